"""The catalog of models users run: each new entry's shapes agree with its GGUF header block, its size with what its
publisher shows, its VRAM/RAM plan on each seed machine (the kit's own planner, inference_service's placement_plan +
memory_plan, at 32k context with a q8_0 KV cache), and a model whose architecture the pinned engine commit does not
know is refused before the download with the engine's own words."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import moe_layouts
from ansible_collections.hmk.moe_kit.plugins.filter import hmk_validate as validate_filters
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_arch, hmk_model_sync
import unit_support

REPO = Path(__file__).resolve().parents[2]
GIB = 1024 ** 3
GB = 1000 ** 3


_load = unit_support.load_script


table = _load("gen_catalog_table", REPO / "scripts" / "gen-catalog-table")
svc, _layouts = table.modules()
CATALOG = table.catalog()
NEW = ("kimi-k2-thinking-q4_x", "glm-4.6-ud-q3_k_xl", "qwen3-coder-480b-a35b-ud-q4_k_xl", "deepseek-v3.1-ud-q2_k_xl",
       "gpt-oss-120b-mxfp4", "minimax-m2-ud-q4_k_xl")
MACHINES = dict((m[0], m) for m in table.MACHINES)

# The plan per model and seed machine: fits?, MoE layers whose experts go to GPUs, GiB each GPU is expected to hold,
# GiB of RAM needed (CPU-side weights + 8 GiB -cram prompt cache + 8 GiB host reserve). Genoa has 384 GB (357.6 GiB), Milan 512 GB (476.8 GiB).
PLANS = {
    ("kimi-k2-thinking-q4_x", "genoa-1x4090"): (False, 0, [16.03], 548.7),
    ("kimi-k2-thinking-q4_x", "genoa-1x5090"): (False, 1, [24.89], 539.9),
    ("kimi-k2-thinking-q4_x", "milan-4x4090"): (False, 4, [15.79, 15.45, 15.62, 16.61], 513.3),
    ("glm-4.6-ud-q3_k_xl", "genoa-1x4090"): (True, 2, [23.82], 149.9),
    ("glm-4.6-ud-q3_k_xl", "genoa-1x5090"): (True, 7, [31.40], 142.3),
    ("glm-4.6-ud-q3_k_xl", "milan-4x4090"): (True, 40, [23.42, 23.11, 23.29, 23.61], 92.3),
    ("qwen3-coder-480b-a35b-ud-q4_k_xl", "genoa-1x4090"): (True, 2, [23.95], 272.0),
    ("qwen3-coder-480b-a35b-ud-q4_k_xl", "genoa-1x5090"): (True, 3, [28.21], 267.8),
    ("qwen3-coder-480b-a35b-ud-q4_k_xl", "milan-4x4090"): (True, 15, [23.83, 23.65, 23.65, 20.17], 216.7),
    ("deepseek-v3.1-ud-q2_k_xl", "genoa-1x4090"): (True, 1, [21.58], 237.4),
    ("deepseek-v3.1-ud-q2_k_xl", "genoa-1x5090"): (True, 3, [29.33], 229.7),
    ("deepseek-v3.1-ud-q2_k_xl", "milan-4x4090"): (True, 16, [23.27, 22.49, 22.70, 23.20], 179.3),
    ("gpt-oss-120b-mxfp4", "genoa-1x4090"): (True, 10, [23.86], 58.1),
    ("gpt-oss-120b-mxfp4", "genoa-1x5090"): (True, 15, [31.74], 50.2),
    ("gpt-oss-120b-mxfp4", "milan-4x4090"): (True, 36, [18.94, 18.94, 18.94, 20.02], 17.1),
    ("minimax-m2-ud-q4_k_xl", "genoa-1x4090"): (True, 6, [22.70], 130.8),
    ("minimax-m2-ud-q4_k_xl", "genoa-1x5090"): (True, 10, [30.88], 122.7),
    ("minimax-m2-ud-q4_k_xl", "milan-4x4090"): (True, 35, [23.95, 23.85, 23.85, 22.30], 71.6),
}


def test_every_new_model_has_a_plan_on_every_seed_machine():
    assert set(PLANS) == set((model, machine) for model in NEW for machine in MACHINES)
    assert set(NEW) <= set(table.LAYOUTS)


@pytest.mark.parametrize("model", NEW)
def test_the_tensor_table_agrees_with_the_catalogs_header_block(model):
    layout = table.layout_of(_layouts, model)
    gguf = CATALOG[model]["gguf"]
    meta = layout["metadata"]
    assert layout["architecture"] == gguf["architecture"]
    assert meta["block_count"] == gguf["block_count"]
    assert meta["expert_count"] == gguf["expert_count"]
    assert meta["expert_used_count"] == gguf["expert_used_count"]
    dense = gguf.get("leading_dense_block_count", 0)
    assert len(layout["expert_bytes"]) == gguf["block_count"] - dense
    assert min(int(n) for n in layout["expert_bytes"]) == dense
    if "kv_lora_rank" in gguf:
        assert meta["kv_lora_rank"] == gguf["kv_lora_rank"]


@pytest.mark.parametrize("model, published", [
    ("kimi-k2-thinking-q4_x", 543.617 * GIB),   # ubergarm's card
    ("glm-4.6-ud-q3_k_xl", 158 * GB),            # the Hub's folder listing
    ("deepseek-v3.1-ud-q2_k_xl", 256 * GB),      # the Hub's folder listing
    ("gpt-oss-120b-mxfp4", 63 * GB),             # three shards, "~60 GB"
])
def test_the_tensor_table_weighs_what_the_publisher_shows(model, published):
    total = table.layout_of(_layouts, model)["total_bytes"]
    assert abs(total - published) / published < 0.04, (model, total / GB)


def test_minimax_first_split_is_pinned_with_its_commit_and_lfs_hash():
    entry = CATALOG["minimax-m2-ud-q4_k_xl"]
    assert entry["huggingface"]["revision"] == "9f34ba3fbaad9746266d863dd01f9c222523b8d0"
    first = entry["files"][0]
    assert (first["size"], first["sha256"][:8]) == (49350927136, "0e2c6e01")
    assert [f["size"] for f in entry["files"][1:]] == [None, None]


@pytest.mark.parametrize("model, machine", sorted(PLANS))
def test_the_plan_on_each_seed_machine(model, machine):
    fits, gpu_layers, vram_gib, ram_gib = PLANS[(model, machine)]
    layout = table.layout_of(_layouts, model)
    result = table.plan_on(svc, layout, MACHINES[machine])
    plan, mem = result["plan"], result["memory"]
    assert plan["gpu_layer_count"] == gpu_layers
    assert [round(v / GIB, 2) for v in mem["vram_needed_bytes"]] == pytest.approx(vram_gib, abs=0.01)
    assert mem["ram_needed_bytes"] / GIB == pytest.approx(ram_gib, abs=0.05)
    assert mem["fits"] is fits
    # the plan never overfills a GPU: a model that does not fit misses on RAM
    assert mem["fits_vram"] and all(g["expected_bytes"] <= g["vram_bytes"] for g in plan["gpus"])
    assert mem["fits_ram"] is fits
    # what the GPUs do not hold stays on the CPU side
    on_gpu = sum(g["weights_bytes"] for g in plan["gpus"])
    assert mem["ram_needed_bytes"] == layout["total_bytes"] - on_gpu + mem["prompt_cache_bytes"] + svc.HOST_RESERVE
    assert mem["prompt_cache_bytes"] == 8192 * 1024 * 1024  # -cram at the engine's default, rendered explicitly


def test_kimi_k2_thinking_misses_even_the_largest_genoa():
    layout = table.layout_of(_layouts, "kimi-k2-thinking-q4_x")
    name, path, _ram = MACHINES["genoa-1x5090"]
    mem = table.plan_on(svc, layout, (name, path, 576 * GB))["memory"]
    assert not mem["fits_ram"] and mem["ram_needed_bytes"] > 576 * GB


def test_memory_plan_reports_an_overfull_gpu():
    layout = moe_layouts.gpt_oss_120b()
    plan = svc.placement_plan(layout, [24 * GIB], svc.kv_cache_bytes(layout, 32768), 3 * GIB, GIB)
    plan["gpus"][0]["expected_bytes"] = 25 * GIB
    mem = svc.memory_plan(layout, plan, 512 * GB)
    assert mem["fits_ram"] and not mem["fits_vram"] and not mem["fits"]


# ----------------------------------------------------------------------------- architectures the engine can load

def test_every_catalog_model_loads_in_ik_at_the_pin():
    problems = hmk_engine_arch.catalog_arch_problems(CATALOG, sorted(CATALOG), "ik_llama.cpp", hmk_engine_arch.IK_PIN)
    assert problems == []
    for arch in ("deepseek2", "glm4moe", "qwen3moe", "gpt-oss", "minimax-m2"):
        assert arch in hmk_engine_arch.known_archs("ik_llama.cpp", hmk_engine_arch.IK_PIN)


def _with(model, arch):
    entry = dict(CATALOG["deepseek-v3.1-ud-q2_k_xl"], gguf=dict(CATALOG["deepseek-v3.1-ud-q2_k_xl"]["gguf"], architecture=arch))
    return dict(CATALOG, **{model: entry})


def test_an_architecture_an_older_pin_lacks_is_refused_in_the_engines_words():
    catalog = _with("deepseek-v4-flash", "deepseek4")
    problems = validate_filters.hmk_engine_arch_problems(catalog, ["deepseek-v4-flash"], "ik_llama.cpp",
                                                         hmk_engine_arch.IK_55D3C05)
    assert len(problems) == 1
    assert "unknown model architecture: 'deepseek4'" in problems[0]
    assert "ik_llama.cpp at 55d3c05 (2026-04-13)" in problems[0]
    assert "from commit 8337e4cd on" in problems[0]
    # the newer commit the kit has read knows it; an arch no commit knows gets no false hint
    assert validate_filters.hmk_engine_arch_problems(catalog, ["deepseek-v4-flash"], "ik_llama.cpp",
                                                     hmk_engine_arch.IK_NEWEST) == []
    never = hmk_engine_arch.arch_problem("ik_llama.cpp", hmk_engine_arch.IK_55D3C05, "kimi-k3")
    at_pin = hmk_engine_arch.arch_problem("ik_llama.cpp", hmk_engine_arch.IK_PIN, "kimi-k3")
    assert "no commit the kit has read knows it" in at_pin
    assert "no commit the kit has read knows it" in never


def test_a_commit_the_kit_has_not_read_is_not_judged():
    catalog = _with("deepseek-v4-flash", "deepseek4")
    assert hmk_engine_arch.catalog_arch_problems(catalog, ["deepseek-v4-flash"], "ik_llama.cpp", "0" * 40) == []
    assert hmk_engine_arch.catalog_arch_problems(catalog, ["deepseek-v4-flash"], "llama.cpp", "0" * 40) == []


def _fixture_arch_names(upstream, rev=None):
    """LLM_ARCH_NAMES of src/llama-arch.cpp at the fixture repository's commit of `upstream` (its subject names it)."""
    fixture = Path(os.environ.get("HMK_CACHE", "/var/cache/hybrid-moe-kit")) / "fixtures" / "ik_llama.cpp.git"
    assert fixture.is_dir(), "no ik_llama.cpp fixture repository at %s: run scripts/lab-fixtures (make unit does)" % fixture
    commits = subprocess.run(["git", "-C", str(fixture), "log", "--format=%H %s", rev or "--all"], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    commit = next((c.split()[0] for c in commits if upstream in c), None)
    assert commit, "no commit of %s in %s%s" % (upstream, fixture, " on " + rev if rev else "")
    source = subprocess.run(["git", "-C", str(fixture), "show", commit + ":src/llama-arch.cpp"], capture_output=True,
                            text=True, check=True).stdout
    return set(hmk_engine_arch.read_arch_names(source).values())


def test_the_arch_list_at_the_old_pin_is_the_engines_own():
    """The list in hmk_engine_arch is llama-arch.cpp's LLM_ARCH_NAMES at 55d3c05 (fixture branch pin-55d3c05)."""
    assert _fixture_arch_names(hmk_engine_arch.IK_55D3C05, "refs/heads/pin-55d3c05") == \
        set(hmk_engine_arch.IK_ARCHS_55D3C05)


def test_the_arch_list_at_the_pin_is_the_engines_own():
    """The pin (8337e4cd) is the fixture repository's main, and the kit's list is its LLM_ARCH_NAMES."""
    assert hmk_engine_arch.IK_PIN == yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml")
                                                    .read_text())["llama_build_version"]
    assert _fixture_arch_names(hmk_engine_arch.IK_PIN, "refs/heads/main") == \
        set(hmk_engine_arch.known_archs("ik_llama.cpp", hmk_engine_arch.IK_PIN))


def test_model_sync_checks_the_architecture_before_it_syncs():
    tasks = yaml.safe_load((REPO / "roles" / "model_sync" / "tasks" / "validate.yml").read_text())
    check = next(t for t in tasks if "architecture" in t["name"])
    assert "hmk_engine_arch_problems" in check["vars"]["__model_sync_arch_problems"]
    main = (REPO / "roles" / "model_sync" / "tasks" / "main.yml").read_text()
    assert main.index("validate.yml") < main.index("sync.yml")


def test_an_include_only_hub_entry_is_a_complete_catalog_entry():
    assert hmk_model_sync.validate_catalog(CATALOG, ["kimi-k2-thinking-q4_x", "qwen3-coder-480b-a35b-ud-q4_k_xl"],
                                           require_hashes=False) == []
    bare = {"m": {"gguf": {"architecture": "qwen3moe"}, "huggingface": {"repo": "a/b", "revision": "main"}}}
    assert hmk_model_sync.validate_catalog(bare, ["m"], require_hashes=False) == ["model 'm' lists no files"]


def test_ktransformers_serves_the_catalog_models_that_say_so_and_refuses_the_others():
    kt = _load("ktransformers_build_filters", REPO / "plugins" / "filter" / "ktransformers_build.py")
    # config.json model_type of each base model, as KTransformers' guardrail reads it
    model_types = {"kimi-k2-thinking-q4_x": "kimi_k2", "qwen3-coder-480b-a35b-ud-q4_k_xl": "qwen3_moe",
                   "deepseek-v3.1-ud-q2_k_xl": "deepseek_v3", "glm-4.6-ud-q3_k_xl": "glm4_moe",
                   "gpt-oss-120b-mxfp4": "gpt_oss", "minimax-m2-ud-q4_k_xl": "minimax_m2"}
    for model, model_type in model_types.items():
        served = CATALOG[model]["engines"]["ktransformers"]
        family = kt.arch_family(model_type)
        assert bool(family) == (served == "LLAMAFILE"), model
        if family:
            assert kt.arch_family(CATALOG[model]["gguf"]["architecture"]) == family


def test_readme_catalog_table_matches_the_plans():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-catalog-table"), "--check"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
