"""FP8 pricing: what each recipe quantises and at what bytes, the forward GEMMs' fast
accumulation on Hopper, the recipe knob and the exports that carry it."""

from __future__ import annotations

import pytest

from planner.cost import compute
from planner.cost.step import compute_floor_s, estimate, layer_cost, quant_bytes
from planner.errors import SpecError
from planner.export import ExportError, export
from planner.graph import Ctx, build_layers, layer_work
from planner.placement import Span
from planner.planning import estimate_plan
from planner.spec.hardware import load_cluster, load_gpu
from planner.spec.model import ModelSpec, MoeSpec, load_model
from planner.spec.training import Strategy, TrainingSetup

SMALL = ModelSpec(name="small", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1000, seq_len=128,
                  ffn_act="swiglu", norm="rmsnorm")
ONE = Span(size=1, per_node=1, nodes=1)


def test_quantised_elements_of_a_dense_layer_by_hand():
    """The inputs a norm writes (QKV, the first MLP linear), those it does not (output
    projection, second MLP linear) and every linear's output gradient; under tp with sequence
    parallelism the column-parallel inputs and row-parallel output gradients are the local shard
    (quantised before the gather)."""
    layer = build_layers(SMALL)[0]
    h, d, a, kv, f = 256, 64, 4, 2, 512
    for tp, sp in ((1, False), (2, True), (2, False)):
        t = 2 * 128  # micro-batch 2, seq 128
        w = layer_work(layer, Ctx(micro_batch=2, seq_len=128, tp=tp, sp=sp))
        gathered = tp if sp else 1
        fed = t * h / gathered + t * h / gathered
        plain = t * a * d / tp + t * f / tp
        grads = t * (a + 2 * kv) * d / tp + t * h / gathered + t * 2 * f / tp + t * h / gathered
        assert w.quant_elements == pytest.approx((plain, fed, grads))


def test_an_moe_layer_quantises_its_routed_tokens_and_no_norm_feeds_its_mlp():
    model = ModelSpec(name="moe", layers=2, hidden=256, heads=4, kv_heads=4, ffn_hidden=512, vocab=1000, seq_len=128,
                      ffn_act="swiglu", norm="rmsnorm",
                      moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=128, shared_experts=1, shared_ffn_hidden=128))
    layer = build_layers(model)[0]
    t, h = 128, 256
    w = layer_work(layer, Ctx(micro_batch=1, seq_len=128, ep=4))
    routed = t * 2
    plain = t * h + t * 128 + t * h + routed * h + routed * 128  # proj, shared fc1 and fc2, experts' fc1 and fc2
    assert w.quant_elements[0] == pytest.approx(plain)
    assert w.quant_elements[1] == pytest.approx(t * h)  # the QKV alone
    assert w.quant_elements[2] == pytest.approx(t * (3 * h + h + 2 * 128 + h) + routed * (2 * 128 + h))


def test_a_runtime_keeping_quantised_inputs_saves_each_gemm_input_at_one_byte():
    """Under fp8 a Transformer Engine runtime keeps every GEMM's input for the weight gradient as
    its fp8 copy: per layer, both norm outputs (the QKV and first MLP inputs) and the
    activation's output (an expert's routed copy and its activation's output too) drop from 2
    bytes an element to 1; the attention output, which the flash core keeps in 16 bits for its
    own backward, gains the output projection's 1-byte copy; nothing else moves. torchao's
    runtime keeps them in 16 bits; full recomputation keeps only the layer input either way."""
    from planner.runtimes import RUNTIME_RULES
    from planner.cost.step import layer_ctx
    assert RUNTIME_RULES["megatron"].fp8_saves_quantised and not RUNTIME_RULES["torchtitan"].fp8_saves_quantised
    layer = build_layers(SMALL)[0]
    h, d, a, f = 256, 64, 4, 512
    for tp, sp in ((1, False), (2, True)):
        t = 2 * 128
        plain, quantised = (layer_work(layer, Ctx(micro_batch=2, seq_len=128, tp=tp, sp=sp, quantised_inputs=q)).saved
                            for q in (False, True))
        fed = 2 * t * h / (tp if sp else 1) + t * f / tp  # one byte saved an element
        assert plain.main - quantised.main == pytest.approx(fed - t * a * d / tp)  # and one added
        assert plain.aux == quantised.aux
        full = [layer_work(layer, Ctx(micro_batch=2, seq_len=128, tp=tp, sp=sp, recompute="full", quantised_inputs=q))
                for q in (False, True)]
        assert full[0].saved == full[1].saved
    moe = ModelSpec(name="moe", layers=2, hidden=256, heads=4, kv_heads=4, ffn_hidden=512, vocab=1000, seq_len=128,
                    ffn_act="swiglu", norm="rmsnorm", moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=128))
    layer = build_layers(moe)[0]
    plain, quantised = (layer_work(layer, Ctx(micro_batch=1, seq_len=128, ep=4, quantised_inputs=q)).saved
                        for q in (False, True))
    routed = 128 * 2
    assert plain.main - quantised.main == pytest.approx(2 * 128 * h - 128 * a * d + routed * h + routed * 128)
    layer = build_layers(SMALL)[0]
    eager = [layer_work(layer, Ctx(micro_batch=1, seq_len=128, flash=False, quantised_inputs=q)).saved for q in (False, True)]
    assert eager[0].main - eager[1].main == pytest.approx(2 * 128 * h + 128 * f + 128 * a * d)  # O kept only as fp8
    setup = dict(gpus=8, global_batch=8, seq_len=128)
    for runtime, precision, expected in (("megatron", "fp8", True), ("megatron", "bf16", False),
                                         ("torchtitan", "fp8", False), ("composer", "fp8", True)):
        ctx = layer_ctx(SMALL, TrainingSetup(precision=precision, runtime=runtime, **setup), 1, 1, 1, 1, False)
        assert ctx.quantised_inputs is expected, (runtime, precision)


READ, WRITE, AMAX, SCALES = 2.0, 1.0, 2.0, 2 / 32
"""the parts a quantisation kernel moves per element (compute.QUANT_BYTES' docstring): it reads
the 16-bit tensor, writes one fp8 byte per layout, a per-tensor amax pass reads it once more, a
block scale (e8m0 per 32 elements, fp32 per 128) adds 1/32 a layout"""


@pytest.mark.parametrize("gpu_name,recipe,expected", [
    # Hopper's wgrad needs a transposed copy (one more WRITE); a norm writes its output in fp8
    # itself (delayed: only the copy is left) or computes its amax (tensorwise: no amax pass)
    ("h100-sxm-80g", "delayed", (READ + 2 * WRITE, WRITE)),
    ("h100-sxm-80g", "tensorwise", (AMAX + READ + 2 * WRITE, READ + 2 * WRITE)),
    ("b200", "delayed", (READ + WRITE, 0.0)), ("b200", "tensorwise", (AMAX + READ + WRITE, READ + WRITE)),
    # block scaling writes both layouts and their scales whatever the GPU
    ("b200", "mxfp8", (READ + 2 * WRITE + SCALES,) * 2), ("h100-sxm-80g", "blockwise", (READ + 2 * WRITE + SCALES,) * 2),
])
def test_quantisation_bytes_follow_the_recipe_and_the_layout_the_gpu_needs(gpu_name, recipe, expected):
    assert compute.fp8_quant_bytes(recipe, load_gpu(gpu_name)) == expected


def test_a_layer_pays_its_quantisation_as_memory_bound_time():
    cluster = load_cluster("dgx-h100")
    layer = build_layers(SMALL)[0]
    ctx = Ctx(micro_batch=1, seq_len=128)
    w = layer_work(layer, ctx)
    none = layer_cost(layer, ctx, cluster, "fp8", ONE, ONE, ONE)
    quant = layer_cost(layer, ctx, cluster, "fp8", ONE, ONE, ONE, quant=(6.0, 4.0))
    plain, fed, grads = w.quant_elements
    t = compute.memory_time_s
    assert quant.fwd - none.fwd == pytest.approx(t(6.0 * plain + 4.0 * fed, cluster.gpu, cluster.efficiency))
    assert quant.bwd - none.bwd == pytest.approx(t(6.0 * grads, cluster.gpu, cluster.efficiency))
    bf16 = TrainingSetup(gpus=8, global_batch=8, seq_len=128)
    assert quant_bytes(cluster, bf16) is None
    assert quant_bytes(cluster, TrainingSetup(gpus=8, global_batch=8, seq_len=128, precision="fp8",
                                               runtime="megatron")) == (4.0, 1.0)  # Megatron's default: delayed


def test_hopper_forward_gemms_accumulate_fast_and_no_fraction_passes_peak(monkeypatch):
    from planner.spec.efficiency import Efficiency
    eff = Efficiency(framework_fraction=0.8, dp_overlap_fraction=0.5)
    h100, b200 = load_gpu("h100-sxm-80g"), load_gpu("b200")
    speedup = compute.FP8_FAST_ACCUM_SPEEDUP
    assert compute.fp8_forward_speedup(h100, "fp8", eff) == speedup
    assert compute.fp8_forward_speedup(h100, "bf16", eff) == 1.0
    assert compute.fp8_forward_speedup(b200, "fp8", eff) == 1.0
    assert compute.gemm_fraction(h100, "fp8", eff) * compute.fp8_forward_speedup(h100, "fp8", eff) <= 1.0
    monkeypatch.setattr(compute, "FP8_FAST_ACCUM_SPEEDUP", 2.0)  # the cap: the forward never runs past peak
    assert compute.gemm_fraction(h100, "fp8", eff) * compute.fp8_forward_speedup(h100, "fp8", eff) == pytest.approx(1.0)
    monkeypatch.setattr(compute, "FP8_FAST_ACCUM_SPEEDUP", speedup)
    # the layer's forward GEMMs compute faster (their operands move as fast), its backward ones do not
    cluster = load_cluster("dgx-h100")
    layer, ctx = build_layers(SMALL)[0], Ctx(micro_batch=4, seq_len=128)
    fast = layer_cost.__wrapped__(layer, ctx, cluster, "fp8", ONE, ONE, ONE)
    monkeypatch.setattr(compute, "FP8_FAST_ACCUM_SPEEDUP", 1.0)
    slow = layer_cost.__wrapped__(layer, ctx, cluster, "fp8", ONE, ONE, ONE)
    rate, _ = compute.gemm_rate(cluster.gpu, "fp8", cluster.efficiency)
    compute_s = sum(f for f, _ in layer_work(layer, ctx).gemms) / rate  # the GEMMs' compute term alone
    assert slow.fwd - fast.fwd == pytest.approx(compute_s * (1 - 1 / speedup))
    assert slow.bwd == fast.bwd


def test_the_floor_stays_below_fp8_prices():
    cluster, model = load_cluster("dgx-h100"), load_model("llama3-8b")
    setup = TrainingSetup(gpus=8, global_batch=16, seq_len=2048, precision="fp8", runtime="megatron")
    floor = compute_floor_s(model, cluster, setup)
    for s in (Strategy(dp=8), Strategy(dp=4, tp=2, sequence_parallel=True), Strategy(dp=2, tp=4, sequence_parallel=True)):
        assert floor <= estimate(model, cluster, setup, s).step_time_s


def test_the_recipe_knob_is_checked_against_the_runtime():
    base = dict(gpus=8, global_batch=8, seq_len=128)
    with pytest.raises(SpecError, match="fp8-recipe must be one of"):
        TrainingSetup(**base, precision="fp8", fp8_recipe="e4m3")
    with pytest.raises(SpecError, match="needs precision fp8"):
        TrainingSetup(**base, precision="bf16", fp8_recipe="delayed")
    with pytest.raises(SpecError, match="torchtitan has no fp8 recipe delayed"):
        TrainingSetup(**base, precision="fp8", fp8_recipe="delayed", runtime="torchtitan")
    assert TrainingSetup(**base, precision="fp8", runtime="torchtitan").quantisation == "tensorwise"
    assert TrainingSetup(**base, precision="fp8", fp8_recipe="mxfp8", runtime="megatron").quantisation == "mxfp8"
    assert "fp8_recipe" not in TrainingSetup(**base, precision="fp8").to_dict()  # plans before the knob read alike


def test_exports_carry_the_recipe_and_refuse_one_the_runtime_lacks():
    from planner.spec.training import RunOptions
    cluster, model = load_cluster("dgx-h100"), load_model("llama3-8b")

    def planned(runtime, recipe="", **knobs):
        return estimate_plan(model, cluster, gpus=8, global_batch=16, seq_len=2048, precision="fp8", attention="flash",
                             runtime=runtime, constraints={"dp": 8, **knobs}, options=RunOptions(fp8_recipe=recipe))
    args = export(planned("megatron", "tensorwise"), "megatron").split()
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    args = export(planned("megatron"), "megatron").split()
    assert args[args.index("--fp8-recipe") + 1] == "delayed"
    with pytest.raises(ExportError, match="delayed fp8 recipe"):
        export(planned("ideal", zero=3), "torchtitan")
    export(planned("ideal", "tensorwise", zero=3), "torchtitan")


def test_a_block_scaled_recipe_runs_only_on_the_gpus_that_have_it():
    cluster, model = load_cluster("dgx-h100"), load_model("llama3-8b")
    setup = TrainingSetup(gpus=8, global_batch=8, seq_len=2048, precision="fp8", fp8_recipe="mxfp8", runtime="megatron")
    with pytest.raises(SpecError, match="mxfp8 runs on blackwell GPUs only; h100-sxm-80g is hopper"):
        estimate(model, cluster, setup, Strategy(dp=8))
    b200 = load_cluster("dgx-b200")
    assert estimate(model, b200, setup, Strategy(dp=8)).step_time_s > 0


def test_a_plan_with_a_recipe_reads_back_and_rechecks_fresh(tmp_path):
    """The recipe a request named is recorded (inputs.training.fp8_recipe, in the schema), and a
    re-plan from the file searches with it: check finds the plan fresh."""
    from click.testing import CliRunner

    from planner.cli import cli
    path = tmp_path / "plan.json"
    args = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "128", "--precision", "fp8",
            "--fp8-recipe", "tensorwise", "-o", str(path)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    import json
    assert json.loads(path.read_text())["inputs"]["training"]["fp8_recipe"] == "tensorwise"
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output


def test_every_recipe_has_its_bytes_and_mla_quantises_its_latent_up_projections_norm_fed():
    from planner.spec.training import FP8_RECIPES, RECIPE_FAMILIES
    assert tuple(compute.QUANT_BYTES) == FP8_RECIPES and set(RECIPE_FAMILIES) <= set(FP8_RECIPES)
    model = load_model("deepseek-v3")
    layer = next(k for k in build_layers(model) if k.experts)
    m, t = model.mla, 4096
    w = layer_work(layer, Ctx(micro_batch=1, seq_len=4096, ep=8))
    # fed: q_up (from the q latent norm) and kv_up (from the kv latent norm); the down-projections
    # read the standalone input norm (Megatron-Core's MLA spec), the output projection the core
    assert w.quant_elements[1] == pytest.approx(t * (m.q_lora_rank + m.kv_lora_rank))


def test_a_gpu_count_sweep_searches_with_the_requests_options():
    """Each count of a sweep is the plan that count gets alone, with the request's MoE options and
    recipe (the sweep's shared bounds read them too: they once read the defaults, and a sweep
    found a slower plan than the count alone)."""
    import json

    from planner.planning import _sweep_entry, sweep
    from planner.spec.training import RunOptions
    request = {"model": load_model("mixtral-8x7b"), "cluster": load_cluster("dgx-h100"), "global_batch": 128,
               "seq_len": 4096, "precision": "fp8", "attention": "flash", "runtime": "megatron", "constraints": {},
               "top": 1, "options": RunOptions(dispatcher="dedup", ep_overlap=True, fp8_recipe="tensorwise")}
    together = sweep(request, [16, 32], workers=1)
    assert json.dumps(together) == json.dumps([_sweep_entry(request, n) for n in (16, 32)])
    assert together[1]["plan"]["inputs"]["training"]["fp8_recipe"] == "tensorwise"


def test_pools_price_the_recipe_and_a_pool_that_lacks_it_holds_no_stage():
    from planner.planning import make_plan
    from planner.spec.training import RunOptions
    model, mix = load_model("llama3-8b"), load_cluster("b200-plus-h100")

    def planned(recipe):
        return make_plan(model, mix, 64, global_batch=64, seq_len=4096, precision="fp8", attention="flash",
                         runtime="megatron", constraints={}, options=RunOptions(fp8_recipe=recipe))
    delayed, tensorwise, mx = planned("delayed"), planned("tensorwise"), planned("mxfp8")
    assert tensorwise["prediction"]["step_time_s"] > delayed["prediction"]["step_time_s"]
    assert tensorwise["inputs"]["training"]["fp8_recipe"] == "tensorwise"
    assert "pools" in mx and not any(st.get("pool") == "h100" for st in mx["stages"])
    assert "mxfp8 runs on blackwell GPUs only" in next(p for p in mx["pools"] if p["name"] == "h100")["why_not"]
