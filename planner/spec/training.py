"""TrainingSetup (what is trained) and Strategy (how it is parallelised): frozen, validated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

from planner.errors import SpecError
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_SWEEP_COUNTS
from planner.placement import expert_pool

Precision = Literal["bf16", "fp16", "fp8"]
Attention = Literal["flash", "eager"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved-1f1b"]
RECOMPUTES = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved-1f1b")
MOE_DISPATCHERS = ("alltoall", "dedup")
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""how an fp8 run scales its tensors (Megatron-Core TransformerConfig.fp8_recipe, whose default is
'delayed' at Megatron-LM d98e8a64; 'tensorwise' is per-tensor current scaling, also torchao's
Float8Linear default; 'blockwise' Hopper's 1x128/128x128 blocks, 'mxfp8' Blackwell's 1x32):
what each costs is cost/compute.QUANT_BYTES"""
GRAD_REDUCES = ("fp32", "bf16")
"""the dtype a run's data-parallel gradient reduction and its gradient buffers take: fp32
(Megatron-LM accumulates and all-reduces bf16 runs' gradients in fp32: arguments.py sets
accumulate_allreduce_grads_in_fp32; FSDP2's reduce_dtype float32, torchtitan's
mixed_precision_reduce) or bf16 (Megatron-LM --grad-reduce-in-bf16, Megatron-Core
DistributedDataParallelConfig.grad_reduce_in_fp32 False, as NVIDIA's MLPerf configs run)"""
OPTIMIZER_STATES = ("fp32", "bf16")
"""the dtype of Adam's two moments: fp32 (every runtime's default) or bf16 (Megatron-LM
--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, Transformer Engine's
FusedAdam under the distributed optimizer, as DeepSeek-V3 trained and NVIDIA's MoE recipes run):
what each keeps and moves is cost/memory.optimizer_bytes"""
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act", "layernorm")
"""the parts of a layer a selective recomputation may recompute (Megatron-LM
--recompute-granularity selective --recompute-modules; megatron-core TransformerConfig
.recompute_modules at Megatron-LM 000c4ac, whose default is core_attn), in this order:
core_attn the attention core (Korthikanti et al. 2022's selective recomputation), mla_up_proj
MLA's up-projections and rotary embedding, mlp a dense layer's MLP, moe_act the experts'
activation, layernorm the norms that are modules of their own (MLA's input norm, an MoE layer's
pre-MLP norm; the others are fused into the linear they feed). What each drops and recomputes:
graph._selective_discarded and graph._selective_work. Megatron's 'moe' and 'shared_experts' are not
priced."""
DEFAULT_MODULES = ("core_attn",)
"""what selective recomputation recomputes where the request names no modules: Megatron-LM's
default and, for the runtimes without the knob, the attention core their selective mode prices"""
LOSS_FUSIONS = ("native", "te")
"""the fused cross-entropy losses a run may use in place of its runtime's own (Megatron-LM
--cross-entropy-loss-fusion with --cross-entropy-fusion-impl native or te: megatron-core
0.16.0 LanguageModule.compute_language_model_loss): 'native' is Megatron-Core's
fused_vocab_parallel_cross_entropy (its steps under torch.compile), 'te' Transformer Engine's
parallel_cross_entropy (Triton kernels); what each moves and keeps is graph.LOSSES"""
RECIPE_FAMILIES = {"mxfp8": ("blackwell",), "blockwise": ("hopper", "blackwell")}
"""the GPU families a block-scaled recipe runs on: MXFP8 is a Blackwell tensor-core format
(Megatron-Core TransformerConfig.fp8_recipe: "'mxfp8' for Blackwell architecture only"), the
1x128/128x128 block scaling Transformer Engine runs from Hopper on; delayed and per-tensor
scaling run wherever fp8 does"""


def recipe_gpu_refusal(recipe: str | None, gpu) -> str | None:
    """Why `gpu` cannot run fp8 recipe `recipe` (None when it can, or for no recipe)."""
    families = RECIPE_FAMILIES.get(recipe or "")
    if families and gpu.family not in families:
        return f"fp8 recipe {recipe} runs on {' and '.join(families)} GPUs only; {gpu.name} is {gpu.family}"
    return None
DEFAULT_HEADROOM = 0.05
"""share of each GPU's capacity `plan` keeps free by default (--memory-headroom): room for what
the model does not count (allocator spikes, NCCL's lazily created communicators, a larger
batch of a data loader). No runtime publishes a figure; 5 % of an 80 GiB GPU (4 GiB) covers
the 1-2 GiB that NCCL's initialisation alone was measured to take (stas00/ml-engineering,
training/performance/README.md). `estimate` and `validate` price at 0: what ran, fits."""


def checked_modules(value) -> tuple[str, ...]:
    """Recompute modules as a tuple in RECOMPUTE_MODULES' order, each once (a list, a tuple or a
    comma-separated string; empty: none named), else the SpecError that names the bad one."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"recompute-modules must be a list of {', '.join(RECOMPUTE_MODULES)}, got {value!r}")
    for name in value:
        if name not in RECOMPUTE_MODULES:
            raise SpecError(f"recompute-modules: {name!r} is not one the cost model prices "
                            f"({', '.join(RECOMPUTE_MODULES)})")
    return tuple(m for m in RECOMPUTE_MODULES if m in value)


MAX_MOE_IMBALANCE = 8.0
"""the largest moe-imbalance a setup takes: a rank's load at 8 balanced shares is a router sending
most tokens to one rank's experts, far past what load-balancing losses leave"""


def checked_imbalance(f) -> float:
    """A moe-imbalance as a float in [1, MAX_MOE_IMBALANCE], else the SpecError that says so."""
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1.0 <= f <= MAX_MOE_IMBALANCE:
        raise SpecError(f"moe-imbalance must be a number in [1, {MAX_MOE_IMBALANCE:g}] (the most loaded "
                        f"expert-parallel rank's tokens over a balanced share), got {f!r}")
    return float(f)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a request runs beyond its precision and parallelism: the TrainingSetup fields
    moe_dispatcher, ep_overlap, moe_folding, fp8_recipe, grad_reduce, fp8_param_gather,
    loss_fusion, moe_imbalance, no_tp_overlap, optimizer_states and recompute_modules as one value, what the CLI,
    planning and forecasts pass along (TrainingSetup
    checks them). folding None leaves it to the search: both layouts where the runtime folds
    (planning.moe_variants)."""

    dispatcher: str = ""
    ep_overlap: bool = False
    folding: bool | None = None
    fp8_recipe: str = ""
    grad_reduce: str = ""
    fp8_param_gather: bool = False
    loss_fusion: str = ""
    moe_imbalance: float = 1.0
    no_tp_overlap: bool = False
    optimizer_states: str = ""
    recompute_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "moe_imbalance", checked_imbalance(self.moe_imbalance))
        object.__setattr__(self, "recompute_modules", checked_modules(self.recompute_modules))

    def at(self, precision: str) -> "RunOptions":
        """The options a setup in `precision` takes: no fp8 recipe nor fp8 parameter gather below
        fp8, no bf16 optimizer states in fp16 (a pool of a mixed cluster whose GPU lacks the
        precision asked for trains in a fallback one, spec/pools.pool_precision)."""
        drop = {}
        if precision != "fp8" and (self.fp8_recipe or self.fp8_param_gather):
            drop.update(fp8_recipe="", fp8_param_gather=False)
        if precision == "fp16" and self.optimizer_states == "bf16":
            drop.update(optimizer_states="")
        return replace(self, **drop) if drop else self

    def setup_fields(self) -> dict:
        return {"moe_dispatcher": self.dispatcher, "ep_overlap": self.ep_overlap, "moe_folding": bool(self.folding),
                "fp8_recipe": self.fp8_recipe, "grad_reduce": self.grad_reduce,
                "fp8_param_gather": self.fp8_param_gather, "loss_fusion": self.loss_fusion,
                "moe_imbalance": self.moe_imbalance, "no_tp_overlap": self.no_tp_overlap,
                "optimizer_states": self.optimizer_states, "recompute_modules": self.recompute_modules}

    @classmethod
    def recorded(cls, training: dict) -> "RunOptions":
        """The options a plan's inputs.training records: the expert layout where it names one,
        else both searched again (absent: the defaults)."""
        return cls(dispatcher=training.get("moe_dispatcher", ""), ep_overlap=training.get("ep_overlap", False),
                   folding=training.get("moe_folding"), fp8_recipe=training.get("fp8_recipe", ""),
                   grad_reduce=training.get("grad_reduce", ""), fp8_param_gather=training.get("fp8_param_gather", False),
                   loss_fusion=training.get("loss_fusion", ""), moe_imbalance=training.get("moe_imbalance", 1.0),
                   no_tp_overlap=training.get("no_tp_overlap", False),
                   optimizer_states=training.get("optimizer_states", ""),
                   recompute_modules=tuple(training.get("recompute_modules", ())))


@dataclass(frozen=True, slots=True)
class TrainingSetup:
    gpus: int
    global_batch: int
    """sequences per optimizer step"""
    seq_len: int
    precision: Precision = "bf16"
    attention: Attention = "flash"
    runtime: str = "ideal"
    """the runtime record that shapes and prices strategies (runtimes.RUNTIME_RULES; 'any', the
    old name of 'ideal', reads as it)"""
    memory_headroom: float = 0.0
    """share of each GPU's capacity kept free (cost/memory.capacity_bytes)"""
    moe_dispatcher: str = ""
    """how MoE tokens reach their experts: 'alltoall' or 'dedup' (runtimes.RuntimeRules.ep_dispatchers);
    '' = the runtime's own"""
    ep_overlap: bool = False
    """overlap the expert all-to-alls of one micro-batch with another's computation
    (runtimes.RuntimeRules.ep_overlap; its rules: runtimes.ep_overlap_problems)"""
    moe_folding: bool = False
    """MoE parallel folding: expert layers without tensor parallelism (Megatron-Core's
    --expert-tensor-parallel-size 1), the expert-parallel group carved from tp x cp x dp rather
    than cp x dp (placement.folded_layout; runtimes.RuntimeRules.moe_folding)"""
    fp8_recipe: str = ""
    """how fp8 tensors are scaled (FP8_RECIPES; runtimes.RuntimeRules.fp8_recipes); '' = the
    runtime's own"""
    grad_reduce: str = ""
    """the dtype of the data-parallel gradient reduction and the gradient buffers (GRAD_REDUCES;
    runtimes.RuntimeRules.grad_reduces); '' = the runtime's own (fp32)"""
    fp8_param_gather: bool = False
    """fp8 runs: keep the layers' GEMM weights in fp8 and all-gather them so (Megatron-LM
    --fp8-param-gather; runtimes.RuntimeRules.fp8_param_gather): the distributed optimizer's and
    ZeRO-3's weight gathers move 1 byte a parameter of the transformer layers"""
    loss_fusion: str = ""
    """a fused cross-entropy loss (LOSS_FUSIONS; runtimes.RuntimeRules.loss_fusions); '' = the
    runtime's own loss"""
    moe_imbalance: float = 1.0
    """MoE routing: the token-expert pairs the most loaded expert-parallel rank receives over a
    balanced share (1 to MAX_MOE_IMBALANCE; graph.Ctx.moe_imbalance). 1 is balanced routing, what
    the published benchmark runs force (force-balanced routers, token dropping at capacity factor
    1): the default, so a plan prices the best case unless told how unevenly a router spreads"""
    no_tp_overlap: bool = False
    """keep the tensor-parallel collectives exposed where the runtime could hide them behind the
    GEMMs (runtimes.tp_overlap): a launch without Megatron-LM's --tp-comm-overlap, NeMo's
    ub_tp_comm_overlap false; the export then leaves it off"""
    optimizer_states: str = ""
    """the dtype of Adam's moments (OPTIMIZER_STATES; runtimes.RuntimeRules.optimizer_states),
    kept so under a sharded optimizer (ZeRO >= 1: Megatron-Core asserts its distributed optimizer
    for --use-precision-aware-optimizer); '' = the runtime's own (fp32)"""
    recompute_modules: tuple[str, ...] = ()
    """what a strategy's selective recomputation recomputes (RECOMPUTE_MODULES;
    runtimes.RuntimeRules.recompute_modules); () = DEFAULT_MODULES, the attention core"""

    def __post_init__(self) -> None:
        for name, most in (("gpus", MAX_GPUS), ("global_batch", MAX_GLOBAL_BATCH), ("seq_len", MAX_SEQ_LEN)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
            if value > most:
                raise SpecError(f"{name.replace('_', '-')} {value:,}: at most {most:,}")
        h = self.memory_headroom
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 <= h < 1.0:
            raise SpecError(f"memory-headroom must be a fraction in [0, 1), got {h!r}")
        from planner.runtimes import (RUNTIME_RULES, dispatcher_refusal, ep_overlap_refusal, folding_refusal,
                                      fp8_param_gather_refusal, fp8_recipe_refusal, grad_reduce_refusal,
                                      loss_fusion_refusal, optimizer_states_refusal, precision_refusal,
                                      record_name, recompute_modules_refusal)
        object.__setattr__(self, "runtime", record_name(self.runtime))
        if self.runtime not in RUNTIME_RULES:
            raise SpecError(f"runtime must be one of {', '.join(RUNTIME_RULES)}, got {self.runtime!r}")
        if self.fp8_recipe not in ("", *FP8_RECIPES):
            raise SpecError(f"fp8-recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.moe_dispatcher not in ("", *MOE_DISPATCHERS):
            raise SpecError(f"moe-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {self.moe_dispatcher!r}")
        if self.grad_reduce not in ("", *GRAD_REDUCES):
            raise SpecError(f"grad-reduce must be one of {', '.join(GRAD_REDUCES)}, got {self.grad_reduce!r}")
        if self.loss_fusion not in ("", *LOSS_FUSIONS):
            raise SpecError(f"loss-fusion must be one of {', '.join(LOSS_FUSIONS)}, got {self.loss_fusion!r}")
        if self.optimizer_states not in ("", *OPTIMIZER_STATES):
            raise SpecError(f"optimizer-states must be one of {', '.join(OPTIMIZER_STATES)}, "
                            f"got {self.optimizer_states!r}")
        for name in ("ep_overlap", "moe_folding", "fp8_param_gather", "no_tp_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name.replace('_', '-')} must be true or false, got {getattr(self, name)!r}")
        object.__setattr__(self, "moe_imbalance", checked_imbalance(self.moe_imbalance))
        object.__setattr__(self, "recompute_modules", checked_modules(self.recompute_modules))
        refused = (precision_refusal(self.runtime, self.precision)
                   or fp8_recipe_refusal(self.runtime, self.precision, self.fp8_recipe)
                   or dispatcher_refusal(self.runtime, self.moe_dispatcher)
                   or ep_overlap_refusal(self.runtime, self.ep_overlap)
                   or folding_refusal(self.runtime, self.moe_folding)
                   or grad_reduce_refusal(self.runtime, self.precision, self.grad_reduce)
                   or fp8_param_gather_refusal(self.runtime, self.precision, self.fp8_param_gather)
                   or loss_fusion_refusal(self.runtime, self.loss_fusion)
                   or optimizer_states_refusal(self.runtime, self.precision, self.optimizer_states)
                   or recompute_modules_refusal(self.runtime, self.recompute_modules))
        if refused:
            raise SpecError(refused)

    @property
    def dispatcher(self) -> str:
        """the MoE dispatcher priced: the one asked for, else the runtime's (runtimes.dispatcher)"""
        from planner.runtimes import dispatcher
        return dispatcher(self.runtime, self.moe_dispatcher)

    @property
    def quantisation(self) -> str | None:
        """the fp8 recipe priced (the one asked for, else the runtime's: runtimes.fp8_recipe);
        None below fp8"""
        from planner.runtimes import fp8_recipe
        return fp8_recipe(self.runtime, self.fp8_recipe) if self.precision == "fp8" else None

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("moe_dispatcher", "fp8_recipe", "grad_reduce", "loss_fusion", "optimizer_states"):
            if not out[name]:
                del out[name]  # the runtime's own: plans made before the knob read alike
        for name in ("ep_overlap", "moe_folding", "fp8_param_gather", "no_tp_overlap"):
            if not out[name]:
                del out[name]  # plans made before the knob read alike
        if out["moe_imbalance"] == 1.0:
            del out["moe_imbalance"]  # balanced routing: plans made before the knob read alike
        if out["recompute_modules"]:
            out["recompute_modules"] = list(out["recompute_modules"])
        else:
            del out["recompute_modules"]  # the runtime's own: plans made before the knob read alike
        return out

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """what selective recomputation recomputes: the modules named, else DEFAULT_MODULES"""
        return self.recompute_modules or DEFAULT_MODULES

    def expert_tp(self, tp: int, model) -> int:
        """The experts' tensor parallelism under dense tensor parallelism tp: 1 when folded (a
        model without experts has none to fold)."""
        return 1 if self.moe_folding and getattr(model, "moe", None) is not None else tp


@dataclass(frozen=True, slots=True)
class Strategy:
    """One parallel strategy. GPUs = dp * tp * pp * cp (Megatron-Core); ep divides dp * cp."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    """virtual pipeline stages per pipeline rank (interleaving)"""
    micro_batch: int = 1
    zero: int = 1
    recompute: Recompute = "none"
    recompute_layers: int | None = None
    """with recompute 'full': layers per stage recomputed (None = all of them)"""
    sequence_parallel: bool = False
    dp_overlap: bool = True
    schedule: Schedule = "1f1b"
    order: str = "tp-cp-ep-dp-pp"
    dp_shard: int = 0
    """hybrid sharding: ZeRO shards the states over groups of dp_shard consecutive data-parallel
    ranks (times cp) and replicates them across the dp / dp_shard groups, which all-reduce their
    gradient shards (torchtitan's data_parallel_shard_degree beside data_parallel_replicate_degree,
    Megatron's --num-distributed-optimizer-instances); 0: over all of dp"""

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def to_dict(self, global_batch: int) -> dict:
        d = asdict(self)
        d["num_microbatches"] = self.num_microbatches(global_batch)
        if d["recompute_layers"] is None:
            del d["recompute_layers"]
        if not d["dp_shard"]:
            del d["dp_shard"]
        del d["order"]
        return d


def strategy_problems(s: Strategy, model, setup: TrainingSetup) -> list[str]:
    """Every rule the strategy breaks, each naming its factors (empty when legal)."""
    problems = []
    gpus = s.dp * s.tp * s.pp * s.cp
    if gpus != setup.gpus:
        problems.append(f"dp*tp*pp*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp} = {gpus} is not the GPU count {setup.gpus}")
    below_one = [f"{name} ({getattr(s, name)}) must be >= 1"
                 for name in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch") if getattr(s, name) < 1]
    if below_one:  # the rules below divide by these
        return problems + below_one
    etp = setup.expert_tp(s.tp, model)
    pool, named = expert_pool(s.tp, s.cp, s.dp, etp)
    if pool % s.ep:
        problems.append(f"ep ({s.ep}) must divide {named} ({pool})")
    elif s.ep > 1 or etp < s.tp and model.moe is not None:
        from planner.placement import has_expert_layout
        try:
            laid_out = has_expert_layout(s.order, s.tp, s.cp, s.dp, s.pp, s.ep, etp)
        except SpecError:
            laid_out = True  # an order that is no order: placement says so where it reads it
        if not laid_out and etp < s.tp:
            problems.append(f"ep ({s.ep}) of folded experts cannot be laid out under order {s.order}: with pp > 1 "
                            f"before dp it needs ep = tp*cp ({s.tp * s.cp}), as Megatron-Core's expert ranks")
        elif not laid_out:
            problems.append(f"ep ({s.ep}) cannot be carved from cp ({s.cp}) x dp ({s.dp}) under order {s.order}: ep "
                            "must divide the inner one's degree or be a multiple of it")
    if setup.global_batch % (s.dp * s.micro_batch):
        problems.append(f"global batch ({setup.global_batch}) must be divisible by dp*micro_batch ({s.dp}*{s.micro_batch})")
    if s.zero not in (0, 1, 2, 3):
        problems.append(f"zero ({s.zero}) must be 0, 1, 2 or 3")
    if s.dp_shard:
        if not 1 < s.dp_shard < s.dp or s.dp % s.dp_shard:
            problems.append(f"dp_shard ({s.dp_shard}) must divide dp ({s.dp}) and lie strictly between 1 and dp")
        if s.zero == 0:
            problems.append("dp_shard needs a ZeRO stage >= 1 (ZeRO-0 shards nothing)")
        if model.moe is not None:
            problems.append(f"dp_shard with experts ({model.name}) is not priced: expert states shard over their own "
                            "data-parallel group")
    if s.recompute not in RECOMPUTES:
        problems.append(f"recompute ({s.recompute}) must be one of {', '.join(RECOMPUTES)}")
    if s.recompute_layers is not None and s.recompute != "full":
        problems.append("recompute_layers applies only to recompute 'full'")
    if s.sequence_parallel and s.tp == 1:
        problems.append("sequence_parallel needs tp > 1 (tp is 1)")
    if s.schedule not in SCHEDULES:
        problems.append(f"schedule ({s.schedule}) must be one of {', '.join(SCHEDULES)}")
    if s.vpp > 1 and s.schedule != "interleaved-1f1b":
        problems.append(f"vpp ({s.vpp}) > 1 needs the interleaved-1f1b schedule")
    if s.vpp > 1 and s.pp == 1:
        problems.append(f"vpp ({s.vpp}) > 1 needs pp > 1")
    if s.schedule == "interleaved-1f1b" and s.vpp == 1:
        problems.append("the interleaved-1f1b schedule needs vpp > 1 (with one chunk a stage it is 1f1b)")
    m = s.num_microbatches(setup.global_batch)
    if s.schedule == "interleaved-1f1b" and s.pp > 1 and m % s.pp:
        problems.append(f"interleaved-1f1b needs num_microbatches ({m}) to be a multiple of pp ({s.pp})")
    if model.is_graph:
        if s.tp > 1 or s.cp > 1 or s.ep > 1:
            problems.append(f"an explicit-graph model ({model.name}) supports dp and pp only (tp={s.tp}, cp={s.cp}, ep={s.ep})")
    else:
        if model.heads % s.tp:
            problems.append(f"tp ({s.tp}) must divide heads ({model.heads})")
        elif model.kv_heads % s.tp and s.tp % model.kv_heads:
            problems.append(f"tp ({s.tp}) and kv_heads ({model.kv_heads}) must divide one another")
        if setup.seq_len % s.cp:
            problems.append(f"cp ({s.cp}) must divide seq_len ({setup.seq_len})")
        if s.ep > 1 and model.moe is None:
            problems.append(f"ep ({s.ep}) > 1 needs a mixture-of-experts model ({model.name} has no experts)")
        if model.moe is not None and model.moe.experts % s.ep:
            problems.append(f"ep ({s.ep}) must divide experts ({model.moe.experts})")
    if s.pp * s.vpp > model.layers:
        problems.append(f"pp*vpp ({s.pp}*{s.vpp}) exceeds the model's layers ({model.layers})")
    if s.recompute_layers is not None and s.recompute_layers * s.pp > model.layers + s.pp:
        problems.append(f"recompute_layers ({s.recompute_layers}) exceeds the layers of a stage")
    if setup.ep_overlap:
        from planner.runtimes import ep_overlap_problems
        problems += ep_overlap_problems(s, model)
    return problems


def check_strategy(s: Strategy, model, setup: TrainingSetup) -> None:
    problems = strategy_problems(s, model, setup)
    if problems:
        raise SpecError("illegal strategy: " + "; ".join(problems))


STRATEGY_KNOBS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "zero", "recompute", "recompute_layers",
                  "sequence_parallel", "dp_overlap", "schedule", "order", "dp_shard")


def resolve_strategy(fixed: dict, setup: TrainingSetup) -> Strategy:
    """A full strategy from the knobs given; the rest take the documented defaults:
    tp = pp = cp = ep = vpp = micro_batch = 1, dp = gpus / (tp*pp*cp), zero 1 (distributed
    optimizer), recompute none, sequence_parallel = (tp > 1), dp_overlap on, schedule
    interleaved-1f1b when vpp > 1 else 1f1b, order tp-cp-ep-dp-pp."""
    knobs = {k: v for k, v in fixed.items() if v is not None}
    unknown = set(knobs) - set(STRATEGY_KNOBS)
    if unknown:
        raise SpecError(f"unknown strategy knob(s): {', '.join(sorted(unknown))}")
    tp, pp, cp = knobs.get("tp", 1), knobs.get("pp", 1), knobs.get("cp", 1)
    if "dp" not in knobs:
        inner = tp * pp * cp
        if inner <= 0:
            raise SpecError(f"illegal strategy: tp, pp and cp must be >= 1 (got {tp}, {pp}, {cp})")
        # an inferred dp that cannot fill the GPUs is reported with every other broken rule
        knobs["dp"] = max(1, setup.gpus // inner)
    vpp = knobs.get("vpp", 1)
    knobs.setdefault("sequence_parallel", tp > 1)
    knobs.setdefault("schedule", "interleaved-1f1b" if vpp > 1 else "1f1b")
    return Strategy(**knobs)


def check_gpu_count(gpus: int, gpus_per_node: int, unit: str = "nodes") -> None:
    """Below one node any count is a partial node; above one node it must fill whole nodes
    (`gpus_per_node` and `unit` as Cluster.count_unit gives them: hosts where a node spans
    several)."""
    if gpus > gpus_per_node and gpus % gpus_per_node:
        lower = gpus // gpus_per_node * gpus_per_node
        raise SpecError(f"--gpus {gpus} does not fill whole {unit} of {gpus_per_node} GPUs "
                        f"(nearest: {lower} or {lower + gpus_per_node})")


def parse_gpu_counts(text: str, gpus_per_node: int, unit: str = "nodes", limit: int = MAX_SWEEP_COUNTS) -> list[int]:
    """'512', '512,1024,2048', '512-4096' (every whole-node count in the range) or '64-8192:x2'
    (LO, then each count times the factor, up to HI: a purchase sweep), each at most MAX_GPUS, at
    most `limit` of them (both checked before any list is built); `gpus_per_node` and `unit` as
    check_gpu_count's."""
    try:
        if ":x" in text:
            span, factor = text.split(":x", 1)
            lo, hi = (int(x) for x in span.split("-", 1))
            k = int(factor)
            if lo < 1 or hi < lo or k < 2:
                raise ValueError
            _check_gpus(text, hi)
            counts = []
            n = lo
            while n <= hi:
                counts.append(n)
                n *= k
        elif "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            _check_gpus(text, hi)
            g = gpus_per_node
            small = max(0, min(hi, g) - lo + 1)  # counts up to one node
            whole = max(0, hi // g - max(lo - 1, g) // g)  # multiples of a node above it
            if small + whole > limit:
                raise SpecError(f"--gpus {text!r} covers {small + whole:,} counts; at most {limit:,} per sweep")
            counts = [n for n in range(lo, min(hi, g) + 1)] + [n * g for n in range(max(lo - 1, g) // g + 1, hi // g + 1)]
        else:
            parts = text.split(",")
            if len(parts) > limit:
                raise SpecError(f"--gpus {text!r} lists {len(parts):,} counts; at most {limit:,} per sweep")
            counts = sorted({int(x) for x in parts})
    except ValueError:
        raise SpecError(f"--gpus {text!r}: expected a count, a list (512,1024), a range (512-4096) or a geometric "
                        "range (64-8192:x2)") from None
    if not counts or min(counts) < 1:
        raise SpecError(f"--gpus {text!r}: no positive GPU count in it" if "-" not in text else
                        f"--gpus {text!r}: no count in it fills whole {unit} of {gpus_per_node} GPUs")
    _check_gpus(text, max(counts))
    return counts


def _check_gpus(text: str, most: int) -> None:
    if most > MAX_GPUS:
        raise SpecError(f"--gpus {text!r}: at most {MAX_GPUS:,} GPUs")
