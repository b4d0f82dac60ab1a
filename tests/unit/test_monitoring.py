"""monitoring: the kit's facts in Prometheus text format (only what the reports measured), the scrape configuration
(the engine's key by file, a node label on every target), the GPU collector's choice, the nvidia-smi collector on a
real nvidia-smi answer, and the Grafana dashboard's queries against the metric names that exist."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_roofline_chart import tune_json

REPO = Path(__file__).resolve().parents[2]
GPU_SCRIPT = REPO / "roles" / "monitoring" / "files" / "hmk-gpu-metrics"
DASHBOARD = REPO / "roles" / "monitoring_server" / "files" / "grafana" / "hmk-inference-node.json"


def _load(name, path):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


mon = _load("monitoring_filters", REPO / "plugins" / "filter" / "monitoring.py")
val = _load("validate_filters_for_monitoring", REPO / "plugins" / "filter" / "validate.py")
gpu = _load("hmk_gpu_metrics", GPU_SCRIPT)

# One GPU's answer to this --query-gpu list, as posted in Ricks-Lab/gpu-utils#83 (GeForce RTX 2080, driver 440.64):
# https://github.com/Ricks-Lab/gpu-utils/issues/83
REAL_FIELDS = ["power.limit", "power.min_limit", "power.max_limit", "memory.total", "vbios_version", "driver_version",
               "name", "gpu_uuid", "power.draw", "temperature.gpu", "temperature.memory", "clocks.current.graphics",
               "clocks.sm", "clocks.mem", "utilization.gpu", "utilization.memory", "fan.speed",
               "pcie.link.width.current", "pstate"]
REAL_LINE = ("200.00, 105.00, 292.00, 7979, 90.04.23.00.5F, 440.64, GeForce RTX 2080, "
             "GPU-22b2c6ac-2d49-4863-197c-9c469071178a, 176.98, 45, N/A, 1965, 1965, 7199, 86, 55, 100, 8, P2\n")
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.e+]+$')
GB = 1000 ** 3


def _check_format(text):
    names = set()
    for line in text.strip().splitlines():
        if line.startswith("# "):
            assert re.match(r"^# (HELP|TYPE) [a-z_:]+ ", line), line
            continue
        assert SAMPLE.match(line), line
        names.add(line.split("{")[0].split(" ")[0])
    return names


def validate_report():
    return val.report({
        "host": "epyc-node", "hardware": {"name": "genoa-1x4090", "cpu": {"sockets": 1},
                                          "memory": {"channels_per_socket": 12, "min_speed_mts": 4800}},
        "deployment": {"engine": "ik_llama.cpp", "build": "55d3c05bf7b3-0a1b2c3d", "commit": "55d3c05",
                       "model": "/srv/models/r1/DeepSeek-R1-IQ4_XS-00001-of-00010.gguf", "architecture": "deepseek2",
                       "total_bytes": 355 * GB, "expert_count": 256, "expert_used_count": 8,
                       "expert_bytes": {str(n): 340 * GB // 58 for n in range(3, 61)}},
        "bench_tg": {"rc": 0, "bench": [{"n_prompt": 0, "n_gen": 128, "avg_ts": 15.1, "samples_ts": [15.0, 15.2]}],
                     "seconds": 30},
        "bench_pp": {"skipped": True, "skip_reason": "check mode"},
        "membw": {"rc": 0, "stdout": json.dumps({"read_gbps": 331.0, "triad_gbps": 290.0, "threads": 32,
                                                 "array_mib": 1024, "runs": 5})},
        "min_meaningful_bytes": GB, "tiny_pattern": "^tiny-"})


def test_the_kit_s_facts_carry_the_speeds_roofline_bandwidth_deployment_preflight_and_tuning():
    rep = dict(validate_report(), passed=True)
    preflight = {"summary": {"pass": 11, "warn": 1, "fail": 1},
                 "checks": [{"id": "smt_disabled", "status": "fail"}, {"id": "memory_speed", "status": "pass"}]}
    text = mon.kit_metrics(rep, preflight, tune_json())
    names = _check_format(text)
    assert 'hmk_validate_generation_tokens_per_second{tokens="128"} 15.1' in text
    assert "hmk_validate_prompt_tokens_per_second" not in names  # the pp run did not happen: no number is made up
    assert 'hmk_memory_bandwidth_bytes_per_second{kind="theoretical"} 460800000000' in text
    assert 'hmk_memory_bandwidth_bytes_per_second{kind="measured_read"} 331000000000' in text
    ceiling = re.search(r'hmk_roofline_ceiling_tokens_per_second\{bandwidth="theoretical"\} ([0-9.]+)', text)
    assert float(ceiling.group(1)) == pytest.approx(460.8 * GB / (340 * GB // 58 * 58 * 8 / 256), rel=1e-3)
    assert re.search(r'hmk_roofline_efficiency\{bandwidth="measured"\} 0\.\d+', text)
    assert ('hmk_deployment_info{architecture="deepseek2",build="55d3c05bf7b3-0a1b2c3d",commit="55d3c05",'
            'engine="ik_llama.cpp",model="DeepSeek-R1-IQ4_XS-00001-of-00010.gguf",profile="genoa-1x4090"} 1') in text
    assert 'hmk_preflight_check{check="smt_disabled",status="fail"} 1' in text
    assert 'hmk_preflight_check{check="smt_disabled",status="pass"} 0' in text
    assert 'hmk_preflight_checks{status="fail"} 1' in text
    assert "hmk_tune_gain_ratio 0.12" in text and 'hmk_tune_generation_tokens_per_second{trial="tuned"} 14.6' in text
    assert "hmk_validate_passed 1" in text


def test_without_reports_there_is_nothing_to_say_and_labels_are_escaped():
    assert mon.kit_metrics({}, {}, {}) == "\n"
    text = mon.kit_metrics({"engine": {"engine": 'we"ird\\'}, "model": {"path": "/m/a\nb.gguf"}}, None, None)
    _check_format(text)
    assert 'engine="we\\"ird\\\\"' in text and 'model="a\\nb.gguf"' in text


def test_the_scrape_configuration_reads_the_engine_key_from_a_file_and_labels_every_target_with_its_node():
    configs = mon.scrape_configs([
        {"name": "epyc-a", "address": "10.0.0.5", "node_exporter_port": 9100, "engine_port": 8080, "engine_key": True,
         "gpu_exporter_port": 9400},
        {"name": "epyc-b", "address": "::1", "node_exporter_port": 9100, "engine_port": 8081, "engine_key": False}],
        "5s", "/etc/prometheus/hmk")
    by_job = {c["job_name"]: c for c in configs}
    assert by_job["hmk_node"]["static_configs"][1] == {"targets": ["[::1]:9100"], "labels": {"node": "epyc-b"}}
    assert by_job["hmk_gpu"]["static_configs"] == [{"targets": ["10.0.0.5:9400"], "labels": {"node": "epyc-a"}}]
    engine_a = by_job["hmk_engine_epyc-a"]
    assert engine_a["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/hmk/epyc-a.api-key"}
    assert engine_a["static_configs"][0]["labels"] == {"node": "epyc-a", "job": "hmk_engine"}
    assert "authorization" not in by_job["hmk_engine_epyc-b"]
    assert all(c["scrape_interval"] == "5s" for c in configs)
    with pytest.raises(Exception, match="not usable"):
        mon.scrape_configs([{"name": "a/b", "address": "x", "node_exporter_port": 1, "engine_port": 2}])


def test_the_gpu_collector_is_dcgm_only_where_apt_has_it_and_nothing_without_gpus():
    assert mon.gpu_exporter_choice("auto", 0, "4.5.0-1")["mode"] == "none"
    assert mon.gpu_exporter_choice("auto", 1, "1:4.5.0-1")["mode"] == "dcgm"
    assert mon.gpu_exporter_choice("auto", 4, "(none)")["mode"] == "nvidia-smi"
    assert mon.gpu_exporter_choice("nvidia-smi", 1, "1:4.5.0-1")["mode"] == "nvidia-smi"
    assert mon.gpu_exporter_choice("none", 1, "1:4.5.0-1")["mode"] == "none"
    with pytest.raises(Exception, match="no datacenter-gpu-manager-exporter"):
        mon.gpu_exporter_choice("dcgm", 1, "(none)")


def test_the_nvidia_smi_parser_reads_a_real_answer_and_skips_what_the_board_does_not_report():
    (row,) = gpu.parse(REAL_FIELDS, REAL_LINE)
    assert row["name"] == "GeForce RTX 2080" and row["power.draw"] == "176.98" and row["temperature.memory"] == "N/A"
    text = gpu.render([dict(row, index="0", uuid=row["gpu_uuid"])])
    _check_format(text)
    assert 'hmk_gpu_power_watts{gpu="0",uuid="GPU-22b2c6ac-2d49-4863-197c-9c469071178a",name="GeForce RTX 2080"} 176.98' in text
    assert "hmk_gpu_memory_total_bytes" in text and "hmk_gpu_utilization_ratio" in text
    assert 'hmk_gpu_pcie_link_width{gpu="0"' in text
    with pytest.raises(ValueError, match="fields"):
        gpu.parse(REAL_FIELDS[:3], REAL_LINE)


def _stand_in(tmp_path, body):
    """A stand-in nvidia-smi (no GPU on the test machines) on PATH."""
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir()
    path.write_text("#!/usr/bin/python3\n" + body)
    path.chmod(0o755)
    return dict(os.environ, PATH="%s:%s" % (path.parent, os.environ["PATH"]))


def test_the_collector_writes_its_file_atomically_and_says_when_nvidia_smi_fails(tmp_path):
    # Stand-in: answers the requested fields with the real RTX 2080 values above, by field name; fields that answer
    # did not include (index, memory.used, pcie.link.gen.current) get the index 0 or "[N/A]", as a board lacking them.
    env = _stand_in(tmp_path, (
        "import sys\nfields = dict(zip(%r, %r))\nfields['uuid'] = fields['gpu_uuid']\nfields['index'] = '0'\n"
        "asked = [a for a in sys.argv if a.startswith('--query-gpu=')][0].split('=', 1)[1].split(',')\n"
        "print(', '.join(fields.get(f, '[N/A]') for f in asked))\n") % (REAL_FIELDS, REAL_LINE.strip().split(", ")))
    out = tmp_path / "hmk_gpu.prom"
    subprocess.run([sys.executable, str(GPU_SCRIPT), str(out)], env=env, check=True)
    text = out.read_text()
    _check_format(text)
    assert "hmk_gpu_smi_up 1" in text and "hmk_gpu_power_watts{" in text and "hmk_gpu_memory_used_bytes" not in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hmk_gpu.")]
    failing = tmp_path / "fail"
    failing.mkdir()
    env = _stand_in(failing, "import sys\nprint('NVIDIA-SMI has failed because it couldn\\'t communicate with the NVIDIA driver.')\nsys.exit(9)\n")
    result = subprocess.run([sys.executable, str(GPU_SCRIPT), str(out)], env=env, stderr=subprocess.PIPE,
                            universal_newlines=True, check=False)
    assert result.returncode == 0 and "exited 9" in result.stderr
    assert out.read_text().strip().endswith("hmk_gpu_smi_up 0") and "hmk_gpu_power_watts" not in out.read_text()


# llama-server's /metrics at the pin (examples/server/server.cpp, handle_metrics): llamacpp:<name>.
ENGINE_METRICS = {"llamacpp:" + n for n in ("prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total",
                                            "tokens_predicted_seconds_total", "prompt_tokens_seconds",
                                            "predicted_tokens_seconds", "kv_cache_usage_ratio", "kv_cache_tokens",
                                            "requests_processing", "requests_deferred")}
DCGM_METRICS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"}


def test_the_dashboard_queries_only_metrics_that_exist():
    dashboard = json.loads(DASHBOARD.read_text())
    rep = dict(validate_report(), passed=True)
    kit = _check_format(mon.kit_metrics(rep, {"checks": [{"id": "x", "status": "pass"}], "summary": {"pass": 1}},
                                        tune_json()))
    gpu_names = {metric for _unused, metric, _unused, _unused in gpu.FIELDS if metric}
    known = ENGINE_METRICS | DCGM_METRICS | kit | gpu_names | {"up"}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    for expr in exprs:
        used = set(re.findall(r"\b(hmk_[a-z_]+|llamacpp:[a-z_]+|DCGM_[A-Z_]+)\b", expr))
        assert used and used <= known, (expr, used - known)
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("tokens/s", "queue", "roofline efficiency", "gpu board power", "gpu memory", "dram bandwidth"):
        assert subject in titles, subject
    assert dashboard["templating"]["list"][0]["name"] == "node"


KEYS = "/etc/prometheus/hmk"


def _found(*names):
    """What ansible.builtin.find gives for the key directory, two levels deep."""
    return [{"path": "%s/%s" % (KEYS, name)} for name in names]


def test_a_departed_node_s_key_and_door_files_go_and_the_current_ones_and_the_ca_stay():
    targets = [{"name": "epyc-01", "engine_key": True, "door": False},
               {"name": "Node_B.lab", "engine_key": False, "door": True},
               {"name": "epyc-03", "engine_key": "False", "door": "false"}]
    found = _found("epyc-01.api-key", "epyc-02.api-key", "epyc-03.api-key", "Node_B.lab.api-key",
                   "doors/ca.pem", "doors/node-b-lab.pem", "doors/node-b-lab.key",
                   "doors/epyc-02.pem", "doors/epyc-02.key",
                   # the operator's own files, of no kit name, and a .pem at the top level: never chosen
                   "doors/epyc-02.pem.bak", "doors/README", "operator.pem", ".api-key")
    assert mon.stale_secret_files(found, targets, KEYS + "/") == [
        # left the nodes; no key (a door or none) any more; its door now holds the key
        KEYS + "/Node_B.lab.api-key", KEYS + "/doors/epyc-02.key", KEYS + "/doors/epyc-02.pem",
        KEYS + "/epyc-02.api-key", KEYS + "/epyc-03.api-key"]
    # A node that lost its door: both of its door files go, the CA stays for the others.
    assert mon.stale_secret_files(found[4:7], [dict(targets[1], door=False)], KEYS) == [
        KEYS + "/doors/node-b-lab.key", KEYS + "/doors/node-b-lab.pem"]
    # Nothing stale: nothing chosen; plain path strings are read as well.
    assert mon.stale_secret_files([KEYS + "/epyc-01.api-key", KEYS + "/doors/ca.pem"], targets[:1], KEYS) == []
    assert mon.FilterModule().filters()["monitoring_stale_secret_files"] is not None


def test_the_stale_file_filter_refuses_what_is_not_the_role_s_target_list():
    with pytest.raises(mon.AnsibleFilterError, match="monitoring_stale_secret_files"):
        mon.stale_secret_files([], {"epyc-01": {}})
    with pytest.raises(mon.AnsibleFilterError, match="needs a name"):
        mon.stale_secret_files([], [{"engine_key": True}])
