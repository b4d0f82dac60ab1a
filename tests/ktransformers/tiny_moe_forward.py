#!/usr/bin/env python3
"""Runs a tiny DeepSeek-V3-style MoE (make_tiny_moe_safetensors.py) through kt-kernel's own wrapper and checks
every MoE layer against a float32 torch reference. Run with the build's venv python on the node or twin.

Per MoE layer: DeepSeek-V3's router (sigmoid scores, e_score_correction_bias for the choice, the chosen scores
normalised and scaled by routed_scaling_factor) picks the experts in torch; kt_kernel.KTMoEWrapper with
method BF16 loads the routed experts from the safetensors folder itself (its BF16SafeTensorLoader) and computes
them through submit_forward/sync_forward; the shared expert is added in torch. The reference computes the same
layer from the same file in float32.

On a CPU-only build two things the wrapper expects from a GPU node are replaced, and only these: the CUDA
stream (CPUInfer.submit_with_cuda_stream/sync_with_cuda_stream enqueue the task on a stream's host callback;
here the task is submitted directly, which is what that callback does), and pinned host buffers (a CPU-only
torch cannot pin memory, so the wrapper's buffers are allocated unpinned).

  tiny_moe_forward.py MODEL_DIR [--threads N] [--tokens 1,7] [--tolerance 0.02] [--out RESULT.json]
Writes the result as JSON (to --out, else stdout: kt-kernel prints its own lines there too); exit status 1 when
a layer differs by more than the tolerance.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file


class _Unpinned:
    """The torch module as the wrapper's buffers see it, with pin_memory turned off (CPU-only torch)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        attr = getattr(self._module, name)
        if name in ("zeros", "empty", "full", "ones"):
            def unpinned(*args, **kwargs):
                kwargs.pop("pin_memory", None)
                return attr(*args, **kwargs)
            return unpinned
        return attr


class _CpuStream:
    """CPUInfer with the CUDA-stream entry points served by the synchronous ones (no GPU stream here)."""

    def __init__(self, inner):
        self._inner = inner

    def submit_with_cuda_stream(self, _stream, task):
        self._inner.submit(task)

    def sync_with_cuda_stream(self, _stream, allow_pending=0):
        self._inner.sync(allow_pending)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def load_weights(model_dir):
    tensors = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model_dir, name)))
    return tensors


def route(x, gate_w, bias, cfg):
    scores = torch.sigmoid(x.float() @ gate_w.float().t())
    chosen = torch.topk(scores + bias.float(), k=cfg["num_experts_per_tok"], dim=-1).indices
    weights = torch.gather(scores, 1, chosen)
    if cfg.get("norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return chosen, (weights * cfg.get("routed_scaling_factor", 1.0)).float().contiguous()


def mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.t()) * (x @ up.t())) @ down.t()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", default="1,7")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--out")
    args = parser.parse_args()

    import kt_kernel
    from kt_kernel import experts_base
    from kt_kernel import KTMoEWrapper

    cpu_only = not hasattr(kt_kernel.kt_kernel_ext.CPUInfer, "submit_with_cuda_stream")
    if cpu_only:
        experts_base.torch = _Unpinned(torch)

    with open(os.path.join(args.model_dir, "config.json")) as handle:
        cfg = json.load(handle)
    weights = load_weights(args.model_dir)
    torch.manual_seed(0)
    results, worst = [], 0.0
    layers = range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"])
    for layer in layers:
        base = "model.layers.%d.mlp" % layer
        wrapper = KTMoEWrapper(
            layer_idx=layer, num_experts=cfg["n_routed_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
            hidden_size=cfg["hidden_size"], moe_intermediate_size=cfg["moe_intermediate_size"], gpu_experts_mask=None,
            cpuinfer_threads=args.threads, threadpool_count=1, weight_path=args.model_dir, chunked_prefill_size=64,
            method="BF16")
        if cpu_only:
            wrapper.cpu_infer = _CpuStream(wrapper.cpu_infer)
        wrapper.load_weights(torch.arange(cfg["n_routed_experts"], dtype=torch.int64))
        for tokens in [int(t) for t in args.tokens.split(",")]:
            x = (torch.randn(tokens, cfg["hidden_size"]) / 4).to(torch.bfloat16)
            ids, topk_w = route(x, weights[base + ".gate.weight"], weights[base + ".gate.e_score_correction_bias"], cfg)
            routed = wrapper.forward(x, ids, topk_w, 0).float().clone()
            shared = mlp(x.float(), *(weights["%s.shared_experts.%s.weight" % (base, p)].float()
                                      for p in ("gate_proj", "up_proj", "down_proj")))
            reference = torch.zeros(tokens, cfg["hidden_size"])
            for t in range(tokens):
                for k in range(cfg["num_experts_per_tok"]):
                    e = int(ids[t, k])
                    reference[t] += topk_w[t, k] * mlp(x[t:t + 1].float(), *(
                        weights["%s.experts.%d.%s.weight" % (base, e, p)].float()
                        for p in ("gate_proj", "up_proj", "down_proj")))[0]
            diff = float((routed - reference).abs().mean() / (reference.abs().mean() + 1e-8))
            layer_diff = float(((routed + shared) - (reference + shared)).abs().mean()
                               / ((reference + shared).abs().mean() + 1e-8))
            worst = max(worst, diff)
            results.append({"layer": layer, "tokens": tokens, "routed_rel_diff": round(diff, 6),
                            "layer_rel_diff": round(layer_diff, 6), "experts": ids.tolist(),
                            "nonzero": bool(routed.abs().sum() > 0)})
    ok = worst <= args.tolerance and all(r["nonzero"] for r in results)
    result = json.dumps({"ok": ok, "worst_rel_diff": round(worst, 6), "tolerance": args.tolerance,
                         "cpu_variant": kt_kernel.__cpu_variant__, "cpu_only_adapters": cpu_only,
                         "torch": torch.__version__, "layers": results}, sort_keys=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(result + "\n")
    else:
        print(result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
