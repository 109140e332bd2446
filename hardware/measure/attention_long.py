"""Measure flash-attention throughput beyond the published tables' 16k tokens, on one GPU: what
the cost model holds flat past 16384 (spec/measured.AttentionTable.tflops), where five long-
context check rows (32k-128k, with and without context parallelism) come out 9-16 % fast
(README, "Where the model is weakest").

Run on a GPU (PyTorch with CUDA; nothing else):

    python hardware/measure/attention_long.py > attention_long_<gpu>.json

For PyTorch's scaled_dot_product_attention with each backend it can force (FLASH_ATTENTION:
FlashAttention-2; CUDNN_ATTENTION: cuDNN fused attention), causal and not, head dimension 128,
bf16, it times the forward and the backward at sequence lengths 2k to 128k: 16k tokens a batch
up to 16k (the FlashAttention papers' convention, so the first rows compare with the preset's
table), one sequence beyond. Heads: 32 (a 7-8B model on one GPU) and 8 (the same under tensor
parallelism 4). The TFLOP/s are the papers' convention: forward 4 * batch * seq^2 * heads *
head_dim, halved when causal; backward 2.5x the forward; forward+backward = 3.5 * F / time.
Prints one JSON document: device, torch and CUDA versions, the date, each row.
"""

from __future__ import annotations

import datetime
import json
import sys

from cuda_timer import time_s

HEAD_DIM = 128
SEQS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
TOKENS_A_BATCH = 16384
HEADS = (32, 8)


def _row(torch, backend, seq: int, heads: int, causal: bool) -> dict:
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    batch = max(1, TOKENS_A_BATCH // seq)
    shape = (batch, heads, seq, HEAD_DIM)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    flops_fwd = 4.0 * batch * seq * seq * heads * HEAD_DIM * (0.5 if causal else 1.0)
    repeats = max(3, min(30, int(2e13 / flops_fwd)))
    row = {"backend": backend.name, "seq": seq, "batch": batch, "heads": heads, "causal": causal}
    try:
        with sdpa_kernel(backend):
            out = sdpa(q, k, v, is_causal=causal)
            grad = torch.randn_like(out)
            fwd = time_s(lambda: sdpa(q, k, v, is_causal=causal), repeats, warmup=2)

            def both():
                o = sdpa(q, k, v, is_causal=causal)
                o.backward(grad)

            total = time_s(both, repeats, warmup=2)
    except RuntimeError as e:  # the backend refuses this shape on this GPU
        row["error"] = str(e).splitlines()[0][:200]
        return row
    bwd = max(total - fwd, 1e-12)
    row.update(fwd_tflops=flops_fwd / fwd / 1e12, bwd_tflops=2.5 * flops_fwd / bwd / 1e12,
               fwd_bwd_tflops=3.5 * flops_fwd / total / 1e12)
    return row


def measure() -> dict:
    import torch
    from torch.nn.attention import SDPBackend
    if not torch.cuda.is_available():
        raise SystemExit("attention_long.py measures a GPU: no CUDA device is visible")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "date": datetime.date.today().isoformat(),
           "script": "hardware/measure/attention_long.py", "head_dim": HEAD_DIM, "rows": []}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for heads in HEADS:
            for causal in (True, False):
                for seq in SEQS:
                    out["rows"].append(_row(torch, backend, seq, heads, causal))
                    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    json.dump(measure(), sys.stdout, indent=1)
    print()
