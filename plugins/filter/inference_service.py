# -*- coding: utf-8 -*-
"""Service knowledge of the inference_service role, as plain functions with unit tests.

What the role decides lives here, not in Jinja: the launch flags per engine (only flags the pinned
engine version accepts), the expert placement plan (which MoE layers' routed experts fit on which
GPU, the rest in DRAM) and the -ot rules it renders, the KV cache size, the arguments file the
unit's wrapper reads (so no regex ever passes through systemd's quoting), the readiness timeout and
the thread count. tests/unit/test_inference_service.py imports this file directly.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_door import door_names
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

from ansible_collections.hmk.moe_kit.plugins.module_utils import (
    hmk_answer_probe, hmk_engine_arch, hmk_engine_log, hmk_nvidia_devices)

GIB = 1024 ** 3
GB = 1000 ** 3

# Bytes per element of the KV cache types llama.cpp / ik_llama.cpp offer (block size / type size).
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34.0 / 32, "q6_0": 26.0 / 32, "q5_0": 22.0 / 32, "q5_1": 24.0 / 32,
    "q4_0": 18.0 / 32, "q4_1": 20.0 / 32, "iq4_nl": 18.0 / 32,
}
# Which architectures are MLA (-mla, -amb and the latent KV cache apply to these only) comes from the engine at the
# build's commit date: hmk_engine_arch.mla_archs, read from ik_llama.cpp's own sources.
# Flags every llama-server since the kit's oldest supported commit (2025-04) parses; the flags that
# changed between commits come from llama_build's per-version table (llama_build_engine_flags).
# --no-slots: ik_llama.cpp (common.cpp at the pin) and mainline (common/arg.cpp since 2024-09) both parse it; the
# service's dry parse against the built binary confirms it before every unit change.
LLAMA_STABLE_FLAGS = ("-m", "--port", "-b", "--api-key-file", "--alias", "-np", "--no-slots", "-tb", "-ts")
NUMA_MODES = ("distribute", "isolate", "numactl")


def _fail(msg):
    raise AnsibleFilterError(msg)


# ------------------------------------------------------------------------------------ the engine's flags

def accepted_flags(flag_set):
    """{flag: smoke-check argument or None} of a llama_build_engine_flags entry, or of a list of names."""
    if isinstance(flag_set, dict):
        items = flag_set.get("accepted", []) or []
    else:
        items = flag_set or []
    out = {}
    for item in items:
        if isinstance(item, dict):
            out[str(item["flag"])] = None if item.get("arg") is None else str(item["arg"])
        else:
            out[str(item)] = None
    return out


def engine_flag_set(table, engine, commit_date):
    """The entry of llama_build_engine_flags that covers the running build's commit date."""
    commit_date = str(commit_date or "")[:10]
    matches = [entry for entry in (table or {}).get(engine, []) or []
               if str(entry.get("since") or "0000-00-00") <= commit_date < str(entry.get("until") or "9999-99-99")]
    if len(matches) != 1:
        _fail("llama_build_engine_flags has %d entries for %s at commit date %s (need exactly one)"
              % (len(matches), engine, commit_date or "?"))
    return hmk_engine_arch.flag_set_at(matches[0], commit_date)


def _fa_args(accepted):
    """Flash attention in the form the engine version takes: `-fa on`, bare `-fa`, or nothing (default on)."""
    if "-fa" not in accepted:
        return []
    value = accepted["-fa"]
    if value is None and "-fmoe" not in accepted:
        value = "on"  # names only (no table): -fa took a value from the commit that dropped -fmoe on
    return ["-fa"] + ([value] if value else [])


def llama_argv(opts):
    """llama-server arguments (without the binary) for ik_llama.cpp or mainline llama.cpp.

    opts: engine, accepted (table entry or flag names), commit_date (the build's: which architectures are MLA),
    model, arch, host, port, threads, threads_batch (0: as -t), ngl, ctx, batch, ubatch, ctk, ctv, amb (MiB, MLA
    models; 0 = no limit, rendered too), cache_ram_mib (-cram), ctx_checkpoints, ot (list of REGEX=BUFFER rules,
    first match wins), numa_nodes, numa_mode, rtr (run-time repacking: CPU-only nodes), metrics, alias, parallel,
    api_key_file, gpus (count), the opt-ins defer_experts, prefetch_experts, split_mode_graph, mtp (with
    mtp_layers, the model's nextn_predict_layers), extra (list).

    What the engine would otherwise decide, and the kit's plan depends on, is rendered wherever the commit accepts
    the flag: -amb (its default moved from no limit to 256 MiB), -cram (host RAM the plan counts),
    --ctx-checkpoints, and mainline's -fit off (else mainline re-plans the kit's placement).
    """
    engine = opts.get("engine", "ik_llama.cpp")
    if engine not in ("ik_llama.cpp", "llama.cpp"):
        _fail("llama_argv renders ik_llama.cpp or llama.cpp, not %r" % engine)
    accepted = accepted_flags(opts.get("accepted"))
    if not accepted:
        _fail("no accepted-flag data for %s: the build record or llama_build_engine_flags is missing" % engine)

    def need(flag):
        if flag not in accepted and flag not in LLAMA_STABLE_FLAGS:
            _fail("%s at this commit does not accept %s, which the service needs; fix llama_build_engine_flags "
                  "or move the pin" % (engine, flag))
        return flag

    argv = [need("-m"), str(opts["model"])]
    argv += [need("--host"), str(opts.get("host", "127.0.0.1")), need("--port"), str(opts.get("port", 8080))]
    argv += [need("-t"), str(int(opts["threads"]))]
    if int(opts.get("threads_batch") or 0) > 0 and int(opts["threads_batch"]) != int(opts["threads"]):
        argv += [need("-tb"), str(int(opts["threads_batch"]))]
    argv += [need("-ngl"), str(int(opts.get("ngl", 99)))]
    argv += [need("-c"), str(int(opts.get("ctx", 32768)))]
    argv += [need("-b"), str(int(opts.get("batch", 2048)))]
    if "-ub" in accepted:
        argv += ["-ub", str(int(opts.get("ubatch", 2048)))]
    argv += [need("-ctk"), str(opts.get("ctk", "q8_0")), need("-ctv"), str(opts.get("ctv", "q8_0"))]
    argv += _fa_args(accepted)
    if "-fmoe" in accepted:  # only commits before 2025-10-25 have (and need) the switch
        argv.append("-fmoe")
    if hmk_engine_arch.is_mla(engine, opts.get("commit_date"), opts.get("arch")) and "-mla" in accepted:
        argv += ["-mla", "3"]
        if "-amb" in accepted:
            amb = int(opts.get("amb") or 0)
            if amb < 0:
                _fail("-amb is a size in MiB (0 = no limit), not %d" % amb)
            argv += ["-amb", str(amb)]
    if "-cram" in accepted:
        cram = cache_ram_mib(opts.get("cache_ram_mib"))
        argv += ["-cram", str(cram)]
    if "--ctx-checkpoints" in accepted:
        checkpoints = int(opts.get("ctx_checkpoints") if opts.get("ctx_checkpoints") not in (None, "") else 32)
        if checkpoints < 0:
            _fail("--ctx-checkpoints is a count per slot (0 = none), not %d" % checkpoints)
        argv += ["--ctx-checkpoints", str(checkpoints)]
    if "-fit" in accepted:  # mainline: never re-plan -ngl/-ot/-c against the free VRAM at start
        argv += ["-fit", "off"]
    argv += opt_in_argv(engine, accepted, opts)
    for rule in opts.get("ot") or []:
        argv += [need("-ot"), str(rule)]
    if opts.get("ts"):
        argv += [need("-ts"), ",".join("%g" % float(v) for v in opts["ts"])]
    if int(opts.get("numa_nodes") or 1) > 1:
        mode = str(opts.get("numa_mode") or "distribute")
        if mode not in NUMA_MODES:
            _fail("the NUMA mode is one of %s, not %r" % (", ".join(NUMA_MODES), mode))
        argv += [need("--numa"), mode]
    if opts.get("rtr"):
        argv.append(need("-rtr"))
    if opts.get("metrics", True):
        argv.append(need("--metrics"))
    # Slot reporting answers the prompts in every slot: on /slots (key-protected) but also on the public
    # /health?include_slots, so it is switched off (ik_llama.cpp server.cpp: params.endpoint_slots).
    argv.append(need("--no-slots"))
    if opts.get("alias"):
        argv += ["--alias", str(opts["alias"])]
    if int(opts.get("parallel") or 0) > 0:
        argv += ["-np", str(int(opts["parallel"]))]
    if opts.get("api_key_file"):
        argv += ["--api-key-file", str(opts["api_key_file"])]
    extra = [str(a) for a in opts.get("extra") or []]
    if opts.get("ts") and ("-ts" in extra or "--tensor-split" in extra):
        _fail("the placement plan renders -ts to keep each layer's experts on the GPU that holds the layer; "
              "remove -ts/--tensor-split from inference_service_extra_args (or give explicit -ot rules)")
    reasons = {
        "--api-key": "the key would be visible in /proc/<pid>/cmdline; set inference_service_api_key",
        "--api-key-file": "the unit hands the key over; set inference_service_api_key",
        "--slots": "slot reporting answers other users' prompts on the public /health?include_slots",
    }
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in ("-rtr", "--run-time-repack", "--api-key", "--api-key-file", "--slots"):
            _fail("%s is refused in the extra arguments: %s" % (flag, reasons.get(
                flag, "run-time repacking disables mmap and GPU prompt offload in hybrid mode")))
    return argv + extra


def cache_ram_mib(value):
    """-cram in MiB: the engine's default 8192 when unset; 0 disables the prompt cache; -1 (no limit) is refused,
    since the RAM plan could not count it."""
    cram = 8192 if value in (None, "") else int(value)
    if cram < 0:
        _fail("-cram %d (no limit) cannot be counted in the RAM plan: give the prompt cache a size in MiB (0: off)" % cram)
    return cram


def opt_in_argv(engine, accepted, opts):
    """The opt-in flags (off unless asked for), each only where the build's commit accepts it; asking for one the
    commit lacks fails, naming it."""
    argv = []

    def want(key):
        return str(opts.get(key)).lower() in ("true", "1", "yes", "on")

    def need(flag, what):
        if flag not in accepted:
            _fail("%s at this commit does not accept %s (%s): move the pin to a commit that has it "
                  "(llama_build_engine_flags lists since when) or switch the option off" % (engine, flag, what))
        return flag

    if want("defer_experts"):
        argv.append(need("--defer-experts", "inference_service_defer_experts"))
    if want("prefetch_experts"):
        argv.append(need("--prefetch-experts", "inference_service_prefetch_experts"))
    if want("split_mode_graph"):
        if int(opts.get("gpus") or 0) < 2:
            _fail("-sm graph splits each layer over several GPUs; this node has %d: switch "
                  "inference_service_split_mode_graph off" % int(opts.get("gpus") or 0))
        argv += [need("-sm", "inference_service_split_mode_graph"), "graph"]
    if want("mtp"):
        if int(opts.get("mtp_layers") or 0) <= 0:
            _fail("the model has no MTP layers (GGUF %s.nextn_predict_layers is 0 or absent): switch "
                  "inference_service_mtp off" % (opts.get("arch") or "<arch>"))
        # the table's items carry the value (--spec-type mtp); a build record's name list does not, but it lists
        # --spec-type only from the commit on that takes "mtp", and -mtp only before it
        if "-mtp" not in accepted and "--spec-type" in accepted and accepted["--spec-type"] in ("mtp", None):
            argv += ["--spec-type", "mtp"]
        else:
            argv.append(need("-mtp", "inference_service_mtp"))
    return argv


# --kt-expert-placement-strategy's choices in sglang-kt's parser (kvcache-ai/sglang server_args.py: the same at
# 40d3a822, 2026-05, and 1e098a77, 2026-07, the newest of ktransformers' submodule commits readable here).
KT_PLACEMENT_STRATEGIES = ("frequency", "front-loading", "uniform", "random")


def kt_expert_argv(opts):
    """The opt-in sglang-kt expert options, each rendered only when set (sglang-kt's own defaults otherwise).

    gpu_prefill_token_threshold: int, 0 = off (--kt-gpu-prefill-token-threshold N: a prefill of N tokens or more runs
    the layer's experts on the GPU); expert_placement_strategy: '' or one of KT_PLACEMENT_STRATEGIES;
    enable_dynamic_expert_update: bool (a flag; it acts only on the GPU prefill, so it needs the threshold);
    numa_nodes: NUMA node ids, one per thread pool (--kt-numa-nodes 0 1: nargs='+', as many as --kt-threadpool-count).
    """
    argv = []
    threshold = opts.get("gpu_prefill_token_threshold")
    threshold = int(threshold) if threshold not in (None, "") else 0
    if threshold < 0:
        _fail("--kt-gpu-prefill-token-threshold must be 0 (off) or a token count, not %d" % threshold)
    if threshold:
        argv += ["--kt-gpu-prefill-token-threshold", str(threshold)]
    if str(opts.get("enable_dynamic_expert_update")).lower() in ("true", "1", "yes", "on"):
        if not threshold:
            _fail("--kt-enable-dynamic-expert-update updates the GPU experts after a GPU prefill, which only "
                  "--kt-gpu-prefill-token-threshold turns on: set inference_service_kt_gpu_prefill_token_threshold too")
        argv.append("--kt-enable-dynamic-expert-update")
    strategy = str(opts.get("expert_placement_strategy") or "")
    if strategy:
        if strategy not in KT_PLACEMENT_STRATEGIES:
            _fail("--kt-expert-placement-strategy %r is not one sglang-kt accepts (%s)"
                  % (strategy, ", ".join(KT_PLACEMENT_STRATEGIES)))
        argv += ["--kt-expert-placement-strategy", strategy]
    nodes = [int(n) for n in opts.get("numa_nodes") or []]
    if nodes:
        pools = int(opts.get("threadpool_count") or 0)
        if len(nodes) != pools:
            _fail("--kt-numa-nodes lists %d node(s) and --kt-threadpool-count is %d: one NUMA node per thread pool, "
                  "and the kit sets one pool per NUMA node of the node" % (len(nodes), pools))
        if len(set(nodes)) != len(nodes) or min(nodes) < 0:
            _fail("--kt-numa-nodes %s must name distinct NUMA node ids (0, 1, ...)" % " ".join(str(n) for n in nodes))
        argv += ["--kt-numa-nodes"] + [str(n) for n in nodes]
    return argv


def kt_argv(opts):
    """sglang-kt arguments (after `python -m sglang.launch_server`) for KTransformers 0.7.x.

    Every flag is one sglang-kt's parser has at the pin (python/sglang/srt/server_args.py of kvcache-ai/sglang),
    and the build's `--help` must list them (ktransformers_build_server_flags, checked on the node).
    opts: model_path (HF folder: config, tokenizer, GPU weights), weight_path (--kt-weight-path), method,
    cpuinfer (physical cores), threadpool_count (NUMA nodes), num_gpu_experts, attention_backend, host, port,
    tensor_parallel_size, served_model_name, context_length, mem_fraction_static, max_deferred_experts_per_token,
    gpu_prefill_token_threshold, expert_placement_strategy, enable_dynamic_expert_update, numa_nodes (see
    kt_expert_argv), metrics, accepted (flag list), extra.
    """
    for key, flag in (("model_path", "--model-path"), ("weight_path", "--kt-weight-path"), ("method", "--kt-method")):
        if not opts.get(key):
            _fail("sglang-kt needs %s: without --kt-weight-path kt-kernel stays off and the GPU runs out of memory "
                  "loading every expert" % flag)
    for key in ("cpuinfer", "threadpool_count"):
        if int(opts.get(key) or 0) <= 0:
            _fail("sglang-kt needs --kt-%s > 0 (physical cores, NUMA nodes)" % key.replace("_", "-"))
    argv = ["--model-path", str(opts["model_path"]), "--kt-weight-path", str(opts["weight_path"]),
            "--kt-method", str(opts["method"]).upper(), "--kt-cpuinfer", str(int(opts["cpuinfer"])),
            "--kt-threadpool-count", str(int(opts["threadpool_count"])),
            "--kt-num-gpu-experts", str(int(opts.get("num_gpu_experts") or 0)),
            "--attention-backend", str(opts.get("attention_backend") or "flashinfer"),
            "--trust-remote-code", "--host", str(opts.get("host", "127.0.0.1")), "--port", str(int(opts.get("port", 30000)))]
    if int(opts.get("tensor_parallel_size") or 1) > 1:
        argv += ["--tensor-parallel-size", str(int(opts["tensor_parallel_size"]))]
    if opts.get("max_deferred_experts_per_token") not in (None, ""):
        argv += ["--kt-max-deferred-experts-per-token", str(int(opts["max_deferred_experts_per_token"]))]
    argv += kt_expert_argv(opts)
    if int(opts.get("context_length") or 0) > 0:
        argv += ["--context-length", str(int(opts["context_length"]))]
    if opts.get("mem_fraction_static"):
        argv += ["--mem-fraction-static", str(float(opts["mem_fraction_static"]))]
    if opts.get("served_model_name"):
        argv += ["--served-model-name", str(opts["served_model_name"])]
    if opts.get("metrics", True):
        argv.append("--enable-metrics")
    accepted = opts.get("accepted")
    if accepted:
        unknown = [a for a in argv if a.startswith("--") and a not in accepted]
        if unknown:
            _fail("the sglang-kt build does not list %s (ktransformers_build_server_flags)" % ", ".join(unknown))
    extra = [str(a) for a in opts.get("extra") or []]
    for forbidden in ("--api-key", "--admin-api-key"):
        if forbidden in extra:
            _fail("%s is refused in the extra arguments: sglang-kt logs its whole ServerArgs, keys included, at "
                  "start-up; keep the service on loopback behind the gateway" % forbidden)
    return argv + extra


# ------------------------------------------------------------------------------------ the dry parse

DRY_PARSE_MODEL = "/nonexistent/hmk-dry-parse.gguf"
PARSE_REFUSALS = re.compile(r"(unknown argument|invalid argument|invalid parameter|error while handling argument|"
                            r"unknown value for|legacy \S+ option '[^']*' is disabled|^usage: |failed to open file)", re.IGNORECASE)


def dry_parse_argv(argv):
    """The service's argv with the model swapped for a path that does not exist: the engine parses every argument
    and then stops at the model load, before it maps anything."""
    out = [str(a) for a in argv]
    for index, arg in enumerate(out[:-1]):
        if arg in ("-m", "--model"):
            out[index + 1] = DRY_PARSE_MODEL
    return out


def dry_parse_errors(output):
    """Lines of a dry run that say the engine's argument parser refused something (it prints its usage then)."""
    return [line.strip() for line in str(output or "").splitlines() if PARSE_REFUSALS.search(line.strip())]


# ------------------------------------------------------------------------------ systemd-safe rendering

def args_file(argv):
    """The wrapper's arguments file: one argument per line, bytes exactly as the engine must see them.

    The wrapper reads it with `read -r`, so backslashes, `%`, `$` and quotes arrive untouched; only a
    newline (or NUL) inside an argument cannot be represented, and is refused.
    """
    lines = []
    for arg in argv:
        arg = str(arg)
        if "\n" in arg or "\r" in arg or "\x00" in arg:
            _fail("argument %r contains a line break or NUL; the arguments file holds one argument per line" % arg)
        if arg == "":
            _fail("an empty argument cannot be passed through the arguments file")
        lines.append(arg)
    return "\n".join(lines) + "\n"


def read_args_file(text):
    """What the wrapper's `while IFS= read -r line` loop yields for an arguments file (for tests)."""
    return str(text).split("\n")[:-1] if str(text).endswith("\n") else str(text).split("\n")


def systemd_word(value):
    """One word of an ExecStart= line: `%` doubled (specifiers), backslash doubled, quoted if needed.

    Only paths go through here (the wrapper, the arguments file); the engine's flags never do.
    """
    value = str(value)
    if any(c in value for c in "\n\r\x00"):
        _fail("a line break cannot appear in an ExecStart= word: %r" % value)
    escaped = value.replace("\\", "\\\\").replace("%", "%%").replace("$", "$$").replace('"', '\\"')
    if value == "" or re.search(r"[\s'\";]", value):
        return '"%s"' % escaped
    return escaped


# ------------------------------------------------------------------------------------------ the model

def model_is_mla(arch, engine="ik_llama.cpp", commit_date=""):
    return hmk_engine_arch.is_mla(engine, commit_date, arch)


def kv_cache_bytes(layout, ctx, ctk="q8_0", ctv="q8_0", mla=None):
    """Bytes of the KV cache for `ctx` tokens.

    MLA (deepseek2 with -mla 3): one latent row of kv_lora_rank + rope dims per token and layer, in the
    K type (~1.2 GiB at 32k for R1 with q8_0). Otherwise n_head_kv x (key_length + value_length).
    """
    meta = layout.get("metadata", layout)
    layers = int(meta.get("block_count") or 0)
    if mla is None:
        mla = model_is_mla(layout.get("architecture") or meta.get("architecture"))
    if ctk not in KV_TYPE_BYTES or ctv not in KV_TYPE_BYTES:
        _fail("unknown KV cache type %s/%s (known: %s)" % (ctk, ctv, ", ".join(sorted(KV_TYPE_BYTES))))
    if mla and meta.get("kv_lora_rank"):
        per_token = (int(meta["kv_lora_rank"]) + int(meta.get("rope_dimension_count") or 0)) * KV_TYPE_BYTES[ctk]
    else:
        heads_kv = int(meta.get("head_count_kv") or meta.get("head_count") or 0)
        embd = int(meta.get("embedding_length") or 0)
        heads = int(meta.get("head_count") or 1)
        key = int(meta.get("key_length") or (embd // heads if heads else 0))
        val = int(meta.get("value_length") or key)
        per_token = heads_kv * (key * KV_TYPE_BYTES[ctk] + val * KV_TYPE_BYTES[ctv])
    return int(per_token * layers * int(ctx))


def gpu_vram_bytes(profile, override=None):
    """Each GPU's VRAM in bytes: an explicit list of GiB, or the profile's gpus.count x gpus.vram_gib."""
    if override:
        return [int(float(v) * GIB) for v in override]
    gpus = (profile or {}).get("gpus") or {}
    count = int(gpus.get("count") or 0)
    if count <= 0:
        return []
    if not gpus.get("vram_gib"):
        _fail("hmk_hardware.gpus declares %d GPU(s) but no vram_gib; the placement plan needs it" % count)
    return [int(float(gpus["vram_gib"]) * GIB)] * count


def _ranges(layers):
    return "|".join(str(n) for n in sorted(layers))


# How the engines share the offloaded layers out over several GPUs (split mode "layer", the default),
# read in their sources:
# - "layers": mainline llama.cpp (llama-model.cpp, load_tensors) and ik_llama.cpp before #1466 give layer i
#   to the first GPU whose cumulative -ts share exceeds (i - i_gpu_start) / min(ngl, n_layer + 1); without
#   -ts the shares are each GPU's free memory at load time.
# - "bytes": ik_llama.cpp since #1466 (2026-03-19; the kit's pin 8337e4cd and 55d3c05 before it have it) walks the layers' sizes
#   (every weight of the layer, routed experts included, plus its KV cache; the output layer last) and
#   fills GPU k up to its share of (sum of sizes + one compute buffer per GPU), counting a compute buffer
#   per GPU; a layer that straddles the border goes where it overshoots less.
# Without -ts both depend on the free memory at start, so the plan renders a -ts that reproduces its blocks.
IK_BYTES_SPLIT_SINCE = "2026-03-19"


def split_model(engine, commit_date=""):
    """The layer-split rule of an engine build: "bytes" (ik_llama.cpp since #1466) or "layers"."""
    if engine == "ik_llama.cpp" and str(commit_date or "")[:10] >= IK_BYTES_SPLIT_SINCE:
        return "bytes"
    return "layers"


def layer_table(layout, kv_bytes):
    """(n_layer, weights per layer incl. experts, experts per layer, KV per layer, output layer bytes)."""
    meta = layout.get("metadata") or {}
    experts = dict((int(k), int(v)) for k, v in (layout.get("expert_bytes") or {}).items())
    totals = dict((int(k), int(v)) for k, v in (layout.get("layer_bytes") or {}).items())
    known = list(experts) + list(totals)
    n_layer = int(meta.get("block_count") or 0) or (max(known) + 1 if known else 0)
    if totals:
        weights = [totals.get(i, 0) for i in range(n_layer)]
        output = int(layout.get("output_bytes") or 0)
    else:
        # A layout without the per-layer table (a record from before it existed): the non-expert weights
        # are spread evenly over the layers and the output layer counts as nothing.
        share = int(layout.get("non_expert_bytes") or 0) // max(n_layer, 1)
        weights = [share + experts.get(i, 0) for i in range(n_layer)]
        output = 0
    kv = [int(kv_bytes) // max(n_layer, 1)] * n_layer
    return n_layer, weights, experts, kv, output


def _blocks(first, n_layer, vram):
    """Contiguous blocks of the offloaded layers [first, n_layer), one per GPU, sized by its VRAM."""
    count = n_layer - first
    total = float(sum(vram)) or 1.0
    ends, cumulative = [], 0
    for index, size in enumerate(vram):
        cumulative += size
        end = first + int(round(count * cumulative / total))
        low = (ends[-1] if ends else first) + (1 if count >= len(vram) else 0)
        high = n_layer - ((len(vram) - index - 1) if count >= len(vram) else 0)
        ends.append(min(max(end, low), high) if index < len(vram) - 1 else n_layer)
    starts = [first] + ends[:-1]
    return [list(range(a, b)) for a, b in zip(starts, ends)]


def tensor_split(blocks, model, n_layer, ngl, sizes=None, compute=0):
    """-ts values that make the engine's own split give each GPU exactly its block.

    model "layers": the cumulative share of GPU k sits half a layer before its block's end.
    model "bytes": GPU k's border sits a quarter of the first next layer's size past its block, so an
    error in the engine's compute-buffer estimate or the KV size of up to that much moves nothing.
    sizes: the engine's layer sizes (layers 0..n_layer-1, then the output layer), for "bytes".
    """
    if len(blocks) < 2:
        return []
    first = max(n_layer - int(ngl), 0)
    if model == "layers":
        active = min(int(ngl), n_layer + 1)
        edges = [(block[-1] + 1 - first - 0.5) / float(active) if block else None for block in blocks[:-1]]
    else:
        n_last = n_layer + 1 if int(ngl) > n_layer else n_layer
        total = float(compute * len(blocks) + sum(sizes[first:n_last]))
        edges, loaded = [], 0.0
        for block in blocks[:-1]:
            loaded += compute + sum(sizes[i] for i in block)
            nxt = block[-1] + 1 if block else first
            edges.append((loaded + sizes[nxt] / 4.0) / total)
    shares, last = [], 0.0
    for edge in edges:
        edge = last if edge is None else edge
        shares.append(edge - last)
        last = edge
    shares.append(1.0 - last)
    return [float("%.6g" % share) for share in shares]


def engine_layer_devices(model, splits, n_layer, ngl, sizes=None, compute=0):
    """Which GPU the engine gives each offloaded layer (and the output layer, index n_layer) for -ts splits.

    The engines' own rules (see IK_BYTES_SPLIT_SINCE), used by the tests and by the proof on the node to
    check that a -ts gives the planned blocks.
    """
    count = len(splits)
    total_share = float(sum(splits)) or 1.0
    cumulative, running = [], 0.0
    for share in splits:
        running += share
        cumulative.append(running / total_share)
    first = max(n_layer - int(ngl), 0)
    devices = {}
    if model == "layers":
        active = min(int(ngl), n_layer + 1)
        last = n_layer + 1 if int(ngl) > n_layer else n_layer
        for layer in range(first, last):
            value = float(layer - first) / active
            devices[layer] = next((k for k, edge in enumerate(cumulative) if edge > value), count - 1)
        return devices
    n_last = n_layer + 1 if int(ngl) > n_layer else n_layer
    total = compute * count + sum(sizes[first:n_last])
    for layer in range(first, n_last):
        devices[layer] = count - 1
    layer, loaded = first, 0.0
    for index in range(count):
        loaded += compute
        split_size = cumulative[index] * total
        while layer < n_last:
            if loaded + sizes[layer] <= split_size:
                devices[layer] = index
                loaded += sizes[layer]
                layer += 1
                continue
            if loaded + sizes[layer] - split_size < split_size - loaded:
                devices[layer] = index
                loaded += sizes[layer]
                layer += 1
            break
    return devices


def placement_plan(layout, vram, kv_bytes, compute_reserve=3 * GIB, overhead=GIB, max_gpu_layers=-1,
                   ngl=99, model="layers"):
    """Which layers each GPU holds, and which MoE layers' routed experts go with them; the rest in DRAM.

    layout: the GGUF reader's output (expert_bytes, layer_bytes, output_bytes, metadata.block_count).
    vram: bytes per GPU. With -ngl N the engine offloads the last N layers (all of them and the output
    layer when N > n_layer) and gives each GPU one contiguous block of them: attention, shared experts,
    dense FFNs and the KV cache of a layer live on the GPU that holds the layer. Blocks are sized by VRAM;
    the rendered -ts (tensor_split) makes the engine's split (model: "layers" or "bytes", see split_model)
    give exactly these blocks. Each GPU then takes whole MoE layers' experts from its own block, in layer
    order, while base (its block's non-expert weights + KV + output layer on the last GPU + the
    reserves) plus experts stay inside its VRAM: a layer never has its attention on one GPU and its
    experts on another. A GPU too small for anything but its block gets no experts, with a warning.
    max_gpu_layers: cap on MoE layers whose experts go to GPUs (-1: as many as fit; 0: all on CPU).
    """
    n_layer, weights, experts, kv, output = layer_table(layout, kv_bytes)
    vram = [int(v) for v in vram or []]
    ngl = int(ngl)
    first = max(n_layer - ngl, 0) if vram else n_layer
    output_on_gpu = bool(vram) and ngl > n_layer
    blocks = _blocks(first, n_layer, vram) if vram else []
    limit = int(max_gpu_layers)
    gpus, warnings, placed = [], [], 0
    for index, size in enumerate(vram):
        block = blocks[index]
        holds_output = output_on_gpu and index == len(vram) - 1
        block_kv = sum(kv[i] for i in block)
        non_expert = sum(weights[i] - experts.get(i, 0) for i in block) + (output if holds_output else 0)
        base = non_expert + block_kv + int(compute_reserve) + int(overhead)
        gpu = {"device": "CUDA%d" % index, "vram_bytes": size, "block": [block[0], block[-1]] if block else [],
               "holds_output": holds_output, "kv_bytes": block_kv, "base_bytes": base,
               "free_for_experts_bytes": max(size - base, 0), "layers": [], "expert_bytes": 0}
        if base > size:
            warnings.append("CUDA%d: its layers' attention and KV cache and the reserves need %.1f GiB of its %.1f GiB; "
                            "lower inference_service_ctx or the reserves, or expect an out-of-memory at load"
                            % (index, base / float(GIB), size / float(GIB)))
        for layer in block:
            if layer not in experts or (0 <= limit <= placed):
                continue
            if gpu["expert_bytes"] + experts[layer] > gpu["free_for_experts_bytes"]:
                break
            gpu["layers"].append(layer)
            gpu["expert_bytes"] += experts[layer]
            placed += 1
        gpu["weights_bytes"] = non_expert + gpu["expert_bytes"]
        gpu["expected_bytes"] = base + gpu["expert_bytes"]
        gpu["expected_gib"] = round(gpu["expected_bytes"] / float(GIB), 2)
        gpus.append(gpu)
    on_gpu = set(n for g in gpus for n in g["layers"])
    cpu_layers = [n for n in sorted(experts) if n not in on_gpu]
    if gpus and not on_gpu and experts and limit != 0:
        warnings.append("no MoE layer's experts fit beside the GPUs' attention and KV cache: all routed experts stay "
                        "in DRAM (buffer CPU)")
    if vram and len(vram) > n_layer - first:
        warnings.append("%d GPUs but only %d offloaded layers: some GPUs hold nothing" % (len(vram), n_layer - first))
    sizes = [w + k for w, k in zip(weights, kv)] + [output]
    splits = tensor_split(blocks, model, n_layer, ngl, sizes, int(compute_reserve)) if vram else []
    plan = {
        "gpus": gpus,
        "cpu_layers": cpu_layers,
        "cpu_expert_bytes": sum(experts[n] for n in cpu_layers),
        "gpu_layer_count": len(on_gpu),
        "moe_layer_count": len(experts),
        "non_expert_bytes": int(layout.get("non_expert_bytes") or 0),
        "kv_bytes": int(kv_bytes),
        "n_layer": n_layer,
        "ngl": ngl,
        "offloaded_layers": min(ngl, n_layer + 1) if vram else 0,
        "split_model": model,
        "tensor_split": splits,
        "warnings": warnings,
    }
    plan["rules"] = ot_rules(plan)
    return plan


# Host RAM the engine keeps besides the model's CPU-side weights and its prompt cache: the CPU compute buffers and
# the OS. The prompt cache (-cram, 8192 MiB unless set: the engine's default at 55d3c05 and 8337e4cd) is counted on
# top, at the size the service renders; with the default the two make the 16 GiB the plan has always reserved.
HOST_RESERVE = 8 * GIB
CACHE_RAM_MIB = 8192


def memory_plan(layout, plan, ram_bytes, host_reserve=HOST_RESERVE, cache_ram=CACHE_RAM_MIB):
    """Whether a placement plan fits a node: every GPU's expected bytes inside its VRAM, and the weights the plan
    leaves on the CPU side (the whole file less what the GPUs hold; mmap keeps them in the page cache) plus the
    prompt cache (-cram, MiB) plus host_reserve inside ram_bytes."""
    total = int(layout.get("total_bytes") or 0)
    on_gpu = sum(int(g["weights_bytes"]) for g in plan["gpus"])
    ram_weights = max(total - on_gpu, 0)
    cache = cache_ram_mib(cache_ram) * 1024 * 1024
    need = ram_weights + cache + int(host_reserve)
    vram_ok = all(g["expected_bytes"] <= g["vram_bytes"] for g in plan["gpus"])
    out = {
        "model_bytes": total, "gpu_weight_bytes": on_gpu, "ram_weight_bytes": ram_weights,
        "prompt_cache_bytes": cache, "host_reserve_bytes": int(host_reserve),
        "ram_needed_bytes": need, "ram_bytes": int(ram_bytes), "fits_ram": need <= int(ram_bytes),
        "vram_needed_bytes": [int(g["expected_bytes"]) for g in plan["gpus"]],
        "vram_bytes": [int(g["vram_bytes"]) for g in plan["gpus"]], "fits_vram": vram_ok,
    }
    out["fits"] = out["fits_ram"] and out["fits_vram"]
    return out


def ot_rules(plan):
    """-ot rules in first-match-wins order: each GPU's layers, then the catch-all `exps=CPU`."""
    rules = []
    for gpu in plan.get("gpus") or []:
        if gpu.get("layers"):
            rules.append(r"blk\.(%s)\.ffn_.*_exps=%s" % (_ranges(gpu["layers"]), gpu["device"]))
    rules.append("exps=CPU")
    return rules


def rule_buffer(rules, tensor):
    """The buffer a tensor name lands in under first-match-wins -ot rules (regex search, like llama.cpp)."""
    for rule in rules:
        pattern, _unused, buffer = str(rule).rpartition("=")
        if re.search(pattern, tensor):
            return buffer
    return None


def _block_text(gpu):
    block = gpu.get("block") or []
    text = "%d-%d" % (block[0], block[1]) if block else "none"
    return text + (" + output" if gpu.get("holds_output") else "")


def plan_markdown(plan, title=""):
    """The plan as a short Markdown page (written beside the unit)."""
    lines = ["# Expert placement%s" % (": " + title if title else ""), ""]
    lines.append("| device | layers it holds | MoE layers with experts here | experts | attention/KV/reserves | expected | VRAM |")
    lines.append("|---|---|---|---|---|---|---|")
    for gpu in plan["gpus"]:
        lines.append("| %s | %s | %s | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB |" % (
            gpu["device"], _block_text(gpu), _ranges(gpu["layers"]) or "none", gpu["expert_bytes"] / float(GIB),
            gpu["base_bytes"] / float(GIB), gpu["expected_bytes"] / float(GIB), gpu["vram_bytes"] / float(GIB)))
    lines.append("| CPU | | %s | %.2f GiB | | | |" % (_ranges(plan["cpu_layers"]) or "none",
                                                      plan["cpu_expert_bytes"] / float(GIB)))
    lines += ["", "-ot rules (first match wins):", ""]
    lines += ["    -ot %s" % r for r in plan["rules"]]
    if plan.get("tensor_split"):
        lines += ["", "Layer split (the engine's %s rule gives each GPU the block above):" % plan.get("split_model"), "",
                  "    -ts %s" % ",".join("%g" % v for v in plan["tensor_split"])]
    for warning in plan["warnings"]:
        lines += ["", "WARNING: " + warning]
    return "\n".join(lines) + "\n"


def plan_summary(plan):
    """One line per device for the play output."""
    out = []
    for gpu in plan["gpus"]:
        out.append("%s: holds layers %s, experts of [%s] %.2f GiB, expected %.2f of %.2f GiB" % (
            gpu["device"], _block_text(gpu), _ranges(gpu["layers"]).replace("|", ",") or "none",
            gpu["expert_bytes"] / float(GIB), gpu["expected_bytes"] / float(GIB), gpu["vram_bytes"] / float(GIB)))
    out.append("CPU: %d MoE layers, %.2f GiB of routed experts in DRAM" % (
        len(plan["cpu_layers"]), plan["cpu_expert_bytes"] / float(GIB)))
    if plan.get("tensor_split"):
        out.append("-ts %s (%s split)" % (",".join("%g" % v for v in plan["tensor_split"]), plan.get("split_model")))
    return out + ["WARNING: " + w for w in plan["warnings"]]


# ------------------------------------------------------------------------------------------ the devices

def nvidia_devices(proc_devices, device_allow=None):
    """/proc/devices judged for the unit's DeviceAllow= entries: the driver's naming and the problems, with fixes."""
    return hmk_nvidia_devices.nvidia(proc_devices, device_allow or ["char-nvidia*"])


# ------------------------------------------------------------------------------------------ the proof

def placement_proof(journal, plan_record, smi_gpus="", smi_apps="", pid=None, smi_error=""):
    """The health gate's verdict on a GPU node: the engine's log of this start and nvidia-smi against the plan.

    journal: the engine's output of this start (journalctl -o cat). plan_record: NAME-plan.json.
    smi_gpus / smi_apps: nvidia-smi --query-gpu=index,uuid,memory.total and --query-compute-apps=pid,gpu_uuid,
    used_memory (csv,noheader,nounits). smi_error: why nvidia-smi could not be read (a failure too: the
    driver must answer on a GPU node). pid: the engine's MainPID.
    """
    apps = None
    if not smi_error:
        apps = hmk_engine_log.parse_smi_apps(smi_apps, hmk_engine_log.parse_smi_gpus(smi_gpus))
    result = hmk_engine_log.evaluate(hmk_engine_log.parse(journal), plan_record, apps,
                                     int(pid) if str(pid or "").isdigit() and int(pid) > 0 else None)
    if smi_error:
        result["ok"] = False
        result["differences"].append({
            "check": "gpu_memory", "found": "nvidia-smi failed: %s" % str(smi_error).strip()[:300],
            "expected": "nvidia-smi lists the GPUs and the engine's memory on them",
            "fix": "Repair the driver (playbooks/gpu.yml; a 'Driver/library version mismatch' needs a reboot)."})
    result["summary"] = hmk_engine_log.summary(result)
    return result


def systemctl_show(text):
    """`systemctl show UNIT --property=A --property=B` -> {A: value, B: value}."""
    props = {}
    for line in str(text or "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


# --------------------------------------------------------------------------------------------- misc

def physical_cores(facts, override=0):
    """Threads for the engine: the override when > 0, else cores per socket x sockets (SMT siblings excluded)."""
    if int(override or 0) > 0:
        return int(override)
    facts = facts or {}
    cores = int(facts.get("processor_cores") or 0) * int(facts.get("processor_count") or 0)
    if cores <= 0:
        cores = int(facts.get("processor_vcpus") or 1)
    return max(cores, 1)


def ready_timeout(model_bytes, base=60, per_gb=2):
    """Seconds to wait for readiness: base + per_gb per GB of model (mapping 400 GB takes minutes)."""
    return int(base + per_gb * ((int(model_bytes) + GB - 1) // GB))


def file_entry(found):
    """One model file as the state record keeps it (path, size, mtime), from an ansible.builtin.find result, as JSON."""
    return json.dumps({"path": found["path"], "size": int(found["size"]), "mtime": int(found["mtime"])}, sort_keys=True)


def config_hash(value):
    """A short stable hash of the service's configuration (anything JSON-serialisable)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def answer_plan(model_path, data, catalog, family="auto", extra=None):
    """The answer probes the gate runs for the served model (hmk_answer_probe.plan): {family, model_id, probes,
    markers, reason}; empty probes, with the reason, for a model of the `none` family or one no catalog entry lists."""
    try:
        return hmk_answer_probe.plan(data or {}, catalog or {}, model_path, family or "auto", extra or [])
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    """inference_service filters."""

    def filters(self):
        return guard_filters({
            "inference_service_engine_flag_set": engine_flag_set,
            "inference_service_llama_argv": llama_argv,
            "inference_service_kt_argv": kt_argv,
            "inference_service_args_file": args_file,
            "inference_service_dry_parse_argv": dry_parse_argv,
            "inference_service_dry_parse_errors": dry_parse_errors,
            "inference_service_systemd_word": systemd_word,
            "inference_service_kv_bytes": kv_cache_bytes,
            "inference_service_gpu_vram": gpu_vram_bytes,
            "inference_service_plan": placement_plan,
            "inference_service_memory_plan": memory_plan,
            "inference_service_is_mla": model_is_mla,
            "inference_service_cache_ram_mib": cache_ram_mib,
            "inference_service_split_model": split_model,
            "inference_service_placement_proof": placement_proof,
            "inference_service_systemctl_show": systemctl_show,
            "inference_service_nvidia_devices": nvidia_devices,
            "inference_service_plan_markdown": plan_markdown,
            "inference_service_plan_summary": plan_summary,
            "inference_service_threads": physical_cores,
            "inference_service_ready_timeout": ready_timeout,
            "inference_service_config_hash": config_hash,
            "inference_service_file_entry": file_entry,
            "inference_service_answer_plan": answer_plan,
            "inference_service_door_names": door_names,
        }, AnsibleFilterError)
