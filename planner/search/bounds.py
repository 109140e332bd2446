"""Lower bounds of the search: for every outer choice, a step time no split or recompute count
can beat and a memory floor every split exceeds somewhere (search/driver.py prices the choices
in the order of these bounds and stops once the next bound is no better than the best plan).

    step >= (m - 1/v) * max_i t_i + sum_i t_i / v + max_i tail_i,
    max_i t_i >= max(sum_i t_i / p, largest stage of the even split when the split is fixed),
where sum_i t_i (all layers, the embedding, the head, every stage's p2p, the least recomputation
that lets the model fit, the ZeRO-2/3 traffic that cannot hide) does not depend on the split.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from functools import lru_cache

import numpy as np

from planner.cost import comm, compute, memory
from planner.cost.pipeline import even_chunks
from planner.cost.step import ADAM_BYTES_PER_PARAM, profile, stage_terms
from planner.search import space, stages
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup, strategy_problems


def bound_all(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict, rules: space.RuntimeRules,
              progress=None) -> tuple[list, int, int, float]:
    """A heap of (bound, order, knobs, vpp, zero, pipeline part, unrefined) for every outer choice
    that may fit, the number of candidates considered, those pruned by the memory floor, and the
    least floor among those."""
    cap = cluster.gpu.memory_bytes
    heap, considered, pruned_memory = [], 0, 0
    least_floor = float("inf")
    seen_spans: set = set()
    for outer, knobs in enumerate(outer_choices(model, cluster, setup, fixed, rules)):
        if progress and outer % 256 == 0:
            progress(0, 0, f"bounding {considered:,} candidates")
        m = setup.global_batch // (knobs["dp"] * knobs["micro_batch"])
        vpps = space.vpp_options(model, knobs["pp"], m, fixed.get("vpp"), rules)
        alone = knobs["tp"] == knobs["pp"] == knobs["cp"] == 1
        zeros = [z for z in (rules.zero_with_pp if knobs["pp"] > 1 else rules.zero)
                 if (fixed.get("zero") is None or z == fixed["zero"]) and (z or alone or not rules.replicate_alone)]
        considered += len(vpps) * len(zeros)
        if not vpps or not zeros:
            continue
        probe = Strategy(**knobs, zero=0, vpp=1)
        if strategy_problems(probe, model, setup):
            continue
        prof = profile(model, cluster, setup, probe)
        signature = (knobs["tp"], knobs["cp"], knobs["pp"], knobs["dp"], knobs["ep"], knobs["micro_batch"],
                     knobs["recompute"], tuple(sorted(prof.spans.items())))
        if signature in seen_spans:  # another rank order that places every group alike
            continue
        seen_spans.add(signature)
        P, E, L = prof.prefix, prof.ends, model.layers
        total = (P["comp"][L] + P["rec_b"][L] + P["tp"][L] + P["cp"][L] + P["ep"][L]
                 + E["emb_comp"] + E["emb_tp"] + E["head_comp"] + E["head_tp"])
        dense, expert = P["params"][L] + E["emb_params"] + E["head_params"], P["expert"][L]
        full = knobs["recompute"] == "full"
        saved_b, saved_f = np.diff(P["saved_b"]), np.diff(P["saved_f"])
        least_saved = (saved_f if full else saved_b).min()
        layer_params, layer_expert = np.diff(P["params"]), np.diff(P["expert"])
        if full:
            rec_args = (saved_b.min(), float((saved_b - saved_f).max()), float(np.diff(P["rec_f"]).min()))
        pp, shards = knobs["pp"], knobs["dp"] * knobs["cp"]
        eshards = max(1, shards // knobs["ep"])
        # Memory floor of any split: stage i with n_i layers holds n_i * (state + k_i * saved), k_i
        # its in-flight micro-batches; the continuous relaxation equalises the stages, so the peak
        # is at least L / sum_i 1 / (state + k_i * saved) (per-layer minima of the model).
        # every (ZeRO stage, vpp) of this layer context at once: arrays of shape (zeros, vpps)
        zs, vs = np.array(zeros), np.array(vpps, dtype=float)
        per_dense = np.array([sum(memory.state_bytes(1.0, z, shards)) for z in zeros])
        per_expert = np.array([sum(memory.state_bytes(1.0, z, eshards)) for z in zeros])
        least_state = (per_dense[:, None] * layer_params + per_expert[:, None] * layer_expert).min(axis=1)
        k = np.stack([in_flight_all(pp, m, v) for v in vpps])  # (vpps, pp)
        floor = (L / np.sum(1.0 / (least_state[:, None, None] + k[None] * least_saved), axis=2)
                 + memory.RUNTIME_RESERVED_BYTES)
        sharded = zs > 0
        opt_floor = compute.memory_time_s(ADAM_BYTES_PER_PARAM * (dense / np.where(sharded, shards, 1) + expert
                                                                    / np.where(sharded, eshards, 1)) / pp,
                                          cluster.gpu.hbm_Bps, cluster.efficiency)
        zfloor = np.zeros(len(zeros))
        tail_floor = opt_floor.copy()
        for j, zero in enumerate(zeros):
            if zero >= 2:
                # sum_i max(0, x_i) >= max(0, sum_i x_i): ZeRO-2/3 per-micro-batch traffic not hidden
                traffic = zero_traffic(prof, zero, dense, expert)
                zfloor[j] = max(0.0, traffic - cluster.efficiency.dp_overlap_fraction
                                * (P["comp"][L] + E["emb_comp"] + E["head_comp"]))
            if pp == 1:
                # one stage: its tail is exact (most hidden when every layer recomputes)
                one = replace(prof, strategy=replace(probe, zero=zero))
                tail_floor[j] = float(stage_terms(one, 0, [(0, L)], L if full else 0)["tail"])
        rec_floor = np.zeros_like(floor)
        if full:
            rec_floor = recompute_floor(least_state[:, None], *rec_args, L, k, cap)
        sigma = total + pp * prof.p2p_s * vs[None, :] + zfloor[:, None] + rec_floor
        bottleneck = sigma / pp
        for col, v in enumerate(vpps):
            if rules.fixed_split(pp, v):
                # the even split is the only split: its largest stage is known before pricing
                bottleneck[:, col] = np.maximum(bottleneck[:, col], even_split_max(prof, L, pp, v))
        pipe = (m - 1.0 / vs[None, :]) * bottleneck + sigma / vs[None, :]
        bound = pipe + tail_floor[:, None]
        fits = floor <= cap
        pruned_memory += int((~fits).sum())
        if (~fits).any():
            least_floor = min(least_floor, float(floor[~fits].min()))
        for j, col in zip(*np.nonzero(fits)):
            heapq.heappush(heap, (float(bound[j, col]), len(heap), knobs, vpps[col], zeros[j],
                                  float(pipe[j, col]) if pp > 1 else None, True))
    return heap, considered, pruned_memory, least_floor


def outer_choices(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict, rules: space.RuntimeRules):
    """Yield the outer choices without vpp and zero (they only change cheap terms of the bound)."""
    for tp, cp, pp, dp in space.degree_tuples(model, cluster, setup, fixed, rules):
        for ep in space.ep_options(model, dp, cp, fixed.get("ep"), rules):
            for mb in space.allowed(space.divisors(setup.global_batch // dp), fixed.get("micro_batch")):
                for mode in space.allowed(space.RECOMPUTES, fixed.get("recompute")):
                    for order in (rules.orders if "order" not in fixed else (fixed["order"],)):
                        sp = fixed.get("sequence_parallel", tp > 1)
                        yield dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, micro_batch=mb, recompute=mode,
                                   order=order, sequence_parallel=sp, dp_overlap=fixed.get("dp_overlap", True))


def even_split_max(prof, layers: int, pp: int, v: int) -> float:
    """The largest stage time of the even split without the terms that need ZeRO or recompute
    counts (compute, attention recompute of 'selective', tp/cp/ep traffic, the embedding and the
    head, p2p): a lower bound on its bottleneck."""
    P, E = prof.prefix, prof.ends
    per = P["comp"] + P["rec_b"] + P["tp"] + P["cp"] + P["ep"]
    chunks, _ = even_chunks(layers, pp, v)
    times = sum(per[b] - per[a] for a, b in chunks) + prof.p2p_s * v
    times[0] += E["emb_comp"] + E["emb_tp"]
    times[-1] += E["head_comp"] + E["head_tp"]
    return float(times.max())


def tail_floor(prof, full: bool, fixed_split: bool) -> float:
    """Least tail the first or the last stage can have (most hidden: every layer recomputed).
    With a fixed (even) split their layers are known; otherwise over every one-layer range (a
    tail grows with more layers' gradients and shrinks with more backward to hide behind, which
    a single layer bounds per layer; the optimizer share is proportional)."""
    s, L = prof.strategy, prof.model.layers
    if fixed_split:
        ends = np.array([0, s.pp - 1])
        chunks, sizes = even_chunks(L, s.pp, s.vpp)
        chunks = [(a[ends], b[ends]) for a, b in chunks]
        return float(np.max(stage_terms(prof, ends, chunks, sizes[ends] if full else 0)["tail"]))
    a = np.arange(L)
    first = stage_terms(prof, 0, [(a, a + 1)], 1 if full else 0)["tail"]
    last = stage_terms(prof, s.pp - 1, [(a, a + 1)], 1 if full else 0)["tail"]
    return float(max(np.min(first), np.min(last)))


def zero_traffic(prof, zero: int, dense: float, expert: float) -> float:
    """ZeRO-2/3 collectives of one micro-batch over all the model's parameters (stage_terms' z)."""
    def coll(kind, n_bytes, group):
        return comm.collective_time_s(kind, n_bytes, prof.spans[group], prof.cluster)
    total = coll("reduce_scatter", prof.grad_bytes * dense, "dpcp") + coll("reduce_scatter", prof.grad_bytes * expert, "edp")
    if zero >= 3:
        total += 2 * coll("all_gather", memory.WEIGHT_BYTES * dense, "dpcp") + 2 * coll("all_gather", memory.WEIGHT_BYTES * expert, "edp")
    return total


def recompute_floor(state, saved: float, saving: float, cost: float, layers: int, k: np.ndarray,
                     cap: float):
    """Least recomputation time any split needs to fit. Stage i with n_i layers, k_i micro-batches
    in flight and r_i recomputed layers fits only if n_i (state + k_i saved) - k_i r_i saving +
    reserve <= cap, so r_i >= (n_i (state / k_i + saved) - (cap - reserve) / k_i) / saving; summed
    over the stages with k_i <= max k: sum r_i >= (L (state / max k + saved) - (cap - reserve)
    sum 1/k_i) / saving. Per-layer minima (maximum saving) keep it a lower bound. `k` holds the
    in-flight counts per stage (last axis), `state` broadcasts against its other axes."""
    if saving <= 0:
        return 0.0 * state * k[..., 0]
    need = (layers * (state / k.max(axis=-1) + saved)
            - (cap - memory.RUNTIME_RESERVED_BYTES) * np.sum(1.0 / k, axis=-1)) / saving
    return np.clip(need, 0.0, layers) * cost


@lru_cache(maxsize=4096)
def in_flight_all(pp: int, m: int, v: int) -> np.ndarray:
    from planner.cost.pipeline import in_flight
    return in_flight(np.arange(pp), pp, m, v)


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
