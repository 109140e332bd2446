"""Lower bounds of the search: for every outer choice, a step time no split or recompute count
can beat and a memory floor every split exceeds somewhere (search/driver.py prices the choices
in the order of these bounds and stops once the next bound is no better than the best plan).

    step >= (m - 1/v) * max_i t_i + sum_i t_i / v + max_i tail_i,
    max_i t_i >= max(sum_i t_i / p, largest stage of the even split when the split is fixed),
where sum_i t_i (all layers, the embedding, the head, every stage's p2p, the least recomputation
that lets the model fit, the ZeRO-2/3 traffic that cannot hide) does not depend on the split,
and max_i tail_i >= the optimizer step of the stage holding the most parameters.

Vectorised: the cost model prices each layer context (tp, cp, ep, micro-batch, recompute mode)
once; every candidate (one row per outer choice, times its ZeRO stages and vpps) is then
bounded by array arithmetic over those contexts, with no Python object per candidate.

Refinement (_Tails, a batch of candidates at a time, in bound order): the largest tail is at
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

from planner.cost import comm, compute, memory
from planner.cost.pipeline import even_chunks, in_flight
from planner.cost.step import (
    ADAM_BYTES_PER_PARAM,
    context_tables,
    dp_grad_bytes,
    layer_kind_index,
    layer_memory,
    p2p_s,
    selective_saves_memory,
    stage_memory,
    stage_tail_s,
    tied_head_params,
    zero_traffic_s,
)
from planner.placement import span
from planner.search import space, stages
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import TrainingSetup

SAFETY = 1e-9
"""relative slack on every bound and floor: the closed forms round differently from the pricing"""
ZEROS = (0, 1, 2, 3)
SLICE = 256
"""candidates whose per-range memory tables are built at once (bounds the arrays' size)"""
BISECTIONS = 30
"""halvings of a bisected bound (its lower end is kept: valid however many)"""


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
    tails: _Tails | None = None
    """None only when there is no candidate"""

    def knobs(self, j: int) -> dict:
        """Candidate j's knobs other than zero and vpp."""
        return self.outer.knobs(int(self.row[j]), int(self.pp[j]))

    def refined_s(self, idx: np.ndarray, cutoff: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
        """Tighter bounds of candidates idx and a floor of their largest tail: the pipeline part
        (with the free split's integrality, _Tails.pipe_floor_s) plus the least largest tail
        (_Tails.floor_s), never below the first bound; infinite when no split of the candidate
        fits in memory (_Tails.fits, checked only where the bound is below `cutoff`)."""
        tail = np.maximum(self.bound_s[idx] - self.pipe_s[idx], self.tails.floor_s(idx) * (1 - SAFETY))
        bound = np.maximum(self.bound_s[idx], self.tails.pipe_floor_s(idx) + tail)
        check = np.nonzero(bound < cutoff)[0]
        bound[check[~self.tails.fits(idx[check])]] = np.inf
        return bound, tail


@dataclass(frozen=True, slots=True)
class _Context:
    """What the bounds need of one layer context, from the cost model's own layer prices."""

    total_s: float
    """per micro-batch: every layer's compute, base-mode recompute and tp/cp/ep time, plus the ends"""
    comp_s: float
    dense: float
    expert: float
    saved_b: float
    saving: float
    rec_cost_s: float
    """least saved bytes and largest saving of a layer without recompute, least recompute time"""
    prefix: dict
    """the context's prefix sums (cost/step.LayerTables)"""
    ends: dict
    transient_bytes: float
    prefetch_bytes: float
    per: np.ndarray
    """prefix sums of a layer's stage time without ZeRO, recompute counts and p2p"""
    layer_s: float
    """the least stage time of one layer (per's steps)"""
    major: tuple
    """the most numerous layer kind: (count, dense params, expert params, saved bytes, saving,
    stage time, full recompute time) of one such layer"""
    first_s: float
    last_s: float


def _major(K: dict, model: ModelSpec) -> tuple:
    """_Context.major from the per-kind rows of cost/step's layer tables."""
    counts = np.bincount(layer_kind_index(model), minlength=len(K["params"]))
    k = int(np.argmax(counts))
    per = K["comp"] + K["rec_b"] + K["tp"] + K["cp"] + K["ep"]
    return (float(counts[k]), float(K["params"][k]), float(K["expert"][k]), float(K["saved_b"][k]),
            float(K["saved_b"][k] - K["saved_f"][k]), float(per[k]), float(K["rec_f"][k]))


class _Table:
    """The layer contexts of one search as columns (a scalar per context, or its prefix sums
    as a matrix), each built once, on first use."""

    __slots__ = ("ctx", "_columns")

    def __init__(self, ctx: list):
        self.ctx, self._columns = ctx, {}

    def col(self, name: str) -> np.ndarray:
        """A _Context field, or an entry of its `ends`, per context."""
        if name not in self._columns:
            field = name in _Context.__dataclass_fields__
            self._columns[name] = np.array([getattr(x, name) if field else x.ends[name] for x in self.ctx])
        return self._columns[name]

    def prefix(self, name: str) -> np.ndarray:
        """(contexts, layers + 1) prefix sums: 'per', or a key of cost/step's prefix tables."""
        key = ("prefix", name)
        if key not in self._columns:
            self._columns[key] = np.stack([x.per if name == "per" else x.prefix[name] for x in self.ctx])
        return self._columns[key]


@lru_cache(maxsize=16384)
def _context(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, tp: int, cp: int, ep: int, mb: int,
             sp: bool, mode: str, spans: tuple) -> _Context:
    tab = context_tables(model, cluster, setup, tp, cp, ep, mb, sp, mode, dict(zip(("tp", "cp", "ep"), spans)))
    P, E, K, L = tab.prefix, tab.ends, tab.kinds, model.layers
    per = P["comp"] + P["rec_b"] + P["tp"] + P["cp"] + P["ep"]
    return _Context(
        total_s=float(per[L] + E["emb_comp"] + E["emb_tp"] + E["head_comp"] + E["head_tp"]),
        comp_s=float(P["comp"][L] + E["emb_comp"] + E["head_comp"]),
        dense=float(P["params"][L] + E["emb_params"] + E["head_params"]), expert=float(P["expert"][L]),
        saved_b=float(K["saved_b"].min()), saving=float((K["saved_b"] - K["saved_f"]).max()),
        rec_cost_s=float(K["rec_f"].min()), prefix=P, ends=E, transient_bytes=tab.transient_bytes,
        prefetch_bytes=tab.prefetch_bytes, per=per, layer_s=float(np.diff(per).min()), major=_major(K, model),
        first_s=E["emb_comp"] + E["emb_tp"], last_s=E["head_comp"] + E["head_tp"])


def bound_all(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict, rules: space.RuntimeRules,
              progress=None) -> Bounds:
    """Bound every candidate of the space (search/space.py) that honours `fixed`."""
    g = min(cluster.gpus_per_node, setup.gpus)
    contexts: dict = {}
    memories: dict = {}
    layouts: dict = {}
    p2ps: dict = {}
    vpp_sets: dict = {}
    zero_sets: dict = {}
    rows: list = []
    considered = dominated = 0
    modes = space.allowed(space.RECOMPUTES, fixed.get("recompute"))
    # the layer context depends on the setup's sequence, precision and attention only
    shape = replace(setup, gpus=1, global_batch=1, runtime="any")
    orders = rules.orders if "order" not in fixed else (fixed["order"],)
    vpp_ids: dict = {}
    for tp, cp, pp, dp in space.degree_tuples(model, cluster, setup, fixed, rules):
        if progress and len(rows) % 256 == 0:
            progress(0, 0, f"bounding {considered:,} candidates")
        sp = fixed.get("sequence_parallel", tp > 1)
        mbs = space.allowed(space.divisors(setup.global_batch // dp), fixed.get("micro_batch"))
        alone = tp == pp == cp == 1
        zkey = (pp > 1, alone)
        if zkey not in zero_sets:
            zero_sets[zkey] = tuple(z for z in (rules.zero_with_pp if pp > 1 else rules.zero)
                                    if fixed.get("zero") in (None, z) and (z or alone or not rules.replicate_alone))
        zeros = zero_sets[zkey]
        for ep in space.ep_options(model, dp, cp, fixed.get("ep"), rules):
            placed = set()
            for o, order in enumerate(orders):
                spans = _spans(order, tp, cp, dp, pp, ep, g)
                duplicate = spans in placed  # another rank order that places every group alike
                placed.add(spans)
                lay = layouts.setdefault(spans[4:], len(layouts))
                for mb in mbs:
                    m = setup.global_batch // (dp * mb)
                    if (pp, m) not in vpp_sets:
                        vpp_sets[(pp, m)] = tuple(space.vpp_options(model, pp, m, fixed.get("vpp"), rules))
                    vpps = vpp_sets[(pp, m)]
                    vid = vpp_ids.setdefault(vpps, len(vpp_ids))
                    considered += len(modes) * len(vpps) * len(zeros)
                    if duplicate or not vpps or not zeros or (sp and tp == 1):
                        continue
                    inter = spans[3].nodes > 1
                    if (tp, cp, mb, inter) not in p2ps:
                        p2ps[(tp, cp, mb, inter)] = p2p_s(model, cluster, setup, tp, cp, mb, 1, inter)
                    for i, mode in enumerate(modes):
                        if (mode == "selective" and "none" in modes
                                and not selective_saves_memory(model, shape, tp, cp, mb, sp)):
                            dominated += len(vpps) * len(zeros)  # the same memory as 'none', more time
                            continue
                        key = (tp, cp, ep, mb, sp, mode, spans[:3])
                        if key not in contexts:
                            contexts[key] = len(contexts)
                        mkey = (tp, cp, ep, mb, sp, mode)
                        if mkey not in memories:
                            memories[mkey] = len(memories)
                        rows.append((contexts[key], lay, pp, dp * cp, max(1, dp * cp // ep), m,
                                     p2ps[(tp, cp, mb, inter)] if pp > 1 else 0.0,
                                     tied_head_params(model, tp) if pp == 1 else 0.0, mode == "full",
                                     _mask(zeros, ZEROS), vid, memories[mkey], tp, cp, dp, ep, mb, i, o, sp))
    outer = _Outer(np.array(rows, dtype=float).reshape(-1, 20)[:, 12:].astype(int), tuple(modes), tuple(orders),
                   fixed.get("dp_overlap", True))
    layers = [layer_memory(model, shape, *k) for k in memories]

    def build(keys):  # the layer contexts, priced only for candidates that pass the memory floor
        return _Table([_context(model, cluster, shape, *k) for k in keys])

    return replace(_bound_rows(model, cluster, setup, rules, outer, rows, list(contexts), build, layers,
                               list(layouts), list(vpp_ids), considered, fixed.get("dp_overlap", True)),
                   dominated=dominated)


@lru_cache(maxsize=65536)
def _spans(order: str, tp: int, cp: int, dp: int, pp: int, ep: int, g: int) -> tuple:
    """Spans of the tp, cp, ep, pp, edp and dp*cp groups (the order of cost/step.profile)."""
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep}
    return tuple(span(order, degrees, (d,), g) for d in ("tp", "cp", "ep", "pp", "edp")) + (
        span(order, degrees, ("cp", "dp"), g),)


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


def _bound_rows(model, cluster, setup, rules, outer, rows, keys, build, layers, layouts, vpp_sets, considered,
                dp_overlap) -> Bounds:
    """The bounds and floors of every (row, ZeRO stage, vpp) at once (formulas: module docstring).
    The memory floor comes first, from `layers` (cost/step.layer_memory per row's column 11);
    the layer contexts `keys` are priced (`build`) only for the candidates that pass it."""
    cap, L = cluster.gpu.memory_bytes, model.layers
    eff = cluster.efficiency
    vpp_domain = sorted({v for vpps in vpp_sets for v in vpps})
    if not rows:
        return Bounds(outer, *(np.zeros(0, dtype=int),) * 4, *(np.zeros(0),) * 3, considered, 0, float("inf"))
    table = np.array(rows, dtype=float)
    c, lay, pp, shards, eshards, m = (table[:, k].astype(int) for k in range(6))
    p2p, tied, full = table[:, 6], table[:, 7], table[:, 8].astype(bool)
    zmask = (table[:, 9].astype(int)[:, None] >> np.arange(len(ZEROS))) & 1
    vmask = np.array([[v in vpps for v in vpp_domain] for vpps in vpp_sets], dtype=bool)[table[:, 10].astype(int)]
    row, zi, vi = np.nonzero(zmask.astype(bool)[:, :, None] & vmask[:, None, :])
    z, v = np.array(ZEROS)[zi], np.array(vpp_domain, dtype=float)[vi]
    mem = table[:, 11].astype(int)
    c, lay, pp, shards, eshards, m, p2p, tied, full, mem = (x[row] for x in (c, lay, pp, shards, eshards, m, p2p,
                                                                             tied, full, mem))

    # memory floor: stage i with n_i layers holds n_i * (state + k_i * saved), k_i its in-flight
    # micro-batches; the continuous relaxation equalises the stages, so the peak is at least
    # L / sum_i 1 / (state + k_i * saved) (per-layer minima of the model)
    per_dense, per_expert = np.zeros(len(z)), np.zeros(len(z))
    for zero in ZEROS:
        sel = z == zero
        per_dense[sel] = sum(memory.state_bytes(1.0, zero, shards[sel]))
        per_expert[sel] = sum(memory.state_bytes(1.0, zero, eshards[sel]))
    width = max(len(kinds) for _, kinds in layers)
    kinds = np.array([list(k) + [k[0]] * (width - len(k)) for _, k in layers])
    least_state = np.min(per_dense[:, None] * kinds[mem, :, 0] + per_expert[:, None] * kinds[mem, :, 1], axis=1)
    saved = np.array([least for least, _ in layers])[mem]
    floor = L / inverse_in_flight_sum(least_state, saved, pp, m, v) + memory.RUNTIME_RESERVED_BYTES
    fits = floor * (1 - SAFETY) <= cap
    pruned = int((~fits).sum())
    least_floor = float(floor[~fits].min()) * (1 - SAFETY) if pruned else float("inf")
    keep = np.nonzero(fits)[0]
    row, z, v, c, lay, pp, shards, eshards, m, p2p, tied, full, least_state, per_dense, per_expert = (
        x[keep] for x in (row, z, v, c, lay, pp, shards, eshards, m, p2p, tied, full, least_state,
                          per_dense, per_expert))
    floor = floor[keep]
    used, c = np.unique(c, return_inverse=True)
    ctx = build([keys[k] for k in used.tolist()])
    dense, expert = ctx.col("dense")[c] - tied, ctx.col("expert")[c]

    # the largest tail is at least the optimizer step of the stage with the most parameters
    sharded = z > 0
    opt = compute.memory_time_s(ADAM_BYTES_PER_PARAM * (dense / np.where(sharded, shards, 1)
                                                        + expert / np.where(sharded, eshards, 1)) / pp,
                                cluster.gpu.hbm_Bps, eff)
    # ZeRO-2/3 per-micro-batch traffic not hidden: sum_i max(0, x_i) >= max(0, sum_i x_i)
    coef = np.array([[[comm.affine_s(kind, group, cluster) for group in (dpcp, edp)] for kind in _KINDS]
                     for edp, dpcp in layouts]).reshape(len(layouts), len(_KINDS), 2, 2)
    traffic = zero_traffic_s(_affine(coef, lay), z, dp_grad_bytes(setup.precision), dense, expert)
    zfloor = np.maximum(0.0, traffic - eff.dp_overlap_fraction * ctx.col("comp_s")[c])
    rec = np.zeros(len(z))
    if full.any():
        f = np.nonzero(full)[0]
        kmax = in_flight(0, pp[f], m[f], v[f])
        inv_k = inverse_in_flight_sum(0.0, 1.0, pp[f], m[f], v[f])
        rec[f] = recompute_floor(least_state[f], ctx.col("saved_b")[c[f]], ctx.col("saving")[c[f]],
                                 ctx.col("rec_cost_s")[c[f]], L, kmax, inv_k, cap)
    sigma = ctx.col("total_s")[c] + pp * p2p * v + zfloor + rec
    bottleneck = sigma / pp
    fixed = (pp == 1) | (v > 1) if rules.uneven_split != "none" else np.ones(len(z), dtype=bool)
    if fixed.any():
        f = np.nonzero(fixed)[0]
        bottleneck[f] = np.maximum(bottleneck[f], even_split_max(ctx, c[f], pp[f], v[f], L) + p2p[f] * v[f])
    pipe = pipeline_floor_s(bottleneck, sigma, m, v)
    bound = pipe + opt * (1 - SAFETY)
    order = np.argsort(bound, kind="stable")
    tails = _Tails(model=model, cluster=cluster, setup=setup, ctx=ctx, coef=coef, dp_overlap=dp_overlap,
                   mixed_layers=width > 1, one_kind=int(layer_kind_index(model).max()) == 0,
                   **{k: x[order] for k, x in dict(c=c, lay=lay, pp=pp, vpp=v.astype(int), m=m, zero=z, shards=shards,
                                                   sigma=sigma, rec=rec, bottleneck=bottleneck, p2p=p2p,
                                                   least_state=least_state, per_dense=per_dense,
                                                   per_expert=per_expert,
                                                   eshards=eshards, tied=tied, full=full, fixed=fixed).items()})
    return Bounds(outer=outer, row=row[order], pp=pp[order], zero=z[order], vpp=v[order].astype(int),
                  floor_bytes=floor[order],
                  bound_s=bound[order],
                  pipe_s=pipe[order], considered=considered, pruned_memory=pruned, least_floor_bytes=least_floor,
                  tails=tails)


_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def _affine(coef: np.ndarray, lay: np.ndarray):
    """coll(kind, bytes, group) of cost/step's shared formulas for candidates on layouts `lay`,
    from each collective's affine coefficients (comm.affine_s); bytes shaped (candidates, ...)."""
    def coll(kind, n_bytes, group):
        n_bytes = np.asarray(n_bytes)
        k = coef[lay, _KINDS.index(kind), 0 if group == "dpcp" else 1]
        extra = (1,) * (n_bytes.ndim - 1)
        return (k[:, 0].reshape(-1, *extra) * n_bytes + k[:, 1].reshape(-1, *extra)) * (n_bytes > 0)
    return coll


@dataclass(frozen=True, slots=True)
class _Tails:
    """What a tail floor needs of every candidate (in bound order) and of the search."""

    model: ModelSpec
    cluster: Cluster
    setup: TrainingSetup
    ctx: _Table
    coef: np.ndarray
    dp_overlap: bool
    mixed_layers: bool
    """whether the model's layers differ (dense and MoE layers: different parameters)"""
    one_kind: bool
    """whether every layer of the chain is the same layer"""
    c: np.ndarray
    lay: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    m: np.ndarray
    zero: np.ndarray
    shards: np.ndarray
    eshards: np.ndarray
    sigma: np.ndarray
    rec: np.ndarray
    """the recompute floor inside sigma"""
    least_state: np.ndarray
    """the least state bytes of a layer"""
    per_dense: np.ndarray
    per_expert: np.ndarray
    """state bytes per dense and per expert parameter (the candidate's ZeRO stage and shards)"""
    bottleneck: np.ndarray
    p2p: np.ndarray
    tied: np.ndarray
    full: np.ndarray
    fixed: np.ndarray

    def pipe_floor_s(self, idx: np.ndarray) -> np.ndarray:
        """The pipeline part of the bound, tightened. Where the split is free, some stage holds
        at least n = ceil(L/p) layers, so the bottleneck is at least the least time of such a
        range at the first, the last or a middle stage (without the terms that need ZeRO or
        recompute counts; a stage's time only grows with its layers), and at least the first
        stage's time with layer 0 and the last's with layer L-1. Where it is fixed and the
        mode is 'full', each stage's least recomputation that fits (_fixed_recompute) adds to
        its time and, beyond the model-wide recompute floor, to the sum."""
        L = self.model.layers
        pp, free = self.pp[idx], ~self.fixed[idx]
        bottleneck, sigma = self.bottleneck[idx].copy(), self.sigma[idx].copy()
        for sel, rec in self._fixed_recompute(idx):
            j, p, v = idx[sel], int(self.pp[idx[sel[0]]]), int(self.vpp[idx[sel[0]]])
            chunks, _ = even_chunks(L, p, v)
            total, _ = self._sums(j, [(a[None, :], b[None, :]) for a, b in chunks])
            stage = np.arange(p)[None, :]
            base = (total("per") + (stage == 0) * self.ctx.col("first_s")[self.c[j]][:, None]
                    + (stage == p - 1) * self.ctx.col("last_s")[self.c[j]][:, None])
            times = base + rec + (self.p2p[j] * v)[:, None]
            bottleneck[sel] = np.maximum(bottleneck[sel], times.max(axis=1))
            sigma[sel] += np.maximum(0.0, rec.sum(axis=1) - self.rec[j])
        for p in sorted(set(pp[free].tolist())):
            sel = np.nonzero(free & (pp == p))[0]
            j = idx[sel]
            n = -(-L // p)
            used, back = np.unique(self.c[j], return_inverse=True)
            per = self.ctx.prefix("per")[used]
            least = np.minimum(per[:, n] + self.ctx.col("first_s")[used],
                               per[:, L] - per[:, L - n] + self.ctx.col("last_s")[used])
            if p >= 3:
                least = np.minimum(least, np.min(per[:, n + 1:L] - per[:, 1:L - n], axis=1))
            # and the first stage holds layer 0 and the embedding, the last layer L-1 and the head
            ends = np.maximum(per[:, 1] + self.ctx.col("first_s")[used],
                              per[:, L] - per[:, L - 1] + self.ctx.col("last_s")[used])
            bottleneck[sel] = np.maximum(bottleneck[sel], np.maximum(least, ends)[back] + self.p2p[j])
        for p in sorted(set(pp[free].tolist()) - {1}):
            sel = np.nonzero(free & (pp == p))[0]
            least = np.max([self._least_bottleneck(idx[sel], p, cls) for cls in self._classes(idx[sel])], axis=0)
            if self.mixed_layers:
                least = np.maximum(least, self._greedy_bottleneck(idx[sel], p))
            bottleneck[sel] = np.maximum(bottleneck[sel], least + self.p2p[idx[sel]])
        for p in sorted(set(pp[free & self.full[idx]].tolist()) - {1}):
            sel = np.nonzero(free & self.full[idx] & (pp == p))[0]
            j = idx[sel]
            least = np.max([self._least_recompute(j, p, cls) * cls.rec[:, 0] for cls in self._classes(j)], axis=0)
            extra = np.maximum(0.0, least * (1 - SAFETY) - self.rec[j])
            sigma[sel] += extra
            bottleneck[sel] = np.maximum(bottleneck[sel], sigma[sel] / p)
        return pipeline_floor_s(bottleneck, sigma, self.m[idx], self.vpp[idx])

    def _greedy_bottleneck(self, j: np.ndarray, p: int) -> np.ndarray:
        """Least largest stage time over contiguous splits whose stages may also be empty, with
        each layer's own time (no ZeRO or recompute terms) and the ends' time on the first and
        last stage: a bisection on T where each stage, in order, reaches as far as T allows
        (reaching furthest is optimal: what a stage can hold, any part of it can too). Where
        layers differ (dense and MoE layers) this is tighter than counting layers at the least
        layer time."""
        L, k = self.model.layers, len(j)
        width = space.stage_width(L, p)
        c = self.c[j]
        row = np.arange(k)
        per = self.ctx.prefix("per")[c]
        first, last = self.ctx.col("first_s")[c], self.ctx.col("last_s")[c]
        big = float((per[:, L] + first + last).max()) * 4 + 1.0  # rows never reach into the next
        flat = (per + row[:, None] * big).ravel()

        def feasible(T):
            a = np.zeros(k, dtype=int)
            for stage in range(p):
                budget = T - (first if stage == 0 else 0.0) - (last if stage == p - 1 else 0.0)
                timed = np.searchsorted(flat, per[row, a] + budget + row * big, side="right") - 1 - row * (L + 1)
                a = np.maximum(a, np.minimum(np.minimum(timed, a + width), L))
            return a >= L

        lo, hi = np.zeros(k), per[:, L] + first + last
        ok = feasible(hi)
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            fits = feasible(mid)
            hi, lo = np.where(fits, mid, hi), np.where(fits, lo, mid)
        return np.where(ok, lo * (1 - SAFETY), np.inf)

    def _classes(self, j: np.ndarray):
        """The layer sets the memory relaxations run on (_Layers): all layers at the model's
        per-layer minima, and, where layers differ, only the most numerous kind at its own
        values (leaving layers out only loosens a lower bound)."""
        c = self.c[j]
        col = (slice(None), None)
        yield _Layers(self.model.layers, self.least_state[j][col], self.ctx.col("saved_b")[c][col],
                      self.ctx.col("saving")[c][col], self.ctx.col("layer_s")[c][col],
                      self.ctx.col("rec_cost_s")[c][col])
        if self.mixed_layers:
            count, params, expert, saved, saving, tau, rec = self.ctx.col("major")[c].T
            state = self.per_dense[j] * params + self.per_expert[j] * expert
            yield _Layers(int(count[0]), state[col], saved[col], saving[col], tau[col], rec[col])

    def _least_bottleneck(self, j: np.ndarray, p: int, cls: _Layers) -> np.ndarray:
        """Least largest stage time of any split that fits, as a bisection on T over fractional
        splits: with a layer's least time tau, stage i holds up to T / tau layers while
        u_i = C / (state + k_i saved) of them fit as they are; beyond u_i (recompute 'full'
        only) each extra layer needs rho_i = (state + k_i saved) / (k_i saving) recomputed
        layers of at least `rec` seconds, so the stage holds up to (T + rho_i rec u_i) /
        (tau + rho_i rec) layers, and never more than C / (state + k_i (saved - saving)) nor
        the stage width; the first and last stages have T less the embedding's and the head's
        time; a stage holds whole layers. T is feasible when the stages can hold all L layers
        (per-layer minima of the layers in `cls`, the ends' memory left out: a lower bound)."""
        L, state, saved, saving, tau, rec = cls
        C = self.cluster.gpu.memory_bytes - memory.RUNTIME_RESERVED_BYTES
        c = self.c[j]
        full = self.full[j][:, None]
        k = in_flight(np.arange(p)[None, :], p, self.m[j][:, None], 1)
        cost = state + k * saved
        free_layers = C / cost
        with np.errstate(divide="ignore", invalid="ignore"):
            most = np.where(full & (cost > k * saving), C / (cost - k * saving), np.where(full, L, free_layers))
            rho = np.where(full & (saving > 0), cost / (k * saving), np.inf)
        most = np.minimum(most, space.stage_width(self.model.layers, p))

        # the first stage also runs the embedding and the last the LM head
        ends = np.zeros((len(j), p))
        ends[:, 0] += self.ctx.col("first_s")[c]
        ends[:, -1] += self.ctx.col("last_s")[c]

        def held(T):
            T = np.maximum(T - ends, 0.0)
            with np.errstate(invalid="ignore"):
                beyond = np.where(np.isfinite(rho), (T + rho * rec * free_layers) / (tau + rho * rec), free_layers)
            # whole layers: a stage holds at most the integer part (a hair of slack for rounding)
            return np.floor(np.minimum(most, np.where(T <= free_layers * tau, T / tau, beyond)) + 1e-9).sum(axis=1)

        lo = L * tau[:, 0] / p
        hi = L * (tau[:, 0] + np.where(self.full[j], rec[:, 0], 0.0)) + tau[:, 0] + ends.max(axis=1)
        feasible = held(hi[:, None]) >= L * (1 - SAFETY)
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            ok = held(mid[:, None]) >= L * (1 - SAFETY)
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        return np.where(feasible, lo * (1 - SAFETY), np.inf)

    def _least_recompute(self, j: np.ndarray, p: int, cls: _Layers) -> np.ndarray:
        """Least count of recomputed layers any split needs to fit, as a linear programme
        (layers and counts fractional, per-layer minima of the model): stage i holds
        u_i = C / c_i layers without recomputing, c_i = state + k_i saved (k_i in flight,
        C = capacity - reserve); each layer beyond costs rho_i = c_i / (k_i saving)
        recomputed layers, up to C / (c_i - k_i saving) layers in all. The layers beyond
        sum u_i go, cheapest rho first, to the stages with the most in flight (rho falls with
        k_i, which falls with i); infinite when they do not fit anywhere. Over the layers of
        `cls` at their per-layer minima."""
        L, state, saved, saving = cls.layers, cls.state, cls.saved, cls.saving
        C = self.cluster.gpu.memory_bytes - memory.RUNTIME_RESERVED_BYTES
        k = in_flight(np.arange(p)[None, :], p, self.m[j][:, None], self.vpp[j][:, None])
        cost = state + k * saved
        free_layers = C / cost
        with np.errstate(divide="ignore", invalid="ignore"):
            most = np.where(cost > k * saving, C / (cost - k * saving), np.inf)
            rho = cost / (k * saving)
        room = np.clip(most - free_layers, 0.0, L)  # no stage takes more than all the layers
        excess = L - free_layers.sum(axis=1)
        before = np.cumsum(room, axis=1) - room  # room of the stages filled earlier
        placed = np.clip(excess[:, None] - before, 0.0, room)
        with np.errstate(invalid="ignore"):  # 0 * inf where a stage takes nothing
            needed = np.where(placed > 0, placed * rho, 0.0).sum(axis=1)
        return np.where(excess <= 0, 0.0, np.where(room.sum(axis=1) >= excess, needed, np.inf))

    def floor_s(self, idx: np.ndarray) -> np.ndarray:
        """Per candidate, the least largest tail any split and recompute count can have: the
        first stage holds [0, n) and the last [L-n, L) for some n the space allows (with a fixed
        split, their known layers), so the largest tail is at least the least tail either can
        have, each computed with all its layers recomputed under 'full' (the most backward to
        hide the reduction behind; the optimizer step does not depend on it)."""
        out = np.zeros(len(idx))
        pp, vpp, fixed = self.pp[idx], self.vpp[idx], self.fixed[idx]
        L = self.model.layers
        for p, v, fx in sorted(set(zip(pp.tolist(), vpp.tolist(), fixed.tolist()))):
            sel = np.nonzero((pp == p) & (vpp == v) & (fixed == fx))[0]
            if fx:
                chunks, _ = even_chunks(L, p, v)
                first = [(a[:1], b[:1]) for a, b in chunks]
                last = [(a[-1:], b[-1:]) for a, b in chunks]
            else:
                n = np.arange(1, min(space.stage_width(L, p), L - p + 1) + 1)
                first, last = [(0 * n, n)], [(L - n, L + 0 * n)]
            out[sel] = np.maximum(self._least_tail(idx[sel], 0, p, first), self._least_tail(idx[sel], p - 1, p, last))
            if not fx and p > 1:
                out[sel] = np.maximum(out[sel], self._largest_stage_tail(idx[sel], p))
        return out

    def _largest_stage_tail(self, j: np.ndarray, p: int) -> np.ndarray:
        """Some stage holds at least n = ceil(L/p) layers, so the largest tail is at least the
        least tail of a range of n..width layers: at the first stage ([0, ...)), the last
        ([..., L)) or a middle one; a middle stage's tail only falls with its index (more
        micro-batches to hide behind), so stage p-2 stands for them all."""
        L = self.model.layers
        n = -(-L // p)
        lengths = np.arange(n, min(space.stage_width(L, p), L - p + 1) + 1)
        least = np.minimum(self._least_tail(j, 0, p, [(0 * lengths, lengths)]),
                           self._least_tail(j, p - 1, p, [(L - lengths, L + 0 * lengths)]))
        if p >= 3:
            # with one layer kind every start gives the same sums: one start stands for all
            starts = np.arange(1, 2 if self.one_kind else L)
            a, size = np.meshgrid(starts, lengths, indexing="ij")
            keep = a + size <= L - 1
            least = np.minimum(least, self._least_tail(j, p - 2, p, [(a[keep], (a + size)[keep])]))
        return least

    def fits(self, idx: np.ndarray) -> np.ndarray:
        """Per candidate, False when its split is fixed (the even split) and some stage exceeds
        the GPU's memory even at its least: no recomputation, or (recompute 'full') all its
        layers recomputed, whichever holds less."""
        out = np.ones(len(idx), dtype=bool)
        for p, v, sel in self._fixed_groups(idx):
            kept, rebuilt, _, _, _ = self._fixed_memory(idx[sel], p, v)
            least = np.where(self.full[idx[sel]][:, None], np.minimum(kept, rebuilt), kept)
            out[sel] = np.all(least * (1 - SAFETY) <= self.cluster.gpu.memory_bytes, axis=1)
        pp, free = self.pp[idx], ~self.fixed[idx]
        for p in sorted(set(pp[free].tolist()) - {1}):
            sel = np.nonzero(free & (pp == p))[0]
            for part in range(0, len(sel), SLICE):  # arrays of (candidates, layers, width)
                out[sel[part:part + SLICE]] = self._split_exists(idx[sel[part:part + SLICE]], p)
        return out

    def _split_exists(self, j: np.ndarray, p: int) -> np.ndarray:
        """Per candidate, whether some contiguous split into p stages of at most stage_width
        layers fits in memory, each stage at its least (as in fits): which layer boundaries the
        first i stages can reach, stage by stage (a boolean dynamic programme over every range
        of every candidate at once). The first stage starts at layer 0 and the last ends at L;
        a middle stage's memory is affine in its in-flight micro-batches, so it is evaluated at
        0 and 1 and scaled per stage."""
        L, cap = self.model.layers, self.cluster.gpu.memory_bytes
        width = space.stage_width(L, p)
        n = np.arange(1, width + 1)
        m = self.m[j][:, None]

        def least(chunks, first, last, inflight):
            total, end = self._sums(j, chunks)
            kept = self._memory(j, total, end, first, last, inflight, "saved_b", False)
            if not self.full[j].any():
                return kept
            rebuilt = self._memory(j, total, end, first, last, inflight, "saved_f", True)
            return np.where(self.full[j].reshape(-1, *(1,) * (kept.ndim - 1)), np.minimum(kept, rebuilt), kept)

        def fits(memory):
            return memory * (1 - SAFETY) <= cap

        reach = np.zeros((len(j), L + 1), dtype=bool)
        reach[:, 0] = True
        head = fits(least([(0 * n[None, :], n[None, :])], True, False, in_flight(0, p, m, 1)))
        reach[:, n] = head & (n <= L - (p - 1))
        if p > 2:
            a = np.arange(L)[None, :, None]
            valid = (a + n[None, None, :] <= L)
            ranges = np.minimum(a + n[None, None, :], L)

            def middle(saved_key, rebuilt, k):
                """A middle stage's memory over every range [a, a+n): affine in the layers' sums,
                so the empty range plus prefix sums of each layer's increment."""
                layer = np.arange(L)[None, :]
                one = self._memory(j, *self._sums(j, [(layer, layer + 1)]), False, False, k, saved_key, rebuilt)
                empty = self._memory(j, *self._sums(j, [(layer[:, :1], layer[:, :1])]), False, False, k,
                                     saved_key, rebuilt)
                steps = np.zeros((len(j), L + 1))
                np.cumsum(one - empty, axis=1, out=steps[:, 1:])
                rows = np.arange(len(j))[:, None, None]
                return empty[:, :, None] + steps[rows, ranges] - steps[rows, a]

            kept = [middle("saved_b", False, k) for k in (0.0, 1.0)]
            rebuilt = [middle("saved_f", True, k) for k in (0.0, 1.0)]
            full = self.full[j][:, None, None]
            for stage in range(1, p - 1):
                k = in_flight(stage, p, self.m[j], 1)[:, None, None]
                memory = kept[0] + k * (kept[1] - kept[0])
                memory = np.where(full, np.minimum(memory, rebuilt[0] + k * (rebuilt[1] - rebuilt[0])), memory)
                ok = valid & fits(memory)
                nxt = np.zeros_like(reach)
                for size in range(1, width + 1):
                    nxt[:, size:] |= reach[:, :L + 1 - size] & ok[:, :L + 1 - size, size - 1]
                reach = nxt
        tail = fits(least([(L - n[None, :], L + 0 * n[None, :])], False, True, in_flight(p - 1, p, m, 1)))
        return np.any(reach[:, L - n] & tail & (n <= L - 1), axis=1)

    def _memory(self, j: np.ndarray, total, end, first, last, inflight, saved_key: str, rebuilt: bool,
                less_saved=0.0) -> np.ndarray:
        """Peak memory of candidates j's stage over the ranges `total` sums (cost/step's
        stage_memory): the first and/or the last stage, `inflight` micro-batches in flight,
        activations from prefix `saved_key` less `less_saved` per micro-batch, and the rebuild
        buffer of a recomputed layer when `rebuilt`."""
        dense = total("params")
        extra = (1,) * (dense.ndim - 1)
        dense = dense + first * end("emb_params") + last * (end("head_params") - self.tied[j].reshape(-1, *extra))
        saved = total(saved_key) + first * end("emb_saved") - less_saved
        head = last * end("head_saved")
        transient = self.ctx.col("transient_bytes")[self.c[j]].reshape(-1, *extra) * rebuilt
        prefetch = self.ctx.col("prefetch_bytes")[self.c[j]].reshape(-1, *extra)
        expert = total("expert")
        shape = np.broadcast_shapes(dense.shape, saved.shape, np.shape(inflight), np.shape(head))
        inflight, head = np.broadcast_to(inflight, shape), np.broadcast_to(head, shape)
        out = np.zeros(shape)
        for zero in ZEROS:
            zs = self.zero[j] == zero
            if zs.any():
                out[zs] = sum(stage_memory(zero, dense[zs], expert[zs], self.shards[j][zs].reshape(-1, *extra),
                                           self.eshards[j][zs].reshape(-1, *extra), inflight[zs], saved[zs],
                                           head[zs], transient[zs], prefetch[zs]))
        return out

    def _fixed_groups(self, idx: np.ndarray):
        """(pp, vpp, positions in idx) of the fixed-split candidates, grouped."""
        pp, vpp, fixed = self.pp[idx], self.vpp[idx], self.fixed[idx]
        for p, v in sorted(set(zip(pp[fixed].tolist(), vpp[fixed].tolist()))):
            yield p, v, np.nonzero(fixed & (pp == p) & (vpp == v))[0]

    def _fixed_memory(self, j: np.ndarray, p: int, v: int):
        """Per candidate and stage of the even split: peak memory with no layer recomputed,
        with all of them recomputed, with the rebuild buffer but nothing recomputed yet, how
        much each recomputed layer saves at most (the model's largest per-layer saving: memory
        is at least affine in the count then), and the stage's layer count."""
        chunks, sizes = even_chunks(self.model.layers, p, v)
        total, end = self._sums(j, [(a[None, :], b[None, :]) for a, b in chunks])
        stage = np.arange(p)[None, :]
        args = (j, total, end, stage == 0, stage == p - 1, in_flight(stage, p, self.m[j][:, None], v))
        kept = self._memory(*args, "saved_b", False)
        rebuilt = self._memory(*args, "saved_f", True)
        buffered = self._memory(*args, "saved_b", True)
        saving = self.ctx.col("saving")[self.c[j]][:, None]
        step = buffered - self._memory(*args, "saved_b", True, saving)
        return kept, rebuilt, buffered, step, np.broadcast_to(sizes, (len(j), p))

    def _fixed_recompute(self, idx: np.ndarray):
        """Per 'full' candidate with a fixed split, the least recomputation time of each stage
        that lets it fit: no layer when it fits as is, else at least
        r = ceil((memory with the rebuild buffer - capacity) / the most a layer saves) layers
        (and at least one), each costing at least the cheapest layer's recomputation. Yields
        (positions in idx, per-stage times)."""
        cap = self.cluster.gpu.memory_bytes
        for p, v, sel in self._fixed_groups(idx):
            sel = sel[self.full[idx[sel]]]
            if not len(sel):
                continue
            j = idx[sel]
            kept, _, buffered, step, sizes = self._fixed_memory(j, p, v)
            with np.errstate(divide="ignore", invalid="ignore"):
                need = np.where(step > 0, np.ceil((buffered * (1 - SAFETY) - cap) / step - SAFETY), 1.0)
            layers = np.where(kept * (1 - SAFETY) <= cap, 0.0, np.clip(need, 1, sizes))
            cost = self.ctx.col("rec_cost_s")[self.c[j]][:, None]
            yield sel, layers * cost * (1 - SAFETY)

    def _sums(self, j: np.ndarray, chunks: list):
        """total(key): the prefix sums of candidates j's contexts summed over `chunks`
        [(a, b), ...] (arrays broadcasting to (candidates, options...)); end(key): an end term,
        shaped to broadcast likewise."""
        rows = self.c[j].reshape(-1, *(1,) * (max(np.ndim(b) for _, b in chunks) - 1))

        def total(key):
            prefix = self.ctx.prefix(key)
            return sum(prefix[rows, b] - prefix[rows, a] for a, b in chunks)

        def end(key):
            return self.ctx.col(key)[rows]

        return total, end

    def _least_tail(self, j: np.ndarray, stage: int, pp: int, chunks: list) -> np.ndarray:
        """Least tail over the options (last axis) of stage `stage` holding `chunks`."""
        total, end = self._sums(j, [(a[None, :], b[None, :]) for a, b in chunks])
        dense = (total("params") + end("emb_params") * (stage == 0)
                 + (end("head_params") - self.tied[j][:, None]) * (stage == pp - 1))
        rec = np.where(self.full[j][:, None], total("rec_f"), total("rec_b"))
        col = (slice(None), None)
        exposed, opt = stage_tail_s(_affine(self.coef, self.lay[j]), self.zero[j][col],
                                    dp_grad_bytes(self.setup.precision), dense, total("expert"), total("fwd"),
                                    total("bwd") + rec, stage, self.dp_overlap, self.shards[j][col],
                                    self.eshards[j][col], self.cluster)
        return np.min(exposed + opt, axis=1)


class _Layers(NamedTuple):
    """A set of layers for the memory relaxations: how many, and per layer (columns over
    candidates) the least state bytes, saved bytes, largest saving by full recomputation, stage
    time and full recompute time."""

    layers: int
    state: np.ndarray
    saved: np.ndarray
    saving: np.ndarray
    tau: np.ndarray
    rec: np.ndarray


def pipeline_floor_s(bottleneck, sigma, m, v):
    """(m - 1/v) * max t + sum t / v (cost/pipeline.py) at its least: max t >= `bottleneck`,
    sum t >= `sigma`; infinite where no split fits (an infinite bottleneck, even with m = 1)."""
    with np.errstate(invalid="ignore"):
        value = ((m - 1.0 / v) * bottleneck + sigma / v) * (1 - SAFETY)
    return np.where(np.isinf(bottleneck) | np.isinf(sigma), np.inf, value)


def inverse_in_flight_sum(state, saved, pp, m, v):
    """sum_i 1 / (state + k_i * saved) over the stages i of a pipeline, k_i the micro-batches in
    flight on stage i (cost/pipeline.in_flight), in closed form: the k_i not capped by m form an
    arithmetic progression c0 + c1*j (1F1B: 1, 2, ..; interleaved: ((v-1)p + 1 + 2j) / v), whose
    sum of reciprocals is reciprocal_run(x, n) / (saved * c1), x = (state/saved + c0)/c1;
    the capped ones each add 1 / (state + m * saved). Arrays broadcast."""
    state, saved = np.asarray(state, dtype=float), np.asarray(saved, dtype=float)
    pp, m, v = (np.asarray(x, dtype=float) for x in (pp, m, v))
    one = v == 1
    c0 = np.where(one, 1.0, ((v - 1) * pp + 1) / v)
    c1 = np.where(one, 1.0, 2.0 / v)
    n = np.where(one, np.minimum(pp, m), np.clip(np.floor((m * v - (v - 1) * pp - 1) / 2) + 1, 0, pp))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(saved > 0, (state / saved + c0) / c1, 1.0)
        progression = np.where(saved > 0, reciprocal_run(x, n) / (saved * c1), n / state)
        capped = (pp - n) / (state + m * saved)
    return progression + capped


def reciprocal_run(x, n):
    """sum_{i=0}^{n-1} 1 / (x + i) = digamma(x + n) - digamma(x) for x > 0 (arrays): both ends
    are shifted up to x >= 20 (digamma(x + 1) = digamma(x) + 1/x), then the asymptotic series
    ln(x) - 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + 1/(240x^8) is differenced, its
    logarithms as log1p(n / x) so that nothing cancels (truncation error below 1e-15)."""
    x, n = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(n, dtype=float))
    total = np.zeros(x.shape)
    for _ in range(20):
        small = x < 20
        if not small.any():
            break
        total = total + np.where(small, 1.0 / x - 1.0 / (x + n), 0.0)
        x = np.where(small, x + 1.0, x)

    def tail(y):
        inv = 1.0 / (y * y)
        return -0.5 / y - inv * (1 / 12 - inv * (1 / 120 - inv * (1 / 252 - inv / 240)))

    return total + np.log1p(n / x) + tail(x + n) - tail(x)


def even_split_max(ctx: _Table, c: np.ndarray, pp: np.ndarray, v: np.ndarray, layers: int) -> np.ndarray:
    """The largest stage time of the even split of context c[j] into pp[j] x v[j] chunks, without
    the terms that need ZeRO, recompute counts or p2p (compute, attention recompute of
    'selective', tp/cp/ep traffic, the embedding and the head): a lower bound on its bottleneck."""
    out = np.zeros(len(c))
    for p, vv in sorted(set(zip(pp.tolist(), v.tolist()))):
        sel = np.nonzero((pp == p) & (v == vv))[0]
        used, back = np.unique(c[sel], return_inverse=True)
        per = ctx.prefix("per")[used]
        chunks, _ = even_chunks(layers, int(p), int(vv))
        times = sum(per[:, b] - per[:, a] for a, b in chunks)
        times[:, 0] += ctx.col("first_s")[used]
        times[:, -1] += ctx.col("last_s")[used]
        out[sel] = times.max(axis=1)[back]
    return out


def recompute_floor(state, saved: float, saving: float, cost: float, layers: int, k_max, inv_k_sum, cap: float):
    """Least recomputation time any split needs to fit. Stage i with n_i layers, k_i micro-batches
    in flight and r_i recomputed layers fits only if n_i (state + k_i saved) - k_i r_i saving +
    reserve <= cap, so r_i >= (n_i (state / k_i + saved) - (cap - reserve) / k_i) / saving; summed
    over the stages with k_i <= max k: sum r_i >= (L (state / max k + saved) - (cap - reserve)
    sum 1/k_i) / saving. Per-layer minima (maximum saving) keep it a lower bound. Arrays
    broadcast (`k_max` = max_i k_i, `inv_k_sum` = sum_i 1/k_i)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        need = (layers * (state / k_max + saved) - (cap - memory.RUNTIME_RESERVED_BYTES) * inv_k_sum) / saving
    return np.where(saving > 0, np.clip(need, 0.0, layers) * cost, 0.0)


def split_floor(prof, width: int) -> float:
    """A lower bound on the step of every split, from stage times without the terms that need
    ZeRO, memory or recompute counts: (m - 1) * (least bottleneck) + sum of stage times. Cheap
    (prefix sums only), so the DP's tables are built only for candidates that may win."""
    s, L, P, E = prof.strategy, prof.model.layers, prof.prefix, prof.ends
    per = sum(P[k] for k in ("comp", "rec_b", "tp", "cp", "ep"))
    a = np.arange(L + 1)[:, None]
    n = np.arange(1, width + 1)[None, :]
    end = np.minimum(a + n, L)
    base = np.where(a + n <= L, per[end] - per[a], np.inf) + prof.p2p_s
    t = np.broadcast_to(base, (s.pp, L + 1, width)).copy()
    t[0] += E["emb_comp"] + E["emb_tp"]
    t[-1] += E["head_comp"] + E["head_tp"]
    total = per[L] + E["emb_comp"] + E["emb_tp"] + E["head_comp"] + E["head_tp"] + s.pp * prof.p2p_s
    return (prof.microbatches - 1) * stages.least_bottleneck(t) + total
