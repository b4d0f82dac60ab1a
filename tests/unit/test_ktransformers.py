"""Unit tests of KTransformers 0.7.x in the kit: plugins/filter/ktransformers_build.py (guardrails, kt-kernel's
build environment per CPU class, the build plan and key, the post-build proof) and the sglang-kt command that
plugins/filter/inference_service.py renders for the seed profiles.

CPU flag lines: the seed CPUs' (test_engine_build.py) and this bed's AMX Xeon
(tests/fixtures/hardware/own/cpuinfo-flags--bed-xeon-amx.txt). Flags and environment names were checked
against kt-kernel/setup.py at 95009ea6 and sglang-kt's server_args.py.
"""
import importlib.util
import os

import pytest
import yaml

from test_engine_build import GENERIC_FLAGS, GENOA_4090, GENOA_5090, LAB_TWIN, MILAN_4X4090, ZEN3_FLAGS, ZEN4_FLAGS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GB = 1000 ** 3


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kt = _load("ktransformers_build_filters_kt", "plugins/filter/ktransformers_build.py")
svc = _load("inference_service_filters_kt", "plugins/filter/inference_service.py")
with open(os.path.join(ROOT, "tests/fixtures/hardware/own/cpuinfo-flags--bed-xeon-amx.txt")) as _h:
    XEON_AMX_FLAGS = _h.read()
with open(os.path.join(ROOT, "roles/ktransformers_build/defaults/main.yml")) as _h:
    DEFAULTS = yaml.safe_load(_h)
with open(os.path.join(ROOT, "roles/ktransformers_build/vars/main.yml")) as _h:
    SERVICE_FLAGS = yaml.safe_load(_h)["__ktransformers_build_service_flags"]
PIN = "95009ea6856c0799e517e93cb12be5e8494bc7ce"


def request(**kwargs):
    """Genoa (32 cores, 1 NUMA node, 576 GB) + RTX 5090 serving R1 in AMXINT4, converted weights present."""
    base = {"commit": PIN, "cpu_flags": ZEN4_FLAGS, "cpu_instruct": "auto", "enable_amx": "auto", "method": "AMXINT4",
            "threads": 32, "physical_cores": 32, "threadpool_count": 1, "numa_nodes": 1,
            "weight_path": "/srv/models/DeepSeek-R1-AMXINT4", "weight_kind": "safetensors", "weight_bytes": 330 * GB,
            "model_arch": "deepseek_v3", "mem_total_bytes": 576 * GB, "gpu_archs": ["120"], "gpu_count": 1,
            "cuda_version": "12.8", "attention_backend": "flashinfer", "serve": True}
    base.update(kwargs)
    return base


def refused(reasons, text):
    return any(text in r for r in reasons)


# --- defaults ------------------------------------------------------------------------------------------

def test_default_pin_is_the_checked_commit():
    assert DEFAULTS["ktransformers_build_version"] == PIN
    assert DEFAULTS["ktransformers_build_cuda_series"] == "12.8"
    assert "libhwloc-dev" in DEFAULTS["ktransformers_build_packages"]


# --- CPU class ------------------------------------------------------------------------------------------

def test_cpu_instruct_is_native_on_zen4_and_avx2_on_zen3():
    assert kt.cpu_instruct(ZEN4_FLAGS) == "NATIVE"
    assert kt.cpu_instruct(ZEN3_FLAGS) == "AVX2"
    assert kt.cpu_instruct(ZEN4_FLAGS, "AVX512") == "AVX512"
    assert kt.cpu_instruct(ZEN4_FLAGS, "AVX2") == "AVX2"


@pytest.mark.parametrize("override", ["AVX512", "FANCY"])
def test_avx512_builds_are_refused_on_zen3(override):
    with pytest.raises(kt.AnsibleFilterError, match="SIGILL"):
        kt.cpu_instruct(ZEN3_FLAGS, override)


def test_a_cpu_without_avx2_is_refused():
    with pytest.raises(kt.AnsibleFilterError, match="AVX2"):
        kt.cpu_instruct(GENERIC_FLAGS)


def test_amx_only_where_the_cpu_has_all_three_flags():
    assert kt.enable_amx(ZEN4_FLAGS) == "OFF"
    assert kt.enable_amx(ZEN3_FLAGS) == "OFF"
    assert kt.enable_amx(XEON_AMX_FLAGS) == "ON"
    assert kt.enable_amx(XEON_AMX_FLAGS, "off") == "OFF"
    with pytest.raises(kt.AnsibleFilterError, match="amx_tile"):
        kt.enable_amx(ZEN4_FLAGS, "on")


def test_toolkit_by_series():
    assert kt.cuda_series_home("12.8") == "/usr/local/cuda-12.8"
    assert kt.cuda_series_home("13.0.2") == "/usr/local/cuda-13.0"
    with pytest.raises(kt.AnsibleFilterError):
        kt.cuda_series_home("latest")


# --- guardrails ---------------------------------------------------------------------------------------

def test_genoa_5090_r1_amxint4_passes():
    assert kt.guardrails(request()) == []


@pytest.mark.parametrize("method", ["AMXINT4", "AMXINT8"])
def test_milan_refuses_amx_methods(method):
    reasons = kt.guardrails(request(cpu_flags=ZEN3_FLAGS, method=method, physical_cores=64, threads=64,
                                    gpu_archs=["89"], gpu_count=4, tensor_parallel_size=4, mem_total_bytes=512 * GB))
    assert refused(reasons, "AVX-512/AMX kernels")


@pytest.mark.parametrize("method,kind", [("FP8", "safetensors"), ("BF16", "safetensors"), ("LLAMAFILE", "gguf")])
def test_milan_serves_the_avx2_methods(method, kind):
    assert kt.guardrails(request(cpu_flags=ZEN3_FLAGS, method=method, weight_kind=kind, weight_bytes=300 * GB,
                                 physical_cores=64, threads=64, gpu_archs=["89"], gpu_count=4,
                                 tensor_parallel_size=4, mem_total_bytes=512 * GB)) == []


def test_threads_must_be_the_physical_cores():
    assert refused(kt.guardrails(request(threads=64)), "SMT siblings")
    assert refused(kt.guardrails(request(threads=16)), "physical cores")


def test_threadpool_count_must_be_the_numa_nodes():
    assert refused(kt.guardrails(request(threadpool_count=2)), "NUMA node")
    assert refused(kt.guardrails(request(numa_nodes=4)), "NUMA node")
    assert kt.guardrails(request(threadpool_count=4, numa_nodes=4)) == []


def test_a_missing_or_empty_weight_path_is_refused():
    assert refused(kt.guardrails(request(weight_kind="missing")), "stays off silently")
    assert refused(kt.guardrails(request(weight_path="")), "stays off silently")
    assert refused(kt.guardrails(request(weight_kind="empty")), "neither .safetensors nor .gguf")


def test_the_weight_format_must_fit_the_method():
    assert refused(kt.guardrails(request(method="LLAMAFILE")), "reads GGUF")
    assert refused(kt.guardrails(request(method="FP8", weight_kind="gguf")), "reads safetensors")
    assert refused(kt.guardrails(request(weight_kind="gguf")), "convert_cpu_weights.py")


def test_ram_needed_by_the_method_against_the_nodes_memory():
    # DeepSeek-R1's FP8 folder is ~690 GB: ~760 GB of RAM, more than a 576 GB Genoa has; its INT4 conversion fits.
    r1_fp8 = request(method="FP8", weight_bytes=690 * GB, weight_path="/srv/models/DeepSeek-R1")
    assert refused(kt.guardrails(r1_fp8), "need about 759 GB of RAM and the node has 576 GB")
    assert kt.guardrails(dict(r1_fp8, mem_total_bytes=1024 * GB)) == []
    assert kt.ram_needed_bytes(request()) == int(330 * GB * 1.1)


def test_the_model_architecture_comes_from_the_models_own_files():
    assert kt.arch_family("deepseek_v3") == kt.arch_family("deepseek2") == "deepseek"
    assert kt.arch_family("qwen3_moe") == kt.arch_family("qwen3moe") == "qwen3moe"
    assert refused(kt.guardrails(request(model_arch="llama")), "not one the kit serves")
    assert refused(kt.guardrails(request(model_arch="")), "not one the kit serves")
    mismatch = request(method="LLAMAFILE", weight_kind="gguf", model_arch="qwen3_moe", model_arch_gguf="deepseek2")
    assert refused(kt.guardrails(mismatch), "different models")
    assert kt.guardrails(dict(mismatch, model_arch="deepseek_v3")) == []


def test_every_kt_package_at_the_pins_version():
    assert kt.kt_package_pins(["numpy", "sglang-kt==0.7.2", "kt_kernel==0.7.0"]) == {"sglang-kt": "0.7.2",
                                                                                     "kt-kernel": "0.7.0"}
    reasons = kt.guardrails(request(kt_version="0.7.0", package_versions={"sglang-kt": "0.7.2"}))
    assert refused(reasons, "every kt package must be at the pin's version 0.7.0")
    assert kt.guardrails(request(kt_version="0.7.0", package_versions={"sglang-kt": "0.7.0"})) == []


def test_gpu_architecture_against_the_bundled_kernels():
    assert refused(kt.guardrails(request(attention_backend="fa3")), "sm_80/86/90 only, not sm_120")
    assert refused(kt.guardrails(request(attention_backend="fa3", gpu_archs=["89"])), "not sm_89")
    assert kt.guardrails(request(attention_backend="fa3", gpu_archs=["90"])) == []
    assert refused(kt.guardrails(request(cuda_version="12.6")), "sm_120 (RTX 5090, Blackwell) needs CUDA >= 12.8")
    assert refused(kt.guardrails(request(cuda_version="")), "no CUDA toolkit")


def test_serving_needs_a_gpu_and_enough_of_them():
    assert refused(kt.guardrails(request(gpu_archs=[], gpu_count=0)), "declares none")
    assert kt.guardrails(request(gpu_archs=[], gpu_count=0, serve=False)) == []
    assert refused(kt.guardrails(request(tensor_parallel_size=4)), "exceeds")


def test_the_pin_must_be_a_full_sha():
    assert refused(kt.guardrails(request(commit="v0.7.2")), "full 40-character")
    assert kt.guardrails(request(commit="main", allow_unpinned=True)) == []


# --- build environment, plan, key, proof -----------------------------------------------------------------

def env_for(flags, archs, **kwargs):
    return kt.build_env(dict({"cpu_flags": flags, "gpu_archs": archs, "cuda_home": "/usr/local/cuda-12.8",
                              "jobs": 32, "kt_version": "0.7.0"}, **kwargs))


def test_genoa_5090_env():
    env = env_for(ZEN4_FLAGS, ["120"])
    assert env["CPUINFER_CPU_INSTRUCT"] == "NATIVE"
    assert env["CPUINFER_ENABLE_AMX"] == "OFF"
    assert env["CPUINFER_USE_CUDA"] == "1"
    assert env["CUDA_HOME"] == "/usr/local/cuda-12.8"
    assert env["CPUINFER_CUDA_ARCHS"] == "120"
    assert env["SGLANG_KT_VERSION"] == "0.7.0"
    assert env["CMAKE_ARGS"].split() == ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                                         "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]


def test_milan_4x4090_env():
    env = env_for(ZEN3_FLAGS, ["89"])
    assert (env["CPUINFER_CPU_INSTRUCT"], env["CPUINFER_ENABLE_AMX"], env["CPUINFER_CUDA_ARCHS"]) == ("AVX2", "OFF", "89")


def test_gpu_less_and_amx_envs():
    env = env_for(XEON_AMX_FLAGS, [])
    assert env["CPUINFER_USE_CUDA"] == "0" and "CUDA_HOME" not in env and "CPUINFER_CUDA_ARCHS" not in env
    assert env["CPUINFER_ENABLE_AMX"] == "ON"
    assert "CUDA_COMPILER_LAUNCHER" not in env["CMAKE_ARGS"]


# --- AOCL-BLIS (kt-kernel setup.py: CPUINFER_ENABLE_BLIS -> -DKTRANSFORMERS_CPU_MOE_AMD; CMake's BLIS_ROOT) -----------

AMD = "AuthenticAMD"


def test_aocl_blis_is_off_by_default_and_adds_nothing():
    assert DEFAULTS["ktransformers_build_blas"] == "default" and DEFAULTS["ktransformers_build_blis_root"] == ""
    env = env_for(ZEN4_FLAGS, ["120"], blas=DEFAULTS["ktransformers_build_blas"],
                  blis_root=DEFAULTS["ktransformers_build_blis_root"])
    assert env == env_for(ZEN4_FLAGS, ["120"])
    assert "CPUINFER_ENABLE_BLIS" not in env and "BLIS_ROOT" not in env["CMAKE_ARGS"]


def test_aocl_blis_sets_the_setup_py_switch_and_cmakes_blis_root():
    env = env_for(ZEN4_FLAGS, ["120"], blas="aocl", blis_root="/opt/AMD/aocl/5.1/gcc/")
    assert env["CPUINFER_ENABLE_BLIS"] == "ON"
    assert env["CMAKE_ARGS"].split()[-1] == "-DBLIS_ROOT=/opt/AMD/aocl/5.1/gcc"
    assert "-DCMAKE_C_COMPILER_LAUNCHER=ccache" in env["CMAKE_ARGS"].split()
    bare = env_for(ZEN3_FLAGS, [], blas="aocl", ccache=False)
    assert bare["CPUINFER_ENABLE_BLIS"] == "ON" and "CMAKE_ARGS" not in bare
    # its own build: the key follows the switch
    assert kt.build_key(PIN, plan("p", env=env), "/r") != kt.build_key(PIN, plan("p", env=env_for(ZEN4_FLAGS, ["120"])), "/r")
    with pytest.raises(kt.AnsibleFilterError, match="ktransformers_build_blas must be one of default, aocl"):
        env_for(ZEN4_FLAGS, [], blas="openblas")


def test_aocl_blis_is_refused_off_amd_and_without_the_library():
    good = request(blas="aocl", cpu_vendor=AMD, blis_header=True, blis_library=True)
    assert kt.guardrails(good) == []
    assert refused(kt.guardrails(dict(good, cpu_vendor="GenuineIntel")), "vendor_id is 'GenuineIntel', not AuthenticAMD")
    assert refused(kt.guardrails(dict(good, cpu_vendor="")), "vendor_id is 'unknown'")
    no_lib = kt.guardrails(dict(good, blis_library=False, blis_root="/opt/aocl"))
    assert refused(no_lib, "libblis is not under /opt/aocl") and refused(no_lib, "the kit downloads nothing")
    assert refused(kt.guardrails(dict(good, blis_header=False)), "blis.h is not under /usr/local or /usr")
    # the service's own check (build: false) has no build to judge
    assert kt.guardrails(dict(good, cpu_vendor="GenuineIntel", build=False, cuda_version="")) == []
    assert kt.guardrails(request(cpu_vendor="GenuineIntel")) == []


def test_the_general_moe_methods_need_the_aocl_build_on_x86():
    int8 = request(method="MOE_INT8", blas="aocl", cpu_vendor=AMD, blis_header=True, blis_library=True)
    assert kt.guardrails(int8) == []
    assert refused(kt.guardrails(dict(int8, blas="default")), "set ktransformers_build_blas: aocl")
    assert refused(kt.guardrails(dict(int8, method="MOE_INT4")), "MOE_INT4 exists only in ARM builds")


def test_the_proof_wants_the_aocl_kernel_when_asked():
    good = {"variant": "avx512", "cuda": False, "versions": {"kt-kernel": "0.7.0"}, "moe_kernel": True}
    expect = {"kt_version": "0.7.0", "cpu_instruct": "NATIVE", "cuda": False, "serve": False, "blas": "aocl"}
    assert kt.proof_problems(good, expect) == []
    assert any("Int8_KERNEL_MOE" in p for p in kt.proof_problems(dict(good, moe_kernel=False), expect))
    assert kt.proof_problems(dict(good, moe_kernel=False), dict(expect, blas="default")) == []


def test_the_proof_script_reports_the_moe_kernel():
    with open(os.path.join(ROOT, "roles/ktransformers_build/vars/main.yml")) as handle:
        script = yaml.safe_load(handle)["__ktransformers_build_proof_script"]
    assert 'out["moe_kernel"]' in script and "Int8_KERNEL_MOE" in script


def plan(key="k", serve=True, env=None):
    return kt.build_plan({"root": "/opt/hmk/engines/ktransformers", "key": key, "python": "python3",
                          "torch_spec": "torch==2.9.1", "torch_args": ["--index-url", "https://download.pytorch.org/whl/cu128"],
                          "pip_args": [], "packages": ["numpy>=1.24.0"], "serve": serve,
                          "env": env or env_for(ZEN4_FLAGS, ["120"])})


def test_plan_compiles_kt_kernel_then_installs_torch_and_sglang_kt_from_one_checkout():
    p = plan()
    pip = ["/opt/hmk/engines/ktransformers/builds/k/venv/bin/python", "-m", "pip", "install", "--no-input"]
    assert p["commands"][0] == ["python3", "-m", "venv", "/opt/hmk/engines/ktransformers/builds/k/venv"]
    assert p["commands"][1] == pip + ["numpy>=1.24.0"]
    assert p["commands"][2] == pip + ["--no-build-isolation", "--no-deps", "/opt/hmk/engines/ktransformers/src/kt-kernel"]
    assert p["commands"][3] == pip + ["torch==2.9.1", "--index-url", "https://download.pytorch.org/whl/cu128"]
    assert p["commands"][4] == pip + ["/opt/hmk/engines/ktransformers/src/third_party/sglang/python"]
    assert len(plan(serve=False)["commands"]) == 4


def test_key_follows_the_plan_not_its_own_directory():
    a = kt.build_key(PIN, plan("pending"), "/opt/hmk/engines/ktransformers")
    assert a.startswith("95009ea6856c-")
    assert a == kt.build_key(PIN, plan(a), "/opt/hmk/engines/ktransformers")
    assert a != kt.build_key(PIN, plan("pending", env=env_for(ZEN3_FLAGS, ["89"])), "/opt/hmk/engines/ktransformers")
    newer_nvcc = dict(plan("pending"), toolkit="12.9")
    assert a != kt.build_key(PIN, newer_nvcc, "/opt/hmk/engines/ktransformers")
    with pytest.raises(kt.AnsibleFilterError):
        kt.build_key("95009ea6", plan(), "/opt/hmk/engines/ktransformers")


def test_pins_read_from_the_checkouts_files():
    pyproject = 'dependencies = [\n  # Core dependencies\n  "torch==2.9.1",\n  "safetensors>=0.4.0",\n]\n'
    assert kt.pyproject_pin(pyproject, "torch") == "2.9.1"
    assert kt.pyproject_pin(pyproject, "safetensors") == ""
    assert kt.version_py('"""\nKTransformers version information.\n"""\n\n__version__ = "0.7.0"\n') == "0.7.0"


def test_proof_problems():
    good = {"variant": "avx2", "cuda": False, "versions": {"kt-kernel": "0.7.0"}}
    expect = {"kt_version": "0.7.0", "cpu_instruct": "AVX2", "cuda": False, "serve": False}
    assert kt.proof_problems(good, expect) == []
    assert kt.proof_problems({"error": "ImportError: x"}, expect) == ["import kt_kernel failed: ImportError: x"]
    assert any("not avx2" in p for p in kt.proof_problems(dict(good, variant="avx512_bf16"), expect))
    assert any("sglang-kt is not installed" in p for p in kt.proof_problems(good, dict(expect, serve=True)))
    odd = dict(good, versions={"kt-kernel": "0.7.0", "sglang-kt": "0.0.0.dev0"})
    assert any("sglang-kt is 0.0.0.dev0" in p for p in kt.proof_problems(odd, dict(expect, serve=True)))
    assert any("CUDA" in p for p in kt.proof_problems(good, dict(expect, cuda=True)))


# --- the sglang-kt command per profile -----------------------------------------------------------------

def argv(**kwargs):
    opts = {"model_path": "/srv/models/DeepSeek-R1", "weight_path": "/srv/models/DeepSeek-R1-AMXINT4",
            "method": "AMXINT4", "cpuinfer": 32, "threadpool_count": 1, "num_gpu_experts": 2,
            "attention_backend": "flashinfer", "host": "127.0.0.1", "port": 30000, "accepted": SERVICE_FLAGS}
    opts.update(kwargs)
    return svc.kt_argv(opts)


def test_genoa_5090_r1():
    assert argv() == ["--model-path", "/srv/models/DeepSeek-R1", "--kt-weight-path", "/srv/models/DeepSeek-R1-AMXINT4",
                      "--kt-method", "AMXINT4", "--kt-cpuinfer", "32", "--kt-threadpool-count", "1",
                      "--kt-num-gpu-experts", "2", "--attention-backend", "flashinfer", "--trust-remote-code",
                      "--host", "127.0.0.1", "--port", "30000", "--enable-metrics"]


def test_genoa_5090_qwen3_235b_fp8():
    got = argv(model_path="/srv/models/Qwen3-235B-A22B-FP8", weight_path="/srv/models/Qwen3-235B-A22B-FP8",
               method="fp8", num_gpu_experts=8, served_model_name="qwen3-235b", context_length=32768)
    assert got[:6] == ["--model-path", "/srv/models/Qwen3-235B-A22B-FP8", "--kt-weight-path",
                       "/srv/models/Qwen3-235B-A22B-FP8", "--kt-method", "FP8"]
    assert "--tensor-parallel-size" not in got
    assert got[got.index("--served-model-name") + 1] == "qwen3-235b"
    assert got[got.index("--context-length") + 1] == "32768"


def test_milan_4x4090_tensor_parallel_4_llamafile():
    got = argv(model_path="/srv/models/DeepSeek-R1", weight_path="/srv/models/DeepSeek-R1-Q4_K_M", method="LLAMAFILE",
               cpuinfer=64, threadpool_count=1, tensor_parallel_size=4)
    assert got[got.index("--tensor-parallel-size") + 1] == "4"
    assert got[got.index("--kt-cpuinfer") + 1] == "64"
    assert got[got.index("--host") + 1] == "127.0.0.1"


def test_every_rendered_flag_is_in_the_checked_list():
    got = argv(tensor_parallel_size=4, max_deferred_experts_per_token=2, context_length=8192, mem_fraction_static=0.9,
               served_model_name="x")
    assert [a for a in got if a.startswith("--") and a not in SERVICE_FLAGS] == []
    with pytest.raises(svc.AnsibleFilterError, match="does not list --tensor-parallel-size"):
        argv(tensor_parallel_size=4, accepted=[f for f in SERVICE_FLAGS if f != "--tensor-parallel-size"])


@pytest.mark.parametrize("missing", ["weight_path", "model_path", "method"])
def test_the_command_needs_the_weights_the_model_and_the_method(missing):
    with pytest.raises(svc.AnsibleFilterError, match="sglang-kt needs"):
        argv(**{missing: ""})


def test_no_key_on_the_command_line():
    with pytest.raises(svc.AnsibleFilterError, match="logs its whole ServerArgs"):
        argv(extra=["--api-key", "secret"])


# --- sglang-kt's opt-in expert options (server_args.py of kvcache-ai/sglang 1e098a77, ktransformers' submodule from
# 2026-07-10; the same in kt-kernel/README.md at the pin) ------------------------------------------------------------

NEW_KT_FLAGS = ["--kt-gpu-prefill-token-threshold", "--kt-expert-placement-strategy",
                "--kt-enable-dynamic-expert-update", "--kt-numa-nodes"]


def test_the_expert_options_are_off_by_default():
    with open(os.path.join(ROOT, "roles/inference_service/defaults/main.yml")) as handle:
        service = yaml.safe_load(handle)
    got = argv(gpu_prefill_token_threshold=service["inference_service_kt_gpu_prefill_token_threshold"],
               expert_placement_strategy=service["inference_service_kt_expert_placement_strategy"],
               enable_dynamic_expert_update=service["inference_service_kt_enable_dynamic_expert_update"],
               numa_nodes=service["inference_service_kt_numa_nodes"])
    assert got == argv()
    assert not set(NEW_KT_FLAGS) & set(got)


def test_each_expert_option_is_rendered_when_set():
    got = argv(threadpool_count=2, gpu_prefill_token_threshold=4096, expert_placement_strategy="front-loading",
               enable_dynamic_expert_update=True, numa_nodes=[0, 1])
    assert got[got.index("--kt-gpu-prefill-token-threshold") + 1] == "4096"
    assert got[got.index("--kt-expert-placement-strategy") + 1] == "front-loading"
    assert "--kt-enable-dynamic-expert-update" in got
    # nargs='+': the ids follow the flag as separate arguments, as many as there are thread pools
    assert got[got.index("--kt-numa-nodes"):got.index("--kt-numa-nodes") + 3] == ["--kt-numa-nodes", "0", "1"]
    assert argv(gpu_prefill_token_threshold="1024")[-3:-1] == ["--kt-gpu-prefill-token-threshold", "1024"]
    off = argv(gpu_prefill_token_threshold=1024, enable_dynamic_expert_update="False")
    assert "--kt-enable-dynamic-expert-update" not in off


@pytest.mark.parametrize("opts,message", [
    ({"gpu_prefill_token_threshold": -1}, "must be 0 \\(off\\) or a token count"),
    ({"expert_placement_strategy": "hot"}, "'hot' is not one sglang-kt accepts"),
    ({"enable_dynamic_expert_update": True}, "only --kt-gpu-prefill-token-threshold turns on"),
    ({"numa_nodes": [0, 1]}, "lists 2 node\\(s\\) and --kt-threadpool-count is 1"),
    ({"numa_nodes": [1, 1], "threadpool_count": 2}, "distinct NUMA node ids"),
])
def test_bad_expert_options_are_refused_by_name(opts, message):
    with pytest.raises(svc.AnsibleFilterError, match=message):
        argv(**opts)


def test_the_build_proves_the_expert_options_and_the_service_checks_them():
    llama = _load("llama_build_filters_kt", "plugins/filter/llama_build.py")
    assert set(NEW_KT_FLAGS) <= set(SERVICE_FLAGS)
    # A parser without them (an older sglang-kt) fails the build's proof, naming each.
    old_help = "usage: launch_server.py [--model-path MODEL_PATH] [--kt-weight-path KT_WEIGHT_PATH]\n"
    assert llama.missing_in_help(old_help, NEW_KT_FLAGS) == NEW_KT_FLAGS
    new_help = old_help + ("  --kt-numa-nodes KT_NUMA_NODES [KT_NUMA_NODES ...]\n  --kt-gpu-prefill-token-threshold N\n"
                           "  --kt-enable-dynamic-expert-update\n  --kt-expert-placement-strategy "
                           "{frequency,front-loading,uniform,random}\n")
    assert llama.missing_in_help(new_help, NEW_KT_FLAGS) == []
    # A build recorded with the older list: the service refuses the option instead of passing it blind.
    older = [f for f in SERVICE_FLAGS if f not in NEW_KT_FLAGS]
    with pytest.raises(svc.AnsibleFilterError, match="does not list --kt-numa-nodes"):
        argv(threadpool_count=2, numa_nodes=[0, 1], accepted=older)


def test_the_role_passes_the_expert_options_to_the_argv_builder():
    with open(os.path.join(ROOT, "roles/inference_service/tasks/plan.yml")) as handle:
        tasks = yaml.safe_load(handle)
    rendered = [t for t in tasks if "__inference_service_argv" in str(t.get("ansible.builtin.set_fact", {}))][0]
    opts = rendered["vars"]["__inference_service_kt_opts"]
    for key, var in (("gpu_prefill_token_threshold", "inference_service_kt_gpu_prefill_token_threshold"),
                     ("expert_placement_strategy", "inference_service_kt_expert_placement_strategy"),
                     ("enable_dynamic_expert_update", "inference_service_kt_enable_dynamic_expert_update"),
                     ("numa_nodes", "inference_service_kt_numa_nodes")):
        assert var in opts[key]


def test_lab_twin_profile_declares_no_gpu():
    assert int(LAB_TWIN["gpus"]["count"]) == 0
    assert GENOA_5090["gpus"]["arch"] == "120" and int(MILAN_4X4090["gpus"]["count"]) == 4
    assert GENOA_4090["gpus"]["model"] == "RTX 4090"


# --- the unit -----------------------------------------------------------------------------------------

def test_ktransformers_unit_is_hardened_on_loopback_without_a_key():
    from test_inference_service import render_unit

    unit = render_unit(inference_service_engine="ktransformers",
                       __inference_service_binary="/opt/hmk/engines/ktransformers/current/venv/bin/python")
    assert ("Environment=PATH=/opt/hmk/engines/ktransformers/current/venv/bin:/usr/local/sbin:/usr/local/bin:"
            "/usr/sbin:/usr/bin:/sbin:/bin") in unit
    assert "Environment=HOME=/var/lib/hmk-inference" in unit
    for line in ("IPAddressDeny=any", "IPAddressAllow=localhost", "NoNewPrivileges=true", "ProtectSystem=strict",
                 "CapabilityBoundingSet=",
                 "ExecStart=/usr/local/libexec/hmk/inference-exec --model-check /etc/hmk/hmk-inference.model.json "
                 "/etc/hmk/hmk-inference.args"):
        assert line in unit, line
    # torch, triton and flashinfer generate code at run time
    assert "MemoryDenyWriteExecute=true" not in unit
    assert not any(line.startswith("ExecStartPre=") or "--api-key" in line for line in unit)


# --- model_sync and the safetensors layout -------------------------------------------------------------

def test_safetensors_shards_are_checked_like_gguf_headers(tmp_path):
    import subprocess
    import sys

    from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as ms

    out = tmp_path / "tiny"
    subprocess.run([sys.executable, os.path.join(ROOT, "tests/ktransformers/make_tiny_moe_safetensors.py"), str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    shard = out / "model-00001-of-00002.safetensors"
    assert ms.safetensors_problems(str(shard)) == []
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(shard.read_bytes()[:4096])
    assert "outside the file" in ms.safetensors_problems(str(cut))[0] or "declares" in ms.safetensors_problems(str(cut))[0]
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert "no JSON" in ms.safetensors_problems(str(junk))[0]
