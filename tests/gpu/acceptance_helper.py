"""The kit's own Python for tests/gpu/acceptance.sh: every judgement the acceptance makes on the GPU machine is
made by the code the roles run (plugins/), not re-implemented in shell. Needs only python3 (no Ansible, no
PyYAML: the role data it needs comes as JSON in the bundle, written by scripts/make-gpu-bundle).

  acceptance_helper.py devices                       /proc/devices and /dev/nvidia-uvm, as the unit needs them
  acceptance_helper.py toolkit NVCC_RELEASE DRIVER   the toolkit runs on the driver (nvidia_driver's table)
  acceptance_helper.py cmake-args BUNDLE ARCH CUDA   llama_build's cmake flags for this GPU, plus the small kernel set
  acceptance_helper.py plan BUNDLE MODEL VRAM_MIB PORT OUT.json   the placement plan and the engine's argv
  acceptance_helper.py proof PLAN.json LOG SMI_GPUS SMI_APPS PID  the health gate's proof on the real log
  acceptance_helper.py power BENCH.json              validate's GPU power reading of a bench run
  acceptance_helper.py trim-kernels SRC BUNDLE       MMQ/MMVQ kernels for quant types the tiny model lacks -> stubs
Each prints one JSON object; the exit status is 0 when the step passes.
"""
import importlib.util
import json
import os
import re
import sys

KIT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(KIT, ".collections"))

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_log, hmk_gguf, hmk_nvidia_devices  # noqa: E402


def _filter(name):
    spec = importlib.util.spec_from_file_location("hmk_acceptance_" + name, os.path.join(KIT, "plugins", "filter", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _out(result, ok):
    result["ok"] = bool(ok)
    print(json.dumps(result, sort_keys=True))
    return 0 if ok else 1


def devices():
    text = open("/proc/devices").read()
    result = hmk_nvidia_devices.nvidia(text, ["char-nvidia*"])
    result["uvm_node"] = os.path.exists("/dev/nvidia-uvm")
    if not result["uvm_node"]:
        result["problems"].append({"what": "/dev/nvidia-uvm is missing", "fix": "nvidia-modprobe -u -c=0 as root"})
    return _out(result, not result["problems"])


def toolkit(release, driver):
    nvidia = _filter("hmk_nvidia")
    try:
        minimum = nvidia.min_driver(release)
    except nvidia.CompatError as exc:
        return _out({"toolkit": release, "driver": driver, "error": str(exc)}, False)
    return _out({"toolkit": release, "driver": driver, "driver_minimum": minimum}, nvidia.version_ge(driver, minimum))


def cmake_args(bundle, arch, cuda):
    data = json.load(open(os.path.join(bundle, "kit-data.json")))
    builder = _filter("llama_build")
    profile = {"gpus": {"count": 1, "arch": str(arch)}}
    cpuinfo = open("/proc/cpuinfo").read().split("\n\n")[0]
    # The role's flags for the pin on this GPU, with the smallest kernel set that serves the tiny q8_0 models: no
    # FlashAttention kernels for other KV quant pairs (CUDA or the CPU's iqk); only this GPU's architecture.
    args = builder.cmake_args(profile, cpuinfo, "ik_llama.cpp", data["commit_date"],
                              {"cuda": "auto", "cuda_version": cuda, "rules": data["cmake_rules"],
                               "iqk_fa_all_quants": False, "extra": ["-DGGML_CUDA_FA_ALL_QUANTS=OFF"]})
    return _out({"args": args}, "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=%s" % arch in args)


def plan(bundle, model, vram_mib, port, out_path):
    data = json.load(open(os.path.join(bundle, "kit-data.json")))
    svc = _filter("inference_service")
    layout = hmk_gguf.layout(model)
    kv = svc.kv_cache_bytes(layout, 4096, "q8_0", "q8_0", mla=layout["architecture"] == "deepseek2")
    gib = 1024 ** 3
    # Every MoE layer but the last goes to the GPU, the last stays in DRAM: both kinds of -ot rule must then
    # show in the engine's log, as on a real hybrid node.
    layers = len(layout["expert_bytes"])
    the_plan = svc.placement_plan(layout, [int(vram_mib) * 1024 * 1024], kv, 3 * gib, gib, max(layers - 1, 1), 99,
                                  svc.split_model("ik_llama.cpp", data["commit_date"]))
    accepted = svc.engine_flag_set(data["engine_flags"], "ik_llama.cpp", data["commit_date"])
    argv = svc.llama_argv({"engine": "ik_llama.cpp", "accepted": accepted, "model": model,
                           "arch": layout["architecture"], "host": "127.0.0.1", "port": int(port),
                           "threads": max(1, (os.cpu_count() or 2) // 2), "ngl": 99, "ctx": 4096, "batch": 512,
                           "ubatch": 512, "amb": 512, "ot": the_plan["rules"], "ts": the_plan["tensor_split"],
                           "numa_nodes": 1})
    record = {"engine": "ik_llama.cpp", "model": model, "override_tensor": the_plan["rules"], "plan": the_plan,
              "argv": argv}
    with open(out_path, "w") as handle:
        json.dump(record, handle, indent=1)
    ok = the_plan["gpus"] and the_plan["gpus"][0]["layers"] and the_plan["cpu_layers"]
    return _out({"rules": the_plan["rules"], "argv": argv, "summary": svc.plan_summary(the_plan)}, ok)


def proof(plan_path, log_path, smi_gpus, smi_apps, pid):
    record = json.load(open(plan_path))
    apps = hmk_engine_log.parse_smi_apps(open(smi_apps).read(), hmk_engine_log.parse_smi_gpus(open(smi_gpus).read()))
    result = hmk_engine_log.evaluate(hmk_engine_log.parse(open(log_path).read()), record, apps, int(pid))
    result["summary"] = hmk_engine_log.summary(result)
    return _out(result, result["ok"])


def power(bench_path):
    validate = _filter("validate")
    run = json.load(open(bench_path))
    gpu = validate.gpu_energy(run.get("gpu_power"), run.get("seconds"))
    return _out({"gpu_board": gpu, "bench_rc": run.get("rc")},
                gpu.get("available") and gpu.get("average_watts", 0) > 0 and run.get("rc") == 0)


# The engine's matrix kernels are compiled once per quant type, one file each (template-instances/mmq-instance-*.cu,
# mmvq-instance-*.cu): about half of the CUDA build, and all but the tiny model's own types are never launched
# here. trim-kernels rewrites each of those other files as a stub that defines the same external function and
# aborts, naming the type, if it is ever called; every other file (FlashAttention, MLA, the CPU's iqk, the
# server) is compiled as the role compiles it. This is for the acceptance's build only: llama_build never trims.
_MMQ_CASE = re.compile(r"^\s*DECL_MMQ_CASE\((GGML_TYPE_\w+)\);", re.M)
_MMQ_MACRO = re.compile(r"#define\s+DECL_MMQ_CASE\(type\)\s*\\\s*template\s+void\s+(\w+)<type>\(\s*"
                        r"ggml_backend_cuda_context\s*&\s*ctx,\s*const\s+(\w+)\s*&\s*args,\s*cudaStream_t\s+stream\s*\)")
_MMVQ_FUNC = re.compile(r"^void\s+(mul_mat_vec_\w+_cuda)\(\s*const\s+mmvq_args\s*&\s*args,\s*cudaStream_t\s+stream\s*\)\s*\{",
                        re.M)
_MMVQ_TYPE = re.compile(r"mul_mat_vec_q_cuda<(GGML_TYPE_\w+)")
_STUB_HEAD = ("// hybrid-moe-kit GPU acceptance (tests/gpu/acceptance_helper.py trim-kernels): the tiny model has no\n"
              "// %s tensors, so this kernel is left out of the acceptance's build; calling it aborts.\n"
              '#include "../common.cuh"\n\n')


def _trim_one(path, keep):
    """The stub for one instance file, or None (kept as it is) with the reason."""
    text = open(path).read()
    name = os.path.basename(path)
    if name.startswith("mmq-instance-"):
        cases = _MMQ_CASE.findall(text)
        include = re.search(r'#include\s+"\.\./(\w+\.cuh)"', text)
        if not cases or not include:
            return None, "no DECL_MMQ_CASE"
        if keep.intersection(cases):
            return None, "the model's type"
        header = os.path.join(os.path.dirname(os.path.dirname(path)), include.group(1))
        macro = _MMQ_MACRO.search(open(header).read()) if os.path.exists(header) else None
        if not macro:
            return None, "no DECL_MMQ_CASE macro in %s" % include.group(1)
        func, args = macro.groups()
        stub = _STUB_HEAD % ", ".join(cases) + "struct %s;\n" % args
        stub += "template <ggml_type type> void %s(ggml_backend_cuda_context & ctx, const %s & args, cudaStream_t stream);\n" % (func, args)
        for case in cases:
            stub += ("template <> void %s<%s>(ggml_backend_cuda_context &, const %s &, cudaStream_t) {\n"
                     '    GGML_ABORT("hybrid-moe-kit GPU acceptance build: no MMQ kernel for %s");\n}\n' % (func, case, args, case))
        return stub, cases
    funcs = _MMVQ_FUNC.findall(text)
    types = set(_MMVQ_TYPE.findall(text))
    if len(funcs) != 1 or len(types) != 1:
        return None, "not one mul_mat_vec_*_cuda of one type"
    qtype = types.pop()
    if qtype in keep:
        return None, "the model's type"
    return (_STUB_HEAD % qtype + "struct mmvq_args;\n"
            "void %s(const mmvq_args &, cudaStream_t) {\n"
            '    GGML_ABORT("hybrid-moe-kit GPU acceptance build: no MMVQ kernel for %s");\n}\n'
            % (funcs[0], qtype)), qtype


def trim_kernels(src, bundle):
    data = json.load(open(os.path.join(bundle, "kit-data.json")))
    keep = set("GGML_TYPE_" + t.upper() for t in data.get("model_tensor_types", []))
    instances = os.path.join(src, "ggml", "src", "ggml-cuda", "template-instances")
    if not keep or not os.path.isdir(instances):
        return _out({"error": "no model_tensor_types in kit-data.json or no %s" % instances}, False)
    stubbed, kept = [], {}
    for name in sorted(os.listdir(instances)):
        if not (name.startswith("mmq-instance-") or name.startswith("mmvq-instance-")) or not name.endswith(".cu"):
            continue
        stub, why = _trim_one(os.path.join(instances, name), keep)
        if stub is None:
            kept[name] = why
            continue
        with open(os.path.join(instances, name), "w") as handle:
            handle.write(stub)
        stubbed.append(name)
    model_files = sorted(n for n, why in kept.items() if why == "the model's type")
    return _out({"kept_types": sorted(keep), "stubbed": len(stubbed), "compiled": model_files,
                 "unrecognised": {n: why for n, why in kept.items() if why != "the model's type"}},
                bool(stubbed) and bool(model_files))


def main(argv):
    commands = {"devices": devices, "toolkit": toolkit, "cmake-args": cmake_args, "plan": plan, "proof": proof,
                "power": power, "trim-kernels": trim_kernels}
    if not argv or argv[0] not in commands:
        sys.stderr.write(__doc__)
        return 2
    return commands[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
