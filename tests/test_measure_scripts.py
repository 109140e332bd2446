"""The device checks of hardware/measure where a CPU can try them: pp_stage_memory's order of
micro-batches is torch.distributed.pipelining's own Schedule1F1B, its stage runs end to end
(FSDP2 on a one-rank gloo mesh at a tiny shape) without a GPU, and what that stage holds, counted
by torch's MemTracker, is what the memory model prices for it (an independent oracle of the
pipelined FSDP2 accounting; the caching allocator's reserve on top is what the device run reads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("torch", reason="PyTorch CPU runs the schedule and the stage; pip install torch==2.13.0")

MEASURE = Path(__file__).resolve().parent.parent / "hardware" / "measure"
sys.path.insert(0, str(MEASURE))

from pp_stage_memory import TINY, one_f_one_b  # noqa: E402


def _torch_1f1b(pp: int, rank: int, microbatches: int) -> list[tuple[str, int]]:
    """The forwards and backwards torch's Schedule1F1B runs on stage `rank`, recorded from a
    stage that only answers its calls (no communication: every receive and send is empty)."""
    from torch.distributed.pipelining.schedules import Schedule1F1B
    calls = []
    stage = mock.MagicMock(num_stages=pp, stage_index=rank, is_first=rank == 0, is_last=rank == pp - 1,
                           device="cpu")
    for ops in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
        getattr(stage, ops).return_value = []
    stage.forward_one_chunk.side_effect = lambda i, *args, **kwargs: calls.append(("F", i))
    stage.backward_one_chunk.side_effect = lambda i, *args, **kwargs: calls.append(("B", i))
    Schedule1F1B(stage, microbatches)._step_microbatches([()] * microbatches, [{}] * microbatches)
    return calls


@pytest.mark.parametrize("pp,microbatches", [(2, 2), (2, 5), (4, 4), (4, 9), (8, 8), (8, 16)])
def test_the_stage_runs_its_micro_batches_in_schedule_1f1b_order_on_every_rank(pp, microbatches):
    for rank in range(pp):
        assert one_f_one_b(pp, rank, microbatches) == _torch_1f1b(pp, rank, microbatches)


def test_the_pipelined_stage_runs_on_a_cpu_and_reports_each_step():
    run = subprocess.run([sys.executable, str(MEASURE / "pp_stage_memory.py"), "--child", "8k-x4", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    row = json.loads(run.stdout)
    assert row["order"] == "".join(f"{k}{i}" for k, i in one_f_one_b(row["pp"], 0, row["microbatches"]))
    assert len(row["steps"]) == TINY["STEPS"] and all(step["wall_s"] > 0 for step in row["steps"])
    h, ffn, attention = TINY["HIDDEN"], TINY["FFN"], TINY["HEADS"] * TINY["HEAD_DIM"]
    layer = 2 * h + 2 * h * attention + 2 * h * TINY["KV_HEADS"] * TINY["HEAD_DIM"] + 3 * h * ffn
    assert row["params"] == TINY["VOCAB"] * h + TINY["LAYERS"] * layer


ORACLE_DIMS = {"TP": 1, "HIDDEN": 256, "HEADS": 4, "KV_HEADS": 1, "HEAD_DIM": 64, "FFN": 640, "VOCAB": 1024,
               "LAYERS": 8, "PP": 8, "MICRO_BATCH": 2, "SEQ": 256, "STEPS": 2}
"""a Llama-shaped stage small enough for a CPU: 8 layers of a 64-layer model on the first of 8
pipeline ranks, no tensor parallelism (the script's stand-in collectives then do nothing)"""


def _tracked_peak(microbatches: int, rank: int) -> tuple[float, int]:
    """(peak bytes live in the second step's forwards and backwards, the stage's parameters) of
    pp_stage_memory's stage `rank` on a CPU, counted by torch's MemTracker."""
    dims = json.dumps({**ORACLE_DIMS, "MICROBATCHES": microbatches, "RANK": rank})
    run = subprocess.run([sys.executable, str(MEASURE / "pp_stage_memory.py"), "--child", "8k-x4", "--device", "cpu",
                          "--dims", dims], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    row = json.loads(run.stdout)
    return row["steps"][-1]["max_tracked_bytes"], row["params"]


def _priced_stage_bytes(microbatches: int, params: int, rank: int) -> float:
    """The memory model's stage `rank` for the same run (torchtitan of December 2024, eager, FSDP2
    without resharding after forward: zero 2 on one data-parallel rank), less what the stage does
    not hold: the runtime's fixed reserve (CUDA context and workspaces) and Adam's two moments
    (the script runs no optimizer; the fp32 master copy is FSDP2's sharded parameter, which it
    holds)."""
    from planner import estimate
    from planner.cost.memory import RUNTIME_RESERVED_BYTES
    from planner.spec.hardware import load_cluster
    from planner.spec.model import ModelSpec
    from planner.spec.training import Strategy, TrainingSetup

    d = ORACLE_DIMS
    model = ModelSpec(name="oracle-stage", layers=d["LAYERS"] * d["PP"], hidden=d["HIDDEN"], heads=d["HEADS"],
                      kv_heads=d["KV_HEADS"], head_dim=d["HEAD_DIM"], ffn_hidden=d["FFN"], vocab=d["VOCAB"],
                      ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=d["SEQ"],
                      linear_bias=False, tied_embeddings=False)
    setup = TrainingSetup(gpus=d["PP"], global_batch=microbatches * d["MICRO_BATCH"], seq_len=d["SEQ"],
                          runtime="torchtitan@2024-12")
    est = estimate(model, load_cluster("grand-teton-h100"), setup,
                   Strategy(dp=1, pp=d["PP"], micro_batch=d["MICRO_BATCH"], zero=2, recompute="full"))
    stage = est.stages[rank]
    assert stage.layers == d["LAYERS"]
    return stage.memory.total - RUNTIME_RESERVED_BYTES - 8 * params


@pytest.mark.parametrize("rank", [0, ORACLE_DIMS["PP"] - 1])
def test_a_pipelined_fsdp2_stage_holds_no_more_than_the_memory_model_prices(rank):
    """The first 1F1B stage runs every micro-batch's forward before its first backward, the last
    one each forward, its loss and its backward in turn; each layer keeps its input, FSDP2
    accumulates unsharded fp32 gradients from the first backward on, the pipelining stage keeps
    each micro-batch's output (the last stage's logits) and receive buffers. What torch holds of
    a stage at its peak is never above the model's price (9-21 % below it here: what the model
    rebuilds of a layer in backward is counted on the safe side), and four more micro-batches
    cost what the model says they do, to 1 %, once its fragmentation allowance on activations
    (memory.FRAGMENTATION) is taken off."""
    from planner.cost.memory import FRAGMENTATION

    tracked8, params = _tracked_peak(8, rank)
    tracked4, _ = _tracked_peak(4, rank)
    priced8, priced4 = _priced_stage_bytes(8, params, rank), _priced_stage_bytes(4, params, rank)
    assert tracked8 <= priced8 <= 1.25 * tracked8
    assert tracked4 <= priced4 <= 1.25 * tracked4
    assert (priced8 - priced4) / (1 + FRAGMENTATION) == pytest.approx(tracked8 - tracked4, rel=0.01)
