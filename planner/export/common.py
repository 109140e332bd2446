"""What every exporter shares: the plan read once into typed values, and the runtime-independent
checks (batch arithmetic, even split, rank order, one recompute policy) with one refusal format.

An exporter never adjusts a plan to fit its runtime: a plan the runtime cannot execute as priced
is refused with an ExportError saying what the runtime lacks and what the plan has.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from planner.errors import ExportError, PlanFormatError
from planner.schema import SCHEMAS
from planner.spec.model import ModelSpec

Chunk = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline rank of the plan."""

    chunks: tuple[Chunk, ...]
    """layer ranges [start, end) it holds, one per virtual stage, in schedule order"""
    recompute_layers: int
    """layers it recomputes fully, allocated to its chunks first to last (cost/step.py)"""

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.chunks)

    @property
    def layers(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True, slots=True)
class PlanView:
    """The parts of a planner.plan/v1 document that exporters read."""

    model: ModelSpec
    gpus: int
    global_batch: int
    seq_len: int
    precision: str
    attention: str
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    micro_batch: int
    num_microbatches: int
    zero: int
    recompute: str
    sequence_parallel: bool
    dp_overlap: bool
    schedule: str
    order: str
    stages: tuple[Stage, ...]
    dispatcher: str = "alltoall"
    """the MoE dispatcher the plan was priced with (TrainingSetup.dispatcher)"""
    ep_overlap: bool = False
    """expert all-to-alls overlapped with another micro-batch's computation (TrainingSetup.ep_overlap)"""
    moe_folding: bool = False
    """expert layers without tensor parallelism (TrainingSetup.moe_folding)"""
    fp8_recipe: str = ""
    """the fp8 recipe the plan was priced with (TrainingSetup.quantisation; '' below fp8)"""
    grad_reduce: str = ""
    """the dtype it reduces gradients in where the request named one (TrainingSetup.grad_reduce)"""
    fp8_param_gather: bool = False
    """fp8 weights gathered in fp8 (TrainingSetup.fp8_param_gather)"""
    loss_fusion: str = ""
    """the fused cross-entropy loss it was priced with where the request named one
    (TrainingSetup.loss_fusion)"""
    no_tp_overlap: bool = False
    """tensor-parallel collectives priced exposed (TrainingSetup.no_tp_overlap)"""
    optimizer_states: str = ""
    """the dtype of Adam's moments where the request named one (TrainingSetup.optimizer_states)"""
    recompute_modules: tuple[str, ...] = ()
    """what selective recomputation recomputes where the request named it
    (TrainingSetup.recompute_modules)"""
    dp_shard: int = 0
    """hybrid sharding's shard group of data-parallel ranks (Strategy.dp_shard; 0: all of dp)"""
    pool_shares: tuple[str, ...] = ()
    """the mixed cluster's pools holding a share of the batch, where there are several
    (search/shares.py: the strategy block is then one of theirs)"""
    stage_pools: tuple[str, ...] = ()
    """the pool of every stage of a pipeline over a mixed cluster's pools (search/pool_stages.py),
    () on one kind of GPU"""
    stage_libraries: tuple[str, ...] = ()
    """the collective library of every stage's GPUs (spec/hardware.COLLECTIVES), beside stage_pools"""
    stage_node_sizes: tuple[int, ...] = ()
    """the GPUs a node of every stage's pool, beside stage_pools"""
    tp_tier: str = ""
    """the network tier of the plan's slowest tensor-parallel group (placement.tiers.tp:
    'intra_node' where every tp group sits inside one node); '' where the plan does not say"""
    families: tuple[str, ...] = ()
    """the GPU families the plan runs on (its cluster's, or its pools')"""

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Layers of every virtual stage, all ranks."""
        return tuple(n for st in self.stages for n in st.sizes)

    @property
    def recompute_counts(self) -> tuple[int, ...]:
        return tuple(st.recompute_layers for st in self.stages)

    def virtual_stages(self) -> list[Chunk]:
        """All pp*vpp layer ranges in pipeline order: virtual stage j*pp + i is chunk j of rank i
        (the looped layout of Megatron's interleaved schedule and torchtitan's looped schedules)."""
        ordered = [st.chunks[j] for j in range(self.vpp) for st in self.stages]
        if any(len(st.chunks) != self.vpp for st in self.stages) or not ordered \
                or ordered[0][0] != 0 or ordered[-1][1] != self.model.layers \
                or any(a[1] != b[0] for a, b in pairwise(ordered)):
            raise PlanFormatError(f"plan stages do not tile the model's {self.model.layers} layers "
                                  f"as {self.pp} ranks of {self.vpp} chunks")
        return ordered


def _get(doc: dict, path: str):
    node = doc
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise PlanFormatError(f"plan has no {path!r}")
        node = node[key]
    return node


def read(plan: dict) -> PlanView:
    """The plan's model, training setup, strategy and stages (PlanFormatError naming a missing key)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("schema"), str) or plan["schema"] not in SCHEMAS:
        found = plan.get("schema") if isinstance(plan, dict) else type(plan).__name__
        raise PlanFormatError(f"schema {found!r} is not one of {', '.join(SCHEMAS)}")
    model = ModelSpec.from_dict(_get(plan, "inputs.model"), "plan inputs.model")
    training, strategy = _get(plan, "inputs.training"), _get(plan, "strategy")
    stages = []
    for i, st in enumerate(_get(plan, "stages")):
        ranges = st.get("chunks") or [st.get("layers")]
        if not all(isinstance(r, list) and len(r) == 2 for r in ranges) or "recompute_layers" not in st:
            raise PlanFormatError(f"plan stage {i} needs 'layers' (or 'chunks') and 'recompute_layers'")
        stages.append(Stage(chunks=tuple((int(a), int(b)) for a, b in ranges),
                            recompute_layers=int(st["recompute_layers"])))
    knobs = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "num_microbatches", "zero", "recompute",
             "sequence_parallel", "schedule")
    s = {key: _get(plan, f"strategy.{key}") for key in knobs}
    t = {key: _get(plan, f"inputs.training.{key}") for key in ("gpus", "global_batch", "seq_len", "precision")}
    from planner.runtimes import dispatcher, fp8_recipe, record_name
    from planner.spec.hardware import collective_library
    pools = {p.get("name"): p.get("cluster", {}) for p in _get(plan, "inputs.cluster").get("pools", [])
             if isinstance(p, dict)}
    stage_pools = tuple(str(st["pool"]) for st in _get(plan, "stages") if "pool" in st)
    if stage_pools and (len(stage_pools) != len(stages) or not set(stage_pools) <= set(pools)):
        raise PlanFormatError("plan stages name pools the plan's inputs.cluster does not hold")
    gpus_of = {name: c.get("gpu", {}) for name, c in pools.items()}
    libraries = tuple(collective_library(gpus_of[p].get("family", ""), gpus_of[p].get("name", p)) for p in stage_pools)
    node_sizes = tuple(int(pools[p].get("gpus_per_node", 0)) for p in stage_pools)
    families = tuple(sorted({str(g.get("family", "")) for g in gpus_of.values()} if pools
                            else {str(_get(plan, "inputs.cluster").get("gpu", {}).get("family", ""))}))
    return PlanView(model=model, attention=training.get("attention", "flash"),
                    dp_overlap=strategy.get("dp_overlap", True), order=_get(plan, "placement.order"),
                    stages=tuple(stages),
                    dispatcher=dispatcher(record_name(training.get("runtime", "ideal")),
                                          training.get("moe_dispatcher", "")),
                    ep_overlap=training.get("ep_overlap", False) is True,
                    moe_folding=training.get("moe_folding", False) is True,
                    fp8_recipe=(fp8_recipe(record_name(training.get("runtime", "ideal")), training.get("fp8_recipe", ""))
                                if t["precision"] == "fp8" else ""),
                    grad_reduce=str(training.get("grad_reduce", "")),
                    fp8_param_gather=training.get("fp8_param_gather", False) is True,
                    loss_fusion=str(training.get("loss_fusion", "")),
                    no_tp_overlap=training.get("no_tp_overlap", False) is True,
                    optimizer_states=str(training.get("optimizer_states", "")),
                    recompute_modules=tuple(training.get("recompute_modules", ())),
                    dp_shard=int(strategy.get("dp_shard", 0)),
                    pool_shares=tuple(p["name"] for p in plan.get("pools", []) if p.get("share")),
                    stage_pools=stage_pools, stage_libraries=libraries, stage_node_sizes=node_sizes,
                    tp_tier=str(plan.get("placement", {}).get("tiers", {}).get("tp", "")), families=families, **t, **s)


def refusal(runtime: str, lacks: str, plan_has: str) -> ExportError:
    """The one-line refusal: what the runtime lacks, then what the plan has."""
    return ExportError(f"cannot export to {runtime}: {runtime} {lacks}; the plan has {plan_has}")


def require(ok: bool, runtime: str, lacks: str, plan_has: str) -> None:
    if not ok:
        raise refusal(runtime, lacks, plan_has)


def check_batch(v: PlanView, runtime: str) -> None:
    """global batch = micro_batch * dp * num_microbatches, as every runtime's batch arithmetic needs."""
    per_step = v.micro_batch * v.dp
    require(v.global_batch % per_step == 0 and v.global_batch // per_step == v.num_microbatches, runtime,
            "needs the global batch to be micro_batch * dp * micro-batches",
            f"global batch {v.global_batch}, micro_batch {v.micro_batch}, dp {v.dp}, "
            f"{v.num_microbatches} micro-batches")


def check_gpus(v: PlanView, runtime: str) -> None:
    require(v.dp * v.tp * v.pp * v.cp == v.gpus, runtime, "needs dp*tp*pp*cp to be the GPU count",
            f"{v.dp}*{v.tp}*{v.pp}*{v.cp} for {v.gpus} GPUs")


def describe_split(v: PlanView) -> str:
    if v.vpp > 1:
        return "virtual stages of " + "/".join(str(n) for n in v.chunk_sizes) + " layers"
    return "stages of " + "/".join(str(st.layers) for st in v.stages) + " layers"


def check_even_split(v: PlanView, runtime: str) -> None:
    """Every (virtual) stage holds the same number of layers."""
    require(len(set(v.chunk_sizes)) == 1, runtime, "has no uneven pipeline split", describe_split(v))


def check_rank_order(v: PlanView, runtime: str, orders: tuple[str, ...]) -> None:
    """The rank order matters only when both dp and pp exceed 1 (the two orders differ in them)."""
    require(v.order in orders or v.dp == 1 or v.pp == 1, runtime,
            f"places ranks only as {' or '.join(orders)}", f"rank order {v.order}")


def check_transformer(v: PlanView, runtime: str) -> None:
    require(not v.model.is_graph, runtime, "needs a transformer model spec",
            f"an explicit layer graph ({v.model.name})")


def check_shares(v: PlanView, record: str | None, runtime: str) -> None:
    """A plan of batch shares over several pools runs only where its runtime's record says it
    runs them (RuntimeRules.batch_shares)."""
    from planner.runtimes import RUNTIME_RULES
    if len(v.pool_shares) > 1 and not (record in RUNTIME_RULES and RUNTIME_RULES[record].batch_shares):
        raise refusal(runtime, "runs only one strategy, with an equal batch share on every data-parallel replica",
                      f"replicas of different kinds with their own strategies and batch shares over pools "
                      f"{', '.join(v.pool_shares)}")


def check_pool_stages(v: PlanView, record: str | None, runtime: str) -> None:
    """A pipeline whose stages sit on several pools runs only where its runtime's record runs
    that one (RuntimeRules.pool_stages, read by runtimes.pool_stages_refusal)."""
    from planner.runtimes import RUNTIME_RULES, pool_stages_refusal
    if len(set(v.stage_pools)) <= 1:
        return
    rule = RUNTIME_RULES[record].pool_stages if record in RUNTIME_RULES else "none"
    why = pool_stages_refusal(rule, set(v.stage_libraries), set(v.stage_node_sizes))
    if why:
        raise ExportError(f"cannot export to {runtime}: {runtime} does not run {why}; the plan has pipeline stages "
                          f"over pools {', '.join(dict.fromkeys(v.stage_pools))}")


def check_record(v: PlanView, record: str, runtime: str) -> None:
    """What the runtime's capability record (planner/runtimes.py) refuses of the plan's strategy,
    of the MoE dispatcher it was priced with and of its expert-parallel overlap, the record the
    search and `estimate --runtime` read: an exporter refuses at least that."""
    from planner.runtimes import (RUNTIME_RULES, ep_overlap_problems, ep_overlap_refusal,
                                  fp8_param_gather_refusal, folding_refusal, grad_reduce_refusal,
                                  loss_fusion_refusal, optimizer_states_refusal, recompute_modules_refusal)
    from planner.spec.training import Strategy
    s = Strategy(dp=v.dp, tp=v.tp, pp=v.pp, cp=v.cp, ep=v.ep, vpp=v.vpp, micro_batch=v.micro_batch, zero=v.zero,
                 recompute=v.recompute, sequence_parallel=v.sequence_parallel, dp_overlap=v.dp_overlap,
                 schedule=v.schedule, order=v.order, dp_shard=v.dp_shard)
    why = RUNTIME_RULES[record].refusal(s, v.model, v.tp if v.moe_folding else 1)
    if not why and v.ep > 1 and v.dispatcher not in RUNTIME_RULES[record].ep_dispatchers:
        why = (f"the {v.dispatcher} MoE dispatcher the plan was priced with (it moves tokens with "
               f"{', '.join(RUNTIME_RULES[record].ep_dispatchers)})")
    if not why and v.moe_folding and v.ep > 1 and v.tp > 1 and folding_refusal(record, True):
        why = "MoE parallel folding (expert tensor parallelism 1 under tp > 1)"
    if not why and v.fp8_recipe and v.fp8_recipe not in RUNTIME_RULES[record].fp8_recipes:
        why = f"the {v.fp8_recipe} fp8 recipe the plan was priced with (it runs {', '.join(RUNTIME_RULES[record].fp8_recipes)})"
    if not why and grad_reduce_refusal(record, v.precision, v.grad_reduce):
        why = f"gradients reduced in {v.grad_reduce} (it reduces in {', '.join(RUNTIME_RULES[record].grad_reduces)})"
    if not why and fp8_param_gather_refusal(record, v.precision, v.fp8_param_gather):
        why = "fp8 weights gathered in fp8 (--fp8-param-gather)"
    if not why and optimizer_states_refusal(record, v.precision, v.optimizer_states):
        why = (f"Adam's moments kept in {v.optimizer_states} (it keeps them in "
               f"{', '.join(RUNTIME_RULES[record].optimizer_states)})")
    if not why and recompute_modules_refusal(record, v.recompute_modules):
        why = f"selective recomputation of {', '.join(v.recompute_modules)} (--recompute-modules)"
    if not why and loss_fusion_refusal(record, v.loss_fusion):
        why = f"the fused {v.loss_fusion} cross-entropy loss the plan was priced with (--loss-fusion)"
    if not why and v.ep_overlap and ep_overlap_refusal(record, True):
        why = "expert all-to-alls overlapped with computation (--ep-overlap)"
    if not why and v.ep_overlap and (problems := ep_overlap_problems(s, v.model)):
        raise ExportError(f"cannot export to {runtime}: " + "; ".join(problems))
    if why:
        raise ExportError(f"cannot export to {runtime}: {runtime} does not run {why}")


def check_decoder(v: PlanView, runtime: str, trains: str = "trains causal decoders only") -> None:
    """A runtime that builds the model from launch flags builds a transformer decoder
    (runtimes.builds: the rule the default plan reads too)."""
    from planner.runtimes import builds
    if builds(v.model):
        return
    check_transformer(v, runtime)  # an explicit layer graph says so
    raise refusal(runtime, trains, f"an encoder ({v.model.name})")


def single_recompute_policy(v: PlanView, runtime: str) -> str:
    """'none', 'selective' or 'full' for a runtime with one activation-checkpoint policy for all
    layers; full recompute of some layers of a stage and not others is refused."""
    if v.recompute != "full":
        return v.recompute
    counts, layers = v.recompute_counts, tuple(st.layers for st in v.stages)
    if not any(counts):
        return "none"
    require(counts == layers, runtime, "recomputes every layer or none (one activation-checkpoint policy)",
            "full recompute of " + ", ".join(f"{r} of {n}" for r, n in zip(counts, layers))
            + " layers per stage")
    return "full"


def check_precision(v: PlanView, runtime: str, record: str) -> None:
    """The plan's precision is one the runtime's capability record trains in (runtimes.py)."""
    from planner.runtimes import RUNTIME_RULES
    precisions = RUNTIME_RULES[record].precisions
    require(v.precision in precisions, runtime, f"trains in {', '.join(precisions)} only", f"precision {v.precision}")


def check_common(v: PlanView, runtime: str) -> None:
    """The checks every exporter makes."""
    check_gpus(v, runtime)
    check_batch(v, runtime)
    require(not v.sequence_parallel or v.tp > 1, runtime, "shards the sequence only over tp > 1 ranks",
            "sequence parallel with tp 1")


def launch_nodes(plan: dict, v: PlanView) -> tuple[int, int, set, list[str]]:
    """(GPUs a node, nodes, the GPU families, the lines that say which NODE_RANKs each pool's
    nodes take) of a launch of the plan on every node. A pipeline over pools (one node size:
    check_pool_stages) runs its stages as the outermost ranks, so each run of consecutive
    stages on one pool takes the next node ranks, first stage first."""
    cluster = plan["inputs"]["cluster"]
    if not v.stage_pools:
        # one process per GPU of each host: a node that spans hosts (gpus_per_host) launches per host
        per_node = min(int(cluster.get("gpus_per_host") or cluster["gpus_per_node"]), v.gpus)
        return per_node, v.gpus // per_node, {cluster.get("gpu", {}).get("family", "")}, []
    pools = {p["name"]: p["cluster"] for p in cluster["pools"]}
    runs: list[list] = []
    for name in v.stage_pools:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    per_node = int(pools[v.stage_pools[0]]["gpus_per_node"])
    lines, start = ["The stages sit on different pools; give each pool's nodes these NODE_RANKs:"], 0
    for name, stages in runs:
        count = stages * (v.gpus // v.pp) // per_node
        lines.append(f"  pool {name}: NODE_RANK {start}" + (f"..{start + count - 1}" if count > 1 else ""))
        start += count
    return per_node, v.gpus // per_node, {pools[n].get("gpu", {}).get("family", "") for n in set(v.stage_pools)}, lines
