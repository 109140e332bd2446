"""Terminal presentation (rich). Everything a human reads is rendered here, on stderr."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape as esc
from rich.table import Table

# A wide console when stderr is not a terminal (CI logs, pipes), so tables are not squeezed.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _fp8_recipe(training: dict) -> str:
    """The fp8 recipe a plan was priced with: the one asked for, else its runtime's default."""
    from planner.runtimes import fp8_recipe, record_name
    return fp8_recipe(record_name(training["runtime"]), training.get("fp8_recipe", ""))


def estimate_table(plan: dict) -> None:
    st, pr = plan["strategy"], plan["prediction"]
    tr, cluster = plan["inputs"]["training"], plan["inputs"]["cluster"]
    on = (f"{tr['gpus']} GPUs of {cluster['name']} (" + " + ".join(
          f"{p['used_gpus']} x {p['gpu']}" for p in plan.get("pools", []) if p["used_gpus"]) + ")"
          if "pools" in cluster else f"{tr['gpus']} x {cluster['gpu']['name']} ({cluster['name']})")
    title = (f"{plan['inputs']['model']['name']} on {on}, global batch {tr['global_batch']}, seq {tr['seq_len']}, "
             f"{tr['precision']}" + (f" ({_fp8_recipe(tr)} scaling)" if tr["precision"] == "fp8" else "")
             + (", expert all-to-alls overlapped" if tr.get("ep_overlap") else "")
             + (", experts folded (expert tp 1)" if tr.get("moe_folding") else "")
             + (", tp collectives not overlapped" if tr.get("no_tp_overlap") else "")
             + (f", Adam moments in {tr['optimizer_states']}" if tr.get("optimizer_states") else "")
             + (f", selective recompute of {' '.join(tr['recompute_modules'])}" if tr.get("recompute_modules") else ""))
    err.print(f"[bold]{esc(title)}[/bold]")
    err.print((f"pool {plan['strategy_pool']}: " if "strategy_pool" in plan else "") + _knobs(st), markup=False,
              highlight=False)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    fits = "[green]fits[/green]" if pr["fits"] else f"[red]does NOT fit ({pr['capacity_gib']:.1f} GiB per GPU)[/red]"
    rows = [("step time", _fmt_s(pr["step_time_s"]))]
    band = pr.get("band")
    if band:
        lo, hi = band["step_time_s"]
        rows.append(("measured, 10-90 %", f"{_fmt_s(lo)} - {_fmt_s(hi)}"))
    rows += [("tokens/s", f"{pr['tokens_per_s']:,.0f}"), ("model TFLOP/s per GPU", f"{pr['model_tflops_per_gpu']:.1f}"),
             ("MFU", f"{pr['mfu'] * 100:.1f} %")]
    if "hfu" in pr:
        rows.append(("HFU", f"{pr['hfu'] * 100:.1f} %"))
    rows.append(("memory per GPU" + (f" ({plan['strategy_pool']})" if "strategy_pool" in plan else ""),
                 f"{pr['peak_memory_gib']:.2f} GiB  {fits}"))
    for label, value in rows:
        summary.add_row(label, value)
    err.print(summary)
    if "runnable_on" in plan:
        names = ", ".join(r["runtime"] for r in plan["runnable_on"]) or "none of the supported runtimes"
        err.print(f"runs on: {names}", markup=False, highlight=False)
    training = plan["inputs"]["training"]
    if training["runtime"] in ("ideal", "any"):
        err.print("space: ideal (no runtime's limits; a what-if plan)", markup=False, highlight=False)
    elif "runtimes" in plan["inputs"]:
        err.print(f"space: the union of {', '.join(plan['inputs']['runtimes'])}; planned for {training['runtime']}",
                  markup=False, highlight=False)
    for entry in plan.get("best_per_runtime", []):
        if "strategy" in entry:
            gap = entry["step_time_s"] / pr["step_time_s"] - 1
            what = f"{_fmt_s(entry['step_time_s'])} ({gap * 100:+.1f} %)  {_knobs(entry['strategy'])}"
        else:
            what = f"no plan: {entry['why_not']}"
        err.print(f"  best on {entry['runtime']:<10} {what}", markup=False, highlight=False)
    if band:
        err.print(f"band: {band['low_error'] * 100:+.1f} % to {band['high_error'] * 100:+.1f} % of measured, "
                  f"from {band['rows']} out-of-sample runs ({band['basis']})", markup=False, highlight=False)
    time_t = Table(title="step time", title_justify="left")
    time_t.add_column("term")
    time_t.add_column("time", justify="right")
    time_t.add_column("share", justify="right")
    total = pr["step_time_s"]
    for k, v in pr["breakdown_s"].items():
        if v:
            time_t.add_row(k, _fmt_s(v), f"{v / total * 100:.1f} %")
    mem_t = Table(title="memory per GPU (peak stage)", title_justify="left")
    mem_t.add_column("term")
    mem_t.add_column("GiB", justify="right")
    for k, v in pr["memory_gib"].items():
        mem_t.add_row(k, f"{v:.2f}")
    err.print(time_t)
    err.print(mem_t)
    for note in plan.get("notes", []):
        err.print(f"[yellow]note:[/yellow] {esc(note)}")


def error_line(message: str) -> None:
    """One line on stderr: characters that would break or colour it (line breaks, controls, rich
    markup) are printed as their escapes."""
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in message)
    err.print(f"[red]error:[/red] {esc(text)}", soft_wrap=True)


class progress:
    """A transient progress bar on stderr for long work, shown only once the work has run longer
    than `delay_s`: `with progress('x') as step: step(i, n, what)`."""

    def __init__(self, label: str, delay_s: float = 0.0):
        import time

        from rich.progress import Progress
        self._progress = Progress(transient=True, console=err)
        self._label = label
        self._task = None
        self._delay_s = delay_s
        self._start = time.monotonic()
        self._shown = False

    def _show(self) -> None:
        if not self._shown:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=None)
            self._shown = True

    def __enter__(self):
        import time
        if self._delay_s <= 0:
            self._show()

        def step(done: int, total: int, what: str) -> None:
            if not self._shown and time.monotonic() - self._start >= self._delay_s:
                self._show()
            if self._shown:
                self._progress.update(self._task, completed=done, total=total or None, description=what)
        return step

    def __exit__(self, *exc):
        if self._shown:
            self._progress.stop()
        return False


def _knobs(st: dict) -> str:
    rec = st["recompute"] + (f" ({st['recompute_layers']} layers/stage)" if "recompute_layers" in st else "")
    return (f"dp {st['dp']} tp {st['tp']} pp {st['pp']} cp {st['cp']} ep {st['ep']} vpp {st['vpp']} | "
            f"micro-batch {st['micro_batch']} x {st['num_microbatches']} | zero {st['zero']}"
            + (f" over {st['dp_shard']} (hybrid, {st['dp'] // st['dp_shard']} replicas)" if st.get("dp_shard") else "")
            + f" | recompute {rec} | "
            f"SP {'on' if st['sequence_parallel'] else 'off'} | {st['schedule']}")


def plan_table(plan: dict) -> None:
    """The winner (as `estimate_table`), its stages, the runners-up and what the search did."""
    estimate_table(plan)
    stages = Table(title="pipeline stages", title_justify="left")
    on_pools = any("pool" in st for st in plan["stages"])
    for col in ("stage", *(("pool",) if on_pools else ()), "layers", "recompute layers", "time / micro-batch",
                "memory GiB"):
        stages.add_column(col, justify="left" if col == "pool" else "right")
    for st in plan["stages"]:
        layers = ", ".join(f"{a}-{b - 1}" for a, b in st.get("chunks", [st["layers"]]))
        stages.add_row(str(st["index"]), *((esc(st.get("pool", "")),) if on_pools else ()), layers,
                       str(st["recompute_layers"]), _fmt_s(st["time_per_microbatch_s"]), f"{st['memory_gib']:.1f}")
    err.print(stages)
    if plan.get("pools"):
        pools_table(plan)
    if plan["alternatives"]:
        alt = Table(title="runners-up", title_justify="left")
        with_runtime = any("runtime" in a for a in plan["alternatives"])
        for col in ("strategy", *(("runtime",) if with_runtime else ()), "step time", "memory GiB", "why not"):
            alt.add_column(col)
        for a in plan["alternatives"]:
            alt.add_row(esc(_knobs(a["strategy"])), *((esc(a.get("runtime", "")),) if with_runtime else ()),
                        _fmt_s(a["step_time_s"]), f"{a['peak_memory_gib']:.1f}", esc(a["why_not"]))
        err.print(alt)
    if "search" in plan:
        s = plan["search"]
        err.print(f"search: {s['considered']:,} candidates, {s['pruned_memory']:,} pruned by the memory floor, "
                  f"{s['pruned_bound']:,} by the time bound or dominance, {s['priced']:,} priced "
                  f"({s['dp_programmes']:,} DP programmes, {s['ilp_solves']:,} ILPs); "
                  + (f"batch shares: {s['share_splits']:,} splits, {s['share_bounds']:,} bounded, "
                     f"{s['share_searches']:,} searched; " if "share_splits" in s else "")
                  + (f"pipelines over pools: {s['pool_stage_candidates']:,} bounded, "
                     + (f"{s['pool_stage_pruned_memory']:,} proven not to fit, " if "pool_stage_pruned_memory" in s
                        else "")
                     + f"{s['pool_stage_programmes']:,} split DPs; " if "pool_stage_candidates" in s else "")
                  + ("proven optimal in this space" if s["proven_optimal"] else "[yellow]not proven optimal[/yellow]"))


def pools_table(plan: dict) -> None:
    """A mixed cluster's pools: GPUs, the GPUs the plan uses, the stages it holds of a pipeline
    over pools, each pool's best step alone, and where the plan spans several with batch shares, each pool's share of the batch (and its precision), its step on
    it, how busy that keeps it and its strategy."""
    shares = any("share" in p for p in plan["pools"])
    t = Table(title="pools", title_justify="left")
    staged = any("stages" in p for p in plan["pools"])
    for col in ("pool", "GPU", "GPUs", "used", *(("stages", "MFU") if staged else ()), "alone",
                *(("share", "step", "busy", "strategy") if shares else ())):
        t.add_column(col, justify="left" if col in ("pool", "GPU", "alone", "strategy") else "right")
    for p in plan["pools"]:
        alone = _fmt_s(p["step_time_s"]) if "step_time_s" in p else f"[red]{esc(p['why_not'])}[/red]"
        held = p.get("stages")
        row = [esc(p["name"]), esc(p["gpu"]), str(p["gpus"]), str(p["used_gpus"]) if p["used_gpus"] else "idle",
               *(((f"{held[0]}" if held[0] == held[1] else f"{held[0]}-{held[1]}") if held else "-",
                  f"{p['mfu'] * 100:.1f} %" if held and "mfu" in p else "-") if staged else ()),
               alone]
        if shares:
            sh = p.get("share")
            row += ([f"{sh['global_batch']} {sh['precision']}", _fmt_s(sh["step_time_s"]), f"{sh['busy'] * 100:.1f} %",
                     esc(_knobs(sh["strategy"]))] if sh else ["-", "-", "-", "-"])
        t.add_row(*row)
    err.print(t)


def _gpus_used(entry: dict) -> str:
    """A sweep entry's GPU count, and on a mixed cluster the GPUs and pools its plan runs on."""
    used = [p for p in entry["plan"].get("pools", []) if p["used_gpus"]]
    return str(entry["gpus"]) + (" (" + " + ".join(f"{p['used_gpus']} {p['name']}" for p in used) + ")" if used else "")


def sweep_table(doc: dict) -> None:
    t = Table(title="plans per GPU count", title_justify="left")
    for col in ("GPUs", "step time", "tokens/s", "MFU", "memory GiB", "runtime", "strategy"):
        t.add_column(col, justify="left" if col in ("runtime", "strategy") else "right")
    for e in doc["plans"]:
        if "plan" not in e:
            t.add_row(str(e["gpus"]), "-", "-", "-", "-", "-", f"[red]{esc(e['infeasible'])}[/red]")
            continue
        pr = e["plan"]["prediction"]
        t.add_row(_gpus_used(e), _fmt_s(pr["step_time_s"]), f"{pr['tokens_per_s']:,.0f}", f"{pr['mfu'] * 100:.1f} %",
                  f"{pr['peak_memory_gib']:.1f}", esc(e["plan"]["inputs"]["training"]["runtime"]),
                  esc(_knobs(e["plan"]["strategy"])))
    err.print(t)


def forecast_table(doc: dict) -> None:
    """The forecast's rows (one per cluster, GPU count and batch), the front marked *, then the
    diminishing returns and the assumptions."""
    t = Table(title=esc(f"forecast: {doc['inputs']['model']}"), title_justify="left")
    cols = ("", "cluster", "GPUs", "batch", "days (10-90 %)", "GPU-hours", "cost", "energy MWh", "goodput",
            "MFU", "dominant")
    for col in cols:
        t.add_column(col, justify="left" if col in ("cluster", "dominant") else "right")
    for r in doc["rows"]:
        if "infeasible" in r:
            t.add_row("", esc(r["cluster"]), str(r["gpus"]), str(r["global_batch"]), "-", "-", "-", "-", "-", "-",
                      f"[red]{esc(r['infeasible'])}[/red]")
            continue
        lo, hi = r["days_band"]
        t.add_row("*" if r["front"] else "", esc(r["cluster"]), str(r["gpus"]), str(r["global_batch"]),
                  f"{r['days']:.1f} ({lo:.1f}-{hi:.1f})", f"{r['gpu_hours']:,.0f}",
                  f"{r['cost']:,.0f}" if "cost" in r else "-",
                  f"{r['energy_mwh']:,.0f}" if "energy_mwh" in r else "-", f"{r['goodput'] * 100:.1f} %",
                  f"{r['mfu'] * 100:.1f} %", r["dominant"])
    err.print(t)
    for k in doc["diminishing_returns"]:
        err.print(f"{k['cluster']}, batch {k['global_batch']}: past {k['gpus']} GPUs, doubling them shortens the "
                  "run by less than 1.2x", markup=False, highlight=False)
    for note in doc["notes"]:
        err.print(f"[yellow]note:[/yellow] {esc(note)}")


def ranks_table(plan: dict, groups: dict | None = None) -> None:
    from planner.plan import rank_groups_of
    groups = groups or rank_groups_of(plan)
    t = Table(title=esc(f"rank groups (order {plan['placement']['order']}, innermost first)"), title_justify="left")
    t.add_column("group")
    t.add_column("count", justify="right")
    t.add_column("tier")
    t.add_column("first groups")
    tiers = plan["placement"]["tiers"]
    for dim, gs in groups.items():
        shown = " ".join(str(g) for g in gs[:4]) + (" ..." if len(gs) > 4 else "")
        t.add_row(dim, str(len(gs)), tiers.get(dim, "-"), shown)
    err.print(t)


def _runs_table(title: str, rows: list[dict]) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("run", "left"), ("GPUs", "right"), ("published", "right"), ("predicted", "right"),
                      ("error", "right"), ("unknown knobs priced at", "left"), ("memory", "right")):
        t.add_column(col, justify=just)
    for r in rows:
        chosen = ", ".join(f"{k}={v}" for k, v in r["chosen"].items())
        mem = f"{r['peak_memory_gib']:.1f} GiB" + ("" if r["fits"] else " [red]no fit[/red]")
        if "memory_error" in r:
            mem += f" ({r['memory_error'] * 100:+.1f}%)"
        t.add_row(esc(r["id"]), str(r["gpus"]), _fmt_s(r["derived_step_time_s"]), _fmt_s(r["predicted_step_time_s"]),
                  f"{r['error'] * 100:+.1f} %", chosen, mem)
    return t


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def validation_table(doc: dict) -> None:
    err.print(_runs_table("predicted vs published step time", doc["runs"]))
    s = Table(title="by source (error = predicted / published - 1; negative: predicted faster)", title_justify="left")
    for col in ("source", "runs", "MAPE", "bias", "max |error|", "LOSO MAPE", "LOSO bias"):
        s.add_column(col, justify="left" if col == "source" else "right")
    loso = doc.get("loso", {}).get("sources", {})
    for name, v in doc["sources"].items():
        lo = loso.get(name)
        s.add_row(esc(name), str(v["runs"]), f"{v['mape'] * 100:.2f} %", _pct(v["bias"]), f"{v['max_abs_error'] * 100:.1f} %",
                  f"{lo['mape'] * 100:.2f} %" if lo else "-", _pct(lo["bias"]) if lo else "-")
    err.print(s)
    line = f"all runs: MAPE {doc['mape'] * 100:.2f} %, bias {_pct(doc['bias'])}, max |error| {doc['max_abs_error'] * 100:.1f} %"
    if "loso" in doc:
        line += (f"; leave-one-source-out MAPE {doc['loso']['mape'] * 100:.2f} %, bias {_pct(doc['loso']['bias'])} "
                 f"(max {doc['loso']['max_abs_error'] * 100:.1f} %)")
    elif "loso_skipped" in doc:
        line += f"; leave-one-source-out: none ({doc['loso_skipped']})"
    err.print(f"[bold]{line}[/bold]")
    for name, e in doc.get("efficiencies", {}).items():
        fitted = ", ".join(f"{n} {e['values'][n]:.4g} in [{e['bounds'][n][0]:g}, {e['bounds'][n][1]:g}]" for n in e["fitted"])
        flag = f"; AT A BOUND: {', '.join(e['at_bound'])}" if e["at_bound"] else "; none at a bound"
        err.print(f"{name}: fitted {fitted or 'nothing'} ({e['source']}){flag}", markup=False, highlight=False)
    if "plans" in doc:
        t = Table(title="unconstrained plan vs the published configuration (same model)", title_justify="left")
        for col in ("run", "published config", "plan", "plan strategy", "at least as fast and fits"):
            t.add_column(col, justify="left" if col in ("run", "plan strategy") else "right")
        for r in doc["plans"]["runs"]:
            t.add_row(esc(r["id"]), _fmt_s(r["published_config_step_time_s"]),
                      _fmt_s(r["plan_step_time_s"]) if r["plan_step_time_s"] else "-", r.get("plan", "-"),
                      "yes" if r["plan_not_slower"] and r["plan_fits"] else "[red]no[/red]")
        err.print(t)
    if "checks" in doc:
        c = doc["checks"]
        err.print(_runs_table("out-of-sample checks (never fitted on)", c["runs"]))
        t = Table(title="checks by source and subset", title_justify="left")
        for col in ("source or subset", "runs", "MAPE", "bias", "max |error|"):
            t.add_column(col, justify="left" if col == "source or subset" else "right")
        for name, v in (*c["sources"].items(), *c["subsets"].items()):
            t.add_row(esc(name), str(v["runs"]), f"{v['mape'] * 100:.2f} %", _pct(v["bias"]), f"{v['max_abs_error'] * 100:.1f} %")
        err.print(t)
        eq = c["equal_source_weight"]
        err.print(f"[bold]checks: MAPE {c['mape'] * 100:.2f} %, bias {_pct(c['bias'])} over {len(c['runs'])} runs; "
                  f"each of {eq['sources']} sources weighted equally: MAPE {eq['mape'] * 100:.2f} %, bias {_pct(eq['bias'])}; "
                  f"{c['over_25_percent']} over 25 %; {c['inside_band'] * 100:.0f} % inside their band[/bold]")
        if "frozen" in c:
            fz, feq, sub = c["frozen"], c["frozen"]["equal_source_weight"], c["frozen"]["subsets"]
            kinds = "; ".join(f"{name} MAPE {sub[key]['mape'] * 100:.1f} %" for name, key in
                              (("fp8", "precision fp8"), ("MoE", "moe")) if key in sub)
            err.print(f"[bold]frozen checks ({fz['runs']} rows, frozen {fz['date']} at {fz['commit'][:7]}): "
                      f"MAPE {fz['mape'] * 100:.2f} %, bias {_pct(fz['bias'])}; each of {feq['sources']} sources "
                      f"weighted equally: MAPE {feq['mape'] * 100:.2f} %, bias {_pct(feq['bias'])}; "
                      f"{fz['over_25_percent']} over 25 %; {kinds}[/bold]")
        mem = c.get("memory", {"runs": 0})
        if mem["runs"]:
            err.print(f"[bold]memory: predicted peak against {mem['runs']} published peaks: MAPE {mem['mape'] * 100:.1f} %, "
                      f"bias {_pct(mem['bias'])}; {mem['within_10_percent']} within 10 %, {mem['under_5_percent']} more "
                      "than 5 % under[/bold]")


def fit_table(result) -> None:
    t = Table(title=f"fitted efficiencies ({len(result.run_ids)} runs, rms log error {result.rms_log_error:.4f})",
              title_justify="left")
    t.add_column("parameter")
    t.add_column("value", justify="right")
    for name in result.efficiency.PARAMETERS:
        t.add_row(name, f"{getattr(result.efficiency, name):.4f}")
    err.print(t)


def bench_table(doc: dict) -> None:
    t = Table(title=f"search speed in a fresh process (median; target {doc['target_s']:.0f} s per scenario)",
              title_justify="left")
    for col in ("scenario", "GPU counts", "candidates", "pruned (memory)", "pruned (bound, dominance)", "priced", "time",
                "best step", "proven"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for r in doc["scenarios"]:
        ok = "green" if r["median_s"] <= doc["target_s"] else "red"
        t.add_row(r["name"], str(r["counts"]), f"{r['considered']:,}", f"{r['pruned_memory']:,}",
                  f"{r['pruned_bound']:,}", f"{r['priced']:,}", f"[{ok}]{r['median_s']:.2f} s[/{ok}]",
                  _fmt_s(r["best_step_s"]) if r["best_step_s"] else "-", "yes" if r["proven_optimal"] else "no")
    err.print(t)
    err.print(f"planner plan, llama3-405b on 16384 GPUs, whole command: {doc['plan_command_405b_wall_s']:.2f} s wall "
              f"(target 2 s)")
    if "depth" in doc:
        d = doc["depth"]
        t = Table(title=f"depth (median; the deepest within {d['target_s']:.0f} s, at most "
                        f"{d['target_growth']:.1f}x per doubling)", title_justify="left")
        for col in ("scenario", "candidates", "priced", "time", "best step", "proven"):
            t.add_column(col, justify="left" if col == "scenario" else "right")
        for r in d["scenarios"]:
            t.add_row(r["name"], f"{r['considered']:,}", f"{r['priced']:,}", f"{r['median_s']:.2f} s",
                      _fmt_s(r["best_step_s"]) if r["best_step_s"] else "-", "yes" if r["proven_optimal"] else "no")
        err.print(t)
        ok = "green" if d["growth_per_doubling"] <= d["target_growth"] else "red"
        err.print(f"time per doubling of the layers: at most [{ok}]{d['growth_per_doubling']:.2f}x[/{ok}]")


def diff_table(changes: list[dict], old_name: str, new_name: str) -> None:
    if not changes:
        err.print(f"[green]equivalent[/green]: {esc(old_name)} and {esc(new_name)}")
        return
    t = Table(title=esc(f"{old_name} -> {new_name}: {len(changes)} difference(s)"), title_justify="left")
    for col in ("key", "old", "new", "change"):
        t.add_column(col, justify="left" if col == "key" else "right")
    for c in changes:
        pct = f"{c['change_pct']:+.2f} %" if "change_pct" in c else ""
        t.add_row(esc(c["key"]), esc(str(c["old"])), esc(str(c["new"])), pct)
    err.print(t)


def check_lines(result: dict, plan_name: str) -> None:
    colour = {"ok": "green", "stale": "yellow", "regressed": "red", "unrunnable": "red"}[result["verdict"]]
    err.print(f"[{colour}]{result['verdict']}[/{colour}]: {esc(str(plan_name))}: {esc(result['reason'])}")
    if result["verdict"] != "ok":
        diff_table(result["changes"], plan_name, "re-planned")
