"""Mixed clusters, second step (issue 15): data-parallel replicas over several pools with batch
shares (search/shares.py). Exactness against brute force over allocations, splits and each
pool's search, and the lower bounds it prunes with."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.cost.comm import pools_exchange_s
from planner.cost.step import compute_floor_s, dp_grad_bytes, estimate
from planner.errors import PlannerError
from planner.graph import model_params
from planner.planning import _setup
from planner.search.driver import search
from planner.search.shares import allocations, best_shares, exchange_s
from planner.spec.hardware import LinkTier, load_cluster
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
        x = exchange_s(model, cluster, "bf16", used)
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
                                                ((1, 1, 1), 24, 9)])
def test_the_shares_search_equals_brute_force(nodes, gpus, batch):
    """Issue 15's exactness: over every allocation of whole nodes (every GPU asked for used, two
    pools at least) and every split of the batch, the search's step is the brute force's."""
    cluster = mix(*nodes)
    found = best_shares(SMALL, cluster, gpus, batch, "bf16", setup_of(SMALL, cluster), {})
    expected = brute_force(SMALL, cluster, gpus, batch)
    assert found is not None and found.step_time_s == pytest.approx(expected, rel=1e-12)
    assert sum(s.setup.global_batch for s in found.shares) == batch
    assert sum(s.setup.gpus for s in found.shares) == gpus and len(found.shares) >= 2
    assert found.proven_optimal


def test_a_cutoff_no_split_beats_gives_nothing():
    cluster = mix(1, 1)
    found = best_shares(SMALL, cluster, 16, 24, "bf16", setup_of(SMALL, cluster), {})
    assert best_shares(SMALL, cluster, 16, 24, "bf16", setup_of(SMALL, cluster), {},
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
    assert exchange_s(model, mix(4, 8), "bf16", (32, 0, 64)) == pools_exchange_s(
        model_params(model) * dp_grad_bytes("bf16"), (32, 64), LINK)


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
