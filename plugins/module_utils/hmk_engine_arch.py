# -*- coding: utf-8 -*-
"""Which GGUF architectures (general.architecture) each pinned engine build can load.

A llama.cpp-family engine maps general.architecture to its LLM_ARCH enum (src/llama-arch.cpp, LLM_ARCH_NAMES) and
stops a load it does not know with "unknown model architecture: '<name>'" (src/llama.cpp, llm_load_arch). The
kit reads that table at each commit it pins, so model_sync can refuse a model before hundreds of GB move, with
the engine's own words.

Sources:
- ik_llama.cpp 55d3c05bf7b377deaa5dc84d255d9740a345a206 (2026-04-13, the kit's pin until issue 25): src/llama-arch.cpp
  of the PyPI sdist ik-llama-cpp-python 0.1.5, as the fixture repository holds it (branch pin-55d3c05, commit
  7e0c0f7 of ${HMK_CACHE}/fixtures/ik_llama.cpp.git).
- ik_llama.cpp 8337e4cd3861406fc04e0854b1409cd1b027fbc9 (2026-08-15, the kit's pin): src/llama-arch.cpp of
  ../shared/sources/ik_llama.cpp/ik_llama.cpp-8337e4cd-src.tar.gz (the fixture repository's main); it adds the
  names in IK_ARCHS_ADDED_8337E4CD and removes none.
A commit the table does not know is not judged here (its own load says it); add its list when pinning it.

It also holds what the service's flags depend on at a commit: which architectures the engine treats as MLA
(multi-head latent attention: -mla, -amb and the latent KV cache apply to these only), read from the same two
sources (55d3c05: the `is_mla_attn = arch == ... || ...` test in src/llama-model.cpp and src/llama.cpp;
8337e4cd: `llama_model::is_mla_model()` in src/llama-model.h), and which of a llama_build_engine_flags entry's
flags a commit date accepts (flag_set_at), for the build's smoke check and the service alike.
Pure Python: the model_sync, llama_build and inference_service filters and the unit tests import it.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

IK_55D3C05 = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
IK_8337E4CD = "8337e4cd3861406fc04e0854b1409cd1b027fbc9"
# The kit's pin (llama_build_version's default) and the newest commit the kit has read.
IK_PIN = IK_8337E4CD
IK_NEWEST = IK_8337E4CD

IK_ARCHS_55D3C05 = frozenset((
    "arctic", "baichuan", "bailingmoe2", "bert", "bitnet", "bitnet-25", "bitnet-b1.58", "bloom", "chatglm",
    "codeshell", "cohere2", "command-r", "dbrx", "deci", "deepseek2", "dots1", "ernie4_5", "ernie4_5-moe", "falcon",
    "gemma", "gemma2", "gemma3", "gemma4", "glm-dsa", "glm4", "glm4moe", "gpt-oss", "gpt2", "gptj", "gptneox",
    "granite", "granitemoe", "grok", "hunyuan-moe", "internlm2", "jais", "jina-bert-v2", "llama", "llama4", "mamba",
    "mimo2", "minicpm", "minimax-m2", "mistral3", "mistral4", "mpt", "nomic-bert", "olmo", "openelm", "orion",
    "phi2", "phi3", "plamo", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen3vl", "qwen3vlmoe", "refact", "seed_oss", "smollm3", "stablelm", "starcoder", "starcoder2",
    "step35", "t5", "t5encoder", "xverse",
))
IK_ARCHS_ADDED_8337E4CD = frozenset((
    "bailingmoe3", "cohere2_moe", "deepseek4", "dflash", "dflash-draft", "gemma4-assistant", "gemma4_mtp", "laguna",
    "mellum", "minimax-m3", "muse-glimmer", "openpangu",
))

# is_mla_model() (8337e4cd) / is_mla_attn (55d3c05): the architectures whose attention is MLA.
IK_MLA_ARCHS_55D3C05 = frozenset(("deepseek2", "glm-dsa", "mistral4"))
IK_MLA_ARCHS_ADDED_8337E4CD = frozenset(("bailingmoe3",))

# engine -> {full commit: (commit date, architectures that commit loads)}
ENGINE_ARCHS = {
    "ik_llama.cpp": {
        IK_55D3C05: ("2026-04-13", IK_ARCHS_55D3C05),
        IK_8337E4CD: ("2026-08-15", IK_ARCHS_55D3C05 | IK_ARCHS_ADDED_8337E4CD),
    },
}


# engine -> {full commit: (commit date, MLA architectures of that commit)}
ENGINE_MLA_ARCHS = {
    "ik_llama.cpp": {
        IK_55D3C05: ("2026-04-13", IK_MLA_ARCHS_55D3C05),
        IK_8337E4CD: ("2026-08-15", IK_MLA_ARCHS_55D3C05 | IK_MLA_ARCHS_ADDED_8337E4CD),
    },
}


def mla_archs(engine, commit_date):
    """The MLA architectures of `engine` at a commit date: the list of the newest commit read on or before that
    date (the oldest list for an older commit). By date, not SHA: a fixture or mirror repository rewrites the SHA.
    Mainline llama.cpp has no -mla (empty)."""
    table = ENGINE_MLA_ARCHS.get(str(engine or ""))
    if not table:
        return frozenset()
    dated = sorted(table.values(), key=lambda item: item[0])
    date = str(commit_date or "")[:10]
    chosen = dated[0][1]
    for since, names in dated:
        if since <= date:
            chosen = names
    return chosen


def is_mla(engine, commit_date, arch):
    """Whether `engine` at that commit date runs GGUF architecture `arch` with MLA."""
    return str(arch or "") in mla_archs(engine, commit_date)


# --------------------------------------------------------------------- readers of the engine's own sources

def read_arch_names(llama_arch_cpp):
    """{LLM_ARCH_X: 'name'} of src/llama-arch.cpp's LLM_ARCH_NAMES table (without LLM_ARCH_UNKNOWN)."""
    found = re.findall(r'\{\s*(LLM_ARCH_[A-Z0-9_]+)\s*,\s*"([^"]+)"\s*\}', llama_arch_cpp)
    return dict((enum, name) for enum, name in found if enum != "LLM_ARCH_UNKNOWN")


def read_mla_archs(sources, arch_names):
    """The architecture names the engine treats as MLA: every `is_mla_model() { return arch == ... }` body
    (8337e4cd, src/llama-model.h) or `is_mla_attn = [model.]arch == ... || ...` test (55d3c05), in any of the
    given source texts; the enums mapped to names with read_arch_names' table."""
    tests = []
    for text in sources:
        tests += re.findall(r"is_mla_model\(\)\s*const\s*\{\s*return\s+([^;]+);", text)
        tests += re.findall(r"\bis_mla_attn\s*=\s*((?:(?:model\.)?arch\s*==\s*LLM_ARCH_\w+\s*(?:\|\|\s*)?)+)", text)
    enums = set(e for test in tests for e in re.findall(r"LLM_ARCH_\w+", test))
    return frozenset(arch_names[e] for e in enums if e in arch_names)


def flag_set_at(entry, commit_date):
    """A llama_build_engine_flags entry as one commit date sees it: `accepted` keeps the flags whose own `since`
    (inclusive) and `until` (exclusive) dates cover the date; a flag past its `until` joins `rejected` (the smoke
    check proves the binary refuses it). Entries without per-flag dates come back unchanged."""
    date = str(commit_date or "")[:10]
    accepted, rejected = [], list((entry or {}).get("rejected") or [])
    for item in (entry or {}).get("accepted") or []:
        if not isinstance(item, dict):
            accepted.append(item)
            continue
        since, until = str(item.get("since") or ""), str(item.get("until") or "")
        if until and date >= until:
            if str(item["flag"]) not in rejected:
                rejected.append(str(item["flag"]))
            continue
        if since and date < since:
            continue
        accepted.append(item)
    out = dict(entry or {})
    out.update(accepted=accepted, rejected=rejected)
    return out


def known_archs(engine, commit):
    """The architectures `engine` at `commit` loads, or None when the table has no list for that commit."""
    entry = ENGINE_ARCHS.get(str(engine or ""), {}).get(str(commit or "").strip().lower())
    return entry[1] if entry else None


def arch_problem(engine, commit, arch):
    """A sentence when `engine` at `commit` cannot load GGUF architecture `arch`; '' when it can or is not known."""
    archs = known_archs(engine, commit)
    if archs is None or not arch or arch in archs:
        return ""
    commit = str(commit).strip().lower()
    date = ENGINE_ARCHS[engine][commit][0]
    newer = [c[:8] for c, (d, names) in sorted(ENGINE_ARCHS[engine].items(), key=lambda kv: kv[1][0])
             if arch in names and d > date]
    hint = ("; %s knows it from commit %s on: move llama_build_version there first" % (engine, newer[0])
            if newer else "; no commit the kit has read knows it")
    return ("%s at %s (%s) would stop loading it with \"unknown model architecture: '%s'\" (its LLM_ARCH_NAMES has no "
            "%s)%s" % (engine, commit[:7], date, arch, arch, hint))


def catalog_arch_problems(catalog, selected, engine, commit):
    """Sentences for each selected catalog model whose gguf.architecture the pinned engine cannot load."""
    problems = []
    for model in selected or []:
        entry = (catalog or {}).get(model)
        if not isinstance(entry, dict):
            continue
        problem = arch_problem(engine, commit, (entry.get("gguf") or {}).get("architecture"))
        if problem:
            problems.append("model %s: %s" % (model, problem))
    return problems
