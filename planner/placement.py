"""Rank placement: the rank order (Megatron's "tp-cp-ep-dp-pp", innermost first), the members of
each parallel group, and how a group spreads over nodes (hence which link tier it uses).

Worked example, order tp-cp-dp-pp with tp=2, dp=2, pp=2 (8 ranks): tp groups [0,1] [2,3] [4,5]
[6,7]; dp groups [0,2] [1,3] [4,6] [5,7]; pp groups [0,4] [1,5] [2,6] [3,7].
Expert parallelism (ep) is carved from the dp*cp ranks: the ep group takes the innermost ep of
them (stride tp), and expert data parallelism the rest.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

DENSE_DIMS = ("tp", "cp", "dp", "pp")


class Span(NamedTuple):
    """How one group of `size` ranks sits on nodes: `per_node` of its ranks share a node. A
    named tuple: the search keys its caches and dictionaries by spans many thousands of times,
    and a tuple hashes and compares in C."""

    size: int
    per_node: int
    nodes: int

    @property
    def tier(self) -> str:
        return "intra_node" if self.nodes == 1 else "inter_node"


@lru_cache(maxsize=64)
def dense_order(order: str) -> tuple[str, ...]:
    """The order without 'ep' (ep does not multiply the GPU count)."""
    dims = tuple(d for d in order.split("-") if d != "ep")
    if sorted(dims) != sorted(DENSE_DIMS):
        from planner.errors import SpecError
        raise SpecError(f"rank order {order!r} must list each of tp, cp, dp, pp once (ep optional)")
    return dims


def strides(order: str, degrees: dict[str, int]) -> dict[str, int]:
    stride, out = 1, {}
    for dim in dense_order(order):
        out[dim] = stride
        stride *= degrees[dim]
    return out


def group_of_rank0(order: str, degrees: dict[str, int], dims: tuple[str, ...]) -> list[int]:
    """Ranks of the group over `dims` that contains rank 0."""
    st = strides(order, degrees)
    ranks = [0]
    for dim in dims:
        ranks = [r + i * st[dim] for r in ranks for i in range(degrees[dim])]
    return sorted(ranks)


def _ep_stride(st: dict[str, int], degrees: dict[str, int]) -> int:
    """Stride of the expert group (st: the order's strides): the innermost ep ranks of the
    dp*cp block (Megatron's expert order)."""
    return min(st["dp"], st["cp"]) if degrees["cp"] > 1 else st["dp"]


def _span(order: str, degrees: dict[str, int], st: dict[str, int], dims: tuple[str, ...],
          gpus_per_node: int) -> Span:
    """Span of the group over `dims` (see span), with the order's strides `st`."""
    if dims == ("edp",):
        # expert data parallel: dp*cp/ep ranks, stride ep inside the dp*cp block
        progression = _ep_stride(st, degrees) * degrees["ep"], degrees["dp"] * degrees["cp"] // degrees["ep"]
    elif dims == ("ep",):
        progression = _ep_stride(st, degrees), degrees["ep"]
    else:
        progression = _progression(st, degrees, dims)
    if progression is not None:
        return _run_span(*progression, gpus_per_node)
    ranks = group_of_rank0(order, degrees, dims)
    nodes = len({r // gpus_per_node for r in ranks})
    return Span(size=len(ranks), per_node=len(ranks) // nodes, nodes=nodes)


@lru_cache(maxsize=65536)
def _run_span(stride: int, size: int, gpus_per_node: int) -> Span:
    """Span of the ranks 0, stride, 2*stride, ... (size of them): with stride >= a node's GPUs
    each sits on its own node, else consecutive ranks move at most one node on, so every node in
    between is used."""
    nodes = size if stride >= gpus_per_node else (size - 1) * stride // gpus_per_node + 1
    return Span(size=size, per_node=size // nodes, nodes=nodes)


def _progression(st: dict[str, int], degrees: dict[str, int], dims: tuple[str, ...]) -> tuple[int, int] | None:
    """(stride, size) when the group's ranks are 0, stride, 2*stride, ...: one dimension, or
    dimensions whose strides chain (each the previous one times its degree, as cp then dp are
    in tp-cp-dp-pp); None otherwise."""
    chain = sorted(dims, key=st.__getitem__)
    for a, b in zip(chain, chain[1:]):
        if st[b] != st[a] * degrees[a]:
            return None
    count = 1
    for d in dims:
        count *= degrees[d]
    return st[chain[0]], count


def span(order: str, degrees: dict[str, int], dims: tuple[str, ...], gpus_per_node: int) -> Span:
    """Span of the group over `dims` ('ep' alone: the expert group; 'edp': expert data parallel)."""
    return _span(order, degrees, strides(order, degrees), dims, gpus_per_node)


GROUPS = ("tp", "cp", "ep", "pp", "edp", "dpcp")
"""the groups a strategy's collectives run over (dpcp: the dp x cp group of its gradients)"""


@lru_cache(maxsize=65536)
def group_spans(order: str, tp: int, cp: int, dp: int, pp: int, ep: int, gpus_per_node: int) -> tuple[Span, ...]:
    """Spans of the GROUPS of a placement, in that order (each but dpcp one progression of
    ranks, as in _span)."""
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep}
    st = strides(order, degrees)
    ep_stride = _ep_stride(st, degrees)
    runs = ((st["tp"], tp), (st["cp"], cp), (ep_stride, ep), (st["pp"], pp), (ep_stride * ep, dp * cp // ep))
    return (*(_run_span(stride, size, gpus_per_node) for stride, size in runs),
            _span(order, degrees, st, ("cp", "dp"), gpus_per_node))


def tiers(order: str, degrees: dict[str, int], gpus_per_node: int) -> dict[str, str]:
    """Link tier each parallel group uses (groups of size 1 are left out)."""
    out = {}
    for dim in ("tp", "cp", "ep", "dp", "pp"):
        if degrees[dim] > 1:
            out[dim] = span(order, degrees, (dim,), gpus_per_node).tier
    return out


def rank_groups(order: str, degrees: dict[str, int], dim: str) -> list[list[int]]:
    """Every group of `dim` ('tp', 'cp', 'dp', 'pp', or 'ep' carved from dp*cp), as rank lists.
    Rank = sum over dims of index * stride, strides by the order (innermost first)."""
    st = strides(order, degrees)
    total = degrees["tp"] * degrees["cp"] * degrees["dp"] * degrees["pp"]
    if dim == "ep":
        stride = _ep_stride(st, degrees)
        members = [i * stride for i in range(degrees["ep"])]
    else:
        members = [i * st[dim] for i in range(degrees[dim])]
    groups, seen = [], set()
    for base in range(total):
        if base in seen:
            continue
        group = [base + m for m in members]
        if any(r >= total or r in seen for r in group):
            continue
        seen.update(group)
        groups.append(group)
    return groups
