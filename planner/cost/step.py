"""Strategy -> StepEstimate: step time with its breakdown and memory per GPU with its breakdown.

Per micro-batch and pipeline stage, each layer costs forward compute (GEMMs, attention core,
memory-bound ops), backward compute (2x the GEMMs: input and weight gradients; the attention core
2x eager or 2.5x flash, whose backward recomputes the scores; 2x the memory-bound traffic),
recompute (the forward again for full recompute; for selective its modules, the attention core
unless others are named: TrainingSetup.recompute_modules), and the
collectives it issues (tensor parallel, the context-parallel exchange of K and V: a ring or an
all-gather, cp_exposed_s; expert all-to-all); a stage adds the
pass some runtimes make over its parameters to accumulate the gradients outside the GEMMs
(RuntimeRules.grad_accum_bytes), memory-bound, on every micro-batch. Stages combine
through the pipeline formula (cost/pipeline.py); each stage then finishes with the part of its
data-parallel gradient reduction that backward cannot hide and its optimizer step, and the step
ends with the slowest of those tails.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from planner.cost import comm, compute, memory, pipeline
from planner.graph import (
    ACT_BYTES,
    LEGACY_LOGIT_RW_BYTES,
    LOGIT_RW_BYTES,
    LOGIT_SAVED_BYTES,
    LOSSES,
    Ctx,
    Layer,
    build_layers,
    embedding_work,
    head_work,
    layer_work,
)
from planner.placement import GROUPS, Span, expert_degrees, group_spans, hybrid_spans, tiers
from planner.runtimes import RUNTIME_RULES, attention_kernel, tp_overlap
from planner.spec.efficiency import LegacyEfficiency
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup, check_strategy

ELEMENTWISE_BWD_FACTOR = 1.0
"""backward HBM traffic of memory-bound ops relative to forward: each reads the incoming gradient
and what it saved and writes one gradient, about what its forward moved (dropout, bias-add,
residual, GeLU); Korthikanti 2022 Table 4 shows sequence parallelism saving 0.5 ms forward but
only 0.1 ms backward, so backward elementwise time is no larger than forward"""
EP_OVERLAP_SM_SHARE = 20 / 132
"""share of the GPU's SMs the expert all-to-all kernels hold while they run beside computation
(layer_cost, ep_overlap): megatron-core 0.16.0's moe_deepep_num_sms default (20; HybridEP's
moe_hybridep_num_sms is 16) of an H100's 132 SMs; physically between 16/148 (HybridEP on B200)
and 20/108 (DeepEP on A100), 0.11-0.19"""


def dp_grad_bytes(precision: str, grad_reduce: str) -> int:
    """Bytes per gradient element, in the gradient buffers a run keeps and in its data-parallel
    reduction alike: memory.GRAD_BYTES where Megatron forces fp32 gradient accumulation and
    reduction with bf16 (accumulate_allreduce_grads_in_fp32; FSDP2's fp32 reduce_dtype) unless
    the setup reduces in bf16 (TrainingSetup.grad_reduce: Megatron-Core's DistributedDataParallel
    then allocates its buffers in bf16); 2 with fp16, whose gradients Megatron keeps and reduces
    in fp16 by default, as FSDP reduces in the parameter dtype."""
    return 2 if precision == "fp16" or grad_reduce == "bf16" else memory.GRAD_BYTES


def optimizer_state_bytes(setup: TrainingSetup) -> float:
    """Bytes per parameter a sharded optimizer keeps for the setup (memory.optimizer_bytes of its
    optimizer_states and precision)."""
    return memory.optimizer_bytes(setup.optimizer_states, setup.precision)


def gather_bytes(setup: TrainingSetup) -> int:
    """Bytes per parameter of the transformer layers that ZeRO's weight all-gathers move: 16-bit
    weights, or 1 with an fp8 parameter gather (TrainingSetup.fp8_param_gather; the embedding
    and LM head stay 16-bit: gathered_bytes)."""
    return 1 if setup.fp8_param_gather else memory.WEIGHT_BYTES


def gathered_bytes(per_param: int, dense, layer_params, expert) -> tuple:
    """(dense, expert) bytes a stage's ZeRO weight all-gather moves: its layers' `layer_params`
    and its experts at `per_param` (gather_bytes), the rest of its `dense` parameters (embedding,
    LM head) at memory.WEIGHT_BYTES. Elementwise over arrays."""
    return per_param * layer_params + memory.WEIGHT_BYTES * (dense - layer_params), per_param * expert

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "tp_comm", "cp_comm", "ep_comm", "pp_comm",
                  "dp_comm_exposed", "optimizer")


@dataclass(frozen=True, slots=True)
class StageEstimate:
    index: int
    chunks: tuple[tuple[int, int], ...]
    recompute_layers: int
    time_per_microbatch_s: float
    memory: memory.MemoryBreakdown

    @property
    def layers(self) -> int:
        return sum(e - s for s, e in self.chunks)


@dataclass(frozen=True, slots=True)
class StepEstimate:
    step_time_s: float
    breakdown_s: dict = field(hash=False)
    memory: memory.MemoryBreakdown
    """the stage with the highest peak"""
    stages: tuple[StageEstimate, ...]
    model_flops_per_step: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    """FLOPs the GPUs execute (causal flash at half the scores, recomputation included) over the
    dense peak: at most 1 for any efficiency block (executed_flops_per_step)"""
    fits: bool
    capacity_bytes: float
    tiers: dict = field(hash=False)

    @property
    def peak_memory_bytes(self) -> float:
        return self.memory.total


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Times (s) of one layer for one micro-batch on one GPU, and what it holds in memory.
    `tp` is the exposed tensor-parallel time of forward and backward together."""

    fwd: float
    bwd: float
    recompute: float
    tp: float
    cp: float
    ep: float
    saved: float
    saved_main: float
    saved_none: float
    params: float
    expert_params: float
    gemm_weights: float


def attention_core_s(layer: Layer, ctx: Ctx, w, cluster: Cluster, precision: str, kernel: str | None) -> tuple:
    """(forward, backward) time of a layer's attention core: a flash kernel at its measured
    throughput for the sequence one call sees (s / cp: each ring step attends one chunk to
    another; priced with the masked table, though only the diagonal steps are masked, because
    load-balanced causal rings split each chunk in two and call the kernel on those halves),
    else the core as a GEMM (backward 2.5x flash's forward, Dao 2023 §3.1; 2x eager's) in bf16
    under fp8 recipes (compute.HIGH_PRECISION)."""
    if not w.attn_flops:
        return 0.0, 0.0
    eff, gpu = cluster.efficiency, cluster.gpu
    if ctx.flash and kernel:
        timed = compute.attention_time_s(w.attn_flops, kernel, layer.causal, layer.d_qk, ctx.seq_len / ctx.cp,
                                         gpu, eff)
        if timed:
            return timed
    attn = compute.gemm_time_s(w.attn_flops, w.attn_intensity, gpu, compute.outside_fp8(precision, eff), eff)
    return attn, compute.attention_bwd_factor(ctx.flash) * attn


@lru_cache(maxsize=65536)
def layer_cost(layer: Layer, ctx: Ctx, cluster: Cluster, precision: str, tp_span: Span, cp_span: Span,
               ep_span: Span, kernel: str | None = None, tp_overlap: bool = False,
               ep_dedup: bool = False, ep_overlap: bool = False,
               quant: tuple[float, float] | None = None) -> LayerCost:
    """Forward, backward and recompute time of one layer (formulas in the module docstring);
    `kernel`: the flash attention kernel the runtime runs (runtimes.attention_kernel);
    `tp_overlap`: whether it hides tensor-parallel collectives behind the GEMMs; `ep_dedup`:
    whether its MoE dispatcher sends a token once per node and rank (comm.dispatch_time_s)
    rather than once per expert (runtimes.py).

    `ep_overlap` (Megatron-Core's combined 1F1B: the forward of one micro-batch runs beside the
    backward of another, layer by layer, each one's all-to-alls beside the other's computation):
    of a layer's expert all-to-alls A (forward and backward) and its computation C (forward and
    backward), what shows is
        ep = max(0, A - C) + min(A, C) * f / (1 - f),   f = EP_OVERLAP_SM_SHARE,
    the all-to-all time no computation covers, plus the slowdown of the computation that ran on
    the SMs the communication kernels left. Priced as if every pass had a partner: a pipeline's
    warm-up and cool-down passes have none, so this is optimistic by at most their share.

    What the runtime runs as eager PyTorch ops (graph._eager_traffic: its norms, rotary
    embeddings, SwiGLU, K and V expansion, from its record) moves Work.eager_bytes in place of the
    fused kernels' Work.eager_fused_bytes (ELEMENTWISE_BWD_FACTOR times that backward): the
    difference is priced as memory-bound time.

    `quant` (fp8 runs: compute.fp8_quant_bytes of the setup's recipe): the bytes per element its
    quantisation kernels move, priced as memory-bound time (compute.quant_time_s) beside the
    GEMMs they feed.

    Experts that keep tp under a dispatcher that gathers for them (graph.Work
    .tp_expert_message_bytes) add one all-reduce-priced pair a pass to the tp time, never
    overlapped: it runs in the dispatcher, outside the linears userbuffers overlap."""
    eff, gpu = cluster.efficiency, cluster.gpu
    w = layer_work(layer, ctx)
    gemm = sum(compute.gemm_time_s(f, i, gpu, precision, eff) for f, i in w.gemms)
    gemms_fwd = [compute.gemm_time_s(f, i, gpu, precision, eff, forward=True) for f, i in w.gemms]
    gemm_fwd = sum(gemms_fwd)
    attn, attn_bwd = attention_core_s(layer, ctx, w, cluster, precision, kernel)
    mem = compute.memory_time_s(w.elementwise_bytes, gpu, eff)
    core_mem = compute.memory_time_s(w.core_elementwise_bytes, gpu, eff)
    eager_fwd, eager_bwd = (compute.memory_time_s(b - f * w.eager_fused_bytes, gpu, eff)
                            for b, f in zip(w.eager_bytes, (1.0, ELEMENTWISE_BWD_FACTOR)))
    quant_fwd, quant_bwd = compute.quant_time_s(w.quant_elements, quant, gpu, eff)
    fwd = gemm_fwd + attn + mem + core_mem + eager_fwd + quant_fwd
    bwd = 2 * gemm + attn_bwd + ELEMENTWISE_BWD_FACTOR * (mem + core_mem) + eager_bwd + quant_bwd
    tp_one = w.tp_collectives * comm.collective_time_s("all_reduce", w.tp_message_bytes, tp_span, cluster)
    if isinstance(eff, LegacyEfficiency):
        tp_one -= min(eff.tp_overlap_fraction * tp_one, gemm_fwd)
    elif tp_overlap and tp_span.nodes == 1:
        # Userbuffers (Transformer Engine's comm+GEMM overlap) needs CUDA multicast handles,
        # which exist only inside one node: a tp group across nodes overlaps nothing
        # (NVIDIA/TransformerEngine issue #1071)
        tp_one = max(0.0, tp_one - gemm_fwd)
    # the experts' own gather and reduce-scatter (Work.tp_expert_message_bytes) run in the token
    # dispatcher, outside the linears whose GEMMs userbuffers overlap: exposed
    tp_one += comm.collective_time_s("all_reduce", w.tp_expert_message_bytes, tp_span, cluster)
    cp_fwd, cp_bwd = cp_exposed_s(ctx.cp_rotation, ctx.cp, w.cp_message_bytes, attn, attn_bwd, cp_span, cluster)
    cp = cp_fwd + cp_bwd
    if ep_dedup and layer.experts:
        ep_one = w.ep_collectives * float(comm.dispatch_time_s(w.ep_message_bytes / layer.top_k, layer.top_k,
                                                                layer.experts, ep_span, cluster, layer.expert_groups,
                                                                layer.group_topk))
    else:
        ep_one = w.ep_collectives * comm.collective_time_s("all_to_all", w.ep_message_bytes, ep_span, cluster)
    if ctx.recompute == "op":
        # the matmuls the policy does not save, every memory-bound op, and the tp collectives
        # whose outputs it does not keep: the all-gathers under sequence parallelism (half a pair's
        # all-reduce time), the all-reduces without
        recompute = (sum(share * t for share, t in zip(w.op_recomputed, gemms_fwd)) + mem + core_mem + eager_fwd
                     + quant_fwd + (tp_one / 2 if ctx.sp else tp_one))
    elif ctx.recompute == "selective":
        # the attention core where it is among the modules (Korthikanti et al. 2022), and what the
        # other modules run again (graph._selective_work), their fp8 inputs quantised again
        recompute = (attn + core_mem + cp_fwd if "core_attn" in ctx.modules else 0.0) + (
            sum(share * t for share, t in zip(w.selective_recomputed, gemms_fwd))
            + compute.memory_time_s(w.selective_bytes, gpu, eff)
            + (w.selective_tp * tp_one / w.tp_collectives if w.selective_tp else 0.0)
            + compute.quant_time_s((*w.selective_quant, 0.0), quant, gpu, eff)[0])
    else:
        recompute = {"none": 0.0, "full": fwd + tp_one + ep_one + cp_fwd}[ctx.recompute]
    ep = 2 * ep_one
    if ep_overlap:
        covered = min(ep, fwd + bwd)
        ep = ep - covered + covered * EP_OVERLAP_SM_SHARE / (1.0 - EP_OVERLAP_SM_SHARE)
    none = layer_work(layer, _variant(ctx, "none", ctx.ep))
    return LayerCost(fwd=fwd, bwd=bwd, recompute=recompute, tp=2 * tp_one, cp=cp, ep=ep,
                     saved=w.saved.total, saved_main=w.saved.main, saved_none=none.saved.total,
                     params=w.params_local, expert_params=w.expert_params_local,
                     gemm_weights=w.gemm_weight_params)


def cp_exposed_s(rotation: str, cp: int, block_bytes: float, attn_fwd_s: float, attn_bwd_s: float,
                 span: Span, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) seconds a layer's context-parallel exchange shows beyond its attention
    core (attn_fwd_s, attn_bwd_s), per micro-batch, for the K and V block of `block_bytes`
    (graph.Work.cp_message_bytes) over the cp group (runtimes.RuntimeRules.cp_rotation); a layer
    that recomputes its attention (full, or Megatron's selective) shows the forward's again. p is
    one send of the block to the next rank, q one of its fp32 gradients, twice the bytes
    (comm.p2p_time_s).
    ring: cp - 1 sends forward behind the whole core, twice as many backward (the blocks and their
      gradients): max(0, (cp-1) p - A_f), max(0, 2 (cp-1) p - A_b).
    allgather: one all-gather of the cp blocks G (comm.collective_time_s), forward behind the local
      block's share of the core and again backward; backward the K and V gradients, in fp32, go
      round the ring cp times, each behind the next block's backward but the last, the causal load
      balance giving every block 1/cp of the core: max(0, G - A_f/cp),
      max(0, G - A_b/cp) + (cp-1) max(0, q - A_b/cp) + q (torch _attention.py
      _templated_ring_attention and its backward)."""
    if cp <= 1:
        return 0.0, 0.0
    inter_node = span.nodes > 1
    if rotation == "ring":
        send = comm.p2p_time_s(block_bytes, inter_node, cluster)
        return max(0.0, (cp - 1) * send - attn_fwd_s), max(0.0, 2 * (cp - 1) * send - attn_bwd_s)
    if rotation != "allgather":
        raise ValueError(f"unknown context-parallel rotation {rotation!r} (runtimes.CP_ROTATIONS)")
    gather = comm.collective_time_s("all_gather", cp * block_bytes, span, cluster)
    grad_send = comm.p2p_time_s(2 * block_bytes, inter_node, cluster)
    block_bwd = attn_bwd_s / cp
    return (max(0.0, gather - attn_fwd_s / cp),
            max(0.0, gather - block_bwd) + (cp - 1) * max(0.0, grad_send - block_bwd) + grad_send)


@lru_cache(maxsize=65536)
def _variant(ctx: Ctx, recompute: str, ep: int) -> Ctx:
    """ctx with another recompute mode and ep (cached: dataclasses.replace is slow, and the
    cost model asks for the same few variants of every context)."""
    return replace(ctx, recompute=recompute, ep=ep)


def _kind_ctx(base: Ctx, layer: Layer, recompute: str) -> Ctx:
    """The context a layer of this kind runs in: `recompute`, and the base's ep only for a layer
    with experts (one without does not depend on ep, so one cache entry serves every ep)."""
    return _variant(base, recompute, base.ep if layer.experts else 1)


@lru_cache(maxsize=8)
def _layers(model: ModelSpec):
    return build_layers(model)


@lru_cache(maxsize=8)
def _kinds(model: ModelSpec) -> tuple[tuple[Layer, ...], np.ndarray]:
    """The distinct layer objects of the chain and, per layer, the index of its kind."""
    kinds: dict = {}
    index = np.array([kinds.setdefault(id(layer), (len(kinds), layer))[0] for layer in _layers(model)], dtype=int)
    return tuple(layer for _, layer in sorted(kinds.values(), key=lambda kv: kv[0])), index


def layer_kind_index(model: ModelSpec) -> np.ndarray:
    """Per layer of the chain, the index of its kind (the order of LayerTables.kinds' rows)."""
    return _kinds(model)[1]


@dataclass(frozen=True, slots=True)
class Profile:
    """A strategy's per-layer prices as prefix sums over the layer chain, plus the scalars of the
    embedding, the LM head and the pipeline, so that any stage [a, b) is priced in O(1) and many
    ranges at once with numpy (the stage-split DP uses exactly this)."""

    model: ModelSpec
    cluster: Cluster
    setup: TrainingSetup
    strategy: Strategy
    microbatches: int
    grad_bytes: int
    """bytes per gradient element of the data-parallel reduction (dp_grad_bytes)"""
    gather_bytes: int
    """bytes per layer parameter of ZeRO's weight all-gathers (gather_bytes)"""
    prefix: dict = field(hash=False)
    """name -> array of length layers+1; '_b' = base recompute mode, '_f' = full recompute"""
    ends: dict = field(hash=False)
    p2p_s: float
    """pipeline send/receive time a stage shows per micro-batch (exposed_p2p_s)"""
    p2p_fill_s: float
    """what the pipeline's fill and drain show of it once a step (p2p_fill_s)"""
    transient_bytes: float
    """extra bytes while a fully recomputed layer is rebuilt (the model's largest such layer)"""
    prefetch_bytes: float
    spans: dict = field(hash=False)
    zero: int
    """the ZeRO stage whose traffic and memory the strategy's has on its runtime
    (runtimes.RuntimeRules.priced_zero)"""
    accum_bytes: float
    """bytes per local parameter each micro-batch's backward moves to accumulate gradients
    outside the GEMMs (runtimes.RuntimeRules.grad_accum_bytes_of at the priced ZeRO stage)"""


_PREFIX_KEYS = ("comp", "fwd", "bwd", "tp", "cp", "ep", "params", "expert", "gemm_w")
LAYER_ROWS = (*_PREFIX_KEYS, "rec_b", "rec_f", "saved_b", "saved_f", "main_b", "main_f")
"""a layer context's rows per layer kind ('_b': its base recompute mode, '_f': full recompute)"""


def profile(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, s: Strategy) -> Profile:
    g = min(cluster.gpus_per_node, setup.gpus)
    spans = dict(zip(GROUPS, group_spans(s.order, s.tp, s.cp, s.dp, s.pp, s.ep, g, setup.expert_tp(s.tp, model))))
    if s.dp_shard:  # ZeRO's collectives run over the shard groups, the gradients' all-reduce across replicas
        spans["dpcp"], spans["replica"] = hybrid_spans(s.order, s.tp, s.cp, s.dp, s.pp, s.dp_shard, g)
    tables = context_tables(model, cluster, setup, s.tp, s.cp, s.ep, s.micro_batch, s.sequence_parallel,
                            s.recompute, spans)
    ends = tables.ends
    chunk = p2p_s(model, cluster, setup, s.tp, s.cp, s.micro_batch, spans["pp"].nodes > 1) if s.pp > 1 else 0.0
    # a version 1 efficiency block prices as it always did: every send shown
    overlaps = RUNTIME_RULES[setup.runtime].pp_overlap and not isinstance(cluster.efficiency, LegacyEfficiency)
    hide = float(np.diff(tables.prefix["fwd"]).min()) if s.pp > 1 else 0.0  # a chunk holds a layer at least
    zero = RUNTIME_RULES[setup.runtime].priced_zero(s.zero, s.pp)
    return Profile(model=model, cluster=cluster, setup=setup, strategy=s,
                   microbatches=s.num_microbatches(setup.global_batch), grad_bytes=dp_grad_bytes(setup.precision, setup.grad_reduce),
                   gather_bytes=gather_bytes(setup), prefix=tables.prefix, ends=ends,
                   p2p_s=float(exposed_p2p_s(chunk, s.vpp, overlaps, hide)),
                   p2p_fill_s=float(p2p_fill_s(chunk, s.pp, s.vpp, overlaps)), transient_bytes=tables.transient_bytes,
                   prefetch_bytes=tables.prefetch_bytes, spans=spans, zero=zero,
                   accum_bytes=RUNTIME_RULES[setup.runtime].grad_accum_bytes_of(setup.precision, zero))


def state_shards(dp: int, cp: int, ep: int, fold: int = 1, shard: int = 0) -> tuple[int, int]:
    """The ranks ZeRO shards a stage's states over: dp*cp for dense parameters (shard*cp under
    hybrid sharding, Strategy.dp_shard), the expert data-parallel group dp*cp*fold/ep for experts
    (fold: tp over the experts' tp, tp when folded, else 1)."""
    return (shard or dp) * cp, max(1, dp * cp * fold // ep)


def replica_share(s: Strategy) -> float:
    """Under hybrid sharding, the share of a stage's dense gradients each rank all-reduces across
    the replicas after reducing them over its shard group: 1 / (dp_shard * cp); 0 without."""
    return 1.0 / (s.dp_shard * s.cp) if s.dp_shard else 0.0


def expert_fold(model: ModelSpec, setup: TrainingSetup, tp: int) -> int:
    """tp over the experts' tensor parallelism: tp when the experts are folded, else 1."""
    return tp // setup.expert_tp(tp, model)


def pricing_key(prof: Profile) -> tuple:
    """Everything the split and recompute pricing of a profile reads (stage_terms, split_terms,
    split_step and the search's DP and ILP), for one model, cluster and setup: two profiles with
    equal keys have equal prices for every split and recompute count. Distinct strategies share
    a key when their layer prices come out equal, e.g. cp and micro-batch scaled together with
    dp*cp fixed (tests/test_search.py shows such ties)."""
    s = prof.strategy
    return (s.pp, s.vpp, s.tp, prof.zero, prof.accum_bytes, s.dp_overlap, prof.spans.get("replica"),
            *state_shards(s.dp, s.cp, s.ep, expert_fold(prof.model, prof.setup, s.tp), s.dp_shard),
            s.recompute,
            s.recompute_layers, prof.microbatches, prof.grad_bytes, prof.gather_bytes, prof.p2p_s, prof.p2p_fill_s,
            prof.transient_bytes,
            prof.prefetch_bytes, prof.spans["dpcp"], prof.spans["edp"], tuple(sorted(prof.ends.items())),
            tuple(prof.prefix[k].tobytes() for k in sorted(prof.prefix)))


def tied_head_params(model: ModelSpec, tp: int) -> float:
    """Parameters the LM head does not hold on its own when one stage holds the whole model and
    the embedding table serves as the head (tied embeddings)."""
    return model.vocab * model.hidden / tp if model.tied_embeddings and not model.is_graph else 0.0


def p2p_s(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, tp: int, cp: int, micro_batch: int,
          inter_node: bool):
    """Pipeline send/receive time of one virtual chunk per micro-batch: the boundary activation
    forward and its gradient backward (a stage shows exposed_p2p_s of it). Megatron's
    scatter/gather optimisation (Narayanan et al. 2021 §4.1): each tp rank sends 1/tp of the
    activation and the receivers all-gather it over NVLink. tp, cp and micro_batch may be arrays."""
    return 2 * comm.p2p_time_s(p2p_message_bytes(model, setup, tp, cp, micro_batch), inter_node, cluster)


def exposed_p2p_s(chunk_s, vpp, overlaps: bool, hide_s=np.inf):
    """Pipeline send/receive time a stage shows per micro-batch, of `chunk_s` per virtual chunk
    (p2p_s: one send each way): all vpp chunks' unless its runtime overlaps the interleaved
    schedule's sends and receives with computation (RuntimeRules.pp_overlap, vpp > 1). Then each
    send hides behind a chunk's computation, at least `hide_s` (its one layer's forward, the
    shortest of the model's), and shows what that leaves: vpp * max(0, chunk_s - 2 * hide_s),
    none where a layer's forward (24 h^2 / tp FLOPs a token) outlasts its send (2 h / tp bytes a
    token), on H100 over InfiniBand (~600 TFLOP/s, 47 GB/s) for hidden sizes above about 1,000.
    hide_s inf (the search's bounds, which read the same rule): none shows. vpp may be an array."""
    overlapped = np.logical_and(overlaps, np.greater(vpp, 1))
    return vpp * np.where(overlapped, np.maximum(0.0, chunk_s - 2 * hide_s), chunk_s)


def p2p_fill_s(chunk_s, pp, vpp, overlaps: bool):
    """What an overlapped interleaved pipeline (exposed_p2p_s) still shows of its sends, once a
    step: the first micro-batch's activations cross the pp*vpp - 1 chunk boundaries one after
    another in the fill and its gradients as many in the drain, each send on the critical path:
    (pp*vpp - 1) * chunk_s (chunk_s holds one send each way). 0 where nothing is overlapped."""
    return np.where(np.logical_and(overlaps, np.greater(vpp, 1)) & np.greater(pp, 1), (pp * vpp - 1) * chunk_s, 0.0)


def p2p_message_bytes(model: ModelSpec, setup: TrainingSetup, tp, cp, micro_batch):
    """Bytes one tp rank sends across a stage boundary per micro-batch (p2p_s): its 1/tp of the
    boundary activation (boundary_bytes)."""
    return boundary_bytes(model, setup.seq_len, cp, micro_batch, tp)


def cp_gathered_bytes(layers, ctx: Ctx) -> float:
    """Bytes the all-gather rotater (runtimes.RuntimeRules.cp_rotation 'allgather') holds while a
    layer's attention runs, forward or backward: the cp ranks' K and V blocks (graph.Work
    .cp_message_bytes) gathered, of the largest such layer; 0 under the ring or without context
    parallelism."""
    if ctx.cp <= 1 or ctx.cp_rotation != "allgather":
        return 0.0
    return ctx.cp * max((layer_work(k, _kind_ctx(ctx, k, "none")).cp_message_bytes for k in layers), default=0.0)


def boundary_bytes(model: ModelSpec, seq_len, cp, micro_batch, shards=1) -> float:
    """Bytes of the activation at a stage boundary per micro-batch, over `shards` ranks: the
    16-bit hidden states of micro_batch x seq_len / cp tokens (a layer graph's largest explicit
    output)."""
    if model.is_graph:
        return max(l.explicit[3] for l in _layers(model)) * micro_batch
    return seq_len / cp * micro_batch * model.hidden * ACT_BYTES / shards


@dataclass(frozen=True, slots=True)
class LayerTables:
    """One layer context's prices: prefix sums over the chain (Profile.prefix), the embedding and
    head terms, and the same rows per distinct layer kind, unsummed (`kinds`)."""

    prefix: dict = field(hash=False)
    ends: dict = field(hash=False)
    kinds: dict = field(hash=False)
    transient_bytes: float
    prefetch_bytes: float


def layer_ctx(model: ModelSpec, setup: TrainingSetup, tp: int, cp: int, ep: int, micro_batch: int,
              sequence_parallel: bool) -> Ctx:
    """The shape one micro-batch takes on one GPU under these degrees (no recomputation)."""
    rules = RUNTIME_RULES[setup.runtime]
    return Ctx(micro_batch=micro_batch, seq_len=setup.seq_len, tp=tp, cp=cp, ep=ep, sp=sequence_parallel,
               modules=setup.selective_modules,
               sp_saves_gathered=sequence_parallel and tp > 1 and rules.sp_saves_gathered,
               flash=setup.attention == "flash", dropout=model.dropout, folded=setup.expert_tp(tp, model) < tp,
               quantised_inputs=setup.precision == "fp8" and rules.fp8_saves_quantised,
               eager_swiglu=rules.eager_swiglu, eager_norm_bytes=rules.eager_norm_bytes,
               eager_rope_bytes=rules.eager_rope_bytes,
               expanded_kv=rules.expanded_kv, cp_expanded_kv=rules.cp_expanded_kv, cp_rotation=rules.cp_rotation,
               moe_imbalance=setup.moe_imbalance if model.moe is not None else 1.0,
               expert_tp_gather=rules.expert_tp_gather)


def base_mode(recompute: str) -> str:
    """The recompute mode of a layer context's base rows: 'full' prices its counts from the
    full-recompute rows beside the rows of no recomputation, so its base is 'none'."""
    return "none" if recompute == "full" else recompute


def priced_mode(setup: TrainingSetup, recompute: str) -> str:
    """The layer recompute mode (graph.Ctx.recompute) a strategy's `recompute` is priced in on the
    setup's runtime: 'selective' is what that runtime's selective recomputation recomputes
    (runtimes.RuntimeRules.selective_mode: Megatron's attention core, torchtitan's per-op
    policy); the others as they are."""
    return RUNTIME_RULES[setup.runtime].selective_mode if recompute == "selective" else recompute


def context_tables(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, tp: int, cp: int, ep: int,
                   micro_batch: int, sequence_parallel: bool, recompute: str, spans: dict) -> LayerTables:
    """The layer tables of a layer context: what every strategy with these tp, cp, ep,
    micro-batch, sequence parallelism, recompute mode and tp/cp/ep group spans shares."""
    return _layer_tables(model, cluster, setup.precision, layer_ctx(model, setup, tp, cp, ep, micro_batch,
                                                                    sequence_parallel),
                         priced_mode(setup, base_mode(recompute)), spans["tp"], spans["cp"], spans["ep"],
                         kernel_of(cluster, setup),
                         tp_overlap(setup.runtime, sequence_parallel, cluster.gpu.family, setup.no_tp_overlap),
                         setup.dispatcher == "dedup", setup.ep_overlap,
                         *loss_bytes(setup, tp, isinstance(cluster.efficiency, LegacyEfficiency)),
                         quant_bytes(cluster, setup), RUNTIME_RULES[setup.runtime].pp_keeps_outputs,
                         RUNTIME_RULES[setup.runtime].pp_buffers_per_microbatch)


def loss_bytes(setup: TrainingSetup, tp: int, legacy: bool = False) -> tuple[float, float]:
    """(bytes per logit the loss holds at its peak, its HBM traffic per logit forward and
    backward): a fused loss's (TrainingSetup.loss_fusion: graph.LOSSES), else the runtime's own
    (runtimes.RuntimeRules.loss_bytes and loss_traffic_per_logit; Megatron-Core's unfused loss,
    graph.LOGIT_RW_BYTES, where the record gives none). `legacy` (a version 1 efficiency block):
    the traffic every loss had then (graph.LEGACY_LOGIT_RW_BYTES)."""
    if setup.loss_fusion:
        kernel = LOSSES[setup.loss_fusion]
        return kernel.peak_bytes, kernel.traffic_bytes
    rules = RUNTIME_RULES[setup.runtime]
    if legacy:
        return rules.loss_bytes(tp), LEGACY_LOGIT_RW_BYTES
    return rules.loss_bytes(tp), rules.loss_traffic_per_logit or LOGIT_RW_BYTES


def quant_bytes(cluster: Cluster, setup: TrainingSetup) -> tuple[float, float] | None:
    """Bytes per element of the setup's fp8 quantisation on this GPU (compute.fp8_quant_bytes);
    None below fp8 or under a version 1 efficiency block (which priced none)."""
    recipe = setup.quantisation
    if recipe is None or isinstance(cluster.efficiency, LegacyEfficiency):
        return None
    return compute.fp8_quant_bytes(recipe, cluster.gpu)


def kernel_of(cluster: Cluster, setup: TrainingSetup) -> str | None:
    """The flash attention kernel the setup's runtime runs on this GPU (runtimes.py), of those
    the GPU has measured tables for."""
    m = cluster.gpu.measured
    return attention_kernel(setup.runtime, m.kernels()) if m is not None else None


def layer_memory(model: ModelSpec, setup: TrainingSetup, tp: int, cp: int, ep: int, micro_batch: int,
                 sequence_parallel: bool, recompute: str) -> tuple[float, tuple]:
    """(least saved bytes of a layer, the distinct (dense, expert) local parameters of a layer)
    under `recompute` ('full': every layer recomputed): the layer tables' memory rows, from the
    layers' work alone (no timing), for memory floors taken before any context is priced."""
    base = layer_ctx(model, setup, tp, cp, ep, micro_batch, sequence_parallel)
    work = [layer_work(k, _kind_ctx(base, k, priced_mode(setup, recompute))) for k in _kinds(model)[0]]
    return (min(w.saved.total for w in work),
            tuple(sorted({(w.params_local, w.expert_params_local) for w in work})))


@lru_cache(maxsize=16384)
def selective_saves_memory(model: ModelSpec, setup: TrainingSetup, tp: int, cp: int, micro_batch: int,
                           sequence_parallel: bool) -> bool:
    """Whether selective recomputation keeps fewer activations than none in this layer context.
    Megatron's of the attention core alone (its default module) keeps the same with flash
    attention (the scores it would drop are never stored), so it only adds time there: every
    strategy with it is matched by the same strategy without; with other modules named
    (TrainingSetup.recompute_modules) it keeps less. torchtitan's per-op policy keeps less in
    every context with a layer of linears. ep is left at 1: what the experts drop (moe_act)
    does not vanish at any ep, so whether anything is dropped does not depend on it."""
    base = layer_ctx(model, setup, tp, cp, 1, micro_batch, sequence_parallel)
    mode = priced_mode(setup, "selective")
    return any(layer_work(k, _variant(base, mode, 1)).saved.total
               < layer_work(k, _variant(base, "none", 1)).saved.total for k in _kinds(model)[0])


@lru_cache(maxsize=4096)
def _layer_tables(model: ModelSpec, cluster: Cluster, precision: str, base: Ctx, base_mode: str,
                  tp_span: Span, cp_span: Span, ep_span: Span, kernel: str | None, overlap: bool,
                  ep_dedup: bool = False, ep_overlap: bool = False,
                  loss_bytes_per_logit: float = LOGIT_SAVED_BYTES,
                  loss_traffic_per_logit: float = LOGIT_RW_BYTES,
                  quant: tuple[float, float] | None = None, keeps_outputs: bool = False,
                  keeps_buffers: bool = False) -> LayerTables:
    """Prefix sums of the layer prices and the embedding/head terms for one layer context
    (shared by every strategy that differs only in dp, pp, vpp, ZeRO or rank order). The head
    holds, at the loss's peak, what it saves besides the logits and `loss_bytes_per_logit` per
    logit (loss_bytes), once per stage: one micro-batch's loss at a time, and moves
    `loss_traffic_per_logit` per logit. Added to a recomputed layer's rebuild buffer, though the two
    never coincide (the loss's buffers are gone when backward reaches a layer): an overcount of
    at most the smaller, on the safe side. `keeps_outputs` (RuntimeRules.pp_keeps_outputs): the
    last pipeline stage keeps each micro-batch's 16-bit logits to the step's end (head_kept).
    `keeps_buffers` (RuntimeRules.pp_buffers_per_microbatch): each chunk holds boundary activations
    (boundary_bytes) for every micro-batch of the step (pp_buffer). cp_buffer (cp_gathered_bytes):
    the blocks an all-gather rotater holds while a layer's attention runs, added like the loss's
    peak on the last stage though the two never coincide either (the same safe-side overcount);
    its backward's fp32 gradient accumulators and send buffers (a few blocks more) are not
    counted. bwd_buffer (graph.Work.backward_bytes): the gradients the backward of the model's
    largest layer holds beyond its saved bytes, held once by every stage, beside the loss's peak
    on the last (the same safe-side overcount) and the rebuild buffer, with which it coincides."""
    gpu, eff = cluster.gpu, cluster.efficiency
    head_precision = compute.outside_fp8(precision, eff)
    layer_kinds, kind_index = _kinds(model)
    no_group = Span(size=1, per_node=1, nodes=1)

    def costs(mode):
        return [layer_cost(k, _kind_ctx(base, k, mode), cluster, precision, tp_span, cp_span,
                           ep_span if k.experts else no_group, kernel, overlap, ep_dedup, ep_overlap, quant)
                for k in layer_kinds]

    # only strategies with recompute 'full' read the full-recompute rows, and their base mode is
    # 'none': a 'selective' table never recomputes a layer fully, so its rows repeat the base's
    base_costs = costs(base_mode)
    full_costs = costs("full") if base_mode == "none" else base_costs
    table = np.array([(b.fwd + b.bwd, b.fwd, b.bwd, b.tp, b.cp, b.ep, b.params, b.expert_params, b.gemm_weights,
                       b.recompute, f.recompute, b.saved, f.saved, b.saved_main, f.saved_main)
                      for b, f in zip(base_costs, full_costs)]).T
    kinds = dict(zip(LAYER_ROWS, table))
    sums = np.zeros((len(LAYER_ROWS), len(kind_index) + 1))
    np.cumsum(table[:, kind_index], axis=1, out=sums[:, 1:])
    prefix = dict(zip(LAYER_ROWS, sums))
    emb, head = embedding_work(model, base), head_work(model, base)

    def t_mem(n_bytes):
        return compute.memory_time_s(n_bytes, gpu, eff)

    def coll(n_bytes):
        return comm.collective_time_s("all_reduce", n_bytes, tp_span, cluster)

    ends = {"emb_comp": t_mem(emb.elementwise_bytes), "emb_tp": coll(emb.tp_message_bytes),
            "emb_params": emb.params_local, "emb_saved": emb.saved_bytes,
            "head_comp": 3 * compute.gemm_time_s(head.gemm_flops, head.gemm_intensity, gpu, head_precision, eff)
            + t_mem(head.elementwise_bytes + (loss_traffic_per_logit - LOGIT_RW_BYTES) * head.logits),
            "head_tp": 2 * coll(head.tp_message_bytes or emb.tp_message_bytes),
            "head_params": head.params_local, "head_tied": tied_head_params(model, base.tp),
            "head_saved": head.saved_bytes + (loss_bytes_per_logit - LOGIT_SAVED_BYTES) * head.logits,
            "head_kept": ACT_BYTES * head.logits if keeps_outputs else 0.0,
            # torchtitan's stage inputs and outputs are its layers' local tensors: Shard(1) under
            # sequence parallelism, whole without
            "pp_buffer": (boundary_bytes(model, base.seq_len, base.cp, base.micro_batch, base.tp if base.sp else 1)
                          if keeps_buffers else 0.0),
            "cp_buffer": cp_gathered_bytes(layer_kinds, base),
            "bwd_buffer": max((layer_work(k, _kind_ctx(base, k, "none")).backward_bytes for k in layer_kinds),
                              default=0.0)}
    transient = max((n.saved_none - f.saved for n, f in zip(base_costs, full_costs)), default=0.0)
    prefetch = 2 * memory.WEIGHT_BYTES * max((c.params + c.expert_params for c in base_costs), default=0.0)
    return LayerTables(prefix=prefix, ends=ends, kinds=kinds, transient_bytes=transient, prefetch_bytes=prefetch)


def stage_terms(prof: Profile, i, chunks, recompute_layers=0, paper_accounting: bool = False) -> dict:
    """Time and memory terms of pipeline stage `i` holding `chunks` [(a, b), ...] with its first
    `recompute_layers` layers fully recomputed (recompute 'full'). i, a, b and recompute_layers may
    be numpy arrays: every term is computed elementwise (the stage DP prices all ranges of one
    stage at once; the search prices all stages of a split at once)."""
    s, cluster = prof.strategy, prof.cluster
    eff = cluster.efficiency
    sums = _stage_sums(prof, chunks, recompute_layers, _PREFIX_KEYS)
    comp, tp, before_zero = _stage_time(prof, i, sums)
    dense, saved, head_saved = _held(prof, i, sums)

    def coll(kind, n_bytes, group):
        return comm.collective_time_s(kind, n_bytes, prof.spans[group], cluster)

    z = 0.0
    gathered = gathered_bytes(prof.gather_bytes, dense, sums["params"], sums["expert"])
    if prof.zero >= 2:
        per_mb = zero_traffic_s(coll, prof.zero, prof.grad_bytes, gathered, dense, sums["expert"], replica_share(s))
        z = np.maximum(0.0, per_mb - eff.dp_overlap_fraction * comp) if s.dp_overlap else per_mb
    # gradient accumulation outside the GEMMs, over the stage's parameters, every micro-batch
    accum = (compute.memory_time_s(prof.accum_bytes * (dense + sums["expert"]), cluster.gpu, eff)
             if prof.accum_bytes else 0.0)
    t = before_zero + z + accum
    shards, eshards = state_shards(s.dp, s.cp, s.ep, expert_fold(prof.model, prof.setup, s.tp), s.dp_shard)
    # recomputation runs inside backward and hides traffic too
    exposed, opt = stage_tail_s(coll, prof.zero, prof.grad_bytes, gathered, dense, sums["expert"], sums["fwd"],
                                sums["bwd"] + sums["rec"], i, s.dp_overlap, shards, eshards, cluster,
                                replica_share(s), optimizer=optimizer_state_bytes(prof.setup))

    if paper_accounting:
        gemm_w = sums["gemm_w"] / s.tp
        weights, grads, optim = (memory.WEIGHT_BYTES * gemm_w, memory.GRAD_BYTES * gemm_w,
                                 memory.OPTIMIZER_BYTES * gemm_w)
        acts, other = pipeline.in_flight(i, s.pp, prof.microbatches, s.vpp) * sums["main"], 0.0 * gemm_w
    else:
        weights, grads, optim, acts, other = _memory_parts(prof, i, sums, dense, saved, head_saved)
    return {"t": t, "compute": comp + accum, "recompute": sums["rec"], "tp_comm": tp, "cp_comm": sums["cp"],
            "ep_comm": sums["ep"], "pp_comm": prof.p2p_s + 0.0 * comp, "pp_fill": prof.p2p_fill_s + 0.0 * comp,
            "z": z, "dp_exposed": exposed, "optimizer": opt, "tail": exposed + opt + prof.p2p_fill_s,
            "weights": weights, "grads": grads, "optim": optim, "activations": acts, "other": other,
            "memory": weights + grads + optim + acts + other, "recompute_layers": sums["n_rec"]}


def busy_s(comp, rec, tp, cp, ep):
    """Time per micro-batch of layers (or a stage) before p2p and ZeRO-2/3 traffic: compute,
    recomputation, and the exposed tp, cp and ep collectives. Arrays broadcast."""
    return comp + rec + tp + cp + ep


def _stage_time(prof: Profile, i, sums: dict) -> tuple:
    """(compute, tp traffic, time per micro-batch without ZeRO-2/3 traffic) of stage i holding
    the layers `sums` sums up (_stage_sums): the first stage adds the embedding's, the last the
    head's, and every stage its p2p."""
    E, first, last = prof.ends, np.equal(i, 0), np.equal(i, prof.strategy.pp - 1)
    comp = sums["comp"] + first * E["emb_comp"] + last * E["head_comp"]
    tp = sums["tp"] + first * E["emb_tp"] + last * E["head_tp"]
    return comp, tp, busy_s(comp, sums["rec"], tp, sums["cp"], sums["ep"]) + prof.p2p_s


def stage_time_floor_s(prof: Profile, i, chunks):
    """stage_terms(...)["t"] less what recompute counts, ZeRO-2/3 traffic and a gradient
    accumulation pass add, each never negative: a lower bound of the stage's time for every
    count, computed without them. It adds up over layers, so its sum over the stages of a split
    is the same for every split."""
    return _stage_time(prof, i, _stage_sums(prof, chunks, 0, ("comp", "tp", "cp", "ep")))[2]


def time_floor_parts_s(prof: Profile, recomputed: bool = False) -> tuple[np.ndarray, float, float]:
    """stage_time_floor_s in its parts: each layer's (an array over the layer chain), the
    embedding's and the head's, without the stage's p2p; a stage's floor is the sum of its
    layers', the embedding's on the first stage, the head's on the last, and its p2p.
    `recomputed`: every layer recomputes fully (recompute 'full' of all layers), whose
    recomputation the floor then holds."""
    a = np.arange(prof.model.layers)
    sums = _stage_sums(prof, [(a, a + 1)], int(recomputed), ("comp", "tp", "cp", "ep"))
    layers = np.broadcast_to(busy_s(sums["comp"], sums["rec"], sums["tp"], sums["cp"], sums["ep"]), a.shape)
    E = prof.ends
    return layers, float(E["emb_comp"] + E["emb_tp"]), float(E["head_comp"] + E["head_tp"])


def _stage_sums(prof: Profile, chunks, recompute_layers, keys) -> dict:
    """Sums over a stage's chunks of the prefix tables `keys`, and of the recompute time, saved
    activations (all, and Korthikanti's main terms), layers and recomputed layers when its first
    `recompute_layers` layers recompute fully (recompute 'full'). A table that is zero throughout
    (no experts, no context parallelism; its rows are times and sizes, never negative, so a
    zero total says so) sums to the scalar 0.0, which spares the collectives priced on it their
    array arithmetic."""
    P, full = prof.prefix, prof.strategy.recompute == "full"

    def total(key, lo, hi):
        table = P[key]
        return table[hi] - table[lo] if table[-1] else 0.0

    sums = {k: 0.0 for k in (*keys, "rec", "saved", "main", "n", "n_rec")}
    left = recompute_layers if full else 0
    for a, b in chunks:
        r = np.minimum(np.maximum(left, 0), b - a) if full else 0
        mid = a + r
        for k in keys:
            sums[k] = sums[k] + total(k, a, b)
        sums["rec"] = sums["rec"] + total("rec_f", a, mid) + total("rec_b", mid, b)
        sums["saved"] = sums["saved"] + total("saved_f", a, mid) + total("saved_b", mid, b)
        sums["main"] = sums["main"] + total("main_f", a, mid) + total("main_b", mid, b)
        sums["n"] = sums["n"] + (b - a)
        sums["n_rec"] = sums["n_rec"] + r
        left = left - r
    return sums


def stage_memory_bytes(prof: Profile, i, chunks, recompute_layers=0):
    """stage_terms(...)["memory"] alone, without the time terms (for searches that only ask
    whether a stage fits)."""
    sums = _stage_sums(prof, chunks, recompute_layers, ("params", "expert"))
    return sum(_memory_parts(prof, i, sums, *_held(prof, i, sums)))


def layer_memory_floor_bytes(prof: Profile) -> np.ndarray:
    """Per layer, bytes it adds at least to the peak of any one-chunk stage that holds it: its
    weights, gradients and optimizer states (stage_memory's, sharded as the strategy shards
    them) and one micro-batch of its saved activations in the mode that saves least (full
    recomputation where the strategy may recompute it fully). A stage's peak (stage_memory) is
    at least memory.RUNTIME_RESERVED_BYTES plus the sum of these over its layers: its states
    are linear in its parameters, it holds at least one micro-batch in flight
    (pipeline.in_flight), and its embedding, head, buffers and rebuild buffer only add."""
    s, P = prof.strategy, prof.prefix
    dense, expert = np.diff(P["params"]), np.diff(P["expert"])
    saved = np.diff(P["saved_b"])
    if s.recompute == "full":
        saved = np.minimum(saved, np.diff(P["saved_f"]))
    shards = state_shards(s.dp, s.cp, s.ep, expert_fold(prof.model, prof.setup, s.tp), s.dp_shard)
    weights, grads, optimizer, acts, _ = stage_memory(prof.zero, dense, expert, *shards, in_flight=1.0, saved=saved,
                                                     head_saved=0.0, transient=0.0, prefetch_bytes=0.0,
                                                     setup=prof.setup)
    return weights + grads + optimizer + acts


def _held(prof: Profile, i, sums: dict) -> tuple:
    """stage_ends of stage i holding the layers `sums` sums up (_stage_sums)."""
    return stage_ends(np.equal(i, 0), np.equal(i, prof.strategy.pp - 1), sums["params"], sums["saved"],
                      prof.ends.__getitem__, prof.microbatches, prof.strategy.vpp)


def _memory_parts(prof: Profile, i, sums: dict, dense, saved, head_saved) -> tuple:
    """stage_memory of stage i: its micro-batches in flight, and the rebuild buffer when it
    recomputes a layer fully."""
    s = prof.strategy
    return stage_memory(prof.zero, dense, sums["expert"],
                        *state_shards(s.dp, s.cp, s.ep, expert_fold(prof.model, prof.setup, s.tp), s.dp_shard),
                        pipeline.in_flight(i, s.pp, prof.microbatches, s.vpp), saved, head_saved,
                        prof.transient_bytes * ((sums["n_rec"] > 0) | (s.recompute == "selective")), prof.prefetch_bytes,
                        prof.setup)


def stage_ends(first, last, params, saved, end, microbatches=1, vpp=1) -> tuple:
    """(dense parameters, saved bytes per micro-batch, what the stage holds once: the LM head's
    saved bytes and the runtime's buffers) of a pipeline stage whose layers hold `params` and
    `saved`; `end(key)` reads the layer context's end terms (LayerTables.ends). The first stage
    also holds the embedding, the last the LM head, less head_tied (tied_head_params) when it is
    also the first, whose embedding table then serves as the head. The last of two or more stages
    also holds head_kept for each of the step's other `microbatches` - 1 micro-batches: at its
    last backward, the outputs of the earlier ones a runtime keeps (RuntimeRules.pp_keeps_outputs).
    A runtime that keeps pipeline buffers for every micro-batch
    (RuntimeRules.pp_buffers_per_microbatch) holds pp_buffer (boundary_bytes) four times a
    micro-batch in each of the stage's `vpp` chunks, less two in the pipeline's first chunk
    (nothing to receive) and two in its last (its output is the logits): microbatches x pp_buffer
    x (4 vpp - 2 first - 2 last), 0 without pipeline stages. Every stage holds cp_buffer
    (cp_gathered_bytes) while a layer's attention runs and bwd_buffer (graph.Work.backward_bytes,
    the model's largest layer's: on the safe side for a stage without it) while a layer's backward
    runs. A chunk's first layer saves its input,
    which is that chunk's receive buffer, so the in-flight micro-batches' inputs are counted twice
    outside the first stage: an overcount of at most in_flight x pp_buffer, on the safe side.
    Arrays broadcast."""
    kept = last * np.logical_not(first) * (microbatches - 1) * end("head_kept")
    buffers = microbatches * end("pp_buffer") * (4 * vpp - 2 * first - 2 * last)
    return (params + first * end("emb_params") + last * (end("head_params") - first * end("head_tied")),
            saved + first * end("emb_saved"),
            last * end("head_saved") + kept + buffers + end("cp_buffer") + end("bwd_buffer"))


def stage_memory(zero, dense, expert, shards, eshards, in_flight, saved, head_saved, transient,
                 prefetch_bytes, setup: TrainingSetup) -> tuple:
    """(weights, grads, optimizer, activations, other) bytes of a stage: the states of its dense
    parameters sharded over the dp*cp group and of its experts over the expert data-parallel
    group (ZeRO; a gradient element of the setup's dp_grad_bytes, a sharded optimizer's states of
    its optimizer_state_bytes), with the gradients its runtime
    keeps beside them (RuntimeRules.kept_grad_bytes_of), the activations of
    its in-flight micro-batches (`saved` per micro-batch) plus what the stage holds once
    (`head_saved`, stage_ends: the head's, the runtime's pipeline and context-parallel buffers,
    the backward's gradients)
    and a recomputed layer's rebuild buffer, and what the runtime adds (with ZeRO-3's prefetched
    layers). Arrays
    broadcast, zero included. With an fp8 parameter gather the weights are still counted at
    16 bits: their fp8 copy plus, on Hopper, the transposed copy the backward's GEMMs take."""
    grad_bytes, optimizer = dp_grad_bytes(setup.precision, setup.grad_reduce), optimizer_state_bytes(setup)
    wd, gd, od = memory.state_bytes(dense, zero, shards, grad_bytes, optimizer)
    we, ge, oe = memory.state_bytes(expert, zero, eshards, grad_bytes, optimizer)
    kept = RUNTIME_RULES[setup.runtime].kept_grad_bytes_of(setup.precision, zero) * (dense + expert)
    acts = in_flight * saved + head_saved + transient
    return (wd + we, gd + ge + kept, od + oe, acts,
            memory.other_bytes(acts, memory.from_stage(zero, 3, prefetch_bytes, 0.0)))


def replica_reduce_s(coll, grad_bytes: int, dense, replicas: float):
    """Under hybrid sharding, the all-reduce across the replicas of each rank's share `replicas`
    (replica_share) of the dense gradients, after their reduce-scatter over the shard group
    (FSDP2's HSDP after every reduce-scatter, Megatron's optimizer instances once a step); 0
    without hybrid sharding. coll as in zero_traffic_s."""
    return coll("all_reduce", grad_bytes * dense * replicas, "replica") if replicas else 0.0


def zero_traffic_s(coll, zero, grad_bytes: int, gathered: tuple, dense, expert, replicas: float = 0.0):
    """ZeRO-2/3 collectives of one micro-batch over a stage's parameters: ZeRO-2 reduce-scatters
    every micro-batch's gradients, ZeRO-3 also gathers the weights for forward and backward;
    over the dp*cp group for dense parameters (its shard group under hybrid sharding) and the
    expert data-parallel group for experts. Under hybrid sharding each rank then all-reduces
    its share `replicas` (replica_share) of the dense gradients across the replicas, as FSDP2's
    HSDP does after every reduce-scatter. `gathered`: the (dense, expert) bytes of the weights
    gathered (gathered_bytes). coll(kind, bytes, 'dpcp' | 'edp' | 'replica') prices one
    collective; zero and the sizes may be arrays."""
    def out():
        return (coll("reduce_scatter", grad_bytes * dense, "dpcp") + coll("reduce_scatter", grad_bytes * expert, "edp")
                + replica_reduce_s(coll, grad_bytes, dense, replicas))

    def gather():
        return 2 * coll("all_gather", gathered[0], "dpcp") + 2 * coll("all_gather", gathered[1], "edp")

    return _by_zero(zero, ((2, 3), out)) + _by_zero(zero, ((3,), gather))


def _by_zero(zero, *cases):
    """Per ZeRO stage, the value of the first case (stages, thunk) listing it, else 0.0; zero
    may be an array. Only the thunks of stages present are called (a scalar zero prices one)."""
    if not getattr(zero, "ndim", 0):
        return next((f() for stages, f in cases if zero in stages), 0.0)
    out = 0.0
    for stages, f in reversed(cases):
        hit = np.logical_or.reduce([np.equal(zero, z) for z in stages])
        if hit.any():
            out = np.where(hit, f(), out)
    return out


def stage_tail_s(coll, zero, grad_bytes: int, gathered: tuple, dense, expert, fwd_s, bwd_s, stage,
                 dp_overlap: bool, shards, eshards, cluster: Cluster, replicas: float = 0.0, *,
                 optimizer: float):
    """(exposed data-parallel time, optimizer time) a stage adds after the pipeline drains: the
    gradient reduction (all-reduce with ZeRO-0, reduce-scatter with ZeRO-1), the parameter
    all-gather after the distributed optimizer (ZeRO-1/2), then the optimizer step over the
    stage's shard. Stage i finishes its last backward i micro-batches after the last stage, so
    the reduction hides behind (dp_overlap_fraction + i) of its backward (`bwd_s`, with its
    recomputation) and the gather behind a fraction of the forward. coll as in zero_traffic_s;
    every argument may be an array; `gathered` as in zero_traffic_s. Under hybrid sharding (`replicas`, the replica_share of the
    dense gradients) ZeRO-1's reduce-scatter over the shard group is followed by the all-reduce
    of that share across the replicas (Megatron's distributed optimizer instances). `optimizer`:
    the bytes a sharded optimizer keeps a parameter (optimizer_state_bytes)."""
    eff = cluster.efficiency

    def both(kind, n_bytes):
        return coll(kind, n_bytes * dense, "dpcp") + coll(kind, n_bytes * expert, "edp")

    def scatter():
        return both("reduce_scatter", grad_bytes) + replica_reduce_s(coll, grad_bytes, dense, replicas)

    grad = _by_zero(zero, ((0,), lambda: both("all_reduce", grad_bytes)), ((1,), scatter))
    gather = _by_zero(zero, ((1, 2), lambda: coll("all_gather", gathered[0], "dpcp")
                                            + coll("all_gather", gathered[1], "edp")))
    if dp_overlap:
        exposed = (np.maximum(0.0, grad - reduction_hiding(cluster, stage, dp_overlap) * bwd_s)
                   + np.maximum(0.0, gather - eff.dp_overlap_fraction * fwd_s))
    else:
        exposed = grad + gather
    return exposed, optimizer_s(zero, dense, expert, shards, eshards, cluster, optimizer)


def reduction_hiding(cluster: Cluster, stage, dp_overlap: bool):
    """Seconds of a stage's gradient reduction that one second of its backward hides
    (stage_tail_s): dp_overlap_fraction + stage with overlap, none without; stage may be an
    array."""
    return cluster.efficiency.dp_overlap_fraction + stage if dp_overlap else 0.0 * stage


def optimizer_s(zero, dense, expert, shards, eshards, cluster: Cluster, optimizer: float):
    """The optimizer step over a stage's parameter shard: memory.adam_traffic_bytes of memory
    traffic a parameter (38 with fp32 states; `optimizer` the bytes a sharded optimizer keeps),
    the states sharded over the dp*cp (experts: expert data-parallel) group from ZeRO-1 on.
    Arrays broadcast."""
    sharded = np.greater_equal(zero, 1)
    return compute.memory_time_s(memory.adam_traffic_bytes(optimizer, zero)
                                 * (dense / np.where(sharded, shards, 1) + expert / np.where(sharded, eshards, 1)),
                                 cluster.gpu, cluster.efficiency)


def split_terms(prof: Profile, bounds, recompute_layers=None) -> dict:
    """stage_terms of every stage of a split at once (arrays indexed by stage).
    `bounds` lists pp*vpp chunks [a, b); stage i holds chunks i, i+pp, ...; `recompute_layers`
    per stage (recompute 'full'; default: the strategy's count on every stage, or all layers)."""
    s = prof.strategy
    chunks, sizes = pipeline.chunk_arrays(bounds, s.pp)
    if recompute_layers is not None:
        r = np.asarray(recompute_layers)
    elif s.recompute_layers is not None:
        r = np.minimum(s.recompute_layers, sizes)
    else:
        r = sizes
    return stage_terms(prof, np.arange(s.pp), chunks, r)


def split_step(terms: dict, microbatches: int, vpp: int) -> tuple[float, float, int, int]:
    """(step time, pipeline bubble, bottleneck stage, tail stage) of a split's terms.
    Step = m * max_i t_i + (sum_i t_i - max_i t_i) / v + max_i (exposed DP_i + optimizer_i + fill),
    fill the sends an overlapped interleaved pipeline still shows (p2p_fill_s), one for all stages."""
    times = [float(x) for x in terms["t"]]
    tails = [float(x) for x in np.broadcast_to(terms["tail"], len(times))]
    bubble_s = pipeline.pipeline_time_s(times, microbatches, vpp)[1]
    worst = max(range(len(times)), key=times.__getitem__)
    tail = max(range(len(tails)), key=tails.__getitem__)
    return pipeline.step_time_s(times, tails, microbatches, vpp), bubble_s, worst, tail


def estimate(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, s: Strategy,
             bounds: list[tuple[int, int]] | None = None, paper_accounting: bool = False,
             recompute_layers: tuple[int, ...] | None = None) -> StepEstimate:
    """Price strategy `s`. `bounds` overrides the even stage split (pp*vpp chunks of layers);
    `recompute_layers` gives per stage how many layers recompute fully (recompute 'full'; default
    s.recompute_layers on every stage, or all of them). `paper_accounting` restricts memory to
    Korthikanti 2022's: 18 bytes per GEMM weight of the transformer layers and the saved
    activations of Table 2, nothing else. Step time: `split_step`."""
    check_strategy(s, model, setup)
    prof = profile(model, cluster, setup, s)
    bounds = list(bounds or pipeline.split_layers(len(_layers(model)), s.pp, s.vpp))
    if paper_accounting:
        per_stage = pipeline.stage_chunks(bounds, s.pp)
        rows = [stage_terms(prof, i, c, sum(b - a for a, b in c), True) for i, c in enumerate(per_stage)]
        terms = {k: np.array([np.broadcast_to(r[k], ()) for r in rows]) for k in rows[0]}
    else:
        terms = split_terms(prof, bounds, recompute_layers)
    return estimate_of_terms(model, setup, s, bounds, terms, prof.microbatches, cluster.gpu.flops(setup.precision),
                             (memory.capacity_bytes(cluster, setup),) * s.pp, min(cluster.gpus_per_node, setup.gpus))


def estimate_of_terms(model: ModelSpec, setup: TrainingSetup, s: Strategy, bounds, terms: dict, m: int,
                      peak_flops: float, capacities: tuple[float, ...], gpus_per_node: int) -> StepEstimate:
    """The StepEstimate of a split's stage terms (split_terms, or cost/pools.pool_terms): step by
    split_step, the breakdown of the bottleneck and tail stages, memory of the stage with the
    highest peak, MFU and HFU over `peak_flops` (the dense peak per GPU, averaged over the GPUs
    where stages sit on different ones); it fits when every stage fits its own capacity."""
    step_s, bubble_s, worst, tail = split_step(terms, m, s.vpp)

    per_stage = {k: np.broadcast_to(v, (s.pp,)).tolist() for k, v in terms.items()}

    def at(key, i):
        return float(per_stage[key][i])

    stages = []
    for i, chunks in enumerate(pipeline.stage_chunks(bounds, s.pp)):
        mem = memory.MemoryBreakdown(weights=at("weights", i), grads=at("grads", i), optimizer=at("optim", i),
                                     activations=at("activations", i), other=at("other", i))
        stages.append(StageEstimate(index=i, chunks=tuple(chunks), recompute_layers=int(at("recompute_layers", i)),
                                    time_per_microbatch_s=at("t", i), memory=mem))
    breakdown = {k: m * at(k, worst) for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm")}
    breakdown["pp_comm"] += at("pp_fill", tail)
    breakdown["bubble"] = bubble_s
    breakdown["dp_comm_exposed"] = at("dp_exposed", tail) + m * at("z", worst)
    breakdown["optimizer"] = at("optimizer", tail)

    flops = model_flops_per_sequence(model, setup.seq_len) * setup.global_batch
    peak_stage = max(stages, key=lambda st: st.memory.total)
    degrees = expert_degrees(s.tp, s.cp, s.dp, s.pp, s.ep, setup.expert_tp(s.tp, model))
    executed = executed_flops_per_step(model, setup, s, stages)
    return StepEstimate(
        step_time_s=step_s, breakdown_s={k: breakdown[k] for k in BREAKDOWN_KEYS}, memory=peak_stage.memory,
        stages=tuple(stages), model_flops_per_step=flops,
        tokens_per_s=setup.global_batch * setup.seq_len / step_s,
        model_tflops_per_gpu=flops / step_s / setup.gpus / 1e12, mfu=flops / step_s / setup.gpus / peak_flops,
        hfu=executed / step_s / setup.gpus / peak_flops,
        fits=all(st.memory.total <= cap for st, cap in zip(stages, capacities)),
        capacity_bytes=capacities[peak_stage.index],
        tiers=tiers(s.order, degrees, gpus_per_node))


def stage_model_flops(model: ModelSpec, seq_len: int, stages) -> list[float]:
    """Model FLOPs of one training sequence on each stage (model_flops_per_sequence's count of
    the layers of its chunks, the head's on the last stage), `stages` StageEstimates in order."""
    layers, head = _model_flops_per_layer(model, seq_len)
    out = [3 * sum(layers[i] for a, b in st.chunks for i in range(a, b)) for st in stages]
    out[-1] += 3 * head
    return out


@lru_cache(maxsize=64)
def model_flops_per_sequence(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of one training sequence: 3x the forward (backward = 2x forward) of every layer
    with attention scores counted in full, plus the LM head (Korthikanti 2022 App. A; DESIGN.md)."""
    layers, head = _model_flops_per_layer(model, seq_len)
    return 3 * (sum(layers) + head)


@lru_cache(maxsize=64)
def _model_flops_per_layer(model: ModelSpec, seq_len: int) -> tuple[tuple[float, ...], float]:
    """(forward model FLOPs of one sequence on each layer of the chain, on the LM head): what
    model_flops_per_sequence and stage_model_flops add up."""
    ctx = Ctx(micro_batch=1, seq_len=seq_len)
    return tuple(layer_work(l, ctx).model_flops for l in _layers(model)), head_work(model, ctx).model_flops


@lru_cache(maxsize=64)
def _executed_per_sequence(model: ModelSpec, seq_len: int, flash: bool,
                           modules: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Of one sequence: per layer of the chain the forward FLOPs a GPU executes (its GEMMs and
    attention core, causal flash at half the scores), the attention core's part, the part of its
    GEMMs' the per-op policy recomputes (graph.op_policy) and the part the selective `modules`
    recompute beyond the core (graph.Work.selective_recomputed); and the LM head's forward."""
    ctx = Ctx(micro_batch=1, seq_len=seq_len, flash=flash, modules=modules)
    works = [layer_work(layer, ctx) for layer in _layers(model)]
    return (np.array([sum(f for f, _ in w.gemms) + w.attn_flops for w in works]),
            np.array([w.attn_flops for w in works]),
            np.array([sum(share * f for share, (f, _) in zip(w.op_recomputed, w.gemms)) for w in works]),
            np.array([sum(share * f for share, (f, _) in zip(w.selective_recomputed, w.gemms)) for w in works]),
            head_work(model, ctx).gemm_flops)


def compute_floor_s(model: ModelSpec, cluster: Cluster, setup: TrainingSetup) -> float:
    """A step time no strategy of `setup` beats: the work of every sequence of the global batch
    spread evenly over the GPUs, each part at the fastest rate the cost model ever grants it
        GEMMs      forward FLOPs x (2 + 1 / compute.fp8_forward_speedup) at compute.gemm_rate
                   (knee term dropped; the setup's precision or bf16, whichever is faster),
        attention  its forward+backward FLOPs (FLASH_BWD_FACTOR, or 2 eager) at the fastest of
                   the GPU's attention tables and the GEMM rate,
        memory     (1 + ELEMENTWISE_BWD_FACTOR) x the memory-bound bytes at compute.memory_time_s,
    each counted unsharded (tp 1, cp 1, one micro-batch of one sequence): sharding splits this
    work over ranks or repeats it, never shrinks it. A step is at least its busiest GPU's compute,
    at least the average; recomputation, communication and bubbles only add (test_cost.py checks
    the floor against priced strategies)."""
    eff, gpu = cluster.efficiency, cluster.gpu
    ctx = Ctx(micro_batch=1, seq_len=setup.seq_len, flash=setup.attention == "flash")
    works = [layer_work(layer, ctx) for layer in _layers(model)]
    gemm_s_per_flop = min((2 + 1 / compute.fp8_forward_speedup(gpu, p, eff)) / compute.gemm_rate(gpu, p, eff)[0]
                          for p in {setup.precision, compute.HIGH_PRECISION})
    gemm = 3 / gemm_s_per_flop  # the fastest GEMM rate over the three passes
    tables = [v for t in (gpu.measured.attention if gpu.measured and not isinstance(eff, LegacyEfficiency) else ())
              for _, v in t.points]
    attn_rate = max([gemm] + [v * 1e12 * compute.framework(eff) for v in tables])
    bwd = compute.attention_bwd_factor(ctx.flash)
    gemm_flops = 3 * (sum(f for w in works for f, _ in w.gemms) + head_work(model, ctx).gemm_flops)
    attn_flops = (1 + bwd) * sum(w.attn_flops for w in works)
    mem_bytes = (1 + ELEMENTWISE_BWD_FACTOR) * sum(w.elementwise_bytes + w.core_elementwise_bytes for w in works)
    per_sequence = gemm_flops / gemm + attn_flops / attn_rate + compute.memory_time_s(mem_bytes, gpu, eff)
    return per_sequence * setup.global_batch / setup.gpus


def executed_flops_per_step(model: ModelSpec, setup: TrainingSetup, s: Strategy, stages) -> float:
    """FLOPs the GPUs execute in one step: forward, backward at twice the forward (a flash
    attention core's at 2.5x: it recomputes the scores, Dao 2023 §3.1), and what recomputation
    runs again (the forward of each stage's recomputed layers under 'full'; under 'selective' its
    modules, the attention core and the GEMMs of the others, or on a runtime with the per-op
    policy the GEMMs it recomputes), for every sequence of the global batch."""
    modules = setup.selective_modules
    fwd, attn, op_gemms, selective, head = _executed_per_sequence(model, setup.seq_len, setup.attention == "flash",
                                                                  modules)
    extra = (compute.FLASH_BWD_FACTOR - 2.0) if setup.attention == "flash" else 0.0
    total = 3 * fwd.sum() + extra * attn.sum() + 3 * head
    if s.recompute == "selective" and priced_mode(setup, "selective") == "op":
        total += op_gemms.sum()
    elif s.recompute == "selective":
        total += (attn.sum() if "core_attn" in modules else 0.0) + selective.sum()
    elif s.recompute == "full":
        for stage in stages:
            left = stage.recompute_layers
            for a, b in stage.chunks:
                r = min(left, b - a)
                total += fwd[a:a + r].sum()
                left -= r
    return float(total * setup.global_batch)
