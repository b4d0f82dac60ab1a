"""Tensor tables of the brief's three models, built from their published shapes and a realistic bits-per-weight
mix, in the form the kit's GGUF reader returns (plugins/module_utils/hmk_gguf.py: layout()). The planner and the
engine-log proof are tested on these instead of 400 GB files.

DeepSeek-R1 (deepseek2): 61 blocks (3 dense + 58 MoE of 256 routed experts and 1 shared), MLA attention (q_lora
1536, kv_lora 512, 128 heads of 128 + 64 rope dims), n_embd 7168, vocab 129280.
Qwen3-235B-A22B (qwen3moe): 94 MoE blocks of 128 experts, GQA 64 heads / 4 KV heads of 128, n_embd 4096,
vocab 151936.
"""

R1_SHAPES = {
    "embd": 7168, "layers": 61, "dense": 3, "ff_dense": 18432, "ff_exp": 2048, "experts": 256, "shared": 1,
    "q_lora": 1536, "kv_lora": 512, "heads": 128, "nope": 128, "rope": 64, "v_head": 128, "vocab": 129280,
}
QWEN3_SHAPES = {"embd": 4096, "layers": 94, "ff_exp": 1536, "experts": 128, "heads": 64, "kv_heads": 4,
                "head_dim": 128, "vocab": 151936}

# bits per weight: routed experts, every other quantised matrix; norms, router and biases stay f32.
QUANTS = {
    # unsloth/bartowski-style Q4_K_M: gate/up q4_K (4.5), down half q4_K half q6_K; attention and shared
    # experts at ~5.5 bpw. R1 ~404 GB, Qwen3-235B ~143 GB.
    "Q4_K_M": {"experts": (2 * 4.5 + (4.5 + 6.5625) / 2) / 3, "other": 5.5},
    # IQ4_XS experts (4.25 bpw nominal, ~4.16 measured on the R1 file) with q5-ish attention: ~351 GB.
    "IQ4_XS": {"experts": 4.16, "other": 5.0},
}


def _bytes(params, bpw):
    return int(params * bpw / 8)


def _layout(arch, metadata, tensors, expert_names):
    expert_bytes, layer_bytes, named = {}, {}, {}
    for name, size in tensors:
        if name.startswith("blk."):
            layer = int(name.split(".")[1])
            layer_bytes[layer] = layer_bytes.get(layer, 0) + size
            if name in expert_names:
                expert_bytes[layer] = expert_bytes.get(layer, 0) + size
        else:
            named[name] = size
    total = sum(size for _unused, size in tensors)
    experts = sum(expert_bytes.values())
    return {"architecture": arch, "metadata": metadata,
            "expert_bytes": {str(k): v for k, v in sorted(expert_bytes.items())},
            "non_expert_bytes": total - experts,
            "layer_bytes": {str(k): v for k, v in sorted(layer_bytes.items())},
            "output_bytes": named["output.weight"] + named["output_norm.weight"],
            "input_bytes": named["token_embd.weight"], "total_bytes": total}


def r1(quant="IQ4_XS"):
    s, q = R1_SHAPES, QUANTS[quant]
    e, f32 = s["embd"], 32
    tensors = [("token_embd.weight", _bytes(s["vocab"] * e, q["other"])),
               ("output.weight", _bytes(s["vocab"] * e, q["other"])), ("output_norm.weight", e * 4)]
    expert_names = set()
    for n in range(s["layers"]):
        blk = "blk.%d." % n
        tensors += [
            (blk + "attn_norm.weight", e * 4), (blk + "attn_q_a_norm.weight", s["q_lora"] * 4),
            (blk + "attn_kv_a_norm.weight", s["kv_lora"] * 4), (blk + "ffn_norm.weight", e * 4),
            (blk + "attn_q_a.weight", _bytes(e * s["q_lora"], q["other"])),
            (blk + "attn_q_b.weight", _bytes(s["q_lora"] * s["heads"] * (s["nope"] + s["rope"]), q["other"])),
            (blk + "attn_kv_a_mqa.weight", _bytes(e * (s["kv_lora"] + s["rope"]), q["other"])),
            (blk + "attn_kv_b.weight", _bytes(s["kv_lora"] * s["heads"] * (s["nope"] + s["v_head"]), q["other"])),
            (blk + "attn_output.weight", _bytes(s["heads"] * s["v_head"] * e, q["other"])),
        ]
        if n < s["dense"]:
            tensors += [(blk + "ffn_%s.weight" % w, _bytes(e * s["ff_dense"], q["other"])) for w in ("gate", "up", "down")]
            continue
        tensors += [(blk + "ffn_gate_inp.weight", _bytes(e * s["experts"], f32)),
                    (blk + "exp_probs_b.bias", s["experts"] * 4)]
        for w in ("gate", "up", "down"):
            name = blk + "ffn_%s_exps.weight" % w
            expert_names.add(name)
            tensors.append((name, _bytes(e * s["ff_exp"] * s["experts"], q["experts"])))
            tensors.append((blk + "ffn_%s_shexp.weight" % w, _bytes(e * s["ff_exp"] * s["shared"], q["other"])))
    meta = {"block_count": s["layers"], "kv_lora_rank": s["kv_lora"], "rope_dimension_count": s["rope"],
            "head_count": s["heads"], "head_count_kv": s["heads"], "key_length": s["nope"] + s["rope"],
            "value_length": s["v_head"], "embedding_length": e, "leading_dense_block_count": s["dense"],
            "expert_count": s["experts"], "expert_used_count": 8, "name": "DeepSeek R1 " + quant}
    return _layout("deepseek2", meta, tensors, expert_names)


def qwen3_235b(quant="Q4_K_M"):
    s, q = QWEN3_SHAPES, QUANTS[quant]
    e, hd = s["embd"], s["head_dim"]
    tensors = [("token_embd.weight", _bytes(s["vocab"] * e, q["other"])),
               ("output.weight", _bytes(s["vocab"] * e, q["other"])), ("output_norm.weight", e * 4)]
    expert_names = set()
    for n in range(s["layers"]):
        blk = "blk.%d." % n
        tensors += [
            (blk + "attn_norm.weight", e * 4), (blk + "ffn_norm.weight", e * 4),
            (blk + "attn_q_norm.weight", hd * 4), (blk + "attn_k_norm.weight", hd * 4),
            (blk + "attn_q.weight", _bytes(e * s["heads"] * hd, q["other"])),
            (blk + "attn_k.weight", _bytes(e * s["kv_heads"] * hd, q["other"])),
            (blk + "attn_v.weight", _bytes(e * s["kv_heads"] * hd, q["other"])),
            (blk + "attn_output.weight", _bytes(s["heads"] * hd * e, q["other"])),
            (blk + "ffn_gate_inp.weight", e * s["experts"] * 4),
        ]
        for w in ("gate", "up", "down"):
            name = blk + "ffn_%s_exps.weight" % w
            expert_names.add(name)
            tensors.append((name, _bytes(e * s["ff_exp"] * s["experts"], q["experts"])))
    meta = {"block_count": s["layers"], "head_count": s["heads"], "head_count_kv": s["kv_heads"],
            "key_length": hd, "value_length": hd, "embedding_length": e, "expert_count": s["experts"],
            "expert_used_count": 8, "name": "Qwen3 235B A22B " + quant}
    return _layout("qwen3moe", meta, tensors, expert_names)
