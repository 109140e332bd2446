"""`plan --runtime X` never produces a plan the X exporter refuses (each setup below pushes the
search towards one of the refusals: ZeRO >= 2 with pipelines, interleaving, context parallelism,
per-stage recompute counts, replication with model parallelism, uneven splits)."""

import pytest

from planner.export import export
from planner.planning import make_plan
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model

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
