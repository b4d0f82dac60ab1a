# -*- coding: utf-8 -*-
"""Findings of the doctor role: raw values read on a node in, ranked findings with fixes out.

The tasks only read (files, `systemctl show`, `journalctl`, `nvidia-smi`, `fincore`); every judgement,
every text a user sees and the ranking live here, so tests/unit/test_doctor.py can feed literal inputs.
The hardware facts arrive already parsed by the bios_checklist role's module (hmk_hardware_facts), and every
hardware judgement (NPS, memory nodes, channels, SMT, GPU links, ASPM, governor, the engine's ISA) comes from the
shared module_utils/hmk_hardware.py, so the preflight and the doctor cannot disagree about a node.

A finding: {id, severity (critical|warning|info|ok), title, evidence (what was read), fix}.
critical: the service is down, or the node loses a large share of its speed; warning: a measurable
loss or a risk; info: does not apply here, or cannot be told from inside this node; ok: as wanted.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_log, hmk_nvidia_devices
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hardware as hw
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

SEVERITIES = ("critical", "warning", "info", "ok")

# The troubleshooting tree, most decisive first: a service that does not start, then what stops a
# started one (flags, engine errors, driver), then what throws DRAM bandwidth away, then PCIe and power.
ORDER = ("service_state", "model_integrity", "engine_flags", "engine_errors", "nvidia_driver", "engine_isa", "platform",
         "gpu_present",
         "gpu_devices", "gpu_placement",
         "numa_balancing", "numa_nodes_per_socket", "numa_memoryless_cpu_nodes", "numa_memory_only_nodes",
         "numa_memory_placement", "memory_channels", "smt", "model_page_cache", "gpu_pcie_link", "pcie_aspm",
         "cpu_governor")

GIB = 1024 ** 3
MIB = 1024 ** 2

# What the engines print when their argument parser refuses something, and the flag each names:
# ik_llama.cpp (common.cpp), mainline llama.cpp (arg.cpp), KTransformers (argparse).
FLAG_ERRORS = (
    re.compile(r"error: unknown argument: (\S+)"),
    re.compile(r"error: invalid parameter for argument: (\S+)"),
    re.compile(r"error: invalid argument: (\S+)"),
    re.compile(r"error while handling argument \"([^\"]+)\""),
    re.compile(r"unrecognized arguments: (.+)$"),
)

# Replacements ../shared/BRIEF.md section 3 knows, by flag as the engine names it.
_FMOE = ("Remove -fmoe: since ik_llama.cpp 2025-10-25 fused MoE is on by default and the flag no longer "
         "exists (-no-fmoe turns it off). The seed's `-fa -fmoe` fails on every current commit.")
_FA = ("Write `-fa on`: since ik_llama.cpp 2025-11-13 (and in mainline llama.cpp) -fa takes a value "
       "(on|off|auto); a bare -fa swallows the next flag as its value. Flash attention is on by default.")
_MLA = ("Mainline llama.cpp has no MLA cache: drop -mla and -amb, or serve the model with ik_llama.cpp "
        "(inference_service_engine: ik_llama.cpp).")
_KT_INVENTED = ("Seed 002 invented this KTransformers flag; the server has no such option. Remove it "
                "(KTransformers 0.2.x takes --model_path, --gguf_path, --cpu_infer, --cache_lens, "
                "--max_new_tokens, --backend_type, --optimize_config_path).")
FLAG_FIXES = {
    "-fmoe": _FMOE,
    "--fused-moe": _FMOE,
    "-fa": _FA,
    "--flash-attn": _FA,
    "-mla": _MLA,
    "--mla-use": _MLA,
    "-amb": _MLA,
    "--attention-max-batch": _MLA,
    "--tensor-parallel-size": _KT_INVENTED,
    "--pipeline-parallel-size": _KT_INVENTED,
    "--prefetch-ahead": _KT_INVENTED,
    "--kv-cache-pool-size": _KT_INVENTED + " The KV cache is sized by --cache_lens.",
    "--power-throttle": _KT_INVENTED + " Cap GPU power with nvidia_driver_power_limit_w (nvidia-smi -pl).",
    "--cpu-offload-ratio": _KT_INVENTED + " Placement comes from --optimize_config_path rules.",
    "--enable-avx2": _KT_INVENTED + " The ISA is chosen at build time (CPU_INSTRUCT=AVX2).",
    "--avx2-thread-count": _KT_INVENTED + " Threads are --cpu_infer (physical cores).",
}

# Engine log lines that name a cause the doctor knows: (pattern, id suffix, title, fix).
ENGINE_ERRORS = (
    (re.compile(r"Driver/library version mismatch|CUDA driver version is insufficient", re.I),
     "The engine could not use the GPU driver",
     "See the nvidia_driver finding: reboot after a driver upgrade, and keep the driver packages held "
     "(nvidia_driver role)."),
    (re.compile(r"(cudaMalloc failed|CUDA error: out of memory|out of memory allocating|"
                r"failed to allocate CUDA\d* buffer)", re.I),
     "The engine ran out of GPU memory",
     "Put fewer expert layers on the GPU (inference_service_gpu_expert_layers), lower the context "
     "(inference_service_ctx) or -ub, or raise inference_service_gpu_compute_reserve_gib."),
    (re.compile(r"(mmap failed|failed to mmap|Cannot allocate memory|mlock failed|failed to mlock)", re.I),
     "The engine could not map or lock the model in memory",
     "Check free RAM against the model size, vm.max_map_count (>= 262144, kernel_tuning role) and "
     "LimitMEMLOCK=infinity in the unit when --mlock is used."),
    (re.compile(r"(failed to load model|error loading model|failed to open .*\.gguf|\.gguf\S*: No such file)", re.I),
     "The engine could not load the model",
     "Check inference_service_model_path (the first split, -00001-of-0000N.gguf), that every split is "
     "there (playbooks/models.yml verifies them) and that the service user can read it."),
)


def _finding(check_id, severity, title, evidence, fix):
    return {"id": check_id, "severity": severity, "title": title, "evidence": evidence, "fix": fix}


def _int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _lines(text):
    return [line for line in str(text or "").replace("\r\n", "\n").split("\n") if line.strip()]


def _size(n_bytes):
    if n_bytes >= GIB:
        return "%.1f GiB" % (n_bytes / float(GIB))
    return "%.1f MiB" % (n_bytes / float(MIB))


def _profile_get(profile, *path):
    value = profile or {}
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


# ------------------------------------------------------------------------------------ parsing

def parse_systemctl_show(text):
    """`systemctl show UNIT -p A -p B` -> {A: value, B: value}."""
    props = {}
    for line in _lines(text):
        if "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def nvidia_module_version(text):
    """/proc/driver/nvidia/version -> '570.86.15' (proprietary and open modules), or None."""
    match = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", str(text or "") + " ")
    return match.group(1) if match else None


def nvidia_library_versions(paths):
    """Versions of the libnvidia-ml.so.X.Y[.Z] files found on the node, sorted and unique."""
    versions = set()
    for path in paths or []:
        match = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", str(path))
        if match:
            versions.add(match.group(1))
    return sorted(versions)


def rejected_flags(lines):
    """Flags the engine's argument parser refused, in the order first seen: [(flag, log line)]."""
    found, seen = [], set()
    for line in lines or []:
        for pattern in FLAG_ERRORS:
            match = pattern.search(line)
            if not match:
                continue
            for flag in match.group(1).split():
                if flag.startswith("-") and flag not in seen:
                    seen.add(flag)
                    found.append((flag, line.strip()))
            break
    return found


def flag_fix(flag):
    """The replacement for a refused flag, where the brief knows one."""
    if flag in FLAG_FIXES:
        return FLAG_FIXES[flag]
    return ("Remove or replace %s: the installed engine build does not accept it. Compare with "
            "`llama-server --help` of the current build and the llama_build flag table "
            "(llama_build_engine_flags), then fix inference_service_extra_args." % flag)


def parse_fincore(text):
    """`fincore --bytes --noheadings --raw --output RES,SIZE FILE...` -> (resident bytes, size bytes)."""
    resident = size = 0
    seen = False
    for line in _lines(text):
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            resident += int(fields[0])
            size += int(fields[1])
            seen = True
    return (resident, size) if seen else (None, None)


def meminfo_kb(text, key):
    match = re.search(r"^%s:\s+(\d+) kB" % re.escape(key), str(text or ""), re.M)
    return int(match.group(1)) if match else None


def parse_governors(text):
    """`grep -r --include=scaling_governor . /sys/devices/system/cpu/cpufreq` -> {governor: policies}."""
    return hw.parse_governors(text)


# ------------------------------------------------------------------------------------- checks

def check_service(raw):
    svc = raw.get("service") or {}
    name = svc.get("name") or "hmk-inference.service"
    props = parse_systemctl_show(svc.get("show"))
    load = props.get("LoadState")
    if not props or load is None:
        return _finding("service_state", "info", "The state of %s could not be read" % name,
                        (svc.get("error") or "no output from systemctl show").strip(),
                        "Run the doctor on a systemd host; read `systemctl status %s` by hand." % name)
    if load == "not-found":
        return _finding("service_state", "info", "%s is not installed on this node" % name,
                        "LoadState=not-found",
                        "Nothing to diagnose in the service; deploy it with playbooks/serve.yml "
                        "(inference_service role) when the node should serve.")
    active, sub = props.get("ActiveState", "?"), props.get("SubState", "?")
    restarts = _int(props.get("NRestarts"), 0)
    evidence = "ActiveState=%s SubState=%s Result=%s ExecMainStatus=%s NRestarts=%s" % (
        active, sub, props.get("Result", "?"), props.get("ExecMainStatus", "?"), props.get("NRestarts", "?"))
    journal = "`journalctl -u %s -n 50 --no-pager`" % name
    if active == "failed" or (active == "activating" and sub == "auto-restart"):
        why = "exits at start" if props.get("Result") in ("exit-code", "start-limit-hit") else "stopped"
        return _finding(
            "service_state", "critical",
            "%s has failed (%s; %d restart(s))" % (name, why, restarts), evidence,
            "Fix the cause the next findings name (read %s), then `systemctl reset-failed %s && "
            "systemctl start %s`, or converge playbooks/serve.yml. The doctor restarts nothing." % (
                journal, name, name))
    if active == "active" and restarts > 0:
        return _finding("service_state", "warning", "%s runs but has restarted %d time(s)" % (name, restarts),
                        evidence,
                        "Something kills or crashes the engine (OOM killer, GPU errors): read %s and "
                        "`journalctl -k -g 'oom|nvidia|Xid'`." % journal)
    if active == "active":
        return _finding("service_state", "ok", "%s is running" % name, evidence, "Nothing to do.")
    if active in ("activating", "reloading"):
        return _finding("service_state", "info", "%s is starting (loading the model)" % name, evidence,
                        "Wait: /health answers 503 while the weights load (minutes for 355 GB from a cold "
                        "page cache); check again, or follow %s." % journal)
    return _finding("service_state", "warning", "%s is installed but not running" % name,
                    evidence + " UnitFileState=%s" % props.get("UnitFileState", "?"),
                    "Start it with `systemctl enable --now %s` (or converge playbooks/serve.yml)." % name)


def _service_state(raw):
    props = parse_systemctl_show((raw.get("service") or {}).get("show"))
    return props.get("LoadState"), props.get("ActiveState"), props.get("SubState")


def _service_down(raw):
    _load, active, sub = _service_state(raw)
    return active in ("failed", "inactive") or (active == "activating" and sub == "auto-restart")


def check_engine_flags(raw):
    load, _active, _sub = _service_state(raw)
    tail = raw.get("journal_tail") or []
    if load in (None, "not-found"):
        return [_finding("engine_flags", "info", "No refused flags to look for (the service is not installed)",
                         "LoadState=%s" % (load or "unknown"), "Nothing to do.")]
    refused = rejected_flags(tail)
    if not refused:
        return [_finding("engine_flags", "ok", "The engine refused no flag",
                         "no argument-parser error in the last %d journal line(s)" % len(tail), "Nothing to do.")]
    findings = []
    down = _service_down(raw)
    for flag, line in refused:
        if down:
            findings.append(_finding("engine_flags", "critical", "The engine refuses the flag %s" % flag, line,
                                     flag_fix(flag)))
        else:
            findings.append(_finding("engine_flags", "info",
                                     "The engine refused %s earlier; the service runs now" % flag, line,
                                     "Nothing to do now; if it comes back: " + flag_fix(flag)))
    return findings


def check_engine_errors(raw):
    load, _active, _sub = _service_state(raw)
    if load in (None, "not-found"):
        return [_finding("engine_errors", "info", "No engine errors to look for (the service is not installed)",
                         "LoadState=%s" % (load or "unknown"), "Nothing to do.")]
    findings = []
    tail = raw.get("journal_tail") or []
    severity = "critical" if _service_down(raw) else "warning"
    last = {}
    for line in tail:  # a line counts for the first cause it names
        for index, (pattern, _title, _fix) in enumerate(ENGINE_ERRORS):
            if pattern.search(line):
                last[index] = line.strip()
                break
    for index, (_pattern, title, fix) in enumerate(ENGINE_ERRORS):
        if index in last:
            findings.append(_finding("engine_errors", severity, title, last[index], fix))
    # CUDA errors the causes above do not cover, by class, with the failing function and the engine log's hint
    # (an engine that crashed on one is down, so the gpu_placement check cannot read them from a running start)
    for error in hmk_engine_log.cuda_errors(tail):
        if error["class"] in ("out_of_memory", "init_failure"):
            continue
        findings.append(_finding("engine_errors", severity, "CUDA error in the engine: %s" % error["class"],
                                 _cuda_error_evidence(error), error["hint"]))
    warnings = [line.strip() for line in raw.get("journal_warnings") or []
                if line.strip() and not line.startswith("-- ")]
    if warnings and not findings:
        findings.append(_finding(
            "engine_errors", "warning",
            "%d warning or error line(s) about the service in the journal since %s" % (
                len(warnings), raw.get("journal_since") or "-1h"),
            " | ".join(warnings[-3:]),
            "Read them: `journalctl -u %s -p warning --since '%s'`." % (
                (raw.get("service") or {}).get("name") or "hmk-inference.service", raw.get("journal_since") or "-1h")))
    if not findings:
        findings.append(_finding("engine_errors", "ok", "No known engine error in the journal",
                                 "%d recent line(s), none at warning or above" % len(tail), "Nothing to do."))
    return findings


def _cuda_error_evidence(error):
    where = ", ".join(part for part in (
        "op %s" % error["op"] if error.get("op") else "",
        "in %s" % error["function"] if error.get("function") else "",
        "at %s" % error["location"] if error.get("location") and error["location"] not in error["line"] else "",
        "device %s" % error["device"] if error.get("device") is not None else "") if part)
    return "%s%s%s" % (error["line"], " (%s)" % where if where else "",
                       "; %d times" % error["count"] if error.get("count", 1) > 1 else "")


def check_nvidia_driver(raw):
    gpus = (raw.get("hardware") or {}).get("gpus") or []
    smi = raw.get("nvidia_smi") or {}
    smi_text = "%s\n%s" % (smi.get("stdout") or "", smi.get("stderr") or "")
    module = nvidia_module_version(raw.get("nvidia_proc_version"))
    libs = nvidia_library_versions(raw.get("nvidia_libraries"))
    nvml = re.search(r"NVML library version:\s*([0-9.]+)", smi_text)
    if nvml and nvml.group(1) not in libs:
        libs = sorted(set(libs) | {nvml.group(1)})
    mismatch_text = "Driver/library version mismatch" in smi_text
    fix = ("The user-space libraries were upgraded under the loaded kernel module: stop the service, "
           "reboot the node (or unload and reload the nvidia modules), then keep the packages held "
           "(the nvidia_driver role pins them and keeps unattended-upgrades away from nvidia-*, libnvidia-*).")
    if mismatch_text or (module and libs and module not in libs):
        evidence = "kernel module %s, libnvidia-ml %s" % (module or "?", ", ".join(libs) or "?")
        if mismatch_text:
            evidence = "nvidia-smi: Driver/library version mismatch; " + evidence
        return _finding("nvidia_driver", "critical", "NVIDIA driver and library versions do not match",
                        evidence, fix)
    if not gpus and not module:
        return _finding("nvidia_driver", "info", "No NVIDIA driver to check (no NVIDIA GPU on this node)",
                        "no /proc/driver/nvidia/version; nvidia-smi %s" % (
                            "missing" if smi.get("missing") else "rc=%s" % smi.get("rc")), "Nothing to do.")
    if gpus and not module:
        return _finding("nvidia_driver", "critical", "The NVIDIA kernel module is not loaded",
                        "%d NVIDIA GPU(s) on the PCI bus, no /proc/driver/nvidia/version" % len(gpus),
                        "Install or repair the driver with playbooks/gpu.yml; read `dmesg | grep -i nvidia` "
                        "(Secure Boot rejects unsigned modules: `mokutil --sb-state`).")
    if smi.get("rc") not in (0, "0"):
        first = (_lines(smi_text) or ["no output"])[0]
        return _finding("nvidia_driver", "critical", "nvidia-smi fails with the driver loaded",
                        "kernel module %s; nvidia-smi rc=%s: %s" % (module, smi.get("rc"), first),
                        "Read the whole `nvidia-smi` output and `dmesg | grep -iE 'nvrm|xid'`; reinstall with "
                        "playbooks/gpu.yml if the user-space tools are missing.")
    return _finding("nvidia_driver", "ok", "NVIDIA driver %s is loaded and its libraries match" % module,
                    "kernel module %s, libnvidia-ml %s" % (module, ", ".join(libs) or "(not found, nvidia-smi works)"),
                    "Nothing to do.")


def _facts(raw):
    return raw.get("hardware") or {}


def _hidden_finding(check_id, verdict, what):
    return _finding(check_id, "info", "%s cannot be told from inside this virtual machine" % what,
                    verdict["observed"], verdict["fix"])


def check_platform(raw):
    verdict = hw.judge_platform(_facts(raw), raw.get("profile"))
    platform = verdict["platform"]
    if platform["kind"] == "virtual":
        return _finding("platform", "info", "This node is a virtual machine: the BIOS checks do not apply",
                        verdict["observed"], verdict["fix"])
    return _finding("platform", "ok", "Judged as bare metal", verdict["observed"], "Nothing to do.")


def check_gpu_present(raw):
    verdict = hw.judge_gpu_present(_facts(raw), raw.get("profile"))
    want = _int(_profile_get(raw.get("profile"), "gpus", "count"), 0) or 0
    usable = verdict["usable"]
    evidence = str(verdict["observed"]) if verdict["observed"] else "no PCI display device with vendor 0x10de"
    if verdict["verdict"] == "absent":
        return _finding("gpu_present", "info", "No NVIDIA GPU on this node; the GPU checks do not apply",
                        "no PCI display device with vendor 0x10de; the profile expects %d" % want,
                        "Nothing to do on a CPU-only node.")
    if verdict["verdict"] == "bad":
        title = "%d of %d expected GPUs are visible" % (usable, want)
        if verdict["passed_through"]:
            title += " (%s passed through with vfio-pci)" % ", ".join(verdict["passed_through"])
        return _finding("gpu_present", "critical", title, evidence,
                        verdict["fix"] + " Without it the service runs attention on the CPU.")
    if verdict["verdict"] == "ok":
        return _finding("gpu_present", "ok", "%d NVIDIA GPU(s) visible as the profile expects" % want, evidence,
                        "Nothing to do.")
    return _finding("gpu_present", "info", "%d NVIDIA GPU(s) visible, the profile expects %d" % (usable, want),
                    evidence, verdict["fix"])


def check_numa_balancing(raw):
    verdict = hw.judge_numa_balancing(_facts(raw), raw.get("profile"))
    if verdict["verdict"] == "ok":
        title = "NUMA balancing is off" if verdict["observed"] == 0 else "NUMA balancing does not exist in this kernel"
        evidence = ("kernel.numa_balancing=0, %s NUMA node(s)" % _known(verdict.get("nodes"))
                    if verdict["observed"] == 0 else "/proc/sys/kernel/numa_balancing absent")
        return _finding("numa_balancing", "ok", title, evidence, "Nothing to do.")
    if verdict["verdict"] == "unknown":
        return _finding("numa_balancing", "info", "NUMA balancing could not be read",
                        str(_facts(raw).get("numa_balancing")), verdict["fix"])
    evidence = "kernel.numa_balancing=%s, %s NUMA node(s)" % (verdict["observed"], _known(verdict.get("nodes")))
    if verdict["verdict"] == "minor":
        return _finding("numa_balancing", "info", "NUMA balancing is on, without effect on a single node", evidence,
                        verdict["fix"])
    return _finding("numa_balancing", "critical", "NUMA balancing is on: pages of the experts migrate", evidence,
                    "It costs 50-65%% of generation speed. %s" % verdict["fix"])


def _known(value):
    return value if hw.known(value) and value is not None else "?"


def check_nps(raw):
    verdict = hw.judge_nps(_facts(raw), raw.get("profile"))
    want = verdict["expected"]
    if verdict["verdict"] == "hidden":
        return _hidden_finding("numa_nodes_per_socket", verdict, "NPS (NUMA nodes per socket)")
    if verdict["verdict"] == "unknown":
        return _finding("numa_nodes_per_socket", "info", "NUMA nodes per socket could not be read",
                        verdict.get("basis", ""), verdict["fix"])
    nps = verdict["observed"]
    evidence = "%s: NPS%s" % (verdict["basis"], nps)
    if verdict["verdict"] == "ok":
        return _finding("numa_nodes_per_socket", "ok", "NPS%s as the profile wants" % nps, evidence, "Nothing to do.")
    if verdict["verdict"] == "minor":
        return _finding("numa_nodes_per_socket", "warning",
                        "%s NUMA nodes per socket: the die layout of this CPU, not a BIOS setting" % nps,
                        evidence + ". " + verdict["why"], verdict["fix"])
    if not isinstance(nps, (int, float)):
        return _finding("numa_nodes_per_socket", "critical", "Sockets carry different NUMA layouts", evidence,
                        verdict["fix"])
    return _finding("numa_nodes_per_socket", "critical",
                    "NPS%s instead of NPS%s: the experts' bandwidth is split" % (nps, want), evidence,
                    verdict["fix"] + ", then reboot (the OS cannot change it).")


def check_memory_nodes(raw):
    facts, profile = _facts(raw), raw.get("profile")
    findings = []
    only = hw.judge_memory_only_nodes(facts, profile)
    if only["verdict"] == "minor":
        findings.append(_finding("numa_memory_only_nodes", "warning", "NUMA node(s) with memory and no CPU: %s" %
                                 ", ".join("node %d" % n["node"] for n in only["nodes"]), only["observed"],
                                 only["fix"]))
    else:
        findings.append(_finding("numa_memory_only_nodes", "ok" if only["verdict"] == "ok" else "info",
                                 "No memory-only NUMA node" if only["verdict"] == "ok" else
                                 "Memory-only NUMA nodes could not be read", only["observed"], only["fix"]))
    less = hw.judge_memoryless_cpu_nodes(facts, profile)
    if less["verdict"] == "bad":
        findings.append(_finding("numa_memoryless_cpu_nodes", "warning", "CPU node(s) without memory: %s" %
                                 ", ".join("node %d" % n for n in less["nodes"]), less["observed"], less["fix"]))
    else:
        findings.append(_finding("numa_memoryless_cpu_nodes", "ok" if less["verdict"] == "ok" else "info",
                                 "Every CPU node has memory" if less["verdict"] == "ok" else
                                 "Memory-less CPU nodes could not be read", less["observed"], less["fix"]))
    placement = hw.judge_memory_placement(facts, profile)
    severity = {"ok": "ok", "minor": "warning"}.get(placement["verdict"], "info")
    title = {"ok": "Memory is spread evenly over the CPU nodes",
             "minor": "Memory is uneven across the CPU nodes"}.get(placement["verdict"],
                                                                   "Memory placement across nodes could not be read")
    findings.append(_finding("numa_memory_placement", severity, title, placement["observed"], placement["fix"]))
    return findings


def check_memory_channels(raw):
    facts, profile = _facts(raw), raw.get("profile")
    memory = facts.get("memory") or {}
    channels = hw.judge_memory_channels(facts, profile)
    speed = hw.judge_memory_speed(facts, profile)
    want, _per_socket = hw.want_channels(facts, profile)
    if channels["verdict"] == "hidden":
        return _hidden_finding("memory_channels", channels, "The memory channel population")
    if channels["verdict"] == "unknown" and not memory.get("slots_populated"):
        return _finding("memory_channels", "info", "The memory channels could not be read",
                        "dmidecode -t 17 lists no populated DIMM (%s slots)" % memory.get("slots_total", 0),
                        channels["fix"])
    count = memory.get("channels_populated")
    evidence = "%s of %s channels populated (%s), %s of %s slots, %s MT/s, %s GB/s theoretical" % (
        count if hw.known(count) else "?", want or "?", memory.get("channel_source"), memory.get("slots_populated"),
        memory.get("slots_total"), _known(memory.get("configured_speed_mts")), _known(memory.get("bandwidth_gbs")))
    if channels["verdict"] == "bad":
        known_count = count if hw.known(count) else memory.get("channels_upper_bound")
        prefix = "" if hw.known(count) else "at most "
        return _finding("memory_channels", "critical",
                        "%s%s of %s memory channels are populated: %s%d%% of the bandwidth is missing" % (
                            prefix, known_count, want, "at least " if prefix else "",
                            round(100.0 * (want - known_count) / want)),
                        evidence if hw.known(count) else channels["observed"],
                        "Populate one identical DIMM in every channel (board manual's population table); "
                        "generation speed scales with channels x MT/s.")
    if channels["verdict"] == "unknown":
        return _finding("memory_channels", "info", "Which memory channels are populated cannot be told from the "
                        "DIMM labels", channels["observed"], channels["fix"])
    if speed["verdict"] in ("bad", "minor"):
        return _finding("memory_channels", "warning", "Memory runs at %s MT/s, below %s" % (
            memory.get("configured_speed_mts"), _profile_get(profile, "memory", "min_speed_mts") or
            memory.get("rated_speed_mts")), evidence + "; " + speed["observed"],
            "BIOS: AMD CBS > UMC Common Options > DDR Options > Memory Clock Speed = Auto/%s; one DIMM per channel." %
            (_profile_get(profile, "memory", "min_speed_mts") or "rated"))
    return _finding("memory_channels", "ok", "Every memory channel is populated", evidence, "Nothing to do.")


def check_smt(raw):
    facts, profile = _facts(raw), raw.get("profile")
    verdict = hw.judge_smt(facts, profile)
    cpu = facts.get("cpu") or {}
    if verdict["verdict"] == "hidden":
        return _hidden_finding("smt", verdict, "SMT")
    if verdict["verdict"] == "unknown":
        return _finding("smt", "info", "SMT could not be read", "no /sys/devices/system/cpu/smt/active",
                        verdict["fix"])
    evidence = "smt active=%d, %s thread(s) per core" % (1 if verdict["observed"] == "on" else 0,
                                                         _known(cpu.get("threads_per_core")))
    if verdict["verdict"] == "ok":
        return _finding("smt", "ok", "SMT is %s as the profile wants" % verdict["observed"], evidence, "Nothing to do.")
    if verdict["observed"] == "on":
        return _finding("smt", "warning", "SMT is on", evidence,
                        verdict["fix"] + "; threads = physical cores, SMT costs ~18%.")
    return _finding("smt", "info", "SMT is off but the profile expects it on", evidence,
                    "Set cpu.smt: false in the profile, or enable SMT in the BIOS.")


def check_page_cache(raw):
    model = raw.get("model") or {}
    path = model.get("path") or ""
    hw = raw.get("hardware") or {}
    if not path:
        return _finding("model_page_cache", "info", "No model path to check",
                        "inference_service_model_path is empty",
                        "Set doctor_model_path (or inference_service_model_path) to the model's GGUF.")
    files = model.get("files") or []
    if not files:
        return _finding("model_page_cache", "critical", "The model file is missing", "%s does not exist" % path,
                        "Sync it with playbooks/models.yml, or fix inference_service_model_path.")
    size = sum(_int(f.get("size"), 0) for f in files)
    total_gb = hw.get("memory_total_gb")
    cached_kb = meminfo_kb(raw.get("meminfo"), "Cached")
    resident, _fsize = parse_fincore(model.get("fincore"))
    evidence = "model %s in %d file(s); " % (_size(size), len(files))
    if resident is not None:
        evidence += "resident %s (fincore); " % _size(resident)
    evidence += "page cache %s; RAM %s GB" % (_size(cached_kb * 1024) if cached_kb is not None else "?",
                                              total_gb if total_gb is not None else "?")
    if total_gb and size > total_gb * 10 ** 9:
        return _finding("model_page_cache", "critical", "The model is larger than the RAM", evidence,
                        "Every token reads experts from disk: use a smaller quant, or add memory.")
    want = float(raw.get("resident_min_pct") or 90) / 100.0
    if resident is not None:
        if resident >= want * size:
            return _finding("model_page_cache", "ok", "The model is resident in the page cache", evidence,
                            "Nothing to do.")
        return _finding("model_page_cache", "warning",
                        "Only %d%% of the model is in the page cache" % (100 * resident // max(size, 1)), evidence,
                        "The next requests read the experts from disk. Warm it (`cat %s > /dev/null` per file), "
                        "check that nothing evicts it (other jobs, a drop_caches timer), and that RAM minus the "
                        "model leaves room for the rest." % path)
    if cached_kb is not None and cached_kb * 1024 < want * size:
        return _finding("model_page_cache", "warning", "The page cache is smaller than the model", evidence,
                        "The model cannot be fully resident: warm it (`cat %s > /dev/null`) and check "
                        "what else uses the memory." % path)
    return _finding("model_page_cache", "info", "The page cache could hold the model; residency not measured",
                    evidence, "Install util-linux's fincore to measure it (`fincore %s`)." % path)


def check_model_integrity(raw):
    """The last scheduled full re-hash of the models (model_sync's hmk-model-rehash.timer): what it found."""
    integrity = raw.get("model_integrity") or {}
    path = integrity.get("path") or "the re-hash record"
    record = integrity.get("record")
    if not isinstance(record, dict):
        return _finding("model_integrity", "info", "The models have not been re-hashed on this node yet",
                        "%s does not exist" % path,
                        "model_sync installs hmk-model-rehash.timer (model_sync_rehash_timer); run it now with "
                        "`systemctl start hmk-model-rehash.service`.")
    mismatches = record.get("mismatches") or []
    evidence = "%s: %s file(s) re-hashed, %d mismatch(es), %d missing" % (
        path, record.get("files_checked", "?"), len(mismatches), len(record.get("missing") or []))
    if mismatches:
        named = "; ".join("%s/%s has sha256 %s instead of %s, moved to %s" % (
            m.get("model"), m.get("file"), str(m.get("observed_sha256"))[:16], str(m.get("expected_sha256"))[:16],
            m.get("quarantined_to")) for m in mismatches)
        return _finding("model_integrity", "critical",
                        "%d model file(s) failed the scheduled re-hash and were quarantined" % len(mismatches),
                        evidence + ": " + named,
                        "The disk returned other bytes than were verified (bit rot, a bad disk, a manual edit). "
                        "Run site.yml (or playbooks/models.yml then playbooks/serve.yml) to fetch the file(s) again; "
                        "the service does not start while a file is missing. Check the disk (smartctl, dmesg).")
    return _finding("model_integrity", "ok", "Every model file matched its sha256 at the last re-hash", evidence,
                    "Nothing to do.")


def check_gpu_links(raw):
    facts, profile = _facts(raw), raw.get("profile")
    verdict = hw.judge_gpu_links(facts, profile)
    gpus = [g for g in facts.get("gpus") or [] if g.get("driver") not in ("vfio-pci", "pci-stub")]
    want = _int(_profile_get(profile, "gpus", "min_link_width")) or 16
    if not gpus:
        return _finding("gpu_pcie_link", "info", "No GPU link to check", "no NVIDIA GPU bound to a host driver",
                        "Nothing to do.")
    if verdict["verdict"] == "hidden":
        return _hidden_finding("gpu_pcie_link", verdict, "The GPU's physical PCIe link")
    parts, narrow, slow, unread = [], [], [], []
    for gpu in gpus:
        link = gpu.get("link") or {}
        bdf = gpu.get("pci_address")
        cw, mw, cs, ms = (link.get(k) for k in ("current_width", "max_width", "current_speed_gts", "max_speed_gts"))
        if not hw.known(cw) or not hw.known(cs) or cw is None or cs is None:
            unread.append(bdf)
            parts.append("%s unknown" % bdf)
            continue
        parts.append("%s x%s of x%s at %s of %s GT/s" % (bdf, cw, _known(mw), cs, _known(ms)))
        if cw < want or (hw.known(mw) and mw and cw < mw):
            narrow.append(bdf)
        elif hw.known(ms) and ms and cs < ms:
            slow.append(bdf)
    evidence = "; ".join(parts)
    if narrow:
        return _finding("gpu_pcie_link", "warning", "GPU link narrower than x%d: %s" % (want, ", ".join(narrow)),
                        evidence, "Prompt processing copies experts over this link. " + verdict["fix"])
    if unread:
        return _finding("gpu_pcie_link", "info", "GPU link width could not be read: %s" % ", ".join(unread), evidence,
                        "Read `lspci -vv -s <bdf> | grep -E 'LnkCap|LnkSta'` as root.")
    if slow:
        return _finding("gpu_pcie_link", "info", "GPU link below its top speed (normal at idle): %s" % ", ".join(slow),
                        evidence, "GPUs drop to Gen1 when idle; re-read under load (`nvidia-smi -q -d PCIE` while "
                        "serving). If it stays low: BIOS PCIe link speed = Auto, check risers.")
    return _finding("gpu_pcie_link", "ok", "Every GPU link runs at full width and speed", evidence, "Nothing to do.")


def check_aspm(raw):
    verdict = hw.judge_aspm(_facts(raw), raw.get("profile"))
    policy = _facts(raw).get("pcie_aspm_policy")
    if verdict["verdict"] == "hidden":
        return _hidden_finding("pcie_aspm", verdict, "The GPU links' ASPM")
    if verdict["verdict"] == "unknown":
        return _finding("pcie_aspm", "info", "The ASPM policy could not be read", verdict["observed"], verdict["fix"])
    if verdict["verdict"] == "ok":
        return _finding("pcie_aspm", "ok", "PCIe ASPM is off on the GPU links" if policy != "performance" else
                        "PCIe ASPM policy is performance", verdict["observed"], "Nothing to do.")
    if verdict.get("links"):
        title = "ASPM is enabled on the GPU link(s): %s" % ", ".join(bdf for bdf, _states in verdict["links"])
    elif "pcie_aspm=off" in verdict["observed"]:
        title = "The kernel runs with pcie_aspm=off, which leaves ASPM to the firmware"
    elif policy == "default":
        title = "PCIe ASPM is left to the firmware (policy default)"
    else:
        title = "PCIe ASPM saves power on the GPU links (policy %s)" % policy
    return _finding("pcie_aspm", "warning", title, verdict["observed"],
                    "Waking a link adds latency to every copy. " + verdict["fix"])


def check_governor(raw):
    cpufreq = raw.get("cpufreq") or {}
    want = raw.get("governor") or "performance"
    verdict = hw.judge_governor(hw.parse_governors(cpufreq.get("stdout")), want)
    if verdict["verdict"] == "absent":
        return _finding("cpu_governor", "info", "No CPU frequency governor (no cpufreq in this kernel or VM)",
                        (cpufreq.get("stderr") or "no scaling_governor under /sys/devices/system/cpu/cpufreq").strip(),
                        verdict["fix"])
    if verdict["verdict"] == "ok":
        return _finding("cpu_governor", "ok", "Every CPU runs the %s governor" % want, verdict["observed"],
                        "Nothing to do.")
    return _finding("cpu_governor", "warning", "CPU governor %s instead of %s" % ("/".join(verdict["others"]), want),
                    verdict["observed"], verdict["fix"])


def check_engine_isa(raw):
    """The running engine's build ISA (its system_info line in the journal) against the CPU's flags."""
    load, _active, _sub = _service_state(raw)
    lines = raw.get("engine_system_info") or []
    if load in (None, "not-found"):
        return _finding("engine_isa", "info", "No engine to compare with the CPU (the service is not installed)",
                        "LoadState=%s" % (load or "unknown"), "Nothing to do.")
    log = hw.parse_llama_log("\n".join(lines) if isinstance(lines, list) else str(lines))
    cpu = (_facts(raw).get("cpu") or {})
    comparison = hw.compare_engine_isa(log["features"], cpu.get("flags"))
    if not comparison["comparable"]:
        return _finding("engine_isa", "info", "The engine's build ISA could not be compared with the CPU",
                        comparison["reason"],
                        "The engine prints its system_info line once at start; read `journalctl -u %s -g system_info`"
                        " after a restart." % ((raw.get("service") or {}).get("name") or "hmk-inference.service"))
    threads = "n_threads=%s n_threads_batch=%s of %s logical CPUs" % (
        _known(log["n_threads"]), _known(log["n_threads_batch"]), _known(log["total_threads"]))
    evidence = "engine uses %s; %s" % (", ".join(comparison["matched"]) or "no SIMD extension", threads)
    if comparison["needs_missing"]:
        return _finding("engine_isa", "critical", "The engine was built for %s, which this CPU lacks" %
                        ", ".join(comparison["needs_missing"]), evidence,
                        "The binary comes from another CPU class (GGML_NATIVE builds for the build host) and dies "
                        "with SIGILL on these instructions: rebuild on this node (playbooks/engines.yml, llama_build "
                        "role).")
    if comparison["built_without"]:
        return _finding("engine_isa", "warning", "The engine does not use %s, which this CPU has" %
                        ", ".join(comparison["built_without"]), evidence,
                        "The build is generic or from an older CPU: rebuild on this node with GGML_NATIVE=ON "
                        "(llama_build role), and check that its build stamp names this CPU's flags.")
    return _finding("engine_isa", "ok", "The engine uses the CPU's vector extensions", evidence, "Nothing to do.")


def _gpu_node(raw):
    return bool((raw.get("hardware") or {}).get("gpus")) or (_int(_profile_get(raw.get("profile"), "gpus", "count"), 0) or 0) > 0


def check_gpu_devices(raw):
    """The driver's character devices, /dev/nvidia-uvm and the unit's DeviceAllow rules, on a GPU node."""
    if not _gpu_node(raw):
        return _finding("gpu_devices", "info", "No GPU on this node; no NVIDIA device to check",
                        "no NVIDIA GPU on the PCI bus and gpus.count 0", "Nothing to do on a CPU-only node.")
    devices = raw.get("gpu_devices") or {}
    # The installed unit's own rules; without a unit, the rule the inference_service role renders.
    allow = [w for w in re.split(r"\s+", devices.get("device_allow") or "") if w.startswith(("char-", "/dev/"))]
    result = hmk_nvidia_devices.nvidia(devices.get("proc_devices"),
                                       allow if devices.get("unit_loaded") else ["char-nvidia*"])
    evidence = "%s: %s; /dev/nvidia-uvm %s; unit DeviceAllow=%s" % (
        result["naming"] or "no NVIDIA driver", ", ".join(result["names"]) or "none",
        "present" if devices.get("uvm_node") else "missing", devices.get("device_allow") or "(not read)")
    problems = list(result["problems"])
    if result["control_major"] is not None and not devices.get("uvm_node"):
        problems.append({"what": "/dev/nvidia-uvm is missing",
                         "fix": "systemctl start hmk-nvidia-device-nodes.service (nvidia_driver role; nvidia-modprobe -u "
                                "-c=0): the sandboxed engine cannot create it and CUDA finds no device without it."})
    if problems:
        return _finding("gpu_devices", "critical", "The engine cannot open the GPUs: " + problems[0]["what"], evidence,
                        " ".join(p["fix"] for p in problems))
    return _finding("gpu_devices", "ok", "The NVIDIA devices exist and the unit may open them", evidence,
                    "Nothing to do.")


def check_gpu_placement(raw):
    """The running engine's own log of its start and nvidia-smi against the plan: the health gate, on demand."""
    placement = raw.get("gpu_placement") or {}
    _load, active, _sub = _service_state(raw)
    if not _gpu_node(raw):
        return _finding("gpu_placement", "info", "No GPU on this node; no placement to check",
                        "gpus.count 0", "Nothing to do on a CPU-only node.")
    if active != "active":
        return _finding("gpu_placement", "info", "The service is not running; the placement cannot be read",
                        "ActiveState=%s" % (active or "unknown"), "See the service_state finding.")
    try:
        plan = json.loads(placement.get("plan") or "")
    except ValueError:
        plan = None
    if not plan or not ((plan.get("plan") or {}).get("gpus")):
        return _finding("gpu_placement", "info", "No GPU placement plan to compare with",
                        "no readable NAME-plan.json with GPUs (%s)" % (placement.get("plan_path") or "?"),
                        "Deploy the service with playbooks/serve.yml; the inference_service role writes the plan.")
    if plan.get("engine") not in ("ik_llama.cpp", "llama.cpp"):
        return _finding("gpu_placement", "info", "The engine's log format is not one the doctor reads",
                        "engine %s" % plan.get("engine"), "Read its log by hand: journalctl -u UNIT -b.")
    apps = None
    if placement.get("smi_rc") in (0, "0"):
        apps = hmk_engine_log.parse_smi_apps(placement.get("smi_apps"), hmk_engine_log.parse_smi_gpus(placement.get("smi_gpus")))
    result = hmk_engine_log.evaluate(hmk_engine_log.parse(placement.get("engine_log")), plan, apps,
                                     _int(placement.get("pid")))
    passed = [c["detail"] for c in result["checks"] if c["status"] == "pass"]
    if result["ok"]:
        return _finding("gpu_placement", "ok", "The engine runs on the GPUs as planned", "; ".join(passed) or "-",
                        "Nothing to do.")
    lines = hmk_engine_log.summary(result)
    if result["cpu_only"]:
        return _finding("gpu_placement", "critical", "Serving CPU-only on a GPU node", " | ".join(lines),
                        result["differences"][0]["fix"])
    failed = set(d["check"] for d in result["differences"])
    errors = [d for d in result["differences"] if d["check"] == "cuda_error"]
    if errors:
        return _finding("gpu_placement", "critical", "CUDA error in the engine's log: %s" % ", ".join(
            d["found"].split(":", 1)[0] for d in errors), " | ".join(lines), " ".join(d["fix"] for d in errors))
    if (result.get("placement") or {}).get("verdict") == "unknown" and failed <= {"cuda_devices"}:
        # a doctor run long after the start: the journal rotated, and no line of the log proves a placement
        return _finding("gpu_placement", "warning", "The engine's log of this start is no longer in the journal; "
                        "its placement cannot be proven from it", " | ".join(lines),
                        result["differences"][0]["fix"])
    severe = {"out_of_memory", "model_load", "cuda_devices", "offloaded_layers", "gpu_layers"}
    severity = "critical" if failed & severe else "warning"
    return _finding("gpu_placement", severity, "The engine's GPU placement differs from the plan: %s" % ", ".join(
        sorted(failed)), " | ".join(lines), " ".join(sorted(set(d["fix"] for d in result["differences"]))))


CHECKS = (check_service, check_model_integrity, check_engine_flags, check_engine_errors, check_nvidia_driver,
          check_engine_isa, check_platform, check_gpu_present, check_gpu_devices,
          check_gpu_placement, check_numa_balancing, check_nps, check_memory_nodes,
          check_memory_channels, check_smt, check_page_cache, check_gpu_links, check_aspm, check_governor)


# ------------------------------------------------------------------------------ rank + render

def rank(findings):
    """Most severe first; within a severity, the troubleshooting tree's order; then as found."""
    def key(item):
        index, finding = item
        order = ORDER.index(finding["id"]) if finding["id"] in ORDER else len(ORDER)
        return (SEVERITIES.index(finding["severity"]), order, index)

    ranked = []
    for position, (_index, finding) in enumerate(sorted(enumerate(findings), key=key), 1):
        finding = dict(finding)
        finding["rank"] = position
        ranked.append(finding)
    return ranked


def summarize(findings):
    counts = dict((s, 0) for s in SEVERITIES)
    for finding in findings:
        counts[finding["severity"]] += 1
    return counts


def diagnose(raw):
    """All checks on the raw values, ranked: {findings, summary}."""
    findings = []
    for check in CHECKS:
        result = check(raw or {})
        findings.extend(result if isinstance(result, list) else [result])
    ranked = rank(findings)
    return {"findings": ranked, "summary": summarize(ranked)}


def failing(findings, fail_on="none"):
    """Findings at or above the doctor_fail_on threshold (none: never)."""
    if fail_on not in SEVERITIES[:2]:
        return []
    limit = SEVERITIES.index(fail_on)
    return [f for f in findings or [] if SEVERITIES.index(f["severity"]) <= limit]


def text(report):
    """The ranked list for the play output, one multi-line string (the yaml callback prints it as a block)."""
    summary = report["summary"]
    lines = ["%d critical, %d warning, %d info, %d ok" % tuple(summary[s] for s in SEVERITIES)]
    for f in report["findings"]:
        lines.append("%d. [%s] %s" % (f["rank"], f["severity"].upper(), f["title"]))
        if f["severity"] != "ok":
            lines.append("   evidence: %s" % f["evidence"])
            lines.append("   fix: %s" % f["fix"])
    return "\n".join(lines) + "\n"


def markdown(report, host=""):
    summary = report["summary"]
    out = ["<!-- Written by the doctor role (hybrid-moe-kit); regenerated on every run. -->",
           "# Doctor report: %s" % host, "",
           "%d critical, %d warning, %d info, %d ok" % tuple(summary[s] for s in SEVERITIES), "",
           "| # | severity | check | finding |", "|---|---|---|---|"]
    for f in report["findings"]:
        out.append("| %d | %s | %s | %s |" % (f["rank"], f["severity"], f["id"], f["title"].replace("|", "/")))
    out += ["", "## Findings and fixes", ""]
    for f in report["findings"]:
        if f["severity"] == "ok":
            continue
        out += ["### %d. %s (%s)" % (f["rank"], f["title"], f["severity"]), "",
                "- evidence: `%s`" % str(f["evidence"]).replace("`", "'"), "- fix: %s" % f["fix"], ""]
    return "\n".join(out) + "\n"


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "doctor_diagnose": diagnose,
            "doctor_failing": failing,
            "doctor_text": text,
            "doctor_markdown": markdown,
            "doctor_systemctl_show": parse_systemctl_show,
        }, AnsibleFilterError)
