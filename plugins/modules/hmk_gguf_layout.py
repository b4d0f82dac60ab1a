#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Reads a GGUF model's tensor table (every split) and sums the routed experts' bytes per layer."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_gguf_layout
short_description: Per-layer routed-expert bytes and the other weights' bytes of a GGUF model
description:
  - Reads the header, metadata and tensor table of a GGUF file and of its sibling splits
    (C(NAME-0000K-of-0000N.gguf)); tensor data is never read, so it costs a few MB of I/O even for 400 GB.
  - A tensor's size is the distance to the next tensor's offset (the last one ends at the end of the
    file), so no table of quantisation block sizes is needed and the sum equals the data section.
  - Tensors named C(blk.N.ffn_(up|down|gate)_exps.weight) count as layer N's routed experts; everything
    else (attention, shared experts, dense FFNs, embeddings, output) as non-expert weights.
options:
  path:
    description: The model file; for a split model, the first split (C(-00001-of-0000N.gguf)).
    type: path
    required: true
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The model's tensor layout is read from its GGUF header
  hmk.moe_kit.hmk_gguf_layout:
    path: /srv/models/qwen3-235b-a22b-q4_k_m/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf
  register: layout

- name: The routed experts' bytes per layer are shown
  ansible.builtin.debug:
    msg: "{{ layout.architecture }}: {{ layout.expert_bytes }}"
"""

RETURN = r"""
architecture:
  description: general.architecture
  type: str
  returned: always
metadata:
  description: The keys the service needs (block_count, context_length, expert_count, head counts, kv_lora_rank...).
  type: dict
  returned: always
expert_bytes:
  description: Routed-expert bytes per MoE layer, keyed by layer number (as a string).
  type: dict
  returned: always
non_expert_bytes:
  description: Bytes of every other tensor.
  type: int
  returned: always
layer_bytes:
  description: Bytes of every tensor of each layer (C(blk.N.*), routed experts included), keyed by layer number.
  type: dict
  returned: always
output_bytes:
  description: Bytes of the output layer (output.weight, or the tied token_embd.weight, plus output_norm.weight).
  type: int
  returned: always
input_bytes:
  description: Bytes of token_embd.weight (the engines keep it on the CPU).
  type: int
  returned: always
total_bytes:
  description: Size of all the model's files.
  type: int
  returned: always
files:
  description: The model's files (path, size, mtime), in split order.
  type: list
  returned: always
"""

import struct

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf import GGUFError, layout


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    try:
        result = layout(module.params["path"])
    except (GGUFError, OSError, struct.error) as exc:
        module.fail_json(msg="cannot read the model's tensor table: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
