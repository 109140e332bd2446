"""Fit a cluster's efficiency parameters to measured runs (scipy.optimize.least_squares).

The parameters (spec/hardware.py `Efficiency`) are a handful of physical fractions, shared by
every run of the cluster: no per-model or per-run constants. Residuals are log(predicted /
derived step time). Runs with unknown knobs take the fastest fitting value at the current
parameters, so the fit alternates: choose knobs, fit with them fixed, until the choice settles.
A weak prior (weight PRIOR_WEIGHT per parameter, scaled by its range) keeps parameters that
the runs cannot identify at their family defaults instead of wandering to a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from planner.errors import SpecError
from planner.runs import Run, price_run
from planner.spec.hardware import FAMILY_DEFAULTS, Efficiency
from planner.units import round_sig

BOUNDS = {
    "gemm_peak_fraction": (0.3, 1.0),
    "gemm_intensity_half": (0.0, 2000.0),
    "hbm_fraction": (0.3, 1.0),
    "intra_link_fraction": (0.2, 1.0),
    "inter_link_fraction": (0.2, 1.0),
    "dp_overlap_fraction": (0.0, 1.0),
    "tp_overlap_fraction": (0.0, 1.0),
}
PRIOR_WEIGHT = 0.02
MAX_ROUNDS = 4


@dataclass(frozen=True, slots=True)
class Fit:
    efficiency: Efficiency
    run_ids: tuple[str, ...]
    rounds: int
    rms_log_error: float


def fit(runs: list[Run], start: Efficiency | None = None) -> Fit:
    """Least-squares fit of one cluster's efficiencies to `runs` (all on that cluster's GPU)."""
    if not runs:
        raise SpecError("calibrate: no runs to fit")
    families = {r.cluster.gpu.family for r in runs}
    if len({r.cluster.gpu.name for r in runs}) > 1:
        raise SpecError(f"calibrate: runs span several GPUs ({', '.join(sorted({r.cluster.gpu.name for r in runs}))}); "
                        "fit one cluster at a time (--cluster)")
    prior = FAMILY_DEFAULTS[families.pop()]
    eff = start or runs[0].cluster.efficiency
    names = Efficiency.PARAMETERS
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    scale = hi - lo
    theta0 = np.array(prior.values())

    chosen, rounds, result = None, 0, None
    for rounds in range(1, MAX_ROUNDS + 1):
        picks = tuple(price_run(r, eff).strategy for r in runs)
        if picks == chosen:
            break
        chosen = picks

        def residuals(theta):
            e = eff.with_values(theta, "fitting")
            errs = [np.log(price_run(r, e, s).estimate.step_time_s / r.step_time_s) for r, s in zip(runs, chosen)]
            return np.concatenate([errs, PRIOR_WEIGHT * (theta - theta0) / scale])

        x0 = np.clip(np.array(eff.values()), lo, hi)
        result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, diff_step=1e-3, max_nfev=200)
        eff = eff.with_values(result.x, "fitting")
    ids = tuple(r.id for r in runs)
    final = eff.with_values(eff.values(), f"fitted on {len(ids)} runs: {', '.join(ids)}")
    rms = float(np.sqrt(np.mean(result.fun[: len(runs)] ** 2))) if result is not None else 0.0
    return Fit(efficiency=final, run_ids=ids, rounds=rounds, rms_log_error=rms)


def efficiency_yaml(result: Fit, runs_file: str) -> str:
    """The `efficiency:` block of a cluster preset, recording what it was fitted on."""
    e = result.efficiency
    lines = [f"efficiency:  # fitted by `planner calibrate --runs {runs_file}` (rms log error {result.rms_log_error:.4f})"]
    for name in Efficiency.PARAMETERS:
        # 6 significant digits: what a plan file records, so a re-plan from a plan reproduces it
        lines.append(f"  {name}: {round_sig(getattr(e, name), 6)}")
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
