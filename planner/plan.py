"""Plan documents (schema planner.plan/v2; v1 still read): build from an estimate, serialise
byte-stably.

Same inputs give a byte-identical file: keys sorted, floats rounded to 6 significant digits, no
timestamps. `inputs.sha256` hashes the canonical JSON of the other inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from planner import __version__
from planner.cost.memory import MEMORY_KEYS
from planner.bands import prediction_band
from planner.cost.step import StepEstimate
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup
from planner.units import bytes_to_gib, round_sig

SCHEMA = "planner.plan/v2"


def rounded(value):
    """Round every float in a JSON-like value to 6 significant digits."""
    if isinstance(value, float):
        return round_sig(value)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def memory_gib(mem) -> dict:
    return {k: bytes_to_gib(getattr(mem, k)) for k in MEMORY_KEYS}


def inputs_block(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, constraints: dict,
                 solver: dict, runtimes: list | None = None) -> dict:
    """The request; `runtimes`: the runtimes whose spaces' union was searched, where the request
    named none (training.runtime is then the one the plan was found for)."""
    inputs = {"model": model.to_dict(), "cluster": cluster.to_dict(), "training": setup.to_dict(),
              "constraints": constraints, "solver": solver}
    if runtimes is not None:
        inputs["runtimes"] = list(runtimes)
    canonical = json.dumps(rounded(inputs), sort_keys=True, separators=(",", ":"))
    inputs["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    return inputs


def strategy_block(s: Strategy, setup: TrainingSetup) -> dict:
    return s.to_dict(setup.global_batch)


def prediction_block(est: StepEstimate, band) -> dict:
    lo, hi = band.step_time_range_s(est.step_time_s)
    return {"step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s,
            "model_tflops_per_gpu": est.model_tflops_per_gpu, "mfu": est.mfu, "hfu": est.hfu,
            "peak_memory_gib": bytes_to_gib(est.peak_memory_bytes), "fits": est.fits,
            "capacity_gib": bytes_to_gib(est.capacity_bytes),
            "breakdown_s": dict(est.breakdown_s), "memory_gib": memory_gib(est.memory),
            "band": {"low_error": band.low, "high_error": band.high, "step_time_s": [lo, hi], "rows": band.rows,
                     "basis": band.basis}}


def slower_by(step_time_s: float, best_step_s: float) -> str:
    """How much slower a runner-up is than the plan, as its why_not says it."""
    gap = (step_time_s / best_step_s - 1) * 100
    return f"slower by {gap:.1f}%" if gap >= 0.1 else f"slower by {gap:.2g}%"


def alternative_entry(s: Strategy, setup: TrainingSetup, step_time_s: float, peak_memory_bytes: float, fits: bool,
                      best_step_s: float, capacity_bytes: float, runtime: str | None = None,
                      conventions: str = "the same conventions") -> dict:
    """A runner-up with a one-line reason it lost (`runtime`: the one it was found for, where the
    search covered several; `conventions`: what makes the plan the more conventional,
    space.conventional_reason, for one at least as fast that lost on the tie rule)."""
    from planner.search.space import TIE_TOLERANCE
    if not fits:
        why = f"does not fit by {bytes_to_gib(peak_memory_bytes - capacity_bytes):.1f} GiB"
    elif step_time_s <= best_step_s and conventions != "the same conventions":
        gap = (1 - step_time_s / best_step_s) * 100
        faster = "as fast" if step_time_s == best_step_s else f"faster by {gap:.2g}%"
        why = f"{faster}, within the {TIE_TOLERANCE:.0%} tie tolerance: the plan has {conventions}"
    elif step_time_s <= best_step_s:
        why = "as fast: an equal alternative"
    else:
        why = slower_by(step_time_s, best_step_s)
    entry = {"strategy": strategy_block(s, setup), "step_time_s": step_time_s,
             "peak_memory_gib": bytes_to_gib(peak_memory_bytes), "why_not": why}
    if runtime is not None:
        entry["runtime"] = runtime
    return entry


def build_plan(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, s: Strategy, est: StepEstimate,
               constraints: dict, solver: dict, alternatives: list | None = None, notes: list | None = None,
               search: dict | None = None, runtimes: list | None = None, per_runtime: list | None = None) -> dict:
    stages = []
    for st in est.stages:
        layers = [st.chunks[0][0], st.chunks[-1][1]] if st.chunks else [0, 0]
        stage = {"index": st.index, "layers": layers, "recompute_layers": st.recompute_layers,
                 "memory_gib": bytes_to_gib(st.memory.total), "time_per_microbatch_s": st.time_per_microbatch_s}
        if s.vpp > 1:
            stage["chunks"] = [list(c) for c in st.chunks]
        stages.append(stage)
    plan = {
        "schema": SCHEMA,
        "planner_version": __version__,
        "inputs": inputs_block(model, cluster, setup, constraints, solver, runtimes),
        "strategy": strategy_block(s, setup),
        "stages": stages,
        "placement": {"order": s.order, "tiers": dict(est.tiers)},
        "prediction": prediction_block(est, prediction_band(cluster)),
        "alternatives": alternatives or [],
        "notes": notes or [],
    }
    if search is not None:
        plan["search"] = search
    if per_runtime is not None:
        plan["best_per_runtime"] = per_runtime
    return rounded(plan)


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"


def write_atomic(path, text: str | bytes) -> None:
    """Write `text` as users expect of -o: '-' is stdout; a FIFO or a character device is written
    directly; a regular file (new, or through a symlink to it: the link stays) via a temporary
    file in its folder renamed over it, so a failed run leaves the old file whole. A new file
    gets the mode the umask gives (an existing one keeps its mode). A target that cannot be
    written (no such folder, read-only, a folder) is one SpecError line."""
    from planner.errors import SpecError
    if str(path) == "-":
        if isinstance(text, bytes):
            sys.stdout.buffer.write(text)
        else:
            sys.stdout.write(text)
        sys.stdout.flush()
        return
    shown = path
    path = Path(os.path.realpath(path))
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise SpecError(f"{shown}: cannot write ({e.strerror})") from None
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        try:
            with open(path, "wb" if isinstance(text, bytes) else "w") as f:
                f.write(text)
        except OSError as e:
            raise SpecError(f"{shown}: cannot write ({e.strerror})") from None
        return
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{shown}: is a folder, not a file")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        reason = "no such folder" if isinstance(e, FileNotFoundError) else e.strerror
        raise SpecError(f"{shown}: cannot write ({reason})") from None
    try:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise SpecError(f"{shown}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


SWEEP_SCHEMA = "planner.sweep/v1"


def sweep_document(entries: list[dict]) -> dict:
    """One plan per GPU count (infeasible counts with their reason)."""
    return {"schema": SWEEP_SCHEMA, "planner_version": __version__, "plans": entries}


def read_plan(path) -> dict:
    """A plan document from a file, validated against the schema (PlanFormatError naming the
    file and the key that is wrong)."""
    from planner.errors import PlanFormatError
    from planner.schema import SCHEMAS, check
    from planner.spec.fields import parse_json, read_text
    doc = parse_json(read_text(Path(path), PlanFormatError), path, PlanFormatError)
    if not isinstance(doc, dict):
        raise PlanFormatError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    if not isinstance(doc.get("schema"), str) or doc["schema"] not in SCHEMAS:
        raise PlanFormatError(f"{path}: schema {doc.get('schema')!r} is not a plan schema this planner reads "
                              f"({', '.join(SCHEMAS)})")
    try:
        check(doc, SCHEMAS[doc["schema"]])
    except PlanFormatError as e:
        raise PlanFormatError(f"{path}: {e}") from None
    _check_degrees(doc, path)
    return doc


def _check_degrees(doc: dict, path) -> None:
    """A plan's degrees fill its GPUs (dp*tp*pp*cp = gpus, at most limits.MAX_GPUS) and its
    expert-parallel size divides dp*cp (tp*dp*cp with folded experts): an edited plan that breaks
    them is refused by every reader (ranks would otherwise list groups of GPUs the plan does not
    have)."""
    from planner.errors import PlanFormatError
    from planner.limits import MAX_GPUS
    s, gpus = doc["strategy"], doc["inputs"]["training"]["gpus"]
    if "strategy_pool" in doc:  # batch shares over pools: the strategy is that pool's
        lead = [p for p in doc.get("pools", []) if p["name"] == doc["strategy_pool"] and "share" in p]
        if not lead:
            raise PlanFormatError(f"{path}: strategy_pool {doc['strategy_pool']!r} names no pool with a share")
        gpus = lead[0]["used_gpus"]
    if gpus > MAX_GPUS:
        raise PlanFormatError(f"{path}: inputs.training.gpus {gpus:,}: at most {MAX_GPUS:,}")
    product = s["dp"] * s["tp"] * s["pp"] * s["cp"]
    if product != gpus:
        raise PlanFormatError(f"{path}: strategy dp*tp*pp*cp = {product:,} does not fill the plan's {gpus:,} GPUs")
    folded = doc["inputs"]["training"].get("moe_folding", False)
    from planner.placement import expert_pool
    pool, named = expert_pool(s["tp"], s["cp"], s["dp"], 1 if folded else 0)
    if pool % s["ep"]:
        raise PlanFormatError(f"{path}: strategy ep {s['ep']} does not divide {named} = {pool}")


def old_schema_note(doc: dict, path) -> str | None:
    """What a reader of an older plan should know (None for a current one)."""
    if doc.get("schema") == SCHEMA:
        return None
    return (f"{path} is a {doc['schema']} plan (planner {doc.get('planner_version', '?')}): read as such; it has "
            f"no band, HFU or memory headroom, and re-planning it writes {SCHEMA}")


def rank_groups_of(doc: dict) -> dict:
    """Explicit rank groups of every parallel dimension of a plan."""
    from planner.placement import rank_groups
    from planner.placement import expert_degrees
    st = doc["strategy"]
    folded = doc["inputs"]["training"].get("moe_folding", False)
    degrees = expert_degrees(*(st[k] for k in ("tp", "cp", "dp", "pp", "ep")), 1 if folded else 0)
    return {dim: rank_groups(doc["placement"]["order"], degrees, dim) for dim in ("tp", "cp", "ep", "dp", "pp")}
