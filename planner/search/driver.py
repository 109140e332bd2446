"""The search: bound -> price in bound order -> split (DP) -> recompute (ILP) -> ranked plans.

Branch and bound over the outer choices (degrees, micro-batch, interleaving, ZeRO, recompute
mode, rank order): search/bounds.py gives every choice a lower bound valid for every stage split
and recompute count, and a memory floor. Choices are priced in the order of their bounds, each
batch of them refined (vectorised) before its first pop: tail floors, the bottleneck under
memory, and whether any split fits (_BoundOrder). The search stops when the next bound is no
better than the best plan that fits, so what it returns is the best in the space of
search/space.py under the cost model, with each 1F1B split from the exact DP (search/stages.py)
and each recompute count from the ILP (search/ilp.py). A choice whose prices equal those of one
priced before (cost/step.pricing_key) is not priced again: it cannot beat the best.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import time
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from planner.cost import memory
from planner.cost.pipeline import chunk_arrays, even_chunks, split_layers, step_time_s, step_times_s
from planner.cost.step import (
    StepEstimate,
    estimate,
    pricing_key,
    profile,
    reduction_hiding,
    split_step,
    split_terms,
    stage_memory_bytes,
    stage_terms,
    stage_time_floor_s,
)
from planner.search import bounds, ilp, space, stages
from planner.search.floors import SAFETY, TIE
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup, strategy_problems
from planner.units import bytes_to_gib

CLOSEST_TRIES = 16
"""when no candidate can fit, how many (the least memory floors) are priced to say what the
closest needs"""


@dataclass(frozen=True, slots=True)
class Candidate:
    strategy: Strategy
    bounds: tuple[tuple[int, int], ...]
    recompute_layers: tuple[int, ...] | None
    step_time_s: float
    peak_memory_bytes: float
    fits: bool

    def estimate(self, model: ModelSpec, cluster: Cluster, setup: TrainingSetup) -> StepEstimate:
        """The full estimate (breakdowns, stages) of this candidate; same step time."""
        return estimate(model, cluster, setup, self.strategy, bounds=list(self.bounds),
                        recompute_layers=self.recompute_layers)


@dataclass(frozen=True, slots=True)
class SearchResult:
    best: Candidate | None
    alternatives: tuple[Candidate, ...]
    closest: Candidate | None
    """the candidate that missed the memory limit by the least, when nothing fits"""
    considered: int
    pruned_memory: int
    pruned_bound: int
    priced: int
    programmes: int
    ilp_solves: int
    proven_optimal: bool
    elapsed_s: float
    memory_floor_bytes: float = 0.0
    """least memory floor of the candidates pruned for memory (what nothing could go below)"""
    found: bounds.Bounds | None = None
    """the bounds searched (what most_conventional searches again, class by class)"""

    def summary(self) -> dict:
        """Deterministic counts for the plan file (no timings: plans are byte-stable)."""
        return {"considered": self.considered, "pruned_memory": self.pruned_memory,
                "pruned_bound": self.pruned_bound, "priced": self.priced,
                "dp_programmes": self.programmes, "ilp_solves": self.ilp_solves,
                "proven_optimal": self.proven_optimal}


NOTHING_SEARCHED = SearchResult(best=None, alternatives=(), closest=None, considered=0, pruned_memory=0,
                                pruned_bound=0, priced=0, programmes=0, ilp_solves=0, proven_optimal=True,
                                elapsed_s=0.0)
"""no search at all (its summary is what a plan over pools none of which has a plan alone sums)"""


def infeasible_message(result: SearchResult, model: ModelSpec, cluster: Cluster, setup: TrainingSetup) -> str:
    """Why nothing fits, and what the closest candidate would need."""
    cap = bytes_to_gib(memory.capacity_bytes(cluster, setup))
    if result.closest is not None:
        s = result.closest.strategy
        need = bytes_to_gib(result.closest.peak_memory_bytes)
        what = (f"best candidate (dp {s.dp} tp {s.tp} pp {s.pp} cp {s.cp}, zero {s.zero}, recompute {s.recompute}) "
                f"needs {need:.1f} GiB per GPU")
    else:
        need = bytes_to_gib(result.memory_floor_bytes)
        what = f"every candidate needs at least {need:.1f} GiB per GPU"
    hints = ["more GPUs"]
    if result.closest is None:
        hints.append("GPUs with more memory")  # the floor already allows ZeRO-3 and full recompute
    else:
        s, rules = result.closest.strategy, space.RUNTIME_RULES[setup.runtime]
        # where the runtime runs ZeRO-3 as such here, over more than one rank of dp x cp
        if s.zero < 3 and s.dp * s.cp > 1 and 3 in rules.zeros(s.pp, model) and rules.priced_zero(3, s.pp) == 3:
            hints.append("ZeRO-3")
        if s.recompute != "full":
            hints.append("full recompute")
    fixes = f"{', '.join(hints[:-1])} or {hints[-1]}" if len(hints) > 1 else hints[0]
    room = f"{cap:.1f} GiB" + (f" ({bytes_to_gib(cluster.gpu.memory_bytes):.1f} GiB less {setup.memory_headroom:.0%} "
                               f"kept free)" if setup.memory_headroom else "")
    return f"no feasible plan: {what}; {cluster.gpu.name} offers {room}; {fixes} would be needed"


def search(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict | None = None,
           solver: str = "exact", time_limit_s: float = 10.0, top: int = 3, progress=None,
           found: bounds.Bounds | None = None, space_of: str | None = None,
           outside_s: float = float("inf")) -> SearchResult:
    """Best strategy in the space of search/space.py honouring the `fixed` knobs (`found`: its
    bounds, when bound_sweep has bounded several GPU counts at once). The space is the setup's
    runtime's, or `space_of`'s (the setup's runtime still prices every strategy). `outside_s`: a
    step time another search already reached (with top 0): what cannot beat it is pruned, and
    best is None when nothing here does."""
    # the search allocates many small objects that live on in the cost model's caches; the cyclic
    # collector would walk them again and again (about 5% of a search). Any cycles left behind
    # are collected once it runs again.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _search(model, cluster, setup, fixed, solver, time_limit_s, top, progress, found,
                       space.RUNTIME_RULES[space_of or setup.runtime], outside_s)
    finally:
        if enabled:
            gc.enable()


def _constraints(fixed: dict | None) -> dict:
    """The knobs a request fixes (a None value leaves the knob free)."""
    return {k: v for k, v in (fixed or {}).items() if v is not None}


def most_conventional(model: ModelSpec, cluster: Cluster, searched: list[tuple[TrainingSetup, SearchResult]],
                      fixed: dict | None = None, solver: str = "exact", time_limit_s: float = 10.0,
                      memo: dict | None = None) -> tuple[int, Candidate, bool] | None:
    """The plan over several searches' spaces (one per setup, in order; the searches' own
    results): the most conventional strategy (space.conventional) within space.TIE_TOLERANCE of
    the fastest of all, ties to the faster, then to the earlier search; as (which search, the
    candidate, whether every search it took was proven optimal), None when nothing fits.

    Exact for the rule: a search's candidates of each class more conventional than its fastest
    plan's (and than the choice so far) whose refined bounds reach the tolerance are priced, one
    class at a time from the most conventional, in bound order (_fastest_within), until one
    lands within it; the first class that does holds that space's most conventional plan within
    the tolerance. `memo`: the classes already priced at a tolerance, shared by calls over the
    same searches (a union's choice and each runtime's own)."""
    memo = {} if memo is None else memo
    fastest = min((r.best.step_time_s for _, r in searched if r.best is not None), default=None)
    if fastest is None:
        return None
    limit = fastest * (1 + space.TIE_TOLERANCE)
    choice, proven = None, True  # choice: (conventions, step, search index, candidate)
    for i, (setup, r) in enumerate(searched):
        if r.best is None:
            continue
        g = min(cluster.gpus_per_node, setup.gpus)
        own = space.strategy_conventions(r.best.strategy, g)
        here = (own, r.best.step_time_s, i, r.best) if r.best.step_time_s <= limit else None
        if r.found is not None and len(r.found.bound_s):
            codes = r.found.conventions(g)
            ceiling = min(own if here else np.inf, choice[0] if choice else np.inf)
            near = np.nonzero((r.found.bound_s < limit * (1 + TIE)) & (codes <= ceiling) & (codes != own))[0]
            refined = np.zeros(0)
            if len(near):  # the refined bounds (one vectorised pass) rule out most classes at once
                refined = r.found.refined_s(near, limit * (1 + TIE))[0]
                near, refined = near[refined < limit * (1 + TIE)], refined[refined < limit * (1 + TIE)]
            for code in np.unique(codes[near]).tolist():
                if choice is not None and code > choice[0]:
                    break
                mine = codes[near] == code
                key = (id(r.found), code, limit)
                if key not in memo:
                    memo[key] = _fastest_within(model, cluster, setup, _constraints(fixed), r.found, near[mine],
                                                refined[mine], solver, time_limit_s, limit)
                found, exact = memo[key]
                proven &= exact
                if found is not None:
                    if here is None or (code, found.step_time_s) < here[:2]:
                        here = (code, found.step_time_s, i, found)
                    break
        if here is not None and (choice is None or here[:3] < choice[:3]):
            choice = here
    return choice[2], choice[3], proven


def _fastest_within(model, cluster, setup, fixed, found, idx, bound, solver, time_limit_s,
                    limit: float) -> tuple[Candidate | None, bool]:
    """The fastest candidate of `idx` (their refined bounds `bound`) that fits and prices at most
    `limit`, or None; and whether that is proven: _search's branch and bound over a handful of
    candidates, without its batches (they were refined together)."""
    rules = space.RUNTIME_RULES[setup.runtime]
    best, proven, gaps = None, True, []
    fits = found.fits(idx) if len(idx) else np.zeros(0, dtype=bool)
    for k in np.argsort(bound, kind="stable").tolist():
        cutoff = limit * (1 + TIE) if best is None else best.step_time_s
        if bound[k] >= cutoff * (1 - TIE):
            break
        if not fits[k]:
            continue
        s = _strategy(found, int(idx[k]), fixed)
        if strategy_problems(s, model, setup):
            continue
        cand, stats = _price(profile(model, cluster, setup, s), rules, solver, time_limit_s, cutoff)
        proven &= stats["optimal"]
        if stats["relaxed_s"] is not None and cand.step_time_s > stats["relaxed_s"] * (1 + SAFETY):
            gaps.append(stats["relaxed_s"])
        if cand.fits and cand.step_time_s <= limit and (best is None or cand.step_time_s < best.step_time_s):
            best = _as_priced(cand, fixed)
    if any(g < (best.step_time_s if best else limit) * (1 - SAFETY) for g in gaps):
        proven = False  # a 'full' candidate's other splits were not all priced and might land within
    return best, proven


def bound_sweep(model: ModelSpec, cluster: Cluster, setups: list[TrainingSetup],
                fixed: dict | None = None, cutoff_s: float = float("inf")) -> list[bounds.Bounds]:
    """The bounds of the searches of setups that differ only in their GPU count and global
    batch, computed together (bounds.bound_counts), for search(found=...); `cutoff_s`: only for
    searches pruned there (outside_s at most that), which never price what it leaves out."""
    return bounds.bound_counts(model, cluster, setups, _constraints(fixed), space.RUNTIME_RULES[setups[0].runtime],
                               cutoff_s=cutoff_s)


def _search(model, cluster, setup, fixed, solver, time_limit_s, top, progress, found, rules,
            outside_s: float = float("inf")) -> SearchResult:
    start = time.perf_counter()
    fixed = _constraints(fixed)
    found_bounds = found if found is not None else bounds.bound_all(model, cluster, setup, fixed, rules, progress)
    total = len(found_bounds.bound_s)
    if progress:
        progress(0, total, "pricing")

    closest: Candidate | None = None
    priced = programmes = ilp_solves = 0
    optimal = True
    pruned_bound, pruned_memory_late = found_bounds.dominated, 0
    relaxed_gaps: list[float] = []
    priced_like: dict[tuple, Candidate] = {}  # pricing_key -> what its first strategy was priced at
    ranked = _Ranked(top, outside_s)
    queue = _BoundOrder(found_bounds)
    queue.cutoff = ranked.cutoff_s
    for j, bound in queue:
        if (ranked.best is not None or outside_s < float("inf")) and bound >= ranked.cutoff_s * (1 - TIE):
            # nothing left can beat the best, nor the runners-up: bounds carry a margin of SAFETY
            # against rounding, so a candidate within TIE of them ties (floors.TIE)
            pruned_bound += queue.remaining + 1
            break
        if bound == float("inf"):
            # everything left is proven not to fit: price only the few with the least memory
            # floors, to say what the closest would need
            pruned_memory_late = queue.remaining + 1
            if ranked.best is None:
                for k in np.argsort(found_bounds.floor_bytes, kind="stable")[:CLOSEST_TRIES].tolist():
                    s = _strategy(found_bounds, k, fixed)
                    if not strategy_problems(s, model, setup):
                        cand = _price(profile(model, cluster, setup, s), rules, solver, time_limit_s)[0]
                        if closest is None or cand.peak_memory_bytes < closest.peak_memory_bytes:
                            closest = cand
            break
        s = _strategy(found_bounds, j, fixed)
        if strategy_problems(s, model, setup):
            continue
        prof = profile(model, cluster, setup, s)
        key = pricing_key(prof)
        if key in priced_like:
            # another strategy with the same prices for every split was priced: its optimum is
            # this one's, found exactly where it could rank (else proven no better than the cutoff
            # then, which only falls), so its price stands for this one's too
            pruned_bound += 1
            cand = replace(priced_like[key], strategy=s)
        else:
            cand, stats = _price(prof, rules, solver, time_limit_s, ranked.cutoff_s)
            priced_like[key] = cand
            priced += 1
            if stats["relaxed_s"] is not None and cand.step_time_s > stats["relaxed_s"] * (1 + SAFETY):
                relaxed_gaps.append(stats["relaxed_s"])
            programmes += stats["programmes"]
            ilp_solves += stats["ilp"]
            optimal &= stats["optimal"]
        if cand.fits:
            ranked.add(_as_priced(cand, fixed))
            queue.cutoff = ranked.cutoff_s
        elif closest is None or cand.peak_memory_bytes < closest.peak_memory_bytes:
            closest = cand
        if progress and priced % 16 == 0:
            progress(priced, priced + queue.remaining, "pricing")
    best = ranked.best
    if best is not None and any(g < best.step_time_s * (1 - SAFETY) for g in relaxed_gaps):
        optimal = False  # a 'full' candidate's other splits were not all priced and might win
    return SearchResult(best=best, alternatives=ranked.alternatives, closest=closest,
                        considered=found_bounds.considered,
                        pruned_memory=found_bounds.pruned_memory + pruned_memory_late, pruned_bound=pruned_bound,
                        priced=priced,
                        programmes=programmes, ilp_solves=ilp_solves, proven_optimal=optimal,
                        elapsed_s=time.perf_counter() - start,
                        memory_floor_bytes=(found_bounds.least_floor_bytes
                                            if np.isfinite(found_bounds.least_floor_bytes) else 0.0),
                        found=found_bounds)


def _as_priced(cand: Candidate, fixed: dict) -> Candidate:
    """A 'full' candidate whose counts recompute no layer is the 'none' strategy (the same
    prices and memory: 'full' prices its counts on the rows of 'none'); unless the user asked
    for 'full', it ranks as that, so that the two are one plan and not a plan and its twin."""
    s = cand.strategy
    if (s.recompute == "full" and "recompute" not in fixed and s.recompute_layers is None
            and cand.recompute_layers is not None and not any(cand.recompute_layers)):
        return replace(cand, strategy=replace(s, recompute="none"), recompute_layers=None)
    return cand


def _strategy(found: bounds.Bounds, j: int, fixed: dict) -> Strategy:
    v = int(found.vpp[j])
    return Strategy(**found.knobs(j), zero=int(found.zero[j]), vpp=v,
                    schedule="interleaved-1f1b" if v > 1 else "1f1b", recompute_layers=fixed.get("recompute_layers"))


class _Ranked:
    """The best plan and the `top` runners-up found so far (distinct strategies; among equal
    steps the one priced first ranks first), and what a candidate must beat to be among them
    (cutoff_s; infinite until there are top + 1, and never above `outside_s`, what another search
    reached), so that the runners-up a plan lists are exact too."""

    def __init__(self, top: int, outside_s: float = float("inf")):
        self.top, self.entries, self.keys, self.outside_s = top, [], set(), outside_s

    def add(self, cand: Candidate) -> None:
        key = strategy_key(cand.strategy)
        if key not in self.keys:
            self.keys.add(key)
            bisect.insort(self.entries, (cand.step_time_s, len(self.keys), cand))
            del self.entries[self.top + 1:]

    @property
    def best(self) -> Candidate | None:
        return self.entries[0][2] if self.entries else None

    @property
    def alternatives(self) -> tuple[Candidate, ...]:
        return tuple(sorted((c for _, _, c in self.entries[1:]), key=lambda c: (c.step_time_s, strategy_key(c.strategy))))

    @property
    def cutoff_s(self) -> float:
        own = self.entries[self.top][0] if len(self.entries) > self.top else float("inf")
        return min(own, self.outside_s)


class _BoundOrder:
    """Candidates in the order of their refined bounds: the first bounds are sorted; the next
    batch of them is refined (Bounds.refined_s, vectorised) into a heap only when the heap's
    least refined bound is no longer below the next first bound, so the refinement costs in
    proportion to how far the search gets. Batches double until a plan is found; after it, one
    batch holds every candidate whose first bound is below the cutoff. A refined candidate
    below the cutoff has its memory checked (Bounds.fits) only when it reaches the top of the
    heap. Yields (candidate, refined bound); every bound yielded after the first plan is found
    is the least remaining."""

    FIRST_BATCH = 32
    MAX_BATCH = 4096
    CUTOFF_BATCH = 16384
    CHECK_BATCH = 16

    def __init__(self, found: bounds.Bounds):
        self.found, self.next, self.heap, self.batch = found, 0, [], self.FIRST_BATCH
        self.cutoff = float("inf")
        """what a candidate must beat to matter (the caller keeps it current: the best plan's
        step, or its last runner-up's): what cannot beat it needs no memory check"""

    @property
    def remaining(self) -> int:
        return len(self.found.bound_s) - self.next + len(self.heap)

    def _settle(self) -> None:
        """Check the memory of the least-bound candidates at the top of the heap that were below
        the cutoff when refined (a batch of up to CHECK_BATCH at once): those proven not to fit
        go back with an infinite bound. Checking them only when they come up spares the checks
        of the many that the search never reaches."""
        batch = []
        while self.heap and self.heap[0][2] and len(batch) < self.CHECK_BATCH:
            batch.append(heapq.heappop(self.heap))
        if batch:
            fits = self.found.fits(np.array([j for _, j, _ in batch])).tolist()
            for (bound, j, _), ok in zip(batch, fits):
                heapq.heappush(self.heap, (bound if ok else float("inf"), j, False))

    def __iter__(self):
        first = self.found.bound_s
        while self.next < len(first) or self.heap:
            while self.heap and self.heap[0][2]:
                self._settle()
            # until a plan is found, the best refined candidate goes first (an incumbent early
            # makes the memory checks of the next batches unnecessary); after it, bound order
            early = self.cutoff == float("inf") and self.heap and self.heap[0][0] < float("inf")
            if self.heap and (early or self.next >= len(first) or self.heap[0][0] <= first[self.next]):
                bound, j, _ = heapq.heappop(self.heap)
                yield j, bound
                continue
            stop = min(len(first), self.next + self.batch)
            if self.cutoff < float("inf"):
                # with a plan found, exactly the candidates whose first bounds are below it need
                # refining: one batch of them all costs less than the same rows in many batches
                below = int(np.searchsorted(first, self.cutoff * (1 - TIE)))
                if below <= self.next:
                    # no candidate left has a first bound below the cutoff: the caller stops here
                    self.next += 1
                    yield self.next - 1, float(first[self.next - 1])
                    continue
                stop = min(below, self.next + self.CUTOFF_BATCH)
            idx = np.arange(self.next, stop)
            refined, unchecked = self.found.refined_s(idx, self.cutoff)
            for item in zip(refined.tolist(), idx.tolist(), unchecked.tolist()):
                heapq.heappush(self.heap, item)
            self.next += len(idx)
            self.batch = min(2 * self.batch, self.MAX_BATCH)


def strategy_key(s: Strategy) -> tuple:
    """What makes two strategies one plan (a runner-up list holds each once)."""
    return (s.dp, s.tp, s.pp, s.cp, s.ep, s.vpp, s.micro_batch, s.zero, s.recompute, s.order, s.sequence_parallel)


def _price(prof, rules, solver, time_limit_s, best_s: float = float("inf")) -> tuple[Candidate, dict]:
    """The split: the exact DP for 1F1B with a free split (for 'full' on the relaxed tables of
    `_tables`), Megatron's first/last-stage split, or the even split. Then, for 'full', how many
    layers each stage recomputes by the ILP; when that lands above the relaxed DP's step and the
    relaxation could still beat `best_s` (the best step so far), the DP over splits and counts
    together settles it exactly (one count for every stage, as a runtime may require, has no
    such DP: the caller is told, and the search says it is not proven optimal). The even split,
    priced first where it caps the DP's window (under 'full' before any plan is found, with no
    layer recomputed or all of them), stands where nothing below it is found."""
    stats = {"programmes": 0, "ilp": 0, "optimal": True, "relaxed_s": None}
    s = prof.strategy
    cap = memory.capacity_bytes(prof.cluster, prof.setup)
    even = tuple(split_layers(prof.model.layers, s.pp, s.vpp))
    free_split = rules.free_split(s.pp, s.vpp)
    found = plain = layouts = None
    cutoff = best_s
    if free_split:
        # the even split is one of the splits: where it fits, its step caps the DP's window (a DP
        # that finds nothing below it leaves the even split the best). Under 'full' (counts not
        # fixed) its best counts would take an ILP, which costs more than the narrower window
        # saves once a plan bounds the window; before, the even split with no layer recomputed or
        # all of them, whichever fits and is faster, caps it.
        if not _counts_free(s, rules):
            plain = _candidate(prof, even, None)
        elif best_s == float("inf"):
            plain = min((c for c in (_candidate(prof, even, (0,) * s.pp), _candidate(prof, even, None)) if c.fits),
                        key=lambda c: c.step_time_s, default=None)
        cutoff = min(best_s, plain.step_time_s) if plain is not None and plain.fits else best_s
        if _dp_cells(prof) > MAX_DP_CELLS:
            stats["optimal"] = False  # the even split stands, unproven: the DP's tables would not fit
        else:
            found = _dp_split(prof, rules, cutoff)
            if found is not None:
                stats["programmes"] += found.programmes
                stats["optimal"] &= found.exhaustive
    elif s.pp > 2 and s.vpp == 1 and rules.uneven_split == "ends":
        layouts = _ends_layouts(prof, rules)
        found = layouts.best() if layouts is not None else None
    if found is None:  # nothing fits or beats the cutoff: the even split says by how much
        if layouts is not None:  # Megatron's layouts: none fits, and the even split may be none of them
            return _with_counts(prof, layouts.balanced(), rules, cap, solver, time_limit_s, best_s, stats), stats
        if free_split and plain is None:
            # under 'full', no split and no counts fit or beat the cutoff (the DP's proof): no
            # count choice is needed, only a price that fits where one does (each stage's least
            # count that fits; every layer recomputed where some stage fits at no count)
            return _candidate(prof, even, _least_fitting(prof, even, cap)), stats
        return plain or _with_counts(prof, even, rules, cap, solver, time_limit_s, best_s, stats), stats
    cand = _with_counts(prof, found.bounds, rules, cap, solver, time_limit_s, best_s, stats)
    if _counts_free(s, rules):
        # the split was chosen on relaxed tables (each range at its least time and least tail), so
        # another split may do better once the counts are chosen exactly
        if (not cand.fits or cand.step_time_s > found.step_s * (1 + SAFETY)) and found.step_s < best_s * (1 - SAFETY):
            if free_split and rules.recompute_counts == "stage" and _dp_cells(prof, counts=True) > MAX_DP_CELLS:
                stats["optimal"] = False  # the joint DP's tables would not fit: the split and counts stand
            elif free_split and rules.recompute_counts == "stage":
                # choose the split and each stage's count together: the DP over counts is exact
                joint = _dp_split(prof, rules, min(cutoff, cand.step_time_s), counts=True)
                if joint is not None:
                    stats["programmes"] += joint.programmes
                    stats["optimal"] &= joint.exhaustive
                    cand = min(cand, _candidate(prof, joint.bounds, joint.options), key=lambda c: c.step_time_s)
            elif rules.uneven_split == "ends" and s.vpp == 1 and (layouts := layouts or _ends_layouts(prof, rules)):
                # one count for every stage has no such DP: Megatron's layouts (with two stages
                # every split), best-first by their bound
                cand = _best_layout(prof, layouts, cand, rules, cap, solver, time_limit_s, best_s, stats)
            else:
                stats["relaxed_s"] = found.step_s  # the caller compares it with the best plan
    if plain is not None and plain.fits and plain.step_time_s < cand.step_time_s:
        cand = plain  # the window's cap: nothing below it was found (or the DP's walk was cut short)
    return cand, stats


def _range_terms(prof, rules, i, a, n, counts_width: int | None = None):
    """(t, tail, fits) of stage i holding layers [a, a+n) (arrays of ranges), shaped (ranges, 1),
    or (ranges, counts_width + 1) with the counts axis of _count_options: the cells of _tables."""
    s = prof.strategy
    cap = memory.capacity_bytes(prof.cluster, prof.setup)
    rng = [(a, a + n)]
    size = (len(i),)
    if _counts_free(s, rules):
        least, fits = _least_counts(prof, i, rng, n, cap)
        at_least = stage_terms(prof, i, rng, least)
        at_all = stage_terms(prof, i, rng, n)
        times, tails = at_least["t"], at_all["tail"]
        if counts_width is not None:
            times, tails, fits = _count_options(prof, i, a, n, counts_width, least, at_least, fits, tails)
            size += (counts_width + 1,)
        else:
            tails = _relaxed_tail(at_least, at_all, reduction_hiding(prof.cluster, i, s.dp_overlap))
    else:
        fixed = np.minimum(s.recompute_layers, n) if s.recompute_layers is not None else n if s.recompute == "full" else 0
        terms = stage_terms(prof, i, rng, fixed)
        times, tails, fits = terms["t"], terms["tail"], terms["memory"] <= cap
    if len(size) == 1:
        return tuple(np.broadcast_to(x, size)[..., None] for x in (times, tails, fits))
    return tuple(np.broadcast_to(x, size) for x in (times, tails, fits))


def _counts_free(s: Strategy, rules) -> bool:
    """Whether the search chooses how many layers each stage recomputes: under 'full' when the
    strategy fixes no count and the runtime runs some layers recomputed and others not (a runtime
    whose checkpointing covers every layer or none recomputes them all)."""
    return s.recompute == "full" and s.recompute_layers is None and rules.recompute_counts != "all"


def _with_counts(prof, split, rules, cap, solver, time_limit_s, best_s, stats) -> Candidate:
    """The split priced, with each stage's count of recomputed layers from the ILP under 'full'
    (when the strategy does not fix it); the ILP's work goes into `stats`."""
    counts = None
    if _counts_free(prof.strategy, rules):
        result = _recompute(prof, split, rules, cap, solver, time_limit_s, best_s)
        stats["ilp"] += result is not None and not result.shortcut
        if result is not None:
            counts = result.recompute_layers
            stats["optimal"] &= result.optimal
    return _candidate(prof, split, counts)


def _candidate(prof, split, counts) -> Candidate:
    """A split (with per-stage recompute counts, or None) priced by the cost model."""
    terms = split_terms(prof, list(split), counts)
    peak = float(np.max(terms["memory"]))
    return Candidate(strategy=prof.strategy, bounds=tuple(split), recompute_layers=counts,
                     step_time_s=split_step(terms, prof.microbatches, prof.strategy.vpp)[0],
                     peak_memory_bytes=peak, fits=peak <= memory.capacity_bytes(prof.cluster, prof.setup))


def _tables(prof, rules, width: int, counts: bool = False, cutoff: float = float("inf"), longest: int | None = None):
    """t, tail, ok of every stage position, first layer and length (<= width), shaped
    (pp, layers+1, width) for stages.best_split; priced only where some split of pp stages of
    1..width layers can hold that range at that position (elsewhere t is inf and ok False). With
    'full' and `counts`, one more axis holds the counts r of recomputed layers (0..width) worth
    choosing (_count_options), so the DP chooses the split and each stage's count together,
    exactly. With 'full' and no `counts`, each range takes its least count that
    fits (the least time) and, as its tail, a floor of what more recomputation adds to its time
    and leaves of its tail (_relaxed_tail): a relaxation, whose DP step is a lower bound for
    every count the ILP may choose afterwards (one count for every stage, the runtime's rule).
    A count the strategy fixes (recompute_layers, at most the range's length) is no choice: the
    tables are then exact. `longest`: ranges of more layers are left unpriced too (a caller that
    knows they cannot be in a split it wants; the stage DP over pools gives each pool its own)."""
    L, p = prof.model.layers, prof.strategy.pp
    i, a, n = _ranges(p, L, width)
    if longest is not None and longest < width:
        i, a, n = i[n <= longest], a[n <= longest], n[n <= longest]
    m = prof.microbatches
    if cutoff < float("inf") and m > 1:
        # a split beats the cutoff only if (m - 1) * max t < cutoff - sum t - max tail, where sum t
        # is at least the split-free sum of the time floors and the tail at least 0: ranges
        # above that bottleneck are left out, and the tables narrow to the longest range kept
        sigma = float(np.sum(stage_time_floor_s(prof, np.arange(p), list(even_chunks(L, p, 1)[0]))))
        inside = stage_time_floor_s(prof, i, [(a, a + n)]) <= (cutoff - sigma) / (m - 1) * (1 + SAFETY)
        width = int(n[inside].max(initial=1))
        inside &= _reachable(i, a, n, p, L, width)
        i, a, n = i[inside], a[inside], n[inside]
    times, tails, fits = _range_terms(prof, rules, i, a, n, width if counts else None)
    size = times.shape
    t, tail = np.full((p, L + 1, width, size[-1]), np.inf), np.full((p, L + 1, width, size[-1]), np.inf)
    ok = np.zeros(t.shape, dtype=bool)
    t[i, a, n - 1] = times  # each broadcast to the cells' shape (len(i), options)
    tail[i, a, n - 1] = tails
    ok[i, a, n - 1] = fits
    return t, tail, ok


@lru_cache(maxsize=1024)
def _ranges(p: int, L: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage, first layer, length) of every range of 1..width layers some split of L layers
    into p stages of 1..width layers puts on that stage (read-only arrays)."""
    i, a, n = (x.ravel() for x in np.meshgrid(np.arange(p), np.arange(L + 1), np.arange(1, width + 1),
                                               indexing="ij"))
    keep = _reachable(i, a, n, p, L, width)
    out = (i[keep], a[keep], n[keep])
    for x in out:
        x.flags.writeable = False
    return out


def _reachable(i, a, n, p: int, L: int, width: int) -> np.ndarray:
    """Whether some split of L layers into p stages of 1..width layers each puts [a, a+n) on
    stage i (the i stages before it and the p-1-i after it hold the rest)."""
    before, after = i, p - 1 - i
    return (a >= before) & (a <= before * width) & (L - a - n >= after) & (L - a - n <= after * width)


def _relaxed_tail(at_least: dict, at_all: dict, hiding):
    """The tail of a range in the relaxed tables (_tables): a lower bound of t(r) - t(least) +
    tail(r) over its counts r from the least that fits to all its layers. Any split's step then
    stays above the relaxed one: sum t + max tail >= sum of the least t + (t_J(r_J) - t_J(least)
    + tail_J(r_J)) for the stage J with the largest such value. As a function of the recompute
    time x added beyond the least count (0..D, D = t(all) - t(least)), t(r) - t(least) + tail(r)
    = x + tail(x) has slope 1 - hiding while the gradient reduction is exposed and 1 once it is
    hidden (stage_tail_s: the reduction hides behind `hiding` of the backward, recomputation
    included): convex, so above the lines through its ends with those slopes. With hiding <= 1
    the first line does not fall, and the least is at x = 0; else it is at least the lines'
    value where they cross (x clipped to [0, D]). Never below tail(all), the least tail."""
    h0, D = at_least["tail"], at_all["t"] - at_least["t"]
    hD = D + at_all["tail"]
    x = np.clip((h0 + D - hD) / np.maximum(hiding, 1.0), 0.0, D)
    return np.maximum(at_all["tail"], h0 + np.minimum(0.0, 1 - hiding) * x)


def _count_options(prof, i, a, n, width, least, at_least, fits, least_tail):
    """The counts axis of the joint tables (_tables), shaped (cells, width + 1): a range whose
    tail at its least fitting count is already its least tail (all layers recomputed) has no
    better count, since time only grows with the count and the tail only falls (the rule
    _recompute drops counts by), so it keeps that one option; the others get every count that
    fits."""
    cap = memory.capacity_bytes(prof.cluster, prof.setup)
    rows = np.arange(len(i))
    times, tails = np.full((len(i), width + 1), np.inf), np.full((len(i), width + 1), np.inf)
    ok = np.zeros(times.shape, dtype=bool)
    times[rows, least], tails[rows, least], ok[rows, least] = at_least["t"], at_least["tail"], fits
    vary = np.nonzero(fits & (np.broadcast_to(at_least["tail"], fits.shape) > least_tail))[0]
    if len(vary):
        r = np.arange(width + 1)[None, :]
        terms = stage_terms(prof, i[vary, None], [(a[vary, None], (a + n)[vary, None])], r)
        ok[vary] = (terms["memory"] <= cap) & (r <= n[vary, None])
        times[vary] = np.broadcast_to(terms["t"], ok[vary].shape)
        tails[vary] = np.broadcast_to(terms["tail"], ok[vary].shape)
    return times, tails, ok


def _least_fitting(prof, split, cap) -> tuple[int, ...] | None:
    """Each stage's least count of recomputed layers that fits on `split`, or None (every layer
    recomputed) when some stage fits at no count."""
    chunks, sizes = chunk_arrays(list(split), prof.strategy.pp)
    least, fits = _least_counts(prof, np.arange(prof.strategy.pp), chunks, sizes, cap)
    return tuple(least.tolist()) if fits.all() else None


def _least_counts(prof, i, rng, n, cap):
    """Per stage and range, the least count of fully recomputed layers that fits, and whether
    any does. Memory falls with every recomputed layer beyond the first (the first adds the
    rebuild buffer), so a bisection over 1..n finds it, for the ranges that do not fit with no
    layer recomputed."""
    none = np.broadcast_to(stage_memory_bytes(prof, i, rng, 0) <= cap, n.shape)
    need = np.nonzero(~none)
    i, n = np.broadcast_to(i, n.shape)[need], n[need]
    rng = [(np.broadcast_to(a, none.shape)[need], np.broadcast_to(b, none.shape)[need]) for a, b in rng]
    lo, hi = np.ones_like(n), n.copy()
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        fits = stage_memory_bytes(prof, i, rng, mid) <= cap
        hi = np.where(fits & (lo < hi), mid, hi)
        lo = np.where(~fits & (lo < hi), mid + 1, lo)
    least, some = np.zeros(none.shape, dtype=int), none.copy()
    least[need], some[need] = lo, stage_memory_bytes(prof, i, rng, lo) <= cap
    return least, some


MAX_DP_CELLS = 20_000_000
"""the most (stage, first layer, length[, count]) cells the split DP's tables may hold: about
160 MB a table. A deeper chain's free split is left at the even split, and the search says it
is not proven optimal: bounded memory and time rather than an answer that never comes (5,000
layers on 1,024 GPUs once took 445 s and 24 GB)."""


def _dp_cells(prof, counts: bool = False) -> int:
    """The cells of the split DP's tables (_tables) for this strategy, with the counts axis."""
    L, p = prof.model.layers, prof.strategy.pp
    width = space.stage_width(L, p)
    return p * (L + 1) * width * ((width + 1) if counts else 1)


def _dp_split(prof, rules, cutoff: float = float("inf"), counts: bool = False) -> stages.Split | None:
    """The exact DP (1F1B) on banded tables (None: nothing fits, or nothing beats `cutoff`).
    With `counts` (recompute 'full', a count per stage) it chooses each stage's count too
    (Split.options)."""
    t, tail, ok = _tables(prof, rules, space.stage_width(prof.model.layers, prof.strategy.pp), counts, cutoff)
    return stages.best_split(t, tail, ok, prof.microbatches, cutoff)


@dataclass(frozen=True)
class _Layouts:
    """Megatron's uneven splits of a strategy: first stage f, last stage la, the middle stages k
    layers each (two stages: f and la), in the order of first, then last; `steps` their step on the stages' tables
    (inf where one does not fit): exact, or a lower bound under 'full' with free counts."""

    steps: np.ndarray
    first: np.ndarray
    middle: np.ndarray
    layers: int
    pp: int

    def split(self, q: int) -> tuple:
        f, k = int(self.first[q]), int(self.middle[q])
        cuts = [0, f] + [f + k * j for j in range(1, self.pp - 1)] + [self.layers]
        return tuple(zip(cuts[:-1], cuts[1:]))

    def best(self) -> stages.Split | None:
        """The least step's layout (the first of the least), or None when none fits."""
        q = int(np.argmin(self.steps))
        if not np.isfinite(self.steps[q]):
            return None
        return stages.Split(bounds=self.split(q), step_s=float(self.steps[q]), programmes=0, exhaustive=True)

    def balanced(self) -> tuple:
        """The layout whose largest stage is least (the first of those): where none fits, the one
        that says by how much (the even split itself where the stages divide the layers)."""
        largest = np.maximum(np.maximum(self.first, self.layers - self.first - self.middle * (self.pp - 2)),
                             self.middle if self.pp > 2 else 0)
        return self.split(int(np.argmin(largest)))


def _ends_layouts(prof, rules) -> _Layouts | None:
    """Every uneven split Megatron runs (first and last stage free, the middle stages equal) and
    its step on the stages' tables (full recomputation of every layer when the mode is 'full';
    the counts are chosen after). Prices only the ranges such layouts use (_range_terms, the
    cells of _tables), all layouts at once; None when the layers admit no such layout."""
    s, L = prof.strategy, prof.model.layers
    p = s.pp
    width = space.stage_width(L, p)
    # every (first, last) in the order of first, then last, whose middle splits evenly (with two
    # stages: every split)
    first, last = (x.ravel() for x in np.meshgrid(np.arange(1, min(L, width + 1)), np.arange(1, min(L, width + 1)),
                                                   indexing="ij"))
    middle = L - first - last
    if p == 2:
        keep = middle == 0
    else:
        keep = (last < L - first) & (middle > 0) & (middle % (p - 2) == 0) & (middle // (p - 2) <= width)
    f, la = first[keep], last[keep]
    if not len(f):
        return None
    k = (L - f - la) // max(p - 2, 1)
    # the ranges of every layout: stage 0 [0, f), stage j (1..p-2) [f + (j-1) k, f + j k), the last [L - la, L)
    j = np.arange(1, p - 1)[None, :]
    starts = np.concatenate([np.zeros((len(f), 1), int), f[:, None] + (j - 1) * k[:, None], (L - la)[:, None]], axis=1)
    lengths = np.concatenate([f[:, None], np.broadcast_to(k[:, None], (len(f), p - 2)), la[:, None]], axis=1)
    stage = np.broadcast_to(np.arange(p)[None, :], starts.shape)
    # the distinct (stage, start, length) cells, in their lexicographic order, as one integer each
    keys, index = np.unique((stage.ravel() * (L + 1) + starts.ravel()) * (L + 1) + lengths.ravel(),
                            return_inverse=True)
    cells = (keys // (L + 1) ** 2, keys // (L + 1) % (L + 1), keys % (L + 1))
    t, tail, ok = (x[:, 0][index.ravel()].reshape(starts.shape) for x in _range_terms(prof, rules, *cells))
    fits = ok.all(axis=1)
    steps = np.where(fits, step_times_s(t, tail, prof.microbatches, 1), np.inf)
    return _Layouts(steps=steps, first=f, middle=k, layers=L, pp=p)


def _best_layout(prof, layouts: _Layouts, cand: Candidate, rules, cap, solver, time_limit_s, best_s, stats):
    """The best of Megatron's uneven splits with their counts chosen: `cand` (the split least on
    the relaxed tables, counts chosen) and then each other layout in the order of its relaxed
    step, a lower bound of its step with any counts, until that bound reaches the best found
    (or the search's `best_s`, which nothing above can beat): exact, as the joint DP is for a
    free split."""
    for q in np.argsort(layouts.steps, kind="stable").tolist():
        if layouts.steps[q] >= min(cand.step_time_s if cand.fits else float("inf"), best_s):
            break
        split = layouts.split(q)
        if split == cand.bounds:
            continue
        other = _with_counts(prof, split, rules, cap, solver, time_limit_s, best_s, stats)
        if other.fits and (not cand.fits or other.step_time_s < cand.step_time_s):
            cand = other  # (a layout whose one count fits no stage set is no plan: any that fits beats it)
    return cand


def _recompute(prof, bounds, rules, cap, solver, time_limit_s, best_s: float) -> ilp.IlpResult | None:
    """Per stage, every feasible count of fully recomputed layers, then the ILP. Counts that a
    smaller count matches in tail are dropped (time only grows with the count), and the ILP is
    skipped when it provably cannot matter: no stage's tail can drop, or even its best case
    cannot beat `best_s`."""
    s = prof.strategy
    flat, sizes = chunk_arrays(list(bounds), s.pp)
    counts = [int(n) for n in sizes]
    i = np.arange(s.pp)[:, None]
    r = np.arange(max(counts) + 1)[None, :]
    chunks = [(a[:, None], b[:, None]) for a, b in flat]
    terms = stage_terms(prof, i, chunks, r)  # every stage and count at once
    shape = (s.pp, r.shape[1])
    fits = np.broadcast_to(terms["memory"] <= cap, shape)
    t = np.broadcast_to(terms["t"], shape)
    tail = np.broadcast_to(terms["tail"], shape)
    m, v = prof.microbatches, s.vpp
    if rules.recompute_counts == "uniform":
        return _uniform_counts(t, tail, fits, counts, m, v, best_s)
    options = []
    for stage, n in enumerate(counts):
        kept, lowest = {}, float("inf")
        for k in range(n + 1):
            if fits[stage, k] and tail[stage, k] < lowest:
                kept[k] = (float(t[stage, k]), float(tail[stage, k]))
                lowest = min(lowest, float(tail[stage, k]))
        options.append(kept)
    if not all(options):
        return None
    least = tuple(min(o) for o in options)
    times = [o[r][0] for o, r in zip(options, least)]
    tails = [o[r][1] for o, r in zip(options, least)]
    step = step_time_s(times, tails, m, v)
    top = max(range(len(options)), key=tails.__getitem__)
    stuck = min(x[1] for x in options[top].values()) >= tails[top]
    floor = step_time_s(times, [min(x[1] for x in o.values()) for o in options], m, v)
    if stuck or floor >= best_s:
        return ilp.IlpResult(recompute_layers=least, objective=step, optimal=True, shortcut=True)
    return ilp.recompute_ilp(options, m, v, solver=solver, time_limit_s=time_limit_s)


def _uniform_counts(t, tail, fits, counts: list[int], m: int, v: int, best_s: float) -> ilp.IlpResult | None:
    """_recompute for one count R for every stage (Megatron's --recompute-num-layers: stage i
    recomputes min(R, n_i) of its layers; with interleaving it recomputes the same R layers of
    every virtual chunk, so only none or all of a stage's layers are expressible), from the
    stages' (stages, counts) time, tail and fit tables: the least fitting counts when no R can
    do better (no stage's tail can drop, or even its best case cannot beat `best_s`), else the
    best R (ilp.uniform_best)."""
    k, n = np.arange(t.shape[1])[None, :], np.asarray(counts)[:, None]
    allowed = fits & (k <= n) & (((k == 0) | (k == n)) if v > 1 else True)
    if not allowed.any(axis=1).all():
        return None
    least = tuple(int(r) for r in allowed.argmax(axis=1))  # each stage's least allowed count
    times = [float(t[i, r]) for i, r in enumerate(least)]
    tails = [float(tail[i, r]) for i, r in enumerate(least)]
    step = step_time_s(times, tails, m, v)
    top = max(range(len(least)), key=tails.__getitem__)
    stuck = float(tail[top][allowed[top]].min()) >= tails[top]
    floor = step_time_s(times, [float(tail[i][allowed[i]].min()) for i in range(len(least))], m, v)
    if (stuck or floor >= best_s) and len(set(least)) == 1:
        return ilp.IlpResult(recompute_layers=least, objective=step, optimal=True, shortcut=True)
    return ilp.uniform_best(t, tail, allowed, m, v, counts)
