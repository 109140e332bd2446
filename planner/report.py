"""Terminal presentation (rich). Everything a human reads is rendered here, on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

err = Console(stderr=True, highlight=False)


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
