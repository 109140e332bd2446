"""The command line contract (DESIGN.md "Command line"), exercised through the real entry point.

The error boundary lives in `planner.cli.main()`, so every test runs `python -m planner` as a
subprocess: exit codes, stdout = data, stderr = one line for humans, never a traceback unless
PLANNER_DEBUG is set.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import yaml
from conftest import REPO, one_error_line, run

from planner.cost.step import model_flops_per_sequence
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model


ESTIMATE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32", "--tp", "2"]

BREAKDOWN_KEYS = {"compute", "recompute", "bubble", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed",
                  "optimizer"}
MEMORY_KEYS = {"weights", "grads", "optimizer", "activations", "other"}


def floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from floats(v)


@pytest.fixture(scope="module")
def estimate_run() -> subprocess.CompletedProcess:
    return run(*ESTIMATE, "--json")


@pytest.fixture(scope="module")
def plan(estimate_run) -> dict:
    assert estimate_run.returncode == 0, estimate_run.stderr
    return json.loads(estimate_run.stdout)


# --- estimate --json: one plan document -------------------------------------------------------

def test_estimate_json_is_one_document(estimate_run):
    assert estimate_run.returncode == 0, estimate_run.stderr
    doc = json.loads(estimate_run.stdout)  # raises on anything besides one JSON document
    assert doc["schema"] == "planner.plan/v2"
    assert estimate_run.stdout.endswith("}\n")


def test_plan_has_design_keys(plan):
    assert {"schema", "planner_version", "inputs", "strategy", "stages", "placement", "prediction",
            "alternatives"} <= set(plan)
    assert plan["alternatives"] == []
    assert {"model", "cluster", "training", "constraints", "solver", "sha256"} <= set(plan["inputs"])
    assert plan["inputs"]["training"] == {"gpus": 8, "global_batch": 32, "seq_len": 8192, "precision": "bf16",
                                          "attention": "flash", "runtime": "megatron", "memory_headroom": 0.0}
    # no --runtime: priced as the fastest of the supported runtimes that run it (tp 2 on one node:
    # Megatron's TP comm overlap and fused attention make it the fastest)
    assert plan["inputs"]["runtimes"] == ["megatron", "deepspeed", "torchtitan", "nanotron"]
    assert plan["inputs"]["constraints"] == {"tp": 2}
    assert plan["placement"]["order"] == "tp-cp-ep-dp-pp"
    for stage in plan["stages"]:
        assert {"index", "layers", "recompute_layers", "memory_gib"} <= set(stage)
    pr = plan["prediction"]
    assert {"step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib", "fits"} <= set(pr)
    assert set(pr["breakdown_s"]) == BREAKDOWN_KEYS
    assert set(pr["memory_gib"]) == MEMORY_KEYS


def test_plan_strategy_resolves_defaults(plan):
    """tp 2 on 8 GPUs: dp = 8 / 2, micro-batch 1, so 32 / (4 * 1) micro-batches; SP defaults on."""
    st = plan["strategy"]
    assert (st["dp"], st["tp"], st["pp"], st["cp"], st["ep"], st["vpp"]) == (4, 2, 1, 1, 1, 1)
    assert st["micro_batch"] == 1
    assert st["num_microbatches"] == 8
    assert st["zero"] == 1
    assert st["recompute"] == "none"
    assert st["sequence_parallel"] is True
    assert st["schedule"] == "1f1b"
    assert [s["layers"] for s in plan["stages"]] == [[0, 32]]


def test_memory_breakdown_sums_to_peak(plan):
    pr = plan["prediction"]
    assert sum(pr["memory_gib"].values()) == pytest.approx(pr["peak_memory_gib"], rel=1e-4)
    assert max(s["memory_gib"] for s in plan["stages"]) == pytest.approx(pr["peak_memory_gib"], rel=1e-4)


def test_time_breakdown_sums_to_step_time(plan):
    pr = plan["prediction"]
    assert sum(pr["breakdown_s"].values()) == pytest.approx(pr["step_time_s"], rel=1e-4)


def test_every_float_has_at_most_six_significant_digits(plan):
    values = list(floats(plan))
    assert values
    for x in values:
        assert x == float(f"{x:.5e}"), x


def test_model_tflops_times_step_time_is_the_step_model_flops(plan):
    pr = plan["prediction"]
    gpus, batch, seq = 8, 32, 8192
    step_flops = pr["model_tflops_per_gpu"] * 1e12 * pr["step_time_s"] * gpus
    # llama3-8b by hand: forward per sequence = linear GEMMs (QKV with GQA, O, SwiGLU MLP), attention
    # scores in full (4 s^2 h per layer), LM head; training = 3x forward.
    h, kv_dim, ffn, layers, vocab = 4096, 8 * 128, 14336, 32, 128256
    linear_params = h * (h + 2 * kv_dim) + h * h + 3 * h * ffn
    forward = layers * (2 * seq * linear_params + 4 * seq * seq * h) + 2 * seq * h * vocab
    model = load_model("llama3-8b")
    assert model_flops_per_sequence(model, seq) == pytest.approx(3 * forward, rel=1e-12)
    assert step_flops == pytest.approx(3 * batch * forward, rel=1e-4)


def test_mfu_is_model_tflops_over_bf16_peak(plan):
    pr = plan["prediction"]
    peak = plan["inputs"]["cluster"]["gpu"]["tflops"]["bf16"]
    assert pr["mfu"] == pytest.approx(pr["model_tflops_per_gpu"] / peak, rel=1e-4)


def test_tokens_per_s_is_batch_tokens_over_step_time(plan):
    pr = plan["prediction"]
    assert pr["tokens_per_s"] == pytest.approx(32 * 8192 / pr["step_time_s"], rel=1e-4)


def test_same_command_gives_identical_bytes(estimate_run):
    again = run(*ESTIMATE, "--json")
    assert again.returncode == 0
    assert again.stdout == estimate_run.stdout


def test_output_file_holds_the_json_bytes(estimate_run, tmp_path):
    out = tmp_path / "plan.json"
    result = run(*ESTIMATE, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == estimate_run.stdout
    assert result.stdout == ""
    assert str(out) in result.stderr


def test_human_output_goes_to_stderr(tmp_path):
    result = run(*ESTIMATE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "step time" in result.stderr
    assert "MFU" in result.stderr


# --- usage and spec errors: exit 2, one line naming every broken factor ------------------------

def test_tp_not_dividing_gpus_or_heads_names_both():
    """--tp 3 on 8 GPUs breaks two rules: 3 does not divide 8 GPUs, and 3 does not divide 32 heads."""
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32", "--tp", "3"))
    assert "GPU count 8" in line
    assert "heads (32)" in line


def test_explicit_degrees_with_wrong_product_and_bad_tp_names_both():
    """dp 2 * tp 3 = 6 is not 8, and tp 3 does not divide 32 heads: both are named."""
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32", "--tp", "3", "--dp", "2"))
    assert "GPU count 8" in line
    assert "heads (32)" in line


def test_degree_product_not_gpu_count():
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32", "--tp", "8", "--pp", "1", "--dp", "2"))
    assert "2*8*1*1 = 16" in line
    assert "GPU count 8" in line


def test_tp_not_dividing_heads():
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "3",
                              "--global-batch", "32", "--tp", "3"))
    assert "tp (3) must divide heads (32)" in line


def test_global_batch_not_divisible():
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "30", "--dp", "8", "--micro-batch", "4"))
    assert "global batch (30)" in line
    assert "8*4" in line


def test_sequence_parallel_needs_tp():
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32", "--sequence-parallel"))
    assert "sequence_parallel needs tp > 1" in line


def test_unknown_model_preset_lists_close_matches():
    line = one_error_line(run("estimate", "-m", "llama3-8", "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32"))
    assert "unknown model preset 'llama3-8'" in line
    assert "did you mean llama3-8b" in line


def test_unknown_cluster_preset_lists_close_matches():
    line = one_error_line(run("estimate", "-m", "llama3-8b", "-c", "dgx-h10", "--gpus", "8",
                              "--global-batch", "32"))
    assert "unknown cluster preset 'dgx-h10'" in line
    assert "dgx-h100" in line


def test_missing_model_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    line = one_error_line(run("estimate", "-m", str(missing), "-c", "dgx-h100", "--gpus", "8",
                              "--global-batch", "32"))
    assert str(missing) in line
    assert "no such model file" in line


def test_malformed_model_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlayers: [1, 2\n")
    line = one_error_line(run("estimate", "-m", str(bad), "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32"))
    assert str(bad) in line
    assert "malformed YAML at line 3" in line


def test_unknown_key_in_model_yaml(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: x\nlayers: 2\nhiden: 64\nhidden: 64\nheads: 4\nffn_hidden: 256\nvocab: 100\n")
    line = one_error_line(run("estimate", "-m", str(typo), "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32"))
    assert str(typo) in line
    assert "hiden: unknown key" in line
    assert "did you mean hidden" in line


def test_click_usage_error_exits_2_without_traceback():
    result = run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32",
                 "--zero", "7")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--zero" in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_env_shows_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlayers: [1, 2\n")
    result = run("estimate", "-m", str(bad), "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32", debug=True)
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "SpecError" in result.stderr


# --- a strategy that does not fit: still exit 0, said in the plan and to the human -------------

NO_FIT = ["estimate", "-m", "llama3-70b", "-c", "dgx-a100-80g", "--gpus", "8", "--global-batch", "8",
          "--tp", "1", "--zero", "0"]


def test_no_fit_estimate_exits_0_with_fits_false():
    result = run(*NO_FIT, "--json")
    assert result.returncode == 0, result.stderr
    pr = json.loads(result.stdout)["prediction"]
    assert pr["fits"] is False
    assert pr["peak_memory_gib"] > pr["capacity_gib"] == 79.15  # hardware/gpus/a100-sxm-80g.yaml


def test_no_fit_human_output_says_so():
    result = run(*NO_FIT)
    assert result.returncode == 0, result.stderr
    assert "does not fit" in result.stderr.lower()


# --- listings ----------------------------------------------------------------------------------

def test_models_lists_the_model_presets():
    result = run("models")
    assert result.returncode == 0
    names = result.stdout.split()
    assert names == sorted(p.stem for p in (REPO / "models").glob("*.yaml"))
    assert len(names) == 10
    assert {"llama3-8b", "llama3-70b", "gpt3-175b", "deepseek-v3", "mixtral-8x7b"} <= set(names)


def test_hardware_lists_gpus_and_clusters():
    result = run("hardware")
    assert result.returncode == 0
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    gpus = [name for kind, name in rows if kind == "gpu"]
    clusters = [name for kind, name in rows if kind == "cluster"]
    assert len(gpus) + len(clusters) == len(rows)
    assert gpus == sorted(p.stem for p in (REPO / "hardware" / "gpus").glob("*.yaml"))
    assert clusters == sorted(p.stem for p in (REPO / "hardware" / "clusters").glob("*.yaml"))
    assert "h100-sxm-80g" in gpus and "dgx-h100" in clusters


CLUSTER_PRESETS = sorted(p.stem for p in (REPO / "hardware" / "clusters").glob("*.yaml"))
MIXED_PRESETS = [name for name in CLUSTER_PRESETS
                 if "pools" in yaml.safe_load((REPO / "hardware" / "clusters" / f"{name}.yaml").read_text())]


@pytest.mark.parametrize("cluster", [name for name in CLUSTER_PRESETS if name not in MIXED_PRESETS])
def test_every_listed_cluster_prices_an_estimate(cluster):
    result = run("estimate", "-m", "llama3-8b", "-c", cluster, "--gpus", "8", "--global-batch", "8", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["cluster"]["name"] == cluster


@pytest.mark.parametrize("cluster", MIXED_PRESETS)
def test_every_listed_mixed_cluster_plans_on_its_pools(cluster):
    result = run("plan", "-m", "llama3-8b", "-c", cluster, "--gpus", "8", "--global-batch", "8", "--json")
    assert result.returncode == 0, result.stderr
    assert [p["used_gpus"] > 0 for p in json.loads(result.stdout)["pools"]].count(True) == 1


# --- validate and calibrate --------------------------------------------------------------------

def test_validate_meets_the_error_targets():
    """Issue 11's calibration goal (MAPE <= 5 %, |bias| <= 2 %) on every calibration source."""
    result = run("validate", "--no-loso", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["mape"] <= 0.05 and abs(doc["bias"]) <= 0.02
    table5 = [abs(r["error"]) for r in doc["runs"] if r["source"] == "Korthikanti et al. 2022, Table 5"]
    assert len(table5) == 8 and sum(table5) / len(table5) <= 0.05
    assert all(math.isfinite(r["predicted_step_time_s"]) for r in doc["runs"])


def test_validate_draws_its_figure_from_the_document_it_prints(tmp_path):
    """--plot draws what --json reports (calibration and checks against the diagonal, the checks'
    errors in their bands, the published memory peaks): a PNG that reads back, and the same
    document on stdout as without the flag."""
    import matplotlib.image

    out = tmp_path / "validate.png"
    result = run("validate", "--no-loso", "--json", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(run("validate", "--no-loso", "--json").stdout)
    image = matplotlib.image.imread(str(out))
    assert image.shape[0] > 300 and image.shape[1] > 3 * image.shape[0]  # three panels side by side


def test_validate_refuses_a_plot_it_cannot_draw_before_pricing(tmp_path):
    line = one_error_line(run("validate", "--plot", str(tmp_path / "v.pdf")))
    assert "--plot" in line and ".png or .svg" in line
    assert not (tmp_path / "v.pdf").exists()
    result = run("validate", "--plot", str(tmp_path / "no" / "v.png"))
    assert "no such folder" in one_error_line(result) and result.stdout == ""  # refused before any table


def test_calibrate_writes_a_loadable_fitted_cluster(tmp_path):
    out = tmp_path / "c.yaml"
    result = run("calibrate", "--cluster", "dgx-h100", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    cluster = load_cluster(str(out))
    assert cluster.name == "dgx-h100"
    assert cluster.efficiency.source.startswith("fitted")
    assert cluster.gpu.name == "h100-sxm-80g"


def test_calibrate_without_cluster_on_several_clusters_names_them(tmp_path):
    out = tmp_path / "c.yaml"
    line = one_error_line(run("calibrate", "-o", str(out)))
    assert "dgx-a100-80g" in line
    assert "dgx-h100" in line
    assert "--cluster" in line
    assert not out.exists()
