"""doctor on GPU nodes: the driver's devices against the unit's device rules (gpu_devices) and the running
engine's own log of its start against the placement plan (gpu_placement, "serving CPU-only on a GPU node"),
on real /proc/devices captures and real engine logs (tests/fixtures/*/INDEX.md)."""
import copy
import json

import pytest

import test_doctor as base

doctor = base.doctor
FIX = base.FIXTURES


def proc(name):
    return (FIX / "proc-devices" / name).read_text()


def log(name):
    return (FIX / "engine-logs" / name).read_text()


def finding(raw, check):
    return base.only(doctor.diagnose(raw)["findings"], check)


def test_a_healthy_gpu_node_passes_both_checks():
    raw = base.healthy()
    devices, placement = finding(raw, "gpu_devices"), finding(raw, "gpu_placement")
    assert devices["severity"] == "ok" and "nvidia + nvidiactl (550.40 and newer)" in devices["evidence"]
    assert placement["severity"] == "ok" and "1 CUDA device(s)" in placement["evidence"]
    assert "62/62 layers" in placement["evidence"]


def test_a_cpu_only_node_has_nothing_to_check():
    raw = base.healthy()
    raw["profile"] = copy.deepcopy(base.TWIN)
    raw["hardware"]["gpus"] = []
    assert finding(raw, "gpu_devices")["severity"] == "info"
    assert finding(raw, "gpu_placement")["severity"] == "info"


def test_no_nvidia_driver_in_proc_devices_is_critical_with_the_fix():
    raw = base.healthy()
    raw["gpu_devices"]["proc_devices"] = proc("ci-machine-no-gpu.txt")
    f = finding(raw, "gpu_devices")
    assert f["severity"] == "critical" and "no NVIDIA driver" in f["title"]
    assert "modprobe nvidia" in f["fix"] and "mokutil --sb-state" in f["fix"]


def test_the_rules_the_kit_had_before_refuse_the_newer_naming():
    raw = base.healthy()
    raw["gpu_devices"]["device_allow"] = ("char-nvidia-frontend rw char-nvidia-uvm rw char-nvidia-caps rw "
                                          "char-nvidia-caps-imex-channels rw")
    f = finding(raw, "gpu_devices")
    assert f["severity"] == "critical" and "would refuse nvidia, nvidiactl" in f["title"]
    assert "char-nvidia*" in f["fix"]
    # the same rules were right for the 535 naming
    raw["gpu_devices"]["proc_devices"] = proc("twin-standin-r535.txt")
    assert finding(raw, "gpu_devices")["severity"] == "ok"


def test_a_missing_unified_memory_node_is_critical():
    raw = base.healthy()
    raw["gpu_devices"]["uvm_node"] = False
    f = finding(raw, "gpu_devices")
    assert f["severity"] == "critical" and "hmk-nvidia-device-nodes.service" in f["fix"]


def test_serving_cpu_only_on_a_gpu_node_is_critical():
    raw = base.healthy()
    raw["gpu_placement"]["engine_log"] = log("mainline--no-cuda-devices-issue6184.log")
    f = finding(raw, "gpu_placement")
    assert (f["severity"], f["title"]) == ("critical", "Serving CPU-only on a GPU node")
    assert "cuda_devices: found the engine found no CUDA device" in f["evidence"]
    assert "DeviceAllow" in f["fix"]
    assert [x["id"] for x in doctor.diagnose(raw)["findings"]][0] == "gpu_placement"


def test_an_out_of_memory_start_is_critical_and_a_different_split_a_warning():
    raw = base.healthy()
    raw["gpu_placement"]["engine_log"] = base.GPU_LOG + log("mainline--oom-at-load-issue20431.log")
    f = finding(raw, "gpu_placement")
    assert f["severity"] == "critical" and "out_of_memory" in f["title"]
    plan = copy.deepcopy(base.GPU_PLAN)
    plan["plan"]["gpus"][0]["expected_bytes"] = 10 * 1024 ** 3   # the weights log 16.9 GiB on CUDA0
    raw = base.healthy()
    raw["gpu_placement"]["plan"] = json.dumps(plan)
    f = finding(raw, "gpu_placement")
    assert f["severity"] == "warning" and f["title"].endswith("weights")


def test_nothing_to_compare_without_a_running_service_or_a_plan():
    raw = base.healthy()
    raw["service"]["show"] = base.SHOW_FAILED
    assert finding(raw, "gpu_placement")["severity"] == "info"
    raw = base.healthy()
    raw["gpu_placement"]["plan"] = ""
    f = finding(raw, "gpu_placement")
    assert f["severity"] == "info" and "hmk-inference-plan.json" in f["evidence"]


def test_a_log_that_lost_its_start_is_not_called_cpu_only():
    # the doctor runs long after the start: the journal kept the buffers, not the ggml_cuda_init lines
    raw = base.healthy()
    raw["gpu_placement"]["engine_log"] = "".join(base.GPU_LOG.splitlines(True)[4:])
    f = finding(raw, "gpu_placement")
    assert f["severity"] == "ok" and "start of the log was not seen" in f["evidence"]
    assert "weights on CUDA0 17284.05 MiB" in f["evidence"]


def test_a_log_with_nothing_left_of_the_start_is_a_warning_that_says_why():
    raw = base.healthy()
    raw["gpu_placement"]["engine_log"] = "llama_new_context_with_model: n_ctx      = 8192\n"
    f = finding(raw, "gpu_placement")
    assert f["severity"] == "warning" and "no longer in the journal" in f["title"]
    assert "journalctl" in f["fix"]


def test_a_cuda_error_in_the_running_engines_log_is_critical_and_named():
    raw = base.healthy()
    raw["gpu_placement"]["engine_log"] = base.GPU_LOG + log("mainline--illegal-memory-access-issue13909.log")
    f = finding(raw, "gpu_placement")
    assert (f["severity"], f["title"]) == ("critical", "CUDA error in the engine's log: illegal_memory_access")
    assert "CUDA error: an illegal memory access was encountered" in f["evidence"]
    assert "xid" in f["fix"]


@pytest.mark.parametrize("name, kind, hint", [
    ("mainline--no-kernel-image-dgx-spark-issue3.log", "no_kernel_image", "CMAKE_CUDA_ARCHITECTURES"),
    ("mainline--cublas-invalid-value-issue25061.log", "cublas", "llama_build_extra_cmake_args"),
    ("mainline--illegal-memory-access-issue13909.log", "illegal_memory_access", "dmesg"),
])
def test_a_crashed_engine_names_its_cuda_error_from_the_journal(name, kind, hint):
    raw = base.healthy()
    raw["service"]["show"] = base.SHOW_FAILED
    raw["journal_tail"] = log(name).splitlines()
    findings = [f for f in doctor.check_engine_errors(raw) if f["title"].startswith("CUDA error")]
    assert [(f["severity"], f["title"]) for f in findings] == [("critical", "CUDA error in the engine: %s" % kind)]
    assert "CUDA error" in findings[0]["evidence"] and hint in findings[0]["fix"]
    # the service is down, so the placement check cannot read a running start
    assert finding(raw, "gpu_placement")["severity"] == "info"
