"""Fused cross-entropy losses (--loss-fusion): what each moves and keeps on the last stage, which
runtimes run them, and the plans and exports that carry them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cost import compute
from planner.cost.step import estimate, layer_ctx
from planner.errors import SpecError
from planner.export import ExportError, export
from planner.graph import LOGIT_RW_BYTES, LOSSES, head_work
from planner.planning import estimate_plan
from planner.runtimes import RUNTIME_RULES
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import LOSS_FUSIONS, RunOptions, Strategy, TrainingSetup

CLUSTER, MODEL = load_cluster("dgx-h100"), load_model("llama3-8b")
BASE = TrainingSetup(gpus=8, global_batch=16, seq_len=2048, runtime="megatron")
DP8 = Strategy(dp=8, zero=1, dp_overlap=False)  # no overlap: the reduction does not depend on compute


@pytest.mark.parametrize("fusion", LOSS_FUSIONS)
def test_a_fused_loss_moves_and_keeps_its_bytes_per_logit(fusion):
    """One stage, m micro-batches: the step is shorter by m times the memory-bound time of the
    traffic the fused loss saves on each micro-batch's logits, and the loss's peak holds its own
    bytes per logit in place of the runtime's."""
    plain = estimate(MODEL, CLUSTER, BASE, DP8)
    fused = estimate(MODEL, CLUSTER, replace(BASE, loss_fusion=fusion), DP8)
    logits = head_work(MODEL, layer_ctx(MODEL, BASE, 1, 1, 1, DP8.micro_batch, False)).logits
    m = DP8.num_microbatches(BASE.global_batch)
    saved_s = m * compute.memory_time_s((LOGIT_RW_BYTES - LOSSES[fusion].traffic_bytes) * logits, CLUSTER.gpu,
                                        CLUSTER.efficiency)
    assert saved_s > 0
    assert plain.step_time_s - fused.step_time_s == pytest.approx(saved_s, rel=1e-9)
    kept = RUNTIME_RULES["megatron"].loss_bytes(1) - LOSSES[fusion].peak_bytes
    assert plain.memory.activations - fused.memory.activations == pytest.approx(kept * logits, rel=1e-9)


def test_only_runtimes_that_run_a_fused_loss_take_one():
    base = dict(gpus=8, global_batch=8, seq_len=2048)
    for fusion in LOSS_FUSIONS:
        assert TrainingSetup(**base, runtime="megatron", loss_fusion=fusion).loss_fusion == fusion
        for runtime in ("torchtitan", "deepspeed", "nanotron", "megatron@2022"):
            with pytest.raises(SpecError, match="runs no fused cross-entropy loss"):
                TrainingSetup(**base, runtime=runtime, loss_fusion=fusion)
    with pytest.raises(SpecError, match="loss-fusion must be one of native, te"):
        TrainingSetup(**base, runtime="megatron", loss_fusion="triton")
    assert "loss_fusion" not in TrainingSetup(**base, runtime="megatron").to_dict()  # plans made before read alike


def test_the_megatron_export_carries_the_fused_loss_and_others_refuse_it():
    def planned(runtime, zero=1, **options):
        return estimate_plan(MODEL, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16", attention="flash",
                             runtime=runtime, constraints={"dp": 8, "zero": zero}, options=RunOptions(**options))
    args = export(planned("megatron", loss_fusion="te"), "megatron").split()
    assert args[args.index("--cross-entropy-fusion-impl") + 1] == "te" and "--cross-entropy-loss-fusion" in args
    assert "--cross-entropy-loss-fusion" not in export(planned("megatron"), "megatron").split()
    with pytest.raises(ExportError, match="fused native cross-entropy loss"):
        export(planned("ideal", zero=3, loss_fusion="native"), "torchtitan")


def test_a_plan_with_a_fused_loss_reads_back_and_rechecks_fresh(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli
    path = tmp_path / "plan.json"
    args = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--runtime", "megatron",
            "--loss-fusion", "te", "-o", str(path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text())["inputs"]["training"]["loss_fusion"] == "te"
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    refused = CliRunner().invoke(cli, [*args[:-2], "--runtime", "torchtitan"])
    assert isinstance(refused.exception, SpecError)
    assert "runtime torchtitan runs no fused cross-entropy loss 'te'" in str(refused.exception)
