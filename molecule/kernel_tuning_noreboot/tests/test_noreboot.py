"""What an operator checks on a systemd-boot twin after a converge that was not allowed to reboot.

Real on the twin: the ESP, Debian's systemd-boot packages, bootctl, kernel-install and its loader
entries, /etc/kernel/cmdline. Staged (prepare.yml): only the firmware's LoaderInfo variable, since the
twin itself boots with SeaBIOS and GRUB."""

import json

import pytest

WANTED_ARGS = ["pcie_aspm.policy=performance", "numa_balancing=disable"]
ENTRIES = "/boot/efi/loader/entries"


def prepare_state(host):
    """The fingerprint prepare took before the role ever ran: {kind key: value}."""
    state = {}
    for line in host.file("/var/tmp/kt-state-prepare").content_string.splitlines():
        kind, _unused, rest = line.partition(" ")
        if kind in ("boot_id", "cmdline", "aspm"):
            state[kind] = rest
        else:
            key, _unused, value = rest.partition(" ")
            state[kind + " " + key] = value
    return state


def installed_kernels(host):
    return [path.rsplit("vmlinuz-", 1)[1] for path in host.check_output("ls /boot/vmlinuz-*").split()]


def entries(host):
    """{kernel release: [options words]} of the loader entries kernel-install wrote."""
    found = {}
    for path in host.check_output("ls %s/*.conf" % ENTRIES).split():
        fields = dict(line.split(None, 1) for line in host.file(path).content_string.splitlines() if " " in line.strip())
        found.setdefault(fields["version"].strip(), []).append(fields["options"].split())
    return found


def test_the_twin_is_a_systemd_boot_host_with_only_the_firmware_staged(host):
    assert host.check_output("bootctl is-installed") == "yes"
    assert host.check_output("findmnt -n -o FSTYPE /boot/efi") == "vfat"
    assert "/boot/efi" in host.file("/etc/fstab").content_string
    assert host.package("systemd-boot").is_installed
    assert "KERNEL_INSTALL_LAYOUT: bls" in host.check_output("kernel-install inspect")
    loader_info = host.check_output(
        "tail -c +5 /sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f | iconv -f UTF-16LE -t UTF-8 | tr -d '\\000'")
    assert loader_info == "systemd-boot " + host.package("systemd-boot").version
    assert host.check_output("findmnt -n -o FSTYPE /sys/firmware") == "tmpfs"


def test_reboot_required_was_reported(host):
    record = json.loads(host.file("/var/tmp/kt-converge.json").content_string)
    assert record["reboot_required"] is True
    assert [n["item"] for n in record["not_applied"]] == ["CPU frequency governor performance"]


def test_no_reboot_happened(host):
    state = prepare_state(host)
    assert host.file("/proc/sys/kernel/random/boot_id").content_string.strip() == state["boot_id"]
    assert host.file("/proc/cmdline").content_string.strip() == state["cmdline"]
    assert "pcie_aspm.policy=performance" not in state["cmdline"].split()


def test_twin_started_with_numa_balancing_on(host):
    assert prepare_state(host)["sysctl kernel.numa_balancing"] == "1"


@pytest.mark.parametrize("key,value", [("kernel.numa_balancing", "0"), ("vm.max_map_count", "262144")])
def test_live_sysctl_applied_without_reboot(host, key, value):
    assert host.run_test("sysctl -n %s", key).stdout.strip() == value


def test_kernel_cmdline_keeps_the_administrators_line_and_adds_each_argument_once(host):
    words = host.file("/etc/kernel/cmdline").content_string.split()
    current = [w for w in host.file("/proc/cmdline").content_string.split() if not w.startswith(("BOOT_IMAGE=", "initrd="))]
    assert words[:len(current)] == current
    for arg in WANTED_ARGS:
        assert words.count(arg) == 1, words
    assert not [w for w in words if w.startswith("BOOT_IMAGE=")]


def test_every_installed_kernels_loader_entry_carries_the_arguments_once(host):
    found = entries(host)
    for kernel in installed_kernels(host):
        assert kernel in found, (kernel, found)
        for options in found[kernel]:
            for arg in WANTED_ARGS:
                assert options.count(arg) == 1, options


def test_grub_is_left_alone_on_a_systemd_boot_host(host):
    state = prepare_state(host)
    assert not host.file("/etc/default/grub.d/60-hybrid-moe-kit.cfg").exists
    for path in ("/etc/default/grub", "/boot/grub/grub.cfg"):
        digest = host.check_output("sha256sum < %s | cut -d' ' -f1" % path)
        assert digest == state["file " + path], path


def test_the_host_without_its_esp_was_refused(host):
    text = host.file("/var/tmp/kt-refused-no-esp.txt").content_string
    assert "systemd-boot boots this node, but kernel-install would not write" in text and "Nothing was changed" in text


def test_limits_and_sysctl_drop_ins(host):
    for path in ("/etc/sysctl.d/60-hybrid-moe-kit.conf", "/etc/security/limits.d/60-hybrid-moe-kit.conf"):
        assert host.file(path).content_string.startswith("#\n# Ansible managed\n#\n")
    assert "moe hard memlock unlimited" in host.file("/etc/security/limits.d/60-hybrid-moe-kit.conf").content_string


def test_drop_caches_helper_absent_by_default(host):
    assert not host.file("/usr/local/sbin/hmk-drop-caches").exists
    assert not host.file("/etc/systemd/system/hmk-drop-caches.service").exists
