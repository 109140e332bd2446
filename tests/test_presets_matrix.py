"""Every preset model priced on every preset cluster with a legal strategy."""

import math

import pytest

from planner.cost.step import estimate
from planner.presets import preset_names
from planner.spec.hardware import Cluster, load_cluster
from planner.spec.model import load_model
from planner.spec.training import TrainingSetup, resolve_strategy, strategy_problems

MODELS = preset_names("models")
CLUSTERS = [name for name in preset_names("hardware/clusters") if isinstance(load_cluster(name), Cluster)]
"""the plain cluster presets (a mixed preset's pools are plain presets; tests/test_pools.py plans them)"""


def test_preset_lists_are_complete():
    for name in ("gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                 "deepseek-v3", "qwen2.5-72b", "bert-large"):
        assert name in MODELS
    for name in ("dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "grand-teton-h100", "mi300x-8", "l40s-pcie-8",
                 "rtx4090-pcie-8"):
        assert name in CLUSTERS


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_every_model_on_every_cluster(model_name, cluster_name):
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    gpus = 4 * cluster.gpus_per_node
    setup = TrainingSetup(gpus=gpus, global_batch=max(64, gpus), seq_len=min(model.seq_len, 4096))
    tp = max(t for t in (1, 2, 4, 8) if model.heads % t == 0 and t <= cluster.gpus_per_node)
    knobs = {"tp": tp, "pp": 4, "micro_batch": 1, "recompute": "full"}
    if model.moe:
        knobs["ep"] = math.gcd(model.moe.experts, gpus // (tp * 4))
    strategy = resolve_strategy(knobs, setup)
    assert strategy_problems(strategy, model, setup) == []
    est = estimate(model, cluster, setup, strategy)
    assert math.isfinite(est.step_time_s) and est.step_time_s > 0
    assert 0 < est.mfu < 1
    assert est.peak_memory_bytes > 0
    assert len(est.stages) == 4
