# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: hmk_progress
type: stdout
short_description: Ansible's default screen output, with a calm progress line for polled jobs
description:
  - >-
    Ansible's default stdout callback (P(ansible.builtin.default#callback)) with one change. When a task retried by
    C(until) carries C(hmk_progress) in its result (M(hmk.moe_kit.hmk_job_progress) does), the retry prints
    C([host] task name: 312/1024 objects compiled) with the percentage and the time elapsed, or for a model sync
    C(tiny-qwen3moe: 1.2 GiB of 3.4 GiB) with the percentage, the rate and the time left, instead of
    the C(FAILED - RETRYING) line with its count of retries left, which made every build look like a failure.
  - Every other line is the default callback's, with its options (result format, diff, skipped and ok hosts).
author: hybrid-moe-kit developers (@hybrid-moe-kit)
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
requirements:
  - set as stdout callback in the configuration
"""

EXAMPLES = r"""
# ansible.cfg:
# [defaults]
# stdout_callback = hmk.moe_kit.hmk_progress
#
# or for one run: ANSIBLE_STDOUT_CALLBACK=hmk.moe_kit.hmk_progress ansible-playbook site.yml
"""

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback


class CallbackModule(DefaultCallback):

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "hmk.moe_kit.hmk_progress"

    def v2_runner_retry(self, result):
        progress = result.result.get("hmk_progress")
        if not isinstance(progress, str) or not progress:
            return super(CallbackModule, self).v2_runner_retry(result)
        msg = "  [%s] %s: %s" % (self.host_label(result), result.task_name or result.task, progress)
        if self._run_is_verbose(result, verbosity=2):
            msg += " Result was: %s" % self._dump_results(result.result)
        self._display.display(msg, color=C.COLOR_DEBUG)
