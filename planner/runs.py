"""Published training runs (calibration_runs.yaml): read them strictly and price each one.

A run states a model, a cluster, a training setup, the strategy its source gives, the knobs the
source leaves open (`unknown`), and a step time derived from what was measured. Pricing a run
takes the fastest value of the unknown knobs that fits in memory (a small enumeration; where none
fits, the one that overflows least: price_run); a knob absent from the row and not listed as
unknown takes the planner's default.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from planner.cost.step import StepEstimate, estimate
from planner.errors import PlannerError, SpecError
from planner.runtimes import RUNTIME_RULES
from planner.search.space import MAX_VPP
from planner.spec.fields import Fields, load_document
from planner.spec.hardware import Cluster, Efficiency, load_cluster
from planner.spec.model import ModelSpec, load_model
from planner.spec.training import (
    FP8_RECIPES,
    GRAD_REDUCES,
    LOSS_FUSIONS,
    MAX_MOE_IMBALANCE,
    MOE_DISPATCHERS,
    OPTIMIZER_STATES,
    STRATEGY_KNOBS,
    Strategy,
    TrainingSetup,
    checked_modules,
    resolve_strategy,
    strategy_problems,
)
from planner.units import GIB

BUNDLED = Path(__file__).resolve().parent / "data" / "calibration_runs.yaml"
CHECKS = Path(__file__).resolve().parent / "data" / "check_runs.yaml"
FROZEN = Path(__file__).resolve().parent / "data" / "frozen_checks.yaml"
"""the check rows frozen, with their derived step times, before the model changed for them"""
"""published runs no fit may use: out-of-sample checks shown by `planner validate`"""
RUN_KEYS = ("id", "source", "model", "cluster", "gpus", "global_batch", "seq_len", "precision", "attention",
            "strategy", "unknown", "notes", "note", "measured", "step_time_s", "derivation",
            "analytic_reference", "confidence", "runtime", "runtime_version", "moe_dispatcher", "ep_overlap", "moe_folding",
            "fp8_recipe", "grad_reduce", "fp8_param_gather", "loss_fusion", "moe_imbalance", "no_tp_overlap",
            "optimizer_states", "recompute_modules", "erratum")
RUN_RUNTIMES = tuple(name for name in RUNTIME_RULES if name != "ideal")
"""the software a published run ran on (Megatron-LM, NeMo and Megatron-Bridge count as megatron,
Megatron-LM before its 2023 overlaps as megatron@2022; Megatron-DeepSpeed as deepspeed; MosaicML
llm-foundry as composer): runtimes.RUNTIME_RULES says what the cost model reads of each"""
UNKNOWN_KNOBS = ("micro_batch", "recompute", "vpp", "zero", "sequence_parallel")


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    source: str
    model: ModelSpec
    cluster: Cluster
    setup: TrainingSetup
    strategy: dict
    """knobs the source states"""
    unknown: tuple[str, ...]
    step_time_s: float
    measured: dict
    analytic_reference: dict | None
    runtime: str = "other"
    """RUN_RUNTIMES: what ran it, for overheads that differ by runtime"""
    runtime_version: str = ""


def _modules(f: Fields) -> tuple[str, ...]:
    """A run's recompute_modules (spec/training.checked_modules), () when absent."""
    try:
        return checked_modules(f.raw("recompute_modules", []))
    except SpecError as e:
        raise f.error("recompute_modules", str(e).removeprefix("recompute-modules: ")) from None


def load_runs(path: Path | None = None) -> list[Run]:
    path = Path(path) if path else BUNDLED
    items = load_document(path)
    if not isinstance(items, list) or not items:
        raise SpecError(f"{path}: expected a non-empty list of runs")
    runs, clusters, seen = [], {}, {}
    for i, item in enumerate(items):
        f = Fields(item, str(path), f"[{i}].")
        run_id = f.str("id")
        if run_id in seen:
            raise f.error("id", f"{run_id!r} is also the id of run [{seen[run_id]}]; each run needs its own")
        seen[run_id] = i
        f.prefix = f"{run_id}."
        model_ref = f.raw("model")
        if isinstance(model_ref, str):
            model = load_model(model_ref)  # a preset's name, as `cluster` takes one
        elif isinstance(model_ref, dict):
            model = ModelSpec.from_dict({"name": run_id, **model_ref}, f"{path}: {run_id}.model")
        else:
            raise f.error("model", f"expected a preset's name or a mapping of the model's dimensions, got {model_ref!r}")
        ref = f.raw("cluster")
        if isinstance(ref, str):
            cluster = clusters.setdefault(ref, load_cluster(ref))
            if not isinstance(cluster, Cluster):
                raise f.error("cluster", f"{ref!r} is a mixed cluster; a published run names the one kind of GPU "
                                         "it ran on")
        else:
            cluster = Cluster.from_dict(ref, f"{path}: {run_id}.cluster")
        runtime = f.choice("runtime", RUN_RUNTIMES, "other")
        setup = TrainingSetup(gpus=f.int("gpus"), global_batch=f.int("global_batch"),
                              seq_len=f.int("seq_len", model.seq_len),
                              precision=f.choice("precision", ("bf16", "fp16", "fp8"), "bf16"),
                              attention=f.choice("attention", ("flash", "eager"), "flash"), runtime=runtime,
                              moe_dispatcher=f.choice("moe_dispatcher", MOE_DISPATCHERS, ""),
                              ep_overlap=f.bool("ep_overlap", False), moe_folding=f.bool("moe_folding", False),
                              fp8_recipe=f.choice("fp8_recipe", FP8_RECIPES, ""),
                              grad_reduce=f.choice("grad_reduce", GRAD_REDUCES, ""),
                              fp8_param_gather=f.bool("fp8_param_gather", False),
                              loss_fusion=f.choice("loss_fusion", LOSS_FUSIONS, ""),
                              moe_imbalance=f.float("moe_imbalance", 1.0, minimum=1.0, maximum=MAX_MOE_IMBALANCE),
                              no_tp_overlap=f.bool("no_tp_overlap", False),
                              optimizer_states=f.choice("optimizer_states", OPTIMIZER_STATES, ""),
                              recompute_modules=_modules(f))
        strategy = dict(f.raw("strategy", {}))
        for knob in strategy:
            if knob not in STRATEGY_KNOBS:
                raise f.error(f"strategy.{knob}", "unknown strategy knob")
        unknown = tuple(f.raw("unknown", []))
        for knob in unknown:
            if knob not in UNKNOWN_KNOBS:
                raise f.error("unknown", f"cannot enumerate {knob!r} (supported: {', '.join(UNKNOWN_KNOBS)})")
        for key in ("source", "notes", "note", "derivation", "confidence"):
            f.raw(key, "")
        runs.append(Run(id=run_id, source=f.str("source"), model=model, cluster=cluster, setup=setup,
                        strategy=strategy, unknown=unknown, step_time_s=f.float("step_time_s"),
                        measured=dict(f.raw("measured", {})), analytic_reference=f.raw("analytic_reference", None),
                        runtime=runtime, runtime_version=str(f.raw("runtime_version", ""))))
        f.reject_unknown(RUN_KEYS)
    return runs


@dataclass(frozen=True, slots=True)
class Frozen:
    """The checks frozen at `commit`: run id -> the step time derived for it then."""

    commit: str
    date: str
    step_times_s: dict


def load_frozen(path: Path = FROZEN) -> Frozen:
    items = load_document(path)
    f = Fields(items if isinstance(items, dict) else {}, str(path))
    rows = f.raw("runs")
    if not isinstance(rows, list) or not rows:
        raise f.error("runs", "expected a non-empty list of {id, step_time_s}")
    times = {}
    for k, row in enumerate(rows):
        r = Fields(row if isinstance(row, dict) else {}, str(path), f"runs[{k}].")
        times[r.str("id")] = r.float("step_time_s")
        r.reject_unknown()
    frozen = Frozen(commit=f.str("commit"), date=str(f.raw("date")), step_times_s=times)
    f.reject_unknown()
    return frozen


def document(source: str) -> str:
    """The document a run's source names: its text up to the first comma (two tables of one
    paper are one source)."""
    return source.split(",")[0].strip()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _vpp_domain(run: Run, pp: int) -> list[int]:
    """The interleavings a run could have used: those its runtime runs (runtimes.py: equal virtual
    chunks where it needs them), only interleaved ones (vpp > 1) where the source states an
    interleaved schedule, only vpp 1 where it states another."""
    if pp == 1:
        return [1]
    rules = RUNTIME_RULES[run.runtime]
    stated = run.strategy.get("schedule")
    return [v for v in range(1, MAX_VPP + 1) if pp * v <= run.model.layers
            and rules.chunks_run(run.model.layers, pp, v)
            and (stated is None or (v > 1) == (stated == "interleaved-1f1b"))]


def candidates(run: Run) -> list[Strategy]:
    """Every legal strategy that fills the run's unknown knobs (the stated ones kept) with values
    its runtime runs (RuntimeRules.refusal), or every legal one where the stated knobs already lie
    outside the runtime's record (a published configuration the record does not describe)."""
    legal = _fills(run)
    rules = RUNTIME_RULES[run.runtime]
    runnable = [s for s in legal if rules.refusal(s, run.model) is None]
    return runnable or legal


def _fills(run: Run) -> list[Strategy]:
    """Every legal strategy that fills the run's unknown knobs (the stated ones kept)."""
    st, setup = run.strategy, run.setup
    dp = st.get("dp") or setup.gpus // (st.get("tp", 1) * st.get("pp", 1) * st.get("cp", 1))
    pp = st.get("pp", 1)
    domains = {
        "micro_batch": _divisors(setup.global_batch // dp) if setup.global_batch % dp == 0 else [1],
        "recompute": ["none", "selective", "full"],
        "vpp": _vpp_domain(run, pp),
        "zero": [0, 1, 2, 3],
        "sequence_parallel": [False, True] if st.get("tp", 1) > 1 else [False],
    }
    out = []
    for values in itertools.product(*(domains[k] for k in run.unknown)):
        knobs = dict(st, **dict(zip(run.unknown, values)))
        if "vpp" in run.unknown and "schedule" not in st:
            knobs["schedule"] = "interleaved-1f1b" if knobs["vpp"] > 1 else "1f1b"
        # an unstated recomputation may be Megatron's --recompute-num-layers: full recompute of
        # some of each stage's layers, where the run's runtime recomputes some layers and not others
        partial = RUNTIME_RULES[run.runtime].recompute_counts != "all"
        counts = ([None, *range(1, -(-run.model.layers // pp))] if "recompute" in run.unknown and partial
                  and knobs["recompute"] == "full" and "recompute_layers" not in st else [knobs.get("recompute_layers")])
        for count in counts:
            try:
                out.append(resolve_strategy(dict(knobs, recompute_layers=count), setup))
            except PlannerError:
                continue
    return out


@dataclass(frozen=True, slots=True)
class Priced:
    run: Run
    strategy: Strategy
    estimate: StepEstimate

    @property
    def error(self) -> float:
        """Relative error of the predicted step time against the run's derived step time."""
        return self.estimate.step_time_s / self.run.step_time_s - 1.0

    @property
    def chosen(self) -> dict:
        """Values the enumeration picked for the unknown knobs (and the recompute count it chose)."""
        out = {k: getattr(self.strategy, k) for k in self.run.unknown}
        if "recompute" in out and "recompute_layers" not in self.run.strategy and self.strategy.recompute_layers:
            out["recompute_layers"] = self.strategy.recompute_layers
        return out


def price_run(run: Run, efficiency: Efficiency | None = None, strategy: Strategy | None = None) -> Priced:
    """Price a run: its own strategy if fully stated, else the fastest fitting unknown-knob fill.
    Where no fill fits, the memory model overcounts this run (it ran): the fill it overcounts
    least (peak to 0.1 GiB), the fastest of those, is the one taken."""
    cluster = replace(run.cluster, efficiency=efficiency) if efficiency is not None else run.cluster
    options = [strategy] if strategy is not None else candidates(run)
    best, refused = None, None
    for s in options:
        try:
            est = estimate(run.model, cluster, run.setup, s)
        except PlannerError as e:
            refused = refused or str(e)
            continue
        key = (not est.fits, 0 if est.fits else round(est.peak_memory_bytes / GIB, 1), est.step_time_s)
        if best is None or key < best[0]:
            best = (key, s, est)
    if best is None:
        if refused is None:  # no fill at all: what the stated knobs break
            refused = "; ".join(strategy_problems(resolve_strategy(run.strategy, run.setup), run.model, run.setup)
                                or ["no fill of its unknown knobs is legal"])
        raise SpecError(f"run {run.id}: no legal strategy for its stated knobs {run.strategy}: {refused}")
    return Priced(run=run, strategy=best[1], estimate=best[2])
