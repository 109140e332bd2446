"""Measure what the cost model's FP8 GEMM fraction and FP8 cast cost rest on, on one GPU.

Run on the GPU a preset describes (PyTorch with CUDA; nothing else):

    python hardware/measure/fp8_gemm.py > fp8_gemm_<gpu>.json

It times, at the GEMM shapes training runs (M tokens x N out x K in):
- bf16 torch.matmul;
- FP8 torch._scaled_mm with use_fast_accum False and True: mamf-finder's figure (the preset's
  gemm_fraction fp8) is the first, while Transformer Engine runs forward GEMMs with fast
  accumulation (transformer_engine/pytorch/module/base.py _2X_ACC_FPROP = False) and its dgrad
  and wgrad GEMMs without;
- the cast of a bf16 activation to FP8 with a per-tensor amax (current scaling: amax, then
  scale and cast), and with a given scale (delayed scaling), as bytes moved per element over
  the measured copy bandwidth.
and prints one JSON document: the device, torch and CUDA versions, the date, and each figure.
The figures go into the GPU preset's `measured:` block with this script's name as their source.
"""

from __future__ import annotations

import datetime
import json
import sys

from cuda_timer import time_s

SHAPES = ((8192, 8192, 8192), (4096, 7168, 16384), (16384, 8192, 28672), (16384, 28672, 8192),
          (4096, 1536, 2048), (4096, 2048, 768), (8192, 10240, 8192))
"""(M, N, K): square, DeepGEMM's dense shape, Llama-70B fc1/fc2 at 16k tokens, small MoE experts
(Qwen3-30B's 768- and 1536-wide), a fused QKV"""


def measure() -> dict:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("fp8_gemm.py measures a GPU: no CUDA device is visible")
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.date.today().isoformat(), "script": "hardware/measure/fp8_gemm.py", "gemms": []}
    one = torch.tensor(1.0, device=dev)
    fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
    has_fp8 = bool(torch.version.hip) or torch.cuda.get_device_capability() >= (8, 9)  # Ada, Hopper and later
    out["fp8"] = str(fp8) if has_fp8 else "none (compute capability below 8.9)"
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "bf16_tflops": flops / time_s(lambda: a @ b.t()) / 1e12}
        out["gemms"].append(row)
        if not has_fp8:
            continue
        a8, b8 = a.to(fp8), b.to(fp8)
        for fast in (False, True):
            t = time_s(lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16,
                                                 use_fast_accum=fast))
            row[f"fp8_{'fast' if fast else 'split'}_accum_tflops"] = flops / t / 1e12
    x = torch.randn(16384, 8192, device=dev, dtype=torch.bfloat16)
    copy_s = time_s(lambda: x.clone())
    copy_Bps = 2 * 2 * x.numel() / copy_s  # read and write 2 bytes an element
    if not has_fp8:
        return out
    current = time_s(lambda: (x * (448.0 / x.abs().amax())).to(fp8))
    delayed = time_s(lambda: (x * 0.5).to(fp8))
    out["casts"] = {"elements": x.numel(), "copy_GBps": copy_Bps / 1e9,
                    "current_scaling_bytes_per_element": current * copy_Bps / x.numel(),
                    "delayed_scaling_bytes_per_element": delayed * copy_Bps / x.numel(),
                    "note": "eager PyTorch casts (no transposed copy): an upper bound of Transformer Engine's fused "
                            "cast kernels, a lower bound of what a transposed copy adds"}
    return out


if __name__ == "__main__":
    json.dump(measure(), sys.stdout, indent=2)
    print()
