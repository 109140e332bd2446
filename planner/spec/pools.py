"""Mixed clusters: pools of different GPUs in one cluster spec (DESIGN.md, 'Mixed cluster').

    name: h100-plus-a100
    pools:
      - {name: fast, cluster: dgx-h100, nodes: 4}       # a cluster preset or an inline spec, and its nodes
      - {name: bulk, cluster: dgx-a100-80g, nodes: 8}
    between_pools: {GBps: 25, latency_us: 8}           # per GPU, per direction, on the shared fabric

Each pool is a plain cluster (its GPU, node size, links and efficiencies) and a node count, so
a pool also bounds the GPUs a plan may take from it. `between_pools` is the link a collective or
a pipeline send crosses from one pool to another; it is required with two pools or more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import SpecError
from planner.spec.fields import Fields
from planner.spec.hardware import Cluster, LinkTier


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    cluster: Cluster
    nodes: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.cluster.gpus_per_node


@dataclass(frozen=True, slots=True)
class MixedCluster:
    """A cluster of pools; planning reads its pools (planning.plan_on_pools), never a GPU of its own."""

    name: str
    pools: tuple[Pool, ...]
    between_pools: LinkTier | None
    source: str = ""

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def gpus_per_node(self) -> int:
        """The step of a GPU-count range on this cluster: every pool's node size divides it."""
        return math.lcm(*(p.cluster.gpus_per_node for p in self.pools))

    @property
    def count_unit(self) -> tuple[int, str]:
        """What a GPU count on this cluster must fill whole (Cluster.count_unit): its nodes."""
        return self.gpus_per_node, "nodes"

    def describe(self) -> str:
        return " + ".join(f"{p.name}: {p.gpus} x {p.cluster.gpu.name}" for p in self.pools)

    def to_dict(self) -> dict:
        """The spec with every pool's cluster resolved inline (mixed_from_dict reads it back)."""
        d = {"name": self.name, "pools": [{"name": p.name, "cluster": p.cluster.to_dict(), "nodes": p.nodes}
                                          for p in self.pools]}
        if self.between_pools is not None:
            d["between_pools"] = self.between_pools.to_dict()
        if self.source:
            d["source"] = self.source
        return d


def mixed_from_dict(data: dict, where: str) -> MixedCluster:
    """A mixed cluster from its spec mapping (SpecError naming the file and field)."""
    from planner.spec.hardware import load_cluster

    f = Fields(data, where)
    entries = f.raw("pools")
    if not isinstance(entries, list) or not entries:
        raise f.error("pools", f"expected a list of {{name, cluster, nodes}} mappings, got {entries!r}")
    pools: list[Pool] = []
    for i, entry in enumerate(entries):
        p = Fields(entry, where, f"pools[{i}].")
        name = p.str("name")
        if any(q.name == name for q in pools):
            raise p.error("name", f"{name!r} names two pools")
        ref = p.raw("cluster")
        if isinstance(ref, str):
            cluster = load_cluster(ref)
            if isinstance(cluster, MixedCluster):
                raise p.error("cluster", f"{ref!r} is itself a mixed cluster; a pool is one plain cluster")
        elif isinstance(ref, dict):
            cluster = Cluster.from_dict({"name": f"{f.data.get('name', 'cluster')}-{name}", **ref},
                                        f"{where}: pools[{i}].cluster")
        else:
            raise p.error("cluster", f"expected a cluster preset name or a mapping, got {ref!r}")
        pools.append(Pool(name=name, cluster=cluster, nodes=p.int("nodes")))
        p.reject_unknown()
    link = f.sub("between_pools")
    if link is None and len(pools) > 1:
        raise f.error("between_pools", "missing (required with two pools or more): {GBps: ..., latency_us: ...}")
    mixed = MixedCluster(name=f.str("name", "cluster"), pools=tuple(pools),
                         between_pools=LinkTier.from_fields(link) if link is not None else None,
                         source=f.str("source", ""))
    f.reject_unknown()
    return mixed


FALLBACK_PRECISIONS = ("bf16", "fp16")
"""what a pool trains in where its GPU lacks the precision requested, in this order"""


def pool_precision(pool: Pool, requested: str) -> str:
    """The precision a pool trains in: the one requested where its GPU has it, else the first of
    FALLBACK_PRECISIONS it has (a mix of H100 and A100 asked for fp8 runs its A100s in bf16:
    Ampere has no FP8)."""
    return common_precision((pool,), requested)


def common_precision(pools, requested: str) -> str:
    """The one precision every pool of `pools` trains in: the one requested where every pool's
    GPU has it, else the first of FALLBACK_PRECISIONS they all have."""
    return next((p for p in (requested, *FALLBACK_PRECISIONS)
                 if all(p in dict(pool.cluster.gpu.peak_flops) for pool in pools)), requested)


def check_gpus(cluster: MixedCluster, gpus: int) -> None:
    """A plan takes at most the cluster's GPUs."""
    if gpus > cluster.gpus:
        raise SpecError(f"--gpus {gpus}: cluster {cluster.name} has {cluster.gpus} GPUs ({cluster.describe()})")
