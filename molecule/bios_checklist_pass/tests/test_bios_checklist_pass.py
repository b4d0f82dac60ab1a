"""The checklist on a twin laid out as the lab profile wants, plus a memory-only NUMA node (QEMU `-numa node`
without cpus): the report on the control machine says pass with the right observed values, NPS counts only the
node with CPUs, the memory-only node is reported with its size, and the VM is exactly as it was before."""
import json
import os
import re

import pytest

SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY",
                          os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT_DIR = os.path.join(SCENARIO, "..", "..", "reports", "molecule-bios_checklist_pass", "bios-pass")


@pytest.fixture(scope="module")
def report():
    with open(os.path.join(REPORT_DIR, "preflight.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def checks(report):
    return dict((c["id"], c) for c in report["checks"])


def test_report_has_every_check_and_no_failure(report, checks):
    assert report["schema"] == "hmk-preflight/1" and report["host"] == "bios-pass"
    assert report["profile"] == "lab-twin"
    for check_id in ("platform", "numa_nodes_per_socket", "numa_memory_only_nodes", "numa_memoryless_cpu_nodes",
                     "numa_memory_placement", "smt_disabled", "memory_channels_populated", "memory_speed",
                     "numa_balancing_disabled", "pcie_aspm_policy", "gpu_present", "gpu_pcie_link", "gpu_vram",
                     "cpu_isa", "secure_boot", "model_disk_space"):
        assert checks[check_id]["status"] in ("pass", "warn"), check_id
        assert checks[check_id]["why"] and checks[check_id]["remedy"], check_id
    assert report["summary"]["fail"] == 0 and report["summary"]["failed_ids"] == []


def test_one_numa_node_per_socket(checks):
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["numa_nodes_per_socket"]["observed"] == 1


def test_the_memory_only_node_is_seen_and_reported_not_counted_as_nps(checks, report):
    nodes = report["hardware"]["numa"]["nodes"]
    assert report["hardware"]["numa"]["source"] == "sysfs" and sorted(nodes) == ["0", "1"]
    assert nodes["1"]["cpus"] == "" and 400 < nodes["1"]["size_mb"] <= 512  # QEMU's 512 MiB, less kernel tables
    assert nodes["0"]["cpus"] == "0-1" and nodes["0"]["packages"] == [0] and nodes["1"]["packages"] == []
    only = checks["numa_memory_only_nodes"]
    assert only["status"] == "warn" and re.match(r"^node 1: 0\.\d GB, no CPU$", only["observed"])
    assert "--membind=0" in only["remedy"]
    assert checks["numa_memoryless_cpu_nodes"]["status"] == "pass"
    assert checks["numa_memory_placement"]["status"] == "pass"  # one node with CPUs


def test_the_twin_is_judged_as_the_bare_metal_it_stands_in_for(checks, report):
    platform = report["hardware"]["platform"]
    assert (platform["kind"], platform["detected"]) == ("bare_metal", "virtual")
    assert checks["platform"]["status"] == "pass" and "a hypervisor was detected" in checks["platform"]["observed"]


def test_smt_off(checks, report):
    assert checks["smt_disabled"]["status"] == "pass"
    assert checks["smt_disabled"]["observed"] == "off"
    assert report["hardware"]["cpu"]["threads_per_core"] == 1


def test_all_twelve_channels_at_4800(checks, report):
    assert checks["memory_channels_populated"]["status"] == "pass"
    assert checks["memory_channels_populated"]["observed"] == "12/12"
    assert checks["memory_speed"]["status"] == "pass"
    memory = report["hardware"]["memory"]
    assert (memory["slots_populated"], memory["slots_total"]) == (12, 12)
    assert memory["configured_speed_mts"] == 4800 and memory["bandwidth_gbs"] == 460.8


def test_no_gpu_expected_and_none_found(checks, report):
    assert report["hardware"]["gpus"] == []
    assert checks["gpu_present"]["status"] == "pass" and checks["gpu_present"]["observed"] == 0


def test_markdown_report_lists_the_checks():
    with open(os.path.join(REPORT_DIR, "preflight.md")) as handle:
        md = handle.read()
    assert "# Preflight report: bios-pass" in md
    assert "| pass | numa_nodes_per_socket | 1 | 1 |" in md
    assert "| pass | memory_channels_populated | 12/12 | 12/12 |" in md


def test_node_settings_and_etc_unchanged(host):
    before = host.file("/run/bios-checklist-before.txt").content_string
    assert before.count("\n") > 100  # the record holds the sysctls and every file under /etc
    after = host.check_output("sh /run/bios-checklist-state.sh")
    assert after.strip() == before.strip()


def test_nothing_written_under_etc_boot_usr(host):
    newer = host.check_output("find /etc /boot /usr -xdev -newer /run/bios-checklist-marker -print")
    assert newer == ""
