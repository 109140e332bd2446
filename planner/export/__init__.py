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

__all__ = ["EXPORTERS", "FORMATS", "ExportError", "export"]


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
