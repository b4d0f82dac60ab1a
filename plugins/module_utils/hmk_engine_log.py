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

Lines may carry any prefix (journald's, `[pid] `, mainline's `0.00.109.727 I `): patterns are searched, not
anchored. Pure Python, no Ansible: the inference_service and doctor filters and the unit tests import it.
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
OOM = re.compile(r"(cudaMalloc failed: out of memory|CUDA error: out of memory|"
                 r"failed to allocate (CUDA\d+) buffer|unable to allocate (CUDA\d+) buffer)")
OOM_DEVICE = re.compile(r"allocating [0-9.]+ MiB on device (\d+)|(CUDA\d+) buffer")
LOAD_ERROR = re.compile(r"error loading model: (.+?)\s*$")


def parse(text):
    """The facts one engine start logged, as a dict (absent facts are None or empty)."""
    cuda = {"device_count": None, "error": None, "devices": [], "gpu_layers_ignored": None, "none_found": False}
    out = {"cuda": cuda, "offloaded": None, "overrides": [], "weights_mib": {}, "kv_mib": {}, "compute_mib": {},
           "oom": [], "load_error": None}
    for raw in str(text or "").splitlines():
        line = raw.rstrip()
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
        match = OFFLOADED.search(line)
        if match:
            out["offloaded"] = {"layers": int(match.group(1)), "of": int(match.group(2))}
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
        match = WEIGHTS.search(line)
        if match:
            _add(out["weights_mib"], match.group(1), match.group(2))
            continue
        if OOM.search(line):
            out["oom"].append(line.strip())
        match = LOAD_ERROR.search(line)
        if match:
            out["load_error"] = match.group(1)
    return out


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
    Returns {"ok", "cpu_only", "differences": [{check, found, expected, fix}], "checks": [{check, status, detail}]}.
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
    want = len(gpus)
    found = cuda.get("device_count")
    if cuda.get("error"):
        record("cuda_devices", False, "ggml_cuda_init: failed to initialize CUDA: %s" % cuda["error"],
               "%d CUDA device(s)" % want, _cuda_fix(cuda["error"]))
    elif cuda.get("none_found"):
        record("cuda_devices", False, "the engine found no CUDA device", "%d CUDA device(s)" % want,
               _cuda_fix("no CUDA devices"))
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
    if offloaded is None:
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
    kv_total = sum(v for k, v in kv.items() if k.startswith("CUDA"))
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

    oom = parsed.get("oom") or []
    if oom:
        record("out_of_memory", False, oom[0], "no allocation failure",
               "%s ran out of memory: put fewer expert layers on the GPUs (inference_service_gpu_expert_layers), "
               "lower inference_service_ctx or -ub, or raise inference_service_gpu_compute_reserve_gib."
               % (", ".join(oom_devices(oom)) or "a GPU"))
    if parsed.get("load_error"):
        record("model_load", False, "error loading model: %s" % parsed["load_error"], "the model loads",
               "See the out_of_memory check, or the model path and its splits (playbooks/models.yml verifies them).")

    cpu_only = bool(cuda.get("error") or cuda.get("none_found") or found in (None, 0) or cuda.get("gpu_layers_ignored")
                    or (offloaded is not None and offloaded["layers"] == 0))
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
    return {"ok": not differences, "cpu_only": cpu_only and bool(gpus), "differences": differences, "checks": checks}


def summary(result):
    """One line per difference, for a failure message."""
    return ["%s: found %s; expected %s. Fix: %s" % (d["check"], d["found"], d["expected"], d["fix"])
            for d in result.get("differences") or []]
