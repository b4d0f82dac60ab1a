#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_hub_lock
short_description: Pin Hugging Face models' files (commit, size, sha256) in a lock file on the control machine
description:
  - An action plugin (plugins/action/hmk_hub_lock.py) that runs on the control machine, never on the node.
  - For each model whose lock entry is missing, reads the Hub's metadata at the catalog's revision with
    huggingface_hub (a branch or tag is resolved to its commit once), and records every file's path, commit, size and
    sha256 in the lock. LFS files carry their sha256 in the Hub's metadata; a file kept in git is read once and its
    bytes checked against the Hub's git object id before its sha256 is recorded.
  - A model already in the lock is checked against its catalog entry (repository, revision, subfolder, include, file
    names, and any size or sha256 the catalog gives) and the Hub is not contacted. A disagreement fails naming both
    values.
  - Several hosts may run it at once; the lock is read, completed and written under an exclusive lock, atomically.
  - Supports check mode (reads the Hub where the lock lacks a model, writes nothing).
options:
  lock_file:
    description: The lock file (YAML), e.g. models.lock.yml beside the inventory. Its directory must exist.
    type: path
    required: true
  endpoint:
    description: The Hub's URL (huggingface_hub's HF_ENDPOINT).
    type: str
    default: https://huggingface.co
  token:
    description: Hugging Face token for private or gated repositories; empty sends none. Never logged.
    type: str
    default: ""
  models:
    description: Catalog entries by model name, each with a huggingface block (repo, revision, subfolder, include,
      hf_files_repo, hf_files_revision) and its files / hf_files.
    type: dict
    required: true
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The Hugging Face files of the selected models are pinned in the lock
  hmk.moe_kit.hmk_hub_lock:
    lock_file: "{{ inventory_dir }}/models.lock.yml"
    token: "{{ vault_hf_token }}"
    models: "{{ {'qwen3-235b-a22b-q4_k_m': catalog['qwen3-235b-a22b-q4_k_m']} }}"
  no_log: true
"""

RETURN = r"""
resolved:
  description: Per model, files and hf_files as hmk_model_fetch takes them (name, size, sha256, repo, commit, path).
  type: dict
  returned: always
from_hub:
  description: Models whose entry was read from the Hub in this run (the others came from the lock).
  type: list
  returned: always
lock_file:
  description: The absolute path of the lock file.
  type: str
  returned: always
"""
