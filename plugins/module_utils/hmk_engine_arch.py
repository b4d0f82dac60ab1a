# -*- coding: utf-8 -*-
"""Which GGUF architectures (general.architecture) each pinned engine build can load.

A llama.cpp-family engine maps general.architecture to its LLM_ARCH enum (src/llama-arch.cpp, LLM_ARCH_NAMES) and
stops a load it does not know with "unknown model architecture: '<name>'" (src/llama.cpp, llm_load_arch). The
kit reads that table at each commit it pins, so model_sync can refuse a model before hundreds of GB move, with
the engine's own words.

Sources:
- ik_llama.cpp 55d3c05bf7b377deaa5dc84d255d9740a345a206 (2026-04-13): src/llama-arch.cpp of the PyPI sdist
  ik-llama-cpp-python 0.1.5, as the fixture repository holds it (commit 7e0c0f7 of
  ${HMK_CACHE}/fixtures/ik_llama.cpp.git).
- ik_llama.cpp 8337e4cd3861406fc04e0854b1409cd1b027fbc9 (2026-08-15): src/llama-arch.cpp of
  ../shared/sources/ik_llama.cpp/ik_llama.cpp-8337e4cd-src.tar.gz; it adds the names in IK_ARCHS_ADDED_8337E4CD
  and removes none.
A commit the table does not know is not judged here (its own load says it); add its list when pinning it.
Pure Python: the model_sync filters and the unit tests import it.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

IK_PIN = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
IK_NEWEST = "8337e4cd3861406fc04e0854b1409cd1b027fbc9"

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

# engine -> {full commit: (commit date, architectures that commit loads)}
ENGINE_ARCHS = {
    "ik_llama.cpp": {
        IK_PIN: ("2026-04-13", IK_ARCHS_55D3C05),
        IK_NEWEST: ("2026-08-15", IK_ARCHS_55D3C05 | IK_ARCHS_ADDED_8337E4CD),
    },
}


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
