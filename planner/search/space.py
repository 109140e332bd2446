"""The search space: legal degree tuples and knob domains, as generators that encode the rules.

What the search enumerates (and so what "best" is relative to):
- tp: divides heads, tp and kv_heads divide one another, tp <= GPUs per node (a tp group
  across nodes is never competitive: every layer would all-reduce over the NICs);
- cp: divides the sequence, each rank keeps at least MIN_CP_TOKENS tokens;
- pp: at most the layers; dp = GPUs / (tp*cp*pp), and dp divides the global batch; a stage
  holds at most MAX_STAGE_FACTOR * ceil(layers / pp) layers;
- ep (MoE only): divides experts and dp*cp;
- micro_batch: divides global_batch / dp;
- vpp: 1, or 2..MAX_VPP with pp*vpp <= layers and the micro-batches a multiple of pp;
- zero 0-3; recompute none | selective | full (full: the ILP then picks per stage how many
  layers to recompute; with interleaving under Megatron, which recomputes N layers of every
  chunk, none or all); sequence parallel on whenever tp > 1 (it never costs time in the cost
  model and saves memory); rank order tp-cp-ep-dp-pp or tp-cp-ep-pp-dp.
Runtimes restrict the space (RUNTIME_RULES); every flag the user fixed is a constraint.

The best plan is the most conventional strategy (`conventional`) within TIE_TOLERANCE of the
fastest (search/driver.most_conventional): a difference the cost model cannot resolve goes to
the plan a team would run anyway.
"""

from __future__ import annotations

import math

import numpy as np

from planner.runtimes import (
    RUNTIME_RULES,
    RuntimeRules,
    ep_overlap_runs_ep,
    ep_overlap_runs_mtp,
    ep_overlap_runs_recompute,
    ep_overlap_runs_stages,
)
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import TrainingSetup

TIE_TOLERANCE = 0.01
"""strategies within 1 % of the fastest tie; the most conventional of them is the plan"""
CONVENTIONS = ("fewer parallel dimensions", "cp 1", "degrees that divide the node", "a lower ZeRO stage")


def conventional(tp, cp, dp, pp, ep, zero, gpus_per_node: int):
    """How unconventional strategies are, as one integer each (least first; numpy arrays or
    plain integers): the parallel dimensions used (dp, tp, pp, cp, ep above 1), then context
    parallelism, then a tp*cp block that neither divides the node nor is a multiple of it,
    then the ZeRO stage (CONVENTIONS, in that order)."""
    dims = sum(np.greater(d, 1).astype(int) for d in (dp, tp, pp, cp, ep))
    inner = np.multiply(tp, cp)
    straddles = (np.mod(gpus_per_node, inner) != 0) & (np.mod(inner, gpus_per_node) != 0)
    code = ((dims * 2 + np.greater(cp, 1)) * 2 + straddles) * 4 + np.asarray(zero)
    return int(code) if np.ndim(code) == 0 else code


def strategy_conventions(s, gpus_per_node: int) -> int:
    """`conventional` of one Strategy."""
    return conventional(s.tp, s.cp, s.dp, s.pp, s.ep, s.zero, gpus_per_node)


def conventional_reason(better: int, worse: int) -> str:
    """The first of CONVENTIONS in which code `better` beats code `worse` (conventional)."""
    for what, shift, mask in zip(CONVENTIONS, (4, 3, 2, 0), (-1, 1, 1, 3)):
        a, b = better >> shift, worse >> shift
        if mask >= 0:
            a, b = a & mask, b & mask
        if a != b:
            return what
    return "the same conventions"


MIN_CP_TOKENS = 512
MAX_VPP = 8
RECOMPUTES = ("none", "selective", "full")
MAX_STAGE_FACTOR = 2
"""a stage holds at most MAX_STAGE_FACTOR * ceil(layers / pp) layers (part of the stated space)"""


def stage_width(layers: int, pp: int) -> int:
    """The most layers one pipeline stage may hold."""
    return min(layers, MAX_STAGE_FACTOR * -(-layers // pp))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def allowed(values, fixed):
    """The values a constraint leaves (all when the knob is free)."""
    return [v for v in values if fixed is None or v == fixed]


def recompute_modes(fixed: dict, rules: RuntimeRules | None = None, ep_overlap: bool = False) -> list[str]:
    """The recompute modes the runtime runs and the constraints leave: a fixed count of
    recomputed layers (recompute_layers) is a knob of 'full' only; ep_overlap runs no full
    recomputation (runtimes.ep_overlap_problems)."""
    modes = [m for m in RECOMPUTES if (rules is None or m in rules.recompute_modes)
             and (not ep_overlap or ep_overlap_runs_recompute(m))]
    return allowed(modes, fixed.get("recompute", "full" if "recompute_layers" in fixed else None))


def tp_options(model: ModelSpec, cluster: Cluster, gpus: int, fixed: int | None) -> list[int]:
    if model.is_graph:
        return allowed([1], fixed)
    limit = gpus if fixed is not None else min(gpus, cluster.gpus_per_node)
    return allowed([t for t in divisors(gpus) if t <= limit and model.heads % t == 0
                     and (model.kv_heads % t == 0 or t % model.kv_heads == 0)], fixed)


def cp_options(model: ModelSpec, setup: TrainingSetup, rest: int, fixed: int | None, rules: RuntimeRules) -> list[int]:
    if model.is_graph or not rules.context_parallel:
        return allowed([1], fixed)
    return allowed([c for c in divisors(rest) if setup.seq_len % c == 0
                     and (c == 1 or setup.seq_len // c >= MIN_CP_TOKENS)], fixed)


def degree_tuples(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict, rules: RuntimeRules):
    """Yield (tp, cp, pp, dp) with tp*cp*pp*dp = GPUs that obey the rules and the constraints."""
    gpus = setup.gpus
    for tp in tp_options(model, cluster, gpus, fixed.get("tp")):
        for cp in cp_options(model, setup, gpus // tp, fixed.get("cp"), rules):
            rest = gpus // (tp * cp)
            for pp in allowed(divisors(rest), fixed.get("pp")):
                dp = rest // pp
                if pp > model.layers or setup.global_batch % dp or ("dp" in fixed and fixed["dp"] != dp):
                    continue
                if rules.uneven_split == "none" and model.layers % pp:
                    continue  # every stage the same layer count
                if setup.ep_overlap and not ep_overlap_runs_mtp(model.mtp_layers, pp):
                    continue
                yield tp, cp, pp, dp


def zero_options(model: ModelSpec, pp: int, alone: bool, fixed: int | None, rules: RuntimeRules) -> tuple[int, ...]:
    """ZeRO stages the runtime runs with `pp` stages for the model that the constraint leaves;
    plain replication (ZeRO 0) only for data parallelism alone where the runtime replicates
    only then (`alone`: tp = pp = cp = 1)."""
    return tuple(z for z in rules.zeros(pp, model) if fixed in (None, z) and not rules.zero_refusal(z, pp, model, alone))


def ep_options(model: ModelSpec, pool: int, fixed: int | None, rules: RuntimeRules,
               precision: str = "bf16", ep_overlap: bool = False) -> list[int]:
    """Expert-parallel degrees: divisors of experts and of the `pool` of ranks ep is carved from
    (dp*cp, or tp*dp*cp with folded experts); more than 1 under ep_overlap
    (runtimes.ep_overlap_problems)."""
    if model.moe is None or not rules.expert_parallel or precision not in rules.ep_precisions:
        degrees = [1]
    else:
        degrees = divisors(math.gcd(model.moe.experts, pool))
    return allowed([e for e in degrees if not ep_overlap or ep_overlap_runs_ep(e)], fixed)


def vpp_options(model: ModelSpec, pp: int, microbatches: int, fixed: int | None, rules: RuntimeRules,
                ep_overlap: bool = False) -> list[int]:
    """Virtual stages per rank: those vpp_refusal lets through (a constraint may go beyond MAX_VPP)."""
    values = [fixed] if fixed is not None else range(1, MAX_VPP + 1)
    return [v for v in values if vpp_refusal(model, pp, v, microbatches, rules, ep_overlap) is None]


def vpp_refusal(model: ModelSpec, pp: int, vpp: int, microbatches: int, rules: RuntimeRules,
                ep_overlap: bool = False) -> str | None:
    """Why the runtime runs no strategy with `vpp` virtual stages per rank over `pp` stages and
    `microbatches` micro-batches, or None: under ep_overlap, interleaved stages only where there
    are stages (runtimes.ep_overlap_problems); one chunk a stage where the runtime has a split of
    the layers (one that splits unevenly only on the ends may have none); interleaving where it
    interleaves, the micro-batches a multiple of pp, pp * vpp <= layers and chunks it runs."""
    if ep_overlap and not ep_overlap_runs_stages(pp, vpp):
        return "expert-parallel overlap (--ep-overlap) runs pipeline stages interleaved only (vpp > 1)"
    if vpp == 1:
        if rules.uneven_split == "ends" and pp > 2 and not ends_layout_exists(model.layers, pp):
            return (f"it splits {model.layers} layers over {pp} stages unevenly only on the first and last stage, "
                    f"with at most {stage_width(model.layers, pp)} layers a stage, and no such split exists")
        return None
    if pp == 1:
        return f"vpp {vpp} needs pipeline stages (pp is 1)"
    if not rules.interleaving:
        return f"it runs no interleaved stages (vpp {vpp})"
    if microbatches % pp:
        return f"interleaving needs the micro-batches ({microbatches}) to be a multiple of pp ({pp})"
    if pp * vpp > model.layers:
        return f"pp x vpp ({pp} x {vpp}) exceeds the layers ({model.layers})"
    if not rules.chunks_run(model.layers, pp, vpp):
        return f"unequal virtual chunks ({model.layers} layers over {pp * vpp} chunks)"
    return None


def ends_layout_exists(layers: int, pp: int) -> bool:
    """Whether `layers` split over pp > 2 stages with only the first and last stage free (the
    middle ones equal), every stage within stage_width: the splits search/driver._ends_layouts
    prices. Where none exists, neither does a split Megatron runs in the space."""
    width = stage_width(layers, pp)
    return any(0 < layers - f - last and (layers - f - last) % (pp - 2) == 0
               and (layers - f - last) // (pp - 2) <= width
               for f in range(1, min(layers, width + 1)) for last in range(1, min(layers, width + 1)))


def explain_empty(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, fixed: dict) -> str:
    """Why no legal strategy exists under the setup's runtime (which the caller names): the
    batch, the GPU count, the runtime's rules for the degree splits that exist (tuple_gap), or
    the constraints."""
    rules = RUNTIME_RULES[setup.runtime]
    free = list(degree_tuples(model, cluster, setup, {}, rules))
    if not free:
        from dataclasses import replace
        loose = list(degree_tuples(model, cluster, replace(setup, global_batch=setup.gpus * 1024), {}, rules))
        if loose:
            dps = sorted({dp for *_, dp in loose})
            return (f"no legal strategy: the global batch ({setup.global_batch}) must be divisible by dp, and every "
                    f"way to split {setup.gpus} GPUs needs dp in {dps[:8]}{'...' if len(dps) > 8 else ''}")
        return (f"no legal strategy for {setup.gpus} GPUs: no tp dividing heads ({model.heads}) and "
                f"pp <= layers ({model.layers}) splits them")
    given = ", ".join(f"{k}={v}" for k, v in sorted(fixed.items()))
    where = f"no legal strategy for {setup.gpus} GPUs" + (f" with {given}" if given else "")
    split = list(degree_tuples(model, cluster, setup, fixed, rules))
    gaps = [(t, tuple_gap(model, setup, fixed, rules, *t)) for t in split]
    gaps = [(t, gap) for t, gap in gaps if gap]
    if split and len(gaps) == len(split):
        by_gap: dict[str, list] = {}
        for (tp, cp, pp, dp), gap in gaps:
            by_gap.setdefault(gap, []).append(f"tp {tp} cp {cp} pp {pp} dp {dp}")
        shown = "; ".join(f"{', '.join(ts[:4])}{f' and {len(ts) - 4} more' if len(ts) > 4 else ''}: {gap}"
                          for gap, ts in by_gap.items())
        return f"{where}: it runs none of the splits of the GPUs there are: {shown}"
    if not split:
        return f"{where}: the constraints leave no split of the GPUs (tp x cp x pp x dp) it allows"
    return where


def tuple_gap(model: ModelSpec, setup: TrainingSetup, fixed: dict, rules: RuntimeRules,
              tp: int, cp: int, pp: int, dp: int) -> str | None:
    """Why the space holds no strategy of these degrees, asking the rules it is enumerated by in
    turn (search/bounds.bound_counts: the ZeRO stages, the micro-batches, the pipeline splits);
    None when none of them is the reason."""
    alone = tp == pp == cp == 1
    if not zero_options(model, pp, alone, fixed.get("zero"), rules):
        zero = fixed.get("zero")
        return (rules.zero_refusal(zero, pp, model, alone) if zero is not None
                else f"it runs no ZeRO stage here ({rules.zeros(pp, model)})")
    per_rank = setup.global_batch // dp
    mbs = allowed(divisors(per_rank), fixed.get("micro_batch"))
    if not mbs:
        return f"micro-batch {fixed['micro_batch']} does not divide the {per_rank} sequences of a data-parallel rank"
    if not any(vpp_options(model, pp, per_rank // mb, fixed.get("vpp"), rules, setup.ep_overlap) for mb in mbs):
        # the reason for the vpp asked for, or for one chunk a stage (each vpp has one), at the
        # micro-batch with the most micro-batches
        return vpp_refusal(model, pp, fixed.get("vpp", 1), per_rank // mbs[0], rules, setup.ep_overlap)
    return None
