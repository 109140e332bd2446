"""Adam's moments in bf16 (--optimizer-states bf16: Megatron's precision-aware optimizer): what a
sharded optimizer keeps and moves, which runtimes run it, and the plans, exports and forecasts
that carry it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cost import memory
from planner.cost.step import estimate
from planner.errors import SpecError
from planner.export import ExportError, export
from planner.forecast import checkpoint_bytes_per_param
from planner.planning import estimate_plan
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import RunOptions, Strategy, TrainingSetup

CLUSTER, MODEL = load_cluster("dgx-h100"), load_model("llama3-8b")
BASE = TrainingSetup(gpus=8, global_batch=8, seq_len=2048, runtime="megatron")


def test_a_sharded_optimizer_keeps_the_bytes_its_states_take():
    """fp32 master weights and moments: 12 bytes; bf16 moments: 2 + 2 beside the master weight,
    which Transformer Engine keeps as a 16-bit remainder of a bf16 weight and whole beside an fp8
    one; unsharded (ZeRO-0) the states stay fp32, as Megatron runs no precision-aware optimizer
    without its distributed one."""
    assert memory.optimizer_bytes("", "bf16") == memory.optimizer_bytes("fp32", "fp8") == 12
    assert memory.optimizer_bytes("bf16", "bf16") == 6
    assert memory.optimizer_bytes("bf16", "fp8") == 8
    assert memory.state_bytes(1000.0, 0, 8, 4, 6)[2] == 12000.0
    assert memory.state_bytes(1000.0, 1, 8, 4, 6)[2] == 750.0
    assert memory.adam_traffic_bytes(12, 1) == 38  # read and write master and moments, plus 14
    assert memory.adam_traffic_bytes(6, 1) == 26 and memory.adam_traffic_bytes(6, 0) == 38


@pytest.mark.parametrize("precision, kept", [("bf16", 6), ("fp8", 8)])
def test_bf16_moments_shrink_the_optimizer_states_and_their_step_and_nothing_else(precision, kept):
    setup = replace(BASE, precision=precision)
    low = replace(setup, optimizer_states="bf16")
    for zero in (0, 1):
        s = Strategy(dp=8, zero=zero)
        fp32, bf16 = estimate(MODEL, CLUSTER, setup, s), estimate(MODEL, CLUSTER, low, s)
        a, b = fp32.stages[0].memory, bf16.stages[0].memory
        share = kept / memory.OPTIMIZER_BYTES if zero else 1.0
        assert b.optimizer == pytest.approx(a.optimizer * share)
        assert (b.weights, b.grads, b.activations, b.other) == (a.weights, a.grads, a.activations, a.other)
        optimizer_share = (2 * kept + 14) / 38 if zero else 1.0
        assert bf16.breakdown_s["optimizer"] == pytest.approx(fp32.breakdown_s["optimizer"] * optimizer_share)
        assert bf16.breakdown_s["compute"] == fp32.breakdown_s["compute"]


def test_only_megatron_keeps_bf16_moments():
    base = {"gpus": 8, "global_batch": 8, "seq_len": 2048}
    for runtime in ("torchtitan", "deepspeed", "nanotron"):
        with pytest.raises(SpecError, match=f"{runtime} keeps Adam's moments in fp32 only"):
            TrainingSetup(**base, optimizer_states="bf16", runtime=runtime)
    with pytest.raises(SpecError, match="optimizer states in bf16 need precision bf16 or fp8, got fp16"):
        TrainingSetup(**base, precision="fp16", optimizer_states="bf16", runtime="megatron")
    with pytest.raises(SpecError, match="optimizer-states must be one of fp32, bf16"):
        TrainingSetup(**base, optimizer_states="fp8")
    assert TrainingSetup(**base, optimizer_states="fp32", runtime="torchtitan").optimizer_states == "fp32"
    # plans made before the knob read alike: the default is not recorded
    assert "optimizer_states" not in TrainingSetup(**base).to_dict()


def test_the_megatron_export_keeps_the_moments_in_bf16_where_it_priced_them():
    def planned(zero, **options):
        return estimate_plan(MODEL, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16",
                             attention="flash", runtime="megatron", constraints={"dp": 8, "zero": zero},
                             options=RunOptions(**options))
    args = export(planned(1, optimizer_states="bf16"), "megatron").split()
    at = args.index("--exp-avg-dtype")
    assert "--use-precision-aware-optimizer" in args and args[at + 1] == "bf16"
    assert args[args.index("--exp-avg-sq-dtype") + 1] == "bf16"
    assert "--use-precision-aware-optimizer" not in export(planned(1), "megatron").split()
    # Megatron-Core asserts its distributed optimizer for them; a ZeRO-0 plan was priced in fp32
    assert "--use-precision-aware-optimizer" not in export(planned(0, optimizer_states="bf16"), "megatron").split()
    ideal = estimate_plan(MODEL, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16", attention="flash",
                          runtime="ideal", constraints={"dp": 8, "zero": 3}, options=RunOptions(optimizer_states="bf16"))
    with pytest.raises(ExportError, match="Adam's moments kept in bf16"):
        export(ideal, "torchtitan")


def test_a_plan_with_bf16_moments_reads_back_rechecks_fresh_and_forecasts_a_smaller_checkpoint(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli
    path = tmp_path / "plan.json"
    args = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64",
            "--optimizer-states", "bf16", "-o", str(path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    training = json.loads(path.read_text())["inputs"]["training"]
    assert training["optimizer_states"] == "bf16" and training["runtime"] == "megatron"
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert checkpoint_bytes_per_param() == 14 and checkpoint_bytes_per_param("bf16") == 10
    forecast = ["forecast", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                "--tokens", "1e9", "--format", "json"]
    rows = [json.loads(CliRunner().invoke(cli, forecast + extra).stdout)["rows"][0]
            for extra in ([], ["--optimizer-states", "bf16"])]
    assert rows[1]["checkpoint_s"] == pytest.approx(rows[0]["checkpoint_s"] * 10 / 14, rel=1e-6)


def test_a_pool_that_falls_back_to_fp16_keeps_fp32_moments():
    """RunOptions.at: a mixed cluster's pool whose GPU lacks the precision asked for trains in a
    fallback one, and in fp16 bf16 moments are refused: that pool takes the fp32 ones."""
    asked = RunOptions(optimizer_states="bf16", fp8_recipe="delayed")
    assert asked.at("fp16") == RunOptions()
    assert asked.at("bf16") == RunOptions(optimizer_states="bf16")
    assert asked.at("fp8") == asked
