"""Megatron-LM / Megatron-Core: the arguments of pretrain_gpt.py that fix the model shape and the
parallel layout of a plan (data, tokenizer, optimizer and checkpoint arguments are the user's).

Argument names follow NVIDIA/Megatron-LM megatron/training/arguments.py (the snapshot named in
tests/data/megatron_arguments.txt). Formats: "lines" (one argument and its value per line),
"shell" (one line), both shell-quoted, and "launch": a bash script that runs pretrain_gpt.py with
torchrun on every node, with the environment Megatron requires (CUDA_DEVICE_MAX_CONNECTIONS=1 with
tensor or context parallelism, Hopper and older) and what the user supplies in a comment.
Tensor-parallel communication overlap (--tp-comm-overlap, Transformer Engine's userbuffers) is on
exactly where the plan was priced with it (tp_comm_overlap), with UB_SKIPMC=1 before Hopper.

Refused, because Megatron-LM cannot run them as planned:
- ZeRO 2 or 3 (the distributed optimizer shards optimizer states only: ZeRO-1);
- full recompute whose per-stage counts no single --recompute-num-layers reproduces (block
  recompute of N layers applies to every stage, and to every virtual chunk with vpp > 1);
- an uneven split in the middle stages (except a pipeline over a mixed cluster's pools, given
  as --pipeline-model-parallel-layout), an uneven split with vpp > 1, virtual chunks of unequal
  size, and any layout other than Megatron's looped interleaving;
- a pipeline over pools whose GPUs run different collective libraries (export/common.py);
- a global batch that is not micro_batch * dp * micro-batches; sequence parallel with tp 1;
- a sequence that is not a multiple of 2*cp (load-balanced context parallelism);
- expert parallelism with fp16; a rank order other than tp-cp-ep-dp-pp or tp-cp-ep-pp-dp;
- ReLU MLPs, ALiBi, non-causal (encoder) models, explicit layer graphs (pretrain_gpt.py builds
  causal GPT decoders with gelu or swiglu MLPs and learned, rotary or no position embeddings);
- a learned position table shorter than the sequence.
"""

from __future__ import annotations

import shlex

from planner.errors import ExportError
from planner.export.common import (
    PlanView,
    check_common,
    check_decoder,
    launch_nodes,
    refusal,
    require,
)
from planner.runtimes import RUNTIME_RULES, tp_overlap

RUNTIME = "Megatron-LM"
FORMATS = ("lines", "shell", "launch")
CHECKED_AGAINST = "Megatron-LM 000c4ac (megatron/training/arguments.py, 2025)"
"""the runtime version whose argument parser this output was read against (tests/data/megatron_arguments.txt)"""
POSITION_TYPES = {"rope": "rope", "learned": "learned_absolute", "none": "none"}
ORDER_FLAGS = {"tp-cp-ep-dp-pp": [], "tp-cp-ep-pp-dp": [("--use-tp-pp-dp-mapping", None)]}
MULTICAST_FAMILIES = ("hopper", "blackwell")
"""GPU families with CUDA multicast (compute capability 9.0 and up), which Transformer Engine's
userbuffers use by default; on the others its initialize_ub asserts unless UB_SKIPMC=1 sends them
over CUDA IPC handles (TE examples/pytorch/comm_gemm_overlap/README.md; userbuffers.cpp takes
multicast only where sm_arch >= 9 and UB_SKIPMC is unset)"""

Arg = tuple[str, object]
"""an argument and its value (None for a switch, a tuple for an argument of several values)"""


def export(plan: dict, v: PlanView, fmt: str = "lines") -> str:
    if fmt not in FORMATS:
        raise ExportError(f"Megatron-LM formats are {', '.join(FORMATS)}; not {fmt!r}")
    args = arguments(v)
    lines = [shlex.join([flag] + ([] if value is None else list(map(str, value)) if isinstance(value, tuple)
                                  else [str(value)])) for flag, value in args]
    if fmt == "launch":
        return launch_script(plan, v, lines)
    return ("\n".join(lines) if fmt == "lines" else " ".join(lines)) + "\n"


def launch_script(plan: dict, v: PlanView, lines: list[str]) -> str:
    """A bash script that launches the plan on every node with torchrun: the environment
    Megatron-LM requires (CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1 before Blackwell: its
    validate_args asserts it), one process per GPU, and what the user still supplies named in a
    comment, never defaulted."""
    per_node, nodes, families, placed = launch_nodes(plan, v)
    out = ["#!/usr/bin/env bash",
           f"# Megatron-LM launch of a planner plan: {v.model.name} on {v.gpus} GPUs ({nodes} node(s) of {per_node}).",
           f"# Checked against {CHECKED_AGAINST}.",
           "# Run it on every node with NODE_RANK (0.." + str(nodes - 1) + ") and MASTER_ADDR (node 0) set, and",
           "# MEGATRON the Megatron-LM checkout. You supply, after the script's arguments: data",
           "# (--data-path), tokenizer (--tokenizer-type, --tokenizer-model), steps (--train-iters), learning",
           "# rate and schedule, checkpoints (--save, --load)."]
    out += [f"# {line}" for line in placed]
    out.append("set -euo pipefail")
    if (v.tp > 1 or v.cp > 1) and families != {"blackwell"}:
        out.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # required by validate_args with tp or cp > 1 before Blackwell")
    elif v.ep_overlap:
        out.append("export CUDA_DEVICE_MAX_CONNECTIONS=32  # overlapped expert all-to-alls need more than one queue "
                   "(validate_args; Megatron-Bridge's recipes set 32)")
    if tp_comm_overlap(v) and set(v.families) - set(MULTICAST_FAMILIES):
        out.append("export UB_SKIPMC=1  # --tp-comm-overlap: userbuffers over CUDA IPC, as GPUs before Hopper have no "
                   "CUDA multicast (Transformer Engine's initialize_ub asserts otherwise)")
    out.append(f'torchrun --nproc-per-node {per_node} --nnodes {nodes} --node-rank "${{NODE_RANK:-0}}" '
               f'--master-addr "${{MASTER_ADDR:-localhost}}" --master-port "${{MASTER_PORT:-6000}}" \\')
    out.append('  "$MEGATRON/pretrain_gpt.py" \\')
    out.extend(f"  {line} \\" for line in lines)
    out.append('  "$@"')
    return "\n".join(out) + "\n"


def arguments(v: PlanView) -> list[Arg]:
    """Every argument, in a fixed order: model, parallelism, batch, recompute, optimizer, precision,
    loss."""
    check_common(v, RUNTIME)
    check_decoder(v, RUNTIME, "pretrain_gpt.py trains causal decoders only")
    return _model(v) + _parallel(v) + _batch(v) + _recompute(v) + _optimizer(v) + _precision(v) + _loss(v)


def _model(v: PlanView) -> list[Arg]:
    m = v.model
    require(m.ffn_act != "relu", RUNTIME, "has no plain ReLU MLP (gelu, swiglu, squared-relu, quick-geglu)",
            f"a ReLU MLP ({m.name})")
    require(m.position_embedding in POSITION_TYPES, RUNTIME, "has no ALiBi position bias",
            f"{m.position_embedding} positions ({m.name})")
    if m.position_embedding == "learned":
        require(m.max_position >= v.seq_len, RUNTIME, "needs the learned position table to cover the sequence",
                f"{m.max_position} positions for sequences of {v.seq_len}")
    args: list[Arg] = [("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--ffn-hidden-size", m.ffn_hidden),
                       ("--num-attention-heads", m.heads)]
    if m.mla is not None:
        args += [("--multi-latent-attention", None)]
        if m.mla.q_lora_rank:
            args += [("--q-lora-rank", m.mla.q_lora_rank)]
        args += [("--kv-lora-rank", m.mla.kv_lora_rank), ("--qk-head-dim", m.mla.qk_nope_head_dim),
                 ("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim), ("--v-head-dim", m.mla.v_head_dim)]
    else:
        if m.kv_heads < m.heads:
            args += [("--group-query-attention", None), ("--num-query-groups", m.kv_heads)]
        if m.head_dim * m.heads != m.hidden:
            args += [("--kv-channels", m.head_dim)]
    # Megatron requires max-position-embeddings >= seq-length for every position type; only a
    # learned table is sized by it
    max_position = m.max_position if m.position_embedding == "learned" else max(m.max_position, v.seq_len)
    args += [("--seq-length", v.seq_len), ("--max-position-embeddings", max_position),
             ("--position-embedding-type", POSITION_TYPES[m.position_embedding]),
             ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")]
    # the model's own rotary base and norm epsilon where its spec states them (Megatron's
    # defaults, 10000 and 1e-5, are not Llama 3's 500000)
    if m.position_embedding == "rope" and m.rope_theta:
        require(float(m.rope_theta).is_integer(), RUNTIME, "takes an integer --rotary-base",
                f"rope_theta {m.rope_theta}")
        args += [("--rotary-base", int(m.rope_theta))]
    if m.norm_eps:
        args += [("--norm-epsilon", m.norm_eps)]
    if m.ffn_act == "swiglu":
        args += [("--swiglu", None)]
    if not m.tied_embeddings:
        args += [("--untie-embeddings-and-output-weights", None)]
    if not m.linear_bias:
        args += [("--disable-bias-linear", None)]
    # Megatron's defaults are 0.1: always say what the model uses
    args += [("--hidden-dropout", m.dropout), ("--attention-dropout", m.dropout)]
    if v.attention == "eager":
        args += [("--attention-backend", "unfused")]
    if m.moe is not None:
        moe = m.moe
        args += [("--num-experts", moe.experts), ("--moe-router-topk", moe.top_k),
                 ("--moe-ffn-hidden-size", moe.expert_ffn_hidden)]
        if moe.shared_experts:
            args += [("--moe-shared-expert-intermediate-size", moe.shared_experts * moe.shared_ffn_hidden)]
        if moe.dense_layers:
            args += [("--moe-layer-freq", f"([0]*{moe.dense_layers}+[1]*{m.layers - moe.dense_layers})")]
        if moe.router_scoring != "softmax":
            args += [("--moe-router-score-function", moe.router_scoring)]
        if moe.groups:  # group-limited routing, which the dispatch traffic was priced with
            args += [("--moe-router-num-groups", moe.groups), ("--moe-router-group-topk", moe.group_topk)]
        # the dispatcher the plan was priced with: the plain all-to-all, or the flex dispatcher
        # with DeepEP, which sends a token once per node and rank (cost/comm.dispatch_time_s)
        if v.dispatcher == "dedup":
            args += [("--moe-token-dispatcher-type", "flex"), ("--moe-enable-deepep", None)]
        else:
            args += [("--moe-token-dispatcher-type", "alltoall")]
        if v.ep_overlap:  # combined 1F1B: one micro-batch's all-to-alls beside another's computation
            args += [("--overlap-moe-expert-parallel-comm", None)]
    return args


def _parallel(v: PlanView) -> list[Arg]:
    require(v.order in ORDER_FLAGS, RUNTIME, f"places ranks only as {' or '.join(ORDER_FLAGS)}",
            f"rank order {v.order}")
    require(v.cp == 1 or v.seq_len % (2 * v.cp) == 0, RUNTIME,
            "needs the sequence to be a multiple of 2*cp (load-balanced context parallelism)",
            f"sequences of {v.seq_len} over cp {v.cp}")
    args: list[Arg] = [("--tensor-model-parallel-size", v.tp), ("--pipeline-model-parallel-size", v.pp),
                       ("--context-parallel-size", v.cp)]
    if v.model.moe is not None:
        precisions = RUNTIME_RULES["megatron"].ep_precisions
        require(v.ep == 1 or v.precision in precisions, RUNTIME,
                f"runs expert parallelism in {', '.join(precisions)} only", f"ep {v.ep} with {v.precision}")
        args += [("--expert-model-parallel-size", v.ep)]
        if v.moe_folding and v.tp > 1:  # MoE parallel folding: the experts' own tensor parallelism
            args += [("--expert-tensor-parallel-size", 1)]
    if v.sequence_parallel:
        args += [("--sequence-parallel", None)]
    if tp_comm_overlap(v):
        args += [("--tp-comm-overlap", None)]
    args += _split(v)
    return args + ORDER_FLAGS[v.order]


def tp_comm_overlap(v: PlanView) -> bool:
    """Whether the launch turns on Transformer Engine's comm+GEMM overlap (--tp-comm-overlap):
    exactly where the cost model hid the tensor-parallel collectives behind the GEMMs on
    Megatron-LM (runtimes.tp_overlap: sequence parallelism, NVLink), for tp groups inside one
    node (the plan's placement), so the job runs what was priced."""
    return (v.tp > 1 and v.tp_tier == "intra_node" and bool(v.families)
            and all(tp_overlap("megatron", v.sequence_parallel, f, v.no_tp_overlap) for f in v.families))


def _split(v: PlanView) -> list[Arg]:
    """Interleaving (equal chunks in Megatron's looped layout, the first and the last one layer
    short where the embedding and the loss are counted as layers) or the first/last-stage split."""
    v.virtual_stages()  # the looped layout, or PlanFormatError
    if v.vpp > 1:
        sizes = v.chunk_sizes
        k = max(sizes)
        embedding, loss = sizes[0] == k - 1, sizes[-1] == k - 1
        require(set(sizes[1:-1]) <= {k} and min(sizes[0], sizes[-1]) >= k - 1, RUNTIME,
                "interleaves only equal virtual chunks (the first and the last may be one layer short, with "
                "--account-for-embedding/loss-in-pipeline-split)",
                "virtual stages of " + "/".join(map(str, sizes)) + " layers")
        return ([("--num-layers-per-virtual-pipeline-stage", k)]
                + ([("--account-for-embedding-in-pipeline-split", None)] if embedding else [])
                + ([("--account-for-loss-in-pipeline-split", None)] if loss else []))
    counts = [st.layers for st in v.stages]
    if len(set(v.stage_pools)) > 1:
        return [("--pipeline-model-parallel-layout", pipeline_layout(counts))]
    middle = counts[1:-1] or counts[-1:]
    require(len(set(middle)) == 1, RUNTIME, "splits unevenly only on the first and last stage",
            "stages of " + "/".join(map(str, counts)) + " layers")
    args: list[Arg] = []
    if counts[0] != middle[0]:
        args += [("--decoder-first-pipeline-num-layers", counts[0])]
    if len(counts) > 2 and counts[-1] != middle[0]:
        args += [("--decoder-last-pipeline-num-layers", counts[-1])]
    return args


def pipeline_layout(counts: list[int]) -> str:
    """--pipeline-model-parallel-layout of stages holding `counts` decoder layers: the embedding
    on the first, the loss on the last, stages split by '|', 't*n' for n decoder layers
    (megatron-core PipelineParallelLayerLayout.parse_str_to_list). No MTP layer: the export sets
    none (--mtp-num-layers), as the cost model prices none (DESIGN.md's MFU convention)."""
    stages = [("t" if n == 1 else f"t*{n}") if n else "" for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def _batch(v: PlanView) -> list[Arg]:
    return [("--micro-batch-size", v.micro_batch), ("--global-batch-size", v.global_batch)]


def _block_recompute(n: int, sizes: tuple[int, ...]) -> list[int]:
    """Layers recomputed per chunk by --recompute-method block --recompute-num-layers n."""
    return [min(n, size) for size in sizes]


def _planned_recompute(r: int, sizes: tuple[int, ...]) -> list[int]:
    """Layers recomputed per chunk by the plan: r on the stage, first chunk first (cost/step.py)."""
    out = []
    for size in sizes:
        out.append(min(r, size))
        r -= out[-1]
    return out


def _recompute(v: PlanView) -> list[Arg]:
    """The recompute flags (Megatron-LM 000c4ac arguments.py: --recompute-granularity, and
    --recompute-modules, space-separated, where the plan names what selective recomputes)."""
    if v.recompute == "selective":
        return [("--recompute-granularity", "selective")] + (
            [("--recompute-modules", v.recompute_modules)] if v.recompute_modules else [])
    if v.recompute != "full" or not any(v.recompute_counts):
        return []
    largest = max(max(st.sizes) for st in v.stages)
    for n in range(1, largest + 1):
        if all(_block_recompute(n, st.sizes) == _planned_recompute(st.recompute_layers, st.sizes)
               for st in v.stages):
            return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                    ("--recompute-num-layers", n)]
    per_chunk = " per virtual chunk" if v.vpp > 1 else ""
    raise refusal(RUNTIME, f"recomputes the same --recompute-num-layers{per_chunk} on every stage",
                  "full recompute of " + ", ".join(f"{st.recompute_layers} of {st.layers}" for st in v.stages)
                  + " layers per stage")


def _optimizer(v: PlanView) -> list[Arg]:
    require(v.zero <= 1, RUNTIME, "has no ZeRO-2/3 (its distributed optimizer shards optimizer states only)",
            f"zero {v.zero}")
    args: list[Arg] = [("--use-distributed-optimizer", None)] if v.zero == 1 else []
    if v.dp_shard:  # hybrid sharding: dp / dp_shard optimizer instances, each over dp_shard x cp ranks
        args += [("--num-distributed-optimizer-instances", v.dp // v.dp_shard)]
    if v.dp_overlap:
        args += [("--overlap-grad-reduce", None)]
        if v.zero == 1:
            args += [("--overlap-param-gather", None)]
    return args


def _precision(v: PlanView) -> list[Arg]:
    """The precision flags, the gradient reduction's dtype, Adam's moments and the fp8 weights'
    gather (Megatron-LM 000c4ac arguments.py: --fp8-recipe tensorwise, delayed, mxfp8 or blockwise;
    --grad-reduce-in-bf16; --use-precision-aware-optimizer with --exp-avg-dtype and
    --exp-avg-sq-dtype, and --fp8-param-gather, both of which need the distributed optimizer: a
    ZeRO-0 plan was priced with fp32 states and gathers no weights, so it goes without)."""
    if v.precision == "fp16":
        return [("--fp16", None)]
    args = [("--bf16", None)]
    if v.grad_reduce == "bf16":
        args.append(("--grad-reduce-in-bf16", None))
    if v.optimizer_states == "bf16" and v.zero >= 1:
        args += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", "bf16"),
                 ("--exp-avg-sq-dtype", "bf16")]
    if v.precision == "fp8":
        args += [("--fp8-format", "hybrid"), ("--fp8-recipe", v.fp8_recipe)]
        if v.fp8_param_gather and v.zero >= 1:
            args.append(("--fp8-param-gather", None))
    return args


def _loss(v: PlanView) -> list[Arg]:
    """The fused cross-entropy loss the plan was priced with (Megatron-LM 000c4ac arguments.py:
    --cross-entropy-loss-fusion, --cross-entropy-fusion-impl native or te); none: the unfused one."""
    if not v.loss_fusion:
        return []
    return [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", v.loss_fusion)]
