# -*- coding: utf-8 -*-
"""The perplexity baseline: the engine's own llama-perplexity over the kit's fixed text, read and judged.

A node that answers the probes can still have lost quality that a handful of answers does not show (a quant made by
another quantizer, a cache type the model handles badly, an engine commit that changed a kernel). Perplexity over a
fixed text with fixed settings is one number that moves when any of those change, so validate records it on the
first good run and reports a rise beyond a tolerance as a regression; tune rejects flags that cause one.

The reader takes the tool's stdout as the engine prints it (examples/perplexity/perplexity.cpp):
  ik_llama.cpp since PR #914 (2025-11-07, so at the kit's pins 55d3c05 and 8337e4cd):
    Final estimate: PPL over 8 chunks for n_ctx=512 = 1.1058 +/- 0.01821
  ik_llama.cpp before it, and mainline llama.cpp:
    Final estimate: PPL = 3.4184 +/- 0.01902
and the failures it prints instead: too few tokens for the context, one chunk only (no standard deviation), NaN.

Pure Python, no Ansible import: the filters of validate and tune and the unit tests import it."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re

FINAL = re.compile(r"^Final estimate: PPL(?: over (?P<chunks>\d+) chunks for n_ctx=(?P<ctx>\d+))? = "
                   r"(?P<ppl>[-+]?(?:\d+(?:\.\d*)?|nan|inf)) \+/- (?P<err>[-+]?(?:\d+(?:\.\d*)?|nan|inf))\s*$",
                   re.M | re.I)
CALCULATING = re.compile(r"calculating perplexity over (?P<chunks>\d+) chunks(?:, n_ctx=(?P<ctx>\d+))?")
RUNNING = re.compile(r"\[(\d+)\]([-+]?(?:\d+\.\d+|nan|inf))", re.I)
TOO_FEW = re.compile(r"you need at least (?P<need>\d+) tokens to evaluate perplexity with a context of (?P<ctx>\d+)")
TOKENIZES = re.compile(r"tokenizes to only (?P<have>\d+) tokens")

# The service flags llama-perplexity does not take, or takes to no use here: the server's own (address, key, slots,
# chat template, reasoning), and the sizes this run sets itself (context, batch, micro-batch, chunks).
DROP_WITH_VALUE = frozenset((
    "--host", "--port", "--api-key", "--api-key-file", "-a", "--alias", "-np", "--parallel", "--chat-template",
    "--chat-template-file", "--reasoning-format", "--reasoning-budget", "-c", "--ctx-size", "-b", "--batch-size",
    "-ub", "--ubatch-size", "--slot-save-path", "--timeout", "-to", "--threads-http", "--ssl-key-file",
    "--ssl-cert-file", "--path", "-n", "--n-predict", "--cache-reuse", "-f", "--file", "--chunks", "--log-file",
    "-cram", "--cache-ram", "-ctx-ckpt", "--ctx-checkpoints", "--spec-type"))
# Speculative decoding (-mtp) only changes how the server generates, never a logit perplexity reads.
DROP_SWITCHES = frozenset(("--metrics", "--jinja", "--no-webui", "--slots", "--no-slots", "--cont-batching",
                           "-cb", "--embedding", "--embeddings", "--props", "--log-disable", "-v", "--verbose",
                           "-mtp", "--multi-token-prediction"))
# Switches that take no value in llama-server's parser (ik_llama.cpp common/common.cpp at 55d3c05 and 8337e4cd), so
# the argv walk does not swallow the next flag's value.
SWITCHES = DROP_SWITCHES | frozenset(("-rtr", "--run-time-repack", "-fmoe", "--fused-moe", "--no-mmap", "--mlock",
                                      "-ger", "--grouped-expert-routing", "-no-kvu", "--no-kv-offload", "-nkvo",
                                      "--defer-experts", "--prefetch-experts"))


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def read(output):
    """The result of one llama-perplexity run from its stdout and stderr (one text): {ok, ppl, error, chunks, n_ctx,
    running, reason}. ok is False, with the reason, when no finite final estimate is there."""
    text = output or ""
    running = [(int(i), _number(v)) for i, v in RUNNING.findall(text)]
    calc = CALCULATING.search(text)
    result = {"ok": False, "ppl": None, "error": None, "running": [value for _index, value in running],
              "chunks": int(calc.group("chunks")) if calc else None,
              "n_ctx": int(calc.group("ctx")) if calc and calc.group("ctx") else None}
    finals = list(FINAL.finditer(text))
    if finals:
        last = finals[-1]
        ppl, err = _number(last.group("ppl")), _number(last.group("err"))
        if last.group("chunks"):
            result["chunks"], result["n_ctx"] = int(last.group("chunks")), int(last.group("ctx"))
        result["ppl"], result["error"] = ppl, err
        if math.isnan(ppl) or math.isinf(ppl):
            result["reason"] = ("the final estimate is %s: the model's logits are not finite (a broken quant, or an "
                                "engine bug at these flags)" % last.group("ppl"))
            return result
        result["ok"] = True
        result["reason"] = "PPL %.4f +/- %.5f over %s chunks of %s tokens" % (
            ppl, err, result["chunks"] if result["chunks"] is not None else "?",
            result["n_ctx"] if result["n_ctx"] is not None else "?")
        return result
    few = TOO_FEW.search(text)
    if few:
        have = TOKENIZES.search(text)
        result["reason"] = ("the text is too short for the context: %s tokens needed at n_ctx %s, it has %s"
                            % (few.group("need"), few.group("ctx"), have.group("have") if have else "fewer"))
    elif "Unexpected negative standard deviation" in text:
        result["reason"] = "one chunk only, so no standard deviation and no final estimate: give a longer text"
    elif any(math.isnan(v) for v in result["running"]):
        result["reason"] = "the running estimate is nan and no final estimate was printed"
    else:
        result["reason"] = "no 'Final estimate: PPL' line in the output (the run stopped early)"
    return result


def verdict(current, baseline, tolerance_pct):
    """Whether `current` (a read() result) regresses against `baseline` ({ppl, ...} or None): {status, rise_pct,
    reason}. status: failed (no estimate), recorded (no baseline: this one becomes it), ok, or regressed (a rise of
    more than tolerance_pct percent). A fall is never a regression."""
    if not current or not current.get("ok"):
        return {"status": "failed", "rise_pct": None,
                "reason": (current or {}).get("reason") or "llama-perplexity did not run"}
    if not baseline or baseline.get("ppl") in (None, ""):
        return {"status": "recorded", "rise_pct": None,
                "reason": "no baseline yet: PPL %.4f becomes this model's recorded value" % current["ppl"]}
    base = float(baseline["ppl"])
    rise = 100.0 * (current["ppl"] - base) / base if base > 0 else float("inf")
    where = baseline.get("source") or "the recorded value"
    if rise > float(tolerance_pct):
        return {"status": "regressed", "rise_pct": round(rise, 3),
                "reason": "PPL %.4f is %.2f%% above %.4f (%s), beyond the %s%% tolerance" % (
                    current["ppl"], rise, base, where, tolerance_pct)}
    return {"status": "ok", "rise_pct": round(rise, 3),
            "reason": "PPL %.4f is within %s%% of %.4f (%s; %+.2f%%)" % (
                current["ppl"], tolerance_pct, base, where, rise)}


def _options(argv):
    """[(flag, value or None)] of a llama-server argv (after the binary), in order."""
    out, index, items = [], 0, [str(a) for a in argv]
    while index < len(items):
        item = items[index]
        if item.startswith("-") and not re.match(r"^-\d", item):
            value = None
            if item not in SWITCHES and index + 1 < len(items) and not (
                    items[index + 1].startswith("-") and not re.match(r"^-\d", items[index + 1])):
                value = items[index + 1]
                index += 1
            out.append((item, value))
        else:
            out.append((item, None))
        index += 1
    return out


def command(server_argv, binary, text_path, ctx=256, chunks=8):
    """llama-perplexity's argv for the service's own settings (model, placement, threads, cache types, attention
    flags: what changes the numbers) over text_path at a context of `ctx` tokens, at most `chunks` chunks, batch
    and micro-batch equal to the context (one chunk per batch, well past the 9 tokens where the partial-offload bugs
    start). llama-perplexity parses the same common arguments as llama-server; the server's own are dropped.
    Returns {argv, dropped}."""
    argv = [str(binary)]
    dropped = []
    if not server_argv:
        raise ValueError("the service has no argv")
    for flag, value in _options(list(server_argv)[1:]):
        if flag in DROP_WITH_VALUE or flag in DROP_SWITCHES:
            dropped.append(flag)
            continue
        argv.append(flag)
        if value is not None:
            argv.append(value)
    if "-m" not in argv and "--model" not in argv:
        raise ValueError("the service's arguments have no -m MODEL")
    ctx = int(ctx)
    argv += ["-f", str(text_path), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "--chunks", str(int(chunks))]
    return {"argv": argv, "dropped": sorted(set(dropped))}


def baseline_key(deployment, text_sha256, ctx):
    """What a recorded value is comparable with: the same model file, text and context (the engine build and flags
    may change: that is what the comparison is for)."""
    return "%s|%s|%s" % (deployment.get("model"), str(text_sha256)[:16], int(ctx))


def baseline(record, key, catalog_value=None, text_name="", ctx=0):
    """The value to compare with: the node's recorded one under `key`, else the catalog's when it was measured on
    the same text and context (catalog_value: {ppl, text, ctx, source}), else None."""
    found = (record or {}).get(key)
    if found and found.get("ppl") is not None:
        return dict(found, source=found.get("source") or "recorded on this node %s" % found.get("date", ""))
    if catalog_value and catalog_value.get("text") == text_name and int(catalog_value.get("ctx") or 0) == int(ctx):
        return dict(catalog_value, source="catalog: %s" % catalog_value.get("source", "?"))
    return None
