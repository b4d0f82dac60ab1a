"""scripts/run-molecule's scheduler, run for real against stand-ins of what it drives: a `molecule` that only logs
when each scenario starts and ends (and fails where told), and a `scripts/twin` / fixture scripts that do nothing.
What it must do: keep both slots busy while engine_build compiles, start the scenarios that reuse engine_build's
compiler cache only after it has finished, run scenarios the order does not name, honour HMK_SCENARIOS, and end
non-zero with each failed scenario named."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STUB_MOLECULE = """#!/usr/bin/env bash
# molecule test -s NAME: logs start/end; DUR_<NAME> seconds; FAIL_<NAME>=1 fails it.
name=$3
echo "start $name" >> "$EVENTS"
dur=DUR_$name; sleep "${!dur:-0.2}"
echo "end $name" >> "$EVENTS"
fail=FAIL_$name; [ "${!fail:-0}" = 1 ] && { echo "fatal: [$name]: FAILED! => {\\"msg\\": \\"stand-in failure\\"}"; exit 2; }
exit 0
"""
STUB_TWIN = """#!/usr/bin/env bash
case "$1 $2" in
  "dockerd status") echo running ;;
  *) exit 0 ;;
esac
"""


def _exe(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _bed(tmp_path, scenarios):
    shutil.copy(REPO / "scripts" / "run-molecule", tmp_path / "run-molecule.tmp")
    _exe(tmp_path / "scripts" / "run-molecule", (tmp_path / "run-molecule.tmp").read_text())
    _exe(tmp_path / "scripts" / "twin", STUB_TWIN)
    _exe(tmp_path / "scripts" / "lab-fixtures", "#!/bin/sh\nexit 0\n")
    _exe(tmp_path / "tests" / "fixtures" / "engines" / "make-kt-repo.sh", "#!/bin/sh\nexit 0\n")
    _exe(tmp_path / "bin" / "molecule", STUB_MOLECULE)
    for name in scenarios:
        (tmp_path / "molecule" / name).mkdir(parents=True)
        (tmp_path / "molecule" / name / "molecule.yml").write_text("---\n")


def _run(tmp_path, **env):
    events = tmp_path / "events"
    events.write_text("")
    full = dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"]), EVENTS=str(events),
                HMK_TEST_LOGS=str(tmp_path / "logs"), HMK_MOLECULE_JOBS="2", **env)
    if "HMK_SCENARIOS" not in env:
        full.pop("HMK_SCENARIOS", None)
    res = subprocess.run(["bash", str(tmp_path / "scripts" / "run-molecule")], env=full, capture_output=True,
                         text=True, timeout=120, check=False)
    return res, events.read_text().split("\n")[:-1]


def test_both_slots_work_while_engine_build_compiles_and_its_cache_users_wait_for_it(tmp_path):
    _bed(tmp_path, ["engine_build", "ktransformers", "nvidia_driver_distro", "day2_fleet", "gateway", "twin_vm",
                    "zz_unlisted"])
    res, events = _run(tmp_path, DUR_engine_build="4")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(e for e in events if e.startswith("start")) == sorted(
        "start " + s for s in ["engine_build", "ktransformers", "nvidia_driver_distro", "day2_fleet", "gateway",
                               "twin_vm", "zz_unlisted"])
    eb_end = events.index("end engine_build")
    # The scenarios that build the same tree start only once engine_build has filled the cache ...
    for waiting in ("day2_fleet", "gateway"):
        assert events.index("start " + waiting) > eb_end, events
    # ... and the other slot does not idle meanwhile: it runs the ones that need no engine, in the order's sequence,
    # passing over the waiting ones; a scenario the order does not name comes after the named ones.
    independent = [e for e in events[:eb_end] if e.startswith("start ") and e != "start engine_build"]
    assert independent == ["start ktransformers", "start nvidia_driver_distro", "start twin_vm", "start zz_unlisted"], \
        events
    assert "molecule: 7 passed, 0 failed" in res.stdout


def test_a_failed_scenario_fails_the_run_and_is_named_with_its_error(tmp_path):
    _bed(tmp_path, ["engine_build", "twin_vm", "gateway"])
    res, events = _run(tmp_path, FAIL_twin_vm="1")
    assert res.returncode == 1
    assert "start gateway" in events  # the others still run
    assert "molecule: 2 passed, 1 failed" in res.stdout
    assert "---- why twin_vm failed" in res.stdout and "stand-in failure" in res.stdout
    assert (tmp_path / "logs" / "twin_vm.result").read_text().split()[:2] == ["twin_vm", "fail"]


def test_hmk_scenarios_runs_only_those_and_a_waiting_one_runs_without_engine_build_in_the_list(tmp_path):
    _bed(tmp_path, ["engine_build", "twin_vm", "gateway", "day2_fleet"])
    res, events = _run(tmp_path, HMK_SCENARIOS="gateway twin_vm")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(events) == ["end gateway", "end twin_vm", "start gateway", "start twin_vm"]


def test_the_slow_os_install_scenario_is_left_to_make_test_slow_unless_named(tmp_path):
    _bed(tmp_path, ["twin_vm", "bmc_os_install", "zz_unlisted"])
    res, events = _run(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "start bmc_os_install" not in events and "start zz_unlisted" in events
    assert "molecule: 2 passed, 0 failed" in res.stdout
    res, events = _run(tmp_path, HMK_SCENARIOS="bmc_os_install")
    assert res.returncode == 0 and events == ["start bmc_os_install", "end bmc_os_install"]
