"""Pipeline stages over the pools of a mixed cluster: one pipeline whose stages sit on different
GPUs, each pool holding a block of consecutive stages (cost/pools.py prices them).

The space: every allocation of whole nodes to at least two pools that uses all `gpus`
(shares.allocations), whose GPUs all run one collective library where the runtime needs it
(RuntimeRules.pool_stages), and every order of the pools it uses; one strategy for every stage (tp, cp,
dp, ep, micro-batch, ZeRO, recompute none, selective or full of every layer, sequence
parallelism where tp > 1), with stage width w = tp*cp*dp dividing every used pool's GPUs g_j,
pool j holding k_j = g_j / w consecutive stages; ranks in the order tp-cp-ep-dp-pp, so that a
stage's ranks, and a pool's stages, are consecutive; one chunk per stage; any contiguous split
of the layers (stages.best_split over each stage's own pool's tables: exact).

A bound valid for every order and split of an allocation and strategy. With f_j(x) the time
floor of item x (each layer, the embedding, the head) on pool j (step.time_floor_parts_s: what a
stage's time is at least, its p2p and tail only adding) and k_j the stages on pool j, a split
puts the items on the pools, L_j the floors on pool j, and

    step = (m - 1) max_i t_i + sum_i t_i + max_i tail_i >= (m - 1) T + sum_j L_j,   T >= L_j / k_j.

Relaxing the items to fractions gives a linear programme over (T, y): min (m - 1) T + sum_x sum_j
y_xj f_j(x) with sum_j y_xj = 1 and sum_x y_xj f_j(x) <= k_j T. Its Lagrangian dual (the pools'
capacity rows priced at mu_j >= 0, sum_j mu_j k_j <= m - 1) is at least

    sum_x min_j (1 + mu_j) f_j(x)

for every such mu. The bound takes (1 + mu_j) = max(1, z / F_j), F_j = sum_x f_j(x), with z where
sum_j k_j mu_j = m - 1 (water filling, fastest pool first): where the pools' item times are
proportional this is the programme's optimum, the best balance of work over the pools.

Candidates are priced in the order of their bound, each order of the pools by the split DP with
TIE_TOLERANCE above the best step as its cutoff, until the next bound is no better than that;
a candidate whose layers' memory floors cannot fit in its pools' stages at all (may_fit) is
dropped before its tables are built;
the plan is then the most conventional candidate (space.conventional) within TIE_TOLERANCE of
the fastest (the single-pool search's rule), ties to the faster.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from planner.cost.pools import crossing_s, stage_pools
from planner.cost import memory
from planner.cost.step import layer_memory_floor_bytes, profile, time_floor_parts_s
from planner.placement import expert_pool, group_spans, has_expert_layout
from planner.runtimes import RuntimeRules, ep_overlap_runs_stages, pool_stages_refusal
from planner.search import space, stages
from planner.search.driver import _tables
from planner.search.floors import SAFETY, TIE
from planner.search.shares import allocations
from planner.spec.model import ModelSpec
from planner.spec.pools import MixedCluster
from planner.spec.training import Strategy, TrainingSetup, strategy_problems

ORDER = "tp-cp-ep-dp-pp"
"""the rank order of a pipeline over pools: pp outermost, a stage's ranks consecutive"""


@dataclass(frozen=True, slots=True)
class PoolStages:
    strategy: Strategy
    order: tuple[int, ...]
    """the pools holding stages, first stage's first (indices into the cluster's pools)"""
    counts: tuple[int, ...]
    """stages on each pool of `order`"""
    bounds: tuple[tuple[int, int], ...]
    """the layer range [a, b) of every stage"""
    step_time_s: float
    setup: TrainingSetup | None = None
    """the training setup it was priced under (its runtime, its expert layout)"""

    @property
    def stage_pool(self) -> tuple[int, ...]:
        return stage_pools(self.order, self.counts)


@dataclass(frozen=True, slots=True)
class PoolStagesResult:
    best: PoolStages | None
    """None where no pipeline fits below the cutoff (or the space has none: considered 0)"""
    considered: int
    """(allocation, strategy) candidates bounded"""
    priced: int
    """(allocation, strategy, order of pools) split DPs run"""
    proven_optimal: bool
    alternatives: tuple[PoolStages, ...] = ()
    """the fastest others below the cutoff, fastest first (best_pool_stages' `top`)"""
    pruned_memory: int = 0
    """(allocation, strategy) candidates reached in bound order that may_fit proved no split fits"""


def pool_rules(rules: RuntimeRules) -> RuntimeRules:
    """The rules a pipeline over pools is priced under: any contiguous split (the runtime's
    per-stage layout, RuntimeRules.pool_stages), full recomputation of every layer or none."""
    return replace(rules, uneven_split="any", recompute_counts="all")


def candidates(model: ModelSpec, cluster: MixedCluster, setup: TrainingSetup, fixed: dict, rules: RuntimeRules):
    """Yield (GPUs per pool, strategy) of the space above (`setup`: the whole job's)."""
    smallest = min(cluster.pools, key=lambda p: p.cluster.gpus_per_node).cluster
    if (ORDER not in rules.orders or fixed.get("order", ORDER) != ORDER
            or fixed.get("vpp", 1) != 1):
        return
    modes = space.recompute_modes(fixed, rules, setup.ep_overlap)
    for used in allocations(cluster, setup.gpus):
        pools = [cluster.pools[j].cluster for j, g in enumerate(used) if g]
        if pool_stages_refusal(rules.pool_stages, {c.gpu.collectives for c in pools},
                               {c.gpus_per_node for c in pools}):
            continue  # the runtime runs no pipeline over these pools
        common = math.gcd(*(g for g in used if g))
        for tp in space.tp_options(model, smallest, common, fixed.get("tp")):
            for cp in space.cp_options(model, setup, common // tp, fixed.get("cp"), rules):
                for dp in space.divisors(common // (tp * cp)):
                    w = tp * cp * dp
                    pp = setup.gpus // w
                    if (pp < 2 or pp > model.layers or setup.global_batch % dp or fixed.get("dp", dp) != dp
                            or fixed.get("pp", pp) != pp or (setup.ep_overlap and not ep_overlap_runs_stages(pp, 1))):
                        continue
                    sp = fixed.get("sequence_parallel", tp > 1)
                    if sp and tp == 1:
                        continue
                    etp = setup.expert_tp(tp, model)
                    zeros = space.zero_options(model, pp, False, fixed.get("zero"), rules)
                    for ep in space.ep_options(model, expert_pool(tp, cp, dp, etp)[0], fixed.get("ep"), rules,
                                               setup.precision, setup.ep_overlap):
                        if not rules.order_runs(ORDER, cp, pp, ep, tp // etp) or not has_expert_layout(
                                ORDER, tp, cp, dp, pp, ep, etp):
                            continue
                        for mb in space.allowed(space.divisors(setup.global_batch // dp), fixed.get("micro_batch")):
                            for mode in modes:
                                for zero in zeros:
                                    s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batch=mb, zero=zero,
                                                 recompute=mode, recompute_layers=fixed.get("recompute_layers"),
                                                 sequence_parallel=sp, dp_overlap=fixed.get("dp_overlap", True),
                                                 order=ORDER)
                                    if not strategy_problems(s, model, setup) and not rules.refusal(s, model, tp // etp):
                                        yield used, s


def item_floors_s(prof) -> np.ndarray:
    """f_j(x) of the module docstring on the profile's pool: every layer's time floor (with its
    recomputation where every layer recomputes), then the embedding's and the head's."""
    s = prof.strategy
    layers, emb, head = time_floor_parts_s(prof, s.recompute == "full" and s.recompute_layers is None)
    return np.concatenate([layers, [emb, head]])


def bound_s(floors: list[np.ndarray], counts: list[int], microbatches: int) -> float:
    """The bound of the module docstring: `floors` f_j of each pool used, `counts` k_j its stages.
    The multipliers: (1 + mu_j) = max(1, z / F_j) with z where sum_j k_j mu_j = m - 1 (water
    filling over the pools, fastest first)."""
    f = np.stack(floors)
    totals = f.sum(axis=1)
    k = np.asarray(counts, dtype=float)
    order = np.argsort(totals, kind="stable")
    z = totals[order[0]]
    for r in range(1, len(order) + 1):
        active = order[:r]
        z = (microbatches - 1 + k[active].sum()) / np.sum(k[active] / totals[active])
        if r == len(order) or z <= totals[order[r]]:
            break
    weight = np.maximum(1.0, z / totals)
    return float(np.min(weight[:, None] * f, axis=0).sum())


def may_fit(profs: dict, counts: dict, clusters, setup: TrainingSetup) -> bool:
    """Whether the pools' stages can hold the layers at all: every stage's peak is at most its
    pool's capacity and at least the reserve plus its layers' floors
    (step.layer_memory_floor_bytes), so with F_lj layer l's floor on pool j and k_j the stages
    on pool j, a split that fits has
        sum_l min_j F_lj + sum_j k_j reserve <= sum_j k_j capacity_j.
    False proves that none fits; True decides nothing."""
    least = np.min(np.stack([layer_memory_floor_bytes(p) for p in profs.values()]), axis=0).sum()
    room = sum(k * (memory.capacity_bytes(clusters[j], setup) - memory.RUNTIME_RESERVED_BYTES)
               for j, k in counts.items())
    return bool(least * (1 - SAFETY) <= room)  # (floors.SAFETY: the sums' rounding, as the search's memory floors)


def _widths(model: ModelSpec, floors: dict, pp: int, m: int, limit: float) -> dict:
    """The most layers a stage on each pool may hold in a split below `limit`: with n layers its
    time is at least n * (its pool's least layer floor), the bottleneck's m - 1 repeats of it and
    the split's sum of times (at least S of the module docstring) stay below the limit."""
    widest = model.layers - pp + 1
    if m <= 1 or not np.isfinite(limit):
        return {j: widest for j in floors}
    room = limit - float(np.min(np.stack(list(floors.values())), axis=0).sum())
    out = {}
    for j, f in floors.items():
        least = float(np.min(f[:model.layers]))
        out[j] = widest if least <= 0 else min(widest, int(room / ((m - 1) * least) * (1 + SAFETY)))
    return out


def best_pool_stages(model: ModelSpec, cluster: MixedCluster, setup: TrainingSetup, fixed: dict,
                     rules: RuntimeRules, cutoff_s: float = float("inf"), progress=None,
                     top: int = 0) -> PoolStagesResult:
    """The best pipeline over pools (module docstring) of the whole job's `setup` below
    `cutoff_s` (best None where none fits below it), and the `top` fastest others below it
    (alternatives: each the best split of its strategy and order of the pools; the search then
    prunes at the slower of the tie limit and the top-th runner-up)."""
    rules = pool_rules(rules)
    clusters = [p.cluster for p in cluster.pools]
    bounded = []
    lows: dict = {}  # (allocation, strategy but its ZeRO stage) -> bound: no floor term reads ZeRO
    floors: dict = {}  # (pool, layer context: step.context_tables' keys) -> f_j

    def floors_of(j: int, s: Strategy) -> np.ndarray:
        g = min(clusters[j].gpus_per_node, setup.gpus)
        spans = group_spans(s.order, s.tp, s.cp, s.dp, s.pp, s.ep, g, setup.expert_tp(s.tp, model))[:3]
        key = (j, s.tp, s.cp, s.ep, s.micro_batch, s.sequence_parallel, s.recompute, s.recompute_layers, spans)
        if key not in floors:
            floors[key] = item_floors_s(profile(model, clusters[j], setup, s))
        return floors[key]

    for n, (used, s) in enumerate(candidates(model, cluster, setup, fixed, rules)):
        if progress and n % 256 == 0:
            progress(0, 0, f"bounding pipelines over pools: {n:,}")
        counts = {j: g // (s.tp * s.cp * s.dp) for j, g in enumerate(used) if g}
        key = (used, s.dp, s.tp, s.cp, s.ep, s.micro_batch, s.recompute, s.recompute_layers, s.sequence_parallel)
        if key not in lows:
            lows[key] = bound_s([floors_of(j, s) for j in counts], list(counts.values()),
                                s.num_microbatches(setup.global_batch))
        bounded.append((lows[key], n, s, counts))
    bounded.sort(key=lambda b: b[:2])
    found: list[PoolStages] = []
    fastest, priced, unfit, proven = cutoff_s / (1 + space.TIE_TOLERANCE), 0, 0, True

    def pruned_at() -> float:
        """prune_limit of what is found so far; a candidate at the limit still ties."""
        return prune_limit([c.step_time_s for c in found], top, cutoff_s) * (1 + TIE)

    for k, (low, _, s, counts) in enumerate(bounded):
        limit = pruned_at()
        if low >= limit:
            break
        if progress and k % 16 == 0:
            progress(k, len(bounded), "pricing pipelines over pools")
        m = s.num_microbatches(setup.global_batch)
        widths = _widths(model, {j: floors_of(j, s) for j in counts}, s.pp, m, limit)
        if min(widths.values()) < 1:
            continue  # some pool can hold no stage below the limit
        profs = {j: profile(model, clusters[j], setup, s) for j in counts}
        if not may_fit(profs, counts, clusters, setup):
            unfit += 1  # no split of the layers fits the pools' stages
            continue
        width = max(widths.values())
        tables = {j: _tables(profs[j], rules, width, longest=widths[j]) for j in profs}
        for order in itertools.permutations(sorted(profs)):
            n_stages = tuple(counts[j] for j in order)
            stage_pool = stage_pools(order, n_stages)
            # stage i's rows from its own pool's tables
            t, tail, ok = (np.stack([tables[j][q][i] for i, j in enumerate(stage_pool)]) for q in range(3))
            t = t + crossing_s(profs, stage_pool, cluster.between_pools)[:, None, None, None]
            split = stages.best_split(t, tail, ok, m, cutoff=pruned_at())
            priced += 1
            if split is None:
                continue
            proven &= split.exhaustive
            found.append(PoolStages(strategy=s, order=order, counts=n_stages, bounds=split.bounds,
                                    step_time_s=split.step_s, setup=setup))
            fastest = min(fastest, split.step_s)
    best, others = ranked(found, top, clusters, fastest * (1 + space.TIE_TOLERANCE))
    return PoolStagesResult(best=best, considered=len(bounded), priced=priced, proven_optimal=proven,
                            alternatives=others, pruned_memory=unfit)


def prune_limit(steps: list[float], top: int, cutoff_s: float) -> float:
    """What a pipeline over pools must beat, given the steps found so far: the tie limit of the
    fastest, or the top-th runner-up where slower, both below the cutoff (one rule for one search
    and for the searches of several runtimes merged)."""
    steps = sorted(steps)
    kept = steps[top] if top and len(steps) > top else (float("inf") if top else 0.0)
    return min(cutoff_s, max(steps[0] * (1 + space.TIE_TOLERANCE), kept) if steps else cutoff_s)


def pool_conventions(c: PoolStages, clusters) -> int:
    """space.strategy_conventions of a pipeline over pools, with the smallest node of its pools."""
    return space.strategy_conventions(c.strategy, min(clusters[j].gpus_per_node for j in c.order))


def ranked(found: list[PoolStages], top: int, clusters, limit: float) -> tuple[PoolStages | None, tuple]:
    """(the most conventional of `found` at most `limit`, ties to the faster, then the earlier;
    the `top` fastest others, a twin priced alike (the same split and step: ZeRO 0 and 1 with dp
    1, say) counted once)."""
    best = min((c for c in found if c.step_time_s <= limit),
               key=lambda c: (pool_conventions(c, clusters), c.step_time_s), default=None)
    others: list[PoolStages] = []
    for c in sorted((c for c in found if c is not best), key=lambda c: c.step_time_s):
        if len(others) < top and not any((o.step_time_s, o.bounds, o.order) == (c.step_time_s, c.bounds, c.order)
                                         for o in [*others, *([best] if best else [])]):
            others.append(c)
    return best, tuple(others)
