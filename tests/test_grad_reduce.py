"""The data-parallel reduction's dtype (--grad-reduce) and fp8 weight gathers (--fp8-param-gather):
what each halves of the ZeRO traffic and the gradient buffers, which runtimes run them, and the
plans and exports that carry them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cost import comm, memory
from planner.cost.step import estimate, profile
from planner.errors import SpecError
from planner.export import ExportError, export
from planner.planning import estimate_plan
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from planner.spec.training import RunOptions, Strategy, TrainingSetup

CLUSTER, MODEL = load_cluster("dgx-h100"), load_model("llama3-8b")
BASE = TrainingSetup(gpus=8, global_batch=8, seq_len=2048, precision="fp8", runtime="megatron")
ZERO1 = Strategy(dp=8, zero=1, dp_overlap=False)  # nothing hides: the step shows the whole reduction


def _exposed_by_hand(setup: TrainingSetup) -> float:
    """ZeRO-1 without overlap, one stage: the gradients' reduce-scatter at their reduction width,
    then the weights' all-gather, the layers' at the gather width and the embedding's and head's
    at 16 bits, each priced on the data-parallel group's span."""
    prof = profile(MODEL, CLUSTER, setup, ZERO1)
    layers = float(prof.prefix["params"][-1])
    ends = prof.ends["emb_params"] + prof.ends["head_params"]
    grad = 2 if setup.grad_reduce == "bf16" else 4
    gathered = (1 if setup.fp8_param_gather else memory.WEIGHT_BYTES) * layers + memory.WEIGHT_BYTES * ends
    span = prof.spans["dpcp"]
    return (comm.collective_time_s("reduce_scatter", grad * (layers + ends), span, CLUSTER)
            + comm.collective_time_s("all_gather", gathered, span, CLUSTER))


@pytest.mark.parametrize("grad_reduce,gather", [("", False), ("bf16", False), ("", True), ("bf16", True)])
def test_the_exposed_reduction_moves_the_bytes_its_dtypes_say(grad_reduce, gather):
    setup = replace(BASE, grad_reduce=grad_reduce, fp8_param_gather=gather)
    exposed = estimate(MODEL, CLUSTER, setup, ZERO1).breakdown_s["dp_comm_exposed"]
    assert exposed == pytest.approx(_exposed_by_hand(setup), rel=1e-9)


def test_a_bf16_reduction_halves_the_gradient_buffers_and_leaves_the_rest():
    for zero in (0, 1):
        s = replace(ZERO1, zero=zero)
        fp32 = estimate(MODEL, CLUSTER, BASE, s).stages[0].memory
        bf16 = estimate(MODEL, CLUSTER, replace(BASE, grad_reduce="bf16"), s).stages[0].memory
        assert bf16.grads == pytest.approx(fp32.grads * 2 / memory.GRAD_BYTES)
        assert (bf16.weights, bf16.optimizer, bf16.activations) == (fp32.weights, fp32.optimizer, fp32.activations)
    # an fp8 gather keeps the weights' memory as priced (fp8 plus Hopper's transposed copy)
    gathered = estimate(MODEL, CLUSTER, replace(BASE, fp8_param_gather=True), ZERO1).stages[0].memory
    assert gathered == estimate(MODEL, CLUSTER, BASE, ZERO1).stages[0].memory


def test_the_runtimes_that_lack_a_knob_refuse_it():
    base = {"gpus": 8, "global_batch": 8, "seq_len": 2048}
    with pytest.raises(SpecError, match="reduced in bf16 need precision bf16 or fp8, got fp16"):
        TrainingSetup(**base, precision="fp16", grad_reduce="bf16", runtime="megatron")
    # an fp16 run's gradients reduce in fp16 (dp_grad_bytes): an fp32 reduction asked of it is
    # refused rather than recorded and priced as fp16
    with pytest.raises(SpecError, match="reduced in fp32 need precision bf16 or fp8, got fp16"):
        TrainingSetup(**base, precision="fp16", grad_reduce="fp32", runtime="megatron")
    with pytest.raises(SpecError, match="torchtitan reduces gradients in fp32 only"):
        TrainingSetup(**base, grad_reduce="bf16", runtime="torchtitan")
    with pytest.raises(SpecError, match="fp8 parameter gather needs precision fp8"):
        TrainingSetup(**base, fp8_param_gather=True, runtime="megatron")
    with pytest.raises(SpecError, match="torchtitan has no fp8 parameter gather"):
        TrainingSetup(**base, precision="fp8", fp8_param_gather=True, runtime="torchtitan")
    with pytest.raises(SpecError, match="grad-reduce must be one of fp32, bf16"):
        TrainingSetup(**base, grad_reduce="fp16")
    assert TrainingSetup(**base, grad_reduce="fp32", runtime="torchtitan").grad_reduce == "fp32"
    # plans made before the knobs read alike: the defaults are not recorded
    assert not {"grad_reduce", "fp8_param_gather"} & set(TrainingSetup(**base).to_dict())
    assert RunOptions(fp8_param_gather=True, fp8_recipe="delayed").at("bf16") == RunOptions()


def test_the_megatron_export_carries_both_flags_where_they_run():
    def planned(zero, **options):
        return estimate_plan(MODEL, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="fp8", attention="flash",
                             runtime="megatron", constraints={"dp": 8, "zero": zero}, options=RunOptions(**options))
    args = export(planned(1, grad_reduce="bf16", fp8_param_gather=True), "megatron").split()
    assert "--grad-reduce-in-bf16" in args and "--fp8-param-gather" in args
    args = export(planned(1), "megatron").split()
    assert "--grad-reduce-in-bf16" not in args and "--fp8-param-gather" not in args
    # Megatron-LM asserts --fp8-param-gather runs with its distributed optimizer; ZeRO-0 gathers nothing
    assert "--fp8-param-gather" not in export(planned(0, fp8_param_gather=True), "megatron").split()
    ideal = estimate_plan(MODEL, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="fp8", attention="flash",
                          runtime="ideal", constraints={"dp": 8, "zero": 3},
                          options=RunOptions(fp8_recipe="tensorwise", grad_reduce="bf16"))
    with pytest.raises(ExportError, match="gradients reduced in bf16"):
        export(ideal, "torchtitan")


def test_a_plan_with_the_knobs_reads_back_and_rechecks_fresh(tmp_path):
    """The knobs a request named are recorded (inputs.training, in the schema) and a re-plan from
    the file searches with them: check finds the plan fresh."""
    from click.testing import CliRunner

    from planner.cli import cli
    path = tmp_path / "plan.json"
    args = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--precision", "fp8",
            "--grad-reduce", "bf16", "--fp8-param-gather", "-o", str(path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    training = json.loads(path.read_text())["inputs"]["training"]
    assert training["grad_reduce"] == "bf16" and training["fp8_param_gather"] is True
    assert training["runtime"] == "megatron"  # the one target that runs both
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
