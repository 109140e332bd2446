"""Sweeps on a Dask cluster (issue 14 item 4): a local cluster started here runs the same sweep
as the local processes, with byte-identical output. The dask extra is installed in CI, so this
never skips."""

import json

from conftest import one_error_line, run


def test_a_sweep_on_a_dask_cluster_is_byte_identical_to_the_local_one():
    from distributed import LocalCluster

    args = ("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8-64", "--global-batch", "512", "--json")
    local = run(*args)
    assert local.returncode == 0, local.stderr
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = run(*args, "--dask", cluster.scheduler_address)
        forecast = ("forecast", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8-64", "--global-batch", "512",
                    "--tokens", "1e11", "--format", "json")
        forecast_remote = run(*forecast, "--dask", cluster.scheduler_address)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert len(json.loads(local.stdout)["plans"]) == 8
    forecast_local = run(*forecast)
    assert forecast_remote.returncode == 0, forecast_remote.stderr
    assert forecast_remote.stdout == forecast_local.stdout


def test_an_address_where_no_scheduler_answers_is_one_line():
    result = run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8-16", "--global-batch", "64",
                 "--dask", "tcp://127.0.0.1:9")
    assert "no Dask scheduler answers" in one_error_line(result)


def test_dask_without_the_extra_is_one_line_naming_it(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO
    fake = tmp_path / "site" / "distributed"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(REPO)]))
    result = subprocess.run([sys.executable, "-m", "planner", "plan", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus",
                             "8-16", "--global-batch", "64", "--dask", "tcp://127.0.0.1:9"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert "[dask]" in one_error_line(result)
