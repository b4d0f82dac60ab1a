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


def r1(quant="IQ4_XS", shapes=None, bits=None):
    """DeepSeek-R1 at `quant`; `shapes` / `bits` build another deepseek2 model (Kimi-K2, V3.1) the same way."""
    s, q = shapes or R1_SHAPES, bits or QUANTS[quant]
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


# ------------------------------------------------------------------------------------- the catalog's other models
# Shapes from each model's config.json (and, for GLM, the GGUF header ollama shows); the GGUF block_count counts
# GLM's one NextN layer, whose tensors the file carries like any MoE layer:
# - Kimi-K2-Thinking (deepseek2): 61 layers, 1 dense, 384 experts + 1 shared, n_embd 7168, MLA with 64 heads,
#   vocab 163840 - https://haimaker.ai/models/moonshotai/kimi-k2.6 (same K2 backbone),
#   https://docs.nvidia.com/nemo/megatron-bridge/latest/apidocs/bridge/bridge.models.kimi.kimi_provider.html
# - DeepSeek-V3.1 (deepseek2): R1's shapes (R1_SHAPES).
# - GLM-4.6 (glm4moe): 92 layers + 1 NextN = block_count 93, 3 dense, 160 experts + 1 shared, n_embd 5120,
#   96 heads / 8 KV heads of 128, vocab 151552 - https://huggingface.co/zai-org/GLM-4.7/blob/refs%2Fpr%2F49/config.json
#   (GLM-4.7 keeps 4.6's shapes), https://ollama.com/MichelRosselli/GLM-4.6:latest/blobs/579108167db6
# - Qwen3-Coder-480B-A35B (qwen3moe): 62 layers, 160 experts, n_embd 6144, 96 heads / 8 KV heads of 128,
#   moe_intermediate 2560, vocab 151936 - https://apxml.com/zh/models/qwen3-coder-480b-a35b
# - gpt-oss-120b (gpt-oss): 36 layers, 128 experts (4 used), n_embd 2880, 64 heads / 8 KV heads of 64,
#   vocab 201088 - https://debuggercafe.com/gpt-oss-inference-with-llama-cpp
# - MiniMax-M2 (minimax-m2): 62 layers, 256 experts, n_embd 3072, 48 heads / 8 KV heads of 128, vocab 200064 -
#   https://huggingface.co/QuixiAI/MiniMax-M2.1-bf16/blob/main/config.json (M2.1 keeps M2's shapes)
KIMI_K2_SHAPES = dict(R1_SHAPES, layers=61, dense=1, experts=384, heads=64, vocab=163840)
GLM46_SHAPES = {"embd": 5120, "layers": 93, "dense": 3, "ff_dense": 12288, "ff_exp": 1536, "experts": 160, "shared": 1,
                "heads": 96, "kv_heads": 8, "head_dim": 128, "vocab": 151552}
QWEN3_CODER_SHAPES = {"embd": 6144, "layers": 62, "dense": 0, "ff_exp": 2560, "experts": 160, "shared": 0,
                      "heads": 96, "kv_heads": 8, "head_dim": 128, "vocab": 151936}
GPT_OSS_120B_SHAPES = {"embd": 2880, "layers": 36, "dense": 0, "ff_exp": 2880, "experts": 128, "shared": 0,
                       "heads": 64, "kv_heads": 8, "head_dim": 64, "vocab": 201088}
MINIMAX_M2_SHAPES = {"embd": 3072, "layers": 62, "dense": 0, "ff_exp": 1536, "experts": 256, "shared": 0,
                     "heads": 48, "kv_heads": 8, "head_dim": 128, "vocab": 200064}

# The catalog quants' bits per weight (routed experts, everything else), chosen so the file set comes out at the
# size its publisher shows (see the catalog entry's comment); where none shows it, the Q4_K_M mix above.
CATALOG_QUANTS = {
    # ubergarm's Q4_X: q4_0 routed experts (the model's own int4 QAT), q8_0 elsewhere; 543.617 GiB published.
    "Q4_X": {"experts": 4.5, "other": 8.5},
    # unsloth UD-Q2_K_XL of DeepSeek-V3.1: 256 GB published.
    "UD-Q2_K_XL": {"experts": 2.95, "other": 6.5},
    # unsloth UD-Q3_K_XL of GLM-4.6: 158 GB published.
    "UD-Q3_K_XL": {"experts": 3.45, "other": 5.5},
    # MXFP4 experts (4.25 bpw: 32 four-bit values + one e8m0 scale), the rest bf16, as ggml-org publishes gpt-oss.
    "MXFP4": {"experts": 4.25, "other": 16.0},
    "UD-Q4_K_XL": QUANTS["Q4_K_M"],
}


def _gqa_moe(arch, s, q, used, name):
    """A GQA-attention MoE model (glm4moe, qwen3moe, gpt-oss, minimax-m2): optional leading dense layers, optional
    shared experts; norms and the router in f32."""
    e, hd = s["embd"], s["head_dim"]
    tensors = [("token_embd.weight", _bytes(s["vocab"] * e, q["other"])),
               ("output.weight", _bytes(s["vocab"] * e, q["other"])), ("output_norm.weight", e * 4)]
    expert_names = set()
    for n in range(s["layers"]):
        blk = "blk.%d." % n
        tensors += [
            (blk + "attn_norm.weight", e * 4), (blk + "ffn_norm.weight", e * 4),
            (blk + "attn_q.weight", _bytes(e * s["heads"] * hd, q["other"])),
            (blk + "attn_k.weight", _bytes(e * s["kv_heads"] * hd, q["other"])),
            (blk + "attn_v.weight", _bytes(e * s["kv_heads"] * hd, q["other"])),
            (blk + "attn_output.weight", _bytes(s["heads"] * hd * e, q["other"])),
        ]
        if n < s["dense"]:
            tensors += [(blk + "ffn_%s.weight" % w, _bytes(e * s["ff_dense"], q["other"])) for w in ("gate", "up", "down")]
            continue
        tensors.append((blk + "ffn_gate_inp.weight", e * s["experts"] * 4))
        for w in ("gate", "up", "down"):
            name_w = blk + "ffn_%s_exps.weight" % w
            expert_names.add(name_w)
            tensors.append((name_w, _bytes(e * s["ff_exp"] * s["experts"], q["experts"])))
            if s["shared"]:
                tensors.append((blk + "ffn_%s_shexp.weight" % w, _bytes(e * s["ff_exp"] * s["shared"], q["other"])))
    meta = {"block_count": s["layers"], "head_count": s["heads"], "head_count_kv": s["kv_heads"],
            "key_length": hd, "value_length": hd, "embedding_length": e, "expert_count": s["experts"],
            "expert_used_count": used, "leading_dense_block_count": s["dense"], "name": name}
    return _layout(arch, meta, tensors, expert_names)


def _mla_moe(s, q, name):
    """A DeepSeek-V3-shaped model (deepseek2) with other layer/expert counts: r1()'s tensor table on `s`."""
    layout = r1(shapes=s, bits=q)
    layout["metadata"]["name"] = name
    return layout


def kimi_k2_thinking(quant="Q4_X"):
    return _mla_moe(KIMI_K2_SHAPES, CATALOG_QUANTS[quant], "Kimi K2 Thinking " + quant)


def deepseek_v31(quant="UD-Q2_K_XL"):
    return _mla_moe(R1_SHAPES, CATALOG_QUANTS[quant], "DeepSeek V3.1 " + quant)


def glm46(quant="UD-Q3_K_XL"):
    return _gqa_moe("glm4moe", GLM46_SHAPES, CATALOG_QUANTS[quant], 8, "GLM 4.6 " + quant)


def qwen3_coder_480b(quant="UD-Q4_K_XL"):
    return _gqa_moe("qwen3moe", QWEN3_CODER_SHAPES, CATALOG_QUANTS[quant], 8, "Qwen3 Coder 480B A35B " + quant)


def gpt_oss_120b(quant="MXFP4"):
    return _gqa_moe("gpt-oss", GPT_OSS_120B_SHAPES, CATALOG_QUANTS[quant], 4, "gpt-oss 120b " + quant)


def minimax_m2(quant="UD-Q4_K_XL"):
    return _gqa_moe("minimax-m2", MINIMAX_M2_SHAPES, CATALOG_QUANTS[quant], 8, "MiniMax M2 " + quant)
