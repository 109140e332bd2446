"""Terminal presentation (rich). Everything a human reads is rendered here, on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

import sys

# A wide console when stderr is not a terminal (CI logs, pipes), so tables are not squeezed.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def estimate_table(plan: dict) -> None:
    st, pr = plan["strategy"], plan["prediction"]
    tr = plan["inputs"]["training"]
    title = (f"{plan['inputs']['model']['name']} on {tr['gpus']} x {plan['inputs']['cluster']['gpu']['name']} "
             f"({plan['inputs']['cluster']['name']}), global batch {tr['global_batch']}, seq {tr['seq_len']}, {tr['precision']}")
    knobs = (f"dp {st['dp']} tp {st['tp']} pp {st['pp']} cp {st['cp']} ep {st['ep']} vpp {st['vpp']} | "
             f"micro-batch {st['micro_batch']} x {st['num_microbatches']} | zero {st['zero']} | recompute {st['recompute']}"
             f"{' (' + str(st['recompute_layers']) + ' layers/stage)' if 'recompute_layers' in st else ''} | "
             f"SP {'on' if st['sequence_parallel'] else 'off'} | {st['schedule']}")
    err.print(f"[bold]{title}[/bold]")
    err.print(knobs)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    fits = "[green]fits[/green]" if pr["fits"] else f"[red]does NOT fit ({pr['capacity_gib']:.1f} GiB per GPU)[/red]"
    for label, value in (("step time", _fmt_s(pr["step_time_s"])), ("tokens/s", f"{pr['tokens_per_s']:,.0f}"),
                         ("model TFLOP/s per GPU", f"{pr['model_tflops_per_gpu']:.1f}"), ("MFU", f"{pr['mfu'] * 100:.1f} %"),
                         ("memory per GPU", f"{pr['peak_memory_gib']:.2f} GiB  {fits}")):
        summary.add_row(label, value)
    err.print(summary)
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
        err.print(f"[yellow]note:[/yellow] {note}")


def error_line(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", soft_wrap=True)


class progress:
    """A transient progress line on stderr for long work: `with progress('x') as step: step(i, n, what)`."""

    def __init__(self, label: str):
        from rich.progress import Progress
        self._progress = Progress(transient=True, console=err)
        self._label = label
        self._task = None

    def __enter__(self):
        self._progress.__enter__()
        self._task = self._progress.add_task(self._label, total=None)

        def step(done: int, total: int, what: str) -> None:
            self._progress.update(self._task, completed=done, total=total, description=what)
        return step

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)


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
        t.add_row(r["id"], str(r["gpus"]), _fmt_s(r["derived_step_time_s"]), _fmt_s(r["predicted_step_time_s"]),
                  f"{r['error'] * 100:+.1f} %", chosen, mem)
    return t


def validation_table(doc: dict) -> None:
    err.print(_runs_table("predicted vs published step time", doc["runs"]))
    s = Table(title="by source", title_justify="left")
    for col in ("source", "runs", "MAPE", "max |error|", "LOSO MAPE"):
        s.add_column(col, justify="left" if col == "source" else "right")
    loso = doc.get("loso", {}).get("sources", {})
    for name, v in doc["sources"].items():
        lo = f"{loso[name]['mape'] * 100:.2f} %" if name in loso else "-"
        s.add_row(name, str(v["runs"]), f"{v['mape'] * 100:.2f} %", f"{v['max_abs_error'] * 100:.1f} %", lo)
    err.print(s)
    line = f"all runs: MAPE {doc['mape'] * 100:.2f} %, max |error| {doc['max_abs_error'] * 100:.1f} %"
    if "loso" in doc:
        line += (f"; leave-one-source-out MAPE {doc['loso']['mape'] * 100:.2f} % "
                 f"(max {doc['loso']['max_abs_error'] * 100:.1f} %)")
    err.print(f"[bold]{line}[/bold]")
    if "checks" in doc:
        c = doc["checks"]
        err.print(_runs_table("out-of-sample checks (never fitted on)", c["runs"]))
        err.print(f"[bold]checks: MAPE {c['mape'] * 100:.2f} %, max |error| {c['max_abs_error'] * 100:.1f} %[/bold]")


def fit_table(result) -> None:
    t = Table(title=f"fitted efficiencies ({len(result.run_ids)} runs, rms log error {result.rms_log_error:.4f})",
              title_justify="left")
    t.add_column("parameter")
    t.add_column("value", justify="right")
    for name in result.efficiency.PARAMETERS:
        t.add_row(name, f"{getattr(result.efficiency, name):.4f}")
    err.print(t)
