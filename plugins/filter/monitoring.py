# -*- coding: utf-8 -*-
"""The monitoring roles' rendering, as plain functions with unit tests.

kit_metrics turns the kit's own reports on the control machine (validate.json, preflight.json, tune.json) into a
Prometheus text-format file for node_exporter's textfile collector: validate's speeds, the roofline ceilings and
efficiency, the measured and theoretical bandwidth, what is deployed (build and model, as an info metric), the
preflight verdicts and the tuned flags' gain. A value the report marks unavailable is left out, never invented.
scrape_configs renders the Prometheus server's scrape jobs for the inference nodes.
tests/unit/test_monitoring.py imports this file directly.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_door import door_names, door_stale_client_files
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters, refusal, rule_ip, rule_port

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

GB = 1000 ** 3
HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")
PREFLIGHT_STATUSES = ("pass", "warn", "fail")


def _fail(msg):
    raise AnsibleFilterError(msg)


def _label_value(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels):
    if not labels:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (key, _label_value(labels[key])) for key in sorted(labels))


def _number(value):
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number  # NaN is no measurement


class _Metrics(object):
    def __init__(self):
        self.families = []  # (name, help, type, [(labels, value)])

    def add(self, name, help_text, value, labels=None, kind="gauge"):
        number = _number(value)
        if number is None:
            return
        for family in self.families:
            if family[0] == name:
                family[3].append((labels or {}, number))
                return
        self.families.append((name, help_text, kind, [(labels or {}, number)]))

    def text(self):
        lines = []
        for name, help_text, kind, samples in self.families:
            lines.append("# HELP %s %s" % (name, help_text))
            lines.append("# TYPE %s %s" % (name, kind))
            for labels, value in samples:
                lines.append("%s%s %s" % (name, _labels(labels), repr(value) if value != int(value) else int(value)))
        return "\n".join(lines) + "\n"


def _available(part):
    return isinstance(part, dict) and part.get("available", True) is not False


def kit_metrics(validate=None, preflight=None, tune=None):
    """The kit's facts about a node in Prometheus text format (node_exporter textfile collector)."""
    metrics = _Metrics()
    validate, preflight, tune = validate or {}, preflight or {}, tune or {}
    if validate:
        engine, model = validate.get("engine") or {}, validate.get("model") or {}
        metrics.add("hmk_deployment_info", "What the inference service runs (validate's deployment record).", 1,
                    {"engine": engine.get("engine") or "", "build": engine.get("build") or "",
                     "commit": engine.get("commit") or "", "model": str(model.get("path") or "").rsplit("/", 1)[-1],
                     "architecture": model.get("architecture") or "", "profile": validate.get("profile") or ""})
        metrics.add("hmk_validate_passed", "1 when the last validation's health, completion and bench passed.",
                    validate.get("passed"))
        metrics.add("hmk_validate_numbers_meaningful", "0 when the model is too small (or a test model) for its speeds "
                    "to say anything about the hardware.", model.get("numbers_meaningful"))
        bench = validate.get("bench") or {}
        for kind, name in (("pp", "prompt"), ("tg", "generation")):
            part = bench.get(kind) or {}
            if _available(part):
                metrics.add("hmk_validate_%s_tokens_per_second" % name,
                            "llama-bench %s speed at the service's flags (validate)." % kind, part.get("tps"),
                            {"tokens": part.get("tokens", "")})
        bandwidth = validate.get("memory_bandwidth") or {}
        measured, theoretical = bandwidth.get("measured") or {}, bandwidth.get("theoretical") or {}
        help_bw = "DRAM bandwidth: measured by hmk-membw (read, triad) and theoretical from the profile."
        if _available(measured):
            metrics.add("hmk_memory_bandwidth_bytes_per_second", help_bw, _scaled(measured.get("read_gbps")),
                        {"kind": "measured_read"})
            metrics.add("hmk_memory_bandwidth_bytes_per_second", help_bw, _scaled(measured.get("triad_gbps")),
                        {"kind": "measured_triad"})
        if _available(theoretical):
            metrics.add("hmk_memory_bandwidth_bytes_per_second", help_bw, _scaled(theoretical.get("gbps")),
                        {"kind": "theoretical"})
        line = validate.get("roofline") or {}
        if _available(line):
            metrics.add("hmk_roofline_expert_bytes_per_token", "Routed-expert bytes one generated token reads.",
                        line.get("expert_bytes_per_token"))
            for label in ("measured", "theoretical"):
                ceiling = line.get("ceiling_tps_at_%s_bandwidth" % label)
                efficiency = line.get("efficiency_vs_%s" % label)
                metrics.add("hmk_roofline_ceiling_tokens_per_second", "Generation ceiling: bandwidth / expert bytes "
                            "per token.", ceiling if not isinstance(ceiling, dict) else None, {"bandwidth": label})
                metrics.add("hmk_roofline_efficiency", "Measured generation speed / the ceiling at that bandwidth.",
                            efficiency if not isinstance(efficiency, dict) else None, {"bandwidth": label})
    if preflight:
        checks = preflight.get("checks") or []
        for check in checks:
            status = check.get("status")
            if status not in PREFLIGHT_STATUSES:
                continue
            for candidate in PREFLIGHT_STATUSES:
                metrics.add("hmk_preflight_check", "Preflight verdict per check: 1 on the series of its status.",
                            1 if candidate == status else 0, {"check": check.get("id") or "?", "status": candidate})
        summary = preflight.get("summary") or {}
        for status in PREFLIGHT_STATUSES:
            metrics.add("hmk_preflight_checks", "Preflight checks by status.", summary.get(status), {"status": status})
    if tune and tune.get("ok"):
        objective = tune.get("objective") or {}
        metrics.add("hmk_tune_info", "The tuned flags' search (playbooks/tune.yml).", 1,
                    {"objective": objective.get("kind") or "", "date": tune.get("date") or "",
                     "build": tune.get("build") or "", "changed": ",".join(tune.get("changed_flags") or [])})
        metrics.add("hmk_tune_gain_ratio", "Score of the tuned flags / score of the flags before tuning, minus 1.",
                    tune.get("gain"))
        for part in ("baseline", "best"):
            trial = tune.get(part) or {}
            metrics.add("hmk_tune_generation_tokens_per_second", "Generation speed of the search's trial.",
                        trial.get("tg_tps"), {"trial": "before" if part == "baseline" else "tuned"})
    return metrics.text()


def _scaled(gbps):
    number = _number(gbps)
    return None if number is None else number * GB


def scrape_configs(nodes, scrape_interval="15s", key_dir="/etc/prometheus/hmk"):
    """Prometheus scrape_configs for the inference nodes.

    nodes: [{name, address, node_exporter_port, engine_port, engine_key (bool), gpu_exporter_port (0: none), door
    (bool), door_monitoring (bool)}]. Every target gets a `node` label (the inventory name) so the engine's and the
    kit's series join on it. The engine's /metrics needs its API key when one is set: it is read from
    key_dir/<node>.api-key (credentials_file), never written into the configuration. A node with a door
    (inference_service_door) is scraped over TLS with the certificate issued for Prometheus' scrapes of that node
    (key_dir/doors/<slug>.pem and .key, the door CA in key_dir/doors/ca.pem); its door adds the node's key, so no key
    file is read. A door that does not let Prometheus in (inference_service_door_monitoring) is refused.
    """
    jobs = {"hmk_node": [], "hmk_engine": [], "hmk_gpu": []}
    for node in nodes or []:
        name = str(node["name"])
        if not re.match(r"^[A-Za-z0-9._-]+$", name):
            _fail("node name %r is not usable as a file name and a label" % name)
        address = node.get("address")
        if rule_ip(address) and not (isinstance(address, str) and HOST_NAME.fullmatch(address)):
            _fail(refusal("%s: monitoring_scrape_address (or ansible_host)" % name, address,
                          "an IP address or a host name of letters, digits, . and -"))
        for key, var in (("node_exporter_port", "monitoring_node_exporter_port"), ("engine_port", "inference_service_port"),
                         ("gpu_exporter_port", "monitoring_dcgm_exporter_port")):
            # gpu_exporter_port 0: the node has no DCGM exporter to scrape.
            if key in node and not (key == "gpu_exporter_port" and node[key] in (0, "0", None)):
                problem = rule_port(node[key])
                if problem:
                    _fail(refusal("%s: %s" % (name, var), node[key], problem))
        host = "[%s]" % address if ":" in address else address
        jobs["hmk_node"].append({"targets": ["%s:%d" % (host, int(node["node_exporter_port"]))], "labels": {"node": name}})
        engine = {"targets": ["%s:%d" % (host, int(node["engine_port"]))], "labels": {"node": name}}
        if _true(node.get("door")):
            if not _true(node.get("door_monitoring")):
                _fail("%s serves through a door that lets the gateway only: set inference_service_door_monitoring: "
                      "true on %s (its door then lets Prometheus read /metrics with a certificate of its own), or "
                      "leave %s out of monitoring_server_nodes" % (name, name, name))
            try:
                names = door_names(name)
            except ValueError as exc:
                _fail("%s: %s" % (name, exc))
            engine["tls"] = {"ca_file": "%s/doors/ca.pem" % key_dir,
                             "cert_file": "%s/doors/%s.pem" % (key_dir, names["slug"]),
                             "key_file": "%s/doors/%s.key" % (key_dir, names["slug"]),
                             "server_name": names["server"]}
        elif node.get("engine_key"):
            engine["key_file"] = "%s/%s.api-key" % (key_dir, name)
        jobs["hmk_engine"].append(engine)
        if int(node.get("gpu_exporter_port") or 0) > 0:
            jobs["hmk_gpu"].append({"targets": ["%s:%d" % (host, int(node["gpu_exporter_port"]))],
                                    "labels": {"node": name}})
    configs = []
    for job in ("hmk_node", "hmk_gpu"):
        if jobs[job]:
            configs.append({"job_name": job, "scrape_interval": scrape_interval,
                            "static_configs": [{"targets": t["targets"], "labels": t["labels"]} for t in jobs[job]]})
    # One job per key: Prometheus takes one authorization per scrape config.
    for target in jobs["hmk_engine"]:
        config = {"job_name": "hmk_engine_%s" % target["labels"]["node"], "scrape_interval": scrape_interval,
                  "metrics_path": "/metrics",
                  "static_configs": [{"targets": target["targets"], "labels": dict(target["labels"], job="hmk_engine")}]}
        if target.get("key_file"):
            config["authorization"] = {"type": "Bearer", "credentials_file": target["key_file"]}
        if target.get("tls"):
            config["scheme"] = "https"
            config["tls_config"] = dict(target["tls"], insecure_skip_verify=False)
        configs.append(config)
    return configs


def _true(value):
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def gpu_exporter_choice(requested, gpu_count, dcgm_candidate):
    """Which GPU collector a node gets: {mode: dcgm|nvidia-smi|none, reason}."""
    if int(gpu_count or 0) <= 0:
        return {"mode": "none", "reason": "the hardware profile declares no GPU: no GPU metrics are collected"}
    if requested == "none":
        return {"mode": "none", "reason": "monitoring_gpu_exporter is none"}
    has_dcgm = bool(dcgm_candidate) and str(dcgm_candidate) != "(none)"
    if requested == "dcgm" and not has_dcgm:
        _fail("monitoring_gpu_exporter is dcgm but apt offers no datacenter-gpu-manager-exporter (NVIDIA's CUDA "
              "repository carries it; nvidia_driver_source: nvidia adds it)")
    if requested == "dcgm" or (requested == "auto" and has_dcgm):
        return {"mode": "dcgm", "reason": "NVIDIA's repository offers datacenter-gpu-manager-exporter %s" % dcgm_candidate}
    return {"mode": "nvidia-smi", "reason": "nvidia-smi into the textfile collector%s" % (
        "" if requested == "nvidia-smi" else " (apt offers no datacenter-gpu-manager-exporter)")}


def stale_secret_files(files, targets, key_dir="/etc/prometheus/hmk"):
    """Paths among `files` (what ansible.builtin.find gives for Prometheus' key directory and its doors/ directory)
    that no current scrape target (`targets`, the role's list of {name, engine_key, door}) uses any more: the
    <node>.api-key of a node that left monitoring_server_nodes, or whose key its door now holds, and the door files
    <slug>.pem / <slug>.key of a node that left or lost its door. Each opens a node Prometheus no longer scrapes (a key
    or a client certificate its door still trusts), so it goes. The door CA's ca.pem and files of any other name stay.
    Sorted."""
    if not isinstance(targets, list):
        _fail("monitoring_stale_secret_files: expected the role's list of scrape targets, got %s" % type(targets).__name__)
    key_dir = str(key_dir).rstrip("/")
    door_dir = key_dir + "/doors"
    keyed = set()
    doors = set()
    for target in targets:
        if not isinstance(target, dict) or not target.get("name"):
            _fail("monitoring_stale_secret_files: each target needs a name, got %r" % (target,))
        if _true(target.get("engine_key", False)):
            keyed.add(str(target["name"]))
        if _true(target.get("door", False)):
            doors.add(door_names(target["name"])["slug"])
    stale = []
    in_doors = {}
    for entry in files or []:
        path = str(entry.get("path", "") if isinstance(entry, dict) else entry).rstrip("/")
        parent, _sep, name = path.rpartition("/")
        if parent == key_dir and name.endswith(".api-key") and len(name) > len(".api-key"):
            if name[:-len(".api-key")] not in keyed:
                stale.append(path)
        elif parent == door_dir:
            in_doors[name] = path
    stale += [in_doors[name] for name in door_stale_client_files(list(in_doors), doors, (".pem", ".key"))]
    return sorted(stale)


class FilterModule(object):
    """Filters of the monitoring roles."""

    def filters(self):
        return guard_filters({
            "monitoring_kit_metrics": kit_metrics,
            "monitoring_scrape_configs": scrape_configs,
            "monitoring_gpu_exporter_choice": gpu_exporter_choice,
            "monitoring_stale_secret_files": stale_secret_files,
        }, AnsibleFilterError)
