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
FP8 (the GEMMs of the transformer blocks; the attention core, LM head and embedding stay in bf16):
each quantised operand is memory-bound time at QUANT_BYTES of its recipe, and Hopper's forward
GEMMs compute at FP8_FAST_ACCUM_SPEEDUP times the measured (precise-accumulation) fp8 rate, their
operands moving as fast as before (gemm_time_s: P * g * s in the first term, I_half * s).
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

from planner.errors import SpecError
from planner.spec.efficiency import LegacyEfficiency
from planner.spec.hardware import Gpu
from planner.spec.measured import typical
from planner.spec.training import recipe_gpu_refusal

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


QUANT_BYTES = {
    # recipe (spec/training.FP8_RECIPES): {the GEMM needs a transposed copy:
    #     (bytes per element of an input no norm writes, of one a norm writes)}
    "delayed": {True: (4.0, 1.0), False: (3.0, 0.0)},
    "tensorwise": {True: (6.0, 4.0), False: (5.0, 3.0)},
    "blockwise": {True: (4.0625, 4.0625), False: (4.0625, 4.0625)},
    "mxfp8": {True: (4.0625, 4.0625), False: (4.0625, 4.0625)},
}
"""HBM bytes per element of quantising one GEMM operand to fp8, read from Transformer Engine
366798ef (the version Megatron-Bridge c810129 pins; its GroupedLinear and Linear quantise every
operand by a kernel of its own). Delayed scaling: one cast kernel reads the 16-bit tensor (2) and
writes the fp8 copy (1) and, where the GEMM needs the other layout, a transposed copy (1), the
amax of the same pass kept for the next step; a norm kernel writes its output in fp8 itself (1
byte instead of 2), so only the transposed copy is added (1 - 1 + 1 = 1; without it the norm
saves a byte, priced 0: the norm's own bytes stay as graph.py counts them).
Per-tensor current scaling needs the amax before it casts: an amax pass reads the tensor (2),
then the cast pass as above (2 + 1 + 1: 6); a norm kernel computes the amax of the output it
writes, leaving the cast pass (4). Block scaling (Hopper's 1x128 and 128x128, Blackwell's MXFP8
1x32) computes each block's scale in the cast kernel, writes both layouts (the blocks run along
different axes) and an e8m0 or fp32 scale per 32 or 128 elements: 2 + 1 + 1 + 1/16. Hopper and Ada tensor cores take
fp8 operands only K-major (the GEMM is TN: cuBLASLt's FP8 requirements), so the wgrad GEMM needs
transposed copies; Blackwell's take either layout."""


TRANSPOSING_FP8 = ("hopper", "ada")
"""families whose fp8 tensor-core GEMMs take K-major operands only (cuBLASLt: FP8 matmuls are TN)"""


def fp8_quant_bytes(recipe: str, gpu: Gpu) -> tuple[float, float]:
    """(bytes per element of a quantised input no norm writes, of one a norm writes) for an fp8
    recipe on this GPU (QUANT_BYTES); a recipe the GPU's family does not run is refused
    (spec/training.RECIPE_FAMILIES)."""
    refused = recipe_gpu_refusal(recipe, gpu)
    if refused:
        raise SpecError(refused)
    return QUANT_BYTES[recipe][gpu.family in TRANSPOSING_FP8]


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


FP8_FAST_ACCUM_SPEEDUP = 1.15
"""how much faster a Hopper fp8 GEMM runs with fast accumulation (no periodic promotion of the
tensor cores' partial sums to fp32) than without: 1.1x to 1.2x in a torchao user's benchmark
(pytorch/ao issue #2377, 2025-06-14), the middle taken. The published recipes accumulate fast in
the forward GEMMs only (Transformer Engine module/base.py: _2X_ACC_FPROP = False, dgrad and
wgrad True; torchao Float8LinearConfig: use_fast_accum in the forward's GEMM config only), and the
GPUs' measured fp8 fractions are torch._scaled_mm's default, without it (mamf-finder; Azure's
cuBLASLt sweep agrees, tests/test_cost_terms.py). Blackwell's tensor cores accumulate fp8 in
fp32 throughout: no such mode. Bound: the forward's fraction times it stays at most 1."""
FAST_ACCUM_FAMILIES = ("hopper",)
"""families whose fp8 GEMMs have a fast-accumulation mode (Hopper's tensor cores accumulate fp8
products in reduced precision unless promoted)"""


def fp8_forward_speedup(gpu: Gpu, precision: str, eff) -> float:
    """Forward GEMM compute rate over the measured one (FP8_FAST_ACCUM_SPEEDUP where it applies, capped so
    that the forward's fraction of peak stays <= 1); 1 elsewhere and under a version 1 block."""
    if precision != "fp8" or gpu.family not in FAST_ACCUM_FAMILIES or isinstance(eff, LegacyEfficiency):
        return 1.0
    return min(FP8_FAST_ACCUM_SPEEDUP, 1.0 / gemm_fraction(gpu, precision, eff))


def framework(eff) -> float:
    return 1.0 if isinstance(eff, LegacyEfficiency) else eff.framework_fraction


@lru_cache(maxsize=256)
def gemm_rate(gpu: Gpu, precision: str, eff) -> tuple[float, float]:
    """(FLOP/s of a GEMM far above the knee, its knee I_half)."""
    return gpu.flops(precision) * gemm_fraction(gpu, precision, eff) * framework(eff), intensity_half(gpu, precision, eff)


def gemm_time_s(flops, intensity, gpu: Gpu, precision: str, eff, forward: bool = False):
    """The roofline above; a `forward` GEMM computes fp8_forward_speedup times faster, its
    operands moving as fast as before: F / (s R) * (1 + s I_half / I), R the rate."""
    rate, knee = gemm_rate(gpu, precision, eff)
    fast = fp8_forward_speedup(gpu, precision, eff) if forward else 1.0
    return flops / (rate * fast) * (1.0 + fast * knee / intensity)


def memory_time_s(n_bytes, gpu: Gpu, eff):
    h = eff.hbm_fraction if isinstance(eff, LegacyEfficiency) else measured(gpu).hbm_fraction
    return n_bytes / (gpu.hbm_Bps * h) / framework(eff)


def quant_time_s(elements: tuple[float, float, float], quant: tuple[float, float] | None, gpu: Gpu,
                 eff) -> tuple[float, float]:
    """(forward, backward) seconds of an fp8 recipe's quantisation kernels, memory-bound:
    forward (plain * e_plain + fed * e_fed) bytes, backward plain * e_grad bytes (the output
    gradients, which no norm writes); graph.Work.quant_elements, `quant` from fp8_quant_bytes
    (None: nothing is quantised)."""
    if quant is None:
        return 0.0, 0.0
    e_plain, e_fed, e_grad = elements
    plain, fed = quant
    return memory_time_s(plain * e_plain + fed * e_fed, gpu, eff), memory_time_s(plain * e_grad, gpu, eff)


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
