"""Strategy -> StepEstimate: step time with its breakdown and memory per GPU with its breakdown.

Per micro-batch and pipeline stage, each layer costs forward compute (GEMMs, attention core,
memory-bound ops), backward compute (2x the GEMMs: input and weight gradients; the attention core
2x eager or 2.5x flash, whose backward recomputes the scores; 2x the memory-bound traffic),
recompute (the forward again for full recompute, the attention core for selective), and the
collectives it issues (tensor parallel, context parallel ring, expert all-to-all). Stages combine
through the pipeline formula (cost/pipeline.py); the data-parallel gradient reduction is added
where backward cannot hide it, then the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from planner.cost import comm, compute, memory, pipeline
from planner.graph import Ctx, Layer, build_layers, embedding_work, head_work, layer_work
from planner.placement import Span, span, tiers
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup, check_strategy

FLASH_BWD_FACTOR = 2.5
"""FlashAttention-2 backward: 5 matmuls of the forward's 2 (Dao 2023, §3.1)"""
ELEMENTWISE_BWD_FACTOR = 1.0
"""backward HBM traffic of memory-bound ops relative to forward: each reads the incoming gradient
and what it saved and writes one gradient, about what its forward moved (dropout, bias-add,
residual, GeLU); Korthikanti 2022 Table 4 shows sequence parallelism saving 0.5 ms forward but
only 0.1 ms backward, so backward elementwise time is no larger than forward"""
ADAM_BYTES_PER_PARAM = 38
"""HBM traffic of one fused Adam step per parameter: read fp32 master, grad, m, v (16), write
master, m, v (12), write the 16-bit weight (2), plus grad-norm read and zeroing (8)"""


def dp_grad_bytes(precision: str) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron forces fp32 gradient
    accumulation and reduction with bf16 (accumulate_allreduce_grads_in_fp32); with fp16 it keeps
    them in fp16 by default, as FSDP reduces in the parameter dtype."""
    return 2 if precision == "fp16" else 4

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


@lru_cache(maxsize=65536)
def layer_cost(layer: Layer, ctx: Ctx, cluster: Cluster, precision: str, tp_span: Span, cp_span: Span,
               ep_span: Span) -> LayerCost:
    """Forward, backward and recompute time of one layer (formulas in the module docstring)."""
    eff, gpu = cluster.efficiency, cluster.gpu
    peak = gpu.flops(precision)
    w = layer_work(layer, ctx)
    gemm = sum(compute.gemm_time_s(f, i, peak, eff) for f, i in w.gemms)
    attn = compute.gemm_time_s(w.attn_flops, w.attn_intensity, peak, eff) if w.attn_flops else 0.0
    mem = compute.memory_time_s(w.elementwise_bytes, gpu.hbm_Bps, eff)
    core_mem = compute.memory_time_s(w.core_elementwise_bytes, gpu.hbm_Bps, eff)
    fwd = gemm + attn + mem + core_mem
    bwd = 2 * gemm + (FLASH_BWD_FACTOR if ctx.flash else 2.0) * attn + ELEMENTWISE_BWD_FACTOR * (mem + core_mem)
    tp_one = w.tp_collectives * comm.collective_time_s("all_reduce", w.tp_message_bytes, tp_span, cluster)
    tp_one -= min(eff.tp_overlap_fraction * tp_one, gemm)
    # Ring attention (context parallel): cp-1 K/V block exchanges, hidden behind the attention core.
    cp_step = (ctx.cp - 1) * comm.p2p_time_s(w.cp_message_bytes, cp_span.nodes > 1, cluster)
    cp = max(0.0, cp_step - attn) + max(0.0, 2 * cp_step - FLASH_BWD_FACTOR * attn)
    ep_one = w.ep_collectives * comm.collective_time_s("all_to_all", w.ep_message_bytes, ep_span, cluster)
    recompute = {"none": 0.0, "selective": attn + core_mem, "full": fwd + tp_one + ep_one}[ctx.recompute]
    none = layer_work(layer, replace(ctx, recompute="none"))
    return LayerCost(fwd=fwd, bwd=bwd, recompute=recompute, tp=2 * tp_one, cp=cp, ep=2 * ep_one,
                     saved=w.saved.total, saved_main=w.saved.main, saved_none=none.saved.total,
                     params=w.params_local, expert_params=w.expert_params_local,
                     gemm_weights=w.gemm_weight_params)


@lru_cache(maxsize=8)
def _layers(model: ModelSpec):
    return build_layers(model)


def estimate(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, s: Strategy,
             bounds: list[tuple[int, int]] | None = None, paper_accounting: bool = False) -> StepEstimate:
    """Price strategy `s`. `bounds` overrides the even stage split (pp*vpp chunks of layers).
    `paper_accounting` restricts memory to Korthikanti 2022's: 18 bytes per GEMM weight of the
    transformer layers and the saved activations of Table 2, nothing else."""
    check_strategy(s, model, setup)
    layers = _layers(model)
    gpu, eff = cluster.gpu, cluster.efficiency
    peak = gpu.flops(setup.precision)
    m = s.num_microbatches(setup.global_batch)
    grad_bytes = dp_grad_bytes(setup.precision)
    degrees = {"tp": s.tp, "cp": s.cp, "dp": s.dp, "pp": s.pp, "ep": s.ep}
    g = min(cluster.gpus_per_node, setup.gpus)
    spans = {d: span(s.order, degrees, (d,), g) for d in ("tp", "cp", "ep", "pp", "edp")}
    spans["dpcp"] = span(s.order, degrees, ("cp", "dp"), g)
    base = Ctx(micro_batch=s.micro_batch, seq_len=setup.seq_len, tp=s.tp, cp=s.cp, ep=s.ep,
               sp=s.sequence_parallel, flash=setup.attention == "flash", dropout=model.dropout)

    def t_gemm(flops, inten):
        return compute.gemm_time_s(flops, inten, peak, eff)

    def t_mem(n_bytes):
        return compute.memory_time_s(n_bytes, gpu.hbm_Bps, eff)

    def coll(kind, n_bytes, group):
        return comm.collective_time_s(kind, n_bytes, spans[group], cluster)

    memo: dict = {}

    def cost_of(layer, mode):
        key = (id(layer), mode)
        if key not in memo:
            memo[key] = layer_cost(layer, _with(base, recompute=mode), cluster, setup.precision,
                                   spans["tp"], spans["cp"], spans["ep"])
        return memo[key]

    bounds = bounds or pipeline.split_layers(len(layers), s.pp, s.vpp)
    per_stage = pipeline.stage_chunks(bounds, s.pp)
    emb, head = embedding_work(model, base), head_work(model, base)
    p2p = 0.0
    if s.pp > 1 and not model.is_graph:
        # Megatron's scatter/gather optimisation (Narayanan et al. 2021 §4.1): each tp rank sends
        # 1/tp of the boundary activation and the receivers all-gather it over NVLink.
        msg = setup.seq_len / s.cp * s.micro_batch * model.hidden * 2 / s.tp
        p2p = 2 * s.vpp * comm.p2p_time_s(msg, spans["pp"].nodes > 1, cluster)
    elif s.pp > 1:
        msg = max(l.explicit[3] for l in layers) * s.micro_batch
        p2p = 2 * comm.p2p_time_s(msg, spans["pp"].nodes > 1, cluster)

    rows, stages = [], []
    for i, chunks in enumerate(per_stage):
        idx = [j for a, b in chunks for j in range(a, b)]
        n_rec = len(idx) if s.recompute_layers is None else min(s.recompute_layers, len(idx))
        modes = [s.recompute if (s.recompute != "full" or k < n_rec) else "none" for k in range(len(idx))]
        costs = [cost_of(layers[j], mode) for j, mode in zip(idx, modes)]
        comp = sum(c.fwd + c.bwd for c in costs)
        rec = sum(c.recompute for c in costs)
        tp_t = sum(c.tp for c in costs)
        dense = sum(c.params for c in costs)
        expert = sum(c.expert_params for c in costs)
        saved = sum(c.saved for c in costs)
        if i == 0:
            comp += t_mem(emb.elementwise_bytes)
            tp_t += coll("all_reduce", emb.tp_message_bytes, "tp")
            dense += emb.params_local
            saved += emb.saved_bytes
        last_saved = 0.0
        if i == s.pp - 1:
            comp += 3 * t_gemm(head.gemm_flops, head.gemm_intensity) + t_mem(head.elementwise_bytes)
            tp_t += 2 * coll("all_reduce", head.tp_message_bytes or emb.tp_message_bytes, "tp")
            dense += head.params_local if (s.pp > 1 or not model.tied_embeddings) else head.params_local - model.vocab * model.hidden / s.tp
            last_saved = head.saved_bytes
        row = dict(compute=comp, recompute=rec, tp_comm=tp_t, cp_comm=sum(c.cp for c in costs),
                   ep_comm=sum(c.ep for c in costs), pp_comm=p2p,
                   fwd=sum(c.fwd for c in costs), bwd=sum(c.bwd for c in costs))
        # ZeRO-3 gathers the stage's weights for forward and backward and scatters its gradients
        # every micro-batch, hidden behind that micro-batch's compute where possible.
        z3 = 0.0
        if s.zero >= 3:
            gather = 2 * coll("all_gather", memory.WEIGHT_BYTES * dense * s.dp * s.cp, "dpcp")
            scatter = coll("reduce_scatter", grad_bytes * dense * s.dp * s.cp, "dpcp")
            z3 = max(0.0, gather + scatter - eff.dp_overlap_fraction * comp)
        row["z3"] = z3
        row["t"] = comp + rec + tp_t + row["cp_comm"] + row["ep_comm"] + p2p + z3
        rows.append(row)

        inflight = pipeline.in_flight(i, s.pp, m, s.vpp)
        if paper_accounting:
            gemm_w = sum(c.gemm_weights for c in costs) / s.tp
            mem = memory.MemoryBreakdown(weights=memory.WEIGHT_BYTES * gemm_w, grads=memory.GRAD_BYTES * gemm_w,
                                         optimizer=memory.OPTIMIZER_BYTES * gemm_w,
                                         activations=inflight * sum(c.saved_main for c in costs), other=0.0)
        else:
            shards_dense = s.dp * s.cp
            shards_expert = max(1, s.dp * s.cp // s.ep)
            wd, gd, od = memory.state_bytes(dense, s.zero, shards_dense)
            we, ge, oe = memory.state_bytes(expert, s.zero, shards_expert)
            transient = max((c.saved_none - c.saved for c in costs if c.recompute and s.recompute == "full"), default=0.0)
            acts = inflight * saved + last_saved + transient
            prefetch = 2 * memory.WEIGHT_BYTES * max((c.params + c.expert_params for c in costs), default=0.0) if s.zero >= 3 else 0.0
            mem = memory.MemoryBreakdown(weights=wd + we, grads=gd + ge, optimizer=od + oe, activations=acts,
                                         other=memory.other_bytes(acts, prefetch))
        stages.append(StageEstimate(index=i, chunks=tuple(chunks), recompute_layers=n_rec if s.recompute == "full" else 0,
                                    time_per_microbatch_s=row["t"], memory=mem))
        row["dense"], row["expert"] = dense, expert

    pipe_s, bubble_s = pipeline.pipeline_time_s([r["t"] for r in rows], m, s.vpp)
    dp_exposed, opt_s = 0.0, 0.0
    for i, r in enumerate(rows):
        grad = coll("all_reduce" if s.zero == 0 else "reduce_scatter", grad_bytes * r["dense"], "dpcp")
        grad += coll("all_reduce" if s.zero == 0 else "reduce_scatter", grad_bytes * r["expert"], "edp")
        gather = 0.0
        if 1 <= s.zero <= 2:
            gather = coll("all_gather", memory.WEIGHT_BYTES * r["dense"], "dpcp")
            gather += coll("all_gather", memory.WEIGHT_BYTES * r["expert"], "edp")
        if s.zero >= 3:
            grad = gather = 0.0
        if s.dp_overlap:
            per_mb_bwd = r["bwd"] / max(1, 1)
            exposed = max(0.0, grad - (eff.dp_overlap_fraction + i) * per_mb_bwd)
            exposed += max(0.0, gather - eff.dp_overlap_fraction * r["fwd"])
        else:
            exposed = grad + gather
        dp_exposed = max(dp_exposed, exposed)
        shards = s.dp * s.cp if s.zero >= 1 else 1
        eshards = max(1, s.dp * s.cp // s.ep) if s.zero >= 1 else 1
        opt_s = max(opt_s, t_mem(ADAM_BYTES_PER_PARAM * (r["dense"] / shards + r["expert"] / eshards)))

    worst = max(range(len(rows)), key=lambda i: rows[i]["t"])
    w = rows[worst]
    breakdown = {k: m * w[k] for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm")}
    breakdown["bubble"] = bubble_s
    breakdown["dp_comm_exposed"] = dp_exposed + m * w["z3"]
    breakdown["optimizer"] = opt_s
    step_s = pipe_s + dp_exposed + opt_s

    flops = model_flops_per_sequence(model, setup.seq_len) * setup.global_batch
    peak_stage = max(stages, key=lambda st: st.memory.total)
    return StepEstimate(
        step_time_s=step_s, breakdown_s={k: breakdown[k] for k in BREAKDOWN_KEYS}, memory=peak_stage.memory,
        stages=tuple(stages), model_flops_per_step=flops,
        tokens_per_s=setup.global_batch * setup.seq_len / step_s,
        model_tflops_per_gpu=flops / step_s / setup.gpus / 1e12, mfu=flops / step_s / setup.gpus / peak,
        fits=peak_stage.memory.total <= gpu.memory_bytes, capacity_bytes=gpu.memory_bytes,
        tiers=tiers(s.order, degrees, g))


def model_flops_per_sequence(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of one training sequence: 3x the forward (backward = 2x forward) of every layer
    with attention scores counted in full, plus the LM head (Korthikanti 2022 App. A; DESIGN.md)."""
    ctx = Ctx(micro_batch=1, seq_len=seq_len)
    fwd = sum(layer_work(l, ctx).model_flops for l in _layers(model)) + head_work(model, ctx).model_flops
    return 3 * fwd


def _with(ctx: Ctx, **changes) -> Ctx:
    return replace(ctx, **changes)
