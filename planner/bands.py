"""How sure a prediction is: the spread of the cost model's errors on runs no fit has seen.

A band is the 10th to 90th percentile of the signed out-of-sample errors (predicted / measured
step time - 1; leave-one-source-out refits and the frozen checks) of the GPU a prediction is for,
or of its family when the GPU has fewer than MIN_ROWS such rows, or of every GPU when the family
has too few as well (then labelled uncalibrated). Percentiles interpolate linearly (numpy's
default); a measured step time then lies in [predicted / (1 + high), predicted / (1 + low)].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
            low, high = np.quantile([r.error for r in rows], QUANTILES)
            return Band(low=float(low), high=float(high), rows=len(rows), basis=basis)
    return None
