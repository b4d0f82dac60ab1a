#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What the running engine really runs, compared with its configuration (argv, binary, start time)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_inference_state
short_description: Judge from the running process whether the service runs its configuration
description:
  - Reads the unit's main PID, the process's argv (/proc/PID/cmdline), its executable and its start time, and
    compares them with the argv the configuration renders, the binary it names and the modification times of the
    files it is made of (unit, arguments, key, model files, the engine's current link).
  - Any difference is drift - the engine is not running, runs other arguments or another build, or a file changed
    after it started (an earlier run was interrupted between writing and restarting). Records are not trusted.
  - Read-only; runs the same in check mode.
options:
  unit:
    description: The systemd unit.
    type: str
    required: true
  argv:
    description: The argv the configuration renders (program first), as the engine must see it.
    type: list
    elements: str
    required: true
  binary:
    description: The engine binary the configuration names; the running executable must be the file it resolves to.
    type: path
  files:
    description: Files whose modification after the engine started means the engine runs an older configuration.
    type: list
    elements: path
    default: []
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The running engine is compared with the configuration it should run
  hmk.moe_kit.hmk_inference_state:
    unit: hmk-inference.service
    argv: [/opt/hmk/engines/current/bin/llama-server, --model, /srv/models/model.gguf, --port, "8080"]
    binary: /opt/hmk/engines/current/bin/llama-server
    files: [/etc/systemd/system/hmk-inference.service, /etc/hmk/inference.args]
  register: engine_state
  check_mode: false

- name: The engine restarts only when it runs something else than configured
  ansible.builtin.systemd_service:
    name: hmk-inference.service
    state: restarted
  when: engine_state.drift | length > 0
"""

RETURN = r"""
running:
  description: Whether the unit is active with a main process.
  type: bool
  returned: always
main_pid:
  description: The unit's main PID (0 when not running).
  type: int
  returned: always
started:
  description: The process's start time (seconds since the epoch), 0 when not running.
  type: float
  returned: always
drift:
  description: One sentence per difference between the running engine and its configuration (empty when none).
  type: list
  returned: always
now:
  description: The node's clock when it was read (seconds since the epoch), for journal queries after a restart.
  type: float
  returned: always
unit_file_state:
  description: The unit's UnitFileState (C(enabled), C(disabled), ...; empty when systemd does not know the unit).
  type: str
  returned: always
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule


def _read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def process_start(pid):
    """Start time of a process in seconds since the epoch, to a clock tick.

    /proc/PID/stat's starttime counts clock ticks since boot on CLOCK_BOOTTIME; the process has run for the
    current CLOCK_BOOTTIME less that, so its start is that long before now on the wall clock. (/proc/stat's btime
    is whole seconds: btime + starttime put the start up to a second early, and a file written in the second
    before the restart read as changed after it, so a converged re-run restarted the engine again.) The error left
    is under a tick plus the microseconds between the two clock reads, and places the start earlier, never later
    (the wall clock is read first): a file changed after the start is never missed.
    """
    stat = _read("/proc/%d/stat" % pid)
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[19])
    now = time.time()
    running_for = time.clock_gettime(time.CLOCK_BOOTTIME) - float(ticks) / os.sysconf("SC_CLK_TCK")
    return now - running_for


def argv_difference(wanted, running):
    """A short sentence on the first difference between two argument lists, or None."""
    if wanted == running:
        return None
    for index, (want, have) in enumerate(zip(wanted, running)):
        if want != have:
            return "argument %d is %r, the configuration says %r" % (index, have, want)
    if len(running) > len(wanted):
        return "it runs %d extra argument(s) from %r on" % (len(running) - len(wanted), running[len(wanted)])
    return "it lacks %d argument(s) from %r on" % (len(wanted) - len(running), wanted[len(running)])


def judge(wanted_argv, running_argv, started, mtimes, exe=None, binary=None):
    """Drift sentences from what was read: the running argv, start time, exe, and {file: mtime or None}."""
    drift = []
    difference = argv_difference(list(wanted_argv), list(running_argv))
    if difference:
        drift.append("the running engine's arguments differ: %s" % difference)
    if binary and exe and exe != binary:
        drift.append("the running engine is %s, the configuration names %s" % (exe, binary))
    for path, mtime in sorted(mtimes.items()):
        if mtime is None:
            drift.append("%s is missing" % path)
        elif mtime > started:
            drift.append("%s changed after the engine started" % path)
    return drift


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            argv=dict(type="list", elements="str", required=True),
            binary=dict(type="path"),
            files=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    rc, out, err = module.run_command(["systemctl", "show", p["unit"], "--property=MainPID,ActiveState,UnitFileState"])
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    pid = int(props.get("MainPID") or 0)
    enabled = props.get("UnitFileState", "")
    if rc != 0 or props.get("ActiveState") != "active" or pid == 0:
        module.exit_json(changed=False, running=False, main_pid=0, started=0.0, now=time.time(), unit_file_state=enabled,
                         drift=["the service is not running (%s)" % (props.get("ActiveState") or err.strip() or "unknown")])
    try:
        running_argv = _read("/proc/%d/cmdline" % pid, "rb").decode("utf-8", "surrogateescape").split("\0")[:-1]
        started = process_start(pid)
        exe = os.readlink("/proc/%d/exe" % pid)
    except (IOError, OSError) as exc:
        module.exit_json(changed=False, running=False, main_pid=pid, started=0.0, now=time.time(),
                         unit_file_state=enabled, drift=["the engine's process %d could not be read (%s)" % (pid, exc)])
    mtimes = {}
    for path in p["files"]:
        try:
            mtimes[path] = os.lstat(path).st_mtime
        except OSError:
            mtimes[path] = None
    binary = os.path.realpath(p["binary"]) if p["binary"] else None
    drift = judge(p["argv"], running_argv, started, mtimes, exe=exe, binary=binary)
    module.exit_json(changed=False, running=True, main_pid=pid, started=started, now=time.time(), unit_file_state=enabled,
                     drift=drift)


if __name__ == "__main__":
    main()
