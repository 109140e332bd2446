"""Selective recomputation of named modules (--recompute-modules: Megatron-LM's
--recompute-granularity selective --recompute-modules): what each module drops and runs again,
which runtimes take it, and the plans and exports that carry it. Expected bytes and FLOPs are
counted here from the layer shapes, by hand, not with the cost model's own helpers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cost.step import estimate, executed_flops_per_step
from planner.errors import SpecError
from planner.export import ExportError, export
from planner.graph import Ctx, build_layers, layer_work
from planner.planning import estimate_plan, make_plan
from planner.runs import load_runs
from planner.spec.hardware import load_cluster
from planner.spec.model import MlaSpec, ModelSpec, MoeSpec, load_model
from planner.spec.training import RECOMPUTE_MODULES, RunOptions, Strategy, TrainingSetup

CLUSTER = load_cluster("dgx-h100")
H, HEADS, FFN, EXPERT_FFN, TOP_K = 1024, 8, 4096, 512, 2
MLA = MlaSpec(kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, q_lora_rank=384)
MODEL = ModelSpec(name="mla-moe", layers=4, hidden=H, heads=HEADS, ffn_hidden=FFN, vocab=32000, ffn_act="swiglu",
                  norm="rmsnorm", seq_len=2048, mla=MLA,
                  moe=MoeSpec(experts=8, top_k=TOP_K, expert_ffn_hidden=EXPERT_FFN, dense_layers=1))
PLAIN = ModelSpec(name="plain-moe", layers=2, hidden=H, heads=HEADS, ffn_hidden=FFN, vocab=32000, ffn_act="swiglu",
                  norm="rmsnorm", seq_len=2048,
                  moe=MoeSpec(experts=8, top_k=TOP_K, expert_ffn_hidden=EXPERT_FFN, dense_layers=1))
TOKENS = 2048  # one sequence, tp 1


def _saved(model, index, modules, fp8=False):
    """(main, aux) saved bytes of layer `index` under selective recomputation of `modules`."""
    layer = build_layers(model)[index]
    work = layer_work(layer, Ctx(micro_batch=1, seq_len=TOKENS, recompute="selective", modules=modules,
                                 quantised_inputs=fp8))
    return work.saved.main, work.saved.aux


@pytest.mark.parametrize("fp8", [False, True])
def test_each_module_keeps_out_what_it_recomputes(fp8):
    """Layer 0 is dense, layer 1 has experts; both have MLA (d_qk 64 + 32, d_v 64, 8 heads). g is
    a GEMM input's byte (1 where fp8 runs keep them quantised)."""
    g = 1 if fp8 else 2
    core = {i: _saved(MODEL, i, ("core_attn",), fp8) for i in (0, 1)}

    def dropped(index, modules):
        main, aux = _saved(MODEL, index, modules, fp8)
        return core[index][0] - main, core[index][1] - aux

    # the queries, keys and values of every head, 16-bit: q and k 96 wide, v 64
    qkv = 2 * TOKENS * HEADS * (96 + 96 + 64)
    assert dropped(0, ("core_attn", "mla_up_proj")) == (qkv, 0.0)
    assert dropped(1, ("core_attn", "mla_up_proj")) == (qkv, 0.0)
    # the dense MLP: its norm's output (g), both SwiGLU halves (16-bit) and the activation's output
    # (g), and the norm's fp32 statistic; an MoE layer's MLP is no dense MLP
    assert dropped(0, ("core_attn", "mlp")) == (g * TOKENS * H + (2 * 2 + g) * TOKENS * FFN, 4.0 * TOKENS)
    assert dropped(1, ("core_attn", "mlp")) == (0.0, 0.0)
    # the experts' activation output: top_k copies of every token, expert_ffn wide
    assert dropped(1, ("core_attn", "moe_act")) == (g * TOKENS * TOP_K * EXPERT_FFN, 0.0)
    assert dropped(0, ("core_attn", "moe_act")) == (0.0, 0.0)
    # norms of their own: MLA's input norm on both, the pre-MLP norm of the expert layer only
    assert dropped(0, ("core_attn", "layernorm")) == (g * TOKENS * H, 4.0 * TOKENS)
    assert dropped(1, ("core_attn", "layernorm")) == (2 * g * TOKENS * H, 8.0 * TOKENS)
    # without MLA the attention norm is fused into the QKV linear: only the experts' norm remains
    plain = _saved(PLAIN, 1, ("core_attn",), fp8)
    assert plain[0] - _saved(PLAIN, 1, ("core_attn", "layernorm"), fp8)[0] == g * TOKENS * H
    assert _saved(PLAIN, 0, ("core_attn", "layernorm"), fp8) == _saved(PLAIN, 0, ("core_attn",), fp8)


def test_fp8_runs_quantise_again_the_inputs_the_modules_rebuild():
    """Work.selective_quant, (plain, norm-fed) input elements, counted from the shapes: MLA's
    up-projections read the latents (384 and 256 wide, fed by their norms), the dense MLP reads
    the hidden (fed) and its activation (4096), the experts' second GEMM its top_k copies of every
    token (512 wide), and the standalone input norm feeds MLA's two down-projections (plain)."""
    def quant(index, modules):
        layer = build_layers(MODEL)[index]
        return layer_work(layer, Ctx(micro_batch=1, seq_len=TOKENS, recompute="selective", modules=modules)).selective_quant

    assert quant(0, ("core_attn",)) == (0.0, 0.0)
    assert quant(0, ("mla_up_proj",)) == (0.0, TOKENS * (384 + 256))
    assert quant(0, ("mlp",)) == (TOKENS * FFN, TOKENS * H)
    assert quant(1, ("moe_act",)) == (TOKENS * TOP_K * EXPERT_FFN, 0.0)
    assert quant(0, ("layernorm",)) == quant(1, ("layernorm",)) == (2 * TOKENS * H, 0.0)


def test_the_attention_core_is_the_default_and_recomputes_nothing_else():
    """() and ('core_attn',) price alike; without core_attn the core's scores are kept (eager),
    and the time each module runs again adds up."""
    model = load_model("llama3-8b")
    base = TrainingSetup(gpus=8, global_batch=16, seq_len=2048, runtime="megatron")
    s = Strategy(dp=8, recompute="selective")
    named = estimate(model, CLUSTER, replace(base, recompute_modules=("core_attn",)), s)
    default = estimate(model, CLUSTER, base, s)
    assert named.step_time_s == default.step_time_s and named.peak_memory_bytes == default.peak_memory_bytes
    eager = replace(base, attention="eager")
    layer = build_layers(model)[0]
    kept = {m: layer_work(layer, Ctx(micro_batch=1, seq_len=2048, flash=False, recompute="selective",
                                     modules=m)).saved.main for m in (("core_attn",), ("mlp",))}
    scores = 2 * 32 * 2048 * 2048  # 16-bit scores of 32 heads
    assert kept[("mlp",)] - kept[("core_attn",)] == pytest.approx(
        scores - (2 * TOKENS * 4096 + (2 * 2 + 2) * TOKENS * 14336), rel=1e-12)
    # what each module runs again adds up: the core's and the MLP's together are the sum of each alone
    times = {m: estimate(model, CLUSTER, replace(eager, recompute_modules=m), s).breakdown_s["recompute"]
             for m in (("core_attn",), ("mlp",), ("core_attn", "mlp"))}
    assert times[("core_attn", "mlp")] == pytest.approx(times[("core_attn",)] + times[("mlp",)], rel=1e-12)
    assert min(times.values()) > 0


def test_the_hardware_flops_count_what_the_modules_run_again():
    """HFU's executed FLOPs: 'mlp' adds each dense MLP's forward GEMMs once more, without the
    attention core; 'core_attn' the core (causal flash at half)."""
    model = load_model("llama3-8b")
    base = TrainingSetup(gpus=8, global_batch=16, seq_len=2048, runtime="megatron")
    s, none = Strategy(dp=8, recompute="selective"), Strategy(dp=8)
    est = estimate(model, CLUSTER, base, none)
    plain = executed_flops_per_step(model, base, none, est.stages)
    mlp = executed_flops_per_step(model, replace(base, recompute_modules=("mlp",)), s, est.stages)
    per_token = 3 * 2 * 4096 * 14336  # gate, up and down projections
    assert mlp - plain == pytest.approx(per_token * 32 * 2048 * 16, rel=1e-12)
    core = executed_flops_per_step(model, base, s, est.stages)
    attention = 2 * 2048 * 2048 * 32 * (128 + 128) / 2  # scores and context, causal half, per layer
    assert core - plain == pytest.approx(attention * 32 * 16, rel=1e-12)


def test_recomputing_modules_trades_time_for_memory_on_deepseek_v3():
    """DeepSeek-V3 on 1,024 H100s as Megatron-Bridge's 25.09 recipe ran it (tp 2, pp 8, ep 64,
    recompute_modules mla_up_proj and mlp): with the attention core alone it does not fit; with
    the recipe's modules it does, for less recompute time than the core's."""
    model = load_model("deepseek-v3")
    setup = TrainingSetup(gpus=1024, global_batch=8192, seq_len=4096, precision="fp8", runtime="megatron")
    s = Strategy(dp=64, tp=2, pp=8, ep=64, micro_batch=1, zero=1, recompute="selective", sequence_parallel=True)
    core = estimate(model, CLUSTER, setup, s)
    modules = estimate(model, CLUSTER, replace(setup, recompute_modules=("mla_up_proj", "mlp")), s)
    assert not core.fits and modules.fits
    assert modules.peak_memory_bytes < core.peak_memory_bytes
    assert 0 < modules.breakdown_s["recompute"] < core.breakdown_s["recompute"]


def test_which_runtimes_take_modules_and_which_models_they_fit():
    base = {"gpus": 8, "global_batch": 8, "seq_len": 2048}
    assert TrainingSetup(**base, runtime="megatron", recompute_modules="layernorm, mlp").recompute_modules == \
        ("mlp", "layernorm")  # Megatron's order, each once
    for runtime in ("torchtitan", "deepspeed", "nanotron", "megatron@2022"):
        with pytest.raises(SpecError, match="takes no recompute modules"):
            TrainingSetup(**base, runtime=runtime, recompute_modules=("mlp",))
    with pytest.raises(SpecError, match="'moe' is not one the cost model prices"):
        TrainingSetup(**base, runtime="megatron", recompute_modules=("moe",))
    assert "recompute_modules" not in TrainingSetup(**base).to_dict()  # plans made before read alike
    assert set(RECOMPUTE_MODULES) == {"core_attn", "mla_up_proj", "mlp", "moe_act", "layernorm"}
    llama = load_model("llama3-8b")
    for modules, what in ((("mla_up_proj",), "no multi-latent attention"), (("moe_act",), "has no experts")):
        with pytest.raises(SpecError, match=what):
            estimate_plan(llama, CLUSTER, gpus=8, global_batch=8, seq_len=2048, precision="bf16", attention="flash",
                          runtime="megatron", constraints={"dp": 8, "recompute": "selective"},
                          options=RunOptions(recompute_modules=modules))


def test_a_run_file_names_its_modules_or_says_which_field_is_wrong(tmp_path):
    row = {"id": "r", "source": "s", "model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "global_batch": 8,
           "seq_len": 2048, "runtime": "megatron", "strategy": {"dp": 8, "recompute": "selective"},
           "step_time_s": 1.0, "recompute_modules": ["mlp"]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([row]))
    assert load_runs(path)[0].setup.recompute_modules == ("mlp",)
    path.write_text(json.dumps([dict(row, recompute_modules=["mlp", "attn"])]))
    with pytest.raises(SpecError, match=r"runs.json: r\.recompute_modules: 'attn' is not one"):
        load_runs(path)
    # a run's model is a preset's name (above) or its dimensions; anything else says so
    path.write_text(json.dumps([dict(row, model=[1, 2])]))
    with pytest.raises(SpecError, match=r"runs.json: r\.model: expected a preset's name or a mapping"):
        load_runs(path)


def test_the_megatron_export_names_the_modules_and_other_runtimes_refuse_them(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli
    model = load_model("llama3-8b")

    def planned(recompute, runtime="megatron", **options):
        return estimate_plan(model, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16",
                             attention="flash", runtime=runtime, constraints={"dp": 8, "zero": 1, "recompute": recompute},
                             options=RunOptions(**options))
    lines = export(planned("selective", recompute_modules=("mlp", "layernorm")), "megatron").splitlines()
    assert "--recompute-granularity selective" in lines and "--recompute-modules mlp layernorm" in lines
    assert not any(line.startswith("--recompute-modules") for line in export(planned("selective"), "megatron").splitlines())
    # a search that may take the modules and chooses another mode: the plan records them, the launch has none
    unused = make_plan(model, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16", attention="flash",
                       runtime="megatron", constraints={"dp": 8, "zero": 1}, options=RunOptions(recompute_modules=("mlp",)))
    assert unused["strategy"]["recompute"] != "selective"
    assert unused["inputs"]["training"]["recompute_modules"] == ["mlp"]
    assert not any(line.startswith("--recompute-modules") for line in export(unused, "megatron").splitlines())
    # a strategy that recomputes otherwise, asked with modules, is a contradiction
    for mode in ("none", "full"):
        with pytest.raises(SpecError, match=f"recompute {mode} recomputes"):
            planned(mode, recompute_modules=("mlp",))
    ideal = estimate_plan(model, CLUSTER, gpus=8, global_batch=16, seq_len=2048, precision="bf16", attention="flash",
                          runtime="ideal", constraints={"dp": 8, "zero": 3, "recompute": "selective"},
                          options=RunOptions(recompute_modules=("mlp",)))
    with pytest.raises(ExportError, match=r"selective recomputation of mlp \(--recompute-modules\)"):
        export(ideal, "torchtitan")
    # the plan records them, reads back and checks fresh
    path = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch",
                                      "64", "--recompute-modules", "mlp", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text())["inputs"]["training"]["recompute_modules"] == ["mlp"]
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch",
                                      "64", "--recompute-modules", "mlp,moe"])
    # the error the command's boundary (cli.main) turns into one line and exit 2
    assert isinstance(result.exception, SpecError) and "'moe' is not one the cost model prices" in str(result.exception)
