"""The closed forms the search's lower bounds share: pipeline time at its least, sums over the
stages of a pipeline in closed form, and the least recomputation a model needs to fit. Pure
functions over numpy arrays (search/bounds.py and search/refine.py use them)."""

from __future__ import annotations

import numpy as np

from planner.cost import memory

SAFETY = 1e-9
"""relative slack on every bound and floor: the closed forms round differently from the pricing"""
TIE = 2 * SAFETY
"""a candidate whose bound is within TIE (relative) of the best plan cannot beat it by more than
its bound's slack and a rounding: it ties, and is not priced (improvements below TIE are not
sought). A tight bound lands a rounding below best * (1 - SAFETY), so SAFETY alone would not do."""


def layer_state_bytes(per_dense, per_expert, params, expert):
    """Weights, gradients and optimizer states of a layer with `params` dense and `expert` expert
    parameters, at `per_dense` and `per_expert` bytes a parameter (memory.state_bytes summed for
    the candidate's ZeRO stage and shards). Arrays broadcast."""
    return per_dense * params + per_expert * expert


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
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # the branches np.where drops
        x = np.where(saved > 0, (state / saved + c0) / c1, 1.0)
        progression = np.where(saved > 0, reciprocal_run(x, n) / (saved * c1), n / state)
        capped = (pp - n) / (state + m * saved)
    return progression + capped


def reciprocal_run(x, n):
    """sum_{i=0}^{n-1} 1 / (x + i) = digamma(x + n) - digamma(x) for x > 0 (arrays): both ends
    are shifted up to x >= 10 (digamma(x + 1) = digamma(x) + 1/x), then the asymptotic series
    ln(x) - 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + 1/(240x^8) - 1/(132x^10)
    + 691/(32760x^12) is differenced, its logarithms as log1p(n / x) so that nothing cancels
    (truncation error below 1e-15: the next term is 1/(12x^14))."""
    x, n = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(n, dtype=float))
    total = np.zeros(x.shape)
    for _ in range(10):
        small = x < 10
        if not small.any():
            break
        total = total + np.where(small, 1.0 / x - 1.0 / (x + n), 0.0)
        x = np.where(small, x + 1.0, x)

    def tail(y):
        inv = 1.0 / (y * y)
        return -0.5 / y - inv * (1 / 12 - inv * (1 / 120 - inv * (1 / 252 - inv * (1 / 240 - inv * (
            1 / 132 - inv * 691 / 32760)))))

    return total + np.log1p(n / x) + tail(x + n) - tail(x)


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
