"""How sure a prediction is: the spread of the cost model's errors on runs no fit has seen.

A band is the 10th to 90th percentile of the signed out-of-sample errors (predicted / measured
step time - 1; leave-one-source-out refits and the frozen checks) of the GPU a prediction is for,
or of its family when the GPU has fewer than MIN_ROWS such rows, or of every GPU when the family
has too few as well (the band's basis says which); a measured step time then lies in
[predicted / (1 + high), predicted / (1 + low)].

The band is for a run no fit has seen, so its percentiles are predictive ones: the p-th
percentile of n errors sits at rank p * (n + 1) (Hyndman & Fan 1996, definition 6; numpy's
'weibull'), interpolated between ranks. For exchangeable errors the k-th smallest of n lies above
a new one with probability k / (n + 1) (F(X_(k)) ~ Beta(k, n + 1 - k)), so a new run falls inside
the band with probability 0.8. Numpy's default rank p * (n - 1) + 1 is the sample's own
percentile: it puts the band's ends one rank in from the ends of the errors and covers a new run
less often (13.6 % below the low end instead of 10 % at n = 21).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

RESIDUALS = Path(__file__).resolve().parent / "data" / "residuals.json"
"""the out-of-sample errors of the bundled runs, as `planner validate --save-residuals` writes them
(a test keeps the file equal to what validate computes)"""
QUANTILES = (0.10, 0.90)
MIN_ROWS = 5
"""fewest out-of-sample rows a band is taken from (else the next wider basis)"""


@dataclass(frozen=True, slots=True)
class Residual:
    """One out-of-sample error: the run's GPU, its family, the document it comes from."""

    gpu: str
    family: str
    document: str
    error: float


@dataclass(frozen=True, slots=True)
class Band:
    low: float
    """10th percentile of the signed errors (negative: the model predicts faster than measured)"""
    high: float
    rows: int
    basis: str
    """'gpu NAME', 'family NAME' or 'all GPUs' (the GPU and its family have too few rows)"""

    def contains(self, error: float) -> bool:
        return self.low <= error <= self.high

    def step_time_range_s(self, predicted_s: float) -> tuple[float, float]:
        """The measured step times this band allows for a prediction."""
        return predicted_s / (1.0 + self.high), predicted_s / (1.0 + self.low)


def band(gpu: str, family: str, residuals: list[Residual], exclude_document: str | None = None) -> Band | None:
    """The band of a prediction on `gpu` from `residuals` (those of `exclude_document` left out,
    so a row is never judged by a band made from its own source); None with no rows at all."""
    pool = [r for r in residuals if r.document != exclude_document]
    for basis, rows in ((f"gpu {gpu}", [r for r in pool if r.gpu == gpu]),
                        (f"family {family}", [r for r in pool if r.family == family]),
                        ("all GPUs", pool)):
        if len(rows) >= MIN_ROWS or basis == "all GPUs" and rows:
            low, high = np.quantile([r.error for r in rows], QUANTILES, method="weibull")
            return Band(low=float(low), high=float(high), rows=len(rows), basis=basis)
    return None


def residuals_json(residuals: list[Residual]) -> str:
    from planner.plan import rounded
    rows = sorted((asdict(r) for r in residuals), key=lambda r: (r["gpu"], r["document"], r["error"]))
    return json.dumps(rounded(rows), indent=1, sort_keys=True) + "\n"


@lru_cache(maxsize=1)
def bundled_residuals() -> tuple[Residual, ...]:
    return tuple(Residual(**row) for row in json.loads(RESIDUALS.read_text()))


def prediction_band(cluster) -> Band:
    """The band a plan on `cluster` carries: its GPU's (or family's) out-of-sample errors; where
    the cluster's efficiencies were not fitted on its own runs (borrowed or family defaults), the
    union of every band its family's GPUs and all GPUs have, and labelled so."""
    pool = list(bundled_residuals())
    gpu = cluster.gpu
    found = band(gpu.name, gpu.family, pool)
    if cluster.efficiency.source.startswith("fitted on"):
        return found
    kin = sorted({r.gpu for r in pool if r.family == gpu.family})
    others = [band(name, gpu.family, pool) for name in kin] + [band("", "", pool)]
    source = cluster.efficiency.source.split(":")[0]
    return Band(low=min(b.low for b in [found, *others]), high=max(b.high for b in [found, *others]),
                rows=found.rows,
                basis=f"{found.basis}, widened to its family's and all GPUs' (efficiencies of {cluster.name}: {source})")


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
