"""The checklist on a twin laid out as the lab profile wants: the report on the control machine
says pass with the right observed values, and the VM is exactly as it was before the role ran."""
import json
import os

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
    for check_id in ("numa_nodes_per_socket", "smt_disabled", "memory_channels_populated", "memory_speed",
                     "numa_balancing_disabled", "pcie_aspm_policy", "gpu_present", "gpu_pcie_link", "gpu_vram",
                     "cpu_isa", "secure_boot", "model_disk_space"):
        assert checks[check_id]["status"] in ("pass", "warn"), check_id
        assert checks[check_id]["why"] and checks[check_id]["remedy"], check_id
    assert report["summary"]["fail"] == 0 and report["summary"]["failed_ids"] == []


def test_one_numa_node_per_socket(checks):
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["numa_nodes_per_socket"]["observed"] == 1


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
