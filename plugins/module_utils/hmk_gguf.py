# -*- coding: utf-8 -*-
"""The kit's one GGUF reader: header, key/value metadata and tensor table of a GGUF file, and the
split-set and per-layer expert arithmetic built on them. Tensor data is never read, so a 400 GB model
costs a few MB of I/O. Pure Python 3 standard library: modules on the node, filters on the controller
and the unit tests all import this file.
"""
from __future__ import absolute_import, division, print_function

import os
import re
import struct

__metaclass__ = type

GGUF_MAGIC = b"GGUF"

# GGUF value types (ggml's gguf.h): code -> (struct format, size); 8 is string, 9 is array.
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
            6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9

SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate)_exps\.weight$")
LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")

# The keys the service and the roofline need, under "{arch}." in the metadata.
LAYOUT_KEYS = ("block_count", "context_length", "embedding_length", "expert_count", "expert_used_count",
               "expert_shared_count", "leading_dense_block_count", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "attention.value_length",
               "attention.kv_lora_rank", "rope.dimension_count",
               # MTP layers (speculative decoding): LLM_KV_NEXTN_PREDICT_LAYERS "%s.nextn_predict_layers" in
               # ik_llama.cpp's src/llama-arch.cpp at 55d3c05 and 8337e4cd.
               "nextn_predict_layers")


class GGUFError(Exception):
    """The file is not a GGUF file this reader understands (bad magic, version, or truncated)."""


class _Reader:
    def __init__(self, handle, endian):
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

    def value(self, vtype, array_limit):
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.scalar("I", 4)
            count = self.scalar("Q", 8)
            keep = array_limit is None or count <= array_limit
            if etype in _SCALARS and not keep:
                self.handle.seek(count * _SCALARS[etype][1], os.SEEK_CUR)
                return {"type": "array", "length": count}
            items = [self.value(etype, array_limit) for _unused in range(count)]
            return items if keep else {"type": "array", "length": count}
        raise GGUFError("unknown GGUF value type %d at byte %d" % (vtype, self.handle.tell()))


def _open_header(handle, path):
    magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError("%s is not a GGUF file (magic %r)" % (path, magic))
    raw_version = handle.read(4)
    if len(raw_version) != 4:
        raise GGUFError("%s is truncated in its header" % path)
    version = struct.unpack("<I", raw_version)[0]
    endian = "<"
    if version & 0xFFFF == 0:  # a big-endian file read as little-endian
        endian, version = ">", struct.unpack(">I", raw_version)[0]
    if version not in (2, 3):
        raise GGUFError("%s has GGUF version %d; this reader knows 2 and 3" % (path, version))
    return version, _Reader(handle, endian)


def read_gguf(path, array_limit=64, tensors=False):
    """Header, metadata and (with `tensors=True`) the tensor table of one GGUF file.

    Arrays longer than `array_limit` (e.g. the token list) come back as {"type": "array", "length": n};
    `array_limit=None` keeps them all. Returns {"version", "tensor_count", "kv_count", "metadata"} and,
    with tensors, "tensors": [(name, bytes)] where a tensor's size is the distance to the next tensor's
    offset (the last one ends at the end of the file), so no table of quantisation block sizes is needed.
    """
    file_size = os.path.getsize(path)
    with open(path, "rb") as handle:
        version, reader = _open_header(handle, path)
        tensor_count = reader.scalar("Q", 8)
        kv_count = reader.scalar("Q", 8)
        metadata = {}
        for _unused in range(kv_count):
            key = reader.string()
            metadata[key] = reader.value(reader.scalar("I", 4), array_limit)
        result = {"version": version, "tensor_count": tensor_count, "kv_count": kv_count, "metadata": metadata}
        if not tensors:
            return result
        infos = []
        for _unused in range(tensor_count):
            name = reader.string()
            for _unused in range(reader.scalar("I", 4)):
                reader.scalar("Q", 8)
            reader.scalar("I", 4)  # ggml type: sizes come from the offsets
            infos.append((name, reader.scalar("Q", 8)))
        alignment = metadata.get("general.alignment", 32)
        alignment = int(alignment) if isinstance(alignment, int) and alignment > 0 else 32
        data_start = -(-handle.tell() // alignment) * alignment
    ordered = sorted(infos, key=lambda item: item[1])
    ends = [offset for _unused, offset in ordered[1:]] + [file_size - data_start]
    table = [(name, end - offset) for (name, offset), end in zip(ordered, ends)]
    if any(size < 0 for _unused, size in table):
        raise GGUFError("%s: tensor offsets run past the end of the file (truncated download?)" % path)
    result["tensors"] = table
    return result


def split_files(path):
    """The model's files in split order: the path itself, or every NAME-0000K-of-0000N.gguf sibling.

    Does not look at the disk; `model_files` does.
    """
    match = SPLIT.match(os.path.basename(path))
    if not match:
        return [path]
    count = int(match.group("count"))
    directory = os.path.dirname(path)
    return [os.path.join(directory, "%s-%05d-of-%05d.gguf" % (match.group("prefix"), i, count))
            for i in range(1, count + 1)]


def model_files(path):
    """`split_files`, failing with the missing ones named when a split is not on disk."""
    files = split_files(path)
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise GGUFError("split model %s lacks %s" % (path, ", ".join(missing)))
    return files


def layout(path):
    """Architecture, metadata, per-layer routed-expert bytes and non-expert bytes of a (split) model.

    Also every layer's total bytes (layer_bytes, experts included), the output layer's (output_bytes:
    output.weight, or token_embd when the output is tied to it, plus output_norm) and the token
    embedding's (input_bytes), which the multi-GPU plan needs to follow the engine's layer split.
    """
    files = model_files(path)
    metadata, expert_bytes, non_expert = {}, {}, 0
    # Where llama.cpp puts each weight decides the GPU plan: a layer's tensors go to the device holding the
    # layer, output.weight (or the tied token_embd) to the one holding the output layer, token_embd stays on CPU.
    layer_bytes, named = {}, {}
    for index, name in enumerate(files):
        table = read_gguf(name, array_limit=0, tensors=True)
        if index == 0:
            metadata = table["metadata"]
        for tensor, size in table["tensors"]:
            match = EXPERT_TENSOR.match(tensor)
            if match:
                layer = int(match.group(1))
                expert_bytes[layer] = expert_bytes.get(layer, 0) + size
            else:
                non_expert += size
            in_layer = LAYER_TENSOR.match(tensor)
            if in_layer:
                layer = int(in_layer.group(1))
                layer_bytes[layer] = layer_bytes.get(layer, 0) + size
            else:
                named[tensor] = size
    arch = str(metadata.get("general.architecture", ""))
    wanted = {}
    for key in LAYOUT_KEYS:
        value = metadata.get("%s.%s" % (arch, key))
        if isinstance(value, (int, float, str)):  # per-layer arrays are not used
            wanted[key.replace("attention.", "").replace("rope.", "rope_")] = value
    wanted["name"] = str(metadata.get("general.name", ""))
    stats = [os.stat(f) for f in files]
    return {
        "architecture": arch,
        "metadata": wanted,
        "expert_bytes": {str(k): v for k, v in sorted(expert_bytes.items())},
        "non_expert_bytes": non_expert,
        "layer_bytes": {str(k): v for k, v in sorted(layer_bytes.items())},
        "output_bytes": named.get("output.weight", named.get("token_embd.weight", 0)) + named.get("output_norm.weight", 0),
        "input_bytes": named.get("token_embd.weight", 0),
        "total_bytes": sum(s.st_size for s in stats),
        "files": [{"path": f, "size": s.st_size, "mtime": int(s.st_mtime)} for f, s in zip(files, stats)],
    }
