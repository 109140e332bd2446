"""Predicted vs published runs: per-run errors, per-source MAPE and bias, leave-one-source-out
errors, and how the out-of-sample errors spread (bands).

Errors are signed: predicted / published step time - 1 (negative: the model is optimistic).
MAPE is the mean absolute error; bias the mean signed error. A source is the document a run
comes from (`document`: its source up to the first comma), so two tables of one paper are one
source. Leave-one-source-out (LOSO): for every source that shares its GPU with another source,
the cluster's efficiencies are refitted on the other sources' runs only and the held-out source
is priced with that fit: an estimate of the error on runs the fit never saw. The checks are
also summarised with every source weighted equally (the mean of the per-source figures), by
subset (MoE, and MoE by whether its layers are host-paced; FP8, GPU, runtime), and by how many fall inside the band (planner/bands.py) built
from the other sources' out-of-sample errors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from planner.bands import MemoryResidual, Residual, band
from planner.calibrate import at_bound, fit
from planner.planning import host_paced, shortest_layer_s
from planner.spec.efficiency import Efficiency
from planner.runs import Priced, Run, document, load_frozen, price_run
from planner.runtimes import runtime_family
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
            # the union of the runtimes' spaces (a published configuration may lie outside the rules
            # the planner writes for its runtime), priced as that runtime runs it
            searched.append(search(r.model, r.cluster, r.setup, {}, top=0, space_of="ideal").best)
    held = []
    if loso:
        by_gpu: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
        for r in runs:
            by_gpu[r.cluster.gpu.name][document(r.source)].append(r)
        jobs = [(gpu, source) for gpu, sources in by_gpu.items() if len(sources) > 1 for source in sources]
        for k, (gpu, source) in enumerate(jobs):
            if progress:
                progress(k, len(jobs), f"refitting {gpu} without {source}")
            train = [r for s, rs in by_gpu[gpu].items() if s != source for r in rs]
            # from the family's unfitted defaults, not the shipped fit: that one saw the source
            # held out, and whatever the rest cannot fit would keep its values
            result = fit(train)
            held.extend((source, price_run(r, result.efficiency)) for r in by_gpu[gpu][source])
    return Validation(priced=priced, loso=tuple(held) if loso else None,
                      checks=tuple(price_run(r) for r in checks), plans=tuple(searched))


def _rows(priced) -> list[dict]:
    rows = []
    for p in priced:
        est = p.estimate
        row = {"id": p.run.id, "source": p.run.source, "gpu": p.run.cluster.gpu.name, "gpus": p.run.setup.gpus,
               "derived_step_time_s": p.run.step_time_s, "predicted_step_time_s": est.step_time_s,
               "error": p.error, "chosen": p.chosen, "fits": est.fits,
               "peak_memory_gib": bytes_to_gib(est.peak_memory_bytes), "mfu": est.mfu,
               "efficiency_source": p.run.cluster.efficiency.source.split(":")[0], "runtime": p.run.runtime}
        if p.run.measured.get("memory_gib"):
            row["measured_memory_gib"] = p.run.measured["memory_gib"]
            row["memory_error"] = memory_error(p)
        rows.append(row)
    return rows


def memory_error(p: Priced) -> float:
    """A priced run's predicted peak against the one its source publishes, predicted / published - 1."""
    return bytes_to_gib(p.estimate.peak_memory_bytes) / p.run.measured["memory_gib"] - 1.0


CHECK_LIMIT = 0.25
"""no out-of-sample check may miss its published step time by more than this (issue 11)"""
MEMORY_UNDER = 0.05
MEMORY_WITHIN = 0.10
"""a predicted peak should be within MEMORY_WITHIN of a published one and never more than
MEMORY_UNDER under it (issue 11)"""


def memory_ok(error: float) -> bool:
    """Whether a predicted peak's error against a published one keeps both bounds above."""
    return -MEMORY_UNDER <= error <= MEMORY_WITHIN


def _memory(rows: list[dict]) -> dict:
    """The predicted peak against the peaks sources publish (measured.memory_gib): how many, the
    mean absolute and signed errors, how many the prediction undershoots by more than
    MEMORY_UNDER and how many land within MEMORY_WITHIN."""
    errors = [r["memory_error"] for r in rows if "memory_error" in r]
    if not errors:
        return {"runs": 0}
    return {"runs": len(errors), "mape": _mape(errors), "bias": sum(errors) / len(errors),
            "under_5_percent": sum(e < -MEMORY_UNDER for e in errors),
            "within_10_percent": sum(abs(e) <= MEMORY_WITHIN for e in errors)}


def _stats(errors) -> dict:
    e = np.asarray(errors, dtype=float)
    return {"runs": len(e), "mape": _mape(e), "bias": float(np.mean(e)) if len(e) else 0.0, "max_abs_error": _max(e)}


def _by_source(pairs) -> dict:
    groups: dict[str, list[float]] = defaultdict(list)
    for source, error in pairs:
        groups[document(source)].append(error)
    return {s: _stats(e) for s, e in groups.items()}


def _max(errors) -> float:
    return float(np.max(np.abs(errors))) if len(errors) else 0.0


def _equal_weight(sources: dict) -> dict:
    """MAPE and bias with every source weighted equally (means of the per-source figures)."""
    return {"sources": len(sources), "mape": float(np.mean([v["mape"] for v in sources.values()])),
            "bias": float(np.mean([v["bias"] for v in sources.values()]))}


def residuals(v: Validation) -> list[Residual]:
    """The out-of-sample errors: LOSO refits and the checks."""
    held = [p for _, p in v.loso or ()] + list(v.checks)
    return [Residual(gpu=p.run.cluster.gpu.name, family=p.run.cluster.gpu.family, document=document(p.run.source),
                     error=p.error) for p in held]


def memory_residuals(v: Validation) -> list[MemoryResidual]:
    """The checks' errors against the peaks their sources publish (measured.memory_gib)."""
    return [MemoryResidual(runtime=runtime_family(p.run.runtime), pipelined=p.strategy.pp > 1,
                           document=document(p.run.source), error=memory_error(p))
            for p in v.checks if p.run.measured.get("memory_gib")]


HOST_PACED, GPU_PACED = "moe, host-paced", "moe, GPU-paced"
"""the MoE rows split by planning.host_paced: those a plan's note says published runs of their kind
ran at the host's pace (a runtime whose dropless routing waits for the host, under
planning.HOST_BOUND_LAYER_S of priced GPU work a layer and micro-batch), and the others. The
threshold was read off these check rows, so the split describes where their errors lie and tests
nothing; it cannot see a run's CUDA graphs (paged-stash runs without the host's sync count as
host-paced)"""


def _subsets(priced) -> dict:
    """Errors by GPU, precision, runtime, dense or MoE, and the MoE rows by HOST_PACED."""
    groups: dict[str, list[float]] = defaultdict(list)
    for p in priced:
        r = p.run
        keys = [f"gpu {r.cluster.gpu.name}", f"precision {r.setup.precision}", f"runtime {r.runtime}",
                "moe" if r.model.moe else "dense"]
        if r.model.moe:
            keys.append(HOST_PACED if host_paced(r.model, r.runtime, shortest_layer_s(p.estimate)) else GPU_PACED)
        for k in keys:
            groups[k].append(p.error)
    return {k: _stats(e) for k, e in sorted(groups.items())}


def _efficiencies(priced) -> dict:
    """Per cluster of the runs: its efficiency block's values, which were fitted, their bounds,
    and whether any fitted value ends at its bound (issue 11: none may)."""
    out = {}
    for p in priced:
        c = p.run.cluster
        eff = c.efficiency
        if c.name in out or not isinstance(eff, Efficiency):
            continue
        out[c.name] = {"values": {n: getattr(eff, n) for n in eff.PARAMETERS}, "fitted": list(eff.fitted),
                       "bounds": {n: list(eff.BOUNDS[n]) for n in eff.PARAMETERS},
                       "at_bound": [n for n in eff.fitted if at_bound(n, getattr(eff, n))],
                       "source": eff.source.split(":")[0]}
    return out


def summary(v: Validation) -> dict:
    """The machine-readable document of `planner validate --json` (schema planner.validate/v1)."""
    errors = [p.error for p in v.priced]
    doc = {
        "schema": "planner.validate/v1",
        **{k: val for k, val in _stats(errors).items() if k != "runs"},
        "runs": _rows(v.priced),
        "sources": _by_source((p.run.source, p.error) for p in v.priced),
        "efficiencies": _efficiencies(v.priced),
    }
    if v.loso == ():
        doc["loso_skipped"] = "no GPU has runs from two or more sources: no source can be held out"
    elif v.loso is not None:
        loso_errors = [p.error for _, p in v.loso]
        doc["loso"] = {**{k: val for k, val in _stats(loso_errors).items() if k != "runs"},
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
        figures = _check_figures(v.checks)
        rows = _rows(v.checks)
        pool = residuals(v)
        inside = 0
        for row, p in zip(rows, v.checks):
            b = band(p.run.cluster.gpu.name, p.run.cluster.gpu.family, pool, exclude_document=document(p.run.source))
            if b is not None:
                row["band"] = {"low": b.low, "high": b.high, "basis": b.basis}
                inside += b.contains(p.error)
        doc["checks"] = {**{k: figures[k] for k in ("mape", "bias", "max_abs_error", "equal_source_weight",
                                                    "over_25_percent")},
                         "inside_band": inside / len(rows),
                         "memory": _memory(rows),
                         "subsets": figures["subsets"],
                         "runs": rows, "sources": figures["sources"]}
        frozen = _frozen(v.checks)
        if frozen:
            doc["checks"]["frozen"] = frozen
    return doc


def _check_figures(checks) -> dict:
    """MAPE, bias and largest error of check rows, each source weighted equally, how many miss by
    more than CHECK_LIMIT, by subset and by source."""
    errors = [p.error for p in checks]
    sources = _by_source((p.run.source, p.error) for p in checks)
    return {**{k: val for k, val in _stats(errors).items() if k != "runs"},
            "equal_source_weight": _equal_weight(sources),
            "over_25_percent": sum(abs(e) > CHECK_LIMIT for e in errors),
            "subsets": _subsets(checks), "sources": sources}


def _frozen(checks) -> dict | None:
    """The figures of the frozen checks (runs.FROZEN: the rows issue 11's targets are judged on),
    where the checks priced hold every one of them (a user's own check file does not)."""
    frozen = load_frozen()
    held = [p for p in checks if p.run.id in frozen.step_times_s]
    if len(held) != len(frozen.step_times_s):
        return None
    figures = _check_figures(held)
    return {"commit": frozen.commit, "date": frozen.date, "runs": len(held),
            **{k: figures[k] for k in ("mape", "bias", "max_abs_error", "equal_source_weight", "over_25_percent",
                                       "subsets")}}
