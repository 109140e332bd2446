"""A cluster's efficiency block: what calibration fits on top of the measured kernel figures.

Version 2 (the current one) fits only what no microbenchmark pins, each within a physical bound:

- framework_fraction: the share of the kernels' measured throughput (spec/measured.py) a
  training loop keeps: launch gaps, unfused small ops, synchronisation; 1 = every kernel runs as
  fast as it does alone. Bound [0.5, 1].
- dp_overlap_fraction: the share of a micro-batch's backward that hides the data-parallel
  gradient reduction (and of its forward, the parameter gather). Bound [0, 1].

Whether tensor-parallel collectives hide behind GEMMs is a fact of the runtime, not a fraction
(runtimes.py `tp_overlap`: Transformer Engine's userbuffers overlap in Megatron-Core).

GEMM, HBM and link efficiencies are not parameters any more: they are the GPU's and the links'
measured figures (`measured:` in hardware/gpus/*.yaml, `busbw_GBps` in hardware/clusters/*.yaml).

Version 1 blocks (seven free fractions, no `version:` key) still load as LegacyEfficiency and
price as they did, so a plan made with one re-plans to the same numbers; calibrate writes
version 2 only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.errors import SpecError
from planner.spec.fields import Fields

VERSION = 2


@dataclass(frozen=True, slots=True)
class Efficiency:
    framework_fraction: float
    dp_overlap_fraction: float
    """share of the last micro-batch's backward that can hide the DP gradient reduction"""
    source: str = ""
    """'fitted on ...' or 'default (<family>)'"""
    fitted: tuple[str, ...] = ()
    """the PARAMETERS calibration fitted (the others are defaults, not fitted)"""
    version: int = VERSION

    PARAMETERS = ("framework_fraction", "dp_overlap_fraction")
    BOUNDS = {"framework_fraction": (0.5, 1.0), "dp_overlap_fraction": (0.0, 1.0)}
    """physical ranges: a training loop cannot run its kernels faster than they run alone (1), and
    0.5 is a floor wide enough that no fit comes near it (H100 0.77, A100 0.91); an overlap hides
    between none and all of what it overlaps"""

    def __post_init__(self) -> None:
        for name in self.PARAMETERS:
            lo, hi = self.BOUNDS[name]
            if not lo <= getattr(self, name) <= hi:
                raise SpecError(f"efficiency.{name}: expected a value in [{lo}, {hi}], got {getattr(self, name)}")

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, n) for n in self.PARAMETERS)

    def with_values(self, values, source: str, names: tuple[str, ...] | None = None) -> "Efficiency":
        return replace(self, **dict(zip(names or self.PARAMETERS, (float(v) for v in values))), source=source)


@dataclass(frozen=True, slots=True)
class LegacyEfficiency:
    """A version 1 block: seven free fractions (GEMM peak and half-intensity, HBM, links,
    overlaps), fitted with nothing measured behind them. Read for old plans and user files."""

    gemm_peak_fraction: float
    gemm_intensity_half: float
    hbm_fraction: float
    intra_link_fraction: float
    inter_link_fraction: float
    dp_overlap_fraction: float
    tp_overlap_fraction: float
    source: str = ""

    PARAMETERS = ("gemm_peak_fraction", "gemm_intensity_half", "hbm_fraction", "intra_link_fraction",
                  "inter_link_fraction", "dp_overlap_fraction", "tp_overlap_fraction")

    def __post_init__(self) -> None:
        for name in self.PARAMETERS:
            value = getattr(self, name)
            if name == "gemm_intensity_half":
                if value < 0:
                    raise SpecError(f"efficiency.{name}: expected a value >= 0, got {value}")
            elif not 0 <= value <= 1 or value == 0 and not name.endswith("overlap_fraction"):
                raise SpecError(f"efficiency.{name}: expected a value in (0, 1], got {value}")


FAMILY_DEFAULTS: dict[str, Efficiency] = {
    family: Efficiency(framework, 0.5, source=f"default ({family})")
    for family, framework in (("ampere", 0.9), ("hopper", 0.9), ("blackwell", 0.9), ("cdna3", 0.9), ("ada", 0.9),
                              ("generic", 0.9))
}
"""Unfitted blocks: 90 % of the kernels' measured speed, half a micro-batch's backward to hide
the DP reduction. Predictions on them carry the widest band."""


def efficiency_from_fields(f: Fields | None, family: str) -> Efficiency | LegacyEfficiency:
    default = FAMILY_DEFAULTS[family]
    if f is None:
        return default
    fitted_on = f.raw("fitted_on", None)
    source = f.str("source", "")
    if not source:
        source = f"fitted on {', '.join(fitted_on)}" if isinstance(fitted_on, list) else "given"
    if not f.has("version") and any(f.has(n) for n in LegacyEfficiency.PARAMETERS if n not in Efficiency.PARAMETERS):
        legacy = {n: f.float(n, positive=not (n == "gemm_intensity_half" or n.endswith("overlap_fraction")))
                  for n in LegacyEfficiency.PARAMETERS}
        f.reject_unknown()
        return LegacyEfficiency(**legacy, source=source)
    if f.int("version", VERSION) != VERSION:
        raise f.error("version", f"expected {VERSION} (or no version with the seven fractions of version 1)")
    # numbers here; their physical ranges are Efficiency's own (BOUNDS), its error named with the file
    values = {n: f.float(n, getattr(default, n), minimum=-math.inf, positive=False) for n in Efficiency.PARAMETERS}
    fitted = f.raw("fitted", []) or []
    if not isinstance(fitted, (list, tuple)) or any(n not in Efficiency.PARAMETERS for n in fitted):
        raise f.error("fitted", f"expected a list of {', '.join(Efficiency.PARAMETERS)}")
    f.reject_unknown()
    try:
        return Efficiency(**values, source=source, fitted=tuple(fitted))
    except SpecError as e:
        raise SpecError(f"{f.where}: {e}") from None
