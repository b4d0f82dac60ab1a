"""tune: the search planner (order, budget, the VRAM limit of the placement plan, the objective), a whole search
driven against a synthetic speed landscape, the llama-bench argv on the real ik_llama.cpp llama-bench --help, and
the tuned-file contract (record, YAML, match against build and model, refusal of anything else)."""
import importlib.util
import itertools
from pathlib import Path

import pytest
import yaml
from ansible.parsing.yaml.loader import AnsibleLoader

from test_inference_service import GENOA_5090, IK_PINNED, MILAN_4X4090, plan_for, qwen3_layout, r1_layout, svc
from test_validate import IK_BENCH_HELP, IK_BENCH_TG_STDOUT

REPO = Path(__file__).resolve().parents[2]
GIB = 1024 ** 3


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tune = _load("tune_filters", REPO / "plugins" / "filter" / "tune.py")
val = _load("validate_filters_for_tune", REPO / "plugins" / "filter" / "validate.py")
ERR = tune.AnsibleFilterError
BENCH = "/opt/hmk/engines/ik_llama.cpp/current/bin/llama-bench"
# what a build record of the pinned commit lists (-tb is in inference_service's stable list, not the table)
ACCEPTED = [item["flag"] for item in IK_PINNED["accepted"]]


def deployment_for(layout, profile, threads=32, numa_nodes=1, **extra):
    plan = plan_for(layout, profile)
    opts = {"engine": "ik_llama.cpp", "accepted": IK_PINNED, "model": "/srv/models/m/m-00001-of-00009.gguf",
            "arch": layout["architecture"], "threads": threads, "ot": plan["rules"], "numa_nodes": numa_nodes,
            "port": 8080, "amb": 512, "ubatch": 2048, "batch": 2048}
    opts.update(extra)
    argv = ["/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server"] + svc.llama_argv(opts)
    deployment = {"engine": "ik_llama.cpp", "argv": argv, "expert_bytes": layout["expert_bytes"],
                  "non_expert_bytes": layout["non_expert_bytes"], "model": opts["model"]}
    return deployment, {"plan": plan, "override_tensor": plan["rules"]}


def state_for(layout, profile, kind="tg", budget=3600, cores=32, vcpus=32, numa_nodes=1, mem_gib=512,
              model_gib=355, deployment=None, plan=None, **extra):
    if deployment is None:
        deployment, plan = deployment_for(layout, profile, threads=cores, numa_nodes=numa_nodes, **extra)
    return tune.space({
        "deployment": deployment, "plan": plan, "help": IK_BENCH_HELP, "binary": BENCH, "accepted": ACCEPTED,
        "cores": cores, "vcpus": vcpus, "mem_bytes": mem_gib * GIB, "numa_nodes": numa_nodes,
        "model_bytes": model_gib * GIB, "vram_bytes": svc.gpu_vram_bytes(profile), "reserve_bytes": 3 * GIB,
        "overhead_bytes": GIB, "objective": tune.objective(kind, 2048, 128), "budget_seconds": budget,
        "min_gain": 0.03, "repetitions": 3, "started_at": 1000.0})


TWIN_PROFILE = {"name": "lab-twin", "gpus": {"count": 0}}


def twin_state(kind="mix", budget=240):
    """The molecule twin: CPU only, tiny deepseek2, -t 1 -b 512 -ub 512, 2 cores."""
    layout = {"architecture": "deepseek2", "expert_bytes": {"1": 4 * 10 ** 6, "2": 4 * 10 ** 6, "3": 4 * 10 ** 6},
              "non_expert_bytes": 3 * 10 ** 6}
    deployment, plan = deployment_for(layout, TWIN_PROFILE, threads=1, ubatch=512, batch=512, numa_nodes=1)
    state = tune.space({
        "deployment": deployment, "plan": plan, "help": IK_BENCH_HELP, "binary": BENCH, "accepted": ACCEPTED,
        "cores": 2, "vcpus": 2, "mem_bytes": 4 * GIB, "numa_nodes": 1, "model_bytes": 15 * 10 ** 6, "vram_bytes": [],
        "reserve_bytes": 3 * GIB, "overhead_bytes": GIB, "objective": tune.objective(kind, 256, 16),
        "budget_seconds": budget, "min_gain": 0.03, "repetitions": 2, "started_at": 1000.0})
    return state


def bench_stdout(pp=None, tg=None, prompt=2048, gen=128):
    """llama-bench -o json rows in the shape IK_BENCH_TG_STDOUT shows (pp row: n_gen 0; tg@pp row: both set)."""
    rows = []
    if pp is not None:
        rows.append('  {\n    "n_prompt": %d,\n    "n_gen": 0,\n    "avg_ts": %f,\n    "test": "pp%d"\n  }' % (prompt, pp, prompt))
    if tg is not None:
        rows.append('  {\n    "n_prompt": %d,\n    "n_gen": %d,\n    "avg_ts": %f,\n    "test": "tg%d@pp%d"\n  }'
                    % (prompt, gen, tg, gen, prompt))
    return "[\nComputed blk.0.attn_k_b.weight as 128 x 512 x 4 of type q8_0 and stored in buffer CPU\n" + ",\n".join(rows) + "\n]\n"


def run_search(state, landscape, seconds=10.0, fail=lambda values: False):
    """Drive the search as the role does: baseline, then each knob in order; a fake clock advances by the trial time."""
    clock = [state["started_at"]]

    def step(candidate):
        nonlocal state
        trial = tune.next_trial(state, candidate, clock[0])
        result = {}
        if trial["run"]:
            took = min(seconds, trial["timeout"])
            clock[0] += took
            if took < seconds:
                result = {"rc": 124, "stdout": "", "stderr": "", "delta": "0:00:%09.6f" % took}
            elif fail(trial["values"]):
                result = {"rc": 1, "stdout": "", "stderr": "cudaMalloc failed: out of memory", "delta": "0:00:10.000000"}
            else:
                pp, tg = landscape(trial["values"])
                result = {"rc": 0, "stdout": bench_stdout(pp, tg), "stderr": "", "delta": "0:00:%09.6f" % took}
        state = tune.record(state, trial, result, clock[0])
        clock[0] += 0.5  # the play's own tasks between trials

    step({"dimension": "baseline", "values": dict(state["baseline"])})
    for dim in state["order"]:
        for candidate in tune.candidates(state, dim):
            step(candidate)
        state = tune.settle(state, dim)
    return state, clock[0]


# ------------------------------------------------------------------------------------ objective

def test_the_objective_is_checked_and_the_mix_weighs_each_phase_by_its_time():
    with pytest.raises(ERR, match="tg, pp, mix"):
        tune.objective("speed")
    with pytest.raises(ERR, match="at least 1"):
        tune.objective("mix", 0, 128)
    mix = tune.objective("mix", 2048, 128)
    # 2048 tokens at 200 tok/s take 10.24 s, 128 at 16 tok/s take 8 s: 2176 tokens in 18.24 s
    assert tune.score(mix, 200, 16) == pytest.approx(2176 / 18.24)
    assert tune.score(tune.objective("tg"), 200, 16) == 16
    assert tune.score(tune.objective("pp"), 200, None) == 200
    assert tune.score(mix, 200, None) is None
    assert tune.score(tune.objective("tg"), 200, 0) is None


def test_bench_sizes_measure_generation_at_the_prompt_depth_where_ik_s_bench_can():
    assert tune.bench_sizes(tune.objective("tg", 2048, 128), IK_BENCH_HELP) == ["-p", "0", "-n", "0", "-gp", "2048,128"]
    assert tune.bench_sizes(tune.objective("pp", 2048, 128), IK_BENCH_HELP) == ["-p", "2048", "-n", "0"]
    assert tune.bench_sizes(tune.objective("mix", 512, 32), IK_BENCH_HELP) == ["-p", "512", "-n", "0", "-gp", "512,32"]
    # a bench without -gp (mainline) measures generation on an empty context
    no_gp = "\n".join(line for line in IK_BENCH_HELP.splitlines() if "-gp" not in line)
    assert tune.bench_sizes(tune.objective("tg", 2048, 128), no_gp) == ["-p", "0", "-n", "128"]


def test_speeds_are_read_through_ik_s_stray_stdout_lines():
    assert tune.bench_speeds(IK_BENCH_TG_STDOUT) == {"pp_tps": None, "tg_tps": pytest.approx(2553.107215)}
    assert tune.bench_speeds(bench_stdout(pp=301.5, tg=14.2)) == {"pp_tps": 301.5, "tg_tps": 14.2}
    assert tune.bench_speeds("error: failed to load model\n") == {"pp_tps": None, "tg_tps": None}


# ------------------------------------------------------------------------------------ the search space and order

def test_generation_searches_gpu_layers_and_threads_first_and_never_the_batch_knobs():
    state = state_for(qwen3_layout(), GENOA_5090, kind="tg", numa_nodes=2)
    assert state["order"][:2] == ["gpu_layers", "threads"]
    assert "ubatch" not in state["order"] and "threads_batch" not in state["order"]
    assert state["skipped"]["ubatch"] == "generation does not use the micro-batch"
    assert "numa" in state["order"]
    assert state["skipped"]["rtr"].startswith("run-time repacking disables mmap")
    assert state["skipped"]["amb"].startswith("-amb applies to MLA")  # qwen3moe has no MLA


def test_prompt_processing_searches_the_micro_batch_first():
    state = state_for(r1_layout(), GENOA_5090, kind="pp")
    assert state["order"][0] == "ubatch"
    assert state["order"].index("threads_batch") < state["order"].index("threads")
    assert state["dims"]["ubatch"][0] == 2048 and set(state["dims"]["ubatch"]) == {256, 512, 1024, 2048}
    assert state["skipped"]["numa"] == "one NUMA node"
    assert "amb" in state["order"]


def test_the_twin_offers_repacking_and_no_gpu_or_numa_knob():
    state = twin_state()
    assert state["order"] == ["threads", "ubatch", "threads_batch", "rtr", "amb"]
    assert state["skipped"]["gpu_layers"] == "no GPU in the hardware profile"
    assert state["dims"]["threads"] == [1, 2]
    assert state["dims"]["rtr"] == [False, True]


def test_repacking_is_not_offered_when_the_model_would_not_fit_in_ram_without_mmap():
    layout = r1_layout()
    deployment, plan = deployment_for(layout, TWIN_PROFILE)
    state = tune.space({
        "deployment": deployment, "plan": plan, "help": IK_BENCH_HELP, "binary": BENCH, "accepted": ACCEPTED,
        "cores": 32, "vcpus": 32, "mem_bytes": 384 * GIB, "numa_nodes": 1, "model_bytes": 355 * GIB, "vram_bytes": [],
        "reserve_bytes": 3 * GIB, "overhead_bytes": GIB, "objective": tune.objective("tg"), "budget_seconds": 60,
        "started_at": 0})
    assert "rtr" not in state["dims"] and "RAM" in state["skipped"]["rtr"]


def test_explicit_ot_rules_are_never_searched_over():
    deployment, plan = deployment_for(qwen3_layout(), GENOA_5090, threads=32)
    plan = dict(plan, override_tensor=["blk\\.0\\.ffn_.*_exps=CUDA0", "exps=CPU"])
    state = state_for(qwen3_layout(), GENOA_5090, deployment=deployment, plan=plan)
    assert "gpu_layers" not in state["dims"]
    assert "explicit -ot" in state["skipped"]["gpu_layers"]


def test_ktransformers_has_no_bench_to_tune_with():
    with pytest.raises(ERR, match="llama-bench"):
        tune.space({"deployment": {"engine": "ktransformers", "argv": []}, "objective": tune.objective("tg"),
                    "budget_seconds": 60, "started_at": 0, "binary": "x"})


# ------------------------------------------------------------------------------------ the VRAM budget

@pytest.mark.parametrize("layout, profile", [(qwen3_layout(), GENOA_5090), (r1_layout(), MILAN_4X4090)])
def test_every_trial_that_runs_stays_inside_the_placement_plan_s_vram(layout, profile):
    state = state_for(layout, profile, kind="mix", cores=64 if profile is MILAN_4X4090 else 32)
    state, _unused = run_search(state, lambda v: (100 + v["ubatch"] / 100.0, 10 + v["gpu_layers"]))
    ran = [t for t in state["trials"] if t["verdict"] != "skipped"]
    assert len(ran) > 5
    for trial in ran:
        values = trial["values"]
        plan = tune.vram_plan(state["context"], values["ubatch"], values["gpu_layers"])
        assert plan["gpu_layer_count"] == values["gpu_layers"]
        for gpu in plan["gpus"]:
            assert gpu["expected_bytes"] <= gpu["vram_bytes"], (trial, gpu)
        # the bench runs exactly the plan's -ot rules, in first-match order, ending with the catch-all
        rules = [trial["argv"][i + 1] for i, a in enumerate(trial["argv"]) if a == "-ot"]
        assert rules == plan["rules"] and rules[-1] == "exps=CPU"


def test_a_larger_micro_batch_grows_the_compute_reserve_and_gives_back_gpu_layers():
    state = state_for(qwen3_layout(), GENOA_5090, kind="pp")
    most_2048, most_4096 = tune.max_gpu_layers(state["context"], 2048), tune.max_gpu_layers(state["context"], 4096)
    assert most_4096 < most_2048 == state["baseline"]["gpu_layers"] == 14
    assert tune.compute_reserve(state["context"], 4096) == 6 * GIB
    assert tune.compute_reserve(state["context"], 512) == 3 * GIB  # never below the service's reserve
    state = dict(state, dims=dict(state["dims"], ubatch=[2048, 4096]),
                 incumbent={"values": dict(state["baseline"]), "score": 1.0, "trial": 0})
    (bigger,) = tune.candidates(state, "ubatch")
    assert bigger["values"]["ubatch"] == 4096 and bigger["values"]["gpu_layers"] == most_4096
    assert "lowered" in bigger["note"]


def test_a_candidate_over_the_vram_budget_is_recorded_and_never_run():
    state = state_for(qwen3_layout(), GENOA_5090, kind="tg")
    too_many = dict(state["baseline"], gpu_layers=state["baseline"]["gpu_layers"] + 1)
    trial = tune.next_trial(state, {"dimension": "gpu_layers", "values": too_many}, 1001.0)
    assert trial["run"] is False and "over the VRAM budget" in trial["reason"]
    assert tune.record(state, trial, {}, 1001.0)["trials"][-1]["verdict"] == "skipped"


# ------------------------------------------------------------------------------------ budget

def test_the_search_never_starts_a_trial_it_cannot_finish_and_stops_at_the_budget():
    state = state_for(qwen3_layout(), GENOA_5090, kind="mix", budget=45)
    state, clock = run_search(state, lambda v: (300.0, 12.0), seconds=10.0)
    ran = [t for t in state["trials"] if t["verdict"] == "ok"]
    assert len(ran) == 4  # 4 x (10 s + 0.5 s of the play's tasks); a fifth would need 13 s of the 3 s left
    assert state["finished_at"] - state["started_at"] <= 45
    assert state["stopped"].startswith("budget")
    # the rest of that knob's candidates are recorded as skipped; later knobs offer none
    assert all(t["verdict"] == "skipped" and t["reason"].startswith("budget") for t in state["trials"][4:])
    assert {t["dimension"] for t in state["trials"][4:]} == {state["trials"][4]["dimension"]}
    assert clock - state["started_at"] <= 45


def test_a_trial_killed_at_the_budget_ends_the_search():
    state = state_for(qwen3_layout(), GENOA_5090, kind="tg", budget=25)
    state, clock = run_search(state, lambda v: (300.0, 12.0), seconds=30.0)
    assert state["trials"][0]["verdict"] == "failed" and "budget" in state["trials"][0]["reason"]
    assert state["incumbent"] is None and state["stopped"].startswith("the service's own flags did not bench")
    assert clock - state["started_at"] <= 26


def test_the_timeout_of_a_trial_is_the_time_left():
    state = state_for(qwen3_layout(), GENOA_5090, kind="tg", budget=600)
    trial = tune.next_trial(state, {"dimension": "baseline", "values": state["baseline"]}, 1100.4)
    assert trial["argv"][:3] == ["timeout", "--kill-after=10", "499"]


# ------------------------------------------------------------------------------------ a whole search

def test_coordinate_descent_finds_the_best_of_a_landscape_and_keeps_the_service_s_flags_within_noise():
    state = state_for(qwen3_layout(), GENOA_5090, kind="mix", cores=32, vcpus=32)

    def landscape(v):
        # generation peaks at 28 threads and grows with every MoE layer in VRAM; prompt speed grows with -ub
        tg = 20.0 - abs(v["threads"] - 28) * 2.0 + v["gpu_layers"] * 0.2
        pp = 100.0 * v["ubatch"] / 2048 + (5.0 if v["threads_batch"] == 32 else 0.0)
        return pp, tg

    state, _unused = run_search(state, landscape)
    best = state["trials"][state["incumbent"]["trial"]]["values"]
    assert best["threads"] == 28 and best["gpu_layers"] == 14 and best["ubatch"] == 2048
    assert best["threads_batch"] == 32  # searched after -t moved, so it no longer follows -t
    result = tune.summary(state, {"host": "n1", "now": 2000, "date": "2026-12-01T00:00:00Z", "engine": "ik_llama.cpp",
                                  "build": "55d3c05bf7b3-0a1b2c3d", "model": "/m.gguf", "model_bytes": 5})
    assert result["vars"]["inference_service_threads"] == 28
    assert result["vars"]["inference_service_threads_batch"] == 32
    assert result["vars"]["inference_service_gpu_expert_layers"] == 14
    assert result["changed_flags"] == ["inference_service_threads", "inference_service_threads_batch"]
    assert result["gain"] > 0
    markdown = tune.markdown(result)
    assert "| 0 | baseline |" in markdown and "not searched: rtr" in markdown


def test_a_gain_inside_the_noise_margin_keeps_the_incumbent():
    state = twin_state(kind="tg")
    state, _unused = run_search(state, lambda v: (None, 100.0 * (1.02 if v["threads"] == 2 else 1.0)))
    assert state["incumbent"]["trial"] == 0


def test_a_failing_candidate_is_recorded_and_passed_over():
    state = twin_state(kind="mix")
    state, _unused = run_search(state, lambda v: (500.0, 50.0 * (2 if v["rtr"] else 1)), fail=lambda v: v["ubatch"] == 256)
    failed = [t for t in state["trials"] if t["verdict"] == "failed"]
    assert len(failed) == 1 and "out of memory" in failed[0]["reason"]
    assert state["trials"][state["incumbent"]["trial"]]["values"]["rtr"] is True


def test_the_bench_argv_is_the_service_s_own_flags_with_the_trial_s_values():
    state = twin_state(kind="mix")
    values = dict(state["baseline"], threads=2, threads_batch=1, ubatch=256, rtr=True, amb=1024)
    argv = tune.trial_argv(state, values)
    assert argv[:3] == [BENCH, "-m", "/srv/models/m/m-00001-of-00009.gguf"]
    assert argv[argv.index("-tgb") + 1] == "2,1" and "-t" not in argv
    assert argv[argv.index("-rtr") + 1] == "1"
    assert argv[argv.index("-ub") + 1] == "256" and argv[argv.index("-b") + 1] == "512"
    assert argv[argv.index("-amb") + 1] == "1024"
    assert argv[-10:] == ["-p", "256", "-n", "0", "-gp", "256,16", "-r", "2", "-o", "json"]
    # every flag the bench gets is one the real ik llama-bench --help lists
    listed = val.bench_flags(IK_BENCH_HELP)
    assert all(a in listed for a in argv[1:] if a.startswith("-") and not a[1:].replace(",", "").isdigit())


def test_the_service_renders_the_tuned_batch_threads_numa_mode_and_repacking():
    opts = {"engine": "ik_llama.cpp", "accepted": dict(IK_PINNED, accepted=IK_PINNED["accepted"] + [{"flag": "-rtr"}]),
            "model": "/m.gguf", "arch": "deepseek2", "threads": 30, "threads_batch": 32, "numa_nodes": 2,
            "numa_mode": "isolate", "rtr": True, "ot": ["exps=CPU"]}
    argv = svc.llama_argv(opts)
    assert argv[argv.index("-tb") + 1] == "32" and argv[argv.index("--numa") + 1] == "isolate" and "-rtr" in argv
    assert "-tb" not in svc.llama_argv(dict(opts, threads_batch=30)) and "-tb" not in svc.llama_argv(dict(opts, threads_batch=0))
    with pytest.raises(ERR, match="NUMA mode"):
        svc.llama_argv(dict(opts, numa_mode="interleave"))
    mapped = val.bench_argv(["llama-server"] + argv, IK_BENCH_HELP, BENCH)
    assert mapped["base"][mapped["base"].index("-tgb") + 1] == "30,32" and "-tb" in mapped["mapped"]
    assert mapped["base"][mapped["base"].index("-rtr") + 1] == "1"


# ------------------------------------------------------------------------------------ the tuned-file contract

def _result(**changes):
    state = twin_state(kind="mix")
    state, _unused = run_search(state, lambda v: (500.0 * v["threads"], 50.0))
    facts = {"host": "tune-monitoring", "now": 1100, "date": "2026-12-02T10:00:00Z", "engine": "ik_llama.cpp",
             "build": "462213ef9ec3-5a2b9c1d", "commit": "462213ef9ec32d610a70c0aba165aaf67d9bfb9e",
             "model": "/srv/models/tiny-deepseek2/tiny-deepseek2.gguf", "model_bytes": 15414624,
             "architecture": "deepseek2"}
    facts.update(changes)
    return tune.summary(state, facts)


DEPLOYED = {"engine": "ik_llama.cpp", "build": "462213ef9ec3-5a2b9c1d",
            "model": "/srv/models/tiny-deepseek2/tiny-deepseek2.gguf", "model_bytes": 15414624}


def test_the_tuned_file_round_trips_through_yaml_and_applies_to_the_same_build_and_model():
    record = tune.tuned_record(_result())
    text = tune.tuned_file(record, "Written by playbooks/tune.yml")
    assert text.startswith("---\n# Written by playbooks/tune.yml\ntune_result:\n")
    long_header = tune.tuned_file(record, "word " * 100)
    assert max(len(line) for line in long_header.splitlines()[:8]) <= 102  # an inventory's yamllint passes
    # Read as the inventory reads it (Ansible's loader knows !unsafe, which every string is written with)
    loaded = AnsibleLoader(text).get_single_data()["tune_result"]
    assert loaded == record
    assert tune.tuned_file(loaded, "Written by playbooks/tune.yml") == text  # stable bytes: a re-run changes nothing
    match = tune.tuned_match(loaded, DEPLOYED)
    assert match["applies"] is True and match["warn"] is False
    assert match["vars"]["inference_service_threads"] == 2
    assert set(match["vars"]) <= set(tune.TUNED_VARS)
    assert "trials" not in loaded and loaded["date"] == "2026-12-02T10:00:00Z"


@pytest.mark.parametrize("field, value, named", [("build", "0c1e57098abc-11111111", "build"),
                                                 ("model", "/srv/models/other.gguf", "model"),
                                                 ("model_bytes", 1, "model size"),
                                                 ("engine", "llama.cpp", "engine")])
def test_a_record_for_another_build_or_model_is_ignored_with_a_warning(field, value, named):
    record = tune.tuned_record(_result())
    match = tune.tuned_match(record, dict(DEPLOYED, **{field: value}))
    assert match["applies"] is False and match["warn"] is True
    assert "ignored" in match["reason"] and named in match["reason"] and "playbooks/tune.yml" in match["reason"]
    assert "vars" not in match


def test_no_record_is_quiet_and_another_objective_asks_for_a_new_search_without_a_warning():
    assert tune.tuned_match({}, DEPLOYED) == {"applies": False, "warn": False, "reason": "no tuned flags for this host"}
    record = tune.tuned_record(_result())
    assert tune.tuned_match(record, DEPLOYED, record["objective"])["applies"] is True
    other = tune.tuned_match(record, DEPLOYED, tune.objective("tg", 256, 16))
    assert other["applies"] is False and other["warn"] is False and "objective" in other["reason"]


@pytest.mark.parametrize("vars_, message", [
    ({"inference_service_api_key": "x"}, "never sets"),
    ({"inference_service_threads": "many"}, "must be a number"),
    ({"inference_service_threads": True}, "must be a number"),
    ({"inference_service_run_time_repack": "yes"}, "true or false"),
    ({"inference_service_numa_mode": "interleave"}, "must be one of"),
    ({"inference_service_threads": -2}, "out of range"),
    ({"inference_service_ubatch": 4096, "inference_service_batch": 2048}, "exceeds the batch"),
    ({}, "no vars"),
])
def test_the_contract_refuses_what_tuning_never_writes(vars_, message):
    record = dict(tune.tuned_record(_result()), vars=vars_)
    with pytest.raises(ERR, match=message):
        tune.tuned_vars(record)
    with pytest.raises(ERR, match="schema"):
        tune.tuned_vars({"vars": {"inference_service_threads": 2}})


def test_a_search_without_a_working_baseline_records_nothing():
    state = twin_state(kind="tg")
    state, _unused = run_search(state, lambda v: (None, None))
    result = tune.summary(state, {"host": "h", "now": 1100})
    assert result["ok"] is False and "vars" not in result
    with pytest.raises(ERR, match="nothing to record"):
        tune.tuned_record(result)


def test_every_tunable_the_contract_allows_is_a_variable_of_the_inference_service_role():
    specs = yaml.safe_load((REPO / "roles" / "inference_service" / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    for name in tune.TUNED_VARS:
        assert name in options, name
    kinds = {int: "int", float: "float", str: "str", bool: "bool"}
    assert all(options[name]["type"] == kinds[kind] for name, kind in tune.TUNED_VARS.items())


def test_the_state_is_plain_data_ansible_can_carry_between_tasks():
    import json
    state = twin_state()
    state, _unused = run_search(state, lambda v: (500.0, 50.0))
    assert json.loads(json.dumps(state)) == state
    assert list(itertools.islice(state["trials"], 1))[0]["dimension"] == "baseline"


# ------------------------------------------------------------------ the opt-in engine flags as knobs (issue 25 item 2)

IK_NEWEST = svc.engine_flag_set(yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml").read_text())
                                ["llama_build_engine_flags"], "ik_llama.cpp", "2026-08-15")
# llama-bench --help at 8337e4cd adds this line (examples/llama-bench/llama-bench.cpp); it has no --prefetch-experts
IK_NEWEST_BENCH_HELP = IK_BENCH_HELP + "  --defer-experts                     (Linux only, default: 0)\n"


def test_split_mode_graph_is_searched_on_several_gpus_only():
    state = state_for(r1_layout(), MILAN_4X4090)
    assert state["dims"]["split_mode"] == ["layer", "graph"] and state["order"][-1] == "split_mode"
    one = state_for(r1_layout(), GENOA_5090)
    assert "split_mode" not in one["dims"] and "one GPU" in one["skipped"]["split_mode"]
    graph = tune.candidates(dict(state, incumbent={"values": state["baseline"], "score": 1.0, "trial": 0}), "split_mode")
    assert [c["values"]["split_mode"] for c in graph] == ["graph"]
    argv = tune.trial_argv(state, graph[0]["values"])
    assert argv[argv.index("-sm") + 1] == "graph"
    assert tune.service_vars(state, graph[0]["values"])["inference_service_split_mode_graph"] is True
    assert tune.tuned_vars({"schema": tune.TUNED_SCHEMA, "vars": {"inference_service_split_mode_graph": True}})


def test_defer_experts_is_searched_where_the_bench_and_the_server_have_it():
    pin = state_for(r1_layout(), GENOA_5090)
    assert "defer_experts" not in pin["dims"] and "8337e4cd" in pin["skipped"]["defer_experts"]
    deployment, plan = deployment_for(r1_layout(), GENOA_5090, threads=32, accepted=IK_NEWEST)
    newest = tune.space({
        "deployment": deployment, "plan": plan, "help": IK_NEWEST_BENCH_HELP, "binary": BENCH,
        "accepted": [i["flag"] for i in IK_NEWEST["accepted"]], "cores": 32, "vcpus": 32, "mem_bytes": 512 * GIB,
        "numa_nodes": 1, "model_bytes": 355 * GIB, "vram_bytes": svc.gpu_vram_bytes(GENOA_5090),
        "reserve_bytes": 3 * GIB, "overhead_bytes": GIB, "objective": tune.objective("tg", 2048, 128),
        "budget_seconds": 3600, "min_gain": 0.03, "repetitions": 3, "started_at": 1000.0})
    assert newest["dims"]["defer_experts"] == [False, True]
    assert "--defer-experts" not in tune.trial_argv(newest, newest["baseline"])  # off in the baseline
    values = dict(newest["baseline"], defer_experts=True)
    assert "--defer-experts" in tune.trial_argv(newest, values)
    assert tune.service_vars(newest, values)["inference_service_defer_experts"] is True
    for never in ("prefetch_experts", "mtp"):
        assert never in newest["skipped"] and never not in newest["dims"]
