# -*- coding: utf-8 -*-
"""The validate role's arithmetic and report, as plain functions with unit tests.

BRIEF section 7: generation speed is bounded by DRAM bandwidth / bytes of routed experts read per token.
Here: the theoretical bandwidth of a hardware profile, the routed-expert bytes a token reads (from the
per-layer expert bytes of the deployed GGUF), the roofline ceilings and the efficiency of a measured tg,
the llama-bench command mapped from the service's own arguments, the energy of the generation run (RAPL
wraparound, GPU board power) and the report (JSON and Markdown). Every number in the report is either
measured, derived from measured numbers, or an explicit {"available": false, "reason": ...}.
tests/unit/test_validate.py imports this file directly. Hardware output (nvidia-smi's power samples) and the
bandwidth formula come from the kit's one hardware package, module_utils/hmk_hardware.py.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hardware as hw
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_perplexity

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

GB = 1000 ** 3
GIB = 1024 ** 3
SCHEMA = "hmk-validate/1"


def _fail(msg):
    raise AnsibleFilterError(msg)


def unavailable(reason):
    """The one shape of a value the kit could not measure."""
    return {"available": False, "reason": str(reason)}


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------ bandwidth and roofline

def theoretical_bandwidth(hardware):
    """Peak DRAM bandwidth of a hardware profile: sockets x channels per socket x MT/s x 8 bytes."""
    hardware = hardware or {}
    cpu, memory = hardware.get("cpu") or {}, hardware.get("memory") or {}
    sockets = int(cpu.get("sockets") or 1)
    channels, speed = memory.get("channels_per_socket"), memory.get("min_speed_mts")
    if not channels or not speed:
        return unavailable("the hardware profile has no memory.channels_per_socket / memory.min_speed_mts")
    gbps = hw.theoretical_bandwidth_gbs(sockets * int(channels), int(speed))
    return {"available": True, "gbps": gbps,
            "formula": "%d socket(s) x %d channels x %d MT/s x 8 bytes" % (sockets, int(channels), int(speed))}


def expert_bytes_per_token(expert_bytes, expert_count, expert_used_count, layers=None):
    """Routed-expert bytes one token reads: sum over MoE layers of layer bytes / expert_count x expert_used_count.

    expert_bytes: {layer: bytes} as hmk_gguf_layout returns it. layers: only these layers (for example the
    ones whose experts stay in DRAM), or all of them when None.
    """
    count, used = int(expert_count or 0), int(expert_used_count or 0)
    if count <= 0 or used <= 0 or used > count:
        _fail("need 0 < expert_used_count (%s) <= expert_count (%s): is this a MoE model?" % (used, count))
    if not expert_bytes:
        _fail("the model has no routed-expert tensors (blk.N.ffn_*_exps.weight)")
    wanted = None if layers is None else set(int(n) for n in layers)
    total = 0.0
    for layer, size in expert_bytes.items():
        if wanted is None or int(layer) in wanted:
            total += float(size) / count * used
    return int(round(total))


def roofline(bytes_per_token, measured_gbps=None, theoretical_gbps=None, tg_tps=None):
    """Ceilings (tok/s) at the measured and the theoretical bandwidth, and the efficiency of a measured tg."""
    if not bytes_per_token or int(bytes_per_token) <= 0:
        return unavailable("no routed-expert bytes per token")
    per_token = int(bytes_per_token)
    tg = _num(tg_tps)
    out = {"available": True, "expert_bytes_per_token": per_token,
           "gb_per_token": round(per_token / GB, 3)}
    for label, bandwidth in (("measured", measured_gbps), ("theoretical", theoretical_gbps)):
        bandwidth = _num(bandwidth)
        if bandwidth is None or bandwidth <= 0:
            out["ceiling_tps_at_%s_bandwidth" % label] = unavailable("no %s bandwidth" % label)
            out["efficiency_vs_%s" % label] = unavailable("no %s bandwidth" % label)
            continue
        ceiling = bandwidth * GB / per_token
        out["ceiling_tps_at_%s_bandwidth" % label] = round(ceiling, 2)
        out["efficiency_vs_%s" % label] = (round(tg / ceiling, 4) if tg is not None
                                           else unavailable("no measured generation speed"))
    return out


# ------------------------------------------------------------------------------------ energy

def rapl_energy(rapl):
    """Joules and average watts of the CPU packages from the helper's before/after counters (with wraparound)."""
    rapl = rapl or {}
    if not rapl.get("available"):
        return unavailable(rapl.get("reason") or "RAPL was not read")
    domains = rapl.get("domains") or []
    seconds = _num(rapl.get("seconds"))
    if not domains or not seconds:
        return unavailable("no package zone had counters before and after the run")
    joules, per_zone = 0.0, []
    for zone in domains:
        before, after = int(zone["energy_uj"]), int(zone["energy_uj_after"])
        span = int(zone.get("max_energy_range_uj") or 0)
        delta = after - before
        if delta < 0:
            if span <= 0:
                return unavailable("%s wrapped and has no max_energy_range_uj" % zone.get("zone"))
            delta += span + 1  # the counter runs 0..max_energy_range_uj, then starts again at 0
        joules += delta / 1e6
        per_zone.append({"zone": zone.get("zone"), "name": zone.get("name"), "joules": round(delta / 1e6, 3)})
    return {"available": True, "joules": round(joules, 3), "seconds": seconds,
            "average_watts": round(joules / seconds, 2), "zones": per_zone}


def gpu_energy(gpu_power, seconds):
    """Average board power (summed over GPUs) and energy over the run from nvidia-smi's raw samples."""
    gpu_power = gpu_power or {}
    if not gpu_power.get("available"):
        return unavailable(gpu_power.get("reason") or "GPU power was not sampled")
    per_gpu = {}
    for sample in hw.parse_nvidia_smi_power(gpu_power.get("raw")):
        per_gpu.setdefault(sample["gpu"], []).append(sample["watts"])
    seconds = _num(seconds)
    if not per_gpu:
        return unavailable("nvidia-smi gave no power.draw sample: %s" % (
            (gpu_power.get("stderr") or "").strip() or (gpu_power.get("raw") or "").strip()[-300:] or "no output"))
    if not seconds:
        return unavailable("the tg run has no wall time")
    averages = {gpu: sum(values) / len(values) for gpu, values in sorted(per_gpu.items())}
    watts = sum(averages.values())
    return {"available": True, "average_watts": round(watts, 2), "joules": round(watts * seconds, 3),
            "seconds": seconds, "samples": sum(len(v) for v in per_gpu.values()),
            "per_gpu_average_watts": {str(k): round(v, 2) for k, v in averages.items()}}


def tokens_per_joule(tg_tps, cpu, gpu):
    """Generated tokens per joule of the sources whose power is known (tg tok/s / their average watts)."""
    tg = _num(tg_tps)
    if tg is None:
        return unavailable("no measured generation speed")
    known = [(name, part) for name, part in (("cpu_package", cpu), ("gpu_board", gpu)) if part.get("available")]
    if not known:
        return unavailable("neither CPU package energy nor GPU board power could be read")
    watts = sum(float(part["average_watts"]) for _unused, part in known)
    if watts <= 0:
        return unavailable("the measured power is zero")
    return {"available": True, "value": round(tg / watts, 4), "watts": round(watts, 2),
            "basis": [name for name, _unused in known]}


# ------------------------------------------------------------------------------------ llama-bench

_FLAG = re.compile(r"(?:^|[\s,|])(-{1,2}[A-Za-z][\w-]*)")


def bench_flags(help_text):
    """Flags a llama-bench --help lists (only the option column of each line, not its description)."""
    flags = set()
    for line in (help_text or "").splitlines():
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        column = re.split(r"\s{2,}|\s<|\s\(", stripped, maxsplit=1)[0]
        flags.update(match.group(1) for match in _FLAG.finditer(" " + column))
    return flags


def _help_line(help_text, flag):
    """The --help line that documents flag ("" when none does)."""
    for line in (help_text or "").splitlines():
        if flag in bench_flags(line):
            return line
    return ""


def _server_options(argv):
    """{flag: [values]} of a llama-server argv (flags without a value map to [None])."""
    options, index = {}, 0
    while index < len(argv):
        item = str(argv[index])
        if item.startswith("-") and not re.match(r"^-\d", item):
            value = None
            if index + 1 < len(argv) and not (str(argv[index + 1]).startswith("-")
                                              and not re.match(r"^-\d", str(argv[index + 1]))):
                value = str(argv[index + 1])
                index += 1
            options.setdefault(item, []).append(value)
        index += 1
    return options


def bench_argv(server_argv, help_text, binary):
    """llama-bench arguments for the service's own settings, keeping only the flags this llama-bench accepts.

    Maps -m, -t (with -tb as ik's -tgb pair), -rtr, -ngl, -b, -ub, -ctk, -ctv, -mla, -amb, -fa, -fmoe, -sm,
    --defer-experts, --numa and -ot of the llama-server argv. Returns
    {"base": [binary and flags], "mapped": [...], "dropped": [flags of the service the bench does not accept]};
    bench_command adds the sizes of a pp or tg run.
    """
    accepted = bench_flags(help_text)
    if "-o" not in accepted and "--output" not in accepted:
        _fail("this llama-bench lists no -o/--output in --help: cannot read its results as JSON")
    options = _server_options(list(server_argv or [])[1:])
    if "-m" not in options:
        _fail("the service's arguments have no -m MODEL")
    argv = [str(binary), "-m", options["-m"][0]]
    mapped, dropped = ["-m"], []
    if "-tb" in options:
        # ik's llama-bench sets generation and batch threads as one pair (-tgb T,TB); -t sets both to T.
        if "-tgb" in accepted:
            argv += ["-tgb", "%s,%s" % (options.get("-t", options["-tb"])[-1], options["-tb"][-1])]
            mapped.append("-tb")
            options.pop("-t", None)
        else:
            dropped.append("-tb")
    if "-rtr" in options:
        if "-rtr" in accepted:
            argv += ["-rtr", "1"]
            mapped.append("-rtr")
        else:
            dropped.append("-rtr")
    for flag in ("-t", "-ngl", "-b", "-ub", "-ctk", "-ctv", "-mla", "-amb"):
        if flag in options:
            if flag in accepted:
                argv += [flag, options[flag][-1]]
                mapped.append(flag)
            else:
                dropped.append(flag)
    # llama-bench takes 0/1 where the server takes on/off, a bare switch, or nothing (on by default).
    for flag in ("-fa", "-fmoe"):
        if flag in options:
            if flag in accepted:
                value = options[flag][-1]
                argv += [flag, "0" if value in ("off", "0", "false") else "1"]
                mapped.append(flag)
            else:
                dropped.append(flag)
    # the opt-in engine flags (issue 25): -sm graph with its value, --defer-experts bare, in both tools' spelling
    if "-sm" in options:
        if "-sm" in accepted:
            argv += ["-sm", options["-sm"][-1]]
            mapped.append("-sm")
        else:
            dropped.append("-sm")
    if "--defer-experts" in options:
        if "--defer-experts" in accepted:
            argv.append("--defer-experts")
            mapped.append("--defer-experts")
        else:
            dropped.append("--defer-experts")
    if "--numa" in options:
        if "--numa" in accepted:
            argv += ["--numa", options["--numa"][-1]]
            mapped.append("--numa")
        else:
            dropped.append("--numa")
    if "-ot" in options:
        rules = [v for v in options["-ot"] if v]
        if "-ot" not in accepted:
            dropped.append("-ot")
        elif ";" in _help_line(help_text, "-ot"):
            # mainline: one -ot holds a configuration's rules separated by ';' (a second -ot would be a sweep)
            argv += ["-ot", ";".join(rules)]
            mapped.append("-ot")
        else:
            # ik_llama.cpp: every -ot appends its rules to the one configuration, in first-match order; one rule
            # per -ot, because a ',' inside a rule would split it
            for rule in rules:
                argv += ["-ot", rule]
            mapped.append("-ot")
    return {"base": argv, "mapped": mapped, "dropped": dropped}


def bench_command(bench, kind, tokens, repetitions=3):
    """The full llama-bench argv of one run: pp (-p TOKENS -n 0) or tg (-p 0 -n TOKENS), JSON output."""
    if kind not in ("pp", "tg"):
        _fail("bench kind is pp or tg, not %r" % kind)
    sizes = ["-p", str(int(tokens)), "-n", "0"] if kind == "pp" else ["-p", "0", "-n", str(int(tokens))]
    return list(bench["base"]) + sizes + ["-r", str(int(repetitions)), "-o", "json"]


def bench_result(raw, kind):
    """pp or tg speed from the helper's output (llama-bench -o json rows)."""
    raw = raw or {}
    if raw.get("skipped"):
        return unavailable(raw.get("skip_reason") or "the bench did not run")
    if int(raw.get("rc", 1)) != 0:
        return unavailable("llama-bench exited %s: %s" % (raw.get("rc"), (raw.get("stderr_tail") or "")[-300:]))
    key = "n_prompt" if kind == "pp" else "n_gen"
    rows = [row for row in raw.get("bench") or [] if int(row.get(key) or 0) > 0]
    if not rows:
        return unavailable(raw.get("bench_error") or "llama-bench printed no %s row" % kind)
    row = rows[-1]
    return {"available": True, "tokens": int(row[key]), "tps": round(float(row["avg_ts"]), 2),
            "stddev_tps": round(float(row.get("stddev_ts") or 0.0), 2),
            "repetitions": len(row.get("samples_ts") or []) or unavailable("llama-bench gave no samples_ts"),
            "seconds": raw.get("seconds") if raw.get("seconds") is not None else unavailable("no wall time")}


# ------------------------------------------------------------------------------------ meaning and seeds

def model_meaning(total_bytes, model_path, min_bytes, tiny_pattern):
    """Whether speed numbers on this model say anything about the hardware (a tiny test model's do not)."""
    name = str(model_path or "").rsplit("/", 1)[-1]
    if tiny_pattern and re.search(tiny_pattern, name):
        return {"meaningful": False, "reason": "%s is a tiny test model (matches %s): the speeds and the roofline "
                "efficiency are not meaningful" % (name, tiny_pattern)}
    if int(total_bytes or 0) < int(min_bytes):
        return {"meaningful": False, "reason": "the model is %.1f MiB, under %.0f MiB: the speeds and the roofline "
                "efficiency are not meaningful" % (int(total_bytes or 0) / 1048576.0, int(min_bytes) / 1048576.0)}
    return {"meaningful": True, "reason": "model of %.1f GiB" % (int(total_bytes) / float(GIB))}


def seed_figures(table, profile_name, model_path):
    """Published figures (BRIEF section 7) for this hardware profile and model, matched on the model file name."""
    name = str(model_path or "").rsplit("/", 1)[-1]
    entries = [dict(entry) for entry in (table or [])
               if entry.get("profile") == profile_name and re.search(str(entry.get("model_pattern")), name)]
    if not entries:
        return unavailable("no published figure for profile %s with %s" % (profile_name or "none", name))
    for entry in entries:
        entry.pop("model_pattern", None)
    return {"available": True, "entries": entries}


# ------------------------------------------------------------------------------------ the report

def _health(raw):
    raw = raw or {}
    if raw.get("skipped") or int(raw.get("status", -1)) < 0:
        return unavailable(raw.get("skip_reason") or raw.get("msg") or "/health was not queried")
    body = raw.get("json")
    return {"available": True, "ok": int(raw["status"]) == 200, "status": int(raw["status"]),
            "body": body if body is not None else (raw.get("content") or "")[:200]}


def _completion(raw):
    raw = raw or {}
    if raw.get("skipped") or "status" not in raw:
        return unavailable(raw.get("skip_reason") or raw.get("msg") or "no completion was requested")
    body = raw.get("json") or {}
    if int(raw["status"]) != 200 or not body.get("choices"):
        return unavailable("POST /v1/completions answered %s: %s" % (raw["status"], str(body)[:200]))
    usage, timings = body.get("usage") or {}, body.get("timings")
    out = {"available": True, "status": int(raw["status"]), "text": body["choices"][0].get("text", ""),
           "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens")}
    for field in ("prompt_tokens", "completion_tokens"):
        if out[field] is None:
            out[field] = unavailable("the server's usage has no %s" % field)
    if timings:
        out["timings"] = {key: timings[key] if timings.get(key) is not None
                          else unavailable("the server's timings have no %s" % key)
                          for key in ("prompt_per_second", "predicted_per_second", "prompt_n", "predicted_n")}
    else:
        out["timings"] = unavailable("the server's answer has no timings object")
    return out


def _membw(raw):
    raw = raw or {}
    if raw.get("skipped") or raw.get("rc", 1) != 0 or not raw.get("stdout"):
        return unavailable(raw.get("skip_reason") or "hmk-membw failed: %s" % (raw.get("stderr") or raw.get("msg") or "?"))
    data = json.loads(raw["stdout"])
    return {"available": True, "read_gbps": data["read_gbps"], "triad_gbps": data["triad_gbps"],
            "threads": data["threads"], "array_mib": data["array_mib"], "runs": data["runs"]}


def report(inputs):
    """The validation report from the raw results the role gathered.

    inputs: host, hardware (hmk_hardware), deployment (the inference_service deployment record), health and
    completion (uri results), bench (the llama-bench mapping), bench_pp and bench_tg (the helper's outputs),
    membw (the command result), seeds (validate_seed_figures), min_meaningful_bytes, tiny_pattern.
    """
    hardware, deployment = inputs.get("hardware") or {}, inputs.get("deployment") or {}
    meaning = model_meaning(deployment.get("total_bytes"), deployment.get("model"),
                            inputs.get("min_meaningful_bytes", GIB), inputs.get("tiny_pattern"))
    pp, tg = bench_result(inputs.get("bench_pp"), "pp"), bench_result(inputs.get("bench_tg"), "tg")
    measured = _membw(inputs.get("membw"))
    theoretical = theoretical_bandwidth(hardware)
    tg_tps = tg["tps"] if tg.get("available") else None
    try:
        per_token = expert_bytes_per_token(deployment.get("expert_bytes"), deployment.get("expert_count"),
                                           deployment.get("expert_used_count"))
        line = roofline(per_token, measured.get("read_gbps"), theoretical.get("gbps"), tg_tps)
        cpu_layers = deployment.get("cpu_expert_layers")
        if line.get("available") and cpu_layers is not None and measured.get("available"):
            dram = expert_bytes_per_token(deployment["expert_bytes"], deployment["expert_count"],
                                          deployment["expert_used_count"], cpu_layers) if cpu_layers else 0
            line["dram_expert_bytes_per_token"] = dram
            line["ceiling_tps_dram_experts_only"] = (round(measured["read_gbps"] * GB / dram, 2) if dram
                                                     else unavailable("every MoE layer's experts are on GPUs"))
    except (AnsibleFilterError, ValueError, TypeError, KeyError) as exc:
        line = unavailable(str(exc))
    bench_tg = inputs.get("bench_tg") or {}
    cpu = rapl_energy(bench_tg.get("rapl") or unavailable(bench_tg.get("skip_reason") or "RAPL was not read"))
    gpu = gpu_energy(bench_tg.get("gpu_power") or unavailable(bench_tg.get("skip_reason") or "GPU power was not sampled"),
                     bench_tg.get("seconds"))
    bench = inputs.get("bench") or {}
    tuning = tuning_section(inputs.get("tuning"), inputs.get("deployment_sha256"), line, tg_tps)
    result = {
        "schema": SCHEMA,
        "host": inputs.get("host"),
        "profile": hardware.get("name") or "none",
        "engine": {"engine": deployment.get("engine"), "build": deployment.get("build"),
                   "commit": deployment.get("commit")},
        "model": {"path": deployment.get("model"), "architecture": deployment.get("architecture"),
                  "total_bytes": deployment.get("total_bytes"), "expert_count": deployment.get("expert_count"),
                  "expert_used_count": deployment.get("expert_used_count"),
                  "numbers_meaningful": meaning["meaningful"], "meaning": meaning["reason"]},
        "health": _health(inputs.get("health")),
        "completion": _completion(inputs.get("completion")),
        "bench": {"pp": pp, "tg": tg,
                  "commands": {kind: (inputs.get("bench_" + kind) or {}).get("command")
                               or unavailable((inputs.get("bench_" + kind) or {}).get("skip_reason")
                                              or "llama-bench was not run")
                               for kind in ("pp", "tg")},
                  "mapped_flags": bench.get("mapped", []), "dropped_flags": bench.get("dropped", []),
                  "service_stopped_for_bench": bool(inputs.get("service_stopped"))},
        "memory_bandwidth": {
            "measured": measured, "theoretical": theoretical,
            "measured_fraction_of_theoretical": (
                round(measured["read_gbps"] / theoretical["gbps"], 4)
                if measured.get("available") and theoretical.get("available")
                else unavailable("needs both the measured and the theoretical bandwidth"))},
        "roofline": line,
        "power": {"during": "the llama-bench tg run (its wall time, model load and warm-up included)", "cpu_package": cpu, "gpu_board": gpu,
                  "tokens_per_joule": tokens_per_joule(tg_tps, cpu, gpu)},
        "published": inputs.get("seeds") or unavailable("no seed table"),
        "tuning": tuning,
        # Whether the answers are right (the gate's probes again) and the perplexity over the kit's text holds.
        "answers": inputs.get("answers") or {"status": "skipped", "reason": "the answer probe was not run"},
        "perplexity": inputs.get("perplexity") or {"status": "skipped", "reason": "llama-perplexity was not run"},
    }
    return result


def _efficiencies(tps, line):
    out = {}
    for label in ("measured", "theoretical"):
        ceiling = (line or {}).get("ceiling_tps_at_%s_bandwidth" % label)
        out["efficiency_vs_%s" % label] = (round(float(tps) / ceiling, 4)
                                           if tps is not None and isinstance(ceiling, (int, float)) and ceiling > 0
                                           else unavailable("no %s ceiling or no generation speed" % label))
    return out


def tuning_section(tune, deployment_sha256, line, tg_tps):
    """Before and after tuning (playbooks/tune.yml's report of this very deployment) against the roofline.

    before: the search's baseline trial (the service's flags before tuning); tuned: its winning trial; validated: this
    report's own llama-bench tg of the tuned service. The search's speeds are at its objective's sizes (generation after
    a prompt of prompt_tokens), validate's at validate_bench_gen_tokens on an empty context.
    """
    tune = tune or {}
    if not tune:
        return unavailable("this deployment was not tuned (no tune.json on the control machine)")
    if not deployment_sha256 or tune.get("deployment_sha256") != deployment_sha256:
        return unavailable("tune.json is of another deployment (tuned %s for build %s); run playbooks/tune.yml again"
                           % (tune.get("date"), tune.get("build")))
    if not tune.get("ok"):
        return unavailable("the search found no working flags: %s" % tune.get("stopped"))
    out = {"available": True, "date": tune.get("date"), "objective": tune.get("objective"),
           "gain": tune.get("gain"), "changed_flags": tune.get("changed_flags", []),
           "trials": len(tune.get("trials") or []), "stopped": tune.get("stopped")}
    for label, trial in (("before", tune.get("baseline") or {}), ("tuned", tune.get("best") or {})):
        part = {"pp_tps": trial.get("pp_tps"), "tg_tps": trial.get("tg_tps"), "score": trial.get("score")}
        part.update(_efficiencies(trial.get("tg_tps"), line))
        out[label] = part
    validated = {"tg_tps": tg_tps}
    validated.update(_efficiencies(tg_tps, line))
    out["validated"] = validated
    return out


def _fmt(value, unit="", digits=1):
    if isinstance(value, dict) and value.get("available") is False:
        return "n/a (%s)" % value.get("reason")
    if isinstance(value, float):
        return ("%." + str(digits) + "f%s") % (value, unit)
    return "%s%s" % (value, unit)


def report_markdown(rep):
    """A short human page of the report."""
    bench, bw, line, power = rep["bench"], rep["memory_bandwidth"], rep["roofline"], rep["power"]
    completion = rep["completion"]
    lines = ["# Validation: %s" % rep["host"], "",
             "Profile `%s`, engine %s (build `%s`), model `%s` (%s)." % (
                 rep["profile"], rep["engine"]["engine"], rep["engine"]["build"],
                 str(rep["model"]["path"]).rsplit("/", 1)[-1], rep["model"]["architecture"]), ""]
    if not rep["model"]["numbers_meaningful"]:
        lines += ["> **Not meaningful:** %s." % rep["model"]["meaning"], ""]
    health = rep["health"]
    lines += ["| check | result |", "|---|---|",
              "| /health | %s |" % (("%s %s" % (health["status"], "ok" if health["ok"] else "NOT OK"))
                                    if health.get("available") else _fmt(health)),
              "| completion | %s |" % (("%s tokens, %s" % (_fmt(completion["completion_tokens"]),
                                                           _json_text(completion["text"])))
                                       if completion.get("available") else _fmt(completion))]
    if completion.get("available") and completion["timings"].get("available", True):
        lines.append("| server timings | prompt %s tok/s, generation %s tok/s |" % (
            _fmt(completion["timings"]["prompt_per_second"]), _fmt(completion["timings"]["predicted_per_second"])))
    for kind in ("pp", "tg"):
        part = bench[kind]
        lines.append("| llama-bench %s | %s |" % (
            kind, ("%s%d: %.2f +/- %.2f tok/s" % (kind, part["tokens"], part["tps"], part["stddev_tps"]))
            if part.get("available") else _fmt(part)))
    answers, perplexity = rep.get("answers") or {}, rep.get("perplexity") or {}
    if answers:
        lines.append("| answer probe | %s%s |" % (answers.get("status"), (" (family %s): %s" % (
            answers.get("family"), str(answers.get("reason", "")).replace("|", "\\|")[:300]))))
    if perplexity:
        reason = str(perplexity.get("reason", "")).replace("|", "\\|")[:300]
        lines.append("| perplexity | %s: %s |" % (perplexity.get("status"), reason))
    measured, theoretical = bw["measured"], bw["theoretical"]
    lines.append("| memory bandwidth | %s measured (read; triad %s), %s theoretical |" % (
        _fmt(measured.get("read_gbps") if measured.get("available") else measured, " GB/s"),
        _fmt(measured.get("triad_gbps") if measured.get("available") else "n/a", " GB/s"),
        _fmt(theoretical.get("gbps") if theoretical.get("available") else theoretical, " GB/s")))
    if line.get("available"):
        lines.append("| roofline | %.3f GB of routed experts per token; ceiling %s tok/s (measured bw), %s tok/s "
                     "(theoretical); efficiency %s / %s |" % (
                         line["gb_per_token"], _fmt(line["ceiling_tps_at_measured_bandwidth"]),
                         _fmt(line["ceiling_tps_at_theoretical_bandwidth"]),
                         _pct(line["efficiency_vs_measured"]), _pct(line["efficiency_vs_theoretical"])))
    else:
        lines.append("| roofline | %s |" % _fmt(line))
    for label, key in (("CPU package power", "cpu_package"), ("GPU board power", "gpu_board")):
        part = power[key]
        lines.append("| %s | %s |" % (label, ("%.1f W, %.1f J over %.1f s" % (
            part["average_watts"], part["joules"], part["seconds"])) if part.get("available") else _fmt(part)))
    tpj = power["tokens_per_joule"]
    lines.append("| tokens per joule | %s |" % (("%.4f (%s)" % (tpj["value"], " + ".join(tpj["basis"])))
                                                if tpj.get("available") else _fmt(tpj)))
    lines.append("")
    published = rep["published"]
    if published.get("available"):
        lines += ["Published figures for this profile and model (BRIEF section 7) beside the measured ones:", "",
                  "| source | engine | pp tok/s | tg tok/s |", "|---|---|---|---|"]
        for entry in published["entries"]:
            lines.append("| %s | %s | %s | %s |" % (entry.get("source"), entry.get("engine"),
                                                    entry.get("pp_tps", "-"), entry.get("tg_tps", "-")))
        lines.append("| this node | %s | %s | %s |" % (
            rep["engine"]["engine"], _fmt(bench["pp"].get("tps", "n/a"), "", 1), _fmt(bench["tg"].get("tps", "n/a"), "", 1)))
    else:
        lines.append("Published figures: %s." % published["reason"])
    tuning = rep.get("tuning") or unavailable("not reported")
    lines.append("")
    if tuning.get("available"):
        obj = tuning["objective"] or {}
        lines += ["Tuning (%s, objective %s at %s/%s tokens, %d trials, %+.1f%%; changed: %s), generation against the "
                  "roofline:" % (tuning["date"], obj.get("kind"), obj.get("prompt_tokens"), obj.get("gen_tokens"),
                                 tuning["trials"], 100 * float(tuning.get("gain") or 0),
                                 ", ".join(tuning["changed_flags"]) or "nothing"), "",
                  "| | tg tok/s | of the ceiling (measured bw) | of the ceiling (theoretical bw) |", "|---|---|---|---|"]
        for label, key in (("before tuning (search baseline)", "before"), ("tuned (search winner)", "tuned"),
                           ("tuned (this validation)", "validated")):
            part = tuning[key]
            lines.append("| %s | %s | %s | %s |" % (label, _fmt(part.get("tg_tps") if part.get("tg_tps") is not None
                                                                else "n/a", "", 1),
                                                    _pct(part["efficiency_vs_measured"]), _pct(part["efficiency_vs_theoretical"])))
    else:
        lines.append("Tuning: %s." % tuning.get("reason"))
    chart = rep.get("chart")
    if isinstance(chart, str):
        lines += ["", "![roofline](%s)" % chart]
    return "\n".join(lines) + "\n"


def chart_spec(rep, seed_table, profile_name):
    """What the roofline chart shows, from a report: the ceilings (tok/s = bandwidth / GB per token) at the
    theoretical and the measured bandwidth, the band published runs reach (35-55% of the theoretical ceiling),
    the seeds' published generation speeds for this profile (every model, at its GB per token), this node's measured
    point and, after tuning, the point before tuning and the tuned one. The hmk_roofline_chart module draws it."""
    line, bw = rep.get("roofline") or {}, rep.get("memory_bandwidth") or {}
    bandwidths = []
    if (bw.get("theoretical") or {}).get("available"):
        bandwidths.append({"label": "theoretical %.1f GB/s" % bw["theoretical"]["gbps"], "gbps": bw["theoretical"]["gbps"],
                           "kind": "theoretical"})
    if (bw.get("measured") or {}).get("available"):
        bandwidths.append({"label": "measured %.1f GB/s (read)" % bw["measured"]["read_gbps"],
                           "gbps": bw["measured"]["read_gbps"], "kind": "measured"})
    points = []
    for entry in seed_table or []:
        if entry.get("profile") == profile_name and entry.get("tg_tps") and entry.get("gb_per_token"):
            points.append({"label": "%s (%s)" % (entry.get("engine"), entry.get("source")), "kind": "published",
                           "gb_per_token": float(entry["gb_per_token"]), "tps": float(entry["tg_tps"])})
    gb = line.get("gb_per_token") if line.get("available") else None
    tg = (rep.get("bench") or {}).get("tg") or {}
    tuning = rep.get("tuning") or {}
    if gb:
        if tuning.get("available"):
            before = tuning["before"].get("tg_tps")
            if before:
                points.append({"label": "before tuning (search baseline)", "kind": "before", "gb_per_token": gb,
                               "tps": float(before)})
            if tg.get("available"):
                points.append({"label": "tuned (validated)", "kind": "tuned", "gb_per_token": gb, "tps": float(tg["tps"])})
        elif tg.get("available"):
            points.append({"label": "measured", "kind": "measured", "gb_per_token": gb, "tps": float(tg["tps"])})
    model = rep.get("model") or {}
    title = "Roofline: %s, %s on %s" % (rep.get("host"), str(model.get("path") or "?").rsplit("/", 1)[-1],
                                        rep.get("profile"))
    note = "" if model.get("numbers_meaningful", True) else "not meaningful: %s" % model.get("meaning")
    return {"title": title, "note": note, "bandwidths": bandwidths, "points": points,
            "band": [0.35, 0.55] if any(b["kind"] == "theoretical" for b in bandwidths) else []}


def _pct(value):
    if isinstance(value, dict):
        return "n/a"
    return "%.1f%%" % (100.0 * value)


def _json_text(text):
    text = str(text).replace("\n", " ").replace("|", "\\|")
    return '"%s"' % (text[:80] + ("..." if len(text) > 80 else ""))


def perplexity_command(server_argv, binary, text_path, ctx=256, chunks=8):
    """llama-perplexity's argv at the service's settings over the kit's text (hmk_perplexity.command)."""
    try:
        return hmk_perplexity.command(server_argv, binary, text_path, ctx, chunks)
    except ValueError as exc:
        _fail(str(exc))


def perplexity_judge(run, record, key, tolerance_pct, catalog_value=None, text_name="", ctx=0):
    """The perplexity result of one run ({rc, stdout, stderr} of the command, or {skipped, skip_reason}) against the
    baseline: {status, ppl, error, chunks, n_ctx, baseline, rise_pct, reason}. status: skipped, failed, recorded
    (the first good value, to be kept), ok or regressed."""
    run = run or {}
    if run.get("skipped"):
        return {"status": "skipped", "reason": run.get("skip_reason") or "llama-perplexity was not run"}
    result = hmk_perplexity.read("%s\n%s" % (run.get("stdout") or "", run.get("stderr") or ""))
    if int(run.get("rc") or 0) != 0 and not result["ok"]:
        result["reason"] = "llama-perplexity exited %s: %s (%s)" % (
            run.get("rc"), result["reason"], (run.get("stderr") or "")[-300:].strip())
    base = hmk_perplexity.baseline(record, key, catalog_value, text_name, ctx)
    verdict = hmk_perplexity.verdict(result, base, tolerance_pct)
    return {"status": verdict["status"], "ppl": result["ppl"], "error": result["error"],
            "chunks": result["chunks"], "n_ctx": result["n_ctx"], "baseline": base,
            "rise_pct": verdict["rise_pct"], "reason": verdict["reason"]}


def perplexity_key(deployment, text_sha256, ctx):
    """The key a recorded perplexity is kept under (the model, the text and the context)."""
    return hmk_perplexity.baseline_key(deployment or {}, text_sha256, ctx)


class FilterModule(object):
    """Filters of the validate role."""

    def filters(self):
        return guard_filters({
            "validate_theoretical_bandwidth": theoretical_bandwidth,
            "validate_expert_bytes_per_token": expert_bytes_per_token,
            "validate_roofline": roofline,
            "validate_bench_argv": bench_argv,
            "validate_bench_command": bench_command,
            "validate_seed_figures": seed_figures,
            "validate_report": report,
            "validate_report_markdown": report_markdown,
            "validate_chart_spec": chart_spec,
            "validate_perplexity_command": perplexity_command,
            "validate_perplexity_judge": perplexity_judge,
            "validate_perplexity_key": perplexity_key,
        }, AnsibleFilterError)
