"""Measure the activation memory of Llama decoder layers under torchtitan's activation
checkpointing policies, eager and compiled, on one GPU: what the memory model's torchtitan rows
rest on (README, "Where the model is weakest": torchtitan's logged peaks; its check rows encode
the selective 'op' policy as full recomputation of every other layer).

Run on a GPU (PyTorch with CUDA; nothing else):

    python hardware/measure/block_memory.py > block_memory_<gpu>.json

A stack of LAYERS Llama 3 8B layers (hidden 4096, 32 heads, 8 KV heads, FFN 14336, RMSNorm
written as torchtitan's eager ops, complex RoPE, SDPA, SwiGLU), bf16 weights, one micro-batch of
MICRO_BATCH x SEQ tokens. For each checkpointing mode
- none: autograd keeps what it keeps;
- full: torch.utils.checkpoint around each layer (non-reentrant), saving only its input;
- op: selective checkpointing with torchtitan's op policy (torchtitan 9dec370
  parallelize_llama.py _apply_ac_to_transformer_block: save the outputs of mm (every other one,
  counted per layer), the flash and efficient SDPA kernels, abs and max; recompute the rest);
- every2: full checkpointing of every other layer (the check rows' encoding of 'op');
eager and under torch.compile of each layer, it reads torch.cuda.memory_allocated after the
forward (less the input, weights and output: the saved bytes) and max_memory_allocated over the
forward and backward (which holds the layers' bf16 weight gradients too), and reports both per
token and layer. Prints one JSON document.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections import defaultdict

from torchtitan_ops import rms_norm

HIDDEN, HEADS, KV_HEADS, FFN = 4096, 32, 8, 14336
LAYERS, MICRO_BATCH, SEQ = 4, 2, 8192


def _model(torch, nn, F):
    head_dim = HIDDEN // HEADS

    RMSNorm = rms_norm(torch, nn, HIDDEN)

    def rope(x, freqs):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.wk = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.wv = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.wo = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
            self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
            self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

        def forward(self, x, freqs):
            b, s, _ = x.shape
            h = self.attention_norm(x)
            q = rope(self.wq(h).view(b, s, HEADS, head_dim), freqs)
            k = rope(self.wk(h).view(b, s, KV_HEADS, head_dim), freqs)
            v = self.wv(h).view(b, s, KV_HEADS, head_dim)
            rep = HEADS // KV_HEADS
            k, v = (t.repeat_interleave(rep, dim=2) for t in (k, v))  # torchtitan repeat_kv
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(b, s, HIDDEN))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    return Layer


def _op_policy(torch):
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )
    ops = torch.ops.aten
    save = {ops.mm.default, ops._scaled_dot_product_efficient_attention.default,
            ops._scaled_dot_product_flash_attention.default, ops.abs.default, ops.max.default}

    def context():
        meta = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == ops.mm.default:
                meta[key] += 1
            keep = func in save and not (func == ops.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context


def _run(torch, layers, freqs, mode: str, compiled: bool) -> dict:
    from torch.utils.checkpoint import checkpoint
    ctx_fn = _op_policy(torch)
    calls = [torch.compile(layer) if compiled else layer for layer in layers]

    def forward(x):
        for i, call in enumerate(calls):
            if mode == "full" or mode == "every2" and i % 2 == 0:
                x = checkpoint(call, x, freqs, use_reentrant=False)
            elif mode == "op":
                x = checkpoint(call, x, freqs, use_reentrant=False, context_fn=ctx_fn)
            else:
                x = call(x, freqs)
        return x

    def step():
        x = torch.randn(MICRO_BATCH, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = forward(x)
        torch.cuda.synchronize()
        saved = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        for p in (p for layer in layers for p in layer.parameters()):
            p.grad = None
        return saved, peak

    step()  # compile and warm the allocator outside the reading
    saved, peak = step()
    per = LAYERS * MICRO_BATCH * SEQ
    return {"mode": mode, "compiled": compiled, "saved_bytes": saved, "peak_bytes": peak,
            "saved_bytes_per_token_layer": saved / per, "peak_bytes_per_token_layer": peak / per}


def measure() -> dict:
    import torch
    import torch.nn.functional as F
    from torch import nn
    if not torch.cuda.is_available():
        raise SystemExit("block_memory.py measures a GPU: no CUDA device is visible")
    Layer = _model(torch, nn, F)
    layers = [Layer().to("cuda", torch.bfloat16) for _ in range(LAYERS)]
    head_dim = HIDDEN // HEADS
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    freqs = torch.polar(torch.ones(SEQ, head_dim // 2, device="cuda"),
                        torch.outer(torch.arange(SEQ, device="cuda").float(), inv)).view(1, SEQ, 1, head_dim // 2)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.date.today().isoformat(), "script": "hardware/measure/block_memory.py",
           "shape": {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN, "layers": LAYERS,
                     "micro_batch": MICRO_BATCH, "seq": SEQ}, "rows": []}
    for compiled in (False, True):
        for mode in ("none", "full", "op", "every2"):
            try:
                out["rows"].append(_run(torch, layers, freqs, mode, compiled))
            except RuntimeError as e:  # a mode this torch cannot compile (dynamo errors are RuntimeErrors): say so, go on
                out["rows"].append({"mode": mode, "compiled": compiled, "error": f"{type(e).__name__}: {e}"[:300]})
            torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    json.dump(measure(), sys.stdout, indent=1)
    print()
