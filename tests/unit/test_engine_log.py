"""The engine-log proof (plugins/module_utils/hmk_engine_log.py) on real startup logs of ik_llama.cpp and mainline
llama.cpp collected from public issues (tests/fixtures/engine-logs/INDEX.md): what each log says, and the
health gate's verdict when such a log meets the kit's plan."""
import importlib.util
from pathlib import Path

import pytest

import moe_layouts
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_log as elog

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "engine-logs"
GIB = 1024 ** 3
MIB = 1024 ** 2

_spec = importlib.util.spec_from_file_location("inference_service_filters_elog",
                                               REPO / "plugins" / "filter" / "inference_service.py")
svc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(svc)


def log(name):
    return (LOGS / name).read_text()


def parsed(name):
    return elog.parse(log(name))


def record(layout, vram_gib, engine="ik_llama.cpp", override_tensor=None, **kw):
    """The plan record the role writes (NAME-plan.json) for this model on these GPUs."""
    kv = svc.kv_cache_bytes(layout, 32768, "q8_0", "q8_0", mla=layout["architecture"] == "deepseek2")
    plan = svc.placement_plan(layout, [g * GIB for g in vram_gib], kv, 3 * GIB, GIB,
                              model=svc.split_model(engine, "2026-04-13"), **kw)
    return {"engine": engine, "override_tensor": override_tensor or plan["rules"], "plan": plan}


def failed(result):
    return {d["check"] for d in result["differences"]}


# ------------------------------------------------------------------------------------- what the logs say

def test_every_fixture_is_listed_in_the_index_with_its_source():
    index = (LOGS / "INDEX.md").read_text()
    names = sorted(p.name for p in LOGS.glob("*.log"))
    assert len(names) >= 20
    for name in names:
        row = next((line for line in index.splitlines() if line.startswith("| `%s`" % name)), None)
        assert row and "https://github.com/" in row, name


EXPECTED = {
    # file: (device_count, error, none_found, gpu_layers_ignored, devices, offloaded, overrides, weights, kv, oom)
    "ik--1gpu-a6000-full-offload-pr333.log":
        (1, None, False, False, ["NVIDIA RTX A6000"], (62, 62), 0, {"CPU": 499.5, "CUDA0": 17284.05}, {"CUDA0": 1952.0}, 0),
    "ik--1gpu-overrides-to-cpu-pr386.log": (None, None, False, False, [], None, 21, {}, {}, 0),
    "ik--1gpu-hybrid-exps-on-cpu-kt1417.log": (None, None, False, False, [], (62, 62), 0, {"CPU": 364089.6}, {}, 0),
    "ik--4gpu-start-pr409.log":
        (4, None, False, False, ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090",
                                 "NVIDIA RTX A6000"], None, 0, {}, {}, 0),
    "ik--4gpu-overrides-pr409.log": (None, None, False, False, [], None, 20, {}, {}, 0),
    "ik--4gpu-start-pr394.log": (4, None, False, False, ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4090",
                                                         "NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"], None, 0, {}, {}, 0),
    "ik--4gpu-buffers-pr394.log":
        (None, None, False, False, [], None, 0, {"CPU": 133756.0, "CUDA_Host": 497.11, "CUDA0": 22412.07,
                                                 "CUDA1": 17714.47, "CUDA2": 21610.08, "CUDA3": 42786.36}, {}, 0),
    "ik--multigpu-overrides-cuda13-14-pr262.log": (None, None, False, False, [], None, 20, {}, {}, 0),
    "ik--11gpu-oom-compute-buffer-issue749.log": (None, None, False, False, [], None, 0, {}, "11 devices", 2),
    "mainline--4gpu-buffers-pr394.log":
        (None, None, False, False, [], (62, 62), 0, {"CUDA0": 22412.07, "CUDA1": 17714.47, "CUDA2": 21610.08,
                                                     "CUDA3": 42786.36, "CPU": 134253.11}, {}, 0),
    "mainline--1gpu-hybrid-r1-pr11397.log":
        (None, None, False, False, [], (62, 62), 0, {"CUDA0": 9460.52, "CPU_Mapped": 384571.29}, {}, 0),
    "mainline--overrides-rpc-verbose-pr11397.log": (None, None, False, False, [], None, 20, {}, {}, 0),
    "mainline--4gpu-init-3090-issue10981.log": (4, None, False, False, ["NVIDIA GeForce RTX 3090"] * 4, None, 0, {}, {}, 0),
    "mainline--3gpu-buffers-deepseek-v4-issue22319.log":
        (None, None, False, False, [], (44, 44), 0, {"CUDA0": 92226.12, "CUDA1": 40997.3, "CUDA2": 14676.03,
                                                     "CUDA_Host": 1010.0}, {}, 0),
    "mainline--1gpu-total-vram-format-issue22748.log":
        (1, None, False, True, ["NVIDIA GeForce RTX 5060 Laptop GPU"], None, 0, {}, {}, 0),
    "mainline--cuda-init-failure-system-not-yet-initialized-issue13059.log":
        (None, "system not yet initialized", False, True, [], None, 0, {}, {}, 0),
    "mainline--cuda-init-failure-unknown-error-issue10553.log": (None, "unknown error", False, True, [], None, 0, {}, {}, 0),
    "mainline--no-cuda-devices-issue6184.log": (None, None, True, False, [], None, 0, {}, {}, 0),
    "mainline--no-usable-gpu-device-info-issue23209.log": (None, None, False, True, [], None, 0, {}, {}, 0),
    "mainline--oom-at-load-issue20431.log": (None, None, False, False, [], None, 0, {}, {}, 3),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_log_says_what_it_says(name):
    count, error, none_found, ignored, devices, offloaded, overrides, weights, kv, oom = EXPECTED[name]
    facts = parsed(name)
    cuda = facts["cuda"]
    assert cuda["device_count"] == count
    assert cuda["error"] == error
    assert cuda["none_found"] is none_found
    assert bool(cuda["gpu_layers_ignored"]) is ignored
    assert [d["name"] for d in cuda["devices"]] == devices
    assert facts["offloaded"] == ({"layers": offloaded[0], "of": offloaded[1]} if offloaded else None)
    assert len(facts["overrides"]) == overrides
    assert facts["weights_mib"] == weights
    if kv == "11 devices":
        assert sorted(facts["kv_mib"]) == sorted("CUDA%d" % i for i in range(11))
    else:
        assert facts["kv_mib"] == kv
    assert len(facts["oom"]) == oom


def test_devices_carry_their_compute_capability_and_the_2026_vram_field():
    devices = parsed("ik--4gpu-start-pr409.log")["cuda"]["devices"]
    assert [d["compute_capability"] for d in devices] == ["12.0", "8.9", "8.9", "8.6"]
    laptop = parsed("mainline--1gpu-total-vram-format-issue22748.log")["cuda"]["devices"][0]
    assert (laptop["index"], laptop["vram_mib"]) == (0, 8150)


def test_override_lines_of_both_spellings_and_every_buffer_name_are_read():
    ik = parsed("ik--multigpu-overrides-cuda13-14-pr262.log")["overrides"]
    assert ik[0] == {"tensor": "blk.54.ffn_down_exps.weight", "buffer": "CUDA13"}
    assert {o["buffer"] for o in ik} == {"CUDA13", "CUDA14"}
    mainline = parsed("mainline--overrides-rpc-verbose-pr11397.log")["overrides"]
    assert {o["buffer"] for o in mainline} == {"CPU", "RPC[127.0.0.1:50053]"}
    # the pin's own format carries the size between the name and "buffer type" (src/llama-load-tensors.cpp)
    pinned = elog.parse("Tensor blk.3.ffn_up_exps.weight (size = 1512.00 MiB) buffer type overriden to CUDA0\n")
    assert pinned["overrides"] == [{"tensor": "blk.3.ffn_up_exps.weight", "buffer": "CUDA0"}]


def test_out_of_memory_names_the_device_and_the_load_error():
    ik = parsed("ik--11gpu-oom-compute-buffer-issue749.log")
    assert elog.oom_devices(ik["oom"]) == ["CUDA0"]
    mainline = parsed("mainline--oom-at-load-issue20431.log")
    assert elog.oom_devices(mainline["oom"]) == ["CUDA0"]
    assert mainline["load_error"] == "unable to allocate CUDA0 buffer"


def test_a_truncated_buffer_line_is_ignored_not_misread():
    facts = parsed("ik--1gpu-hybrid-exps-on-cpu-kt1417.log")
    assert "CUDA0" not in facts["weights_mib"]
    assert facts["weights_mib"]["CPU"] == pytest.approx(364089.6)


# ------------------------------------------------------------------------------------------- the gate

R1 = moe_layouts.r1("IQ4_XS")


@pytest.mark.parametrize("name", ["mainline--no-cuda-devices-issue6184.log",
                                  "mainline--no-usable-gpu-device-info-issue23209.log",
                                  "mainline--cuda-init-failure-system-not-yet-initialized-issue13059.log",
                                  "mainline--cuda-init-failure-unknown-error-issue10553.log"])
def test_a_node_whose_engine_sees_no_gpu_fails_the_gate_as_cpu_only_with_the_reason(name):
    plan = record(R1, [24])
    result = elog.evaluate(parsed(name), plan, apps=[], pid=4242)
    assert not result["ok"] and result["cpu_only"]
    cuda = next(d for d in result["differences"] if d["check"] == "cuda_devices")
    assert cuda["expected"] == "1 CUDA device(s)"
    assert "offloaded_layers" in failed(result) and "gpu_memory" in failed(result)
    text = "\n".join(elog.summary(result))
    assert "cuda_devices: found" in text and "Fix:" in text


def test_the_no_cuda_device_fix_points_at_the_device_rules_and_the_uvm_node():
    result = elog.evaluate(parsed("mainline--no-cuda-devices-issue6184.log"), record(R1, [24]))
    fix = next(d["fix"] for d in result["differences"] if d["check"] == "cuda_devices")
    assert "DeviceAllow" in fix and "/dev/nvidia-uvm" in fix and "nvidia-modprobe -u -c=0" in fix


def test_fewer_cuda_devices_than_the_profile_fails_naming_both_counts():
    plan = record(R1, [24, 24, 24, 24])
    result = elog.evaluate(parsed("mainline--1gpu-total-vram-format-issue22748.log"), plan)
    cuda = next(d for d in result["differences"] if d["check"] == "cuda_devices")
    assert cuda["found"].startswith("1 CUDA device(s)") and cuda["expected"].startswith("4 CUDA device(s)")
    assert "gpu_layers" in failed(result)  # the engine ignored -ngl: it serves from the CPU


def test_a_driver_too_old_for_the_build_gets_the_driver_fix():
    fix = elog.evaluate(elog.parse("ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient "
                                   "for CUDA runtime version\n"), record(R1, [24]))["differences"][0]["fix"]
    assert "nvidia_driver_branch" in fix


def test_four_devices_as_planned_pass_the_device_check():
    plan = record(R1, [24, 24, 24, 24])
    result = elog.evaluate(parsed("ik--4gpu-start-pr394.log"), plan)
    assert "cuda_devices" not in failed(result)
    assert next(c for c in result["checks"] if c["check"] == "cuda_devices")["status"] == "pass"


def test_a_full_offload_log_passes_the_layer_count_of_a_61_layer_model():
    result = elog.evaluate(parsed("ik--1gpu-a6000-full-offload-pr333.log"), record(R1, [24]))
    assert "offloaded_layers" not in failed(result) and "cuda_devices" not in failed(result)
    # the plan puts layer 3's experts on CUDA0 but this run logged no override at all: ik always logs them
    assert "override_rules" in failed(result)


def test_a_cpu_only_start_without_override_lines_is_not_blamed_on_the_rules():
    """ik_llama.cpp from 8337e4cd drops -ot when it finds no GPU (src/llama.cpp, llama_model_load_from_file): the
    CPU-only start is the finding, not the rules; with a GPU in use a missing override line still fails."""
    plan = record(R1, [24])
    result = elog.evaluate(elog.parse("ggml_cuda_init: no CUDA devices found\n"), plan)
    assert "cuda_devices" in failed(result) and "override_rules" not in failed(result)
    assert next(c for c in result["checks"] if c["check"] == "override_rules")["status"] == "skip"
    assert "override_rules" in failed(elog.evaluate(parsed("ik--1gpu-a6000-full-offload-pr333.log"), plan))


def test_fewer_layers_offloaded_than_ngl_asks_fails():
    facts = elog.parse("llm_load_tensors: offloaded 30/62 layers to GPU\n")
    result = elog.evaluate(facts, record(R1, [24]))
    diff = next(d for d in result["differences"] if d["check"] == "offloaded_layers")
    assert diff["found"] == "30/62 layers" and diff["expected"].startswith("62/62 layers")


def test_explicit_rules_must_each_match_tensors_in_the_engines_override_lines():
    facts = parsed("ik--4gpu-overrides-pr409.log")
    good = {"engine": "ik_llama.cpp", "override_tensor": ["blk.(8|9|10|11).ffn.=CUDA1", "blk.(12|13|14|15).ffn.=CUDA2"],
            "plan": record(R1, [24, 24, 24, 24])["plan"]}
    result = elog.evaluate(facts, good)
    rules = [c for c in result["checks"] if c["check"] == "override_rules"]
    assert [c["status"] for c in rules] == ["pass", "pass"]
    assert rules[0]["detail"] == "-ot blk.(8|9|10|11).ffn.=CUDA1 matched 4 tensor(s)"
    bad = dict(good, override_tensor=["blk.(0|1|2|3|4|5|6|7).ffn.=CUDA0"] + good["override_tensor"])
    diff = next(d for d in elog.evaluate(facts, bad)["differences"] if d["check"] == "override_rules")
    assert diff["found"].endswith("matched 0 tensor(s)") and "inference_service_override_tensor" in diff["fix"]


def test_the_experts_each_gpu_logged_are_compared_with_the_plans_layers():
    facts = parsed("ik--multigpu-overrides-cuda13-14-pr262.log")
    plan = record(R1, [24] * 15)
    # say the plan put layers 54-56 on CUDA13 and 57-60 on CUDA14 (what that run's rules did)
    plan["plan"]["gpus"][13]["layers"] = [54, 55, 56]
    plan["plan"]["gpus"][14]["layers"] = [57, 58, 59, 60]
    plan["override_tensor"] = plan["plan"]["rules"] = [r"blk\.(54|55|56)\.=CUDA13", r"blk\.(57|58|59|60)\.=CUDA14",
                                                       "exps=CPU"]
    checks = {c["detail"]: c["status"] for c in elog.evaluate(facts, plan)["checks"] if c["check"] == "expert_layers"}
    assert checks["CUDA13 holds the experts of layers [54, 55, 56]"] == "pass"
    assert checks["CUDA14 holds the experts of layers [57, 58, 59, 60]"] == "pass"
    assert checks["CUDA0 holds the experts of layers none"] == "fail"  # the plan wanted layer 3 there


def test_out_of_memory_fails_with_the_device_and_the_fix():
    result = elog.evaluate(parsed("ik--11gpu-oom-compute-buffer-issue749.log"), record(R1, [24] * 11))
    diff = next(d for d in result["differences"] if d["check"] == "out_of_memory")
    assert "cudaMalloc failed: out of memory" in diff["found"]
    assert diff["fix"].startswith("CUDA0 ran out of memory") and "inference_service_gpu_expert_layers" in diff["fix"]
    load = elog.evaluate(parsed("mainline--oom-at-load-issue20431.log"), record(R1, [24], engine="llama.cpp"))
    assert {"out_of_memory", "model_load"} <= failed(load)


def test_the_weights_on_each_gpu_must_hold_its_planned_experts_and_stay_in_budget():
    plan = record(R1, [24])
    gpu = plan["plan"]["gpus"][0]
    right = "llm_load_tensors:      CUDA0 buffer size = %.2f MiB\n" % (gpu["weights_bytes"] / float(MIB))
    assert "weights" not in failed(elog.evaluate(elog.parse(right), plan))
    # mainline's hybrid R1 run above put 9.2 GiB on its GPU: less than one R1 layer of experts, so the experts
    # the plan wanted on CUDA0 are not there
    result = elog.evaluate(parsed("mainline--1gpu-hybrid-r1-pr11397.log"), record(R1, [24], engine="llama.cpp"))
    diff = next(d for d in result["differences"] if d["check"] == "weights")
    assert diff["found"] == "CUDA0 weights 9.24 GiB"
    # and without -v mainline logs no overrides: that check is skipped, not passed
    assert next(c for c in result["checks"] if c["check"] == "override_rules")["status"] == "skip"


def test_the_kv_cache_per_gpu_proves_the_layer_split():
    plan = record(R1, [24, 24, 24, 24])
    blocks = [g["block"] for g in plan["plan"]["gpus"]]
    per_layer = 18.68
    as_planned = "".join("llama_kv_cache_init:      CUDA%d KV buffer size = %.2f MiB\n"
                         % (i, per_layer * (b[1] - b[0] + 1)) for i, b in enumerate(blocks))
    assert "layer_split" not in failed(elog.evaluate(elog.parse(as_planned), plan))
    # the engine's default split without -ts (16/15/16/14 layers) moves layer 15 to CUDA0
    default = "".join("llama_kv_cache_init:      CUDA%d KV buffer size = %.2f MiB\n" % (i, per_layer * n)
                      for i, n in enumerate([16, 15, 16, 14]))
    diff = [d for d in elog.evaluate(elog.parse(default), plan)["differences"] if d["check"] == "layer_split"]
    assert diff and diff[0]["found"] == "CUDA0 holds the KV cache of about 16 layer(s)"
    assert diff[0]["expected"] == "CUDA0: 15 layer(s) (0-14)"


def test_gpu_memory_of_the_process_must_sit_between_its_experts_and_the_budget():
    plan = record(R1, [24, 24])
    gpus = plan["plan"]["gpus"]
    facts = elog.parse("")
    fits = [{"pid": 77, "gpu": i, "used_mib": int(g["expected_bytes"] * 0.95 / MIB)} for i, g in enumerate(gpus)]
    ok = [c for c in elog.evaluate(facts, plan, fits, 77)["checks"] if c["check"] == "gpu_memory"]
    assert [c["status"] for c in ok] == ["pass", "pass"]
    over = [dict(fits[0], used_mib=int(gpus[0]["expected_bytes"] / MIB) + 512), fits[1]]
    diff = next(d for d in elog.evaluate(facts, plan, over, 77)["differences"] if d["check"] == "gpu_memory")
    assert diff["found"].startswith("GPU 0: the engine holds") and "budget" in diff["expected"]
    missing = elog.evaluate(facts, plan, [fits[1]], 77)
    assert any(d["found"] == "PID 77 holds no memory on GPU 0" for d in missing["differences"])
    nowhere = elog.evaluate(facts, plan, [{"pid": 5, "gpu": 0, "used_mib": 100}], 77)
    assert nowhere["cpu_only"]
    na = elog.evaluate(facts, plan, [dict(f, used_mib=None) for f in fits], 77)
    assert [c["status"] for c in na["checks"] if c["check"] == "gpu_memory"] == ["skip", "skip"]


def test_nvidia_smi_csv_maps_uuids_to_indexes_and_reads_na():
    # the form `--format=csv,noheader,nounits` prints (NVIDIA's nvidia-smi documentation): values, comma + space
    gpus = elog.parse_smi_gpus("0, GPU-aaaa, 24564\n1, GPU-bbbb, 24564\n")
    assert gpus == {"GPU-aaaa": 0, "GPU-bbbb": 1}
    apps = elog.parse_smi_apps("4242, GPU-bbbb, 20133\n4242, GPU-aaaa, [N/A]\n", gpus)
    assert apps == [{"pid": 4242, "gpu": 1, "used_mib": 20133}, {"pid": 4242, "gpu": 0, "used_mib": None}]
    assert elog.parse_smi_apps("No running processes found\n", gpus) == []


# ------------------------------------------------------------------ the placement from all the evidence

VERDICTS = {
    # file: (verdict, the log's start seen, GPUs the evidence names, CUDA error classes)
    "ik--11gpu-oom-compute-buffer-issue749.log":
        ("gpu", False, ["CUDA%d" % i for i in range(11)], ["out_of_memory", "out_of_memory"]),
    "ik--1gpu-3090ti-full-start-pr344.log": ("gpu", True, ["CUDA0"], []),
    "ik--1gpu-3090ti-start-cut-pr344.log": ("gpu", False, ["CUDA0"], []),
    "ik--1gpu-a6000-full-offload-pr333.log": ("gpu", True, ["CUDA0"], []),
    "ik--1gpu-hybrid-exps-on-cpu-kt1417.log": ("gpu", False, [], []),
    "ik--1gpu-overrides-to-cpu-pr386.log": ("unknown", False, [], []),
    "ik--4gpu-buffers-pr394.log": ("gpu", False, ["CUDA0", "CUDA1", "CUDA2", "CUDA3"], []),
    "ik--4gpu-overrides-pr409.log": ("gpu", False, ["CUDA1", "CUDA2"], []),
    "ik--4gpu-start-pr394.log": ("unknown", True, [], []),
    "ik--4gpu-start-pr409.log": ("unknown", True, [], []),
    "ik--multigpu-overrides-cuda13-14-pr262.log": ("gpu", False, ["CUDA13", "CUDA14"], []),
    "koboldcpp--cublas-status-not-supported-issue621.log": ("gpu", False, [], ["cublas"]),
    "lmstudio--using-device-cut-issue1360.log": ("gpu", False, ["CUDA0"], []),
    "mainline--1gpu-hybrid-r1-pr11397.log": ("gpu", False, ["CUDA0"], []),
    "mainline--1gpu-total-vram-format-issue22748.log": ("cpu_only", True, [], []),
    "mainline--2gpu-cuda-host-kv-pr8035.log": ("gpu", True, ["CUDA0", "CUDA1"], []),
    "mainline--2gpu-cuda-host-weights-issue7217.log": ("gpu", True, ["CUDA0", "CUDA1"], []),
    "mainline--2gpu-start-cut-compute-buffers-pr6122.log": ("gpu", False, ["CUDA0", "CUDA1"], []),
    "mainline--3gpu-buffers-deepseek-v4-issue22319.log": ("gpu", False, ["CUDA0", "CUDA1", "CUDA2"], []),
    "mainline--4gpu-buffers-pr394.log": ("gpu", False, ["CUDA0", "CUDA1", "CUDA2", "CUDA3"], []),
    "mainline--4gpu-init-3090-issue10981.log": ("unknown", True, [], []),
    "mainline--cublas-invalid-value-issue25061.log": ("gpu", False, [], ["cublas"]),
    "mainline--cublas-not-supported-old-format-issue4395.log": ("gpu", False, [], ["cublas"]),
    "mainline--cuda-init-failure-system-not-yet-initialized-issue13059.log": ("cpu_only", True, [], ["init_failure"]),
    "mainline--cuda-init-failure-unknown-error-issue10553.log": ("cpu_only", True, [], ["init_failure"]),
    "mainline--cuda-init-failure-with-offload-claim-issue1866.log": ("cpu_only", True, [], ["init_failure"]),
    "mainline--illegal-memory-access-issue13909.log": ("gpu", False, [], ["illegal_memory_access"]),
    "mainline--kv-cache-prefix-colour-cut-issue27680.log": ("gpu", False, ["CUDA0"], []),
    "mainline--no-cuda-devices-issue6184.log": ("cpu_only", True, [], ["init_failure"]),
    "mainline--no-kernel-image-dgx-spark-issue3.log": ("gpu", False, [], ["no_kernel_image"]),
    "mainline--no-kernel-image-old-format-issue4215.log": ("gpu", False, [], ["no_kernel_image"]),
    "mainline--no-usable-gpu-device-info-issue23209.log": ("cpu_only", True, [], []),
    "mainline--oom-at-load-issue20431.log": ("gpu", True, [], ["out_of_memory"] * 3),
    "mainline--oom-old-format-issue3221.log": ("gpu", True, [], ["out_of_memory"]),
    "mainline--overrides-rpc-verbose-pr11397.log": ("unknown", False, [], []),
}


def test_every_fixture_has_the_verdict_the_parser_must_reach():
    assert sorted(VERDICTS) == sorted(p.name for p in LOGS.glob("*.log"))


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_each_real_log_gets_its_placement_verdict_and_error_classes(name):
    verdict, start, devices, classes = VERDICTS[name]
    facts = parsed(name)
    assert facts["log_start_seen"] is start
    assert facts["placement"]["verdict"] == verdict
    assert facts["placement"]["log_start_seen"] is start
    assert facts["placement"]["gpu_devices"] == devices
    assert [e["class"] for e in facts["cuda_errors"]] == classes


def test_a_log_that_lost_its_first_lines_still_proves_the_gpu_placement():
    full, cut = parsed("ik--1gpu-3090ti-full-start-pr344.log"), parsed("ik--1gpu-3090ti-start-cut-pr344.log")
    assert full["cuda"]["device_count"] == 1 and cut["cuda"]["device_count"] is None
    assert full["gpu_mib"] == cut["gpu_mib"] == {"CUDA0": 18255.48}
    plan = record(R1, [24])
    result = elog.evaluate(cut, plan)
    assert not result["cpu_only"] and result["log_start_seen"] is False
    cuda = next(c for c in result["checks"] if c["check"] == "cuda_devices")
    assert cuda["status"] == "pass" and "CUDA0" in cuda["detail"] and "start of the log was not seen" in cuda["detail"]
    proof = next(c for c in result["checks"] if c["check"] == "placement")
    assert proof["status"] == "pass" and "weights on CUDA0 16303.48 MiB" in proof["detail"]
    # ik logs its overrides before the buffers: a cut log cannot show them, so they are not asked for
    assert next(c for c in result["checks"] if c["check"] == "override_rules")["status"] == "skip"
    assert "override_rules" in failed(elog.evaluate(full, plan))
    # the same log with its start is judged as before
    assert next(c for c in elog.evaluate(full, plan)["checks"] if c["check"] == "cuda_devices")["status"] == "pass"


def test_a_cut_multi_gpu_log_counts_the_gpus_from_their_buffers():
    facts = parsed("mainline--2gpu-start-cut-compute-buffers-pr6122.log")
    assert [d["index"] for d in facts["cuda"]["devices"]] == [0, 1] and facts["cuda"]["device_count"] is None
    assert facts["gpu_mib"] == {"CUDA0": 7642.39, "CUDA1": 17573.53}
    two = elog.evaluate(facts, record(R1, [24, 24]))
    assert "cuda_devices" not in failed(two) and not two["cpu_only"]
    four = elog.evaluate(facts, record(R1, [24, 24, 24, 24]))
    diff = next(d for d in four["differences"] if d["check"] == "cuda_devices")
    assert diff["found"].startswith("2 CUDA device(s) hold buffers or layers (CUDA0, CUDA1)")
    assert not four["cpu_only"]


def test_newer_device_lines_and_prefixes_are_evidence_too():
    used = parsed("lmstudio--using-device-cut-issue1360.log")
    assert used["devices_used"] == [{"device": "CUDA0", "name": "NVIDIA GeForce RTX 5060 Ti", "free_mib": 15055}]
    assert "using device CUDA0 (NVIDIA GeForce RTX 5060 Ti)" in used["placement"]["evidence"]
    colour = parsed("mainline--kv-cache-prefix-colour-cut-issue27680.log")
    assert colour["kv_mib"] == {"CUDA0": 182.75} and colour["output_mib"] == {"CUDA_Host": 0.49}
    unified = elog.parse("llama_kv_cache_unified:      CUDA1 KV buffer size =  1088.50 MiB\n"
                         "llama_context:      CUDA1 compute buffer size =   396.06 MiB\n")
    assert unified["gpu_mib"] == {"CUDA1": 1484.56} and unified["placement"]["verdict"] == "gpu"


def test_cuda_host_buffers_are_pinned_host_memory_not_gpu_memory():
    kv = parsed("mainline--2gpu-cuda-host-kv-pr8035.log")
    assert kv["kv_mib"]["CUDA_Host"] == 64.0   # the parser still reports every buffer by name
    assert kv["gpu_mib"] == {"CUDA0": 15213.75, "CUDA1": 9676.0}
    assert kv["host_mib"] == {"CPU": 22994.45, "CUDA_Host": 64.98} and kv["pinned_host_mib"] == 64.98
    weights = parsed("mainline--2gpu-cuda-host-weights-issue7217.log")
    assert "CUDA_Host" not in weights["gpu_mib"] and weights["pinned_host_mib"] == 232.42
    assert elog.is_gpu_buffer("CUDA0") and elog.is_gpu_buffer("CUDA_Split") and not elog.is_gpu_buffer("CUDA_Host")


def test_a_pinned_host_kv_buffer_does_not_skew_the_layer_split():
    plan = record(R1, [24, 24, 24, 24])
    blocks = [g["block"] for g in plan["plan"]["gpus"]]
    as_planned = "".join("llama_kv_cache_init:      CUDA%d KV buffer size = %.2f MiB\n"
                         % (i, 18.68 * (b[1] - b[0] + 1)) for i, b in enumerate(blocks))
    with_host = "llama_kv_cache_init:  CUDA_Host KV buffer size =   600.00 MiB\n" + as_planned
    assert "layer_split" not in failed(elog.evaluate(elog.parse(with_host), plan))


def test_explicit_cpu_evidence_wins_over_an_offload_line():
    facts = parsed("mainline--cuda-init-failure-with-offload-claim-issue1866.log")
    assert facts["offloaded"] == {"layers": 81, "of": 81} and facts["gpu_mib"] == {}
    result = elog.evaluate(facts, record(R1, [24]))
    assert result["cpu_only"] and "placement" in failed(result)
    assert "failed to initialize CUDA: unknown error" in facts["placement"]["cpu_evidence"][0]


def test_cpu_only_needs_the_start_of_the_log_or_explicit_evidence():
    start = "build: 4199 (9e2301f4) with cc (Ubuntu 12.3.0-1ubuntu1~23.04) 12.3.0 for x86_64-linux-gnu\n"
    host_only = "load_tensors:   CPU_Mapped model buffer size = 45358.94 MiB\n"
    assert elog.parse(start + host_only)["placement"]["verdict"] == "cpu_only"
    plan = record(R1, [24])
    assert elog.evaluate(elog.parse(start + host_only), plan)["cpu_only"]
    # the same buffer without the start: the log cannot tell, and the proof says so instead of "CPU-only"
    rotated = elog.evaluate(elog.parse(host_only), plan)
    assert not rotated["cpu_only"] and rotated["placement"]["verdict"] == "unknown"
    cuda = next(d for d in rotated["differences"] if d["check"] == "cuda_devices")
    assert "neither its start" in cuda["found"] and "journalctl" in cuda["fix"]
    assert next(c for c in rotated["checks"] if c["check"] == "offloaded_layers")["status"] == "skip"
    assert not elog.evaluate(elog.parse(""), plan)["cpu_only"]


def test_an_offload_claim_with_every_weight_and_kv_buffer_in_host_memory_is_cpu_only():
    # a build without CUDA given -ngl logs `offloaded 62/62` and then only host buffers
    facts = elog.parse("llm_load_tensors: offloaded 62/62 layers to GPU\n"
                       "llm_load_tensors:        CPU buffer size = 12288.00 MiB\n"
                       "llama_kv_cache_init:        CPU KV buffer size =   488.00 MiB\n")
    assert facts["placement"]["verdict"] == "cpu_only"
    assert facts["placement"]["cpu_evidence"] == ["every weight and KV buffer is in host memory (CPU)"]
    assert elog.evaluate(facts, record(R1, [24]))["cpu_only"]


def test_zero_layers_offloaded_is_cpu_only_whatever_else_the_log_lacks():
    facts = elog.parse("load_tensors: offloaded 0/62 layers to GPU\n")
    assert facts["placement"]["verdict"] == "cpu_only"
    assert elog.evaluate(facts, record(R1, [24]))["cpu_only"]


# ------------------------------------------------------------------------------------- CUDA errors named

ERRORS = {
    # file: (class, where (function or file:line), what the hint must name)
    "mainline--no-kernel-image-dgx-spark-issue3.log": ("no_kernel_image", "ggml_cuda_compute_forward",
                                                       "CMAKE_CUDA_ARCHITECTURES"),
    "mainline--no-kernel-image-old-format-issue4215.log": ("no_kernel_image", "ggml-cuda.cu:6701", "gpus.arch"),
    "mainline--cublas-invalid-value-issue25061.log": ("cublas", "ggml_cuda_op_mul_mat_cublas", "GGML_CUDA_FORCE_MMQ"),
    "mainline--cublas-not-supported-old-format-issue4395.log": ("cublas", "ggml-cuda.cu:7956", "toolkit"),
    "koboldcpp--cublas-status-not-supported-issue621.log": ("cublas", None, "(CUBLAS_STATUS_NOT_SUPPORTED)"),
    "mainline--illegal-memory-access-issue13909.log": ("illegal_memory_access", "ggml_backend_cuda_synchronize",
                                                       "xid"),
    "mainline--oom-old-format-issue3221.log": ("out_of_memory", "ggml-cuda.cu:5509", "CUDA1 ran out of memory"),
    "mainline--cuda-init-failure-unknown-error-issue10553.log": ("init_failure", "ggml_cuda_init",
                                                                 "hmk-nvidia-device-nodes.service"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_each_cuda_error_class_is_named_with_its_line_and_a_hint(name):
    kind, where, hint = ERRORS[name]
    error = parsed(name)["cuda_errors"][0]
    assert error["class"] == kind
    assert error["line"] and error["line"] in log(name)
    if where:
        assert where in (error["function"] or "") or where in (error["location"] or "")
    assert hint in error["hint"]


def test_the_failing_op_and_call_are_kept():
    kernel = parsed("mainline--no-kernel-image-dgx-spark-issue3.log")["cuda_errors"][0]
    assert (kernel["op"], kernel["device"]) == ("SCALE", 0)
    assert kernel["location"].endswith("ggml-cuda.cu:2761")
    cublas = parsed("mainline--cublas-invalid-value-issue25061.log")["cuda_errors"][0]
    assert cublas["call"].startswith("cublasSgemm_v2(") and cublas["message"].startswith("an unsupported value")
    illegal = parsed("mainline--illegal-memory-access-issue13909.log")["cuda_errors"][0]
    assert illegal["device"] == 7 and illegal["call"] == "cudaStreamSynchronize(cuda_ctx->stream())"


def test_the_kernel_image_hint_names_the_gpus_compute_capability():
    text = log("mainline--4gpu-init-3090-issue10981.log") + log("mainline--no-kernel-image-dgx-spark-issue3.log")
    hint = elog.parse(text)["cuda_errors"][0]["hint"]
    assert "compute capability 8.6" in hint


def test_an_unknown_cuda_error_is_named_with_its_function_and_file_line():
    facts = elog.parse("CUDA error: operation not supported\n"
                       "  current device: 3, in function ggml_backend_cuda_graph_compute at "
                       "/src/ggml/src/ggml-cuda/ggml-cuda.cu:2912\n"
                       "  cudaGraphLaunch(cuda_ctx->cuda_graph->instance, cuda_ctx->stream())\n")
    error = facts["cuda_errors"][0]
    assert error["class"] == "cuda_error" and error["device"] == 3
    assert "in ggml_backend_cuda_graph_compute at ggml-cuda.cu:2912" in error["hint"]


def test_repeated_errors_are_counted_once():
    line = "CUDA error: an illegal memory access was encountered\n"
    errors = elog.parse(line * 3)["cuda_errors"]
    assert len(errors) == 1 and errors[0]["count"] == 3


@pytest.mark.parametrize("name", sorted(n for n in ERRORS if ERRORS[n][0] not in ("init_failure", "out_of_memory")))
def test_the_gate_fails_naming_the_cuda_error_class_the_line_and_the_hint(name):
    kind, _where, hint = ERRORS[name]
    plan = record(R1, [24])
    result = svc.placement_proof(log("ik--1gpu-a6000-full-offload-pr333.log") + log(name), plan, pid=4242,
                                 smi_error="not read in this test")
    assert not result["ok"] and not result["cpu_only"]
    diff = next(d for d in result["differences"] if d["check"] == "cuda_error")
    assert diff["found"].startswith(kind + ": ") and hint in diff["fix"]
    assert any(line.startswith("cuda_error: found %s: " % kind) for line in result["summary"])
    assert result["cuda_errors"][0]["class"] == kind


def test_out_of_memory_in_the_old_form_fails_the_out_of_memory_check():
    result = elog.evaluate(parsed("mainline--oom-old-format-issue3221.log"), record(R1, [24]))
    diff = next(d for d in result["differences"] if d["check"] == "out_of_memory")
    assert diff["found"].startswith("CUDA error 2 at") and "cuda_error" not in failed(result)
