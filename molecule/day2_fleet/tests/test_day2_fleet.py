"""Day-2 operations on the two-node fleet, checked from the nodes' real state after side_effect.

side_effect ran, in order: (a) playbooks/upgrade.yml to upgrade-good, (b) playbooks/upgrade.yml to upgrade-bad-gate,
(c) playbooks/model_swap.yml on day2-a to tiny-qwen3moe, (d) the same to a catalog entry with a wrong sha256. It left
each run's exit status and output in runs.json and a snapshot of every node after every run (<stage>.json).
"""
import json
import os
import re
import urllib.error
import urllib.request
from datetime import datetime

import pytest
import testinfra

NODES = {"day2-a": 18501, "day2-b": 18502}
KEY = "hmk-test-key-7d1e5b90c2a4f386"
MAIN = "462213ef9ec32d610a70c0aba165aaf67d9bfb9e"
GOOD = "c963af7bfa0d11f5ae5095696301d996f324deec"
BAD_GATE = "a00d55351a3b45dc777a16545ef09d22fa42623e"
STATE = "/var/lib/hmk-day2-test"
ROOT = "/opt/hmk/engines/ik_llama.cpp"
DEEPSEEK = "/srv/models/tiny-deepseek2/tiny-deepseek2-00001-of-00002.gguf"
QWEN = "/srv/models/tiny-qwen3moe/tiny-qwen3moe-00001-of-00003.gguf"
UNIT = "hmk-inference.service"


@pytest.fixture(scope="module")
def fleet():
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return {name: testinfra.get_host("ansible://" + name, ansible_inventory=inventory) for name in NODES}


def _json(node, path):
    return json.loads(node.file(path).content_string)


@pytest.fixture(scope="module")
def snap(fleet):
    """snap[node][stage]: what the node ran after each stage of side_effect."""
    stages = ["converged", "after-check", "after-upgrade-good", "after-upgrade-bad-gate", "after-swap", "after-bad-swap",
              "after-swap-remove-old"]
    return {name: {stage: _json(node, "%s/%s.json" % (STATE, stage)) for stage in stages} for name, node in fleet.items()}


@pytest.fixture(scope="module")
def runs(fleet):
    return _json(fleet["day2-a"], STATE + "/runs.json")


def output(run):
    """What the operator saw: stdout and stderr (Ansible prints failures on stderr), without colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", run["stdout"] + "\n" + run["stderr"])


def upgrade_log(node):
    return [json.loads(line) for line in node.file("/var/log/hmk-upgrade.log").content_string.splitlines() if line]


def http(port, path, key="", body=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        return e.code, None


def chat(port, key=KEY):
    return http(port, "/v1/chat/completions", key, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})


def test_converge_serves_tiny_deepseek2_from_main(snap):
    for name in NODES:
        assert snap[name]["converged"]["build"].startswith(MAIN[:12] + "-"), name
        assert snap[name]["converged"]["model"] == DEEPSEEK
        assert snap[name]["converged"]["unit"]["ActiveState"] == "active"


def test_check_mode_upgrade_changes_nothing(fleet, snap, runs):
    assert runs["check"]["rc"] == 0, output(runs["check"])[-3000:]
    for name in NODES:
        before, after = snap[name]["converged"], snap[name]["after-check"]
        assert after["build"] == before["build"], name
        for prop in ("MainPID", "ActiveEnterTimestampMonotonic", "NRestarts"):
            assert after["unit"][prop] == before["unit"][prop], (name, prop)
        # The log's first line is the real upgrade's start: check mode wrote nothing.
        assert upgrade_log(fleet[name])[0]["event"] == "started"
        assert upgrade_log(fleet[name])[0]["from"] == before["build"]


def test_good_upgrade_succeeds_and_both_nodes_run_upgrade_good(snap, runs):
    assert runs["upgrade-good"]["rc"] == 0, runs["upgrade-good"]["stdout"][-3000:]
    for name in NODES:
        before, after = snap[name]["converged"], snap[name]["after-upgrade-good"]
        assert after["build"].startswith(GOOD[:12] + "-"), name
        # Same flags, new commit: the flags hash is unchanged.
        assert after["build"].split("-")[1] == before["build"].split("-")[1]
        # The service was restarted onto the new build.
        assert after["unit"]["MainPID"] != before["unit"]["MainPID"], name
        assert int(after["unit"]["ActiveEnterTimestampMonotonic"]) > int(before["unit"]["ActiveEnterTimestampMonotonic"])
        assert after["unit"]["ActiveState"] == "active"


def test_good_upgrade_went_one_node_at_a_time(fleet, snap):
    a = [e for e in upgrade_log(fleet["day2-a"]) if e.get("to_version") == GOOD or e.get("to", "").startswith(GOOD[:12])]
    b = [e for e in upgrade_log(fleet["day2-b"]) if e.get("to_version") == GOOD or e.get("to", "").startswith(GOOD[:12])]
    a_done = [datetime.fromisoformat(e["time"]) for e in a if e["event"] == "upgraded"]
    b_start = [datetime.fromisoformat(e["time"]) for e in b if e["event"] == "started"]
    assert len(a_done) == 1 and len(b_start) == 1, (a, b)
    # day2-b's upgrade began only after day2-a had passed its gate.
    assert a_done[0] <= b_start[0]
    # And day2-a's service was on the new build before day2-b's was restarted.
    assert (int(snap["day2-a"]["after-upgrade-good"]["unit"]["ActiveEnterTimestampMonotonic"])
            < int(snap["day2-b"]["after-upgrade-good"]["unit"]["ActiveEnterTimestampMonotonic"]))


def test_bad_gate_upgrade_fails_and_names_the_node(runs):
    run = runs["upgrade-bad-gate"]
    assert run["rc"] != 0
    assert "The upgrade to %s failed on day2-a" % BAD_GATE in output(run)
    # The gate, not the compiler, failed: llama_build's build and smoke check passed.
    assert re.search(r"TASK \[hmk\.moe_kit\.inference_service : The engine (reports|is) ready on its own /health", output(run))
    assert re.search(r"The node serves build %s-[0-9a-f]{8} again" % GOOD[:12], output(run))


def test_bad_gate_build_compiled_and_refuses_to_serve(fleet):
    node = fleet["day2-a"]
    builds = node.check_output("ls %s/builds" % ROOT).split()
    bad = [b for b in builds if b.startswith(BAD_GATE[:12] + "-")]
    assert len(bad) == 1, builds
    assert node.file("%s/builds/%s/build-record.json" % (ROOT, bad[0])).exists
    assert "this build refuses to serve" in node.check_output("journalctl -u %s --no-pager -o cat" % UNIT)


def test_day2a_rolled_back_to_the_upgrade_good_build_and_serves(fleet, snap):
    good, after = snap["day2-a"]["after-upgrade-good"], snap["day2-a"]["after-upgrade-bad-gate"]
    assert after["build"] == good["build"]
    assert after["unit"]["ActiveState"] == "active"
    # Restarted twice (onto the bad build, then back): a different process from the one the good upgrade left.
    assert after["unit"]["MainPID"] != good["unit"]["MainPID"]
    rolled = [e for e in upgrade_log(fleet["day2-a"]) if e["event"] == "rolled_back"]
    assert len(rolled) == 1
    assert rolled[0]["from"] == good["build"] and rolled[0]["to_version"] == BAD_GATE
    assert "health" in rolled[0]["failure"].lower()


def test_day2b_untouched_by_the_failed_rollout(fleet, snap):
    good, after = snap["day2-b"]["after-upgrade-good"], snap["day2-b"]["after-upgrade-bad-gate"]
    assert after["build"] == good["build"]
    for prop in ("MainPID", "ActiveEnterTimestampMonotonic", "NRestarts"):
        assert after["unit"][prop] == good["unit"][prop], prop
    assert not [e for e in upgrade_log(fleet["day2-b"]) if e.get("to_version") == BAD_GATE]
    assert not fleet["day2-b"].check_output("ls %s/builds" % ROOT).count(BAD_GATE[:12])


def test_swap_serves_tiny_qwen3moe_and_keeps_the_old_files(fleet, snap, runs):
    assert runs["swap"]["rc"] == 0, runs["swap"]["stdout"][-3000:]
    before, after = snap["day2-a"]["after-upgrade-bad-gate"], snap["day2-a"]["after-swap"]
    assert after["model"] == QWEN
    assert after["build"] == before["build"]
    assert after["unit"]["MainPID"] != before["unit"]["MainPID"]
    node = fleet["day2-a"]
    for split in ("00001", "00002"):
        old = node.file("/srv/models/tiny-deepseek2/tiny-deepseek2-%s-of-00002.gguf" % split)
        assert old.exists and old.size > 0
    # day2-b was not part of the swap (-l day2-a).
    assert snap["day2-b"]["after-swap"]["model"] == DEEPSEEK
    assert snap["day2-b"]["after-swap"]["unit"]["MainPID"] == snap["day2-b"]["after-upgrade-good"]["unit"]["MainPID"]


def test_failed_swap_keeps_serving_the_previous_model(fleet, snap, runs):
    run = runs["bad-swap"]
    assert run["rc"] != 0
    assert "The swap to tiny-qwen3moe-corrupt failed on day2-a" in output(run)
    assert "tiny-qwen3moe-00001-of-00003.gguf failed verification" in output(run)
    assert "The service runs %s again" % QWEN in output(run)
    before, after = snap["day2-a"]["after-swap"], snap["day2-a"]["after-bad-swap"]
    assert after["model"] == QWEN
    # Verification failed before the service was touched: same process.
    assert after["unit"]["MainPID"] == before["unit"]["MainPID"]
    node = fleet["day2-a"]
    assert not node.file("/srv/models/tiny-qwen3moe-corrupt/tiny-qwen3moe-00001-of-00003.gguf").exists
    assert node.file("/srv/models/.quarantine/tiny-qwen3moe-corrupt").is_directory
    assert node.file(QWEN).exists


def test_swap_with_removal_deletes_only_the_old_model(fleet, snap, runs):
    assert runs["swap-remove-old"]["rc"] == 0, output(runs["swap-remove-old"])[-3000:]
    before, after = snap["day2-b"]["after-bad-swap"], snap["day2-b"]["after-swap-remove-old"]
    assert before["model"] == DEEPSEEK and after["model"] == QWEN
    assert not fleet["day2-b"].file("/srv/models/tiny-deepseek2").exists
    assert fleet["day2-b"].file(QWEN).exists
    # day2-a (not in -l) keeps both models and its process.
    assert fleet["day2-a"].file(DEEPSEEK).exists
    assert snap["day2-a"]["after-swap-remove-old"]["unit"]["MainPID"] == snap["day2-a"]["after-bad-swap"]["unit"]["MainPID"]


def test_both_nodes_serve_now_with_the_key(fleet):
    for name, port in NODES.items():
        assert http(port, "/health")[0] == 200, name
        status, body = chat(port)
        assert status == 200, name
        assert body["usage"]["completion_tokens"] > 0
        assert chat(port, key="")[0] == 401
    served = {name: fleet[name].check_output("cat /etc/hmk/hmk-inference.args") for name in NODES}
    assert QWEN in served["day2-a"] and QWEN in served["day2-b"]
    assert fleet["day2-a"].check_output("readlink %s/current" % ROOT).startswith("builds/" + GOOD[:12])
    assert fleet["day2-b"].check_output("readlink %s/current" % ROOT).startswith("builds/" + GOOD[:12])


def test_the_api_key_is_in_no_operator_output(runs):
    for stage, run in runs.items():
        assert KEY not in run["stdout"] and KEY not in run["stderr"], stage
