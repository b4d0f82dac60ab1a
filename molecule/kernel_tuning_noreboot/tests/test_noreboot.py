"""What an operator checks on the twin after a converge that was not allowed to reboot."""

import json

import pytest

WANTED_ARGS = ["pcie_aspm.policy=performance", "numa_balancing=disable"]


def prepare_state(host):
    """The fingerprint prepare took before the role ever ran: {kind key: value}."""
    state = {}
    for line in host.file("/var/tmp/kt-state-prepare").content_string.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("boot_id", "cmdline", "aspm"):
            state[kind] = rest
        else:
            key, _, value = rest.partition(" ")
            state[kind + " " + key] = value
    return state


def test_reboot_required_was_reported(host):
    record = json.loads(host.file("/var/tmp/kt-converge.json").content_string)
    assert record["reboot_required"] is True
    assert [n["item"] for n in record["not_applied"]] == ["CPU frequency governor performance"]


def test_no_reboot_happened(host):
    state = prepare_state(host)
    assert host.file("/proc/sys/kernel/random/boot_id").content_string.strip() == state["boot_id"]
    assert host.file("/proc/cmdline").content_string.strip() == state["cmdline"]
    for arg in WANTED_ARGS:
        assert arg not in state["cmdline"].split()


def test_twin_started_with_numa_balancing_on(host):
    assert prepare_state(host)["sysctl kernel.numa_balancing"] == "1"


@pytest.mark.parametrize("key,value", [("kernel.numa_balancing", "0"), ("vm.max_map_count", "262144")])
def test_live_sysctl_applied_without_reboot(host, key, value):
    assert host.run_test("sysctl -n %s", key).stdout.strip() == value


def test_grub_drop_in_and_grub_cfg_carry_arguments_once(host):
    dropin = host.file("/etc/default/grub.d/60-hybrid-moe-kit.cfg")
    assert dropin.is_file and dropin.content_string.startswith("#\n# Ansible managed\n#\n")
    cfg = host.file("/boot/grub/grub.cfg").content_string
    linux = [l.split() for l in cfg.splitlines() if l.strip().startswith("linux") and "vmlinuz" in l]
    # Recovery entries ("single") take GRUB_CMDLINE_LINUX only, not the _DEFAULT line the drop-in extends.
    normal = [words for words in linux if "single" not in words]
    assert normal
    for words in linux:
        for arg in WANTED_ARGS:
            assert words.count(arg) == (1 if words in normal else 0), words


def test_default_grub_untouched(host):
    digest = host.check_output("sha256sum < /etc/default/grub | cut -d' ' -f1")
    assert digest == prepare_state(host)["file /etc/default/grub"]


def test_limits_and_sysctl_drop_ins(host):
    for path in ("/etc/sysctl.d/60-hybrid-moe-kit.conf", "/etc/security/limits.d/60-hybrid-moe-kit.conf"):
        assert host.file(path).content_string.startswith("#\n# Ansible managed\n#\n")
    assert "moe hard memlock unlimited" in host.file("/etc/security/limits.d/60-hybrid-moe-kit.conf").content_string


def test_drop_caches_helper_absent_by_default(host):
    assert not host.file("/usr/local/sbin/hmk-drop-caches").exists
    assert not host.file("/etc/systemd/system/hmk-drop-caches.service").exists
