"""Split the layer chain into pipeline stages: an exact dynamic programme over contiguous splits.

Inputs are banded cost tables over every stage position i, first layer a, length n (1..N) and
recomputed layers r: t[i, a, n-1, r] the time of one micro-batch on stage i holding layers
[a, a+n), tail[...] what the stage adds after the pipeline drains (exposed DP reduction and
optimizer step), ok[...] whether it fits in memory. The objective is the cost model's own 1F1B step time
(cost/pipeline.py with v = 1):

    step = m * max_i t_i + (sum_i t_i - max_i t_i) + max_i tail_i
         = (m - 1) * T + sum_i t_i + U,   T = max_i t_i,  U = max_i tail_i.

For fixed thresholds (T, U) the best split minimises sum_i t_i over ranges with t <= T and
tail <= U: a shortest path, best[i][b] = min_n best[i-1][b-n] + t[i, b-n, n-1] (Alpa, Zheng et
al. 2022, §5.2, enumerates the bottleneck the same way). T runs upwards through the distinct
values of the table and stops once (m - 1) * T + (least sum t) + (least feasible U) cannot beat
the best step found; for each T, U runs down the breakpoints of the least sum (each programme's
split has some largest tail u; only U < u can give another split). The result is the exact
optimum over all contiguous splits whose stages hold at most N layers, unless the iteration
limit stops it first (then `exhaustive` is False and the plan says it is not proven optimal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = float("inf")
MAX_PROGRAMMES = 400
"""shortest-path programmes per split before the DP gives up proving optimality"""


@dataclass(frozen=True, slots=True)
class Split:
    bounds: tuple[tuple[int, int], ...]
    recompute_layers: tuple[int, ...]
    """per stage, the recomputed layers the split's cheapest feasible choice takes"""
    step_s: float
    """(m - 1) * max t + sum t + max tail of the split"""
    programmes: int
    """shortest-path programmes solved"""
    exhaustive: bool


def _shortest(cost: np.ndarray) -> tuple[float, list[int]]:
    """Min over splits of sum_i cost[i, a_i, n_i] (a_0 = 0, a_i + n_i = a_{i+1}, a_p = L)."""
    p, n1, width = cost.shape
    end = n1 - 1
    b = np.arange(n1)[:, None]
    n = np.arange(1, width + 1)[None, :]
    start = b - n
    valid = start >= 0
    start_c = np.where(valid, start, 0)
    lengths = np.arange(1, width + 1)
    best = np.full(n1, INF)
    reach = lengths <= end
    best[lengths[reach]] = cost[0, 0, reach]
    choices = []
    for i in range(1, p):
        total = np.where(valid, best[start_c] + cost[i, start_c, n - 1 + 0 * b], INF)
        arg = np.argmin(total, axis=1)
        choices.append(arg)
        best = total[np.arange(n1), arg]
    if not np.isfinite(best[end]):
        return INF, []
    cuts = [end]
    for arg in reversed(choices):
        cuts.append(cuts[-1] - int(arg[cuts[-1]]) - 1)
    cuts.append(0)
    return float(best[end]), cuts[::-1]


def best_split(t: np.ndarray, tail: np.ndarray, ok: np.ndarray, microbatches: int,
               cutoff: float = INF) -> Split | None:
    """Exact best contiguous split (None when no split fits, or none can beat `cutoff`).

    Tables are (p, L+1, N, R): the last axis is the number of fully recomputed layers r (R = 1
    when there is no such choice). For a range and thresholds (T, U) the cheapest choice is the
    least r that fits with tail <= U (time grows with r), allowed when its time is <= T; so the
    DP is exact over splits and recompute counts together."""
    p = t.shape[0]
    valid = ok & np.isfinite(t)
    solved = 0

    def solve(T: float, U: float):
        nonlocal solved
        solved += 1
        mask = valid & (tail <= U)
        least = np.argmax(mask, axis=3)[..., None]
        chosen = np.take_along_axis(t, least, axis=3)[..., 0]
        usable = mask.any(axis=3) & (chosen <= T)
        total, cuts = _shortest(np.where(usable, chosen, INF))
        if not cuts:
            return None
        bounds = [(cuts[i], cuts[i + 1]) for i in range(p)]
        cells = [(i, lo, hi - lo - 1, int(least[i, lo, hi - lo - 1, 0])) for i, (lo, hi) in enumerate(bounds)]
        t_max = max(t[c] for c in cells)
        u_max = max(tail[c] for c in cells)
        return (microbatches - 1) * t_max + total + u_max, bounds, total, tuple(c[3] for c in cells), u_max

    free = solve(INF, INF)
    if free is None:
        return None
    best_step, best_bounds, sigma_min, best_r, _ = free
    if (microbatches - 1) * sigma_min / p + sigma_min + tail[valid].min() >= cutoff:
        return None  # max t >= sum t / p: no split can beat the cutoff
    t_values = np.unique(t[valid])
    u_values = np.unique(tail[valid])

    def lowest_feasible(values, make):
        lo, hi = 0, len(values) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if make(values[mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        return lo

    t0 = lowest_feasible(t_values, lambda T: solve(T, INF))
    u_floor = u_values[lowest_feasible(u_values, lambda U: solve(INF, U))]
    if (microbatches - 1) * t_values[t0] + sigma_min + u_floor >= min(cutoff, best_step):
        return None if best_step >= cutoff else Split(bounds=tuple(best_bounds), recompute_layers=tuple(best_r),
                                                      step_s=float(best_step), programmes=solved, exhaustive=True)
    exhaustive = True
    for T in t_values[t0:]:
        if (microbatches - 1) * T + sigma_min + u_floor >= best_step:
            break
        # Down the breakpoints of the tail: each programme returns the least sum t with tails <= U;
        # the next one only needs U below that split's own largest tail.
        U = INF
        while True:
            if solved >= MAX_PROGRAMMES:
                exhaustive = False
                break
            found = solve(T, U)
            if found is None:
                break
            step, bounds, total, counts, u_max = found
            if step < best_step:
                best_step, best_bounds, best_r = step, bounds, counts
            below = np.searchsorted(u_values, u_max) - 1
            if below < 0 or (microbatches - 1) * t_values[t0] + total + u_floor >= best_step:
                break
            U = u_values[below]
        if not exhaustive:
            break
    if best_step >= cutoff:
        return None
    return Split(bounds=tuple(best_bounds), recompute_layers=tuple(best_r), step_s=float(best_step),
                 programmes=solved, exhaustive=exhaustive)
