# -*- coding: utf-8 -*-
"""The answer probe: the greedy request a probe sends, and the judge of what came back.

A node can load a model, serve at full speed and still answer with garbage: an engine bug under partial offload,
a cache type the model does not support, a wrong chat template, a damaged quant. This judge says whether an answer
is the expected one (a substring, an exact word or a number, compared after normalising case, whitespace, thousands
separators and a trailing period) and whether it has degenerated (empty, repeated tokens or n-grams, replacement
characters, runs of one character, only punctuation, leaked control or chat-template tokens, the prompt echoed).

Thinking models (DeepSeek-R1, Qwen3) put their reasoning in `<think>...</think>` before the answer, or in the
response's `reasoning_content` field (llama-server with --reasoning-format): the expectation is judged on the final
answer only, and the reasoning only on the checks that mean garbage whatever the length (loops, U+FFFD, control
tokens), so a long, sound think block passes.

Pure Python, no Ansible import: the module plugins/modules/hmk_answer_probe.py and the unit tests import it."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import unicodedata

# One fixed seed: with temperature 0 the engine samples greedily and the seed only matters to engines that still
# draw; the same probe then gets the same answer on every run, so a changed answer means a changed node.
DEFAULT_SEED = 1234
DEFAULT_MAX_TOKENS = 256

# Tokens a working engine never prints as text. <unk>/<pad> come out when the logits are garbage; DeepSeek's
# full-width-bar tokens and ChatML tokens in the text mean a template or tokenizer mismatch.
CONTROL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>", "[UNK]", "[PAD]", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                  "<\uff5c\u2581pad\u2581\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
                  "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

WORD_RUN = 3          # the same word (letters, 2+ characters) this many times in a row: an answer in a loop
TOKEN_RUN = 6         # any whitespace-separated token this many times in a row (the think block's limit too)
LETTER_RUN = 5        # one letter repeated: GGGGG, DDDDD
SYMBOL_RUN = 10       # one punctuation or symbol character repeated: //////////
NGRAM = 4             # word n-grams of this length ...
NGRAM_MIN_WORDS = 24  # ... over at least this many words ...
NGRAM_DISTINCT = 0.5  # ... less than this share distinct: the text repeats itself
CHARGRAM = 6          # character n-grams, for text without spaces (CJK loops, GGGG without spaces)
CHARGRAM_MIN = 60
CHARGRAM_DISTINCT = 0.3


def request_body(probe, model, seed=DEFAULT_SEED, extra=None):
    """The OpenAI-compatible body of one probe: greedy (temperature 0, top_k 1), a fixed seed, the probe's
    max_tokens, and `extra` (engine-specific keys such as llama-server's cache_prompt: false, so a re-run processes
    the prompt again).

    A chat probe (the default) goes to /v1/chat/completions with its system message and chat template arguments
    when it has them (Qwen3's enable_thinking: llama-server honours chat_template_kwargs with --jinja). A probe with
    `endpoint: completions` goes to /v1/completions as raw text with its `stop` strings: a pretrained base model
    (the bed's Gemma 3 270M) continues text, it was never taught to answer a chat turn."""
    body = {"model": model, "temperature": 0, "top_k": 1, "seed": int(seed),
            "max_tokens": int(probe.get("max_tokens") or DEFAULT_MAX_TOKENS), "stream": False}
    if endpoint(probe) == "completions":
        body["prompt"] = probe["prompt"]
        if probe.get("stop"):
            body["stop"] = list(probe["stop"])
    else:
        messages = []
        if probe.get("system"):
            messages.append({"role": "system", "content": probe["system"]})
        messages.append({"role": "user", "content": probe["prompt"]})
        body["messages"] = messages
        if probe.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = dict(probe["chat_template_kwargs"])
    body.update(extra or {})
    return body


ENDPOINTS = ("chat", "completions")


def endpoint(probe):
    """chat or completions: the API a probe is sent to."""
    return probe.get("endpoint") or "chat"


def probe_url(chat_url, probe):
    """The URL of one probe, from the service's chat completions URL: a completions probe goes to the same server's
    /v1/completions."""
    if endpoint(probe) == "completions" and chat_url.endswith("/chat/completions"):
        return chat_url[:-len("/chat/completions")] + "/completions"
    return chat_url


def split_reply(message):
    """(reasoning, answer, closed) from a chat completion's message: the `reasoning_content` field when the
    server split it off, else a <think> block at the start of `content`. DeepSeek-R1's template opens <think> in
    the prompt, so content may hold the reasoning and a lone </think> (closed True). `closed` is False when a
    think block was opened and never closed: max_tokens ran out while the model was still thinking."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or ""
    if not isinstance(content, str):
        content = str(content)
    stripped = content.lstrip()
    if stripped.startswith(THINK_OPEN):
        inner = stripped[len(THINK_OPEN):]
        if THINK_CLOSE not in inner:
            return (reasoning + inner), "", False
        think, answer = inner.split(THINK_CLOSE, 1)
        return (reasoning + think), answer.strip(), True
    if THINK_CLOSE in content and THINK_OPEN not in content:
        think, answer = content.split(THINK_CLOSE, 1)
        return (reasoning + think), answer.strip(), True
    return reasoning, content.strip(), True


def normalise(text):
    """Lower case, NFKC, one space for any whitespace, no thousands separators inside numbers (1,234 / 1 234 /
    1'234 -> 1234), no markdown emphasis, no trailing period or surrounding quotes."""
    text = unicodedata.normalize("NFKC", text or "").casefold()
    text = re.sub(r"(?<=\d)[,'\u2009\u202f ](?=\d{3}(?!\d))", "", text)
    text = re.sub(r"[*_`]+", "", text)
    text = " ".join(text.split())
    return text.strip().strip("\"'\u201c\u201d\u2018\u2019").rstrip(".!").strip()


def numbers(text):
    """The numbers in normalised text, as floats (-3, 391, 2.5)."""
    return [float(n) for n in re.findall(r"(?<![\d.])-?\d+(?:\.\d+)?", normalise(text))]


def expected_text(expect):
    parts = []
    if "exact" in expect:
        parts.append("exactly %r" % expect["exact"])
    if "number" in expect:
        parts.append("the number %s" % expect["number"])
    if expect.get("contains"):
        parts.append("all of %s" % ", ".join(repr(s) for s in expect["contains"]))
    if expect.get("any_of"):
        parts.append("one of %s" % ", ".join(repr(s) for s in expect["any_of"]))
    return " and ".join(parts) or "a sound answer"


def expectation(answer, expect):
    """None when the answer is what the probe expects, else what is missing."""
    norm = normalise(answer)
    if "exact" in expect and norm != normalise(str(expect["exact"])):
        return "the answer is not exactly %r" % expect["exact"]
    if "number" in expect:
        want = float(expect["number"])
        if not any(abs(n - want) < 1e-9 for n in numbers(answer)):
            return "the number %s is not in the answer" % expect["number"]
    missing = [s for s in expect.get("contains") or [] if normalise(s) not in norm]
    if missing:
        return "the answer lacks %s" % ", ".join(repr(s) for s in missing)
    if expect.get("any_of") and not any(normalise(s) in norm for s in expect["any_of"]):
        return "the answer has none of %s" % ", ".join(repr(s) for s in expect["any_of"])
    return None


def _run(items, limit):
    """The longest run of one item, and the item, when it reaches `limit`."""
    best, count, prev = None, 0, object()
    for item in items:
        count = count + 1 if item == prev else 1
        prev = item
        if count >= limit:
            best = (item, count) if best is None or count > best[1] else best
    return best


def _char_runs(text):
    """(character, length) of each run of one character."""
    return [(m.group(0)[0], len(m.group(0))) for m in re.finditer(r"(.)\1*", text, re.S)]


def _distinct_share(items, n):
    grams = [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]
    return len(set(grams)) / float(len(grams)) if grams else 1.0


def _is_cjk(ch):
    return "CJK" in unicodedata.name(ch, "") or "HIRAGANA" in unicodedata.name(ch, "") or \
        "KATAKANA" in unicodedata.name(ch, "") or "HANGUL" in unicodedata.name(ch, "")


def loops(text, word_run=TOKEN_RUN):
    """Why `text` is garbage whatever its length (a loop, broken bytes, control tokens), or None. Used on the
    final answer and on the think block."""
    if "\ufffd" in text:
        return "it has %d U+FFFD replacement characters (broken UTF-8 from the engine)" % text.count("\ufffd")
    leaked = [t for t in CONTROL_TOKENS if t in text]
    if leaked:
        return "it prints control tokens as text (%s)" % ", ".join(leaked)
    for ch, count in _char_runs(text):
        if ch.isalpha() and count >= LETTER_RUN:
            return "one letter repeated %d times in a row (%r)" % (count, ch * min(count, 12))
        if not ch.isalnum() and not ch.isspace() and count >= SYMBOL_RUN:
            return "one character repeated %d times in a row (%r)" % (count, ch * min(count, 12))
    tokens = text.split()
    run = _run(tokens, TOKEN_RUN)
    if run:
        return "the token %r repeated %d times in a row" % (run[0][:40], run[1])
    words = [w.casefold() for w in re.findall(r"[^\W\d_]{2,}", text)]
    run = _run(words, word_run)
    if run:
        return "the word %r repeated %d times in a row" % (run[0], run[1])
    if len(words) >= NGRAM_MIN_WORDS and _distinct_share(words, NGRAM) < NGRAM_DISTINCT:
        return "it repeats itself (%d%% of its %d-word sequences are repeats)" % (
            round(100 * (1 - _distinct_share(words, NGRAM))), NGRAM)
    chars = [c for c in text if not c.isspace()]
    if len(chars) >= CHARGRAM_MIN and _distinct_share(chars, CHARGRAM) < CHARGRAM_DISTINCT:
        return "it repeats itself (%d%% of its %d-character sequences are repeats)" % (
            round(100 * (1 - _distinct_share(chars, CHARGRAM))), CHARGRAM)
    return None


def degeneration(answer, prompt, markers=(), min_words=1):
    """Why the final answer is degenerate, or None."""
    if not answer.strip():
        return "the answer is empty"
    found = [m for m in markers if m in answer]
    if found:
        return ("the answer holds chat template markers (%s): the chat template does not match the model, or the "
                "engine runs without its template (--jinja)" % ", ".join(found))
    why = loops(answer, word_run=WORD_RUN)
    if why:
        return "the answer is degenerate: " + why
    if not any(unicodedata.category(c)[0] in "LN" for c in answer):
        return "the answer has no letter or digit, only punctuation or symbols (%r)" % answer[:40]
    if len(re.findall(r"\w+", answer)) < min_words:
        return "the answer has fewer than %d words" % min_words
    if normalise(prompt) and normalise(answer).startswith(normalise(prompt)):
        return "the answer echoes the prompt"
    if not any(_is_cjk(c) for c in prompt):
        cjk = [c for c in answer if _is_cjk(c)]
        if cjk:
            return "the answer mixes in CJK characters the prompt does not use (%s)" % "".join(cjk[:8])
    return None


def judge(probe, message, markers=()):
    """The verdict on one probe's reply: {name, passed, reason, prompt, answer, expected, reasoning_chars}.
    `message` is choices[0].message of the chat completion; `markers` the family's chat template tokens that must
    not appear in an answer."""
    expect = probe.get("expect") or {}
    reasoning, answer, closed = split_reply(message or {})
    verdict = {"name": probe.get("name", ""), "prompt": probe["prompt"], "answer": answer,
               "expected": expected_text(expect), "reasoning_chars": len(reasoning), "passed": False}
    why = loops(reasoning) if reasoning.strip() else None
    if why:
        verdict["reason"] = "the think block is degenerate: " + why
        return verdict
    if not closed:
        verdict["reason"] = ("no final answer: the think block did not close within max_tokens %s (raise the "
                             "probe's max_tokens, or turn thinking off for the probe)"
                             % probe.get("max_tokens", DEFAULT_MAX_TOKENS))
        return verdict
    why = degeneration(answer, probe["prompt"], markers, int(probe.get("min_words") or 1))
    if why is None and expect:
        why = expectation(answer, expect)
    verdict["passed"] = why is None
    verdict["reason"] = why or ("the answer is right" if expect else "the answer is sound (no expectation to check)")
    return verdict


def reply_message(status, body):
    """choices[0].message of a chat completion's JSON (a text completion's choices[0].text as {"content": text}),
    or (None, why) when the reply is not one."""
    if status == 0:
        return None, "no HTTP answer (%s)" % (body.get("error") if isinstance(body, dict) else body)
    if status in (401, 403):
        return None, "the API key was refused (HTTP %d)" % status
    if status != 200:
        return None, "HTTP %d: %s" % (status, str(body)[:300])
    try:
        choice = body["choices"][0]
        message = choice["message"] if "message" in choice or "text" not in choice else {"content": choice["text"]}
    except (KeyError, IndexError, TypeError):
        return None, ("the reply is not a completion (no choices[0].message, no choices[0].text): %s"
                      % str(body)[:300])
    if not isinstance(message, dict):
        return None, "choices[0].message is not an object"
    return message, None


def probe_set(data, entry, extra=()):
    """The probes to run for a catalog entry: [] for the kit's generated test models (an entry with a
    `generator` key) and for families marked `none`; else the family's probes (the entry's `answer_probes` key
    names the family, or its gguf.architecture does through data['family_by_architecture']), with `extra`
    (the inventory's inference_service_answer_probes) merged in: a probe whose name is already in the set replaces
    it, one with `families` set applies only to those families, the rest are added. Returns (family, probes)."""
    family = entry.get("answer_probes")
    if not family:
        if entry.get("generator"):
            family = "none"
        else:
            arch = ((entry.get("gguf") or {}).get("architecture") or "")
            family = (data.get("family_by_architecture") or {}).get(arch, "none")
    fam = (data.get("families") or {}).get(family) or {}
    if family == "none" or not fam.get("meaningful", True):
        return family, []
    probes = [dict(p) for p in fam.get("probes") or []]
    for probe in extra or ():
        if probe.get("families") and family not in probe["families"]:
            continue
        names = [p.get("name") for p in probes]
        if probe.get("name") in names:
            probes[names.index(probe["name"])] = dict(probe)
        else:
            probes.append(dict(probe))
    # A family whose models answer only raw text (a base model) sends every probe, the user's too, that way.
    for probe in probes:
        probe.setdefault("endpoint", fam.get("endpoint") or "chat")
    return family, probes


PROBE_KEYS = ("name", "prompt", "system", "endpoint", "stop", "max_tokens", "min_words", "chat_template_kwargs",
              "expect", "families")
EXPECT_KEYS = ("exact", "number", "contains", "any_of")


def _strings(value):
    return isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)


def probe_problem(probe):
    """What is wrong with one probe of the user's (inference_service_answer_probes), as the words after
    "refused:", or None."""
    if not isinstance(probe, dict):
        return "a probe is a mapping with name, prompt and expect"
    unknown = sorted(set(probe) - set(PROBE_KEYS))
    if unknown:
        return "unknown key(s) %s; a probe takes %s" % (", ".join(unknown), ", ".join(PROBE_KEYS))
    if not isinstance(probe.get("name"), str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", probe["name"]):
        return "name is 1 to 64 letters, digits, '.', '_' or '-'"
    if not isinstance(probe.get("prompt"), str) or not probe["prompt"].strip():
        return "prompt is a non-empty string"
    if endpoint(probe) not in ENDPOINTS:
        return "endpoint is chat or completions"
    for key, low in (("max_tokens", 1), ("min_words", 1)):
        value = probe.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 32768):
            return "%s is an integer from %d to 32768" % (key, low)
    for key in ("stop", "families"):
        if key in probe and not _strings(probe[key]):
            return "%s is a list of non-empty strings" % key
    if "chat_template_kwargs" in probe and not isinstance(probe["chat_template_kwargs"], dict):
        return "chat_template_kwargs is a mapping"
    expect = probe.get("expect")
    if not isinstance(expect, dict) or not expect:
        return "expect is a mapping with one or more of %s (a probe without one judges nothing)" % ", ".join(
            EXPECT_KEYS)
    if set(expect) - set(EXPECT_KEYS):
        return "expect takes %s, not %s" % (", ".join(EXPECT_KEYS), ", ".join(sorted(set(expect) - set(EXPECT_KEYS))))
    if "number" in expect and (isinstance(expect["number"], bool) or not isinstance(expect["number"], (int, float))
                               or expect["number"] != expect["number"]):
        return "expect.number is a finite number"
    if "exact" in expect and not (isinstance(expect["exact"], (str, int)) and str(expect["exact"]).strip()):
        return "expect.exact is a non-empty string"
    for key in ("contains", "any_of"):
        if key in expect and not _strings(expect[key]):
            return "expect.%s is a list of non-empty strings" % key
    return None


def catalog_entry(catalog, model_path):
    """(id, entry) of the catalog entry that lists the served file (the basename of the service's -m path; for a
    split model, its first part), or (None, None)."""
    name = str(model_path or "").rstrip("/").rsplit("/", 1)[-1]
    for model_id in sorted(catalog or {}):
        entry = catalog[model_id] or {}
        if name and name in [f.get("name") for f in entry.get("files") or [] if isinstance(f, dict)]:
            return model_id, entry
    return None, None


def plan(data, catalog, model_path, family="auto", extra=()):
    """What the gate, validate and tune probe for the served model: {family, model_id, probes, markers, reason}.

    family auto: the catalog entry listing the served file decides (probe_set); a file no entry lists runs no probe,
    since its family would be a guess and a wrong set fails a working node (name one with `family`). Any other
    `family` names the set outright. An empty `probes` means no probe runs, and `reason` says why in words the gate
    prints."""
    model_id, entry = catalog_entry(catalog, model_path)
    if family and family != "auto":
        if family not in (data.get("families") or {}):
            raise ValueError("answer probe family %r is not one of %s" % (
                family, ", ".join(sorted(data.get("families") or {}))))
        fam, probes = probe_set(data, {"answer_probes": family}, extra)
        origin = "set by inference_service_answer_probe_family"
    elif entry is None:
        return {"family": "none", "model_id": None, "probes": [], "markers": [],
                "reason": "no catalog entry lists %s, so its answer probe family is unknown: no answer probe runs "
                          "(set inference_service_answer_probe_family to probe it)"
                          % str(model_path).rsplit("/", 1)[-1]}
    else:
        fam, probes = probe_set(data, entry, extra)
        origin = "catalog entry %s" % model_id
    markers = list(((data.get("families") or {}).get(fam) or {}).get("markers") or [])
    if not probes:
        why = ("its weights are random (a generated test model)" if (entry or {}).get("generator")
               else "the family has no meaningful answers")
        return {"family": fam, "model_id": model_id, "probes": [], "markers": markers,
                "reason": "answer probe family %s (%s): %s, so no answer probe runs" % (fam, origin, why)}
    out = {"family": fam, "model_id": model_id, "probes": probes, "markers": markers,
           "reason": "answer probe family %s (%s): %d probes" % (fam, origin, len(probes))}
    if (entry or {}).get("perplexity"):
        # A published perplexity of this model over the kit's text (validate compares with it until it records one).
        out["perplexity"] = dict(entry["perplexity"])
    return out
