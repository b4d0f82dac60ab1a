"""The day-2 playbooks keep their safety contract: one node at a time, stop at the first failure, roll back first.

molecule/day2_fleet runs them for real; these checks catch an edit that would loosen the contract (a serial that is
no longer 1 by default, a rescue that forgets to restore the service) before a fleet does.
"""
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _play(name):
    plays = yaml.safe_load((REPO / "playbooks" / name).read_text())
    assert len(plays) == 1
    return plays[0]


def _block(play):
    blocks = [t for t in play["tasks"] if "block" in t]
    assert len(blocks) == 1
    return blocks[0]


def _includes(tasks, gateway=False, heal=False):
    """(role without the collection prefix, tasks_from, vars) of each include_role; the gateway's drain/restore
    steps and the self-heal's arming only when asked (the tests of the fleet contract check them)."""
    found = [(t["ansible.builtin.include_role"]["name"].removeprefix("hmk.moe_kit."),
              t["ansible.builtin.include_role"].get("tasks_from"), t.get("vars", {}))
             for t in tasks if "ansible.builtin.include_role" in t]
    found = found if gateway else [f for f in found if f[0] != "gateway"]
    return found if heal else [f for f in found if f[1] not in ("heal_arm", "fleet_guard")]


def _rolling(play, serial_var):
    assert play["hosts"] == "inference_nodes"
    assert play["serial"] == "{{ %s | default(1) }}" % serial_var
    assert play["max_fail_percentage"] == 0
    assert play["become"] is True


def test_upgrade_is_rolling_and_stops_at_the_first_failed_node():
    _rolling(_play("upgrade.yml"), "upgrade_serial")


def test_upgrade_remembers_the_build_before_building():
    play = _play("upgrade.yml")
    first = _includes(play["tasks"])[0]
    # Only the fleet guard comes before it.
    assert _includes(play["tasks"], heal=True)[0][:2] == ("inference_service", "fleet_guard")
    assert first[:2] == ("llama_build", "current.yml")
    names = [t["name"] for t in play["tasks"]]
    assert names.index("The build to come back to is remembered") < names.index(_block(play)["name"])


def test_upgrade_builds_then_gates_and_rolls_back_then_fails():
    block = _block(_play("upgrade.yml"))
    assert [(r, f) for r, f, _unused in _includes(block["block"])] == [("llama_build", None), ("inference_service", None)]
    rescue = block["rescue"]
    included = _includes(rescue)
    rollback = [v for r, f, v in included if r == "llama_build" and f is None]
    assert rollback == [{"llama_build_rollback_to": "{{ upgrade_previous_key }}"}]
    # The unit is re-applied after current moved back, so its arguments match the previous build.
    assert included[-1][:2] == ("inference_service", None)
    assert "ansible.builtin.fail" in rescue[-1]


def test_upgrade_drains_and_restores_the_node_on_the_gateways():
    block = _block(_play("upgrade.yml"))
    # Drained once the new build exists (the node served while it compiled), before the restart; back after the gate.
    assert [(r, f) for r, f, _unused in _includes(block["block"], gateway=True)] == [
        ("llama_build", None), ("gateway", "drain.yml"), ("inference_service", None), ("gateway", "restore.yml")]
    # The self-heal is armed before the build (a killed run leaves the node on the build it served) and again, with
    # the shorter bound, once the new build is current.
    assert [(r, f) for r, f, _unused in _includes(block["block"], gateway=True, heal=True)] == [
        ("inference_service", "heal_arm"), ("llama_build", None), ("inference_service", "heal_arm"),
        ("gateway", "drain.yml"), ("inference_service", None), ("gateway", "restore.yml")]
    # A node that rolled back serves the remembered build: it goes back into rotation before the node fails.
    rescue = _includes(block["rescue"], gateway=True)
    assert [(r, f) for r, f, _unused in rescue[-2:]] == [("inference_service", None), ("gateway", "restore.yml")]
    assert "ansible.builtin.fail" in block["rescue"][-1]


def test_model_swap_is_rolling_and_restores_the_old_model():
    play = _play("model_swap.yml")
    _rolling(play, "model_swap_serial")
    block = _block(play)
    assert _includes(block["block"]) == [
        ("model_sync", None, {"model_sync_models": ["{{ model_swap_model }}"]}),
        ("inference_service", None, {"inference_service_model_path": "{{ model_swap_new_path }}"}),
    ]
    assert _includes(block["rescue"]) == [
        ("inference_service", None, {"inference_service_model_path": "{{ model_swap_previous_path }}"})]
    assert "ansible.builtin.fail" in block["rescue"][-1]


def test_model_swap_drains_and_restores_the_node_on_the_gateways():
    block = _block(_play("model_swap.yml"))
    assert [(r, f) for r, f, _unused in _includes(block["block"], gateway=True)] == [
        ("model_sync", None), ("gateway", "drain.yml"), ("inference_service", None), ("gateway", "restore.yml")]
    assert [(r, f) for r, f, _unused in _includes(block["rescue"], gateway=True)] == [
        ("inference_service", None), ("gateway", "restore.yml")]


def test_model_swap_deletes_the_old_model_only_when_asked_and_after_success():
    play = _play("model_swap.yml")
    tasks = play["tasks"]
    removals = [t for t in tasks if t.get("ansible.builtin.file", {}).get("state") == "absent"]
    assert len(removals) == 1
    # After the block: a failed swap never reaches it.
    assert tasks.index(removals[0]) > tasks.index(_block(play))
    assert "model_swap_remove_old | default(false) | bool" in removals[0]["when"]


def _tune_play():
    plays = yaml.safe_load((REPO / "playbooks" / "tune.yml").read_text())
    assert len(plays) == 2
    return plays[0]


def test_every_day2_playbook_starts_each_batch_with_the_fleet_guard():
    for play in (_play("upgrade.yml"), _play("model_swap.yml"), _tune_play()):
        tasks = play["tasks"]
        if tasks[0]["ansible.builtin.include_role"].get("tasks_from") == "decide":
            # tune.yml checks its inputs first, so a bad value changes nothing (molecule/hardening replays them).
            assert tasks[0]["ansible.builtin.include_role"]["name"] == "hmk.moe_kit.tune"
            tasks = tasks[1:]
        first = tasks[0]["ansible.builtin.include_role"]
        assert (first["name"], first["tasks_from"]) == ("hmk.moe_kit.inference_service", "fleet_guard")


def test_tune_is_rolling_drains_first_and_restores_on_both_paths():
    play = _tune_play()
    _rolling(play, "tune_serial")
    # The node heals itself and leaves the gateways before the search stops its service.
    assert [(r, f) for r, f, _unused in _includes(play["tasks"], gateway=True, heal=True)][:4] == [
        ("tune", "decide"), ("inference_service", "fleet_guard"), ("inference_service", "heal_arm"),
        ("gateway", "drain.yml")]
    # A node whose build, model and objective were tuned already is neither armed nor drained (nor restored): a re-run
    # that searches nothing changes nothing (molecule/tune_monitoring's idempotence).
    by_step = {(t["ansible.builtin.include_role"]["name"], t["ansible.builtin.include_role"].get("tasks_from")): t
               for t in play["tasks"] if "ansible.builtin.include_role" in t}
    for step in (("hmk.moe_kit.inference_service", "heal_arm"), ("hmk.moe_kit.gateway", "drain.yml")):
        assert by_step[step].get("when") == "tune_searched | bool", step
    for path in ("block", "rescue"):
        restores = [t for t in _block(play)[path] if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "restore.yml"]
        assert restores and all("tune_searched" in t.get("when", "") for t in restores), path
    block = _block(play)
    # The perplexity at the old flags is recorded before the search when none is; the tuned flags must keep it
    # (after the gate, whose answer probe judged them first), or the rescue below puts the old flags back.
    assert [(r, f) for r, f, _unused in _includes(block["block"], gateway=True)] == [
        ("validate", "quality"), ("tune", None), ("tune", "apply"), ("inference_service", None),
        ("validate", "quality"), ("gateway", "restore.yml")]
    quality = [t for t in block["block"] if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "quality"]
    assert [t["vars"]["validate_quality_record"] for t in quality] == [True, False]
    assert all("tune_searched | bool" in str(t["when"]) for t in quality)
    assert "changed_flags" in str(quality[1]["when"])
    # A failed search or gate: the old flags serve again and the gateways take the node back before the run fails.
    assert [(r, f) for r, f, _unused in _includes(block["rescue"], gateway=True)] == [
        ("inference_service", None), ("gateway", "restore.yml")]
    assert "ansible.builtin.fail" in block["rescue"][-1]
