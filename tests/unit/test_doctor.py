"""doctor: every finding branch of plugins/filter/doctor.py on literal inputs (what the tasks
read on a node: systemctl show, journal lines, /proc and /sys values, nvidia-smi output, the bios_checklist
module's parsed hardware), and the ranking order."""
import copy
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doctor_filters", REPO / "plugins" / "filter" / "doctor.py")
doctor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doctor)

GENOA = yaml.safe_load((REPO / "inventories/production/group_vars/genoa_1gpu/hardware.yml").read_text())["hmk_hardware"]
TWIN = yaml.safe_load((REPO / "inventories/lab/group_vars/twins/hardware.yml").read_text())["hmk_hardware"]

GIB = 1024 ** 3
SHOW_RUNNING = ("LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nExecMainStatus=0\n"
                "NRestarts=0\nUnitFileState=enabled\nInvocationID=0f3c\n")
SHOW_FAILED = ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=1\n"
               "NRestarts=3\nUnitFileState=enabled\n")
PROC_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
             "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 21:39:29 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.01  Fri Oct 18 12:48:58 UTC 2024\n"
MEMINFO = "MemTotal:       395000000 kB\nMemFree:         10000000 kB\nCached:         370000000 kB\n"
GPU = {"pci_address": "0000:01:00.0", "model": "NVIDIA GeForce RTX 4090", "vram_mib": 24564, "numa_node": 0,
       "driver": "nvidia",
       "link": {"current_width": 16, "max_width": 16, "current_speed_gts": 16.0, "max_speed_gts": 16.0}}
GENOA_FLAGS = ["avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx512vbmi", "bmi2", "f16c",
               "fma", "pni", "ssse3"]
# ik_llama.cpp's start line on that node (its format: ../fixtures/hardware/llama-log--ik-server-*.txt).
SYSTEM_INFO = ('2026-11-30T09:00:01+0000 node llama-server[900]: INFO [                    main] system info | '
               'tid="1" timestamp=1 n_threads=32 n_threads_batch=32 total_threads=32 system_info="AVX = 1 | '
               'AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | FMA = 1 | '
               'NEON = 0 | F16C = 1 | SSE3 = 1 | SSSE3 = 1 | "')
IK_FMOE = "2026-11-30T09:41:02+0000 node hmk-inference[812]: error: unknown argument: -fmoe"
FIXTURES = REPO / "tests" / "fixtures"
# The kernel's /proc/devices with the driver's 550.40+ names (captured in molecule/gpu_devices, STAND-IN modules).
GPU_PROC_DEVICES = (FIXTURES / "proc-devices" / "twin-standin-r580.txt").read_text()
# A real ik_llama.cpp start on one GPU, every layer offloaded (tests/fixtures/engine-logs/INDEX.md), and the plan
# that start matches: a 61-layer model without routed experts, all on CUDA0.
GPU_LOG = (FIXTURES / "engine-logs" / "ik--1gpu-a6000-full-offload-pr333.log").read_text()
GPU_PLAN = {"engine": "ik_llama.cpp", "override_tensor": ["exps=CPU"],
            "plan": {"n_layer": 61, "ngl": 99, "offloaded_layers": 62, "cpu_layers": [], "rules": ["exps=CPU"],
                     "gpus": [{"device": "CUDA0", "block": [0, 60], "holds_output": True, "layers": [],
                               "expert_bytes": 0, "kv_bytes": 1952 * 1024 ** 2,
                               "weights_bytes": int(17284.05 * 1024 ** 2), "expected_bytes": 46 * 1024 ** 3}]}}


def healthy():
    """A Genoa + RTX 4090 node as the profile wants it, serving a resident 355 GB model."""
    size = 355 * 10 ** 9
    return {
        "profile": copy.deepcopy(GENOA),
        "hardware": {
            "cpu": {"sockets": 1, "numa_nodes": 1, "smt_active": False, "threads_per_core": 1, "hypervisor": False,
                    "vendor": "AuthenticAMD", "family": 25, "model_number": 17, "flags": GENOA_FLAGS},
            "numa": {"source": "sysfs", "nodes": {"0": {"cpus": "0-31", "size_mb": 385000, "packages": [0]}}},
            "memory": {"slots_populated": 12, "slots_total": 24, "channels_populated": 12, "channels_total": 12,
                       "channel_source": "labels", "configured_speed_mts": 4800, "bandwidth_gbs": 460.8},
            "memory_total_gb": 376.7,
            "numa_balancing": 0,
            "pcie_aspm_policy": "performance",
            "gpus": [copy.deepcopy(GPU)],
        },
        "service": {"name": "hmk-inference.service", "show": SHOW_RUNNING},
        "journal_since": "-1h",
        "journal_warnings": [],
        "journal_tail": ["2026-11-30T09:00:00+0000 node hmk-inference[900]: INFO [main] HTTP server listening"],
        "engine_system_info": [SYSTEM_INFO],
        "nvidia_smi": {"rc": 0, "stdout": "570.86.15, NVIDIA GeForce RTX 4090, 00000000:01:00.0", "stderr": ""},
        "nvidia_proc_version": PROC_OPEN,
        "nvidia_libraries": ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15"],
        "model": {"path": "/srv/models/r1/r1-00001-of-00002.gguf",
                  "files": [{"path": "/srv/models/r1/r1-00001-of-00002.gguf", "size": size // 2},
                            {"path": "/srv/models/r1/r1-00002-of-00002.gguf", "size": size - size // 2}],
                  "fincore": "%d %d\n%d %d\n" % (size // 2, size // 2, size - size // 2, size - size // 2)},
        "meminfo": MEMINFO,
        "resident_min_pct": 90,
        "cpufreq": {"stdout": "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor:performance\n"
                              "/sys/devices/system/cpu/cpufreq/policy1/scaling_governor:performance\n", "stderr": ""},
        "governor": "performance",
        # The GPU node's devices and its engine's start (tests/unit/test_doctor_gpu.py covers the bad cases).
        "gpu_devices": {"proc_devices": GPU_PROC_DEVICES, "uvm_node": True, "unit_loaded": True,
                        "device_allow": "char-nvidia* rw"},
        "gpu_placement": {"plan": json.dumps(GPU_PLAN), "plan_path": "/etc/hmk/hmk-inference-plan.json",
                          "engine_log": GPU_LOG, "pid": "900", "smi_rc": 1, "smi_gpus": "", "smi_apps": ""},
        "model_integrity": {"path": "/var/lib/hmk/model-integrity.json",
                            "record": {"schema": "hmk-model-integrity/1", "ok": True, "files_checked": 2,
                                       "mismatches": [], "missing": [], "finished": 1764500000.0}},
    }


def set_nodes(raw, count, sockets=1, size_mb=96000):
    """count NUMA nodes with 8 CPUs and size_mb each, spread evenly over the sockets."""
    raw["hardware"]["cpu"]["sockets"] = sockets
    raw["hardware"]["numa"]["nodes"] = dict(
        (str(n), {"cpus": "%d-%d" % (8 * n, 8 * n + 7), "size_mb": size_mb, "packages": [n * sockets // count]})
        for n in range(count))


def only(findings, check_id):
    hits = [f for f in findings if f["id"] == check_id]
    assert len(hits) == 1, hits
    return hits[0]


def run(check, raw):
    result = check(raw)
    return result if isinstance(result, list) else [result]


# ------------------------------------------------------------------------------ whole report

def test_healthy_node_is_all_ok_and_every_check_reports():
    report = doctor.diagnose(healthy())
    assert [f["severity"] for f in report["findings"]] == ["ok"] * len(doctor.ORDER)
    assert sorted(f["id"] for f in report["findings"]) == sorted(doctor.ORDER)
    assert report["summary"] == {"critical": 0, "warning": 0, "info": 0, "ok": len(doctor.ORDER)}
    for finding in report["findings"]:
        assert finding["title"] and finding["evidence"] != "" and finding["fix"]


def test_broken_node_ranks_the_failed_service_and_refused_flag_first():
    raw = healthy()
    raw["service"]["show"] = SHOW_FAILED
    raw["journal_tail"] = [IK_FMOE, "2026-11-30T09:41:02+0000 node systemd[1]: hmk-inference.service: Failed with result 'exit-code'."]
    raw["journal_warnings"] = ["2026-11-30T09:41:02+0000 node systemd[1]: hmk-inference.service: Failed with result 'exit-code'."]
    raw["hardware"]["numa_balancing"] = 1
    set_nodes(raw, 4)                                 # NPS4
    raw["hardware"]["cpu"]["smt_active"] = True
    raw["hardware"]["pcie_aspm_policy"] = "powersave"
    report = doctor.diagnose(raw)
    ranked = [(f["rank"], f["severity"], f["id"]) for f in report["findings"]]
    assert ranked[:8] == [(1, "critical", "service_state"), (2, "critical", "engine_flags"),
                          (3, "critical", "numa_balancing"), (4, "critical", "numa_nodes_per_socket"),
                          (5, "warning", "engine_errors"), (6, "warning", "smt"), (7, "warning", "pcie_aspm"),
                          (8, "info", "gpu_placement")]  # the engine's placement cannot be read while it is down
    assert [f["rank"] for f in report["findings"]] == list(range(1, len(report["findings"]) + 1))
    assert "-no-fmoe" in report["findings"][1]["fix"] and report["findings"][1]["evidence"] == IK_FMOE
    assert report["summary"]["critical"] == 4 and report["summary"]["warning"] == 3


def test_rank_keeps_the_tree_order_within_a_severity_and_unknown_ids_last():
    findings = [doctor._finding("cpu_governor", "warning", "g", "e", "f"),
                doctor._finding("zzz_new", "warning", "z", "e", "f"),
                doctor._finding("smt", "warning", "s", "e", "f"),
                doctor._finding("pcie_aspm", "ok", "a", "e", "f"),
                doctor._finding("gpu_present", "info", "p", "e", "f"),
                doctor._finding("engine_flags", "critical", "x1", "e", "f"),
                doctor._finding("engine_flags", "critical", "x2", "e", "f")]
    ranked = doctor.rank(findings)
    assert [f["title"] for f in ranked] == ["x1", "x2", "s", "g", "z", "p", "a"]
    assert [f["rank"] for f in ranked] == [1, 2, 3, 4, 5, 6, 7]
    assert "rank" not in findings[0]


def test_failing_threshold():
    findings = doctor.diagnose(healthy())["findings"]
    findings[0] = dict(findings[0], severity="warning")
    assert doctor.failing(findings, "none") == []
    assert doctor.failing(findings, "critical") == []
    assert [f["severity"] for f in doctor.failing(findings, "warning")] == ["warning"]
    findings[1] = dict(findings[1], severity="critical")
    assert len(doctor.failing(findings, "critical")) == 1


def test_text_and_markdown_show_rank_evidence_and_fix():
    raw = healthy()
    raw["hardware"]["numa_balancing"] = 1
    set_nodes(raw, 2, sockets=2)
    report = doctor.diagnose(raw)
    lines = doctor.text(report).splitlines()
    assert lines[0] == "1 critical, 0 warning, 0 info, %d ok" % (len(doctor.ORDER) - 1)
    assert lines[1] == "1. [CRITICAL] NUMA balancing is on: pages of the experts migrate"
    assert lines[2] == "   evidence: kernel.numa_balancing=1, 2 NUMA node(s)"
    assert lines[3].startswith("   fix: It costs 50-65% of generation speed. `sysctl -w kernel.numa_balancing=0`")
    assert lines[4].startswith("2. [OK] ")
    md = doctor.markdown(report, "epyc-node")
    assert "# Doctor report: epyc-node" in md
    assert "| 1 | critical | numa_balancing | NUMA balancing is on: pages of the experts migrate |" in md
    assert "### 1. NUMA balancing is on: pages of the experts migrate (critical)" in md
    assert "- evidence: `kernel.numa_balancing=1, 2 NUMA node(s)`" in md
    assert "### 2." not in md  # ok findings are listed in the table only


def test_filter_plugin_exports():
    assert set(doctor.FilterModule().filters()) == {"doctor_diagnose", "doctor_failing", "doctor_text",
                                                    "doctor_markdown", "doctor_systemctl_show"}


# ------------------------------------------------------------------------------------ service

@pytest.mark.parametrize("show, severity, title", [
    ("", "info", "The state of hmk-inference.service could not be read"),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\n", "info",
     "hmk-inference.service is not installed on this node"),
    (SHOW_FAILED, "critical", "hmk-inference.service has failed (exits at start; 3 restart(s))"),
    (SHOW_FAILED.replace("Result=exit-code", "Result=signal"), "critical",
     "hmk-inference.service has failed (stopped; 3 restart(s))"),
    ("LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\nNRestarts=2\n", "critical",
     "hmk-inference.service has failed (exits at start; 2 restart(s))"),
    (SHOW_RUNNING.replace("NRestarts=0", "NRestarts=4"), "warning",
     "hmk-inference.service runs but has restarted 4 time(s)"),
    (SHOW_RUNNING, "ok", "hmk-inference.service is running"),
    ("LoadState=loaded\nActiveState=activating\nSubState=start\nNRestarts=0\n", "info",
     "hmk-inference.service is starting (loading the model)"),
    ("LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nNRestarts=0\nUnitFileState=disabled\n",
     "warning", "hmk-inference.service is installed but not running"),
])
def test_service_state(show, severity, title):
    raw = healthy()
    raw["service"] = {"name": "hmk-inference.service", "show": show, "error": "Failed to connect to bus"}
    finding = doctor.check_service(raw)
    assert (finding["severity"], finding["title"]) == (severity, title)
    if severity == "critical":
        assert "ExecMainStatus=" in finding["evidence"] and "reset-failed" in finding["fix"]
        assert "restarts nothing" in finding["fix"]
    if not show:
        assert finding["evidence"] == "Failed to connect to bus"
    if "inactive" in show and "loaded" in show:
        assert "UnitFileState=disabled" in finding["evidence"]


def test_parse_systemctl_show_keeps_values_with_equals():
    assert doctor.parse_systemctl_show("A=1\nEnvironment=X=1 Y=2\n\nnoise\n") == {"A": "1", "Environment": "X=1 Y=2"}


# -------------------------------------------------------------------------------- engine flags

@pytest.mark.parametrize("line, flag, fix_part", [
    (IK_FMOE, "-fmoe", "fused MoE is on by default"),
    ("node hmk-inference[9]: error: invalid parameter for argument: -fa", "-fa", "`-fa on`"),
    ("node llama-server[9]: error: invalid argument: -mla", "-mla", "no MLA cache"),
    ('node llama-server[9]: error while handling argument "-amb": stoi', "-amb", "no MLA cache"),
    ("node python[9]: main.py: error: unrecognized arguments: --tensor-parallel-size 4 --power-throttle 380",
     "--tensor-parallel-size", "invented"),
    ("node hmk-inference[9]: error: unknown argument: --frobnicate", "--frobnicate", "llama_build_engine_flags"),
])
def test_refused_flags_name_the_replacement(line, flag, fix_part):
    raw = healthy()
    raw["service"]["show"] = SHOW_FAILED
    raw["journal_tail"] = ["node systemd[1]: Started hmk-inference.service.", line, line]
    findings = doctor.check_engine_flags(raw)
    assert findings[0]["severity"] == "critical"
    assert findings[0]["title"] == "The engine refuses the flag %s" % flag
    assert findings[0]["evidence"] == line.strip()
    assert fix_part in findings[0]["fix"]


def test_argparse_line_yields_every_unrecognized_flag_once_and_no_values():
    assert [f for f, _unused in doctor.rejected_flags([
        "error: unrecognized arguments: --tensor-parallel-size 4 --power-throttle 380",
        "error: unrecognized arguments: --power-throttle 380"])] == ["--tensor-parallel-size", "--power-throttle"]
    assert "nvidia_driver_power_limit_w" in doctor.flag_fix("--power-throttle")
    assert "--cpu_infer" in doctor.flag_fix("--avx2-thread-count")


def test_refused_flag_on_a_running_service_is_history():
    raw = healthy()
    raw["journal_tail"] = [IK_FMOE]
    findings = doctor.check_engine_flags(raw)
    assert [(f["severity"], f["title"]) for f in findings] == [
        ("info", "The engine refused -fmoe earlier; the service runs now")]
    assert findings[0]["fix"].startswith("Nothing to do now; if it comes back: Remove -fmoe")


def test_no_refused_flag_and_no_service():
    assert [f["severity"] for f in doctor.check_engine_flags(healthy())] == ["ok"]
    raw = healthy()
    raw["service"]["show"] = "LoadState=not-found\n"
    assert [(f["severity"], f["title"]) for f in doctor.check_engine_flags(raw)] == [
        ("info", "No refused flags to look for (the service is not installed)")]
    raw["service"]["show"] = ""
    assert doctor.check_engine_flags(raw)[0]["evidence"] == "LoadState=unknown"


# ------------------------------------------------------------------------------ engine errors

@pytest.mark.parametrize("line, title", [
    ("Failed to initialize NVML: Driver/library version mismatch", "The engine could not use the GPU driver"),
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 30000 MiB on device 0: cudaMalloc failed: out of memory",
     "The engine ran out of GPU memory"),
    ("llama_model_load: error loading model: mmap failed: Cannot allocate memory",
     "The engine could not map or lock the model in memory"),
    ("llama_load_model_from_file: failed to load model", "The engine could not load the model"),
    ("gguf_init_from_file: failed to open GGUF file '/srv/models/r1/r1-00001-of-00009.gguf' (No such file or directory)",
     "The engine could not load the model"),
])
def test_known_engine_errors(line, title):
    raw = healthy()
    raw["service"]["show"] = SHOW_FAILED
    raw["journal_tail"] = ["older line", line]
    findings = doctor.check_engine_errors(raw)
    assert [(f["severity"], f["title"], f["evidence"]) for f in findings] == [("critical", title, line)]
    raw["service"]["show"] = SHOW_RUNNING
    assert doctor.check_engine_errors(raw)[0]["severity"] == "warning"


def test_unrelated_missing_file_is_not_a_model_error():
    raw = healthy()
    raw["journal_tail"] = ["open /etc/hmk/extra.conf: No such file or directory"]
    assert [f["severity"] for f in doctor.check_engine_errors(raw)] == ["ok"]


def test_journal_warnings_without_a_known_cause():
    raw = healthy()
    raw["journal_warnings"] = ["-- Boot 1f --", "a: warn 1", "b: warn 2", "c: warn 3", "d: warn 4"]
    findings = doctor.check_engine_errors(raw)
    assert [(f["severity"], f["title"]) for f in findings] == [
        ("warning", "4 warning or error line(s) about the service in the journal since -1h")]
    assert findings[0]["evidence"] == "b: warn 2 | c: warn 3 | d: warn 4"
    assert "--since '-1h'" in findings[0]["fix"]


def test_engine_errors_ok_and_not_installed():
    assert doctor.check_engine_errors(healthy())[0]["severity"] == "ok"
    raw = healthy()
    raw["service"]["show"] = "LoadState=not-found\n"
    assert [(f["severity"], f["title"]) for f in doctor.check_engine_errors(raw)] == [
        ("info", "No engine errors to look for (the service is not installed)")]


# ------------------------------------------------------------------------------- NVIDIA driver

def test_module_and_library_versions_are_read():
    assert doctor.nvidia_module_version(PROC_OPEN) == "570.86.15"
    assert doctor.nvidia_module_version(PROC_PROPRIETARY) == "535.216.01"
    assert doctor.nvidia_module_version("") is None
    assert doctor.nvidia_library_versions(["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15",
                                           "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                           "/usr/lib64/libnvidia-ml.so.535.216.01"]) == ["535.216.01", "570.86.15"]


def test_nvidia_smi_mismatch_is_critical():
    raw = healthy()
    raw["nvidia_smi"] = {"rc": 18, "stdout": "Failed to initialize NVML: Driver/library version mismatch\n"
                                             "NVML library version: 570.124", "stderr": ""}
    finding = doctor.check_nvidia_driver(raw)
    assert finding["severity"] == "critical"
    assert finding["title"] == "NVIDIA driver and library versions do not match"
    assert finding["evidence"] == ("nvidia-smi: Driver/library version mismatch; kernel module 570.86.15, "
                                   "libnvidia-ml 570.124, 570.86.15")
    assert "reboot" in finding["fix"] and "held" in finding["fix"]


def test_module_older_than_the_libraries_is_critical_without_nvidia_smi_saying_so():
    raw = healthy()
    raw["nvidia_proc_version"] = PROC_PROPRIETARY
    finding = doctor.check_nvidia_driver(raw)
    assert finding["severity"] == "critical"
    assert finding["evidence"] == "kernel module 535.216.01, libnvidia-ml 570.86.15"


def test_no_gpu_no_driver_is_info():
    raw = healthy()
    raw["hardware"]["gpus"] = []
    raw["nvidia_proc_version"] = ""
    raw["nvidia_libraries"] = []
    raw["nvidia_smi"] = {"rc": 2, "stdout": "", "stderr": "", "missing": True}
    finding = doctor.check_nvidia_driver(raw)
    assert (finding["severity"], finding["evidence"]) == (
        "info", "no /proc/driver/nvidia/version; nvidia-smi missing")
    raw["nvidia_smi"]["missing"] = False
    assert doctor.check_nvidia_driver(raw)["evidence"].endswith("nvidia-smi rc=2")


def test_gpu_without_module_is_critical():
    raw = healthy()
    raw["nvidia_proc_version"] = ""
    raw["nvidia_smi"] = {"rc": 9, "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the "
                                            "NVIDIA driver.", "stderr": ""}
    finding = doctor.check_nvidia_driver(raw)
    assert (finding["severity"], finding["title"]) == ("critical", "The NVIDIA kernel module is not loaded")
    assert "mokutil" in finding["fix"]


def test_nvidia_smi_failing_with_module_loaded_is_critical():
    raw = healthy()
    raw["nvidia_smi"] = {"rc": 15, "stdout": "", "stderr": "Unable to determine the device handle for GPU0000:01:00.0: "
                         "Unknown Error"}
    finding = doctor.check_nvidia_driver(raw)
    assert finding["title"] == "nvidia-smi fails with the driver loaded"
    assert finding["evidence"] == ("kernel module 570.86.15; nvidia-smi rc=15: Unable to determine the device handle "
                                   "for GPU0000:01:00.0: Unknown Error")


def test_driver_ok_and_libraries_not_found():
    assert doctor.check_nvidia_driver(healthy())["severity"] == "ok"
    raw = healthy()
    raw["nvidia_libraries"] = []
    finding = doctor.check_nvidia_driver(raw)
    assert finding["severity"] == "ok" and "(not found, nvidia-smi works)" in finding["evidence"]


# ----------------------------------------------------------------------------------- GPU count

def test_gpu_presence():
    raw = healthy()
    assert doctor.check_gpu_present(raw)["severity"] == "ok"
    raw["hardware"]["gpus"] = []
    finding = doctor.check_gpu_present(raw)
    assert (finding["severity"], finding["title"]) == ("critical", "0 of 1 expected GPUs are visible")
    raw["profile"] = copy.deepcopy(TWIN)
    finding = doctor.check_gpu_present(raw)
    assert (finding["severity"], finding["title"]) == (
        "info", "No NVIDIA GPU on this node; the GPU checks do not apply")
    raw["hardware"]["gpus"] = [copy.deepcopy(GPU)]
    finding = doctor.check_gpu_present(raw)
    assert finding["severity"] == "info" and "gpus.count" in finding["fix"]
    raw["profile"] = {"name": "bare", "gpus": None}  # a profile without a GPU section expects none
    assert doctor.check_gpu_present(raw)["title"] == "1 NVIDIA GPU(s) visible, the profile expects 0"


# ------------------------------------------------------------------------ NUMA, NPS, SMT, DIMMs

@pytest.mark.parametrize("value, nodes, severity", [
    ("absent", 1, "ok"), ({"unknown": "reads 'x'"}, 1, "info"), (0, 4, "ok"), (1, 1, "info"), (1, 2, "critical"),
    (1, None, "critical"),
])
def test_numa_balancing(value, nodes, severity):
    raw = healthy()
    raw["hardware"]["numa_balancing"] = value
    if nodes:
        set_nodes(raw, nodes)
    else:
        raw["hardware"]["numa"] = {}
        raw["hardware"]["cpu"]["numa_nodes"] = {"unknown": "no NUMA node(s) line"}
    assert doctor.check_numa_balancing(raw)["severity"] == severity


@pytest.mark.parametrize("sockets, nodes, severity, title", [
    (None, 1, "info", "NUMA nodes per socket could not be read"),
    (1, 1, "ok", "NPS1 as the profile wants"),
    (1, 4, "critical", "NPS4 instead of NPS1: the experts' bandwidth is split"),
    (2, 3, "critical", "NPS1.5 instead of NPS1: the experts' bandwidth is split"),
])
def test_nps(sockets, nodes, severity, title):
    raw = healthy()
    raw["hardware"]["numa"] = {}  # lscpu's counts only: no per-socket node list
    raw["hardware"]["cpu"].update(sockets=sockets, numa_nodes=nodes)
    finding = doctor.check_nps(raw)
    assert (finding["severity"], finding["title"]) == (severity, title)


def test_nps_counts_nodes_with_cpus_per_socket_and_reports_memory_only_nodes():
    raw = healthy()
    raw["hardware"]["numa"]["nodes"]["1"] = {"cpus": "", "size_mb": 262144, "packages": []}  # a CXL expander
    assert doctor.check_nps(raw)["title"] == "NPS1 as the profile wants"
    findings = dict((f["id"], f) for f in doctor.check_memory_nodes(raw))
    assert findings["numa_memory_only_nodes"]["severity"] == "warning"
    assert findings["numa_memory_only_nodes"]["evidence"] == "node 1: 256.0 GB, no CPU"
    assert findings["numa_memoryless_cpu_nodes"]["severity"] == "ok"
    set_nodes(raw, 4, size_mb=0)
    raw["hardware"]["numa"]["nodes"]["1"]["size_mb"] = 128000
    findings = dict((f["id"], f) for f in doctor.check_memory_nodes(raw))
    assert findings["numa_memoryless_cpu_nodes"]["title"] == "CPU node(s) without memory: node 0, node 2, node 3"
    assert findings["numa_memory_placement"]["severity"] == "warning"


def test_naples_die_layout_is_a_warning_without_an_nps_fix():
    raw = healthy()
    raw["hardware"]["cpu"].update(family=23, model_number=1)
    set_nodes(raw, 4)
    finding = doctor.check_nps(raw)
    assert finding["severity"] == "warning" and "die layout" in finding["title"]
    assert "NUMA nodes per socket = NPS" not in finding["fix"]


def test_nps_smt_channels_in_a_vm_are_info_that_the_host_decides():
    raw = healthy()
    raw["hardware"]["cpu"].update(hypervisor=True, hypervisor_vendor="KVM")
    set_nodes(raw, 2)
    assert doctor.check_platform(raw)["severity"] == "info"
    for check in (doctor.check_nps, doctor.check_smt, doctor.check_memory_channels):
        finding = check(raw)
        assert finding["severity"] == "info" and "virtual machine" in finding["title"], check
    raw["profile"]["platform"] = "bare_metal"  # a twin that stands in for the metal is judged as metal
    raw["hardware"]["platform"] = {"kind": "bare_metal", "detected": "virtual", "source": "declared",
                                   "evidence": ["CPU hypervisor flag (KVM)"]}
    assert doctor.check_nps(raw)["severity"] == "critical"


def test_memory_channels():
    raw = healthy()
    assert doctor.check_memory_channels(raw)["severity"] == "ok"
    raw["hardware"]["memory"].update(channels_populated=8, slots_populated=8)
    finding = doctor.check_memory_channels(raw)
    assert (finding["severity"], finding["title"]) == (
        "critical", "8 of 12 memory channels are populated: 33% of the bandwidth is missing")
    assert finding["evidence"].startswith("8 of 12 channels populated (labels), 8 of 24 slots, 4800 MT/s")
    raw["hardware"]["memory"].update(channels_populated=12, slots_populated=12, configured_speed_mts=4400)
    finding = doctor.check_memory_channels(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "Memory runs at 4400 MT/s, below 4800")
    raw["profile"]["memory"] = {}  # no target in the profile: the CPU generation's (Genoa: 12 channels)
    raw["hardware"]["memory"].update(configured_speed_mts=4800)
    assert doctor.check_memory_channels(raw)["severity"] == "ok"
    raw["hardware"]["cpu"].update(family={"unknown": "no cpu family line"})
    assert doctor.check_memory_channels(raw)["severity"] == "info"
    raw["hardware"]["memory"] = {"slots_populated": 0, "slots_total": 0}
    finding = doctor.check_memory_channels(raw)
    assert (finding["severity"], finding["evidence"]) == (
        "info", "dmidecode -t 17 lists no populated DIMM (0 slots)")


def test_memory_channels_from_labels_that_do_not_name_channels():
    raw = healthy()
    raw["hardware"]["memory"] = {"slots_populated": 4, "slots_total": 16, "channel_source": "unknown",
                                 "channels_populated": {"unknown": "the DIMM labels (Dell) do not name channels"},
                                 "channels_upper_bound": 4, "configured_speed_mts": 4800}
    finding = doctor.check_memory_channels(raw)
    assert (finding["severity"], finding["title"]) == (
        "critical", "at most 4 of 12 memory channels are populated: at least 67% of the bandwidth is missing")
    raw["profile"]["memory"]["channels_per_socket"] = 4
    finding = doctor.check_memory_channels(raw)
    assert finding["severity"] == "info" and "cannot be told" in finding["title"]


@pytest.mark.parametrize("smt, want, severity", [
    (None, False, "info"), (False, False, "ok"), (True, True, "ok"), (True, False, "warning"), (False, True, "info"),
])
def test_smt(smt, want, severity):
    raw = healthy()
    raw["hardware"]["cpu"]["smt_active"] = smt
    if smt is None:
        raw["hardware"]["cpu"]["threads_per_core"] = {"unknown": "no Thread(s) per core line"}
    raw["profile"]["cpu"]["smt"] = want
    assert doctor.check_smt(raw)["severity"] == severity


# ---------------------------------------------------------------------------------- page cache

def test_page_cache_branches():
    raw = healthy()
    finding = doctor.check_page_cache(raw)
    assert finding["severity"] == "ok"
    assert finding["evidence"] == ("model 330.6 GiB in 2 file(s); resident 330.6 GiB (fincore); "
                                   "page cache 352.9 GiB; RAM 376.7 GB")

    raw["model"]["fincore"] = "%d %d\n0 %d\n" % (177 * 10 ** 9, 177 * 10 ** 9, 178 * 10 ** 9)
    finding = doctor.check_page_cache(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "Only 49% of the model is in the page cache")

    raw["model"]["fincore"] = ""  # no fincore: the page cache total decides
    raw["meminfo"] = MEMINFO.replace("370000000", "100000000")
    finding = doctor.check_page_cache(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "The page cache is smaller than the model")
    raw["meminfo"] = MEMINFO
    finding = doctor.check_page_cache(raw)
    assert finding["severity"] == "info" and "fincore" in finding["fix"]

    raw["hardware"]["memory_total_gb"] = 256.0
    assert doctor.check_page_cache(raw)["title"] == "The model is larger than the RAM"

    raw["model"]["files"] = []
    finding = doctor.check_page_cache(raw)
    assert (finding["severity"], finding["evidence"]) == (
        "critical", "/srv/models/r1/r1-00001-of-00002.gguf does not exist")

    raw["model"] = {"path": ""}
    assert doctor.check_page_cache(raw)["severity"] == "info"


def test_small_model_sizes_read_in_mib():
    raw = healthy()
    raw["model"] = {"path": "/srv/models/tiny.gguf", "files": [{"path": "/srv/models/tiny.gguf", "size": 4 * 2 ** 20}],
                    "fincore": "4194304 4194304\n"}
    assert doctor.check_page_cache(raw)["evidence"].startswith("model 4.0 MiB in 1 file(s); resident 4.0 MiB")


def test_parsers_of_fincore_meminfo_governors():
    assert doctor.parse_fincore("RES SIZE\n10 20\n5 5\n") == (15, 25)
    assert doctor.parse_fincore("") == (None, None)
    assert doctor.meminfo_kb(MEMINFO, "Cached") == 370000000 and doctor.meminfo_kb("", "Cached") is None
    assert doctor.parse_governors("/a/policy0/scaling_governor:powersave\n/a/policy1/scaling_governor:powersave\n"
                                  "/a/policy2/scaling_governor:performance\n") == {"powersave": 2, "performance": 1}


# -------------------------------------------------------------------------------- PCIe, governor

def test_gpu_links():
    raw = healthy()
    assert doctor.check_gpu_links(raw)["severity"] == "ok"
    raw["hardware"]["gpus"][0]["link"].update(current_speed_gts=2.5)
    finding = doctor.check_gpu_links(raw)
    assert (finding["severity"], finding["evidence"]) == ("info", "0000:01:00.0 x16 of x16 at 2.5 of 16.0 GT/s")
    raw["hardware"]["gpus"][0]["link"].update(current_width=8)
    finding = doctor.check_gpu_links(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "GPU link narrower than x16: 0000:01:00.0")
    raw["hardware"]["gpus"][0]["link"] = {}
    assert doctor.check_gpu_links(raw)["title"] == "GPU link width could not be read: 0000:01:00.0"
    raw["hardware"]["gpus"] = []
    assert doctor.check_gpu_links(raw)["severity"] == "info"


@pytest.mark.parametrize("policy, severity", [
    (None, "info"), ("performance", "ok"), ("default", "warning"), ("powersave", "warning"),
    ("powersupersave", "warning"),
])
def test_aspm(policy, severity):
    raw = healthy()
    raw["hardware"]["pcie_aspm_policy"] = policy
    finding = doctor.check_aspm(raw)
    assert finding["severity"] == severity
    if severity == "warning":
        assert "pcie_aspm.policy=performance" in finding["fix"]


def test_governor():
    raw = healthy()
    finding = doctor.check_governor(raw)
    assert (finding["severity"], finding["evidence"]) == ("ok", "performance: 2 policies")
    raw["cpufreq"]["stdout"] = "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor:schedutil\n"
    finding = doctor.check_governor(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "CPU governor schedutil instead of performance")
    assert "kernel_tuning_cpufreq_governor: performance" in finding["fix"]
    raw["cpufreq"] = {"stdout": "", "stderr": ""}
    assert doctor.check_governor(raw)["severity"] == "info"


# ------------------------------------------------------------------------------ model integrity

def test_a_file_that_failed_the_scheduled_rehash_is_critical_and_named_with_the_fix():
    raw = healthy()
    raw["model_integrity"]["record"] = {
        "ok": False, "files_checked": 2, "missing": [],
        "mismatches": [{"model": "r1", "file": "r1-00002-of-00002.gguf", "expected_sha256": "ab" * 32,
                        "observed_sha256": "cd" * 32, "quarantined_to": "/srv/models/.quarantine/r1/x.rehash-mismatch"}]}
    report = doctor.diagnose(raw)
    finding = only(report["findings"], "model_integrity")
    assert finding["severity"] == "critical" and finding["rank"] == 1
    assert "r1/r1-00002-of-00002.gguf" in finding["evidence"] and "cdcdcdcd" in finding["evidence"]
    assert ".quarantine/r1/x.rehash-mismatch" in finding["evidence"]
    assert "site.yml" in finding["fix"]


def test_no_rehash_record_yet_is_information_only():
    raw = healthy()
    raw["model_integrity"] = {"path": "/var/lib/hmk/model-integrity.json", "record": None}
    finding = only(doctor.diagnose(raw)["findings"], "model_integrity")
    assert finding["severity"] == "info" and "hmk-model-rehash" in finding["fix"]


# ------------------------------------------------------------------------ engine ISA, passthrough

HARDWARE_FIXTURES = FIXTURES / "hardware"


def test_engine_isa_matches_the_cpu():
    finding = doctor.check_engine_isa(healthy())
    assert (finding["severity"], finding["title"]) == ("ok", "The engine uses the CPU's vector extensions")
    assert "n_threads=32 n_threads_batch=32 of 32 logical CPUs" in finding["evidence"]


def test_engine_built_without_avx512_on_a_zen4_host_is_a_warning():
    raw = healthy()
    # The journal of a service that runs an AVX2-only build; the terminal-wrapped form reads the same.
    wrapped = (HARDWARE_FIXTURES / "llama-log--ik-perplexity-terminal-wrapped-system-info-64-of-128.txt").read_text()
    raw["engine_system_info"] = wrapped.splitlines()
    finding = doctor.check_engine_isa(raw)
    assert finding["severity"] == "warning"
    assert finding["title"] == "The engine does not use AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16, which this CPU has"
    assert "GGML_NATIVE=ON" in finding["fix"]


def test_engine_built_for_avx512_on_a_zen3_host_is_critical():
    raw = healthy()
    raw["hardware"]["cpu"]["flags"] = [f for f in GENOA_FLAGS if not f.startswith("avx512")]
    finding = doctor.check_engine_isa(raw)
    assert finding["severity"] == "critical" and "SIGILL" in finding["fix"]
    assert finding["title"].startswith("The engine was built for AVX512, AVX512_VBMI")


def test_engine_isa_without_a_system_info_line_or_service():
    raw = healthy()
    raw["engine_system_info"] = []
    finding = doctor.check_engine_isa(raw)
    assert finding["severity"] == "info" and "no system_info line" in finding["evidence"]
    raw["service"]["show"] = "LoadState=not-found\n"
    assert doctor.check_engine_isa(raw)["title"].startswith("No engine to compare")


def test_gpu_bound_to_vfio_is_passed_through_not_present():
    raw = healthy()
    raw["hardware"]["gpus"][0]["driver"] = "vfio-pci"
    raw["hardware"]["gpus"][0]["vram_mib"] = {"unknown": "nvidia-smi does not list this GPU"}
    finding = doctor.check_gpu_present(raw)
    assert finding["severity"] == "critical"
    assert finding["title"] == "0 of 1 expected GPUs are visible (0000:01:00.0 passed through with vfio-pci)"
    assert doctor.check_gpu_links(raw)["severity"] == "info"


def test_aspm_enabled_on_the_gpu_link_and_pcie_aspm_off_are_warnings():
    raw = healthy()
    raw["hardware"]["gpus"][0]["link"]["aspm_enabled"] = ["L1"]
    finding = doctor.check_aspm(raw)
    assert (finding["severity"], finding["title"]) == ("warning", "ASPM is enabled on the GPU link(s): 0000:01:00.0")
    raw["hardware"]["gpus"][0]["link"]["aspm_enabled"] = []
    raw["hardware"]["pcie_aspm_policy"] = "default"
    raw["hardware"]["cmdline"] = {"line": "ro pcie_aspm=off", "params": {"pcie_aspm": "off"}, "pcie_aspm": "off",
                                  "pcie_aspm_policy": "unset"}
    finding = doctor.check_aspm(raw)
    assert finding["severity"] == "warning" and "pcie_aspm=off" in finding["title"]
    assert "pcie_aspm.policy=performance" in finding["fix"]
