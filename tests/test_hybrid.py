"""Hybrid sharding (Strategy.dp_shard): ZeRO over groups of dp_shard data-parallel ranks,
replicated across them. Priced by estimate and exported; the search does not explore it."""

from __future__ import annotations

import json
import random

import pytest

from conftest import one_error_line, run
from planner.cost import comm, memory
from planner.cost.step import estimate, gather_bytes, gathered_bytes, stage_tail_s, zero_traffic_s
from planner.errors import ExportError
from planner.export import export
from planner.placement import group_spans, hybrid_spans, rank_groups, span_of, worst
from planner.planning import estimate_plan
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import Strategy, TrainingSetup, strategy_problems
from runtime_checks import check_megatron, check_torchtitan, megatron_args

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-cp-pp", "cp-tp-dp-pp")


@pytest.mark.parametrize("seed", range(30))
def test_hybrid_groups_are_the_dp_groups_split_in_consecutive_blocks(seed):
    """A shard group of dp_shard = dp is the dp x cp group, one of dp_shard = 1 the cp group;
    a replica group of dp_shard = 1 is the dp group: the slowest of each, as the placement's
    own spans (worst over rank_groups) give them, for random degrees, orders and node sizes."""
    rng = random.Random(seed)
    tp, cp, dp, pp = (rng.choice((1, 2, 4)) for _ in range(4))
    order, g = rng.choice(ORDERS), rng.choice((4, 8))
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": 1}
    dpcp = worst(span_of(r, g) for r in rank_groups(order, degrees, "dpcp"))
    assert hybrid_spans(order, tp, cp, dp, pp, dp, g)[0] == dpcp
    shard1, replica1 = hybrid_spans(order, tp, cp, dp, pp, 1, g)
    assert shard1 == worst(span_of(r, g) for r in rank_groups(order, degrees, "cp"))
    assert replica1 == worst(span_of(r, g) for r in rank_groups(order, degrees, "dp"))
    assert group_spans(order, tp, cp, dp, pp, 1, g)[-1] == dpcp


def _setup(runtime="ideal", gpus=64):
    return TrainingSetup(gpus=gpus, global_batch=256, seq_len=4096, runtime=runtime)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_states_shard_over_the_shard_group(zero):
    """Each rank's sharded states grow by dp / dp_shard under hybrid sharding: what ZeRO shards
    (the optimizer states from ZeRO-1, gradients from 2, weights from 3) over dp_shard x cp."""
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100")
    plain = estimate(m, c, _setup(), Strategy(dp=32, cp=2, zero=zero, recompute="full")).memory
    hybrid = estimate(m, c, _setup(), Strategy(dp=32, cp=2, zero=zero, recompute="full", dp_shard=4)).memory
    assert hybrid.optimizer == pytest.approx(plain.optimizer * 8)
    assert hybrid.grads == pytest.approx(plain.grads * (8 if zero >= 2 else 1))
    assert hybrid.weights == pytest.approx(plain.weights * (8 if zero == 3 else 1))
    assert hybrid.activations == plain.activations


def test_the_replicas_all_reduce_their_shard_of_the_gradients():
    """ZeRO-2/3: each micro-batch reduce-scatters over the shard group, then all-reduces the
    1/(dp_shard*cp) share across the replicas; ZeRO-1 does so once a step before its gather."""
    calls = []

    def coll(kind, n_bytes, group):
        calls.append((kind, n_bytes, group))
        return 0.0

    gathered = gathered_bytes(gather_bytes(_setup()), 1000.0, 1000.0, 0.0)  # 1,000 layer parameters, no experts
    zero_traffic_s(coll, 3, 4, gathered, 1000.0, 0.0, replicas=1 / 8)
    assert ("reduce_scatter", 4000.0, "dpcp") in calls and ("all_reduce", 500.0, "replica") in calls
    assert ("all_gather", 2000.0, "dpcp") in calls  # the 16-bit weights, gathered for forward and backward
    calls.clear()
    cluster = load_cluster("dgx-h100")
    stage_tail_s(coll, 1, 4, (2000.0, 0.0), 1000.0, 0.0, 1.0, 1.0, 0, True, 8, 1, cluster, replicas=1 / 8,
                 optimizer=memory.OPTIMIZER_BYTES)
    assert ("reduce_scatter", 4000.0, "dpcp") in calls and ("all_reduce", 500.0, "replica") in calls
    calls.clear()
    zero_traffic_s(coll, 3, 4, (2000.0, 0.0), 1000.0, 0.0)
    assert all(g != "replica" for _, _, g in calls)


def test_the_replica_all_reduce_is_priced_on_the_replica_groups_span():
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100")
    s = Strategy(dp=64, zero=3, recompute="full", dp_shard=8, dp_overlap=False)
    plain = estimate(m, c, _setup(), Strategy(dp=64, zero=3, recompute="full", dp_overlap=False))
    hybrid = estimate(m, c, _setup(), s)
    shard, replica = hybrid_spans(s.order, 1, 1, 64, 1, 8, 8)
    assert (shard.nodes, replica.nodes, replica.size) == (1, 8, 8)  # a node shards, the nodes replicate
    assert hybrid.breakdown_s["compute"] == plain.breakdown_s["compute"]
    # the in-node reduce-scatters and gathers are cheaper than over all 64 ranks; the share crosses nodes
    assert comm.collective_time_s("reduce_scatter", 1e9, shard, c) < comm.collective_time_s(
        "reduce_scatter", 1e9, group_spans(s.order, 1, 1, 64, 1, 1, 8)[-1], c)


@pytest.mark.parametrize("knobs, phrase", [
    ({"dp": 64, "dp_shard": 64}, "strictly between 1 and dp"),
    ({"dp": 64, "dp_shard": 6}, "must divide dp"),
    ({"dp": 64, "dp_shard": 8, "zero": 0}, "ZeRO-0 shards nothing"),
])
def test_illegal_hybrid_sharding_is_named(knobs, phrase):
    assert any(phrase in p for p in strategy_problems(Strategy(**knobs), load_model("llama3-8b"), _setup()))


def test_experts_are_not_hybrid_sharded():
    s = Strategy(dp=64, ep=8, zero=1, dp_shard=8)
    assert any("with experts" in p for p in strategy_problems(s, load_model("mixtral-8x7b"), _setup()))


def _plan(runtime, zero, **knobs):
    return estimate_plan(load_model("llama3-8b"), load_cluster("dgx-h100"), 64, 256, 4096, "bf16", "flash", runtime,
                         {"zero": zero, "dp_shard": 8, **knobs})


def test_torchtitan_runs_fsdp_as_hsdp():
    plan = _plan("torchtitan", 3, recompute="full")
    assert plan["strategy"]["dp_shard"] == 8 and "torchtitan" in [r["runtime"] for r in plan["runnable_on"]]
    check_torchtitan(plan)  # 0.3's ParallelDims: replicate 8 x shard 8; 0.2's ConfigManager alike


def test_megatron_runs_distributed_optimizer_instances():
    plan = _plan("megatron", 1)
    check_megatron(plan)
    assert megatron_args(export(plan, "megatron"))["--num-distributed-optimizer-instances"] == "8"


@pytest.mark.parametrize("runtime", ["deepspeed", "nanotron"])
def test_runtimes_without_hybrid_sharding_refuse_it(runtime):
    with pytest.raises(Exception, match="hybrid sharding"):
        _plan(runtime, 1)
    plan = _plan("ideal", 1)
    with pytest.raises(ExportError, match="hybrid sharding"):
        export(plan, runtime)


def test_a_plan_without_hybrid_sharding_writes_no_dp_shard(tmp_path):
    plan = estimate_plan(load_model("llama3-8b"), load_cluster("dgx-h100"), 64, 256, 4096, "bf16", "flash",
                         "megatron", {"zero": 1})
    assert "dp_shard" not in plan["strategy"]


def test_the_search_says_it_does_not_explore_hybrid_sharding():
    line = one_error_line(run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "64", "--global-batch", "256",
                              "--dp-shard", "8"))
    assert "does not explore hybrid sharding" in line
    result = run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "64", "--global-batch", "256",
                 "--zero", "3", "--dp-shard", "8", "--runtime", "torchtitan", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["strategy"]["dp_shard"] == 8
