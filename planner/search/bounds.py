"""Lower bounds of the search: for every outer choice, a step time no split or recompute count
can beat and a memory floor every split exceeds somewhere (search/driver.py prices the choices
in the order of these bounds and stops once the next bound is no better than the best plan).

    step >= (m - 1/v) * max_i t_i + sum_i t_i / v + max_i tail_i,
    max_i t_i >= max(sum_i t_i / p, largest stage of the even split when the split is fixed),
where sum_i t_i (all layers, the embedding, the head, every stage's exposed p2p, the least recomputation
that lets the model fit, the ZeRO-2/3 traffic that cannot hide) does not depend on the split,
and max_i tail_i >= the optimizer step of the stage holding the most parameters.

Vectorised: the cost model prices each layer context (tp, cp, ep, micro-batch, recompute mode)
once; every candidate (one row per outer choice, times its ZeRO stages and vpps) is then
bounded by array arithmetic over those contexts, with no Python object per candidate.

Refinement (Refiner, a batch of candidates at a time, in bound order): the largest tail is at
least the least tail the first or last stage, or a stage holding ceil(L/p) layers, can have;
the bottleneck of a free split is at least the least bottleneck of fractional splits whose
stages respect memory (recomputing where 'full' allows) and, where layers differ, of contiguous
splits by their own layer times; a fixed split recomputes at least what each stage needs to
fit; and a candidate none of whose splits fits (an exact reachability test over ranges) is
dropped before it is priced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from planner.cost import memory
from planner.cost.pipeline import in_flight
from planner.cost.step import (
    base_mode,
    compute_floor_s,
    dp_grad_bytes,
    expert_fold,
    gather_bytes,
    layer_kind_index,
    optimizer_s,
    optimizer_state_bytes,
    exposed_p2p_s,
    p2p_s,
    selective_saves_memory,
    state_shards,
    zero_traffic_s,
)
from planner.placement import expert_pool, group_spans, has_expert_layout
from planner.search import space
from planner.search.contexts import KINDS, Table, affine, layout_coef, registry
from planner.search.floors import (
    SAFETY,
    inverse_in_flight_sum,
    layer_state_bytes,
    pipeline_floor_s,
    recompute_floor,
)
from planner.search.refine import Refiner
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import TrainingSetup

ZEROS = (0, 1, 2, 3)
"""the ZeRO stages (a candidate row's mask of allowed ones has a bit per stage)"""


@dataclass(frozen=True, slots=True)
class Bounds:
    """Every candidate that may fit, sorted by bound: candidate j is ZeRO stage zero[j] and vpp
    vpp[j] of outer choice row[j] (knobs(j): the other knobs)."""

    outer: _Outer
    row: np.ndarray
    pp: np.ndarray
    zero: np.ndarray
    vpp: np.ndarray
    bound_s: np.ndarray
    pipe_s: np.ndarray
    """the pipeline part of the bound (the rest is a floor of the largest tail)"""
    floor_bytes: np.ndarray
    """the memory floor of each candidate"""
    considered: int
    pruned_memory: int
    least_floor_bytes: float
    """least memory floor of the candidates pruned for memory (inf when none was)"""
    dominated: int = 0
    """candidates left out because another does as well with no more memory (selective
    recomputation where it keeps the same activations as none)"""
    refiner: Refiner | None = None
    """None only when there is no candidate"""
    order: np.ndarray | None = None
    """candidate j is the refiner's row order[j] (the refiner's columns are not sorted)"""

    def knobs(self, j: int) -> dict:
        """Candidate j's knobs other than zero and vpp."""
        return self.outer.knobs(int(self.row[j]), int(self.pp[j]))

    def conventions(self, gpus_per_node: int) -> np.ndarray:
        """space.conventional of every candidate."""
        tp, cp, dp, ep = (self.outer.columns[self.row, k] for k in range(4))
        return space.conventional(tp, cp, dp, self.pp, ep, self.zero, gpus_per_node)

    def refined_s(self, idx: np.ndarray, cutoff: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
        """Tighter bounds of candidates idx: the pipeline part (with the free split's
        integrality, Refiner.pipe_floor_s) plus the least largest tail (Refiner.floor_s), never
        below the first bound; and which of them are below `cutoff`, the ones whose memory
        check (fits) decides whether they are priced. What is not below `cutoff` with the
        pipeline part alone (nearly all that the refinement prunes) needs neither the tail floor
        nor the memory check, and what its cheaper floors put there skips the memory
        relaxations too: those bounds are looser but at or above the cutoff, where nothing is
        priced."""
        rows = self.order[idx]
        tail = self.bound_s[idx] - self.pipe_s[idx]
        pipe = self.refiner.pipe_floor_s(rows, cutoff - tail)
        bound = np.maximum(self.bound_s[idx], pipe + tail)
        open_ = np.nonzero(bound < cutoff)[0]
        tail = np.maximum(tail[open_], self.refiner.floor_s(rows[open_]) * (1 - SAFETY))
        bound[open_] = np.maximum(bound[open_], pipe[open_] + tail)
        return bound, bound < cutoff

    def fits(self, idx: np.ndarray) -> np.ndarray:
        """Whether some split of candidates idx may fit in memory (Refiner.fits: False proves
        none does)."""
        return self.refiner.fits(self.order[idx])


def bound_all(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict, rules: space.RuntimeRules,
              progress=None) -> Bounds:
    """Bound every candidate of the space (search/space.py) that honours `fixed`. The rank
    placements are enumerated in Python (one per degrees, ep and order); their micro-batches and
    recompute modes, and the keys the rows share (layer contexts, memory floors, p2p times), as
    arrays."""
    return bound_counts(model, cluster, [setup], fixed, rules, progress)[0]


def bound_counts(model: ModelSpec, cluster: Cluster, setups: list[TrainingSetup], fixed: dict,
                 rules: space.RuntimeRules, progress=None, cutoff_s: float = np.inf) -> list[Bounds]:
    """bound_all of setups that differ only in their GPU count and global batch (a sweep's, or
    a mixed cluster's pool at each batch share), in one pass: the candidates of all of them are
    bounded as one set of arrays (what costs is the number of array operations more than their
    length), then sorted and split by setup; the Bounds of each are those bound_all gives it
    alone. `cutoff_s`: leave out the candidates whose compute floor (below) is no better, which
    no search pruned there would price, before their layer contexts are priced."""
    modes = space.recompute_modes(fixed, rules, setups[0].ep_overlap)
    shape = _shape(replace(setups[0], gpus=1, global_batch=1, memory_headroom=0.0))
    orders = rules.orders if "order" not in fixed else (fixed["order"],)
    span_ids: dict = {}
    layouts: dict = {}
    zero_sets: dict = {}
    placements: list = []
    for count, setup in enumerate(setups):
        g = min(cluster.gpus_per_node, setup.gpus)
        for tp, cp, pp, dp in space.degree_tuples(model, cluster, setup, fixed, rules):
            if progress and len(placements) % 256 == 0:
                progress(0, 0, f"bounding {len(placements):,} placements")
            sp = fixed.get("sequence_parallel", tp > 1)
            if sp and tp == 1:
                continue  # sequence parallelism without tensor parallelism is no strategy
            alone = tp == pp == cp == 1
            zkey = (pp > 1, alone)
            if zkey not in zero_sets:
                zero_sets[zkey] = space.zero_options(model, pp, alone, fixed.get("zero"), rules)
            zeros = zero_sets[zkey]
            etp = setup.expert_tp(tp, model)
            for ep in space.ep_options(model, expert_pool(tp, cp, dp, etp)[0], fixed.get("ep"), rules, setup.precision,
                                      setup.ep_overlap):
                placed = set()
                for o, order in enumerate(orders):
                    if (not rules.order_runs(order, cp, pp, ep, tp // etp)
                            or not has_expert_layout(order, tp, cp, dp, pp, ep, etp)):
                        continue
                    spans = group_spans(order, tp, cp, dp, pp, ep, g, etp)
                    duplicate = spans in placed  # another rank order that places every group alike
                    placed.add(spans)
                    placements.append(_Placement(count, tp, cp, pp, dp, ep, o, sp, _mask(zeros, ZEROS), len(zeros),
                                                 layouts.setdefault(spans[4:], len(layouts)),
                                                 span_ids.setdefault(spans[:3], len(span_ids)), spans[3].nodes > 1,
                                                 duplicate))
    rows, vpp_sets, considered, dominated = _rows(model, cluster, setups[0], fixed, rules, modes, shape, placements,
                                                  [s.global_batch for s in setups], cutoff_s)
    span_sets = list(span_ids)
    # 'full' reads the same layer context as 'none' (its base rows)
    base = np.array([space.RECOMPUTES.index(base_mode(mode)) for mode in modes])[rows["mode"]]
    keys, context_id = _keys(*(rows[k] for k in ("tp", "cp", "ep", "mb", "sp")), base, rows["span_set"])
    memories, memory_id = _keys(*(rows[k] for k in ("tp", "cp", "ep", "mb", "sp", "mode")))
    link = (model, cluster, setups[0], rows["tp"], rows["cp"], rows["mb"])
    p2p = np.where(rows["pp"] > 1, np.where(rows["inter"], p2p_s(*link, True), p2p_s(*link, False)), 0.0)
    groups, group_id = _keys(rows["dp"], rows["cp"], rows["ep"], rows["tp"])
    shards, eshards = np.array([state_shards(dp, cp, ep, expert_fold(model, setups[0], tp)) for dp, cp, ep, tp in groups],
                               dtype=np.int64).reshape(-1, 2)[group_id].T
    columns = {"context": context_id, "shards": shards, "eshards": eshards, "p2p": p2p,
               "full": rows["mode"] == modes.index("full") if "full" in modes else np.zeros(len(p2p), dtype=bool),
               "memory": memory_id, **rows}
    table = np.column_stack([columns[k] for k in _ROW]).astype(float).reshape(-1, len(_ROW))
    outer = _Outer(table[:, _ROW.index("tp"):].astype(int), tuple(modes), tuple(orders), fixed.get("dp_overlap", True))
    reg = registry(model, cluster, shape)
    layers = [reg.memory(tp, cp, ep, mb, bool(sp), modes[mode]) for tp, cp, ep, mb, sp, mode in memories]

    def build(used):  # the layer contexts, priced only for candidates that pass the memory floor
        return Table(reg, np.array([reg.id(tp, cp, ep, mb, bool(sp), space.RECOMPUTES[b], span_sets[s])
                                    for tp, cp, ep, mb, sp, b, s in used], dtype=np.int64))

    found = _bound_rows(model, cluster, setups[0], rules, outer, table, keys, build, layers, list(layouts), vpp_sets,
                        considered, fixed.get("dp_overlap", True), cutoff_s)
    return [replace(b, dominated=int(d)) for b, d in zip(found, dominated)]


@lru_cache(maxsize=64)
def _shape(shape: TrainingSetup) -> TrainingSetup:
    """The one instance of an equal setup shape: what a layer context depends on of the setup
    (sequence, precision, attention, and the runtime's attention kernel), with which the cost model's caches are looked up many
    times a search; an instance met before matches by identity, with no field comparisons."""
    return shape


class _Placement(NamedTuple):
    """One rank placement of bound_all (degrees, ep, rank order): what its candidate rows share."""

    count: int
    """index of its setup (bound_counts)"""
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    order: int
    sp: bool
    zeros: int
    """mask of the ZeRO stages allowed (a bit per ZEROS entry)"""
    nzeros: int
    layout: int
    """index of its (edp, dpcp) group spans"""
    span_set: int
    """index of its (tp, cp, ep) group spans"""
    inter: bool
    """whether its pipeline groups cross nodes"""
    dup: bool
    """whether another rank order places every group alike"""


def _rows(model, cluster, setup, fixed, rules, modes, shape, placements, batches: list[int],
          cutoff_s: float = np.inf) -> tuple[dict, list, np.ndarray, np.ndarray]:
    """The candidate rows of the placements (bound_counts), in the order of a loop over
    placements, then micro-batches, then recompute modes: columns by name, with the candidates
    they stand for (times ZeRO stages and vpps) and those dominated (a duplicate placement;
    selective recomputation that keeps the same activations as none) per setup (`batches`: the
    global batch of each), and the vpp sets the rows' 'vpps' index; without the rows whose
    compute floor at their most interleaved vpp is no better than `cutoff_s` (_least_pipe_s)."""
    setups = len(batches)
    if not placements:
        return ({k: np.zeros(0, dtype=int) for k in (*_Placement._fields, "mb", "mode", "m", "vpps")}, [],
                np.zeros(setups, dtype=int), np.zeros(setups, dtype=int))
    block = dict(zip(_Placement._fields, np.array(placements, dtype=np.int64).T))
    batch = np.array(batches, dtype=np.int64)[block["count"]]
    dp_batch = list(zip(block["dp"].tolist(), batch.tolist()))
    mb_sets = {(dp, b): np.array(space.allowed(space.divisors(b // dp), fixed.get("micro_batch")), dtype=np.int64)
               for dp, b in set(dp_batch)}
    counts = np.array([len(mb_sets[key]) for key in dp_batch]) * len(modes)
    rows = {k: np.repeat(v, counts) for k, v in block.items()}
    mbs = np.concatenate([mb_sets[key] for key in dp_batch])
    rows["mb"] = np.repeat(mbs, len(modes))
    rows["mode"] = np.tile(np.arange(len(modes)), len(mbs))
    rows["m"] = np.repeat(batch, counts) // (rows["dp"] * rows["mb"])
    # the vpps of each (pp, micro-batches)
    pairs, pair_id = _keys(rows["pp"], rows["m"])
    vpp_ids: dict = {}
    per_pair = [vpp_ids.setdefault(tuple(space.vpp_options(model, pp, m, fixed.get("vpp"), rules, setup.ep_overlap)),
                                   len(vpp_ids))
                for pp, m in pairs]
    rows["vpps"] = np.array(per_pair, dtype=np.int64)[pair_id]
    size = np.array([len(v) for v in vpp_ids])[rows["vpps"]] * rows["nzeros"]
    considered = np.bincount(rows["count"], weights=size, minlength=setups).astype(int)
    if cutoff_s < np.inf:
        most = np.array([max(v, default=1) for v in vpp_ids])[rows["vpps"]]
        open_ = np.nonzero(_least_pipe_s(model, cluster, setup, rows["tp"], rows["cp"], rows["pp"], rows["mb"],
                                         rows["m"], most) < cutoff_s)[0]
        rows, size = {k: v[open_] for k, v in rows.items()}, size[open_]
    same = rows["dup"].astype(bool)
    if "selective" in modes and "none" in modes:
        # selective recomputation keeping the same memory as 'none' only adds time
        sel = np.nonzero(~same & (rows["mode"] == modes.index("selective")))[0]
        if len(sel):
            shapes, shape_id = _keys(*(rows[k][sel] for k in ("tp", "cp", "mb", "sp")))
            saves = np.array([selective_saves_memory(model, shape, tp, cp, mb, bool(sp)) for tp, cp, mb, sp in shapes])
            same[sel[~saves[shape_id]]] = True
    dominated = np.bincount(rows["count"][same], weights=size[same], minlength=setups).astype(int)
    keep = np.nonzero(~same & (size > 0))[0]
    return {k: v[keep] for k, v in rows.items()}, list(vpp_ids), considered, dominated


def _keys(*columns: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """The distinct tuples of `columns` over their rows, in order of first appearance, and each
    row's index into them."""
    if not len(columns[0]):
        return [], np.zeros(0, dtype=int)
    cols = np.column_stack(columns).astype(np.int64)
    # one integer per row (mixed radix over the columns' ranges), unless that overflows
    low, sizes = cols.min(axis=0), np.ptp(cols, axis=0) + 1
    if float(np.prod(sizes.astype(float))) < 2.0 ** 62:
        _, first, inverse = np.unique(np.ravel_multi_index((cols - low).T, sizes), return_index=True,
                                      return_inverse=True)
    else:
        _, first, inverse = np.unique(cols, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=int)
    rank[order] = np.arange(len(order))
    return list(map(tuple, cols[first[order]].tolist())), rank[inverse.reshape(-1)]


_ROW = ("count", "context", "layout", "pp", "shards", "eshards", "m", "p2p", "full", "zeros", "vpps", "memory",
        "tp", "cp", "dp", "ep", "mb", "mode", "order", "sp")
"""a candidate row's columns (bound_all): the bounds read the first ones, _Outer the knobs from tp on"""


def _mask(values, domain) -> int:
    return sum(1 << domain.index(v) for v in values)


@dataclass(frozen=True, slots=True)
class _Outer:
    """The outer choices as integer columns: tp, cp, dp, ep, micro-batch, recompute mode (index
    into modes), rank order (index into orders), sequence parallel; pp from the bounds."""

    columns: np.ndarray
    modes: tuple
    orders: tuple
    dp_overlap: bool

    def knobs(self, row: int, pp: int) -> dict:
        tp, cp, dp, ep, mb, mode, order, sp = self.columns[row].tolist()
        return {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "micro_batch": mb, "recompute": self.modes[mode],
                "order": self.orders[order], "sequence_parallel": bool(sp), "dp_overlap": self.dp_overlap}


def _bound_rows(model, cluster, setup, rules, outer, table, keys, build, layers, layouts, vpp_sets, considered,
                dp_overlap, cutoff_s: float = np.inf) -> list[Bounds]:
    """The bounds and floors of every (row, ZeRO stage, vpp) at once (formulas: module docstring),
    one Bounds per setup (the rows' 'count'). The memory floor comes first, from `layers`
    (cost/step.layer_memory per row's 'memory'); the layer contexts `keys` are priced (`build`)
    only for the candidates that pass it."""
    cap, L = memory.capacity_bytes(cluster, setup), model.layers
    eff = cluster.efficiency
    vpp_domain = sorted({v for vpps in vpp_sets for v in vpps})
    if not len(table):
        return [Bounds(outer, *(np.zeros(0, dtype=int),) * 4, *(np.zeros(0),) * 3, int(n), 0, float("inf"))
                for n in considered]

    def column(name: str) -> np.ndarray:
        return table[:, _ROW.index(name)]

    count, c, lay, pp, shards, eshards, m, mem = (column(k).astype(int) for k in ("count", "context", "layout", "pp",
                                                                                 "shards", "eshards", "m", "memory"))
    p2p, full = column("p2p"), column("full").astype(bool)
    zmask = (column("zeros").astype(int)[:, None] >> np.arange(len(ZEROS))) & 1
    vmask = np.array([[v in vpps for v in vpp_domain] for vpps in vpp_sets], dtype=bool)[column("vpps").astype(int)]
    row, zi, vi = np.nonzero(zmask.astype(bool)[:, :, None] & vmask[:, None, :])
    z, v = np.array(ZEROS)[zi], np.array(vpp_domain, dtype=float)[vi]
    count, c, lay, pp, shards, eshards, m, p2p, full, mem = (x[row] for x in (count, c, lay, pp, shards, eshards, m,
                                                                              p2p, full, mem))
    zp = rules.priced_zero(z, pp)  # the stage priced; z is the plan's (RuntimeRules.pp_defers_sharding)
    p2p = exposed_p2p_s(p2p, v, rules.pp_overlap)  # per micro-batch, as the price shows it

    # memory floor: stage i with n_i layers holds n_i * (state + k_i * saved), k_i its in-flight
    # micro-batches; the continuous relaxation equalises the stages, so the peak is at least
    # L / sum_i 1 / (state + k_i * saved) (per-layer minima of the model)
    grad, optim = dp_grad_bytes(setup.precision, setup.grad_reduce), optimizer_state_bytes(setup)
    per_dense = sum(memory.state_bytes(1.0, zp, shards, grad, optim))
    per_expert = sum(memory.state_bytes(1.0, zp, eshards, grad, optim))
    width = max(len(kinds) for _, kinds in layers)
    kinds = np.array([list(k) + [k[0]] * (width - len(k)) for _, k in layers])
    least_state = np.min(layer_state_bytes(per_dense[:, None], per_expert[:, None], kinds[mem, :, 0],
                                           kinds[mem, :, 1]), axis=1)
    saved = np.array([least for least, _ in layers])[mem]
    floor = L / inverse_in_flight_sum(least_state, saved, pp, m, v) + memory.RUNTIME_RESERVED_BYTES
    fits = floor * (1 - SAFETY) <= cap
    setups = len(considered)
    pruned = np.bincount(count[~fits], minlength=setups)
    least_floor = np.full(setups, np.inf)
    np.minimum.at(least_floor, count[~fits], floor[~fits] * (1 - SAFETY))
    keep = np.nonzero(fits)[0]
    if cutoff_s < np.inf:
        tp, cp, mb = (column(k)[row[keep]] for k in ("tp", "cp", "mb"))
        keep = keep[_least_pipe_s(model, cluster, setup, tp, cp, pp[keep], mb, m[keep], v[keep]) < cutoff_s]
    row, z, zp, v, count, c, lay, pp, shards, eshards, m, p2p, full, least_state, per_dense, per_expert = (
        x[keep] for x in (row, z, zp, v, count, c, lay, pp, shards, eshards, m, p2p, full, least_state,
                          per_dense, per_expert))
    floor = floor[keep]
    used, c = np.unique(c, return_inverse=True)
    ctx = build([keys[k] for k in used.tolist()])
    # one stage holds the whole model where pp = 1: a tied head's parameters count once (stage_ends)
    dense, expert = ctx.col("dense")[c] - (pp == 1) * ctx.col("head_tied")[c], ctx.col("expert")[c]

    # the largest tail is at least the optimizer step of the stage with the most parameters
    opt = optimizer_s(zp, dense / pp, expert / pp, shards, eshards, cluster, optim)
    # ZeRO-2/3 per-micro-batch traffic not hidden: sum_i max(0, x_i) >= max(0, sum_i x_i)
    coef = np.array([layout_coef(edp, dpcp, cluster) for edp, dpcp in layouts]).reshape(len(layouts), len(KINDS), 2, 2)
    # every parameter gathered at the layers' width (gathered_bytes: the ends' is at least that)
    per_param = gather_bytes(setup)
    traffic = zero_traffic_s(affine(coef, lay), zp, dp_grad_bytes(setup.precision, setup.grad_reduce),
                             (per_param * dense, per_param * expert), dense, expert)
    zfloor = np.maximum(0.0, traffic - eff.dp_overlap_fraction * ctx.col("comp_s")[c])
    rec = np.zeros(len(z))
    if full.any():
        f = np.nonzero(full)[0]
        kmax = in_flight(0, pp[f], m[f], v[f])
        inv_k = inverse_in_flight_sum(0.0, 1.0, pp[f], m[f], v[f])
        if rules.recompute_counts == "all":  # every layer recomputes: L times the least layer's
            rec[f] = L * ctx.col("rec_cost_s")[c[f]]
        else:
            rec[f] = recompute_floor(least_state[f], ctx.col("saved_b")[c[f]], ctx.col("saving")[c[f]],
                                     ctx.col("rec_cost_s")[c[f]], L, kmax, inv_k, cap)
    sigma = ctx.col("total_s")[c] + pp * p2p + zfloor + rec
    bottleneck = sigma / pp
    fixed = np.broadcast_to(rules.fixed_split(pp, v), pp.shape)
    if fixed.any():
        f = np.nonzero(fixed)[0]
        bottleneck[f] = np.maximum(bottleneck[f], even_split_max(ctx, c[f], pp[f], v[f], L) + p2p[f])
    pipe = pipeline_floor_s(bottleneck, sigma, m, v)
    bound = pipe + opt * (1 - SAFETY)
    # each setup's candidates by bound (a stable sort: ties in the order they were generated)
    order = np.lexsort((bound, count))
    ends = np.searchsorted(count[order], np.arange(setups + 1))
    refiner = Refiner(model=model, cluster=cluster, setup=setup, ctx=ctx, coef=coef, dp_overlap=dp_overlap,
                      mixed_layers=width > 1, one_kind=int(layer_kind_index(model).max()) == 0, c=c, lay=lay,
                      pp=pp, vpp=v.astype(int), m=m, zero=zp, shards=shards, eshards=eshards, sigma=sigma, rec=rec,
                      least_state=least_state, per_dense=per_dense, per_expert=per_expert, bottleneck=bottleneck,
                      p2p=p2p, full=full, fixed=fixed)
    return [Bounds(outer=outer, row=row[o], pp=pp[o], zero=z[o], vpp=v[o].astype(int), floor_bytes=floor[o],
                   bound_s=bound[o], pipe_s=pipe[o], considered=int(considered[k]), pruned_memory=int(pruned[k]),
                   least_floor_bytes=float(least_floor[k]), refiner=refiner, order=o)
            for k, o in enumerate(order[a:b] for a, b in zip(ends[:-1], ends[1:]))]


def _least_pipe_s(model, cluster, setup, tp, cp, pp, mb, m, v) -> np.ndarray:
    """The pipeline part of candidates' bounds with every stage at the compute floor: one
    micro-batch's work on a tp x cp rank group is at least its share of a sequence's floor
    (cost/step.compute_floor_s) times the micro-batch, so the sum over stages is, and the
    bottleneck at least that over pp (pipeline_floor_s; lower the more interleaved)."""
    sequence_s = compute_floor_s(model, cluster, replace(setup, gpus=1, global_batch=1))
    sigma = sequence_s * mb / (tp * cp)
    return pipeline_floor_s(sigma / pp, sigma, m, v)


def even_split_max(ctx: Table, c: np.ndarray, pp: np.ndarray, v: np.ndarray, layers: int) -> np.ndarray:
    """The largest stage time of the even split of context c[j] into pp[j] x v[j] chunks, without
    the terms that need ZeRO, recompute counts or p2p (compute, attention recompute of
    'selective', tp/cp/ep traffic, the embedding and the head): a lower bound on its bottleneck."""
    out = np.zeros(len(c))
    # the candidates grouped by (pp, v), in one sort rather than a pass over all per group
    span = int(v.max()) + 1 if len(v) else 1
    codes, group = np.unique(pp.astype(int) * span + v.astype(int), return_inverse=True)
    members = np.split(np.argsort(group, kind="stable"), np.cumsum(np.bincount(group))[:-1])
    for code, sel in zip(codes.tolist(), members):
        p, vv = divmod(code, span)
        used, back = np.unique(c[sel], return_inverse=True)
        out[sel] = ctx.even_stage_s(used, p, vv, layers).max(axis=1)[back]
    return out
