"""Predicted vs published runs: per-run errors, per-source MAPE, leave-one-source-out errors.

Leave-one-source-out (LOSO): for every source that shares its GPU with another source, the
cluster's efficiencies are refitted on the other sources' runs only and the held-out source is
priced with that fit: an estimate of the error on runs the fit never saw.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from planner.calibrate import fit
from planner.runs import Priced, Run, price_run
from planner.units import bytes_to_gib


@dataclass(frozen=True, slots=True)
class Validation:
    priced: tuple[Priced, ...]
    loso: tuple[tuple[str, Priced], ...] | None
    """(held-out source, run priced with the fit that excluded it); None when not asked for"""
    checks: tuple[Priced, ...] = ()
    """out-of-sample runs no fit ever used, priced with the shipped presets"""
    plans: tuple = ()
    """per run, the unconstrained search's best candidate (None when nothing fits)"""


def _mape(errors) -> float:
    return float(np.mean(np.abs(errors))) if len(errors) else 0.0


def validate(runs: list[Run], loso: bool = True, checks: list[Run] = (), plans: bool = False,
             progress=None) -> Validation:
    priced = tuple(price_run(r) for r in runs)
    searched = []
    if plans:
        from planner.search.driver import search
        for k, r in enumerate(runs):
            if progress:
                progress(k, len(runs), f"searching {r.id}")
            searched.append(search(r.model, r.cluster, r.setup, {}, top=0).best)
    held = []
    if loso:
        by_gpu: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
        for r in runs:
            by_gpu[r.cluster.gpu.name][r.source].append(r)
        jobs = [(gpu, source) for gpu, sources in by_gpu.items() if len(sources) > 1 for source in sources]
        for k, (gpu, source) in enumerate(jobs):
            if progress:
                progress(k, len(jobs), f"refitting {gpu} without {source}")
            train = [r for s, rs in by_gpu[gpu].items() if s != source for r in rs]
            result = fit(train, start=train[0].cluster.efficiency)
            held.extend((source, price_run(r, result.efficiency)) for r in by_gpu[gpu][source])
    return Validation(priced=priced, loso=tuple(held) if loso else None,
                      checks=tuple(price_run(r) for r in checks), plans=tuple(searched))


def _rows(priced) -> list[dict]:
    rows = []
    for p in priced:
        est = p.estimate
        row = {"id": p.run.id, "source": p.run.source, "gpus": p.run.setup.gpus,
               "derived_step_time_s": p.run.step_time_s, "predicted_step_time_s": est.step_time_s,
               "error": p.error, "chosen": p.chosen, "fits": est.fits,
               "peak_memory_gib": bytes_to_gib(est.peak_memory_bytes), "mfu": est.mfu,
               "efficiency_source": p.run.cluster.efficiency.source.split(":")[0]}
        measured_mem = p.run.measured.get("memory_gib")
        if measured_mem:
            row["measured_memory_gib"] = measured_mem
            row["memory_error"] = bytes_to_gib(est.peak_memory_bytes) / measured_mem - 1.0
        rows.append(row)
    return rows


def _by_source(pairs) -> dict:
    groups: dict[str, list[float]] = defaultdict(list)
    for source, error in pairs:
        groups[source].append(error)
    return {s: {"runs": len(e), "mape": _mape(e), "max_abs_error": float(np.max(np.abs(e)))} for s, e in groups.items()}


def _max(errors) -> float:
    return float(np.max(np.abs(errors))) if len(errors) else 0.0


def summary(v: Validation) -> dict:
    """The machine-readable document of `planner validate --json` (schema planner.validate/v1)."""
    errors = [p.error for p in v.priced]
    doc = {
        "schema": "planner.validate/v1",
        "mape": _mape(errors),
        "max_abs_error": _max(errors),
        "runs": _rows(v.priced),
        "sources": _by_source((p.run.source, p.error) for p in v.priced),
    }
    if v.loso is not None:
        loso_errors = [p.error for _, p in v.loso]
        doc["loso"] = {"mape": _mape(loso_errors), "max_abs_error": _max(loso_errors),
                       "sources": _by_source((s, p.error) for s, p in v.loso),
                       "runs": [{"id": p.run.id, "held_out_source": s, "error": p.error} for s, p in v.loso]}
    if v.plans:
        plan_rows = []
        for p, best in zip(v.priced, v.plans):
            row = {"id": p.run.id, "published_config_step_time_s": p.estimate.step_time_s,
                   "plan_step_time_s": best.step_time_s if best else None,
                   "plan_fits": bool(best and best.fits),
                   "plan_not_slower": bool(best and best.step_time_s <= p.estimate.step_time_s * (1 + 1e-9))}
            if best:
                s = best.strategy
                row["plan"] = f"dp {s.dp} tp {s.tp} pp {s.pp} cp {s.cp} vpp {s.vpp} mb {s.micro_batch} " \
                              f"zero {s.zero} {s.recompute}"
            plan_rows.append(row)
        doc["plans"] = {"all_not_slower": all(r["plan_not_slower"] and r["plan_fits"] for r in plan_rows),
                        "runs": plan_rows}
    if v.checks:
        check_errors = [p.error for p in v.checks]
        doc["checks"] = {"mape": _mape(check_errors), "max_abs_error": _max(check_errors),
                         "runs": _rows(v.checks), "sources": _by_source((p.run.source, p.error) for p in v.checks)}
    return doc
