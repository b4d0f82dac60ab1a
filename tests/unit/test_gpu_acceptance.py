"""tests/gpu/acceptance.sh off a GPU: what this machine can check of it. The script itself runs on a machine with an
NVIDIA GPU (tests/gpu/README.md); here: it stops with a clear FAIL and a result file where there is no GPU, and the
kit code it calls on the GPU machine (tests/gpu/acceptance_helper.py) plans, renders and judges correctly."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "acceptance.sh"
HELPER = REPO / "tests" / "gpu" / "acceptance_helper.py"
LOGS = REPO / "tests" / "fixtures" / "engine-logs"


def kit_data(path):
    """What scripts/make-gpu-bundle writes as kit-data.json."""
    defaults = yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml").read_text())
    path.write_text(json.dumps({"commit_date": "2026-04-13", "cmake_rules": defaults["llama_build_cmake_rules"],
                                "engine_flags": defaults["llama_build_engine_flags"]}))


def helper(*args):
    out = subprocess.run([sys.executable, str(HELPER)] + [str(a) for a in args], capture_output=True, text=True, check=False)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else out.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-deepseek2.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make-tiny-moe-gguf"), "--arch", "deepseek2", "-o", str(path)],
                   check=True, capture_output=True)
    return path


def test_without_a_gpu_the_script_fails_at_the_gpu_step_and_writes_its_result(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name in ("ik_llama.cpp.tar.xz", "cmake.tar.xz", "tiny-deepseek2.gguf", "kit-data.json"):
        (bundle / name).write_text(name)
    subprocess.run("sha256sum * > SHA256SUMS", shell=True, cwd=bundle, check=True)
    env = dict(os.environ, PATH="/usr/bin:/bin")  # no nvidia-smi on this machine kind
    run = subprocess.run(["bash", str(SCRIPT), str(bundle), str(tmp_path / "out")], capture_output=True, text=True,
                         env=env, timeout=120, check=False)
    assert run.returncode == 1
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["result"] == "FAIL"
    assert [(s["step"], s["status"]) for s in result["steps"]] == [("bundle", "PASS"), ("gpu", "FAIL")]
    assert "nvidia-smi is not installed" in result["steps"][1]["detail"]
    assert "gpu      FAIL" in run.stdout and "RESULT FAIL" in run.stdout


def test_a_bundle_that_does_not_match_its_sums_is_refused(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "kit-data.json").write_text("{}")
    subprocess.run("sha256sum * > SHA256SUMS", shell=True, cwd=bundle, check=True)
    (bundle / "kit-data.json").write_text('{"changed": true}')
    run = subprocess.run(["bash", str(SCRIPT), str(bundle), str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 1 and "bundle   FAIL" in run.stdout and "make gpu-bundle" in run.stdout


def test_the_plan_puts_all_moe_layers_but_the_last_on_the_gpu_and_renders_the_role_argv(tmp_path, tiny):
    kit_data(tmp_path / "kit-data.json")
    rc, out = helper("plan", tmp_path, tiny, 143771, 18549, tmp_path / "plan.json")
    assert rc == 0, out
    assert out["rules"] == [r"blk\.(1|2)\.ffn_.*_exps=CUDA0", "exps=CPU"]
    argv = out["argv"]
    assert argv[argv.index("-mla") + 1] == "3" and argv[argv.index("-fa") + 1] == "on"
    assert argv[argv.index("--port") + 1] == "18549" and "-ts" not in argv  # one GPU: no split to pin
    record = json.loads((tmp_path / "plan.json").read_text())
    assert record["plan"]["cpu_layers"] == [3] and record["plan"]["gpus"][0]["block"] == [0, 3]


def test_the_cmake_flags_are_the_roles_for_this_gpu_with_the_small_kernel_set(tmp_path):
    kit_data(tmp_path / "kit-data.json")
    rc, out = helper("cmake-args", tmp_path, "90", "12.8")
    assert rc == 0, out
    args = out["args"]
    for arg in ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_CUDA_FA_ALL_QUANTS=OFF",
                "-DGGML_IQK_FA_ALL_QUANTS=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF"):
        assert arg in args
    rc, out = helper("cmake-args", tmp_path, "120", "12.4")   # an RTX 5090 needs CUDA 12.8
    assert rc == 1 and "12.8" in str(out)


def test_the_toolkit_check_uses_the_driver_table():
    assert helper("toolkit", "12.8", "570.124.06")[0] == 0
    rc, out = helper("toolkit", "13.0", "570.124.06")
    assert rc == 1 and out["driver_minimum"].startswith("580")


def test_the_proof_step_fails_with_the_reason_on_a_log_without_cuda(tmp_path, tiny):
    kit_data(tmp_path / "kit-data.json")
    helper("plan", tmp_path, tiny, 24564, 18549, tmp_path / "plan.json")
    (tmp_path / "gpus.csv").write_text("")
    (tmp_path / "apps.csv").write_text("")
    rc, out = helper("proof", tmp_path / "plan.json", LOGS / "mainline--no-cuda-devices-issue6184.log",
                     tmp_path / "gpus.csv", tmp_path / "apps.csv", 4242)
    assert rc == 1 and out["cpu_only"]
    assert any(line.startswith("cuda_devices: found the engine found no CUDA device") for line in out["summary"])


def _instance_tree(root):
    """A source tree with the shapes of ik_llama.cpp's per-type kernel files (one, two or no DECL_MMQ_CASE)."""
    cuda = root / "ggml" / "src" / "ggml-cuda"
    (cuda / "template-instances").mkdir(parents=True)
    (cuda / "mmq.cuh").write_text("#define DECL_MMQ_CASE(type)                                     \\\n"
                                  "    template void mul_mat_q_case<type>(ggml_backend_cuda_context & ctx, "
                                  "const mmq_args & args, cudaStream_t stream) \\\n")
    (cuda / "mmq_id_common.cuh").write_text("#define DECL_MMQ_CASE(type) \\\n    template void mul_mat_q_case_id<type>("
                                            "ggml_backend_cuda_context & ctx, const mmq_args_id & args, cudaStream_t stream) \\\n")
    files = {
        "mmq-instance-q8_0.cu": '#include "../mmq.cuh"\n\nDECL_MMQ_CASE(GGML_TYPE_Q8_0);\n',
        "mmq-instance-q4_0.cu": '#include "../mmq.cuh"\n\nDECL_MMQ_CASE(GGML_TYPE_Q4_0);\n',
        "mmq-instance-iq4_nl.cu": '#include "../mmq.cuh"\n\nDECL_MMQ_CASE(GGML_TYPE_IQ4_NL);\nDECL_MMQ_CASE(GGML_TYPE_MXFP4);\n',
        "mmq-instance-iq2_k_id.cu": '#include "../mmq_id_common.cuh"\nstatic int load() { return 0; }\n'
                                    'DECL_MMQ_CASE(GGML_TYPE_IQ2_K);\n',
        "mmvq-instance-q8_0.cu": '#include "../mmvq-templates.cuh"\n\nvoid mul_mat_vec_q8_0_q8_1_cuda(const mmvq_args & args, '
                                 'cudaStream_t stream) {\n    mul_mat_vec_q_cuda<GGML_TYPE_Q8_0>(args, stream);\n}\n',
        "mmvq-instance-iq2_k.cu": '#include "../iqk_mmvq_templates.cuh"\n__device__ void vec_dot_iq2_k_q8_1() {}\n'
                                  'void mul_mat_vec_iq2_k_q8_1_cuda(const mmvq_args & args, cudaStream_t stream) {\n'
                                  '    iqk_mul_mat_vec_q_cuda<GGML_TYPE_IQ2_K, 4, vec_dot_iq2_k_q8_1>(args, stream);\n}\n',
        "mmvq-instance-odd.cu": "void a_helper() {}\n",
        "fattn-vec-f16-instance-hs128-q8_0-q8_0.cu": "// FlashAttention: never trimmed\n",
    }
    for name, text in files.items():
        (cuda / "template-instances" / name).write_text(text)
    return cuda / "template-instances", files


def test_trim_kernels_stubs_the_matrix_kernels_of_types_the_model_lacks_and_keeps_its_own(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    kit_data(bundle / "kit-data.json")
    data = json.loads((bundle / "kit-data.json").read_text())
    data["model_tensor_types"] = ["F32", "Q8_0"]
    (bundle / "kit-data.json").write_text(json.dumps(data))
    instances, files = _instance_tree(tmp_path / "src")
    rc, out = helper("trim-kernels", tmp_path / "src", bundle)
    assert rc == 0 and out["ok"], out
    assert out["compiled"] == ["mmq-instance-q8_0.cu", "mmvq-instance-q8_0.cu"]
    assert out["stubbed"] == 4 and list(out["unrecognised"]) == ["mmvq-instance-odd.cu"]
    for kept in ("mmq-instance-q8_0.cu", "mmvq-instance-q8_0.cu", "mmvq-instance-odd.cu", "fattn-vec-f16-instance-hs128-q8_0-q8_0.cu"):
        assert (instances / kept).read_text() == files[kept]
    # Each stub defines exactly what the file exported (the same template specialisation or function, so the
    # link finds it) and aborts naming the type; none instantiates a kernel.
    q4 = (instances / "mmq-instance-q4_0.cu").read_text()
    assert "template <> void mul_mat_q_case<GGML_TYPE_Q4_0>(ggml_backend_cuda_context &, const mmq_args &, cudaStream_t)" in q4
    assert 'GGML_ABORT("hybrid-moe-kit GPU acceptance build: no MMQ kernel for GGML_TYPE_Q4_0")' in q4
    assert "mmq.cuh" not in q4 and "struct mmq_args;" in q4
    pair = (instances / "mmq-instance-iq4_nl.cu").read_text()
    assert "mul_mat_q_case<GGML_TYPE_IQ4_NL>" in pair and "mul_mat_q_case<GGML_TYPE_MXFP4>" in pair
    ident = (instances / "mmq-instance-iq2_k_id.cu").read_text()
    assert "mul_mat_q_case_id<GGML_TYPE_IQ2_K>(ggml_backend_cuda_context &, const mmq_args_id &, cudaStream_t)" in ident
    assert "load()" not in ident
    mmvq = (instances / "mmvq-instance-iq2_k.cu").read_text()
    assert "void mul_mat_vec_iq2_k_q8_1_cuda(const mmvq_args &, cudaStream_t) {" in mmvq
    assert "iqk_mmvq_templates" not in mmvq and "no MMVQ kernel for GGML_TYPE_IQ2_K" in mmvq


def test_trim_kernels_refuses_a_bundle_without_the_models_types(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    kit_data(bundle / "kit-data.json")
    instances, files = _instance_tree(tmp_path / "src")
    rc, out = helper("trim-kernels", tmp_path / "src", bundle)
    assert rc == 1 and "model_tensor_types" in out["error"]
    assert (instances / "mmq-instance-q4_0.cu").read_text() == files["mmq-instance-q4_0.cu"]
