"""planner.export: the text each runtime reads, for real plans (golden files), read back with the
runtime's own syntax (shlex, json, tomllib, yaml), and one test per refusal.

Golden files live in tests/data/export/; `PLANNER_UPDATE_GOLDEN=1 pytest tests/test_export.py`
rewrites them. Plans come from make_plan with every strategy knob pinned, so a change in the cost
model does not move them; refusals edit a real plan with `variant`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from planner.cost.pipeline import split_layers, stage_chunks
from planner.errors import ExportError, PlanFormatError, PlannerError
from planner.export import EXPORTERS, FORMATS, export
from planner.export.torchtitan import generated_split
from planner.planning import make_plan
from planner.runtimes import TORCHTITAN_MODELS
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import RunOptions
from conftest import run
from runtime_checks import check_deepspeed, check_torchtitan, megatron_args, megatron_known, torchtitan_model

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "export"
UPDATE = os.environ.get("PLANNER_UPDATE_GOLDEN") == "1"
ORDER = "tp-cp-ep-dp-pp"

# name: (model, gpus, global batch, seq len, runtime, pinned strategy)
PLANS = {
    "llama3-8b-vpp": ("llama3-8b", 32, 128, 4096, "megatron",
                      {"tp": 2, "pp": 4, "cp": 1, "vpp": 2, "micro_batch": 1, "zero": 1, "recompute": "selective"}),
    "llama3-70b-recompute": ("llama3-70b", 64, 64, 8192, "megatron",
                             {"tp": 8, "pp": 8, "cp": 1, "vpp": 1, "micro_batch": 1, "zero": 1, "recompute": "full",
                              "recompute_layers": 4}),
    "mixtral-ep": ("mixtral-8x7b", 64, 256, 4096, "megatron",
                   {"tp": 2, "pp": 4, "cp": 1, "ep": 8, "vpp": 4, "micro_batch": 1, "zero": 1, "recompute": "none"}),
    "llama3-8b-pp2": ("llama3-8b", 16, 64, 4096, "deepspeed",
                      {"tp": 2, "pp": 2, "cp": 1, "vpp": 1, "micro_batch": 1, "zero": 1, "recompute": "none"}),
    "llama3-8b-fsdp": ("llama3-8b", 16, 64, 8192, "torchtitan",
                       {"tp": 2, "pp": 2, "cp": 1, "vpp": 2, "micro_batch": 1, "zero": 3, "recompute": "full",
                        "recompute_layers": 16}),
}
# (runtime, format, plan, golden file)
GOLDENS = [
    ("megatron", "lines", "llama3-8b-vpp", "megatron_llama3-8b-vpp.txt"),
    ("megatron", "shell", "llama3-8b-vpp", "megatron_llama3-8b-vpp.shell.txt"),
    ("megatron", "lines", "llama3-70b-recompute", "megatron_llama3-70b-recompute.txt"),
    ("megatron", "lines", "mixtral-ep", "megatron_mixtral-ep.txt"),
    ("deepspeed", "json", "llama3-8b-pp2", "deepspeed_llama3-8b-pp2.json"),
    ("torchtitan", "py", "llama3-8b-fsdp", "torchtitan_llama3-8b-fsdp.py"),
    ("torchtitan@0.2", "toml", "llama3-8b-fsdp", "torchtitan_llama3-8b-fsdp.toml"),
    ("torchtitan@0.2", "cli", "llama3-8b-fsdp", "torchtitan_llama3-8b-fsdp.cli.txt"),
    ("nanotron", "yaml", "llama3-8b-pp2", "nanotron_llama3-8b-pp2.yaml"),
]


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    cluster = load_cluster("dgx-h100")
    out = {}
    for name, (model, gpus, batch, seq, runtime, knobs) in PLANS.items():
        out[name] = make_plan(load_model(model), cluster, gpus, batch, seq, "bf16", "flash", runtime,
                              {**knobs, "order": ORDER})
    return out


def variant(plan: dict, model: str | None = None, sizes: list[int] | None = None,
            recompute_layers: list[int] | None = None, **strategy) -> dict:
    """A copy of `plan` with other strategy values, model or split (an even split by default)."""
    doc = copy.deepcopy(plan)
    if model is not None:
        doc["inputs"]["model"] = load_model(model).to_dict()
    st = doc["strategy"]
    st.update(strategy)
    if "gpus" not in strategy:
        doc["inputs"]["training"]["gpus"] = st["dp"] * st["tp"] * st["pp"] * st["cp"]
    st["num_microbatches"] = doc["inputs"]["training"]["global_batch"] // (st["dp"] * st["micro_batch"])
    layers = doc["inputs"]["model"]["layers"]
    if sizes is None:
        bounds = split_layers(layers, st["pp"], st["vpp"])
    else:
        edges = [0]
        for n in sizes:
            edges.append(edges[-1] + n)
        bounds = list(itertools.pairwise(edges))
    per_rank = stage_chunks(bounds, st["pp"])
    counts = recompute_layers or [0] * st["pp"]
    doc["stages"] = [{"index": i, "layers": [c[0][0], c[-1][1]], "recompute_layers": counts[i],
                      **({"chunks": [list(x) for x in c]} if st["vpp"] > 1 else {})}
                     for i, c in enumerate(per_rank)]
    return doc


def refused(plan: dict, runtime: str, fmt: str | None = None) -> str:
    with pytest.raises(ExportError) as info:
        export(plan, runtime, fmt)
    message = str(info.value)
    assert "\n" not in message and message.startswith("cannot export to ")
    return message


# ---------------------------------------------------------------- golden files and dispatch


@pytest.mark.parametrize("runtime, fmt, name, golden", GOLDENS, ids=[g[3] for g in GOLDENS])
def test_golden(plans, runtime, fmt, name, golden):
    text = export(plans[name], runtime, fmt)
    path = GOLDEN / golden
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with PLANNER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{golden} changed: diff it, then PLANNER_UPDATE_GOLDEN=1 if intended"


def test_default_format_is_the_first(plans):
    for runtime in EXPORTERS:
        plan = plans["llama3-8b-fsdp"] if runtime.startswith("torchtitan") else plans["llama3-8b-pp2"]
        assert export(plan, runtime) == export(plan, runtime, FORMATS[runtime][0])


def test_unknown_runtime_and_format_are_export_errors(plans):
    assert issubclass(ExportError, PlannerError) and ExportError.exit_code == 2
    with pytest.raises(ExportError, match="unknown runtime"):
        export(plans["llama3-8b-pp2"], "jax")
    with pytest.raises(ExportError, match="not 'yaml'"):
        export(plans["llama3-8b-pp2"], "megatron", "yaml")


def test_a_plan_without_its_keys_is_a_plan_format_error(plans):
    doc = copy.deepcopy(plans["llama3-8b-pp2"])
    del doc["strategy"]["micro_batch"]
    with pytest.raises(PlanFormatError, match="strategy.micro_batch"):
        export(doc, "megatron")
    with pytest.raises(PlanFormatError, match="schema"):
        export({"schema": "other"}, "megatron")


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_flags_are_megatron_arguments(plans):
    known = megatron_known()
    docs = [plans[name] for name in ("llama3-8b-vpp", "llama3-70b-recompute", "mixtral-ep", "llama3-8b-pp2")] + [
        variant(plans["llama3-70b-recompute"], sizes=[9, 10, 10, 10, 10, 10, 10, 11]),
        variant(plans["llama3-8b-pp2"], zero=0, dp_overlap=True),
        variant(plans["llama3-8b-pp2"], pp=1, dp=8, tp=2, sequence_parallel=True),
        variant(plans["llama3-8b-pp2"], model="deepseek-v3", pp=1, dp=8, tp=2, ep=8),
    ]
    fp8 = copy.deepcopy(plans["llama3-8b-pp2"])
    fp8["inputs"]["training"].update(precision="fp8", attention="eager")
    docs.append(fp8)
    for doc in docs:
        unknown = set(megatron_args(export(doc, "megatron"))) - known
        assert not unknown, f"not in tests/data/megatron_arguments.txt: {sorted(unknown)}"


def test_megatron_arguments_carry_the_plan(plans):
    for name in ("llama3-8b-vpp", "llama3-70b-recompute", "mixtral-ep"):
        plan = plans[name]
        s, model, training = plan["strategy"], plan["inputs"]["model"], plan["inputs"]["training"]
        lines = export(plan, "megatron", "lines")
        args = megatron_args(lines)
        assert megatron_args(export(plan, "megatron", "shell")) == args
        assert len(export(plan, "megatron", "shell").splitlines()) == 1
        tp, pp, cp = (int(args[f"--{k}-parallel-size"]) for k in ("tensor-model", "pipeline-model", "context"))
        assert (tp, pp, cp) == (s["tp"], s["pp"], s["cp"])
        dp = training["gpus"] // (tp * pp * cp)
        micro, batch = int(args["--micro-batch-size"]), int(args["--global-batch-size"])
        assert (micro, batch) == (s["micro_batch"], training["global_batch"])
        assert batch // (micro * dp) == s["num_microbatches"] and batch % (micro * dp) == 0
        layers = int(args["--num-layers"])
        assert layers == model["layers"] and int(args["--hidden-size"]) == model["hidden"]
        if s["vpp"] > 1:
            assert layers // pp // int(args["--num-layers-per-virtual-pipeline-stage"]) == s["vpp"]
        assert ("--sequence-parallel" in args) == s["sequence_parallel"]
        assert ("--use-distributed-optimizer" in args) == (s["zero"] == 1)
        assert args.get("--recompute-granularity") == {"none": None, "selective": "selective",
                                                       "full": "full"}[s["recompute"]]
        if s["recompute"] == "full":
            assert args["--recompute-method"] == "block"
            assert {int(args["--recompute-num-layers"])} == {st["recompute_layers"] for st in plan["stages"]}
        if model.get("moe"):
            assert int(args["--expert-model-parallel-size"]) == s["ep"]
            assert int(args["--num-experts"]) == model["moe"]["experts"]


def test_megatron_overlaps_tensor_parallel_communication_where_the_plan_priced_it(plans):
    """--tp-comm-overlap exactly where the cost model hid the tp collectives behind the GEMMs:
    tp > 1 with sequence parallelism (Megatron-LM refuses it without), every tp group inside one
    node (the plan's placement) and NVLink; UB_SKIPMC=1 in the launch before Hopper (no CUDA
    multicast for Transformer Engine's userbuffers)."""
    from planner.cost.step import estimate
    from planner.spec.training import TrainingSetup, resolve_strategy

    def flags(plan):
        return export(plan, "megatron", "lines").splitlines()

    base = plans["llama3-70b-recompute"]
    assert "--tp-comm-overlap" in flags(base) and "UB_SKIPMC" not in export(base, "megatron", "launch")
    across = copy.deepcopy(base)
    across["placement"]["tiers"]["tp"] = "inter_node"
    assert "--tp-comm-overlap" not in flags(across)
    no_sp = variant(base, sequence_parallel=False)
    assert "--sequence-parallel" not in flags(no_sp) and "--tp-comm-overlap" not in flags(no_sp)
    assert "--tp-comm-overlap" not in flags(variant(base, tp=1, dp=8, sequence_parallel=False))
    model = load_model("llama3-8b")
    for cluster, overlapped, skipmc in (("dgx-a100-80g", True, True), ("l40s-pcie-8", False, False)):
        plan = make_plan(model, load_cluster(cluster), 16, 64, 4096, "bf16", "flash", "megatron",
                         {"tp": 2, "pp": 1, "cp": 1, "micro_batch": 1, "zero": 1, "recompute": "full",
                          "order": ORDER})
        assert ("--tp-comm-overlap" in flags(plan)) == overlapped, cluster
        assert ("export UB_SKIPMC=1" in export(plan, "megatron", "launch")) == skipmc, cluster
    # the pricing behind it: without sequence parallelism, or over PCIe, the collectives show
    setup = TrainingSetup(gpus=8, global_batch=8, seq_len=4096, runtime="megatron")
    knobs = {"tp": 8, "micro_batch": 1, "zero": 1}
    h100 = load_cluster("dgx-h100")
    hidden = estimate(model, h100, setup, resolve_strategy({**knobs, "sequence_parallel": True}, setup))
    shown = estimate(model, h100, setup, resolve_strategy({**knobs, "sequence_parallel": False}, setup))
    pcie = estimate(model, load_cluster("l40s-pcie-8"), setup, resolve_strategy({**knobs, "sequence_parallel": True},
                                                                                 setup))
    assert shown.breakdown_s["tp_comm"] > 10 * hidden.breakdown_s["tp_comm"] and pcie.breakdown_s["tp_comm"] > 0.01


def test_a_plan_without_tp_overlap_prices_the_collectives_and_launches_without_it(tmp_path):
    """--no-tp-overlap (TrainingSetup.no_tp_overlap: a launch without --tp-comm-overlap, NeMo's
    ub_tp_comm_overlap false): the tensor-parallel collectives are priced whole, the plan records
    the knob (and says so in its title), the export leaves the flag off, and `planner check`
    re-plans from the recorded inputs to the same plan."""
    from planner.cost.step import estimate
    from planner.spec.training import TrainingSetup, resolve_strategy

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    knobs = {"tp": 8, "micro_batch": 1, "zero": 1, "sequence_parallel": True}
    on, off = (TrainingSetup(gpus=8, global_batch=8, seq_len=4096, runtime="megatron", no_tp_overlap=flag)
               for flag in (False, True))
    hidden = estimate(model, cluster, on, resolve_strategy(knobs, on)).breakdown_s["tp_comm"]
    shown = estimate(model, cluster, off, resolve_strategy(knobs, off)).breakdown_s["tp_comm"]
    assert shown > 10 * hidden
    plan = make_plan(model, cluster, 16, 64, 4096, "bf16", "flash", "megatron",
                     {"tp": 2, "pp": 1, "cp": 1, "micro_batch": 1, "zero": 1, "recompute": "full", "order": ORDER},
                     options=RunOptions(no_tp_overlap=True))
    assert plan["inputs"]["training"]["no_tp_overlap"] is True
    assert "--tp-comm-overlap" not in export(plan, "megatron", "lines").splitlines()
    default = make_plan(model, cluster, 16, 64, 4096, "bf16", "flash", "megatron",
                        {"tp": 2, "pp": 1, "cp": 1, "micro_batch": 1, "zero": 1, "recompute": "full", "order": ORDER})
    assert "no_tp_overlap" not in default["inputs"]["training"]
    assert plan["prediction"]["breakdown_s"]["tp_comm"] > default["prediction"]["breakdown_s"]["tp_comm"]
    assert RunOptions.recorded(plan["inputs"]["training"]).no_tp_overlap is True
    path = tmp_path / "plan.json"
    args = ["-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
            "--runtime", "megatron", "--tp", "2", "--pp", "1", "--no-tp-overlap"]
    made = run("plan", *args, "-o", str(path))
    assert made.returncode == 0 and "tp collectives not overlapped" in made.stderr, made.stderr
    assert run("check", str(path), "--tolerance", "0").returncode == 0


def test_megatron_uneven_first_and_last_stage(plans):
    plan = variant(plans["llama3-70b-recompute"], sizes=[8, 10, 10, 10, 10, 10, 10, 12])
    args = megatron_args(export(plan, "megatron"))
    assert args["--decoder-first-pipeline-num-layers"] == "8"
    assert args["--decoder-last-pipeline-num-layers"] == "12"
    two = variant(plans["llama3-8b-pp2"], sizes=[15, 17])
    args = megatron_args(export(two, "megatron"))
    assert args["--decoder-first-pipeline-num-layers"] == "15"
    assert "--decoder-last-pipeline-num-layers" not in args  # the last stage takes the rest


def test_megatron_recompute_count_that_covers_short_stages(plans):
    # block recompute of 10 layers recomputes every layer of an 8-layer first stage too
    plan = variant(plans["llama3-70b-recompute"], sizes=[8, 10, 10, 10, 10, 10, 10, 12],
                   recompute_layers=[8, 10, 10, 10, 10, 10, 10, 10])
    assert megatron_args(export(plan, "megatron"))["--recompute-num-layers"] == "10"


def test_megatron_model_details(plans):
    deepseek = variant(plans["llama3-8b-pp2"], model="deepseek-v3", pp=1, dp=8, tp=2, ep=8)
    args = megatron_args(export(deepseek, "megatron"))
    moe = load_model("deepseek-v3").moe
    assert args["--moe-layer-freq"] == f"([0]*{moe.dense_layers}+[1]*{61 - moe.dense_layers})"
    assert int(args["--moe-shared-expert-intermediate-size"]) == moe.shared_experts * moe.shared_ffn_hidden
    assert "--multi-latent-attention" in args and "--group-query-attention" not in args
    gpt3 = variant(plans["llama3-8b-pp2"], model="gpt3-175b", pp=2, vpp=1)
    gpt3["inputs"]["training"]["seq_len"] = 2048
    args = megatron_args(export(gpt3, "megatron"))
    assert args["--position-embedding-type"] == "learned_absolute"
    assert "--disable-bias-linear" not in args and "--untie-embeddings-and-output-weights" not in args
    assert "--swiglu" not in args and args["--normalization"] == "LayerNorm"


MEGATRON_REFUSALS = {
    "zero 2": ({"zero": 2}, "ZeRO-2/3"),
    "zero 3": ({"zero": 3}, "ZeRO-2/3"),
    "sequence parallel with tp 1": ({"tp": 1, "dp": 8, "sequence_parallel": True}, "tp > 1"),
    "batch": ({"num_microbatches": 3}, "global batch"),
    "rank order": ({"order": "pp-dp-tp"}, "places ranks"),
    "cp not dividing 2*cp": ({"cp": 4, "dp": 1, "seq_len": 4100}, "2*cp"),
}


@pytest.mark.parametrize("case", MEGATRON_REFUSALS)
def test_megatron_refuses(plans, case):
    changes, phrase = MEGATRON_REFUSALS[case]
    changes = dict(changes)
    plan = variant(plans["llama3-8b-pp2"], **{k: v for k, v in changes.items()
                                              if k not in ("num_microbatches", "order", "seq_len")})
    if "num_microbatches" in changes:
        plan["strategy"]["num_microbatches"] = changes["num_microbatches"]
    if "order" in changes:
        plan["placement"]["order"] = changes["order"]
    if "seq_len" in changes:
        plan["inputs"]["training"]["seq_len"] = changes["seq_len"]
    assert phrase in refused(plan, "megatron")


def test_megatron_refuses_recompute_counts_that_differ(plans):
    plan = variant(plans["llama3-70b-recompute"], recompute_layers=[4, 4, 4, 4, 4, 4, 4, 2])
    assert "--recompute-num-layers on every stage" in refused(plan, "megatron")


def test_megatron_refuses_partial_recompute_of_virtual_chunks(plans):
    # 3 of a rank's 8 layers, first chunk first: block recompute would take 3 of every 4-layer chunk
    plan = variant(plans["llama3-8b-vpp"], recompute="full", recompute_layers=[3, 3, 3, 3])
    assert "per virtual chunk" in refused(plan, "megatron")
    every = variant(plans["llama3-8b-vpp"], recompute="full", recompute_layers=[8, 8, 8, 8])
    assert megatron_args(export(every, "megatron"))["--recompute-num-layers"] == "4"


def test_megatron_refuses_uneven_middle_stages(plans):
    plan = variant(plans["llama3-70b-recompute"], sizes=[10, 9, 11, 10, 10, 10, 10, 10])
    assert "first and last stage" in refused(plan, "megatron")


def test_megatron_refuses_unequal_virtual_chunks(plans):
    plan = variant(plans["llama3-8b-vpp"], sizes=[3, 4, 4, 4, 4, 4, 4, 5])
    assert "equal virtual chunks" in refused(plan, "megatron")


@pytest.mark.parametrize("field, value, phrase", [
    ("ffn_act", "relu", "ReLU"), ("position_embedding", "alibi", "ALiBi"), ("causal", False, "causal"),
])
def test_megatron_refuses_models_pretrain_gpt_cannot_build(plans, field, value, phrase):
    plan = copy.deepcopy(plans["llama3-8b-pp2"])
    plan["inputs"]["model"][field] = value
    assert phrase in refused(plan, "megatron")


# ---------------------------------------------------------------- DeepSpeed


def test_deepspeed_config_carries_the_plan(plans):
    plan = plans["llama3-8b-pp2"]
    s = plan["strategy"]
    doc = json.loads(export(plan, "deepspeed"))
    launch = doc["_planner"]
    dp = launch["data_parallel_size"]
    assert dp * launch["tensor_model_parallel_size"] * launch["pipeline_model_parallel_size"] \
        == plan["inputs"]["training"]["gpus"]
    assert doc["train_batch_size"] == doc["train_micro_batch_size_per_gpu"] * doc["gradient_accumulation_steps"] * dp
    assert doc["gradient_accumulation_steps"] == s["num_microbatches"]
    assert doc["zero_optimization"]["stage"] == s["zero"]
    assert doc["zero_optimization"]["overlap_comm"] == s["dp_overlap"]
    assert doc["bf16"] == {"enabled": True} and "fp16" not in doc
    assert "activation_checkpointing" not in doc


def test_deepspeed_full_recompute_and_zero3(plans):
    plan = variant(plans["llama3-8b-pp2"], pp=1, dp=8, zero=3, recompute="full", recompute_layers=[32])
    doc = json.loads(export(plan, "deepspeed"))
    assert doc["activation_checkpointing"]["number_checkpoints"] == 32
    assert doc["activation_checkpointing"]["partition_activations"] is True
    assert doc["zero_optimization"]["stage"] == 3 and "stage3_prefetch_bucket_size" in doc["zero_optimization"]
    assert doc["_planner"]["recompute"] == "full"


DEEPSPEED_REFUSALS = {
    "zero 2 with pp": ({"zero": 2}, {}, "ZeRO-2/3 with pipeline"),
    "zero 3 with pp": ({"zero": 3}, {}, "ZeRO-2/3 with pipeline"),
    "vpp": ({"vpp": 2, "schedule": "interleaved-1f1b"}, {}, "interleaved"),
    "cp": ({"cp": 2, "dp": 2}, {}, "context parallelism"),
    "uneven split": ({}, {"sizes": [15, 17]}, "uneven"),
    "some layers recomputed": ({"recompute": "full"}, {"recompute_layers": [16, 8]}, "every layer or none"),
}


@pytest.mark.parametrize("case", DEEPSPEED_REFUSALS)
def test_deepspeed_refuses(plans, case):
    strategy, split, phrase = DEEPSPEED_REFUSALS[case]
    assert phrase in refused(variant(plans["llama3-8b-pp2"], **split, **strategy), "deepspeed")


def test_deepspeed_refuses_fp8(plans):
    plan = copy.deepcopy(plans["llama3-8b-pp2"])
    plan["inputs"]["training"]["precision"] = "fp8"
    assert "trains in bf16, fp16 only; the plan has precision fp8" in refused(plan, "deepspeed")


def test_deepspeed_config_class_accepts_it(plans):
    plan = plans["llama3-8b-pp2"]
    check_deepspeed(plan)
    check_deepspeed(variant(plan, pp=1, dp=8, zero=3, recompute="full", recompute_layers=[32]))


# ---------------------------------------------------------------- torchtitan


def test_torchtitan_toml_carries_the_plan(plans):
    plan = plans["llama3-8b-fsdp"]
    s = plan["strategy"]
    doc = tomllib.loads(export(plan, "torchtitan@0.2", "toml"))
    par, train = doc["parallelism"], doc["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, s["dp"])
    assert dp * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * par["context_parallel_degree"] \
        == plan["inputs"]["training"]["gpus"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert train["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == s["num_microbatches"]
    assert train["global_batch_size"] == train["local_batch_size"] * dp  # one pipeline pass per step
    assert train["seq_len"] == plan["inputs"]["training"]["seq_len"]
    assert doc["activation_checkpoint"]["mode"] == "full"
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == s["pp"] * s["vpp"]
    flat = [name for part in parts for name in part]
    layers = plan["inputs"]["model"]["layers"]
    assert flat == ["tok_embeddings"] + [f"layers.{i}" for i in range(layers)] + ["norm", "output"]
    chunks = sorted(tuple(c) for st in plan["stages"] for c in st["chunks"])
    assert [sum(n.startswith("layers.") for n in part) for part in parts] == [b - a for a, b in chunks]


def torchtitan_cli(text: str) -> dict[str, str]:
    tokens = shlex.split(text)
    return dict(zip(tokens[::2], tokens[1::2]))


def test_torchtitan_cli_split_knobs_reproduce_the_toml_split(plans):
    for plan in (plans["llama3-8b-fsdp"], variant(plans["llama3-8b-fsdp"], vpp=1, schedule="1f1b",
                                                  recompute="none", sizes=[17, 15])):
        toml_parts = tomllib.loads(export(plan, "torchtitan@0.2"))["parallelism"]["module_fqns_per_model_part"]
        cli = torchtitan_cli(export(plan, "torchtitan@0.2", "cli"))
        par = tomllib.loads(export(plan, "torchtitan@0.2"))["parallelism"]
        for key, value in par.items():
            if key != "module_fqns_per_model_part":
                assert cli[f"--parallelism.{key}"] == str(value)
        first = int(cli["--parallelism.pipeline_parallel_first_stage_less_layers"])
        last = int(cli["--parallelism.pipeline_parallel_last_stage_less_layers"])
        sizes = generated_split(len(toml_parts), plan["inputs"]["model"]["layers"], first, last)
        assert sizes == [sum(n.startswith("layers.") for n in part) for part in toml_parts]


def test_torchtitan_zero0_is_ddp(plans):
    plan = variant(plans["llama3-8b-fsdp"], tp=1, pp=1, vpp=1, dp=16, zero=0, recompute="none",
                   sequence_parallel=False, schedule="1f1b")
    doc = tomllib.loads(export(plan, "torchtitan@0.2"))
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 16
    assert doc["parallelism"]["data_parallel_shard_degree"] == 1
    assert "fsdp_reshard_after_forward" not in doc["parallelism"]
    assert doc["training"]["local_batch_size"] == 1  # gradient accumulation runs the micro-batches


TORCHTITAN_REFUSALS = {
    "zero 1": ({"zero": 1}, {}, "shards everything"),
    "zero 2": ({"zero": 2}, {}, "shards everything"),
    "zero 0 with tp": ({"zero": 0}, {}, "sole parallelism"),
    "zero 0 with cp": ({"zero": 0, "cp": 2, "dp": 2}, {}, "cp ranks"),
    "some layers recomputed": ({}, {"recompute_layers": [16, 8]}, "every layer or none"),
}


@pytest.mark.parametrize("version", ["torchtitan", "torchtitan@0.2"])
@pytest.mark.parametrize("case", TORCHTITAN_REFUSALS)
def test_torchtitan_refuses(plans, case, version):
    strategy, extra, phrase = TORCHTITAN_REFUSALS[case]
    assert phrase in refused(variant(plans["llama3-8b-fsdp"], **extra, **strategy), version)


@pytest.mark.parametrize("version", ["torchtitan", "torchtitan@0.2"])
def test_torchtitan_refuses_fp16(plans, version):
    plan = copy.deepcopy(plans["llama3-8b-fsdp"])
    plan["inputs"]["training"]["precision"] = "fp16"
    assert "fp16" in refused(plan, version)


def test_torchtitan_cli_refuses_a_split_its_knobs_cannot_make(plans):
    plan = variant(plans["llama3-8b-fsdp"], pp=4, dp=2, vpp=1, schedule="1f1b", recompute="none",
                   sizes=[6, 12, 6, 8])
    assert "TOML" in refused(plan, "torchtitan@0.2", "cli")
    assert tomllib.loads(export(plan, "torchtitan@0.2"))["parallelism"]["module_fqns_per_model_part"]


def test_torchtitan_config_manager_accepts_it(plans):
    check_torchtitan(plans["llama3-8b-fsdp"])


# ---------------------------------------------------------------- nanotron


def test_nanotron_yaml_carries_the_plan(plans):
    plan = plans["llama3-8b-pp2"]
    s, training = plan["strategy"], plan["inputs"]["training"]
    doc = yaml.safe_load(export(plan, "nanotron"))
    par, tokens = doc["parallelism"], doc["tokens"]
    assert par["dp"] * par["tp"] * par["pp"] == training["gpus"]
    assert tokens["micro_batch_size"] * tokens["batch_accumulation_per_replica"] * par["dp"] == training["global_batch"]
    assert tokens["sequence_length"] == training["seq_len"]
    assert par["tp_mode"] == "REDUCE_SCATTER" and par["tp_linear_async_communication"] is True
    assert par["pp_engine"] == "1f1b" and doc["optimizer"] == {"zero_stage": s["zero"]}


NANOTRON_REFUSALS = {
    "vpp": ({"vpp": 2, "schedule": "interleaved-1f1b"}, {}, "interleaved"),
    "cp": ({"cp": 2, "dp": 2}, {}, "context parallelism"),
    "zero 2": ({"zero": 2}, {}, "zero_stage 0 or 1"),
    "uneven split": ({}, {"sizes": [15, 17]}, "uneven"),
    "expert parallel": ({"ep": 2}, {"model": "mixtral-8x7b"}, "expert_parallel_size"),
    "recompute": ({"recompute": "selective"}, {}, "recomputation"),
}


@pytest.mark.parametrize("case", NANOTRON_REFUSALS)
def test_nanotron_refuses(plans, case):
    strategy, extra, phrase = NANOTRON_REFUSALS[case]
    assert phrase in refused(variant(plans["llama3-8b-pp2"], **extra, **strategy), "nanotron")


def test_megatron_builds_the_model_settings_the_spec_states(plans):
    """Llama 3's rotary base (500000, not Megatron's 10000) and norm epsilon, DeepSeek-V3's sigmoid
    router, and the MoE dispatcher the plan was priced with (flex with DeepEP under Megatron's
    record; the plain all-to-all when the plan names it)."""
    args = megatron_args(export(plans["llama3-8b-vpp"], "megatron"))
    assert args["--rotary-base"] == "500000" and float(args["--norm-epsilon"]) == 1e-5
    deepseek = variant(plans["llama3-8b-pp2"], model="deepseek-v3", pp=1, dp=8, tp=2, ep=8)
    deepseek["inputs"]["training"]["runtime"] = "megatron"
    args = megatron_args(export(deepseek, "megatron"))
    assert args["--moe-router-score-function"] == "sigmoid" and float(args["--norm-epsilon"]) == 1e-6
    assert args["--moe-token-dispatcher-type"] == "flex" and "--moe-enable-deepep" in args
    deepseek["inputs"]["training"]["moe_dispatcher"] = "alltoall"
    args = megatron_args(export(deepseek, "megatron"))
    assert args["--moe-token-dispatcher-type"] == "alltoall" and "--moe-enable-deepep" not in args
    assert not set(args) - megatron_known()


MEGATRON_CONFIG_FIELDS = {
    # flag: megatron-core TransformerConfig field (core_transformer_config_from_args copies each
    # by name in megatron/training/arguments.py at 000c4ac; a flag of no value sets True)
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups",
    "--kv-channels": "kv_channels", "--normalization": "normalization", "--norm-epsilon": "layernorm_epsilon",
    "--swiglu": "gated_linear_unit", "--hidden-dropout": "hidden_dropout", "--attention-dropout": "attention_dropout",
    "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk",
    "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--moe-router-score-function": "moe_router_score_function", "--moe-router-num-groups": "moe_router_num_groups",
    "--moe-router-group-topk": "moe_router_group_topk", "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim",
}
"""the fields of the model that Megatron builds from an export (the table of issue 12, item 5)"""


def megatron_model_config(args: dict):
    """megatron-core 0.16.0's TransformerConfig (MLATransformerConfig with --multi-latent-attention)
    from an export's arguments, as Megatron-LM's core_transformer_config_from_args builds it:
    its __post_init__ checks the combination; --disable-bias-linear clears add_bias_linear and
    --group-query-attention keeps num_query_groups (else it equals the head count)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    def value(text):
        if text is None:
            return True
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    fields = {field: value(args[flag]) for flag, field in MEGATRON_CONFIG_FIELDS.items() if flag in args}
    if "--group-query-attention" not in args:
        fields["num_query_groups"] = fields["num_attention_heads"]
    fields["add_bias_linear"] = "--disable-bias-linear" not in args
    if "--moe-layer-freq" in args:
        fields["moe_layer_freq"] = eval(args["--moe-layer-freq"])  # as Megatron's moe_freq_type evaluates it
    if "--multi-latent-attention" in args:
        return MLATransformerConfig(**fields, multi_latent_attention=True)
    return TransformerConfig(**fields)


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b", "llama3-70b", "gpt3-175b", "qwen2.5-72b",
                                  "mixtral-8x7b", "deepseek-v3"])
def test_megatron_builds_the_model_the_plan_priced(plans, name):
    """Issue 12: the model config megatron-core builds from the export equals the plan's model
    spec, field by field (MEGATRON_CONFIG_FIELDS; vocabulary from the tokenizer the user names)."""
    plan = variant(plans["llama3-8b-pp2"], model=name, pp=1, tp=2, dp=4,
                   ep=4 if name in ("mixtral-8x7b", "deepseek-v3") else 1)
    m = load_model(name)
    plan["inputs"]["training"]["runtime"] = "megatron"
    if m.position_embedding == "learned":  # sequences its position table covers
        plan["inputs"]["training"]["seq_len"] = m.max_position
    args = megatron_args(export(plan, "megatron"))
    config = megatron_model_config(args)
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (m.layers, m.hidden, m.heads)
    assert config.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
    assert config.layernorm_epsilon == (m.norm_eps or 1e-5)  # Megatron's default where the spec states none
    assert config.gated_linear_unit == (m.ffn_act == "swiglu") and config.add_bias_linear == m.linear_bias
    assert config.hidden_dropout == config.attention_dropout == m.dropout
    assert ("--untie-embeddings-and-output-weights" in args) == (not m.tied_embeddings)
    assert args["--position-embedding-type"] == {"rope": "rope", "learned": "learned_absolute"}[m.position_embedding]
    if m.position_embedding == "rope":
        assert int(args.get("--rotary-base", 10000)) == int(m.rope_theta or 10000)
    if m.mla is None:
        assert config.num_query_groups == m.kv_heads and config.kv_channels == m.head_dim
        assert config.ffn_hidden_size == m.ffn_hidden
    else:
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                config.v_head_dim) == (m.mla.q_lora_rank or None, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim,
                                       m.mla.qk_rope_head_dim, m.mla.v_head_dim)
    if m.moe is None:
        assert config.num_moe_experts is None
        return
    moe = m.moe
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (
        moe.experts, moe.top_k, moe.expert_ffn_hidden)
    assert (config.moe_shared_expert_intermediate_size or 0) == moe.shared_experts * moe.shared_ffn_hidden
    assert config.moe_router_score_function == moe.router_scoring
    assert (config.moe_router_num_groups or 0, config.moe_router_group_topk or 0) == (moe.groups, moe.group_topk)
    dense = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else [1] * m.layers
    assert dense == [0] * moe.dense_layers + [1] * (m.layers - moe.dense_layers)
    if moe.dense_layers:
        assert config.ffn_hidden_size == m.ffn_hidden


def test_megatron_launch_script_runs_the_arguments_on_every_node(plans, tmp_path):
    """The launch format is a bash script (bash -n reads it) that runs pretrain_gpt.py under
    torchrun with one process per GPU on each node, the same arguments as the lines format, and
    CUDA_DEVICE_MAX_CONNECTIONS=1 where Megatron's validate_args requires it (tp or cp > 1
    before Blackwell); what the user supplies is named in its comments."""
    import subprocess

    plan = plans["llama3-8b-vpp"]
    script = export(plan, "megatron", "launch")
    path = tmp_path / "launch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    nodes = plan["inputs"]["training"]["gpus"] // 8
    assert f"torchrun --nproc-per-node 8 --nnodes {nodes} " in script
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script  # tp 2 on H100
    body = [line.strip().rstrip("\\").strip() for line in script.splitlines() if line.startswith("  --")]
    assert body == export(plan, "megatron", "lines").splitlines()
    for supplied in ("--data-path", "--tokenizer-type", "--train-iters", "--save"):
        assert supplied in script.split("set -euo pipefail")[0]
    no_tp = variant(plans["llama3-8b-pp2"], tp=1, dp=16, sequence_parallel=False)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in export(no_tp, "megatron", "launch")


def test_a_gb200_launch_runs_one_process_per_gpu_of_each_tray():
    """GB200 NVL72 prices 72 GPUs as one NVLink domain, but a host is a compute tray of 4: a job
    takes whole trays (128 GPUs: 32 of them; 130 is refused naming the tray) and its launch runs 4
    processes on each of them, as torchrun on a tray can."""
    from planner.errors import SpecError
    cluster = load_cluster("gb200-nvl72")
    knobs = {"tp": 1, "pp": 1, "dp": 128, "micro_batch": 1, "zero": 1, "recompute": "none"}
    plan = make_plan(load_model("llama3-8b"), cluster, 128, 128, 8192, "bf16", "flash", "megatron", knobs, top=0)
    assert plan["inputs"]["cluster"]["gpus_per_host"] == 4
    assert "torchrun --nproc-per-node 4 --nnodes 32 " in export(plan, "megatron", "launch")
    with pytest.raises(SpecError, match="whole hosts of 4 GPUs"):
        make_plan(load_model("llama3-8b"), cluster, 130, 130, 8192, "bf16", "flash", "megatron", {}, top=0)


@pytest.mark.parametrize("m", TORCHTITAN_MODELS, ids=lambda m: m.flavor)
def test_torchtitan_flavors_are_the_models_torchtitan_builds(m):
    """The capability record's llama3 flavors have the shapes torchtitan's own model code builds."""
    assert torchtitan_model(m.name, m.flavor) == {
        "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden,
        "vocab": m.vocab, "rope_theta": m.rope_theta, "norm_eps": m.norm_eps}


def test_torchtitan_refuses_a_model_it_does_not_ship(plans):
    assert "builds only the models it ships (llama3 8B, llama3 70B, llama3 405B)" in refused(
        variant(plans["llama3-8b-fsdp"], model="llama2-7b"), "torchtitan")
