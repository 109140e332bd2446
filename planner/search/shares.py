"""Batch shares over the pools of a mixed cluster: data-parallel replicas of different kinds.

A plan over several pools gives pool i g_i of its GPUs (whole nodes, every GPU asked for used:
sum g_i = --gpus, at least two pools) and a share B_i >= 1 of the global batch (sum B_i = B).
Each pool runs its own strategy on its share, the fastest one of its space (driver.search on
the pool's plain cluster with global batch B_i), and the pools then all-reduce their gradients
over the links between them (cost/comm.pools_exchange_s). The step is

    max_i F_i(g_i, B_i) + exchange(g),

F_i(g, B) the step of pool i's fastest strategy on g GPUs at batch B (infinite where none fits).
F is not monotone in B (a share that divides badly leaves dp or the micro-batch few options), so
no split is skipped on its neighbours' account: the search is branch and bound over every
allocation and split, in the order of a lower bound, stopping when the next bound is no better
than the best step found. Two lower bounds of F_i, each valid for every strategy:

  - cost/step.compute_floor_s, linear in B_i (closed form: prunes most splits at once);
  - the pool search's own bound at that share (bounds.bound_counts: the least bound of any
    candidate), computed only for the splits the first leaves open, and only for candidates
    whose compute floor is below the best step found (cutoff_s: the rest cannot be priced).

What survives both is priced: each pool's search at its share, pruned at the best step found
less the exchange. The result is the best plan over all allocations and splits under the cost
model (the brute force over them in tests/test_shares.py checks it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable

from planner.cost.comm import pools_exchange_s
from planner.cost.step import dp_grad_bytes, compute_floor_s
from planner.graph import model_params
from planner.search.driver import Candidate, bound_sweep, search
from planner.spec.model import ModelSpec
from planner.spec.pools import MixedCluster
from planner.spec.training import TrainingSetup


@dataclass(frozen=True, slots=True)
class Share:
    pool: int
    """index of the pool in the cluster's pools"""
    setup: TrainingSetup
    """the pool's GPUs and its share of the global batch (setup.gpus, setup.global_batch)"""
    candidate: Candidate
    """the pool's fastest strategy at its share"""


@dataclass(frozen=True, slots=True)
class SharesResult:
    shares: tuple[Share, ...]
    step_time_s: float
    exchange_s: float
    splits: int
    """allocations and splits the search considered"""
    bounded: int
    """pool shares whose search bound was computed"""
    priced: int
    """pool shares searched to the end"""
    proven_optimal: bool


def allocations(cluster: MixedCluster, gpus: int) -> list[tuple[int, ...]]:
    """GPUs per pool (whole nodes, at most the pool's) summing to `gpus`, at least two pools used."""
    options = [range(0, p.gpus + 1, p.cluster.gpus_per_node) for p in cluster.pools]
    return [g for g in itertools.product(*options) if sum(g) == gpus and sum(1 for n in g if n) >= 2]


def exchange_s(model: ModelSpec, cluster: MixedCluster, precisions: tuple[str, ...], used: tuple[int, ...],
               grad_reduce: str) -> float:
    """The gradient exchange between the pools that hold GPUs in `used` (`precisions`: each
    pool's, `grad_reduce` the request's; the gradients cross in the widest of their reductions'
    dtypes)."""
    grad_bytes = max(dp_grad_bytes(p, grad_reduce) for p, n in zip(precisions, used) if n)
    return pools_exchange_s(model_params(model) * grad_bytes, tuple(n for n in used if n), cluster.between_pools)


def best_shares(model: ModelSpec, cluster: MixedCluster, gpus: int, batch: int, precisions: tuple[str, ...],
                grad_reduce: str, setup_of: Callable[[int, int, int], TrainingSetup], fixed: dict, solver: str = "exact",
                time_limit_s: float = 10.0, cutoff_s: float = float("inf"), progress=None) -> SharesResult | None:
    """The fastest plan over several pools (module docstring) of `gpus` GPUs and global batch
    `batch` whose step is below `cutoff_s`, or None. `precisions`: each pool's (its setups');
    `grad_reduce`: the dtype the gradients are reduced in (TrainingSetup.grad_reduce);
    `setup_of(pool index, gpus, share)`: the pool's training setup (a PlannerError: that share
    has no plan); `progress(done, total, what)`: called as splits are settled."""
    from planner.errors import PlannerError

    pools = cluster.pools
    best_s, best = cutoff_s, None
    heap: list = []
    rates: dict = {}
    for used in allocations(cluster, gpus):
        x = exchange_s(model, cluster, precisions, used, grad_reduce)
        idx = [i for i, n in enumerate(used) if n]
        rate = []
        for i in idx:
            key = (i, used[i])
            if key not in rates:
                try:
                    s = setup_of(i, used[i], 1)
                    rates[key] = compute_floor_s(model, pools[i].cluster, s)
                except PlannerError:
                    rates[key] = float("inf")
            rate.append(rates[key])
        for split in _splits_below(batch, rate, best_s - x):
            heap.append((max(r * b for r, b in zip(rate, split)) + x, used, tuple(zip(idx, split)), x))
    heapq.heapify(heap)
    splits = len(heap)
    # per (pool, gpus, share), none depending on the other pools (whose GPUs set the exchange):
    bounds: dict = {}  # -> (setup, the pool search's bounds, the cutoff they were cut at)
    lows: dict = {}  # -> a lower bound of F
    exact: dict = {}  # -> (F, setup, candidate): the pool's fastest strategy at that share
    bounded = priced = 0
    proven = True

    def bound(key, i: int, n: int, b: int, cut: float) -> None:
        nonlocal bounded
        try:
            s = setup_of(i, n, b)
        except PlannerError:
            lows[key] = float("inf")
            return
        # what the cutoff leaves out is no better than it (bounds.bound_counts)
        bnd = bound_sweep(model, pools[i].cluster, [s], fixed, cutoff_s=cut)[0]
        bounded += 1
        bounds[key] = (s, bnd, cut)
        lows[key] = max(lows.get(key, 0.0), min(float(bnd.bound_s.min()) if len(bnd.bound_s) else float("inf"), cut))

    while heap and heap[0][0] < best_s:
        floor, used, parts, x = heapq.heappop(heap)
        if progress and (splits - len(heap)) % 64 == 0:
            progress(splits - len(heap), splits, "batch shares over the pools")
        limit = best_s - x  # what each pool's step must stay below for this split to beat the best
        # the heaviest side first: its bound is the likeliest to prune the split alone
        order = sorted(parts, key=lambda p: -rates[(p[0], used[p[0]])] * p[1])
        pruned = False
        for i, b in order:
            key = (i, used[i], b)
            if key not in lows:
                bound(key, i, used[i], b, limit)
            if lows[key] >= limit:
                pruned = True
                break
        if pruned:
            continue
        steps = []
        for i, b in order:
            key = (i, used[i], b)
            if key not in exact:
                if bounds[key][2] < limit:  # cut below what this split allows (another exchange)
                    bound(key, i, used[i], b, limit)
                s, bnd, _ = bounds[key]
                r = search(model, pools[i].cluster, s, fixed, solver=solver, time_limit_s=time_limit_s, top=0,
                           found=bnd, outside_s=limit)
                priced += 1
                proven = proven and r.proven_optimal
                if r.best is None or not r.best.fits or r.best.step_time_s >= limit:
                    # a search pruned at the limit says only that nothing of it is below it
                    lows[key] = max(lows[key], limit)
                    break
                exact[key] = (r.best.step_time_s, s, r.best)
            steps.append(exact[key][0])
            if exact[key][0] >= limit:
                break
        else:
            step = max(steps) + x
            if step < best_s:
                best_s = step
                best = (step, x, [(i, exact[(i, used[i], b)]) for i, b in sorted(parts)])
    if best is None:
        return None
    step, x, chosen = best
    return SharesResult(shares=tuple(Share(pool=i, setup=s, candidate=c) for i, (_, s, c) in chosen),
                        step_time_s=step, exchange_s=x, splits=splits, bounded=bounded, priced=priced,
                        proven_optimal=proven)


def _splits_below(total: int, rates: list[float], limit: float):
    """Every way to write `total` as len(rates) positive shares b_i with rates[i] * b_i < limit
    for each (the others cannot beat `limit`), in order: the first share runs over what the
    others can still hold, so nothing outside is generated."""
    if not rates:
        return
    # the largest b with r * b < limit (every b where nothing limits)
    most = [total if limit == math.inf else math.ceil(limit / r) - 1 if r < math.inf else 0 for r in rates]
    most = [min(total, m) for m in most]
    room = [sum(most[i:]) for i in range(len(rates))]  # what pools i.. can hold together

    def walk(i: int, left: int, prefix: tuple):
        if i == len(rates) - 1:
            if 1 <= left <= most[i]:
                yield (*prefix, left)
            return
        rest = len(rates) - i - 1  # each of the others needs at least one sequence
        for b in range(max(1, left - room[i + 1]), min(most[i], left - rest) + 1):
            yield from walk(i + 1, left - b, (*prefix, b))

    yield from walk(0, total, ())
