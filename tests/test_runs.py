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
