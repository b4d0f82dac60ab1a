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
author: hybrid-moe-kit
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
total_bytes:
  description: Size of all the model's files.
  type: int
  returned: always
files:
  description: The model's files (path, size, mtime), in split order.
  type: list
  returned: always
"""

import os
import re
import struct

from ansible.module_utils.basic import AnsibleModule

_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
            6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9
SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate)_exps\.weight$")
WANTED_KEYS = ("block_count", "context_length", "embedding_length", "expert_count", "expert_used_count",
               "expert_shared_count", "leading_dense_block_count", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "attention.value_length",
               "attention.kv_lora_rank", "rope.dimension_count")


class GGUFError(Exception):
    """Not a GGUF file this reader understands."""


class _Reader:
    def __init__(self, handle, endian="<"):
        self.handle, self.endian = handle, endian

    def take(self, size):
        data = self.handle.read(size)
        if len(data) != size:
            raise GGUFError("truncated GGUF header at byte %d" % self.handle.tell())
        return data

    def scalar(self, fmt, size):
        return struct.unpack(self.endian + fmt, self.take(size))[0]

    def string(self):
        length = self.scalar("Q", 8)
        if length > 1 << 30:
            raise GGUFError("implausible string length %d at byte %d" % (length, self.handle.tell()))
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, vtype):
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("I", 4), self.scalar("Q", 8)
            if etype in _SCALARS:  # skipped: only scalars and strings are needed
                self.handle.seek(count * _SCALARS[etype][1], os.SEEK_CUR)
            else:
                for _ in range(count):
                    self.value(etype)
            return None
        raise GGUFError("unknown GGUF value type %d at byte %d" % (vtype, self.handle.tell()))


def read_tensor_table(path):
    """{"metadata": {key: scalar}, "tensors": [(name, bytes)]} of one GGUF file."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise GGUFError("%s is not a GGUF file" % path)
        raw = handle.read(4)
        if len(raw) != 4:
            raise GGUFError("%s is truncated" % path)
        endian = "<"
        version = struct.unpack("<I", raw)[0]
        if version & 0xFFFF == 0:
            endian, version = ">", struct.unpack(">I", raw)[0]
        if version not in (2, 3):
            raise GGUFError("%s has GGUF version %d; this reader knows 2 and 3" % (path, version))
        reader = _Reader(handle, endian)
        tensor_count, kv_count = reader.scalar("Q", 8), reader.scalar("Q", 8)
        metadata = {}
        for _ in range(kv_count):
            key = reader.string()
            value = reader.value(reader.scalar("I", 4))
            if value is not None:
                metadata[key] = value
        infos = []
        for _ in range(tensor_count):
            name = reader.string()
            n_dims = reader.scalar("I", 4)
            for _ in range(n_dims):
                reader.scalar("Q", 8)
            reader.scalar("I", 4)  # ggml type: sizes come from the offsets
            infos.append((name, reader.scalar("Q", 8)))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = -(-handle.tell() // alignment) * alignment
    ordered = sorted(infos, key=lambda item: item[1])
    ends = [offset for _, offset in ordered[1:]] + [file_size - data_start]
    tensors = [(name, end - offset) for (name, offset), end in zip(ordered, ends)]
    if any(size < 0 for _, size in tensors):
        raise GGUFError("%s: tensor offsets run past the end of the file (truncated download?)" % path)
    return {"metadata": metadata, "tensors": tensors}


def model_files(path):
    """The model's files in split order: the path itself, or every NAME-0000K-of-0000N.gguf sibling."""
    match = SPLIT.match(os.path.basename(path))
    if not match:
        return [path]
    count = int(match.group("count"))
    directory = os.path.dirname(path)
    files = [os.path.join(directory, "%s-%05d-of-%05d.gguf" % (match.group("prefix"), i, count))
             for i in range(1, count + 1)]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise GGUFError("split model %s lacks %s" % (path, ", ".join(missing)))
    return files


def layout(path):
    """Architecture, metadata, per-layer routed-expert bytes and non-expert bytes of a (split) model."""
    files = model_files(path)
    metadata, expert_bytes, non_expert = {}, {}, 0
    for index, name in enumerate(files):
        table = read_tensor_table(name)
        if index == 0:
            metadata = table["metadata"]
        for tensor, size in table["tensors"]:
            match = EXPERT_TENSOR.match(tensor)
            if match:
                layer = int(match.group(1))
                expert_bytes[layer] = expert_bytes.get(layer, 0) + size
            else:
                non_expert += size
    arch = str(metadata.get("general.architecture", ""))
    wanted = {}
    for key in WANTED_KEYS:
        value = metadata.get("%s.%s" % (arch, key))
        if value is not None:
            wanted[key.replace("attention.", "").replace("rope.", "rope_")] = value
    wanted["name"] = str(metadata.get("general.name", ""))
    stats = [os.stat(f) for f in files]
    return {
        "architecture": arch,
        "metadata": wanted,
        "expert_bytes": {str(k): v for k, v in sorted(expert_bytes.items())},
        "non_expert_bytes": non_expert,
        "total_bytes": sum(s.st_size for s in stats),
        "files": [{"path": f, "size": s.st_size, "mtime": int(s.st_mtime)} for f, s in zip(files, stats)],
    }


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    try:
        result = layout(module.params["path"])
    except (GGUFError, OSError, struct.error) as exc:
        module.fail_json(msg="cannot read the model's tensor table: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
