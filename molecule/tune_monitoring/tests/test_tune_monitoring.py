"""What playbooks/tune.yml and playbooks/monitoring.yml promise on the serving twin, checked as an operator would:
the tuned file and the trials, the service running and answering on the tuned flags, the chart, and a real
Prometheus (Debian's) that scraped the engine with its key and the kit's facts."""
import json
import os
import re
import struct
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

UNIT = "hmk-inference.service"
HOST = "tune-monitoring"
PORT, EXPORTER, PROMETHEUS = 18611, 18612, 18613
KEY = "hmk-test-key-7c1d93e05ab24f68"
SCRATCH = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPORTS = SCRATCH / "reports" / HOST
TUNED = SCRATCH / "inventory" / "host_vars" / HOST / "tuned.yml"
DASHBOARD = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "roles/monitoring_server/files/grafana/hmk-inference-node.json"


def http(url, key=None, body=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def query(expr):
    status, body = http("http://127.0.0.1:%d/api/v1/query?%s" % (PROMETHEUS, urllib.parse.urlencode({"query": expr})))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(expr, check, seconds=60):
    deadline = time.time() + seconds
    while True:
        result = query(expr)
        if check(result) or time.time() > deadline:
            return result
        time.sleep(2)


class InventoryLoader(yaml.SafeLoader):
    """The tuned file as Ansible reads it: its strings are tagged !unsafe (never templated)."""


InventoryLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def tuned_record():
    return yaml.load(TUNED.read_text(), Loader=InventoryLoader)["tune_result"]


def tune_report():
    return json.loads((REPORTS / "tune.json").read_text())


def deployment(host):
    return json.loads(host.file("/var/lib/hmk/inference/deployment.json").content_string)


# ------------------------------------------------------------------------------------ the search and the tuned file

def test_the_search_ran_inside_its_budget_and_recorded_every_trial():
    report = tune_report()
    assert report["budget_seconds"] == 240
    assert report["search_seconds"] <= report["budget_seconds"]
    assert report["objective"] == {"kind": "mix", "prompt_tokens": 256, "gen_tokens": 16}
    assert report["trials"][0]["dimension"] == "baseline" and report["trials"][0]["verdict"] == "ok"
    assert report["order"][0] == "threads" and "gpu_layers" in report["skipped"]
    searched = {t["dimension"] for t in report["trials"] if t["verdict"] == "ok"}
    assert {"baseline", "threads", "rtr"} <= searched, report["trials"]
    for trial in report["trials"]:
        assert trial["verdict"] in ("ok", "failed", "skipped")
        if trial["verdict"] == "ok":
            assert trial["pp_tps"] > 0 and trial["tg_tps"] > 0 and trial["score"] > 0
            assert "-gp" in trial["argv"] and trial["argv"][trial["argv"].index("-gp") + 1] == "256,16"
    markdown = (REPORTS / "tune.md").read_text()
    assert "| 0 | baseline |" in markdown and "Objective **mix**" in markdown


def test_the_tuned_file_names_the_build_and_model_it_was_found_for(host):
    record = tuned_record()
    served = deployment(host)
    # what came from the node is written so that the inventory never templates it
    assert re.search(r"^  build: !unsafe \"%s\"$" % re.escape(served["build"]), TUNED.read_text(), re.M)
    assert re.search(r"^  model: !unsafe \"", TUNED.read_text(), re.M)
    assert record["schema"] == "hmk-tuned/1"
    assert record["build"] == served["build"] and record["model"] == served["model"]
    assert record["model_bytes"] == host.file(served["model"]).size
    assert record["vars"] == tune_report()["vars"]
    assert set(record["vars"]) <= {"inference_service_threads", "inference_service_threads_batch",
                                   "inference_service_batch", "inference_service_ubatch", "inference_service_amb",
                                   "inference_service_run_time_repack",
                                   # searched where the engine has it (ik_llama.cpp from 8337e4cd; roles/tune)
                                   "inference_service_defer_experts"}
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", record["date"])


def test_the_service_runs_the_tuned_flags_and_serves(host):
    tuned = tuned_record()["vars"]
    assert host.service(UNIT).is_running
    args = host.file("/etc/hmk/hmk-inference.args").content_string.split("\n")
    assert args[args.index("-t") + 1] == str(tuned["inference_service_threads"])
    assert args[args.index("-ub") + 1] == str(tuned["inference_service_ubatch"])
    assert args[args.index("-amb") + 1] == str(tuned["inference_service_amb"])
    assert ("-rtr" in args) == tuned["inference_service_run_time_repack"]
    assert ("-tb" in args) == (tuned["inference_service_threads_batch"] > 0)
    pid = host.check_output("systemctl show -p MainPID --value %s" % UNIT)
    running = [a for a in host.check_output("tr '\\0' '\\n' < /proc/%s/cmdline" % pid).split("\n") if a]
    assert running == [a for a in args if a] + ["--api-key-file", "/run/hmk-inference/api-key"]
    assert deployment(host)["argv"] == [a for a in args if a]
    status, body = http("http://127.0.0.1:%d/v1/chat/completions" % PORT, KEY,
                        {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] > 0


def test_validate_shows_before_and_after_against_the_roofline_with_a_chart(host):
    report = json.loads((REPORTS / "validate.json").read_text())
    assert report["tuning"]["available"] is True, report["tuning"]
    assert report["tuning"]["before"]["tg_tps"] == tune_report()["baseline"]["tg_tps"]
    assert report["tuning"]["tuned"]["efficiency_vs_theoretical"] > 0
    markdown = (REPORTS / "validate.md").read_text()
    assert "| before tuning (search baseline) |" in markdown and "![roofline](validate-roofline.png)" in markdown
    png = (REPORTS / "validate-roofline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (1000, 650)


# ------------------------------------------------------------------------------------ metrics

def test_the_exporters_listen_on_loopback_only_and_metrics_need_the_key(host):
    listening = host.check_output("ss -Hltn")
    for port in (PORT, EXPORTER, PROMETHEUS):
        bound = re.findall(r"\s(\S+):%d\s" % port, listening)
        assert bound and set(bound) <= {"127.0.0.1"}, (port, bound)
    assert http("http://127.0.0.1:%d/metrics" % PORT)[0] == 401
    status, body = http("http://127.0.0.1:%d/metrics" % PORT, KEY)
    assert status == 200 and "llamacpp:tokens_predicted_total" in body
    config = host.file("/etc/prometheus/prometheus.yml").content_string
    assert KEY not in config and "credentials_file" in config
    key_file = host.file("/etc/prometheus/hmk/%s.api-key" % HOST)
    assert key_file.mode == 0o640 and key_file.user == "root" and key_file.group == "prometheus"
    assert KEY not in host.check_output("ps -eo args")
    # prepare left a departed node's key and door files: gone; the operator's note beside them stays
    for name in ("departed-node.api-key", "doors/departed-node.pem", "doors/departed-node.key"):
        assert not host.file("/etc/prometheus/hmk/" + name).exists, name
    assert host.file("/etc/prometheus/hmk/doors/NOTES.txt").exists


def test_prometheus_scraped_the_engine_s_tokens_counter_with_the_key():
    http("http://127.0.0.1:%d/v1/completions" % PORT, KEY, {"prompt": "The capital of France is", "max_tokens": 8})
    result = wait_for('llamacpp:tokens_predicted_total{node="%s"}' % HOST,
                      lambda r: r and float(r[0]["value"][1]) > 0)
    assert result and float(result[0]["value"][1]) > 0, result
    assert result[0]["metric"]["job"] == "hmk_engine"
    up = query('up{node="%s"}' % HOST)
    assert {r["metric"]["job"]: r["value"][1] for r in up} == {"hmk_node": "1", "hmk_engine": "1"}


def test_prometheus_has_the_kit_s_roofline_and_facts_from_the_textfile_collector(host):
    result = wait_for('hmk_roofline_efficiency{node="%s"}' % HOST, lambda r: len(r) == 2)
    assert {r["metric"]["bandwidth"] for r in result} == {"measured", "theoretical"}
    served = deployment(host)
    (info,) = query('hmk_deployment_info{node="%s"}' % HOST)
    assert info["metric"]["build"] == served["build"] and info["metric"]["model"] == "tiny-deepseek2.gguf"
    assert query('hmk_validate_numbers_meaningful{node="%s"}' % HOST)[0]["value"][1] == "0"
    assert query('hmk_tune_info{node="%s"}' % HOST)[0]["metric"]["objective"] == "mix"
    assert query('hmk_memory_bandwidth_bytes_per_second{kind="measured_read"}')
    assert query('node_textfile_scrape_error{node="%s"}' % HOST)[0]["value"][1] == "0"


def test_a_node_without_gpus_reports_no_gpu_metrics(host):
    assert not host.file("/var/lib/prometheus/node-exporter/hmk_gpu.prom").exists
    assert not host.file("/etc/systemd/system/hmk-gpu-metrics.timer").exists
    assert query('{__name__=~"hmk_gpu_.*|DCGM_.*"}') == []


def test_every_dashboard_query_runs_on_this_prometheus():
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            query(target["expr"].replace("$node", ".*"))
    assert query(dashboard["templating"]["list"][0]["query"]["query"].replace("label_values(", "").rsplit(",", 1)[0])
