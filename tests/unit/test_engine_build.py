"""Unit tests for the engine build roles' Python pieces:
plugins/filter/llama_build.py (flag derivation, pin check, keys, smoke parsing,
pruning). KTransformers' filter has its own file: tests/unit/test_ktransformers.py.

CPU flags are /proc/cpuinfo lines of the seed CPUs (EPYC 9374F Zen 4, EPYC 7B13 Zen 3) and of this
bed's Xeon; profiles are the inventories' hardware.yml files, read from disk.
"""
import importlib.util
import os

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lb = _load("llama_build_filters", "plugins/filter/llama_build.py")


def _yaml(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _profile(path):
    return _yaml(path)["hmk_hardware"]


LLAMA_DEFAULTS = _yaml("roles/llama_build/defaults/main.yml")
RULES = LLAMA_DEFAULTS["llama_build_cmake_rules"]
FLAG_TABLE = LLAMA_DEFAULTS["llama_build_engine_flags"]

GENOA_4090 = _profile("inventories/production/group_vars/genoa_1gpu/hardware.yml")
MILAN_4X4090 = _profile("inventories/production/group_vars/milan_4gpu/hardware.yml")
LAB_TWIN = _profile("inventories/lab/group_vars/twins/hardware.yml")
GENOA_5090 = dict(GENOA_4090, name="genoa-1x5090",
                  gpus={"count": 1, "model": "RTX 5090", "arch": "120", "vram_gib": 32, "min_link_width": 16})
H200 = dict(GENOA_4090, name="genoa-1xh200", gpus={"count": 1, "model": "H200", "vram_gib": 141})

# /proc/cpuinfo "flags" lines (trimmed of flags that play no role here, kept in real order).
ZEN4_FLAGS = ("flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
              "fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
              "nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 "
              "sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy "
              "abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext perfctr_core perfctr_nb bpext "
              "perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd mba perfmon_v2 ibrs ibpb stibp ibrs_enhanced "
              "vmmcall fsgsbase bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a avx512f avx512dq rdseed adx smap "
              "avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves "
              "cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local avx512_bf16 clzero irperf xsaveerptr rdpru "
              "wbnoinvd amd_ppin cppc arat npt lbrv svm_lock nrip_save tsc_scale vmcb_clean flushbyasid "
              "decodeassists pausefilter pfthreshold avic v_vmsave_vmload vgif x2avic v_spec_ctrl vnmi "
              "avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
              "avx512_vpopcntdq la57 rdpid overflow_recov succor smca fsrm flush_l1d")
ZEN3_FLAGS = ("flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
              "fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
              "nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 "
              "sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy "
              "abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext perfctr_core perfctr_nb bpext "
              "perfctr_llc mwaitx cpb cat_l3 cdp_l3 invpcid_single hw_pstate ssbd mba ibrs ibpb stibp vmmcall "
              "fsgsbase bmi1 avx2 smep bmi2 invpcid cqm rdt_a rdseed adx smap clflushopt clwb sha_ni xsaveopt "
              "xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local clzero irperf "
              "xsaveerptr rdpru wbnoinvd amd_ppin brs arat npt lbrv svm_lock nrip_save tsc_scale vmcb_clean "
              "flushbyasid decodeassists pausefilter pfthreshold v_vmsave_vmload vgif v_spec_ctrl umip pku "
              "ospke vaes vpclmulqdq rdpid overflow_recov succor smca fsrm")
GENERIC_FLAGS = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 sse4_1 sse4_2 popcnt"

AVX512_ARGS = ["-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"]
DATE_55D3C05 = "2026-04-13"


def args_for(profile, flags, date=DATE_55D3C05, **options):
    options.setdefault("rules", RULES)
    return lb.cmake_args(profile, flags, "ik_llama.cpp", date, options)


# --- flag derivation per seed profile -------------------------------------------------------------

def test_genoa_4090_gets_avx512_and_sm89():
    args = args_for(GENOA_4090, ZEN4_FLAGS)
    assert args[:2] == ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
    for arg in AVX512_ARGS:
        assert arg in args
    assert "-DGGML_AVX2=ON" not in args
    assert "-DGGML_CUDA=ON" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=89" in args
    assert "-DBUILD_SHARED_LIBS=OFF" in args and "-DLLAMA_CURL=OFF" in args
    assert "-DGGML_CCACHE=ON" in args
    assert not any("SCHED_MAX_COPIES" in a for a in args)


def test_genoa_5090_gets_sm120():
    args = args_for(GENOA_5090, ZEN4_FLAGS, cuda_version="12.8")
    assert "-DCMAKE_CUDA_ARCHITECTURES=120" in args
    assert "-DGGML_AVX512_BF16=ON" in args


def test_sm120_needs_cuda_12_8():
    with pytest.raises(lb.AnsibleFilterError, match="sm_120 needs CUDA >= 12.8"):
        args_for(GENOA_5090, ZEN4_FLAGS, cuda_version="12.6")
    assert "-DCMAKE_CUDA_ARCHITECTURES=120" in args_for(GENOA_5090, ZEN4_FLAGS, cuda_version="13.0")


def test_milan_4x4090_gets_avx2_sm89_and_no_avx512():
    args = args_for(MILAN_4X4090, ZEN3_FLAGS)
    assert not any("AVX512" in a for a in args)
    assert "-DGGML_AVX2=ON" in args and "-DGGML_FMA=ON" in args and "-DGGML_F16C=ON" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=89" in args
    assert lb.cpu_isa(ZEN3_FLAGS) == "avx2"


def test_h200_is_looked_up_by_model_as_sm90():
    assert "arch" not in H200["gpus"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in args_for(H200, ZEN4_FLAGS)


def test_cpu_only_twin_builds_without_cuda():
    args = args_for(LAB_TWIN, ZEN4_FLAGS, iqk_fa_all_quants=False)
    assert "-DGGML_CUDA=OFF" in args
    assert not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in args)
    assert args[-1] == "-DGGML_IQK_FA_ALL_QUANTS=OFF"


def test_generic_cpu_gets_neither_avx2_nor_avx512():
    args = args_for(LAB_TWIN, GENERIC_FLAGS)
    assert lb.cpu_isa(GENERIC_FLAGS) == "generic"
    assert not any("AVX" in a for a in args)


def test_mixed_gpu_architectures_are_sorted_and_deduplicated():
    profile = dict(GENOA_4090, gpus={"count": 2, "arch": ["sm_120", "89", "89"]})
    assert lb.cuda_architectures(profile) == "89;120"
    assert lb.cuda_architectures(dict(GENOA_4090, gpus={"count": 2, "arch": "120;89"})) == "89;120"


@pytest.mark.parametrize("arch", ["native", "all", "all-major"])
def test_native_cuda_architectures_are_refused(arch):
    with pytest.raises(lb.AnsibleFilterError, match="refused"):
        lb.cuda_architectures(dict(GENOA_4090, gpus={"count": 1, "arch": arch}))
    with pytest.raises(lb.AnsibleFilterError, match="refused"):
        args_for(LAB_TWIN, ZEN4_FLAGS, extra=["-DCMAKE_CUDA_ARCHITECTURES=native"])


def test_unknown_gpu_without_arch_is_an_error():
    with pytest.raises(lb.AnsibleFilterError, match="gpus.arch"):
        lb.cuda_architectures(dict(GENOA_4090, gpus={"count": 1, "model": "Mystery 9000"}))


def test_cuda_forced_on_without_gpus_is_an_error_and_forced_off_wins():
    with pytest.raises(lb.AnsibleFilterError, match="no GPU"):
        args_for(LAB_TWIN, ZEN4_FLAGS, cuda="enabled")
    assert "-DGGML_CUDA=OFF" in args_for(GENOA_4090, ZEN4_FLAGS, cuda="disabled")


def test_extra_args_come_last_and_must_be_defines():
    args = args_for(LAB_TWIN, ZEN4_FLAGS, extra=["-DCMAKE_EXE_LINKER_FLAGS=-Wl,-O1"])
    assert args[-1] == "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-O1"
    with pytest.raises(lb.AnsibleFilterError, match="-DNAME=VALUE"):
        args_for(LAB_TWIN, ZEN4_FLAGS, extra=["--fresh"])


def test_cpu_flags_parse_a_cpuinfo_line_a_string_and_a_list():
    assert "avx512_bf16" in lb.cpu_flags(ZEN4_FLAGS)
    assert "flags" not in lb.cpu_flags(ZEN4_FLAGS)
    assert lb.cpu_flags("avx2 fma") == ["avx2", "fma"]
    assert lb.cpu_flags(["AVX2", "fma", "fma"]) == ["avx2", "fma"]
    assert lb.cpu_flags(None) == []


# --- SCHED_MAX_COPIES by commit date --------------------------------------------------------------

def test_sched_max_copies_before_2025_09_02_on_multi_gpu():
    assert "-DGGML_SCHED_MAX_COPIES=1" in args_for(MILAN_4X4090, ZEN3_FLAGS, date="2025-09-01")


def test_no_sched_max_copies_from_2025_09_02_or_on_one_gpu_or_cpu_only():
    assert "-DGGML_SCHED_MAX_COPIES=1" not in args_for(MILAN_4X4090, ZEN3_FLAGS, date="2025-09-02")
    assert "-DGGML_SCHED_MAX_COPIES=1" not in args_for(GENOA_4090, ZEN4_FLAGS, date="2025-06-01")
    assert "-DGGML_SCHED_MAX_COPIES=1" not in args_for(MILAN_4X4090, ZEN3_FLAGS, date="2025-06-01",
                                                       cuda="disabled")


def test_sched_rule_is_ik_only():
    args = lb.cmake_args(MILAN_4X4090, ZEN3_FLAGS, "llama.cpp", "2025-06-01", {"rules": RULES})
    assert "-DGGML_SCHED_MAX_COPIES=1" not in args
    assert not any("IQK" in a for a in lb.cmake_args(LAB_TWIN, ZEN4_FLAGS, "llama.cpp", "2025-06-01",
                                                     {"iqk_fa_all_quants": False}))


def test_bad_commit_date_and_engine_are_refused():
    with pytest.raises(lb.AnsibleFilterError, match="YYYY-MM-DD"):
        args_for(LAB_TWIN, ZEN4_FLAGS, date="")
    with pytest.raises(lb.AnsibleFilterError, match="unknown engine"):
        lb.cmake_args(LAB_TWIN, ZEN4_FLAGS, "vllm", DATE_55D3C05, {})


# --- pins and keys --------------------------------------------------------------------------------

def test_full_sha_pin_is_accepted():
    assert lb.check_pin("55d3c05bf7b377deaa5dc84d255d9740a345a206") is True
    assert lb.check_pin(LLAMA_DEFAULTS["llama_build_version"]) is True


@pytest.mark.parametrize("version", ["55d3c05", "main", "b4810", "v0.2.4", "",
                                     "55D3C05BF7B377DEAA5DC84D255D9740A345A206",
                                     "55d3c05bf7b377deaa5dc84d255d9740a345a20"])
def test_short_sha_branch_or_tag_is_refused_unless_allowed(version):
    with pytest.raises(lb.AnsibleFilterError, match="full 40-character"):
        lb.check_pin(version)
    if version:
        assert lb.check_pin(version, allow_unpinned=True) is True


def test_argument_spec_and_defaults_agree_on_the_pin():
    spec = _yaml("roles/llama_build/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert spec["llama_build_version"]["default"] == LLAMA_DEFAULTS["llama_build_version"]
    # issue 25: the pin moved from 55d3c05 (2026-04-13, the PyPI sdist's) to 8337e4cd (2026-08-15)
    assert LLAMA_DEFAULTS["llama_build_version"] == "8337e4cd3861406fc04e0854b1409cd1b027fbc9"
    assert "8337e4cd3861406fc04e0854b1409cd1b027fbc9" in [
        str(pin).split()[0] for pin in FLAG_TABLE["ik_llama.cpp"][0]["pins_checked"]]
    assert set(spec) >= set(LLAMA_DEFAULTS)


def test_build_key_changes_with_commit_flags_and_targets_only():
    sha = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
    args = args_for(GENOA_4090, ZEN4_FLAGS)
    key = lb.build_key(sha, args, ["llama-server", "llama-bench"], "ik_llama.cpp")
    assert key.startswith("55d3c05bf7b3-") and len(key) == 21
    assert key == lb.build_key(sha, list(args), ["llama-bench", "llama-server"], "ik_llama.cpp")
    assert key != lb.build_key(sha, args + ["-DCMAKE_EXE_LINKER_FLAGS=-Wl,-O1"],
                               ["llama-server", "llama-bench"], "ik_llama.cpp")
    assert key != lb.build_key(sha, args, ["llama-server"], "ik_llama.cpp")
    assert key != lb.build_key("8337e4cd3861406fc04e0854b1409cd1b027fbc9", args,
                               ["llama-server", "llama-bench"], "ik_llama.cpp")
    with pytest.raises(lb.AnsibleFilterError):
        lb.build_key("55d3c05", args)


# --- engine flag table and smoke-check parsing ----------------------------------------------------

def test_flag_table_for_55d3c05_has_fa_with_value_and_no_fmoe():
    entry = lb.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", DATE_55D3C05)
    argv = lb.flag_argv(entry)
    assert argv[argv.index("-fa") + 1] == "on"
    assert "-fmoe" not in argv and "-fmoe" in entry["rejected"]
    for flag in ("-mla", "-amb", "-ot", "-ctk", "-ctv", "--metrics", "--api-key", "--numa"):
        assert flag in argv
    assert "-ot" not in lb.help_flags(entry)   # ik accepts -ot but does not list it in --help
    assert "--metrics" in lb.help_flags(entry)


def test_flag_table_before_2025_10_25_has_bare_fa_and_fmoe():
    entry = lb.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", "2025-08-01")
    argv = lb.flag_argv(entry)
    assert "-fmoe" in argv
    assert argv[argv.index("-fa") + 1].startswith("-")


def test_flag_table_mainline_has_no_mla():
    entry = lb.engine_flag_set(FLAG_TABLE, "llama.cpp", "2026-10-01")
    assert "-mla" not in lb.flag_argv(entry) and "-mla" in entry["rejected"]


def test_flag_table_ranges_do_not_overlap_or_leave_gaps_since_april_2025():
    for day in ("2025-04-02", "2025-10-24", "2025-10-25", "2025-11-12", "2025-11-13", "2026-11-30"):
        lb.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", day)
    with pytest.raises(lb.AnsibleFilterError, match="0 entries"):
        lb.engine_flag_set(FLAG_TABLE, "ik_llama.cpp", "2024-12-01")


def test_version_commit_is_read_from_version_output():
    out = "version: 4411 (55d3c05)\nbuilt with cc (Debian 12.2.0-14+deb12u1) 12.2.0 for x86_64-linux-gnu\n"
    assert lb.version_commit(out) == "55d3c05"
    assert lb.version_commit("version: 1 (unknown)") == ""


def test_parse_errors_spot_refused_flags_only():
    assert lb.parse_errors("error: unknown argument: -fmoe\n") == ["error: unknown argument: -fmoe"]
    assert lb.parse_errors("error: invalid parameter for argument: -fa") != []
    loaded = ("llama_model_load: error loading model: llama_model_loader: failed to load model from "
              "/nonexistent/hmk-dry-parse.gguf\nmain: error: unable to load model\n")
    assert lb.parse_errors(loaded) == []


def test_missing_in_help_matches_whole_flags():
    text = "  -fa,   --flash-attn on|off  \n  -mla N\n  --metrics     enable\n  -ctk, --cache-type-k TYPE\n"
    assert lb.missing_in_help(text, ["-fa", "-mla", "--metrics", "-ctk"]) == []
    assert lb.missing_in_help(text, ["-fmoe", "-ml", "-c"]) == ["-fmoe", "-ml", "-c"]


def test_prune_keeps_the_newest_and_the_protected():
    builds = [{"path": "/b/a", "mtime": 1}, {"path": "/b/b", "mtime": 2}, {"path": "/b/c", "mtime": 3},
              {"path": "/b/d", "mtime": 4}, {"path": "/b/e", "mtime": 5}]
    assert lb.builds_to_prune(builds, 3) == ["a", "b"]
    assert lb.builds_to_prune(builds, 3, ["a"]) == ["b"]
    assert lb.builds_to_prune(builds, 0) == ["a", "b", "c", "d"]
    assert lb.builds_to_prune({"x": 1}, 3) == []
