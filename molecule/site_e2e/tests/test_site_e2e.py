"""What `site.yml` promises on a fresh twin, checked on the node and in the reports it wrote."""
import json
import os

UNIT = "hmk-inference.service"
PORT = 18491
KEY = "hmk-lab-key-not-a-secret"  # the lab inventory's (inventories/lab/group_vars/twins/service.yml)
FIXTURE_SHA = "462213ef9ec32d610a70c0aba165aaf67d9bfb9e"
MODEL_DIR = "/srv/models/tiny-deepseek2"
REPORTS = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", ""), "reports", "site-e2e")

HTTP = r"""
import json, sys, urllib.request, urllib.error
url, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
req = urllib.request.Request(url, data=body.encode() if body else None, headers={"Content-Type": "application/json"})
if key:
    req.add_header("Authorization", "Bearer " + key)
try:
    with urllib.request.urlopen(req, timeout=300) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
"""


def _q(value):
    return "'" + value.replace("'", "'\"'\"'") + "'"


def http(host, path, key="", body=""):
    return json.loads(host.check_output("python3 -c %s %s %s %s" % tuple(
        _q(v) for v in (HTTP, "http://127.0.0.1:%d%s" % (PORT, path), key, body))))


def test_the_service_is_running_enabled_and_healthy(host):
    svc = host.service(UNIT)
    assert svc.is_running and svc.is_enabled
    assert http(host, "/health")["status"] == 200


def test_a_completion_needs_the_key_and_answers_with_it(host):
    body = json.dumps({"prompt": "The capital of France is", "max_tokens": 8})
    assert http(host, "/v1/completions", body=body)["status"] == 401
    answer = http(host, "/v1/completions", key=KEY, body=body)
    assert answer["status"] == 200, answer
    assert json.loads(answer["body"])["choices"][0]["text"]


def test_the_engine_runs_from_the_pinned_build(host):
    current = host.file("/opt/hmk/engines/ik_llama.cpp/current")
    assert current.is_symlink
    record = json.loads(host.file("/opt/hmk/engines/ik_llama.cpp/current/build-record.json").content_string)
    assert record["commit"] == FIXTURE_SHA
    pid = host.check_output("systemctl show -p MainPID --value %s" % UNIT)
    exe = host.check_output("readlink /proc/%s/exe" % pid)
    assert exe.startswith(host.check_output("readlink -f /opt/hmk/engines/ik_llama.cpp/current"))


def test_the_model_is_published_verified_and_read_only_for_the_service(host):
    for name in ("tiny-deepseek2-00001-of-00002.gguf", "tiny-deepseek2-00002-of-00002.gguf"):
        model = host.file("%s/%s" % (MODEL_DIR, name))
        assert model.exists and model.user == "root" and model.mode == 0o644
        assert not host.file("%s/%s.partial" % (MODEL_DIR, name)).exists
    assert host.run("runuser -u moe -- test -w %s/tiny-deepseek2-00001-of-00002.gguf" % MODEL_DIR).rc != 0


def test_check_mode_on_the_converged_node_changed_nothing():
    with open(os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "check-mode.log")) as handle:
        recap = [line for line in handle if line.startswith("site-e2e ")][-1]
    assert "changed=0 " in recap and "failed=0 " in recap


def test_the_preflight_report_was_written():
    with open(os.path.join(REPORTS, "preflight.json")) as handle:
        report = json.load(handle)
    assert report["host"] == "site-e2e"


def _unfilled(value, path="$"):
    """Paths of fields that are empty, or marked unavailable without a reason."""
    if isinstance(value, dict):
        if value.get("available") is False and not str(value.get("reason", "")).strip():
            return [path + " (unavailable without a reason)"]
        return [p for key, item in value.items() for p in _unfilled(item, "%s.%s" % (path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in _unfilled(item, "%s[%d]" % (path, index))]
    return [path] if value is None or value == "" else []


def test_the_validate_report_has_every_field_filled():
    with open(os.path.join(REPORTS, "validate.json")) as handle:
        report = json.load(handle)
    assert _unfilled(report) == []
    with open(os.path.join(REPORTS, "validate.md")) as handle:
        assert "not meaningful" in handle.read()


def test_the_doctor_finds_the_served_node_healthy_where_it_can_tell():
    with open(os.path.join(REPORTS, "doctor.json")) as handle:
        findings = {f["id"]: f["severity"] for f in json.load(handle)["findings"]}
    assert findings["service_state"] == "ok"
    assert findings["engine_flags"] == "ok"
    assert findings["gpu_present"] == "info"  # the lab profile declares no GPU
