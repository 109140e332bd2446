"""Bytes per GPU: weights, gradients, optimizer states, activations, other.

Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3): 16-bit weights (2 bytes per parameter),
gradients kept in fp32 as Megatron's main_grad buffers (4), fp32 master weights and two Adam
moments (12). ZeRO-1 shards the 12 bytes over the data-parallel group, ZeRO-2 the gradients too,
ZeRO-3 the weights too; with bf16 moments a sharded optimizer keeps 6 or 8 (optimizer_bytes).
Korthikanti et al. 2022's own accounting is 2 + 4 + 12 = 18 bytes per parameter of the transformer
layers' GEMM weights.

`other` is what a real runtime adds: the CUDA context and library workspaces (cuBLAS, NCCL),
ZeRO-3's prefetched full layers, and an allocator fragmentation allowance on activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.units import GIB

WEIGHT_BYTES = 2
GRAD_BYTES = 4
MASTER_BYTES = 4
"""an fp32 master weight"""
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
"""bytes of each of Adam's two moments by their dtype (spec/training.OPTIMIZER_STATES)"""
OPTIMIZER_BYTES = MASTER_BYTES + 2 * MOMENT_BYTES["fp32"]
"""fp32 master weights and Adam's two fp32 moments, per parameter (12)"""
REMAINDER_BYTES = 2
"""the fp32 master weight of a bf16 parameter kept as its low 16 bits beside the bf16 weight
(Transformer Engine FusedAdam store_param_remainders, megatron-core OptimizerConfig's default,
from TE 2.1)"""
ADAM_OTHER_BYTES = 14
"""HBM traffic of a fused Adam step per parameter besides reading and writing its states: read
the gradient (4), write the 16-bit weight (2), the gradient-norm read and the zeroing (8)"""
RUNTIME_RESERVED_BYTES = 1.0 * GIB
"""CUDA context (~0.5 GiB) plus cuBLAS and NCCL workspaces, as PyTorch reports them reserved"""
FRAGMENTATION = 0.05
"""caching-allocator overhead on activations (fraction), an allowance, not a measurement"""


def capacity_bytes(cluster, setup) -> float:
    """Bytes a plan may use on each GPU: what the framework can allocate (the GPU spec's
    memory_gib) less the setup's memory_headroom."""
    return cluster.gpu.memory_bytes * (1.0 - setup.memory_headroom)


MEMORY_KEYS = ("weights", "grads", "optimizer", "activations", "other")


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other


def optimizer_bytes(states: str, precision: str) -> float:
    """Bytes per parameter a sharded optimizer (ZeRO >= 1) keeps for Adam with its moments in
    `states` (spec/training.OPTIMIZER_STATES; '' = fp32): OPTIMIZER_BYTES with fp32 moments; with
    bf16 ones (Megatron's precision-aware optimizer, Transformer Engine's FusedAdam: megatron-core
    0.16.0 optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups) two 2-byte moments
    beside the master weight, which TE keeps as REMAINDER_BYTES beside a bf16 weight and
    megatron-core keeps whole (MASTER_BYTES) in an fp8 run: 6 bytes in bf16, 8 in fp8. (An fp8
    run under delayed scaling without fp8 weights hands TE its master weights too
    (use_precision_aware_optimizer_no_fp8_or_ds_fp8), so it keeps 6: priced at 8, the safe side.)"""
    if states in ("", "fp32"):
        return OPTIMIZER_BYTES
    master = REMAINDER_BYTES if precision == "bf16" else MASTER_BYTES
    return master + 2 * MOMENT_BYTES[states]


def kept_optimizer_bytes(optimizer: float, zero):
    """Bytes per parameter the optimizer keeps at ZeRO stage `zero` (an array or a stage): the
    `optimizer` bytes a sharded one keeps (optimizer_bytes) from ZeRO-1 on, OPTIMIZER_BYTES
    below (Megatron's precision-aware optimizer needs its distributed one)."""
    return from_stage(zero, 1, optimizer, OPTIMIZER_BYTES)


def adam_traffic_bytes(optimizer: float, zero):
    """HBM bytes per parameter of one fused Adam step over the states kept_optimizer_bytes
    keeps: read and write them, plus ADAM_OTHER_BYTES; 38 with fp32 states."""
    return 2 * kept_optimizer_bytes(optimizer, zero) + ADAM_OTHER_BYTES


def state_bytes(params: float, zero: int, shards: int, grad_bytes: int,
                optimizer: float) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of `params` parameters replicated over `shards` ranks
    (zero may be an array of ZeRO stages, one per candidate), `grad_bytes` a gradient element
    (cost/step.dp_grad_bytes), `optimizer` the bytes a sharded optimizer keeps a parameter
    (optimizer_bytes; kept_optimizer_bytes says what each stage keeps)."""
    weights = WEIGHT_BYTES * params / from_stage(zero, 3, shards, 1)
    grads = grad_bytes * params / from_stage(zero, 2, shards, 1)
    optimizer = kept_optimizer_bytes(optimizer, zero) * params / from_stage(zero, 1, shards, 1)
    return weights, grads, optimizer


def from_stage(zero, stage: int, then, otherwise):
    """`then` where the ZeRO stage `zero` is at least `stage`, else `otherwise` (elementwise when
    zero is an array)."""
    if getattr(zero, "ndim", 0):  # np.ndim's wrapper costs more than the scalar path here
        return np.where(np.greater_equal(zero, stage), then, otherwise)
    return then if zero >= stage else otherwise


def other_bytes(activation_bytes: float, prefetch_bytes: float) -> float:
    return RUNTIME_RESERVED_BYTES + prefetch_bytes + FRAGMENTATION * activation_bytes
