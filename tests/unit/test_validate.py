"""validate: the roofline arithmetic against BRIEF section 7's table, theoretical bandwidth of the seed profiles,
RAPL wraparound and GPU power, llama-bench flag mapping on the real ik_llama.cpp llama-bench --help, the bench helper
on a real subprocess with ik's stray stdout lines, the report's "value or {available: false, reason}" rule, the
seed figures and the memory bandwidth probe compiled with gcc."""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "validate"
GB = 1000 ** 3


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


val = _load("validate_filters", REPO / "plugins" / "filter" / "validate.py")


def _profile(path):
    return yaml.safe_load((REPO / path).read_text())["hmk_hardware"]


GENOA_4090 = _profile("inventories/production/group_vars/genoa_1gpu/hardware.yml")
GENOA_5090 = _profile("inventories/production/host_vars/epyc-genoa-5090/hardware.yml")
MILAN_4X4090 = _profile("inventories/production/group_vars/milan_4gpu/hardware.yml")
TWIN = _profile("inventories/lab/group_vars/twins/hardware.yml")

# `llama-bench --help` of the ik_llama.cpp build molecule/inference_service makes (pinned fixture commit 7e0c0f7).
IK_BENCH_HELP = (
    "usage: /opt/hmk/engines/ik_llama.cpp/current/bin/llama-bench [options]\n"
    "\n"
    "options:\n"
    "  -h, --help\n"
    "  -m, --model <filename>              (default: models/7B/ggml-model-q4_0.gguf)\n"
    "  -p, --n-prompt <n>                  (default: 512)\n"
    "  -n, --n-gen <n>                     (default: 128)\n"
    "  -pg <pp,tg>                         (default: )\n"
    "  -gp <pp,tg>                         (default: )\n"
    "  -b, --batch-size <n>                (default: 2048)\n"
    "  -ub, --ubatch-size <n>              (default: 512)\n"
    "  -ctk, --cache-type-k <t>            (default: f16)\n"
    "  -ctv, --cache-type-v <t>            (default: f16)\n"
    "  -t, --threads <n>                   (default: {2, 2})\n"
    "  -tgb, --threads-gen-batch <n1,n2>   (default: {2, 2})\n"
    "  -ngl, --n-gpu-layers <n>            (default: 999)\n"
    "  --n-cpu-moe <n>                     (default: none)\n"
    "  -rpc, --rpc <rpc_servers>           (default: )\n"
    "  -sm, --split-mode <none|layer|graph>(default: layer)\n"
    "  -mg, --main-gpu <i>                 (default: 0)\n"
    "  -nkvo, --no-kv-offload <0|1>        (default: 0)\n"
    "  -fa, --flash-attn <0|1>             (default: 1)\n"
    "  -mla, --mla-attn <0|1|2>            (default: 3)\n"
    "  -amb, --attn-max-batch <i>          (default: 0)\n"
    "  -ser, --smart-expert-reduction <i,f>(default: 0)\n"
    "  -gr, --graph-reuse <0|1>            (default: 1)\n"
    "  -mmp, --mmap <0|1>                  (default: 1)\n"
    "  --numa <distribute|isolate|numactl> (default: disabled)\n"
    "  -embd, --embeddings <0|1>           (default: 0)\n"
    "  -ts, --tensor-split <ts0/ts1/..>    (default: 0)\n"
    "  -r, --repetitions <n>               (default: 5)\n"
    "  -o, --output <csv|json|md|sql>      (default: md)\n"
    "  -oe, --output-err <csv|json|md|sql> (default: none)\n"
    "  -v, --verbose                       (default: 0)\n"
    "  -w, --warmup <0|1>                  (default: 1)\n"
    "  -rtr, --run-time-repack <0|1>       (default: 0)\n"
    "  -cuda, --cuda-params <string>       (default: )\n"
    "  -mqkv, --merge-qkv                  (default: 0)\n"
    "  -muge, --merge-up-gate-experts      (default: 0)\n"
    "  -rcache, --rope-cache               (default: 0)\n"
    "  -thp, --transparent-huge-pages <0|1> (default: 0)\n"
    "  -ot, --override-tensor pattern      (default: none)\n"
    "  -fmoe, --fused-moe <0|1>            (default: 1)\n"
    "  -ger, --grouped-expert-routing <0|1>(default: 0)\n"
    "  -no-fug, --no-fused-up-gate <0|1>   (default: 0)\n"
    "  -no-ooae, --no-offload-only-active-experts <0|1>   (default: 0)\n"
    "  -sas, --scheduler-async <0|1>       (default: 0)\n"
    "  --fit <0|1>                         (default: 0)\n"
    "  --fit-margin N                      (default: 0)\n"
    "  --max-gpu <N>                       (default: 0)\n"
    "        --print-overrides <0|1>       (default: 0)\n"
    "\n"
    "Multiple values can be given for each parameter by separating them with ',' or by specifying the parameter multiple times.\n"
)

# stdout of `llama-bench -m tiny-deepseek2.gguf -t 1 -p 0 -n 8 -r 2 -o json` from the same build: ik prints its
# "Computed blk.N.attn_k_b.weight ..." notes on stdout, between the JSON's first line and the rest.
IK_BENCH_TG_STDOUT = (
    "[\n"
    "Computed blk.0.attn_k_b.weight as 128 x 512 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.0.attn_v_b.weight as 512 x 128 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.1.attn_k_b.weight as 128 x 512 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.1.attn_v_b.weight as 512 x 128 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.2.attn_k_b.weight as 128 x 512 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.2.attn_v_b.weight as 512 x 128 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.3.attn_k_b.weight as 128 x 512 x 4 of type q8_0 and stored in buffer CPU\n"
    "Computed blk.3.attn_v_b.weight as 512 x 128 x 4 of type q8_0 and stored in buffer CPU\n"
    "  {\n"
    "    \"build_commit\": \"7e0c0f7\",\n"
    "    \"build_number\": 1,\n"
    "    \"cuda\": false,\n"
    "    \"vulkan\": false,\n"
    "    \"kompute\": false,\n"
    "    \"metal\": false,\n"
    "    \"sycl\": false,\n"
    "    \"rpc\": \"0\",\n"
    "    \"gpu_blas\": false,\n"
    "    \"blas\": false,\n"
    "    \"cpu_info\": \"AMD EPYC\",\n"
    "    \"gpu_info\": \"\",\n"
    "    \"model_filename\": \"/srv/models/tiny-deepseek2/tiny-deepseek2.gguf\",\n"
    "    \"model_type\": \"deepseek2 ?B Q8_0\",\n"
    "    \"model_size\": 17579968,\n"
    "    \"model_n_params\": 16532272,\n"
    "    \"n_batch\": 2048,\n"
    "    \"n_ubatch\": 512,\n"
    "    \"n_threads\": 1,\n"
    "    \"type_k\": \"f16\",\n"
    "    \"type_v\": \"f16\",\n"
    "    \"n_gpu_layers\": 999,\n"
    "    \"split_mode\": \"layer\",\n"
    "    \"main_gpu\": 0,\n"
    "    \"no_kv_offload\": false,\n"
    "    \"flash_attn\": true,\n"
    "    \"mla_attn\": 3,\n"
    "    \"attn_max_batch\": 0,\n"
    "    \"ser\": \"-1,0\",\n"
    "    \"reuse\": true,\n"
    "    \"tensor_split\": \"0.00\",\n"
    "    \"use_mmap\": true,\n"
    "    \"embeddings\": false,\n"
    "    \"repack\": false,\n"
    "    \"mqkv\": false,\n"
    "    \"muge\": false,\n"
    "    \"fused_moe\": true,\n"
    "    \"grouped_er\": false,\n"
    "    \"no_fused_up_gate\": false,\n"
    "    \"use_thp\": false,\n"
    "    \"no_ooae\": false,\n"
    "    \"rcache\": false,\n"
    "    \"sas\": false,\n"
    "    \"max_gpu\": 0,\n"
    "    \"cuda_params\": \"\",\n"
    "    \"override_tensor\": \"\",\n"
    "    \"n_prompt\": 0,\n"
    "    \"n_gen\": 8,\n"
    "    \"test_time\": \"2026-11-30T09:49:58Z\",\n"
    "    \"avg_ns\": 3568503,\n"
    "    \"stddev_ns\": 1762124,\n"
    "    \"avg_ts\": 2553.107215,\n"
    "    \"stddev_ts\": 1260.720831,\n"
    "    \"test\": \"tg8\",\n"
    "    \"samples_ns\": [ 4814512, 2322495 ],\n"
    "    \"samples_ts\": [ 1661.64, 3444.57 ]\n"
    "  }\n"
    "]\n"
)

# The service's argv as the inference_service role rendered it on the twin (deployment.json of the scenario).
TWIN_SERVER_ARGV = [
    "/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server", "-m", "/srv/models/tiny-deepseek2/tiny-deepseek2.gguf",
    "--host", "127.0.0.1", "--port", "18481", "-t", "1", "-ngl", "99", "-c", "4096", "-b", "512", "-ub", "512",
    "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "-mla", "3", "-amb", "512",
    "-ot", "blk\\.\\d+\\.ffn_(up|down|gate)_exps\\.weight=CPU", "--metrics"]
BENCH = "/opt/hmk/engines/ik_llama.cpp/current/bin/llama-bench"


# ------------------------------------------------------------------------------------ bandwidth and roofline

@pytest.mark.parametrize("profile, gbps", [(GENOA_4090, 460.8), (GENOA_5090, 460.8), (MILAN_4X4090, 204.8),
                                           (TWIN, 460.8)])
def test_theoretical_bandwidth_of_the_profiles_is_the_brief_s(profile, gbps):
    result = val.theoretical_bandwidth(profile)
    assert result["available"] is True
    assert result["gbps"] == gbps


def test_theoretical_bandwidth_counts_sockets_and_says_why_when_it_cannot():
    dual = {"cpu": {"sockets": 2}, "memory": {"channels_per_socket": 12, "min_speed_mts": 4800}}
    assert val.theoretical_bandwidth(dual)["gbps"] == 921.6
    missing = val.theoretical_bandwidth({"cpu": {"sockets": 1}, "memory": {"type": "DDR5"}})
    assert missing["available"] is False and "min_speed_mts" in missing["reason"]


def r1_iq4_xs_expert_bytes():
    """DeepSeek-R1 IQ4_XS: MoE layers 3..60, each 3 tensors (gate, up, down) of 256 experts x 7168 x 2048 weights
    at IQ4_XS's 4.25 bits per weight (136 bytes per 256-weight block)."""
    per_layer = 3 * 256 * 7168 * 2048 * 136 // 256
    return {str(layer): per_layer for layer in range(3, 61)}


def test_r1_iq4_xs_reads_about_10_8_gb_per_token_and_tops_out_near_42_7_tok_s_at_460_8_gb_s():
    per_token = val.expert_bytes_per_token(r1_iq4_xs_expert_bytes(), 256, 8)
    assert per_token / GB == pytest.approx(10.8, rel=0.015)
    line = val.roofline(per_token, None, 460.8, None)
    assert line["ceiling_tps_at_theoretical_bandwidth"] == pytest.approx(42.7, rel=0.015)
    milan = val.roofline(per_token, None, 204.8, None)
    assert milan["ceiling_tps_at_theoretical_bandwidth"] == pytest.approx(19.0, rel=0.015)


@pytest.mark.parametrize("layers, count, used, dims, params_b", [
    (range(3, 61), 256, 8, (7168, 2048), 20.4),   # DeepSeek-R1: 58 MoE layers, 8 of 256 experts
    (range(0, 94), 128, 8, (4096, 1536), 14.2),   # Qwen3-235B-A22B: 94 MoE layers, 8 of 128 experts
])
def test_expert_params_read_per_token_match_the_brief(layers, count, used, dims, params_b):
    # one byte per weight: the bytes per token are the expert parameters per token
    per_layer = 3 * count * dims[0] * dims[1]
    per_token = val.expert_bytes_per_token({str(n): per_layer for n in layers}, count, used)
    assert per_token / 1e9 == pytest.approx(params_b, rel=0.005)


@pytest.mark.parametrize("gb_per_token, at_460, at_204", [(12.3, 37.5, 16.7), (8.6, 53.6, 23.8)])
def test_ceilings_of_the_brief_s_other_rows(gb_per_token, at_460, at_204):
    line = val.roofline(int(gb_per_token * GB), 204.8, 460.8, None)
    assert line["ceiling_tps_at_theoretical_bandwidth"] == pytest.approx(at_460, rel=0.005)
    assert line["ceiling_tps_at_measured_bandwidth"] == pytest.approx(at_204, rel=0.005)


def test_efficiency_is_measured_tg_over_the_ceiling():
    per_token = val.expert_bytes_per_token(r1_iq4_xs_expert_bytes(), 256, 8)
    # seed 000: ik_llama.cpp + 4090 on R1 IQ4_XS generates 15.8 tok/s; a STREAM-like read of ~350 GB/s
    line = val.roofline(per_token, 350.0, 460.8, 15.8)
    assert line["efficiency_vs_theoretical"] == pytest.approx(15.8 / (460.8e9 / per_token), abs=1e-4)
    assert line["efficiency_vs_measured"] == pytest.approx(15.8 / (350e9 / per_token), abs=1e-4)
    assert 0.35 <= line["efficiency_vs_theoretical"] <= 0.55  # the brief: published runs reach 35-55%
    no_tg = val.roofline(per_token, 350.0, 460.8, None)
    assert no_tg["efficiency_vs_measured"] == {"available": False, "reason": "no measured generation speed"}
    no_bw = val.roofline(per_token, None, 460.8, 15.8)
    assert no_bw["ceiling_tps_at_measured_bandwidth"]["available"] is False


def test_expert_bytes_of_a_subset_of_layers_and_refusals():
    experts = {"1": 1600, "2": 3200}
    assert val.expert_bytes_per_token(experts, 16, 4) == 1200
    assert val.expert_bytes_per_token(experts, 16, 4, layers=[2]) == 800
    assert val.expert_bytes_per_token(experts, 16, 4, layers=[]) == 0
    with pytest.raises(val.AnsibleFilterError, match="MoE"):
        val.expert_bytes_per_token(experts, 0, 0)
    with pytest.raises(val.AnsibleFilterError, match="no routed-expert"):
        val.expert_bytes_per_token({}, 16, 4)


# ------------------------------------------------------------------------------------ energy

def test_rapl_energy_handles_a_counter_that_wrapped():
    span = 262143328850  # max_energy_range_uj of an AMD package zone
    rapl = {"available": True, "seconds": 10.0, "domains": [
        {"zone": "intel-rapl:0", "name": "package-0", "energy_uj": span - 500_000_000,
         "energy_uj_after": 1_499_999_999, "max_energy_range_uj": span}]}
    result = val.rapl_energy(rapl)
    # 500 J up to the wrap, one microjoule for the step to 0, then 1500 J
    assert result["joules"] == pytest.approx(2000.0, abs=0.01)
    assert result["average_watts"] == pytest.approx(200.0, abs=0.01)


def test_rapl_energy_sums_packages_and_passes_reasons_through():
    rapl = {"available": True, "seconds": 4.0, "domains": [
        {"zone": "intel-rapl:0", "name": "package-0", "energy_uj": 1_000_000, "energy_uj_after": 401_000_000,
         "max_energy_range_uj": 2 ** 32},
        {"zone": "intel-rapl:1", "name": "package-1", "energy_uj": 0, "energy_uj_after": 400_000_000,
         "max_energy_range_uj": 2 ** 32}]}
    assert val.rapl_energy(rapl)["joules"] == 800.0
    reason = "no RAPL zone under /sys/class/powercap (no powercap driver, or a container without it)"
    assert val.rapl_energy({"available": False, "reason": reason}) == {"available": False, "reason": reason}


def test_gpu_energy_averages_each_board_then_sums_them():
    raw = "0, 300.00\n1, 100.00\n0, 340.00\n1, 120.00\n1, [N/A]\n"  # nvidia-smi --format=csv,noheader,nounits
    result = val.gpu_energy({"available": True, "raw": raw, "stderr": ""}, 2.0)
    assert result["average_watts"] == 430.0
    assert result["joules"] == 860.0
    assert result["per_gpu_average_watts"] == {"0": 320.0, "1": 110.0}
    failed = val.gpu_energy({"available": True, "raw": "", "stderr": "Failed to initialize NVML: Driver/library "
                             "version mismatch\n"}, 2.0)
    assert failed == {"available": False, "reason": "nvidia-smi gave no power.draw sample: Failed to initialize NVML: "
                      "Driver/library version mismatch"}


def test_tokens_per_joule_uses_the_known_sources_and_says_which():
    cpu = {"available": True, "average_watts": 250.0}
    gpu = {"available": True, "average_watts": 150.0}
    both = val.tokens_per_joule(16.0, cpu, gpu)
    assert both["value"] == 0.04 and both["basis"] == ["cpu_package", "gpu_board"]
    cpu_only = val.tokens_per_joule(16.0, cpu, {"available": False, "reason": "nvidia-smi is not installed"})
    assert cpu_only["value"] == 0.064 and cpu_only["basis"] == ["cpu_package"]
    none = val.tokens_per_joule(16.0, {"available": False, "reason": "x"}, {"available": False, "reason": "y"})
    assert none["available"] is False


# ------------------------------------------------------------------------------------ llama-bench

def test_the_real_ik_bench_help_lists_the_flags_the_mapping_needs():
    flags = val.bench_flags(IK_BENCH_HELP)
    for flag in ("-m", "-p", "-n", "-t", "-ngl", "-b", "-ub", "-ctk", "-ctv", "-fa", "-mla", "-amb", "-ot", "-fmoe",
                 "--numa", "-r", "-o", "--output", "--n-cpu-moe"):
        assert flag in flags, flag
    # words from the descriptions are not flags
    assert "-thp" in flags and "-none" not in flags and "--csv" not in flags


def test_the_service_argv_maps_onto_the_real_ik_bench():
    bench = val.bench_argv(TWIN_SERVER_ARGV, IK_BENCH_HELP, BENCH)
    assert bench["base"] == [
        BENCH, "-m", "/srv/models/tiny-deepseek2/tiny-deepseek2.gguf", "-t", "1", "-ngl", "99", "-b", "512",
        "-ub", "512", "-ctk", "q8_0", "-ctv", "q8_0", "-mla", "3", "-amb", "512", "-fa", "1",
        "-ot", "blk\\.\\d+\\.ffn_(up|down|gate)_exps\\.weight=CPU"]
    assert bench["dropped"] == []
    assert val.bench_command(bench, "pp", 2048, 3)[-8:] == ["-p", "2048", "-n", "0", "-r", "3", "-o", "json"]
    assert val.bench_command(bench, "tg", 128, 3)[-8:] == ["-p", "0", "-n", "128", "-r", "3", "-o", "json"]
    with pytest.raises(val.AnsibleFilterError):
        val.bench_command(bench, "pg", 1)


def test_several_ot_rules_stay_one_configuration_on_ik_and_mainline():
    argv = TWIN_SERVER_ARGV[:-3] + ["-ot", "blk\\.(3|4)\\.ffn_.*_exps=CUDA0", "-ot", "exps=CPU",
                                    "--numa", "distribute", "-fmoe"]
    ik = val.bench_argv(argv, IK_BENCH_HELP, BENCH)["base"]
    # ik appends every -ot to the one configuration: one rule per -ot, in first-match order
    assert ik[ik.index("-ot"):] == ["-ot", "blk\\.(3|4)\\.ffn_.*_exps=CUDA0", "-ot", "exps=CPU"]
    assert ik[ik.index("--numa") + 1] == "distribute" and ik[ik.index("-fmoe") + 1] == "1"
    # mainline's help documents ';' between the rules of one -ot (a second -ot would be a second configuration);
    # this help text is a two-line excerpt written for the test, not captured output
    mainline_help = ("  -o, --output <csv|json|jsonl|md|sql>      output format printed to stdout (default: md)\n"
                     "  -ot --override-tensors <tensor name pattern>=<buffer type>;...\n")
    mainline = val.bench_argv(argv, mainline_help, BENCH)
    assert mainline["base"][-2:] == ["-ot", "blk\\.(3|4)\\.ffn_.*_exps=CUDA0;exps=CPU"]
    assert set(mainline["dropped"]) == {"-t", "-ngl", "-b", "-ub", "-ctk", "-ctv", "-mla", "-amb", "-fa", "-fmoe",
                                        "--numa"}


def test_a_bench_without_json_output_is_refused():
    with pytest.raises(val.AnsibleFilterError, match="JSON"):
        val.bench_argv(TWIN_SERVER_ARGV, "  -m, --model <filename>\n", BENCH)


def _helper(*args):
    run = subprocess.run([sys.executable, str(ROLE / "files" / "hmk-validate-bench")] + list(args),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=True)
    return json.loads(run.stdout)


def test_the_helper_reads_ik_s_json_through_its_stray_lines_and_reports_power_sources(tmp_path):
    fake = tmp_path / "out.txt"
    fake.write_text(IK_BENCH_TG_STDOUT)
    raw = _helper("--rapl", "--gpu-power", "--", "cat", str(fake))
    assert raw["rc"] == 0 and raw["stdout_notes"] == 8
    tg = val.bench_result(raw, "tg")
    assert tg["available"] is True and tg["tokens"] == 8 and tg["repetitions"] == 2
    assert tg["tps"] == round(raw["bench"][0]["avg_ts"], 2)
    assert val.bench_result(raw, "pp")["available"] is False  # a tg-only run has no pp row
    for source in ("rapl", "gpu_power"):  # read for real: either counters or the reason they are missing
        assert raw[source].get("available") is True or raw[source]["reason"]


def test_the_helper_reports_a_failing_bench_with_its_exit_status():
    raw = _helper("--", sys.executable, "-c", "import sys; sys.stderr.write('error: unknown argument: -xyz'); sys.exit(1)")
    result = val.bench_result(raw, "tg")
    assert result["available"] is False and "exited 1" in result["reason"] and "-xyz" in result["reason"]


# ------------------------------------------------------------------------------------ meaning, seeds, report

def test_tiny_models_are_marked_not_meaningful():
    assert val.model_meaning(15368544, "/srv/models/tiny-deepseek2/tiny-deepseek2.gguf", 2 ** 30, "^tiny-")[
        "meaningful"] is False
    small = val.model_meaning(300 * 2 ** 20, "/srv/models/x/small.gguf", 2 ** 30, "^tiny-")
    assert small["meaningful"] is False and "300.0 MiB" in small["reason"]
    assert val.model_meaning(355 * GB, "/srv/models/R1/DeepSeek-R1-IQ4_XS-00001-of-00010.gguf", 2 ** 30,
                             "^tiny-")["meaningful"] is True


def _seed_table():
    return yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__validate_seed_figures_builtin"]


def test_seed_figures_are_keyed_by_profile_and_model():
    seeds = val.seed_figures(_seed_table(), GENOA_4090["name"],
                             "/srv/models/DeepSeek-R1-IQ4_XS/DeepSeek-R1-IQ4_XS-00001-of-00010.gguf")
    assert seeds["available"] is True
    assert [(e["engine"], e["pp_tps"], e["tg_tps"]) for e in seeds["entries"]] == [("ik_llama.cpp", 295, 15.8)]
    qwen = val.seed_figures(_seed_table(), GENOA_5090["name"],
                            "/srv/models/Qwen3-235B-A22B-Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00001-of-00005.gguf")
    assert [(e["pp_tps"], e["tg_tps"]) for e in qwen["entries"]] == [(510, 26.4)]
    milan = val.seed_figures(_seed_table(), MILAN_4X4090["name"], "DeepSeek-R1-Q4_K_M-00001-of-00009.gguf")
    assert [e["tg_tps"] for e in milan["entries"]] == [9.2]
    assert val.seed_figures(_seed_table(), TWIN["name"], "tiny-deepseek2.gguf")["available"] is False


def _leaves_are_filled(node, path="report"):
    """Every leaf is a value; a missing one is {"available": False, "reason": non-empty text}."""
    if isinstance(node, dict):
        if node.get("available") is False:
            assert isinstance(node.get("reason"), str) and node["reason"], path
        for key, value in node.items():
            _leaves_are_filled(value, "%s.%s" % (path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _leaves_are_filled(value, "%s[%d]" % (path, index))
    else:
        assert node is not None, path


def _deployment():
    return {"engine": "ik_llama.cpp", "build": "55d3c05a1b2c-0123abcd", "commit": "55d3c05", "model":
            "/srv/models/DeepSeek-R1-IQ4_XS/DeepSeek-R1-IQ4_XS-00001-of-00010.gguf", "total_bytes": 355 * GB,
            "architecture": "deepseek2", "expert_count": 256, "expert_used_count": 8,
            "expert_bytes": r1_iq4_xs_expert_bytes(), "cpu_expert_layers": list(range(4, 61)),
            "argv": TWIN_SERVER_ARGV, "port": 8080, "threads": 32}


def test_a_full_report_on_genoa_has_every_field_filled_and_the_seed_beside_it():
    tg_raw = {"rc": 0, "seconds": 60.0, "command": ["llama-bench"],
              "bench": [{"n_prompt": 0, "n_gen": 128, "avg_ts": 15.1, "stddev_ts": 0.2, "samples_ts": [15.0, 15.2]}],
              "rapl": {"available": True, "seconds": 60.0, "domains": [
                  {"zone": "intel-rapl:0", "name": "package-0", "energy_uj": 0, "energy_uj_after": 18_000_000_000,
                   "max_energy_range_uj": 262143328850}]},
              "gpu_power": {"available": True, "raw": "0, 120.0\n0, 140.0\n", "stderr": ""}}
    pp_raw = {"rc": 0, "seconds": 90.0, "command": ["llama-bench"], "bench": [{"n_prompt": 2048, "n_gen": 0, "avg_ts": 280.0, "stddev_ts": 3.0,
                                                                               "samples_ts": [277.0, 283.0]}]}
    inputs = {"host": "epyc-node", "hardware": GENOA_4090, "deployment": _deployment(),
              "health": {"status": 200, "json": {"status": "ok"}},
              "completion": {"status": 200, "json": {"choices": [{"text": " Paris."}],
                                                     "usage": {"prompt_tokens": 6, "completion_tokens": 3},
                                                     "timings": {"prompt_per_second": 40.0, "predicted_per_second": 14.9,
                                                                 "prompt_n": 6, "predicted_n": 3}}},
              "bench": val.bench_argv(TWIN_SERVER_ARGV, IK_BENCH_HELP, BENCH), "bench_pp": pp_raw, "bench_tg": tg_raw,
              "service_stopped": True,
              "membw": {"rc": 0, "stdout": json.dumps({"read_gbps": 361.5, "triad_gbps": 330.2, "threads": 32,
                                                       "array_mib": 1024, "runs": 5})},
              "seeds": val.seed_figures(_seed_table(), GENOA_4090["name"], _deployment()["model"]),
              "min_meaningful_bytes": 2 ** 30, "tiny_pattern": "^tiny-"}
    rep = val.report(inputs)
    _leaves_are_filled(rep)
    assert rep["model"]["numbers_meaningful"] is True
    assert rep["bench"]["tg"]["tps"] == 15.1 and rep["bench"]["pp"]["tps"] == 280.0
    assert rep["memory_bandwidth"]["theoretical"]["gbps"] == 460.8
    assert rep["memory_bandwidth"]["measured_fraction_of_theoretical"] == pytest.approx(361.5 / 460.8, abs=1e-4)
    assert rep["roofline"]["gb_per_token"] == pytest.approx(10.8, rel=0.015)
    assert rep["roofline"]["efficiency_vs_theoretical"] == pytest.approx(15.1 / rep["roofline"][
        "ceiling_tps_at_theoretical_bandwidth"], abs=1e-3)
    assert rep["power"]["cpu_package"]["average_watts"] == 300.0
    assert rep["power"]["gpu_board"]["average_watts"] == 130.0
    assert rep["power"]["tokens_per_joule"]["value"] == pytest.approx(15.1 / 430.0, abs=1e-4)
    assert rep["published"]["entries"][0]["tg_tps"] == 15.8
    page = val.report_markdown(rep)
    assert "| llama-bench tg | tg128: 15.10 +/- 0.20 tok/s |" in page
    assert "| this node | ik_llama.cpp | 280.0 | 15.1 |" in page
    assert "Not meaningful" not in page


def test_a_report_where_nothing_could_be_measured_still_fills_every_field_with_reasons():
    skip = {"skipped": True, "skip_reason": "check mode: the bench would stop the service"}
    inputs = {"host": "epyc-node", "hardware": {"name": "odd", "cpu": {}, "memory": {}},
              "deployment": {"engine": "ktransformers", "build": "kt-1", "commit": "", "model": "/m/tiny-x.gguf",
                             "total_bytes": 10, "architecture": "llama", "expert_count": 0, "expert_used_count": 0,
                             "expert_bytes": {}},
              "health": {"status": -1, "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111]>"},
              "completion": {"status": -1, "json": {}, "msg": "connection refused"},
              "bench": {}, "bench_pp": skip, "bench_tg": skip, "service_stopped": False,
              "membw": {"skipped": True, "skip_reason": "validate_membw is false"},
              "seeds": val.seed_figures([], "odd", "/m/tiny-x.gguf"), "min_meaningful_bytes": 2 ** 30,
              "tiny_pattern": "^tiny-"}
    rep = val.report(inputs)
    _leaves_are_filled(rep)
    assert rep["health"]["reason"].startswith("Status code was -1")
    assert rep["bench"]["tg"]["reason"] == "check mode: the bench would stop the service"
    assert rep["roofline"]["available"] is False and "MoE" in rep["roofline"]["reason"]
    assert rep["power"]["cpu_package"]["reason"] == "check mode: the bench would stop the service"
    assert "Not meaningful" in val.report_markdown(rep)


# ------------------------------------------------------------------------------------ the probe and the role

@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_the_membw_probe_compiles_cleanly_and_prints_its_json(tmp_path):
    binary = tmp_path / "hmk-membw"
    build = subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-o",
                            str(binary), str(ROLE / "files" / "hmk-membw.c")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert build.returncode == 0, build.stdout
    run = subprocess.run([str(binary), "16", "2"], stdout=subprocess.PIPE, universal_newlines=True, check=True,
                         env={"OMP_NUM_THREADS": "1"})
    data = json.loads(run.stdout)
    assert data["threads"] == 1 and data["array_mib"] == 16 and data["runs"] == 2
    assert data["read_gbps"] > 0 and data["triad_gbps"] > 0
    bad = subprocess.run([str(binary), "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert bad.returncode == 2 and "positive integer" in bad.stderr


def test_every_default_is_documented_and_every_documented_option_has_a_default():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert all(name.startswith("validate_") for name in defaults)
    assert options["validate_api_key"].get("no_log") is True
