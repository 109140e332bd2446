"""Rank placement: the rank order (Megatron's "tp-cp-ep-dp-pp", innermost first), the members of
each parallel group, and how a group spreads over nodes (hence which link tier it uses).

Worked example, order tp-cp-dp-pp with tp=2, dp=2, pp=2 (8 ranks): tp groups [0,1] [2,3] [4,5]
[6,7]; dp groups [0,2] [1,3] [4,6] [5,7]; pp groups [0,4] [1,5] [2,6] [3,7].
Expert parallelism (ep) is carved from the dp*cp ranks: numbering that block innermost first (the
one of cp and dp with the smaller stride inside), the ep group takes ep consecutive of them and
the expert data-parallel group (edp) every ep-th (expert_layout). With the experts' own tensor
parallelism etp below tp (MoE parallel folding, Megatron-Core's expert_tensor_parallel_size), ep
is carved from the whole tp*cp*dp block instead: etp innermost, then ep, then edp (folded_layout).
Megatron-Core's expert rank generator forms exactly these groups wherever it runs the placement
(tests/test_runtime_exports.py compares them with megatron-core 0.16.0).
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd
from typing import NamedTuple

import numpy as np

DENSE_DIMS = ("tp", "cp", "dp", "pp")


class Span(NamedTuple):
    """How one group of `size` ranks sits on nodes: it uses `nodes` nodes, and `per_node` is the
    fewest of its ranks on any one of them (every node when the group spreads evenly). The
    fewest sets the inter-node phase of a hierarchical collective: each node's share leaves on
    its ranks' own NICs, so the node with the fewest ranks sends the most per NIC
    (cost/comm.py). A named tuple: the search keys its caches and dictionaries by spans many
    thousands of times, and a tuple hashes and compares in C."""

    size: int
    per_node: int
    nodes: int

    @property
    def tier(self) -> str:
        return "intra_node" if self.nodes == 1 else "inter_node"


def slowness(s: Span) -> tuple[float, int, int]:
    """The order in which groups of one size are slower: first the bytes each GPU sends over
    its NIC per byte of message in the inter-node phase, (nodes - 1) / (nodes * per_node) (the
    term that dominates whenever a group crosses nodes: cost/comm.py), then more nodes (more
    inter-node latency), then more ranks a node (a longer intra-node phase)."""
    return (s.nodes - 1) / (s.nodes * s.per_node), s.nodes, s.per_node


def worst(spans) -> Span:
    """The slowest of some groups' spans (`slowness`): a collective over every group of a kind
    runs at once and takes as long as its slowest group."""
    return max(spans, key=slowness)


def span_of(ranks, gpus_per_node: int) -> Span:
    """The span of one group given as its ranks."""
    counts: dict = {}
    for r in ranks:
        counts[r // gpus_per_node] = counts.get(r // gpus_per_node, 0) + 1
    return Span(size=len(ranks), per_node=min(counts.values()), nodes=len(counts))


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


def expert_layout(st: dict[str, int], degrees: dict[str, int]) -> tuple[tuple, tuple] | None:
    """Where the expert groups sit: folded_layout where degrees['etp'] (absent: tp) is below tp,
    else carved_layout."""
    if degrees.get("etp", degrees["tp"]) < degrees["tp"]:
        return folded_layout(st, degrees)
    return carved_layout(st, degrees)


def folded_layout(st: dict[str, int], degrees: dict[str, int]) -> tuple[tuple, tuple] | None:
    """The ep and edp groups of MoE parallel folding, as expert_layout gives them: Megatron-Core's
    expert rank generator numbers each pipeline stage's tp*cp*dp ranks with etp innermost, then
    ep, then edp (RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1) in the same order), so an ep
    group is ep ranks etp apart and an edp group every (etp*ep)-th. With pp outermost (or pp 1)
    a stage's ranks are consecutive; under an order that ends in dp, the expert groups are those
    only where edp equals dp (etp*ep = tp*cp: megatron-core asserts as much). None otherwise."""
    etp, ep, tp, cp, dp = degrees["etp"], degrees["ep"], degrees["tp"], degrees["cp"], degrees["dp"]
    block = tp * cp * dp
    if tp % etp or block % (etp * ep):
        return None
    if degrees["pp"] == 1 or st["pp"] == block:
        return ((etp, ep),), ((etp * ep, block // (etp * ep)),)
    if etp * ep == tp * cp and st["dp"] == tp * cp * degrees["pp"]:
        return ((etp, ep),), ((st["dp"], dp),)
    return None


def carved_layout(st: dict[str, int], degrees: dict[str, int]) -> tuple[tuple, tuple] | None:
    """Where the expert (ep) and expert data-parallel (edp) groups sit in the dp*cp block, with
    the order's strides `st`: each as ((stride, size),), a progression of ranks, or ((a, inner),
    (S, outer)), blocks of `inner` ranks at stride a, `outer` of them at stride S. The block's
    ranks numbered innermost first (X the inner of cp and dp, Y the outer, degrees above 1): ep
    takes ep consecutive of them, edp every ep-th. None when ep neither divides X's degree nor
    is a multiple of it while X and Y do not chain (st_Y != st_X * deg_X): no such placement."""
    ep = degrees["ep"]
    rest = degrees["dp"] * degrees["cp"] // ep
    dims = sorted((d for d in ("cp", "dp") if degrees[d] > 1), key=st.__getitem__)
    if not dims:
        return ((1, ep),), ((1, rest),)
    x = dims[0]
    if len(dims) == 1 or st[dims[1]] == st[x] * degrees[x]:  # one progression
        return ((st[x], ep),), ((st[x] * ep, rest),)
    y = dims[1]
    (sx, dx), (sy, dy) = (st[x], degrees[x]), (st[y], degrees[y])
    if dx % ep == 0:
        return ((sx, ep),), (((sy, dy),) if dx == ep else ((sx * ep, dx // ep), (sy, dy)))
    if ep % dx == 0:
        return ((sx, dx), (sy, ep // dx)), ((sy * (ep // dx), rest),)
    return None


def expert_pool(tp: int, cp: int, dp: int, etp: int = 0) -> tuple[int, str]:
    """(the ranks of a pipeline stage ep is carved from, their name): dp*cp, or tp*dp*cp / etp
    where the experts' tensor parallelism etp is below tp (folded_layout); etp 0: tp."""
    if 0 < etp < tp:
        return tp * cp * dp // etp, "tp*dp*cp (folded experts)"
    return dp * cp, "dp*cp"


def has_expert_layout(order: str, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int = 0) -> bool:
    """Whether the expert groups can be laid out under this order (expert_layout; etp 0: tp)."""
    degrees = expert_degrees(tp, cp, dp, pp, ep, etp)
    # with ep 1 the experts' groups are the dense ones, unless folded (edp then spans tp too)
    return ep == 1 and "etp" not in degrees or expert_layout(strides(order, degrees), degrees) is not None


def expert_degrees(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int = 0) -> dict[str, int]:
    """The degrees placement reads; 'etp' only where the experts' tensor parallelism is below tp."""
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep}
    if 0 < etp < tp:
        degrees["etp"] = etp
    return degrees


def _expert(st: dict[str, int], degrees: dict[str, int], dim: str) -> tuple:
    layout = expert_layout(st, degrees)
    if layout is None:
        from planner.errors import SpecError
        if "etp" in degrees:
            raise SpecError(f"ep {degrees['ep']} with expert tp {degrees['etp']} cannot be laid out over tp "
                            f"{degrees['tp']} x cp {degrees['cp']} x dp {degrees['dp']} under this rank order")
        raise SpecError(f"ep {degrees['ep']} cannot be carved from cp {degrees['cp']} x dp {degrees['dp']} under this "
                        "rank order (ep must divide the inner one's degree or be a multiple of it)")
    return layout[0] if dim == "ep" else layout[1]


def _total(degrees: dict[str, int]) -> int:
    return degrees["tp"] * degrees["cp"] * degrees["dp"] * degrees["pp"]


def _span(order: str, degrees: dict[str, int], st: dict[str, int], dims: tuple[str, ...],
          gpus_per_node: int) -> Span:
    """Span of the slowest group over `dims` (see span), with the order's strides `st`."""
    total = _total(degrees)
    if dims in (("ep",), ("edp",)):
        layout = _expert(st, degrees, dims[0])
        if len(layout) == 1:
            return _run_span(*layout[0], gpus_per_node, total)
        (a, inner), (S, outer) = layout
        return _blocks_span(a, inner, S, outer, gpus_per_node, _expert_starts(st, degrees, dims[0], gpus_per_node))
    else:
        # a dimension of degree 1 adds no rank to the group (cp 1 beside dp, apart in the order)
        progression = _progression(st, degrees, tuple(d for d in dims if degrees[d] > 1) or dims[:1])
    if progression is not None:
        return _run_span(*progression, gpus_per_node, total)
    return _lattice_span(order, degrees, st, dims, gpus_per_node)


def _lattice_span(order: str, degrees: dict[str, int], st: dict[str, int], dims: tuple[str, ...],
                  gpus_per_node: int) -> Span:
    """The slowest group over two dimensions whose strides do not chain (cp and dp apart in the
    order, as in tp-cp-pp-dp): blocks of `inner` ranks at stride a, `outer` of them at stride S."""
    inner, outer = sorted(dims, key=st.__getitem__)
    G = gpus_per_node
    starts = {0}
    for d in DENSE_DIMS:
        if d not in dims:  # a base's place in its node: the other dimensions' offsets mod G
            starts = {(x + i * st[d]) % G for x in starts for i in range(min(degrees[d], G))}
    return _blocks_span(st[inner], degrees[inner], st[outer], degrees[outer], G, frozenset(starts))


def _expert_starts(st: dict[str, int], degrees: dict[str, int], dim: str, G: int) -> frozenset:
    """The places in a node (mod G) of the first ranks of every ep or edp group laid out as
    blocks (expert_layout): the offsets of the dimensions outside the dp*cp block, plus those of
    the block's ranks that start a group."""
    starts = {0}
    for d in ("tp", "pp"):
        starts = {(x + i * st[d]) % G for x in starts for i in range(min(degrees[d], G))}
    x, y = sorted(("cp", "dp"), key=st.__getitem__)
    ep, (sx, dx), (sy, dy) = degrees["ep"], (st[x], degrees[x]), (st[y], degrees[y])
    if dim == "ep":  # groups start every ep // dx blocks along y
        firsts = [k * (ep // dx) * sy for k in range(min(dy // (ep // dx), G))]
    else:  # groups start at each of the first ep ranks along x
        firsts = [c * sx for c in range(min(ep, G))]
    return frozenset((s + f) % G for s in starts for f in firsts)


@lru_cache(maxsize=4096)
def _blocks_span(a: int, inner: int, S: int, outer: int, G: int, starts: frozenset) -> Span:
    """Span of the slowest group r + i*a + j*S (i < inner, j < outer, S > a*inner) over the
    bases' places r in a node. Block j + P, P = G / gcd(S, G), sits where block j does, L = P*S/G
    nodes on, and blocks more than K apart never share a node, so past the first and before the
    last few blocks the pattern of ranks a node repeats with every P blocks: a group of J blocks
    with J = outer (mod P) and J large enough has the same fewest ranks a node, and adds a fixed
    number of nodes per P blocks."""
    P = G // gcd(S, G)
    K = max(0, -(-(G + (inner - 1) * a) // S))
    least = 3 * P + 2 * K + 2
    J = outer if outer <= least + P else least + (outer - least) % P
    offsets = ((a * np.arange(inner))[None, :] + (S * np.arange(J))[:, None]).ravel()
    r = np.array(sorted(starts))
    nodes = (r[:, None] + offsets[None, :]) // G  # each row ascending: blocks do not interleave (S > a * inner)
    rows, width = nodes.shape
    new = np.ones(nodes.shape, dtype=bool)
    new[:, 1:] = nodes[:, 1:] != nodes[:, :-1]  # where a row enters another node
    run = np.cumsum(new, axis=1)  # the node's number along the row, from 1
    counts = np.bincount((np.arange(rows)[:, None] * (width + 1) + run).ravel(), minlength=rows * (width + 1))
    counts = counts.reshape(rows, width + 1)[:, 1:]
    used = run[:, -1]
    fewest = np.where(counts > 0, counts, width).min(axis=1)
    if J < outer:  # nodes the last P blocks add, repeated for the blocks left out
        used = used + (outer - J) // P * (used - run[:, (J - P) * inner - 1])
    return worst(Span(size=inner * outer, per_node=int(p), nodes=int(n)) for p, n in zip(fewest, used))


@lru_cache(maxsize=65536)
def _run_span(stride: int, size: int, gpus_per_node: int, total: int) -> Span:
    """Span of the slowest group of `size` ranks b, b + stride, b + 2*stride, ..., for every
    base b = o + k * stride * size (o < stride) of `total` ranks: the groups of one dimension (or
    of dimensions whose strides chain). With stride >= a node's GPUs each rank sits on its own
    node. Else a group fills every node from its first rank's to its last, and how many of its
    ranks each holds depends only on where the base falls in its node (b mod gpus_per_node)."""
    G = gpus_per_node
    if size <= 1 or G <= 1:
        return Span(size=size, per_node=1 if G <= 1 else size, nodes=size if G <= 1 else 1)
    if stride >= G:
        return Span(size=size, per_node=1, nodes=size)
    block = stride * size
    blocks = min(max(total // block, 1), G // gcd(block, G))
    starts = {(o + k * block) % G for k in range(blocks) for o in range(stride)}
    return worst(_offset_span(r, stride, size, G) for r in starts)


@lru_cache(maxsize=65536)
def _offset_span(r: int, stride: int, size: int, G: int) -> Span:
    """Span of the ranks r, r + stride, ..., (size of them; stride < G, r < G) on nodes of G:
    node j holds the ranks in [j*G, (j+1)*G), ceil(((j+1)*G - r) / stride) - ceil((j*G - r) /
    stride) of them; the counts of the inner nodes repeat with period stride, so a period of
    them gives their least."""
    def before(x):  # ranks of the group below position x
        return min(size, max(0, -(-(x - r) // stride)))

    nodes = (r + (size - 1) * stride) // G + 1
    inner = range(1, min(nodes - 1, 1 + stride))
    counts = [before(G), size - before((nodes - 1) * G)] + [before((j + 1) * G) - before(j * G) for j in inner]
    counts = [c for c in counts if c > 0] if nodes > 1 else [size]
    return Span(size=size, per_node=min(counts), nodes=nodes)


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
    """Span of the slowest group over `dims` ('ep' alone: the expert group; 'edp': expert data
    parallel), over every group of that kind (`worst`)."""
    return _span(order, degrees, strides(order, degrees), dims, gpus_per_node)


GROUPS = ("tp", "cp", "ep", "pp", "edp", "dpcp")
"""the groups a strategy's collectives run over (dpcp: the dp x cp group of its gradients)"""


@lru_cache(maxsize=65536)
def group_spans(order: str, tp: int, cp: int, dp: int, pp: int, ep: int, gpus_per_node: int,
                etp: int = 0) -> tuple[Span, ...]:
    """Spans of the slowest group of each of GROUPS of a placement, in that order (as _span
    finds them: tp, cp and pp are progressions of ranks; ep, edp and dpcp may be blocks); etp:
    the experts' tensor parallelism (0: tp)."""
    degrees = expert_degrees(tp, cp, dp, pp, ep, etp)
    st = strides(order, degrees)
    total = tp * cp * dp * pp
    dense = (_run_span(st["tp"], tp, gpus_per_node, total), _run_span(st["cp"], cp, gpus_per_node, total))
    dpcp = _span(order, degrees, st, ("cp", "dp"), gpus_per_node)
    if ep == 1 and "etp" not in degrees:  # the expert group is one rank, the experts' dp group the dense one's
        return (*dense, Span(size=1, per_node=1, nodes=1), _run_span(st["pp"], pp, gpus_per_node, total), dpcp, dpcp)
    return (*dense, _span(order, degrees, st, ("ep",), gpus_per_node), _run_span(st["pp"], pp, gpus_per_node, total),
            _span(order, degrees, st, ("edp",), gpus_per_node), dpcp)


@lru_cache(maxsize=4096)
def hybrid_spans(order: str, tp: int, cp: int, dp: int, pp: int, shard: int, gpus_per_node: int) -> tuple[Span, Span]:
    """(the slowest shard group, the slowest replica group) of hybrid sharding (Strategy.dp_shard):
    a shard group is `shard` consecutive data-parallel indices with every cp index (the ranks ZeRO
    shards over: torchtitan's dp_shard x cp FSDP mesh, a Megatron distributed-optimizer instance),
    a replica group the dp / shard ranks that hold the same shard. Found by listing every rank's
    coordinates (a plan prices one placement; the search does not enumerate dp_shard)."""
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    st = strides(order, degrees)
    ranks = list(range(tp * cp * dp * pp))
    coord = {d: [(r // st[d]) % degrees[d] for r in ranks] for d in degrees}
    shard_groups: dict = {}
    replica_groups: dict = {}
    for r in ranks:
        t, c, i, p = coord["tp"][r], coord["cp"][r], coord["dp"][r], coord["pp"][r]
        shard_groups.setdefault((t, p, i // shard), []).append(r)
        replica_groups.setdefault((t, c, p, i % shard), []).append(r)
    return (worst(span_of(g, gpus_per_node) for g in shard_groups.values()),
            worst(span_of(g, gpus_per_node) for g in replica_groups.values()))


def tiers(order: str, degrees: dict[str, int], gpus_per_node: int) -> dict[str, str]:
    """Link tier each parallel group uses (groups of size 1 are left out)."""
    out = {}
    for dim in ("tp", "cp", "ep", "dp", "pp"):
        if degrees[dim] > 1:
            out[dim] = span(order, degrees, (dim,), gpus_per_node).tier
    return out


def _members(order: str, degrees: dict[str, int], dims: tuple[str, ...]) -> list[int]:
    """Offsets from its first rank of the ranks of a group over `dims` (dense dimensions, or 'ep'
    or 'edp' alone)."""
    st = strides(order, degrees)
    if dims in (("ep",), ("edp",)):
        members = [0]
        for stride, size in _expert(st, degrees, dims[0]):
            members = [m + i * stride for m in members for i in range(size)]
        return sorted(members)
    members = [0]
    for dim in dims:
        members = [m + i * st[dim] for m in members for i in range(degrees[dim])]
    return sorted(members)


def _groups(order: str, degrees: dict[str, int], dims: tuple[str, ...]) -> list[list[int]]:
    """Every group over `dims`: the ranks, lowest first, not yet in a group, each with its
    group's offsets (_members)."""
    members, total = _members(order, degrees, dims), _total(degrees)
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


def rank_groups(order: str, degrees: dict[str, int], dim: str) -> list[list[int]]:
    """Every group of `dim` ('tp', 'cp', 'dp', 'pp', 'ep' carved from dp*cp, 'edp' the expert
    data-parallel rest of it, 'dpcp' the dp x cp group of the gradients), as rank lists.
    Rank = sum over dims of index * stride, strides by the order (innermost first)."""
    return _groups(order, degrees, ("cp", "dp") if dim == "dpcp" else (dim,))
