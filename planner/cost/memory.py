"""Bytes per GPU: weights, gradients, optimizer states, activations, other.

Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3): 16-bit weights (2 bytes per parameter),
gradients kept in fp32 as Megatron's main_grad buffers (4), fp32 master weights and two Adam
moments (12). ZeRO-1 shards the 12 bytes over the data-parallel group, ZeRO-2 the gradients too,
ZeRO-3 the weights too. Korthikanti et al. 2022's own accounting is 2 + 4 + 12 = 18 bytes per
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


def state_bytes(params: float, zero: int, shards: int, grad_bytes: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of `params` parameters replicated over `shards` ranks
    (zero may be an array of ZeRO stages, one per candidate), `grad_bytes` a gradient element
    (cost/step.dp_grad_bytes)."""
    weights = WEIGHT_BYTES * params / from_stage(zero, 3, shards, 1)
    grads = grad_bytes * params / from_stage(zero, 2, shards, 1)
    optimizer = OPTIMIZER_BYTES * params / from_stage(zero, 1, shards, 1)
    return weights, grads, optimizer


def from_stage(zero, stage: int, then, otherwise):
    """`then` where the ZeRO stage `zero` is at least `stage`, else `otherwise` (elementwise when
    zero is an array)."""
    if np.ndim(zero):
        return np.where(np.greater_equal(zero, stage), then, otherwise)
    return then if zero >= stage else otherwise


def other_bytes(activation_bytes: float, prefetch_bytes: float) -> float:
    return RUNTIME_RESERVED_BYTES + prefetch_bytes + FRAGMENTATION * activation_bytes
