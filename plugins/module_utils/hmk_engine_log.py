# -*- coding: utf-8 -*-
"""What a llama.cpp-family engine says about its GPUs at start, and whether that is what the kit planned.

The node proves the placement from the engine's own words: the CUDA devices it found (or why it found none),
the layers it offloaded, where each -ot rule sent each tensor, the weights and KV cache per device, any
out-of-memory; and from the driver's: the GPU memory the process holds (nvidia-smi --query-compute-apps).
Formats read (see tests/fixtures/engine-logs/INDEX.md for the real logs they come from):

- ik_llama.cpp: `llm_load_tensors: offloaded N/M layers to GPU`, `Tensor NAME [(size = X MiB)] buffer type
  overriden to BUF` at info level, `llm_load_tensors: CUDA0 buffer size = X MiB`;
- mainline llama.cpp: `load_tensors: offloaded N/M layers to GPU`, `load_tensors: CUDA0 model buffer size =
  X MiB`, override lines only with -v (`tensor NAME (...) buffer type overridden to BUF`);
- both: `ggml_cuda_init: found N CUDA devices[ (Total VRAM: X MiB)]:`, `Device i: NAME, compute capability
  X.Y, ...`, `ggml_cuda_init: failed to initialize CUDA: REASON`, `llama_kv_cache_init: CUDA0 KV buffer size
  = X MiB`, `cudaMalloc failed: out of memory`.

Lines may carry any prefix (journald's, `[pid] `, mainline's `0.00.109.727 I `, colour codes): patterns are
searched, not anchored. Pure Python, no Ansible: the inference_service and doctor filters and the unit tests import it.

The placement is judged from all the evidence the log holds, not from its first lines alone: a journal that
rotated, or a doctor run long after the start, keeps the buffers (`CUDA0 buffer size`, `CUDA0 model buffer
size`, `CUDA0 KV buffer size`, `CUDA0 compute buffer size`, under any of the prefixes `llm_load_tensors:`,
`load_tensors:`, `llama_kv_cache_init:`, `llama_kv_cache_unified:`, `llama_kv_cache:`, `llama_context:`,
`llama_new_context_with_model:`), `offloaded N/M layers to GPU` and newer builds' `using device CUDA0 (NAME)`
while the `ggml_cuda_init` line is gone. `CUDA_Host` buffers are pinned host RAM, never GPU memory. CUDA errors
are named by class (see CUDA_ERROR_CLASSES) with the line that showed them and what to try.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

MIB = 1024 ** 2

CUDA_FOUND = re.compile(r"ggml_cuda_init: found (\d+) CUDA devices")
CUDA_FAILED = re.compile(r"ggml_cuda_init: failed to initialize CUDA: (.+?)\s*$")
# ggml before 2024-04 said ggml_init_cublas; both report a driver that sees no device this way.
CUDA_NONE = re.compile(r"ggml_(?:init_cublas|cuda_init): no CUDA devices found")
DEVICE = re.compile(r"Device (\d+): (.+?), compute capability (\d+)\.(\d+)(?:.*?VRAM: (\d+) MiB)?")
GPU_LAYERS_IGNORED = re.compile(r"(no usable GPU found|not compiled with GPU offload support), "
                                r"--gpu-layers option will be ignored")
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
OVERRIDE = re.compile(r"[Tt]ensor (\S+) (?:\([^)]*\) )?buffer type overrid+en to (\S+)")
WEIGHTS = re.compile(r"(?:llm_)?load_tensors:\s+(\S+) (?:model )?buffer size =\s+([0-9.]+) MiB")
KV = re.compile(r"\s(\S+) KV buffer size =\s+([0-9.]+) MiB")
COMPUTE = re.compile(r":\s+(\S+) compute buffer size =\s+([0-9.]+) MiB")
OUTPUT = re.compile(r":\s+(\S+)\s+output buffer size =\s+([0-9.]+) MiB")
OOM = re.compile(r"(cudaMalloc failed: out of memory|CUDA error: out of memory|"
                 r"failed to allocate (CUDA\d+) buffer|unable to allocate (CUDA\d+) buffer)")
OOM_DEVICE = re.compile(r"allocating [0-9.]+ MiB on device (\d+)|(CUDA\d+) buffer")
LOAD_ERROR = re.compile(r"error loading model: (.+?)\s*$")
# Newer builds name each device the model is loaded on: `using device CUDA0 (NVIDIA H200) (0000:01:00.0) - N MiB free`.
USING_DEVICE = re.compile(r"using device (CUDA\d+) \((.+?)\)(?: \([0-9A-Fa-f:.]+\))?(?: - (\d+) MiB free)?")
ASSIGNED = re.compile(r"layer\s+\d+ assigned to device (CUDA\d+)")
OFFLOADING = re.compile(r"offloading (\d+) repeating layers to GPU")
# Lines every build prints before the weights are loaded: when one is there, the log holds the start of this run.
START = re.compile(r"ggml_cuda_init:|ggml_init_cublas:|load_backend:|register_backend:|^\s*Log start\s*$|"
                   r"\bbuild(?:_info)?(?: =|:) |built with |system[_ ]info|\"build info\"|llama_model_loader: |"
                   r"llm_load_print_meta: |print_info: |llm_load_vocab: |main: loading model|log_info: |device_info:")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GPU_BUFFER = re.compile(r"^CUDA(\d+|_Split)$")
HOST_BUFFER = re.compile(r"^(CPU\w*|CUDA_Host)$")

# CUDA errors, old form `CUDA error 209 at FILE:LINE: MSG` / `cuBLAS error 15 at FILE:LINE: MSG`, and the form since
# 2024: `CUDA error: MSG`, then `current device: N, in function F at FILE:LINE`, then the failing call.
CUDA_ERROR_OLD = re.compile(r"\b(CUDA|cuBLAS) error (\d+) at (\S+?:\d+): (.+?)\s*$")
CUDA_ERROR_NEW = re.compile(r"CUDA error: (.+?)\s*$")
CUDA_ERROR_AT = re.compile(r"current device: (\d+)(?:, in function (\S+) at (\S+?:\d+))?")
CUDA_ERROR_ABORT = re.compile(r"(\S+\.cu:\d+): CUDA error\s*$")
CUDA_OP_FAILED = re.compile(r"ggml_cuda_compute_forward: (\S+) failed")
CUDA_CALL = re.compile(r"\b((?:cublas|cuda|cu)[A-Z]\w*\(.*)$")
# (class, what the line says) in the order they are tried: the first that matches names the error.
CUDA_ERROR_CLASSES = (
    ("no_kernel_image", re.compile(r"no kernel image is available|device kernel image is invalid|"
                                   r"CUDA error 209\b|cudaErrorNoKernelImageForDevice", re.I)),
    ("out_of_memory", re.compile(r"out of memory|cudaMalloc failed|failed to allocate (CUDA\d+|CUDA_Host) buffer|"
                                 r"unable to allocate (CUDA\d+|CUDA_Host) buffer|CUBLAS_STATUS_ALLOC_FAILED", re.I)),
    ("illegal_memory_access", re.compile(r"illegal memory access|cudaErrorIllegalAddress|misaligned address", re.I)),
    ("cublas", re.compile(r"CUBLAS_STATUS_\w+|cuBLAS error|\bcublas\w*", re.I)),
    ("cuda_error", re.compile(r"CUDA error", re.I)),
)
CUDA_ERROR_HINTS = {
    "no_kernel_image": "The engine's CUDA kernels were not built for this GPU's compute capability{cc}: rebuild the "
                       "engine with CMAKE_CUDA_ARCHITECTURES that includes it (the hardware profile's gpus.arch, e.g. "
                       "90 for H100/H200, 89 for RTX 40xx, 120 for RTX 50xx, which needs CUDA >= 12.8; llama_build "
                       "renders it, playbooks/engines.yml), then restart the service.",
    "cublas": "cuBLAS refused or failed a matrix multiply{status}. NOT_SUPPORTED or an unsupported value usually "
              "means the GPU or the cuBLAS version lacks that data type or shape (old compute capability, a "
              "toolkit newer than the driver): use the toolkit the driver supports and rebuild, or add "
              "-DGGML_CUDA_FORCE_MMQ=ON to llama_build_extra_cmake_args so ggml's own kernels do the work; "
              "EXECUTION_FAILED points at the driver or "
              "the GPU: read `dmesg | grep -i xid`, update the driver, re-run the GPU check.",
    "illegal_memory_access": "A GPU kernel touched memory outside its buffers: an engine bug for this model and "
                             "these flags, or a failing GPU. Read `dmesg | grep -i xid` (Xid 13/31/43: the "
                             "program; 48/63/64/74/79: the hardware), undo the last flag change (-fa, -mla, -amb, "
                             "-ot, -ub), move the engine pin, and report it upstream with this log.",
    "out_of_memory": "{device} ran out of memory: put fewer expert layers on the GPUs "
                     "(inference_service_gpu_expert_layers), lower inference_service_ctx or -ub, or raise "
                     "inference_service_gpu_compute_reserve_gib.",
    "out_of_memory_host": "Pinned host memory (CUDA_Host) could not be allocated: free RAM on the host, raise "
                          "LimitMEMLOCK in the unit, or lower inference_service_ctx.",
    "cuda_error": "A CUDA call failed{where}: read the lines around it (`journalctl -u UNIT -b -o cat`), check "
                  "`nvidia-smi` and `dmesg | grep -i xid` for a GPU fault, and move the engine pin or report it "
                  "upstream with the log.",
}


def parse(text):
    """The facts one engine start logged, as a dict (absent facts are None or empty).

    Besides the per-line facts: log_start_seen (a line from before the weights were loaded is there),
    devices_used (newer builds' `using device CUDA0 (NAME)`), gpu_mib / host_mib (every buffer by where it lives:
    CUDAn and CUDA_Split on GPUs; CPU, CPU_Mapped, CUDA_Host, ... in host RAM, pinned_host_mib the CUDA_Host
    share), cuda_errors (classified, see cuda_errors()) and placement (the verdict from all of it, see placement()).
    """
    cuda = {"device_count": None, "error": None, "devices": [], "gpu_layers_ignored": None, "none_found": False}
    out = {"cuda": cuda, "offloaded": None, "overrides": [], "weights_mib": {}, "kv_mib": {}, "compute_mib": {},
           "oom": [], "load_error": None, "log_start_seen": False, "devices_used": [], "assigned": [],
           "offloading": None, "output_mib": {}}
    lines = [ANSI.sub("", raw).rstrip() for raw in str(text or "").splitlines()]
    for line in lines:
        if not out["log_start_seen"] and START.search(line):
            out["log_start_seen"] = True
        match = CUDA_FOUND.search(line)
        if match:
            cuda["device_count"] = int(match.group(1))
            continue
        match = CUDA_FAILED.search(line)
        if match:
            cuda["error"] = match.group(1)
            continue
        if CUDA_NONE.search(line):
            cuda["none_found"] = True
            continue
        match = GPU_LAYERS_IGNORED.search(line)
        if match:
            cuda["gpu_layers_ignored"] = match.group(0)
            continue
        match = DEVICE.search(line)
        if match:
            cuda["devices"].append({"index": int(match.group(1)), "name": match.group(2),
                                    "compute_capability": "%s.%s" % (match.group(3), match.group(4)),
                                    "vram_mib": int(match.group(5)) if match.group(5) else None})
            continue
        match = USING_DEVICE.search(line)
        if match:
            out["devices_used"].append({"device": match.group(1), "name": match.group(2),
                                        "free_mib": int(match.group(3)) if match.group(3) else None})
            continue
        match = ASSIGNED.search(line)
        if match:
            if match.group(1) not in out["assigned"]:
                out["assigned"].append(match.group(1))
            continue
        match = OFFLOADED.search(line)
        if match:
            out["offloaded"] = {"layers": int(match.group(1)), "of": int(match.group(2))}
            continue
        match = OFFLOADING.search(line)
        if match:
            out["offloading"] = int(match.group(1))
            continue
        match = OVERRIDE.search(line)
        if match:
            out["overrides"].append({"tensor": match.group(1), "buffer": match.group(2)})
            continue
        match = KV.search(line)
        if match:
            _add(out["kv_mib"], match.group(1), match.group(2))
            continue
        match = COMPUTE.search(line)
        if match:
            _add(out["compute_mib"], match.group(1), match.group(2))
            continue
        match = OUTPUT.search(line)
        if match:
            _add(out["output_mib"], match.group(1), match.group(2))
            continue
        match = WEIGHTS.search(line)
        if match:
            _add(out["weights_mib"], match.group(1), match.group(2))
            continue
        if OOM.search(line):
            out["oom"].append(line.strip())
        match = LOAD_ERROR.search(line)
        if match:
            out["load_error"] = match.group(1)
    out["gpu_mib"], out["host_mib"] = _memory(out)
    out["pinned_host_mib"] = round(sum(v for k, v in out["host_mib"].items() if k == "CUDA_Host"), 2)
    out["cuda_errors"] = cuda_errors(lines, cuda)
    out["placement"] = placement(out)
    return out


def is_gpu_buffer(name):
    """CUDA0, CUDA1, ... and CUDA_Split live in GPU memory; CUDA_Host is pinned host RAM."""
    return bool(GPU_BUFFER.match(str(name or "")))


def _memory(facts):
    """Every buffer the log sized, by where it lives: ({CUDA0: MiB}, {CPU: MiB, CUDA_Host: MiB, ...})."""
    gpu, host = {}, {}
    for kind in ("weights_mib", "kv_mib", "compute_mib", "output_mib"):
        for name, mib in (facts.get(kind) or {}).items():
            if is_gpu_buffer(name):
                _add(gpu, name, mib)
            elif HOST_BUFFER.match(name):
                _add(host, name, mib)
    return gpu, host


def placement(facts):
    """Where the engine put the model, judged from all the evidence in the log.

    Returns {verdict: "gpu" | "cpu_only" | "unknown", log_start_seen, gpu_devices, evidence, cpu_evidence}.
    Explicit CPU-only evidence (CUDA init failed, no CUDA device, -ngl ignored, 0 layers offloaded, every weight
    and KV buffer in host memory) decides first; then any device evidence (GPU buffers, layers offloaded or
    assigned to a CUDA device, `using device CUDAn`, tensors overridden to one, a CUDA error of a running backend)
    means GPU placement even when the log's first lines are gone; a log that shows its start and no device
    evidence is CPU-only; a log that shows neither is unknown (the journal no longer holds this start).
    """
    cuda = facts.get("cuda") or {}
    offloaded = facts.get("offloaded")
    gpu = facts.get("gpu_mib") or {}
    cpu_evidence = []
    if cuda.get("error"):
        cpu_evidence.append("ggml_cuda_init: failed to initialize CUDA: %s" % cuda["error"])
    if cuda.get("none_found"):
        cpu_evidence.append("no CUDA devices found")
    if cuda.get("gpu_layers_ignored"):
        cpu_evidence.append(cuda["gpu_layers_ignored"])
    if offloaded is not None and offloaded["layers"] == 0:
        cpu_evidence.append("offloaded 0/%d layers to GPU" % offloaded["of"])
    weights, kv = facts.get("weights_mib") or {}, facts.get("kv_mib") or {}
    if weights and kv and not any(is_gpu_buffer(name) for name in list(weights) + list(kv)):
        # the load is complete (the KV cache comes after the weights) and nothing of the model is on a GPU, whatever
        # an `offloaded N/M` line claims: a build without CUDA says so with -ngl given
        cpu_evidence.append("every weight and KV buffer is in host memory (%s)"
                            % ", ".join(sorted(set(weights) | set(kv))))
    evidence = []
    for kind, label in (("weights_mib", "weights"), ("kv_mib", "KV cache"), ("compute_mib", "compute")):
        on_gpu = dict((k, v) for k, v in (facts.get(kind) or {}).items() if is_gpu_buffer(k))
        if on_gpu:
            evidence.append("%s on %s" % (label, ", ".join("%s %.2f MiB" % (k, on_gpu[k]) for k in _by_index(on_gpu))))
    if offloaded is not None and offloaded["layers"] > 0:
        evidence.append("offloaded %d/%d layers to GPU" % (offloaded["layers"], offloaded["of"]))
    elif offloaded is None and facts.get("offloading"):
        evidence.append("offloading %d repeating layers to GPU" % facts["offloading"])
    for used in facts.get("devices_used") or []:
        evidence.append("using device %s (%s)" % (used["device"], used["name"]))
    if facts.get("assigned"):
        evidence.append("layers assigned to %s" % ", ".join(facts["assigned"]))
    overridden = set(o["buffer"] for o in facts.get("overrides") or [] if is_gpu_buffer(o["buffer"]))
    if overridden:
        evidence.append("tensors overridden to %s" % ", ".join(_by_index(overridden)))
    failed_on_gpu = [e["class"] for e in facts.get("cuda_errors") or [] if e["class"] != "init_failure"]
    if failed_on_gpu:
        # the CUDA backend was running when it failed: the failure is judged on its own, not as CPU-only
        evidence.append("the CUDA backend ran and failed (%s)" % ", ".join(sorted(set(failed_on_gpu))))
    devices = set(gpu) | set(facts.get("assigned") or []) | set(u["device"] for u in facts.get("devices_used") or [])
    devices |= overridden
    devices.discard("CUDA_Split")
    start = bool(facts.get("log_start_seen"))
    if cpu_evidence:
        verdict = "cpu_only"
    elif evidence:
        verdict = "gpu"
    elif start and (cuda.get("device_count") in (None, 0) or facts.get("host_mib")):
        # the start is there and nothing went to a GPU: no CUDA backend, or a CUDA build that loaded
        # every weight into host memory
        verdict = "cpu_only"
        cpu_evidence.append("the log shows the start and no GPU buffer, offload or device line")
    else:
        verdict = "unknown"
    return {"verdict": verdict, "log_start_seen": start, "gpu_devices": _by_index(devices),
            "evidence": evidence, "cpu_evidence": cpu_evidence}


def _by_index(names):
    return sorted(names, key=lambda n: (len(n), n))


def cuda_errors(lines, cuda=None):
    """CUDA errors in log lines, by class, each once: [{class, line, message, function, location, device, op, call,
    count, hint}] in the order first seen. Classes: no_kernel_image, out_of_memory, illegal_memory_access, cublas,
    init_failure, cuda_error (any other, with the file:line of the failing call). cuda: parse()'s cuda facts, for
    the compute capability the kernel-image hint names."""
    found, pending_op, abort_at = [], None, None
    rows = [ANSI.sub("", str(raw)).rstrip() for raw in (lines or [])]
    for index, line in enumerate(rows):
        match = CUDA_OP_FAILED.search(line)
        if match:
            pending_op = match.group(1)
            continue
        match = CUDA_ERROR_ABORT.search(line)
        if match and not CUDA_ERROR_NEW.search(line):
            abort_at = match.group(1)
            continue
        item = _error_item(line)
        if item is None:
            continue
        for follow in rows[index + 1:index + 3]:
            at = CUDA_ERROR_AT.search(follow)
            if at:
                item["device"] = int(at.group(1))
                item["function"] = at.group(2) or item["function"]
                item["location"] = at.group(3) or item["location"]
                continue
            call = CUDA_CALL.search(follow)
            if call and item["function"]:
                item["call"] = call.group(1).strip()
            break
        item["location"] = item["location"] or abort_at
        item["op"], pending_op, abort_at = pending_op, None, None
        if not item.get("class"):
            text = " ".join(str(v) for v in (item["line"], item["function"], item["call"]) if v)
            item["class"] = next((name for name, pattern in CUDA_ERROR_CLASSES if pattern.search(text)), "cuda_error")
        _merge(found, item)
    for item in found:
        item["hint"] = _error_hint(item, cuda or {})
    return found


def _error_item(line):
    """The error one line starts, or None."""
    item = {"line": line.strip(), "message": None, "location": None, "function": None, "device": None, "call": None}
    failed, none = CUDA_FAILED.search(line), CUDA_NONE.search(line)
    if failed or none:
        item.update({"class": "init_failure", "function": "ggml_cuda_init",
                     "message": failed.group(1) if failed else "no CUDA devices found"})
        return item
    old = CUDA_ERROR_OLD.search(line)
    if old:
        item["location"] = old.group(3)
        item["message"] = old.group(4)
        if old.group(1) == "cuBLAS":
            item["message"] = "cuBLAS error %s: %s" % (old.group(2), old.group(4))
        return item
    new = CUDA_ERROR_NEW.search(line)
    if new or OOM.search(line):
        item["message"] = new.group(1) if new else line.strip()
        return item
    return None


def _merge(found, item):
    for seen in found:
        if (seen["class"], seen["message"], seen["location"]) == (item["class"], item["message"], item["location"]):
            seen["count"] += 1
            return
    item["count"] = 1
    found.append(item)


def _error_hint(item, cuda):
    kind = item["class"]
    if kind == "init_failure":
        return _cuda_fix(item["message"])
    if kind == "no_kernel_image":
        devices = cuda.get("devices") or []
        caps = sorted(set(d["compute_capability"] for d in devices))
        return CUDA_ERROR_HINTS[kind].format(cc=" (compute capability %s)" % ", ".join(caps) if caps else "")
    if kind == "cublas":
        status = re.search(r"CUBLAS_STATUS_\w+", " ".join(str(v) for v in (item["message"], item["call"]) if v))
        return CUDA_ERROR_HINTS[kind].format(status=" (%s)" % status.group(0) if status else "")
    if kind == "out_of_memory":
        if "CUDA_Host" in item["line"]:
            return CUDA_ERROR_HINTS["out_of_memory_host"]
        named = oom_devices([item["line"]])
        if item["device"] is not None and not named:
            named = ["CUDA%d" % item["device"]]
        return CUDA_ERROR_HINTS[kind].format(device=", ".join(named) or "a GPU")
    where = " in %s" % item["function"] if item["function"] else ""
    if item["location"]:
        where += " at %s" % item["location"].rsplit("/", 1)[-1]
    return CUDA_ERROR_HINTS["cuda_error"].format(where=where)


def _add(table, device, mib):
    table[device] = round(table.get(device, 0.0) + float(mib), 2)


def oom_devices(lines):
    """CUDA devices named in out-of-memory lines, e.g. ['CUDA0']."""
    found = []
    for line in lines or []:
        for match in OOM_DEVICE.finditer(line):
            name = match.group(2) or ("CUDA%s" % match.group(1))
            if name not in found:
                found.append(name)
    return found


# ----------------------------------------------------------------------------------------- nvidia-smi

def parse_smi_gpus(text):
    """`nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits` -> {uuid: index}."""
    gpus = {}
    for line in str(text or "").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 2 and fields[0].isdigit():
            gpus[fields[1]] = int(fields[0])
    return gpus


def parse_smi_apps(text, gpus):
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`.

    Returns [{pid, gpu (nvidia-smi index, or None), used_mib (None when the driver says [N/A])}].
    """
    apps = []
    for line in str(text or "").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        used = fields[2]
        apps.append({"pid": int(fields[0]), "gpu": gpus.get(fields[1]),
                     "used_mib": int(float(used)) if re.match(r"^[0-9.]+$", used) else None})
    return apps


# --------------------------------------------------------------------------------------------- proof

def _rule_parts(rule):
    pattern, _unused, buffer = str(rule).rpartition("=")
    return pattern, buffer


def _gib(n_bytes):
    return "%.2f GiB" % (n_bytes / float(1024 ** 3))


def _cuda_fix(error):
    text = (error or "").lower()
    if "no cuda-capable device" in text or "no cuda devices" in text or "no usable gpu" in text:
        return ("The engine sees no GPU although the node has some. Check, in this order: the unit's device "
                "rules (`systemctl show -p DeviceAllow,DevicePolicy UNIT`: char-nvidia* must be allowed), that "
                "/proc/devices lists nvidia (or nvidia-frontend) and nvidia-uvm, that /dev/nvidia-uvm exists "
                "(`systemctl status hmk-nvidia-device-nodes.service`, it runs nvidia-modprobe -u -c=0), and that "
                "`nvidia-smi` lists the GPUs; then restart the service.")
    if "insufficient" in text or "unsupported display driver" in text:
        return ("The engine was built with a CUDA toolkit newer than the loaded driver supports: install a driver "
                "branch that supports it (nvidia_driver_branch) and reboot, or rebuild the engine with the "
                "toolkit the driver supports (playbooks/engines.yml).")
    if "not yet initialized" in text:
        return ("The driver is loaded but not ready (on NVSwitch systems nvidia-fabricmanager must run; otherwise "
                "the GPU fell off the bus: `dmesg | grep -iE 'nvrm|xid'`). Fix that, then restart the service.")
    if "unknown error" in text or "initialization error" in text:
        return ("CUDA could not open a device: usually /dev/nvidia-uvm is missing or the user-space driver does "
                "not match the kernel module. Run `systemctl restart hmk-nvidia-device-nodes.service` and "
                "`nvidia-smi`; after a driver upgrade, reboot.")
    return "Read the engine's first lines (`journalctl -u UNIT -b -o cat | head -50`) and `nvidia-smi`; fix, then restart."


def evaluate(parsed, plan, apps=None, pid=None):
    """Compare what the engine and the driver report with the plan; every difference with its fix.

    parsed: parse() of the engine's log of this start. plan: the plan record the role writes
    (NAME-plan.json: engine, override_tensor, plan{gpus[], n_layer, ngl, offloaded_layers, cpu_layers}).
    apps: parse_smi_apps() output, or None when nvidia-smi was not read. pid: the engine's main PID.
    Returns {"ok", "cpu_only", "differences": [{check, found, expected, fix}], "checks": [{check, status, detail}],
    "log_start_seen", "placement" (placement()), "cuda_errors" (cuda_errors())}. Without the log's start, the
    device count and the offloaded layers are judged from the buffers (or skipped), never called CPU-only.
    """
    inner = (plan or {}).get("plan") or {}
    gpus = inner.get("gpus") or []
    engine = (plan or {}).get("engine") or "ik_llama.cpp"
    rules = list((plan or {}).get("override_tensor") or inner.get("rules") or [])
    planned_rules = rules == list(inner.get("rules") or [])
    differences, checks = [], []

    def record(check, ok, detail, expected=None, fix=None):
        checks.append({"check": check, "status": "pass" if ok else "fail", "detail": detail})
        if not ok:
            differences.append({"check": check, "found": detail, "expected": expected, "fix": fix})

    def skip(check, detail):
        checks.append({"check": check, "status": "skip", "detail": detail})

    cuda = parsed.get("cuda") or {}
    place = parsed.get("placement") or placement(parsed)
    start = place["log_start_seen"]
    not_seen = "" if start else "; the start of the log was not seen (the journal no longer holds it)"
    want = len(gpus)
    found = cuda.get("device_count")
    if cuda.get("error"):
        record("cuda_devices", False, "ggml_cuda_init: failed to initialize CUDA: %s" % cuda["error"],
               "%d CUDA device(s)" % want, _cuda_fix(cuda["error"]))
    elif cuda.get("none_found"):
        record("cuda_devices", False, "the engine found no CUDA device", "%d CUDA device(s)" % want,
               _cuda_fix("no CUDA devices"))
    elif found is None and place["gpu_devices"]:
        seen = place["gpu_devices"]
        record("cuda_devices", len(seen) == want,
               "%d CUDA device(s) hold buffers or layers (%s); no ggml_cuda_init line%s"
               % (len(seen), ", ".join(seen), not_seen),
               "%d CUDA device(s), as hmk_hardware.gpus.count" % want,
               "The engine uses fewer GPUs than the profile has: the layer split (-ts in NAME.args) must give every "
               "GPU its block; re-run the role, or correct gpus.count in the hardware profile and re-plan.")
    elif found is None and place["verdict"] == "gpu":
        skip("cuda_devices", "no ggml_cuda_init line%s; the CUDA backend shows in: %s"
             % (not_seen, "; ".join(place["evidence"])))
    elif found is None and place["verdict"] == "unknown":
        record("cuda_devices", False, "the log has neither its start nor any GPU buffer, offload or device line",
               "%d CUDA device(s)" % want,
               "The journal no longer holds this start (rotated, or read long after it): read it with "
               "`journalctl -u UNIT -b -o cat`, or restart the service and run the proof again; nvidia-smi "
               "--query-compute-apps shows meanwhile whether the engine holds GPU memory.")
    elif found is None:
        record("cuda_devices", False, "the log has no ggml_cuda_init line: the engine build has no CUDA backend",
               "%d CUDA device(s)" % want,
               "Build the engine with CUDA: the profile's gpus.count and gpus.arch make llama_build configure "
               "-DGGML_CUDA=ON (playbooks/engines.yml), then restart the service.")
    else:
        names = ", ".join("%d: %s" % (d["index"], d["name"]) for d in cuda.get("devices") or [])
        record("cuda_devices", found == want, "%d CUDA device(s)%s" % (found, " (%s)" % names if names else ""),
               "%d CUDA device(s), as hmk_hardware.gpus.count" % want,
               "Make the engine see exactly the profile's GPUs: `nvidia-smi -L`, no CUDA_VISIBLE_DEVICES in the unit, "
               "every GPU seated (lspci -d 10de:), or correct gpus.count in the hardware profile and re-plan.")
    if cuda.get("gpu_layers_ignored"):
        record("gpu_layers", False, cuda["gpu_layers_ignored"], "-ngl honoured",
               _cuda_fix(cuda.get("error") or "no usable GPU"))

    offloaded = parsed.get("offloaded")
    n_layer = int(inner.get("n_layer") or 0)
    expected_layers = int(inner.get("offloaded_layers") or 0)
    if offloaded is None and not start and place["verdict"] != "cpu_only":
        skip("offloaded_layers", "no 'offloaded N/M layers to GPU' line in the part of the log that is left%s"
             % not_seen)
    elif offloaded is None:
        record("offloaded_layers", False, "no 'offloaded N/M layers to GPU' line",
               "%d/%d layers" % (expected_layers, n_layer + 1),
               "The engine did not reach loading the weights on a GPU: read the lines before (out of memory, "
               "CUDA errors) in `journalctl -u UNIT -b -o cat`.")
    else:
        got = "%d/%d layers" % (offloaded["layers"], offloaded["of"])
        ok = offloaded["layers"] == expected_layers and (not n_layer or offloaded["of"] == n_layer + 1)
        record("offloaded_layers", ok, got, "%d/%d layers (-ngl %s)" % (expected_layers, n_layer + 1, inner.get("ngl")),
               "The engine offloaded a different number of layers than -ngl asks: it could not use a GPU (see the "
               "cuda_devices check) or -ngl in inference_service_extra_args overrides the plan's.")

    overrides = parsed.get("overrides") or []
    if not overrides:
        if engine == "llama.cpp":
            skip("override_rules", "mainline llama.cpp logs tensor overrides only with -v; judged by the weights "
                                   "per device instead")
        elif not start:
            skip("override_rules", "no override line in the part of the log that is left (ik logs them before the "
                                   "buffers)%s; judged by the weights per device instead" % not_seen)
        elif place["verdict"] == "cpu_only":
            # ik_llama.cpp from 8337e4cd loads with -ngl 0 when it finds no GPU and then drops -ot (src/llama.cpp,
            # llama_model_load_from_file): no override line is expected, and the CPU-only start is reported above.
            skip("override_rules", "the engine used no GPU, so it applied no -ot rule (ik_llama.cpp drops them "
                                   "with -ngl 0); see the cuda_devices check")
        elif any(_rule_parts(r)[1].startswith("CUDA") for r in rules) or (rules and inner.get("cpu_layers")):
            record("override_rules", False, "no 'buffer type overriden' line in the log",
                   "every -ot rule matching tensors",
                   "The engine did not apply the -ot rules: check that the arguments file carries them "
                   "(NAME.args, one argument per line) and that the engine build accepts -ot.")
    else:
        by_buffer = {}
        for item in overrides:
            by_buffer.setdefault(item["buffer"], []).append(item["tensor"])
        for rule in rules:
            pattern, buffer = _rule_parts(rule)
            matched = [t for t in by_buffer.get(buffer, []) if re.search(pattern, t)]
            needed = buffer.startswith("CUDA") or (buffer == "CPU" and inner.get("cpu_layers"))
            if needed:
                record("override_rules", bool(matched), "-ot %s matched %d tensor(s)" % (rule, len(matched)),
                       "at least one tensor",
                       "The rule's regex matches no tensor name of this model (names look like "
                       "blk.N.ffn_up_exps.weight): fix inference_service_override_tensor, or drop it to use the plan.")
        if planned_rules:
            for index, gpu in enumerate(gpus):
                device = gpu["device"]
                layers = sorted(set(int(t.split(".")[1]) for t in by_buffer.get(device, [])
                                    if re.match(r"^blk\.\d+\.ffn_(up|down|gate)_exps\.weight$", t)))
                want_layers = sorted(gpu.get("layers") or [])
                record("expert_layers", layers == want_layers,
                       "%s holds the experts of layers %s" % (device, layers or "none"),
                       "%s: layers %s" % (device, want_layers or "none"),
                       "The engine placed experts differently from the plan: compare the -ot rules in NAME.args "
                       "with NAME-plan.md and re-run the role.")

    weights = parsed.get("weights_mib") or {}
    for gpu in gpus:
        device = gpu["device"]
        if device not in weights:
            if weights:
                record("weights", False, "%s has no weights buffer" % device,
                       "%s of weights" % _gib(gpu.get("weights_bytes") or 0),
                       "The GPU took no layer: the layer split differs from the plan's -ts (see NAME-plan.md).")
            continue
        got = weights[device] * MIB
        # The plan's weights come from the same GGUF's tensor table; half of an expert layer is the slack
        # (ik adds MLA matrices at load). Missing experts, or a layer more or less, fall outside it.
        layer = float(gpu.get("expert_bytes") or 0) / max(len(gpu.get("layers") or []), 1)
        planned = gpu.get("weights_bytes") or 0
        low = planned - layer / 2.0 if layer else 0.9 * planned
        high = gpu.get("expected_bytes") or got
        record("weights", low <= got <= high, "%s weights %s" % (device, _gib(got)),
               "between %s and %s (the plan's weights %s, its budget %s)" % (_gib(low), _gib(high), _gib(planned),
                                                                             _gib(high)),
               "The weights on this GPU are not what the plan put there: re-run the role so the plan, the -ts "
               "and the -ot rules agree, or lower inference_service_gpu_expert_layers.")

    kv = parsed.get("kv_mib") or {}
    kv_total = sum(v for k, v in kv.items() if is_gpu_buffer(k))  # CUDA_Host KV is pinned host RAM
    plan_kv = sum(g.get("kv_bytes") or 0 for g in gpus)
    if len(gpus) > 1 and kv_total and plan_kv:
        for gpu in gpus:
            share = kv.get(gpu["device"], 0.0) / kv_total
            want_share = float(gpu.get("kv_bytes") or 0) / plan_kv
            layers = int(round(share * n_layer)) if n_layer else 0
            want_count = (gpu["block"][1] - gpu["block"][0] + 1) if gpu.get("block") else 0
            record("layer_split", abs(share - want_share) <= 0.5 / max(n_layer, 1),
                   "%s holds the KV cache of about %d layer(s)" % (gpu["device"], layers),
                   "%s: %d layer(s) (%s)" % (gpu["device"], want_count,
                                             "-".join(str(b) for b in gpu.get("block") or []) or "none"),
                   "The engine split the layers differently from the plan: the -ts in NAME.args must be the plan's "
                   "(no -ts in inference_service_extra_args); re-run the role.")

    errors = parsed.get("cuda_errors") or []
    oom = parsed.get("oom") or [e["line"] for e in errors if e["class"] == "out_of_memory"]
    if oom:
        record("out_of_memory", False, oom[0], "no allocation failure",
               "%s ran out of memory: put fewer expert layers on the GPUs (inference_service_gpu_expert_layers), "
               "lower inference_service_ctx or -ub, or raise inference_service_gpu_compute_reserve_gib."
               % (", ".join(oom_devices(oom)) or "a GPU"))
    if parsed.get("load_error"):
        record("model_load", False, "error loading model: %s" % parsed["load_error"], "the model loads",
               "See the out_of_memory check, or the model path and its splits (playbooks/models.yml verifies them).")

    named = set()
    for error in errors:
        # init failures are the cuda_devices check's, out of memory the out_of_memory check's
        if error["class"] in ("init_failure", "out_of_memory") or error["class"] in named:
            continue
        named.add(error["class"])
        record("cuda_error", False, "%s: %s%s" % (error["class"], error["line"], _error_where(error)),
               "no CUDA error in the engine's log", error["hint"])

    if place["verdict"] == "cpu_only":
        record("placement", False, "CPU-only: %s" % "; ".join(place["cpu_evidence"]),
               "the model's layers on the GPUs", "See the cuda_devices and gpu_layers checks.")
    elif place["verdict"] == "gpu":
        record("placement", True, "on the GPUs: %s%s" % ("; ".join(place["evidence"]), not_seen))
    else:
        skip("placement", "the log shows no placement%s" % not_seen)
    cpu_only = place["verdict"] == "cpu_only"
    if apps is None:
        skip("gpu_memory", "nvidia-smi was not read")
    else:
        mine = [a for a in apps if pid is not None and a["pid"] == int(pid)]
        for index, gpu in enumerate(gpus):
            on_gpu = [a for a in mine if a["gpu"] == index]
            if not on_gpu:
                cpu_only = cpu_only or not mine
                record("gpu_memory", False, "PID %s holds no memory on GPU %d" % (pid, index),
                       "the engine on GPU %d" % index,
                       "The engine does not use this GPU: see the cuda_devices check; CUDA_DEVICE_ORDER=PCI_BUS_ID in "
                       "the unit makes CUDA%d nvidia-smi's GPU %d." % (index, index))
                continue
            used = [a["used_mib"] for a in on_gpu if a["used_mib"] is not None]
            if not used:
                skip("gpu_memory", "GPU %d: nvidia-smi reports [N/A] for the process's memory" % index)
                continue
            got = sum(used) * MIB
            budget = gpu.get("expected_bytes") or 0
            floor = 0.9 * (gpu.get("expert_bytes") or 0)
            record("gpu_memory", floor <= got <= budget, "GPU %d: the engine holds %s" % (index, _gib(got)),
                   "between %s and the plan's budget %s" % (_gib(floor), _gib(budget)),
                   "Above the budget: raise inference_service_gpu_compute_reserve_gib or put fewer expert layers "
                   "on this GPU (inference_service_gpu_expert_layers); below its experts: the -ot rules did not apply.")
    return {"ok": not differences, "cpu_only": cpu_only and bool(gpus), "differences": differences, "checks": checks,
            "log_start_seen": start, "placement": place, "cuda_errors": errors}


def _error_where(error):
    parts = []
    if error.get("op"):
        parts.append("op %s" % error["op"])
    if error.get("function"):
        parts.append("in %s" % error["function"])
    if error.get("location") and error["location"] not in error["line"]:
        parts.append("at %s" % error["location"].rsplit("/", 1)[-1])
    if error.get("call"):
        parts.append("calling %s" % error["call"].split("(", 1)[0])
    return " (%s)" % ", ".join(parts) if parts else ""


def summary(result):
    """One line per difference, for a failure message."""
    return ["%s: found %s; expected %s. Fix: %s" % (d["check"], d["found"], d["expected"], d["fix"])
            for d in result.get("differences") or []]
