"""Fit what no microbenchmark pins of a cluster's efficiency (spec/efficiency.py, version 2) to
published runs (scipy.optimize.least_squares).

GEMM, HBM, attention and link efficiencies are measured facts of the GPU and cluster presets;
calibration fits only the residuals: framework_fraction and dp_overlap_fraction, shared by
every run of the cluster (no per-model or per-run constants).
A GPU gets at most min(rows // 4, sources + 1) fitted parameters (sources: the documents its rows
come from), taken in that order among those its runs can identify (dp overlap needs runs that
overlap their data-parallel reduction); the rest keep their values. A parameter whose fit ends at its bound is not identified by the runs: it is fixed at
its value before the fit and the rest refitted, so no fitted value ends at a bound.
Residuals are log(predicted / derived step time). Runs with unknown knobs take the fastest
fitting value at the current parameters, so the fit alternates: choose knobs, fit with them
fixed, until the choice settles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from planner.errors import SpecError
from planner.runs import Run, document, price_run
from planner.spec.efficiency import FAMILY_DEFAULTS, Efficiency
from planner.units import round_sig

PRIORITY = ("framework_fraction", "dp_overlap_fraction")
MAX_ROUNDS = 4
AT_BOUND = 1e-3
"""a fitted value this close to its bound (relative to the range) counts as at the bound"""


@dataclass(frozen=True, slots=True)
class Fit:
    efficiency: Efficiency
    run_ids: tuple[str, ...]
    rounds: int
    rms_log_error: float
    fitted: tuple[str, ...]
    """the parameters fitted (the rest kept their values)"""


def most_fitted(runs: list[Run]) -> int:
    """How many parameters `runs` may fit: min(rows // 4, sources + 1)."""
    return min(len(runs) // 4, len({document(r.source) for r in runs}) + 1)


def fittable(runs: list[Run]) -> tuple[str, ...]:
    """The parameters the runs can identify, in PRIORITY order."""
    dp = any(r.strategy.get("dp_overlap", True) and r.setup.gpus > r.strategy.get("tp", 1) * r.strategy.get("pp", 1)
             for r in runs)
    ok = {"framework_fraction": True, "dp_overlap_fraction": dp}
    return tuple(n for n in PRIORITY if ok[n])


def _start(runs: list[Run], start) -> Efficiency:
    family = runs[0].cluster.gpu.family
    return start if isinstance(start, Efficiency) else FAMILY_DEFAULTS[family]


def fit(runs: list[Run], start: Efficiency | None = None) -> Fit:
    """Least-squares fit of one cluster's efficiency residuals to `runs` (all on that cluster's GPU)."""
    if not runs:
        raise SpecError("calibrate: no runs to fit")
    if len({r.cluster.gpu.name for r in runs}) > 1:
        raise SpecError(f"calibrate: runs span several GPUs ({', '.join(sorted({r.cluster.gpu.name for r in runs}))}); "
                        "fit one cluster at a time (--cluster)")
    eff = _start(runs, start)
    candidates, cap, rejected = fittable(runs), most_fitted(runs), set()
    rounds, names = 0, ()
    while True:
        names = tuple(n for n in candidates if n not in rejected)[:max(cap, 0)]
        if not names:
            break
        eff, rounds, _ = _fit(runs, eff, names)
        stuck = [n for n in names if at_bound(n, getattr(eff, n))]
        if not stuck:
            break
        eff = replace(eff, **{n: getattr(_start(runs, start), n) for n in stuck})
        rejected.update(stuck)
    ids = tuple(r.id for r in runs)
    final = replace(eff, source=f"fitted on {len(ids)} runs: {', '.join(ids)}", fitted=names)
    errors = [np.log(price_run(r, final).estimate.step_time_s / r.step_time_s) for r in runs]
    return Fit(efficiency=final, run_ids=ids, rounds=rounds, rms_log_error=float(np.sqrt(np.mean(np.square(errors)))),
               fitted=names)


def at_bound(name: str, value: float) -> bool:
    """Whether a fitted value lies within AT_BOUND of its physical bound (Efficiency.BOUNDS)."""
    lo, hi = Efficiency.BOUNDS[name]
    return min(value - lo, hi - value) <= AT_BOUND * (hi - lo)


def _fit(runs: list[Run], eff: Efficiency, names: tuple[str, ...]):
    lo = np.array([Efficiency.BOUNDS[n][0] for n in names])
    hi = np.array([Efficiency.BOUNDS[n][1] for n in names])
    chosen, rounds, result = None, 0, None
    for rounds in range(1, MAX_ROUNDS + 1):
        picks = tuple(price_run(r, eff).strategy for r in runs)
        if picks == chosen:
            break
        chosen = picks

        def residuals(theta):
            e = eff.with_values(theta, "fitting", names)
            return [np.log(price_run(r, e, s).estimate.step_time_s / r.step_time_s) for r, s in zip(runs, chosen)]

        x0 = np.clip([getattr(eff, n) for n in names], lo + 1e-6, hi - 1e-6)
        result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=hi - lo, diff_step=1e-3, max_nfev=200)
        eff = eff.with_values(result.x, "fitting", names)
    return eff, rounds, result


def efficiency_yaml(result: Fit, runs_file: str) -> str:
    """The `efficiency:` block of a cluster preset, recording what it was fitted on."""
    e = result.efficiency
    lines = [f"efficiency:  # fitted by `planner calibrate --runs {runs_file}` (rms log error {result.rms_log_error:.4f})",
             f"  version: {e.version}"]
    for name in Efficiency.PARAMETERS:
        # 6 significant digits: what a plan file records, so a re-plan from a plan reproduces it
        lines.append(f"  {name}: {round_sig(getattr(e, name), 6)}")
    lines.append(f"  fitted: [{', '.join(result.fitted)}]")
    lines.append(f"  source: \"fitted on {len(result.run_ids)} runs of {runs_file}\"")
    lines.append("  fitted_on:")
    lines.extend(f"  - {rid}" for rid in result.run_ids)
    return "\n".join(lines) + "\n"


def with_efficiency(cluster_yaml: str, block: str) -> str:
    """Cluster YAML text with its top-level `efficiency:` block replaced by `block` (comments kept)."""
    out, skipping = [], False
    for line in cluster_yaml.splitlines():
        top_level = line and not line[0].isspace() and not line.startswith("#")
        if top_level:
            skipping = line.startswith("efficiency:")
        if not skipping:
            out.append(line)
    text = "\n".join(out).rstrip() + "\n"
    return text + block
