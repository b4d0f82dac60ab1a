"""The doctor on a node whose service fails on a removed flag: the ranked report on the control machine puts
the failed service and the refused -fmoe first as critical, with the fix; the node without a GPU gets info
findings; and the node (files under /etc, kernel settings, the service's systemd state) is exactly as before."""
import json
import os

import pytest

SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY",
                          os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT_DIR = os.path.join(SCENARIO, "..", "..", "reports", "molecule-doctor", "doctor-node")
SEVERITIES = ["critical", "warning", "info", "ok"]


@pytest.fixture(scope="module")
def report():
    with open(os.path.join(REPORT_DIR, "doctor.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def findings(report):
    return report["findings"]


def by_id(findings, check_id):
    return [f for f in findings if f["id"] == check_id]


def test_report_header_and_every_check(report, findings):
    assert report["schema"] == "hmk-doctor/1" and report["host"] == "doctor-node"
    assert report["profile"] == "lab-twin" and report["service"] == "hmk-inference.service"
    ids = {f["id"] for f in findings}
    assert ids == {"service_state", "model_integrity", "engine_flags", "engine_errors", "nvidia_driver", "engine_isa",
                   "platform", "gpu_present", "gpu_devices", "gpu_placement", "numa_balancing", "numa_nodes_per_socket",
                   "numa_memoryless_cpu_nodes", "numa_memory_only_nodes", "numa_memory_placement", "memory_channels",
                   "smt", "model_page_cache", "gpu_pcie_link", "pcie_aspm", "cpu_governor"}
    for f in findings:
        assert f["severity"] in SEVERITIES and f["title"] and f["fix"] and str(f["evidence"]), f


def test_findings_are_ranked_by_severity(report, findings):
    assert [f["rank"] for f in findings] == list(range(1, len(findings) + 1))
    order = [SEVERITIES.index(f["severity"]) for f in findings]
    assert order == sorted(order)
    assert report["summary"]["critical"] == sum(1 for f in findings if f["severity"] == "critical")


def test_failed_service_is_the_first_critical(findings):
    first = findings[0]
    assert (first["rank"], first["severity"], first["id"]) == (1, "critical", "service_state")
    assert first["title"].startswith("hmk-inference.service has failed")
    assert "ActiveState=failed" in first["evidence"]
    restarts = int(first["evidence"].split("NRestarts=")[1].split()[0])
    assert restarts >= 1


def test_refused_fmoe_is_second_with_its_fix(findings):
    second = findings[1]
    assert (second["rank"], second["severity"], second["id"]) == (2, "critical", "engine_flags")
    assert second["title"] == "The engine refuses the flag -fmoe"
    # The evidence is the engine's own journal line (short-iso: time, host, unit[pid]: message).
    assert second["evidence"].endswith("error: unknown argument: -fmoe")
    assert "hmk-inference" in second["evidence"] or "llama-server" in second["evidence"]
    assert "fused MoE is on by default" in second["fix"] and "-no-fmoe" in second["fix"]


def test_no_gpu_is_info_not_failure(findings):
    gpu = by_id(findings, "gpu_present")[0]
    assert (gpu["severity"], gpu["title"]) == ("info", "No NVIDIA GPU on this node; the GPU checks do not apply")
    driver = by_id(findings, "nvidia_driver")[0]
    assert driver["severity"] == "info" and "no /proc/driver/nvidia/version" in driver["evidence"]
    assert by_id(findings, "gpu_pcie_link")[0]["severity"] == "info"
    # The device rules and the placement proof apply to GPU nodes only: here they say why they do not.
    devices = by_id(findings, "gpu_devices")[0]
    assert (devices["severity"], devices["title"]) == ("info", "No GPU on this node; no NVIDIA device to check")
    placement = by_id(findings, "gpu_placement")[0]
    assert (placement["severity"], placement["title"]) == ("info", "No GPU on this node; no placement to check")


def test_hardware_findings_come_from_the_shared_judges(findings):
    # The refusing stand-in never printed a system_info line: the comparison says so instead of guessing.
    isa = by_id(findings, "engine_isa")[0]
    assert isa["severity"] == "info" and "no system_info line" in isa["evidence"]
    # The lab profile declares the twin bare metal: judged as the node it stands in for.
    assert by_id(findings, "platform")[0]["severity"] == "ok"
    assert by_id(findings, "numa_memory_only_nodes")[0]["severity"] in ("ok", "warning")


def test_model_is_measured(findings):
    cache = by_id(findings, "model_page_cache")[0]
    assert cache["evidence"].startswith("model 4.0 MiB in 1 file(s)")
    assert cache["severity"] in ("ok", "warning")


def test_markdown_report(findings):
    with open(os.path.join(REPORT_DIR, "doctor.md")) as handle:
        md = handle.read()
    assert "# Doctor report: doctor-node" in md
    assert "| 1 | critical | service_state | %s |" % findings[0]["title"] in md
    assert "| 2 | critical | engine_flags | The engine refuses the flag -fmoe |" in md
    assert "### 2. The engine refuses the flag -fmoe (critical)" in md


def test_node_and_service_unchanged(host):
    before = host.file("/run/doctor-before.txt").content_string
    assert "ActiveState=failed" in before and before.count("\n") > 100
    after = host.check_output("sh /run/doctor-state.sh")
    assert after.strip() == before.strip()


def test_nothing_written_under_etc_usr_srv(host):
    newer = host.check_output("find /etc /usr /srv -xdev -newer /run/doctor-marker -print")
    assert newer == ""
