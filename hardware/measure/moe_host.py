"""Measure the host time a small-expert MoE layer exposes, on one GPU: the suspect the cost model
leaves unpriced for Megatron-Bridge's Qwen3 FP8 rows (README, "Where the model is weakest").

Run on a GPU (PyTorch with CUDA; nothing else):

    python hardware/measure/moe_host.py > moe_host_<gpu>.json

A dropless MoE layer of Qwen3-30B-A3B's shape on one expert-parallel rank (hidden 2048, 128
experts top-8 of which 8 are local, expert FFN 768, SwiGLU), written as eager PyTorch the way a
dropless dispatcher runs it: router GEMM and top-k, a sort of the routed tokens by expert, the
per-expert token counts copied to the host (the synchronisation dropless routing needs to size
its GEMMs), one GEMM pair per local expert, the weighted scatter back. For micro-batches of 1,
2 and 4 sequences of 4096 tokens it times, forward and backward:
- wall: a layer call as the host sees it (synchronised at the end), median of repeats;
- busy: the sum of the layer's kernel times (torch.profiler's CUDA kernel events);
- kernels: how many kernels one call launches.
wall - busy is the time the GPU waits for the host. The cost model's fixed host time per layer
and micro-batch, were it priced, is the intercept of wall - busy against the micro-batch size
(Megatron-Bridge's archive suggests about 7.5 ms a layer on B200 without CUDA graphs). This is a
stand-in for Megatron-Core's TEGroupedMLP (no Transformer Engine here): its kernel count is a
lower bound of Megatron's, so its host time is too. Prints one JSON document.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time

HIDDEN, EXPERTS, TOP_K, LOCAL, FFN = 2048, 128, 8, 8, 768
"""Qwen3-30B-A3B (config.json: hidden_size 2048, num_experts 128, num_experts_per_tok 8,
moe_intermediate_size 768) on 16 expert-parallel ranks: 8 local experts"""
SEQ = 4096


def _layer(torch, x, router, w1, w2):
    """One dropless MoE layer on this rank's tokens (the all-to-all left out: one rank alone)."""
    logits = x @ router
    weights, chosen = torch.topk(torch.softmax(logits.float(), dim=-1), TOP_K, dim=-1)
    local = chosen % LOCAL  # balanced: every rank's experts get their share of the routed tokens
    flat = local.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=LOCAL).tolist()  # the host synchronisation
    routed = x.repeat_interleave(TOP_K, dim=0)[order]
    outs, start = [], 0
    for e, n in enumerate(counts):
        h = routed[start:start + n] @ w1[e]
        gate, up = h.chunk(2, dim=-1)
        outs.append((torch.nn.functional.silu(gate) * up) @ w2[e])
        start += n
    y = torch.empty_like(routed)
    y[order] = torch.cat(outs)
    y = y.view(-1, TOP_K, HIDDEN) * weights.to(y.dtype).unsqueeze(-1)
    return y.sum(dim=1)


def measure() -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        raise SystemExit("moe_host.py measures a GPU: no CUDA device is visible")
    dev, dt = torch.device("cuda"), torch.bfloat16
    router = torch.randn(HIDDEN, EXPERTS, device=dev, dtype=dt, requires_grad=True)
    w1 = torch.randn(LOCAL, HIDDEN, 2 * FFN, device=dev, dtype=dt, requires_grad=True)
    w2 = torch.randn(LOCAL, FFN, HIDDEN, device=dev, dtype=dt, requires_grad=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.date.today().isoformat(), "script": "hardware/measure/moe_host.py",
           "shape": {"hidden": HIDDEN, "experts": EXPERTS, "top_k": TOP_K, "local_experts": LOCAL, "ffn": FFN},
           "rows": []}
    for sequences in (1, 2, 4):
        x = torch.randn(sequences * SEQ, HIDDEN, device=dev, dtype=dt, requires_grad=True)

        def step():
            _layer(torch, x, router, w1, w2).sum().backward()

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        walls = []
        for _ in range(20):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy = sum(e.device_time for e in kernels) / 1e6  # device_time is in microseconds
        wall = statistics.median(walls)
        out["rows"].append({"tokens": sequences * SEQ, "wall_s": wall, "busy_s": busy, "host_exposed_s": wall - busy,
                            "kernels": len(kernels)})
    return out


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
