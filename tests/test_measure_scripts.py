"""The device checks of hardware/measure where a CPU can try them: pp_stage_memory's order of
micro-batches is torch.distributed.pipelining's own Schedule1F1B, its stage runs end to end on
every kind of pipeline rank (FSDP2 on a one-rank gloo mesh at a tiny shape) without a GPU, and
what the script's stage holds, counted by torch's MemTracker, is what the memory model prices for
it (an independent oracle of the pipelined FSDP2 accounting; the caching allocator's reserve on
top is what the device run reads)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("torch", reason="PyTorch CPU runs the schedule and the stage; pip install torch==2.13.0")

SCRIPT = Path(__file__).resolve().parent.parent / "hardware" / "measure" / "pp_stage_memory.py"
_spec = importlib.util.spec_from_file_location("pp_stage_memory", SCRIPT)
pp_stage_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pp_stage_memory)
TINY, one_f_one_b = pp_stage_memory.TINY, pp_stage_memory.one_f_one_b


def _stage_process(dims: dict) -> subprocess.CompletedProcess:
    """One CPU run of the script's stage at TINY's shape with `dims` over it."""
    return subprocess.run([sys.executable, str(SCRIPT), "--child", "tiny", "--device", "cpu", "--dims",
                           json.dumps(dims)], capture_output=True, text=True, timeout=300)


def _run_stage(dims: dict) -> dict:
    """The script's JSON for that run, which must succeed."""
    run = _stage_process(dims)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


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
def test_the_stage_order_is_schedule_1f1b_on_every_rank(pp, microbatches):
    for rank in range(pp):
        assert one_f_one_b(pp, rank, microbatches) == _torch_1f1b(pp, rank, microbatches)


def _torch_interleaved(pp: int, rank: int, microbatches: int, chunks: int) -> list[str]:
    """The actions torch's ScheduleInterleaved1F1B plans for `rank` (its pipeline_order, idle
    slots left out), as '<stage>F<micro-batch>' and '<stage>B<micro-batch>'."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    stages = [mock.MagicMock(stage_index=rank + c * pp, num_stages=chunks * pp, group_size=pp, group_rank=rank,
                             is_first=rank + c * pp == 0, is_last=rank + c * pp == chunks * pp - 1, device="cpu")
              for c in range(chunks)]
    return [str(a) for a in ScheduleInterleaved1F1B(stages, microbatches).pipeline_order[rank] if a is not None]


@pytest.mark.parametrize("pp,microbatches,chunks", [(2, 2, 2), (2, 6, 3), (4, 4, 2), (4, 12, 2), (8, 8, 2),
                                                     (8, 16, 2), (8, 24, 3)])
def test_the_interleaved_stage_order_is_schedule_interleaved_1f1b_on_every_rank(pp, microbatches, chunks):
    for rank in range(pp):
        mine = [f"{rank + c * pp}{kind}{i}" for kind, c, i in pp_stage_memory.interleaved_1f1b(pp, rank, microbatches,
                                                                                               chunks)]
        assert mine == _torch_interleaved(pp, rank, microbatches, chunks)


@pytest.mark.parametrize("rank", [0, 1, TINY["PP"] - 1])
def test_the_stage_runs_on_a_cpu_as_the_first_a_middle_and_the_last_rank(rank):
    row = _run_stage({"RANK": rank})
    order = " ".join(f"{rank}{k}{i}" for k, i in one_f_one_b(TINY["PP"], rank, TINY["MICROBATCHES"]))
    assert [step["ran"] for step in row["steps"]] == [order] * TINY["STEPS"]
    assert all(step["max_tracked_bytes"] > 0 for step in row["steps"])
    h, ffn, attention = TINY["HIDDEN"], TINY["FFN"], TINY["HEADS"] * TINY["HEAD_DIM"]
    layer = 2 * h + 2 * h * attention + 2 * h * TINY["KV_HEADS"] * TINY["HEAD_DIM"] + 3 * h * ffn
    ends = (TINY["VOCAB"] * h if rank == 0 else 0) + (h + h * TINY["VOCAB"] // TINY["TP"] if rank == TINY["PP"] - 1
                                                       else 0)
    assert row["params"] == TINY["LAYERS"] * layer + ends


def test_the_stage_refuses_dims_it_does_not_know():
    run = _stage_process({"MICROBATCH": 8})
    assert run.returncode != 0 and "unknown key(s) MICROBATCH" in run.stderr
    run = _stage_process({"RANK": TINY["PP"]})
    assert run.returncode != 0 and "RANK must be a pipeline rank" in run.stderr


ORACLE_DIMS = {"TP": 1, "HIDDEN": 256, "HEADS": 4, "KV_HEADS": 1, "HEAD_DIM": 64, "FFN": 640, "VOCAB": 1024,
               "LAYERS": 8, "PP": 8, "MICRO_BATCH": 2, "SEQ": 256, "STEPS": 2}
"""a Llama-shaped stage small enough for a CPU: 8 layers of a 64-layer model on a rank of 8
pipeline ranks, no tensor parallelism (the script's stand-in collectives then do nothing)"""


def _tracked_peak(microbatches: int, rank: int, vpp: int = 1, pp: int = ORACLE_DIMS["PP"]) -> tuple[float, int]:
    """(peak bytes live in the second step's forwards and backwards, the rank's parameters) of
    pp_stage_memory's stage `rank` of `pp` (its `vpp` chunks) on a CPU, counted by torch's MemTracker."""
    row = _run_stage({**ORACLE_DIMS, "MICROBATCHES": microbatches, "RANK": rank, "VPP": vpp, "PP": pp})
    return row["steps"][-1]["max_tracked_bytes"], row["params"]


def _priced_stage_bytes(microbatches: int, params: int, rank: int, vpp: int = 1, pp: int = ORACLE_DIMS["PP"]) -> float:
    """The memory model's stage `rank` for the same run (torchtitan of December 2024, eager, FSDP2
    without resharding after forward: zero 2 on one data-parallel rank), less what the script's
    stage does not hold: the runtime's fixed reserve (CUDA context and workspaces) and Adam's two
    moments (it runs no optimizer; the fp32 master copy is FSDP2's sharded parameter, which it
    holds)."""
    from planner import estimate
    from planner.cost.memory import RUNTIME_RESERVED_BYTES
    from planner.spec.hardware import load_cluster
    from planner.spec.model import ModelSpec
    from planner.spec.training import Strategy, TrainingSetup

    d = {**ORACLE_DIMS, "PP": pp}
    model = ModelSpec(name="oracle-stage", layers=d["LAYERS"] * d["PP"], hidden=d["HIDDEN"], heads=d["HEADS"],
                      kv_heads=d["KV_HEADS"], head_dim=d["HEAD_DIM"], ffn_hidden=d["FFN"], vocab=d["VOCAB"],
                      ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=d["SEQ"],
                      linear_bias=False, tied_embeddings=False)
    setup = TrainingSetup(gpus=d["PP"], global_batch=microbatches * d["MICRO_BATCH"], seq_len=d["SEQ"],
                          runtime="torchtitan@2024-12")
    est = estimate(model, load_cluster("grand-teton-h100"), setup,
                   Strategy(dp=1, pp=d["PP"], vpp=vpp, micro_batch=d["MICRO_BATCH"], zero=2, recompute="full",
                            schedule="interleaved-1f1b" if vpp > 1 else "1f1b"))
    stage = est.stages[rank]
    assert stage.layers == d["LAYERS"]
    return stage.memory.total - RUNTIME_RESERVED_BYTES - 8 * params


@pytest.mark.parametrize("rank", [0, ORACLE_DIMS["PP"] - 1])
def test_a_pipelined_fsdp2_stage_holds_no_more_than_the_memory_model_prices(rank):
    """The first 1F1B rank runs every micro-batch's forward before its first backward, the last
    one each forward, its loss and its backward in turn; each layer keeps its input, FSDP2 keeps
    the bf16 weights and accumulates unsharded fp32 gradients from the first backward on, the
    pipelining stage keeps each micro-batch's output (the last rank's logits) and receive
    buffers. At its peak the script's stage holds no more than the model prices, the price at most
    12 % above it (4 % on the first rank and 9 % on the last here: what the model rebuilds of a
    layer in backward is counted on the safe side, and 5 % of activations is its fragmentation
    allowance), and four more micro-batches cost what the model says they do, to 1 %, once that
    allowance (memory.FRAGMENTATION) is taken off."""
    from planner.cost.memory import FRAGMENTATION

    tracked8, params = _tracked_peak(8, rank)
    tracked4, _ = _tracked_peak(4, rank)
    priced8, priced4 = _priced_stage_bytes(8, params, rank), _priced_stage_bytes(4, params, rank)
    assert tracked8 <= priced8 <= 1.12 * tracked8
    assert tracked4 <= priced4 <= 1.12 * tracked4
    assert (priced8 - priced4) / (1 + FRAGMENTATION) == pytest.approx(tracked8 - tracked4, rel=0.01)


@pytest.mark.parametrize("rank", [0, 3])
def test_an_interleaved_fsdp2_rank_holds_no_more_than_the_memory_model_prices(rank):
    """Two chunks of 4 layers a rank of 4 (stages rank and rank + 4), ScheduleInterleaved1F1B's
    order, each chunk its own FSDP2 root: a chunk's reduce-scatters run at its own last backward,
    so the later chunk's unsharded gradients are gone before the earlier chunk's backwards end,
    which the model does not price (the safe side). 8 more micro-batches (8 and 16: the first
    rank's warm-up is 10 chunk forwards either way, the last's 4, so only the outputs and receive
    buffers grow) cost what the model prices, to 1 %, less its fragmentation allowance."""
    from planner.cost.memory import FRAGMENTATION

    tracked16, params = _tracked_peak(16, rank, vpp=2, pp=4)
    tracked8, _ = _tracked_peak(8, rank, vpp=2, pp=4)
    priced16, priced8 = (_priced_stage_bytes(m, params, rank, vpp=2, pp=4) for m in (16, 8))
    assert tracked16 <= priced16 <= 1.25 * tracked16
    assert tracked8 <= priced8 <= 1.25 * tracked8
    assert (priced16 - priced8) / (1 + FRAGMENTATION) == pytest.approx(tracked16 - tracked8, rel=0.01)
