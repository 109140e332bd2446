"""Split the layer chain into pipeline stages: an exact dynamic programme over contiguous splits.

Inputs are banded cost tables over every stage position i, first layer a and length n (1..N):
t[i, a, n-1] the time of one micro-batch on stage i holding layers [a, a+n), tail[...] what the
stage adds after the pipeline drains (exposed DP reduction and optimizer step), ok[...] whether
it fits in memory. The objective is the cost model's own 1F1B step time
(cost/pipeline.py with v = 1):

    step = m * max_i t_i + (sum_i t_i - max_i t_i) + max_i tail_i
         = (m - 1) * T + sum_i t_i + U,   T = max_i t_i,  U = max_i tail_i.

For fixed thresholds (T, U) the best split minimises sum_i t_i over ranges with t <= T and
tail <= U: a shortest path, best[i][b] = min_n best[i-1][b-n] + t[i, b-n, n-1] (Alpa, Zheng et
al. 2022, §5.2, enumerates the bottleneck the same way). The thresholds walk down the Pareto
front of (max t, max tail, sum t) from (inf, inf), pruning every branch whose least possible
step, (m - 1) * (least feasible T) + sum t + (least feasible U), cannot beat the best found, and
clamping both thresholds to the window where a split could still beat it: T <= (best - least
sum t - least U) / (m - 1) and U <= best - (m - 1) * (least T) - least sum t; the thresholds
are values of t and tail inside that window. The best found starts from the programmes at
(inf, inf) and at (least feasible T, inf). With several options per range (a last axis, such
as how many layers recompute), a range takes its least t among the options under the
thresholds, and an option that another matches or beats in both t and tail is dropped. The
result is the exact optimum over all contiguous splits whose stages hold at most N layers,
unless the iteration limit stops it first (then `exhaustive` is False and the plan says it is
not proven optimal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = float("inf")
MAX_PROGRAMMES = 128
"""shortest-path programmes per split before the DP gives up proving optimality"""


@dataclass(frozen=True, slots=True)
class Split:
    bounds: tuple[tuple[int, int], ...]
    step_s: float
    """(m - 1) * max t + sum t + max tail of the split"""
    programmes: int
    """shortest-path programmes solved"""
    exhaustive: bool
    options: tuple[int, ...] | None = None
    """each stage's option (best_split's last table axis)"""


def _skew(cost: np.ndarray) -> np.ndarray:
    """cost[i, a, n-1] (stage i holding [a, a+n)) re-indexed by length and where the stage ends:
    out[i, n-1, b] = cost[i, b-n, n-1], INF where b < n. Extra trailing axes ride along."""
    n1, width = cost.shape[1], cost.shape[2]
    n = np.arange(1, width + 1)[:, None]
    b = np.arange(n1)[None, :]
    out = cost[:, np.maximum(b - n, 0), np.broadcast_to(n - 1, (width, n1))]
    inside = (b >= n).reshape((1, width, n1) + (1,) * (cost.ndim - 3))
    if np.issubdtype(out.dtype, np.bool_):
        return out & inside
    return np.where(inside, out, INF)


def _chain(skewed: np.ndarray, combine) -> tuple:
    """The recursion over stages both programmes share, on _skew's layout: best[i][b] = min_n
    combine(best[i-1][b-n], skewed[i, n-1, b]) with stage 0 starting at layer 0; returns the
    value at b = L and each later stage's table of combined values (for the cut points).
    Tables (p, k, width, L+1) run k recursions at once (values: an array of k)."""
    p, *batch, width, n1 = skewed.shape
    lengths = np.arange(1, min(width, n1 - 1) + 1)
    # best[i-1] after `width` INF: row n-1 of `shifted` is best[i-1][b-n] (INF where b < n), a
    # view that follows every update of `padded`
    padded = np.full((*batch, width + n1), INF)
    padded[..., width + lengths] = skewed[0][..., lengths - 1, lengths]
    step = padded.itemsize
    shifted = np.ndarray((*batch, width, n1), padded.dtype, padded, (width - 1) * step,
                         (*padded.strides[:-1], -step, step))
    totals = []
    for i in range(1, p):
        total = combine(shifted, skewed[i])  # INF where the stage cannot end at b
        totals.append(total)
        np.minimum.reduce(total, axis=-2, out=padded[..., width:])
    return (padded[..., -1].copy() if batch else float(padded[-1])), totals


def _shortest(skewed: np.ndarray) -> tuple[float, list[int]]:
    """Min over splits of sum_i cost[i, a_i, n_i] (a_0 = 0, a_i + n_i = a_{i+1}, a_p = L) on
    _skew's layout, and the split's cut points."""
    total, tables = _chain(skewed, np.add)
    if not np.isfinite(total):
        return INF, []
    cuts = [skewed.shape[2] - 1]
    for table in reversed(tables):
        cuts.append(cuts[-1] - int(table[:, cuts[-1]].argmin()) - 1)
    cuts.append(0)
    return total, cuts[::-1]


class _Options:
    """The options of every (stage, length, end) cell, in _skew's layout, less those another
    option of the same cell matches or beats in both t and tail (no split is better for them):
    cells left with one option as dense arrays, the few with several as runs of entries, so
    a programme's work does not grow with the options axis."""

    def __init__(self, t_s: np.ndarray, tail_s: np.ndarray, valid_s: np.ndarray):
        shape, width = t_s.shape[:-1], t_s.shape[-1]
        keep = valid_s
        if width > 1:
            # where t never falls as the option index grows, an option is beaten by an earlier
            # one whose tail is no larger: keep the options that lower the least tail so far
            t_seen = np.maximum.accumulate(np.where(valid_s, t_s, -INF), axis=-1)
            if np.all(~valid_s[..., 1:] | (t_s[..., 1:] >= t_seen[..., :-1])):
                least_tail = np.minimum.accumulate(np.where(valid_s, tail_s, INF), axis=-1)
                keep = valid_s & np.concatenate([np.ones(shape + (1,), dtype=bool),
                                                 tail_s[..., 1:] < least_tail[..., :-1]], axis=-1)
        self.shape = shape
        if width == 1:  # one option a cell: no runs
            self.first = np.zeros(shape, dtype=int)
            self.t1, self.tail1 = np.where(keep[..., 0], t_s[..., 0], INF), np.where(keep[..., 0], tail_s[..., 0], INF)
            self.multi, self.t_e, self.tail_e = np.zeros(0, dtype=int), np.zeros(0), np.zeros(0)
            return
        count = keep.sum(axis=-1)
        self.first = np.argmax(keep, axis=-1)
        single, pick = count == 1, self.first[..., None]
        self.t1 = np.where(single, np.take_along_axis(t_s, pick, axis=-1)[..., 0], INF)
        self.tail1 = np.where(single, np.take_along_axis(tail_s, pick, axis=-1)[..., 0], INF)
        self.multi = np.flatnonzero(count > 1)
        kept = keep.reshape(-1, width)[self.multi]
        self.t_e = t_s.reshape(-1, width)[self.multi][kept]
        self.tail_e = tail_s.reshape(-1, width)[self.multi][kept]
        self.option_e = np.nonzero(kept)[1]
        self.starts = np.concatenate([[0], np.cumsum(kept.sum(axis=1))[:-1]]).astype(int)

    def least(self, T: float, U: float) -> tuple[np.ndarray, np.ndarray | None]:
        """Per cell, the least t among its options with t <= T and tail <= U (INF when none);
        and the entries' allowed t (for choice)."""
        out = np.where((self.tail1 <= U) & (self.t1 <= T), self.t1, INF)
        if not self.multi.size:
            return out, None
        allowed = np.where((self.tail_e <= U) & (self.t_e <= T), self.t_e, INF)
        out.reshape(-1)[self.multi] = np.minimum.reduceat(allowed, self.starts)
        return out, allowed

    def choice(self, cell: tuple, allowed: np.ndarray) -> int:
        """The option a cell takes under the thresholds `allowed` came from (some cell has several
        options: else every cell takes `first`)."""
        flat = int(np.ravel_multi_index(cell, self.shape))
        k = int(np.searchsorted(self.multi, flat))
        if k == len(self.multi) or self.multi[k] != flat:
            return int(self.first[cell])
        run = slice(self.starts[k], self.starts[k + 1] if k + 1 < len(self.starts) else len(self.t_e))
        return int(self.option_e[run][np.argmin(allowed[run])])

    def least_tail(self) -> np.ndarray:
        """Per cell, the least tail of its options."""
        out = self.tail1.copy()
        if self.multi.size:
            out.reshape(-1)[self.multi] = np.minimum.reduceat(self.tail_e, self.starts)
        return out

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """Every t and every tail an option has (the thresholds' candidates)."""
        single = np.isfinite(self.t1)
        return np.concatenate([self.t1[single], self.t_e]), np.concatenate([self.tail1[single], self.tail_e])


def best_split(t: np.ndarray, tail: np.ndarray, ok: np.ndarray, microbatches: int,
               cutoff: float = INF) -> Split | None:
    """Exact best contiguous split (None when no split fits, or none can beat `cutoff`; when
    the iteration limit stops the walk first, the best split found, with exhaustive False).
    Tables are (p, L+1, N), or (p, L+1, N, R) with R options per stage and range (how many of
    its layers recompute, say): under thresholds (T, U) each range takes its least t among the
    options with t <= T and tail <= U, so the walk below is exact over splits and options
    together; Split.options gives each stage's option."""
    if t.ndim == 3:
        t, tail, ok = t[..., None], tail[..., None], ok[..., None]
    p = t.shape[0]
    # the programmes run on the tables re-indexed by where each stage ends (_skew), built once
    options = _Options(_skew(t), _skew(tail), _skew(ok & np.isfinite(t)))
    solved = 0

    def solve(T: float, U: float):
        nonlocal solved
        solved += 1
        least, allowed = options.least(T, U)
        total, cuts = _shortest(least)
        if not cuts:
            return None
        bounds = [(cuts[i], cuts[i + 1]) for i in range(p)]
        stage, lo, hi = np.arange(p), np.array(cuts[:-1]), np.array(cuts[1:])
        if allowed is None:  # no cell has several options: each takes its first, all at once
            chosen = tuple(options.first[stage, hi - lo - 1, hi].tolist())
        else:
            chosen = tuple(options.choice((i, b - a - 1, b), allowed) for i, (a, b) in enumerate(bounds))
        picked = (stage, lo, hi - lo - 1, np.array(chosen))
        t_max, u_max = t[picked].max(), tail[picked].max()
        return (microbatches - 1) * t_max + total + u_max, bounds, total, t_max, u_max, chosen

    free = solve(INF, INF)
    if free is None:
        return None
    best_step, best_bounds, sigma_min, free_t_max, _, best_options = free
    # Exact floors: the least bottleneck and the least largest tail any feasible split can have.
    t_floor, u_floor = _chain(np.stack([options.least(INF, INF)[0], options.least_tail()], axis=1),
                              np.maximum)[0].tolist()
    if (microbatches - 1) * t_floor + sigma_min + u_floor >= cutoff:
        return None
    # the least sum t under the least bottleneck: where sum t hardly depends on the split (a
    # chain of equal layers) it is near the best, and the window below narrows at once
    if free_t_max > t_floor:
        found = solve(t_floor, INF)
        if found is not None and found[0] < best_step:
            best_step, best_bounds, _, _, _, best_options = found
    # the thresholds are values of t and tail; only those inside the first window (below) can
    # serve, since the window only narrows as the best improves
    limit = min(best_step, cutoff)
    t_hi = (limit - sigma_min - u_floor) / (microbatches - 1) if microbatches > 1 else INF
    u_hi = limit - (microbatches - 1) * t_floor - sigma_min
    t_all, u_all = options.values()
    t_values = np.unique(t_all[(t_all >= t_floor) & (t_all <= t_hi)])
    u_values = np.unique(u_all[(u_all >= u_floor) & (u_all <= u_hi)])

    def below(values, x, strict=True):
        """The largest value < x (<= x when not strict), or None."""
        k = np.searchsorted(values, x, side="left" if strict else "right") - 1
        return float(values[k]) if k >= 0 else None

    # Walk the Pareto front of (max t, max tail, sum t) downwards from (inf, inf): a node's
    # programme returns the least sum t under its thresholds; a better split must have a smaller
    # max t or a smaller max tail than the one returned, so the children tighten one threshold to
    # just below that split's own value. Tightening only raises sum t, which bounds a subtree.
    exhaustive = True
    stack, seen = [(INF, INF)], set()
    while stack:
        T, U = stack.pop()
        # a split beating the best has (m - 1) * max t + sum t + max tail < best with sum t >=
        # sigma_min, max t >= t_floor and max tail >= u_floor: clamp the thresholds to that window
        limit = min(best_step, cutoff)
        t_max = below(t_values, (limit - sigma_min - u_floor) / (microbatches - 1), strict=False) \
            if microbatches > 1 else INF
        u_max = below(u_values, limit - (microbatches - 1) * t_floor - sigma_min, strict=False)
        if t_max is None or u_max is None:
            continue
        T, U = min(T, t_max), min(U, u_max)
        if (T, U) in seen:
            continue
        seen.add((T, U))
        if solved >= MAX_PROGRAMMES:
            exhaustive = False
            break
        found = solve(T, U)
        if found is None:
            continue
        step, bounds, total, t_max, u_max, chosen = found
        if step < best_step:
            best_step, best_bounds, best_options = step, bounds, chosen
        if (microbatches - 1) * t_floor + total + u_floor >= min(best_step, cutoff):
            continue
        u_next = below(u_values, u_max)
        if u_next is not None:
            stack.append((T, u_next))
        t_next = below(t_values, t_max)
        if t_next is not None and microbatches > 1:
            stack.append((t_next, U))
    if best_step >= cutoff and exhaustive:
        return None
    return Split(bounds=tuple(best_bounds), step_s=float(best_step), programmes=solved, exhaustive=exhaustive,
                 options=best_options)
