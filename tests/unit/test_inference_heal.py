"""roles/inference_service/files/hmk-inference-heal: what an interrupted day-2 run leaves, put back by the node itself.

The script is run as the node's transient timer runs it, on real files in a temporary tree. `systemctl` is a
stand-in on PATH that records its arguments and answers is-active from a file (labelled as such: no systemd here);
molecule/gateway runs the script under the real systemd, killed runs included.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "inference_service" / "files" / "hmk-inference-heal"

SYSTEMCTL_STANDIN = """#!/bin/sh
# Stand-in for systemctl (unit tests only): records each call, answers is-active from $HEAL_ACTIVE.
echo "$*" >> "$HEAL_CALLS"
case "$1" in
  is-active) [ "$(cat "$HEAL_ACTIVE")" = active ] ;;
  restart) [ ! -e "$HEAL_RESTART_FAILS" ] || { echo "Job failed" >&2; exit 1; } ;;
esac
"""


@pytest.fixture
def node(tmp_path):
    etc, lg, builds = tmp_path / "etc", tmp_path / "etc" / "svc.last-good", tmp_path / "engine" / "builds"
    for d in (etc, lg, builds / "old", builds / "new", tmp_path / "bin"):
        d.mkdir(parents=True)
    for name, text in (("unit", "[Service]\nExecStart=old\n"), ("args", "-m\nold.gguf\n"), ("model.json", "{}\n"),
                       ("api-key", "old-key\n")):
        (lg / name).write_text(text)
    (etc / "svc.service").write_text("[Service]\nExecStart=old\n")
    (etc / "svc.args").write_text("-m\nold.gguf\n")
    (etc / "svc.model.json").write_text("{}\n")
    (etc / "svc.api-key").write_text("old-key\n")
    os.symlink("builds/old", tmp_path / "engine" / "current")
    (lg / "heal.json").write_text(json.dumps({
        "unit": "svc.service",
        "files": [{"from": "unit", "to": str(etc / "svc.service"), "group": "root", "mode": "0644"},
                  {"from": "args", "to": str(etc / "svc.args"), "group": "root", "mode": "0640"},
                  {"from": "model.json", "to": str(etc / "svc.model.json"), "group": "root", "mode": "0644"}],
        "key": {"from": "api-key", "to": str(etc / "svc.api-key")},
        "current": {"link": str(tmp_path / "engine" / "current"), "target": "builds/old"}}))
    systemctl = tmp_path / "bin" / "systemctl"
    systemctl.write_text(SYSTEMCTL_STANDIN)
    systemctl.chmod(0o755)
    (tmp_path / "active").write_text("active")
    return tmp_path


def run(node):
    env = dict(os.environ, PATH="%s:%s" % (node / "bin", os.environ["PATH"]), HEAL_CALLS=str(node / "calls"),
               HEAL_ACTIVE=str(node / "active"), HEAL_RESTART_FAILS=str(node / "restart-fails"))
    return subprocess.run([sys.executable, str(SCRIPT), str(node / "etc" / "svc.last-good")], env=env,
                          capture_output=True, text=True, check=False)


def calls(node):
    return (node / "calls").read_text().splitlines() if (node / "calls").exists() else []


def test_not_armed_means_the_run_confirmed_and_nothing_is_touched(node):
    (node / "etc" / "svc.args").write_text("-m\nnew.gguf\n")
    r = run(node)
    assert r.returncode == 0 and "not armed" in r.stdout
    assert (node / "etc" / "svc.args").read_text() == "-m\nnew.gguf\n"
    assert calls(node) == []


def test_an_interrupted_upgrade_goes_back_to_the_build_and_files_that_served(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("playbooks/upgrade.yml, restarting\n")
    (node / "etc" / "svc.args").write_text("-m\nnew.gguf\n--flag\n")
    (node / "engine" / "current").unlink()
    os.symlink("builds/new", node / "engine" / "current")
    r = run(node)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (node / "etc" / "svc.args").read_text() == "-m\nold.gguf\n"
    assert oct((node / "etc" / "svc.args").stat().st_mode & 0o777) == "0o640"
    assert os.readlink(node / "engine" / "current") == "builds/old"
    assert calls(node)[-3:] == ["daemon-reload", "reset-failed svc.service", "restart svc.service"]
    assert not (node / "etc" / "svc.last-good" / "armed").exists()
    assert "playbooks/upgrade.yml, restarting" in r.stdout and "svc.args" in r.stdout
    # Unchanged files were left alone (no stray temporary files either).
    left = sorted(p.name for p in (node / "etc").iterdir())
    assert left == ["svc.api-key", "svc.args", "svc.last-good", "svc.model.json", "svc.service"]


def test_an_interrupted_tune_starts_the_stopped_service_without_touching_files(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("playbooks/tune.yml, searching\n")
    (node / "active").write_text("inactive")
    before = (node / "etc" / "svc.service").stat().st_mtime_ns
    r = run(node)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restart svc.service" in calls(node)
    assert (node / "etc" / "svc.service").stat().st_mtime_ns == before
    assert "nothing had changed; it was started" in r.stdout


def test_armed_with_nothing_changed_and_the_engine_serving_restarts_nothing(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("x\n")
    r = run(node)
    assert r.returncode == 0
    assert [c for c in calls(node) if c.startswith("restart")] == []
    assert not (node / "etc" / "svc.last-good" / "armed").exists()


def test_the_key_follows_the_last_good_configuration(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("x\n")
    (node / "etc" / "svc.api-key").write_text("new-key\n")
    assert run(node).returncode == 0
    assert (node / "etc" / "svc.api-key").read_text() == "old-key\n"
    assert oct((node / "etc" / "svc.api-key").stat().st_mode & 0o777) == "0o600"
    # A last good configuration without a key: the new key goes.
    (node / "etc" / "svc.last-good" / "api-key").unlink()
    (node / "etc" / "svc.last-good" / "armed").write_text("x\n")
    assert run(node).returncode == 0
    assert not (node / "etc" / "svc.api-key").exists()


def test_a_restart_that_fails_keeps_the_marker_and_fails(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("x\n")
    (node / "etc" / "svc.args").write_text("changed\n")
    (node / "restart-fails").write_text("")
    r = run(node)
    assert r.returncode == 1 and "did not restart" in r.stdout
    assert (node / "etc" / "svc.last-good" / "armed").exists()


def test_a_build_that_is_gone_is_said_and_the_link_left(node):
    (node / "etc" / "svc.last-good" / "armed").write_text("x\n")
    (node / "engine" / "current").unlink()
    os.symlink("builds/new", node / "engine" / "current")
    os.rmdir(node / "engine" / "builds" / "old")
    r = run(node)
    assert "is gone" in r.stdout
    assert os.readlink(node / "engine" / "current") == "builds/new"
