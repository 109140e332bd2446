"""DeepSpeed: the ds_config.json of a plan, as a Megatron-DeepSpeed launch reads it.

Batch keys follow DeepSpeed's rule train_batch_size = train_micro_batch_size_per_gpu *
gradient_accumulation_steps * data-parallel size (DeepSpeedConfig._batch_assertion). The tensor,
pipeline and expert degrees are not DeepSpeed config keys (Megatron-DeepSpeed takes them as
--tensor-model-parallel-size / --pipeline-model-parallel-size / --sequence-parallel): they go in a
top-level "_planner" block. DeepSpeedConfig reads only the top-level keys it knows and ignores the
others (checked in DeepSpeed 0.16.4, 0.18.2 and 0.19.0, deepspeed/runtime/config.py), while its sections
(zero_optimization, bf16, fp16, ...) are pydantic models that reject unknown keys, so every key
written inside a section is one DeepSpeed defines. Bucket sizes are DeepSpeed's defaults, written
out so the file says what runs. A bf16 plan at ZeRO-1 also writes data_types.grad_accum_dtype fp32
(a plain top-level dict since DeepSpeed #2512), under which DeepSpeed runs the BF16_Optimizer the
plan was priced on.

Refused, because DeepSpeed cannot run them as planned:
- ZeRO 2 or 3 with pp > 1 (the pipeline engine asserts "ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism");
- vpp > 1 (the pipeline engine has no interleaved schedule), cp > 1 (no context parallelism),
  an uneven split (Megatron-DeepSpeed's pipeline partitions transformer layers evenly);
- full recompute of some layers only (activation checkpointing covers every layer or none);
- an explicit layer graph or an encoder (Megatron-DeepSpeed's pretrain_gpt.py builds causal
  GPT decoders);
- FP8 (no FP8 training mode in the config); a global batch that is not micro_batch * dp *
  micro-batches; sequence parallel with tp 1; a rank order other than tp-cp-ep-dp-pp when dp
  and pp both exceed 1 (the pipe-data-model topology puts pipeline stages outermost).
"""

from __future__ import annotations

import json

from planner.errors import ExportError
from planner.export.common import (
    PlanView,
    check_common,
    check_decoder,
    check_even_split,
    check_precision,
    check_rank_order,
    require,
    single_recompute_policy,
)
from planner.runtimes import RUNTIME_RULES

RUNTIME = "DeepSpeed"
FORMATS = ("json",)
CHECKED_AGAINST = "DeepSpeed 0.16.4, 0.18.2 and 0.19.0 (DeepSpeedConfig)"
"""the runtime versions whose config class this output was checked against"""
BUCKET_BYTES = 500_000_000
"""DeepSpeed's default reduce/allgather bucket size (elements), zero/config.py"""
STAGE3_DEFAULTS = {"stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
                   "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000}
"""DeepSpeed's ZeRO-3 defaults (zero/config.py)"""


def export(plan: dict, v: PlanView, fmt: str = "json") -> str:
    if fmt not in FORMATS:
        raise ExportError(f"DeepSpeed formats are {', '.join(FORMATS)}; not {fmt!r}")
    return json.dumps(config(v), indent=2) + "\n"


def config(v: PlanView) -> dict:
    check_common(v, RUNTIME)
    check_decoder(v, RUNTIME, "(with Megatron-DeepSpeed's pretrain_gpt.py) trains causal decoders only")
    require(v.zero <= 1 or v.pp == 1, RUNTIME, "has no ZeRO-2/3 with pipeline parallelism (pipeline engine)",
            f"zero {v.zero} with pp {v.pp}")
    require(v.vpp == 1, RUNTIME, "has no interleaved pipeline schedule", f"vpp {v.vpp}")
    require(v.cp == 1, RUNTIME, "has no context parallelism", f"cp {v.cp}")
    check_precision(v, RUNTIME, "deepspeed")
    check_even_split(v, RUNTIME)
    check_rank_order(v, RUNTIME, ("tp-cp-ep-dp-pp",))
    recompute = single_recompute_policy(v, RUNTIME)
    doc: dict = {
        "train_batch_size": v.global_batch,
        "train_micro_batch_size_per_gpu": v.micro_batch,
        "gradient_accumulation_steps": v.num_microbatches,
        "zero_optimization": _zero(v),
    }
    doc["fp16" if v.precision == "fp16" else "bf16"] = {"enabled": True}
    if v.precision == "fp16":
        doc["fp16"]["loss_scale"] = 0  # dynamic loss scaling
    if v.zero == 1 and RUNTIME_RULES["deepspeed"].grad_accum_bytes_of(v.precision, v.zero):
        # the BF16_Optimizer the record prices (its grad_accum_bytes): DeepSpeed runs it under
        # ZeRO-1 only with fp32 gradient accumulation (engine._do_optimizer_sanity_check; without
        # ZeRO it picks fp32 itself, get_data_types)
        doc["data_types"] = {"grad_accum_dtype": "fp32"}
    if recompute == "full":
        doc["activation_checkpointing"] = {
            # shard each saved layer input over the tp ranks, as sequence parallelism does
            "partition_activations": v.sequence_parallel,
            "contiguous_memory_optimization": False,
            "number_checkpoints": v.stages[0].layers,
            "cpu_checkpointing": False,
        }
    doc["_planner"] = _launch(v, recompute)
    return doc


def _zero(v: PlanView) -> dict:
    zero: dict = {"stage": v.zero}
    if v.zero == 0:
        return zero
    zero.update({"overlap_comm": v.dp_overlap, "contiguous_gradients": True, "reduce_bucket_size": BUCKET_BYTES})
    if v.zero <= 2:
        zero["allgather_bucket_size"] = BUCKET_BYTES
    else:
        zero.update(STAGE3_DEFAULTS)
    return zero


def _launch(v: PlanView, recompute: str) -> dict:
    launch = {
        "note": "not read by DeepSpeed: the degrees a Megatron-DeepSpeed launch passes as arguments",
        "data_parallel_size": v.dp,
        "tensor_model_parallel_size": v.tp,
        "pipeline_model_parallel_size": v.pp,
        "sequence_parallel": v.sequence_parallel,
        "recompute": recompute,
    }
    if v.model.moe is not None:
        launch["expert_parallel_size"] = v.ep
    return launch
