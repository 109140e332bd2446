"""Capacity planning: a whole training run from the best plan's step time (`planner forecast`).

Time. steps = ceil(tokens / (global batch x sequence length)) (or --steps); the failure-free
run takes steps x step time, W seconds of work.

Failures. Interruptions arrive as a Poisson process at `rate` per GPU-hour (FAILURE_PRESET:
Dubey et al. 2024, the Llama 3 405B run), so the job's mean time between failures is
M = 3600 / (rate x GPUs) s. Every tau seconds of work the job writes a checkpoint, which takes
delta (the plan's weights and optimizer states, 14 bytes a parameter, at the write bandwidth the
job gets, min(aggregate, nodes x per node); asynchronous writes block only for the copy out of
GPU memory). A failure costs the restart R and the work since the last checkpoint. With
failures possible at any moment (during checkpoints and restarts too) the expected wall time of
W seconds of work is exactly (Daly 2006, Future Gener. Comput. Syst. 22, eq. 13)

    T(tau) = M e^{R/M} (e^{(tau + delta)/M} - 1) W / tau,        goodput G = W / T,

largest where e^{(tau+delta)/M} (1 - tau/M) = 1, that is at
tau* = M (1 + W0(-e^{-(1 + delta/M)})), W0 the principal branch of Lambert's W (Young's and
Daly's sqrt(2 delta M) is its first order). tests/test_forecast.py checks tau* against a seeded
discrete-event simulation.

Money and energy. GPU-hours = wall time x GPUs; cost = GPU-hours x price per GPU-hour; energy =
GPU-hours x the GPU's rated power (tdp_w) x PUE, the convention of published model cards (no
utilisation model: the GPUs are taken at their rated power throughout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import lambertw

from planner.cost.memory import MASTER_BYTES, MOMENT_BYTES, WEIGHT_BYTES
from planner.errors import InfeasibleError, SpecError
from planner.limits import MAX_TOKENS
from planner.spec.pools import MixedCluster
from planner.spec.training import RunOptions


def checkpoint_bytes_per_param(optimizer_states: str = "") -> int:
    """16-bit weights, fp32 master weights and Adam's two moments in their dtype
    (memory.MOMENT_BYTES; '' = fp32), as distributed checkpoints of Megatron-LM and torchtitan hold
    them: 14 bytes, 10 with bf16 moments (Megatron's precision-aware optimizer saves its states in
    their own dtype and its master weights whole)."""
    return WEIGHT_BYTES + MASTER_BYTES + 2 * MOMENT_BYTES[optimizer_states or "fp32"]


FAILURE_PRESET = {
    "rate_per_gpu_hour": 419 / (54 * 24 * 16384),
    "events": 419,
    "source": "Dubey et al. 2024 (Llama 3 Herd of Models) sec. 3.3.4: 419 unexpected interruptions in a 54-day "
              "snapshot of pre-training on 16,384 H100 GPUs (466 in all, 47 planned)",
}
"""interruptions per GPU-hour from a published large run; comparisons with that run are in-sample"""
STORAGE_PRESET = {
    "aggregate_GBps": 2000.0,
    "source": "Dubey et al. 2024 sec. 3.3.1: Meta's Tectonic file system for Llama 3 sustains 2 TB/s (7 TB/s peak)",
}
NODE_WRITE_GBPS = 25.0
"""per-node checkpoint write bandwidth assumed where the cluster states none (two 100 Gb/s storage
NICs): an assumption, set --storage-node-gbps"""
HOST_COPY_GBPS = 25.0
"""device-to-host copy an asynchronous checkpoint blocks for, per GPU (PCIe Gen4 x16 carries 32 GB/s
a direction; about 25 in practice): an assumption, set --host-copy-gbps"""
RESTART_S = 600.0
"""time from a failure to training again (detect, reschedule, load the checkpoint): an assumption,
the source reports none; set --restart-s"""
BAND_Z = 1.2816
"""the 10th/90th percentile of a normal: the failure rate's band from its Poisson count"""


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a forecast needs besides the plan."""

    tokens: float | None = None
    steps: int | None = None
    price_per_gpu_hour: float | None = None
    pue: float | None = None
    """None: the cluster's (else 1)"""
    failure_rate_per_gpu_hour: float = FAILURE_PRESET["rate_per_gpu_hour"]
    failure_events: int | None = FAILURE_PRESET["events"]
    """how many events the rate was counted from (its band); None: no band"""
    storage_aggregate_GBps: float = STORAGE_PRESET["aggregate_GBps"]
    storage_node_GBps: float = NODE_WRITE_GBPS
    async_checkpoint: bool = False
    host_copy_GBps: float = HOST_COPY_GBPS
    restart_s: float = RESTART_S
    given: frozenset = frozenset()
    """the fields the user set (the others are the presets and assumptions above, said so)"""

    def preset(self, name: str) -> bool:
        """Whether `name` is still its preset or assumed default."""
        return name not in self.given

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise SpecError("forecast needs exactly one of --tokens and --steps")
        for name in ("tokens", "steps", "storage_aggregate_GBps", "storage_node_GBps", "host_copy_GBps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SpecError(f"{name.replace('_', '-')} must be a positive number, got {value!r}")
        for name in ("tokens", "steps"):
            value = getattr(self, name)
            if value is not None and value > MAX_TOKENS:
                raise SpecError(f"--{name} {value:g}: at most {MAX_TOKENS:g} (limits.MAX_TOKENS)")
        for name in ("price_per_gpu_hour", "failure_rate_per_gpu_hour", "restart_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise SpecError(f"{name.replace('_', '-')} must be a number >= 0, got {value!r}")
        if self.pue is not None and not (math.isfinite(self.pue) and self.pue >= 1.0):
            raise SpecError(f"pue must be a number >= 1, got {self.pue!r}")


def optimal_interval_s(mtbf_s: float, checkpoint_s: float) -> float:
    """tau* = M (1 + W0(-e^{-(1 + delta/M)})): the work between checkpoints that maximises goodput
    (module doc); infinite without failures."""
    if not math.isfinite(mtbf_s):
        return math.inf
    if checkpoint_s <= 0:
        return 0.0
    w = lambertw(-math.exp(-(1.0 + checkpoint_s / mtbf_s)), 0).real
    return mtbf_s * (1.0 + w)


def goodput(interval_s: float, mtbf_s: float, checkpoint_s: float, restart_s: float) -> float:
    """W / T(tau) = tau / (M e^{R/M} (e^{(tau+delta)/M} - 1)) (module doc); 1 without failures."""
    if not math.isfinite(mtbf_s):
        return 1.0
    if interval_s <= 0:
        return 0.0
    m, x = mtbf_s, (interval_s + checkpoint_s) / mtbf_s
    # in logarithms (log expm1(x) = x + log1p(-e^-x)): failures far more frequent than the restart
    # underflow to a goodput of 0 rather than overflow e^{R/M}
    return math.exp(math.log(interval_s / m) - restart_s / m - x - math.log1p(-math.exp(-x)))


def checkpoint_s(params: float, gpus: int, gpus_per_node: int, inputs: RunInputs,
                 shard_bytes: float | None = None, optimizer_states: str = "") -> float:
    """Seconds a checkpoint blocks training: the whole state (checkpoint_bytes_per_param of the
    plan's optimizer_states) at the bandwidth the job gets (min(aggregate, nodes x per node));
    asynchronous, the largest GPU's share of it (`shard_bytes`: its weights and optimizer states as
    the plan shards them; else an even share) copied out of its memory."""
    total = params * checkpoint_bytes_per_param(optimizer_states)
    if inputs.async_checkpoint:
        return (shard_bytes if shard_bytes is not None else total / gpus) / (inputs.host_copy_GBps * 1e9)
    nodes = -(-gpus // gpus_per_node)
    return total / (min(inputs.storage_aggregate_GBps, nodes * inputs.storage_node_GBps) * 1e9)


def _run(work_s: float, gpus: int, mtbf_s: float, ckpt_s: float, restart_s: float) -> dict:
    tau = optimal_interval_s(mtbf_s, ckpt_s)
    g = goodput(tau, mtbf_s, ckpt_s, restart_s)
    wall_s = work_s / g if g > 0 else math.inf
    return {"work_s": work_s, "interval_s": tau, "goodput": g, "wall_s": wall_s, "gpu_hours": wall_s * gpus / 3600}


def forecast_row(phases: list[tuple[dict, int]], params: float, gpus_per_node: int, tdp_w: float | None,
                 inputs: RunInputs, cluster_price: float | None = None, cluster_pue: float | None = None,
                 gpu: str | None = None) -> dict:
    """One configuration's whole run from its plan documents (planner.plan/v2), each with the
    steps it runs (one, or one per phase of a schedule): days, GPU-hours, cost, energy, tokens/s,
    MFU, goodput and the checkpoint interval, each with its band (the step times' 10-90 % bands;
    goodput also the failure rate's), and the dominant term; `gpu`: the GPUs' name where the
    plan's cluster names none (a mixed cluster's)."""
    plans = [p for p, _ in phases]
    tr = plans[-1]["inputs"]["training"]
    gpus = tr["gpus"]
    rate = inputs.failure_rate_per_gpu_hour
    spread = BAND_Z / math.sqrt(inputs.failure_events) if inputs.failure_events else 0.0

    def mtbf(scale: float) -> float:
        return 3600.0 / (rate * scale * gpus) if rate > 0 else math.inf

    # the plan's peak stage holds the most weights and optimizer states a GPU writes
    shard = max((p["prediction"]["memory_gib"]["weights"] + p["prediction"]["memory_gib"]["optimizer"]) * 1024**3
                for p in plans)
    ckpt = checkpoint_s(params, gpus, gpus_per_node, inputs, shard, tr.get("optimizer_states", ""))
    work = [p["prediction"]["step_time_s"] * n for p, n in phases]
    step_bands = [p["prediction"].get("band", {}).get("step_time_s", [p["prediction"]["step_time_s"]] * 2)
                  for p in plans]
    mid = _run(sum(work), gpus, mtbf(1.0), ckpt, inputs.restart_s)
    best = _run(sum(lo * n for (lo, _), (_, n) in zip(step_bands, phases)), gpus, mtbf(1 - spread), ckpt,
                inputs.restart_s)
    worst = _run(sum(hi * n for (_, hi), (_, n) in zip(step_bands, phases)), gpus, mtbf(1 + spread), ckpt,
                 inputs.restart_s)
    if not math.isfinite(worst["wall_s"]):
        raise InfeasibleError(f"a failure every {mtbf(1.0):.3g} s on {gpus} GPUs (restart {inputs.restart_s:g} s, "
                              f"checkpoint {ckpt:.3g} s): the run makes no progress")
    price = inputs.price_per_gpu_hour if inputs.price_per_gpu_hour is not None else cluster_price
    pue = inputs.pue if inputs.pue is not None else (cluster_pue if cluster_pue is not None else 1.0)
    tokens = sum(p["inputs"]["training"]["global_batch"] * p["inputs"]["training"]["seq_len"] * n for p, n in phases)
    share = [w / sum(work) for w in work]
    mfu = sum(p["prediction"]["mfu"] * s for p, s in zip(plans, share))  # weighted by each phase's time
    breakdown: dict = {}
    for p, s in zip(plans, share):
        step = p["prediction"]["step_time_s"]
        for k, v in p["prediction"]["breakdown_s"].items():
            breakdown[k] = breakdown.get(k, 0.0) + v / step * s

    def band(key, scale=1.0):
        return [best[key] * scale, worst[key] * scale]

    row = {
        "cluster": plans[-1]["inputs"]["cluster"]["name"], "gpu": gpu or plans[-1]["inputs"]["cluster"]["gpu"]["name"],
        "gpus": gpus, "global_batch": tr["global_batch"], "seq_len": tr["seq_len"], "runtime": tr["runtime"],
        "strategy": plans[-1]["strategy"], "steps": sum(n for _, n in phases), "tokens": tokens,
        "step_time_s": plans[-1]["prediction"]["step_time_s"], "days": mid["wall_s"] / 86400,
        "days_band": band("wall_s", 1 / 86400), "gpu_hours": mid["gpu_hours"], "gpu_hours_band": band("gpu_hours"),
        "tokens_per_s": tokens / mid["wall_s"], "tokens_per_s_band": [tokens / worst["wall_s"], tokens / best["wall_s"]],
        "mfu": mfu, "mfu_band": [mfu * mid["work_s"] / worst["work_s"], mfu * mid["work_s"] / best["work_s"]],
        "goodput": mid["goodput"], "goodput_band": [worst["goodput"], best["goodput"]],
        # without failures there is no MTBF and no interval to checkpoint at (null, not Infinity)
        "mtbf_h": _finite(mtbf(1.0) / 3600), "checkpoint_s": ckpt, "checkpoint_interval_s": _finite(mid["interval_s"]),
        "failures_expected": mid["wall_s"] / mtbf(1.0), "lost_gpu_hours": mid["gpu_hours"] * (1 - mid["goodput"]),
        **_losses(mid, ckpt, inputs.restart_s, mtbf(1.0)),
        "dominant": dominant_term(breakdown, mid["goodput"]),
    }
    if len(phases) > 1:
        row["phases"] = [{"global_batch": p["inputs"]["training"]["global_batch"],
                          "seq_len": p["inputs"]["training"]["seq_len"], "steps": n,
                          "step_time_s": p["prediction"]["step_time_s"], "runtime": p["inputs"]["training"]["runtime"],
                          "strategy": p["strategy"]} for p, n in phases]
    if price is not None:
        row["cost"], row["cost_band"] = mid["gpu_hours"] * price, band("gpu_hours", price)
    if tdp_w is not None:
        kwh = tdp_w / 1000 * pue
        row["energy_mwh"], row["energy_mwh_band"] = mid["gpu_hours"] * kwh / 1000, band("gpu_hours", kwh / 1000)
    return row


def _losses(run: dict, ckpt_s: float, restart_s: float, mtbf_s: float) -> dict:
    """Where the wall time beyond the work goes, in hours: writing checkpoints (one per interval
    of work), restarting (one per expected failure), and work done again (the rest)."""
    if not math.isfinite(run["interval_s"]):
        return {"checkpoint_h": 0.0, "restart_h": 0.0, "redone_h": 0.0}
    checkpoint = run["work_s"] / run["interval_s"] * ckpt_s
    restart = run["wall_s"] / mtbf_s * restart_s
    redone = max(0.0, run["wall_s"] - run["work_s"] - checkpoint - restart)
    return {"checkpoint_h": checkpoint / 3600, "restart_h": restart / 3600, "redone_h": redone / 3600}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a batch and sequence-length schedule: its global batch (sequences), sequence
    length, and the cumulative tokens at which it ends (None: the run's end)."""

    global_batch: int
    seq_len: int
    until_tokens: float | None = None


def parse_schedule(text: str) -> list[Phase]:
    """'BATCHxSEQ:UNTIL,BATCHxSEQ:UNTIL,...,BATCHxSEQ': each phase trains BATCH sequences of SEQ
    tokens a step until the run has seen UNTIL tokens in all (the last runs to --tokens). Llama
    3 405B's (Dubey et al. 2024 sec. 3.4.1): '1024x4096:252e6,1024x8192:2.87e12,2048x8192'."""
    phases, last = [], 0.0
    parts = text.split(",")
    for i, part in enumerate(parts):
        shape, _, until = part.strip().partition(":")
        try:
            batch, seq = (int(x) for x in shape.lower().split("x"))
            end = float(until) if until else None
        except ValueError:
            raise SpecError(f"--batch-schedule {text!r}: phase {part!r} is not BATCHxSEQ[:TOKENS]") from None
        if batch < 1 or seq < 1:
            raise SpecError(f"--batch-schedule {text!r}: phase {part!r} needs a positive batch and sequence length")
        if (end is None) != (i == len(parts) - 1):
            raise SpecError(f"--batch-schedule {text!r}: every phase but the last ends at a token count (BATCHxSEQ:TOKENS), "
                            "the last runs to --tokens")
        if end is not None and not (math.isfinite(end) and end > last):
            raise SpecError(f"--batch-schedule {text!r}: phase ends must grow (got {until} after {last:g})")
        phases.append(Phase(batch, seq, end))
        last = end if end is not None else last
    return phases


def steps_for(tokens: float, global_batch: int, seq_len: int) -> int:
    """Whole steps that train `tokens` (> 0) tokens: ceil(tokens / (global batch x sequence
    length)), at least one (a quotient below the smallest float would round to 0 steps)."""
    return max(1, math.ceil(tokens / (global_batch * seq_len)))


def phase_steps(phases: list[Phase], tokens: float) -> list[int]:
    """Steps each phase runs to reach `tokens` in all (a phase's tokens rounded up to whole steps)."""
    bounds = [0.0] + [p.until_tokens for p in phases[:-1]] + [tokens]
    if tokens <= bounds[-2]:
        raise SpecError(f"--tokens {tokens:g}: the schedule's last phase starts at {bounds[-2]:g} tokens")
    return [steps_for(b - a, p.global_batch, p.seq_len) for p, a, b in zip(phases, bounds, bounds[1:])]


TERMS = {"compute": ("compute", "recompute", "optimizer"), "bubble": ("bubble",),
         "exposed communication": ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed")}
"""the step's terms, grouped as forecast names what dominates a run"""


def dominant_term(breakdown_s: dict, goodput_fraction: float) -> str:
    """The largest share of a run's wall time: compute, pipeline bubble, exposed communication,
    or failures (the share goodput loses)."""
    step = sum(breakdown_s.values())
    shares = {name: sum(breakdown_s.get(k, 0.0) for k in keys) / step * goodput_fraction
              for name, keys in TERMS.items()}
    shares["failures"] = 1.0 - goodput_fraction
    return max(shares, key=shares.get)


def pareto_front(points: list[tuple[float, float] | None]) -> list[bool]:
    """Which points (time, cost; None: infeasible) no other point matches or beats in both with
    one strictly better: equal points are all on the front."""
    out = []
    for i, p in enumerate(points):
        if p is None:
            out.append(False)
            continue
        out.append(not any(q is not None and q[0] <= p[0] and q[1] <= p[1] and q != p for q in points))
    return out


def diminishing_return_gpus(rows: list[dict], ratio: float = 1.2) -> int | None:
    """The least GPU count past which doubling the GPUs shortens the run by less than `ratio`x,
    among rows of one cluster and batch that have a row at twice their count (None: none)."""
    days = {r["gpus"]: r["days"] for r in rows if "days" in r}
    for n in sorted(days):
        if 2 * n in days and days[n] / days[2 * n] < ratio:
            return n
    return None


SCHEMA = "planner.forecast/v1"


@dataclass(frozen=True, slots=True)
class _RanOn:
    """What a run's cost and energy read of the GPUs its plan uses."""

    gpu: str
    gpus_per_node: int
    tdp_w: float | None
    price_per_gpu_hour: float | None
    pue: float | None


def _ran_on(cluster, plan: dict) -> _RanOn:
    """The GPUs a plan runs on: the cluster itself, the pool of a mixed cluster that the plan uses
    (planning.plan_on_pools), or over several pools (batch shares, or one pipeline over them) their
    GPUs averaged by count
    (TDP and price; PUE by power), each known only where every pool states it."""
    if not isinstance(cluster, MixedCluster):
        used = [(cluster, 1)]
    else:
        by_name = {p.name: p.cluster for p in cluster.pools}
        used = [(by_name[e["name"]], e["used_gpus"]) for e in plan["pools"] if e["used_gpus"]]
    n = sum(k for _, k in used)

    def mean(values, weights):
        return None if any(v is None for v in values) else sum(v * w for v, w in zip(values, weights)) / sum(weights)

    tdp = mean([c.gpu.tdp_w for c, _ in used], [k for _, k in used])
    return _RanOn(gpu="+".join(c.gpu.name for c, _ in used), gpus_per_node=used[0][0].gpus_per_node, tdp_w=tdp,
                  price_per_gpu_hour=mean([c.price_per_gpu_hour for c, _ in used], [k / n for _, k in used]),
                  pue=mean([c.pue for c, _ in used], [k * (c.gpu.tdp_w or 1.0) for c, k in used]))


def _gpu_name(cluster) -> str:
    if not isinstance(cluster, MixedCluster):
        return cluster.gpu.name
    return "+".join(p.cluster.gpu.name for p in cluster.pools)


def forecast_document(model, clusters: list, gpus: str, global_batches: list[int], seq_len: int | None,
                      precision: str, attention: str, runtime: str, inputs: RunInputs,
                      memory_headroom: float, progress=None, schedule: list[Phase] | None = None,
                      dask: str | None = None, constraints: dict | None = None,
                      options: RunOptions = RunOptions()) -> dict:
    """planner.forecast/v1: one row per cluster x GPU count x global batch (the best plan's run,
    or why the configuration has none), the time-cost Pareto front marked, and per cluster and
    batch the GPU count past which doubling gives less than 1.2x."""
    from planner import __version__
    from planner.errors import PlannerError
    from planner.graph import model_params
    from planner.planning import make_plan, sweep
    from planner.spec.training import parse_gpu_counts

    params = float(model_params(model))
    rows, knees = [], []
    # each configuration's phases: (global batch, sequence, steps or None: from the tokens)
    if schedule:
        steps = phase_steps(schedule, inputs.tokens) if inputs.tokens is not None else None
        if steps is None:
            raise SpecError("--batch-schedule needs --tokens (the last phase runs to it)")
        configurations = [[(p.global_batch, p.seq_len, n) for p, n in zip(schedule, steps)]]
    else:
        seq = seq_len or model.seq_len
        configurations = [[(b, seq, inputs.steps if inputs.steps is not None else steps_for(inputs.tokens, b, seq))]
                          for b in global_batches]
    for cluster in clusters:
        counts = parse_gpu_counts(gpus, *cluster.count_unit)
        for phases in configurations:
            per_phase = []
            for batch, seq, _ in phases:
                request = dict(model=model, cluster=cluster, global_batch=batch, seq_len=seq, precision=precision,
                               attention=attention, runtime=runtime, constraints=dict(constraints or {}), top=0,
                               memory_headroom=memory_headroom, per_runtime=False, options=options)
                if len(counts) == 1:
                    try:
                        entries = [{"gpus": counts[0], "plan": make_plan(gpus=counts[0], **request)}]
                    except PlannerError as e:
                        entries = [{"gpus": counts[0], "infeasible": str(e)}]
                else:
                    entries = sweep(request, counts, progress=progress, dask=dask)
                per_phase.append(entries)
            series = []
            for k, n in enumerate(counts):
                found = [entries[k] for entries in per_phase]
                missing = [(ph, e) for ph, e in zip(phases, found) if "plan" not in e]
                if missing:
                    (batch, seq, _), e = missing[0]
                    why = e["infeasible"] if len(phases) == 1 else f"phase {batch}x{seq}: {e['infeasible']}"
                    row = {"cluster": cluster.name, "gpu": _gpu_name(cluster), "gpus": n,
                           "global_batch": phases[-1][0], "infeasible": why}
                else:
                    ran = _ran_on(cluster, found[-1]["plan"])
                    try:
                        row = forecast_row([(e["plan"], ph[2]) for ph, e in zip(phases, found)], params,
                                           ran.gpus_per_node, ran.tdp_w, inputs, ran.price_per_gpu_hour, ran.pue,
                                           ran.gpu)
                        row["cluster"] = cluster.name  # a mixed cluster's row: its name, the pool's GPU
                        series.append(row)
                    except InfeasibleError as e:
                        row = {"cluster": cluster.name, "gpu": ran.gpu, "gpus": n,
                               "global_batch": phases[-1][0], "infeasible": str(e)}
                rows.append(row)
            knee = diminishing_return_gpus(series)
            if knee is not None:
                knees.append({"cluster": cluster.name, "global_batch": phases[-1][0], "gpus": knee})
    timed = [r for r in rows if "days" in r]
    priced = bool(timed) and all("cost" in r for r in timed)
    points = [((r["days"], r["cost"] if priced else r["gpu_hours"]) if "days" in r else None) for r in rows]
    for row, on in zip(rows, pareto_front(points)):
        row["front"] = on
    notes = [f"failure rate {inputs.failure_rate_per_gpu_hour:.3g} per GPU-hour"
             + (f" ({FAILURE_PRESET['source']}; a forecast of that run is in-sample)"
                if inputs.preset("failure_rate_per_gpu_hour") else "")]
    if inputs.async_checkpoint:
        notes.append(f"asynchronous checkpoints block for the device-to-host copy at {inputs.host_copy_GBps:g} GB/s "
                     "per GPU" + (" (assumed)" if inputs.preset("host_copy_GBps") else ""))
    else:
        notes.append(f"checkpoints written at min({inputs.storage_aggregate_GBps:g} GB/s, nodes x "
                     f"{inputs.storage_node_GBps:g} GB/s)"
                     + (f" ({STORAGE_PRESET['source']})" if inputs.preset("storage_aggregate_GBps") else "")
                     + (" (per node: assumed)" if inputs.preset("storage_node_GBps") else ""))
    if inputs.preset("restart_s"):
        notes.append(f"restart after a failure {RESTART_S:g} s (assumed; --restart-s)")
    notes.append("the front is " + ("days against cost" if priced else "days against GPU-hours (no price given)"))
    # forecasts made before these knobs read alike
    given = {k: True for k, on in (("ep_overlap", options.ep_overlap), ("moe_folding", options.folding),
                                   ("fp8_param_gather", options.fp8_param_gather),
                                   ("no_tp_overlap", options.no_tp_overlap)) if on}
    for key, value in (("fp8_recipe", options.fp8_recipe), ("grad_reduce", options.grad_reduce),
                       ("loss_fusion", options.loss_fusion), ("optimizer_states", options.optimizer_states)):
        if value:
            given[key] = value
    if options.moe_imbalance != 1.0:
        given["moe_imbalance"] = options.moe_imbalance
    if options.recompute_modules:
        given["recompute_modules"] = list(options.recompute_modules)
    return {"schema": SCHEMA, "planner_version": __version__,
            "inputs": {**given, "model": model.name, "clusters": [c.name for c in clusters], "gpus": gpus,
                       "global_batches": list(global_batches), "seq_len": seq_len or model.seq_len,
                       "schedule": [[p.global_batch, p.seq_len, p.until_tokens] for p in schedule or []],
                       "precision": precision, "runtime": runtime, "constraints": dict(constraints or {}),
                       "moe_dispatcher": options.dispatcher, "tokens": inputs.tokens, "steps": inputs.steps,
                       "price_per_gpu_hour": inputs.price_per_gpu_hour, "pue": inputs.pue,
                       "failure_rate_per_gpu_hour": inputs.failure_rate_per_gpu_hour,
                       "async_checkpoint": inputs.async_checkpoint, "restart_s": inputs.restart_s},
            "rows": rows, "diminishing_returns": knees, "notes": notes}


CSV_COLUMNS = ("cluster", "gpu", "gpus", "global_batch", "seq_len", "runtime", "steps", "step_time_s", "days",
               "days_low", "days_high", "gpu_hours", "cost", "energy_mwh", "goodput", "checkpoint_interval_s",
               "tokens_per_s", "mfu", "dominant", "front", "infeasible")


def csv_text(doc: dict) -> str:
    """The rows as CSV (one line each; bands as their low and high ends)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in doc["rows"]:
        flat = dict(r, days_low=r.get("days_band", [None, None])[0], days_high=r.get("days_band", [None, None])[1])
        writer.writerow(["" if flat.get(c) is None else f"{flat[c]:.6g}" if isinstance(flat[c], float) else flat[c]
                         for c in CSV_COLUMNS])
    return out.getvalue()
