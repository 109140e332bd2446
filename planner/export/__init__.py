"""Exporters: a plan document in, the launch configuration of one training runtime out.

Each runtime is one module with a pure function `export(plan, fmt) -> str` and a docstring that
lists what the runtime cannot run; such plans raise ExportError (exit code 2) with one line
naming the missing capability. Shared reading and checks live in export/common.py.
"""

from __future__ import annotations

from planner.errors import ExportError
from planner.export import deepspeed, megatron, nanotron, torchtitan, torchtitan_config
from planner.export.common import PlanView, check_pool_stages, check_record, check_shares, read
from planner.runtimes import RUNTIME_RULES, record_name

MODULES = {"megatron": megatron, "deepspeed": deepspeed, "torchtitan": torchtitan_config, "nanotron": nanotron,
           "torchtitan@0.2": torchtitan}
"""each runtime's exporter of its newest checked version (NAME), and of older versions users still
run (NAME@VERSION: same capability record, another config format)"""
EXPORTERS = {name: module.export for name, module in MODULES.items()}
FORMATS = {name: module.FORMATS for name, module in MODULES.items()}
"""formats of each runtime; the first is the default"""
CHECKED_AGAINST = {name: module.CHECKED_AGAINST for name, module in MODULES.items()}
"""the runtime version each exporter's output was checked against"""

__all__ = ["CHECKED_AGAINST", "EXPORTERS", "FORMATS", "ExportError", "export", "runnable_on"]


def export(plan: dict, runtime: str, fmt: str | None = None, view: PlanView | None = None) -> str:
    """The plan as `runtime` reads it, in `fmt` (default: the runtime's first format); `view`:
    the plan already read (export.common.read), where one plan goes to several runtimes."""
    if runtime not in EXPORTERS:
        raise ExportError(f"unknown runtime {runtime!r}; choose one of {', '.join(EXPORTERS)}")
    formats = FORMATS[runtime]
    if fmt is None:
        fmt = formats[0]
    if fmt not in formats:
        raise ExportError(f"{runtime} exports as {', '.join(formats)}; not {fmt!r}")
    v = read(plan) if view is None else view
    check_shares(v, record_name(runtime), MODULES[runtime].RUNTIME)
    check_pool_stages(v, record_name(runtime), MODULES[runtime].RUNTIME)
    text = EXPORTERS[runtime](plan, v, fmt)
    if runtime in RUNTIME_RULES:  # and at least what the runtime's record refuses (search and estimate read it)
        check_record(v, runtime, MODULES[runtime].RUNTIME)
    return text


def runnable_on(plan: dict) -> list[dict]:
    """The runtimes that execute the plan as planned: those whose exporter takes it without a
    refusal (each refusal is what that runtime cannot run), with the version the output was
    checked against. A plan lists them under runnable_on."""
    out = []
    v = read(plan)
    for runtime in EXPORTERS:
        try:
            export(plan, runtime, view=v)
        except ExportError:
            continue
        out.append({"runtime": runtime, "checked_against": CHECKED_AGAINST[runtime]})
    return out
