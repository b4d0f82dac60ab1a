"""kernel_tuning in a container: drop-ins written, the host kernel left alone, the rest reported."""

import json

WANTED_SYSCTL = {"kernel.numa_balancing": "0", "vm.max_map_count": "262144"}


def record(host):
    return json.loads(host.file("/var/tmp/kt-converge.json").content_string)


def reported(host):
    return {n["item"]: n["reason"] for n in record(host)["not_applied"]}


def test_no_reboot_is_required_or_attempted(host):
    assert record(host)["reboot_required"] is False
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_kernel_arguments_reported_not_written(host):
    items = reported(host)
    key = "kernel arguments pcie_aspm.policy=performance numa_balancing=disable"
    assert "no bootloader" in items[key]
    assert not host.file("/etc/default/grub.d/60-hybrid-moe-kit.cfg").exists


def test_aspm_governor_and_helper_reported(host):
    items = reported(host)
    assert "container" in items["PCIe ASPM policy performance"]
    assert "not applicable" in items["CPU frequency governor performance"]
    assert "read-only" in items["page-cache helper (installed)"]


def test_each_sysctl_the_host_lacks_is_reported_and_left_alone(host):
    items = reported(host)
    for key, wanted in WANTED_SYSCTL.items():
        live = host.check_output("sysctl -n %s", key).split()
        listed = [i for i in items if i.startswith("sysctl %s=" % key)]
        if live == wanted.split():
            assert not listed
        else:
            assert len(listed) == 1 and "host kernel" in items[listed[0]], items


def test_drop_ins_written_with_managed_header(host):
    for path in (
        "/etc/sysctl.d/60-hybrid-moe-kit.conf",
        "/etc/security/limits.d/60-hybrid-moe-kit.conf",
        "/etc/systemd/system/hmk-drop-caches.service",
    ):
        assert host.file(path).content_string.startswith("#\n# Ansible managed\n#\n"), path
    assert host.file("/usr/local/sbin/hmk-drop-caches").mode == 0o755
