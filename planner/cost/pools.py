"""A pipeline over the pools of a mixed cluster: consecutive blocks of stages on different GPUs.

Stage i runs on pool P(i). It is priced as the cost model prices a stage of its pool alone:
step.stage_terms of the strategy's profile on the pool's plain cluster (its GPU, links,
efficiencies and memory capacity), every pool's profile of the same strategy and training setup.
Where neighbouring stages sit on different pools, the send between them crosses the link between
the pools. Of a stage's two sends per micro-batch (step.p2p_s: the activation forward, the
gradient backward), each one that crosses is priced on that link (comm.pools_p2p_s) instead of
its pool's:

    t_i = t_i(P(i)) + c_i * (send_between - send_i),

c_i the number of stage i's neighbours on another pool. The step is the single-pool formula
over the stages (step.split_step). Interleaving is not priced here (one chunk per stage).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.cost import comm, memory
from planner.cost.step import (
    Profile,
    StepEstimate,
    estimate_of_terms,
    p2p_message_bytes,
    profile,
    split_terms,
    stage_model_flops,
)
from planner.spec.hardware import Cluster, LinkTier
from planner.spec.model import ModelSpec
from planner.spec.training import Strategy, TrainingSetup, check_strategy


def stage_pools(order: tuple[int, ...], counts: tuple[int, ...]) -> tuple[int, ...]:
    """The pool of every stage: pools `order` in turn, pool order[j] holding counts[j] stages."""
    return tuple(p for p, k in zip(order, counts) for _ in range(k))


def crossing_s(profs: dict[int, Profile], stage_pool: tuple[int, ...], link: LinkTier) -> np.ndarray:
    """What each stage's sends across pools add to its time per micro-batch (see above)."""
    any_prof = next(iter(profs.values()))
    s = any_prof.strategy
    if s.vpp != 1:
        raise ValueError("stages over pools are priced with one chunk per stage (vpp 1)")
    between = float(comm.pools_p2p_s(p2p_message_bytes(any_prof.model, any_prof.setup, s.tp, s.cp, s.micro_batch),
                                     link))
    out = np.zeros(len(stage_pool))
    for i, p in enumerate(stage_pool):
        crossings = (i > 0 and stage_pool[i - 1] != p) + (i + 1 < len(stage_pool) and stage_pool[i + 1] != p)
        out[i] = crossings * (between - profs[p].p2p_s / 2)
    return out


def pool_terms(profs: dict[int, Profile], stage_pool: tuple[int, ...], link: LinkTier, bounds,
               recompute_layers=None) -> dict:
    """step.split_terms of a split whose stage i is priced on pool stage_pool[i] (`profs`: each
    pool's profile), with the sends across pools (crossing_s) in t and pp_comm."""
    pp = len(stage_pool)
    own = {p: split_terms(prof, bounds, recompute_layers) for p, prof in profs.items()}
    rows = np.arange(pp)
    terms = {k: np.array([np.broadcast_to(own[p][k], (pp,))[i] for i, p in zip(rows, stage_pool)])
             for k in own[stage_pool[0]]}
    extra = crossing_s(profs, stage_pool, link)
    terms["t"] = terms["t"] + extra
    terms["pp_comm"] = terms["pp_comm"] + extra
    return terms


def estimate_on_pools(model: ModelSpec, clusters: tuple[Cluster, ...], link: LinkTier, setup: TrainingSetup,
                      s: Strategy, stage_pool: tuple[int, ...], bounds,
                      recompute_layers=None) -> StepEstimate:
    """Price strategy `s` with stage i on clusters[stage_pool[i]] and the split `bounds` (see
    above). MFU and HFU are over the mean dense peak of the GPUs (every stage has tp*cp*dp of
    them); each stage fits its own pool's capacity."""
    check_strategy(s, model, setup)
    profs = {p: profile(model, clusters[p], setup, s) for p in sorted(set(stage_pool))}
    terms = pool_terms(profs, stage_pool, link, list(bounds), recompute_layers)
    peak = sum(clusters[p].gpu.flops(setup.precision) for p in stage_pool) / len(stage_pool)
    capacities = tuple(memory.capacity_bytes(clusters[p], setup) for p in stage_pool)
    nodes = min(min(clusters[p].gpus_per_node, setup.gpus) for p in profs)
    est = estimate_of_terms(model, setup, s, list(bounds), terms, profs[stage_pool[0]].microbatches, peak,
                            capacities, nodes)
    if len(profs) > 1:  # the pipeline's groups cross the link between the pools
        est = replace(est, tiers={**est.tiers, "pp": "between_pools"})
    return est


def pool_mfu(model: ModelSpec, clusters: tuple[Cluster, ...], setup: TrainingSetup, s: Strategy,
             stage_pool: tuple[int, ...], est: StepEstimate) -> dict[int, float]:
    """Each pool's MFU in a pipeline over pools: the model FLOPs of its stages
    (step.stage_model_flops) over its GPUs (tp*cp*dp a stage) at their own dense peak."""
    flops = stage_model_flops(model, setup.seq_len, est.stages)
    width = s.tp * s.cp * s.dp
    return {j: sum(f for f, q in zip(flops, stage_pool) if q == j) * setup.global_batch / est.step_time_s
            / (stage_pool.count(j) * width * clusters[j].gpu.flops(setup.precision)) for j in sorted(set(stage_pool))}
