"""Gpu, LinkTier, Efficiency, Cluster: frozen specs read from hardware/ presets or user YAML.

Figures in files carry units in their keys (memory_gib, hbm_GBps, tflops, GBps, latency_us) and
are converted to SI here. Link figures are per GPU per direction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from planner.errors import SpecError
from planner.presets import resolve
from planner.spec.efficiency import Efficiency, LegacyEfficiency, efficiency_from_fields
from planner.spec.fields import Fields, load_mapping
from planner.spec.measured import Measured
from planner.units import GBps_to_Bps, gib_to_bytes, tflops_to_flops, us_to_s

PRECISIONS = ("bf16", "fp16", "fp8")
FAMILIES = ("ampere", "hopper", "blackwell", "cdna3", "ada", "generic")
COLLECTIVES = {"ampere": "NCCL", "hopper": "NCCL", "blackwell": "NCCL", "ada": "NCCL", "cdna3": "RCCL"}
"""the collective library each family's GPUs run (NVIDIA's NCCL, AMD's RCCL); the two do not
interoperate, so the GPUs of one job's collectives and sends all run one of them"""


def collective_library(family: str, gpu_name: str) -> str:
    """The collective library of a GPU (COLLECTIVES); one of no known family has one of its own."""
    return COLLECTIVES.get(family, f"that of {gpu_name}")


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    memory_bytes: float
    hbm_Bps: float
    peak_flops: tuple[tuple[str, float], ...]
    """dense peaks per precision, (precision, FLOP/s)"""
    family: str = "generic"
    source: str = ""
    measured: Measured | None = None
    """kernel microbenchmarks (spec/measured.py); None: the family's typical figures"""
    tdp_w: float | None = None
    """the board power the vendor rates the part at (W): forecasts price energy as GPU-hours x
    tdp_w x PUE, the convention of published model cards; None: unknown"""

    @property
    def collectives(self) -> str:
        return collective_library(self.family, self.name)

    def flops(self, precision: str) -> float:
        table = dict(self.peak_flops)
        if precision in table:
            return table[precision]
        if precision == "fp16" and "bf16" in table:
            return table["bf16"]
        raise SpecError(f"GPU {self.name} lists no {precision} peak (it lists {', '.join(table)})")

    def to_dict(self) -> dict:
        d = {"name": self.name, "memory_gib": self.memory_bytes / 1024**3, "hbm_GBps": self.hbm_Bps / 1e9,
             "tflops": {p: v / 1e12 for p, v in self.peak_flops}, "family": self.family, "source": self.source}
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
        if self.tdp_w is not None:
            d["tdp_w"] = self.tdp_w
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "Gpu":
        f = Fields(data, where)
        tf = f.sub("tflops")
        if tf is None:
            raise f.error("tflops", "missing (required): dense peaks per precision, e.g. {bf16: 989}")
        peaks = tuple((p, tflops_to_flops(tf.float(p))) for p in PRECISIONS if tf.has(p))
        if not peaks:
            raise f.error("tflops", f"expected at least one of {', '.join(PRECISIONS)}")
        tf.reject_unknown(PRECISIONS)
        name = f.str("name", "gpu")
        m = f.sub("measured")
        gpu = cls(name=name, memory_bytes=gib_to_bytes(f.float("memory_gib")),
                  hbm_Bps=GBps_to_Bps(f.float("hbm_GBps")), peak_flops=peaks,
                  family=f.choice("family", FAMILIES, guess_family(name, dict(peaks))),
                  source=f.str("source", ""), measured=Measured.from_fields(m) if m is not None else None,
                  tdp_w=f.float("tdp_w", None))
        f.reject_unknown()
        fastest = max((t.points[k][1] for t in gpu.measured.attention for k in range(len(t.points))), default=0.0) \
            if gpu.measured else 0.0
        if fastest * 1e12 > gpu.flops("bf16" if any(p == "bf16" for p, _ in peaks) else peaks[0][0]):
            raise f.error("measured.attention", f"an attention kernel at {fastest:g} TFLOP/s is faster than the "
                          "GPU's dense bf16 peak")
        return gpu


def guess_family(name: str, peaks: dict[str, float]) -> str:
    """Architecture family from the GPU name; else from its dense bf16 peak (A100 312, H100 989,
    B200 2250 TFLOP/s: a part within 15 % of one of those is taken for that generation); else
    'generic'."""
    lowered = name.lower()
    for family, marks in (("ampere", ("a100", "a800", "a40", "a30", "a10")), ("hopper", ("h100", "h200", "h800", "gh200")),
                          ("blackwell", ("b200", "b100", "gb200", "b300")), ("cdna3", ("mi300", "mi325")),
                          ("ada", ("l40", "4090", "l4", "6000 ada"))):
        if any(m in lowered for m in marks):
            return family
    bf16 = peaks.get("bf16", peaks.get("fp16", 0.0)) / 1e12
    for family, reference in (("ampere", 312.0), ("hopper", 989.0), ("blackwell", 2250.0)):
        if abs(bf16 / reference - 1) <= 0.15:
            return family
    return "generic"


@dataclass(frozen=True, slots=True)
class LinkTier:
    """One tier of the network, per GPU per direction."""

    Bps: float
    latency_s: float
    mesh: bool = False
    """a fully connected mesh (one link per peer, e.g. MI300X): a group of n of the node's g GPUs
    reaches (n-1)/(g-1) of the GPU's total bandwidth"""
    busbw_Bps: float | None = None
    """measured nccl-tests bus bandwidth of large collectives over this tier (per GPU); None:
    the typical share of the link rate (cost/comm.py)"""

    def to_dict(self) -> dict:
        d = {"GBps": self.Bps / 1e9, "latency_us": self.latency_s * 1e6, "mesh": self.mesh}
        if self.busbw_Bps is not None:
            d["busbw_GBps"] = self.busbw_Bps / 1e9
        return d

    @classmethod
    def from_fields(cls, f: Fields) -> "LinkTier":
        bw = f.float("GBps")
        busbw = f.float("busbw_GBps", None, maximum=bw * 1.25)
        tier = cls(Bps=GBps_to_Bps(bw), latency_s=us_to_s(f.float("latency_us", 5.0, positive=False)),
                   mesh=f.bool("mesh", False), busbw_Bps=GBps_to_Bps(busbw) if busbw is not None else None)
        f.raw("source", "")
        f.reject_unknown()
        return tier


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    gpu: Gpu
    gpus_per_node: int
    intra_node: LinkTier
    inter_node: LinkTier
    efficiency: Efficiency | LegacyEfficiency
    source: str = ""
    price_per_gpu_hour: float | None = None
    """what one GPU-hour costs on this cluster (any currency; forecast's cost), None: not given"""
    pue: float | None = None
    """power usage effectiveness of its data centre (forecast's energy: GPU power x PUE), None: 1"""
    gpus_per_host: int | None = None
    """GPUs of one host (one OS, one torchrun) where a node, the NVLink domain the cost model
    prices, spans several hosts (GB200 NVL72: 18 compute trays of 4); None: the node is one host.
    A job takes whole hosts, and a launch runs one process per GPU of each host."""

    @property
    def host_gpus(self) -> int:
        """GPUs of one host: gpus_per_host, else the node's."""
        return self.gpus_per_host or self.gpus_per_node

    @property
    def count_unit(self) -> tuple[int, str]:
        """(GPUs, name) of what a GPU count above one of them must fill whole: its hosts where a
        node spans several, else its nodes."""
        return self.host_gpus, "hosts" if self.gpus_per_host else "nodes"

    def to_dict(self) -> dict:
        d = {"name": self.name, "gpu": self.gpu.to_dict(), "gpus_per_node": self.gpus_per_node,
             "intra_node": self.intra_node.to_dict(), "inter_node": self.inter_node.to_dict(),
             "efficiency": asdict(self.efficiency), "source": self.source}
        for key in ("price_per_gpu_hour", "pue", "gpus_per_host"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "Cluster":
        f = Fields(data, where)
        gpu_ref = f.raw("gpu")
        if isinstance(gpu_ref, str):
            gpu = load_gpu(gpu_ref)
        elif isinstance(gpu_ref, dict):
            gpu = gpu_from_mapping(dict(gpu_ref), f"{where}: gpu")
        else:
            raise f.error("gpu", f"expected a GPU preset name or a mapping, got {gpu_ref!r}")
        intra, inter = f.sub("intra_node"), f.sub("inter_node")
        if intra is None or inter is None:
            raise f.error("intra_node" if intra is None else "inter_node", "missing (required): {GBps: ..., latency_us: ...}")
        eff = f.sub("efficiency")
        cluster = cls(name=f.str("name", "cluster"), gpu=gpu, gpus_per_node=f.int("gpus_per_node"),
                      intra_node=LinkTier.from_fields(intra), inter_node=LinkTier.from_fields(inter),
                      efficiency=_efficiency(eff, gpu), source=f.str("source", ""),
                      price_per_gpu_hour=f.float("price_per_gpu_hour", None, positive=False),
                      pue=f.float("pue", None, minimum=1.0, positive=False),
                      gpus_per_host=f.int("gpus_per_host", None))
        if cluster.gpus_per_host is not None and cluster.gpus_per_node % cluster.gpus_per_host:
            raise f.error("gpus_per_host", f"expected a divisor of gpus_per_node ({cluster.gpus_per_node}): a node "
                                           f"(NVLink domain) is whole hosts, got {cluster.gpus_per_host}")
        f.reject_unknown()
        return cluster


def _efficiency(f: Fields | None, gpu: Gpu) -> Efficiency | LegacyEfficiency:
    if f is not None and f.has("borrowed_from"):
        return _borrowed(f, gpu)
    return efficiency_from_fields(f, gpu.family)


BORROWED_SOURCE = "borrowed from {lender}: fitted there on its runs, none on this cluster"


def _borrowed(f: Fields, gpu: Gpu) -> Efficiency:
    """`efficiency: {borrowed_from: NAME}`: the fitted block of cluster NAME (a preset or a YAML
    path) of the same GPU family, read from there, so that a refit of the lender reaches every
    cluster that borrows it (no copied numbers). The lender must hold a block fitted on its own
    runs: a borrowed or default one would be a guess passed on."""
    name = f.str("borrowed_from")
    for key in f.data:
        if key != "borrowed_from":
            raise f.error(str(key), "nothing goes beside borrowed_from: a borrowed block's values are its lender's")
    try:
        path, data = _cluster_mapping(name)
    except SpecError as e:
        raise f.error("borrowed_from", str(e)) from None
    if "pools" in data:
        raise f.error("borrowed_from", f"{name!r} is a mixed cluster; borrow from a cluster of one kind of GPU")
    if isinstance(data.get("efficiency"), dict) and "borrowed_from" in data["efficiency"]:
        raise f.error("borrowed_from", f"{name!r} borrows its block from {data['efficiency']['borrowed_from']!r}; "
                                       "borrow from the cluster it was fitted on")
    lender = Cluster.from_dict(data, str(path))
    eff = lender.efficiency
    if not isinstance(eff, Efficiency) or not eff.source.startswith("fitted on"):
        raise f.error("borrowed_from", f"{name!r} has no block fitted on its own runs ({eff.source or 'version 1'})")
    if lender.gpu.family != gpu.family:
        raise f.error("borrowed_from", f"{name!r} runs {lender.gpu.name} ({lender.gpu.family}); a block carries "
                                       f"over only within a GPU family ({gpu.family} here)")
    return replace(eff, source=BORROWED_SOURCE.format(lender=name))


def load_gpu(ref: str, _seen: tuple[str, ...] = ()) -> Gpu:
    path = resolve(ref, "hardware/gpus", "GPU")
    data = load_mapping(path)
    data.setdefault("name", path.stem)
    return gpu_from_mapping(data, str(path), _seen + (str(path.resolve()),))


def gpu_from_mapping(data: dict, where: str, seen: tuple[str, ...] = ()) -> Gpu:
    """A GPU from its mapping (a file's or a cluster's inline `gpu:`), derated where it says so."""
    if "derated_from" in data:
        data = derated(data, where, seen)
    return Gpu.from_dict(data, where)


def derated(data: dict, where: str, seen: tuple[str, ...]) -> dict:
    """A GPU file written as another GPU run slower (`derated_from: {gpu: NAME, compute: F}`: a
    power-capped part, say): the base GPU's dense peaks and measured attention throughputs times
    F, its measured fractions of peak (GEMM, HBM) kept, and every other key the file states
    (memory_gib, hbm_GBps, tdp_w, source, ...) taking the place of the base's."""
    f = Fields(data, where)
    d = f.sub("derated_from")
    if d is None:
        raise f.error("derated_from", "expected a mapping {gpu: NAME, compute: FRACTION}")
    factor = d.float("compute", maximum=1.0)
    ref = d.str("gpu")
    d.reject_unknown()
    if f.has("tflops"):
        raise f.error("tflops", "a derated GPU takes its peaks from derated_from.gpu; state one or the other")
    try:
        base_path = str(resolve(ref, "hardware/gpus", "GPU").resolve())
    except SpecError as e:
        raise d.error("gpu", str(e)) from None
    if base_path in seen:
        raise f.error("derated_from.gpu", f"{ref!r} is derated from this file again (a cycle)")
    base = load_gpu(ref, seen).to_dict()
    base["tflops"] = {p: v * factor for p, v in base["tflops"].items()}
    if "measured" in base:
        m = base["measured"]
        for table in m["attention"]:
            table["tflops"] = {s: v * factor for s, v in table["tflops"].items()}
        m["source"] = f"{m['source']} (of {base['name']}; attention x {factor:g} with its peaks)"
    merged = {k: v for k, v in base.items() if k != "name"}
    merged.update({k: v for k, v in data.items() if k != "derated_from"})
    return merged


def load_cluster(ref: str):
    """A preset name under hardware/clusters/ or a path to a cluster YAML: a Cluster, or a
    spec/pools.MixedCluster where the spec lists `pools:`."""
    path, data = _cluster_mapping(ref)
    return cluster_from_dict(data, str(path))


def _cluster_mapping(ref: str):
    """(path, mapping) of a cluster preset or YAML, its name defaulting to the file's stem."""
    path = resolve(ref, "hardware/clusters", "cluster")
    data = load_mapping(path)
    data.setdefault("name", path.stem)
    return path, data


def cluster_from_dict(data: dict, where: str):
    """A Cluster from its spec mapping, or a spec/pools.MixedCluster where it lists `pools:`."""
    if "pools" in data:
        from planner.spec.pools import mixed_from_dict
        return mixed_from_dict(data, where)
    return Cluster.from_dict(data, where)
