# -*- coding: utf-8 -*-
"""Test-only callback (molecule/hardening): stops the run right after a named task changed something.

HMK_INTERRUPT_AFTER names the task (its name without the role prefix). ansible-playbook exits on the spot with 130
(128 + SIGINT), as a Ctrl-C or a dropped control machine leaves a node: the task has run, nothing after it has.
The process exits instead of raising KeyboardInterrupt because Ansible's own shutdown after one can hang (its
results thread waits on a queue no worker writes to any more).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import sys

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: hmk_interrupt
type: aggregate
short_description: Stop the playbook (exit 130, as Ctrl-C) right after a named task changed something
description: Test-only; see molecule/hardening/molecule.yml.
requirements: [HMK_INTERRUPT_AFTER in the environment]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hmk_interrupt"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_on_ok(self, result):
        if result._task.name == os.environ.get("HMK_INTERRUPT_AFTER") and result._result.get("changed"):
            self._display.display("hmk_interrupt: stopped after %r" % result._task.name)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
