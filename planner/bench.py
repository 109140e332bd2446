"""`planner bench`: search speed on standard scenarios (median of repeats, each in a fresh process
with process start and spec loading excluded), with the size of the space each search covered."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from planner.errors import PlannerError
from planner.planning import SUPPORTED, make_plan, sweep
from planner.search.driver import search
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.pools import MixedCluster
from planner.spec.training import TrainingSetup, parse_gpu_counts

# (name, model, cluster, GPUs (a count or a range), global batch, sequence length)
SCENARIOS = (
    ("llama3-405b / 16384 x H100", "llama3-405b", "dgx-h100", "16384", 2048, 8192),
    ("gpt3-175b / 1536 x A100-80G", "gpt3-175b", "dgx-a100-80g", "1536", 1536, 2048),
    ("llama3-70b / 64-1024 x H100", "llama3-70b", "dgx-h100", "64-1024", 1024, 8192),
    ("deepseek-v3 / 2048 x H100", "deepseek-v3", "dgx-h100", "2048", 4096, 4096),
    ("llama3-70b / 32 H100 + 64 A100-80G", "llama3-70b", "h100-plus-a100", "96", 384, 4096),
    ("llama3-70b / 32 H100 + 64 A100-80G, supported", "llama3-70b", "h100-plus-a100", "96", 384, 4096, "supported"),
)
"""the mixed scenarios are issue 15's bench mix (hardware/clusters/h100-plus-a100.yaml), the whole
plan over its pools (planning.plan_on_pools): each pool alone, the pipelines over pools and, in
the ideal space, batch shares; in the supported runtimes' space, pools alone and pipelines"""
TARGET_S = 1.0
DEPTHS = (1250, 2500, 5000, 10000)
"""the depth ladder: a GPT-style decoder of that many layers (depth_model) on 1,024 H100s, global
batch 1024, in the space `planner plan` searches by default (the supported runtimes' union)"""
DEPTH_TARGET_S = 60.0
"""the deepest rung's target median"""
DEPTH_GROWTH = 2.2
"""the most its time may grow per doubling of the layers"""


def depth_model(layers: int):
    """The depth ladder's model: hidden 2048, 16 heads, FFN 8192, vocab 32000, sequence 2048."""
    from planner.spec.model import ModelSpec
    return ModelSpec(name=f"deep-{layers}", layers=layers, hidden=2048, heads=16, ffn_hidden=8192, vocab=32000,
                     seq_len=2048)


def depth_scenarios() -> tuple:
    return tuple((f"{n:,} layers / 1024 x H100", f"deep:{n}", "dgx-h100", "1024", 1024, 2048, "supported")
                 for n in DEPTHS)


def depth_growth(rows) -> float:
    """The largest ratio of one rung's median time to the one before (half as many layers)."""
    times = [r.median_s for r in rows]
    return max((b / a for a, b in zip(times, times[1:])), default=1.0)


@dataclass(frozen=True, slots=True)
class BenchRow:
    name: str
    counts: int
    considered: int
    pruned_memory: int
    pruned_bound: int
    priced: int
    median_s: float
    best_step_s: float | None
    proven_optimal: bool


def run_scenario(name: str, model_ref: str, cluster_ref: str, gpus: str, global_batch: int, seq_len: int,
                 runtime: str = "ideal", repeats: int = 3) -> BenchRow:
    """Median over `repeats` runs, each in a fresh process so that no cache of an earlier run
    helps (what one `planner plan` meets); the time excludes process start and spec loading."""
    runs = []
    for _ in range(repeats):
        args = json.dumps([model_ref, cluster_ref, gpus, global_batch, seq_len, runtime])
        out = subprocess.run([sys.executable, "-c", f"from planner.bench import measure; measure({args!r})"],
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout))
    stats, best = runs[0]["stats"], [b for b in runs[0]["best"] if b is not None]
    return BenchRow(name=name, counts=runs[0]["counts"], considered=sum(s["considered"] for s in stats),
                    pruned_memory=sum(s["pruned_memory"] for s in stats),
                    pruned_bound=sum(s["pruned_bound"] for s in stats), priced=sum(s["priced"] for s in stats),
                    median_s=statistics.median(r["time_s"] for r in runs), best_step_s=min(best) if best else None,
                    proven_optimal=all(s["proven_optimal"] for s in stats))


def measure(args: str) -> None:
    """One timed run (in a child process): one GPU count is the search itself (in the ideal
    space, or with 'supported' the plan `planner plan` makes by default: the runtimes' union, three
    runners-up and each runtime's best); a range is
    the sweep `planner plan` runs (parallel processes, one search per count). Prints JSON."""
    model_ref, cluster_ref, gpus, global_batch, seq_len, *rest = json.loads(args)
    runtime = rest[0] if rest else "ideal"
    model = depth_model(int(model_ref.split(":")[1])) if model_ref.startswith("deep:") else load_model(model_ref)
    cluster = load_cluster(cluster_ref)
    counts = parse_gpu_counts(gpus, *cluster.count_unit)
    start = time.perf_counter()
    if len(counts) == 1 and (runtime == SUPPORTED or isinstance(cluster, MixedCluster)):
        try:
            doc = make_plan(model, cluster, gpus=counts[0], global_batch=global_batch, seq_len=seq_len,
                            precision="bf16", attention="flash", runtime=runtime, constraints={})
            found = [(doc["search"], doc["prediction"]["step_time_s"])]
        except PlannerError:
            found = []
    elif len(counts) == 1:
        try:
            result = search(model, cluster, TrainingSetup(gpus=counts[0], global_batch=global_batch, seq_len=seq_len))
            found = [(result.summary(), result.best.step_time_s if result.best else None)]
        except PlannerError:
            found = []
    else:
        request = {"model": model, "cluster": cluster, "global_batch": global_batch, "seq_len": seq_len,
                   "precision": "bf16", "attention": "flash", "runtime": "ideal", "constraints": {}, "top": 0}
        found = [(e["plan"]["search"], e["plan"]["prediction"]["step_time_s"])
                 for e in sweep(request, counts) if "plan" in e]
    elapsed = time.perf_counter() - start
    print(json.dumps({"time_s": elapsed, "counts": len(counts), "stats": [f[0] for f in found],
                      "best": [f[1] for f in found]}))


def plan_command_wall_s(repeats: int) -> float:
    """Wall time of the whole `planner plan` command for llama3-405b on 16384 GPUs (process start
    included), median of repeats."""
    cmd = [sys.executable, "-m", "planner", "plan", "-m", "llama3-405b", "-c", "dgx-h100", "--gpus", "16384",
           "--global-batch", "2048", "--seq-len", "8192", "--json"]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
