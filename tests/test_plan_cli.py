"""planner plan / ranks / diff / check / schema through the real command line."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import one_error_line, run

PLAN = ["plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096"]


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    result = run(*PLAN, "--json", "-o", str(path))
    assert result.returncode == 0, result.stderr
    return path, result.stdout


def test_plan_prints_one_document_and_writes_the_same_bytes(plan_doc):
    path, stdout = plan_doc
    doc = json.loads(stdout)
    assert doc["schema"] == "planner.plan/v2"
    assert path.read_text() == stdout
    assert doc["prediction"]["fits"]
    assert doc["search"]["priced"] >= 1 and doc["search"]["considered"] >= doc["search"]["priced"]


def test_plan_is_deterministic(plan_doc):
    _, stdout = plan_doc
    assert run(*PLAN, "--json").stdout == stdout


def test_runners_up_say_why_they_lost(plan_doc):
    doc = json.loads(plan_doc[1])
    fitting = [a for a in doc["alternatives"] if not a["why_not"].startswith("does not fit")]
    assert len(fitting) == 3 and len(doc["alternatives"]) <= 3 + 1  # plus a faster candidate that does not fit
    best = doc["prediction"]["step_time_s"]
    for alt in doc["alternatives"]:
        assert alt["why_not"].startswith(("slower by", "does not fit by", "as fast"))
        if alt["why_not"].startswith("slower"):
            assert alt["step_time_s"] > best
        if alt["why_not"].startswith("as fast"):
            assert alt["step_time_s"] == best


def test_moe_imbalance_is_priced_recorded_rechecked_and_refused_where_it_means_nothing(tmp_path):
    """--moe-imbalance F prices the most loaded expert rank (slower than balanced routing at the same
    strategy), is recorded in the plan (absent at 1: plans made before the knob read alike) and
    re-checked from it; a plan priced balanced says so in a note, one priced at F does not; a
    dense model or an F below 1 is refused in one line."""
    mixtral = ["plan", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "64", "--global-batch", "256",
               "--seq-len", "4096", "--runtime", "megatron", "--tp", "2", "--ep", "8", "--pp", "1", "--json"]
    even = json.loads(run(*mixtral).stdout)
    path = tmp_path / "uneven.json"
    result = run(*mixtral, "--moe-imbalance", "1.3", "-o", str(path))
    assert result.returncode == 0, result.stderr
    uneven = json.loads(result.stdout)
    assert "moe_imbalance" not in even["inputs"]["training"] and uneven["inputs"]["training"]["moe_imbalance"] == 1.3
    assert uneven["prediction"]["step_time_s"] > 1.05 * even["prediction"]["step_time_s"]
    balanced = [n for n in even["notes"] if "routing priced balanced" in n]
    assert len(balanced) == 1 and "--moe-imbalance" in balanced[0]
    assert not any("routing priced balanced" in n for n in uneven["notes"])
    assert not any("routing" in n for n in json.loads(run(*PLAN, "--json").stdout)["notes"])
    assert run("check", str(path)).returncode == 0
    assert "has no experts" in one_error_line(run(*PLAN, "--moe-imbalance", "1.2"))
    assert "moe-imbalance must be a number in [1, 8]" in one_error_line(run(*mixtral, "--moe-imbalance", "0.5"))


def test_top_controls_the_runners_up():
    doc = json.loads(run(*PLAN, "--top", "1", "--json").stdout)
    assert len(doc["alternatives"]) <= 2  # one runner-up, plus a faster candidate that does not fit
    assert all(a["why_not"].startswith(("slower", "as fast")) for a in doc["alternatives"][:1])


def test_constraints_are_honoured_on_the_command_line():
    doc = json.loads(run(*PLAN, "--tp", "2", "--pp", "2", "--zero", "1", "--json").stdout)
    st = doc["strategy"]
    assert (st["tp"], st["pp"], st["zero"]) == (2, 2, 1)
    assert doc["inputs"]["constraints"] == {"tp": 2, "pp": 2, "zero": 1}


def test_human_output_goes_to_stderr_only():
    result = run(*PLAN)
    assert result.returncode == 0
    assert result.stdout == ""
    assert "runners-up" in result.stderr and "search:" in result.stderr


def test_cbc_prints_nothing_on_stdout():
    result = run(*PLAN, "--recompute", "full", "--pp", "2", "--vpp", "2", "--solver", "cbc", "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)


def test_infeasible_exits_3_and_leaves_no_file(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("previous")
    result = run("plan", "-m", "llama3-405b", "-c", "dgx-a100-40g", "--gpus", "8", "--global-batch", "8",
                 "-o", str(out))
    line = one_error_line(result, code=3)
    assert "GiB per GPU" in line and "39.4 GiB less 5% kept free" in line and "more GPUs" in line
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_infeasible_moe_says_what_the_closest_candidate_needs():
    """Every candidate passes the first memory floor but no split fits: the refinement proves it
    (deepseek-v3's mixed layers take the greedy bottleneck path) and a few candidates with the
    least floors are priced to say what the closest would need."""
    result = run("plan", "-m", "deepseek-v3", "-c", "dgx-h100", "--gpus", "128", "--global-batch", "1024",
                 "--seq-len", "4096")
    line = one_error_line(result, code=3)
    assert "best candidate (" in line and "GiB per GPU" in line and "offers 75.1 GiB (79.1 GiB less 5% kept free)" in line


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "12", "--global-batch", "64"], "whole nodes"),
    (["-m", "bert-large", "--gpus", "512", "--global-batch", "3"], "global batch"),
    (["--gpus", "16", "--global-batch", "64", "--tp", "3"], "constraints"),
])
def test_impossible_requests_exit_2(args, needle):
    result = run("plan", "-m", "llama3-8b", "-c", "dgx-h100", *args)
    assert needle in one_error_line(result, code=2)


def test_sweep_over_gpu_counts():
    result = run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8,16,24", "--global-batch", "48",
                 "--seq-len", "4096", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "planner.sweep/v1"
    assert [e["gpus"] for e in doc["plans"]] == [8, 16, 24]
    assert all("plan" in e or "infeasible" in e for e in doc["plans"])
    assert all(e["plan"]["alternatives"] == [] for e in doc["plans"] if "plan" in e)  # no --top: none per count
    again = json.loads(run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8,16", "--global-batch", "48",
                           "--seq-len", "4096", "--top", "2", "--json").stdout)
    assert all(len(e["plan"]["alternatives"]) >= 2 for e in again["plans"] if "plan" in e)


def test_ranks_lists_every_group(plan_doc):
    path, stdout = plan_doc
    doc = json.loads(stdout)
    groups = json.loads(run("ranks", str(path), "--json").stdout)
    st = doc["strategy"]
    gpus = st["dp"] * st["tp"] * st["pp"] * st["cp"]
    for dim in ("tp", "dp", "pp", "cp"):
        assert sorted(r for g in groups[dim] for r in g) == list(range(gpus))
        assert all(len(g) == st[dim] for g in groups[dim])


# --- diff, check, schema ---------------------------------------------------------------------

def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_diff_identical_plans_exit_0(plan_doc, tmp_path):
    path, _ = plan_doc
    result = run("diff", str(path), str(path), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"changes": [], "equivalent": True}


def test_diff_ignores_version_and_alternatives(plan_doc, tmp_path):
    doc = json.loads(plan_doc[1])
    other = copy.deepcopy(doc)
    other["planner_version"] = "9.9.9"
    other["alternatives"] = []
    assert run("diff", str(plan_doc[0]), _write(tmp_path, "b.json", other)).returncode == 0


def test_diff_a_changed_degree_exits_1(plan_doc, tmp_path):
    doc = json.loads(plan_doc[1])
    other = copy.deepcopy(doc)
    other["strategy"]["micro_batch"] += 1
    result = run("diff", str(plan_doc[0]), _write(tmp_path, "b.json", other), "--json")
    assert result.returncode == 1
    assert [c["key"] for c in json.loads(result.stdout)["changes"]] == ["strategy.micro_batch"]


def test_check_unchanged_plan_exits_0(plan_doc):
    result = run("check", str(plan_doc[0]))
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("ok")


def test_check_stale_strategy_exits_1(plan_doc, tmp_path):
    doc = json.loads(plan_doc[1])
    assert doc["strategy"]["zero"] == 1
    doc["strategy"]["zero"] = 0  # another strategy its runtime runs too
    result = run("check", _write(tmp_path, "stale.json", doc), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["verdict"] == "stale"


def test_check_exits_1_when_the_recorded_runtime_no_longer_runs_the_plan(plan_doc, tmp_path):
    doc = json.loads(plan_doc[1])
    runtime = doc["inputs"]["training"]["runtime"]
    assert runtime in [r["runtime"] for r in doc["runnable_on"]]
    doc["strategy"]["micro_batch"] += 1  # the batch arithmetic no runtime can launch
    result = run("check", _write(tmp_path, "unrunnable.json", doc), "--json")
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert out["verdict"] == "unrunnable" and runtime in out["reason"]


def test_a_plan_recorded_in_the_old_any_space_reads_as_ideal_and_check_says_to_replan(plan_doc, tmp_path):
    doc = json.loads(plan_doc[1])
    training = doc["inputs"]["training"]
    training["runtime"] = "any"
    doc["inputs"].pop("runtimes", None)
    assert run("export", _write(tmp_path, "any.json", doc), "--to", "megatron").returncode in (0, 2)
    result = run("check", _write(tmp_path, "any.json", doc), "--json")
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert out["verdict"] == "stale" and "re-plan" in out["reason"]


@pytest.mark.parametrize("factor,tolerance,code", [(0.99, 0.02, 0), (0.97, 0.02, 1), (0.97, 0.05, 0)])
def test_check_slower_prediction_against_the_tolerance(plan_doc, tmp_path, factor, tolerance, code):
    """A committed plan that predicted a faster step than the installed model now gives: the
    re-plan is slower by 1/factor - 1."""
    doc = json.loads(plan_doc[1])
    doc["prediction"]["step_time_s"] *= factor
    result = run("check", _write(tmp_path, "old.json", doc), "--tolerance", str(tolerance), "--json")
    assert result.returncode == code, result.stdout
    assert json.loads(result.stdout)["verdict"] == ("ok" if code == 0 else "regressed")


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(schema="planner.plan/v0"), "planner.plan/v0"),
    (lambda d: d["strategy"].pop("tp"), "strategy.tp: missing"),
    (lambda d: d["strategy"].update(tp="8"), "strategy.tp: expected integer"),
    (lambda d: d["prediction"].update(step_time_s=None), "prediction.step_time_s"),
])
def test_broken_plans_exit_2_naming_the_key(plan_doc, tmp_path, edit, needle):
    doc = json.loads(plan_doc[1])
    edit(doc)
    path = _write(tmp_path, "broken.json", doc)
    for command in (["diff", path, path], ["check", path], ["ranks", path]):
        assert needle in one_error_line(run(*command), code=2)


def test_truncated_plan_exits_2(plan_doc, tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(plan_doc[1][: len(plan_doc[1]) // 2])
    assert "malformed JSON at line" in one_error_line(run("check", str(path)), code=2)


def test_schema_describes_the_plan(plan_doc):
    schema = json.loads(run("schema").stdout)
    assert schema["title"] == "planner.plan/v2"
    assert set(schema["required"]) <= set(json.loads(plan_doc[1]))


def test_plans_read_back_identically(plan_doc):
    from planner.plan import dumps, read_plan

    path, stdout = plan_doc
    assert dumps(read_plan(path)) == stdout


def test_library_plan_equals_the_command(plan_doc):
    import planner
    from planner.plan import dumps

    doc = planner.make_plan(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"), gpus=16, global_batch=64,
                       seq_len=4096)
    assert dumps(doc) == plan_doc[1]


# --- memory headroom ----------------------------------------------------------------------------

def _nearly_full() -> list[str]:
    """Arguments of a strategy whose peak is between 99 % and 100 % of what an H100 lets a
    framework allocate (79.1 GiB: hardware/gpus/h100-sxm-80g.yaml, the cost model's own figure):
    Llama 3 8B on 8 GPUs at micro-batch 1 with as few layers recomputed as leave it that full,
    found by pricing every count the way `planner estimate` does."""
    from planner import load_cluster, load_model
    from planner.planning import SUPPORTED, estimate_plan

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    for layers in range(model.layers + 1):
        knobs = {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 1, "zero": 1, "recompute": "full",
                 "recompute_layers": layers}
        est = estimate_plan(model, cluster, 8, 64, None, "bf16", "flash", SUPPORTED, knobs)["prediction"]
        if 0.99 * est["capacity_gib"] < est["peak_memory_gib"] <= est["capacity_gib"]:
            return ["-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "64", "--tp", "1",
                    "--pp", "1", "--cp", "1", "--micro-batch", "1", "--zero", "1", "--recompute", "full",
                    "--recompute-layers", str(layers)]
    raise AssertionError("no recompute count leaves Llama 3 8B on 8 H100 99-100 % full")


def test_a_nearly_full_strategy_is_refused_by_default_and_accepted_without_headroom():
    """A strategy 99-100 % full (_nearly_full) fits as estimated (no headroom by default), is
    refused by `plan` under its default 5 % headroom and accepted with --memory-headroom 0."""
    args = _nearly_full()
    est = json.loads(run("estimate", *args, "--json").stdout)["prediction"]
    assert est["capacity_gib"] == 79.1  # estimate: no headroom by default
    assert est["fits"] and 0.95 * est["capacity_gib"] < est["peak_memory_gib"] <= est["capacity_gib"]
    refused = run("plan", *args)
    assert refused.returncode == 3 and "5% kept free" in refused.stderr
    accepted = run("plan", *args, "--memory-headroom", "0", "--json")
    assert accepted.returncode == 0, accepted.stderr
    doc = json.loads(accepted.stdout)
    assert doc["inputs"]["training"]["memory_headroom"] == 0
    assert doc["prediction"]["peak_memory_gib"] == est["peak_memory_gib"]
    assert json.loads(run("estimate", *args, "--memory-headroom", "0.05", "--json").stdout)["prediction"]["fits"] is False


@pytest.mark.parametrize("gpus", [256, 1024])
def test_no_plan_peaks_above_capacity_less_headroom(gpus):
    """llama3-70b on 256 and 1024 H100 planned at 79.5-79.9 GiB before the headroom existed."""
    from planner import load_cluster, load_model, make_plan

    for headroom in (0.05, 0.15):
        doc = make_plan(load_model("llama3-70b"), load_cluster("dgx-h100"), gpus=gpus, global_batch=512,
                        memory_headroom=headroom, top=3)
        cap = 79.1 * (1 - headroom)  # hardware/gpus/h100-sxm-80g.yaml memory_gib less the headroom
        assert doc["prediction"]["capacity_gib"] == pytest.approx(cap, rel=1e-5)
        assert doc["prediction"]["peak_memory_gib"] <= cap
        assert all(a["peak_memory_gib"] <= cap for a in doc["alternatives"] if not a["why_not"].startswith("does not"))


def test_a_plan_of_schema_v1_with_a_seven_fraction_efficiency_block_rechecks_unchanged():
    """tests/data/plan_v1_291d48b.json: `planner plan -m llama3-8b -c dgx-h100 --gpus 16
    --global-batch 64 --seq-len 4096 --json` at commit 291d48b, whose efficiency block had seven
    free fractions. It re-plans from its recorded inputs (runtime 'any', read as 'ideal') to the
    same strategy and step time; check still exits 1 and says to re-plan, since its space is no
    longer the default."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "plan_v1_291d48b.json"
    result = run("check", str(path), "--tolerance", "0", "--json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["verdict"] == "stale" and "re-plan" in out["reason"]
    assert out["step_time_change"] == 0
    assert not [c for c in out["changes"] if c["key"].startswith("strategy.")]


def test_diff_export_and_ranks_read_a_v1_plan_and_say_so():
    from pathlib import Path

    path = str(Path(__file__).parent / "data" / "plan_v1_291d48b.json")
    for args in (("diff", path, path), ("export", path, "--to", "deepspeed"), ("ranks", path)):
        result = run(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert "is a planner.plan/v1 plan" in result.stderr


def test_a_named_moe_dispatcher_is_recorded_and_replanned(tmp_path):
    """--moe-dispatcher goes into the plan's training inputs (absent: the runtime's own, and no
    key), `check` re-plans with it, and the plain all-to-all is never the cheaper of the two."""
    args = ["plan", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "64", "--global-batch", "256", "--seq-len", "4096",
            "--tp", "2", "--ep", "8", "--runtime", "megatron", "--no-moe-folding", "--json"]  # one expert layout
    own = json.loads(run(*args).stdout)
    plain_path = tmp_path / "plain.json"
    result = run(*args, "--moe-dispatcher", "alltoall", "-o", str(plain_path))
    assert result.returncode == 0, result.stderr
    plain = json.loads(result.stdout)
    assert "moe_dispatcher" not in own["inputs"]["training"]
    assert plain["inputs"]["training"]["moe_dispatcher"] == "alltoall"
    assert plain["prediction"]["breakdown_s"]["ep_comm"] > own["prediction"]["breakdown_s"]["ep_comm"] > 0
    assert run("check", str(plain_path)).returncode == 0
    bad = run(*args, "--moe-dispatcher", "deepep")
    assert bad.returncode == 2 and "--moe-dispatcher" in one_error_line(bad)


def test_a_setup_every_runtime_refuses_alike_is_one_line_said_once():
    """--ep-overlap on a dense model: each supported runtime refuses it for the same reason,
    which the error gives once, in one line, exit 2."""
    line = one_error_line(run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "64",
                              "--ep-overlap"))
    assert line.count("llama3-8b has no experts") == 1


def test_folded_experts_are_recorded_exported_to_megatron_and_refused_elsewhere(tmp_path):
    """--moe-folding: the plan records it, ep may exceed dp*cp (ep 8 over tp 2 x dp 4, pp 2), `check`
    re-plans it alike, `ranks` lists ep groups of consecutive ranks, Megatron's export carries
    --expert-tensor-parallel-size 1, DeepSpeed refuses, and a dense model is refused with exit 2."""
    path = tmp_path / "folded.json"
    args = ["plan", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
            "--tp", "2", "--pp", "2", "--vpp", "1", "--ep", "8", "--moe-folding", "--moe-dispatcher", "alltoall",
            "--runtime", "megatron"]
    result = run(*args, "--json", "-o", str(path))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["inputs"]["training"]["moe_folding"] is True
    assert (plan["strategy"]["tp"], plan["strategy"]["dp"], plan["strategy"]["ep"]) == (2, 4, 8)
    assert run("check", str(path)).returncode == 0
    ranks = run("ranks", str(path), "--json")
    assert ranks.returncode == 0, ranks.stderr
    assert json.loads(ranks.stdout)["ep"] == [list(range(8)), list(range(8, 16))]
    exported = run("export", str(path), "--to", "megatron")
    assert exported.returncode == 0, exported.stderr
    assert "--expert-tensor-parallel-size 1" in exported.stdout
    refused = run("export", str(path), "--to", "deepspeed")
    assert refused.returncode != 0 and "folding" in refused.stderr
    dense = run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "64", "--moe-folding")
    assert dense.returncode == 2 and "--moe-folding" in one_error_line(dense)
