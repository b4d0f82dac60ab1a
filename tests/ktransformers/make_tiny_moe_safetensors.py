#!/usr/bin/env python3
"""Writes a tiny random-weight DeepSeek-V3-style MoE in the safetensors layout kt-kernel reads natively (BF16).

Standard library only, so it runs on a bare node or twin before any venv exists. The layout follows DeepSeek-V3's
Hugging Face folder: config.json (model_type deepseek_v3, first_k_dense_replace dense layers, then MoE layers
with n_routed_experts routed experts, a sigmoid router with e_score_correction_bias and n_shared_experts), and
the tensors the MoE blocks use, named model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight,
model.layers.N.mlp.gate.weight, model.layers.N.mlp.gate.e_score_correction_bias and
model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight, split over two files with an index, as published
checkpoints are. Attention weights are left out: kt-kernel never reads them. Deterministic for a seed.

  make_tiny_moe_safetensors.py OUT_DIR [--seed 1234]
"""
import argparse
import json
import os
import random
import struct

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "moe_intermediate_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def bf16_bytes(values):
    """float -> bfloat16 bytes, rounded to nearest even (what torch's .to(torch.bfloat16) does)."""
    out = bytearray()
    for value in values:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out += struct.pack("<H", bits & 0xFFFF)
    return bytes(out)


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def tensors_of_layer(rng, layer, cfg):
    hidden, inter, experts = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    base = "model.layers.%d.mlp" % layer

    def rand(shape, scale):
        count = 1
        for dim in shape:
            count *= dim
        return [rng.gauss(0.0, scale) for _unused in range(count)]

    out = []
    for expert in range(experts):
        for name, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
            out.append(("%s.experts.%d.%s.weight" % (base, expert, name), "BF16", shape, bf16_bytes(rand(shape, 0.1))))
    shared = inter * cfg["n_shared_experts"]
    for name, shape in (("gate_proj", [shared, hidden]), ("up_proj", [shared, hidden]), ("down_proj", [hidden, shared])):
        out.append(("%s.shared_experts.%s.weight" % (base, name), "BF16", shape, bf16_bytes(rand(shape, 0.1))))
    out.append(("%s.gate.weight" % base, "BF16", [experts, hidden], bf16_bytes(rand([experts, hidden], 0.5))))
    out.append(("%s.gate.e_score_correction_bias" % base, "F32", [experts], f32_bytes(rand([experts], 0.1))))
    return out


def write_safetensors(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path + ".tmp", "wb") as handle:
        handle.write(struct.pack("<Q", len(blob)))
        handle.write(blob)
        for _unused, _unused, _unused, data in tensors:
            handle.write(data)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    moe_layers = range(CONFIG["first_k_dense_replace"], CONFIG["num_hidden_layers"])
    files, weight_map = [], {}
    for index, layer in enumerate(moe_layers, start=1):
        name = "model-%05d-of-%05d.safetensors" % (index, len(moe_layers))
        tensors = tensors_of_layer(rng, layer, CONFIG)
        write_safetensors(os.path.join(args.out_dir, name), tensors)
        weight_map.update({t[0]: name for t in tensors})
        files.append(name)
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle, indent=1, sort_keys=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as handle:
        json.dump(CONFIG, handle, indent=1, sort_keys=True)
    print(json.dumps({"dir": args.out_dir, "files": files}))


if __name__ == "__main__":
    main()
