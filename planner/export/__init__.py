"""Exporters: a plan document in, the launch configuration of one training runtime out.

Each runtime is one module with a pure function `export(plan, fmt) -> str` and a docstring that
lists what the runtime cannot run; such plans raise ExportError (exit code 2) with one line
naming the missing capability. Shared reading and checks live in export/common.py.
"""

from __future__ import annotations

from planner.errors import ExportError
from planner.export import deepspeed, megatron, nanotron, torchtitan

EXPORTERS = {
    "megatron": megatron.export,
    "deepspeed": deepspeed.export,
    "torchtitan": torchtitan.export,
    "nanotron": nanotron.export,
}
FORMATS = {
    "megatron": megatron.FORMATS,
    "deepspeed": deepspeed.FORMATS,
    "torchtitan": torchtitan.FORMATS,
    "nanotron": nanotron.FORMATS,
}
"""formats of each runtime; the first is the default"""

CHECKED_AGAINST = {
    "megatron": megatron.CHECKED_AGAINST,
    "deepspeed": deepspeed.CHECKED_AGAINST,
    "torchtitan": torchtitan.CHECKED_AGAINST,
    "nanotron": nanotron.CHECKED_AGAINST,
}
"""the runtime version each exporter's output was checked against"""

__all__ = ["CHECKED_AGAINST", "EXPORTERS", "FORMATS", "ExportError", "export", "runnable_on"]


def export(plan: dict, runtime: str, fmt: str | None = None) -> str:
    """The plan as `runtime` reads it, in `fmt` (default: the runtime's first format)."""
    if runtime not in EXPORTERS:
        raise ExportError(f"unknown runtime {runtime!r}; choose one of {', '.join(EXPORTERS)}")
    formats = FORMATS[runtime]
    if fmt is None:
        fmt = formats[0]
    if fmt not in formats:
        raise ExportError(f"{runtime} exports as {', '.join(formats)}; not {fmt!r}")
    return EXPORTERS[runtime](plan, fmt)


def runnable_on(plan: dict) -> list[dict]:
    """The runtimes that execute the plan as planned: those whose exporter takes it without a
    refusal (each refusal is what that runtime cannot run), with the version the output was
    checked against. A plan lists them under runnable_on."""
    out = []
    for runtime, exporter in EXPORTERS.items():
        try:
            exporter(plan, FORMATS[runtime][0])
        except ExportError:
            continue
        out.append({"runtime": runtime, "checked_against": CHECKED_AGAINST[runtime]})
    return out
