"""The device checks of hardware/measure where a CPU can try them: pp_stage_memory's order of
micro-batches is torch.distributed.pipelining's own Schedule1F1B, and its stage runs end to end
(FSDP2 on a one-rank gloo mesh at a tiny shape) without a GPU."""

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
