"""What each training runtime can execute and what it runs (one record per runtime), read by
the search's legal space (search/space.py) and by the cost model (the attention kernel).

The kernel facts: Megatron-Core with Transformer Engine runs cuDNN's fused attention on Hopper
(and FlashAttention-2 where cuDNN has no measured table); PyTorch's scaled_dot_product_attention
(torchtitan), DeepSpeed, nanotron and llm-foundry run FlashAttention-2 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.graph import TORCH_LOSS_RW_BYTES
from planner.spec.training import FP8_RECIPES, LOSS_FUSIONS, RECOMPUTE_MODULES


@dataclass(frozen=True, slots=True)
class ShippedModel:
    """A model a runtime builds by name (it takes no free architecture flags): its shape."""

    name: str
    flavor: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    rope_theta: float
    norm_eps: float

    def matches(self, m) -> bool:
        """Whether ModelSpec `m` is this model: a Llama-style decoder (SwiGLU, RMSNorm, rotary,
        no biases, untied embeddings, dense) of exactly these sizes (rope and epsilon as stated,
        or not stated)."""
        return (not m.is_graph and m.moe is None and m.mla is None and m.causal and m.ffn_act == "swiglu"
                and m.norm == "rmsnorm" and m.position_embedding == "rope" and not m.linear_bias
                and not m.tied_embeddings and m.head_dim * m.heads == m.hidden
                and (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)
                == (self.layers, self.hidden, self.heads, self.kv_heads, self.ffn_hidden, self.vocab)
                and m.rope_theta in (0, self.rope_theta) and m.norm_eps in (0, self.norm_eps))


TORCHTITAN_MODELS = tuple(
    ShippedModel("llama3", flavor, layers, hidden, heads, 8, ffn, 128256, 500000.0, 1e-5)
    for flavor, layers, hidden, heads, ffn in (("8B", 32, 4096, 32, 14336), ("70B", 80, 8192, 64, 28672),
                                               ("405B", 126, 16384, 128, 53248)))
"""torchtitan 0.2.2's llama3 flavors (torchtitan/models/llama3/__init__.py llama3_args: dim,
n_layers, n_heads, n_kv_heads 8, vocab_size 128256, rope_theta 500000, norm_eps 1e-5; the FFN
width from its FeedForward rule: multiple_of * ceil(ffn_dim_multiplier * int(8 dim / 3) /
multiple_of), multiplier 1.3, 1.3, 1.2 and multiple_of 1024, 4096, 4096). A test compares them
with the installed package."""

def whole_grads(figures: tuple[tuple[str, float], ...], precision: str, zero):
    """A per-precision figure of a runtime's whole gradients (RuntimeRules.grad_accum_bytes,
    kept_grad_bytes) at priced ZeRO stage `zero`, elementwise over an array: 0 above ZeRO-1, where
    the gradients are reduce-scattered shards, or where the record names no figure."""
    per_param = dict(figures).get(precision, 0.0)
    if getattr(zero, "ndim", 0):
        return np.where(np.less_equal(zero, 1), per_param, 0.0)
    return per_param if zero <= 1 else 0.0


CP_ROTATIONS = ("ring", "allgather")
"""how a runtime's context parallelism moves K and V (RuntimeRules.cp_rotation)"""


@dataclass(frozen=True, slots=True)
class RuntimeRules:
    """What a training runtime can execute."""

    zero: tuple[int, ...]
    zero_with_pp: tuple[int, ...]
    """the ZeRO stages it runs without and with pipeline stages (zeros)"""
    interleaving: bool
    even_chunks: bool
    """virtual chunks must hold equal layer counts (chunks_run)"""
    uneven_split: str
    """'any' (any contiguous split), 'ends' (only the first and last stage differ), 'none' (every
    stage the same layer count: pp divides the layers)"""
    recompute_counts: str
    """which layers full recomputation may cover: 'stage' (any count per stage), 'uniform' (one
    count for every stage: Megatron's --recompute-num-layers), 'all' (every layer or none: one
    activation-checkpoint policy)"""
    context_parallel: bool
    expert_parallel: bool
    note: str
    orders: tuple[str, ...] = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
    replicate_alone: bool = False
    """ZeRO-0 (plain replication) only when data parallelism is the only parallelism"""
    tp_overlap: bool = False
    """hides tensor-parallel collectives behind the GEMMs they feed (Transformer Engine's
    userbuffers comm-GEMM overlap, --tp-comm-overlap), for tp groups inside one node: exposed is
    what the GEMMs cannot cover"""
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp8")
    """the mixed-precision recipes it trains with"""
    ep_precisions: tuple[str, ...] = ("bf16", "fp16", "fp8")
    """those of them it runs expert parallelism in"""
    fp8_recipes: tuple[str, ...] = FP8_RECIPES
    """how it scales fp8 tensors (spec/training.FP8_RECIPES), its default first (fp8_recipe)"""
    grad_reduces: tuple[str, ...] = ("fp32",)
    """the dtypes it reduces data-parallel gradients in (spec/training.GRAD_REDUCES), its default
    first: fp32 everywhere (torchtitan 0.3's mixed_precision_reduce is Literal["float32"]);
    Megatron-LM also bf16 (--grad-reduce-in-bf16)"""
    optimizer_states: tuple[str, ...] = ("fp32",)
    """the dtypes it keeps Adam's moments in (spec/training.OPTIMIZER_STATES), its default first:
    fp32 everywhere; Megatron-LM also bf16 (--use-precision-aware-optimizer with --exp-avg-dtype and
    --exp-avg-sq-dtype bf16: Transformer Engine's FusedAdam, under the distributed optimizer only,
    megatron-core OptimizerConfig.__post_init__). torchtitan's AdamW keeps its states in the
    parameters' fp32, DeepSpeed's BF16_Optimizer and nanotron's in fp32"""
    fp8_param_gather: bool = False
    """whether it keeps fp8 weights and all-gathers them in fp8 (Megatron-LM --fp8-param-gather,
    with its distributed optimizer)"""
    models: tuple[ShippedModel, ...] = ()
    """the models it builds, where it builds them by name (torchtitan); () where launch flags
    describe any decoder (Megatron-LM, DeepSpeed, nanotron)"""
    ep_dispatchers: tuple[str, ...] = ("alltoall",)
    """how it can move MoE tokens to their experts, its default first: 'alltoall' (one copy per
    expert chosen, torch.distributed all_to_all) or 'dedup' (Megatron-Core's flex dispatcher with
    DeepEP or HybridEP: one copy per destination node and rank, cost/comm.dispatch_time_s)"""
    attention: tuple[str, ...] = ("fa2",)
    """flash attention kernels it runs, preferred first (spec/measured.KERNELS): the cost model
    prices the first one the GPU has a measured table of (cost/compute.attention_time_s)"""
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    """the activation recomputation it runs"""
    selective_mode: str = "selective"
    """what its selective recomputation recomputes, the layer mode (graph.Ctx.recompute) it is
    priced in: 'selective', the attention core (Korthikanti et al. 2022; Megatron-LM's
    --recompute-granularity selective), or 'op', torchtitan's per-op policy (graph.op_policy:
    every second matmul and the memory-bound ops, the attention kernel's output kept)"""
    recompute_modules: tuple[str, ...] = ()
    """the modules its selective recomputation can be told to recompute (spec/training
    .RECOMPUTE_MODULES; TrainingSetup.recompute_modules): all of them on Megatron-LM
    (--recompute-modules, 000c4ac arguments.py) and in the ideal space, none elsewhere (their
    selective recomputation is one fixed policy)"""
    pp_outermost_unless_cp_is_ep: bool = False
    """with pipeline stages, a rank order that does not end in pp runs only where the expert
    data-parallel size dp*cp/ep equals dp, that is cp == ep (megatron-core 0.16.0
    initialize_model_parallel asserts order.endswith('pp') or pp == 1 or expert dp == dp; its
    expert rank generator forms the expert groups with cp 1 inside the same order)"""
    pp_defers_sharding: bool = False
    """under pipeline stages its ZeRO-2/3 (FSDP2) keeps the weights gathered and the gradients
    unsharded across a step's micro-batches and reduce-scatters once, after the last backward:
    torch.distributed.pipelining (stage.py backward_maybe_with_nosync turns off gradient sync and
    reshard-after-backward until perform_reduce_grad), and torchtitan's fsdp_reshard_after_forward
    'default' (reshard_after_forward = not pp_enabled). That is the traffic and memory of ZeRO-1
    (priced_zero)."""

    pp_keeps_outputs: bool = False
    """under pipeline stages its last stage keeps every micro-batch's output, the 16-bit logits, until
    the step ends: torch.distributed.pipelining's forward_one_chunk appends each output of the last
    stage to output_chunks, which only the next step's clear_runtime_states empties; torchtitan turned
    it off in #1922 (e5ef99aab, 2025-10-22: return_outputs=False, the API of pytorch#165822 'since we
    do not return any output from PP step(). This allows us to release the memory earlier'), first
    in v0.2.1. cost/step.stage_ends counts the kept logits"""

    pp_buffers_per_microbatch: bool = False
    """under pipeline stages each virtual chunk holds, for every micro-batch of the step, a receive
    buffer of its input and that buffer's gradient (all but the first chunk), and a receive buffer
    of its output's gradient and the sent output itself (all but the last): four boundary
    activations a micro-batch in a middle chunk, held whether or not the micro-batch is in flight.
    torch.distributed.pipelining: PipelineStage._prepare_forward_infra and _prepare_backward_infra
    allocate one receive buffer per micro-batch and direction when the stage is set up (torch 2.6,
    the release nearest torchtitan 9dec370's torch; pytorch#136380 asks to keep fewer, still open;
    NVIDIA-NeMo/Automodel#3780, 2026-09-01: 'pre-allocates one full-size P2P recv buffer per
    microbatch and per direction', 52 GiB on Kimi-K3's middle stages); the input buffers' gradients
    stay until the next step's clear_runtime_states; sent outputs stay to the step's end (torch
    2.6's output_chunks on every stage; later the send works and fwd_cache, pytorch#193903:
    'retained microbatches * stages_per_rank activations'). cost/step.stage_ends counts them"""

    loss_bytes_per_logit: float = 6.0
    """bytes per logit element its loss holds at its peak (the LM head's logits, their fp32 copy,
    the softmax it keeps, their gradients), measured with PyTorch on CPU in
    tests/test_torch_oracle.py: 6 for Megatron-Core's vocab-parallel cross entropy (the bf16
    logits beside their fp32 copy; softmax and gradient in place), 12 for PyTorch's cross_entropy
    on an fp32 cast (torchtitan's loss uncompiled: the fp32 log-probabilities it keeps, their
    gradient and the input's gradient at once), 4 for that loss under torch.compile (it keeps
    the bf16 logits and the per-row statistics; the gradient comes back in bf16)"""
    pp_overlap: bool = False
    """its interleaved schedule (vpp > 1) overlaps the pipeline's sends and receives with the
    chunks' computation: Megatron-LM's overlap_p2p_comm, on by default with virtual stages and
    off without them (arguments.py at 000c4ac lines 603-618; --no-overlap-p2p-communication turns
    it off); cost/step.exposed_p2p_s prices what shows"""
    loss_traffic_per_logit: float | None = None
    """HBM bytes per logit element its own loss moves, forward and backward, of those graph.py
    counts: None is Megatron-Core's unfused vocab-parallel loss (graph.LOGIT_RW_BYTES); torchtitan
    runs PyTorch's cross_entropy on an fp32 cast (graph.TORCH_LOSS_RW_BYTES, an upper bound for
    torchtitan@compile's compiled loss)"""
    loss_fusions: tuple[str, ...] = ()
    """the fused cross-entropy losses it can run in place of its own (spec/training.LOSS_FUSIONS,
    priced by graph.LOSSES): Megatron-LM's --cross-entropy-loss-fusion with
    --cross-entropy-fusion-impl native or te (arguments.py at 000c4ac; megatron-core 0.16.0
    LanguageModule.compute_language_model_loss)"""
    loss_parallel_bytes_per_logit: float | None = None
    """bytes per logit its loss holds at its peak when tp > 1 and the loss runs on the
    vocabulary-sharded logits (torch's DTensor loss_parallel: 16, measured in
    tests/test_torch_oracle.py: the plain loss's 12 and the fp32 log-softmax beside them); None:
    loss_bytes_per_logit whatever tp"""
    eager_norm_bytes: tuple[float, float] | None = None
    """HBM bytes per element of each RMSNorm, forward and backward, where the runtime runs it as
    eager PyTorch ops rather than one fused kernel (graph.NORM_FUSED_BYTES forward, as much
    backward); None: fused. Counted op by op with PyTorch's dispatcher on CPU in
    tests/test_torch_oracle.py: 36 and 92 for torchtitan's own eager RMSNorm of late 2024 (a
    float cast, pow, mean, rsqrt, two multiplies and the cast back, bf16 in and out). Megatron's
    and DeepSpeed's norms are Transformer Engine's and Apex's fused kernels; torchtitan's April
    2024 configs chose its Triton fused_rmsnorm, and 0.3's nn.RMSNorm dispatches to PyTorch's
    fused CUDA kernel (native_functions.yaml: _fused_rms_norm, CUDA: _fused_rms_norm_cuda)"""
    eager_rope_bytes: tuple[float, float] | None = None
    """HBM bytes per rotated element (of the queries and the keys), forward and backward, where the
    runtime applies rotary embeddings as eager PyTorch ops rather than one fused kernel
    (graph.ROPE_FUSED_BYTES each way); None: fused. Counted op by op with PyTorch's dispatcher on
    CPU in tests/test_torch_oracle.py: 20 and 20 for torchtitan's complex RoPE (a float cast, the
    complex multiply, the cast back; backward the same three on the gradient): 0.3.0
    models/common/rope.py ComplexRoPE.apply_rotary_emb, the same arithmetic in 1ea476e9f's and
    9dec370's models/llama/model.py apply_rotary_emb; under torch.compile it fuses"""
    eager_swiglu: bool = False
    """its SwiGLU runs as eager silu and mul, whose backward keeps silu's output beside both GEMM
    outputs (graph._eager_saved: 2 bytes more a ffn element), where a fused kernel keeps its input
    alone (Megatron's bias_swiglu, Transformer Engine's): torchtitan's FeedForward
    w2(F.silu(w1(x)) * w3(x)) and GroupedExperts (0.3.0 models/common/feed_forward.py and moe.py;
    0.2.2 and 9dec370 llama model.py) without torch.compile, which its exports leave off; nanotron
    v0.4's GLUActivation (models/llama.py: SiLUActivation(gate) * up). Its traffic is
    graph.EAGER_SWIGLU_BYTES"""
    expanded_kv: bool = False
    """its attention expands K and V to every query head before the kernel, which keeps them so
    (graph._eager_saved) and copies them there and back (graph._eager_traffic): torchtitan
    1ea476e9f's and 9dec370's repeat_kv (models/llama/model.py); since 0.2 it passes enable_gqa to
    SDPA and keeps them at the KV heads"""
    cp_rotation: str = "ring"
    """how its context parallelism moves each layer's K and V between the cp ranks (cost/step
    .cp_exposed_s; CP_ROTATIONS): 'ring', one block a step, the sends behind the attention core (Megatron-Core's
    Transformer Engine attention under its default cp_comm_type 'p2p'), or 'allgather', torch's
    context_parallel under its default rotate method (torch 2.6 and 2.13
    distributed/tensor/experimental _attention.py: _cp_options.rotate_method ALL_GATHER, which
    torchtitan keeps: 9dec370 and 0.2.2 context_parallel_rotate_method 'allgather'). The all-gather
    rotater gathers every rank's block at once behind the local block's attention, forward and
    again in backward, where the K and V gradients go round the ring in fp32 (accum_dtype under
    convert_to_f32, dkv_rotater ALL_TO_ALL), and holds the gathered blocks while a layer's attention
    runs"""
    cp_expanded_kv: bool = False
    """its attention hands the kernel K and V expanded to every query head, so its context
    parallelism moves them at that size: torchtitan 9dec370's Attention.forward (repeat_kv before
    F.scaled_dot_product_attention, compiled or not, which torch's context_parallel replaces with
    its ring attention); since 0.2 it passes enable_gqa and keeps them at the KV heads"""
    sp_saves_gathered: bool = False
    """under sequence parallelism the GEMMs after each norm (the column-parallel QKV and first MLP
    projections, the LM head; a router or MLA down-projection, unsplit, reads the same gathered
    tensor) keep their all-gathered input, tokens x hidden, for the weight gradient (graph
    ._gemm_input): torchtitan's tensor parallelism is DTensor's, where PrepareModuleInput
    redistributes each norm's Shard(1) output to Replicate before the linears and their matmul saves
    that (9dec370 parallelisms/parallelize_llama.py apply_tp; 0.3.0 the same plan; under float8
    torchao's PrepareFloat8ModuleInput gathers it in fp8, eab345c float8_tensor_parallel.py),
    counted with DTensor on two CPU ranks in tests/test_torch_oracle.py. Megatron-Core's and
    Transformer Engine's linears save the sequence shard and gather it again in backward
    (Korthikanti et al. 2022 §4.2.2)"""
    zero_with_experts: tuple[int, ...] = (0, 1, 2, 3)
    """the ZeRO stages it runs a model with experts in (zeros)"""
    fp8_saves_quantised: bool = False
    """whether, under fp8, it keeps each GEMM's input for the weight gradient as the fp8 copy its
    forward GEMM read (1 byte an element; graph._saved) rather than in 16 bits: Transformer
    Engine's Linear saves `inputmat` (the fp8 cast, or its fp8 transpose) unless the recipe keeps
    wgrad in high precision (transformer_engine/pytorch/module/linear.py, _Linear.forward at
    0004dbd; its 2.x modules save the quantised tensor the same way). torchao's Float8Linear, which
    torchtitan runs, saves the input it is given since pytorch/ao 2ec9bc15d (#1461, 2025-01-13:
    matmul_with_hp_or_float8_args, ctx.save_for_backward(input_hp, weight_hp_t)), the 16-bit one
    (under tp its fp8 gather, an overcount of 1 byte an element); before, under tensorwise scaling,
    its fp8 cast (eab345c, torchtitan 9dec370's torchao: manual_float8_matmul_with_args_in_float8
    saves input_fp8, weight_fp8_t), one per norm output once compiled (AOTAutograd's
    common-subexpression elimination merges the QKV linears' casts of one input)"""
    ends_accounted: bool = False
    """its equal virtual chunks may count the embedding and the loss as a layer each, leaving the
    first and the last chunk one layer short (Megatron's --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split: megatron-core 0.16.0 TransformerConfig.__post_init__
    requires (layers + 1 + 1) % (pp * vpp) == 0 then); cost/pipeline.split_layers gives exactly
    that layout where the layers fall one or two short of a multiple of the chunks"""
    moe_folding: bool = False
    """runs expert layers with their own tensor parallelism of 1 beside the dense tp (MoE parallel
    folding: megatron-core's expert_tensor_parallel_size, --expert-tensor-parallel-size 1)"""
    batch_shares: bool = False
    """runs data-parallel replicas of different kinds over a mixed cluster's pools, each with its
    own strategy and share of the global batch (search/shares.py): no runtime we know does (each
    assumes one strategy and an equal share per replica), so only the ideal space has them"""
    pool_stages: str = "none"
    """which pipelines over a mixed cluster's pools it runs (search/pool_stages.py: consecutive
    stages on different GPUs, one strategy, a layer count per stage): 'none'; 'same_library'
    (Megatron-LM: --pipeline-model-parallel-layout gives every stage its own layer count, at
    Megatron-LM 000c4ac and megatron-core 0.16.0 PipelineParallelLayerLayout; torchtitan:
    module_fqns_per_model_part, the modules of each stage; one job's
    collectives run one library, so every GPU must run the same one, spec/hardware.COLLECTIVES:
    NCCL and RCCL do not interoperate; and its launch runs one process count on every node);
    'any' (the ideal space). pool_stages_refusal reads it."""
    hybrid_zero: tuple[int, ...] = ()
    """the ZeRO stages it runs with hybrid sharding (Strategy.dp_shard: states sharded over
    groups of dp_shard data-parallel ranks, replicated across them): megatron ZeRO-1 with
    --num-distributed-optimizer-instances; torchtitan FSDP2 (ZeRO-3) with data_parallel_replicate
    x data_parallel_shard. The search does not enumerate dp_shard; estimate prices it"""
    grad_accum_bytes: tuple[tuple[str, float], ...] = ()
    """HBM bytes per local parameter that each micro-batch's backward moves to accumulate the
    gradients outside the weight-gradient GEMMs, per precision (grad_accum_bytes_of), where the
    gradients stay whole on every rank (ZeRO <= 1); () where nothing does: Megatron-LM since
    gradient accumulation fusion (NVIDIA/Megatron-LM 83b1e42f3, merged 2022-02-22, on by
    default: the weight-gradient GEMM adds into main_grad), FSDP's sharded gradients (a
    1/shards share, left out). Counted with PyTorch's dispatcher on CPU in
    tests/test_torch_oracle.py: 18 for DeepSpeed's BF16_Optimizer, whose pipeline engine calls
    update_hp_grads after every micro-batch's backward (hp_grad.add_(lp.grad.to(fp32)): a cast,
    then an fp32 add; microsoft/DeepSpeed 56c522386, #1801 2022-04-19, unchanged at 38327e07f);
    6 for autograd's in-place add into a 16-bit .grad (Megatron-LM of April 2021). Priced as
    memory-bound time on every micro-batch (cost/step.stage_terms), the first included, which
    autograd's steals: one pass a step too many there. Not priced for nanotron: its
    FP32GradientAccumulator (v0.4 optim/gradient_accumulator.py, fp32_grad.add_(half_param.grad),
    10 bytes) runs where the optimizer config's accumulate_grad_in_fp32 says, a key the export
    leaves to the user"""
    expert_tp_gather: bool = False
    """experts that keep tensor parallelism (not folded) get every routed token of their tp group
    on each of its ranks and send their outputs back from each: under its all-to-all dispatcher
    an all-gather over the experts' tp group after the all-to-all and a reduce-scatter before the
    combine (megatron-core 0.16.0 token_dispatcher.py MoEAlltoAllTokenDispatcher
    dispatch_postprocess and combine_preprocess, gather_from_sequence_parallel_region over
    expt_tp), on the compute stream, outside the linears userbuffers overlap; under its flex
    dispatcher (dedup) the same copies inside its fused all-to-all over tp x ep (router_topk = tp x
    top_k, the same file), which comm.dispatch_time_s does not count. Both priced as the gather
    and reduce-scatter, exposed (graph.Work.tp_expert_message_bytes): the bytes each rank receives
    are the same; how much of them the fused kernel hides behind its inter-node sends is not
    measured"""
    dropless_host_sync: bool = False
    """its dropless MoE routing copies each MoE layer's per-expert token counts to the host before
    the expert GEMMs, so the GPU then waits for the host to launch the rest of the layer:
    Megatron-Core's token_dispatcher.py (_maybe_dtoh_and_synchronize under the all-to-all
    dispatcher, the HybridEP path's tokens_per_expert sum) and TEGroupedMLP's
    tokens_per_expert.tolist() (experts.py). The host's time is not priced (no measurement of it
    yet: hardware/measure/moe_host.py); plans whose MoE layers are short say so
    (planning.HOST_BOUND_LAYER_S)"""
    kept_grad_bytes: tuple[tuple[str, float], ...] = ()
    """bytes per parameter of autograd's own gradient that it keeps beside its gradient
    accumulator from one micro-batch's backward to the next, per precision (kept_grad_bytes_of),
    where the gradients stay whole on every rank (ZeRO <= 1): DeepSpeed's BF16_Optimizer frees the
    16-bit .grad only when the next backward starts (38327e07f bf16_optimizer.py backward:
    clear_lp_grads, loss.backward, update_hp_grads with clear_lp_grads False; the pipeline engine
    the same around _exec_backward_pass), so every forward but a step's first runs beside the
    stage's 16-bit gradients as well as its fp32 ones: 2 bytes a parameter (cost/step.stage_memory
    adds them to the gradients). () where autograd's gradient is the accumulator itself (Megatron's
    main_grad, FSDP's, autograd's own add in Megatron-LM of 2021)"""
    ep_overlap: bool = False
    """can overlap the expert all-to-alls of one micro-batch with the computation of another
    (Megatron-Core's combined 1F1B, --overlap-moe-expert-parallel-comm; priced by
    cost/step.layer_cost, its rules in ep_overlap_problems)"""

    def loss_bytes(self, tp: int) -> float:
        """Bytes per logit the loss holds at its peak under tensor parallelism `tp`."""
        if tp > 1 and self.loss_parallel_bytes_per_logit is not None:
            return self.loss_parallel_bytes_per_logit
        return self.loss_bytes_per_logit

    def grad_accum_bytes_of(self, precision: str, zero):
        """grad_accum_bytes for a run in `precision` whose priced ZeRO stage is `zero` (whole_grads)."""
        return whole_grads(self.grad_accum_bytes, precision, zero)

    def kept_grad_bytes_of(self, precision: str, zero):
        """kept_grad_bytes for a run in `precision` whose priced ZeRO stage is `zero` (whole_grads)."""
        return whole_grads(self.kept_grad_bytes, precision, zero)

    def priced_zero(self, zero, pp):
        """The ZeRO stage whose traffic and memory a plan's `zero` has under this runtime with
        `pp` stages (pp_defers_sharding); elementwise over arrays."""
        if not self.pp_defers_sharding:
            return zero
        if getattr(zero, "ndim", 0) or getattr(pp, "ndim", 0):
            return np.where(np.greater(pp, 1) & np.greater_equal(zero, 2), 1, zero)
        return 1 if pp > 1 and zero >= 2 else zero

    def refusal(self, s, model, fold: int = 1) -> str | None:
        """What this runtime cannot run of Strategy `s` for ModelSpec `model` (None when it runs
        it): the rules the search's space (search/space.py, search/bounds.py) enumerates by, read
        from the same fields; `fold`: tp over the experts' tp (order_runs). The precision, the
        dispatcher, folding and the model itself are refused with the setup (precision_refusal,
        dispatcher_refusal, folding_refusal, model_refusal)."""
        zero = self.zero_refusal(s.zero, s.pp, model, s.tp == s.pp == s.cp == 1)
        if zero:
            return zero
        if s.dp_shard and s.zero not in self.hybrid_zero:
            return (f"hybrid sharding (dp_shard {s.dp_shard}) with ZeRO {s.zero}"
                    + (f" (it shards in groups with ZeRO {self.hybrid_zero})" if self.hybrid_zero else ""))
        if s.cp > 1 and not self.context_parallel:
            return f"context parallelism (cp {s.cp})"
        if s.ep > 1 and not self.expert_parallel:
            return f"expert parallelism (ep {s.ep})"
        if s.vpp > 1 and not self.interleaving:
            return f"interleaved pipeline stages (vpp {s.vpp})"
        if not self.chunks_run(model.layers, s.pp, s.vpp):
            return f"unequal virtual chunks ({model.layers} layers over {s.pp * s.vpp} chunks)"
        if self.uneven_split == "none" and model.layers % s.pp:
            return f"unequal stages ({model.layers} layers over {s.pp})"
        if s.order not in self.orders and s.dp > 1 and s.pp > 1:  # the orders differ only then
            return f"rank order {s.order} (it places ranks {' or '.join(self.orders)})"
        if not self.order_runs(s.order, s.cp, s.pp, s.ep, fold):
            carved = f"cp {s.cp}" if fold == 1 else f"tp*cp {s.tp * s.cp}"
            return (f"rank order {s.order} with pipeline stages and {carved} != ep {s.ep} (the expert groups "
                    "need pp outermost)")
        if s.recompute not in self.recompute_modes:
            return f"{s.recompute} activation recomputation (it runs {', '.join(self.recompute_modes)})"
        if self.recompute_counts == "all" and s.recompute == "full" and s.recompute_layers is not None:
            return f"full recomputation of some layers only (recompute_layers {s.recompute_layers})"
        return None

    def order_runs(self, order: str, cp: int, pp: int, ep: int, fold: int = 1) -> bool:
        """Whether the rank order places these degrees (pp_outermost_unless_cp_is_ep; `fold`: tp
        over the experts' tp, the share of tp the expert groups fold in: edp = dp*cp*fold/ep is dp
        exactly when ep = cp*fold)."""
        return not self.pp_outermost_unless_cp_is_ep or pp == 1 or order.endswith("pp") or cp * fold == ep

    def zero_refusal(self, zero: int, pp: int, model, alone: bool) -> str | None:
        """What it cannot run of ZeRO stage `zero` with `pp` stages for `model` (refusal's ZeRO
        rules; `alone`: tp = pp = cp = 1, where a runtime that replicates only then may), or None."""
        zeros = self.zeros(pp, model)
        if zero not in zeros:
            dense = zero in self.zeros(pp, None)  # it would run it without the experts
            where = " with experts" if dense else " under pipeline stages" if pp > 1 else ""
            return f"ZeRO {zero}{where} (it runs {zeros})"
        if self.replicate_alone and zero == 0 and not alone:
            return "plain replication (ZeRO 0) beside other parallelism"
        return None

    def zeros(self, pp: int, model) -> tuple[int, ...]:
        """The ZeRO stages it runs with `pp` stages for `model` (None: a model without experts)."""
        zeros = self.zero_with_pp if pp > 1 else self.zero
        if getattr(model, "moe", None) is not None:
            zeros = tuple(z for z in zeros if z in self.zero_with_experts)
        return zeros

    def chunks_run(self, layers: int, pp: int, vpp: int) -> bool:
        """Whether the even split of `layers` into pp*vpp virtual chunks (split_layers) is one it
        interleaves: any split without interleaving (the stage rules decide), equal chunks, or
        where ends_accounted the first and the last one layer short."""
        chunks = pp * vpp
        if vpp == 1 or not self.even_chunks or layers % chunks == 0:
            return True
        return self.ends_accounted and chunks > 2 and layers % chunks >= chunks - 2 and layers >= chunks

    def fixed_split(self, pp, vpp):
        """Whether the even split is the only split: one stage, interleaving (equal virtual
        chunks), or a runtime that splits evenly (elementwise over arrays of pp and vpp)."""
        return np.equal(pp, 1) | np.greater(vpp, 1) | (self.uneven_split == "none")

    def free_split(self, pp: int, vpp: int) -> bool:
        """Whether any contiguous split is allowed (the split DP's case): 'any', or 'ends' with
        two stages, which are both ends."""
        return not self.fixed_split(pp, vpp) and (self.uneven_split == "any" or pp == 2)


RUNTIME_RULES: dict[str, RuntimeRules] = {
    "ideal": RuntimeRules((0, 1, 2, 3), (0, 1, 2, 3), True, False, "any", "stage", True, True,
                          "the ideal space: no runtime's restrictions (for what-if analysis; no runtime may run "
                          "its plans)", tp_overlap=True, ep_dispatchers=("dedup", "alltoall"), attention=("cudnn", "fa2"),
                          ep_overlap=True, loss_bytes_per_logit=4.0, moe_folding=True, hybrid_zero=(1, 2, 3),
                          batch_shares=True, pool_stages="any", grad_reduces=("fp32", "bf16"), fp8_param_gather=True,
                          optimizer_states=("fp32", "bf16"), recompute_modules=RECOMPUTE_MODULES,
                          fp8_saves_quantised=True, loss_fusions=LOSS_FUSIONS, pp_overlap=True),
    "megatron": RuntimeRules((0, 1), (0, 1), True, True, "ends", "uniform", True, True,
                             "Megatron-LM: distributed optimizer (ZeRO-1) at most; one --recompute-num-layers "
                             "for all stages; uneven split only on the first/last stage; equal virtual chunks",
                             tp_overlap=True, ep_dispatchers=("dedup", "alltoall"), attention=("cudnn", "fa2"),
                             # validate_args: "Expert parallelism is not supported with fp16 training."
                             ep_precisions=("bf16", "fp8"), pp_outermost_unless_cp_is_ep=True, ep_overlap=True,
                             moe_folding=True, ends_accounted=True, pool_stages="same_library", dropless_host_sync=True,
                             expert_tp_gather=True,
                             # arguments.py: --grad-reduce-in-bf16, --fp8-param-gather, --use-precision-aware-optimizer
                             # with --exp-avg-dtype / --exp-avg-sq-dtype (Megatron-LM 000c4ac)
                             grad_reduces=("fp32", "bf16"), fp8_param_gather=True, optimizer_states=("fp32", "bf16"),
                             # --recompute-granularity selective --recompute-modules (arguments.py, 000c4ac)
                             recompute_modules=RECOMPUTE_MODULES,
                             # --num-distributed-optimizer-instances (megatron-core parallel_state:
                             # intra-partial groups of dp*cp/instances consecutive dp-cp ranks)
                             hybrid_zero=(1,), fp8_saves_quantised=True, loss_fusions=LOSS_FUSIONS,
                             pp_overlap=True),
    "deepspeed": RuntimeRules((0, 1, 2, 3), (0, 1), False, False, "none", "all", False, True,
                              "DeepSpeed: pipeline engine only with ZeRO <= 1, no interleaving, no context "
                              "parallelism, layers split evenly (pp divides them), activation checkpointing of "
                              "every layer or none, pipeline stages outermost; no FP8 training mode",
                              orders=("tp-cp-ep-dp-pp",), precisions=("bf16", "fp16"),
                              # deepspeed 0.19.0 runtime/engine.py _configure_zero_optimizer: "MoE not
                              # supported with Stage 3" (asserted wherever the model has MoE layers)
                              zero_with_experts=(0, 1, 2),
                              # Megatron-DeepSpeed (f4157bea) model/gpt_model.py: vocab_parallel_cross_entropy
                              # of output.float(), whose core/tensor_parallel/cross_entropy.py subtracts the
                              # max out of place and keeps exp as the softmax: its own code on CPU (one gloo
                              # rank) holds 10.02 bytes a logit at its peak, where megatron-core's in-place
                              # one holds 6
                              loss_bytes_per_logit=10.0,
                              # bf16 without ZeRO runs BF16_Optimizer (38327e07f engine.py get_data_types:
                              # fp32 accumulation by default when ZeRO is off; _do_optimizer_sanity_check), which
                              # shards its fp32 states as ZeRO-1 does (BLOOM's ZERO_STAGE=0, its row's zero 1);
                              # under ZeRO-1 it runs with data_types grad_accum_dtype fp32, which the export
                              # writes (export/deepspeed.py)
                              grad_accum_bytes=(("bf16", 18.0),), kept_grad_bytes=(("bf16", 2.0),)),
    "torchtitan": RuntimeRules((0, 3), (0, 3), True, False, "any", "all", True, True,
                               "torchtitan 0.3.0 (0.2.x: torchtitan@0.2): FSDP2 (ZeRO-3), or DDP replication when dp is the only parallelism; "
                               "activation checkpointing of every layer or none; no fp16 mixed precision",
                               orders=("tp-cp-ep-dp-pp",), replicate_alone=True, precisions=("bf16", "fp8"),
                               # torchao Float8LinearConfig's default recipe: dynamic per-tensor scaling
                               fp8_recipes=("tensorwise",),
                               models=TORCHTITAN_MODELS, pp_defers_sharding=True, pp_buffers_per_microbatch=True,
                               cp_rotation="allgather", sp_saves_gathered=True,
                               loss_bytes_per_logit=12.0,
                               # under tp its lm_head leaves the logits vocabulary-sharded (0.3.0
                               # models/common/decoder_sharding.py: out S(-1)), so the loss is its
                               # _LossParallelCrossEntropy (components/loss.py), measured at 16 bytes
                               # a logit on CPU like 0.2's DTensor loss_parallel (tests/test_torch_oracle.py)
                               loss_parallel_bytes_per_logit=16.0,
                               eager_swiglu=True, eager_rope_bytes=(20.0, 20.0),
                               loss_traffic_per_logit=TORCH_LOSS_RW_BYTES,
                               # module_fqns_per_model_part: each stage's own layers (torchtitan 0.3.0
                               # config/configs.py ParallelismConfig; 0.2.x job_config.Parallelism)
                               pool_stages="same_library",
                               # data_parallel_replicate_degree x data_parallel_shard_degree (HSDP;
                               # ParallelDims mesh pp, dp_replicate, dp_shard, cp, tp)
                               hybrid_zero=(3,),
                               # activation_checkpoint mode 'selective' is SelectiveAC, the per-op
                               # policy (0.3.0 distributed/activation_checkpoint.py; 0.2.x and
                               # since 2024-04 selective_ac_option 'op')
                               selective_mode="op"),
}
# Runtimes that published runs ran on but that the search does not target (a version, or a
# setting, of a target; or a runtime described only by its kernels and loss): what the cost
# model reads of them is the attention kernel, the loss's peak and, for a version of a target,
# its space.
RUNTIME_RULES["torchtitan@0.2"] = replace(
    RUNTIME_RULES["torchtitan"],
    note="torchtitan 0.2.x (0.2.0, 0.2.2): the space of 0.3, its job written as the TOML config 0.3 no longer reads; "
         "under tp its loss runs in torch's DTensor loss_parallel (v0.2.2 train.py: loss_parallel_enabled = "
         "tp_enabled and not disable_loss_parallel; components/loss.py: cross_entropy of the fp32 cast)")
RUNTIME_RULES["torchtitan@2024-04"] = replace(
    RUNTIME_RULES["torchtitan"], expanded_kv=True, cp_expanded_kv=True,
    note="torchtitan of April 2024 (1ea476e9f, the configs of docs/performance.md then): no torch.compile, no "
         "float8; Triton fused_rmsnorm (train_configs norm_type), eager complex RoPE and SwiGLU, K and V expanded "
         "by repeat_kv before SDPA (models/llama/model.py), the loss on the fp32 logits")
# expanded_kv stays off here and cp_expanded_kv on: compiled, the block still hands SDPA the expanded K
# and V (so context parallelism moves them so), but the priced memory and traffic leave the expansion
# out; the compiled 8B rows' published peaks, within 1 % of the model's without it, agree. Whether
# Inductor keeps the unexpanded tensors and recomputes the copy is not measured
RUNTIME_RULES["torchtitan@2024-12-compiled"] = replace(
    RUNTIME_RULES["torchtitan"], eager_swiglu=False, eager_rope_bytes=None, pp_keeps_outputs=True, cp_expanded_kv=True,
    fp8_saves_quantised=True,
    note="torchtitan of December 2024 (9dec370, the configs of docs/performance.md at d4c86e375) with "
         "torch.compile of its TransformerBlocks (the norms, rotary embeddings and SwiGLU fused; the loss not "
         "compiled) and, under tp, torch's "
         "DTensor loss_parallel (parallel_dims.loss_parallel_enabled: tp > 1 unless disable_loss_parallel)")
# fp8_saves_quantised off: uncompiled, each Float8Linear casts its input itself and saves its own
# fp8 copy, three of the attention norm's output and two of the MLP's (5 bytes an element, where the
# 16-bit count gives 4 and the quantised one 2); under tp one fp8 gather precedes them (2)
RUNTIME_RULES["torchtitan@2024-12"] = replace(
    RUNTIME_RULES["torchtitan@2024-12-compiled"], eager_norm_bytes=(36.0, 92.0), eager_swiglu=True, expanded_kv=True,
    eager_rope_bytes=RUNTIME_RULES["torchtitan"].eager_rope_bytes, fp8_saves_quantised=False,
    note="torchtitan of December 2024 without torch.compile (9dec370, the configs of docs/performance.md at "
         "d4c86e375: norm_type 'rmsnorm', torchtitan/models/norms.py's eager RMSNorm; loss_parallel under tp)")
RUNTIME_RULES["torchtitan@compile"] = replace(
    RUNTIME_RULES["torchtitan"], loss_bytes_per_logit=4.0, loss_parallel_bytes_per_logit=None, eager_swiglu=False,
    eager_rope_bytes=None,
    note="torchtitan with torch.compile of the model and the loss (training.compile from mid-2025, "
         "components/loss.py build_cross_entropy_loss; before, its train.py compiled no loss)")
RUNTIME_RULES["megatron@2022"] = RuntimeRules(
    (0, 1), (0, 1), True, True, "ends", "uniform", True, True,
    "Megatron-LM of 2021-22 (the SC21 and Korthikanti et al. runs): no TP comm overlap, gradients all-reduced "
    "after backward (dp_overlap false), no fused attention, no fp8 (Transformer Engine came in 2023)",
    precisions=("bf16", "fp16"))
RUNTIME_RULES["megatron@2021"] = replace(
    RUNTIME_RULES["megatron@2022"], grad_accum_bytes=(("fp16", 6.0), ("bf16", 6.0)),
    note="Megatron-LM of April 2021 (the SC21 runs; a8d172b31e, examples/pretrain_gpt3_175B.sh: --fp16, the local "
         "DistributedDataParallel without contiguous buffers, its default until e8fb052f81 of 2021-08-18): before "
         "gradient accumulation fusion (83b1e42f3, merged 2022-02-22), so autograd adds each micro-batch's "
         "gradients into the 16-bit .grad")
RUNTIME_RULES["deepspeed@2021"] = replace(
    RUNTIME_RULES["deepspeed"], grad_accum_bytes=(), kept_grad_bytes=(),
    note="DeepSpeed of 2021 as Megatron-DeepSpeed ran MT-NLG 530B in bf16 with its pipeline engine, before the "
         "public bf16 pipeline path (BF16_Optimizer with the pipeline engine: microsoft/DeepSpeed 56c522386, #1801, "
         "2022-04-19; public bf16 began with ZeRO-2's, 648f7bfa5, 2021-11-01): how it accumulated gradients "
         "is not published")
RUNTIME_RULES["nanotron"] = RuntimeRules(
    (0, 1), (0, 1), False, False, "none", "all", False, False,
    "nanotron 0.4 (export/nanotron.py): zero_stage 0 or 1, 1F1B without interleaving, no context parallelism, "
    "no expert parallelism within dp (expert_parallel_size multiplies the GPU count), layers split evenly, no "
    "activation recomputation, no FP8; ranks ep, pp, dp, tp outermost first",
    orders=("tp-cp-ep-dp-pp",), precisions=("bf16", "fp16"), recompute_modes=("none",),
    # v0.4 models/llama.py GLUActivation: act(gate) * up with nn/activations.py's SiLUActivation
    eager_swiglu=True,
    # v0.4 models/llama.py Loss: sharded_cross_entropy(..., dtype=torch.float), whose
    # _ShardedCrossEntropy (parallel/tensor_parallel/functional.py) holds at its peak the 16-bit
    # logits (2), their fp32 cast (4) and the shifted fp32 copy it exponentiates in place and
    # keeps as the softmax (4): 10 bytes a logit (its own code on CPU, one gloo rank: 10.02)
    loss_bytes_per_logit=10.0)
for _name, _note, _recipes, _te in (
        # Composer's amp_fp8 runs Transformer Engine's fp8_autocast with its default DelayedScaling
        ("composer", "MosaicML llm-foundry (FSDP, flash_attn; fp8 through Transformer Engine, delayed scaling)",
         ("delayed",), True),
        ("other", "a runtime not described here (flash_attn assumed)", FP8_RECIPES, False)):
    RUNTIME_RULES[_name] = RuntimeRules((0, 1, 2, 3), (0, 1, 2, 3), True, False, "any", "stage", True, True, _note,
                                        fp8_recipes=_recipes, fp8_saves_quantised=_te)
RUNTIME_RULES["composer@2023"] = replace(
    RUNTIME_RULES["composer"], attention=("fa-triton", "fa2"),
    note="llm-foundry of 2023 (the benchmark tables of b2a43a147, 2023-10-19): MPT's attn_impl 'triton', "
         "flash-attn's Triton FlashAttention (scripts/train/yamls/pretrain/mpt-*.yaml attn_config attn_impl: triton; "
         "scripts/train/benchmarking/submit_benchmarks.py --attn_impl default 'triton', which sweep.sh never "
         "overrides; '-e .[gpu]' installed flash-attn 1.0.9, no FlashAttention-2). Its throughput is measured on "
         "A100 only (Dao 2023, Fig. 4): on other GPUs FlashAttention-2's table prices it, too fast by what the "
         "Triton kernel loses there")


TARGETS = ("megatron", "deepspeed", "torchtitan", "nanotron")
"""the runtimes a plan is searched for when the request names none (the union of their spaces,
each strategy priced as the runtime that runs it)"""
OLDER_VERSIONS = ("torchtitan@0.2",)
"""records of a target's older versions that users still run (NAME@VERSION; NAME alone is the
newest checked): plannable and exportable by name, never part of the default union"""
OLD_NAMES = {"any": "ideal"}
"""record names plans and commands of earlier versions used"""


def record_name(runtime: str) -> str:
    """The record a runtime name stands for (an old name read as its new one)."""
    return OLD_NAMES.get(runtime, runtime)


def runtime_family(runtime: str) -> str:
    """A runtime record's family: its NAME before any @VERSION (torchtitan@2024-12 -> torchtitan)."""
    return runtime.split("@")[0]


def builds(model) -> bool:
    """Whether the supported runtimes build ModelSpec `model` at all: each builds transformer
    decoders only (no explicit layer graph, no encoder); the exporters refuse the rest
    (export/common.check_decoder) and the default plans such a model in the ideal space."""
    return not model.is_graph and model.causal


def dispatcher(runtime: str, requested: str = "") -> str:
    """The MoE dispatcher priced and exported: the one a setup names, else its runtime's default
    (a runtime no record describes: the plain all-to-all)."""
    if requested:
        return requested
    return RUNTIME_RULES[runtime].ep_dispatchers[0] if runtime in RUNTIME_RULES else "alltoall"


def dispatcher_refusal(runtime: str, requested: str) -> str | None:
    """Why `runtime` cannot move tokens with the dispatcher a setup names (None when it can): a
    dispatcher the runtime lacks is a freedom no run has."""
    runs = RUNTIME_RULES[runtime].ep_dispatchers
    if not requested or requested in runs:
        return None
    return f"runtime {runtime} has no {requested} MoE dispatcher (it runs {', '.join(runs)})"


def folding_refusal(runtime: str, folding: bool) -> str | None:
    """Why `runtime` cannot run folded experts (None when it can or when not asked)."""
    if not folding or RUNTIME_RULES[runtime].moe_folding:
        return None
    return f"runtime {runtime} has no MoE parallel folding (--moe-folding: expert tensor parallelism 1)"


def ep_overlap_refusal(runtime: str, ep_overlap: bool) -> str | None:
    """Why `runtime` cannot overlap expert all-to-alls with computation (None when it can or
    when the setup does not ask for it)."""
    if not ep_overlap or RUNTIME_RULES[runtime].ep_overlap:
        return None
    return f"runtime {runtime} has no expert-parallel communication overlap (--ep-overlap)"


# The rules of overlapping expert all-to-alls with computation, as Megatron-Core (the one runtime
# that runs it) states them (megatron-core 0.16.0 TransformerConfig.__post_init__ under
# overlap_moe_expert_parallel_comm), one predicate a knob: ep_overlap_problems reads them to refuse
# a strategy, search/space.py to enumerate the space.

def ep_overlap_runs_ep(ep: int) -> bool:
    """expert parallelism"""
    return ep > 1


def ep_overlap_runs_stages(pp: int, vpp: int) -> bool:
    """interleaved stages when there are pipeline stages (combined 1F1B pairs one micro-batch's
    forward with another's backward chunk by chunk)"""
    return pp == 1 or vpp > 1


def ep_overlap_runs_recompute(mode: str) -> bool:
    """no full recomputation"""
    return mode != "full"


def ep_overlap_runs_mtp(mtp_layers: int, pp: int) -> bool:
    """at most one MTP layer, and with one, pipeline stages"""
    return mtp_layers == 0 or mtp_layers == 1 and pp > 1


def ep_overlap_problems(s, model) -> list[str]:
    """Every ep-overlap rule above that Strategy `s` of `model` breaks (empty when it runs)."""
    problems = []
    if not ep_overlap_runs_ep(s.ep):
        problems.append(f"ep-overlap needs expert parallelism (ep {s.ep})")
    if not ep_overlap_runs_stages(s.pp, s.vpp):
        problems.append(f"ep-overlap with pipeline stages needs interleaving (pp {s.pp}, vpp {s.vpp})")
    if not ep_overlap_runs_recompute(s.recompute):
        problems.append("ep-overlap runs no full recomputation")
    if not ep_overlap_runs_mtp(model.mtp_layers, s.pp):
        problems.append(f"ep-overlap runs at most one MTP layer, and with one pipeline stages "
                        f"(the model has {model.mtp_layers}, pp {s.pp})")
    return problems


def shipped_names(runtime: str) -> str:
    """'llama3 8B, llama3 70B, ...': the models a runtime that builds them by name ships."""
    return ", ".join(f"{m.name} {m.flavor}" for m in RUNTIME_RULES[runtime].models)


def shipped_model(runtime: str, model) -> ShippedModel | None:
    """The runtime's own model that ModelSpec `model` is, where the runtime builds models by name."""
    return next((m for m in RUNTIME_RULES[runtime].models if m.matches(model)), None)


def model_refusal(runtime: str, model) -> str | None:
    """Why `runtime` cannot build `model` (None when it can): a runtime that builds models by name
    builds only those it ships."""
    rules = RUNTIME_RULES[runtime]
    if not rules.models or shipped_model(runtime, model) is not None:
        return None
    return (f"runtime {runtime} builds only the models it ships ({shipped_names(runtime)}); {model.name} is none of them "
            f"({model.layers} layers, hidden {model.hidden}, ffn {model.ffn_hidden}, vocab {model.vocab})")


def fp8_recipe(runtime: str, requested: str = "") -> str:
    """The fp8 recipe priced: the one asked for, else the runtime's default (its first)."""
    return requested or RUNTIME_RULES[runtime].fp8_recipes[0]


def fp8_recipe_refusal(runtime: str, precision: str, recipe: str) -> str | None:
    """Why `runtime` cannot train with fp8 recipe `recipe` (None when it can, or when none is asked)."""
    if not recipe:
        return None
    if precision != "fp8":
        return f"an fp8 recipe ({recipe}) needs precision fp8, got {precision}"
    rules = RUNTIME_RULES[runtime]
    if recipe not in rules.fp8_recipes:
        return f"runtime {runtime} has no fp8 recipe {recipe} (it runs {', '.join(rules.fp8_recipes)})"
    return None


def grad_reduce_refusal(runtime: str, precision: str, requested: str) -> str | None:
    """Why `runtime` cannot reduce gradients in `requested` (None when it can, or none is asked):
    bf16 or fp32 for a bf16 or fp8 run only: an fp16 run's gradients reduce in fp16
    (cost/step.dp_grad_bytes), and an fp32 reduction of them is not priced."""
    if not requested:
        return None
    if precision == "fp16":
        return (f"gradients reduced in {requested} need precision bf16 or fp8, got fp16 (whose gradients "
                f"reduce in fp16)")
    have = RUNTIME_RULES[runtime].grad_reduces
    if requested in have:
        return None
    return f"runtime {runtime} reduces gradients in {', '.join(have)} only, not {requested}"


def optimizer_states_refusal(runtime: str, precision: str, requested: str) -> str | None:
    """Why `runtime` cannot keep Adam's moments in `requested` (None when it can, or none is
    asked): bf16 moments for a bf16 or fp8 run only (cost/memory.optimizer_bytes prices the
    16-bit weights they sit beside as bf16)."""
    if not requested:
        return None
    have = RUNTIME_RULES[runtime].optimizer_states
    if requested not in have:
        return f"runtime {runtime} keeps Adam's moments in {', '.join(have)} only, not {requested}"
    if requested != have[0] and precision == "fp16":
        return f"optimizer states in {requested} need precision bf16 or fp8, got fp16"
    return None


def recompute_modules_refusal(runtime: str, requested: tuple[str, ...]) -> str | None:
    """Why `runtime` cannot be told which modules its selective recomputation recomputes (None
    when it can, or none are named)."""
    have = RUNTIME_RULES[runtime].recompute_modules
    missing = [m for m in requested if m not in have]
    if not missing:
        return None
    if not have:
        return f"runtime {runtime} has one selective recomputation of its own; it takes no recompute modules"
    return f"runtime {runtime} recomputes {', '.join(have)} selectively, not {', '.join(missing)}"


def loss_fusion_refusal(runtime: str, requested: str) -> str | None:
    """Why `runtime` cannot run the fused loss `requested` (None when it can, or none is asked)."""
    if not requested or requested in RUNTIME_RULES[runtime].loss_fusions:
        return None
    have = RUNTIME_RULES[runtime].loss_fusions
    return (f"runtime {runtime} runs no fused cross-entropy loss {requested!r}"
            + (f" (it runs {', '.join(have)})" if have else " (only its own loss)"))


def fp8_param_gather_refusal(runtime: str, precision: str, asked: bool) -> str | None:
    """Why `runtime` cannot keep and gather fp8 weights (None when it can, or it is not asked)."""
    if not asked:
        return None
    if precision != "fp8":
        return f"an fp8 parameter gather needs precision fp8, got {precision}"
    if not RUNTIME_RULES[runtime].fp8_param_gather:
        return f"runtime {runtime} has no fp8 parameter gather"
    return None


def precision_refusal(runtime: str, precision: str) -> str | None:
    """Why `runtime` cannot train in `precision` (None when it can): its record's precisions."""
    rules = RUNTIME_RULES[runtime]
    if precision in rules.precisions:
        return None
    return f"runtime {runtime} has no {precision} training (it trains in {', '.join(rules.precisions)})"


NO_NVLINK_FAMILIES = ("ada",)
"""GPU families whose parts have no NVLink (L40S, RTX 4090: PCIe only, their datasheets), which
Transformer Engine's comm+GEMM overlap needs between the tensor-parallel GPUs
(examples/pytorch/comm_gemm_overlap/README.md: "Tensor-parallel GPUs must be on a single node,
and connected over NVLink/NVSwitch")"""


def tp_overlap(runtime: str, sequence_parallel: bool, family: str, off: bool = False) -> bool:
    """Whether `runtime` hides tensor-parallel collectives behind GEMMs (RuntimeRules.tp_overlap)
    for a plan with or without sequence parallelism on GPUs of `family`, unless the setup turns it
    `off` (TrainingSetup.no_tp_overlap): userbuffers overlap the
    all-gathers and reduce-scatters sequence parallelism issues, and Megatron-LM refuses
    --tp-comm-overlap without it (megatron/training/arguments.py validate_args at 000c4ac:
    "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
    enabled"); over NVLink only (NO_NVLINK_FAMILIES). Priced for tp groups inside one node
    (cost/step.layer_cost); export/megatron.py turns it on for exactly those plans."""
    return RUNTIME_RULES[runtime].tp_overlap and sequence_parallel and family not in NO_NVLINK_FAMILIES and not off


def pool_stages_refusal(rule: str, libraries: set, node_sizes: set) -> str | None:
    """What a runtime whose record says `rule` (RuntimeRules.pool_stages) cannot run of a
    pipeline over pools whose GPUs run the collective `libraries` on nodes of `node_sizes` GPUs;
    None where it runs it (the search's space and the exports read this one rule)."""
    if rule == "none":
        return "a pipeline over pools of different GPUs (a layer count per stage)"
    if rule == "same_library" and len(libraries) > 1:
        return (f"stages on GPUs of {' and '.join(sorted(libraries))} (one collective library per job: NCCL and "
                "RCCL do not interoperate)")
    if rule == "same_library" and len(node_sizes) > 1:
        return (f"pools of {' and '.join(str(n) for n in sorted(node_sizes))} GPUs a node (its launch runs one "
                "process count on every node)")
    return None


def attention_kernel(runtime: str, kernels: tuple[str, ...]) -> str | None:
    """The kernel `runtime` runs of those a GPU has tables for (`kernels`), or None."""
    return next((k for k in RUNTIME_RULES[runtime].attention if k in kernels), None)
