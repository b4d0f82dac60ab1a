# -*- coding: utf-8 -*-
"""Build knowledge of the ktransformers_build role: guardrails and the rendered build plan.

KTransformers 0.2.x cannot be built without a CUDA torch and a GPU, so the role's decisions are
plain functions that tests/unit/test_engine_build.py checks: which combinations are refused before
anything is built, and the exact environment and commands of the build.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.\-]?(post|rc|a|b)(\d*))?$")
CPU_INSTRUCTS = ("NATIVE", "FANCY", "AVX512", "AVX2")
# Model architectures each release line can serve (0.2.x: DeepSeek family only).
QWEN3_MOE = ("qwen3_moe", "qwen3moe", "qwen3-moe")


def _fail(msg):
    raise AnsibleFilterError(msg)


def tag_version(tag):
    """'v0.2.4post1' -> (0, 2, 4); None when the version is not a release tag."""
    match = TAG.match(str(tag or "").strip())
    if not match:
        return None
    return tuple(int(match.group(i)) for i in (1, 2, 3))


def _flags(value):
    if isinstance(value, (list, tuple)):
        return {str(v).lower() for v in value}
    text = str(value or "")
    if ":" in text:
        text = text.split(":", 1)[1]
    return {w.lower() for w in text.split()}


def cpu_instruct(flags, override="auto"):
    """CPU_INSTRUCT for KTransformers' cmake: FANCY on AVX-512 with VNNI+VBMI+BF16 (Zen 4),
    AVX512 on plain AVX-512, AVX2 on Zen 2/3, NATIVE otherwise."""
    if override and override != "auto":
        if override not in CPU_INSTRUCTS:
            _fail("CPU_INSTRUCT must be one of %s or auto, not %r" % (", ".join(CPU_INSTRUCTS), override))
        return override
    flags = _flags(flags)
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        if {"avx512_vnni", "avx512vbmi", "avx512_bf16"} <= flags:
            return "FANCY"
        return "AVX512"
    if "avx2" in flags:
        return "AVX2"
    return "NATIVE"


def _archs(profile):
    gpus = (profile or {}).get("gpus") or {}
    if int(gpus.get("count") or 0) <= 0:
        return []
    arch = gpus.get("arch")
    if arch in (None, "", []):
        arch = {"RTX 4090": "89", "RTX 5090": "120", "H100": "90", "H200": "90"}.get(gpus.get("model"), "")
    items = arch if isinstance(arch, (list, tuple)) else re.split(r"[;,\s]+", str(arch))
    return sorted({re.sub(r"^sm_", "", str(a).strip().lower()) for a in items if str(a).strip()},
                  key=lambda a: int(re.match(r"\d+", a).group(0)) if re.match(r"\d+", a) else 0)


def _cuda_tuple(version):
    match = re.search(r"(\d+)\.(\d+)", str(version or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def guardrails(request):
    """Reasons the requested build must not start (empty list: go).

    request: version (tag), commit, allow_unpinned, profile (hmk_hardware), model_arch,
    cuda_version ("" when no toolkit), cuda_home.
    """
    reasons = []
    version = str(request.get("version") or "")
    ver = tag_version(version)
    commit = str(request.get("commit") or "")
    if not request.get("allow_unpinned"):
        if ver is None:
            reasons.append("ktransformers_build_version=%r is not a release tag (vX.Y.Z[postN]); set "
                           "ktransformers_build_allow_unpinned: true to build a branch or commit" % version)
        if not FULL_SHA.match(commit):
            reasons.append("ktransformers_build_commit=%r is not the full 40-character SHA the tag %s must "
                           "resolve to (a moved tag would otherwise go unnoticed)" % (commit, version))
    if ver is not None and ver < (0, 2, 4):
        reasons.append("KTransformers %s is older than v0.2.4post1, the oldest release the kit supports "
                       "(v0.2.4's install.sh needs USE_BALANCE_SERVE=1 and only post1 fixes it)" % version)
    model = str(request.get("model_arch") or "").lower()
    if model in QWEN3_MOE and ver is not None and ver < (0, 3, 0):
        reasons.append("Qwen3-MoE models need KTransformers v0.3 or newer; %s serves DeepSeek-V2/V3/R1 only. "
                       "Use a newer tag or serve this model with ik_llama.cpp" % version)
    archs = _archs(request.get("profile"))
    if not archs:
        reasons.append("KTransformers needs an NVIDIA GPU and a CUDA build of torch, and the hardware profile "
                       "declares none (hmk_hardware.gpus.count is 0); serve with ik_llama.cpp instead")
    if "120" in archs and ver is not None and ver < (0, 3, 0):
        reasons.append("RTX 5090 / sm_120 (Blackwell) does not work with KTransformers %s (0.2.x: torch/CUDA "
                       "12.8 and ABI issues); use v0.3.2 or newer, or ik_llama.cpp" % version)
    cuda = _cuda_tuple(request.get("cuda_version"))
    if cuda is None:
        reasons.append("no CUDA toolkit at %s (bin/nvcc does not run); KTransformers compiles CUDA "
                       "kernels: install the toolkit first (nvidia_driver role)" % (request.get("cuda_home") or "?"))
    elif "120" in archs and cuda < (12, 8):
        reasons.append("sm_120 needs CUDA >= 12.8, the node has %d.%d" % cuda)
    return reasons


def torch_for_cuda(cuda_version, table):
    """The torch wheel (version + index URL) matching the toolkit: the newest table row with
    cuda <= the node's toolkit and the same major version."""
    cuda = _cuda_tuple(cuda_version)
    if cuda is None:
        _fail("no CUDA toolkit version to match torch against")
    best = None
    for row in table or []:
        row_cuda = _cuda_tuple(row.get("cuda"))
        if row_cuda and row_cuda[0] == cuda[0] and row_cuda <= cuda and (best is None or row_cuda > best[0]):
            best = (row_cuda, row)
    if best is None:
        _fail("no torch build in ktransformers_build_torch_table matches CUDA %d.%d" % cuda)
    return best[1]


def build_plan(request):
    """Environment and commands of one KTransformers source build.

    request: root, key, cuda_home, cuda_version, profile, cpu_flags, cpu_instruct, use_numa, jobs,
    torch_table, python, extra_env.
    """
    profile = request.get("profile") or {}
    cpu = profile.get("cpu") or {}
    numa_nodes = int(cpu.get("sockets") or 1) * int(cpu.get("numa_nodes_per_socket") or 1)
    root = str(request["root"]).rstrip("/")
    build_dir = "%s/builds/%s" % (root, request["key"])
    venv = build_dir + "/venv"
    cuda_home = str(request.get("cuda_home") or "/usr/local/cuda")
    torch = torch_for_cuda(request.get("cuda_version"), request.get("torch_table"))
    archs = _archs(profile)
    env = {
        "CPU_INSTRUCT": cpu_instruct(request.get("cpu_flags"), request.get("cpu_instruct", "auto")),
        "USE_BALANCE_SERVE": "1",
        "KTRANSFORMERS_FORCE_BUILD": "TRUE",
        "CUDA_HOME": cuda_home,
        "CUDA_PATH": cuda_home,
        "TORCH_CUDA_ARCH_LIST": ";".join("%d.%d" % (int(a[:-1]), int(a[-1])) for a in
                                         (re.match(r"\d+", x).group(0) for x in archs)),
        "MAX_JOBS": str(int(request.get("jobs") or 1)),
        "VIRTUAL_ENV": venv,
        "PATH": "%s/bin:%s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" % (venv, cuda_home),
    }
    # USE_NUMA is on whenever it is defined (even =0) and then copies the experts onto every NUMA node:
    # it is set only on multi-node boxes that ask for it, and otherwise left out entirely.
    if request.get("use_numa") and numa_nodes > 1:
        env["USE_NUMA"] = "1"
    for key, value in (request.get("extra_env") or {}).items():
        if key == "USE_NUMA":
            _fail("set USE_NUMA through ktransformers_build_use_numa, not the extra environment")
        env[str(key)] = str(value)
    python = str(request.get("python") or "python3")
    pip = venv + "/bin/pip"
    commands = [
        [python, "-m", "venv", venv],
        [pip, "install", "--upgrade", "pip", "setuptools", "wheel", "packaging", "ninja", "cpufeature", "numpy"],
        [pip, "install", "torch==%s" % torch["torch"], "--index-url", torch["index_url"]],
        ["git", "-C", root + "/src", "submodule", "update", "--init", "--recursive"],
        ["bash", "install.sh"],
    ]
    return {"build_dir": build_dir, "venv": venv, "env": env, "commands": commands, "torch": torch,
            "chdir": root + "/src"}


def plan_hash(plan):
    """8 hex digits over the environment and commands, with the build directory (which is named
    after this hash) replaced by a placeholder."""
    blob = json.dumps({"env": plan["env"], "commands": plan["commands"]}, sort_keys=True)
    blob = blob.replace(plan["build_dir"], "<build>")
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]


def build_key(commit, plan):
    """builds/<commit12>-<planhash8>."""
    commit = str(commit or "").lower()
    if not FULL_SHA.match(commit):
        _fail("build key needs the full 40-character commit SHA, got %r" % commit)
    return "%s-%s" % (commit[:12], plan_hash(plan))


class FilterModule(object):
    """ktransformers_build filters."""

    def filters(self):
        return {
            "ktransformers_build_tag_version": tag_version,
            "ktransformers_build_cpu_instruct": cpu_instruct,
            "ktransformers_build_guardrails": guardrails,
            "ktransformers_build_torch_for_cuda": torch_for_cuda,
            "ktransformers_build_plan": build_plan,
            "ktransformers_build_plan_hash": plan_hash,
            "ktransformers_build_key": build_key,
        }
