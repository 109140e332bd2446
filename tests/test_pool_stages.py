"""Mixed clusters, third step (issue 15): one pipeline whose stages sit on different pools
(search/pool_stages.py, priced by cost/pools.py), the heterogeneous plan Megatron-LM runs with
--pipeline-model-parallel-layout. Exactness against brute force over orders, strategies and
splits; the bound it prunes with; the pricing against the single-pool cost model; the document,
its export and its refusals."""

from __future__ import annotations

import copy
import itertools
import json
import random
from dataclasses import replace
from itertools import pairwise

import pytest

from conftest import run
from planner.cost.memory import capacity_bytes
from planner.cost.pools import crossing_s, estimate_on_pools, pool_terms, stage_pools
from planner.cost.step import estimate, profile, split_step
from planner.planning import _setup, check_plan, make_plan
from planner.runtimes import RUNTIME_RULES
from planner.schema import PLAN_SCHEMA, check
from planner.search.pool_stages import bound_s, best_pool_stages, candidates, item_floors_s, pool_rules
from planner.search.space import TIE_TOLERANCE, strategy_conventions
from planner.spec.hardware import LinkTier, load_cluster
from planner.spec.model import ModelSpec, load_model
from planner.spec.pools import MixedCluster, Pool
from planner.spec.training import TrainingSetup

H100, A100, MI300X = load_cluster("dgx-h100"), load_cluster("dgx-a100-80g"), load_cluster("mi300x-8")
TINY = ModelSpec(name="tiny", layers=6, hidden=2048, heads=16, ffn_hidden=8192, vocab=32000, seq_len=2048)
LINK = LinkTier(Bps=25e9, latency_s=6e-6, busbw_Bps=24e9)


def mix(*nodes: int, clusters=(H100, A100)) -> MixedCluster:
    return MixedCluster("mix", tuple(Pool(f"p{i}", c, n) for i, (c, n) in enumerate(zip(clusters, nodes))), LINK)


def job(model, cluster: MixedCluster, gpus: int, batch: int, runtime: str = "megatron", seq: int = 2048):
    first = cluster.pools[0].cluster
    return replace(_setup(model, first, first.gpus_per_node, batch, seq, "bf16", "flash", runtime, 0.05), gpus=gpus)


def brute_force(model, cluster, setup, fixed, runtime):
    """Every strategy of the space, every order of its pools and every split, priced by
    cost/pools.pool_terms; the most conventional within TIE_TOLERANCE of the fastest."""
    clusters = [p.cluster for p in cluster.pools]
    priced = []
    for used, s in candidates(model, cluster, setup, fixed, pool_rules(RUNTIME_RULES[runtime])):
        width = s.tp * s.cp * s.dp
        counts = {j: g // width for j, g in enumerate(used) if g}
        profs = {j: profile(model, clusters[j], setup, s) for j in counts}
        for order in itertools.permutations(counts):
            stage_pool = stage_pools(order, tuple(counts[j] for j in order))
            for cuts in itertools.combinations(range(1, model.layers), s.pp - 1):
                bounds = list(pairwise((0, *cuts, model.layers)))
                terms = pool_terms(profs, stage_pool, cluster.between_pools, bounds)
                fits = all(terms["memory"][i] <= capacity_bytes(profs[j].cluster, setup)
                           for i, j in enumerate(stage_pool))
                if fits:
                    priced.append((split_step(terms, s.num_microbatches(setup.global_batch), 1)[0], s, stage_pool))
    fastest = min(p[0] for p in priced)
    return min((p for p in priced if p[0] <= fastest * (1 + TIE_TOLERANCE)),
               key=lambda p: (strategy_conventions(p[1], min(c.gpus_per_node for c in clusters)), p[0]))


@pytest.mark.parametrize("nodes, gpus, batch, runtime", [((1, 1), 16, 8, "megatron"), ((1, 2), 24, 4, "ideal"),
                                                         ((2, 1), 24, 8, "megatron")])
def test_the_search_equals_brute_force(nodes, gpus, batch, runtime):
    """Issue 15's exactness for pipelines over pools: over every allocation, order of the pools,
    strategy and contiguous split, the search's plan is the brute force's (the rule's choice
    within the tie tolerance included), and its step is the cost model's price of its split."""
    cluster = mix(*nodes)
    setup = job(TINY, cluster, gpus, batch, runtime)
    found = best_pool_stages(TINY, cluster, setup, {}, RUNTIME_RULES[runtime])
    step, strategy, stage_pool = brute_force(TINY, cluster, setup, {}, runtime)
    assert found is not None and found.proven_optimal
    assert found.best.step_time_s == pytest.approx(step, rel=1e-12)
    assert (found.best.strategy, found.best.stage_pool) == (strategy, stage_pool)
    est = estimate_on_pools(TINY, tuple(p.cluster for p in cluster.pools), cluster.between_pools, setup,
                            found.best.strategy, found.best.stage_pool, found.best.bounds)
    assert est.step_time_s == pytest.approx(found.best.step_time_s, rel=1e-12) and est.fits


@pytest.mark.parametrize("seed", range(4))
def test_the_bound_is_below_every_order_and_split(seed):
    """search/pool_stages.bound_s: at most the price of every order of the pools and every
    split, for random strategies of random mixes (the search prunes on it)."""
    rng = random.Random(seed)
    cluster = mix(rng.choice([1, 2]), rng.choice([1, 2]))
    setup = job(TINY, cluster, cluster.gpus, rng.choice([8, 16]), "ideal")
    clusters = [p.cluster for p in cluster.pools]
    every = list(candidates(TINY, cluster, setup, {}, pool_rules(RUNTIME_RULES["ideal"])))
    for used, s in rng.sample(every, 12):
        width = s.tp * s.cp * s.dp
        counts = {j: g // width for j, g in enumerate(used) if g}
        profs = {j: profile(TINY, clusters[j], setup, s) for j in counts}
        low = bound_s([item_floors_s(profs[j]) for j in counts], list(counts.values()),
                      s.num_microbatches(setup.global_batch))
        for order in itertools.permutations(counts):
            stage_pool = stage_pools(order, tuple(counts[j] for j in order))
            for cuts in itertools.combinations(range(1, TINY.layers), s.pp - 1):
                terms = pool_terms(profs, stage_pool, LINK, list(pairwise((0, *cuts, TINY.layers))))
                assert low <= split_step(terms, s.num_microbatches(setup.global_batch), 1)[0] * (1 + 1e-12)


WIDE = ModelSpec(name="wide", layers=6, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
                 seq_len=2048)
"""six layers of Llama 3 405B's width: where a pipeline over 16 GPUs fits depends on its strategy"""


@pytest.mark.parametrize("seed", range(3))
def test_the_layer_memory_floor_is_below_every_stage(seed):
    """cost/step.layer_memory_floor_bytes: a stage's peak is at least the reserve plus its
    layers' floors, for random strategies, stage positions, ranges and recompute counts (the
    memory check of pipelines over pools, pool_stages.may_fit, rests on it)."""
    import numpy as np

    from planner.cost.memory import RUNTIME_RESERVED_BYTES
    from planner.cost.step import layer_memory_floor_bytes, stage_memory_bytes
    rng = random.Random(seed)
    model = rng.choice([WIDE, load_model("mixtral-8x7b"), load_model("deepseek-v3")])
    cluster = mix(2, 2)
    setup = job(model, cluster, 32, 32, "ideal")
    every = list(candidates(model, cluster, setup, {}, pool_rules(RUNTIME_RULES["ideal"])))
    for _, s in rng.sample(every, min(10, len(every))):
        prof = profile(model, rng.choice([H100, A100]), setup, s)
        floor = layer_memory_floor_bytes(prof)
        for _ in range(20):
            a = rng.randrange(model.layers)
            b = rng.randrange(a + 1, model.layers + 1)
            i = rng.randrange(s.pp)
            r = rng.randrange(b - a + 1)
            held = stage_memory_bytes(prof, i, [(a, b)], r if s.recompute == "full" else 0)
            assert RUNTIME_RESERVED_BYTES + floor[a:b].sum() <= held * (1 + 1e-12)
        assert np.all(floor > 0)


def test_a_pipeline_the_memory_check_drops_has_no_split_that_fits():
    """pool_stages.may_fit False proves that no order of the pools and no split fits (brute
    force over both), and it does drop some of the candidates of a model that fits only some
    ways; the search's plan is the one it finds without the check, and where nothing fits it
    prices nothing."""
    from unittest import mock

    import planner.search.pool_stages as ps

    cluster = mix(1, 1)
    setup = job(WIDE, cluster, 16, 16, "ideal")
    clusters = [p.cluster for p in cluster.pools]
    dropped = 0
    for used, s in candidates(WIDE, cluster, setup, {}, pool_rules(RUNTIME_RULES["ideal"])):
        counts = {j: g // (s.tp * s.cp * s.dp) for j, g in enumerate(used) if g}
        profs = {j: profile(WIDE, clusters[j], setup, s) for j in counts}
        if ps.may_fit(profs, counts, clusters, setup):
            continue
        dropped += 1
        for order in itertools.permutations(counts):
            stage_pool = stage_pools(order, tuple(counts[j] for j in order))
            for cuts in itertools.combinations(range(1, WIDE.layers), s.pp - 1):
                terms = pool_terms(profs, stage_pool, LINK, list(pairwise((0, *cuts, WIDE.layers))))
                assert any(terms["memory"][i] > capacity_bytes(clusters[j], setup) for i, j in enumerate(stage_pool))
    assert dropped
    checked = best_pool_stages(WIDE, cluster, setup, {}, RUNTIME_RULES["ideal"], top=2)
    with mock.patch.object(ps, "may_fit", lambda *_: True):
        unchecked = best_pool_stages(WIDE, cluster, setup, {}, RUNTIME_RULES["ideal"], top=2)
    assert (checked.best, checked.alternatives) == (unchecked.best, unchecked.alternatives)
    # a model no pipeline over these pools holds is answered without one split DP (it took minutes)
    dsv3 = load_model("deepseek-v3")
    none = best_pool_stages(dsv3, cluster, job(dsv3, cluster, 16, 16, "ideal"), {}, RUNTIME_RULES["ideal"])
    assert none.best is None and none.considered > 0 and none.priced == 0


def test_stages_on_one_pool_are_priced_as_that_pool_alone():
    """cost/pools.estimate_on_pools with every stage on one pool is step.estimate on its cluster:
    nothing crosses between pools, and every term is the pool's own."""
    model = load_model("llama3-8b")
    cluster = mix(2, 2)
    setup = job(model, cluster, 16, 64)
    s = next(s for _, s in candidates(model, cluster, replace(setup, gpus=32), {},
                                      pool_rules(RUNTIME_RULES["megatron"])) if s.pp == 4)
    s = replace(s, dp=s.dp // 2)
    bounds = [(0, 9), (9, 17), (17, 25), (25, 32)]
    for j, c in enumerate((H100, A100)):
        pooled = estimate_on_pools(model, (H100, A100), LINK, setup, s, (j,) * 4, bounds)
        alone = estimate(model, c, setup, s, bounds=bounds)
        assert pooled == alone


def test_a_send_across_pools_is_priced_on_the_link_between_them():
    """Each stage next to another pool's has one of its two sends per micro-batch on the link
    between the pools (comm.pools_p2p_s) instead of its pool's."""
    model, cluster = load_model("llama3-8b"), mix(1, 1)
    setup = job(model, cluster, 16, 64)
    s = next(s for _, s in candidates(model, cluster, setup, {}, pool_rules(RUNTIME_RULES["megatron"]))
             if s.pp == 4 and s.tp == 4)
    profs = {0: profile(model, H100, setup, s), 1: profile(model, A100, setup, s)}
    slow = LinkTier(Bps=12.5e9, latency_s=10e-6, busbw_Bps=10e9)
    extra = crossing_s(profs, (0, 0, 1, 1), slow)
    assert extra[0] == extra[3] == 0.0 and extra[1] > 0.0 and extra[2] > 0.0
    msg = 2048 * s.micro_batch * model.hidden * 2 / s.tp
    assert extra[1] == pytest.approx(msg / 10e9 + 10e-6 - profs[0].p2p_s / 2, rel=1e-12)
    assert extra[2] == pytest.approx(msg / 10e9 + 10e-6 - profs[1].p2p_s / 2, rel=1e-12)


@pytest.fixture(scope="module")
def bench_mix():
    model, cluster = load_model("llama3-70b"), load_cluster("h100-plus-a100")
    request = dict(global_batch=384, seq_len=4096, precision="bf16", attention="flash", constraints={}, top=3)
    return make_plan(model, cluster, 96, **request, runtime="supported")


def test_the_bench_mix_runs_one_pipeline_over_both_pools_on_megatron(bench_mix):
    """The default space (the supported runtimes) plans the bench mix as one pipeline over both
    pools, faster than either pool alone by more than the tie tolerance, runnable on Megatron-LM
    (the record's pool_stages), every stage within its own pool's memory."""
    doc = bench_mix
    assert [p["used_gpus"] for p in doc["pools"]] == [p["gpus"] for p in doc["pools"]]  # every GPU used
    pools = [st["pool"] for st in doc["stages"]]
    assert set(pools) == {"h100", "a100"} and pools == sorted(pools, key=pools.index)  # blocks, not interleaved
    assert [r["runtime"] for r in doc["runnable_on"]] == ["megatron"]
    for alternative in doc["alternatives"]:  # every pool alone is slower by more than the tie tolerance
        if alternative["why_not"].startswith("pool "):
            assert doc["prediction"]["step_time_s"] * (1 + TIE_TOLERANCE) < alternative["step_time_s"]
    by_pool = {p["name"]: p for p in doc["pools"]}
    for st in doc["stages"]:
        tr = doc["inputs"]["training"]
        setup = TrainingSetup(gpus=tr["gpus"], global_batch=tr["global_batch"], seq_len=tr["seq_len"],
                              memory_headroom=tr["memory_headroom"])  # the plan's headroom (the default, 5 %)
        capacity = capacity_bytes(H100 if st["pool"] == "h100" else A100, setup) / 2**30
        assert st["memory_gib"] <= capacity
        lo, hi = by_pool[st["pool"]]["stages"]
        assert lo <= st["index"] <= hi
    assert doc["prediction"]["fits"] and doc["strategy"]["vpp"] == 1
    assert doc["placement"]["tiers"]["pp"] == "between_pools"
    # each pool's MFU is its stages' model FLOPs over its own GPUs' peak: together, the plan's
    peaks = {"h100": H100.gpu.flops("bf16"), "a100": A100.gpu.flops("bf16")}
    rates = sum(p["mfu"] * p["used_gpus"] * peaks[p["name"]] for p in doc["pools"])
    assert rates == pytest.approx(doc["prediction"]["mfu"] * sum(p["used_gpus"] * peaks[p["name"]]
                                                                 for p in doc["pools"]), rel=1e-4)
    check(json.loads(json.dumps(doc)), PLAN_SCHEMA)


def test_megatron_gets_the_layout_and_the_node_order_and_the_others_refuse(bench_mix, tmp_path):
    """The Megatron export names every stage's layers (--pipeline-model-parallel-layout, parsed
    and validated by megatron-core's own PipelineParallelLayerLayout) and which node ranks each
    pool takes; every other runtime refuses, naming the capability."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    path = tmp_path / "mix.json"
    path.write_text(json.dumps(bench_mix))
    result = run("export", str(path), "--to", "megatron", "--format", "launch")
    assert result.returncode == 0, result.stderr
    layout = result.stdout.split("--pipeline-model-parallel-layout ")[1].split(" \\")[0].strip("'")
    counts = [st["layers"][1] - st["layers"][0] for st in bench_mix["stages"]]
    parsed = PipelineParallelLayerLayout(layout, len(counts))
    parsed.validate_layer_layout(80, 0)
    assert [sum(1 for x in row[0] if x.name == "decoder") for row in parsed.layout] == counts
    start = 0
    for p in sorted(bench_mix["pools"], key=lambda p: p["stages"][0]):
        nodes = p["used_gpus"] // load_cluster(p["cluster"]).gpus_per_node
        ranks = f"NODE_RANK {start}" + (f"..{start + nodes - 1}" if nodes > 1 else "")
        assert f"pool {p['name']}: {ranks}" in result.stdout
        start += nodes
    from planner.errors import ExportError
    from planner.export import export
    for runtime in ("deepspeed", "nanotron"):
        with pytest.raises(ExportError, match="does not run a pipeline over pools of different GPUs"):
            export(bench_mix, runtime)
    from runtime_checks import check_megatron
    check_megatron(bench_mix)


def test_torchtitan_runs_a_pipeline_over_pools_with_each_stages_modules():
    """torchtitan's record runs pipelines over pools too (module_fqns_per_model_part: each
    stage's own modules): planned in its space, both its versions read the export (its own
    ConfigManager), each stage's modules are its planned layers, and the NODE_RANKs each pool's
    nodes take are written beside the launch."""
    from planner.export import export
    from runtime_checks import check_torchtitan

    model, cluster = load_model("llama3-8b"), load_cluster("h100-plus-a100")
    doc = make_plan(model, cluster, 96, global_batch=384, seq_len=4096, precision="bf16", attention="flash",
                    constraints={}, top=0, runtime="torchtitan")
    assert {st["pool"] for st in doc["stages"]} == {"h100", "a100"}
    assert {r["runtime"] for r in doc["runnable_on"]} == {"torchtitan", "torchtitan@0.2"}
    check_torchtitan(doc)
    text = export(doc, "torchtitan")
    parts = text.split("module_fqns_per_model_part = [")[1].split("    ]")[0].strip().splitlines()
    assert [part.count("'layers.") for part in parts] == [st["layers"][1] - st["layers"][0] for st in doc["stages"]]
    start = 0
    for name, group in itertools.groupby(st["pool"] for st in doc["stages"]):
        stages = len(list(group))
        per_node = load_cluster(next(p["cluster"] for p in doc["pools"] if p["name"] == name)).gpus_per_node
        nodes = stages * doc["inputs"]["training"]["gpus"] // doc["strategy"]["pp"] // per_node
        assert f"pool {name}: NODE_RANK {start}..{start + nodes - 1}" in text
        assert f"pool {name}: NODE_RANK {start}..{start + nodes - 1}" in export(doc, "torchtitan@0.2")
        start += nodes


@pytest.mark.parametrize("model, gpus", [("llama3-8b", 96), ("llama3-70b", 96)])
def test_the_plan_is_the_pipeline_over_pools_where_it_beats_every_pool_alone(model, gpus):
    """The plan on a mixed cluster is the pipeline over pools that search/pool_stages finds below
    every pool's own plan by more than the tie tolerance (the pools alone are its runners-up)."""
    mixed, m = load_cluster("h100-plus-a100"), load_model(model)
    request = dict(global_batch=64, seq_len=2048, precision="bf16", attention="flash", constraints={}, top=3)
    alone = [make_plan(m, p.cluster, min(gpus, p.gpus), **request, runtime="supported") for p in mixed.pools]
    doc = make_plan(m, mixed, gpus, **request, runtime="supported")
    found = best_pool_stages(m, mixed, job(m, mixed, gpus, 64), {}, RUNTIME_RULES["megatron"], top=3)
    assert doc["prediction"]["step_time_s"] == pytest.approx(found.best.step_time_s, rel=1e-5)
    assert [st["pool"] for st in doc["stages"]] == [mixed.pools[j].name for j in found.best.stage_pool]
    assert all(doc["prediction"]["step_time_s"] * (1 + TIE_TOLERANCE) < d["prediction"]["step_time_s"] for d in alone)
    # the runners-up: the three fastest other pipelines over pools, then every pool alone
    pipelines = [a for a in doc["alternatives"] if a["why_not"].startswith("a pipeline over pools")]
    assert [a["step_time_s"] for a in pipelines] == pytest.approx([c.step_time_s for c in found.alternatives][:3],
                                                                  rel=1e-5) and len(pipelines) == 3
    assert sorted(a["step_time_s"] for a in doc["alternatives"] if a not in pipelines) == sorted(
        d["prediction"]["step_time_s"] for d in alone)
    assert [a["step_time_s"] for a in doc["alternatives"]] == sorted(a["step_time_s"] for a in doc["alternatives"])


def test_a_pipeline_over_pools_reads_back_checks_and_goes_stale_when_a_stage_moves(bench_mix):
    doc = bench_mix
    assert check_plan(doc, 0.02)["verdict"] == "ok"
    moved = copy.deepcopy(doc)
    moved["stages"][0]["pool"], moved["stages"][-1]["pool"] = moved["stages"][-1]["pool"], moved["stages"][0]["pool"]
    verdict = check_plan(moved, 0.02)
    assert verdict["verdict"] == "stale" and "stages[0].pool" in verdict["reason"]


def test_gpus_of_two_collective_libraries_share_no_runnable_pipeline(bench_mix):
    """NCCL and RCCL do not interoperate, and Megatron's launch runs one process count a node
    (runtimes.pool_stages_refusal): Megatron's space has no pipeline over MI300X and H100 pools,
    nor over nodes of 8 and 4 GPUs, the ideal space has both, and the Megatron export refuses
    such a plan, naming what it has."""
    from planner.errors import ExportError
    from planner.export import export

    model = load_model("llama3-8b")
    cluster = mix(1, 1, clusters=(MI300X, H100))
    none = best_pool_stages(model, cluster, job(model, cluster, 16, 64), {}, RUNTIME_RULES["megatron"])
    assert none.best is None and none.considered == 0
    assert best_pool_stages(model, cluster, job(model, cluster, 16, 64, "ideal"), {}, RUNTIME_RULES["ideal"]).best
    four = replace(A100, gpus_per_node=4)
    odd = mix(2, 2, clusters=(H100, four))
    assert best_pool_stages(model, odd, job(model, odd, 24, 64), {}, RUNTIME_RULES["megatron"]).considered == 0
    assert best_pool_stages(model, odd, job(model, odd, 24, 64, "ideal"), {}, RUNTIME_RULES["ideal"]).considered
    small_nodes = copy.deepcopy(bench_mix)
    small_nodes["inputs"]["cluster"]["pools"][1]["cluster"]["gpus_per_node"] = 4
    with pytest.raises(ExportError, match="does not run pools of 4 and 8 GPUs a node"):
        export(small_nodes, "megatron")
    amd = copy.deepcopy(bench_mix)
    amd["inputs"]["cluster"]["pools"][1]["cluster"]["gpu"]["family"] = "cdna3"
    with pytest.raises(ExportError, match=r"does not run stages on GPUs of NCCL and RCCL \(one collective library "
                                          r"per job: NCCL and RCCL do not interoperate\)"):
        export(amd, "megatron")


def test_the_pool_alone_note_says_what_was_searched_over_the_pools():
    """With pp 1 fixed no pipeline spans the pools: the plan takes the best pool alone and its note
    says the space had none (not that none was faster); with one searched but slower, it says that;
    either way, that batch shares are searched in the ideal space only."""
    cluster = mix(1, 1)
    request = dict(global_batch=24, seq_len=2048, precision="bf16", attention="flash", top=0, runtime="supported")
    doc = make_plan(TINY, cluster, 16, constraints={"pp": 1}, **request)
    assert sum(1 for p in doc["pools"] if p["used_gpus"]) == 1 and not any("pool" in st for st in doc["stages"])
    assert any("has no pipeline over these pools" in n and "ideal space only" in n for n in doc["notes"])
    h100_alone = make_plan(load_model("llama3-8b"), load_cluster("h100-plus-a100"), 40, constraints={}, **request)
    assert any(f"No plan of one pipeline over the pools is faster by more than {TIE_TOLERANCE:.0%}" in n
               and "ideal space only" in n
               for n in h100_alone["notes"])


def test_a_pipeline_over_pools_where_no_pool_fits_alone():
    """llama3-70b on 16 H100s or 16 A100s alone does not fit at this batch; over both pools it
    does: the plan says why each pool has no plan alone, its runners-up are other pipelines only, and reads as any plan
    (the report, the schema)."""
    from planner import report

    model, cluster = load_model("llama3-70b"), mix(2, 2)
    doc = make_plan(model, cluster, 32, global_batch=32, seq_len=2048, precision="bf16", attention="flash",
                    constraints={}, top=3, runtime="supported")
    assert all("why_not" in p and "step_time_s" not in p for p in doc["pools"])
    assert {st["pool"] for st in doc["stages"]} == {"p0", "p1"}
    assert all(a["why_not"].startswith("a pipeline over pools") for a in doc["alternatives"])  # no pool alone
    assert doc["search"]["considered"] == 0 and doc["search"]["pool_stage_candidates"] > 0
    report.plan_table(doc)
    check(json.loads(json.dumps(doc)), PLAN_SCHEMA)


@pytest.mark.parametrize("seed", range(6))
def test_in_the_default_space_a_mix_is_bounded_by_its_best_pool_and_by_its_pools_all_of_the_better_gpu(seed):
    """Issue 15's property where pipelines over pools are searched (the supported runtimes):
    over random mixes of H100 and A100-80G nodes, the plan is never slower than the best plan on
    one pool alone, and never faster than the same pools all H100 (at least as good in every
    figure) by more than the tie tolerance: the all-H100 mix has every pipeline the mix has, each
    stage at most as slow."""
    rng = random.Random(seed)
    nodes = (rng.choice([1, 2]), rng.choice([1, 2, 3]))
    mixed, better = mix(*nodes), mix(*nodes, clusters=(H100, H100))
    model = rng.choice([TINY, load_model("llama3-8b")])
    request = dict(global_batch=rng.choice([16, 24, 48]), seq_len=rng.choice([1024, 2048]), precision="bf16",
                   attention="flash", constraints={}, top=0, runtime="supported")
    step = make_plan(model, mixed, mixed.gpus, **request)["prediction"]["step_time_s"]
    for pool in mixed.pools:
        alone = make_plan(model, pool.cluster, pool.gpus, **request)["prediction"]["step_time_s"]
        assert step <= alone * (1 + 1e-9)
    assert make_plan(model, better, better.gpus, **request)["prediction"]["step_time_s"] <= step * (1 + TIE_TOLERANCE)


@pytest.mark.parametrize("runtime", [n for n, r in RUNTIME_RULES.items() if r.pool_stages != "none"])
def test_every_pipeline_over_pools_a_runtime_is_searched_for_is_one_its_record_runs(runtime):
    """search/pool_stages.candidates yields only strategies the runtime's own record runs
    (RuntimeRules.refusal: torchtitan's ZeRO-0 only alone, its ZeRO stages, ...)."""
    model, cluster = load_model("llama3-8b"), mix(1, 2)
    rules = RUNTIME_RULES[runtime]
    every = list(candidates(model, cluster, job(model, cluster, 24, 48, runtime), {}, pool_rules(rules)))
    assert every and not [s for _, s in every if rules.refusal(s, model)]


def test_the_runners_up_of_several_runtimes_searches_are_the_fastest_of_all():
    """In the supported space Megatron-LM's and torchtitan's pipelines over pools are searched
    each: the plan is the most conventional within the tie tolerance of the fastest of both, its
    pipeline runners-up the three fastest others of both, each labelled with its runtime."""
    model, cluster = load_model("llama3-8b"), load_cluster("h100-plus-a100")
    doc = make_plan(model, cluster, 96, global_batch=384, seq_len=4096, precision="bf16", attention="flash",
                    constraints={}, top=3, runtime="supported")
    every = []
    for runtime in ("megatron", "torchtitan"):
        r = best_pool_stages(model, cluster, job(model, cluster, 96, 384, runtime, seq=4096), {},
                             RUNTIME_RULES[runtime], top=50)
        every += [r.best, *r.alternatives]
    steps = sorted(c.step_time_s for c in every)
    assert doc["prediction"]["step_time_s"] == pytest.approx(steps[0], rel=1e-5)
    pipelines = [a for a in doc["alternatives"] if a["why_not"].startswith("a pipeline over pools")]
    assert [a["step_time_s"] for a in pipelines] == pytest.approx(steps[1:4], rel=1e-5)
    assert all(a["runtime"] in ("megatron", "torchtitan") for a in pipelines)
