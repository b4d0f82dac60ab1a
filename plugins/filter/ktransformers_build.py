# -*- coding: utf-8 -*-
"""Build knowledge of the ktransformers_build role (KTransformers 0.7.x: kt-kernel + sglang-kt).

What the role decides lives here, as plain functions with unit tests (tests/unit/test_ktransformers.py):
the guardrails that refuse a request before anything is installed, kt-kernel's build environment per CPU
class (checked against kt-kernel/setup.py at the pin: CPUINFER_CPU_INSTRUCT, CPUINFER_ENABLE_AMX,
CPUINFER_USE_CUDA, CPUINFER_CUDA_ARCHS, CPUINFER_PARALLEL, CPUINFER_BUILD_TYPE, CPUINFER_ENABLE_BLIS, CMAKE_ARGS), the commands
of one build, its key, and the reading of the post-build proof. CPU flags, CUDA architectures, the pin
check and pruning are llama_build's filters (hmk.moe_kit.llama_build_*), called from the role, not copied.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_hardware import cpu_flags

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
CPU_INSTRUCTS = ("NATIVE", "AVX512", "AVX2", "FANCY")
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
AVX512_BASE = ("avx512f", "avx512bw")
# --kt-method values of sglang-kt at the pin (kt_kernel/experts.py INFERENCE_METHODS) and what each needs
# from the CPU. AMXINT4/AMXINT8 kernels exist only in AVX-512/AMX builds (USE_AMX_AVX_KERNEL); FP8, BF16,
# RAWINT4 and LLAMAFILE have AVX2 paths (AVX2FP8_MOE, AVX2BF16_MOE, AVX2RawInt4_MOE, llamafile).
KT_METHODS = {
    "AMXINT4": "avx512", "AMXINT8": "avx512", "FP8_PERCHANNEL": "avx512",
    "FP8": "avx2", "BF16": "avx2", "RAWINT4": "avx2", "LLAMAFILE": "avx2",
    "GPTQ_INT4": "avx2", "MXFP4": "avx2", "MXFP8": "avx2", "MOE_INT4": "avx2", "MOE_INT8": "avx2",
}
# Weight formats per method: safetensors folders (native FP8/BF16, converted AMX INT4/INT8) or GGUF.
GGUF_METHODS = ("LLAMAFILE",)
CONVERTED_METHODS = ("AMXINT4", "AMXINT8")
# sglang-kt's FlashAttention-3 backend ships kernels for these compute capabilities only.
FA3_ARCHS = ("80", "86", "90")
# Model architectures by the names the three sources use: GGUF general.architecture, HF config.json
# model_type, and the catalog's gguf.architecture. KTransformers serves these families. Kimi-K2's config.json says
# kimi_k2 over DeepSeek-V3's shapes (its GGUF says deepseek2); kt-kernel's model registry at the pin
# (kt-kernel/python/cli/utils/model_registry.py, 95009ea6) lists Kimi-K2-Thinking.
ARCH_FAMILY = {
    "deepseek2": "deepseek", "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "deepseek3": "deepseek",
    "kimi_k2": "deepseek",
    "qwen3moe": "qwen3moe", "qwen3_moe": "qwen3moe",
}
GB = 1000 ** 3
# kt-kernel's BLAS choices: default (none), or aocl - AMD's AOCL-BLIS, the general MoE kernel's INT8 GEMM on AMD
# CPUs (setup.py: CPUINFER_ENABLE_BLIS -> -DKTRANSFORMERS_CPU_MOE_AMD, which also turns on
# -DKTRANSFORMERS_CPU_MOE_KERNEL; CMakeLists.txt looks for blis.h and libblis under BLIS_ROOT, /usr/local, /usr).
BLAS_CHOICES = ("default", "aocl")
AMD_VENDOR = "AuthenticAMD"


def _fail(msg):
    raise AnsibleFilterError(msg)


def has_amx(flags):
    """All three AMX flags, as kt-kernel's cmake/DetectCPU.cmake requires them."""
    return set(AMX_FLAGS) <= set(cpu_flags(flags))


def cpu_isa(flags):
    """avx512 (avx512f+avx512bw, Zen 4 and Sapphire Rapids), avx2 (Zen 2/3) or generic."""
    flags = set(cpu_flags(flags))
    if set(AVX512_BASE) <= flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def cpu_instruct(flags, override="auto"):
    """CPUINFER_CPU_INSTRUCT: NATIVE on AVX-512 CPUs (built on the node, -march=native), AVX2 on AVX2-only
    CPUs (the portable set, free of AVX-512 since upstream 517e7a43). An override is checked against the CPU."""
    isa = cpu_isa(flags)
    if isa == "generic":
        _fail("this CPU has neither AVX-512 nor AVX2; kt-kernel needs AVX2 at least")
    if override in (None, "", "auto"):
        return "NATIVE" if isa == "avx512" else "AVX2"
    override = str(override).upper()
    if override not in CPU_INSTRUCTS:
        _fail("CPUINFER_CPU_INSTRUCT must be one of %s or auto, not %r" % (", ".join(CPU_INSTRUCTS), override))
    if override in ("AVX512", "FANCY") and isa != "avx512":
        _fail("CPUINFER_CPU_INSTRUCT=%s on a CPU without AVX-512 (avx512f, avx512bw) builds a module that dies "
              "with SIGILL; use AVX2 (or auto)" % override)
    return override


def enable_amx(flags, override="auto"):
    """CPUINFER_ENABLE_AMX: ON only where the CPU has amx_tile, amx_int8 and amx_bf16, always explicit
    (unset, kt-kernel's setup.py enables it from the build host's flags)."""
    amx = has_amx(flags)
    if override in (None, "", "auto"):
        return "ON" if amx else "OFF"
    value = "ON" if str(override).lower() in ("on", "true", "1", "yes") else "OFF"
    if value == "ON" and not amx:
        _fail("CPUINFER_ENABLE_AMX=ON on a CPU without %s" % ", ".join(AMX_FLAGS))
    return value


def cuda_series_home(version, root="/usr/local"):
    """The toolkit by series: /usr/local/cuda-X.Y (never the floating /usr/local/cuda)."""
    match = re.match(r"^(\d+)\.(\d+)", str(version or ""))
    if not match:
        _fail("the CUDA toolkit series must be X.Y (e.g. 12.8), not %r" % (version,))
    return "%s/cuda-%s.%s" % (str(root).rstrip("/"), match.group(1), match.group(2))


def _version_tuple(text):
    match = re.search(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _archs(value):
    if isinstance(value, (list, tuple)):
        items = value
    else:
        items = re.split(r"[;,\s]+", str(value or ""))
    return [re.sub(r"^sm_", "", str(a).strip().lower()) for a in items if str(a).strip()]


def arch_family(arch):
    """deepseek / qwen3moe for the names GGUF, config.json and the catalog use; '' when unknown."""
    return ARCH_FAMILY.get(str(arch or "").strip().lower(), "")


def pyproject_pin(text, package):
    """The exact pin (==X) of `package` in a pyproject.toml's dependencies, '' when it has none."""
    match = re.search(r"""["']%s\s*==\s*([0-9][^"';,\s]*)["']""" % re.escape(package), str(text or ""))
    return match.group(1) if match else ""


def version_py(text):
    """__version__ of KTransformers' version.py."""
    match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", str(text or ""))
    if not match:
        _fail("version.py at the pin has no __version__")
    return match.group(1)


def kt_package_pins(packages):
    """{package: version} of the kt packages (kt-kernel, sglang-kt, ktransformers) pinned with == in a pip list."""
    pins = {}
    for item in packages or []:
        match = re.match(r"^\s*(kt-kernel|kt_kernel|sglang-kt|sglang_kt|ktransformers)\s*==\s*([^\s;,]+)", str(item))
        if match:
            pins[match.group(1).replace("_", "-")] = match.group(2)
    return pins


def version_problems(versions, kt_version):
    """Every kt package at the pin's version (version.py): what differs, as refusal reasons."""
    kt_version = str(kt_version or "")
    odd = sorted("%s %s" % (k, v) for k, v in (versions or {}).items() if v and kt_version and str(v) != kt_version)
    if not odd:
        return []
    return ["every kt package must be at the pin's version %s (version.py); requested %s" % (kt_version, ", ".join(odd))]


def ram_needed_bytes(request):
    """Bytes of DRAM kt-kernel holds for the CPU experts: the weight files at --kt-weight-path (safetensors
    or GGUF, as measured on the node) plus 10% for its buffers. DeepSeek-R1's FP8 folder (~690 GB) comes to
    ~760 GB this way, its AMXINT4 conversion (~330 GB) to ~360 GB."""
    return int(int(request.get("weight_bytes") or 0) * 1.1)


def guardrails(request):
    """Reasons the requested build and service must not go ahead (empty list: go).

    request keys: commit, allow_unpinned, cpu_flags, cpu_instruct, enable_amx, method, threads,
    physical_cores, threadpool_count, numa_nodes, weight_path, weight_kind (safetensors | gguf | missing |
    empty), weight_bytes, model_arch (config.json model_type or GGUF general.architecture), model_arch_gguf, mem_total_bytes,
    gpu_archs (list), gpu_count, cuda_version (nvcc's X.Y, '' without a toolkit), attention_backend,
    serve (bool: sglang-kt is installed and served), build (false: the service's check, no toolkit needed),
    kt_version (version.py at the pin),
    package_versions ({package: version} requested), tensor_parallel_size.
    """
    reasons = []
    commit = str(request.get("commit") or "").lower()
    if not request.get("allow_unpinned") and not FULL_SHA.match(commit):
        reasons.append("ktransformers_build_version=%r is not a full 40-character commit SHA: KTransformers' tags and "
                       "branches move; pin the commit (or set ktransformers_build_allow_unpinned: true)" % commit)
    flags = request.get("cpu_flags")
    isa = cpu_isa(flags)
    try:
        cpu_instruct(flags, request.get("cpu_instruct", "auto"))
        enable_amx(flags, request.get("enable_amx", "auto"))
    except AnsibleFilterError as exc:
        reasons.append(str(exc))
    method = str(request.get("method") or "").upper()
    if method not in KT_METHODS:
        reasons.append("--kt-method %r is not one sglang-kt knows at the pin (%s)" % (method, ", ".join(sorted(KT_METHODS))))
    elif KT_METHODS[method] == "avx512" and isa != "avx512":
        reasons.append("--kt-method %s needs kt-kernel's AVX-512/AMX kernels, which an %s CPU (e.g. EPYC Milan, Zen 3) "
                       "cannot run; use FP8 or BF16 safetensors, or LLAMAFILE with GGUF weights" % (method, isa.upper()))
    threads, cores = int(request.get("threads") or 0), int(request.get("physical_cores") or 0)
    if cores > 0 and threads != cores:
        reasons.append("--kt-cpuinfer %d is not the node's %d physical cores: SMT siblings cut decode about 10x and "
                       "fewer threads leave bandwidth unused" % (threads, cores))
    pools, nodes = int(request.get("threadpool_count") or 0), int(request.get("numa_nodes") or 0)
    if nodes > 0 and pools != nodes:
        reasons.append("--kt-threadpool-count %d is not the node's %d NUMA node(s): one thread pool per NUMA node "
                       "(convert_cpu_weights.py must use the same count)" % (pools, nodes))
    kind = request.get("weight_kind") or "missing"
    path = request.get("weight_path") or ""
    if not path or kind == "missing":
        reasons.append("--kt-weight-path %r does not exist: without it kt-kernel stays off silently and the GPU runs "
                       "out of memory loading every expert; sync the weights first (model_sync)" % path)
    elif kind == "empty":
        reasons.append("--kt-weight-path %s holds neither .safetensors nor .gguf files" % path)
    elif method in GGUF_METHODS and kind != "gguf":
        reasons.append("--kt-method %s reads GGUF files, and %s holds %s" % (method, path, kind))
    elif method in KT_METHODS and method not in GGUF_METHODS and kind != "safetensors":
        reasons.append("--kt-method %s reads safetensors (%s), and %s holds %s" % (
            method, "converted by convert_cpu_weights.py" if method in CONVERTED_METHODS else "the model's own folder",
            path, kind))
    family = arch_family(request.get("model_arch"))
    if not family:
        reasons.append("the served model's architecture %r (config.json model_type or GGUF header) is not one the "
                       "kit serves with KTransformers (DeepSeek-V3/R1, Kimi-K2, Qwen3-MoE)" % (request.get("model_arch"),))
    gguf_family = arch_family(request.get("model_arch_gguf"))
    if request.get("model_arch_gguf") and family and gguf_family != family:
        reasons.append("the model's config.json says %s and its GGUF weights say %s: --model and --kt-weight-path are "
                       "different models" % (request.get("model_arch"), request.get("model_arch_gguf")))
    need, have = ram_needed_bytes(request), int(request.get("mem_total_bytes") or 0)
    if need and have and need > have:
        reasons.append("%s experts of this %s model need about %d GB of RAM and the node has %d GB; use a smaller format "
                       "(AMXINT4 on AVX-512, LLAMAFILE GGUF on AVX2) or a node with more memory"
                       % (method, family or "model", need // GB, have // GB))
    archs = _archs(request.get("gpu_archs"))
    serve = bool(request.get("serve", True))
    if serve and int(request.get("gpu_count") or 0) <= 0:
        reasons.append("sglang-kt serves attention and the KV cache on a GPU and the hardware profile declares none; "
                       "build kt-kernel alone (ktransformers_build_serve: false) or serve with ik_llama.cpp")
    cuda = _version_tuple(request.get("cuda_version"))
    build = bool(request.get("build", True))
    if build and archs and cuda is None:
        reasons.append("no CUDA toolkit (nvcc) at %s: kt-kernel's CUDA path (CPUINFER_USE_CUDA=1) compiles with it"
                       % (request.get("cuda_home") or "/usr/local/cuda-X.Y"))
    if build and "120" in archs and cuda is not None and cuda < (12, 8):
        reasons.append("sm_120 (RTX 5090, Blackwell) needs CUDA >= 12.8 and torch's cu128 wheels; the toolkit is %d.%d" % cuda)
    backend = str(request.get("attention_backend") or "")
    if backend == "fa3":
        foreign = [a for a in archs if a not in FA3_ARCHS]
        if foreign:
            reasons.append("--attention-backend fa3: FlashAttention-3 kernels exist for sm_80/86/90 only, not sm_%s; "
                           "use flashinfer or triton" % ", sm_".join(foreign))
    tp = int(request.get("tensor_parallel_size") or 1)
    if serve and tp > max(int(request.get("gpu_count") or 0), 1):
        reasons.append("--tensor-parallel-size %d exceeds the %s GPU(s) the profile declares" % (tp, request.get("gpu_count")))
    reasons += version_problems(request.get("package_versions"), request.get("kt_version"))
    if build:
        reasons += blas_problems(request)
        # ext_bindings.cpp at the pin binds the general MoE kernel's INT8 class only with USE_MOE_KERNEL (on x86: the
        # AOCL-BLIS build), and its INT4 class only on aarch64 with KML.
        if method == "MOE_INT4":
            reasons.append("--kt-method MOE_INT4 exists only in ARM builds of kt-kernel (KML) at the pin; on x86 use "
                           "MOE_INT8 with ktransformers_build_blas: aocl, or another method")
        elif method == "MOE_INT8" and str(request.get("blas") or "default") != "aocl":
            reasons.append("--kt-method MOE_INT8 runs on kt-kernel's general MoE kernel, which an x86 build has only "
                           "with AOCL-BLIS: set ktransformers_build_blas: aocl (AMD CPUs)")
    return reasons


def blas_problems(request):
    """Reasons an AOCL-BLIS build (blas: aocl) must not start: the CPU is not AMD's, or AOCL-BLIS is not installed.

    request keys: blas (default | aocl), cpu_vendor (/proc/cpuinfo vendor_id, '' when unread), blis_root ('' for
    kt-kernel's own search of /usr/local and /usr), blis_header, blis_library (bool: found on the node).
    """
    blas = str(request.get("blas") or "default")
    if blas not in BLAS_CHOICES:
        return ["ktransformers_build_blas %r is not one of %s" % (blas, ", ".join(BLAS_CHOICES))]
    if blas != "aocl":
        return []
    reasons = []
    vendor = str(request.get("cpu_vendor") or "")
    if vendor != AMD_VENDOR:
        reasons.append("ktransformers_build_blas: aocl builds kt-kernel's AMD MoE kernel on AOCL-BLIS, for AMD EPYC; "
                       "this CPU's vendor_id is %r, not %s: leave ktransformers_build_blas at default"
                       % (vendor or "unknown", AMD_VENDOR))
    missing = [what for what, found in (("blis.h", request.get("blis_header")), ("libblis", request.get("blis_library")))
               if not found]
    if missing:
        where = request.get("blis_root") or "/usr/local or /usr"
        reasons.append("ktransformers_build_blas: aocl needs AOCL-BLIS on the node, and %s is not under %s (include/, "
                       "lib/, lib64/): install it from your own package or mirror (AMD's aocl-blis package, or a local "
                       "build of amd/blis) and set ktransformers_build_blis_root to its prefix; the kit downloads "
                       "nothing" % (" and ".join(missing), where))
    return reasons


def build_env(request):
    """kt-kernel's build environment (every name read by kt-kernel/setup.py at the pin).

    request: cpu_flags, cpu_instruct, enable_amx, gpu_archs, cuda_home, jobs, kt_version, ccache (bool),
    blas (default | aocl), blis_root. Nothing is added for blas: default, so the keys of existing builds stay.
    """
    archs = _archs(request.get("gpu_archs"))
    env = {
        "CPUINFER_CPU_INSTRUCT": cpu_instruct(request.get("cpu_flags"), request.get("cpu_instruct", "auto")),
        "CPUINFER_ENABLE_AMX": enable_amx(request.get("cpu_flags"), request.get("enable_amx", "auto")),
        "CPUINFER_BUILD_TYPE": "Release",
        "CPUINFER_PARALLEL": str(max(int(request.get("jobs") or 1), 1)),
        # Without CUDA, setup.py probes CUDA_HOME, PATH and /usr/local/cuda: a GPU-less build says so itself.
        "CPUINFER_USE_CUDA": "1" if archs else "0",
        "SGLANG_KT_VERSION": str(request.get("kt_version") or ""),
    }
    if archs:
        home = str(request.get("cuda_home") or "")
        env.update({"CUDA_HOME": home, "CPUINFER_CUDA_ARCHS": ";".join(archs)})
    cmake_args = []
    if request.get("ccache", True):
        cmake_args = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        if archs:
            cmake_args.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    blas = str(request.get("blas") or "default")
    if blas not in BLAS_CHOICES:
        _fail("ktransformers_build_blas must be one of %s, not %r" % (", ".join(BLAS_CHOICES), blas))
    if blas == "aocl":
        env["CPUINFER_ENABLE_BLIS"] = "ON"
        # setup.py's CPUINFER_BLIS_ROOT -> BLIS_ROOT forward is commented out at the pin: CMake gets it directly.
        if request.get("blis_root"):
            cmake_args.append("-DBLIS_ROOT=%s" % str(request["blis_root"]).rstrip("/"))
    if cmake_args:
        env["CMAKE_ARGS"] = " ".join(cmake_args)
    return env


def build_plan(request):
    """Environment and commands of one build into <root>/staging/<key>/venv (moved to builds/<key> after).

    request: root, key, src (checkout), python, env (build_env), torch_spec, pip_args (index options),
    packages (runtime dependencies installed first), serve (bool: install sglang-kt from the checkout),
    toolkit (nvcc's version, '' without CUDA: part of the key, so a new toolkit builds anew).
    """
    root = str(request["root"]).rstrip("/")
    venv = "%s/builds/%s/venv" % (root, request["key"])
    src = str(request.get("src") or root + "/src")
    pip = [venv + "/bin/python", "-m", "pip", "install", "--no-input"] + [str(a) for a in request.get("pip_args") or []]
    # kt-kernel compiles first (its cmake needs no torch), so a commit that does not compile fails in seconds
    # after the cache hits, before gigabytes of wheels are installed. The build tools come from the venv
    # (--no-build-isolation): pybind11 and llama.cpp are vendored.
    commands = [
        [str(request.get("python") or "python3"), "-m", "venv", venv],
        pip + [str(p) for p in request.get("packages") or []],
        pip + ["--no-build-isolation", "--no-deps", src + "/kt-kernel"],
        pip + [str(request["torch_spec"])] + [str(a) for a in request.get("torch_args") or []],
    ]
    if request.get("serve"):
        # Upstream's install.sh installs its SGLang fork from the submodule, versioned by SGLANG_KT_VERSION.
        commands.append(pip + [src + "/third_party/sglang/python"])
    return {"venv": venv, "env": dict(request.get("env") or {}), "commands": commands, "chdir": src + "/kt-kernel",
            "toolkit": str(request.get("toolkit") or "")}


def plan_hash(plan, root):
    """8 hex digits over the build's environment, commands and nvcc's version, the build's own directory abstracted."""
    blob = json.dumps({"env": plan["env"], "commands": plan["commands"], "toolkit": plan.get("toolkit", "")},
                      sort_keys=True)
    blob = re.sub(re.escape(str(root).rstrip("/")) + r"/builds/[^/\"]+", "<build>", blob)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]


def build_key(commit, plan, root):
    """<commit12>-<planhash8>: one directory per commit and configuration, like llama_build."""
    commit = str(commit or "").lower()
    if not FULL_SHA.match(commit):
        _fail("build key needs the full 40-character commit SHA, got %r" % commit)
    return "%s-%s" % (commit[:12], plan_hash(plan, root))


def proof_problems(proof, expect):
    """What the post-build import check says is wrong (empty: the build is good).

    proof: the JSON the check prints (variant, cuda, versions {package: version}, error).
    expect: kt_version, cpu_instruct, cuda (bool), serve (bool), blas (aocl: the proof's moe_kernel must be true).
    """
    problems = []
    if proof.get("error"):
        return ["import kt_kernel failed: %s" % proof["error"]]
    versions = proof.get("versions") or {}
    kt_version = str(expect.get("kt_version") or "")
    wanted = ["kt-kernel"] + (["sglang-kt"] if expect.get("serve") else [])
    for package in wanted:
        if package not in versions:
            problems.append("%s is not installed in the build's venv" % package)
    for package, version in sorted(versions.items()):
        if kt_version and version != kt_version:
            problems.append("%s is %s, not the pin's %s (all kt packages at one version)" % (package, version, kt_version))
    variant = str(proof.get("variant") or "")
    if expect.get("cpu_instruct") == "AVX2" and variant != "avx2":
        problems.append("the module reports CPU variant %r, not avx2: the AVX2 build carries AVX-512 code" % variant)
    if expect.get("blas") == "aocl" and not proof.get("moe_kernel"):
        problems.append("the module lacks the AOCL-BLIS MoE kernel (kt_kernel_ext.moe.Int8_KERNEL_MOE) the build asked "
                        "for with ktransformers_build_blas: aocl")
    if bool(expect.get("cuda")) != bool(proof.get("cuda")):
        problems.append("the module %s the CUDA stream bridge (submit_with_cuda_stream), the build %s CUDA"
                        % ("has" if proof.get("cuda") else "lacks", "asked for" if expect.get("cuda") else "did not ask for"))
    return problems


class FilterModule(object):
    """ktransformers_build filters."""

    def filters(self):
        return guard_filters({
            "ktransformers_build_cpu_isa": cpu_isa,
            "ktransformers_build_cpu_instruct": cpu_instruct,
            "ktransformers_build_enable_amx": enable_amx,
            "ktransformers_build_cuda_series_home": cuda_series_home,
            "ktransformers_build_arch_family": arch_family,
            "ktransformers_build_pyproject_pin": pyproject_pin,
            "ktransformers_build_version_py": version_py,
            "ktransformers_build_ram_needed": ram_needed_bytes,
            "ktransformers_build_kt_package_pins": kt_package_pins,
            "ktransformers_build_version_problems": version_problems,
            "ktransformers_build_guardrails": guardrails,
            "ktransformers_build_env": build_env,
            "ktransformers_build_plan": build_plan,
            "ktransformers_build_key": build_key,
            "ktransformers_build_proof_problems": proof_problems,
        }, AnsibleFilterError)
