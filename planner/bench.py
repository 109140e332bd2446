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
from planner.planning import sweep
from planner.search.driver import search
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import TrainingSetup, parse_gpu_counts

# (name, model, cluster, GPUs (a count or a range), global batch, sequence length)
SCENARIOS = (
    ("llama3-405b / 16384 x H100", "llama3-405b", "dgx-h100", "16384", 2048, 8192),
    ("gpt3-175b / 1536 x A100-80G", "gpt3-175b", "dgx-a100-80g", "1536", 1536, 2048),
    ("llama3-70b / 64-1024 x H100", "llama3-70b", "dgx-h100", "64-1024", 1024, 8192),
    ("deepseek-v3 / 2048 x H100", "deepseek-v3", "dgx-h100", "2048", 4096, 4096),
)
TARGET_S = 1.0


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
                 repeats: int) -> BenchRow:
    """Median over `repeats` runs, each in a fresh process so that no cache of an earlier run
    helps (what one `planner plan` meets); the time excludes process start and spec loading."""
    runs = []
    for _ in range(repeats):
        args = json.dumps([model_ref, cluster_ref, gpus, global_batch, seq_len])
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
    """One timed run (in a child process): one GPU count is the search itself; a range is the
    sweep `planner plan` runs (parallel processes, one search per count). Prints JSON."""
    model_ref, cluster_ref, gpus, global_batch, seq_len = json.loads(args)
    model, cluster = load_model(model_ref), load_cluster(cluster_ref)
    counts = parse_gpu_counts(gpus, cluster.gpus_per_node)
    start = time.perf_counter()
    if len(counts) == 1:
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
