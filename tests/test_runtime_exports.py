"""`plan --runtime X` never produces a plan the X exporter refuses (each setup below pushes the
search towards one of the refusals: ZeRO >= 2 with pipelines, interleaving, context parallelism,
per-stage recompute counts, replication with model parallelism, uneven splits)."""

import functools
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.export import export
from planner.planning import SUPPORTED, estimate_plan, make_plan
from planner.runtimes import RUNTIME_RULES, TARGETS
from planner.search import space
from planner.spec.training import STRATEGY_KNOBS, RunOptions, TrainingSetup, resolve_strategy
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from runtime_checks import CHECKS

SETUPS = [
    # (model, cluster, gpus, global batch, seq, constraints)
    ("llama3-8b", "dgx-a100-40g", 16, 64, 8192, {}),                 # memory-tight: ZeRO, recompute
    ("llama3-8b", "dgx-h100", 32, 32, 16384, {}),                     # long sequence: cp, pp
    ("llama3-70b", "dgx-h100", 64, 64, 4096, {"pp": 4}),              # pipelines: split, vpp
    ("llama3-70b", "dgx-a100-80g", 64, 128, 4096, {"pp": 8, "recompute": "full"}),  # recompute counts
]
RUNTIMES = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "torchtitan", "nanotron": "nanotron"}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: f"{s[0]}-{s[2]}gpu-{s[4]}")
def test_plan_for_a_runtime_exports_to_it(runtime, setup):
    model_name, cluster_name, gpus, batch, seq, constraints = setup
    if constraints.get("recompute", "none") not in RUNTIME_RULES[runtime].recompute_modes:
        with pytest.raises(PlannerError, match="no legal strategy"):  # nanotron 0.4 recomputes nothing
            make_plan(load_model(model_name), load_cluster(cluster_name), gpus=gpus, global_batch=batch,
                      seq_len=seq, precision="bf16", attention="flash", runtime=runtime, constraints=constraints, top=0)
        return
    plan = make_plan(load_model(model_name), load_cluster(cluster_name), gpus=gpus, global_batch=batch,
                     seq_len=seq, precision="bf16", attention="flash", runtime=runtime, constraints=constraints,
                     top=0)
    assert plan["inputs"]["training"]["runtime"] == runtime
    assert export(plan, RUNTIMES[runtime])


PROPERTY_MODELS = ("llama3-8b", "llama2-7b", "llama3-70b", "mixtral-8x7b", "gpt3-175b")
PROPERTY_CLUSTERS = ("dgx-h100", "dgx-a100-80g", "dgx-a100-40g")


@st.composite
def runtime_setups(draw):
    """A setup a user could bring: a preset decoder on a preset cluster, a GPU count, batch,
    sequence, precision and sometimes a constraint (the search may find nothing that fits)."""
    model = draw(st.sampled_from(PROPERTY_MODELS))
    cluster = draw(st.sampled_from(PROPERTY_CLUSTERS))
    gpus = draw(st.sampled_from([8, 16, 32, 64, 128, 256, 512]))
    batch = gpus * draw(st.sampled_from([1, 2, 4, 8]))
    seq = draw(st.sampled_from([2048, 4096, 8192, 16384]))
    precision = draw(st.sampled_from(["bf16", "fp8"] if cluster == "dgx-h100" else ["bf16", "fp16"]))
    constraints = draw(st.sampled_from([{}, {}, {"recompute": "full"}, {"pp": 2}, {"pp": 4}, {"zero": 1}]))
    return model, cluster, gpus, batch, seq, precision, constraints


NIGHTLY = os.environ.get("PLANNER_FUZZ_NIGHTLY") == "1"
"""the nightly profile (as tests/test_fuzz.py): 300 random setups per runtime, not 50 fixed ones"""


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@settings(max_examples=300 if NIGHTLY else 50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=not NIGHTLY)
@given(runtime_setups())
def test_every_plan_for_a_runtime_exports_to_it(runtime, setup):
    """Issue 12: wherever `plan --runtime R` succeeds, `export --to R` does not refuse (the
    search's legal space and the exporter read one capability record), and the runtime's own
    config code reads the export (runtime_checks). 50 setups a runtime in CI, 300 in the
    nightly profile (PLANNER_FUZZ_NIGHTLY=1)."""
    model, cluster, gpus, batch, seq, precision, constraints = setup
    try:
        plan = make_plan(load_model(model), load_cluster(cluster), gpus=gpus, global_batch=batch, seq_len=seq,
                         precision=precision, attention="flash", runtime=runtime, constraints=constraints, top=0)
    except PlannerError:
        return  # refused, or nothing fits: no plan to export
    assert export(plan, RUNTIMES[runtime])
    assert runtime in [r["runtime"] for r in plan["runnable_on"]]
    CHECKS[runtime](plan)  # and the runtime's own code reads the export
    knobs = {k: v for k, v in plan["strategy"].items() if k in STRATEGY_KNOBS}
    strategy = resolve_strategy(dict(knobs, order=plan["placement"]["order"]),
                                TrainingSetup(gpus=gpus, global_batch=batch, seq_len=seq, precision=precision,
                                              runtime=runtime))
    assert RUNTIME_RULES[runtime].refusal(strategy, load_model(model)) is None  # the record's own check agrees


def test_runnable_on_lists_exactly_the_runtimes_that_take_the_plan():
    """runnable_on names each runtime whose exporter takes the plan, with the version it was
    checked against; the others refuse it. The README's quick-start setup planned in the ideal
    space runs on none of them, and says so in its notes."""
    from planner.errors import ExportError
    from planner.export import CHECKED_AGAINST, EXPORTERS

    for runtime in ("ideal", "deepspeed"):
        plan = make_plan(load_model("llama3-70b"), load_cluster("dgx-h100"), gpus=64, global_batch=512, seq_len=4096,
                         precision="bf16", attention="flash", runtime=runtime, constraints={}, top=0)
        listed = {r["runtime"]: r["checked_against"] for r in plan["runnable_on"]}
        for name in EXPORTERS:
            try:
                export(plan, name)
                assert listed[name] == CHECKED_AGAINST[name]
            except ExportError:
                assert name not in listed
        if not listed:
            assert any("no supported runtime runs this plan" in n for n in plan["notes"])
    assert "deepspeed" in listed


def test_the_readme_export_commands_run_and_their_runtimes_read_the_output(tmp_path):
    """README's Export section: every line runs as written (in a scratch folder), and each
    runtime's own reading (runtime_checks) takes the plan it exported."""
    import re
    import shlex

    from conftest import REPO, run

    text = (REPO / "README.md").read_text()
    block = re.search(r"## Export\n.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [shlex.split(line.split("#")[0]) for line in block.strip().splitlines()]
    assert [c[1] for c in commands] == ["plan", "export"] * 4
    for command in commands:
        assert command[0] == "planner"
        result = run(*command[1:], cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)
    import json
    for runtime, name in (("megatron", "megatron"), ("deepspeed", "deepspeed"), ("torchtitan", "torchtitan"),
                          ("torchtitan@0.2", "torchtitan02")):
        plan = json.loads((tmp_path / f"{name}-plan.json").read_text())
        assert runtime in [r["runtime"] for r in plan["runnable_on"]]
        CHECKS[runtime](plan)
    assert (tmp_path / "planner_job.py").read_text().startswith('"""torchtitan 0.3 job')
    assert (tmp_path / "launch.sh").read_text().startswith("#!/usr/bin/env bash")


# ------------------------------------------------------------------ the default: every runtime's space

MATRIX = [
    # every decoder preset on its natural cluster, at three GPU counts: (model, cluster, seq, batch, counts)
    ("llama2-7b", "dgx-a100-80g", 4096, 1024, (8, 64, 256)),
    ("llama2-70b", "dgx-a100-80g", 4096, 1024, (64, 256, 1024)),
    ("gpt3-175b", "dgx-a100-80g", 2048, 1536, (384, 768, 1536)),
    ("llama3-8b", "dgx-h100", 8192, 512, (8, 64, 512)),
    ("llama3-70b", "dgx-h100", 8192, 1024, (64, 256, 1024)),
    ("llama3-405b", "dgx-h100", 8192, 2048, (1024, 4096, 16384)),
    ("qwen2.5-72b", "dgx-h100", 4096, 1024, (64, 256, 1024)),
    ("mixtral-8x7b", "dgx-h100", 4096, 1024, (64, 256, 1024)),
    ("deepseek-v3", "dgx-h100", 4096, 4096, (256, 1024, 2048)),
]


def test_the_matrix_names_every_decoder_preset():
    from planner.presets import preset_names
    decoders = {n for n in preset_names("models") if load_model(n).causal and not load_model(n).is_graph}
    assert {m for m, *_ in MATRIX} == decoders


@pytest.mark.parametrize("model, cluster, seq, batch, gpus",
                         [(m, c, s, b, g) for m, c, s, b, counts in MATRIX for g in counts],
                         ids=lambda v: str(v))
def test_the_default_plan_runs_on_a_supported_runtime(model, cluster, seq, batch, gpus):
    """Issue 12: without --runtime, the plan comes from the union of the supported runtimes'
    spaces; it lists where it runs, exports to each of them without refusal, and each runtime's
    own code reads the export (runtime_checks)."""
    plan = _default_plan(model, cluster, seq, batch, gpus)
    runs_on = [r["runtime"] for r in plan["runnable_on"]]
    assert plan["inputs"]["training"]["runtime"] in runs_on
    for runtime in runs_on:
        assert export(plan, runtime)
        if runtime in CHECKS:
            CHECKS[runtime](plan)


@functools.lru_cache(maxsize=None)
def _default_plan(model: str, cluster: str, seq: int, batch: int, gpus: int) -> dict:
    return make_plan(load_model(model), load_cluster(cluster), gpus=gpus, global_batch=batch, seq_len=seq,
                     precision="bf16", attention="flash", runtime=SUPPORTED, constraints={}, top=0)


def test_no_default_plan_predicts_more_than_three_points_above_the_best_published_mfu():
    """Issue 11: over the matrix, a plan on a GPU with calibration rows (A100-80G, H100) predicts
    no MFU more than 3 points above the best published for that GPU and precision
    (planner/data/best_mfu.yaml, each entry with its source)."""
    from planner.bands import best_published_mfu
    from planner.runs import BUNDLED, load_runs

    calibrated = {r.cluster.gpu.name for r in load_runs(BUNDLED)}
    checked = 0
    for model, cluster, seq, batch, counts in MATRIX:
        gpu = load_cluster(cluster).gpu.name
        if gpu not in calibrated:
            continue
        best, source = best_published_mfu(gpu, "bf16")
        for gpus in counts:
            mfu = _default_plan(model, cluster, seq, batch, gpus)["prediction"]["mfu"]
            assert mfu <= best + 0.03, (model, gpus, mfu, best, source)
            checked += 1
    assert checked == 27


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: f"{s[0]}-{s[2]}gpu-{s[4]}")
def test_the_default_plan_is_the_fastest_of_the_runtimes_plans(setup):
    """The union's search is exact for the tie rule: its plan lies within space.TIE_TOLERANCE of
    the fastest of the plans each supported runtime's own search finds, and is at least as
    conventional as every one of them within it (ties to the faster); each runtime's own plan is
    listed beside it, and the runners-up are the next fastest of all, each strategy once."""
    model_name, cluster_name, gpus, batch, seq, constraints = setup
    model, cluster = load_model(model_name), load_cluster(cluster_name)

    def plan(runtime, top=2):
        try:
            return make_plan(model, cluster, gpus=gpus, global_batch=batch, seq_len=seq, precision="bf16",
                             attention="flash", runtime=runtime, constraints=constraints, top=top)
        except PlannerError:
            return None

    each = {r: plan(r) for r in TARGETS}
    union = plan(SUPPORTED)
    steps = [(p["prediction"]["step_time_s"], i, r) for i, (r, p) in enumerate(each.items()) if p]
    fastest = min(steps)
    limit = fastest[0] * (1 + space.TIE_TOLERANCE)
    g = min(cluster.gpus_per_node, gpus)

    def conventions(p):
        st = p["strategy"]
        return space.conventional(st["tp"], st["cp"], st["dp"], st["pp"], st["ep"], st["zero"], g)
    step = union["prediction"]["step_time_s"]
    assert step <= limit
    for p in each.values():
        if p and p["prediction"]["step_time_s"] <= limit:
            assert (conventions(union), step) <= (conventions(p), p["prediction"]["step_time_s"])
    listed = {e["runtime"]: e for e in union["best_per_runtime"]}
    assert list(listed) == list(TARGETS)
    for r, p in each.items():
        if p:
            assert listed[r]["step_time_s"] == p["prediction"]["step_time_s"]
            assert listed[r]["strategy"] == p["strategy"]
        else:
            assert "why_not" in listed[r]
    pool = sorted(((a["step_time_s"], i, k, json.dumps(a["strategy"], sort_keys=True))
                   for i, p in enumerate(each.values()) if p
                   for k, a in enumerate([{"step_time_s": p["prediction"]["step_time_s"], "strategy": p["strategy"]},
                                          *p["alternatives"]]) if not a.get("why_not", "").startswith("does not fit")))
    expected, seen = [], {json.dumps(union["strategy"], sort_keys=True)}
    for step, _, _, key in pool:
        if key not in seen and len(expected) < 2:
            seen.add(key)
            expected.append((step, key))
    got = [(a["step_time_s"], json.dumps(a["strategy"], sort_keys=True)) for a in union["alternatives"]
           if not a["why_not"].startswith("does not fit")]
    assert got == expected
    # each runtime's search pruning at the best step found so far (forecast sweeps) finds the same plan
    shared = make_plan(model, cluster, gpus=gpus, global_batch=batch, seq_len=seq, precision="bf16", attention="flash",
                       runtime=SUPPORTED, constraints=constraints, top=0, per_runtime=False)
    assert shared["strategy"] == union["strategy"] and "best_per_runtime" not in shared
    assert shared["prediction"] == union["prediction"]


def test_estimate_refuses_what_the_named_runtime_cannot_run_and_the_default_prices_who_can():
    """One record for search, estimate and export: `estimate --runtime deepspeed --cp 2` is refused
    as `plan` refuses it; without --runtime the strategy is priced as the fastest runtime that
    runs it, and one no supported runtime runs is priced in the ideal space, saying so."""
    from planner.errors import SpecError
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    args = dict(gpus=16, global_batch=64, seq_len=8192, precision="bf16", attention="flash")
    with pytest.raises(SpecError, match="deepspeed cannot run context parallelism"):
        estimate_plan(model, cluster, runtime="deepspeed", constraints={"cp": 2}, **args)
    doc = estimate_plan(model, cluster, runtime=SUPPORTED, constraints={"cp": 2}, **args)
    assert doc["inputs"]["training"]["runtime"] in ("megatron", "torchtitan")
    # ZeRO-2 under pipeline stages: Megatron has no ZeRO-2, DeepSpeed's pipeline engine stops at
    # ZeRO-1, torchtitan shards fully or not at all
    doc = estimate_plan(model, cluster, runtime=SUPPORTED, constraints={"pp": 2, "zero": 2}, **args)
    assert doc["inputs"]["training"]["runtime"] == "ideal"
    assert any("no supported runtime runs this strategy" in n for n in doc["notes"])
    for runtime in TARGETS:
        with pytest.raises(SpecError, match=f"runtime {runtime} cannot run"):
            estimate_plan(model, cluster, runtime=runtime, constraints={"pp": 2, "zero": 2}, **args)


def test_a_model_no_runtime_builds_is_planned_in_the_ideal_space_with_a_note():
    from pathlib import Path
    model = load_model(str(Path(__file__).parent / "data" / "toy-cnn.yaml"))
    plan = make_plan(model, load_cluster("dgx-h100"), gpus=8, global_batch=64, seq_len=None, precision="bf16",
                     attention="flash", runtime=SUPPORTED, constraints={}, top=0)
    assert plan["inputs"]["training"]["runtime"] == "ideal" and plan["inputs"]["runtimes"] == []
    assert plan["runnable_on"] == []
    assert any("no supported runtime builds" in n for n in plan["notes"])


# ------------------------------------------------------------------ Megatron-Core's rank generator

@pytest.mark.parametrize("pp, vpp", [(2, 2), (2, 3), (4, 2), (4, 3), (8, 2), (8, 4)])
def test_megatron_cores_config_interleaves_the_chunks_the_record_allows(pp, vpp):
    """Equal virtual chunks, or the first and the last one layer short with the embedding and the
    loss counted as layers: for every layer count, the Megatron record runs the interleaving
    exactly where megatron-core 0.16.0 builds every layer under some setting of the two flags
    (TransformerConfig accepts it and get_num_layers_to_build over the virtual stages sums to the
    layers), and under the flags the exporter sets each virtual stage gets the layers the plan
    priced (cost/pipeline.split_layers, chunk v*pp + r on rank r)."""
    import warnings

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no Transformer Engine or Apex on CPU
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
    from planner.cost.pipeline import split_layers

    def config(layers, embedding, loss):
        return TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                                 pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                                 pipeline_dtype=torch.bfloat16, account_for_embedding_in_pipeline_split=embedding,
                                 account_for_loss_in_pipeline_split=loss)
    chunks = pp * vpp

    def built(cfg):
        return [get_num_layers_to_build(cfg, vp_stage=c // pp, pp_rank=c % pp) for c in range(chunks)]

    def builds_all(layers, embedding, loss):
        try:
            return sum(built(config(layers, embedding, loss))) == layers
        except (ValueError, AssertionError):  # the config's checks, or get_num_layers_to_build's
            return False
    for layers in range(chunks, 4 * chunks + 1):
        runs = any(builds_all(layers, e, l) for e in (False, True) for l in (False, True))
        assert RUNTIME_RULES["megatron"].chunks_run(layers, pp, vpp) == runs, layers
        if not runs:
            continue
        sizes = [b - a for a, b in split_layers(layers, pp, vpp)]
        k = max(sizes)
        assert built(config(layers, sizes[0] == k - 1, sizes[-1] == k - 1)) == sizes, layers


def _megatron_generators(tp, cp, dp, pp, ep, order, etp=None):
    """The dense and expert RankGenerators megatron-core 0.16.0's initialize_model_parallel builds
    (expert tensor parallel etp, tp unless given; expert data parallel = world / (etp * ep * pp);
    cp 1)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no Transformer Engine or Apex on CPU
        from megatron.core.parallel_state import RankGenerator
    world, etp = tp * cp * dp * pp, etp or tp
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    return dense, expert


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]), st.sampled_from(RUNTIME_RULES["megatron"].orders))
def test_megatron_cores_rank_generator_forms_the_groups_the_plan_prices(tp, cp, dp, pp, ep, order):
    """Issue 12: for every rank order the Megatron record lets the search use, the groups the
    planner prices (placement.rank_groups: tp, cp, dp, pp, the dp x cp gradient group, the
    expert group carved from dp x cp and the expert data-parallel rest) are exactly those
    megatron-core 0.16.0's RankGenerator forms; a placement the record refuses is one
    initialize_model_parallel rejects (its two assertions)."""
    from planner.placement import rank_groups
    if (dp * cp) % ep:
        return  # ep divides dp * cp (the search's rule)
    dense, expert = _megatron_generators(tp, cp, dp, pp, ep, order)
    pp_last_ok = order.endswith("pp") or pp == 1 or (cp * dp) // ep == dp
    same_pp = dense.get_ranks("pp") == expert.get_ranks("pp")
    runs = RUNTIME_RULES["megatron"].order_runs(order, cp, pp, ep)
    assert runs == (pp_last_ok and same_pp)
    if not runs:
        return
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep}

    def ours(dim):
        return sorted(rank_groups(order, degrees, dim))

    for dim, theirs in (("tp", dense.get_ranks("tp")), ("cp", dense.get_ranks("cp")), ("dp", dense.get_ranks("dp")),
                        ("pp", dense.get_ranks("pp")), ("dpcp", dense.get_ranks("dp-cp")),
                        ("ep", expert.get_ranks("ep")), ("edp", expert.get_ranks("dp"))):
        assert ours(dim) == sorted(sorted(g) for g in theirs), dim


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 3, 4]),
       st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8, 16]), st.sampled_from(RUNTIME_RULES["megatron"].orders))
def test_megatron_cores_rank_generator_forms_the_folded_expert_groups(tp, cp, dp, pp, ep, order):
    """MoE parallel folding (--moe-folding, expert tensor parallel size 1): where the Megatron
    record runs the placement, megatron-core 0.16.0's expert RankGenerator forms exactly the ep
    and edp groups the plan prices (placement.folded_layout), and where it refuses, megatron-core
    rejects it (its pp-outermost assertion or unequal pipeline groups)."""
    from planner.placement import has_expert_layout, rank_groups
    if (tp * cp * dp) % ep:
        return
    dense, expert = _megatron_generators(tp, cp, dp, pp, ep, order, etp=1)
    edp = tp * cp * dp // ep
    megatron_runs = (order.endswith("pp") or pp == 1 or edp == dp) and dense.get_ranks("pp") == expert.get_ranks("pp")
    ours = RUNTIME_RULES["megatron"].order_runs(order, cp, pp, ep, tp) and has_expert_layout(order, tp, cp, dp, pp, ep, 1)
    assert ours == megatron_runs
    if not ours:
        return
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": 1}
    for dim, theirs in (("ep", expert.get_ranks("ep")), ("edp", expert.get_ranks("dp"))):
        assert sorted(rank_groups(order, degrees, dim)) == sorted(sorted(g) for g in theirs), dim


# ------------------------------------------------------------------ Megatron-Core's expert overlap

@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("pp, vpp", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("mtp", [0, 1, 2])
def test_the_expert_overlap_rules_are_megatron_cores(ep, pp, vpp, recompute, mtp):
    """The strategies runtimes.ep_overlap_problems refuses under --ep-overlap are exactly those
    megatron-core 0.16.0's TransformerConfig rejects with overlap_moe_expert_parallel_comm."""
    import warnings

    import torch

    from planner.runtimes import ep_overlap_problems
    from planner.spec.model import ModelSpec, MoeSpec
    from planner.spec.training import Strategy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no Transformer Engine or Apex on CPU
        from megatron.core.transformer.transformer_config import TransformerConfig
    config = dict(num_layers=8, hidden_size=256, num_attention_heads=8, num_moe_experts=8, moe_router_topk=2,
                  expert_model_parallel_size=ep, pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                  virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, bf16=True,
                  params_dtype=torch.bfloat16, moe_token_dispatcher_type="alltoall",
                  overlap_moe_expert_parallel_comm=True, mtp_num_layers=mtp or None)
    if recompute == "full":
        config.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        config.update(recompute_granularity="selective")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice on settings the test leaves at their defaults
        try:
            TransformerConfig(**config)
            accepted = True
        except (AssertionError, ValueError):
            accepted = False
    model = ModelSpec(name="m", layers=8, hidden=256, heads=8, ffn_hidden=1024, vocab=1000, mtp_layers=mtp,
                      moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=1024))
    s = Strategy(dp=2, pp=pp, ep=ep, vpp=vpp, recompute=recompute,
                 schedule="interleaved-1f1b" if vpp > 1 else "1f1b")
    assert (not ep_overlap_problems(s, model)) == accepted


def test_an_overlapped_expert_plan_exports_to_megatron_alone():
    """Megatron's export carries --overlap-moe-expert-parallel-comm and, without tp or cp, the
    larger CUDA_DEVICE_MAX_CONNECTIONS the overlap needs; runtimes without it refuse the plan,
    and a plan without it exports no such flag."""
    from planner.errors import ExportError
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100")

    def planned(**kw):
        return estimate_plan(model, cluster, gpus=64, global_batch=512, seq_len=4096, precision="bf16",
                             attention="flash", runtime="megatron", constraints={"ep": 8, "pp": 2, "vpp": 2}, **kw)
    plan = planned(options=RunOptions(ep_overlap=True))
    assert "--overlap-moe-expert-parallel-comm" in export(plan, "megatron").split()
    CHECKS["megatron"](plan)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in export(plan, "megatron", "launch")
    # with tp > 1 before Blackwell validate_args wants one queue, and the script sets that alone
    with_tp = estimate_plan(model, cluster, gpus=64, global_batch=512, seq_len=4096, precision="bf16",
                            attention="flash", runtime="megatron", constraints={"ep": 8, "pp": 2, "vpp": 2, "tp": 2},
                            options=RunOptions(ep_overlap=True))
    launch = export(with_tp, "megatron", "launch")
    assert launch.count("CUDA_DEVICE_MAX_CONNECTIONS=") == 1 and "export CUDA_DEVICE_MAX_CONNECTIONS=1 " in launch
    for other in ("deepspeed", "torchtitan", "nanotron"):
        with pytest.raises(ExportError):
            export(plan, other)
    assert "--overlap-moe-expert-parallel-comm" not in export(planned(), "megatron")


@pytest.mark.parametrize("runtime", [*TARGETS, "ideal"])
def test_a_plan_for_any_runtime_reads_back(runtime, tmp_path):
    """check, diff and export read a plan file through its schema: a plan made for any runtime the
    CLI offers reads back (--runtime nanotron plans once failed the schema's runtime list)."""
    from planner.plan import dumps, read_plan, write_atomic
    plan = make_plan(load_model("llama3-8b"), load_cluster("dgx-h100"), gpus=8, global_batch=64, seq_len=4096,
                     precision="bf16", attention="flash", runtime=runtime, constraints={}, top=0)
    path = tmp_path / "plan.json"
    write_atomic(path, dumps(plan))
    assert read_plan(path)["inputs"]["training"]["runtime"] == runtime


def test_a_plan_priced_with_a_dispatcher_a_runtime_lacks_does_not_run_there():
    """Megatron's record prices expert all-to-alls with its flex dispatcher (dedup) by default;
    DeepSpeed moves tokens with a plain all-to-all, so it does not run that plan as priced
    (runnable_on once listed it). Priced with alltoall, both run it."""
    from planner.errors import ExportError
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100")
    knobs = {"tp": 1, "pp": 1, "ep": 8, "zero": 1, "micro_batch": 1, "recompute": "full"}

    def planned(dispatcher=""):
        return estimate_plan(model, cluster, gpus=64, global_batch=512, seq_len=4096, precision="bf16",
                             attention="flash", runtime="megatron", constraints=knobs,
                             options=RunOptions(dispatcher=dispatcher))
    dedup, plain = planned(), planned("alltoall")
    assert [r["runtime"] for r in dedup["runnable_on"]] == ["megatron"]
    with pytest.raises(ExportError, match="dedup MoE dispatcher"):
        export(dedup, "deepspeed")
    assert [r["runtime"] for r in plain["runnable_on"]] == ["megatron", "deepspeed"]
    CHECKS["deepspeed"](plain)


def test_qwen3_235b_as_megatron_bridge_runs_it_on_h100_plans_exports_and_places_its_experts():
    """Issue 12: Qwen3-235B-A22B from its config.json as Megatron-Bridge's H100 recipe runs it
    (tp 2, pp 8, vpp 4, ep 32 on 256 GPUs, fp8). ep 32 exceeds dp*cp, so only folded experts run
    it; the search finds that layout, 94 layers interleave over 32 chunks with the embedding and
    the loss counted as layers, the export passes Megatron's checks, and megatron-core's expert
    rank generator (expert tensor parallel 1) forms the expert groups the plan priced."""
    from pathlib import Path

    from planner.plan import rank_groups_of
    from planner.spec.model import load_model as load
    model = load(str(Path(__file__).parent / "data" / "hf" / "qwen3-235b-a22b.json"))
    knobs = {"tp": 2, "pp": 8, "vpp": 4, "ep": 32, "micro_batch": 1}
    plan = make_plan(model, load_cluster("dgx-h100"), gpus=256, global_batch=2048, seq_len=4096, precision="fp8",
                     attention="flash", runtime="megatron", constraints=knobs, top=0)
    assert plan["inputs"]["training"]["moe_folding"] is True
    st = plan["strategy"]
    text = export(plan, "megatron")
    CHECKS["megatron"](plan)
    for flag in ("--expert-tensor-parallel-size 1", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--num-layers-per-virtual-pipeline-stage 3"):
        assert flag in text, flag
    _, expert = _megatron_generators(st["tp"], st["cp"], st["dp"], st["pp"], st["ep"], plan["placement"]["order"], etp=1)
    ours = rank_groups_of(plan)
    assert sorted(ours["ep"]) == sorted(sorted(g) for g in expert.get_ranks("ep"))


def test_deepspeed_runs_no_zero3_with_experts():
    """DeepSpeed 0.19.0 asserts "MoE not supported with Stage 3" wherever the model has MoE layers
    (runtime/engine.py, _configure_zero_optimizer): its record, the search and the exporter refuse
    a ZeRO-3 MoE plan alike, and a dense model keeps ZeRO-3."""
    from pathlib import Path

    import deepspeed.runtime.engine as engine
    from planner.errors import ExportError
    assert 'assert not self.has_moe_layers, "MoE not supported with Stage 3"' in Path(engine.__file__).read_text()
    mixtral, dense, cluster = load_model("mixtral-8x7b"), load_model("llama3-8b"), load_cluster("dgx-h100")
    rules = RUNTIME_RULES["deepspeed"]
    assert 3 not in rules.zeros(1, mixtral) and 3 in rules.zeros(1, dense)
    plan = make_plan(mixtral, cluster, gpus=64, global_batch=512, seq_len=4096, precision="bf16", attention="flash",
                     runtime="deepspeed", constraints={}, top=3)
    assert all(p["strategy"]["zero"] < 3 for p in (plan, *plan["alternatives"]))
    zero3 = estimate_plan(mixtral, cluster, gpus=64, global_batch=512, seq_len=4096, precision="bf16",
                          attention="flash", runtime="ideal", constraints={"zero": 3, "ep": 8})
    with pytest.raises(ExportError, match="ZeRO 3 with experts"):
        export(zero3, "deepspeed")
