# -*- coding: utf-8 -*-
"""One poll of a background job with its progress (see plugins/modules/hmk_job_progress.py for the documentation):
async_status's result, unchanged, plus `hmk_progress`, a line read from the end of the job's own log on the node
(the build writes its log directly; nothing sits between the compiler and the log), or with `model` that model's
bytes, rate and time left read from the model sync's shared log (hmk_model_fetch's lines, read by module_utils).
The stdout callback hmk.moe_kit.hmk_progress prints that line in place of the FAILED - RETRYING line of `until`."""
from __future__ import absolute_import, division, print_function

import calendar
import re
import shlex
import time

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_model_sync import (
    LOG_PROGRESS_MARK, describe_sync_log, format_duration)

__metaclass__ = type

ARGUMENT_SPEC = dict(
    jid=dict(type="str", required=True),
    log=dict(type="str"),
    model=dict(type="str"),
)

# Elapsed times above a week come from a clock that disagrees with the node's, not from a build.
_MAX_PLAUSIBLE_ELAPSED = 7 * 86400
# The end of the log that one poll reads: enough for the compiler's last count line between warnings.
TAIL_LINES = 80
# The model sync's log is shared by every model and every run: one model's lines, all but its progress lines (the
# start of the run and each file's start and end, a few per file), then its last lines, with the latest progress.
SYNC_EVENT_LINES = 1000
SYNC_TAIL_LINES = 40
_TAIL_MARK = "--hmk-job-progress-tail--"

_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z")
_STEP = re.compile(r"^== .* step (\d+/\d+): ")
_NINJA = re.compile(r"^\s*\[(\d+)/(\d+)\] ")
_MAKE = re.compile(r"^\s*\[ *(\d{1,3})%\] ")


format_elapsed = format_duration


def read_log(first, tail):
    """What the build scripts' log says so far: the start (the UTC stamp on its first line, `== configure <stamp>`
    or `== <stamp> step 1/n: ...`), the last step marker, phase and compiler count in its last lines.

    The compiler writes the log and nothing else is added to it: ninja's `[N/M]`, make's `[ NN%]`, the scripts'
    own `== configure`, `== build` and `== <stamp> step i/n:` lines. A step marker starts a new count."""
    state = dict(started=None, step=None, phase=None, count=None)
    stamp = _STAMP.search(first or "")
    if stamp:
        state["started"] = calendar.timegm(tuple(int(part) for part in stamp.groups()) + (0, 0, 0))
    # The first line's marker counts even when the tail no longer holds it; a short log repeats it, to the same effect.
    for line in [first or ""] + (tail or "").splitlines():
        step = _STEP.match(line)
        ninja = _NINJA.match(line)
        make = _MAKE.match(line)
        if line.startswith("== configure "):
            state.update(phase="configuring", count=None)
        elif line.startswith("== build "):
            state.update(phase="compiling", count=None)
        elif step:
            state.update(step=step.group(1), phase=None, count=None)
        elif ninja and int(ninja.group(2)) > 0:
            done, total = int(ninja.group(1)), int(ninja.group(2))
            state["count"] = "%d/%d objects compiled (%d%%)" % (done, total, done * 100 // total)
        elif make:
            state["count"] = "%s%% compiled" % make.group(1)
    return state


def describe_progress(first, tail, now=None, log=None):
    """The one-line report of a running build from its log's first line and last lines (None: no log yet)."""
    now = time.time() if now is None else now
    state = read_log(first, tail)
    parts = [part for part in ("step %s" % state["step"] if state["step"] else None,
                               state["count"] or state["phase"]) if part]
    if not parts:
        parts.append("no progress yet")
    started = state["started"]
    if started is not None and 0 <= now - started <= _MAX_PLAUSIBLE_ELAPSED:
        parts.append("%s elapsed" % format_elapsed(now - started))
    line = ", ".join(parts)
    if log and first is None:
        line += ", log: %s" % log
    return line


class ActionModule(ActionBase):

    def _get_async_dir(self):
        # Where async_status's own action looks: the shell's async_dir.
        async_dir = self.get_shell_option("async_dir", default="~/.ansible_async")
        return self._remote_expand_user(async_dir)

    def _read_log(self, path):
        """(first line, last lines) of the job's log, or (None, None) when it cannot be read yet: no error."""
        quoted = shlex.quote(path)
        cmd = "head -n 1 -- %s && echo %s && tail -n %d -- %s" % (quoted, _TAIL_MARK, TAIL_LINES, quoted)
        read = self._low_level_execute_command(cmd, sudoable=True)
        out = read.get("stdout") or ""
        if read.get("rc") != 0 or _TAIL_MARK not in out:
            return None, None
        first, tail = out.split(_TAIL_MARK, 1)
        return first.strip("\n"), tail.lstrip("\n")

    def _read_sync_log(self, path, model, results_file):
        """(start of the job by the node's clock, or None; `model`'s lines of the shared log): the job's results file
        is written when the job starts, so lines stamped before it are an earlier run's."""
        log, mine = shlex.quote(path), shlex.quote(" %s " % model)
        cmd = ("stat -c %%Y -- %s; echo %s; grep -F -e %s -- %s | grep -v -F -e %s | tail -n %d; "
               "grep -F -e %s -- %s | tail -n %d"
               % (shlex.quote(results_file), _TAIL_MARK, mine, log, shlex.quote(LOG_PROGRESS_MARK), SYNC_EVENT_LINES,
                  mine, log, SYNC_TAIL_LINES))
        out = self._low_level_execute_command(cmd, sudoable=True).get("stdout") or ""
        if _TAIL_MARK not in out:
            return None, []
        since, lines = out.split(_TAIL_MARK, 1)
        since = since.strip()
        return (int(since) if since.isdigit() else None), lines.splitlines()

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)

        # What async_status's action does, so that the result (and a failed job's failure) is the same.
        jid = args["jid"]
        async_dir = self._get_async_dir()
        result.update(started=True, finished=False, stdout="", stderr="", stdout_lines=[], stderr_lines=[],
                      ansible_job_id=jid, results_file=self._connection._shell.join_path(async_dir, jid))
        status = self._execute_module(module_name="ansible.builtin.async_status",
                                      module_args=dict(jid=jid, mode="status", _async_dir=async_dir),
                                      task_vars=task_vars)
        result = merge_hash(result, status)
        for key in ("started", "finished"):
            result[key] = bool(result[key])

        if args.get("model"):
            # The finished job's module arguments stay off the screen (the task that started it may hide them).
            result.pop("invocation", None)
        if result["finished"]:
            # The job's results file has been read: it is removed (async_status mode=cleanup), so that each build and
            # each model sync leaves nothing behind in the node's async directory.
            self._execute_module(module_name="ansible.builtin.async_status",
                                 module_args=dict(jid=jid, mode="cleanup", _async_dir=async_dir), task_vars=task_vars)
        if result["finished"] or result.get("failed"):
            return result
        if args.get("model"):
            since, lines = self._read_sync_log(args["log"], args["model"], result["results_file"]) if args.get("log") \
                else (None, [])
            result["hmk_progress"] = describe_sync_log(lines, args["model"], since)
        else:
            first, tail = self._read_log(args["log"]) if args.get("log") else (None, None)
            result["hmk_progress"] = describe_progress(first, tail, log=args.get("log"))
        return result
