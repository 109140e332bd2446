"""Command line: one click group, one error boundary. stdout carries data, stderr humans."""

from __future__ import annotations

import math
import os
import sys

import click

from planner import __version__
from planner.errors import PlannerError
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN
from planner.runtimes import OLDER_VERSIONS, RUNTIME_RULES, TARGETS
from planner.spec.training import (DEFAULT_HEADROOM, FP8_RECIPES, GRAD_REDUCES, LOSS_FUSIONS, OPTIMIZER_STATES,
                                   RECOMPUTE_MODULES)


_DEGREE = click.IntRange(1, MAX_GPUS)


class _Finite(click.FloatRange):
    """A number within the range: click's FloatRange lets nan through (it compares false with
    every bound) and inf past an open end, and either would reach a plan file as JSON that no
    strict reader (ours included) accepts."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _strategy_options(f):
    opts = [
        click.option("--tp", type=_DEGREE, help="tensor-parallel degree"),
        click.option("--pp", type=_DEGREE, help="pipeline-parallel degree"),
        click.option("--dp", type=_DEGREE, help="data-parallel degree (default: GPUs / (tp*pp*cp))"),
        click.option("--cp", type=_DEGREE, help="context-parallel degree"),
        click.option("--ep", type=_DEGREE, help="expert-parallel degree (divides dp*cp)"),
        click.option("--vpp", type=click.IntRange(1, MAX_LAYERS), help="virtual pipeline stages per rank (interleaving)"),
        click.option("--micro-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), help="sequences per micro-batch"),
        click.option("--zero", type=click.IntRange(0, 3), help="ZeRO stage 0-3"),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"])),
        click.option("--recompute-layers", type=click.IntRange(0, MAX_LAYERS), help="with --recompute full: layers per stage recomputed"),
        click.option("--sequence-parallel/--no-sequence-parallel", default=None),
        click.option("--dp-overlap/--no-dp-overlap", default=None),
        click.option("--schedule", type=click.Choice(["1f1b", "interleaved-1f1b"])),
        click.option("--order", help="rank order, innermost first (default tp-cp-ep-dp-pp)"),
        click.option("--dp-shard", type=_DEGREE,
                     help="hybrid sharding: ZeRO shards over groups of this many dp ranks, replicated across "
                          "them (estimate only: the search does not explore it)"),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


_RUNTIMES = ["supported", *TARGETS, "ideal", "any", *OLDER_VERSIONS]
"""--runtime's choices: the search spaces, then older versions of a runtime (NAME@VERSION)"""


def _setup_options(f):
    opts = [
        click.option("--model", "-m", "model_ref", required=True, help="preset name, our YAML, or a config.json"),
        click.option("--cluster", "-c", "cluster_ref", required=True, help="preset name or cluster YAML"),
        click.option("--gpus", required=True, help="GPU count (plan: also a list 512,1024 or a range 512-4096)"),
        click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), required=True, help="sequences per step"),
        click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), help="sequence length (default: the model's)"),
        click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8"]), default="bf16", show_default=True),
        click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash", show_default=True),
        click.option("--runtime", type=click.Choice(_RUNTIMES),
                     default="supported", show_default=True,
                     help="the space searched: supported = the union of megatron, deepspeed, torchtitan and nanotron (each "
                          "plan priced as the runtime that runs it); one of them; ideal = no runtime's limits "
                          "(what-if: no runtime may run its plans; 'any' is its old name). On a mixed cluster "
                          "every space has one pipeline over its pools where a runtime of it runs one "
                          "(Megatron-LM, torchtitan), and ideal also data-parallel replicas over pools with batch "
                          "shares"),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return _run_options(f)


def _run_options(f):
    """The MoE, fp8-recipe, gradient-reduction, loss-fusion and tp-overlap flags, handed to the command as one
    `options` (RunOptions)."""
    import functools

    from planner.spec.training import RunOptions

    @functools.wraps(f)
    def command(*args, moe_dispatcher, ep_overlap, moe_folding, fp8_recipe, grad_reduce, fp8_param_gather, loss_fusion,
                moe_imbalance, no_tp_overlap, optimizer_states, recompute_modules, **kwargs):
        if recompute_modules is not None:
            from planner.errors import SpecError
            from planner.spec.training import checked_modules
            if not checked_modules(recompute_modules):
                raise SpecError(f"--recompute-modules {recompute_modules!r} names no module (one or more of "
                                f"{', '.join(RECOMPUTE_MODULES)}, comma-separated)")
        return f(*args, options=RunOptions(dispatcher=moe_dispatcher or "", ep_overlap=ep_overlap, folding=moe_folding,
                                           fp8_recipe=fp8_recipe or "", grad_reduce=grad_reduce or "",
                                           fp8_param_gather=fp8_param_gather, loss_fusion=loss_fusion or "",
                                           moe_imbalance=1.0 if moe_imbalance is None else moe_imbalance,
                                           no_tp_overlap=no_tp_overlap, optimizer_states=optimizer_states or "",
                                           recompute_modules=recompute_modules or ""),
                 **kwargs)

    opts = [
        click.option("--moe-dispatcher", type=click.Choice(["alltoall", "dedup"]), default=None,
                     help="how MoE tokens reach their experts: one copy per expert (alltoall) or per node and "
                          "rank (dedup: Megatron's flex dispatcher)  [default: the runtime's]"),
        click.option("--ep-overlap", is_flag=True, default=False,
                     help="overlap expert all-to-alls with another micro-batch's computation (Megatron's "
                          "--overlap-moe-expert-parallel-comm: ep > 1, interleaved stages, no full recompute)"),
        click.option("--moe-folding/--no-moe-folding", default=None,
                     help="expert layers without tensor parallelism, ep carved from tp x cp x dp (Megatron's "
                          "MoE parallel folding, --expert-tensor-parallel-size 1), or with the dense tp  "
                          "[default: both, where the runtime folds]"),
        click.option("--fp8-recipe", type=click.Choice(list(FP8_RECIPES)), default=None,
                     help="how fp8 tensors are scaled (Megatron's --fp8-recipe): its quantisation kernels are "
                          "priced  [default: the runtime's: "
                          + ", ".join(f"{n} {RUNTIME_RULES[n].fp8_recipes[0]}" for n in TARGETS
                                      if "fp8" in RUNTIME_RULES[n].precisions) + "]"),
        click.option("--grad-reduce", type=click.Choice(list(GRAD_REDUCES)), default=None,
                     help="the dtype of the data-parallel gradient reduction and gradient buffers: bf16 halves "
                          "their traffic and memory (Megatron's --grad-reduce-in-bf16); bf16 and fp8 runs only  "
                          "[default: fp32; fp16 runs reduce in fp16]"),
        click.option("--optimizer-states", type=click.Choice(list(OPTIMIZER_STATES)), default=None,
                     help="the dtype of Adam's two moments: bf16 keeps 6 bytes a parameter in a bf16 run, 8 in "
                          "fp8, not 12, under a sharded optimizer (Megatron's --use-precision-aware-optimizer "
                          "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, with the distributed optimizer)  "
                          "[default: fp32]"),
        click.option("--recompute-modules", default=None, metavar="M[,M...]",
                     help="what selective recomputation recomputes, of " + ", ".join(RECOMPUTE_MODULES)
                          + " (Megatron's --recompute-granularity selective --recompute-modules): each drops "
                            "its activations and runs again in backward  [default: core_attn]"),
        click.option("--fp8-param-gather", is_flag=True, default=False,
                     help="fp8 runs: keep the layers' weights in fp8 and all-gather them so, 1 byte a parameter "
                          "(Megatron's --fp8-param-gather, with the distributed optimizer)"),
        click.option("--moe-imbalance", type=_Finite(), default=None, metavar="F",
                     help="MoE routing: the most loaded expert-parallel rank's token-expert pairs over a "
                          "balanced share (1 to 8); that rank's expert GEMMs, all-to-alls and activations set "
                          "the pace  [default: 1, balanced, as the published benchmark runs force it]"),
        click.option("--loss-fusion", type=click.Choice(list(LOSS_FUSIONS)), default=None,
                     help="a fused cross-entropy loss (Megatron's --cross-entropy-loss-fusion with "
                          "--cross-entropy-fusion-impl native or te): its traffic and memory on the last stage "
                          "are priced  [default: the runtime's own loss]"),
        click.option("--no-tp-overlap", is_flag=True, default=False,
                     help="keep the tensor-parallel collectives exposed: a launch without Megatron's "
                          "--tp-comm-overlap (Transformer Engine's userbuffers), which the export then leaves off  "
                          "[default: hidden behind the GEMMs where the runtime can]"),
    ]
    for opt in reversed(opts):
        command = opt(command)
    return command


def _read_plan(path) -> dict:
    """A plan file, and on stderr what its reader should know if its schema is an older one."""
    from planner.plan import old_schema_note, read_plan
    doc = read_plan(path)
    note = old_schema_note(doc, path)
    if note:
        from planner import report
        report.err.print(f"note: {note}", markup=False, highlight=False)
    return doc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
def cli() -> None:
    """Auto-parallel planner for distributed training: specs in, priced strategies searched, a plan out."""


def _headroom_option(default: float):
    return click.option("--memory-headroom", type=_Finite(0.0, 1.0, max_open=True), default=default,
                        show_default=True, help="share of each GPU's memory kept free")


@cli.command()
@_setup_options
@_strategy_options
@_headroom_option(0.0)
@click.option("--json", "as_json", is_flag=True, help="print exactly one plan document on stdout")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the plan file here")
def estimate(model_ref, cluster_ref, gpus, global_batch, seq_len, precision, attention, runtime, options,
             memory_headroom, as_json, output, **knobs):
    """Price exactly the strategy given (unset knobs take documented defaults)."""
    from planner import report
    from planner.errors import SpecError
    from planner.plan import dumps, write_atomic
    from planner.planning import estimate_plan
    from planner.spec.hardware import load_cluster
    from planner.spec.model import load_model

    model = load_model(model_ref)
    cluster = load_cluster(cluster_ref)
    try:
        gpus = int(gpus)
    except ValueError:
        raise SpecError(f"--gpus {gpus!r}: estimate prices one GPU count (plan sweeps lists and ranges)") from None
    constraints = {k: v for k, v in knobs.items() if v is not None}
    plan = estimate_plan(model, cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                         precision=precision, attention=attention, runtime=runtime, constraints=constraints,
                         memory_headroom=memory_headroom, options=options)
    text = dumps(plan)
    if output:
        write_atomic(output, text)
    if as_json:
        click.echo(text, nl=False)
    else:
        report.estimate_table(plan)
        if output:
            report.err.print(f"plan written to {output}", markup=False, highlight=False)


@cli.command()
@click.option("--runs", "runs_file", type=click.Path(dir_okay=False), help="runs YAML (default: the bundled calibration set)")
@click.option("--no-loso", is_flag=True, help="skip the leave-one-source-out refits")
@click.option("--plans", "with_plans", is_flag=True,
              help="also search each run's setup and compare the plan with the published configuration")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document on stdout")
@click.option("--save-residuals", "residuals_file", type=click.Path(dir_okay=False),
              help="write the out-of-sample errors (the plans' bands read planner/data/residuals.json)")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="draw predicted against published step times, the checks' errors in their bands and the "
                   "memory peaks to FILE.png or FILE.svg (needs the plot extra)")
def validate(runs_file, no_loso, with_plans, as_json, residuals_file, plot_file):
    """Predicted vs published step times: per-run error, MAPE, leave-one-source-out.

    Without --runs: the bundled calibration set, then the bundled out-of-sample checks."""
    import json

    from planner import report
    from planner.plan import rounded
    from planner.runs import CHECKS, load_runs
    from planner.validate import summary
    from planner.validate import validate as run_validation

    if plot_file:  # refuse a plot it cannot draw before the refits run
        from planner.plots import plot_format
        suffix = plot_format(plot_file)
    runs = load_runs(runs_file)
    checks = [] if runs_file else load_runs(CHECKS)
    with report.progress("validating") as step:
        result = run_validation(runs, loso=not no_loso, checks=checks, plans=with_plans, progress=step)
    doc = rounded(summary(result))
    if residuals_file:
        from planner.bands import residuals_json
        from planner.plan import write_atomic
        from planner.validate import memory_residuals, residuals
        write_atomic(residuals_file, residuals_json(residuals(result), memory_residuals(result)))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        report.validation_table(doc)
    if plot_file:
        from planner.plan import write_atomic
        from planner.plots import validation_figure
        write_atomic(plot_file, validation_figure(doc, suffix))
        report.err.print(f"plot written to {plot_file}", markup=False, highlight=False)


@cli.command()
@click.option("--runs", "runs_file", type=click.Path(dir_okay=False), help="runs YAML (default: the bundled calibration set)")
@click.option("--cluster", "cluster_name", help="fit the runs of this cluster (needed when the file has several)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="cluster YAML to write")
def calibrate(runs_file, cluster_name, output):
    """Fit a cluster's efficiency parameters to measured runs and write the cluster preset."""
    from pathlib import Path

    from planner import report
    from planner.calibrate import efficiency_yaml, fit, with_efficiency
    from planner.errors import SpecError
    from planner.plan import write_atomic
    from planner.presets import resolve
    from planner.runs import BUNDLED, load_runs

    runs = load_runs(runs_file)
    names = sorted({r.cluster.name for r in runs})
    if cluster_name is None and len(names) > 1:
        raise SpecError(f"runs cover several clusters ({', '.join(names)}); choose one with --cluster")
    cluster_name = cluster_name or names[0]
    chosen = [r for r in runs if r.cluster.name == cluster_name]
    if not chosen:
        raise SpecError(f"no run uses cluster {cluster_name!r} (runs use: {', '.join(names)})")
    with report.progress("fitting") as step:
        step(0, 1, f"fitting {cluster_name} on {len(chosen)} runs")
        result = fit(chosen)
    try:
        base = resolve(cluster_name, "hardware/clusters", "cluster").read_text()
    except SpecError:
        import yaml
        base = yaml.safe_dump({k: v for k, v in chosen[0].cluster.to_dict().items() if k != "efficiency"}, sort_keys=False)
    label = Path(runs_file).name if runs_file else BUNDLED.name
    write_atomic(Path(output), with_efficiency(base, efficiency_yaml(result, label)))
    report.fit_table(result)
    report.err.print(f"cluster preset written to {output}", markup=False, highlight=False)


@cli.command()
@_setup_options
@_strategy_options
@click.option("--solver", type=click.Choice(["exact", "highs", "cbc"]), default="exact", show_default=True,
              help="how the per-stage recompute counts are chosen: exact (by the problem's structure, no "
                   "solver), or the same model as an ILP (HiGHS in process; CBC as a subprocess)")
@click.option("--time-limit", "time_limit_s", type=_Finite(0.0, min_open=True), default=10.0, show_default=True,
              help="seconds per ILP solve (highs, cbc)")
@click.option("--top", type=click.IntRange(0, 50), default=None,
              help="runners-up to keep  [default: 3; 0 per count of a sweep]")
@click.option("--ranks", "show_ranks", is_flag=True, help="also list the rank groups of the plan")
@_headroom_option(DEFAULT_HEADROOM)
@click.option("--json", "as_json", is_flag=True, help="print exactly one JSON document on stdout")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the plan file here (atomically)")
@click.option("--dask", help="run a sweep on the Dask cluster at this scheduler address (the dask extra)")
def plan(model_ref, cluster_ref, gpus, global_batch, seq_len, precision, attention, runtime, options,
         solver, time_limit_s, top, show_ranks, memory_headroom, as_json, output, dask, **knobs):
    """Search the strategy space and write the best plan (strategy flags are constraints)."""
    from planner import report
    from planner.errors import InfeasibleError
    from planner.plan import dumps, sweep_document, write_atomic
    from planner.planning import make_plan, sweep
    from planner.spec.hardware import load_cluster
    from planner.spec.model import load_model
    from planner.spec.training import parse_gpu_counts

    model = load_model(model_ref)
    cluster = load_cluster(cluster_ref)
    counts = parse_gpu_counts(gpus, *cluster.count_unit)
    constraints = {k: v for k, v in knobs.items() if v is not None}
    one_count = len(counts) == 1  # '8', '8,8' or '8-8': one plan, not a sweep of one
    if top is None:
        top = 3 if one_count else 0  # a sweep answers how many GPUs: one plan per count
    request = dict(model=model, cluster=cluster, global_batch=global_batch, seq_len=seq_len,
                   precision=precision, attention=attention, runtime=runtime, constraints=constraints,
                   solver=solver, time_limit_s=time_limit_s, top=top, memory_headroom=memory_headroom,
                   options=options)
    if one_count:
        if dask:
            report.err.print("note: --dask distributes the counts of a sweep; one GPU count is searched here",
                             markup=False, highlight=False)
        with report.progress("searching", delay_s=1.0) as step:
            doc = make_plan(gpus=counts[0], progress=step, **request)
    else:
        with report.progress("sweeping", delay_s=1.0) as step:
            entries = sweep(request, counts, progress=step, dask=dask)
        doc = sweep_document(entries)
        if not any("plan" in e for e in entries):
            raise InfeasibleError("no GPU count of the sweep has a feasible plan: "
                                  + "; ".join(f"{e['gpus']}: {e['infeasible']}" for e in entries[:5]))
    text = dumps(doc)
    if output:
        write_atomic(output, text)
    if as_json:
        click.echo(text, nl=False)
    elif doc["schema"] == "planner.sweep/v1":
        report.sweep_table(doc)
    else:
        report.plan_table(doc)
        if show_ranks:
            report.ranks_table(doc)
    if output and not as_json:
        report.err.print(f"written to {output}", markup=False, highlight=False)




@cli.command()
@click.option("--model", "-m", "model_ref", required=True, help="preset name, our YAML, or a config.json")
@click.option("--cluster", "-c", "cluster_refs", required=True, multiple=True,
              help="preset name or cluster YAML (repeat for several)")
@click.option("--gpus", required=True, help="GPU count, list 512,1024 or range 512-4096")
@click.option("--global-batch", "global_batches", type=click.IntRange(1, MAX_GLOBAL_BATCH), multiple=True,
              help="sequences per step (repeat for several; or --batch-schedule)")
@click.option("--batch-schedule", "schedule_text",
              help="batch and sequence phases BATCHxSEQ:UNTIL_TOKENS,...,BATCHxSEQ (the last runs to --tokens), "
                   "e.g. Llama 3's 1024x4096:252e6,1024x8192:2.87e12,2048x8192")
@click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), help="sequence length (default: the model's)")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8"]), default="bf16", show_default=True)
@click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash", show_default=True)
@click.option("--runtime", type=click.Choice(_RUNTIMES), default="supported", show_default=True)
@_run_options
@_strategy_options
@click.option("--tokens", type=float, help="tokens to train on (or --steps)")
@click.option("--steps", type=click.IntRange(1, None), help="optimizer steps to run (or --tokens)")
@click.option("--gpu-hour-price", type=float, help="price of one GPU-hour (else the cluster's price_per_gpu_hour)")
@click.option("--pue", type=float, help="power usage effectiveness (else the cluster's pue, else 1)")
@click.option("--failure-rate", type=float, default=None,
              help="interruptions per GPU-hour  [default: Llama 3 405B's, Dubey et al. 2024]")
@click.option("--storage-gbps", type=float, default=None, help="aggregate checkpoint write GB/s  [default: 2000]")
@click.option("--storage-node-gbps", type=float, default=None, help="checkpoint write GB/s per node  [default: 25]")
@click.option("--async-checkpoint", is_flag=True, help="checkpoints block only for the copy out of GPU memory")
@click.option("--host-copy-gbps", type=float, default=None, help="device-to-host GB/s per GPU  [default: 25]")
@click.option("--restart-s", type=float, default=None, help="seconds from a failure to training again  [default: 600]")
@_headroom_option(DEFAULT_HEADROOM)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the CSV or JSON here (atomically)")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="draw time and cost against GPUs to FILE.png or FILE.svg (needs the plot extra)")
@click.option("--dask", help="run the sweeps on the Dask cluster at this scheduler address (the dask extra)")
def forecast(model_ref, cluster_refs, gpus, global_batches, schedule_text, seq_len, precision, attention, runtime,
             tokens, steps,
             gpu_hour_price, pue, failure_rate, storage_gbps, storage_node_gbps, async_checkpoint, host_copy_gbps,
             restart_s, memory_headroom, fmt, output, plot_file, dask, options, **knobs):
    """A whole training run: days, GPU-hours, cost, energy and goodput under failures, per
    cluster, GPU count and batch (the best plan's step time; planner/forecast.py)."""
    import json

    from planner import report
    from planner.errors import SpecError
    from planner.forecast import FAILURE_PRESET, RunInputs, csv_text, forecast_document
    from planner.plan import rounded, write_atomic
    from planner.spec.hardware import load_cluster
    from planner.spec.model import load_model

    if plot_file:  # refuse a plot it cannot draw before the sweep runs
        from planner.plots import plot_format
        suffix = plot_format(plot_file)
    if bool(global_batches) == bool(schedule_text):
        raise SpecError("forecast needs --global-batch or --batch-schedule (one of them)")
    from planner.forecast import parse_schedule
    schedule = parse_schedule(schedule_text) if schedule_text else None
    model = load_model(model_ref)
    clusters = [load_cluster(ref) for ref in cluster_refs]
    given = {"failure_rate_per_gpu_hour": failure_rate, "storage_aggregate_GBps": storage_gbps,
             "storage_node_GBps": storage_node_gbps, "host_copy_GBps": host_copy_gbps, "restart_s": restart_s}
    inputs = RunInputs(tokens=tokens, steps=steps, price_per_gpu_hour=gpu_hour_price, pue=pue,
                       async_checkpoint=async_checkpoint,
                       failure_events=FAILURE_PRESET["events"] if failure_rate is None else None,
                       given=frozenset(k for k, v in given.items() if v is not None),
                       **{k: v for k, v in given.items() if v is not None})
    with report.progress("forecasting", delay_s=1.0) as step:
        doc = rounded(forecast_document(model, clusters, gpus, list(global_batches), seq_len, precision, attention,
                                        runtime, inputs, memory_headroom, progress=step, schedule=schedule,
                                        dask=dask, constraints={k: v for k, v in knobs.items() if v is not None},
                                        options=options))
    text = csv_text(doc) if fmt == "csv" else json.dumps(doc, sort_keys=True, indent=2) + "\n"
    if output:
        write_atomic(output, text)
    if plot_file:
        from planner.plots import forecast_figure
        write_atomic(plot_file, forecast_figure(doc, suffix))
        report.err.print(f"plot written to {plot_file}", markup=False, highlight=False)
    if fmt == "table":
        report.forecast_table(doc)
    elif not output:
        click.echo(text, nl=False)
    if output:
        report.err.print(f"written to {output}", markup=False, highlight=False)


@cli.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the rank groups as JSON on stdout")
def ranks(plan_file, as_json):
    """List the explicit rank groups of a plan (tp, cp, ep, dp, pp)."""
    import json

    from planner import report
    from planner.plan import rank_groups_of

    doc = _read_plan(plan_file)
    groups = rank_groups_of(doc)
    if as_json:
        click.echo(json.dumps(groups, indent=2, sort_keys=True))
    else:
        report.ranks_table(doc, groups)


@cli.command()
@click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True, help="runs per scenario (median)")
@click.option("--quick", is_flag=True, help="only the single-count scenarios, one run each, no depth ladder")
@click.option("--json", "as_json", is_flag=True, help="print the table as JSON on stdout")
def bench(repeat, quick, as_json):
    """Time the search on the standard scenarios and show the size of the space it covered."""
    import json
    from dataclasses import asdict

    from planner import report
    from planner.bench import (DEPTH_GROWTH, DEPTH_TARGET_S, SCENARIOS, TARGET_S, depth_growth, depth_scenarios,
                               plan_command_wall_s, run_scenario)

    rows = []
    scenarios = [s for s in SCENARIOS if not (quick and "-" in s[3])]
    ladder = () if quick else depth_scenarios()
    with report.progress("benchmarking") as step:
        for k, scenario in enumerate((*scenarios, *ladder)):
            step(k, len(scenarios) + len(ladder), scenario[0])
            rows.append(run_scenario(*scenario, repeats=1 if quick else repeat))
        step(len(scenarios) + len(ladder), len(scenarios) + len(ladder), "planner plan command (wall)")
        wall = plan_command_wall_s(1 if quick else repeat)
    depth = rows[len(scenarios):]
    doc = {"schema": "planner.bench/v1", "target_s": TARGET_S, "scenarios": [asdict(r) for r in rows[:len(scenarios)]],
           "plan_command_405b_wall_s": wall}
    if depth:
        doc["depth"] = {"scenarios": [asdict(r) for r in depth], "target_s": DEPTH_TARGET_S,
                        "growth_per_doubling": depth_growth(depth), "target_growth": DEPTH_GROWTH}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        report.bench_table(doc)


@cli.command()
def schema():
    """Print the JSON Schema of planner.plan/v2 (the plans this version writes)."""
    import json

    from planner.schema import PLAN_SCHEMA
    click.echo(json.dumps(PLAN_SCHEMA, indent=2, sort_keys=True))


@cli.command("diff")
@click.argument("old_file", type=click.Path(dir_okay=False))
@click.argument("new_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the differences as JSON on stdout")
def diff_command(old_file, new_file, as_json):
    """Compare two plans: exit 0 when equivalent, 1 when they differ."""
    import json

    from planner import report
    from planner.compare import diff
    from planner.plan import rounded

    changes = diff(_read_plan(old_file), _read_plan(new_file))
    if as_json:
        click.echo(json.dumps(rounded({"equivalent": not changes, "changes": changes}), indent=2, sort_keys=True))
    else:
        report.diff_table(changes, old_file, new_file)
    sys.exit(1 if changes else 0)


@cli.command("check")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--tolerance", type=_Finite(0.0), default=0.02, show_default=True,
              help="allowed relative growth of the predicted step time")
@click.option("--refresh-presets", is_flag=True, help="re-resolve preset names from the installed presets first")
@click.option("--json", "as_json", is_flag=True, help="print the verdict as JSON on stdout")
def check_command(plan_file, tolerance, refresh_presets, as_json):
    """Re-plan from the plan's recorded inputs: exit 0 if unchanged, 1 if stale or regressed."""
    import json

    from planner import report
    from planner.plan import rounded
    from planner.planning import check_plan

    doc = _read_plan(plan_file)
    with report.progress("re-planning", delay_s=1.0):
        result = check_plan(doc, tolerance, refresh_presets)
    if as_json:
        out = {k: v for k, v in result.items() if k != "fresh"}
        click.echo(json.dumps(rounded(out), indent=2, sort_keys=True))
    else:
        report.check_lines(result, plan_file)
    sys.exit(0 if result["verdict"] == "ok" else 1)


@cli.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "runtime", type=click.Choice([*TARGETS, *OLDER_VERSIONS]),
              required=True, help="the runtime (its newest checked version; NAME@VERSION an older one)")
@click.option("--format", "fmt", help="megatron: lines|shell|launch; torchtitan: py; torchtitan@0.2: toml|cli")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write here (atomically) instead of stdout")
def export_command(plan_file, runtime, fmt, output):
    """Turn a plan into the configuration of a training runtime."""
    from planner.export import export
    from planner.plan import write_atomic

    text = export(_read_plan(plan_file), runtime, fmt)
    if output:
        write_atomic(output, text)
        from planner.report import err
        err.print(f"{runtime} configuration written to {output}", markup=False, highlight=False)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@cli.command("models")
def list_models() -> None:
    """List model presets."""
    from planner.presets import preset_names
    for name in preset_names("models"):
        click.echo(name)


@cli.command("hardware")
def list_hardware() -> None:
    """List GPU and cluster presets."""
    from planner.presets import preset_names
    for kind in ("hardware/gpus", "hardware/clusters"):
        for name in preset_names(kind):
            click.echo(f"{kind.split('/')[1][:-1]}\t{name}")


def main() -> None:
    """Entry point with the one error boundary: known errors become one red line and an exit code."""
    try:
        cli.main(standalone_mode=False)
    except PlannerError as e:
        if os.environ.get("PLANNER_DEBUG"):
            raise
        from planner.report import error_line
        error_line(str(e))
        sys.exit(e.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        from planner.report import error_line
        error_line("interrupted; nothing was written")
        sys.exit(130)
    except click.ClickException as e:
        from planner.report import error_line
        error_line(e.format_message() + (" (see --help)" if isinstance(e, click.UsageError) else ""))
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, never a traceback
        if os.environ.get("PLANNER_DEBUG"):
            raise
        from planner.report import error_line
        error_line(f"internal error: {type(e).__name__}: {e} (set PLANNER_DEBUG=1 for the traceback)")
        sys.exit(70)
