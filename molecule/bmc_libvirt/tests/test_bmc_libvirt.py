"""The bmc role against sushy-tools' Redfish emulator in front of libvirt and a running QEMU domain.

Read after Molecule's check, converge and idempotence runs of playbooks/baremetal.yml (bmc_bios_apply: true): the
three runs' reports (converge.yml keeps each), the requests the emulator received (files/emulator.py), libvirt's
own view of the domain (virsh, the domain's QEMU log) and the host's links and firewall rules against what create
recorded. sushy-tools' libvirt driver applies a BIOS PATCH at once (not at the next boot, as a real BMC does), so
the restart is proven apart: one Reset request after the PATCH, one destroy and start of the domain after it.
"""
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest

BED = Path(os.environ.get("HMK_STATE", "/var/tmp/hybrid-moe-kit")) / "bmc_libvirt"
UUID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
DOMAIN = "bmc-node"
FIXED = {"NumaMemoryDomainsPerSocket": {"before": "TwoMemoryDomainsPerSocket", "after": "OneMemoryDomainPerSocket"},
         "ProcSMT": {"before": "Enabled", "after": "Disabled"}}
LIBVIRT_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\+0000: (starting up|shutting down, reason=(\w+))")


@pytest.fixture(scope="module")
def bed():
    return json.loads((BED / "bed.json").read_text())


@pytest.fixture(scope="module")
def reports():
    """check, converge, idempotence: in the order Molecule ran them."""
    files = sorted((BED / "reports" / "history").glob("*.json"))
    return [(f.name, json.loads(f.read_text())) for f in files]


@pytest.fixture(scope="module")
def requests_sent():
    path = BED / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def virsh(host, bed, *args):
    return host.check_output("virsh -q -c" + " %s" * (1 + len(args)), bed["uri"], *args)


def by_id(report):
    return dict((c["id"], c) for c in report["checks"])


def test_three_runs_check_converge_idempotence(reports):
    assert [name for name, _report in reports] == ["01-check.json", "02-run.json", "03-run.json"]


def test_the_report_from_the_bmc_flags_wrong_nps_and_smt_and_plans_the_fix(reports):
    _name, report = reports[0]
    checks = by_id(report)
    assert report["vendor"] == "hpe" and report["system"]["PowerState"] == "On"
    assert checks["numa_nodes_per_socket"]["status"] == "fail"
    assert checks["numa_nodes_per_socket"]["observed"] == "2"
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NumaMemoryDomainsPerSocket": "TwoMemoryDomainsPerSocket"}
    assert checks["smt_disabled"]["status"] == "fail"
    assert checks["smt_disabled"]["attributes"] == {"ProcSMT": "Enabled"}
    assert all(c["source"] == "bmc" for c in report["checks"])
    assert report["planned"] == FIXED and report["applied"] == {}


def test_apply_wrote_both_and_the_reread_values_are_right(reports):
    _name, report = reports[1]
    checks = by_id(report)
    assert report["applied"] == FIXED and report["planned"] == {} and report["pending"] == {}
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NumaMemoryDomainsPerSocket": "OneMemoryDomainPerSocket"}
    assert checks["smt_disabled"]["status"] == "pass"
    assert checks["smt_disabled"]["attributes"] == {"ProcSMT": "Disabled"}
    assert report["summary"]["failed_ids"] == []


def test_the_second_run_found_nothing_to_change(reports):
    _name, report = reports[2]
    assert report["applied"] == {} and report["planned"] == {} and report["pending"] == {}
    assert by_id(report)["numa_nodes_per_socket"]["status"] == "pass"
    assert by_id(report)["smt_disabled"]["status"] == "pass"


def test_one_patch_then_one_restart_over_all_three_runs(requests_sent):
    # check mode and the second run sent nothing: the two requests are the converge's
    assert [(q["method"], q["path"], q["body"]) for q in requests_sent] == [
        ("PATCH", "/redfish/v1/Systems/%s/BIOS/Settings" % UUID,
         {"Attributes": {"NumaMemoryDomainsPerSocket": "OneMemoryDomainPerSocket", "ProcSMT": "Disabled"}}),
        ("POST", "/redfish/v1/Systems/%s/Actions/ComputerSystem.Reset" % UUID, {"ResetType": "ForceRestart"}),
    ]


def test_libvirt_power_cycled_the_domain_once_after_the_reset_request(bed, requests_sent):
    """The domain's QEMU log: started by create, then destroyed and started again by the emulator's ForceRestart,
    at or after the moment the reset request arrived; nothing since."""
    events = []
    for line in (BED / "libvirt" / "cache" / "libvirt" / "qemu" / "log" / (DOMAIN + ".log")).read_text().splitlines():
        match = LIBVIRT_TIME.match(line)
        if match:
            events.append((datetime.fromisoformat(match.group(1) + "+00:00"), match.group(2).split(",")[0]))
    assert [what for _when, what in events] == ["starting up", "shutting down", "starting up"]
    reset = datetime.fromisoformat(requests_sent[1]["time"])
    assert events[1][0] >= reset.replace(microsecond=0) and events[2][0] >= events[1][0]


def test_the_domain_runs_in_a_new_qemu_process(host, bed):
    assert virsh(host, bed, "domstate", "--reason", DOMAIN) == "running (booted)"
    pid = int((BED / "libvirt" / "runtime" / "libvirt" / "qemu" / "run" / (DOMAIN + ".pid")).read_text())
    assert pid != bed["qemu_pid_at_create"]
    qemu = host.process.get(pid=pid)
    assert qemu.comm.startswith("qemu-system-x86") and qemu.user == "nobody"
    assert "guest=%s," % DOMAIN in qemu.args and re.search(r"-accel tcg\b", qemu.args)  # software emulation, no KVM


def test_libvirt_keeps_the_new_values_in_the_domain_definition(host, bed):
    tree = ElementTree.fromstring(virsh(host, bed, "dumpxml", "--inactive", DOMAIN))
    ns = {"sushy": "http://openstack.org/xmlns/libvirt/sushy"}
    attributes = {a.get("name"): a.get("value") for a in tree.findall(".//sushy:bios/sushy:attributes/sushy:attribute",
                                                                      ns)}
    assert attributes["NumaMemoryDomainsPerSocket"] == "OneMemoryDomainPerSocket"
    assert attributes["ProcSMT"] == "Disabled"
    assert len(attributes) > 150  # the DL325 Gen11's whole attribute set, not a stub
    assert tree.find("./devices/interface") is None and tree.find("./devices/disk") is None


def test_the_daemon_is_a_session_daemon_of_nobody_with_no_network(host, bed):
    assert virsh(host, bed, "uri").startswith("qemu:///session")
    assert host.process.get(pid=bed["libvirtd_pid"]).user == "nobody"
    assert virsh(host, bed, "net-list", "--all") == ""
    assert bed["address"].startswith("127.0.0.1:")


def test_the_host_has_no_new_link_and_the_same_firewall_rules(bed):
    before = json.loads((BED / "network-before.json").read_text())
    now = json.loads(subprocess.run([sys.executable,
                                     str(Path(__file__).resolve().parents[1] / "files" / "bed.py"), "network"],
                                    check=True, capture_output=True, text=True).stdout)
    assert not [n for n in now["links"] if n.startswith(("virbr", "vnet", "macvtap", "tap"))]
    assert set(now["links"]) <= set(before["links"])
    for rules in ("iptables", "ip6tables", "nft"):
        assert now.get(rules) == before.get(rules), rules


def test_the_bmc_password_is_in_no_log(bed):
    password = json.loads((BED / "credentials.json").read_text())["bmc_password"]
    for name in ("emulator.log", "libvirtd.log", "requests.log", "bed.json"):
        path = BED / name
        assert not path.exists() or password not in path.read_text(), name
