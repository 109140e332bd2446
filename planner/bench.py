"""`planner bench`: search speed on standard scenarios (median of repeats, process start and spec
loading excluded), with the size of the space each search covered."""

from __future__ import annotations

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
    """One GPU count: the search itself. A range: the sweep `planner plan` runs (parallel
    processes, one search per count)."""
    model, cluster = load_model(model_ref), load_cluster(cluster_ref)
    counts = parse_gpu_counts(gpus, cluster.gpus_per_node)
    times, stats = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        if len(counts) == 1:
            try:
                result = search(model, cluster, TrainingSetup(gpus=counts[0], global_batch=global_batch,
                                                              seq_len=seq_len))
                stats = [(result.summary(), result.best.step_time_s if result.best else None)]
            except PlannerError:
                stats = []
        else:
            request = dict(model=model, cluster=cluster, global_batch=global_batch, seq_len=seq_len, precision="bf16",
                           attention="flash", runtime="any", constraints={}, top=0)
            entries = sweep(request, counts)
            stats = [(e["plan"]["search"], e["plan"]["prediction"]["step_time_s"]) for e in entries if "plan" in e]
        times.append(time.perf_counter() - start)
    best = [step for _, step in stats if step is not None]
    return BenchRow(name=name, counts=len(counts), considered=sum(s["considered"] for s, _ in stats),
                    pruned_memory=sum(s["pruned_memory"] for s, _ in stats),
                    pruned_bound=sum(s["pruned_bound"] for s, _ in stats), priced=sum(s["priced"] for s, _ in stats),
                    median_s=statistics.median(times), best_step_s=min(best) if best else None,
                    proven_optimal=all(s["proven_optimal"] for s, _ in stats))


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
