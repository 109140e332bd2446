"""LayerGraph: the model as an ordered chain of layers, each priced as a `Work` record.

A `Work` holds, for ONE micro-batch on ONE GPU, the forward FLOPs of every GEMM with its
arithmetic intensity, the attention-core FLOPs, the bytes moved by memory-bound ops, the
messages of the collectives the layer issues, the activation bytes it saves for backward, and
its parameters. The embedding and the LM head are not layers of the chain: they sit on the first
and last pipeline stage (`embedding_work`, `head_work`).

Sources: FLOPs per GEMM are 2*m*n*k. Saved activations follow Korthikanti et al. 2022 (§4.1,
Table 2): attention 11*s*b*h + 5*a*s^2*b, MLP 19*s*b*h, two LayerNorms 4*s*b*h with 16-bit
values and 1-byte dropout masks, of which 10*s*b*h stay replicated under tensor parallelism
unless sequence parallelism shards them. They are derived here per tensor (GQA, SwiGLU, MoE,
MLA, flash attention) so that the paper's totals come out for the GPT layer it describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

from planner.spec.model import ModelSpec
from planner.spec.training import DEFAULT_MODULES

ACT_BYTES = 2
"""bytes of a 16-bit activation element"""
MASK_BYTES = 1
"""PyTorch keeps dropout masks as bool (1 byte)"""
FP8_BYTES = 1
"""bytes of an fp8 element (its per-tensor or per-block scales are left out: 4 bytes a tensor, or
1 a 32-element block under MXFP8, at most 3 % more)"""


@dataclass(frozen=True, slots=True)
class Ctx:
    """The shape one micro-batch takes on one GPU."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    sp_saves_gathered: bool = False
    """under sequence parallelism the column-parallel GEMMs keep their all-gathered input whole for
    the weight gradient, not the sequence shard re-gathered in backward
    (runtimes.RuntimeRules.sp_saves_gathered): the norm outputs then take tp times the shard"""
    recompute: str = "none"
    """recompute mode of this layer: none | selective (the `modules`) | op (torchtitan's per-op
    policy, op_policy) | full"""
    modules: tuple[str, ...] = DEFAULT_MODULES
    """what 'selective' recomputes (spec/training.RECOMPUTE_MODULES, TrainingSetup
    .selective_modules): what they drop is _selective_discarded, what they run again
    Work.selective_recomputed, selective_bytes and selective_tp"""
    flash: bool = True
    dropout: float = 0.0
    folded: bool = False
    """expert layers without tensor parallelism (MoE parallel folding, TrainingSetup.moe_folding):
    each rank routes its own 1/tp of the tokens to whole experts"""
    expert_tp_gather: bool = False
    """experts that keep tp get every routed token of their tp group on each of its ranks and send
    their outputs back from each (runtimes.RuntimeRules.expert_tp_gather): Work
    .tp_expert_message_bytes"""
    quantised_inputs: bool = False
    """fp8 GEMM inputs kept for backward as their 1-byte copies (runtimes.RuntimeRules
    .fp8_saves_quantised under fp8), not in 16 bits"""
    eager_swiglu: bool = False
    """SwiGLU runs as eager silu and mul (runtimes.RuntimeRules.eager_swiglu): the mul keeps silu's
    output for its backward, beside both GEMM outputs (_eager_saved), and each op moves its own
    bytes (EAGER_SWIGLU_BYTES, _eager_traffic)"""
    eager_norm_bytes: tuple[float, float] | None = None
    """(forward, backward) HBM bytes per element of RMSNorm where the runtime runs it as eager ops on
    an fp32 cast (runtimes.RuntimeRules.eager_norm_bytes; None: fused): _eager_traffic counts the
    traffic, _eager_saved what it keeps (the fp32 copy of its input and its normalised 16-bit
    value, not the 16-bit input)"""
    eager_rope_bytes: tuple[float, float] | None = None
    """(forward, backward) HBM bytes per rotated element (of the queries and the keys) where the
    runtime applies rotary embeddings as eager ops on an fp32 complex view
    (runtimes.RuntimeRules.eager_rope_bytes; None: fused, ROPE_FUSED_BYTES)"""
    expanded_kv: bool = False
    """K and V are expanded to every query head before the attention kernel
    (runtimes.RuntimeRules.expanded_kv), which then keeps them at the query heads' count"""
    cp_expanded_kv: bool = False
    """context parallelism moves K and V expanded to every query head
    (runtimes.RuntimeRules.cp_expanded_kv): Work.cp_message_bytes at the query heads' count"""
    cp_rotation: str = "ring"
    """how context parallelism moves K and V between its ranks (runtimes.RuntimeRules.cp_rotation;
    cost/step.cp_exposed_s prices it)"""
    moe_imbalance: float = 1.0
    """the token-expert pairs the most loaded expert-parallel rank receives over a balanced
    share (TrainingSetup.moe_imbalance): that rank's expert GEMMs, permutes, all-to-all bytes and
    kept activations, which every rank waits for"""


def _imbalance(ctx: Ctx) -> float:
    """The most loaded expert-parallel rank's share of token-expert pairs over a balanced one: the
    setup's moe_imbalance, at most ep (that rank then receives every pair; without expert
    parallelism one rank holds all experts and no rank waits for another)."""
    return min(ctx.moe_imbalance, float(ctx.ep))


@dataclass(frozen=True, slots=True)
class Saved:
    """Activation bytes saved for backward, by term; `aux` terms (norm statistics, attention
    log-sum-exp) are real but outside Korthikanti's accounting."""

    main: float
    aux: float

    @property
    def total(self) -> float:
        return self.main + self.aux


@dataclass(frozen=True, slots=True)
class Work:
    gemms: tuple[tuple[float, float], ...]
    """(forward FLOPs, arithmetic intensity) per GEMM, per GPU"""
    attn_flops: float
    """attention-core forward FLOPs executed per GPU (causal flash skips the masked half)"""
    attn_intensity: float
    elementwise_bytes: float
    """forward HBM traffic of memory-bound ops per GPU, attention core excluded"""
    core_elementwise_bytes: float
    """forward HBM traffic of the eager attention core (softmax, dropout at s x s); 0 with flash"""
    tp_message_bytes: float
    """payload of each tensor-parallel collective (all-reduce, or all-gather + reduce-scatter)"""
    tp_collectives: int
    """tensor-parallel collectives in forward (as many again in backward)"""
    cp_message_bytes: float
    """the K and V of this rank's sequence block, the block context parallelism passes between its
    ranks (at the KV heads' count, or the query heads' where Ctx.cp_expanded_kv)"""
    ep_message_bytes: float
    """payload of each expert all-to-all (dispatch and combine) per GPU"""
    ep_collectives: int
    saved: Saved
    saved_full_recompute: float
    """bytes saved when the layer is fully recomputed (its input only)"""
    params_local: float
    """parameters held by this GPU for the layer (dense sharded by tp; experts by ep*tp)"""
    expert_params_local: float
    gemm_weight_params: float
    """parameters in GEMM weight matrices, unsharded (Korthikanti's 12*h^2 per layer)"""
    op_recomputed: tuple[float, ...]
    """per GEMM of `gemms`, the share of its forward FLOPs the per-op policy recomputes (op_policy)"""
    model_flops: float
    """forward model FLOPs of the micro-batch, whole layer, not sharded (MFU numerator)"""
    eager_bytes: tuple[float, float] = (0.0, 0.0)
    """(forward, backward) HBM traffic per GPU of the memory-bound ops the runtime runs as eager
    PyTorch ops (_eager_traffic): norms, rotary embeddings, SwiGLU, the K and V expansion"""
    eager_fused_bytes: float = 0.0
    """the forward traffic elementwise_bytes counts for those same ops (their fused kernels)"""
    quant_elements: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """what an fp8 recipe quantises per GPU (cost/compute.quant_time_s): the forward GEMM inputs no
    norm writes, those a norm writes (a norm kernel can emit them quantised), the output
    gradients backward quantises; the router's GEMM stays in high precision"""
    backward_bytes: float = 0.0
    """what the layer's backward holds at once beyond what its forward saved, at its largest: the
    gradients of its MLP's activation, MLP_BACKWARD_GRADS ffn-wide 16-bit tensors (_mlp_backward)"""
    selective_recomputed: tuple[float, ...] = ()
    """per GEMM of `gemms`, the share of its forward the selective modules recompute beyond the
    attention core (Ctx.modules: MLA's up-projections under 'mla_up_proj', a dense MLP's under
    'mlp'); () where none does"""
    selective_bytes: float = 0.0
    """forward HBM traffic per GPU of the memory-bound ops the selective modules run again: the
    rotary embedding ('mla_up_proj'), a dense MLP's activation and norm ('mlp'), the experts'
    activation ('moe_act'), the norms that are modules of their own ('layernorm')"""
    selective_tp: float = 0.0
    """forward tensor-parallel collectives the selective modules run again (a dense MLP's under
    'mlp' with tp > 1), of the tp_collectives"""
    selective_quant: tuple[float, float] = (0.0, 0.0)
    """(plain, norm-fed) GEMM-input elements per GPU the selective modules quantise again under fp8
    (_selective_work), in the terms of quant_elements' first two"""
    tp_expert_message_bytes: float = 0.0
    """payload of the experts' own tensor-parallel collective where they keep tp (not folded) and
    the runtime's dispatcher gathers for them (Ctx.expert_tp_gather): every routed token of the tp
    group before the expert GEMMs, their outputs reduce-scattered after, expert_tokens x hidden
    x ACT_BYTES; one such pair in forward, one in backward"""


MLP_BACKWARD_GRADS = {"swiglu": 3, "gelu": 2, "relu": 2}
"""ffn-wide gradients an MLP's backward holds at once, per activation: a gated MLP the gradient of
the activation's output and, from it, those of the gate and the up projection (torch's own
silu(gate) * up: aten mul's and silu_backward's outputs; a fused SwiGLU backward reads the first
and writes the other two alike); ungated, the output's gradient and the pre-activation's. Counted
exactly, weights frozen, on an eager torchtitan block and a GPT block (torch's gelu) on CPU with
torch's memory tracker (tests/test_torch_oracle.py); relu taken as gelu, its backward alike"""

NORM_FUSED_BYTES = 2 * ACT_BYTES
"""HBM traffic per element of a fused norm kernel's forward: read the input, write the output"""
ROPE_FUSED_BYTES = 2 * ACT_BYTES
"""per rotated element (of the queries and the keys), a fused rotary kernel's forward: read, write"""
SWIGLU_FUSED_BYTES = 3 * ACT_BYTES
"""per ffn element, a fused SwiGLU's forward: read the gate and the up projection, write the product"""
EAGER_SWIGLU_BYTES = (10.0, 18.0)
"""(forward, backward) HBM bytes per ffn element of eager silu(gate) * up in 16 bits: forward silu
(2 read, 2 written) and the mul (4, 2); backward the mul's two gradients (4, 2 each) and
silu_backward (4, 2). Counted op by op with PyTorch's dispatcher on CPU in
tests/test_torch_oracle.py"""


def intensity(m: float, n: float, k: float) -> float:
    """FLOP per element moved of an (m x k) @ (k x n) GEMM: m*n*k / (m*k + k*n + m*n)."""
    return m * n * k / (m * k + k * n + m * n)


@dataclass(frozen=True, slots=True)
class Linear:
    k: int
    n: int
    split: str
    """'col' (output sharded by tp), 'row' (input sharded by tp) or 'none'"""
    norm_fed: bool = False
    """its input is a norm's output, which the norm kernel can write quantised (Megatron-Core's
    Transformer Engine specs fuse the norm into the linear: TELayerNormColumnParallelLinear for
    the QKV, a dense layer's first MLP linear and MLA's up-projections behind their latent norms;
    MLA's down-projections and an MoE layer's MLPs read a standalone norm's output)"""
    parts: tuple[int, ...] = ()
    """the output widths of the separate linears this one fuses, in the order a runtime that keeps
    them apart calls them (torchtitan: wq, wk, wv; SwiGLU's w1 then w3); () for one linear"""


@dataclass(frozen=True, slots=True)
class Layer:
    """One transformer layer (or one explicit graph layer: then `explicit` is set)."""

    hidden: int
    q_heads: int
    kv_heads: int
    d_qk: int
    d_v: int
    attn_linears: tuple[Linear, ...]
    mlp_linears: tuple[Linear, ...]
    """dense MLP, or the shared experts of an MoE layer"""
    ffn_act: str
    ffn_width: int
    """sum of the intermediate widths of the dense MLP / shared experts"""
    experts: int = 0
    top_k: int = 0
    expert_groups: int = 0
    """group-limited routing (MoeSpec.groups, group_topk): 0 for none"""
    group_topk: int = 0
    expert_linears: tuple[Linear, ...] = ()
    norm: str = "layernorm"
    mla: bool = False
    """multi-head latent attention (DeepSeek): its queries, keys and values come from
    up-projections of latents (the attention linears split by column), which 'mla_up_proj'
    recomputes"""
    rope: bool = True
    causal: bool = True
    bias: bool = False
    explicit: tuple | None = None
    """(fwd_flops, params, saved_bytes, output_bytes) per sample of an explicit graph layer"""
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # layers key the cost model's caches: hash the nested linears once, not on every lookup
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare)))

    def __hash__(self) -> int:
        return self._hash


def _mlp(hidden: int, width: int, act: str, norm_fed: bool = False) -> tuple[Linear, ...]:
    if act == "swiglu":
        return (Linear(hidden, 2 * width, "col", norm_fed, (width, width)), Linear(width, hidden, "row"))
    return (Linear(hidden, width, "col", norm_fed), Linear(width, hidden, "row"))


def build_layers(spec: ModelSpec) -> tuple[Layer, ...]:
    if spec.is_graph:
        return tuple(Layer(hidden=0, q_heads=0, kv_heads=0, d_qk=0, d_v=0, attn_linears=(), mlp_linears=(),
                           ffn_act="none", ffn_width=0,
                           explicit=(g.fwd_flops, g.params, g.saved_bytes, g.output_bytes))
                     for i, g in enumerate(spec.graph))
    h, a = spec.hidden, spec.heads
    if spec.mla is not None:
        m = spec.mla
        d_qk, d_v, kv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim, a
        q = ((Linear(h, m.q_lora_rank, "none"), Linear(m.q_lora_rank, a * d_qk, "col", True)) if m.q_lora_rank
             else (Linear(h, a * d_qk, "col"),))
        attn = q + (Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, "none"),
                    Linear(m.kv_lora_rank, a * (m.qk_nope_head_dim + d_v), "col", True),
                    Linear(a * d_v, h, "row"))
    else:
        d_qk = d_v = spec.head_dim
        kv = spec.kv_heads
        attn = (Linear(h, (a + 2 * kv) * d_qk, "col", True, (a * d_qk, kv * d_qk, kv * d_qk)),
                Linear(a * d_qk, h, "row"))
    layers, kinds = [], {}
    for i in range(spec.layers):
        common = dict(hidden=h, q_heads=a, kv_heads=kv, d_qk=d_qk, d_v=d_v, attn_linears=attn,
                      ffn_act=spec.ffn_act, norm=spec.norm, mla=spec.mla is not None,
                      rope=spec.position_embedding == "rope",
                      causal=spec.causal, bias=spec.linear_bias)
        if spec.is_moe_layer(i):
            moe = spec.moe
            shared = moe.shared_experts * moe.shared_ffn_hidden
            layer = Layer(**common, mlp_linears=_mlp(h, shared, spec.ffn_act) if shared else (),
                          ffn_width=shared, experts=moe.experts, top_k=moe.top_k,
                          expert_groups=moe.groups, group_topk=moe.group_topk,
                          expert_linears=_mlp(h, moe.expert_ffn_hidden, spec.ffn_act))
        else:
            layer = Layer(**common, mlp_linears=_mlp(h, spec.ffn_hidden, spec.ffn_act, norm_fed=True),
                          ffn_width=spec.ffn_hidden)
        # identical layers share one object, so per-layer prices are computed once per kind
        layers.append(kinds.setdefault(layer, layer))
    return tuple(layers)


def _linear_params(linears: tuple[Linear, ...], bias: bool) -> tuple[float, float]:
    """(weights, biases) of a list of linears, unsharded."""
    return sum(l.k * l.n for l in linears), (sum(l.n for l in linears) if bias else 0)


def _local(linears: tuple[Linear, ...], tp: int, bias: bool) -> float:
    """Parameters of the linears one tp rank holds (row-parallel biases are replicated)."""
    total = 0.0
    for l in linears:
        shard = tp if l.split != "none" else 1
        total += l.k * l.n / shard + (l.n / (tp if l.split == "col" else 1) if bias else 0)
    return total


@lru_cache(maxsize=4096)
def _layer_weights(layer: Layer) -> tuple[float, float, float, float]:
    """(weights, biases) of a layer's dense linears (attention and MLP), then of one expert's."""
    return (*_linear_params(layer.attn_linears + layer.mlp_linears, layer.bias),
            *_linear_params(layer.expert_linears, layer.bias))


@lru_cache(maxsize=4096)
def _dense_local(layer: Layer, tp: int) -> float:
    """_local of a layer's dense linears (attention and MLP)."""
    return _local(layer.attn_linears + layer.mlp_linears, tp, layer.bias)


def layer_params(layer: Layer) -> float:
    """All parameters of a layer: linears (and biases), norms, router, all experts."""
    if layer.explicit is not None:
        return layer.explicit[1]
    w, b, ew, eb = _layer_weights(layer)
    norm = 2 * layer.hidden * (2 if layer.norm == "layernorm" else 1)
    router = layer.hidden * layer.experts
    return w + b + norm + layer.experts * (ew + eb) + router


def _expert_tp(ctx: Ctx) -> int:
    """The experts' tensor parallelism: tp, or 1 under MoE parallel folding (Ctx.folded)."""
    return 1 if ctx.folded else ctx.tp


@lru_cache(maxsize=65536)
def layer_work(layer: Layer, ctx: Ctx) -> Work:
    """Forward work of one layer for one micro-batch on one GPU (formulas in the module doc)."""
    if layer.explicit is not None:
        return _explicit_work(layer, ctx)
    b, s, tp, cp = ctx.micro_batch, ctx.seq_len, ctx.tp, ctx.cp
    h = layer.hidden
    tokens = b * s / cp
    seq_shard = tp if ctx.sp else 1
    rep = tokens * h / seq_shard
    q_local = layer.q_heads / tp
    kv_local = max(layer.kv_heads / tp, 1.0)
    has_dropout = ctx.dropout > 0

    gemms = []
    quant = [0.0, 0.0, 0.0]  # Work.quant_elements
    inputs = []  # each dense linear's input elements, quantised under fp8
    for l in layer.attn_linears + layer.mlp_linears:
        n = l.n / tp if l.split == "col" else l.n
        k = l.k / tp if l.split == "row" else l.k
        gemms.append((2 * tokens * n * k, intensity(tokens, n, k)))
        inputs.append(tokens * k / (tp if ctx.sp and l.split == "col" else 1))
        quant[1 if l.norm_fed else 0] += inputs[-1]
        quant[2] += tokens * n / (tp if ctx.sp and l.split == "row" else 1)
    expert_inputs = []
    expert_tokens = 0.0
    etp = _expert_tp(ctx)
    if layer.experts:
        # Balanced routing: each GPU of an expert-parallel group processes tokens*top_k*etp/tp
        # token-expert pairs, spread over its experts/ep local experts, their weights sharded by
        # the experts' tensor parallelism etp (tp, or 1 when folded: the same FLOPs a GPU); the
        # most loaded rank moe_imbalance times that, and every rank waits for it.
        expert_tokens = tokens * layer.top_k * _imbalance(ctx)
        routed = expert_tokens * etp / tp
        per_expert = max(routed * ctx.ep / layer.experts, 1.0)
        for l in layer.expert_linears:
            n = l.n / etp if l.split == "col" else l.n
            k = l.k / etp if l.split == "row" else l.k
            gemms.append((2 * routed * n * k, intensity(per_expert, n, k)))
            expert_inputs.append(routed * k)
            quant[0] += expert_inputs[-1]
            quant[2] += routed * n
        gemms.append((2 * tokens * h * layer.experts, intensity(tokens, layer.experts, h)))

    # Attention core: scores 2*s*s*d_qk and context 2*s*s*d_v per head and sequence.
    kv_len = s
    full_core = 2 * b * (s / cp) * kv_len * q_local * (layer.d_qk + layer.d_v)
    skip = 0.5 if (ctx.flash and layer.causal) else 1.0
    attn_flops = full_core * skip
    attn_int = 1.0 / (2.0 / s + 1.0 / layer.d_qk)
    score_elems = b * q_local * (s / cp) * kv_len

    # Memory-bound ops (bytes read + written, forward).
    norm_elems = 2 * rep  # the layer's two norms
    norm_rw = NORM_FUSED_BYTES * norm_elems
    bias_dropout_add = 2 * (3 * ACT_BYTES + (MASK_BYTES if has_dropout else 0)) * rep
    act_width = (layer.ffn_width + layer.top_k * _imbalance(ctx)
                 * (layer.expert_linears[0].n // (2 if layer.ffn_act == "swiglu" else 1) if layer.experts else 0))
    act_elems = tokens * act_width / tp
    act_rw = (SWIGLU_FUSED_BYTES if layer.ffn_act == "swiglu" else 2 * ACT_BYTES) * act_elems
    rotated = tokens * (q_local + kv_local) * layer.d_qk if layer.rope else 0.0  # the local queries and keys
    rope_rw = ROPE_FUSED_BYTES * rotated
    softmax_rw = 0.0
    if not ctx.flash:
        softmax_rw = score_elems * (2 * ACT_BYTES + ((2 * ACT_BYTES + MASK_BYTES) if has_dropout else 0))
    permute_rw = 2 * 2 * ACT_BYTES * expert_tokens * h / tp if layer.experts else 0.0
    elementwise = norm_rw + bias_dropout_add + act_rw + rope_rw + permute_rw

    saved = _saved(layer, ctx, tokens, rep, q_local, kv_local, score_elems, expert_tokens)
    dense_act_rw = ((SWIGLU_FUSED_BYTES if layer.ffn_act == "swiglu" else 2 * ACT_BYTES)
                    * tokens * layer.ffn_width / tp)
    selective = _selective_work(layer, ctx, len(gemms), rep, rope_rw, dense_act_rw, act_rw - dense_act_rw, inputs,
                                expert_inputs)
    expanded = tokens * (q_local + kv_local) * (layer.d_qk + layer.d_v) if q_local > kv_local else 0.0
    eager_fwd, eager_bwd, eager_fused = _eager_traffic(layer, ctx, norm_elems, rotated, act_elems, expanded)
    # the per-op policy recomputes its uncounted matmuls whole: the experts' grouped GEMMs and the router's
    op_recomputed = op_policy(layer)[0] + (1.0,) * (len(gemms) - len(layer.attn_linears + layer.mlp_linears))
    params_local = _dense_local(layer, tp) + 2 * h * (2 if layer.norm == "layernorm" else 1) + h * layer.experts
    dense_w, _, ew, eb = _layer_weights(layer)
    expert_local_all = layer.experts * (ew + eb) / (etp * ctx.ep)
    gemm_weights = dense_w + layer.experts * ew

    model_flops = (2 * b * s * (dense_w + layer.top_k * ew + h * layer.experts)
                   + 2 * b * s * s * layer.q_heads * (layer.d_qk + layer.d_v))
    return Work(
        gemms=tuple(gemms), attn_flops=attn_flops, attn_intensity=attn_int, elementwise_bytes=elementwise,
        core_elementwise_bytes=softmax_rw,
        tp_message_bytes=tokens * h * ACT_BYTES if tp > 1 else 0.0,
        # attention's, the dense MLP's (a MoE layer's shared experts'), and an expert MLP's that
        # keeps tp at tokens x hidden where the runtime's dispatcher does not gather for it (else
        # its gather is tp_expert_message_bytes)
        tp_collectives=(0 if tp == 1 else 1 + (1 if layer.mlp_linears or not layer.experts else 0)
                        + (1 if layer.experts and etp > 1 and not ctx.expert_tp_gather else 0)),
        tp_expert_message_bytes=(expert_tokens * h * ACT_BYTES if layer.experts and etp > 1 and ctx.expert_tp_gather
                                 else 0.0),
        cp_message_bytes=(2 * b * (s / cp) * (q_local if ctx.cp_expanded_kv else kv_local) * layer.d_qk * ACT_BYTES
                          if cp > 1 else 0.0),
        ep_message_bytes=expert_tokens * h * ACT_BYTES / tp if layer.experts else 0.0,
        ep_collectives=2 if layer.experts else 0,
        saved=saved, saved_full_recompute=ACT_BYTES * rep,
        params_local=params_local, expert_params_local=expert_local_all,
        gemm_weight_params=gemm_weights, op_recomputed=op_recomputed, model_flops=model_flops,
        eager_bytes=(eager_fwd, eager_bwd), eager_fused_bytes=eager_fused, quant_elements=tuple(quant),
        backward_bytes=_mlp_backward(layer, tokens, expert_tokens, tp), selective_recomputed=selective[0],
        selective_bytes=selective[1], selective_tp=selective[2], selective_quant=selective[3])


def _standalone_norms(layer: Layer) -> int:
    """The layer's norms that are modules of their own rather than fused into the linear they feed
    (Linear.norm_fed): an attention norm whose first linear it does not feed fused (MLA's input
    norm, which its down-projections read), and an MoE layer's pre-MLP norm (its router, experts
    and shared experts read it). Megatron-Core's Transformer Engine specs: TENorm for those,
    IdentityOp where the norm is fused into TELayerNormColumnParallelLinear."""
    attn = bool(layer.attn_linears) and not layer.attn_linears[0].norm_fed
    mlp = bool(layer.experts) or (bool(layer.mlp_linears) and not layer.mlp_linears[0].norm_fed)
    return int(attn) + int(mlp)


def _applied(layer: Layer, modules: tuple[str, ...]) -> frozenset[str]:
    """The selective modules that act on this layer (megatron-core at Megatron-LM 000c4ac):
    core_attn on every layer, mla_up_proj on MLA's, mlp on those without experts
    (transformer_layer.py sets recompute_mlp only where the MLP is no MoELayer), moe_act on those
    with experts, layernorm where a norm is a module of its own (_standalone_norms)."""
    acts = {"core_attn": True, "mla_up_proj": layer.mla, "mlp": not layer.experts and bool(layer.mlp_linears),
            "moe_act": bool(layer.experts), "layernorm": _standalone_norms(layer) > 0}
    return frozenset(m for m in modules if acts[m])


def _norm_stats_bytes(layer: Layer, ctx: Ctx, tokens: float) -> float:
    """The fp32 statistics one norm keeps for its backward: mean and rstd (LayerNorm) or rstd
    (RMSNorm) per token, of the sequence shard under sequence parallelism."""
    return (8 if layer.norm == "layernorm" else 4) * tokens / (ctx.tp if ctx.sp else 1)


def _selective_work(layer: Layer, ctx: Ctx, n_gemms: int, rep: float, rope_rw: float, dense_act_rw: float,
                    expert_act_rw: float, inputs: list, expert_inputs: list
                    ) -> tuple[tuple[float, ...], float, float, tuple[float, float]]:
    """(Work.selective_recomputed, selective_bytes, selective_tp, selective_quant): what the selective modules
    (Ctx.modules) beyond the attention core run again in backward, forward work per GPU, for
    Megatron-Core at Megatron-LM 000c4ac (transformer_layer.py, multi_latent_attention.py,
    moe/experts.py):
    - mla_up_proj (MLA layers): the up-projections (the attention linears split by column: q up or
      q, kv up) and the rotary embedding (CheckpointWithoutOutput around both);
    - mlp (layers without experts: 'recompute_mlp' only where the MLP is no MoELayer): the MLP's
      GEMMs, its activation, its norm (fused into the first linear, inside the checkpoint) and its
      tp collective pair;
    - moe_act (layers with experts): the experts' activation (CheckpointWithoutOutput);
    - layernorm: each norm that is a module of its own (_standalone_norms).
    Under fp8 each GEMM input they rebuild is quantised again (`inputs`, `expert_inputs`: each dense
    and expert linear's input elements, as layer_work counts them for Work.quant_elements): the
    recomputed linears' inputs (mla_up_proj, mlp), the second expert GEMM's (moe_act: megatron-core
    has it save its original input and quantise it in backward), and the inputs of the linears that
    read a standalone norm (layernorm: the attention linears it feeds, neither fused to a norm nor
    row-parallel, and an MoE layer's shared experts; the router stays in high precision and the
    experts read dispatched tokens)."""
    on = _applied(layer, ctx.modules)
    shares = [1.0 if "mla_up_proj" in on and l.split == "col" else 0.0 for l in layer.attn_linears]
    shares += [1.0 if "mlp" in on else 0.0 for _ in layer.mlp_linears]
    shares += [0.0] * (n_gemms - len(shares))
    n_bytes = 0.0
    if "mla_up_proj" in on:
        n_bytes += rope_rw
    if "mlp" in on:
        n_bytes += dense_act_rw + NORM_FUSED_BYTES * rep
    if "moe_act" in on:
        n_bytes += expert_act_rw
    if "layernorm" in on:
        n_bytes += NORM_FUSED_BYTES * rep * _standalone_norms(layer)
    tp_pairs = 1.0 if "mlp" in on and ctx.tp > 1 else 0.0
    attn = layer.attn_linears
    reads_norm = [False] * len(inputs)  # the linears fed by a standalone norm, whose output layernorm drops
    if "layernorm" in on:
        if attn and not attn[0].norm_fed:
            reads_norm[:len(attn)] = [not l.norm_fed and l.split != "row" for l in attn]
        if layer.experts and layer.mlp_linears:
            reads_norm[len(attn)] = True  # the shared experts' first linear
    plain = fed = 0.0
    for l, share, read, x in zip(attn + layer.mlp_linears, shares, reads_norm, inputs):
        if share or read:
            fed, plain = (fed + x, plain) if l.norm_fed else (fed, plain + x)
    if "moe_act" in on:
        plain += expert_inputs[1]
    return (tuple(shares) if any(shares) else ()), n_bytes, tp_pairs, (plain, fed)


def _selective_discarded(layer: Layer, ctx: Ctx, tokens: float, rep: float, q_local: float, kv_local: float,
                        expert_tokens: float) -> Saved:
    """What the selective modules beyond the attention core (Ctx.modules) keep out of _saved's
    count, per GPU (Megatron-Core at Megatron-LM 000c4ac; `g` as in _saved):
    - mla_up_proj: the queries, keys and values, outputs of the up-projections and the rotary
      embedding, which the attention core saved (the checkpoint discards them once the core has
      run and rebuilds them before its backward);
    - mlp: the MLP's norm output (the first linear's input, g), the first GEMM's output and the
      activation's (the checkpoint keeps only its input, the residual stream _saved counts as the
      norm's input) and that norm's statistics;
    - moe_act: the experts' activation output, the second expert GEMM's input (g; under fp8
      megatron-core has that linear save its original input, which the checkpoint discards);
    - layernorm: each standalone norm's output (g; under fp8 the linears reading it save the
      original, discarded) and its statistics (the norm runs without grad; its input, the
      residual stream, stays)."""
    g = FP8_BYTES if ctx.quantised_inputs else ACT_BYTES
    on = _applied(layer, ctx.modules)
    stats = _norm_stats_bytes(layer, ctx, tokens)
    main = aux = 0.0
    if "mla_up_proj" in on:
        main += ACT_BYTES * tokens * (q_local * layer.d_qk + kv_local * (layer.d_qk + layer.d_v))
    if "mlp" in on:
        per_token_mlp = (2 if layer.ffn_act == "swiglu" else 1) * ACT_BYTES + g
        main += g * _gemm_input(ctx, tokens, layer.hidden, rep) + per_token_mlp * tokens * layer.ffn_width / ctx.tp
        aux += stats
    if "moe_act" in on:
        main += g * expert_tokens * layer.expert_linears[1].k / ctx.tp
    if "layernorm" in on:
        norms = _standalone_norms(layer)
        main += norms * g * _gemm_input(ctx, tokens, layer.hidden, rep)
        aux += norms * stats
    return Saved(main=main, aux=aux)


def _mlp_backward(layer: Layer, tokens: float, expert_tokens: float, tp: int) -> float:
    """Work.backward_bytes: MLP_BACKWARD_GRADS x ACT_BYTES x the widest ffn activation a GPU holds,
    the dense MLP's tokens x ffn_width / tp or the local experts' routed tokens x expert ffn (one
    grouped backward over all of them: Megatron-Core's TEGroupedMLP), expert_tokens x width / tp
    whether the experts keep tp (every routed token, 1/tp of the width) or fold (1/tp of them)."""
    experts = expert_tokens * layer.expert_linears[1].k if layer.experts else 0.0
    return MLP_BACKWARD_GRADS[layer.ffn_act] * ACT_BYTES * max(tokens * layer.ffn_width, experts) / tp


def _lse_bytes(ctx: Ctx, tokens: float, q_local: float) -> float:
    """The fp32 log-sum-exp per token and local head a flash attention kernel keeps for its
    backward (none eager)."""
    return 4 * tokens * q_local if ctx.flash else 0.0


@lru_cache(maxsize=4096)
def op_policy(layer: Layer) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """torchtitan's per-op activation checkpointing of a layer's dense linears (activation_checkpoint
    mode 'selective' with selective_ac_option 'op', its Llama 3 configs' default): the policy
    counts the matmuls a block calls and saves the output of the odd ones, recomputing every
    second (torchtitan 1ea476e9f, 2024-04, parallelisms/parallelize_llama.py no_recompute_list;
    the same rule at 9dec370, e7c0cae and in 0.3.0's distributed/activation_checkpoint.py
    SelectiveAC). Its blocks call wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or the MLP's two
    (Linear.parts splits this graph's fused linears in that order); MoE routers and the experts'
    grouped GEMMs are not counted (0.3.0 forces the router's recomputation; aten._grouped_mm is not
    in its save list). Returns, per dense linear (attn_linears then mlp_linears), the share of
    its output recomputed and the output width it saves, unsharded."""
    count, shares, kept = 0, [], []
    for linear in layer.attn_linears + layer.mlp_linears:
        width = 0
        for part in linear.parts or (linear.n,):
            count += 1
            width += part if count % 2 else 0
        shares.append(1.0 - width / linear.n)
        kept.append(float(width))
    return tuple(shares), tuple(kept)


def _op_saved(layer: Layer, ctx: Ctx, tokens: float, rep: float, q_local: float, score_elems: float,
              expert_tokens: float) -> Saved:
    """What torchtitan's per-op policy (op_policy) keeps of a layer for backward, in 16 bits (its
    Float8Linear saves 16-bit inputs too): the block's input (the checkpoint's), the outputs of the
    matmuls it saves (column-parallel ones sharded by tp, row-parallel ones whole: the partial sums
    before their reduction), the attention kernel's output (with its log-sum-exp) and, eager,
    its probabilities (the math kernel's second output), the reduce-scatters' outputs under
    sequence parallelism, and the expert all-to-alls' outputs where tokens cross ranks (ep > 1);
    everything else (norms, rotary embedding, activation, residual adds, the all-gathers) it
    recomputes."""
    main = ACT_BYTES * rep
    for linear, width in zip(layer.attn_linears + layer.mlp_linears, op_policy(layer)[1]):
        main += ACT_BYTES * tokens * width / (ctx.tp if linear.split == "col" else 1)
    main += ACT_BYTES * tokens * q_local * layer.d_v
    if not ctx.flash:
        main += ACT_BYTES * score_elems
    if ctx.tp > 1 and ctx.sp:
        main += 2 * ACT_BYTES * rep
    if layer.experts and ctx.ep > 1:
        main += 2 * ACT_BYTES * expert_tokens * layer.hidden / ctx.tp
    return Saved(main=main, aux=_lse_bytes(ctx, tokens, q_local))


def _saved(layer: Layer, ctx: Ctx, tokens: float, rep: float, q_local: float, kv_local: float,
           score_elems: float, expert_tokens: float) -> Saved:
    """Activation bytes one layer keeps for backward (Korthikanti 2022 §4.1, per tensor).

    Replicated across tp unless sequence parallel (`rep` elements): both norm inputs and outputs
    (= inputs of the QKV and first MLP GEMMs), two dropout masks; the norm outputs stay whole
    (tokens x hidden) where the runtime keeps the all-gathered GEMM input (ctx.sp_saves_gathered).
    Sharded by tp: Q, K, V, the attention output (input of the output projection), the MLP
    intermediates, and with eager attention the softmax output plus dropout mask and output
    (5*a*s^2*b bytes with dropout). An expert's routed input is its tp group's tokens, gathered
    (whole where the experts keep tp, a 1/tp share under folding: _expert_tp).
    Where the runtime keeps fp8 runs' GEMM inputs as their quantised copies (ctx.quantised_inputs)
    those inputs take `g` = FP8_BYTES an element, else ACT_BYTES: both norm outputs (the QKV and
    first MLP inputs; the norms keep their inputs), the activation's output (the second MLP
    input), an expert's routed input and its activation's output. A flash core keeps the attention
    output in 16 bits for its own backward (D = rowsum(dO * O)), so the output projection's fp8
    copy of it comes on top (it shares the one 16-bit tensor otherwise; eager attention keeps only
    that copy).
    """
    if ctx.recompute == "full":
        return Saved(main=ACT_BYTES * rep, aux=0.0)
    if ctx.recompute == "op":
        return _op_saved(layer, ctx, tokens, rep, q_local, score_elems, expert_tokens)
    d = ctx.dropout > 0
    g = FP8_BYTES if ctx.quantised_inputs else ACT_BYTES
    main = 2 * ACT_BYTES * rep + 2 * g * _gemm_input(ctx, tokens, layer.hidden, rep) + (2 * MASK_BYTES * rep if d else 0)
    main += ACT_BYTES * tokens * (q_local * layer.d_qk + kv_local * (layer.d_qk + layer.d_v))
    kept_by_core = ACT_BYTES if ctx.flash else 0  # eager attention's backward needs its probabilities, not O
    main += (kept_by_core + g if ctx.quantised_inputs else ACT_BYTES) * tokens * q_local * layer.d_v
    if not ctx.flash and not (ctx.recompute == "selective" and "core_attn" in ctx.modules):
        main += score_elems * (ACT_BYTES + ((MASK_BYTES + ACT_BYTES) if d else 0))
    # the first GEMM's output (two halves under SwiGLU) in 16 bits, the activation's output (the
    # second GEMM's input) at g
    per_token_mlp = (2 if layer.ffn_act == "swiglu" else 1) * ACT_BYTES + g
    main += per_token_mlp * tokens * layer.ffn_width / ctx.tp
    if layer.experts:
        expert_width = layer.expert_linears[1].k
        # routed token copies (expert inputs: every token of the experts' tp group, which the
        # dispatcher all-gathers before the expert GEMMs: megatron-core 0.16.0 token_dispatcher.py,
        # MoEAlltoAllTokenDispatcher's gather_from_sequence_parallel_region over expt_tp) and
        # expert outputs, reduce-scattered back to the sequence shard, kept for the routing-weight
        # gradient
        main += (g * _expert_tp(ctx) + ACT_BYTES) * expert_tokens * layer.hidden / ctx.tp
        main += per_token_mlp * expert_tokens * expert_width / ctx.tp
    main += _eager_saved(layer, ctx, tokens, rep, q_local, kv_local, expert_tokens)
    stats = 2 * _norm_stats_bytes(layer, ctx, tokens)  # the layer's two norms
    lse = _lse_bytes(ctx, tokens, q_local)
    if ctx.recompute == "selective":
        dropped = _selective_discarded(layer, ctx, tokens, rep, q_local, kv_local, expert_tokens)
        return Saved(main=main - dropped.main, aux=stats + lse - dropped.aux)
    return Saved(main=main, aux=stats + lse)


def _gemm_input(ctx: Ctx, tokens: float, hidden: int, rep: float) -> float:
    """Elements of a norm's output that the GEMMs reading it keep for backward (the column-parallel
    projections, and a router's or an MLA down-projection's, unsplit, alike): the sequence
    shard `rep` (Megatron-Core's and Transformer Engine's linears under sequence parallelism save
    their local input and all-gather it again in backward), or the all-gathered tokens x hidden
    where ctx.sp_saves_gathered (DTensor's PrepareModuleInput redistributes Shard(1) to Replicate
    before the linears, whose matmul then saves the gathered tensor)."""
    return tokens * hidden if ctx.sp_saves_gathered else rep


EAGER_NORM_EXTRA_BYTES = 4
"""bytes per element an eager RMSNorm keeps beyond a fused kernel's 16-bit input: the fp32 cast
of its input (4, which pow and the rsqrt multiply save) and the normalised value cast back (2,
which the weight multiply saves) in place of the input (2); counted by PyTorch on CPU in
tests/test_torch_oracle.py (torchtitan 9dec370 models/norms.py RMSNorm)"""


def _eager_saved(layer: Layer, ctx: Ctx, tokens: float, rep: float, q_local: float, kv_local: float,
                 expert_tokens: float) -> float:
    """What running parts of a layer as eager PyTorch ops keeps beyond the fused kernels _saved
    counts (without recomputation, or with the attention core's): eager SwiGLU keeps silu's
    output, ACT_BYTES a ffn element (dense and expert); eager RMSNorm EAGER_NORM_EXTRA_BYTES an
    element of both norms; K and V expanded to the query heads keep ACT_BYTES * (q - kv) heads
    each. Each counted by PyTorch's saved-tensor hooks on CPU (tests/test_torch_oracle.py)."""
    extra = 0.0
    if ctx.eager_swiglu and layer.ffn_act == "swiglu":
        extra += ACT_BYTES * tokens * layer.ffn_width / ctx.tp
        if layer.experts:
            extra += ACT_BYTES * expert_tokens * layer.expert_linears[1].k / ctx.tp
    if ctx.eager_norm_bytes and layer.norm == "rmsnorm":
        extra += 2 * EAGER_NORM_EXTRA_BYTES * rep
    if ctx.expanded_kv:
        extra += ACT_BYTES * tokens * (q_local - kv_local) * (layer.d_qk + layer.d_v)
    return extra


def _eager_traffic(layer: Layer, ctx: Ctx, norm_elems: float, rotated: float, act_elems: float,
                   expanded: float) -> tuple[float, float, float]:
    """(forward bytes, backward bytes, the forward bytes elementwise_bytes counts for the same ops)
    of what a runtime runs as eager PyTorch ops, per GPU, over the elements layer_work counts its
    fused kernels on: RMSNorm (Ctx.eager_norm_bytes per normalised element), rotary embeddings
    (Ctx.eager_rope_bytes per rotated element), SwiGLU (EAGER_SWIGLU_BYTES per ffn element, dense
    and expert), and K and V expanded to the query heads (`expanded`: the elements of both K and
    V at the KV heads and at the query heads; a copy reads the one and writes the other forward,
    the gradient's sum back does the reverse: ACT_BYTES each, each way; no fused kernel has it)."""
    ops = []
    if ctx.eager_norm_bytes and layer.norm == "rmsnorm":
        ops.append((*ctx.eager_norm_bytes, NORM_FUSED_BYTES, norm_elems))
    if ctx.eager_rope_bytes:
        ops.append((*ctx.eager_rope_bytes, ROPE_FUSED_BYTES, rotated))
    if ctx.eager_swiglu and layer.ffn_act == "swiglu":
        ops.append((*EAGER_SWIGLU_BYTES, SWIGLU_FUSED_BYTES, act_elems))
    if ctx.expanded_kv:
        ops.append((ACT_BYTES, ACT_BYTES, 0.0, expanded))
    return tuple(sum(op[k] * op[3] for op in ops) for k in range(3))


def _explicit_work(layer: Layer, ctx: Ctx) -> Work:
    fwd_flops, params, saved_bytes, output_bytes = layer.explicit
    b = ctx.micro_batch
    saved = Saved(main=saved_bytes * b, aux=0.0)
    flops = fwd_flops * b
    return Work(gemms=((flops, 1e9),), attn_flops=0.0, attn_intensity=1.0, elementwise_bytes=0.0,
                core_elementwise_bytes=0.0, tp_message_bytes=0.0, tp_collectives=0, cp_message_bytes=0.0, ep_message_bytes=0.0,
                ep_collectives=0, saved=saved, saved_full_recompute=output_bytes * b,
                params_local=params, expert_params_local=0.0, gemm_weight_params=params, op_recomputed=(0.0,),
                model_flops=flops)


@dataclass(frozen=True, slots=True)
class EndWork:
    """Embedding (first stage) or LM head and loss (last stage) for one micro-batch on one GPU."""

    gemm_flops: float
    gemm_intensity: float
    elementwise_bytes: float
    """HBM traffic of memory-bound ops, forward and backward together"""
    saved_bytes: float
    params_local: float
    params_total: float
    model_flops: float
    tp_message_bytes: float
    logits: float = 0.0
    """logit elements per GPU (the head's), which the loss holds bytes of at its peak
    (runtimes.RuntimeRules.loss_bytes_per_logit)"""


def embedding_work(spec: ModelSpec, ctx: Ctx) -> EndWork:
    """Token (and learned position) embedding: a lookup, its dropout mask, a tp all-reduce of the
    vocab-parallel lookup (Megatron VocabParallelEmbedding)."""
    if spec.is_graph:
        return EndWork(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    tokens = ctx.micro_batch * ctx.seq_len / ctx.cp
    rows = spec.vocab + (spec.max_position if spec.position_embedding == "learned" else 0)
    rep = tokens * spec.hidden / (ctx.tp if ctx.sp else 1)
    return EndWork(gemm_flops=0.0, gemm_intensity=1.0, elementwise_bytes=3 * 3 * ACT_BYTES * rep,
                   saved_bytes=MASK_BYTES * rep if ctx.dropout > 0 else 0.0,
                   params_local=spec.vocab * spec.hidden / ctx.tp + (rows - spec.vocab) * spec.hidden,
                   params_total=rows * spec.hidden, model_flops=0.0,
                   tp_message_bytes=tokens * spec.hidden * ACT_BYTES if ctx.tp > 1 else 0.0)


LOGIT_SAVED_BYTES = 4
"""per logit element: Megatron's vocab-parallel cross entropy keeps only the fp32 softmax
(exp_logits) for backward; the head GEMM keeps its input, not the logits (PyTorch agrees). What
the loss holds at its peak is the runtime's (runtimes.RuntimeRules.loss_bytes_per_logit)."""
LOGIT_RW_BYTES = 38 + 14
"""HBM traffic per logit element, forward and backward, of Megatron's (unfused) vocab-parallel
cross entropy in fp32: cast (2+4), max (4), subtract (4+4), exp (4+4), sum (4), normalise (4+4);
backward: scale the softmax by the loss gradient (4+4), cast back (4+2); the target's logit is
gathered and its one-hot subtracted one element a row (megatron-core 0.16.0
tensor_parallel/cross_entropy.py, counted op by op in tests/test_torch_oracle.py)"""
TORCH_LOSS_RW_BYTES = 36
"""the same of PyTorch's cross_entropy on the logits' fp32 cast (torchtitan's loss uncompiled):
the cast (2 + 4), log_softmax (4 + 4), its backward (4 + 4 + 4), nll_loss's backward writing the
gradient (4, a scatter of one element a row), the cast back (4 + 2); nll_loss itself gathers one
element a row (counted op by op in tests/test_torch_oracle.py). A compiled loss moves at most
that"""
LEGACY_LOGIT_RW_BYTES = 60
"""what every loss moved under a version 1 efficiency block (the one-hot update counted as a full
pass), which prices as it always did (spec/efficiency.LegacyEfficiency)"""


@dataclass(frozen=True, slots=True)
class LossKernel:
    """What a fused cross-entropy loss (spec/training.LOSS_FUSIONS) moves and keeps per logit."""

    traffic_bytes: float
    """HBM traffic per logit element, forward and backward (in place of LOGIT_RW_BYTES)"""
    peak_bytes: float
    """bytes per logit element held at the loss's peak (in place of the runtime's
    runtimes.RuntimeRules.loss_bytes_per_logit)"""


LOSSES = {
    # megatron-core 0.16.0 fusions/fused_cross_entropy.py: four torch.compile'd steps (jit_fuser),
    # each one pass over the logits: the fp32 copy and its max (2 + 4), subtract the max and exp
    # in place with the row sums (4 + 4), normalise in place (4 + 4); backward: scale the softmax
    # by the loss gradient in place and cast to bf16 (4 + 4 + 2). It keeps what the unfused loss
    # keeps: the bf16 logits beside their fp32 copy, the softmax in place (6)
    "native": LossKernel(traffic_bytes=6 + 8 + 8 + 10, peak_bytes=6.0),
    # Transformer Engine 2.8 pytorch/triton/cross_entropy.py: online_softmax_kernel reads the bf16
    # logits (2), cross_entropy_kernel reads them again and writes the gradient over them (2 + 2);
    # backward, element_mul_kernel scales it in place by the loss gradient (2 + 2). It keeps the
    # logits' bf16 buffer alone, which holds the gradient (2)
    "te": LossKernel(traffic_bytes=2 + 4 + 4, peak_bytes=2.0),
}


def head_work(spec: ModelSpec, ctx: Ctx) -> EndWork:
    """Final norm, LM-head GEMM 2*b*s*h*V (Korthikanti 2022 App. A), vocab-parallel cross entropy.
    The norm's input and output are kept, the output whole where the head GEMM keeps its
    all-gathered input (_gemm_input)."""
    if spec.is_graph:
        return EndWork(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    tokens = ctx.micro_batch * ctx.seq_len / ctx.cp
    h, v = spec.hidden, spec.vocab
    rep = tokens * h / (ctx.tp if ctx.sp else 1)
    logits = tokens * v / ctx.tp
    norm = 2 * h if spec.norm == "layernorm" else h
    own_head = 0 if spec.tied_embeddings else v * h
    return EndWork(gemm_flops=2 * tokens * h * v / ctx.tp, gemm_intensity=intensity(tokens, v / ctx.tp, h),
                   elementwise_bytes=3 * 4 * ACT_BYTES * rep + LOGIT_RW_BYTES * logits,
                   saved_bytes=ACT_BYTES * (rep + _gemm_input(ctx, tokens, h, rep)) + LOGIT_SAVED_BYTES * logits,
                   # a tied head still needs its copy of the embedding on the last stage (pp > 1)
                   params_local=norm + v * h / ctx.tp, params_total=norm + own_head,
                   model_flops=2 * ctx.micro_batch * ctx.seq_len * h * v, tp_message_bytes=0.0, logits=logits)


def model_params(spec: ModelSpec) -> int:
    """Total parameters (embeddings once if tied; MTP modules excluded)."""
    layers = build_layers(spec)
    total = sum(layer_params(l) for l in layers)
    if not spec.is_graph:
        ctx = Ctx(micro_batch=1, seq_len=spec.seq_len)
        total += embedding_work(spec, ctx).params_total + head_work(spec, ctx).params_total
    return int(round(total))
