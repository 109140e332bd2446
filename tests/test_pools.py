"""Mixed clusters (issue 15, first step): the `pools:` spec, its errors, and plans that take the
best pool alone (each pool's exact search, brute force over the pools), the others idle and said so."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import one_error_line, run
from planner.errors import InfeasibleError, PlannerError, SpecError
from planner.planning import estimate_plan, make_plan, sweep
from planner.schema import PLAN_SCHEMA, check
from planner.spec.hardware import Cluster, load_cluster
from planner.spec.model import load_model
from planner.spec.pools import MixedCluster

SETUP = dict(global_batch=64, seq_len=2048, precision="bf16", attention="flash", runtime="supported",
             constraints={}, top=0)


def spec(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("name, pools, gpus", [("h100-plus-a100", ("h100", "a100"), 96),
                                               ("b200-plus-h100", ("b200", "h100"), 160)])
def test_the_mixed_presets_load_as_pools_of_plain_clusters(name, pools, gpus):
    mixed = load_cluster(name)
    assert isinstance(mixed, MixedCluster) and tuple(p.name for p in mixed.pools) == pools
    assert mixed.gpus == gpus and all(isinstance(p.cluster, Cluster) for p in mixed.pools)
    assert mixed.between_pools is not None and mixed.gpus_per_node == 8


@pytest.mark.parametrize("data, phrase", [
    ({"pools": []}, "pools: expected a list"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "nodes": 1}, {"name": "a", "cluster": "dgx-b200", "nodes": 1}],
      "between_pools": {"GBps": 50}}, "pools[1].name: 'a' names two pools"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "nodes": 1}, {"name": "b", "cluster": "dgx-b200", "nodes": 1}]},
     "between_pools: missing (required with two pools or more)"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "nodes": 0}]}, "pools[0].nodes: expected an integer >= 1"),
    ({"pools": [{"name": "a", "cluster": "h100-plus-a100", "nodes": 1}]}, "is itself a mixed cluster"),
    ({"pools": [{"name": "a", "cluster": 7, "nodes": 1}]}, "pools[0].cluster: expected a cluster preset name"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "nodes": 1, "gpu": "x"}]}, "pools[0].gpu: unknown key"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "nodes": 1}], "bandwidth": 1}, "bandwidth: unknown key"),
])
def test_a_bad_pools_spec_is_one_error_line_naming_the_field(tmp_path, data, phrase):
    path = spec(tmp_path, "bad", data)
    line = one_error_line(run("plan", "-m", "llama3-8b", "-c", path, "--gpus", "8", "--global-batch", "64"))
    assert phrase in line and path in line


def test_an_inline_pool_cluster_loads():
    mixed = load_cluster("h100-plus-a100")
    inline = {"name": "x", "pools": [{"name": "p", "nodes": 2, "cluster": mixed.pools[0].cluster.to_dict()}]}
    from planner.spec.pools import mixed_from_dict
    assert mixed_from_dict(inline, "inline").pools[0].cluster.gpu == mixed.pools[0].cluster.gpu


def test_a_one_pool_spec_plans_as_the_cluster_written_plainly(tmp_path):
    """Issue 15: `planner diff` exits 0 between the plan on a one-pool spec and on its cluster."""
    path = spec(tmp_path, "one", {"pools": [{"name": "only", "cluster": "dgx-h100", "nodes": 4}]})
    args = ["-m", "llama3-8b", "--gpus", "32", "--global-batch", "64", "--seq-len", "4096"]
    assert run("plan", *args, "-c", path, "-o", str(tmp_path / "pooled.json")).returncode == 0
    assert run("plan", *args, "-c", "dgx-h100", "-o", str(tmp_path / "plain.json")).returncode == 0
    result = run("diff", str(tmp_path / "plain.json"), str(tmp_path / "pooled.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    pooled = json.loads((tmp_path / "pooled.json").read_text())
    assert pooled["pools"] == [{"name": "only", "cluster": "dgx-h100", "gpu": "h100-sxm-80g", "gpus": 32,
                                "used_gpus": 32, "step_time_s": pooled["prediction"]["step_time_s"]}]
    line = one_error_line(run("plan", *args[:2], "--gpus", "64", *args[4:], "-c", path))
    assert "has 32 GPUs" in line


@pytest.mark.parametrize("model, gpus", [("llama3-8b", 40), ("llama2-7b", 16), ("llama3-70b", 40)])
def test_the_plan_is_the_best_pool_alone(model, gpus):
    """Brute force over the pools: where no pipeline over the pools is faster (here 8 A100s or
    none beside the H100s: tests/test_pool_stages.py has the mixes where one is), the plan is the
    fastest of each pool's own plan with as many of the GPUs as it holds (ties to the earlier
    pool), its document that pool's plan, and the rest are listed idle with the step time they
    reach alone."""
    mixed, m = load_cluster("h100-plus-a100"), load_model(model)
    alone = []
    for pool in mixed.pools:
        try:
            alone.append((make_plan(m, pool.cluster, min(gpus, pool.gpus), **SETUP), pool))
        except PlannerError:
            alone.append((None, pool))
    doc = make_plan(m, mixed, gpus, **SETUP)
    best, pool = min(((d, p) for d, p in alone if d), key=lambda x: x[0]["prediction"]["step_time_s"])
    assert doc["strategy"] == best["strategy"] and doc["prediction"] == best["prediction"]
    assert doc["inputs"]["cluster"]["name"] == pool.cluster.name
    for entry, (d, p) in zip(doc["pools"], alone):
        assert entry["used_gpus"] == (doc["inputs"]["training"]["gpus"] if p is pool else 0)
        assert entry.get("step_time_s") == (d["prediction"]["step_time_s"] if d else None)
    assert any(f"runs on pool {pool.name} alone" in n for n in doc["notes"])
    check(json.loads(json.dumps(doc)), PLAN_SCHEMA)  # the schema's pools entries


def test_no_pool_with_a_plan_says_why_for_each():
    mixed, m = load_cluster("h100-plus-a100"), load_model("llama3-405b")
    with pytest.raises(InfeasibleError, match="no pool of h100-plus-a100 has a plan on its own; h100: .*; a100: "):
        make_plan(m, mixed, 16, **{**SETUP, "seq_len": 8192})


def test_sweeps_and_forecasts_plan_each_count_pool_by_pool():
    mixed, m = load_cluster("b200-plus-h100"), load_model("llama3-8b")
    request = dict(model=m, cluster=mixed, **SETUP)
    entries = sweep(request, [32, 64], workers=1)
    for e in entries:
        assert e["plan"] == make_plan(m, mixed, e["gpus"], **SETUP) | {"planner_version": e["plan"]["planner_version"]}
    result = run("forecast", "-m", "llama3-8b", "-c", "b200-plus-h100", "--gpus", "32,64", "--global-batch", "64",
                 "--seq-len", "2048", "--tokens", "1e10", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    # 32 GPUs: the B200 pool alone; 64: one pipeline over both pools (tests/test_pool_stages.py)
    assert [r["cluster"] for r in rows] == ["b200-plus-h100"] * 2
    assert [r["gpu"] for r in rows] == ["b200", "b200+h100-sxm-80g"]


def test_estimate_asks_for_one_kind_of_gpu():
    with pytest.raises(SpecError, match="estimate prices one strategy on one kind of GPU"):
        estimate_plan(load_model("llama3-8b"), load_cluster("h100-plus-a100"), 8, 64, 2048, "bf16", "flash",
                      "megatron", {})


@pytest.mark.parametrize("seed", range(6))
def test_a_mixed_plan_is_bounded_by_its_best_pool_and_by_a_cluster_all_of_the_better_gpu(seed):
    """Issue 15's property over random mixes of H100 and A100-80G nodes (the H100 is at least as
    good in every figure: peak, HBM, memory, links): the mixed plan is never slower than the best
    plan on any one pool alone, and never faster than the same GPU count all H100 (to the 1 %
    tie tolerance: each plan is the most conventional within 1 % of its fastest)."""
    import random

    from planner.search.space import TIE_TOLERANCE
    from planner.spec.pools import MixedCluster, Pool

    rng = random.Random(seed)
    h100, a100 = load_cluster("dgx-h100"), load_cluster("dgx-a100-80g")
    pools = (Pool("h100", h100, rng.choice([1, 2, 4])), Pool("a100", a100, rng.choice([1, 2, 4, 8])))
    mixed = MixedCluster("mix", pools, h100.inter_node)
    m = load_model(rng.choice(["llama3-8b", "llama2-7b", "llama3-70b"]))
    setup = {**SETUP, "global_batch": rng.choice([64, 128, 256]), "seq_len": rng.choice([2048, 4096])}
    try:
        mixed_s = make_plan(m, mixed, mixed.gpus, **setup)["prediction"]["step_time_s"]
    except PlannerError:
        return  # no pool fits the model
    for pool in pools:
        try:
            alone = make_plan(m, pool.cluster, pool.gpus, **setup)["prediction"]["step_time_s"]
        except PlannerError:
            continue
        assert mixed_s <= alone
    all_h100 = make_plan(m, h100, mixed.gpus, **setup)["prediction"]["step_time_s"]
    assert all_h100 <= mixed_s * (1 + TIE_TOLERANCE)
