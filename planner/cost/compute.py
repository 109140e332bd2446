"""Time of FLOPs and bytes on one GPU, from the GPU's measured kernel figures (spec/measured.py).

GEMM (a smooth roofline: the kernel moves its operands, then computes, Williams et al. 2009):
  t = F / (P * g) * (1 + I_half / I) / k,   I_half = P * g / (B * h) * (e / 2)
with F the FLOPs, P the dense peak of the precision, g the GPU's measured best GEMM fraction of
that precision, I = m*n*k / (m*k + k*n + m*n) the GEMM's FLOPs per byte of 2-byte operands,
B the datasheet HBM bandwidth, h its measured fraction, e the operand bytes (1 for fp8), and k
the cluster's fitted framework_fraction. Nothing in I_half is fitted: it is where the memory
time equals the compute time. (Checked against cuBLASLt's published square-GEMM sweep in
tests/test_cost_terms.py.)
Memory-bound ops: t = bytes / (B * h) / k.
Attention core (flash kernels): t_fwd+bwd = 3.5 * F_fwd / T / k, T the kernel's measured
forward+backward TFLOP/s at the layer's head dimension and the sequence length one kernel call
sees (s / cp under context parallelism), in the FlashAttention papers' convention (backward 2.5x
the forward, causal FLOPs counted at half, as graph.py counts them); split 1 : 2.5 between
forward and backward. Without a measured table the core is priced as a GEMM.

A version 1 efficiency block (spec/efficiency.LegacyEfficiency) prices as it always did: its own
GEMM fraction and half-intensity, its HBM fraction, attention as a GEMM, no framework fraction.
"""

from __future__ import annotations

from functools import lru_cache

from planner.spec.efficiency import LegacyEfficiency
from planner.spec.hardware import Gpu
from planner.spec.measured import typical

FLASH_BWD_FACTOR = 2.5
"""FlashAttention backward FLOPs over its forward's: 5 matmuls of the forward's 2 (Dao 2023, §3.1)"""
FLASH_FWD_BWD_FACTOR = 1 + FLASH_BWD_FACTOR


def attention_bwd_factor(flash: bool) -> float:
    """Backward time of an attention core over its forward where it is priced as a GEMM: flash
    recomputes the scores (FLASH_BWD_FACTOR), eager runs twice the forward's matmuls."""
    return FLASH_BWD_FACTOR if flash else 2.0
HIGH_PRECISION = "bf16"
"""what stays out of fp8 in the published FP8 recipes: the attention core, the LM head and the
embedding (Transformer Engine's fp8_autocast covers the transformer blocks' linear layers;
torchao's float8 conversion skips the output layer)"""


def outside_fp8(precision: str, eff) -> str:
    """The precision of the GEMMs that published FP8 recipes keep in HIGH_PRECISION (the
    attention core, the LM head); a version 1 block priced them at the run's precision."""
    return precision if isinstance(eff, LegacyEfficiency) or precision != "fp8" else HIGH_PRECISION


def measured(gpu: Gpu):
    """The GPU's kernel measurements, or its family flagship's (spec/measured.typical)."""
    return gpu.measured if gpu.measured is not None else typical(gpu.family)


def gemm_fraction(gpu: Gpu, precision: str, eff) -> float:
    if isinstance(eff, LegacyEfficiency):
        return eff.gemm_peak_fraction
    m = measured(gpu)
    return m.gemm(precision) or typical(gpu.family).gemm(precision) or m.gemm("bf16")


def intensity_half(gpu: Gpu, precision: str, eff) -> float:
    """FLOPs per byte at which a GEMM's memory time equals its compute time (see above)."""
    if isinstance(eff, LegacyEfficiency):
        return eff.gemm_intensity_half
    operand_bytes = 1 if precision == "fp8" else 2
    return (gpu.flops(precision) * gemm_fraction(gpu, precision, eff)
            / (gpu.hbm_Bps * measured(gpu).hbm_fraction) * operand_bytes / 2)


def framework(eff) -> float:
    return 1.0 if isinstance(eff, LegacyEfficiency) else eff.framework_fraction


@lru_cache(maxsize=256)
def gemm_rate(gpu: Gpu, precision: str, eff) -> tuple[float, float]:
    """(FLOP/s of a GEMM far above the knee, its knee I_half)."""
    return gpu.flops(precision) * gemm_fraction(gpu, precision, eff) * framework(eff), intensity_half(gpu, precision, eff)


def gemm_time_s(flops, intensity, gpu: Gpu, precision: str, eff):
    rate, knee = gemm_rate(gpu, precision, eff)
    return flops / rate * (1.0 + knee / intensity)


def memory_time_s(n_bytes, gpu: Gpu, eff):
    h = eff.hbm_fraction if isinstance(eff, LegacyEfficiency) else measured(gpu).hbm_fraction
    return n_bytes / (gpu.hbm_Bps * h) / framework(eff)


def attention_time_s(flops: float, kernel: str, causal: bool, head_dim: float, seq_len: float, gpu: Gpu,
                     eff) -> tuple[float, float] | None:
    """(forward, backward) seconds of a flash attention core of `flops` forward FLOPs with the
    kernel's measured throughput; None when the GPU has no table for it (price it as a GEMM)."""
    if isinstance(eff, LegacyEfficiency) or gpu.measured is None:
        return None
    tflops = gpu.measured.attention_tflops(kernel, causal, head_dim, seq_len)
    if not tflops:
        return None
    total = FLASH_FWD_BWD_FACTOR * flops / (tflops * 1e12) / eff.framework_fraction
    return total / FLASH_FWD_BWD_FACTOR, total * FLASH_BWD_FACTOR / FLASH_FWD_BWD_FACTOR
