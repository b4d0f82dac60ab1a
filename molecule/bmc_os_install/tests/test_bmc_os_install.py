"""The OS installed through the BMC on a machine with an empty disk, read after converge and side_effect.

`host` is the installed node itself, reached over SSH as the seed's admin user with the key the seed carried (the
instance config create.yml wrote). The control machine's side is read from the bed's directory: the emulator's log
of write requests and of its one-time boot (files/emulator.py), the mirror's access log, the published ISO, the
reports, libvirt's view of the domain, and the second run's refusal (side_effect.yml).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

BED = Path(os.environ.get("HMK_STATE", "/var/tmp/hybrid-moe-kit")) / "bmc_os_install"
DOMAIN = "bmc-node"
UUID = "5f0f2c8e-4b1e-4c55-9d2a-6c1e8a7b3d10"
SYSTEM = "/redfish/v1/Systems/" + UUID
LIBVIRT_EVENT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\+0000: (starting up|shutting down)")


@pytest.fixture(scope="module")
def bed():
    return json.loads((BED / "bed.json").read_text())


@pytest.fixture(scope="module")
def log_lines():
    return [json.loads(line) for line in (BED / "requests.log").read_text().splitlines()]


def virsh(*args):
    env = dict(os.environ, XDG_CONFIG_HOME=str(BED / "client" / "config"), XDG_CACHE_HOME=str(BED / "client" / "cache"),
               XDG_RUNTIME_DIR=str(BED / "client" / "runtime"))
    uri = "qemu:///session?socket=%s" % (BED / "libvirt" / "runtime" / "libvirt" / "libvirt-sock")
    return subprocess.run(["virsh", "-q", "-c", uri] + list(args), check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def test_the_bmc_got_insert_one_time_boot_power_on_and_eject_and_nothing_more(bed, log_lines):
    """Over converge and the refused second run together: the second run sent the BMC nothing."""
    writes = [(q["method"], q["path"], q["body"]) for q in log_lines if "event" not in q]
    iso = writes[0][2]["Image"]
    assert re.fullmatch(r"http://127\.0\.0\.1:%d/seeds/bmc-node/installer-[0-9a-f]{12}\.iso" % bed["http_port"], iso)
    assert writes == [
        ("POST", SYSTEM + "/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia",
         {"Image": iso, "Inserted": True, "WriteProtected": True}),
        ("PATCH", SYSTEM, {"Boot": {"BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "UEFI",
                                    "BootSourceOverrideTarget": "Cd"}}),
        ("POST", SYSTEM + "/Actions/ComputerSystem.Reset", {"ResetType": "On"}),
        ("POST", SYSTEM + "/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia", {}),
    ]


def test_the_one_time_boot_was_used_by_the_power_on_and_the_installers_reboot_booted_the_disk(log_lines):
    events = [q["event"] for q in log_lines if "event" in q]
    assert events == ["once-recorded", "once-used", "guest-reset-restarted"]
    restored = [q for q in log_lines if q.get("event") == "once-used"][0]
    assert restored["restored"] == "Hdd"


def test_libvirt_started_the_machine_twice_the_installer_then_the_installed_disk():
    events = [m.group(1) for m in map(LIBVIRT_EVENT.match, (
        BED / "libvirt" / "cache" / "libvirt" / "qemu" / "log" / (DOMAIN + ".log")).read_text().splitlines()) if m]
    assert events == ["starting up", "shutting down", "starting up"]
    assert virsh("domstate", DOMAIN) == "running"
    tree = ElementTree.fromstring(virsh("dumpxml", "--inactive", DOMAIN))
    disk = tree.find("./devices/disk[@device='disk']")
    assert disk.find("boot").get("order") == "1"
    assert tree.find("./devices/disk[@device='cdrom']/source") is None  # ejected


def test_the_mirror_served_the_checked_iso_the_rebuilt_iso_and_the_seed(bed):
    served = re.findall(r'"GET (\S+) HTTP', (BED / "mirror.log").read_text())
    assert bed["image_path"] in served                                      # the controller's checked download
    assert [p for p in served if re.fullmatch(r"/seeds/bmc-node/installer-[0-9a-f]{12}\.iso", p)]  # the BMC
    assert "/seeds/bmc-node/preseed.cfg" in served                            # the installer in the guest


def test_the_rebuilt_iso_boots_its_first_entry_unattended_with_the_seed(bed, tmp_path):
    iso = sorted((BED / "www" / "seeds" / "bmc-node").glob("installer-*.iso"))
    assert len(iso) == 1
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(iso[0]), "-extract", "/boot/grub/grub.cfg",
                    str(tmp_path / "grub.cfg")], check=True, capture_output=True)
    menu = (tmp_path / "grub.cfg").read_text()
    first = re.search(r"^menuentry 'Install' \{.*?^\}", menu, re.M | re.S).group(0)
    kernel = [line for line in first.splitlines() if line.strip().startswith("linux")][0]
    seed = "preseed/url=http://10.0.2.2:%d/seeds/bmc-node/preseed.cfg" % bed["http_port"]
    assert kernel.index("auto=true priority=critical") < kernel.index(seed) < kernel.index("---")
    assert re.search(r"^set timeout=\d+$", menu, re.M)


def test_the_node_is_the_machine_behind_the_bmc(host):
    assert host.file("/sys/class/dmi/id/product_uuid").exists
    with host.sudo():
        assert host.file("/sys/class/dmi/id/product_uuid").content_string.strip().lower() == UUID
    assert host.check_output("hostname") == DOMAIN


def test_debian_12_installed_in_uefi_mode_on_the_empty_disk(host):
    assert host.system_info.distribution == "debian" and host.system_info.release.startswith("12")
    assert host.file("/sys/firmware/efi").is_directory
    root = host.check_output("findmnt -no SOURCE /")
    assert root.startswith("/dev/vda")
    with host.sudo():
        assert host.file("/boot/efi/EFI/BOOT/BOOTX64.EFI").exists  # grub-installer/force-efi-extra-removable


def test_the_admin_user_logs_in_only_with_the_kits_key_and_has_sudo(host):
    key = (BED / "id_ed25519.pub").read_text().strip()
    assert host.file("/home/hmk/.ssh/authorized_keys").content_string.strip() == key
    assert host.file("/home/hmk/.ssh/authorized_keys").mode == 0o600
    with host.sudo():
        assert host.check_output("passwd -S hmk").split()[1] == "L"   # no password: the key is the way in
        assert host.check_output("passwd -S root").split()[1] == "L"  # passwd/root-login false
        assert host.check_output("id -un") == "root"
    assert host.package("openssh-server").is_installed and host.package("python3").is_installed
    assert not host.package("task-english").is_installed  # bmc_os_install_debian_tasks: [ssh-server] only


def test_preflight_ran_on_the_new_node(host):
    report = json.loads((BED / "reports" / DOMAIN / "preflight.json").read_text())
    assert report["schema"] == "hmk-preflight/1" and report["host"] == DOMAIN
    assert report["checks"]
    assert json.dumps(report["hardware"])  # facts gathered from the installed OS


def test_the_second_run_was_refused_because_the_node_answers_as_itself():
    refusal = (BED / "second-run.txt").read_text()
    assert refusal.startswith("Refused to reinstall bmc-node: it already answers over SSH as this node (system UUID "
                              + UUID + ", the same as its BMC's). Nothing was changed.")
    assert "-e bmc_os_reinstall_confirm=bmc-node" in refusal


def test_the_bios_was_read_from_the_bmc_before_the_install():
    report = json.loads((BED / "reports" / DOMAIN / "bmc-bios.json").read_text())
    checks = dict((c["id"], c) for c in report["checks"])
    assert report["vendor"] == "hpe"
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["smt_disabled"]["status"] == "pass"


def test_the_host_has_no_new_link_and_the_same_firewall_rules():
    before = json.loads((BED / "network-before.json").read_text())
    now = json.loads(subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "bmc_libvirt" / "files"
                                                         / "bed.py"), "network"],
                                    check=True, capture_output=True, text=True).stdout)
    assert set(now["links"]) <= set(before["links"])
    for rules in ("iptables", "ip6tables", "nft"):
        assert now.get(rules) == before.get(rules), rules


def test_the_bmc_password_is_in_no_log():
    password = json.loads((BED / "credentials.json").read_text())["bmc_password"]
    for name in ("emulator.log", "libvirtd.log", "requests.log", "bed.json", "mirror.log", "console.log"):
        path = BED / name
        assert not path.exists() or password not in path.read_text(errors="replace"), name
