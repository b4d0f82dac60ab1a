# -*- coding: utf-8 -*-
"""The tune role's search planner and the tuned-file contract, as plain functions with unit tests.

playbooks/tune.yml searches the engine's own knobs on the node, one llama-bench run per trial, and keeps
the flags that serve the user's objective best. The search is a coordinate descent from the flags the
service runs today: one knob at a time, in an order that puts the knobs with the largest expected effect on
the chosen objective first, each knob's candidates measured with the others held at the best values found
so far; a candidate replaces the incumbent only when it beats it by more than a noise margin. Every trial
is recorded. A wall-clock budget bounds the whole search: a trial that the longest trial so far says would
not finish in the time left is not started, and a started one is killed at the budget (`timeout`).

The GPU side never leaves the placement plan's VRAM budget: the number of MoE layers whose experts sit on
the GPUs is planned by inference_service's own placement filter (imported, not copied), at the service's
context, KV type and reserves, the compute reserve growing with -ub. What llama-bench measures is the
service's own argv with the trial's values, mapped by the validate role's own mapping (also imported), so
validate later measures the tuned service exactly as the search did.

The winner is written to the controller's inventory (host_vars/<host>/tuned.yml) as `tune_result`: the
inference_service variables that render it, with the date, engine build and model it was found for. A
record for another build or model is ignored (with a warning) by tuned_match. Ansible templates every string
of a vars file it reads, and the build, commit and model come from the node: so the fields of a known shape
are checked against it before anything is written, and every string is written `!unsafe` (never templated) or,
where `!unsafe` would read it back as another type, in a form that cannot hold a template.
tests/unit/test_tune.py imports this file directly.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import math
import re
import textwrap

from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

try:
    from ansible_collections.hmk.moe_kit.plugins.filter.inference_service import LLAMA_STABLE_FLAGS, placement_plan
    from ansible_collections.hmk.moe_kit.plugins.filter.validate import bench_argv, bench_flags
except ImportError:  # loaded by file path in unit tests without the collection on sys.path
    import importlib.util
    import os

    def _sibling(name):
        spec = importlib.util.spec_from_file_location(
            "hmk_tune_" + name, os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    _service = _sibling("inference_service")
    placement_plan, LLAMA_STABLE_FLAGS = _service.placement_plan, _service.LLAMA_STABLE_FLAGS
    _validate = _sibling("validate")
    bench_argv, bench_flags = _validate.bench_argv, _validate.bench_flags

GIB = 1024 ** 3
STATE_SCHEMA = "hmk-tune-state/1"
RESULT_SCHEMA = "hmk-tune/1"
TUNED_SCHEMA = "hmk-tuned/1"
OBJECTIVES = ("tg", "pp", "mix")

# Search order per objective, big wins first. Generation is bounded by DRAM bytes per token: a MoE layer whose
# experts move to VRAM takes its bytes off the DRAM read, the thread count decides how much of the bandwidth the
# CPU pulls, the NUMA mode whether remote nodes' bandwidth counts, repacking how fast the CPU's matmuls are; -amb
# only caps the attention buffer. Prompt processing on a hybrid node copies CPU-resident experts to the GPU once
# per micro-batch, so -ub comes first there, then the batch threads. Knobs that cannot move the objective (-ub
# and the batch threads for generation) are not searched for it.
# The opt-in engine flags come last (split_mode: -sm graph on several GPUs; defer_experts: --defer-experts): off in
# the baseline, kept only when they win by the margin. --prefetch-experts and MTP speculative decoding are never
# searched: llama-bench has neither (8337e4cd), and what they change (load time, accepted draft tokens) is not a
# bench row.
ORDER = {
    "tg": ("gpu_layers", "threads", "numa", "rtr", "amb", "split_mode", "defer_experts"),
    "pp": ("ubatch", "threads_batch", "gpu_layers", "amb", "threads", "numa", "rtr", "split_mode", "defer_experts"),
    "mix": ("gpu_layers", "threads", "ubatch", "threads_batch", "numa", "rtr", "amb", "split_mode", "defer_experts"),
}
UBATCH_CANDIDATES = (4096, 2048, 1024, 512, 256)
AMB_CANDIDATES = (256, 512, 1024)
NUMA_MODES = ("distribute", "isolate", "numactl")
# -rtr copies the weights into anonymous memory (no mmap): only where the model takes at most this share of RAM.
RTR_MAX_RAM_FRACTION = 0.8
# The inference_service variables a tuned record may set, and their types.
TUNED_VARS = {
    "inference_service_threads": int,
    "inference_service_threads_batch": int,
    "inference_service_batch": int,
    "inference_service_ubatch": int,
    "inference_service_amb": int,
    "inference_service_gpu_expert_layers": int,
    "inference_service_gpu_compute_reserve_gib": float,
    "inference_service_numa_mode": str,
    "inference_service_run_time_repack": bool,
    "inference_service_split_mode_graph": bool,
    "inference_service_defer_experts": bool,
}


def _fail(msg):
    raise AnsibleFilterError(msg)


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------ the objective

def objective(kind, prompt_tokens=2048, gen_tokens=128):
    """The user's objective: tg (generation at a prompt depth), pp (prompt processing) or mix (a whole request)."""
    if kind not in OBJECTIVES:
        _fail("tune_objective is one of %s, not %r" % (", ".join(OBJECTIVES), kind))
    prompt_tokens, gen_tokens = int(prompt_tokens), int(gen_tokens)
    if prompt_tokens < 1 or gen_tokens < 1:
        _fail("tune_prompt_tokens and tune_gen_tokens must be at least 1 (got %d and %d)" % (prompt_tokens, gen_tokens))
    return {"kind": kind, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens}


def score(obj, pp_tps, tg_tps):
    """The number the search maximises, or None when the trial lacks a speed the objective needs.

    tg: generation tok/s after a prompt of prompt_tokens; pp: prompt tok/s at prompt_tokens; mix: tokens of a
    whole request (prompt_tokens in, gen_tokens out) per second of its time, P+G / (P/pp + G/tg): each phase
    weighs by the time it takes in such a request.
    """
    pp, tg = _num(pp_tps), _num(tg_tps)
    if obj["kind"] == "tg":
        return tg if tg and tg > 0 else None
    if obj["kind"] == "pp":
        return pp if pp and pp > 0 else None
    if not pp or not tg or pp <= 0 or tg <= 0:
        return None
    tokens = obj["prompt_tokens"] + obj["gen_tokens"]
    return tokens / (obj["prompt_tokens"] / pp + obj["gen_tokens"] / tg)


def bench_sizes(obj, help_text):
    """llama-bench's test sizes for the objective: -p P -n 0 for pp; tg after a P-token prompt (-gp P,G where the
    bench has it, else -n G at an empty context); explicit zeros so that no default test runs."""
    has_gp = bool(re.search(r"(?m)^\s*-gp\b", help_text or ""))
    p, g = str(obj["prompt_tokens"]), str(obj["gen_tokens"])
    tg = ["-gp", "%s,%s" % (p, g)] if has_gp else []
    if obj["kind"] == "pp":
        return ["-p", p, "-n", "0"]
    if obj["kind"] == "tg":
        return ["-p", "0", "-n", "0"] + tg if has_gp else ["-p", "0", "-n", g]
    return ["-p", p, "-n", "0"] + tg if has_gp else ["-p", p, "-n", g]


# ------------------------------------------------------------------------------------ llama-bench output

def bench_rows(stdout):
    """llama-bench -o json rows from its stdout; ik_llama.cpp prints model-loading notes between the JSON's lines,
    and every line of llama-bench's pretty-printed JSON starts with one of [ ] { } \"."""
    lines = [line for line in str(stdout or "").splitlines() if line.strip()[:1] in ("[", "]", "{", "}", '"')]
    if not lines:
        return []
    try:
        rows = json.loads("\n".join(lines))
    except ValueError:
        return []
    return rows if isinstance(rows, list) else []


def bench_speeds(stdout):
    """{pp_tps, tg_tps} of a run: the pp row (prompt only) and the tg row (generation, at a depth or not)."""
    out = {"pp_tps": None, "tg_tps": None}
    for row in bench_rows(stdout):
        n_prompt, n_gen = int(row.get("n_prompt") or 0), int(row.get("n_gen") or 0)
        speed = _num(row.get("avg_ts"))
        if n_gen > 0:
            out["tg_tps"] = speed
        elif n_prompt > 0:
            out["pp_tps"] = speed
    return out


# ------------------------------------------------------------------------------------ the service's argv

def _options(argv):
    """{flag: value or None} of the last occurrence of every flag (values never start with '-' but numbers)."""
    out, index = {}, 0
    argv = [str(a) for a in argv]
    while index < len(argv):
        item = argv[index]
        if item.startswith("-") and not re.match(r"^-\d", item):
            nxt = argv[index + 1] if index + 1 < len(argv) else None
            if nxt is not None and not (nxt.startswith("-") and not re.match(r"^-\d", nxt)):
                out[item] = nxt
                index += 1
            else:
                out[item] = None
        index += 1
    return out


def _without(argv, flag, takes_value=True):
    out, index = [], 0
    while index < len(argv):
        if argv[index] == flag:
            index += 2 if takes_value else 1
            continue
        out.append(argv[index])
        index += 1
    return out


def _set(argv, flag, value):
    """argv with flag set to value (replaced in place when present, else appended)."""
    argv = list(argv)
    if flag in argv:
        position = argv.index(flag)
        argv = _without(argv, flag)
        argv[position:position] = [flag, str(value)]
        return argv
    return argv + [flag, str(value)]


def service_argv(argv, values, rules=None):
    """The service's argv (binary first) with a trial's values: -t, -tb, -b/-ub, -amb, --numa, -rtr and the -ot rules."""
    argv = [str(a) for a in argv]
    if "threads" in values:
        argv = _set(argv, "-t", int(values["threads"]))
    if "threads_batch" in values:
        argv = _without(argv, "-tb")
        if int(values["threads_batch"]) != int(values.get("threads", 0)):
            argv += ["-tb", str(int(values["threads_batch"]))]
    if "ubatch" in values:
        argv = _set(argv, "-b", max(int(values.get("batch") or 0), int(values["ubatch"])))
        argv = _set(argv, "-ub", int(values["ubatch"]))
    if values.get("amb") is not None and "-amb" in argv:
        argv = _set(argv, "-amb", int(values["amb"]))
    if values.get("numa"):
        argv = _set(argv, "--numa", values["numa"])
    if "rtr" in values:
        argv = _without(argv, "-rtr", takes_value=False)
        if values["rtr"]:
            argv.append("-rtr")
    if "split_mode" in values:
        argv = _without(argv, "-sm")
        if values["split_mode"] == "graph":
            argv += ["-sm", "graph"]
    if "defer_experts" in values:
        argv = _without(argv, "--defer-experts", takes_value=False)
        if values["defer_experts"]:
            argv.append("--defer-experts")
    if rules is not None:
        argv = _without(argv, "-ot")
        for rule in rules:
            argv += ["-ot", str(rule)]
    return argv


# ------------------------------------------------------------------------------------ the VRAM budget

def compute_reserve(context, ubatch):
    """The per-GPU compute reserve at a micro-batch: the service's reserve, grown in proportion above its -ub
    (llama.cpp's compute buffers hold one micro-batch's activations)."""
    base = int(context["reserve_bytes"])
    return int(base * max(1.0, float(ubatch) / float(context["ubatch_service"])))


def vram_plan(context, ubatch, gpu_layers):
    """inference_service's placement plan for this micro-batch and at most gpu_layers MoE layers on the GPUs."""
    layout = {"expert_bytes": context["expert_bytes"], "non_expert_bytes": context["non_expert_bytes"]}
    return placement_plan(layout, context["vram_bytes"], context["kv_bytes"], compute_reserve(context, ubatch),
                          context["overhead_bytes"], int(gpu_layers))


def max_gpu_layers(context, ubatch):
    """How many MoE layers the plan places on the GPUs at this micro-batch (0 without GPUs)."""
    if not context.get("vram_bytes"):
        return 0
    return vram_plan(context, ubatch, -1)["gpu_layer_count"]


def fits(context, ubatch, gpu_layers):
    """Whether exactly gpu_layers MoE layers fit the plan's VRAM budget at this micro-batch."""
    return 0 <= int(gpu_layers) <= max_gpu_layers(context, ubatch)


# ------------------------------------------------------------------------------------ the search space

def _uniq(values):
    out = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def space(inputs):
    """The initial search state from what the node reports.

    inputs: deployment (the inference_service deployment record), plan (its -plan.json), help (llama-bench
    --help), binary, accepted (the server's accepted flags: names), cores (physical), vcpus, mem_bytes,
    numa_nodes, model_bytes, vram_bytes (per GPU), reserve_bytes, overhead_bytes, objective, budget_seconds,
    min_gain, repetitions, started_at (seconds since the epoch).
    """
    deployment, plan_record = inputs.get("deployment") or {}, inputs.get("plan") or {}
    if deployment.get("engine") not in ("ik_llama.cpp", "llama.cpp"):
        _fail("tuning needs llama-bench, which %s does not have; tune ik_llama.cpp or llama.cpp services"
              % (deployment.get("engine") or "this engine"))
    argv = [str(a) for a in deployment.get("argv") or []]
    opts = _options(argv[1:])
    help_text = inputs.get("help") or ""
    listed = bench_flags(help_text)
    # what the build's record lists, plus the flags every supported commit parses (inference_service's own list)
    accepted = set(str(a) for a in inputs.get("accepted") or []) | set(LLAMA_STABLE_FLAGS)
    obj = inputs["objective"]
    cores, vcpus = int(inputs.get("cores") or 1), int(inputs.get("vcpus") or inputs.get("cores") or 1)
    threads = int(opts.get("-t") or cores)
    ubatch = int(opts.get("-ub") or opts.get("-b") or 512)
    batch = int(opts.get("-b") or ubatch)
    plan = plan_record.get("plan") or {}
    context = {
        "expert_bytes": deployment.get("expert_bytes") or {},
        "non_expert_bytes": int(deployment.get("non_expert_bytes") or 0),
        "kv_bytes": int(plan.get("kv_bytes") or 0),
        "vram_bytes": [int(v) for v in inputs.get("vram_bytes") or []],
        "reserve_bytes": int(inputs.get("reserve_bytes") or 0),
        "overhead_bytes": int(inputs.get("overhead_bytes") or 0),
        "ubatch_service": ubatch,
        "rules": [str(r) for r in plan.get("rules") or []],
    }
    baseline = {
        "threads": threads,
        "threads_batch": int(opts.get("-tb") or threads),
        "batch": batch,
        "ubatch": ubatch,
        "amb": int(opts["-amb"]) if opts.get("-amb") else None,
        "gpu_layers": int(plan.get("gpu_layer_count") or 0),
        "numa": opts.get("--numa"),
        "rtr": "-rtr" in opts,
        "split_mode": "graph" if opts.get("-sm") == "graph" else "layer",
        "defer_experts": "--defer-experts" in opts,
    }
    dims, skipped = {}, {}

    def offer(name, candidates, why_not=""):
        if why_not:
            skipped[name] = why_not
        elif len(_uniq(candidates)) < 2:
            skipped[name] = "one value only (%s)" % ", ".join(str(c) for c in _uniq(candidates))
        else:
            dims[name] = _uniq(candidates)

    offer("threads", [threads] + [t for t in _uniq([cores, int(round(cores * 0.875)), int(round(cores * 0.75)),
                                                    cores // 2]) if 1 <= t <= cores])
    offer("threads_batch", [baseline["threads_batch"]] + [t for t in (cores, vcpus, cores // 2) if t >= 1],
          "" if obj["kind"] != "tg" else "generation does not use the batch threads")
    if "threads_batch" in dims and ("-tgb" not in listed or "-tb" not in accepted):
        dims.pop("threads_batch")
        skipped["threads_batch"] = "llama-bench has no -tgb or the server no -tb"
    offer("ubatch", [ubatch] + [u for u in UBATCH_CANDIDATES if u <= max(obj["prompt_tokens"], min(UBATCH_CANDIDATES))],
          "" if obj["kind"] != "tg" else "generation does not use the micro-batch")
    mla = "-mla" in opts
    offer("amb", [baseline["amb"]] + list(AMB_CANDIDATES),
          "" if mla and baseline["amb"] is not None and "-amb" in listed
          else "-amb applies to MLA models on ik_llama.cpp only")
    context["plan_driven"] = bool(context["vram_bytes"]) and plan_record.get("override_tensor") in (None, plan.get("rules"))
    if not context["vram_bytes"]:
        skipped["gpu_layers"] = "no GPU in the hardware profile"
    elif not context["plan_driven"]:
        skipped["gpu_layers"] = "inference_service_override_tensor gives explicit -ot rules"
    else:
        most = max_gpu_layers(context, ubatch)
        offer("gpu_layers", [baseline["gpu_layers"]] + [n for n in (most, most - 1, most // 2, 0) if n >= 0])
    offer("numa", [baseline["numa"] or "distribute"] + list(NUMA_MODES),
          "" if int(inputs.get("numa_nodes") or 1) > 1 and "--numa" in listed
          else "one NUMA node" if int(inputs.get("numa_nodes") or 1) <= 1 else "llama-bench has no --numa")
    rtr_why = ("run-time repacking disables mmap and GPU prompt offload in hybrid mode" if context["vram_bytes"]
               else "llama-bench or the server lacks -rtr" if "-rtr" not in listed or "-rtr" not in accepted
               else "the model needs more than %d%% of RAM twice over without mmap" % int(RTR_MAX_RAM_FRACTION * 100)
               if int(inputs.get("model_bytes") or 0) > RTR_MAX_RAM_FRACTION * int(inputs.get("mem_bytes") or 0)
               else "")
    offer("rtr", [baseline["rtr"], not baseline["rtr"]], rtr_why)
    gpus = len(context["vram_bytes"])
    offer("split_mode", [baseline["split_mode"], "graph", "layer"],
          "one GPU or none: -sm graph splits a layer over several" if gpus < 2
          else "llama-bench has no -sm or the server no -sm" if "-sm" not in listed or "-sm" not in accepted else "")
    offer("defer_experts", [baseline["defer_experts"], not baseline["defer_experts"]],
          "" if "--defer-experts" in listed and "--defer-experts" in accepted
          else "llama-bench or the server lacks --defer-experts (ik_llama.cpp from 8337e4cd)")
    skipped["prefetch_experts"] = "llama-bench has no --prefetch-experts; it changes load time, not a bench row"
    skipped["mtp"] = "llama-bench runs no speculative decoding; measure -mtp / --spec-type mtp with requests"
    if baseline["numa"] is None:
        baseline.pop("numa")
    return {
        "schema": STATE_SCHEMA,
        "objective": obj,
        "budget_seconds": int(inputs["budget_seconds"]),
        "min_gain": float(inputs.get("min_gain", 0.03)),
        "repetitions": int(inputs.get("repetitions", 3)),
        "started_at": float(inputs["started_at"]),
        "binary": str(inputs["binary"]),
        "help": help_text,
        "argv": argv,
        "context": context,
        "order": [name for name in ORDER[obj["kind"]] if name in dims],
        "dims": dims,
        "skipped": skipped,
        "baseline": baseline,
        "incumbent": None,
        "trials": [],
        "stopped": None,
    }


def candidates(state, dim):
    """The trials of one knob: the incumbent's values with that knob changed. A micro-batch whose compute reserve
    leaves room for fewer MoE layers on the GPUs takes that many fewer (inside the plan's budget)."""
    if state.get("incumbent") is None or state.get("stopped"):
        return []
    current = state["incumbent"]["values"]
    out = []
    for value in state["dims"].get(dim) or []:
        if value == current.get(dim):
            continue
        values = dict(current, **{dim: value})
        note = ""
        if dim == "ubatch" and state["context"]["vram_bytes"]:
            room = max_gpu_layers(state["context"], value)
            if values["gpu_layers"] > room:
                values["gpu_layers"] = room
                note = "gpu_layers lowered to %d to fit -ub %d" % (room, value)
        if dim == "threads" and current["threads_batch"] == current["threads"]:
            values["threads_batch"] = value  # -tb follows -t until the batch threads are searched themselves
        out.append({"dimension": dim, "values": values, "note": note})
    return out


def trial_argv(state, values):
    """The llama-bench argv of a trial (the service's argv with these values, mapped as validate maps it)."""
    context = state["context"]
    rules = vram_plan(context, values["ubatch"], values["gpu_layers"])["rules"] if context["plan_driven"] else None
    argv = service_argv(state["argv"], values, rules)
    mapped = bench_argv(argv, state["help"], state["binary"])
    return mapped["base"] + bench_sizes(state["objective"], state["help"]) + [
        "-r", str(state["repetitions"]), "-o", "json"]


def next_trial(state, candidate, now):
    """Whether and how to run a candidate: {run, reason, argv (with the budget's timeout), timeout, values, ...}."""
    values = candidate["values"]
    elapsed = float(now) - state["started_at"]
    left = state["budget_seconds"] - elapsed
    out = {"dimension": candidate.get("dimension", "baseline"), "values": values, "note": candidate.get("note", ""),
           "run": False, "reason": "", "argv": [], "timeout": 0}
    ran = [t["seconds"] for t in state["trials"] if t.get("seconds")]
    longest = max(ran) if ran else 0.0
    if state["context"]["plan_driven"] and not fits(state["context"], values["ubatch"], values["gpu_layers"]):
        out["reason"] = "over the VRAM budget: %d MoE layers do not fit beside -ub %d" % (
            values["gpu_layers"], values["ubatch"])
        return out
    if state.get("stopped"):
        out["reason"] = state["stopped"]
        return out
    # A trial needs about as long as the longest so far, plus the play's own tasks around it.
    if left <= 1 or (longest and longest * 1.1 + 2 > left):
        out["reason"] = "budget: %.0f s of %d s left, the longest trial took %.0f s" % (
            max(left, 0), state["budget_seconds"], longest)
        return out
    timeout = int(math.floor(left))
    out.update({"run": True, "timeout": timeout,
                "argv": ["timeout", "--kill-after=10", str(timeout)] + trial_argv(state, values)})
    return out


def _seconds(delta):
    """Seconds of the command module's delta ("H:MM:SS.ffffff")."""
    match = re.match(r"^(\d+):(\d+):(\d+(?:\.\d+)?)$", str(delta or ""))
    if not match:
        return 0.0
    return int(match.group(1)) * 3600 + int(match.group(2)) * 60 + float(match.group(3))


def record(state, trial, result, now):
    """The state with one trial recorded. result: the command's result (rc, stdout, stderr, delta); {} when skipped."""
    state = dict(state)
    entry = {"index": len(state["trials"]), "dimension": trial["dimension"], "values": trial["values"],
             "note": trial.get("note", ""), "argv": trial.get("argv", [])[3:]}
    result = result or {}
    if not trial.get("run"):
        entry.update({"verdict": "skipped", "reason": trial.get("reason", ""), "seconds": 0.0})
        if trial.get("reason", "").startswith("budget"):
            state["stopped"] = trial["reason"]
    else:
        seconds = _seconds(result.get("delta"))
        speeds = bench_speeds(result.get("stdout"))
        value = score(state["objective"], speeds["pp_tps"], speeds["tg_tps"])
        rc = int(result.get("rc", -1))
        entry.update(speeds)
        entry.update({"seconds": round(seconds, 3), "rc": rc, "score": value})
        state["finished_at"] = float(now)
        if rc == 124 or rc == 137:
            entry.update({"verdict": "failed", "reason": "killed at the budget (timeout)"})
            state["stopped"] = "budget: a trial ran into the end of the budget"
        elif rc != 0:
            entry.update({"verdict": "failed",
                          "reason": "llama-bench exited %d: %s" % (rc, str(result.get("stderr") or "")[-300:])})
        elif value is None:
            entry.update({"verdict": "failed", "reason": "llama-bench printed no speed the objective needs"})
        else:
            entry.update({"verdict": "ok", "reason": ""})
    state["trials"] = list(state["trials"]) + [entry]
    if entry["dimension"] == "baseline":
        if entry["verdict"] != "ok":
            state["stopped"] = "the service's own flags did not bench: %s" % entry["reason"]
        else:
            state["incumbent"] = {"values": entry["values"], "score": entry["score"], "trial": entry["index"]}
    return state


def settle(state, dim):
    """After a knob's trials: the best of them becomes the incumbent when it beats it by more than min_gain."""
    state = dict(state)
    incumbent = state.get("incumbent")
    if incumbent is None:
        return state
    best = incumbent
    for trial in state["trials"]:
        if trial["dimension"] == dim and trial["verdict"] == "ok" and trial["score"] > best["score"]:
            best = {"values": trial["values"], "score": trial["score"], "trial": trial["index"]}
    if best is not incumbent and best["score"] > incumbent["score"] * (1 + state["min_gain"]):
        state["incumbent"] = best
    return state


def service_vars(state, values):
    """The inference_service variables that render these values (every tunable, so the record is complete)."""
    out = {
        "inference_service_threads": int(values["threads"]),
        "inference_service_threads_batch": 0 if int(values["threads_batch"]) == int(values["threads"])
        else int(values["threads_batch"]),
        "inference_service_batch": max(int(values["batch"]), int(values["ubatch"])),
        "inference_service_ubatch": int(values["ubatch"]),
        "inference_service_run_time_repack": bool(values["rtr"]),
    }
    if "split_mode" in state["dims"] or values.get("split_mode") == "graph":
        out["inference_service_split_mode_graph"] = values.get("split_mode") == "graph"
    if "defer_experts" in state["dims"] or values.get("defer_experts"):
        out["inference_service_defer_experts"] = bool(values.get("defer_experts"))
    if values.get("amb") is not None:
        out["inference_service_amb"] = int(values["amb"])
    if values.get("numa"):
        out["inference_service_numa_mode"] = str(values["numa"])
    if state["context"]["plan_driven"]:
        out["inference_service_gpu_expert_layers"] = int(values["gpu_layers"])
        out["inference_service_gpu_compute_reserve_gib"] = round(
            compute_reserve(state["context"], values["ubatch"]) / float(GIB), 3)
    return out


def summary(state, facts):
    """The search's result: the report's content and the source of the tuned record.

    facts: host, engine, build, commit, model, model_bytes, architecture, date (ISO 8601, UTC), now (epoch s).
    """
    trials = state["trials"]
    baseline = trials[0] if trials else None
    incumbent = state.get("incumbent")
    best = trials[incumbent["trial"]] if incumbent else None
    stopped = state.get("stopped") or "every candidate measured"
    result = {
        "schema": RESULT_SCHEMA,
        "host": facts.get("host"), "date": facts.get("date"),
        "engine": facts.get("engine"), "build": facts.get("build"), "commit": facts.get("commit"),
        "model": facts.get("model"), "model_bytes": int(facts.get("model_bytes") or 0),
        "architecture": facts.get("architecture"),
        "objective": state["objective"], "budget_seconds": state["budget_seconds"],
        "search_seconds": round(float(state.get("finished_at", state["started_at"])) - state["started_at"], 1),
        "elapsed_seconds": round(float(facts["now"]) - state["started_at"], 1),
        "min_gain": state["min_gain"], "repetitions": state["repetitions"],
        "stopped": stopped, "order": state["order"], "dims": state["dims"], "skipped": state["skipped"],
        "trials": trials,
        "baseline": baseline, "best": best,
        "ok": bool(best),
    }
    if best:
        result["gain"] = round(best["score"] / baseline["score"] - 1.0, 4)
        result["vars"] = service_vars(state, best["values"])
        result["baseline_vars"] = service_vars(state, baseline["values"])
        result["changed_flags"] = sorted(k for k in result["vars"] if result["vars"][k] != result["baseline_vars"].get(k))
    return result


# ------------------------------------------------------------------------------------ the tuned-file contract

def tuned_record(result):
    """The record written to host_vars/<host>/tuned.yml as `tune_result` (no trials: those are in the report)."""
    if not result.get("ok"):
        _fail("the search found no working flags (%s): nothing to record" % result.get("stopped"))
    keep = ("date", "host", "engine", "build", "commit", "model", "model_bytes", "objective", "gain", "vars")
    record = {"schema": TUNED_SCHEMA}
    record.update({key: result[key] for key in keep})
    for part in ("baseline", "best"):
        record[part] = {"pp_tps": result[part].get("pp_tps"), "tg_tps": result[part].get("tg_tps"),
                        "score": result[part]["score"]}
    return record


def tuned_vars(record):
    """The inference_service variables of a tuned record, checked against the contract (types, names, ranges)."""
    if not isinstance(record, dict) or record.get("schema") != TUNED_SCHEMA:
        _fail("tune_result is not a %s record (schema %r): re-run playbooks/tune.yml"
              % (TUNED_SCHEMA, (record or {}).get("schema") if isinstance(record, dict) else type(record).__name__))
    values = record.get("vars")
    if not isinstance(values, dict) or not values:
        _fail("tune_result has no vars")
    out = {}
    for name, value in values.items():
        kind = TUNED_VARS.get(name)
        if kind is None:
            _fail("tune_result sets %s, which tuning never sets (allowed: %s)" % (name, ", ".join(sorted(TUNED_VARS))))
        if kind is bool:
            if not isinstance(value, bool):
                _fail("tune_result: %s must be true or false, not %r" % (name, value))
        elif kind is str:
            if value not in NUMA_MODES:
                _fail("tune_result: %s must be one of %s, not %r" % (name, ", ".join(NUMA_MODES), value))
        else:
            if isinstance(value, bool) or _num(value) is None:
                _fail("tune_result: %s must be a number, not %r" % (name, value))
            value = kind(value)
            if value < (-1 if name == "inference_service_gpu_expert_layers" else 0):
                _fail("tune_result: %s is out of range (%r)" % (name, value))
        out[name] = value
    if out.get("inference_service_ubatch", 0) > out.get("inference_service_batch", float("inf")):
        _fail("tune_result: the micro-batch exceeds the batch")
    return out


def tuned_match(record, deployed, obj=None):
    """Whether a tuned record applies to what the node runs: {applies, warn, reason[, vars]}.

    deployed: engine, build (the current build's directory name), model (path), model_bytes. With obj, the
    record must also have been found for that objective (a search for another one is due).
    """
    if not record:
        return {"applies": False, "warn": False, "reason": "no tuned flags for this host"}
    found = "tuned on %s for %s build %s and %s (%s bytes)" % (
        record.get("date"), record.get("engine"), record.get("build"), record.get("model"), record.get("model_bytes"))
    wrong = [name for name in ("engine", "build", "model") if str(record.get(name)) != str(deployed.get(name))]
    if int(record.get("model_bytes") or -1) != int(deployed.get("model_bytes") or -2):
        wrong.append("model size")
    if wrong:
        return {"applies": False, "warn": True, "reason": (
            "the tuned flags are ignored: %s; this node runs %s build %s and %s (%s bytes), another %s. Run "
            "playbooks/tune.yml again for this one." % (found, deployed.get("engine"), deployed.get("build"),
                                                        deployed.get("model"), deployed.get("model_bytes"),
                                                        " and ".join(wrong)))}
    out = {"applies": True, "warn": False, "reason": found, "vars": tuned_vars(record)}
    if obj is not None and record.get("objective") != obj:
        out.update({"applies": False, "reason": "%s, objective %s; the objective is now %s" % (
            found, json.dumps(record.get("objective"), sort_keys=True), json.dumps(obj, sort_keys=True))})
    return out


# The fields of the tuned record whose shape is known, checked before the record reaches the inventory: the node
# reports the engine, build and commit (its deployment record), so a value of another shape is refused, not written.
TUNED_SHAPES = {
    "engine": (re.compile(r"^(ik_llama\.cpp|llama\.cpp)\Z"), "ik_llama.cpp or llama.cpp"),
    "build": (re.compile(r"^[0-9a-f]{12}-[0-9a-f]{8}\Z"), "a build directory name, <sha12>-<flagshash8>"),
    "commit": (re.compile(r"^(?:[0-9a-f]{40})?\Z"), "a full 40-character commit SHA, or empty"),
    "date": (re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z"), "an ISO 8601 UTC time, YYYY-MM-DDTHH:MM:SSZ"),
}
_RESOLVER = Resolver()
_KEY = re.compile(r"^[a-z_][a-z0-9_]*\Z")
# YAML's short escapes; every other character outside printable ASCII is written as \x, \u or \U.
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\0": "\\0", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n",
            "\v": "\\v", "\f": "\\f", "\r": "\\r", "\x1b": "\\e"}


def _shown(value):
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def tuned_checked(record):
    """The record (or what the node reports), when every field of a known shape it holds has that shape; else a
    refusal that names the field and its value."""
    for field, (pattern, shape) in sorted(TUNED_SHAPES.items()):
        if field not in record:
            continue
        value = record[field]
        if not isinstance(value, str) or not pattern.match(value):
            _fail("tune_result.%s is %s, not %s: nothing is written to the inventory, which Ansible reads as "
                  "variables (and would template)" % (field, _shown(value), shape))
    return record


def tuned_file(record, header=""):
    """The tuned file's YAML text (a stable rendering: the same record gives the same bytes).

    Every string is written `!unsafe` (see _quoted for the few that cannot be): Ansible reads the file as host
    variables and would otherwise evaluate a template in any of them (a node's root commanding the controller).
    The escapes keep the file printable ASCII.
    """
    tuned_vars(record)
    tuned_checked(record)
    lines = ["---"] + ["# " + line for line in textwrap.wrap(" ".join(str(header).split()), 100)] + ["tune_result:"]
    lines += _yaml(record, 1)
    return "\n".join(lines) + "\n"


def _quoted(text, where):
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0x20 <= code <= 0x7E:
            out.append(char)
        elif 0xD800 <= code <= 0xDFFF:
            _fail("%s holds a lone surrogate (%s), which no YAML file can hold: nothing is written "
                  "to the inventory" % (where, _shown(text)))
        elif code <= 0xFF:
            out.append("\\x%02x" % code)
        elif code <= 0xFFFF:
            out.append("\\u%04x" % code)
        else:
            out.append("\\U%08x" % code)
    body = '"%s"' % "".join(out)
    # Ansible 2.19 resolves an !unsafe scalar's type again as if it were plain ("" is null, a date a datetime, digits
    # an int): such a value is written quoted without the tag. None of those forms can hold "{", so no template.
    if _RESOLVER.resolve(ScalarNode, text, (True, False)) != "tag:yaml.org,2002:str":
        return body
    return "!unsafe " + body


def _scalar(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return _quoted(str(value), where)


def _yaml(value, depth, where="tune_result"):
    pad = "  " * depth
    out = []
    for key in sorted(value):
        if not isinstance(key, str) or not _KEY.match(key):
            _fail("%s has a key %s that is not a variable name: nothing is written to the inventory"
                  % (where, _shown(key)))
        item, inner = value[key], "%s.%s" % (where, key)
        if isinstance(item, dict):
            out.append("%s%s:" % (pad, key))
            out += _yaml(item, depth + 1, inner)
        else:
            out.append("%s%s: %s" % (pad, key, _scalar(item, inner)))
    return out


def utc_date(epoch):
    """ISO 8601 UTC of an epoch (seconds)."""
    return datetime.datetime.fromtimestamp(float(epoch), tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------ the report

def _speed(value):
    return "-" if value is None else "%.2f" % float(value)


def markdown(result):
    """The search as a Markdown page: objective, budget, what was and was not searched, every trial."""
    obj = result["objective"]
    lines = ["# Tuning: %s" % result["host"], "",
             "%s, build `%s`, model `%s`, %s." % (result["engine"], result["build"],
                                                  str(result["model"]).rsplit("/", 1)[-1], result["date"]), "",
             "Objective **%s** (prompt %d tokens, generation %d tokens); budget %d s, the last trial ended after %.0f s; "
             "stopped: %s." % (obj["kind"], obj["prompt_tokens"], obj["gen_tokens"], result["budget_seconds"],
                               result["search_seconds"], result["stopped"]), ""]
    if result.get("ok"):
        lines += ["Score %.2f -> %.2f (%+.1f%%); flags changed: %s." % (
            result["baseline"]["score"], result["best"]["score"], 100 * result["gain"],
            ", ".join(result["changed_flags"]) or "none (the service's flags were best)"), ""]
    lines += ["Search order: %s." % (", ".join(result["order"]) or "nothing to search")]
    for name, why in sorted(result["skipped"].items()):
        lines.append("- not searched: %s (%s)" % (name, why))
    lines += ["", "| # | knob | values | pp tok/s | tg tok/s | score | s | verdict |", "|---|---|---|---|---|---|---|---|"]
    for trial in result["trials"]:
        values = trial["values"]
        shown = " ".join("%s=%s" % (k, values[k]) for k in sorted(values))
        verdict = trial["verdict"] + (": " + trial["reason"] if trial.get("reason") else "")
        if trial.get("note"):
            verdict += " (%s)" % trial["note"]
        lines.append("| %d | %s | %s | %s | %s | %s | %.1f | %s |" % (
            trial["index"], trial["dimension"], shown, _speed(trial.get("pp_tps")), _speed(trial.get("tg_tps")),
            _speed(trial.get("score")), float(trial.get("seconds") or 0), verdict.replace("|", "\\|")))
    return "\n".join(lines) + "\n"


class FilterModule(object):
    """Filters of the tune role."""

    def filters(self):
        return {
            "tune_objective": objective,
            "tune_space": space,
            "tune_candidates": candidates,
            "tune_next_trial": next_trial,
            "tune_record": record,
            "tune_settle": settle,
            "tune_summary": summary,
            "tune_markdown": markdown,
            "tune_tuned_record": tuned_record,
            "tune_tuned_vars": tuned_vars,
            "tune_tuned_match": tuned_match,
            "tune_tuned_file": tuned_file,
            "tune_tuned_checked": tuned_checked,
            "tune_utc_date": utc_date,
        }
