"""hmk_haproxy_server: the gateway's drain/maint/ready steps, on real HAProxy 2.6 runtime API answers.

tests/fixtures/haproxy/ holds what Debian 12's HAProxy answered in each state (README there); a scripted socket
replays them in the order a real drain goes through, so these tests pin the decisions (when to wait, when a
server counts as drained or up, what goes back on a timeout). molecule/gateway runs the module against the real
HAProxy during a rolling upgrade.
"""
from pathlib import Path

import pytest

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_haproxy as h
from ansible_collections.hmk.moe_kit.plugins.modules import hmk_haproxy_server as m

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "haproxy"


def fixture(state):
    return (FIX / (state + ".servers-state.txt")).read_text(), (FIX / (state + ".stat.csv")).read_text()


def test_parsers_read_each_captured_state():
    expect = {
        "up": (0, "running", "UP", 0),
        "drain-busy": (8, "running", "DRAIN", 1),
        "drain-idle": (8, "running", "DRAIN", 0),
        "maint": (1, "stopped", "MAINT", 0),
        "ready-unchecked": (0, "running", "UP 1/2", 0),
        "ready-checked": (0, "running", "UP", 0),
        "down": (0, "stopped", "DOWN", 0),
        "down-drain": (8, "stopped", "DOWN", 0),
    }
    for state, (admin, op, status, scur) in expect.items():
        servers, stat = fixture(state)
        got = h.parse_servers_state(servers, "hmk_nodes")["day2-b"]
        row = h.parse_stat(stat, "hmk_nodes")["day2-b"]
        assert (got["admin_state"], got["op_state"], row["status"], row["scur"]) == (admin, op, status, scur), state
        # The other server is untouched in every capture.
        assert h.parse_stat(stat, "hmk_nodes")["day2-a"]["status"] == "UP"
        assert sorted(h.parse_servers_state(servers, "hmk_nodes")) == ["day2-a", "day2-b"]


def test_absent_server_or_backend():
    servers, stat = fixture("up")
    assert "nope" not in h.parse_servers_state(servers, "hmk_nodes")
    assert h.parse_stat(stat, "other") == {}
    # FRONTEND/BACKEND rows are the proxies' totals, not servers.
    assert "BACKEND" not in h.parse_stat(stat, "hmk_nodes")
    with pytest.raises(m.RuntimeApiError):
        h.parse_servers_state((FIX / "no-such-backend.txt").read_text(), "nope")


def test_only_a_checked_server_counts_as_up():
    assert m.is_up(h.parse_stat(fixture("ready-checked")[1], "hmk_nodes")["day2-b"])
    # Leaving maintenance shows "UP 1/2" before any check ran: not yet proven to serve.
    assert not m.is_up(h.parse_stat(fixture("ready-unchecked")[1], "hmk_nodes")["day2-b"])
    assert not m.is_up(h.parse_stat(fixture("down")[1], "hmk_nodes")["day2-b"])


def test_wanted_change_per_state():
    assert m.wanted_change("maint", 0) and m.wanted_change("maint", 8) and not m.wanted_change("maint", 1)
    assert m.wanted_change("drain", 0) and not m.wanted_change("drain", 8) and m.wanted_change("drain", 1)
    assert not m.wanted_change("ready", 0) and m.wanted_change("ready", 1) and m.wanted_change("ready", 8)
    # Maintenance set in the configuration is not the runtime API's to lift.
    assert not m.wanted_change("ready", h.ADMF_CMAINT)


class ScriptedApi(m.RuntimeApi):
    """Answers `show servers state` / `show stat` from a list of captured states, advancing one per look;
    records every command sent."""

    def __init__(self, states, set_answers=None):
        super().__init__("/nonexistent")
        self.states = list(states)
        self.sent = []
        self.set_answers = set_answers or {}
        self.looks = 0

    def command(self, cmd):
        self.sent.append(cmd)
        if cmd.startswith("show servers state"):
            state = self.states[min(self.looks, len(self.states) - 1)]
            return fixture(state)[0]
        if cmd == "show stat":
            state = self.states[min(self.looks, len(self.states) - 1)]
            self.looks += 1
            return fixture(state)[1]
        return self.set_answers.get(cmd, "\n")


class Exit(Exception):
    pass


class FakeModule:
    def __init__(self, check_mode=False, **params):
        self.params = dict(socket="/run/haproxy/admin.sock", backend="hmk_nodes", server="day2-b", wait=True,
                           timeout=5, interval=0.0, min_others_up=0)
        self.params.update(params)
        self.check_mode = check_mode
        self.result = None

    def exit_json(self, **kw):
        self.result = dict(kw, failed=False)
        raise Exit()

    def fail_json(self, **kw):
        self.result = dict(kw, failed=True)
        raise Exit()


def run(module, api):
    with pytest.raises(Exit):
        m.run(module, api)
    return module.result


def sets(api):
    return [c for c in api.sent if c.startswith("set server")]


def test_maint_drains_waits_for_the_open_request_then_sets_maintenance():
    api = ScriptedApi(["up", "drain-busy", "drain-busy", "drain-idle", "maint"])
    res = run(FakeModule(state="maint"), api)
    assert not res["failed"] and res["changed"]
    assert sets(api) == ["set server hmk_nodes/day2-b state drain", "set server hmk_nodes/day2-b state maint"]
    # maint came only after a look showed no request in progress.
    looks_before_maint = api.sent[:api.sent.index("set server hmk_nodes/day2-b state maint")].count("show stat")
    assert looks_before_maint == 4


def test_maint_of_a_server_that_is_down_does_not_wait_for_a_drain_status():
    api = ScriptedApi(["down", "down-drain", "maint"])
    res = run(FakeModule(state="maint"), api)
    assert not res["failed"]
    assert sets(api)[-1] == "set server hmk_nodes/day2-b state maint"


def test_maint_timeout_restores_the_previous_state_and_fails():
    api = ScriptedApi(["up"] + ["drain-busy"] * 50)
    res = run(FakeModule(state="maint", timeout=0), api)
    assert res["failed"]
    assert "1 request(s) in progress" in res["msg"]
    # Drained, then back to ready as it was: it keeps serving, the upgrade of this node does not start.
    assert sets(api) == ["set server hmk_nodes/day2-b state drain", "set server hmk_nodes/day2-b state ready"]


def test_maint_when_already_in_maintenance_changes_nothing():
    api = ScriptedApi(["maint"])
    res = run(FakeModule(state="maint"), api)
    assert not res["failed"] and not res["changed"] and sets(api) == []


def test_ready_waits_for_a_passing_check():
    api = ScriptedApi(["maint", "ready-unchecked", "ready-unchecked", "ready-checked"])
    res = run(FakeModule(state="ready"), api)
    assert not res["failed"] and res["changed"]
    assert sets(api) == ["set server hmk_nodes/day2-b state ready"]
    assert res["after"]["status"] == "UP"


def test_ready_fails_when_the_check_never_passes():
    api = ScriptedApi(["maint", "down"])
    res = run(FakeModule(state="ready", timeout=0), api)
    assert res["failed"] and "not UP" in res["msg"] and "L4CON" in res["msg"]


def test_check_mode_sends_no_change():
    api = ScriptedApi(["up"])
    res = run(FakeModule(check_mode=True, state="maint"), api)
    assert res["changed"] and sets(api) == []


def test_unknown_server_fails_before_any_change():
    api = ScriptedApi(["up"])
    res = run(FakeModule(state="maint", server="nope"), api)
    assert res["failed"] and "no server nope" in res["msg"] and sets(api) == []


def test_the_last_server_in_rotation_is_not_taken_out():
    # day2-b is drained in this capture: taking day2-a out too would leave the gateway nothing to send to.
    api = ScriptedApi(["drain-idle"])
    res = run(FakeModule(state="maint", server="day2-a", min_others_up=1), api)
    assert res["failed"] and "0 other server(s) in rotation" in res["msg"] and "day2-b DRAIN" in res["msg"]
    assert sets(api) == []
    # With day2-b serving, day2-a may go.
    api = ScriptedApi(["up", "up", "maint"])
    assert not run(FakeModule(state="maint", server="day2-a", min_others_up=1), api)["failed"]


def test_without_state_it_only_reads():
    api = ScriptedApi(["down-drain"])
    res = run(FakeModule(state=None, server=None), api)
    assert not res["failed"] and not res["changed"] and sets(api) == []
    assert res["servers"]["day2-b"]["status"] == "DOWN" and res["servers"]["day2-b"]["admin_state"] == 8
    assert res["servers"]["day2-a"]["status"] == "UP"


def test_a_refused_command_is_an_error():
    api = ScriptedApi(["up"], {"set server hmk_nodes/day2-b state drain": (FIX / "no-such-server.txt").read_text()})
    with pytest.raises(m.RuntimeApiError, match="No such server"):
        m.run(FakeModule(state="maint"), api)
