"""Bytes per GPU: weights, gradients, optimizer states, activations, other.

Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3): 16-bit weights (2 bytes per parameter),
gradients kept in fp32 as Megatron's main_grad buffers (4), fp32 master weights and two Adam
moments (12). ZeRO-1 shards the 12 bytes over the data-parallel group, ZeRO-2 the gradients too,
ZeRO-3 the weights too. With bf16 moments (optimizer_bytes) a sharded optimizer keeps 6 or 8. Korthikanti et al. 2022's own accounting is 2 + 4 + 12 = 18 bytes per
parameter of the transformer layers' GEMM weights.

`other` is what a real runtime adds: the CUDA context and library workspaces (cuBLAS, NCCL),
ZeRO-3's prefetched full layers, and an allocator fragmentation allowance on activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.units import GIB

WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
"""fp32 master weights and Adam's two fp32 moments, per parameter"""
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
"""bytes of each of Adam's two moments by their dtype (spec/training.OPTIMIZER_STATES)"""
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
    beside the master weight, which TE keeps as REMAINDER_BYTES beside a bf16 weight (megatron-core
    hands TE the master weights unless the run is fp8 with a recipe other than delayed:
    use_precision_aware_optimizer_no_fp8_or_ds_fp8; fp8 weights take no remainder) and fp32
    beside an fp8 one: 6 bytes in bf16, 8 in fp8."""
    if states in ("", "fp32"):
        return OPTIMIZER_BYTES
    master = REMAINDER_BYTES if precision == "bf16" else 4
    return master + 2 * MOMENT_BYTES[states]


def adam_traffic_bytes(optimizer: float, zero):
    """HBM bytes per parameter of one fused Adam step over states of `optimizer` bytes a
    parameter (optimizer_bytes, which applies from ZeRO-1: below it OPTIMIZER_BYTES): read and
    write the states, plus ADAM_OTHER_BYTES; 38 with fp32 states. zero may be an array."""
    return 2 * from_stage(zero, 1, optimizer, OPTIMIZER_BYTES) + ADAM_OTHER_BYTES


def state_bytes(params: float, zero: int, shards: int, grad_bytes: int,
                optimizer: float = OPTIMIZER_BYTES) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of `params` parameters replicated over `shards` ranks
    (zero may be an array of ZeRO stages, one per candidate), `grad_bytes` a gradient element
    (cost/step.dp_grad_bytes), `optimizer` the bytes a sharded optimizer keeps a parameter
    (optimizer_bytes; unsharded, ZeRO-0, keeps OPTIMIZER_BYTES: Megatron's precision-aware
    optimizer needs its distributed one)."""
    weights = WEIGHT_BYTES * params / from_stage(zero, 3, shards, 1)
    grads = grad_bytes * params / from_stage(zero, 2, shards, 1)
    optimizer = from_stage(zero, 1, optimizer, OPTIMIZER_BYTES) * params / from_stage(zero, 1, shards, 1)
    return weights, grads, optimizer


def from_stage(zero, stage: int, then, otherwise):
    """`then` where the ZeRO stage `zero` is at least `stage`, else `otherwise` (elementwise when
    zero is an array)."""
    if np.ndim(zero):
        return np.where(np.greater_equal(zero, stage), then, otherwise)
    return then if zero >= stage else otherwise


def other_bytes(activation_bytes: float, prefetch_bytes: float) -> float:
    return RUNTIME_RESERVED_BYTES + prefetch_bytes + FRAGMENTATION * activation_bytes
