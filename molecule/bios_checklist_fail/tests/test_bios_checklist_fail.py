"""The checklist on a twin with NPS4, SMT on and 8 of 12 DIMMs: the report on the control machine
has the three failures with their remedies, and the VM is exactly as it was before the role ran."""
import json
import os

import pytest

SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY",
                          os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT_DIR = os.path.join(SCENARIO, "..", "..", "reports", "molecule-bios_checklist_fail", "bios-fail")


@pytest.fixture(scope="module")
def report():
    with open(os.path.join(REPORT_DIR, "preflight.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def checks(report):
    return dict((c["id"], c) for c in report["checks"])


def test_exactly_the_three_bios_items_fail(report):
    assert report["summary"]["failed_ids"] == ["numa_nodes_per_socket", "smt_disabled", "memory_channels_populated"]


def test_four_cpu_nodes_on_one_socket_and_no_memory_only_node(checks, report):
    nodes = report["hardware"]["numa"]["nodes"]
    assert sorted(nodes) == ["0", "1", "2", "3"] and all(n["packages"] == [0] for n in nodes.values())
    assert checks["numa_memory_only_nodes"]["status"] == "pass"
    assert checks["numa_memoryless_cpu_nodes"]["status"] == "pass"


def test_nps2_fails_with_the_bios_remedy(checks, report):
    check = checks["numa_nodes_per_socket"]
    assert (check["status"], check["observed"], check["expected"]) == ("fail", 4, 1)
    # The remedy speaks the CPU vendor's BIOS: a TCG twin's vCPU is an Intel model (SNC), a KVM twin's the host's.
    if report["hardware"]["cpu"]["generation"]["vendor"] == "intel":
        assert "SNC (Sub-NUMA Clustering) = Disabled" in check["remedy"]
    else:
        assert "NPS1" in check["remedy"]


def test_smt_on_fails_with_the_bios_remedy(checks, report):
    check = checks["smt_disabled"]
    assert (check["status"], check["observed"], check["expected"]) == ("fail", "on", "off")
    if report["hardware"]["cpu"]["generation"]["vendor"] == "intel":
        assert "Hyper-Threading [ALL] = Disable" in check["remedy"]
    else:
        assert "SMT Control = Disable" in check["remedy"]
    assert report["hardware"]["cpu"]["threads_per_core"] == 2


def test_eight_of_twelve_channels_fail_with_the_population_remedy(checks, report):
    check = checks["memory_channels_populated"]
    assert (check["status"], check["observed"], check["expected"]) == ("fail", "8/12", "12/12")
    assert "every memory channel" in check["remedy"]
    assert report["hardware"]["memory"]["bandwidth_gbs"] == 8 * 4800 * 8 / 1000.0


def test_markdown_report_names_the_findings():
    with open(os.path.join(REPORT_DIR, "preflight.md")) as handle:
        md = handle.read()
    assert "3 fail: numa_nodes_per_socket, smt_disabled, memory_channels_populated" in md
    assert "- **smt_disabled** (fail)" in md


def test_node_settings_and_etc_unchanged(host):
    before = host.file("/run/bios-checklist-before.txt").content_string
    assert before.count("\n") > 100
    after = host.check_output("sh /run/bios-checklist-state.sh")
    assert after.strip() == before.strip()


def test_nothing_written_under_etc_boot_usr(host):
    newer = host.check_output("find /etc /boot /usr -xdev -newer /run/bios-checklist-marker -print")
    assert newer == ""
