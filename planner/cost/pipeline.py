"""Pipeline schedules: stage split, step time with its bubble, micro-batches in flight.

Step time (Narayanan et al. 2021 §2.2, generalised to unequal stages): with t_i the time of one
micro-batch (forward + backward) on stage i, m micro-batches and v virtual stages per rank,
    T = m * max_i t_i + (sum_i t_i - max_i t_i) / v.
Equal stages give T = (m + (p-1)/v) * t: bubble fraction (p-1)/m for 1F1B and (p-1)/(v*m)
interleaved. For v = 1 it is the (m-1) * max + sum of Alpa's stage construction.

In-flight activations: 1F1B stage i holds min(p - i, m) micro-batches; interleaved 1F1B (Megatron)
holds 2*(p - i - 1) + (v - 1)*p + 1 model chunks at its peak, which for stage 0 is Korthikanti
et al. 2022's p * (1 + (p-1)/(p*v)) micro-batches of the whole stage.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def split_layers(layers: int, pp: int, vpp: int) -> list[tuple[int, int]]:
    """Even split of `layers` into pp*vpp chunks [start, end); extra layers go to the middle
    chunks, since the first and last stages also carry the embedding and the LM head."""
    chunks = pp * vpp
    base, extra = divmod(layers, chunks)
    sizes = [base] * chunks
    start = (chunks - extra) // 2
    for i in range(start, start + extra):
        sizes[i] += 1
    bounds, at = [], 0
    for size in sizes:
        bounds.append((at, at + size))
        at += size
    return bounds


def stage_chunks(bounds: list[tuple[int, int]], pp: int) -> list[list[tuple[int, int]]]:
    """Chunks held by each pipeline rank: rank i holds chunks i, i + pp, i + 2*pp, ..."""
    return [bounds[i::pp] for i in range(pp)]


def chunk_arrays(bounds: list[tuple[int, int]], pp: int, stages=None) -> tuple[list, np.ndarray]:
    """The chunks of `stages` (default: all) as [(a, b), ...] with a and b arrays over those
    stages (stage i holds chunks i, i + pp, ...), and each stage's layer count: the form in
    which the cost model prices many stages at once."""
    stages = np.arange(pp) if stages is None else np.asarray(stages)
    chunks = [(np.array([bounds[k * pp + i][0] for i in stages]), np.array([bounds[k * pp + i][1] for i in stages]))
              for k in range(len(bounds) // pp)]
    return chunks, sum(b - a for a, b in chunks)


@lru_cache(maxsize=4096)
def even_chunks(layers: int, pp: int, vpp: int) -> tuple[tuple, np.ndarray]:
    """chunk_arrays of the even split (cached: the search asks for the same splits often)."""
    chunks, sizes = chunk_arrays(split_layers(layers, pp, vpp), pp)
    for a, b in chunks:
        a.flags.writeable = b.flags.writeable = False
    sizes.flags.writeable = False
    return tuple(chunks), sizes


def pipeline_time_s(stage_times_s: list[float], microbatches: int, vpp: int) -> tuple[float, float]:
    """(step time of the pipeline, bubble part of it); formula in the module docstring."""
    worst = max(stage_times_s)
    bubble = (sum(stage_times_s) - worst) / vpp
    return microbatches * worst + bubble, bubble


def step_time_s(stage_times_s: list[float], tails_s: list[float], microbatches: int, vpp: int) -> float:
    """The step: the pipeline (above) plus the largest end-of-step tail of a stage (its exposed
    data-parallel reduction and optimizer step)."""
    return pipeline_time_s(stage_times_s, microbatches, vpp)[0] + max(tails_s)


def step_times_s(times_s: np.ndarray, tails_s: np.ndarray, microbatches: int, vpp: int) -> np.ndarray:
    """step_time_s of many candidates at once: `times_s` and `tails_s` are (candidates, stages)
    arrays, each row's stages summed in order as step_time_s sums them (so a row prices to the
    same float). An inf time gives inf (or nan, which callers mask)."""
    worst, total = times_s.max(axis=1), times_s[:, 0].copy()
    for i in range(1, times_s.shape[1]):
        total += times_s[:, i]
    with np.errstate(invalid="ignore"):  # inf - inf where a stage cannot take a candidate
        return microbatches * worst + (total - worst) / vpp + tails_s.max(axis=1)


def in_flight(stage, pp: int, microbatches: int, vpp: int):
    """Micro-batches of the whole stage whose activations stage `stage` (an int or an array of
    them) holds at its peak; pp, microbatches and vpp may be arrays too."""
    one = np.minimum(pp - stage, microbatches) * 1.0
    if not getattr(vpp, "ndim", 0) and vpp == 1:
        return one
    chunks = np.minimum(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, microbatches * vpp) / vpp
    return np.where(np.equal(vpp, 1), one, chunks)
