"""torchtitan v0.2.x: the job config of a plan, as a TOML file or as command-line overrides.

Key names are those of torchtitan/config/job_config.py in the torchtitan 0.2.0 and 0.2.2 wheels
(identical for every key written here); the config manager rejects unknown keys. Mapping:
- ZeRO-3 is FSDP2 over dp (data_parallel_shard_degree = dp, replicate 1, resharding after every
  forward as the plan prices it), or over dp_shard under hybrid sharding (HSDP: replicate =
  dp / dp_shard); ZeRO-0 is DDP (replicate = dp, shard 1);
- the pipeline split is written out: in the TOML as module_fqns_per_model_part (torchtitan's
  decoder models name their modules tok_embeddings, layers.N, norm, output); on the command line
  as the split knobs (pipeline_parallel_first/last_stage_less_layers, layers_per_stage) whose
  split torchtitan's generate_llm_fqn_per_model_part makes equal to the plan's;
- with pp > 1 one step is one pipeline pass: local_batch_size = micro_batch * micro-batches and
  pipeline_parallel_microbatch_size = micro_batch; without pp, gradient accumulation runs the
  micro-batches (global_batch_size / (local_batch_size * dp));
- selective recompute is torchtitan's per-op policy ("op"), as the plan prices it on torchtitan
  (runtimes.RuntimeRules.selective_mode, graph.op_policy);
- torchtitan's tensor parallelism always shards the sequence (sequence parallel), and FSDP2
  always overlaps its communication (dp_overlap is not a knob).

Refused, because torchtitan cannot run them as planned:
- ZeRO 1 or 2 (FSDP2 shards everything, or DDP replicates everything); ZeRO-0 with cp > 1
  (torchtitan shards parameters over the cp ranks) or with tp or pp > 1 (DDP only as the sole
  parallelism); a model other than the llama3 flavors it ships (no MoE among them);
- full recompute of some layers only (one activation-checkpoint policy for all layers);
- fp16 (mixed precision is bfloat16 or float32); an explicit layer graph (no module names);
- a rank order other than tp-cp-ep-dp-pp when dp and pp both exceed 1 (mesh pp, dp, cp, tp);
- on the command line only: a split that the split knobs cannot reproduce (use the TOML).
"""

from __future__ import annotations

import json
import math

from planner.errors import ExportError
from planner.export.common import (
    PlanView,
    check_common,
    check_precision,
    check_rank_order,
    check_transformer,
    describe_split,
    launch_nodes,
    refusal,
    require,
    single_recompute_policy,
)
from planner.runtimes import shipped_model, shipped_names

RUNTIME = "torchtitan"
FORMATS = ("toml", "cli")
CHECKED_AGAINST = "torchtitan 0.2.0 and 0.2.2 (torchtitan/config/job_config.py)"
"""the runtime versions whose config manager this output was checked against"""
SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def export(plan: dict, v: PlanView, fmt: str = "toml") -> str:
    if fmt not in FORMATS:
        raise ExportError(f"torchtitan formats are {', '.join(FORMATS)}; not {fmt!r}")
    sections = job_config(v, cli=fmt == "cli")
    require(fmt != "cli" or not v.stage_pools, RUNTIME, "command line names no node rank of a pool (the TOML does)",
            "pipeline stages over pools " + ", ".join(dict.fromkeys(v.stage_pools)))
    if fmt == "cli":
        return " ".join(f"--{section}.{key} {_cli_value(value)}"
                        for section, keys in sections.items() for key, value in keys.items()) + "\n"
    text = _toml(v, sections)
    if v.stage_pools:  # the node ranks each pool's nodes take (stages are the outermost ranks)
        first, rest = text.split("\n", 1)
        text = "\n".join([first, *(f"# {line}" for line in launch_nodes(plan, v)[3]), rest])
    return text


def job_config(v: PlanView, cli: bool = False, head: str = "output") -> dict[str, dict]:
    """Sections of the job config; with `cli`, the split as knobs instead of module lists;
    `head` the LM head's module name (0.2's decoders call it output, 0.3's lm_head)."""
    check_common(v, RUNTIME)
    check_transformer(v, RUNTIME)
    require(v.zero in (0, 3), RUNTIME, "shards everything (FSDP2, ZeRO-3) or replicates (DDP, ZeRO-0)",
            f"zero {v.zero}")
    if v.zero == 0:
        require(v.cp == 1, RUNTIME, "shards parameters over the cp ranks whenever cp > 1 (no ZeRO-0 with cp)",
                f"zero 0 with cp {v.cp}")
        require(v.dp == 1 or v.tp == v.pp == 1, RUNTIME, "replicates (DDP) only when dp is the sole parallelism",
                f"zero 0 with dp {v.dp}, tp {v.tp}, pp {v.pp}")
    check_precision(v, RUNTIME, "torchtitan")
    check_rank_order(v, RUNTIME, ("tp-cp-ep-dp-pp",))
    recompute = single_recompute_policy(v, RUNTIME)
    shard = (v.dp_shard or v.dp) if v.zero == 3 else 1  # hybrid sharding: replicate x shard (HSDP)
    shipped = shipped_model("torchtitan", v.model)
    require(shipped is not None, RUNTIME, f"builds only the models it ships ({shipped_names('torchtitan')})",
            f"{v.model.name}, none of them")
    model: dict = {"name": shipped.name, "flavor": shipped.flavor}
    if v.precision == "fp8":
        model["converters"] = ["quantize.linear.float8"]
    training = {"local_batch_size": v.micro_batch * (v.num_microbatches if v.pp > 1 else 1),
                "global_batch_size": v.global_batch, "seq_len": v.seq_len, "mixed_precision_param": "bfloat16"}
    parallelism: dict = {"data_parallel_replicate_degree": v.dp // shard, "data_parallel_shard_degree": shard}
    if v.zero == 3:
        parallelism["fsdp_reshard_after_forward"] = "always"
    parallelism.update({"tensor_parallel_degree": v.tp, "context_parallel_degree": v.cp,
                        "pipeline_parallel_degree": v.pp})
    if v.pp > 1:
        parallelism.update({"pipeline_parallel_schedule": SCHEDULES[v.schedule],
                            "pipeline_parallel_microbatch_size": v.micro_batch})
        parallelism.update(_split_knobs(v) if cli else {"module_fqns_per_model_part": module_fqns(v, head)})
    checkpoint = {"mode": recompute}
    if recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    sections = {"model": model, "training": training, "parallelism": parallelism, "activation_checkpoint": checkpoint}
    return {name: keys for name, keys in sections.items() if keys}


def module_fqns(v: PlanView, head: str = "output") -> list[list[str]]:
    """Module names of every virtual stage in pipeline order (looped: stage j*pp + i on rank i)."""
    stages = v.virtual_stages()
    parts = []
    for k, (a, b) in enumerate(stages):
        names = [f"layers.{i}" for i in range(a, b)]
        if k == 0:
            names.insert(0, "tok_embeddings")
        if k == len(stages) - 1:
            names += ["norm", head]
        parts.append(names)
    return parts


def generated_split(stages: int, layers: int, first_less: int, last_less: int) -> list[int] | None:
    """Layers per virtual stage of torchtitan v0.2.x generate_llm_fqn_per_model_part
    (distributed/pipeline_parallel.py): layers + first_less + last_less spread evenly, the
    remainder to the first stages, the first stage then giving first_less of its share to the
    embedding and the last stage last_less to the output; None when it raises."""
    effective = layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    counts, left = [], layers
    for k in range(stages):
        share = per + (k < extra) - (first_less if k == 0 else 0) - (last_less if k == stages - 1 else 0)
        counts.append(max(0, min(share, left)))
        left -= counts[-1]
    return counts


def _split_knobs(v: PlanView) -> dict:
    """first/last_stage_less_layers (and layers_per_stage when the schedule's default count of
    virtual stages is not the plan's) that reproduce the plan's split."""
    sizes = [b - a for a, b in v.virtual_stages()]
    stages, top = len(sizes), max(sizes)
    default_stages = v.pp * (1 if v.vpp == 1 else 2)
    for first in range(top + 1):
        for last in range(top + 1):
            if generated_split(stages, v.model.layers, first, last) != sizes:
                continue
            knobs = {"pipeline_parallel_first_stage_less_layers": first,
                     "pipeline_parallel_last_stage_less_layers": last}
            if stages == default_stages:
                return knobs
            effective = v.model.layers + first + last
            for per_stage in range(1, effective + 1):
                if math.ceil(effective / per_stage) == stages:
                    return {**knobs, "pipeline_parallel_layers_per_stage": per_stage}
    raise refusal(RUNTIME, "command-line split knobs cannot reproduce this split (the TOML format can)",
                  describe_split(v))


def _cli_value(value) -> str:
    if isinstance(value, list):
        return " ".join(str(x) for x in value)
    return str(value)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[\n" + "".join(f"  {_toml_value(item)},\n" for item in value) + "]"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(x) for x in value) + "]"
    return json.dumps(value)  # a TOML basic string is a JSON string for the text written here


def _toml(v: PlanView, sections: dict[str, dict]) -> str:
    lines = [f"# torchtitan v0.2.x job config: {v.model.name} on {v.gpus} GPUs (written by planner export)",
             "", "[job]", f"description = {json.dumps(f'{v.model.name}: planner strategy')}"]
    sections = {"model": {}, **sections}  # [model] first
    for name, keys in sections.items():
        lines += ["", f"[{name}]"]
        if name == "model":
            lines.append(f"# the torchtitan model of {v.model.name}'s shape")
        for key, value in keys.items():
            if key == "module_fqns_per_model_part":
                lines.append("# module names of torchtitan's decoder models (llama3, llama4, qwen3, deepseek_v3)")
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
