# -*- coding: utf-8 -*-
"""Build knowledge of the llama_build role, as plain functions with unit tests.

Everything that decides what gets compiled lives here, not in Jinja: which CPU ISA flags the node
gets, which CUDA architectures the declared GPUs need, the per-commit cmake rules (data passed in
from the role's defaults), the pin check, the build directory key, the smoke-check command lines
and which old builds to prune. tests/unit/test_engine_build.py imports this file directly.
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

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_engine_arch import flag_set_at
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_hardware import cpu_flags

FULL_SHA = re.compile(r"^[0-9a-f]{40}\Z")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")

# Compute capability of the GPUs the kit knows, for profiles that name a model but no arch.
GPU_ARCH_BY_MODEL = {
    "RTX 4090": "89",
    "RTX 5090": "120",
    "H100": "90",
    "H200": "90",
    "L40S": "89",
}
# Minimum CUDA toolkit per architecture (sm_120 needs 12.8).
MIN_CUDA_FOR_ARCH = {"120": (12, 8), "90": (11, 8), "89": (11, 8)}

# /proc/cpuinfo flag -> ggml cmake option, in the order the options are emitted.
AVX512_OPTIONS = (
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
AVX2_OPTIONS = (
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
)


def _fail(msg):
    raise AnsibleFilterError(msg)


def cpu_isa(flags):
    """The widest x86 ISA class the build can use: avx512, avx2 or generic."""
    flags = set(cpu_flags(flags))
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def cuda_architectures(profile):
    """CMAKE_CUDA_ARCHITECTURES for the GPUs a hardware profile declares ("" when it has none).

    gpus.arch may be "89", "89;120", "89,120" or a list; without it gpus.model is looked up.
    "native" and "all" are refused: native needs a visible GPU at configure time and the
    fallback list lacks 89/120 on CUDA 13.
    """
    gpus = (profile or {}).get("gpus") or {}
    if int(gpus.get("count") or 0) <= 0:
        return ""
    arch = gpus.get("arch")
    if arch in (None, "", []):
        model = gpus.get("model")
        if model not in GPU_ARCH_BY_MODEL:
            _fail("hmk_hardware.gpus declares %s GPU(s) but neither gpus.arch nor a known gpus.model "
                  "(%s); set gpus.arch, e.g. \"89\" for RTX 4090, \"120\" for RTX 5090, \"90\" for H100/H200"
                  % (gpus.get("count"), model))
        arch = GPU_ARCH_BY_MODEL[model]
    if isinstance(arch, (list, tuple)):
        items = [str(a) for a in arch]
    else:
        items = re.split(r"[;,\s]+", str(arch))
    archs = []
    for item in items:
        item = item.strip().lower()
        if not item:
            continue
        item = re.sub(r"^(sm_|compute_)", "", item)
        if item in ("native", "all", "all-major"):
            _fail("CMAKE_CUDA_ARCHITECTURES=%s is refused: declare the GPUs' architectures "
                  "(89 RTX 4090, 120 RTX 5090, 90 H100/H200) in hmk_hardware.gpus.arch" % item)
        if not re.match(r"^\d{2,3}[af]?(-real|-virtual)?$", item):
            _fail("hmk_hardware.gpus.arch has an unknown CUDA architecture %r" % item)
        if item not in archs:
            archs.append(item)
    return ";".join(sorted(archs, key=lambda a: int(re.match(r"\d+", a).group(0))))


def _version_tuple(text):
    match = re.search(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _rule_applies(rule, engine, commit_date, gpu_count, cuda):
    if rule.get("engine", engine) != engine:
        return False
    if rule.get("before") and not commit_date < str(rule["before"]):
        return False
    if rule.get("since") and not commit_date >= str(rule["since"]):
        return False
    if gpu_count < int(rule.get("min_gpus", 0)):
        return False
    if rule.get("cuda") is not None and bool(rule["cuda"]) != cuda:
        return False
    return True


def cmake_args(profile, flags, engine="ik_llama.cpp", commit_date="", options=None):
    """The cmake -D arguments for one node, in a stable order.

    profile: hmk_hardware; flags: the node's CPU flags; commit_date: YYYY-MM-DD of the pinned commit.
    options: cuda ("auto" | "enabled" | "disabled"), cuda_version ("13.0"), cuda_home (the toolkit
    the build must use, /usr/local/cuda-X.Y: passed as CMAKE_CUDA_COMPILER and CUDAToolkit_ROOT so
    that neither nvcc nor cuBLAS comes from another toolkit), ccache (bool), iqk_fa_all_quants (bool,
    ik only), rules (list of per-commit rules, see defaults), extra (list).
    """
    options = dict(options or {})
    if engine not in ("ik_llama.cpp", "llama.cpp"):
        _fail("unknown engine %r: ik_llama.cpp or llama.cpp" % engine)
    commit_date = str(commit_date or "")[:10]
    if not DATE.match(commit_date):
        _fail("the commit date %r is not YYYY-MM-DD" % commit_date)
    isa = cpu_isa(flags)
    flag_set = set(cpu_flags(flags))
    archs = cuda_architectures(profile)
    mode = options.get("cuda", "auto")
    if mode not in ("auto", "enabled", "disabled"):
        _fail("cuda must be auto, enabled or disabled, not %r" % mode)
    cuda = bool(archs) if mode == "auto" else mode == "enabled"
    if cuda and not archs:
        _fail("CUDA is enabled but the hardware profile declares no GPU architecture (hmk_hardware.gpus)")
    gpu_count = int(((profile or {}).get("gpus") or {}).get("count") or 0)

    args = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
    if isa == "avx512":
        args += ["-D%s=ON" % opt for flag, opt in AVX512_OPTIONS if flag in flag_set]
    elif isa == "avx2":
        args += ["-D%s=ON" % opt for flag, opt in AVX2_OPTIONS if flag in flag_set]
    if cuda:
        cuda_version = _version_tuple(options.get("cuda_version"))
        for arch in archs.split(";"):
            need = MIN_CUDA_FOR_ARCH.get(re.match(r"\d+", arch).group(0))
            if need and cuda_version and cuda_version < need:
                _fail("sm_%s needs CUDA >= %d.%d, the node has %d.%d" % (arch, need[0], need[1],
                                                                         cuda_version[0], cuda_version[1]))
        args += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=%s" % archs]
        cuda_home = str(options.get("cuda_home") or "").rstrip("/")
        if cuda_home:
            args += ["-DCMAKE_CUDA_COMPILER=%s/bin/nvcc" % cuda_home, "-DCUDAToolkit_ROOT=%s" % cuda_home]
    else:
        args += ["-DGGML_CUDA=OFF"]
    args += ["-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DGGML_CCACHE=%s" % ("ON" if options.get("ccache", True) else "OFF")]
    if engine == "ik_llama.cpp" and not options.get("iqk_fa_all_quants", True):
        args.append("-DGGML_IQK_FA_ALL_QUANTS=OFF")
    for rule in options.get("rules") or []:
        if _rule_applies(rule, engine, commit_date, gpu_count, cuda):
            args += [str(a) for a in rule.get("args", [])]
    for arg in options.get("extra") or []:
        if not str(arg).startswith("-D"):
            _fail("extra cmake arguments must be -DNAME=VALUE, not %r" % arg)
        args.append(str(arg))
    for arg in args:
        if re.match(r"^-DCMAKE_CUDA_ARCHITECTURES=(native|all)", arg):
            _fail("CMAKE_CUDA_ARCHITECTURES=native/all is refused; declare the GPUs in hmk_hardware.gpus.arch")
    return args


def flags_hash(args, targets=None, engine="", nvcc=""):
    """8 hex digits identifying the build configuration (cmake args + targets + engine, and for a
    CUDA build nvcc's full version: a toolkit update within a series rebuilds). CPU-only keys are
    the same as before the toolkit joined the key."""
    config = {"engine": engine, "args": list(args), "targets": sorted(targets or [])}
    if nvcc:
        config["nvcc"] = str(nvcc)
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]


def build_key(sha, args, targets=None, engine="", nvcc=""):
    """builds/<sha12>-<flagshash8>: one directory per commit and configuration."""
    sha = str(sha or "").lower()
    if not FULL_SHA.match(sha):
        _fail("build key needs the full 40-character commit SHA, got %r" % sha)
    return "%s-%s" % (sha[:12], flags_hash(args, targets, engine, nvcc))


def is_full_sha(version):
    return bool(FULL_SHA.match(str(version or "")))


def check_pin(version, allow_unpinned=False):
    """True for a full SHA; a branch, tag or short SHA only with allow_unpinned (else an error)."""
    if is_full_sha(version):
        return True
    if allow_unpinned and str(version or "").strip():
        return True
    _fail("version %r is not a full 40-character commit SHA; ik_llama.cpp has no release tags and "
          "a branch or short SHA moves or becomes ambiguous. Pin the full SHA, or set "
          "<role>_allow_unpinned: true to build it anyway" % (version,))


def engine_flag_set(table, engine, commit_date):
    """The entry of the per-engine-version flag table that covers the commit date, with only the flags whose own
    since/until cover it (a flag past its until is listed as rejected)."""
    commit_date = str(commit_date or "")[:10]
    matches = []
    for entry in (table or {}).get(engine, []) or []:
        since = str(entry.get("since") or "0000-00-00")
        until = str(entry.get("until") or "9999-99-99")
        if since <= commit_date < until:
            matches.append(entry)
    if len(matches) != 1:
        _fail("the engine flag table has %d entries for %s at commit date %s (need exactly one): "
              "add or fix the entry in llama_build_engine_flags before moving the pin"
              % (len(matches), engine, commit_date or "?"))
    return flag_set_at(matches[0], commit_date)


def flag_argv(flag_set, key="accepted"):
    """The flags of a table entry as argv: [flag, value, flag, ...]."""
    argv = []
    for item in flag_set.get(key, []) or []:
        if isinstance(item, str):
            argv.append(item)
            continue
        argv.append(str(item["flag"]))
        if item.get("arg") is not None:
            argv.append(str(item["arg"]))
    return argv


def help_flags(flag_set):
    """Flags that must appear in `llama-server --help` (entries may opt out with in_help: false)."""
    return [str(i["flag"]) for i in flag_set.get("accepted", []) or []
            if not isinstance(i, str) and i.get("in_help", True)]


PARSE_ERRORS = re.compile(r"(unknown argument|invalid argument|invalid parameter|"
                          r"error while handling argument|unknown value for|legacy \S+ option '[^']*' is disabled)", re.IGNORECASE)


def parse_errors(output):
    """Lines of a llama-server run that say its argument parser refused something."""
    return [line.strip() for line in str(output or "").splitlines() if PARSE_ERRORS.search(line)]


def missing_in_help(help_text, flags):
    """Flags that `--help` does not list (a flag counts when it stands alone or before , = or space)."""
    text = str(help_text or "")
    missing = []
    for flag in flags or []:
        if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(str(flag)), text):
            missing.append(str(flag))
    return missing


def version_commit(output):
    """The commit llama-server --version prints: 'version: 4411 (55d3c05)' -> '55d3c05'."""
    match = re.search(r"version:\s*\d+\s*\(([0-9a-f]{7,40})\)", str(output or ""))
    return match.group(1) if match else ""


def builds_to_prune(builds, keep, protect=None):
    """Build directory names to delete: all but the newest `keep`, never a protected one.

    builds: ansible.builtin.find files (path + mtime) or {name: mtime}.
    """
    if isinstance(builds, dict):
        items = list(builds.items())
    else:
        items = [(str(b["path"]).rstrip("/").rsplit("/", 1)[-1], float(b.get("mtime", 0))) for b in builds]
    protect = {p for p in (protect or []) if p}
    newest_first = sorted(items, key=lambda kv: (-kv[1], kv[0]))
    kept = [name for name, _unused in newest_first[:max(int(keep), 1)]]
    return sorted(name for name, _unused in newest_first if name not in kept and name not in protect)


class FilterModule(object):
    """llama_build filters."""

    def filters(self):
        return guard_filters({
            "llama_build_cpu_flags": cpu_flags,
            "llama_build_cpu_isa": cpu_isa,
            "llama_build_cuda_architectures": cuda_architectures,
            "llama_build_cmake_args": cmake_args,
            "llama_build_flags_hash": flags_hash,
            "llama_build_key": build_key,
            "llama_build_is_full_sha": is_full_sha,
            "llama_build_check_pin": check_pin,
            "llama_build_engine_flag_set": engine_flag_set,
            "llama_build_flag_argv": flag_argv,
            "llama_build_help_flags": help_flags,
            "llama_build_parse_errors": parse_errors,
            "llama_build_missing_in_help": missing_in_help,
            "llama_build_version_commit": version_commit,
            "llama_build_prune": builds_to_prune,
        }, AnsibleFilterError)
