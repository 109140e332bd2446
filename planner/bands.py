"""How sure a prediction is: the spread of the cost model's errors on runs no fit has seen.

A band is the 10th to 90th percentile of the predictive distribution of the signed out-of-sample
error (predicted / measured step time - 1; leave-one-source-out refits and the frozen checks) of
the GPU a prediction is for, or of its family when the GPU's errors come from fewer than
MIN_SOURCES sources, or of every GPU when the family's do as well (the band's basis says which);
a measured step time then lies in [predicted / (1 + high), predicted / (1 + low)].

The errors cluster by source (a document: one software stack, one way of measuring): on H100 the
between-source variance is about as large as the within-source one (intraclass correlation 0.46
over 11 sources, 2026-12-03), so a source's nine rows are not nine independent draws, and a run
a user has not made yet comes from a source the errors have not seen. The band is therefore the
prediction interval of a one-way random-effects model, e_ij = mu + u_j + eps_ij with source
effects u_j ~ N(0, tau^2) and rows eps_ij ~ N(0, sigma^2) (Higgins, Thompson & Spiegelhalter
2009, J. R. Stat. Soc. A 172:137, eq. 12):
  mu ± t(0.9; k - 2) * sqrt(tau^2 + sigma^2 + Var(mu))
with k sources, mu the mean of the k source means m_j (each source weighted equally, as
validate's equal-source figures), sigma^2 the pooled within-source variance
sum (e_ij - m_j)^2 / (N - k), tau^2 = max(0, s_m^2 - sigma^2 * mean(1 / n_j)) (moments:
E[s_m^2] = tau^2 + sigma^2 * mean(1 / n_j), s_m^2 the variance of the source means) and
Var(mu) = s_m^2 / k. Percentiles of the pooled rows (the band before 2026-12-03) ignore the
clustering: their band narrowed whenever one source's rows agreed with each other, and held 76.7 %
of the check rows, each judged without its own source, where this one holds 82.6 % (66 and 71 of
the 86 rows of that date, `planner validate`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from planner.runtimes import runtime_family
from planner.spec.hardware import Gpu
from planner.units import bytes_to_gib

RESIDUALS = Path(__file__).resolve().parent / "data" / "residuals.json"
"""the out-of-sample errors of the bundled runs, as `planner validate --save-residuals` writes them
(a test keeps the file equal to what validate computes)"""
COVERAGE = 0.80
"""the band's central probability: its ends are the 10th and 90th percentiles"""
MIN_SOURCES = 3
"""fewest sources a band is taken from (else the next wider basis): the t quantile has k - 2
degrees of freedom"""


@dataclass(frozen=True, slots=True)
class Residual:
    """One out-of-sample error: the run's GPU, its family, the document it comes from."""

    gpu: str
    family: str
    document: str
    error: float


@dataclass(frozen=True, slots=True)
class MemoryResidual:
    """One out-of-sample error of a predicted peak against a published one (predicted / published
    - 1): the runtime family that ran it (the record name before any @version), whether it ran
    pipeline stages, the document it comes from."""

    runtime: str
    pipelined: bool
    document: str
    error: float


@dataclass(frozen=True, slots=True)
class Band:
    low: float
    """10th percentile of a new run's signed error (negative: the model predicts faster than measured)"""
    high: float
    rows: int
    basis: str
    """'gpu NAME', 'family NAME' or 'all GPUs' (the GPU and its family have too few sources),
    then how many sources"""

    def contains(self, error: float) -> bool:
        return self.low <= error <= self.high

    def step_time_range_s(self, predicted_s: float) -> tuple[float, float]:
        """The measured step times this band allows for a prediction."""
        return predicted_s / (1.0 + self.high), predicted_s / (1.0 + self.low)


def band(gpu: str, family: str, residuals: list[Residual], exclude_document: str | None = None) -> Band | None:
    """The band of a prediction on `gpu` from `residuals` (those of `exclude_document` left out,
    so a row is never judged by a band made from its own source); None where even all GPUs'
    errors come from fewer than MIN_SOURCES sources."""
    pool = [r for r in residuals if r.document != exclude_document]
    for basis, rows in ((f"gpu {gpu}", [r for r in pool if r.gpu == gpu]),
                        (f"family {family}", [r for r in pool if r.family == family]),
                        ("all GPUs", pool)):
        sources = len({r.document for r in rows})
        if sources >= MIN_SOURCES:
            low, high = prediction_interval(rows)
            return Band(low=low, high=high, rows=len(rows), basis=f"{basis}, {sources} sources")
    return None


def prediction_interval(rows: list[Residual]) -> tuple[float, float]:
    """(low, high): the COVERAGE prediction interval of a new source's error under the one-way
    random-effects model of the module docstring; rows from at least MIN_SOURCES documents."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r.document, []).append(r.error)
    errors = [np.asarray(g, dtype=float) for g in groups.values()]
    k, n = len(errors), np.array([len(g) for g in errors])
    means = np.array([g.mean() for g in errors])
    within_dof = int(n.sum()) - k
    sigma2 = sum(float(((g - g.mean()) ** 2).sum()) for g in errors) / within_dof if within_dof else 0.0
    s_m2 = float(means.var(ddof=1))
    tau2 = max(0.0, s_m2 - sigma2 * float(np.mean(1.0 / n)))
    half = t_quantile(0.5 + COVERAGE / 2, k - 2) * float(np.sqrt(tau2 + sigma2 + s_m2 / k))
    mu = float(means.mean())
    return mu - half, mu + half


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile at p > 1/2 for whole degrees of freedom: bisection on the exact
    P(|T| <= t) of Abramowitz & Stegun 26.7.3 (odd dof) and 26.7.4 (even), between 0 and the
    one-degree quantile tan(pi (p - 1/2)), the largest. (scipy's takes 0.25-0.5 s to import, which
    a plan would pay for one number; tests compare the two.)"""
    target, lo, hi = 2 * p - 1, 0.0, math.tan(math.pi * (p - 0.5))
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _abs_t_cdf(mid, dof) < target else (lo, mid)
    return (lo + hi) / 2


def _abs_t_cdf(t: float, dof: int) -> float:
    theta = math.atan(t / math.sqrt(dof))
    c2, total = math.cos(theta) ** 2, 1.0 if dof % 2 == 0 else math.cos(theta)
    term = total
    for k in range(2 if dof % 2 == 0 else 3, dof - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    if dof % 2 == 0:
        return math.sin(theta) * total
    return 2 / math.pi * (theta + (math.sin(theta) * total if dof > 1 else 0.0))


def residuals_json(residuals: list[Residual], memory: list[MemoryResidual]) -> str:
    """The document `planner validate --save-residuals` writes: the step-time and the memory
    residuals, each sorted."""
    from planner.plan import rounded
    rows = sorted((asdict(r) for r in residuals), key=lambda r: (r["gpu"], r["document"], r["error"]))
    peaks = sorted((asdict(r) for r in memory), key=lambda r: (r["runtime"], r["pipelined"], r["document"], r["error"]))
    return json.dumps(rounded({"step_time": rows, "memory": peaks}), indent=1, sort_keys=True) + "\n"


@lru_cache(maxsize=1)
def _bundled() -> dict:
    return json.loads(RESIDUALS.read_text())


@lru_cache(maxsize=1)
def bundled_residuals() -> tuple[Residual, ...]:
    return tuple(Residual(**row) for row in _bundled()["step_time"])


@lru_cache(maxsize=1)
def bundled_memory_residuals() -> tuple[MemoryResidual, ...]:
    return tuple(MemoryResidual(**row) for row in _bundled()["memory"])


def memory_warning(runtime: str, pp: int, peak_bytes: float, gpu: Gpu) -> str | None:
    """A note when the published peaks of runs like this plan's (its runtime's family, with or
    without pipeline stages, of any schedule: bundled_memory_residuals) ran above the cost model's
    by more than the plan's GPU has room for: with `worst` the most negative such error (predicted
    / published - 1), the plan's peak / (1 + worst) is more than the GPU's memory. The note gives
    how far above the model those peaks ran: 1 / (1 + worst) - 1."""
    pipelined = pp > 1
    errors = [r.error for r in bundled_memory_residuals()
              if r.runtime == runtime_family(runtime) and r.pipelined == pipelined]
    worst = min(errors, default=0.0)
    if worst >= 0.0 or peak_bytes / (1.0 + worst) <= gpu.memory_bytes:
        return None
    kind = "with pipeline stages" if pipelined else "without pipeline stages"
    return (f"memory: published peaks of {runtime_family(runtime)} runs {kind} came out up to "
            f"{1.0 / (1.0 + worst) - 1.0:.0%} above "
            f"this cost model's ({len(errors)} runs, `planner validate`); at that, this plan's "
            f"{bytes_to_gib(peak_bytes):.1f} GiB would be {bytes_to_gib(peak_bytes / (1.0 + worst)):.1f} GiB, more "
            f"than the {bytes_to_gib(gpu.memory_bytes):.1f} GiB of {gpu.name}")


def prediction_band(cluster) -> Band:
    """The band a plan on `cluster` carries: its GPU's (or family's) out-of-sample errors; where
    the cluster's efficiencies were not fitted on its own runs (borrowed or family defaults), the
    union of every band its family's GPUs and all GPUs have, and labelled so."""
    return _prediction_band(cluster.gpu.name, cluster.gpu.family, cluster.efficiency.source, cluster.name)


@lru_cache(maxsize=64)
def _prediction_band(gpu: str, family: str, efficiency_source: str, cluster: str) -> Band:
    """prediction_band of what it reads of a cluster (a sweep asks it of one cluster per plan)."""
    pool = list(bundled_residuals())
    found = band(gpu, family, pool)
    if efficiency_source.startswith("fitted on"):
        return found
    kin = sorted({r.gpu for r in pool if r.family == family})
    others = [band(name, family, pool) for name in kin] + [band("", "", pool)]
    source = efficiency_source.split(":")[0]
    return Band(low=min(b.low for b in [found, *others]), high=max(b.high for b in [found, *others]),
                rows=found.rows,
                basis=f"{found.basis}, widened to its family's and all GPUs' (efficiencies of {cluster}: {source})")


BEST_MFU = Path(__file__).resolve().parent / "data" / "best_mfu.yaml"
MFU_MARGIN = 0.03
"""how far above the best published MFU of its GPU and precision a prediction may go unflagged"""


@lru_cache(maxsize=1)
def _best_mfu() -> dict:
    import yaml
    best: dict = {}
    for row in yaml.safe_load(BEST_MFU.read_text()):
        key = (row["gpu"], row["precision"])
        if row["mfu"] > best.get(key, (0.0, ""))[0]:
            best[key] = (row["mfu"], row["source"].split(":")[0])
    return best


def best_published_mfu(gpu: str, precision: str) -> tuple[float, str] | None:
    """(the best MFU published for this GPU and precision, its source), or None."""
    return _best_mfu().get((gpu, "bf16" if precision == "fp16" else precision))


def mfu_warning(gpu: str, precision: str, mfu: float) -> str | None:
    """A note when a predicted MFU beats the best published one by more than MFU_MARGIN."""
    found = best_published_mfu(gpu, precision)
    if found is None or mfu <= found[0] + MFU_MARGIN:
        return None
    return (f"predicted MFU {mfu:.1%} is above the best published for {gpu} {precision} ({found[0]:.1%}, "
            f"{found[1]}): a prediction better than every published run is a warning sign, not a result")
