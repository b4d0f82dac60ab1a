"""What an operator checks on the twin after an allowed reboot (kernel_tuning_reboot)."""

import json
import os
import re

import pytest

WANTED_ARGS = ["pcie_aspm.policy=performance", "numa_balancing=disable"]
MANAGED = "# Ansible managed"


def original_default_grub():
    """/etc/default/grub as scripts/build-image.sh writes it into the image."""
    script = os.path.join(os.environ["MOLECULE_PROJECT_DIRECTORY"], "scripts", "build-image.sh")
    with open(script, encoding="utf-8") as fh:
        text = fh.read()
    match = re.search(r"cat > \"\$root/etc/default/grub\" <<'GRUB'\n(.*?)\nGRUB\n", text, re.S)
    assert match, "build-image.sh no longer writes /etc/default/grub with a GRUB heredoc"
    return match.group(1) + "\n"


def converge_record(host):
    return json.loads(host.file("/var/tmp/kt-converge.json").content_string)


@pytest.mark.parametrize("arg", WANTED_ARGS)
def test_cmdline_carries_each_argument_once(host, arg):
    words = host.file("/proc/cmdline").content_string.split()
    assert words.count(arg) == 1, words


@pytest.mark.parametrize("key,value", [("kernel.numa_balancing", "0"), ("vm.max_map_count", "262144")])
def test_live_sysctl(host, key, value):
    assert host.run_test("sysctl -n %s", key).stdout.strip() == value


def test_live_aspm_policy_is_performance(host):
    policy = host.file("/sys/module/pcie_aspm/parameters/policy").content_string
    assert "[performance]" in policy, policy


@pytest.mark.parametrize(
    "path",
    [
        "/etc/sysctl.d/60-hybrid-moe-kit.conf",
        "/etc/default/grub.d/60-hybrid-moe-kit.cfg",
        "/etc/security/limits.d/60-hybrid-moe-kit.conf",
        "/etc/systemd/system/hmk-drop-caches.service",
    ],
)
def test_drop_in_exists_with_managed_header(host, path):
    f = host.file(path)
    assert f.is_file and f.user == "root" and f.mode == 0o644
    assert f.content_string.splitlines()[:3] == ["#", MANAGED, "#"]


def test_limits_drop_in_gives_memlock(host):
    lines = host.file("/etc/security/limits.d/60-hybrid-moe-kit.conf").content_string.splitlines()
    assert "moe soft memlock unlimited" in lines and "moe hard memlock unlimited" in lines


def test_default_grub_is_the_image_original(host):
    assert host.file("/etc/default/grub").content_string == original_default_grub()


def test_grub_cfg_linux_lines_carry_arguments_once(host):
    cfg = host.file("/boot/grub/grub.cfg").content_string
    linux = [l.split() for l in cfg.splitlines() if l.strip().startswith("linux") and "vmlinuz" in l]
    # Recovery entries ("single") take GRUB_CMDLINE_LINUX only, not the _DEFAULT line the drop-in extends.
    normal = [words for words in linux if "single" not in words]
    assert normal
    for words in linux:
        for arg in WANTED_ARGS:
            assert words.count(arg) == (1 if words in normal else 0), words


def test_exactly_one_reboot_during_converge_and_none_after(host):
    prepare_boot = host.file("/var/tmp/kt-boot-prepare").content_string.strip()
    now_boot = host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
    assert converge_record(host)["boot_id"] == now_boot, "the twin rebooted after converge"
    assert prepare_boot != now_boot, "converge did not reboot"
    boots = host.check_output("journalctl --list-boots --no-pager -q").splitlines()
    assert len(boots) == 2, boots


def test_reboot_contract_reports_done(host):
    record = converge_record(host)
    assert record["reboot_required"] is False
    items = [n["item"] for n in record["not_applied"]]
    assert items == ["CPU frequency governor performance"], record["not_applied"]


def test_no_cpufreq_unit_where_cpufreq_is_absent(host):
    assert not host.file("/sys/devices/system/cpu/cpu0/cpufreq").exists
    assert not host.file("/etc/systemd/system/hmk-cpufreq-governor.service").exists


def test_drop_caches_helper_drops_the_page_cache(host):
    script = host.file("/usr/local/sbin/hmk-drop-caches")
    assert script.user == "root" and script.mode == 0o755
    host.run_test("dd if=/boot/grub/grub.cfg of=/dev/null status=none")
    before = int(host.check_output("awk '/^Cached:/ {print $2}' /proc/meminfo"))
    host.run_expect([0], "systemctl start hmk-drop-caches.service")
    after = int(host.check_output("awk '/^Cached:/ {print $2}' /proc/meminfo"))
    assert host.service("hmk-drop-caches.service").systemd_properties["Result"] == "success"
    assert after < before, (before, after)
