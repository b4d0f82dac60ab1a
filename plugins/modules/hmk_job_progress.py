#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_job_progress
short_description: Check a background job like async_status, with the job's own progress in one line
description:
  - An action plugin (plugins/action/hmk_job_progress.py); this file only documents it.
  - >-
    Runs M(ansible.builtin.async_status) for O(jid) on the node and returns its result unchanged, so
    C(until: result.finished) and a failed job (its rc, stdout and stderr) behave exactly as with async_status.
  - >-
    While the job runs, also reads the first line and the last 80 lines of the job's log O(log) on the node (missing
    or empty is not an error) and returns RV(hmk_progress), such as C(312/1024 objects compiled) with the percentage
    and the time elapsed.
  - A module cannot print while it runs; the stdout callback C(hmk.moe_kit.hmk_progress) prints RV(hmk_progress) at
    each retry in place of Ansible's C(FAILED - RETRYING) line.
  - >-
    With O(model), O(log) is the model sync's log, the one M(hmk.moe_kit.hmk_model_fetch) writes (its C(log_path)),
    shared by every model and run: that model's lines written since its job started are read and RV(hmk_progress) is
    such as C(tiny-qwen3moe: 1.2 GiB of 3.4 GiB) with the percentage, then C(412 MiB/s, 5m40s left): the bytes missing
    when the sync began, the files' own rates (or the bytes over the time the log covers), and the time left at that
    rate. The finished job's module arguments, C(invocation), are left out of the result.
  - >-
    Once the job has finished, its results file in the node's async directory is removed (M(ansible.builtin.async_status)
    with C(mode=cleanup)) after it was read, so that builds and model syncs leave no file behind there. A job is
    therefore read as finished once only.
  - >-
    Without O(model), what is read from the log: the compiler's own count, C([N/M]) (ninja) or C([ NN%]) (make), the
    kit's build scripts' markers C(== configure <stamp>), C(== build <stamp>) and C(== <stamp> step i/n:) (a step
    starts a new count), and the UTC stamp on the first line as the start; the elapsed time therefore assumes the node's clock
    agrees with the control machine's and is left out when it does not plausibly.
options:
  jid:
    description: "The job id, C(ansible_job_id) of the task started with C(async) and C(poll: 0)."
    type: str
    required: true
  log:
    description: The job's log on the node, which the job writes as it goes. Without it RV(hmk_progress) says
      C(no progress yet); while it cannot be read yet, RV(hmk_progress) names it.
    type: str
  model:
    description: The model whose sync the job is; O(log) is then read as the model sync's log (see above).
    type: str
notes:
  - Supports check mode as async_status does; a job cannot be started in check mode, so such tasks usually skip it.
seealso:
  - module: ansible.builtin.async_status
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The compiler starts on the build
  ansible.builtin.command:
    cmd: /opt/hmk/engines/llama.cpp/staging/b1.sh
  async: 3600
  poll: 0
  register: build_job
  changed_when: true

- name: The compiler builds b1, checked every 15 s
  hmk.moe_kit.hmk_job_progress:
    jid: "{{ build_job.ansible_job_id }}"
    log: /opt/hmk/engines/llama.cpp/logs/b1.log
  register: build_run
  until: build_run.finished
  retries: 241
  delay: 15

- name: A model's sync, checked every 15 s with its bytes, rate and time left
  hmk.moe_kit.hmk_job_progress:
    jid: "{{ sync_job.ansible_job_id }}"
    log: /var/log/hmk-model-sync.log
    model: tiny-qwen3moe
  register: sync_run
  until: sync_run.finished
  retries: 11521
  delay: 15
"""

RETURN = r"""
hmk_progress:
  description: The job's progress in one line, while it has not finished.
  type: str
  returned: when the job has not finished and has not failed
  sample: 312/1024 objects compiled (30%), 4m10s elapsed
finished:
  description: Whether the job has finished (as async_status returns it).
  type: bool
  returned: always
started:
  description: Whether the job has started (as async_status returns it).
  type: bool
  returned: always
ansible_job_id:
  description: The job id.
  type: str
  returned: always
results_file:
  description: The job's results file on the node.
  type: str
  returned: always
stdout:
  description: The job's stdout once it has finished (as async_status returns it; the same for the other keys of
    the job's result, such as rc, stderr, start, end).
  type: str
  returned: always
stderr:
  description: The job's stderr once it has finished.
  type: str
  returned: always
"""
