"""inference_service: launch flags per seed profile and engine version, the expert placement plan on realistic
tensor sizes, the GGUF tensor-table reader on real (tiny) GGUFs, and the arguments file + wrapper that carry the
-ot regex to the engine without systemd's quoting touching it."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_service"
GIB = 1024 ** 3


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


svc = _load("inference_service_filters", REPO / "plugins" / "filter" / "inference_service.py")
validate_filters = importlib.import_module("ansible_collections.hmk.moe_kit.plugins.filter.hmk_validate")
gguf_layout = importlib.import_module("ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf")

# The flags table the llama_build role checks every build against. IK_PINNED: the set at 55d3c05 (2026-04-13), the
# pin before issue 25; 8337e4cd (2026-08-15, the pin now) adds only opt-in flags (test_engine_flags.py checks those).
FLAG_TABLE = yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml").read_text())["llama_build_engine_flags"]
IK_PINNED = svc.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", "2026-04-13")
MAINLINE = svc.engine_flag_set(FLAG_TABLE, "llama.cpp", "2026-10-01")
IK_OLD = svc.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", "2025-06-01")


def _profile(path):
    return yaml.safe_load((REPO / path).read_text())["hmk_hardware"]


GENOA_4090 = _profile("inventories/production/group_vars/genoa_1gpu/hardware.yml")
GENOA_5090 = _profile("inventories/production/host_vars/epyc-genoa-5090/hardware.yml")
MILAN_4X4090 = _profile("inventories/production/group_vars/milan_4gpu/hardware.yml")
TWIN = _profile("inventories/lab/group_vars/twins/hardware.yml")

GENOA_FACTS = {"processor_cores": 32, "processor_count": 1, "processor_vcpus": 32}
MILAN_FACTS = {"processor_cores": 64, "processor_count": 1, "processor_vcpus": 64}
TWIN_FACTS = {"processor_cores": 2, "processor_count": 1, "processor_vcpus": 2}


def r1_layout():
    """DeepSeek-R1 IQ4_XS (~355 GB): 61 blocks, the first 3 dense, 58 MoE layers of 256 routed experts.

    Routed experts: 58 x 256 x 3 x 7168 x 2048 = 653.8 B params at ~4.16 bpw ~ 340 GB, ~5.86 GB per layer;
    the remaining ~17 B params (attention, shared experts, dense FFNs, embeddings) ~ 11.5 GB.
    """
    per_layer = 340 * 10 ** 9 // 58
    return {"architecture": "deepseek2",
            "metadata": {"block_count": 61, "kv_lora_rank": 512, "rope_dimension_count": 64, "head_count": 128,
                         "head_count_kv": 128, "key_length": 192, "value_length": 128, "embedding_length": 7168,
                         "leading_dense_block_count": 3, "expert_count": 256},
            "expert_bytes": {str(n): per_layer for n in range(3, 61)},
            "non_expert_bytes": int(11.5 * 10 ** 9)}


def qwen3_layout():
    """Qwen3-235B-A22B Q4_K_M (~143 GB): 94 layers, all MoE, 128 experts, GQA 64 heads / 4 KV heads of 128.

    Routed experts: 94 x 128 x 3 x 4096 x 1536 = 226.9 B params ~ 138 GB, ~1.47 GB per layer; the rest ~5 GB.
    """
    per_layer = 138 * 10 ** 9 // 94
    return {"architecture": "qwen3moe",
            "metadata": {"block_count": 94, "head_count": 64, "head_count_kv": 4, "key_length": 128,
                         "value_length": 128, "embedding_length": 4096, "expert_count": 128},
            "expert_bytes": {str(n): per_layer for n in range(94)},
            "non_expert_bytes": 5 * 10 ** 9}


def plan_for(layout, profile, ctx=32768, vram=None):
    kv = svc.kv_cache_bytes(layout, ctx, "q8_0", "q8_0", mla=layout["architecture"] == "deepseek2")
    return svc.placement_plan(layout, vram if vram is not None else svc.gpu_vram_bytes(profile), kv, 3 * GIB, GIB)


def argv_for(layout, profile, facts, accepted=IK_PINNED, engine="ik_llama.cpp", **extra):
    plan = plan_for(layout, profile)
    opts = {"engine": engine, "accepted": accepted, "model": "/srv/models/m/m-00001-of-00009.gguf",
            "arch": layout["architecture"], "threads": svc.physical_cores(facts), "ot": plan["rules"],
            "ts": plan["tensor_split"], "numa_nodes": 1, "port": 8080, "amb": 512}
    opts.update(extra)
    return svc.llama_argv(opts), plan


def value(argv, flag):
    return argv[argv.index(flag) + 1]


def all_values(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


# ------------------------------------------------------------------------------------------ seed profiles

def test_r1_iq4_xs_on_genoa_4090_renders_the_pinned_ik_flags_and_one_gpu_layer():
    argv, plan = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS)
    assert value(argv, "-t") == "32"
    assert value(argv, "-ngl") == "99"
    assert value(argv, "-fa") == "on"
    assert "-fmoe" not in argv
    assert value(argv, "-mla") == "3"
    assert value(argv, "-amb") == "512"
    assert (value(argv, "-ctk"), value(argv, "-ctv")) == ("q8_0", "q8_0")
    assert (value(argv, "-c"), value(argv, "-b"), value(argv, "-ub")) == ("32768", "2048", "2048")
    assert value(argv, "--host") == "127.0.0.1"
    assert "--metrics" in argv and "--numa" not in argv and "-rtr" not in argv
    # 24 GiB: 11.5 GB of attention/shared weights + 1.2 GB of MLA cache + 4 GiB reserves leave room for one
    # 5.9 GB MoE layer.
    assert plan["gpus"][0]["layers"] == [3]
    assert all_values(argv, "-ot") == [r"blk\.(3)\.ffn_.*_exps=CUDA0", "exps=CPU"]
    assert plan["gpus"][0]["expected_bytes"] <= 24 * GIB


def test_qwen3_235b_on_genoa_5090_has_no_mla_and_fills_the_32_gib_card():
    argv, plan = argv_for(qwen3_layout(), GENOA_5090, GENOA_FACTS)
    assert "-mla" not in argv and "-amb" not in argv  # MLA is DeepSeek's; ik ignores it for Qwen3
    assert value(argv, "-fa") == "on" and "-fmoe" not in argv
    assert plan["gpus"][0]["layers"] == list(range(14))
    assert plan["cpu_layers"] == list(range(14, 94))
    assert plan["gpus"][0]["expected_bytes"] <= 32 * GIB
    assert all_values(argv, "-ot") == [r"blk\.(0|1|2|3|4|5|6|7|8|9|10|11|12|13)\.ffn_.*_exps=CUDA0", "exps=CPU"]


def test_r1_on_milan_4x4090_keeps_each_gpus_experts_inside_the_layers_it_holds():
    argv, plan = argv_for(r1_layout(), MILAN_4X4090, MILAN_FACTS)
    assert value(argv, "-t") == "64"
    # -ngl 99 gives each GPU a contiguous block of the 61 layers (the output layer on the last); each GPU
    # takes its experts from its own block, never from a neighbour's (tests/unit/test_gpu_placement.py).
    assert [g["block"] for g in plan["gpus"]] == [[0, 14], [15, 29], [30, 45], [46, 60]]
    assert [g["layers"] for g in plan["gpus"]] == [[3, 4, 5], [15, 16, 17], [30, 31, 32], [46, 47, 48]]
    assert sorted(plan["cpu_layers"] + [n for g in plan["gpus"] for n in g["layers"]]) == list(range(3, 61))
    for gpu in plan["gpus"]:
        assert gpu["expected_bytes"] <= gpu["vram_bytes"], gpu
    assert all_values(argv, "-ot") == [r"blk\.(3|4|5)\.ffn_.*_exps=CUDA0", r"blk\.(15|16|17)\.ffn_.*_exps=CUDA1",
                                       r"blk\.(30|31|32)\.ffn_.*_exps=CUDA2", r"blk\.(46|47|48)\.ffn_.*_exps=CUDA3",
                                       "exps=CPU"]
    # the -ts that makes mainline's and ik's own split give these blocks is rendered (tested in test_gpu_placement)
    assert value(argv, "-ts") == ",".join("%g" % v for v in plan["tensor_split"]) and len(plan["tensor_split"]) == 4


def test_first_match_wins_order_sends_each_tensor_where_the_plan_says():
    _unused, plan = argv_for(r1_layout(), MILAN_4X4090, MILAN_FACTS)
    rules = plan["rules"]
    assert svc.rule_buffer(rules, "blk.3.ffn_up_exps.weight") == "CUDA0"
    assert svc.rule_buffer(rules, "blk.17.ffn_down_exps.weight") == "CUDA1"
    # blk.30 must not match the blk\.(3|...) rule, and the catch-all comes last
    assert svc.rule_buffer(rules, "blk.30.ffn_gate_exps.weight") == "CUDA2"
    assert svc.rule_buffer(rules, "blk.33.ffn_gate_exps.weight") == "CPU"
    assert svc.rule_buffer(rules, "blk.60.ffn_up_exps.weight") == "CPU"
    # shared experts and attention match no rule: they follow -ngl onto the GPU holding the layer
    assert svc.rule_buffer(rules, "blk.3.ffn_up_shexp.weight") is None
    assert svc.rule_buffer(rules, "blk.3.attn_kv_a_mqa.weight") is None


def test_twin_cpu_only_gets_no_gpu_rule_only_the_harmless_catch_all():
    argv, plan = argv_for(r1_layout(), TWIN, TWIN_FACTS)
    assert plan["gpus"] == [] and plan["gpu_layer_count"] == 0
    assert all_values(argv, "-ot") == ["exps=CPU"]
    assert value(argv, "-t") == "2"
    assert plan["warnings"] == []


def test_mainline_gets_no_mla_no_amb_no_fmoe_but_fa_on():
    argv, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, accepted=MAINLINE, engine="llama.cpp")
    assert "-mla" not in argv and "-amb" not in argv and "-fmoe" not in argv
    assert value(argv, "-fa") == "on"


def test_an_old_ik_commit_gets_the_bare_switches_it_had():
    argv, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, accepted=IK_OLD)
    assert argv[argv.index("-fa") + 1].startswith("-")  # bare -fa
    assert "-fmoe" in argv


def test_flag_names_from_a_build_record_render_the_same_as_the_table():
    names = [item["flag"] for item in IK_PINNED["accepted"]]
    by_table, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS)
    by_names, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, accepted=names)
    assert by_table == by_names


def test_a_flag_the_engine_version_lacks_is_an_error_not_a_silent_drop():
    accepted = [item for item in IK_PINNED["accepted"] if item["flag"] != "-ot"]
    with pytest.raises(svc.AnsibleFilterError, match="does not accept -ot"):
        argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, accepted=accepted)


def test_multi_numa_node_boxes_get_numa_distribute():
    argv, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, numa_nodes=4)
    assert value(argv, "--numa") == "distribute"


@pytest.mark.parametrize("extra", [["-rtr"], ["--api-key", "secret"]])
def test_extra_arguments_cannot_bring_rtr_or_a_key_on_the_command_line(extra):
    with pytest.raises(svc.AnsibleFilterError):
        argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, extra=extra)


def test_the_api_key_goes_by_file():
    argv, _unused = argv_for(r1_layout(), GENOA_4090, GENOA_FACTS, api_key_file="/run/hmk-inference/api-key")
    assert value(argv, "--api-key-file") == "/run/hmk-inference/api-key"
    assert "--api-key" not in argv


# ---------------------------------------------------------------------------------------- the planner

@pytest.mark.parametrize("vram_gib", [6, 8, 12])
def test_a_gpu_too_small_for_anything_but_attention_keeps_every_expert_on_cpu_without_failing(vram_gib):
    plan = plan_for(r1_layout(), None, vram=[vram_gib * GIB])
    assert plan["gpus"][0]["layers"] == []
    assert plan["cpu_layers"] == list(range(3, 61))
    assert plan["rules"] == ["exps=CPU"]
    assert any("DRAM" in w for w in plan["warnings"])


def test_zero_gpu_layers_requested_keeps_every_expert_on_cpu_quietly():
    layout = r1_layout()
    kv = svc.kv_cache_bytes(layout, 32768)
    plan = svc.placement_plan(layout, [80 * GIB], kv, 3 * GIB, GIB, max_gpu_layers=0)
    assert plan["rules"] == ["exps=CPU"] and plan["warnings"] == []


def test_a_cap_on_gpu_layers_is_honoured():
    layout = r1_layout()
    plan = svc.placement_plan(layout, [24 * GIB] * 4, svc.kv_cache_bytes(layout, 32768), 3 * GIB, GIB, max_gpu_layers=5)
    assert [g["layers"] for g in plan["gpus"]] == [[3, 4, 5], [15, 16], [], []]


def test_a_layer_that_does_not_fit_its_gpu_stays_in_dram_and_never_moves_to_another_gpu():
    layout = {"expert_bytes": {"0": 6 * GIB, "1": 6 * GIB, "2": 6 * GIB}, "non_expert_bytes": 0}
    plan = svc.placement_plan(layout, [10 * GIB, 10 * GIB], 0, 0, 0)
    assert [g["block"] for g in plan["gpus"]] == [[0, 1], [2, 2]]
    assert [g["layers"] for g in plan["gpus"]] == [[0], [2]]
    assert plan["cpu_layers"] == [1]


def test_kv_cache_sizes_match_the_brief():
    # R1 with MLA: (512 + 64) x 1.0625 B x 61 layers x 32768 tokens ~ 1.14 GiB ("~1.2 GiB at 32k")
    assert 1.1 * GIB < svc.kv_cache_bytes(r1_layout(), 32768, mla=True) < 1.2 * GIB
    # Qwen3-235B: 4 KV heads x (128 + 128) x 1.0625 B x 94 layers x 32768 ~ 3.1 GiB
    assert 3.0 * GIB < svc.kv_cache_bytes(qwen3_layout(), 32768) < 3.2 * GIB
    # DeepSeek without MLA (mainline's MHA path) is ~40x bigger: the plan must not use the MLA size there
    assert svc.kv_cache_bytes(r1_layout(), 32768, mla=False) > 40 * GIB


def test_the_plan_is_readable():
    _unused, plan = argv_for(r1_layout(), MILAN_4X4090, MILAN_FACTS)
    text = svc.plan_markdown(plan, "R1")
    assert "| CUDA1 | 15-29 | 15|16|17 |" in text and "| CUDA3 | 46-60 + output | 46|47|48 |" in text
    assert "    -ot exps=CPU" in text and "    -ts " in text
    summary = svc.plan_summary(plan)
    assert summary[0].startswith("CUDA0: holds layers 0-14, experts of [3,4,5]")
    assert summary[4].startswith("CPU: 46 MoE layers") and summary[5].startswith("-ts ")


def test_threads_are_physical_cores_unless_overridden():
    assert svc.physical_cores({"processor_cores": 32, "processor_count": 1, "processor_vcpus": 64}) == 32
    assert svc.physical_cores(GENOA_FACTS, 24) == 24
    assert svc.physical_cores({"processor_vcpus": 3}) == 3


def test_ready_timeout_scales_with_the_model():
    assert svc.ready_timeout(0) == 60
    assert svc.ready_timeout(355 * 10 ** 9) == 60 + 2 * 355
    assert svc.ready_timeout(15 * 10 ** 6) == 62


# --------------------------------------------------------------------------- the arguments file and systemd

WEIRD = [r"blk\.(3|4|5)\.ffn_.*_exps=CUDA0", r"blk\.\d+\.ffn_(up|down)_exps\.weight=CPU", "100%", "%d/api-key",
         "$HOME", "${PATH}", "it's", 'say "hi"', "two words", "back\\\\slash", "-", "\t"]


def test_args_file_round_trips_through_the_wrappers_read_loop():
    assert svc.read_args_file(svc.args_file(WEIRD)) == WEIRD


def test_the_real_wrapper_execs_the_engine_with_every_argument_byte_for_byte(tmp_path):
    args = tmp_path / "engine.args"
    argv = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"] + WEIRD
    args.write_text(svc.args_file(argv))
    out = subprocess.run(["sh", str(ROLE / "files" / "inference-exec"), str(args), "--api-key-file", "/run/x/api-key"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == WEIRD + ["--api-key-file", "/run/x/api-key"]


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "", "nul\x00"])
def test_args_file_refuses_what_one_line_per_argument_cannot_carry(bad):
    with pytest.raises(svc.AnsibleFilterError):
        svc.args_file(["x", bad])


def test_systemd_words_escape_specifiers_backslashes_and_quote_spaces():
    assert svc.systemd_word("/etc/hmk/hmk-inference.args") == "/etc/hmk/hmk-inference.args"
    assert svc.systemd_word("/srv/100%") == "/srv/100%%"
    assert svc.systemd_word("a\\b") == "a\\\\b"
    assert svc.systemd_word("/srv/my models") == '"/srv/my models"'
    assert svc.systemd_word("$X") == "$$X"
    with pytest.raises(svc.AnsibleFilterError):
        svc.systemd_word("a\nb")


def test_the_unit_template_passes_no_engine_flag_through_execstart():
    text = (ROLE / "templates" / "inference.service.j2").read_text()
    assert text.startswith("{{ ansible_managed | comment }}")
    exec_lines = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert exec_lines and all("-ot" not in line and "__inference_service_argv" not in line for line in exec_lines)
    assert "-rtr" not in text and "--api-key " not in text


def test_config_hash_is_stable_and_sensitive():
    a = svc.config_hash({"argv": ["-m", "x"], "build": "builds/a"})
    assert a == svc.config_hash({"build": "builds/a", "argv": ["-m", "x"]})
    assert a != svc.config_hash({"argv": ["-m", "x"], "build": "builds/b"})


# ---------------------------------------------------------------------------------- the GGUF reader

def _tiny(tmp_path, *args):
    subprocess.run([sys.executable, str(REPO / "scripts" / "make-tiny-moe-gguf")] + list(args),
                   check=True, capture_output=True)


def _gguf_truth(paths):
    from gguf import GGUFReader
    experts, other = {}, 0
    for path in paths:
        for tensor in GGUFReader(path).tensors:
            match = re.match(r"^blk\.(\d+)\.ffn_(up|down|gate)_exps\.weight$", tensor.name)
            if match:
                experts[match.group(1)] = experts.get(match.group(1), 0) + int(tensor.n_bytes)
            else:
                other += int(tensor.n_bytes)
    return experts, other


def test_reader_sums_expert_bytes_per_layer_of_a_deepseek2_gguf(tmp_path):
    path = str(tmp_path / "ds.gguf")
    _tiny(tmp_path, "--arch", "deepseek2", "-o", path)
    layout = gguf_layout.layout(path)
    experts, other = _gguf_truth([path])
    assert layout["architecture"] == "deepseek2"
    assert layout["expert_bytes"] == experts and sorted(experts) == ["1", "2", "3"]  # 1 dense + 3 MoE
    # sizes come from offsets, so alignment padding counts with the tensor before it (a few bytes at most)
    assert 0 <= layout["non_expert_bytes"] - other < 32 * 64
    assert layout["metadata"]["kv_lora_rank"] == 512 and layout["metadata"]["rope_dimension_count"] == 64
    assert layout["total_bytes"] == os.path.getsize(path)


def test_reader_follows_every_split(tmp_path):
    _tiny(tmp_path, "--arch", "qwen3moe", "-o", str(tmp_path / "q.gguf"), "--split", "3")
    paths = [str(tmp_path / ("q-%05d-of-00003.gguf" % i)) for i in (1, 2, 3)]
    layout = gguf_layout.layout(paths[0])
    experts, _unused = _gguf_truth(paths)
    assert [f["path"] for f in layout["files"]] == paths
    assert layout["expert_bytes"] == experts and len(experts) == 4
    assert layout["metadata"]["head_count_kv"] == 2
    assert layout["total_bytes"] == sum(os.path.getsize(p) for p in paths)


def test_reader_refuses_a_missing_split_and_a_non_gguf(tmp_path):
    _tiny(tmp_path, "--arch", "qwen3moe", "-o", str(tmp_path / "q.gguf"), "--split", "2")
    os.remove(tmp_path / "q-00002-of-00002.gguf")
    with pytest.raises(gguf_layout.GGUFError, match="lacks"):
        gguf_layout.layout(str(tmp_path / "q-00001-of-00002.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(gguf_layout.GGUFError, match="not a GGUF"):
        gguf_layout.layout(str(junk))


def test_the_tiny_model_plan_on_a_small_fake_gpu_places_whole_layers(tmp_path):
    path = str(tmp_path / "ds.gguf")
    _tiny(tmp_path, "--arch", "deepseek2", "-o", path)
    layout = gguf_layout.layout(path)
    per_layer = layout["expert_bytes"]["1"]
    vram = layout["non_expert_bytes"] + 2 * per_layer + per_layer // 2
    plan = svc.placement_plan(layout, [vram], 0, 0, 0)
    assert plan["gpus"][0]["layers"] == [1, 2] and plan["cpu_layers"] == [3]
    assert plan["rules"] == [r"blk\.(1|2)\.ffn_.*_exps=CUDA0", "exps=CPU"]


# --------------------------------------------------------------------------------- the unit template

def render_unit(**overrides):
    """The unit as Ansible's template module renders it (trim_blocks), with the role's defaults."""
    import jinja2
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: "#\n# %s\n#" % text
    env.filters["hmk.moe_kit.inference_service_systemd_word"] = svc.systemd_word
    env.filters["basename"] = os.path.basename
    env.filters["dirname"] = os.path.dirname
    env.filters["bool"] = bool
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    context = dict(defaults)
    context.update({
        "ansible_managed": "Ansible managed",
        "inference_service_model_path": "/srv/models/r1/R1-00001-of-00010.gguf",
        "inference_service_engine_root": "/opt/hmk/engines/ik_llama.cpp",
        "__inference_service_llama_engines": ["ik_llama.cpp", "llama.cpp"],
        "__inference_service_gpu_count": 0,
        "__inference_service_gpu_devices": yaml.safe_load((ROLE / "vars" / "main.yml").read_text())[
            "__inference_service_gpu_devices"],
        "__inference_service_numa_nodes": 1,
        "__inference_service_plan_md": "/etc/hmk/hmk-inference-plan.md",
        "__inference_service_args_path": "/etc/hmk/hmk-inference.args",
        "__inference_service_key_path": "/etc/hmk/hmk-inference.api-key",
        "__inference_service_wrapper": "/usr/local/libexec/hmk/inference-exec",
        "__inference_service_binary": "/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server",
        "__inference_service_drop_caches_unit": "hmk-drop-caches.service",
        "__inference_service_path_env": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "__inference_service_ready_timeout": 770,
        "__inference_service_manifest_path": "/etc/hmk/hmk-inference.model.json",
    })
    context.update(overrides)
    context.setdefault("__inference_service_loopback", validate_filters.hmk_is_loopback(context["inference_service_host"]))
    template = env.from_string((ROLE / "templates" / "inference.service.j2").read_text())
    return template.render(**context).splitlines()


def test_cpu_only_unit_is_sandboxed_without_devices_and_with_mdwe():
    unit = render_unit(inference_service_api_key="k")
    for line in ("PrivateDevices=true", "MemoryDenyWriteExecute=true", "IPAddressDeny=any", "IPAddressAllow=localhost",
                 "ProtectSystem=strict", "CapabilityBoundingSet=", "LimitMEMLOCK=infinity", "TimeoutStartSec=770",
                 "Restart=on-failure", "RestartPreventExitStatus=78",
                 "ExecStart=/usr/local/libexec/hmk/inference-exec --model-check /etc/hmk/hmk-inference.model.json "
                 "/etc/hmk/hmk-inference.args --api-key-file /run/hmk-inference/api-key"):
        assert line in unit, line
    assert not any(line.startswith(("Requires=", "DeviceAllow=", "NUMAPolicy=")) for line in unit)
    assert not any("k" == line.rsplit(" ", 1)[-1] for line in unit if line.startswith("Exec"))


def test_gpu_unit_requires_the_driver_units_and_allows_only_nvidia_devices():
    unit = render_unit(__inference_service_gpu_count=4)
    assert "After=network.target nvidia-persistenced.service hmk-nvidia-device-nodes.service" in unit
    assert "Requires=nvidia-persistenced.service hmk-nvidia-device-nodes.service" in unit
    assert "DevicePolicy=closed" in unit and "PrivateDevices=false" in unit
    # one glob for every driver generation (tests/unit/test_nvidia_devices.py matches it against both namings)
    assert [line for line in unit if line.startswith("DeviceAllow=")] == ["DeviceAllow=char-nvidia* rw"]
    assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in unit
    assert "MemoryDenyWriteExecute=true" not in unit  # auto: not verified with NVIDIA's user-space driver
    assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK" in unit


def test_multi_numa_node_unit_interleaves():
    unit = render_unit(__inference_service_numa_nodes=4)
    assert "NUMAPolicy=interleave" in unit and "NUMAMask=all" in unit


def test_a_public_bind_keeps_the_ip_filter_and_allows_only_the_listed_networks():
    unit = render_unit(inference_service_host="0.0.0.0", inference_service_allowed_networks=["10.20.0.0/24", "fd00::/64"])
    allow = [line for line in unit if line.startswith("IPAddress")]
    assert allow == ["IPAddressDeny=any", "IPAddressAllow=localhost", "IPAddressAllow=10.20.0.0/24",
                     "IPAddressAllow=fd00::/64"]
    loopback = render_unit()
    assert [line for line in loopback if line.startswith("IPAddress")] == ["IPAddressDeny=any", "IPAddressAllow=localhost"]


def test_ktransformers_unit_puts_the_venv_first_on_path_and_has_a_home():
    unit = render_unit(inference_service_engine="ktransformers",
                       __inference_service_binary="/opt/hmk/engines/ktransformers/current/venv/bin/python")
    assert ("Environment=PATH=/opt/hmk/engines/ktransformers/current/venv/bin:/usr/local/sbin:/usr/local/bin:"
            "/usr/sbin:/usr/bin:/sbin:/bin") in unit
    assert "Environment=HOME=/var/lib/hmk-inference" in unit
    assert "MemoryDenyWriteExecute=true" not in unit
    assert not any(line.startswith("ExecStartPre=") for line in unit)


def test_drop_caches_orders_the_kernel_tuning_oneshot_before_the_start():
    unit = render_unit(inference_service_drop_caches=True)
    assert "After=network.target hmk-drop-caches.service" in unit
    assert "Wants=hmk-drop-caches.service" in unit
