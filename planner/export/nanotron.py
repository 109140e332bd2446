"""nanotron v0.4: the parallelism:, tokens: and optimizer.zero_stage parts of its YAML config, to
merge into a full config (model, data, checkpoints and the rest of the optimizer are the user's).

Key names are those of nanotron 0.4 (src/nanotron/config/parallelism_config.py ParallelismArgs,
config.py TokensArgs and OptimizerArgs). Sequence parallelism is tp_mode REDUCE_SCATTER, with
asynchronous TP communication (nanotron applies it only in that mode); 1F1B is pp_engine 1f1b.
nanotron places blocks on pipeline stages itself, by cumulative compute cost (the LM head
counted, the embedding not), so only an even plan split is exported, and nanotron's own split
may still move a layer between neighbouring stages.

Refused, because nanotron cannot run them as planned:
- vpp > 1 (no interleaved schedule), cp > 1 (no context parallelism), ZeRO > 1 (zero_stage is 0
  or 1), an uneven split;
- ep > 1 (expert_parallel_size multiplies the GPU count instead of sharing the data-parallel
  ranks), any activation recomputation (v0.4 has none), FP8;
- an explicit layer graph or an encoder (it builds causal decoders);
- a global batch that is not micro_batch * dp * micro-batches; sequence parallel with tp 1;
- a rank order other than tp-cp-ep-dp-pp when dp and pp both exceed 1 (ranks are ep, pp, dp, tp,
  outermost first).
"""

from __future__ import annotations

from planner.errors import ExportError
from planner.export.common import (
    PlanView,
    check_common,
    check_decoder,
    check_even_split,
    check_rank_order,
    require,
)

RUNTIME = "nanotron"
FORMATS = ("yaml",)
CHECKED_AGAINST = "nanotron 0.4 (config/parallelism_config.py, config.py)"
"""the runtime version whose config classes this output follows"""


def export(plan: dict, v: PlanView, fmt: str = "yaml") -> str:
    if fmt not in FORMATS:
        raise ExportError(f"nanotron formats are {', '.join(FORMATS)}; not {fmt!r}")
    sections = config(v)
    lines = [f"# nanotron v0.4 config sections: {v.model.name} on {v.gpus} GPUs (written by planner export);",
             "# merge into a full config"]
    for name, keys in sections.items():
        lines.append(f"{name}:")
        lines += [f"  {key}: {_yaml_value(value)}" for key, value in keys.items()]
        if name == "tokens":
            lines.append("  # train_steps: required by nanotron, set for the run")
        if name == "optimizer":
            lines.append("  # the other optimizer keys (learning rate, weight decay, ...) are the run's")
    return "\n".join(lines) + "\n"


def config(v: PlanView) -> dict[str, dict]:
    check_common(v, RUNTIME)
    check_decoder(v, RUNTIME, "builds causal decoders only")
    require(v.vpp == 1, RUNTIME, "has no interleaved pipeline schedule", f"vpp {v.vpp}")
    require(v.cp == 1, RUNTIME, "has no context parallelism", f"cp {v.cp}")
    require(v.zero <= 1, RUNTIME, "has zero_stage 0 or 1 only", f"zero {v.zero}")
    require(v.ep == 1, RUNTIME, "multiplies the GPU count by expert_parallel_size (no ep within dp)",
            f"ep {v.ep}")
    require(v.recompute == "none" or (v.recompute == "full" and not any(v.recompute_counts)), RUNTIME,
            "has no activation recomputation", f"{v.recompute} recompute")
    require(v.precision != "fp8", RUNTIME, "has no FP8 training", "precision fp8")
    check_even_split(v, RUNTIME)
    check_rank_order(v, RUNTIME, ("tp-cp-ep-dp-pp",))
    return {
        "parallelism": {"dp": v.dp, "tp": v.tp, "pp": v.pp, "pp_engine": "1f1b",
                        "tp_mode": "REDUCE_SCATTER" if v.sequence_parallel else "ALL_REDUCE",
                        "tp_linear_async_communication": v.sequence_parallel},
        "tokens": {"sequence_length": v.seq_len, "micro_batch_size": v.micro_batch,
                   "batch_accumulation_per_replica": v.num_microbatches},
        "optimizer": {"zero_stage": v.zero},
    }


def _yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
