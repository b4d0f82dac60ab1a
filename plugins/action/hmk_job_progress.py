# -*- coding: utf-8 -*-
"""One poll of a background job with its progress (see plugins/modules/hmk_job_progress.py for the documentation):
async_status's result, unchanged, plus `hmk_progress`, a line read from the progress file the job keeps on the node.
The stdout callback hmk.moe_kit.hmk_progress prints that line in place of the FAILED - RETRYING line of `until`."""
from __future__ import absolute_import, division, print_function

import base64
import re
import time

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

__metaclass__ = type

ARGUMENT_SPEC = dict(
    jid=dict(type="str", required=True),
    progress=dict(type="str"),
    log=dict(type="str"),
)

# Elapsed times above a week come from a clock that disagrees with the node's, not from a build.
_MAX_PLAUSIBLE_ELAPSED = 7 * 86400


def format_elapsed(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%ds" % seconds


def describe_progress(text, now=None, log=None):
    """The one-line report for the first line of a progress file.

    The file holds space-separated words: `N/M` (ninja's count of build edges), `NN%` (make's percentage),
    `step=i/n` (a script's step), `started=EPOCH` (the node's clock when the job began), and the phase words
    `configuring` / `compiling`. Unknown words are ignored, so an older or newer writer never breaks a poll.
    """
    now = time.time() if now is None else now
    step = compiled = phase = started = None
    lines = (text or "").strip().splitlines()
    words = lines[0].split() if lines else []
    for word in words:
        count = re.match(r"^(\d+)/(\d+)$", word)
        percent = re.match(r"^(\d{1,3})%$", word)
        if count and int(count.group(2)) > 0:
            done, total = int(count.group(1)), int(count.group(2))
            compiled = "%d/%d objects compiled (%d%%)" % (done, total, done * 100 // total)
        elif percent:
            compiled = "%s%% compiled" % percent.group(1)
        elif re.match(r"^step=\d+/\d+$", word):
            step = "step %s" % word[5:]
        elif re.match(r"^started=\d+$", word):
            started = int(word[8:])
        elif word in ("configuring", "compiling"):
            phase = word
    parts = [part for part in (step, compiled or phase) if part]
    if not parts:
        parts.append("no progress yet")
    if started is not None and 0 <= now - started <= _MAX_PLAUSIBLE_ELAPSED:
        parts.append("%s elapsed" % format_elapsed(now - started))
    line = ", ".join(parts)
    if log and not words:
        line += ", log: %s" % log
    return line


class ActionModule(ActionBase):

    def _get_async_dir(self):
        # Where async_status's own action looks: the shell's async_dir.
        async_dir = self.get_shell_option("async_dir", default="~/.ansible_async")
        return self._remote_expand_user(async_dir)

    def _read_progress(self, path, task_vars):
        """The progress file's text, or None: a job that has not written it yet is not an error."""
        read = self._execute_module(module_name="ansible.builtin.slurp", module_args=dict(src=path),
                                    task_vars=task_vars)
        if read.get("failed") or "content" not in read:
            return None
        try:
            return base64.b64decode(read["content"]).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return None

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

        if not result["finished"] and not result.get("failed"):
            text = self._read_progress(args["progress"], task_vars) if args.get("progress") else None
            result["hmk_progress"] = describe_progress(text, log=args.get("log"))
        return result
