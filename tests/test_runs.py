"""The bundled published runs: what every row must state, and the wall between calibration and
out-of-sample checks."""

import numpy as np
import pytest
import yaml

from planner.errors import PlannerError
from planner.runs import BUNDLED, CHECKS, RUN_RUNTIMES, load_runs, price_run


def _raw(path):
    return yaml.safe_load(path.read_text())


def test_every_bundled_row_names_the_runtime_it_ran_on():
    for path in (BUNDLED, CHECKS):
        for row in _raw(path):
            assert row.get("runtime") in RUN_RUNTIMES, (path.name, row["id"])


def test_checks_and_calibration_share_no_run():
    calibration, checks = load_runs(BUNDLED), load_runs(CHECKS)
    ids = [r.id for r in calibration] + [r.id for r in checks]
    assert len(ids) == len(set(ids))
    assert not {r.source for r in calibration} & {r.source for r in checks}


def test_every_check_row_says_how_its_step_time_was_derived():
    for row in _raw(CHECKS):
        assert row["source"] and row["derivation"] and row["confidence"] in ("high", "medium", "low"), row["id"]
        assert row["step_time_s"] > 0


def test_frozen_checks_keep_their_derived_step_times():
    """The checks frozen before the model changed for them (planner/data/frozen_checks.yaml, commit
    602ebd8) are all still checks, each at the step time derived then: later corrections come as
    cited errata that leave it unchanged."""
    from planner.runs import load_frozen

    frozen, rows = load_frozen(), {r["id"]: r for r in _raw(CHECKS)}
    assert len(frozen.step_times_s) == 60 and frozen.commit.startswith("602ebd8")
    for run_id, step_time_s in frozen.step_times_s.items():
        assert rows[run_id]["step_time_s"] == step_time_s, run_id


def test_validate_reports_the_frozen_checks_apart(monkeypatch):
    """Their figures are those of the frozen rows alone, each source weighted equally as for all
    checks, and absent where the checks priced lack one of them (a user's own check file)."""
    import planner.validate as validate_module
    from planner.runs import Frozen, document
    from planner.validate import summary, validate

    checks = load_runs(CHECKS)[:6]
    picked = [checks[0], checks[3], checks[5]]
    monkeypatch.setattr(validate_module, "load_frozen",
                        lambda: Frozen("0" * 40, "2026-12-01", {r.id: r.step_time_s for r in picked}))
    doc = summary(validate(load_runs(BUNDLED)[:1], loso=False, checks=checks))
    errors = {r["id"]: r["error"] for r in doc["checks"]["runs"]}
    fz = doc["checks"]["frozen"]
    assert fz["runs"] == 3 and fz["bias"] == pytest.approx(np.mean([errors[r.id] for r in picked]))
    by_doc = {}
    for r in picked:
        by_doc.setdefault(document(r.source), []).append(errors[r.id])
    assert fz["equal_source_weight"]["sources"] == len(by_doc)
    assert fz["equal_source_weight"]["bias"] == pytest.approx(np.mean([np.mean(e) for e in by_doc.values()]))
    assert "frozen" not in summary(validate(load_runs(BUNDLED)[:1], loso=False, checks=checks[1:]))["checks"]


def test_band_falls_back_from_gpu_to_family_to_all():
    from planner.bands import MIN_SOURCES, Residual, band

    rows = [Residual("h100", "hopper", f"doc{i}", -0.1 * i + 0.01 * j) for i in range(MIN_SOURCES) for j in range(2)]
    rows += [Residual("a100", "ampere", "docA", 0.05)]
    assert band("h100", "hopper", rows).basis == f"gpu h100, {MIN_SOURCES} sources"
    assert band("h200", "hopper", rows).basis == f"family hopper, {MIN_SOURCES} sources"
    assert band("a100", "ampere", rows).basis == f"all GPUs, {MIN_SOURCES + 1} sources"
    b = band("h100", "hopper", rows)
    assert b.rows == 2 * MIN_SOURCES and b.low < -0.1 * (MIN_SOURCES - 1) and b.high > 0.01
    # a row is never judged by its own document's errors: h100 keeps too few sources, all GPUs has enough
    left = band("h100", "hopper", rows, exclude_document="doc0")
    assert left.basis == f"all GPUs, {MIN_SOURCES} sources" and left.rows == 2 * MIN_SOURCES - 1
    assert band("a100", "ampere", rows[:2 * (MIN_SOURCES - 1)]) is None  # too few sources anywhere
    low, high = b.step_time_range_s(1.0)
    assert low == 1.0 / (1 + b.high) and high == 1.0 / (1 + b.low)


def test_band_is_the_random_effects_prediction_interval():
    """Two sources' rows and a third's, computed by hand from the one-way random-effects model
    (Higgins, Thompson & Spiegelhalter 2009, eq. 12): within-source sum of squares over N - k,
    the source means' variance less its within-source part, t with k - 2 degrees of freedom."""
    from statistics import mean, variance

    from scipy.stats import t

    from planner.bands import Residual, band

    by_doc = {"a": [-0.20, -0.10, -0.15], "b": [0.05, 0.07], "c": [0.00, -0.02, -0.04, 0.02]}
    rows = [Residual("h100", "hopper", d, e) for d, es in by_doc.items() for e in es]
    means = [mean(es) for es in by_doc.values()]
    ss = sum((e - mean(es)) ** 2 for es in by_doc.values() for e in es)
    sigma2 = ss / (9 - 3)
    tau2 = max(0.0, variance(means) - sigma2 * mean(1 / len(es) for es in by_doc.values()))
    half = t.ppf(0.9, 1) * (tau2 + sigma2 + variance(means) / 3) ** 0.5
    b = band("h100", "hopper", rows)
    assert b.low == pytest.approx(mean(means) - half) and b.high == pytest.approx(mean(means) + half)
    # a source's weight is one source's, however many rows it has
    heavy = rows + [Residual("h100", "hopper", "a", -0.15)] * 40
    assert band("h100", "hopper", heavy).low == pytest.approx(mean(means) - half, abs=0.02)


def test_t_quantile_is_scipys():
    from scipy.stats import t

    from planner.bands import t_quantile

    for dof in range(1, 61):
        for p in (0.6, 0.9, 0.99):
            assert t_quantile(p, dof) == pytest.approx(t.ppf(p, dof), rel=1e-12), (p, dof)


def test_band_covers_a_new_source_as_often_as_it_says():
    """Errors drawn as sources do (a shared offset per source, tau 0.08, and rows around it,
    sigma 0.04, 3 to 12 rows a source): the band from 8 sources holds a new source's run 80 % of
    the time; the pooled rows' percentiles (each row a draw) would hold fewer."""
    from planner.bands import Residual, band

    rng = np.random.default_rng(11)
    inside = pooled_inside = 0
    trials = 3000
    for _ in range(trials):
        rows = []
        for d in range(8):
            offset = rng.normal(0.0, 0.08)
            rows += [Residual("h100", "hopper", f"doc{d}", offset + rng.normal(0.0, 0.04))
                     for _ in range(rng.integers(3, 13))]
        new = rng.normal(0.0, 0.08) + rng.normal(0.0, 0.04)
        inside += band("h100", "hopper", rows).contains(new)
        low, high = np.quantile([r.error for r in rows], (0.1, 0.9), method="weibull")
        pooled_inside += low <= new <= high
    assert 0.77 <= inside / trials <= 0.86
    assert pooled_inside / trials < inside / trials - 0.03


def test_validate_reports_bias_beside_mape():
    from planner.validate import summary, validate

    runs = load_runs(BUNDLED)[:3]
    doc = summary(validate(runs, loso=False, checks=load_runs(CHECKS)[:6]))
    errors = [r["error"] for r in doc["runs"]]
    assert doc["bias"] == sum(errors) / len(errors)
    assert doc["mape"] == sum(map(abs, errors)) / len(errors)
    c = doc["checks"]
    per_source = [v["mape"] for v in c["sources"].values()]
    assert c["equal_source_weight"]["mape"] == sum(per_source) / len(per_source)
    assert c["over_25_percent"] == sum(abs(r["error"]) > 0.25 for r in c["runs"])


def test_a_source_held_out_is_priced_by_what_the_rest_can_fit_and_no_more():
    """Leave-one-source-out refits from the family's unfitted defaults, never from the shipped
    fit (which saw the source held out): with too few rows left to fit anything (min(rows // 4,
    sources + 1) = 0), the held-out rows price at the defaults."""
    from planner.spec.efficiency import FAMILY_DEFAULTS
    from planner.validate import document, validate

    runs = [r for r in load_runs(BUNDLED) if r.cluster.gpu.name == "a100-sxm-80g"]
    first, second = sorted({document(r.source) for r in runs})
    picked = ([r for r in runs if document(r.source) == first][:1]
              + [r for r in runs if document(r.source) == second][:2])
    default = FAMILY_DEFAULTS["ampere"]
    assert picked[0].cluster.efficiency.framework_fraction != default.framework_fraction  # the shipped fit
    held = validate(picked, loso=True).loso
    assert len(held) == 3
    for _, priced in held:
        assert priced.error == price_run(priced.run, default).error


def test_bundled_residuals_are_what_validate_computes_now():
    """planner/data/residuals.json (the plans' bands read it) is regenerated by `planner validate
    --save-residuals planner/data/residuals.json` whenever the model or the runs change."""
    from planner.bands import RESIDUALS, residuals_json
    from planner.validate import memory_residuals, residuals, validate

    v = validate(load_runs(BUNDLED), loso=True, checks=load_runs(CHECKS))
    fresh = residuals_json(residuals(v), memory_residuals(v))
    assert fresh == RESIDUALS.read_text(), "stale: run planner validate --save-residuals planner/data/residuals.json"


def test_a_plan_carries_its_band_and_a_cluster_without_its_own_fit_a_wider_one():
    from planner import load_cluster, load_model, make_plan

    model = load_model("llama3-8b")
    own = make_plan(model, load_cluster("dgx-h100"), gpus=8, global_batch=16, top=0)["prediction"]
    borrowed = make_plan(model, load_cluster("dgx-h200"), gpus=8, global_batch=16, top=0)["prediction"]
    b, w = own["band"], borrowed["band"]
    assert b["basis"].startswith("gpu h100-sxm-80g, ") and b["rows"] >= 5 and b["low_error"] < b["high_error"]
    lo, hi = b["step_time_s"]
    assert lo == pytest.approx(own["step_time_s"] / (1 + b["high_error"]), rel=1e-5)
    assert hi == pytest.approx(own["step_time_s"] / (1 + b["low_error"]), rel=1e-5)
    assert "widened" in w["basis"] and w["high_error"] - w["low_error"] >= b["high_error"] - b["low_error"]
    assert 0 < own["hfu"] <= 1


def test_a_prediction_above_the_best_published_mfu_is_flagged():
    from planner.bands import MFU_MARGIN, best_published_mfu, mfu_warning

    best, source = best_published_mfu("h100-sxm-80g", "bf16")
    assert best == 0.625 and source.startswith("NVIDIA/dgxc-benchmarking")  # planner/data/best_mfu.yaml
    assert mfu_warning("h100-sxm-80g", "bf16", best + MFU_MARGIN) is None
    assert "warning sign" in mfu_warning("h100-sxm-80g", "bf16", best + MFU_MARGIN + 0.001)
    assert best_published_mfu("h100-sxm-80g", "fp16") == best_published_mfu("h100-sxm-80g", "bf16")
    assert mfu_warning("l40s", "bf16", 0.99) is None  # nothing published to compare with


def test_no_fitted_efficiency_ends_at_its_bound():
    """Issue 11: every fitted parameter of the shipped calibrated clusters lies inside its bound."""
    from planner.validate import summary, validate

    doc = summary(validate(load_runs(BUNDLED), loso=False))
    assert set(doc["efficiencies"]) == {"dgx-a100-80g", "dgx-b200", "dgx-h100"}
    for name, e in doc["efficiencies"].items():
        assert e["fitted"] and e["at_bound"] == [], name


def _one_run(tmp_path, strategy: dict, unknown: list, hidden: int = 2048):
    row = {"id": "r", "source": "test", "runtime": "other", "cluster": "dgx-h100", "gpus": 16, "global_batch": 64,
           "model": {"layers": 16, "hidden": hidden, "heads": 16, "ffn_hidden": 4 * hidden, "vocab": 32000,
                     "seq_len": 2048},
           "strategy": strategy, "unknown": unknown, "step_time_s": 1.0}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([row]))
    return load_runs(path)[0]


@pytest.mark.parametrize("schedule, vpps", [(None, {1, 2, 4}), ("interleaved-1f1b", {2, 4}), ("1f1b", {1})])
def test_a_stated_schedule_bounds_the_interleavings_enumerated(tmp_path, schedule, vpps):
    from planner.runs import candidates
    stated = {"tp": 2, "pp": 4, "dp": 2, "micro_batch": 1} | ({"schedule": schedule} if schedule else {})
    run = _one_run(tmp_path, stated, ["vpp"])
    found = {s.vpp for s in candidates(run)}
    # 16 layers over 4 stages: chunks of 4, 2 or 1 layers (vpp 1, 2, 4); vpp 3 splits unevenly
    assert found & {1, 2, 4} == vpps
    assert all((s.schedule == "interleaved-1f1b") == (s.vpp > 1) for s in candidates(run))


def test_open_knobs_are_filled_only_with_what_the_runtime_runs():
    """MT-NLG ran DeepSpeed's pipeline engine, which runs ZeRO <= 1 under pipeline stages: its open
    zero is never filled with 2 or 3. A row whose stated knobs already lie outside its runtime's
    record (torchtitan's 405B: FSDP2 under pipeline stages, stated as zero 2) keeps its fills."""
    from planner.runs import candidates
    from planner.runtimes import RUNTIME_RULES

    runs = {r.id: r for r in load_runs(CHECKS)}
    mtnlg = runs["smith22-mtnlg-530b-2240gpu"]
    fills = candidates(mtnlg)
    assert fills and {s.zero for s in fills} == {0, 1}
    assert all(RUNTIME_RULES["deepspeed"].refusal(s, mtnlg.model) is None for s in fills)
    titan = runs["torchtitan24-h100-llama3.1-405b-4d-32k"]
    assert candidates(titan) and all(RUNTIME_RULES[titan.runtime].refusal(s, titan.model) for s in candidates(titan))


def test_a_run_no_fill_fits_is_priced_at_the_fill_that_overflows_least(tmp_path):
    from planner.cost.step import estimate
    from planner.runs import candidates
    run = _one_run(tmp_path, {"tp": 2, "pp": 4, "dp": 2}, ["micro_batch", "vpp"], hidden=16384)
    peaks = {}
    for s in candidates(run):
        try:
            peaks[s] = estimate(run.model, run.cluster, run.setup, s)
        except PlannerError:  # a fill the schedule cannot run (price_run skips it too)
            continue
    assert len(peaks) > 1
    assert not any(e.fits for e in peaks.values())
    priced = price_run(run)
    least = min(round(e.peak_memory_bytes / 2**30, 1) for e in peaks.values())
    assert round(priced.estimate.peak_memory_bytes / 2**30, 1) == least
    assert priced.estimate.step_time_s == min(e.step_time_s for e in peaks.values()
                                              if round(e.peak_memory_bytes / 2**30, 1) == least)


def test_validate_sums_up_the_predicted_peaks_against_the_published_ones():
    from planner.validate import _memory
    rows = [{"memory_error": -0.20}, {"memory_error": 0.04}, {"memory_error": -0.06}, {}]
    out = _memory(rows)
    assert out["runs"] == 3 and out["under_5_percent"] == 2 and out["within_10_percent"] == 2
    assert out["mape"] == pytest.approx(0.10) and out["bias"] == pytest.approx(-0.22 / 3)
    assert _memory([{}]) == {"runs": 0}


@pytest.mark.parametrize("micro_batch, noted", [(1, True), (4, False)])
def test_a_plan_of_short_dropless_moe_layers_says_the_host_may_set_the_pace(micro_batch, noted):
    """Megatron-Core's dropless routing waits for the host every MoE layer (RuntimeRules
    .dropless_host_sync): a plan whose layers take under planning.HOST_BOUND_LAYER_S of GPU work a
    micro-batch says so. Qwen3-30B-A3B on 8 B200s at micro-batch 1 (3.4 ms priced; the archive's
    run took 8.8) is noted, at micro-batch 4 (12.3 ms priced) not; the same plan under a
    runtime without the sync (the ideal space) is not."""
    from planner import make_plan
    from planner.spec.training import RunOptions

    run = {r.id: r for r in load_runs(CHECKS)}["mbridge2602-qwen3-30b-a3b-b200-8gpu-mxfp8"]
    constraints = {"tp": 1, "pp": 1, "cp": 1, "ep": 8, "micro_batch": micro_batch, "recompute": "none"}

    def notes(runtime):
        doc = make_plan(run.model, run.cluster, gpus=8, global_batch=512, seq_len=4096, precision="fp8",
                        runtime=runtime, constraints=constraints, top=0, memory_headroom=0.0,
                        options=RunOptions(fp8_recipe="mxfp8") if runtime == "megatron" else RunOptions())
        return [n for n in doc["notes"] if "host's pace" in n]

    assert bool(notes("megatron")) == noted
    if noted:
        assert not notes("ideal")


def test_validate_splits_the_moe_checks_by_whether_their_layers_are_host_paced():
    """validate's subsets hold the MoE rows twice more, by planning.host_paced (the plan note's
    rule): the archive's Qwen3-30B-A3B on 8 B200s at micro-batch 1 (3.4 ms priced a layer and
    micro-batch) is host-paced, the same shape at micro-batch 4 (12.3 ms) is not, and a dense row
    is in neither."""
    from planner.validate import GPU_PACED, HOST_PACED, _subsets

    runs = {r.id: r for r in load_runs(CHECKS)}
    short, long, dense = (price_run(runs[i]) for i in ("mbridge2602-qwen3-30b-a3b-b200-8gpu-mxfp8",
                                                        "mbridge26041-qwen3-30b-a3b-b200-8gpu-mxfp8-mbs4",
                                                        "mlperf51-cisco-h100-llama31-8b-64gpu-fp8"))
    out = _subsets([short, long, dense])
    assert out["moe"]["runs"] == 2 and out["dense"]["runs"] == 1
    assert out[HOST_PACED]["runs"] == 1 and out[HOST_PACED]["bias"] == pytest.approx(short.error)
    assert out[GPU_PACED]["runs"] == 1 and out[GPU_PACED]["bias"] == pytest.approx(long.error)


def test_a_plan_near_capacity_says_where_published_peaks_ran_above_the_model():
    """bands.memory_warning: where published peaks of runs like a plan's (its runtime's family,
    pipelined or not) came out above the cost model's by more than the plan's GPU has room for, the
    plan says so, with the most negative of those errors, read from the bundled residuals."""
    from planner.bands import bundled_memory_residuals, memory_warning
    from planner.spec.hardware import load_cluster

    gpu = load_cluster("dgx-h100").gpu
    piped = [r.error for r in bundled_memory_residuals() if r.runtime == "torchtitan" and r.pipelined]
    worst = min(piped)
    assert worst < 0, "torchtitan's pipelined 405B rows publish peaks above the model's"
    # just over and just under what the GPU holds at the worst error
    over, under = gpu.memory_bytes * (1 + worst) * 1.001, gpu.memory_bytes * (1 + worst) * 0.999
    note = memory_warning("torchtitan@0.2", 8, over, gpu)
    # published = predicted / (1 + error): the peaks ran 1 / (1 + worst) - 1 above the model
    assert note is not None and f"up to {1 / (1 + worst) - 1:.0%} above" in note and f"({len(piped)} runs" in note
    assert memory_warning("torchtitan", 8, under, gpu) is None
    # no published peak of a Megatron run: nothing to say
    assert memory_warning("megatron", 8, gpu.memory_bytes, gpu) is None
    # torchtitan without pipeline stages, judged on its own rows
    flat = min(r.error for r in bundled_memory_residuals() if r.runtime == "torchtitan" and not r.pipelined)
    assert (memory_warning("torchtitan", 1, gpu.memory_bytes * (1 + flat) * 1.001, gpu) is None) == (flat >= 0)


def test_plans_and_estimates_carry_the_memory_note_of_their_runtime():
    """The note reaches the plan document (planning._notes) on the estimate path, with the plan's
    own peak: Llama 3 405B on 512 H100 with torchtitan's FSDP x TP 8 x PP 8 at micro-batch 4 peaks
    within the GPU as priced, past it at the pipelined rows' worst error; the same degrees under
    Megatron (its distributed optimizer: ZeRO 3 does not run under its pipeline stages), whose
    runs publish no peak here, carry no such note."""
    from planner.bands import bundled_memory_residuals
    from planner.planning import estimate_plan
    from planner.spec.hardware import load_cluster
    from planner.spec.model import load_model

    model, cluster = load_model("llama3-405b"), load_cluster("dgx-h100")
    knobs = {"tp": 8, "pp": 8, "zero": 3, "micro_batch": 4, "recompute": "full"}
    worst = min(r.error for r in bundled_memory_residuals() if r.runtime == "torchtitan" and r.pipelined)

    def notes(runtime, zero=3):
        doc = estimate_plan(model, cluster, 512, 512, 8192, "fp8", "flash", runtime, {**knobs, "zero": zero})
        return doc, [n for n in doc["notes"] if n.startswith("memory: published peaks")]

    doc, found = notes("torchtitan")
    peak = doc["prediction"]["peak_memory_gib"]
    assert peak * 2**30 <= cluster.gpu.memory_bytes < peak * 2**30 / (1 + worst)
    assert len(found) == 1 and f"this plan's {peak:.1f} GiB" in found[0]
    assert notes("megatron", zero=1)[1] == []
