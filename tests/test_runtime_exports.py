"""`plan --runtime X` never produces a plan the X exporter refuses (each setup below pushes the
search towards one of the refusals: ZeRO >= 2 with pipelines, interleaving, context parallelism,
per-stage recompute counts, replication with model parallelism, uneven splits)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.export import export
from planner.planning import make_plan
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model
from runtime_checks import CHECKS

SETUPS = [
    # (model, cluster, gpus, global batch, seq, constraints)
    ("llama3-8b", "dgx-a100-40g", 16, 64, 8192, {}),                 # memory-tight: ZeRO, recompute
    ("llama3-8b", "dgx-h100", 32, 32, 16384, {}),                     # long sequence: cp, pp
    ("llama3-70b", "dgx-h100", 64, 64, 4096, {"pp": 4}),              # pipelines: split, vpp
    ("llama3-70b", "dgx-a100-80g", 64, 128, 4096, {"pp": 8, "recompute": "full"}),  # recompute counts
]
RUNTIMES = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "torchtitan"}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: f"{s[0]}-{s[2]}gpu-{s[4]}")
def test_plan_for_a_runtime_exports_to_it(runtime, setup):
    model_name, cluster_name, gpus, batch, seq, constraints = setup
    plan = make_plan(load_model(model_name), load_cluster(cluster_name), gpus=gpus, global_batch=batch,
                     seq_len=seq, precision="bf16", attention="flash", runtime=runtime, constraints=constraints,
                     top=0)
    assert plan["inputs"]["training"]["runtime"] == runtime
    assert export(plan, RUNTIMES[runtime])


PROPERTY_MODELS = ("llama3-8b", "llama2-7b", "llama3-70b", "mixtral-8x7b", "gpt3-175b")
PROPERTY_CLUSTERS = ("dgx-h100", "dgx-a100-80g", "dgx-a100-40g")


@st.composite
def runtime_setups(draw):
    """A setup a user could bring: a preset decoder on a preset cluster, a GPU count, batch,
    sequence, precision and sometimes a constraint (the search may find nothing that fits)."""
    model = draw(st.sampled_from(PROPERTY_MODELS))
    cluster = draw(st.sampled_from(PROPERTY_CLUSTERS))
    gpus = draw(st.sampled_from([8, 16, 32, 64, 128, 256, 512]))
    batch = gpus * draw(st.sampled_from([1, 2, 4, 8]))
    seq = draw(st.sampled_from([2048, 4096, 8192, 16384]))
    precision = draw(st.sampled_from(["bf16", "fp8"] if cluster == "dgx-h100" else ["bf16", "fp16"]))
    constraints = draw(st.sampled_from([{}, {}, {"recompute": "full"}, {"pp": 2}, {"pp": 4}, {"zero": 1}]))
    return model, cluster, gpus, batch, seq, precision, constraints


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(runtime_setups())
def test_every_plan_for_a_runtime_exports_to_it(runtime, setup):
    """Issue 12: wherever `plan --runtime R` succeeds, `export --to R` does not refuse (the
    search's legal space and the exporter read one capability record), and the runtime's own
    config code reads the export (runtime_checks)."""
    model, cluster, gpus, batch, seq, precision, constraints = setup
    try:
        plan = make_plan(load_model(model), load_cluster(cluster), gpus=gpus, global_batch=batch, seq_len=seq,
                         precision=precision, attention="flash", runtime=runtime, constraints=constraints, top=0)
    except PlannerError:
        return  # refused, or nothing fits: no plan to export
    assert export(plan, RUNTIMES[runtime])
    assert runtime in [r["runtime"] for r in plan["runnable_on"]]
    CHECKS[runtime](plan)  # and the runtime's own code reads the export


def test_runnable_on_lists_exactly_the_runtimes_that_take_the_plan():
    """runnable_on names each runtime whose exporter takes the plan, with the version it was
    checked against; the others refuse it. The README's quick-start plan (the unrestricted
    space) runs on none of them today, and says so in its notes."""
    from planner.errors import ExportError
    from planner.export import CHECKED_AGAINST, EXPORTERS

    for runtime in ("any", "deepspeed"):
        plan = make_plan(load_model("llama3-70b"), load_cluster("dgx-h100"), gpus=64, global_batch=512, seq_len=4096,
                         precision="bf16", attention="flash", runtime=runtime, constraints={}, top=0)
        listed = {r["runtime"]: r["checked_against"] for r in plan["runnable_on"]}
        for name in EXPORTERS:
            try:
                export(plan, name)
                assert listed[name] == CHECKED_AGAINST[name]
            except ExportError:
                assert name not in listed
        if not listed:
            assert any("no supported runtime runs this plan" in n for n in plan["notes"])
    assert "deepspeed" in listed


def test_the_readme_export_commands_run_and_their_runtimes_read_the_output(tmp_path):
    """README's Export section: every line runs as written (in a scratch folder), and each
    runtime's own reading (runtime_checks) takes the plan it exported."""
    import re
    import shlex

    from conftest import REPO, run

    text = (REPO / "README.md").read_text()
    block = re.search(r"## Export\n.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [shlex.split(line.split("#")[0]) for line in block.strip().splitlines()]
    assert [c[1] for c in commands] == ["plan", "export"] * 3
    for command in commands:
        assert command[0] == "planner"
        result = run(*command[1:], cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)
    import json
    for runtime in ("megatron", "deepspeed", "torchtitan"):
        plan = json.loads((tmp_path / f"{runtime}-plan.json").read_text())
        assert runtime in [r["runtime"] for r in plan["runnable_on"]]
        CHECKS[runtime](plan)
    assert (tmp_path / "launch.sh").read_text().startswith("#!/usr/bin/env bash")
