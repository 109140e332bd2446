"""Mixed clusters, second step (issue 15): data-parallel replicas over several pools with batch
shares (search/shares.py), in the ideal space. Exactness against brute force over allocations,
splits and each pool's search; the lower bounds it prunes with; the document, its readers and
its refusal by every runtime."""

from __future__ import annotations

import copy
import itertools
import json
import random

import pytest

from conftest import run
from planner.cost.comm import pools_exchange_s
from planner.cost.step import compute_floor_s, dp_grad_bytes, estimate
from planner.errors import PlannerError
from planner.graph import model_params
from planner.planning import _setup, check_plan, make_plan
from planner.schema import PLAN_SCHEMA, check
from planner.search.driver import search
from planner.search.shares import allocations, best_shares, exchange_s
from planner.search.space import RUNTIME_RULES, TIE_TOLERANCE
from planner.spec.hardware import LinkTier, cluster_from_dict, load_cluster
from planner.spec.model import ModelSpec, load_model
from planner.spec.pools import MixedCluster, Pool

H100, A100 = load_cluster("dgx-h100"), load_cluster("dgx-a100-80g")
SMALL = ModelSpec(name="small", layers=8, hidden=2048, heads=16, ffn_hidden=8192, vocab=32000, seq_len=2048)
LINK = LinkTier(Bps=25e9, latency_s=6e-6, busbw_Bps=24e9)
SETUP = dict(seq_len=2048, precision="bf16", attention="flash", constraints={}, top=0)


def mix(*nodes: int, clusters=(H100, A100, load_cluster("dgx-b200"))) -> MixedCluster:
    return MixedCluster("mix", tuple(Pool(f"p{i}", c, n) for i, (c, n) in enumerate(zip(clusters, nodes))), LINK)


def setup_of(model, cluster):
    return lambda i, n, b: _setup(model, cluster.pools[i].cluster, n, b, 2048, "bf16", "flash", "ideal", 0.05)


def brute_force(model, cluster, gpus, batch):
    """The best step over every allocation and split, each pool's share searched to the end."""
    make = setup_of(model, cluster)
    best = float("inf")
    for used in allocations(cluster, gpus):
        idx = [i for i, n in enumerate(used) if n]
        x = exchange_s(model, cluster, ("bf16",) * len(used), used, "")
        for split in itertools.product(range(1, batch), repeat=len(idx)):
            if sum(split) != batch:
                continue
            steps = []
            for i, b in zip(idx, split):
                try:
                    r = search(model, cluster.pools[i].cluster, make(i, used[i], b), {}, top=0)
                except PlannerError:
                    r = None
                steps.append(r.best.step_time_s if r and r.best and r.best.fits else float("inf"))
            best = min(best, max(steps) + x)
    return best


@pytest.mark.parametrize("nodes, gpus, batch", [((1, 1), 16, 24), ((1, 2), 16, 16), ((1, 2), 24, 20),
                                                ((1, 1, 1), 24, 9), ((1, 2, 2), 32, 8)])
def test_the_shares_search_equals_brute_force(nodes, gpus, batch):
    """Issue 15's exactness: over every allocation of whole nodes (every GPU asked for used, two
    pools at least) and every split of the batch, the search's step is the brute force's (the
    last mix has allocations whose exchanges differ for the same pool and GPUs)."""
    cluster = mix(*nodes)
    found = best_shares(SMALL, cluster, gpus, batch, ("bf16",) * len(nodes), "", setup_of(SMALL, cluster), {})
    expected = brute_force(SMALL, cluster, gpus, batch)
    assert found is not None and found.step_time_s == pytest.approx(expected, rel=1e-12)
    assert sum(s.setup.global_batch for s in found.shares) == batch
    assert sum(s.setup.gpus for s in found.shares) == gpus and len(found.shares) >= 2
    assert found.proven_optimal


def test_a_cutoff_no_split_beats_gives_nothing():
    cluster = mix(1, 1)
    found = best_shares(SMALL, cluster, 16, 24, ("bf16",) * 2, "", setup_of(SMALL, cluster), {})
    assert best_shares(SMALL, cluster, 16, 24, ("bf16",) * 2, "", setup_of(SMALL, cluster), {},
                       cutoff_s=found.step_time_s) is None


def test_allocations_take_whole_nodes_every_gpu_and_two_pools():
    assert allocations(mix(1, 2), 16) == [(8, 8)]
    assert allocations(mix(1, 2), 24) == [(8, 16)]
    assert allocations(mix(2, 2), 24) == [(8, 16), (16, 8)]
    assert allocations(mix(1, 1), 8) == []


def test_the_exchange_is_a_ring_over_the_pools_at_the_fewest_gpus_links():
    """2 (P-1)/P * bytes / (min g * busbw) + 2 (P-1) * latency (cost/comm.pools_exchange_s)."""
    assert pools_exchange_s(1e9, (8,), LINK) == 0.0
    assert pools_exchange_s(1e9, (8, 16), LINK) == pytest.approx(1e9 / (8 * 24e9) + 2 * 6e-6)
    assert pools_exchange_s(3e9, (16, 8, 24), LINK) == pytest.approx(2 * 2 / 3 * 3e9 / (8 * 24e9) + 4 * 6e-6)
    unmeasured = LinkTier(Bps=25e9, latency_s=0.0)
    assert pools_exchange_s(1e9, (8, 8), unmeasured) == pytest.approx(1e9 / (8 * 25e9 * 0.8))
    model = load_model("llama3-70b")
    assert exchange_s(model, mix(4, 8), ("bf16",) * 3, (32, 0, 64), "") == pools_exchange_s(
        model_params(model) * dp_grad_bytes("bf16", ""), (32, 64), LINK)
    # the gradients cross in the widest reduction dtype of the pools used (fp16's is 2 bytes, bf16's 4)
    assert exchange_s(model, mix(4, 8), ("fp16", "bf16", "fp16"), (32, 64, 0), "") == exchange_s(
        model, mix(4, 8), ("bf16",) * 3, (32, 64, 0), "") > exchange_s(model, mix(4, 8), ("fp16",) * 3, (32, 64, 0), "")


def test_the_compute_floor_is_below_every_priced_strategy():
    """cost/step.compute_floor_s, the bound the shares search prunes with first, is at most the
    step of every strategy the search prices (the best and its runners-up), on random models,
    GPUs, precisions, attention kernels, sequences and batches."""
    rng = random.Random(15)
    models = [SMALL, load_model("llama3-8b"), load_model("mixtral-8x7b"), load_model("llama2-7b"),
              load_model("bert-large")]
    clusters = [H100, A100, load_cluster("dgx-b200"), load_cluster("mi300x-8"), load_cluster("l40s-pcie-8")]
    checked = 0
    for _ in range(24):
        model, cluster = rng.choice(models), rng.choice(clusters)
        precision = rng.choice(["bf16", "fp8"] if "fp8" in dict(cluster.gpu.peak_flops) else ["bf16"])
        seq = rng.choice([512, 1024, 2048])
        seq = min(seq, model.max_position) if model.position_embedding == "learned" else seq
        setup = _setup(model, cluster, rng.choice([8, 16]), rng.choice([16, 24, 64]), seq, precision,
                       rng.choice(["flash", "eager"]), "ideal", 0.0)
        result = search(model, cluster, setup, {}, top=20)
        floor = compute_floor_s(model, cluster, setup)
        for cand in ([result.best] if result.best else []) + list(result.alternatives):
            assert floor <= cand.step_time_s * (1 + 1e-12)
            assert floor <= estimate(model, cluster, setup, cand.strategy).step_time_s * (1 + 1e-12)
            checked += 1
    assert checked >= 200


@pytest.fixture(scope="module")
def bench_mix():
    """Issue 15's bench mix: llama3-70b, 32 H100 + 64 A100-80G, seq 4096, global batch 384."""
    model, cluster = load_model("llama3-70b"), load_cluster("h100-plus-a100")
    doc = make_plan(model, cluster, 96, global_batch=384, **{**SETUP, "seq_len": 4096, "top": 3}, runtime="ideal")
    alone = make_plan(model, cluster.pools[0].cluster, 32, global_batch=384, **{**SETUP, "seq_len": 4096},
                      runtime="ideal")
    return doc, alone


def test_the_bench_mix_uses_both_pools_and_beats_the_h100_pool_alone(bench_mix):
    doc, alone = bench_mix
    shares = [p["share"] for p in doc["pools"]]
    assert [p["used_gpus"] for p in doc["pools"]] == [32, 64]
    assert sum(s["global_batch"] for s in shares) == 384
    assert doc["prediction"]["step_time_s"] * (1 + TIE_TOLERANCE) < alone["prediction"]["step_time_s"]
    slowest = max(s["step_time_s"] for s in shares)
    breakdown = doc["prediction"]["breakdown_s"]
    # each figure is rounded to 6 significant digits (plan.rounded): up to 5e-6 of it apart
    assert doc["prediction"]["step_time_s"] == pytest.approx(slowest + breakdown["pools_exchange"], rel=1e-5)
    assert sum(breakdown.values()) == pytest.approx(doc["prediction"]["step_time_s"], rel=1e-5)  # each rounded
    assert max(s["busy"] for s in shares) == pytest.approx(slowest / doc["prediction"]["step_time_s"], rel=1e-4)
    # its runners-up are the pools alone, fastest first
    assert [a["step_time_s"] for a in doc["alternatives"]] == sorted(p["step_time_s"] for p in doc["pools"])
    assert doc["alternatives"][0]["strategy"] == alone["strategy"]
    assert "pool h100 alone (32 x h100-sxm-80g): slower by" in doc["alternatives"][0]["why_not"]
    check(json.loads(json.dumps(doc)), PLAN_SCHEMA)


def test_a_shares_plan_no_runtime_runs_reads_back_and_checks(bench_mix, tmp_path):
    """Every runtime refuses it, naming the capability (RuntimeRules.batch_shares); check re-plans
    it on the mixed cluster (ok), and calls it stale when one pool's share changed."""
    doc, _ = bench_mix
    from planner.runtimes import TARGETS
    assert doc["runnable_on"] == [] and not any(RUNTIME_RULES[r].batch_shares for r in TARGETS)
    assert RUNTIME_RULES["ideal"].batch_shares  # the one space that has them
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(doc))
    for runtime in ("megatron", "deepspeed", "torchtitan", "nanotron", "torchtitan@0.2"):
        result = run("export", str(path), "--to", runtime)
        assert result.returncode == 2 and "equal batch share on every data-parallel replica" in result.stderr
    assert cluster_from_dict(doc["inputs"]["cluster"], "x") == load_cluster("h100-plus-a100")
    assert check_plan(doc, 0.02)["verdict"] == "ok"
    edited = copy.deepcopy(doc)
    edited["pools"][0]["share"]["global_batch"] += 1
    assert check_plan(edited, 0.02)["verdict"] == "stale"
    assert run("diff", str(path), str(path)).returncode == 0
    assert run("ranks", str(path)).returncode == 0


def test_the_default_space_has_no_batch_shares():
    """The supported runtimes run no batch shares: the default plan is a pool alone or one
    pipeline over the pools (tests/test_pool_stages.py), never shares."""
    doc = make_plan(SMALL, mix(1, 1), 16, global_batch=24, **SETUP, runtime="supported")
    assert "strategy_pool" not in doc and not any("share" in p for p in doc["pools"])


def test_the_plan_command_shows_each_pools_share(tmp_path):
    result = run("plan", "-m", "llama3-8b", "-c", "h100-plus-a100", "--gpus", "96", "--global-batch", "96",
                 "--seq-len", "2048", "--runtime", "ideal", "-o", str(tmp_path / "p.json"))
    assert result.returncode == 0, result.stderr
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["strategy_pool"] in ("h100", "a100")
    for shown in ("share", "busy", "pools_exchange", "batch shares:", "GPUs of h100-plus-a100 (32 x h100-sxm-80g + "):
        assert shown in result.stderr


def test_a_forecast_over_pools_runs_on_all_their_gpus():
    """forecast on a mixed cluster in the ideal space: the row is the plan over both pools, its
    GPUs named together and its energy at their power averaged by count."""
    result = run("forecast", "-m", "llama3-8b", "-c", "h100-plus-a100", "--gpus", "96", "--global-batch", "96",
                 "--seq-len", "2048", "--tokens", "1e10", "--runtime", "ideal", "--format", "json")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["rows"][0]
    plan = make_plan(load_model("llama3-8b"), load_cluster("h100-plus-a100"), 96, global_batch=96,
                     **{**SETUP, "seq_len": 2048}, runtime="ideal")
    assert row["gpu"] == "h100-sxm-80g+a100-sxm-80g" and row["step_time_s"] == pytest.approx(
        plan["prediction"]["step_time_s"], rel=1e-5)
    watts = (32 * H100.gpu.tdp_w + 64 * A100.gpu.tdp_w) / 96
    assert row["energy_mwh"] == pytest.approx(row["gpu_hours"] * watts / 1e6, rel=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_in_the_ideal_space_a_mix_is_bounded_by_its_best_pool_and_by_its_pools_all_of_the_better_gpu(seed):
    """Issue 15's property with batch shares searched: over random mixes of H100 and A100-80G
    nodes, the plan is never slower than the best plan on one pool alone, and never faster than
    the same pools all H100 (at least as good in every figure: peak, HBM, memory, links) by more
    than the tie tolerance. Both follow from an exact search and a cost model that never prices
    a better GPU slower: the all-H100 mix has every plan the mix has, each at most as slow."""
    rng = random.Random(seed)
    nodes = (rng.choice([1, 2]), rng.choice([1, 2, 3]))
    mixed, better = mix(*nodes), mix(*nodes, clusters=(H100, H100))
    model = rng.choice([SMALL, load_model("llama3-8b")])
    setup = {**SETUP, "global_batch": rng.choice([16, 24, 48]), "seq_len": rng.choice([1024, 2048]),
             "runtime": "ideal"}
    gpus = mixed.gpus
    step = make_plan(model, mixed, gpus, **setup)["prediction"]["step_time_s"]
    for pool in mixed.pools:
        alone = make_plan(model, pool.cluster, pool.gpus, **setup)["prediction"]["step_time_s"]
        assert step <= alone * (1 + 1e-9)
    assert make_plan(model, better, gpus, **setup)["prediction"]["step_time_s"] <= step * (1 + TIE_TOLERANCE)


def test_each_pool_trains_in_a_precision_its_gpu_has():
    """spec/pools.pool_precision: fp8 asked of H100 + A100 runs the A100s in bf16, alone and in a
    plan over both pools (each share says its precision); a GPU with no bf16 falls back to fp16."""
    from dataclasses import replace as swap

    from planner.spec.pools import pool_precision

    cluster = mix(1, 2)
    assert [pool_precision(p, "fp8") for p in cluster.pools] == ["fp8", "bf16"]
    no_bf16 = swap(A100, gpu=swap(A100.gpu, peak_flops=(("fp16", 312e12),)))
    assert pool_precision(Pool("old", no_bf16, 1), "bf16") == "fp16"
    doc = make_plan(SMALL, cluster, 24, global_batch=48, **{**SETUP, "precision": "fp8"}, runtime="ideal")
    assert doc["pools"][1]["precision"] == "bf16" and "step_time_s" in doc["pools"][1]
    assert [p["share"]["precision"] for p in doc["pools"]] == ["fp8", "bf16"]
    check(json.loads(json.dumps(doc)), PLAN_SCHEMA)


@pytest.mark.parametrize("gpus, batch", [(8, 24), (16, 7), (16, 64)])
def test_bounds_with_a_cutoff_leave_a_search_pruned_there_as_it_was(gpus, batch):
    """bound_sweep(cutoff_s=c) leaves out candidates whose compute floor is at least c before
    pricing their layer contexts: a search pruned at c (outside_s) on those bounds finds the
    best step where it is below c, and nothing below c where it is not (a search pruned at c
    may still return what it priced above c: the shares search reads that as 'not below c')."""
    from planner.search.driver import bound_sweep

    setup = _setup(SMALL, H100, gpus, batch, 2048, "bf16", "flash", "ideal", 0.05)
    best = search(SMALL, H100, setup, {}, top=0).best.step_time_s
    for cutoff in (best * 0.9, best, best * 1.05, best * 3):
        full = search(SMALL, H100, setup, {}, top=0, outside_s=cutoff)
        cut = search(SMALL, H100, setup, {}, top=0, outside_s=cutoff,
                     found=bound_sweep(SMALL, H100, [setup], {}, cutoff_s=cutoff)[0])
        if best < cutoff:
            assert cut.best.step_time_s == full.best.step_time_s == best
            assert cut.best.strategy == full.best.strategy
        else:
            assert cut.best is None or cut.best.step_time_s >= cutoff


@pytest.mark.parametrize("total, rates, limit", [(12, [1.0, 2.0], 9.0), (9, [1.0, 1.5, 3.0], 7.5), (5, [1.0, 1.0], 2.0),
                                                 (10, [0.5, float("inf")], 4.0), (7, [1.0, 2.0, 3.0], float("inf"))])
def test_the_splits_below_a_limit_are_those_brute_force_keeps(total, rates, limit):
    """search/shares._splits_below yields, in order, exactly the positive splits of `total` each
    of whose shares stays below `limit` at its rate."""
    from planner.search.shares import _splits_below

    every = [s for s in itertools.product(range(1, total + 1), repeat=len(rates)) if sum(s) == total]
    assert list(_splits_below(total, rates, limit)) == [s for s in every if all(r * b < limit for r, b in zip(rates, s))]
