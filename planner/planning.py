"""One planning request end to end: setup -> search -> plan document (shared by plan and check)."""

from __future__ import annotations

import math

from planner.bands import memory_warning, mfu_warning
from planner.cost.memory import capacity_bytes
from planner.cost.step import estimate, expert_fold
from planner.errors import InfeasibleError, SpecError
from planner.plan import alternative_entry, build_plan, slower_by, strategy_block
from planner.runtimes import (RUNTIME_RULES, TARGETS, builds, ep_overlap_runs_mtp, fp8_recipe, model_refusal,
                              record_name)
from planner.search import space
from planner.search.driver import infeasible_message, most_conventional, search, strategy_key
from planner.search.floors import TIE
from planner.search.space import TIE_TOLERANCE, conventional_reason, strategy_conventions
from planner.spec.efficiency import LegacyEfficiency
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.pools import MixedCluster, check_gpus, common_precision, pool_precision
from planner.spec.training import (DEFAULT_HEADROOM, RunOptions, TrainingSetup, check_gpu_count, recipe_gpu_refusal,
                                   resolve_strategy)
from planner.units import bytes_to_gib

SUPPORTED = "supported"
"""the runtime a request names when it names none: the union of the spaces of TARGETS, each
strategy priced as the runtime that runs it (make_plan)"""
SWEEP_CHUNK = 8
"""GPU counts whose bounds a sweep computes together: more share the array work, fewer
balance the processes better"""


HOST_BOUND_LAYER_S = 12e-3
"""The GPU time of a layer and micro-batch under which published dropless MoE runs on Megatron-Core
(runtimes.RuntimeRules.dropless_host_sync) ran at the host's pace rather than the GPU's, priced
against measured a layer and micro-batch (check_runs.yaml): Megatron-Bridge's archive has
Qwen3-30B-A3B at micro-batch 1 on 8 B200s (3.4 ms priced, 8.8 ran) and on 16 H100s (6.5, 9.5),
at micro-batch 4 on 8 GB200s (10.8, 13.1); Megatron-LM's MoE recipe index has Qwen3-30B-A3B on 32
H100s (5.7, 8.4) and 16 GB200s (11.4, 15.3; the same run without the host sync, paged stash and
one CUDA graph, 12.1), Qwen3-235B-A22B on 256 H100s (8.5, 15.1) and 128 B200s (9.8, 15.3); the
archive's B200 recipe at micro-batch 4 (12.3 priced, 12.6 ran) follows the GPU. The threshold of a
note, not a price: no time is added and nothing is fitted on those rows."""


def shortest_layer_s(est) -> float:
    """The shortest of a plan's stages' time per layer and micro-batch (0 without layers)."""
    return min((st.time_per_microbatch_s / st.layers for st in est.stages if st.layers), default=0.0)


def host_paced(model: ModelSpec, runtime: str, layer_s: float) -> bool:
    """Whether a plan is of the kind published runs ran at the host's pace (HOST_BOUND_LAYER_S):
    MoE layers on a runtime whose dropless routing waits for the host every MoE layer
    (runtimes.RuntimeRules.dropless_host_sync), with under HOST_BOUND_LAYER_S of priced GPU work a
    layer and micro-batch (`layer_s`, shortest_layer_s). The plan's note and validate's subsets
    read it."""
    rules = RUNTIME_RULES.get(runtime)
    return model.moe is not None and rules is not None and rules.dropless_host_sync and 0.0 < layer_s < HOST_BOUND_LAYER_S


def _notes(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fits: bool = True, peak_bytes: float = 0.0,
           proven_optimal: bool = True, mfu: float = 0.0, layer_s: float = 0.0, pp: int = 1) -> list[str]:
    """What a reader of the plan must know about how far to trust it; `peak_bytes` the plan's peak
    memory on `cluster`'s GPUs (what it needs where it does not fit; bands.memory_warning where it
    does), `layer_s` (shortest_layer_s) its shortest time per layer and micro-batch, `pp` its pipeline
    stages."""
    notes = []
    if model.moe is not None and setup.moe_imbalance == 1.0:
        notes.append(f"{model.name}: expert routing priced balanced, every expert-parallel rank an equal share of the "
                     "tokens (as the published benchmarks force it); `--moe-imbalance F` prices the busiest rank at F "
                     "times its share")
    if host_paced(model, setup.runtime, layer_s):
        notes.append(f"{model.name}: {layer_s * 1e3:.1f} ms of GPU work a layer and micro-batch; {setup.runtime}'s "
                     "dropless routing waits for the host every MoE layer, and published runs with layers under "
                     f"{HOST_BOUND_LAYER_S * 1e3:.0f} ms ran at the host's pace, slower than this cost model predicts, "
                     "which leaves the host's time unpriced (NVIDIA's Qwen3 MoE recipes on H100, B200 and GB200: "
                     "`planner validate` shows their errors); a larger micro-batch amortises it")
    warning = mfu_warning(cluster.gpu.name, setup.precision, mfu)
    if warning:
        notes.append(warning)
    if fits and peak_bytes and (short := memory_warning(setup.runtime, pp, peak_bytes, cluster.gpu)):
        notes.append(short)
    if isinstance(cluster.efficiency, LegacyEfficiency):
        notes.append(f"efficiencies of {cluster.name}: a version 1 block (seven free fractions, not grounded in "
                     "measured kernel figures); `planner calibrate` writes version 2")
    if not cluster.efficiency.source.startswith("fitted"):
        notes.append(f"efficiencies of {cluster.name}: {cluster.efficiency.source}, not fitted to its own measured runs")
    if not fits:
        room = (f" ({bytes_to_gib(cluster.gpu.memory_bytes):.1f} GiB less {setup.memory_headroom:.0%} kept free)"
                if setup.memory_headroom else "")
        notes.append(f"does not fit: needs {bytes_to_gib(peak_bytes):.1f} GiB per GPU, {cluster.gpu.name} offers "
                     f"{bytes_to_gib(capacity_bytes(cluster, setup)):.1f} GiB{room}")
    if not proven_optimal:
        notes.append("a solver or DP iteration limit was hit: the plan is the best found, not proven optimal")
    return notes


def _setup(model: ModelSpec, cluster: Cluster, gpus: int, global_batch: int, seq_len: int | None, precision: str,
           attention: str, runtime: str, memory_headroom: float, options: RunOptions = RunOptions()) -> TrainingSetup:
    """The training setup of a request (the model's sequence length unless one is given), after
    checking that the GPU count fills whole nodes."""
    check_gpu_count(gpus, *cluster.count_unit)
    runtime = record_name(runtime)
    if runtime in RUNTIME_RULES and (refused := model_refusal(runtime, model)):
        raise SpecError(refused)
    seq = seq_len or model.seq_len
    if not model.is_graph and model.position_embedding == "learned" and seq > model.max_position:
        raise SpecError(f"--seq-len {seq}: {model.name} has a learned position table of {model.max_position} "
                        "positions; a longer sequence has no position embedding")
    if options.ep_overlap and model.moe is None:
        raise SpecError(f"--ep-overlap overlaps expert all-to-alls; {model.name} has no experts")
    if options.folding and model.moe is None:
        raise SpecError(f"--moe-folding lays out expert layers; {model.name} has no experts")
    if options.moe_imbalance != 1.0 and model.moe is None:
        raise SpecError(f"--moe-imbalance spreads tokens over experts; {model.name} has no experts")
    if "mla_up_proj" in options.recompute_modules and model.mla is None:
        raise SpecError(f"--recompute-modules mla_up_proj recomputes MLA's up-projections; {model.name} has no "
                        "multi-latent attention")
    if "moe_act" in options.recompute_modules and model.moe is None:
        raise SpecError(f"--recompute-modules moe_act recomputes the experts' activation; {model.name} has no experts")
    if options.ep_overlap and not ep_overlap_runs_mtp(model.mtp_layers, pp=max(2, model.layers)):
        raise SpecError(f"--ep-overlap runs at most one MTP layer; {model.name} has {model.mtp_layers}")
    if precision == "fp8" and (refused := recipe_gpu_refusal(fp8_recipe(runtime, options.fp8_recipe), cluster.gpu)):
        raise SpecError(refused)
    return TrainingSetup(gpus=gpus, global_batch=global_batch, seq_len=seq_len or model.seq_len, precision=precision,
                         attention=attention, runtime=runtime, memory_headroom=memory_headroom,
                         **options.setup_fields())


def moe_variants(model: ModelSpec, runtime: str, options: RunOptions) -> list[RunOptions]:
    """The expert layouts a request searches under `runtime`: the one it names, else unfolded
    and, where the runtime folds experts (RuntimeRules.moe_folding) and the model has them,
    folded too (ties go to the first)."""
    from dataclasses import replace
    if options.folding is not None:
        return [options]
    unfolded = replace(options, folding=False)
    if model.moe is None or runtime not in RUNTIME_RULES or not RUNTIME_RULES[runtime].moe_folding:
        return [unfolded]
    return [unfolded, replace(options, folding=True)]


def _modules_apply(options: RunOptions, recompute: str | None) -> None:
    """--recompute-modules says what selective recomputation recomputes: a request whose
    strategy recomputes otherwise (`recompute`: the mode it fixes, None where the search
    chooses) would record modules that nothing reads."""
    if options.recompute_modules and recompute in ("none", "full"):
        what = "nothing" if recompute == "none" else "whole layers"
        raise SpecError(f"--recompute-modules says what selective recomputation recomputes; recompute {recompute} "
                        f"recomputes {what} (--recompute selective runs them)")


def estimate_plan(model: ModelSpec, cluster: Cluster, gpus: int, global_batch: int, seq_len: int | None,
                  precision: str, attention: str, runtime: str, constraints: dict, memory_headroom: float = 0.0,
                  options: RunOptions = RunOptions()) -> dict:
    """The plan document of exactly the strategy given (unset knobs take their defaults; no
    headroom unless asked: a configuration that ran, fits), priced as `runtime` runs it (a
    strategy its record refuses: SpecError), or with SUPPORTED as the fastest of the TARGETS that
    run it (none does: priced in the ideal space, with a note saying why). Experts keep the dense
    tp (Megatron's default) unless asked to fold, or unless only folded experts run the strategy."""
    if isinstance(cluster, MixedCluster):
        raise SpecError(f"cluster {cluster.name} is mixed ({cluster.describe()}): estimate prices one strategy on one "
                        "kind of GPU; name one pool's cluster (plan searches the pools)")
    _modules_apply(options, constraints.get("recompute") or ("full" if "recompute_layers" in constraints else "none"))
    union = runtime == SUPPORTED
    priced, refused = [], []
    for name in _space_names(model, runtime):
        errors = []
        for variant in moe_variants(model, name, options):
            try:
                setup = _setup(model, cluster, gpus, global_batch, seq_len, precision, attention, name,
                               memory_headroom, variant)
                strategy = resolve_strategy(constraints, setup)
                why = RUNTIME_RULES[name].refusal(strategy, model, expert_fold(model, setup, strategy.tp))
                if why:
                    raise SpecError(f"runtime {name} cannot run {why}")
            except SpecError as e:
                errors.append(e)
                continue
            est = estimate(model, cluster, setup, strategy)
            priced.append((est.step_time_s, len(priced), setup, strategy, est))
            break  # the first layout that runs it: the default one where it does
        if len(errors) == len(moe_variants(model, name, options)):  # no layout of this runtime runs it
            if not union:
                raise errors[0]
            refused.append(str(errors[0]))
    notes = []
    if not priced:
        error = None
        for variant in moe_variants(model, "ideal", options):
            try:
                setup = _setup(model, cluster, gpus, global_batch, seq_len, precision, attention, "ideal",
                               memory_headroom, variant)
                strategy = resolve_strategy(constraints, setup)
                break
            except SpecError as e:
                error = error or e
        else:
            raise error
        est = estimate(model, cluster, setup, strategy)
        notes.append("no supported runtime runs this strategy (" + "; ".join(refused) + "): priced in the ideal space")
    else:
        _, _, setup, strategy, est = min(priced, key=lambda x: x[:2])
    notes = _notes(model, cluster, setup, est.fits, est.peak_memory_bytes, mfu=est.mfu, layer_s=shortest_layer_s(est),
                   pp=strategy.pp) + notes
    if union and not builds(model):
        notes.append(_unbuilt_note(model))
    return _with_runtimes(_requested(options, build_plan(model, cluster, setup, strategy, est, constraints,
                                     {"name": "none", "time_limit_s": 0}, notes=notes,
                                     runtimes=(list(TARGETS) if builds(model) else []) if union else None)))


def make_plan(model: ModelSpec, cluster: Cluster, gpus: int, global_batch: int, seq_len: int | None, precision: str,
              attention: str, runtime: str, constraints: dict, solver: str = "exact", time_limit_s: float = 10.0,
              top: int = 3, progress=None, found: dict | None = None, memory_headroom: float = DEFAULT_HEADROOM,
              options: RunOptions = RunOptions(), per_runtime: bool = True) -> dict:
    """The plan document of the best strategy in the space of `runtime`, or with SUPPORTED in the
    union of the spaces of TARGETS (each searched exactly, the fastest plan of all taken, ties to
    the earlier in TARGETS; a model none of them builds is planned in the ideal space, with a
    note). InfeasibleError when nothing fits, SpecError when no legal strategy satisfies the
    request; `found`: {runtime: the search's bounds}, computed beforehand. Without `per_runtime`
    (and with top 0) each runtime's search prunes at the best step found so far, so the plan is
    the same but its best_per_runtime is left out (forecast sweeps). A mixed cluster
    (spec/pools.MixedCluster) is planned by plan_on_pools."""
    if constraints.get("dp_shard"):
        raise SpecError("--dp-shard: the search does not explore hybrid sharding yet; price a strategy with it by "
                        "`planner estimate`")
    if isinstance(cluster, MixedCluster):
        return plan_on_pools(model, cluster, gpus, global_batch=global_batch, seq_len=seq_len, precision=precision,
                             attention=attention, runtime=runtime, constraints=constraints, solver=solver,
                             time_limit_s=time_limit_s, top=top, progress=progress, memory_headroom=memory_headroom,
                             options=options, per_runtime=per_runtime)
    _modules_apply(options, constraints.get("recompute") or ("full" if "recompute_layers" in constraints else None))
    union, built = runtime == SUPPORTED, builds(model)
    names = _space_names(model, runtime)
    searched, refused = {}, {}
    for name in names:
        # one search per expert layout the request leaves open (moe_variants), keyed apart
        for k, variant in enumerate(moe_variants(model, name, options)):
            label = name if k == 0 else f"{name} folded"
            try:
                setup = _setup(model, cluster, gpus, global_batch, seq_len, precision, attention, name,
                               memory_headroom, variant)
            except SpecError as e:
                if k:
                    continue
                if not union:
                    raise
                refused[name] = str(e)
                break
            shared = not per_runtime and top == 0
            reached = min((r.best.step_time_s for _, r in searched.values() if r.best), default=float("inf"))
            # what another search reached prunes this one only past the tie tolerance, where
            # nothing can become the plan (most_conventional)
            searched[label] = (setup, search(model, cluster, setup, constraints, solver=solver,
                                             time_limit_s=time_limit_s, top=top, progress=progress,
                                             found=(found or {}).get(name) if k == 0 else None,
                                             outside_s=reached * (1 + TIE_TOLERANCE) * (1 + TIE) if shared
                                             else float("inf")))
    memo: dict = {}  # the classes priced for the choice, which each runtime's own line may ask again
    chosen = most_conventional(model, cluster, list(searched.values()), constraints, solver, time_limit_s, memo)
    if chosen is None:
        raise _nothing(model, cluster, constraints, searched, refused)
    index, best, rule_proven = chosen
    setup, result = list(searched.values())[index]
    name = setup.runtime
    est = best.estimate(model, cluster, setup)
    cap = capacity_bytes(cluster, setup)
    g = min(cluster.gpus_per_node, gpus)
    code = strategy_conventions(best.strategy, g)
    runners = _runners_up(searched, best, top)
    alternatives = [alternative_entry(c.strategy, s_up, c.step_time_s, c.peak_memory_bytes, c.fits, best.step_time_s,
                                      cap, r if union and built else None,
                                      conventional_reason(code, strategy_conventions(c.strategy, g)))
                    for r, s_up, c in runners]
    if result.closest is not None and result.closest.step_time_s < best.step_time_s and top:
        c = result.closest
        alternatives.append(alternative_entry(c.strategy, setup, c.step_time_s, c.peak_memory_bytes, False,
                                              best.step_time_s, cap, name if union and built else None))
    notes = _notes(model, cluster, setup, proven_optimal=rule_proven and all(r.proven_optimal for _, r in searched.values()),
                   mfu=est.mfu, layer_s=shortest_layer_s(est), pp=best.strategy.pp, peak_bytes=est.peak_memory_bytes)
    if union and not built:
        notes.append(_unbuilt_note(model))
    elif name == "ideal":
        notes.append("planned in the ideal space (--runtime ideal): no runtime's limits shape it, so no runtime may "
                     "run it as planned")
    bests = (_per_runtime(model, cluster, searched, refused, constraints, solver, time_limit_s, memo)
             if union and built and per_runtime else None)
    return _with_runtimes(_requested(options, build_plan(model, cluster, setup, best.strategy, est, constraints,
                                     {"name": solver, "time_limit_s": time_limit_s}, alternatives=alternatives,
                                     notes=notes, search=_search_summary(searched),
                                     runtimes=(list(TARGETS) if built else []) if union else None,
                                     per_runtime=bests)))


def _requested(options: RunOptions, doc: dict) -> dict:
    """The plan, its training inputs also saying where the request kept the experts unfolded
    (--no-moe-folding), so that a re-plan searches what it searched (RunOptions.recorded)."""
    if options.folding is False:
        doc["inputs"]["training"]["moe_folding"] = False
    return doc


def _unbuilt_note(model: ModelSpec) -> str:
    return (f"no supported runtime builds {model.name} (an explicit graph or an encoder): planned in the ideal "
            "space, which no runtime's limits shape")


def _space_names(model: ModelSpec, runtime: str) -> tuple[str, ...]:
    """The runtime records whose spaces' union a request searches (make_plan)."""
    if runtime != SUPPORTED:
        return (record_name(runtime),)
    return TARGETS if builds(model) else ("ideal",)


def _runners_up(searched: dict, chosen, top: int) -> list:
    """(runtime, setup, candidate) of the `top` fastest plans other than the `chosen` one over
    every runtime searched (faster ones that lost on the tie rule included): one per strategy
    (its fastest runtime's), ties to the earlier runtime."""
    pool = []
    for i, (setup, r) in enumerate(searched.values()):
        for cand in ((r.best,) if r.best else ()) + r.alternatives:
            pool.append((cand.step_time_s, i, setup.runtime, setup, cand))
    pool.sort(key=lambda x: (x[0], x[1]))
    best_key = strategy_key(chosen.strategy)
    seen, out = {best_key}, []
    for _, _, name, setup, cand in pool:
        key = strategy_key(cand.strategy)
        if key not in seen and len(out) < top:
            seen.add(key)
            out.append((name, setup, cand))
    return out


def _per_runtime(model: ModelSpec, cluster: Cluster, searched: dict, refused: dict, constraints: dict, solver: str,
                 time_limit_s: float, memo: dict) -> list[dict]:
    """Each runtime's best plan (a one-line strategy and its step time: what `plan --runtime` gives,
    the tie rule applied within its own space), or why it has none."""
    out = []
    for name in TARGETS:
        if name in refused:
            out.append({"runtime": name, "why_not": refused[name]})
            continue
        mine = [(setup, r) for setup, r in searched.values() if setup.runtime == name]
        own = most_conventional(model, cluster, mine, constraints, solver, time_limit_s, memo)
        if own is None:
            setup, r = mine[0]
            out.append({"runtime": name, "why_not": infeasible_message(r, model, cluster, setup) if r.closest or r.pruned_memory
                        else "no legal strategy satisfies the request under this runtime"})
            continue
        setup = mine[own[0]][0]
        out.append({"runtime": name, "step_time_s": own[1].step_time_s,
                    "strategy": strategy_block(own[1].strategy, setup)})
    return out


def _search_summary(searched: dict) -> dict:
    """The search counts of every runtime searched, summed (what the plan's search block says)."""
    results = [r for _, r in searched.values()]
    out = results[0].summary()
    for r in results[1:]:
        for k, v in r.summary().items():
            out[k] = out[k] and v if isinstance(v, bool) else out[k] + v
    return out


def _nothing(model: ModelSpec, cluster: Cluster, constraints: dict, searched: dict, refused: dict) -> Exception:
    """The error of a request no runtime searched has a plan for: what refused it, what the
    closest candidate would need, or why no strategy is legal."""
    if not searched:
        return SpecError("no supported runtime runs this setup: " + "; ".join(dict.fromkeys(refused.values())))
    near = [(r.closest.peak_memory_bytes, i, setup, r) for i, (setup, r) in enumerate(searched.values()) if r.closest]
    if near:
        _, _, setup, r = min(near, key=lambda x: x[:2])
        return InfeasibleError(infeasible_message(r, model, cluster, setup))
    pruned = [(setup, r) for setup, r in searched.values() if r.pruned_memory]
    if pruned:
        setup, r = min(pruned, key=lambda x: x[1].memory_floor_bytes)
        return InfeasibleError(infeasible_message(r, model, cluster, setup))
    # each runtime's own reason, the runtimes that share one named together
    reasons: dict[str, dict[str, None]] = {}
    for setup, _ in searched.values():
        reasons.setdefault(space.explain_empty(model, cluster, setup, constraints), {})[setup.runtime] = None
    return SpecError("; ".join([f"{', '.join(names)}: {why}" for why, names in reasons.items()]
                               + [f"{name}: {why}" for name, why in refused.items()]))


def _with_runtimes(doc: dict) -> dict:
    """The plan with runnable_on: the runtimes that execute it as planned (export.runnable_on),
    and a note when none does."""
    from planner.export import runnable_on
    doc["runnable_on"] = runnable_on(doc)
    if not doc["runnable_on"]:
        doc["notes"].append("no supported runtime runs this plan as planned: `planner export` says what each lacks")
    return doc


def replan(doc: dict, refresh_presets: bool = False) -> dict:
    """Plan again from the inputs a plan recorded (resolved specs, training, constraints,
    solver) with the installed version; `refresh_presets` re-reads preset names first."""
    from planner.presets import preset_names
    from planner.spec.hardware import cluster_from_dict, load_cluster
    from planner.spec.model import ModelSpec, load_model

    inputs = doc["inputs"]
    model = ModelSpec.from_dict(inputs["model"], "plan inputs.model")
    cluster = cluster_from_dict(inputs["cluster"], "plan inputs.cluster")
    if refresh_presets:
        if model.name in preset_names("models"):
            model = load_model(model.name)
        if cluster.name in preset_names("hardware/clusters"):
            cluster = load_cluster(cluster.name)
    tr = inputs["training"]
    return make_plan(model, cluster, gpus=tr["gpus"], global_batch=tr["global_batch"], seq_len=tr["seq_len"],
                     precision=tr["precision"], attention=tr["attention"],
                     runtime=SUPPORTED if "runtimes" in inputs else tr["runtime"],
                     constraints=dict(inputs["constraints"]), solver=inputs["solver"]["name"],
                     time_limit_s=inputs["solver"]["time_limit_s"], top=len(doc.get("alternatives", [])),
                     memory_headroom=tr.get("memory_headroom", 0.0), options=RunOptions.recorded(tr))


def _strategies(doc: dict) -> dict:
    """What makes a plan the same plan (what compare.diff reads of it): its strategy, and over
    several pools each pool's share of the batch and strategy, or each stage's pool."""
    out = {"strategy": doc["strategy"],
           "pools": [{"name": p["name"], "share": {k: p["share"][k] for k in ("global_batch", "strategy")}}
                     for p in doc.get("pools", []) if "share" in p]}
    if any("pool" in st for st in doc.get("stages", [])):  # a pipeline over pools: each stage's pool
        out["stages"] = [{"pool": st.get("pool")} for st in doc["stages"]]
    return out


def check_plan(doc: dict, tolerance: float, refresh_presets: bool = False) -> dict:
    """Verdict of `planner check`: 'ok', 'unrunnable' (the runtime the plan was made for no longer
    runs it as planned: export.runnable_on), 'stale' (the best strategy changed, even if faster;
    or the plan was made in the ideal space under its old name 'any', which is no longer the
    default: re-plan) or 'regressed' (the predicted step time grew by more than `tolerance`)."""
    from planner.compare import diff
    from planner.export import runnable_on

    fresh = replan(doc, refresh_presets)
    old_step = doc["prediction"]["step_time_s"]
    new_step = fresh["prediction"]["step_time_s"]
    growth = new_step / old_step - 1.0
    changed = diff(_strategies(doc), _strategies(fresh))
    recorded = doc["inputs"]["training"]["runtime"]
    if recorded in TARGETS and recorded not in [r["runtime"] for r in runnable_on(doc)]:
        verdict = "unrunnable"
        why = f"{recorded}, the runtime it was planned for, no longer runs it as planned (planner export says why)"
    elif recorded == "any":
        verdict = "stale"
        why = ("planned in the ideal space under its old name 'any' (no runtime's limits), no longer the default: "
               "re-plan for a plan the supported runtimes run")
    elif changed:
        verdict = "stale"
        why = (f"the best strategy changed ({', '.join(c['key'].removeprefix('strategy.') for c in changed)}); "
               f"the new plan is {'faster' if growth < 0 else 'slower'} by {abs(growth) * 100:.2f}%")
    elif growth > tolerance:
        verdict = "regressed"
        why = f"predicted step time grew by {growth * 100:.2f}% (> {tolerance * 100:.2f}%)"
    else:
        verdict = "ok"
        why = f"same strategy; step time {growth * 100:+.2f}% (tolerance {tolerance * 100:.2f}%)"
    return {"verdict": verdict, "reason": why, "step_time_change": growth, "changes": diff(doc, fresh),
            "fresh": fresh}


def plan_on_pools(model: ModelSpec, cluster: MixedCluster, gpus: int, **request) -> dict:
    """The plan on a mixed cluster: each pool alone with as many of the `gpus` as it holds
    (make_plan on its plain cluster), the fastest of those plans, ties to the earlier pool; and
    one pipeline over several pools (search/pool_stages.py, in the spaces whose records run them:
    RuntimeRules.pool_stages) and, where the space has them (_has_shares: the ideal space's record
    only), data-parallel replicas over several pools with batch shares (search/shares.py), each
    taken only where faster than every pool alone by more than the tie tolerance, a pipeline
    over the shares unless they beat it by more than the tolerance. A plan on one pool is that pool's plan (inputs.cluster its
    cluster, so check, diff and export read it as any plan); both kinds list every pool under
    `pools`, the GPUs the plan uses of it and the step time it reaches alone (or why it has none),
    with a note naming the pools left idle. The error of the first pool when no pool has a plan."""
    from planner.errors import PlannerError

    check_gpus(cluster, gpus)
    plans, entries, first_error = [], [], None
    for pool in cluster.pools:
        entry = {"name": pool.name, "cluster": pool.cluster.name, "gpu": pool.cluster.gpu.name, "gpus": pool.gpus}
        precision = pool_precision(pool, request["precision"])
        if precision != request["precision"]:
            entry["precision"] = precision
        try:
            doc = make_plan(model, pool.cluster, min(gpus, pool.gpus),
                            **{**request, "precision": precision,
                               "options": request.get("options", RunOptions()).at(precision)})
            plans.append((doc["prediction"]["step_time_s"], len(plans), pool, doc))
            entry["step_time_s"] = doc["prediction"]["step_time_s"]
        except PlannerError as e:
            first_error = first_error or e
            entry["why_not"] = str(e)
        entries.append(entry)
    # a plan over several pools must beat every pool alone by more than the tie tolerance; of
    # those, a pipeline over pools within the tolerance of the best batch shares is the plan
    # (it is what a runtime may run), so shares, searched first, cap the pipelines' cutoff
    alone = min((p[0] for p in plans), default=float("inf"))
    shares, several = None, len(cluster.pools) > 1 and _has_shares(request["runtime"])
    if several:
        shares = _shares(model, cluster, gpus, request, cutoff_s=alone / (1 + TIE_TOLERANCE))
    cutoff = min(alone / (1 + TIE_TOLERANCE), shares.step_time_s * (1 + TIE_TOLERANCE) if shares else float("inf"))
    staged, pipelines = _pool_stages(model, cluster, gpus, request, cutoff_s=cutoff) \
        if len(cluster.pools) > 1 else (None, False)
    if staged is not None:
        return _stages_plan(model, cluster, request, *staged, entries, [(pool, d) for _, _, pool, d in plans])
    if shares is not None:
        return _shares_plan(model, cluster, request, shares, entries, [(pool, d) for _, _, pool, d in plans])
    if not plans:
        raise type(first_error)(f"no pool of {cluster.name} has a plan on its own; "
                                + "; ".join(f"{e['name']}: {e['why_not']}" for e in entries))
    _, _, chosen, doc = min(plans, key=lambda p: p[:2])
    doc["search"] = _summed([d["search"] for *_, d in plans])
    used = doc["inputs"]["training"]["gpus"]
    for entry in entries:
        entry["used_gpus"] = used if entry["name"] == chosen.name else 0
    doc["pools"] = _pool_entries(entries)
    idle = [e for e in entries if not e["used_gpus"]]
    if idle or used < gpus:
        kinds = [k for k, on in (("one pipeline over the pools", pipelines), ("batch shares", several)) if on]
        why = ((f" No plan of {' or '.join(kinds)} is faster by more than {TIE_TOLERANCE:.0%}." if kinds else
                " The space searched has no pipeline over these pools (no runtime of it runs one on them, "
                "RuntimeRules.pool_stages, or the constraints leave none).")
               + ("" if several else " Plans of data-parallel replicas with batch shares over pools are searched "
                  "in the ideal space only (--runtime ideal): no supported runtime runs them."))
        doc["notes"].append(
            f"mixed cluster {cluster.name} ({cluster.describe()}): the plan runs on pool {chosen.name} alone "
            f"({used} of the {gpus} GPUs asked for)"
            + ("; idle: " + ", ".join(f"{e['name']} ({e['gpus']} x {e['gpu']}"
                                      + (f", {e['step_time_s']:.4g} s alone)" if "step_time_s" in e else ", no plan)")
                                      for e in idle) if idle else "")
            + "." + (why if len(cluster.pools) > 1 else ""))
    return doc


def _pool_stages(model: ModelSpec, cluster: MixedCluster, gpus: int, request: dict, cutoff_s: float):
    """The pipeline over several pools below `cutoff_s` (search/pool_stages.py) in the request's
    space: each runtime of it whose record runs them (RuntimeRules.pool_stages) and each expert
    layout the request leaves open (moe_variants) searched and priced as itself; of all of them
    the most conventional within the tie tolerance of the fastest (ties to the faster, then to
    the earlier search), and the `top` fastest others as its runners-up (each search prunes at
    the slower of the tie limit and the top-th found so far, so both are exact). ((its setup, a
    result of the merged searches) or None, whether the space has any such pipeline). One
    precision for every pool (spec/pools.common_precision)."""
    from dataclasses import replace

    from planner.search.pool_stages import PoolStagesResult, best_pool_stages, prune_limit, ranked

    results, searched, cutoff, top = [], False, cutoff_s, request.get("top", 3)
    precision = common_precision(cluster.pools, request["precision"])
    first = cluster.pools[0].cluster

    def found() -> list:
        return [c for r in results for c in ([r.best] if r.best else []) + list(r.alternatives)]

    for name in _space_names(model, request["runtime"]):
        rules = RUNTIME_RULES[name]
        if rules.pool_stages == "none" or precision not in rules.precisions:
            continue
        options = request.get("options", RunOptions()).at(precision)
        if precision == "fp8" and any(recipe_gpu_refusal(fp8_recipe(name, options.fp8_recipe), p.cluster.gpu)
                                      for p in cluster.pools):
            continue  # a pool's GPU does not run the recipe: no pipeline over all of them
        for variant in moe_variants(model, name, options):
            try:
                setup = _setup(model, first, first.gpus_per_node, request["global_batch"], request["seq_len"],
                               precision, request["attention"], name, request.get("memory_headroom", DEFAULT_HEADROOM),
                               variant)
            except SpecError:
                continue
            result = best_pool_stages(model, cluster, replace(setup, gpus=gpus), request["constraints"], rules,
                                      cutoff_s=cutoff, progress=request.get("progress"), top=top)
            searched |= result.considered > 0
            results.append(result)
            cutoff = prune_limit([c.step_time_s for c in found()], top, cutoff_s)
    pool = found()
    if not pool:
        return None, searched
    best, others = ranked(pool, top, tuple(p.cluster for p in cluster.pools),
                          min(c.step_time_s for c in pool) * (1 + TIE_TOLERANCE))
    merged = PoolStagesResult(best=best, considered=sum(r.considered for r in results),
                              priced=sum(r.priced for r in results),
                              proven_optimal=all(r.proven_optimal for r in results), alternatives=others,
                              pruned_memory=sum(r.pruned_memory for r in results))
    return (best.setup, merged), searched


POOL_KEYS = ("name", "cluster", "gpu", "gpus", "used_gpus", "stages", "mfu", "precision", "step_time_s", "why_not",
             "share")
"""the keys of a plan's pools[] entries (schema.POOL), those an entry has"""


def _pool_entries(entries: list[dict]) -> list[dict]:
    return [{k: e[k] for k in POOL_KEYS if k in e} for e in entries]


def _alone_alternatives(alone: list[tuple], step: float, top: int) -> list[dict]:
    """The runners-up of a plan over several pools: each pool's own plan alone, fastest first
    (`alone`: (pool, document) of each pool that has one)."""
    return sorted(
        ({"strategy": d["strategy"], "step_time_s": d["prediction"]["step_time_s"],
          "peak_memory_gib": d["prediction"]["peak_memory_gib"],
          "why_not": f"pool {pool.name} alone ({d['inputs']['training']['gpus']} x {pool.cluster.gpu.name}): "
                     + slower_by(d["prediction"]["step_time_s"], step)} for pool, d in alone),
        key=lambda a: a["step_time_s"])[:top]


def _pipeline_alternatives(model: ModelSpec, cluster: MixedCluster, request: dict, result, step: float) -> list[dict]:
    """The runners-up among the pipelines over pools (search/pool_stages: the fastest other
    strategies and orders of the pools), each with the pools its stages sit on, the runtime it
    was found for where the request's space is several runtimes', and why it lost."""
    from planner.cost.pools import estimate_on_pools

    from planner.search.pool_stages import pool_conventions

    clusters = tuple(p.cluster for p in cluster.pools)
    out = []
    for alt in result.alternatives:
        est = estimate_on_pools(model, clusters, cluster.between_pools, alt.setup, alt.strategy, alt.stage_pool,
                                alt.bounds)
        entry = alternative_entry(alt.strategy, alt.setup, alt.step_time_s, est.peak_memory_bytes, est.fits, step,
                                  est.capacity_bytes,
                                  alt.setup.runtime if request["runtime"] == SUPPORTED else None,
                                  conventional_reason(pool_conventions(result.best, clusters),
                                                      pool_conventions(alt, clusters)))
        where = ", ".join(f"{cluster.pools[j].name} {n} stage{'s' if n > 1 else ''}" for j, n in
                          zip(alt.order, alt.counts))
        entry["why_not"] = f"a pipeline over pools ({where}): {entry['why_not']}"
        out.append(entry)
    return out


def _over_pools_search(alone: list[tuple], counts: dict, proven: bool) -> dict:
    """The search summary of a plan over several pools: the pools' own searches added up (none
    where no pool has a plan alone), the search over the pools' `counts`, proven where all were."""
    from planner.search.driver import NOTHING_SEARCHED

    out = {**_summed([d["search"] for _, d in alone] or [NOTHING_SEARCHED.summary()]), **counts}
    out["proven_optimal"] = out["proven_optimal"] and proven
    return out


def _pools_band(used: list) -> dict:
    """The band of a plan over several pools: the widest of its pools' (`used`: (pool, its
    cluster) of each pool the plan uses), each pool's basis named."""
    from planner.bands import prediction_band

    bands = [(pool, prediction_band(c)) for pool, c in used]
    low, high = min(b.low for _, b in bands), max(b.high for _, b in bands)
    return {"low_error": low, "high_error": high, "rows": min(b.rows for _, b in bands),
            "basis": "the widest of its pools' bands: " + "; ".join(f"{pool.name}: {b.basis}" for pool, b in bands)}


def _stages_plan(model: ModelSpec, cluster: MixedCluster, request: dict, setup: TrainingSetup, result,
                 entries: list[dict], alone: list[tuple]) -> dict:
    """The document of a pipeline over pools: the strategy every stage runs, each stage with its
    pool (stages[].pool), the pools' GPUs and stages (pools[].used_gpus, pools[].stages: first
    and last stage; pools[].mfu: the model FLOPs of its stages over its GPUs' own peak, which
    the best-published-MFU warning reads), a prediction over all of them (cost/pools.estimate_on_pools: MFU over the
    mean peak of the GPUs, each stage fitting its own pool), the widest band of its pools'; the
    runners-up are the `top` fastest other pipelines over pools and every pool's own plan alone
    (`alone`: (pool, document) of each pool that has one)."""
    from planner.cost.pools import estimate_on_pools, pool_mfu
    from planner.plan import inputs_block, rounded

    best = result.best
    clusters = tuple(p.cluster for p in cluster.pools)
    est = estimate_on_pools(model, clusters, cluster.between_pools, setup, best.strategy, best.stage_pool,
                            best.bounds)
    used = sorted(set(best.stage_pool))
    proven = result.proven_optimal and all(d["search"]["proven_optimal"] for _, d in alone)
    width = best.strategy.tp * best.strategy.cp * best.strategy.dp
    mfu = pool_mfu(model, clusters, setup, best.strategy, best.stage_pool, est)
    # each pool's GPUs hold its own stages: the highest of their peaks
    peaks = {j: max(st.memory.total for st, k in zip(est.stages, best.stage_pool) if k == j) for j in used}
    notes = [n for j in used for n in _notes(model, clusters[j], setup, peak_bytes=peaks[j], proven_optimal=proven,
                                             mfu=mfu[j], pp=best.strategy.pp)]
    union = request["runtime"] == SUPPORTED
    doc = build_plan(model, clusters[best.stage_pool[0]], setup, best.strategy, est, request["constraints"],
                     {"name": request.get("solver", "exact"), "time_limit_s": request.get("time_limit_s", 10.0)},
                     notes=list(dict.fromkeys(notes)))
    doc["inputs"] = inputs_block(model, cluster, setup, request["constraints"], doc["inputs"]["solver"],
                                 list(TARGETS) if union else None)
    step = est.step_time_s
    p = doc["prediction"]
    band = _pools_band([(cluster.pools[j], clusters[j]) for j in used])
    p["band"] = {**band, "step_time_s": [step / (1 + band["high_error"]), step / (1 + band["low_error"])]}
    for stage, j in zip(doc["stages"], best.stage_pool):
        stage["pool"] = cluster.pools[j].name
    for j, entry in enumerate(entries):
        held = [i for i, q in enumerate(best.stage_pool) if q == j]
        entry["used_gpus"] = len(held) * width
        if held:
            entry["stages"], entry["mfu"] = [held[0], held[-1]], mfu[j]
    doc["pools"] = _pool_entries(entries)
    # the runners-up: the `top` fastest other pipelines, then every pool alone (none with top 0)
    doc["alternatives"] = sorted(_pipeline_alternatives(model, cluster, request, result, step)
                                 + _alone_alternatives(alone, step, len(alone) if request.get("top", 3) else 0),
                                 key=lambda a: a["step_time_s"])
    slowest = max(est.stages, key=lambda st: st.time_per_microbatch_s)
    best_alone = min((d["prediction"]["step_time_s"] for _, d in alone), default=None)
    blocks = []
    for j in best.order:
        held = [st for st, q in zip(est.stages, best.stage_pool) if q == j]
        first, last = held[0], held[-1]
        blocks.append(f"{cluster.pools[j].name} (stage{'s' if len(held) > 1 else ''} {first.index}"
                      + (f"-{last.index}" if len(held) > 1 else "")
                      + f", {len(held) * width} x {clusters[j].gpu.name}, layers {first.chunks[0][0]}-"
                        f"{last.chunks[-1][1]})")
    doc["notes"].insert(0, (
        f"mixed cluster {cluster.name}: one pipeline over pools " + ", ".join(blocks)
        + f", every stage running the strategy above in {setup.precision}; each send between pools crosses "
        f"the link between them. Stage {slowest.index} (pool {cluster.pools[best.stage_pool[slowest.index]].name}) "
        f"is the slowest, {slowest.time_per_microbatch_s * 1e3:.4g} ms a micro-batch"
        + (f"; the fastest pool alone takes {best_alone:.4g} s" if best_alone else "")
        + (". Ranks are laid out pp outermost: launch the nodes of the first pool's stages first"
           if setup.runtime != "ideal" else ". Planned in the ideal space")))
    doc["search"] = _over_pools_search(alone, {"pool_stage_candidates": result.considered,
                                               "pool_stage_pruned_memory": result.pruned_memory,
                                               "pool_stage_programmes": result.priced}, result.proven_optimal)
    return _with_runtimes(rounded(doc))


def _has_shares(runtime: str) -> bool:
    """Whether the space a request names has plans of batch shares over several pools: its
    record runs them (RuntimeRules.batch_shares); the supported runtimes' union has them where
    one of them does."""
    names = TARGETS if runtime == SUPPORTED else (record_name(runtime),)
    return any(RUNTIME_RULES[n].batch_shares for n in names)


def _summed(searches: list[dict]) -> dict:
    """Search counts added up over several searches (proven where each was)."""
    return {k: (all(s[k] for s in searches) if k == "proven_optimal" else sum(s[k] for s in searches))
            for k in searches[0]}


def _shares(model: ModelSpec, cluster: MixedCluster, gpus: int, request: dict, cutoff_s: float):
    """The fastest plan of batch shares over several pools below `cutoff_s` (search/shares.py),
    each pool's share searched in the request's space (one that has them: _has_shares)."""
    from planner.search.shares import best_shares

    def setup_of(i: int, n: int, share: int) -> TrainingSetup:
        return _setup(model, cluster.pools[i].cluster, n, share, request["seq_len"],
                      pool_precision(cluster.pools[i], request["precision"]), request["attention"],
                      record_name(request["runtime"]),
                      request.get("memory_headroom", DEFAULT_HEADROOM),
                      request.get("options", RunOptions()).at(pool_precision(cluster.pools[i], request["precision"])))

    precisions = tuple(pool_precision(p, request["precision"]) for p in cluster.pools)
    return best_shares(model, cluster, gpus, request["global_batch"], precisions,
                       request.get("options", RunOptions()).grad_reduce, setup_of, request["constraints"],
                       solver=request.get("solver", "exact"), time_limit_s=request.get("time_limit_s", 10.0),
                       cutoff_s=cutoff_s, progress=request.get("progress"))


def _shares_plan(model: ModelSpec, cluster: MixedCluster, request: dict, shares, entries: list[dict],
                 alone: list[tuple]) -> dict:
    """The document of a plan of batch shares: the strategy, stages and placement of the pool
    with the most GPUs (strategy_pool; ties to the earlier pool), every pool's share under
    pools[].share, and a prediction over all of them: the step of the slowest pool plus the
    exchange between the pools, throughput and MFU over every GPU used (each at its own peak),
    the strategy pool's breakdown with its wait for the slowest and the exchange added, and the
    widest band of the pools'; the runners-up are the pools' own plans alone (`alone`: (pool,
    document) of each pool that has one)."""
    from dataclasses import replace

    from planner.cost.step import executed_flops_per_step, model_flops_per_sequence
    from planner.plan import inputs_block, rounded
    from planner.schema import POOL_BREAKDOWN_KEYS

    priced = []
    for sh in shares.shares:
        pool = cluster.pools[sh.pool]
        priced.append((sh, pool, sh.candidate.estimate(model, pool.cluster, sh.setup)))
    lead, lead_pool, lead_est = max(priced, key=lambda x: (x[0].setup.gpus, -x[0].pool))
    step, x = shares.step_time_s, shares.exchange_s
    used = sum(sh.setup.gpus for sh, _, _ in priced)
    batch = request["global_batch"]
    setup = replace(lead.setup, gpus=used, global_batch=batch)
    notes = [n for sh, pool, est in priced
             for n in _notes(model, pool.cluster, sh.setup, peak_bytes=est.peak_memory_bytes, mfu=est.mfu,
                             pp=sh.candidate.strategy.pp)]
    doc = build_plan(model, lead_pool.cluster, lead.setup, lead.candidate.strategy, lead_est, request["constraints"],
                     {"name": request.get("solver", "exact"), "time_limit_s": request.get("time_limit_s", 10.0)},
                     notes=list(dict.fromkeys(notes)))
    doc["inputs"] = inputs_block(model, cluster, setup, request["constraints"], doc["inputs"]["solver"])
    peak = sum(sh.setup.gpus * pool.cluster.gpu.flops(sh.setup.precision) for sh, pool, _ in priced)
    flops = model_flops_per_sequence(model, setup.seq_len) * batch
    executed = sum(executed_flops_per_step(model, sh.setup, sh.candidate.strategy, est.stages)
                   for sh, _, est in priced)
    p = doc["prediction"]
    p.update(step_time_s=step, tokens_per_s=batch * setup.seq_len / step, model_tflops_per_gpu=flops / step / used / 1e12,
             mfu=flops / step / peak, hfu=executed / step / peak,
             fits=all(est.fits for *_, est in priced))
    p["breakdown_s"].update(dict(zip(POOL_BREAKDOWN_KEYS, (step - x - lead_est.step_time_s, x))))
    band = _pools_band([(pool, pool.cluster) for _, pool, _ in priced])
    p["band"] = {**band, "step_time_s": [step / (1 + band["high_error"]), step / (1 + band["low_error"])]}
    by_pool = {pool.name: (sh, est) for sh, pool, est in priced}
    for entry in entries:
        sh, est = by_pool.get(entry["name"], (None, None))
        entry["used_gpus"] = sh.setup.gpus if sh else 0
        if sh:
            entry["share"] = {"global_batch": sh.setup.global_batch, "precision": sh.setup.precision,
                              "step_time_s": est.step_time_s,
                              "busy": est.step_time_s / step, "peak_memory_gib": bytes_to_gib(est.peak_memory_bytes),
                              "capacity_gib": bytes_to_gib(est.capacity_bytes),
                              "strategy": strategy_block(sh.candidate.strategy, sh.setup)}
    doc["pools"] = _pool_entries(entries)
    doc["strategy_pool"] = lead_pool.name
    # the runners-up: each pool's plan alone (what the shares beat by more than the tie tolerance)
    doc["alternatives"] = _alone_alternatives(alone, step, request.get("top", 3))
    slowest = max(priced, key=lambda q: (q[2].step_time_s, -q[0].pool))[1]
    best_alone = min((d["prediction"]["step_time_s"] for _, d in alone), default=None)
    doc["notes"].insert(0, (
        f"mixed cluster {cluster.name}: data-parallel replicas over pools "
        + ", ".join(f"{pool.name} ({sh.setup.gpus} x {pool.cluster.gpu.name}, {sh.setup.global_batch} of {batch} "
                    f"sequences, {est.step_time_s:.4g} s)" for sh, pool, est in priced)
        + f", each with its own strategy (the strategy block is pool {lead_pool.name}'s; the others are under "
        f"pools[].share), then {x:.3g} s of gradient exchange between the pools. Pool {slowest.name} sets the step"
        + (f"; the fastest pool alone takes {best_alone:.4g} s" if best_alone else "")
        + ". Planned in the ideal space: no supported runtime runs per-pool strategies and batch shares"))
    doc["search"] = _over_pools_search(alone, {"share_splits": shares.splits, "share_bounds": shares.bounded,
                                               "share_searches": shares.priced}, shares.proven_optimal)
    return _with_runtimes(rounded(doc))


def _sweep_entry(request: dict, gpus: int, found=None) -> dict:
    from planner.errors import PlannerError
    try:
        return {"gpus": gpus, "plan": make_plan(gpus=gpus, found=found, **request)}
    except PlannerError as e:
        return {"gpus": gpus, "infeasible": str(e)}


def _sweep_chunk(request: dict, counts: list[int]) -> list[dict]:
    """The entries of some GPU counts, the bounds of the valid ones computed together
    (driver.bound_sweep); a count that is not valid gets the entry that says why."""
    from planner.errors import PlannerError
    from planner.search.driver import bound_sweep

    r, found = request, {n: {} for n in counts}
    if isinstance(r["cluster"], MixedCluster):  # each count planned pool by pool (plan_on_pools)
        return [_sweep_entry(request, n) for n in counts]
    for name in _space_names(r["model"], r["runtime"]):
        setups = {}
        for n in counts:
            try:
                setups[n] = _setup(r["model"], r["cluster"], n, r["global_batch"], r["seq_len"], r["precision"],
                                   r["attention"], name, r.get("memory_headroom", DEFAULT_HEADROOM),
                                   r.get("options", RunOptions()))
            except PlannerError:
                pass  # make_plan says why
        try:
            for n, b in zip(setups, bound_sweep(r["model"], r["cluster"], list(setups.values()), r["constraints"])
                            if setups else []):
                found[n][name] = b
        except PlannerError:
            pass  # each count's search says why
    return [_sweep_entry(request, n, found[n]) for n in counts]


def _chunks(counts: list[int], global_batch: int, size: int) -> list[list[int]]:
    """The counts in chunks of about `size`, the likely longest searches spread over them and
    the chunks with the most of them first (no long chunk is left for the end): a count's
    search grows with the data-parallel degrees that divide both it and the global batch."""
    weight = {n: len(space.divisors(math.gcd(n, global_batch))) for n in counts}
    ranked = sorted(counts, key=lambda n: -weight[n])
    parts = max(1, -(-len(counts) // size))
    chunks = [ranked[k::parts] for k in range(parts)]
    return sorted(chunks, key=lambda c: -sum(weight[n] for n in c))


def _dask_client(address: str):
    """A client of the Dask cluster at `address` (SpecError naming the extra when dask.distributed
    is not installed, or the address when nothing answers there)."""
    try:
        from distributed import Client
    except ImportError:
        raise SpecError("--dask needs dask.distributed: pip install 'llm-parallel-planner[dask]'") from None
    try:
        return Client(address, timeout=10)
    except ValueError as e:  # an address distributed cannot parse ('host' without a port)
        raise SpecError(f"--dask {address}: not a scheduler address ({e}); expected host:port or "
                        "tcp://host:port") from None
    except (OSError, TimeoutError) as e:
        raise SpecError(f"--dask {address}: no Dask scheduler answers there ({e.__class__.__name__})") from None


def sweep(request: dict, counts: list[int], progress=None, workers: int | None = None,
          dask: str | None = None) -> list[dict]:
    """One plan (or the reason there is none) per GPU count, searched in parallel processes (as
    many as cores, at most 8), or on the Dask cluster at `dask`, in chunks of counts whose bounds
    are computed together; the entries come back in the order of `counts`, whoever computed
    them (each chunk's entries are a pure function of the request and its counts)."""
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = workers or min(8, os.cpu_count() or 1, len(counts))
    chunks = _chunks(counts, request["global_batch"], SWEEP_CHUNK)
    entries: dict[int, dict] = {}
    if dask:
        with _dask_client(dask) as client:
            from distributed import as_completed as dask_completed
            futures = [client.submit(_sweep_chunk, request, chunk, pure=False) for chunk in chunks]
            for future in dask_completed(futures):
                entries.update((e["gpus"], e) for e in future.result())
                if progress:
                    progress(len(entries), len(counts), f"{len(entries)} of {len(counts)} counts")
        return [entries[n] for n in counts]
    if workers <= 1:
        for chunk in chunks:
            if progress:
                progress(len(entries), len(counts), f"{len(entries)} of {len(counts)} counts")
            entries.update((e["gpus"], e) for e in _sweep_chunk(request, chunk))
    else:
        pool = ProcessPoolExecutor(max_workers=workers)
        try:
            for future in as_completed([pool.submit(_sweep_chunk, request, chunk) for chunk in chunks]):
                entries.update((e["gpus"], e) for e in future.result())
                if progress:
                    progress(len(entries), len(counts), f"{len(entries)} of {len(counts)} counts")
        except BaseException:
            # an interrupt (or a failure) stops the workers now rather than after their chunks
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return [entries[n] for n in counts]
