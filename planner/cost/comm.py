"""Collectives priced with the alpha-beta model on the tiers a group spans.

Ring collectives over n ranks on one tier (Thakur et al. 2005; nccl-tests PERFORMANCE.md):
  all-reduce     2(n-1)/n * M / B + 2(n-1) * alpha
  all-gather     (n-1)/n * M / B + (n-1) * alpha        (M = gathered size)
  reduce-scatter (n-1)/n * M / B + (n-1) * alpha        (M = input size)
  all-to-all     (n-1)/n * M / B + (n-1) * alpha
  p2p            M / B + alpha
B is the per-GPU per-direction link bandwidth times the tier's efficiency; the nccl-tests "bus
bandwidth" of a collective equals B by construction.

A group spanning N nodes with `per_node` ranks on each is priced hierarchically (NCCL's rings
cross each node boundary once per ring, one ring per NIC): the intra-node phase over `per_node`
ranks moves M as above on NVLink, and the inter-node phase moves M / per_node per GPU over N nodes
on each GPU's own NIC. A group spread unevenly (a degree that does not divide the node) is priced
at the fewest of its ranks on one node (placement.Span), whose NICs carry the most; the span is
that of the slowest group of its kind (placement.worst), since all of them run at once.
"""

from __future__ import annotations

import math

import numpy as np

from planner.placement import Span
from planner.spec.efficiency import LegacyEfficiency
from planner.spec.hardware import Cluster, LinkTier

_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}


TYPICAL_BUSBW_FRACTION = 0.80
"""nccl-tests bus bandwidth over link rate where a tier states no measurement: NVLink4 reaches
about 370 of 450 GB/s outside NVLS, an NDR NIC 46-48 of 50 (NVIDIA engineers in nccl-tests
issues); 0.8 is the lower of the two"""


def link_fraction(cluster: Cluster, intra: bool) -> float:
    """The share of a tier's link rate its collectives reach: the tier's measured nccl-tests
    bus bandwidth (busbw_GBps), else TYPICAL_BUSBW_FRACTION; a version 1 efficiency block's own."""
    eff = cluster.efficiency
    if isinstance(eff, LegacyEfficiency):
        return eff.intra_link_fraction if intra else eff.inter_link_fraction
    tier = cluster.intra_node if intra else cluster.inter_node
    return tier.busbw_Bps / tier.Bps if tier.busbw_Bps else TYPICAL_BUSBW_FRACTION


def _tier_bandwidth(cluster: Cluster, intra: bool, ranks_in_node: int) -> tuple[float, float]:
    if intra:
        tier = cluster.intra_node
        bw = tier.Bps * link_fraction(cluster, True)
        if tier.mesh and cluster.gpus_per_node > 1:
            bw *= (ranks_in_node - 1) / (cluster.gpus_per_node - 1)
        return bw, tier.latency_s
    return cluster.inter_node.Bps * link_fraction(cluster, False), cluster.inter_node.latency_s


def _ring(kind: str, message_bytes: float, n: int, bw_Bps: float, latency_s: float) -> float:
    if n <= 1:
        return 0.0
    f = _FACTOR[kind]
    return f * (n - 1) / n * message_bytes / bw_Bps + f * (n - 1) * latency_s


def collective_time_s(kind: str, message_bytes, span: Span, cluster: Cluster):
    """Time of one collective of `kind` with per-rank message `message_bytes` over a group
    (a number or a numpy array of them; an empty message costs nothing)."""
    if span.size <= 1:
        return 0.0 * message_bytes
    intra_bw, intra_lat = _tier_bandwidth(cluster, True, span.per_node)
    if span.nodes == 1:
        t = _ring(kind, message_bytes, span.size, intra_bw, intra_lat)
    else:
        inter_bw, inter_lat = _tier_bandwidth(cluster, False, span.per_node)
        if kind == "all_to_all":
            off_node = (span.size - span.per_node) / span.size
            on_node = (span.per_node - 1) / span.size  # none with one rank a node (no NVLink share then)
            local = on_node * message_bytes / intra_bw if on_node else 0.0
            t = local + off_node * message_bytes / inter_bw + (span.size - 1) * inter_lat
        else:
            local = _ring(kind, message_bytes, span.per_node, intra_bw, intra_lat)
            t = local + _ring(kind, message_bytes / span.per_node, span.nodes, inter_bw, inter_lat)
    return t * (message_bytes > 0)


def hit_probability(experts: int, top_k: int, held: float) -> float:
    """Probability that a token's top_k distinct experts, chosen uniformly among `experts`
    (balanced routing), include at least one of `held` of them:
        1 - prod_{j<k} (E - held - j) / (E - j)."""
    miss = 1.0
    for j in range(top_k):
        miss *= max(0.0, experts - held - j) / (experts - j)
    return 1.0 - miss


def grouped_hit_probability(experts: int, top_k: int, held: float, groups: int = 0, group_topk: int = 0) -> float:
    """hit_probability under group-limited routing (Megatron's moe_router_num_groups and
    moe_router_group_topk; DeepSeek-V3's node-limited routing): a token's group_topk groups g of
    the `groups` G chosen uniformly (balanced routing, as force-balanced benchmark runs are), and
    its top_k experts k spread evenly over them, k/g from each: Megatron-Core's group_limited_topk
    picks the groups by the sum of their top two scores, so each chosen group holds the token's
    best experts (DeepSeek-V3: 8 over 4 groups, 2 each). `held` consecutive experts, aligned:
      inside one group of E (E a multiple of held):  g/G * P(k/g of E include one of held);
      whole groups (h = held / E):  1 - C(G - h, g) / C(G, g).
    k not a multiple of g, unaligned, or no groups: hit_probability (at least as many hits)."""
    if not groups or group_topk >= groups or top_k % group_topk:
        return hit_probability(experts, top_k, held)
    per_group = experts // groups
    if held <= per_group and per_group % held == 0:
        return group_topk / groups * hit_probability(per_group, top_k // group_topk, held)
    if held % per_group == 0:
        h = int(held // per_group)
        return 1.0 - math.comb(groups - h, group_topk) / math.comb(groups, group_topk)
    return hit_probability(experts, top_k, held)


def dispatch_time_s(token_bytes, top_k: int, experts: int, span: Span, cluster: Cluster, groups: int = 0,
                    group_topk: int = 0):
    """One token dispatch (or combine) of a deduplicating MoE dispatcher (DeepEP, HybridEP:
    Megatron-Core's flex dispatcher) over an expert-parallel group, `token_bytes` the bytes of
    the tokens one rank routes (each token once, not once per expert).

    A token crosses the network once per other node holding one of its experts, and NVLink once
    per other rank holding one (the node's receiving GPU forwards it): DeepEP's internode kernel
    counts a token once per destination node (csrc/kernels/internode.cu, ebfe47e) and sends it
    over RDMA to the same-index GPU there, which forwards it over NVLink (DeepSeek-V3 report,
    arXiv 2412.19437, sec. 3.2.2). With experts spread evenly (experts / size a rank):
        network = (nodes - 1) * P(node holds one) * token_bytes / inter busbw
        nvlink  = (size - 1) * P(rank holds one) * token_bytes / intra busbw
    With one rank a node the NVLink term is 0 (nothing to forward).
    The kernel runs sending, forwarding and receiving at once (separate warps), so the dispatch
    takes the slower of the two, plus one latency per peer node and per peer rank on the node.
    Under group-limited routing (`groups`, `group_topk`) the probabilities are
    grouped_hit_probability's: DeepSeek-V3's 8 groups on 8 nodes reach at most 4 of them.
    A plain all-to-all (all_to_all in collective_time_s) instead sends one copy per expert."""
    if span.size <= 1:
        return 0.0 * token_bytes
    per_rank = experts / span.size
    intra_bw, intra_lat = _tier_bandwidth(cluster, True, span.per_node)
    # with one rank a node nothing is forwarded on a node: no NVLink share (a mesh tier gives it none)
    nvlink = ((span.size - 1) * grouped_hit_probability(experts, top_k, per_rank, groups, group_topk) * token_bytes
              / intra_bw) if span.per_node > 1 else 0.0 * token_bytes
    fixed = (span.per_node - 1) * intra_lat
    if span.nodes > 1:
        inter_bw, inter_lat = _tier_bandwidth(cluster, False, span.per_node)
        network = ((span.nodes - 1) * grouped_hit_probability(experts, top_k, per_rank * span.per_node, groups,
                                                              group_topk) * token_bytes / inter_bw)
        return (np.maximum(nvlink, network) + fixed + (span.nodes - 1) * inter_lat) * (token_bytes > 0)
    return (nvlink + fixed) * (token_bytes > 0)


def _send_s(message_bytes, bw: float, latency_s: float):
    """One point-to-point send of `message_bytes` at bandwidth `bw` after `latency_s` (none when empty)."""
    return (message_bytes / bw + latency_s) * (message_bytes > 0)


def p2p_time_s(message_bytes, inter_node: bool, cluster: Cluster):
    """One point-to-point send between neighbouring pipeline stages."""
    return _send_s(message_bytes, *_tier_bandwidth(cluster, not inter_node, 2))


def affine_s(kind: str, span: Span, cluster: Cluster) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) such that collective_time_s(kind, M, span) equals
    per_byte * M + fixed for every M > 0 (each formula above is affine in M): what prices one
    collective over many message sizes at once."""
    fixed = float(collective_time_s(kind, 1e-300, span, cluster))
    return (float(collective_time_s(kind, 1e12, span, cluster)) - fixed) / 1e12, fixed


def pools_exchange_s(grad_bytes: float, pool_gpus: tuple[int, ...], link: LinkTier) -> float:
    """The gradient all-reduce between the data-parallel replicas of P pools (a mixed cluster's
    batch shares), after each pool has reduced its own: a ring over the P pools of the whole
    gradient (`grad_bytes`), each pool's share carried by its GPUs' own links between the pools,
    so the pool with the fewest GPUs sets the rate (the slowest link it crosses):
        2 (P-1)/P * grad_bytes / (min_i g_i * B) + 2 (P-1) * alpha,
    B the link's measured bus bandwidth, else TYPICAL_BUSBW_FRACTION of its rate. It is priced
    exposed: it starts after the slowest pool's own reduction (no overlap is claimed)."""
    if len(pool_gpus) <= 1:
        return 0.0
    return _ring("all_reduce", grad_bytes, len(pool_gpus), min(pool_gpus) * _pools_Bps(link), link.latency_s)


def pools_p2p_s(message_bytes, link: LinkTier):
    """One point-to-point send between neighbouring pipeline stages on different pools of a
    mixed cluster: over the link between the pools, at its measured bus bandwidth, else
    TYPICAL_BUSBW_FRACTION of its rate (as pools_exchange_s)."""
    return _send_s(message_bytes, _pools_Bps(link), link.latency_s)


def _pools_Bps(link: LinkTier) -> float:
    """A link between pools' bandwidth per GPU: its measured bus bandwidth, else
    TYPICAL_BUSBW_FRACTION of its rate."""
    return link.busbw_Bps or link.Bps * TYPICAL_BUSBW_FRACTION
