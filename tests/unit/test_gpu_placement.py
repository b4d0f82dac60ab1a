"""Multi-GPU expert placement that agrees with the engines' own layer split (issue: the GPU path).

With -ngl 99 the engine gives each GPU one contiguous block of layers (attention, shared experts, KV cache);
a layer whose routed experts are pinned to another GPU would copy its activations between GPUs through the
host on every token (no P2P on GeForce cards). The plan picks each GPU's expert layers from its own block and
renders a -ts that makes the engine's split (mainline's layer-count rule, ik_llama.cpp's byte-size rule since
#1466; both read in their sources, see plugins/filter/inference_service.py) give exactly those blocks.
Models: tests/unit/moe_layouts.py (the published shapes of DeepSeek-R1 and Qwen3-235B-A22B with realistic
quantisation mixes)."""
import importlib.util
from pathlib import Path

import pytest

import moe_layouts

REPO = Path(__file__).resolve().parents[2]
GIB = 1024 ** 3

_spec = importlib.util.spec_from_file_location("inference_service_filters_placement",
                                               REPO / "plugins" / "filter" / "inference_service.py")
svc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(svc)

MODELS = {
    "r1-q4_k_m": moe_layouts.r1("Q4_K_M"),
    "r1-iq4_xs": moe_layouts.r1("IQ4_XS"),
    "qwen3-235b-q4_k_m": moe_layouts.qwen3_235b("Q4_K_M"),
}
GPUS = {"1x24": [24 * GIB], "1x32": [32 * GIB], "4x24": [24 * GIB] * 4}
RESERVE, OVERHEAD = 3 * GIB, GIB


def kv_of(layout, ctx=32768):
    return svc.kv_cache_bytes(layout, ctx, "q8_0", "q8_0", mla=layout["architecture"] == "deepseek2")


def plan_of(model, gpus, split="layers", **kw):
    layout = MODELS[model]
    return svc.placement_plan(layout, GPUS[gpus] if isinstance(gpus, str) else gpus, kv_of(layout), RESERVE, OVERHEAD,
                              model=split, **kw)


def engine_sizes(layout, kv, extra_per_layer=0, kv_scale=1.0):
    """The per-layer sizes ik_llama.cpp logs ("Layer N: weights, kv, ..."), with room to perturb them."""
    n_layer, weights, _experts, kvs, output = svc.layer_table(layout, kv)
    return [w + extra_per_layer + int(k * kv_scale) for w, k in zip(weights, kvs)] + [output]


def held_by(plan):
    """{layer: GPU index} of the blocks the plan wants (the output layer as n_layer)."""
    out = {}
    for index, gpu in enumerate(plan["gpus"]):
        if gpu["block"]:
            for layer in range(gpu["block"][0], gpu["block"][1] + 1):
                out[layer] = index
        if gpu["holds_output"]:
            out[plan["n_layer"]] = index
    return out


@pytest.mark.parametrize("gpus", sorted(GPUS))
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("split", ["layers", "bytes"])
def test_no_layer_is_split_across_two_gpus_and_every_gpu_is_inside_its_budget(model, gpus, split):
    plan = plan_of(model, gpus, split)
    layout = MODELS[model]
    n_layer = plan["n_layer"]
    # blocks: contiguous, disjoint, covering every layer, the output layer on the last GPU
    held = held_by(plan)
    assert sorted(held) == list(range(n_layer + 1))
    assert [held[n] for n in range(n_layer + 1)] == sorted(held[n] for n in range(n_layer + 1))
    for index, gpu in enumerate(plan["gpus"]):
        # every GPU's experts come from layers it holds, whole layers only
        assert all(held[layer] == index for layer in gpu["layers"]), (index, gpu["block"], gpu["layers"])
        assert gpu["expert_bytes"] == sum(int(layout["expert_bytes"][str(n)]) for n in gpu["layers"])
        assert gpu["expected_bytes"] <= gpu["vram_bytes"], gpu
        assert gpu["layers"], "a 24 GiB card has room for at least one MoE layer's experts of these models"
    placed = [n for gpu in plan["gpus"] for n in gpu["layers"]]
    assert len(placed) == len(set(placed))
    assert sorted(placed + plan["cpu_layers"]) == sorted(int(n) for n in layout["expert_bytes"])
    # the engine, given the rendered -ts, gives every layer to the GPU the plan says
    if len(plan["gpus"]) > 1:
        sizes = engine_sizes(layout, kv_of(layout))
        devices = svc.engine_layer_devices(split, plan["tensor_split"], n_layer, 99, sizes, RESERVE)
        assert devices == held
    else:
        assert plan["tensor_split"] == []


def test_the_seed_profiles_land_where_the_brief_expects():
    # one RTX 4090 (24 GiB) holds one R1 MoE layer's experts beside every layer's attention and the MLA cache
    assert [g["layers"] for g in plan_of("r1-iq4_xs", "1x24")["gpus"]] == [[3]]
    # an RTX 5090 (32 GiB) holds more of the smaller Qwen3 layers (1.5 GB each)
    assert len(plan_of("qwen3-235b-q4_k_m", "1x32")["gpus"][0]["layers"]) >= 10
    # four 4090s: each takes the first MoE layers of its own quarter
    plan = plan_of("r1-q4_k_m", "4x24")
    assert [g["block"] for g in plan["gpus"]] == [[0, 14], [15, 29], [30, 45], [46, 60]]
    assert [g["layers"][0] for g in plan["gpus"]] == [3, 15, 30, 46]


@pytest.mark.parametrize("compute_gib", [0, 0.5, 1, 3, 6])
@pytest.mark.parametrize("kv_scale", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_ts_survives_the_engines_own_estimates_of_compute_buffers_and_kv(model, compute_gib, kv_scale):
    """ik sizes layers with its own KV and MLA numbers and one compute buffer per GPU; none of them is known
    exactly before the start, so the -ts border sits a quarter of a layer past each block."""
    plan = plan_of(model, "4x24", "bytes")
    layout = MODELS[model]
    mla_extra = 17 * 10 ** 6 if layout["architecture"] == "deepseek2" else 0  # attn_k_b/v_b rebuilt at q8_0
    sizes = engine_sizes(layout, kv_of(layout), extra_per_layer=mla_extra, kv_scale=kv_scale)
    devices = svc.engine_layer_devices("bytes", plan["tensor_split"], plan["n_layer"], 99, sizes, compute_gib * GIB)
    assert devices == held_by(plan)


def test_without_a_ts_the_engines_own_split_would_part_layers_from_their_experts():
    """Why -ts is rendered: on four equal cards mainline splits 62 layers as 16/15/16/15, so layer 15's experts
    (planned on CUDA1 with its attention) would sit on another GPU than its attention."""
    plan = plan_of("r1-q4_k_m", "4x24", "layers")
    default = svc.engine_layer_devices("layers", [1, 1, 1, 1], plan["n_layer"], 99)
    assert default[15] == 0 and held_by(plan)[15] == 1
    assert 15 in plan["gpus"][1]["layers"]


def test_unequal_cards_get_blocks_in_proportion_to_their_memory():
    plan = plan_of("qwen3-235b-q4_k_m", [24 * GIB, 32 * GIB], "bytes")
    first, second = (g["block"][1] - g["block"][0] + 1 for g in plan["gpus"])
    assert (first, second) == (40, 54)
    assert all(g["expected_bytes"] <= g["vram_bytes"] for g in plan["gpus"])
    devices = svc.engine_layer_devices("bytes", plan["tensor_split"], plan["n_layer"], 99,
                                       engine_sizes(MODELS["qwen3-235b-q4_k_m"], kv_of(MODELS["qwen3-235b-q4_k_m"])),
                                       RESERVE)
    assert devices == held_by(plan)


def test_a_partial_offload_keeps_the_cpu_layers_experts_in_dram():
    """-ngl 40 offloads the last 40 of R1's 61 layers; the output layer stays on the CPU."""
    plan = plan_of("r1-iq4_xs", "4x24", "layers", ngl=40)
    assert plan["offloaded_layers"] == 40
    assert [g["block"] for g in plan["gpus"]] == [[21, 30], [31, 40], [41, 50], [51, 60]]
    assert not any(g["holds_output"] for g in plan["gpus"])
    assert all(n >= 21 for g in plan["gpus"] for n in g["layers"])
    assert set(range(3, 21)) <= set(plan["cpu_layers"])
    devices = svc.engine_layer_devices("layers", plan["tensor_split"], plan["n_layer"], 40)
    assert devices == held_by(plan)


def test_the_split_rule_follows_the_engine_and_its_commit():
    assert svc.split_model("ik_llama.cpp", "2026-04-13") == "bytes"   # 55d3c05, the pin before issue 25
    assert svc.split_model("ik_llama.cpp", "2026-08-15") == "bytes"   # the kit's pin, 8337e4cd
    assert svc.split_model("ik_llama.cpp", "2025-11-20") == "layers"
    assert svc.split_model("llama.cpp", "2026-10-01") == "layers"
    assert svc.split_model("ik_llama.cpp", "") == "layers"


def test_a_ts_in_the_extra_arguments_cannot_fight_the_plans():
    plan = plan_of("r1-q4_k_m", "4x24")
    opts = {"engine": "llama.cpp", "accepted": ["-ngl", "-c", "-ctk", "-ctv", "-t", "--host", "-ot", "--metrics"],
            "model": "/m.gguf", "threads": 8, "ot": plan["rules"], "ts": plan["tensor_split"], "extra": ["-ts", "1,1,1,1"]}
    with pytest.raises(svc.AnsibleFilterError, match="-ts"):
        svc.llama_argv(opts)
