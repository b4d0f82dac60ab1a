# -*- coding: utf-8 -*-
"""Test-only callback (molecule/hardening): interrupts the run like Ctrl-C right after a named task changed.

HMK_INTERRUPT_AFTER names the task (its name without the role prefix). The SIGINT goes to ansible-playbook itself,
which stops as an operator's Ctrl-C stops it: the task has run, nothing after it has.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: hmk_interrupt
type: aggregate
short_description: Interrupt the playbook (SIGINT) right after a named task changed something
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
            self._display.display("hmk_interrupt: SIGINT after %r" % result._task.name)
            os.kill(os.getpid(), signal.SIGINT)
