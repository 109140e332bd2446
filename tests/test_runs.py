"""The bundled published runs: what every row must state, and the wall between calibration and
out-of-sample checks."""

import yaml

from planner.runs import BUNDLED, CHECKS, RUN_RUNTIMES, load_runs


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


def test_band_falls_back_from_gpu_to_family_to_all():
    from planner.bands import MIN_ROWS, Residual, band

    rows = [Residual("h100", "hopper", f"doc{i}", -0.1 * i) for i in range(MIN_ROWS)]
    rows += [Residual("a100", "ampere", "docA", 0.05)]
    assert band("h100", "hopper", rows).basis == "gpu h100"
    assert band("h200", "hopper", rows).basis == "family hopper"
    assert band("a100", "ampere", rows).basis == "all GPUs"
    b = band("h100", "hopper", rows)
    assert b.low <= -0.1 * (MIN_ROWS - 1) * 0.8 and b.high >= -0.1 * 0.5  # 10th and 90th percentiles
    # a row is never judged by its own document's errors
    assert band("h100", "hopper", rows, exclude_document="doc0").rows == MIN_ROWS  # 4 of h100 left: all GPUs
    low, high = b.step_time_range_s(1.0)
    assert low == 1.0 / (1 + b.high) and high == 1.0 / (1 + b.low)


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
