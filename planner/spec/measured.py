"""Kernel microbenchmarks of a GPU: what its GEMMs, HBM and attention kernels reach when measured
alone, each figure with its source in the GPU preset (`measured:`).

- gemm_fraction: the best dense GEMM throughput of the precision over its dense peak (cuBLAS
  through torch.matmul at the best shape found; stas00/ml-engineering's mamf-finder tables);
- hbm_fraction: achievable HBM bandwidth over the datasheet figure (a copy kernel);
- attention: forward+backward TFLOP/s of an attention kernel by head dimension and sequence
  length, in the FlashAttention papers' convention (forward 4*s^2*d per head, backward 2.5x the
  forward, causal counted at half), as each paper measured it.

The cost model reads these as the facts its efficiencies start from (cost/compute.py); what a
training loop loses beyond them is the fitted `framework_fraction` (spec/efficiency.py).
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field

from planner.errors import SpecError
from planner.spec.fields import Fields

KERNELS = ("fa2", "fa3", "cudnn", "fa-triton")
"""attention kernels with published tables: FlashAttention-2 (Dao 2023), FlashAttention-3 (Shah
et al. 2024), cuDNN fused attention (as the FlashAttention-3 paper measured it), and FlashAttention
in Triton (flash-attn's experimental flash_attn_triton, the kernel MPT's attn_impl 'triton'
copies: measured beside FlashAttention-2 on A100 in Dao 2023, Fig. 4; never on Hopper)"""


@dataclass(frozen=True, slots=True)
class AttentionTable:
    kernel: str
    causal: bool
    head_dim: int
    points: tuple[tuple[int, float], ...]
    """(sequence length, forward+backward TFLOP/s), by sequence length"""

    def tflops(self, seq_len: float) -> float:
        """Linear in log2(sequence length) between the measured points, flat beyond them."""
        xs = [math.log2(s) for s, _ in self.points]
        ys = [t for _, t in self.points]
        x = math.log2(max(seq_len, 1.0))
        if x <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return ys[-1]


@dataclass(frozen=True, slots=True)
class Measured:
    gemm_fraction: tuple[tuple[str, float], ...]
    hbm_fraction: float
    attention: tuple[AttentionTable, ...] = ()
    source: str = ""
    _hash: int = field(default=0, init=False, compare=False, repr=False)
    """the hash of the fields, computed once: a GPU keys the cost model's caches thousands of
    times a search, and hashing every point of its attention tables each time was 10 % of one"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.gemm_fraction, self.hbm_fraction, self.attention, self.source)))

    def __hash__(self) -> int:
        return self._hash

    def gemm(self, precision: str) -> float | None:
        for p, value in self.gemm_fraction:
            if p == precision:
                return value
        return self.gemm("bf16") if precision == "fp16" else None

    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.kernel for t in self.attention))

    def attention_tflops(self, kernel: str, causal: bool, head_dim: float, seq_len: float) -> float | None:
        """Forward+backward TFLOP/s of `kernel` at this head dimension and sequence length: the
        tables of that kernel and masking, interpolated linearly in head dimension between the
        two nearest measured ones (the nearest one beyond them); None when not measured."""
        return _attention_tflops(self, kernel, causal, head_dim, seq_len)


    def to_dict(self) -> dict:
        return {"gemm_fraction": dict(self.gemm_fraction), "hbm_fraction": self.hbm_fraction,
                "attention": [{"kernel": t.kernel, "causal": t.causal, "head_dim": t.head_dim,
                               "tflops": {str(s): v for s, v in t.points}} for t in self.attention],
                "source": self.source}

    @classmethod
    def from_fields(cls, f: Fields) -> "Measured":
        g = f.sub("gemm_fraction")
        if g is None:
            raise f.error("gemm_fraction", "missing (required): best GEMM throughput over dense peak, e.g. {bf16: 0.80}")
        precisions = ("bf16", "fp16", "fp8")
        gemm = tuple((p, g.float(p, maximum=1.0)) for p in precisions if g.has(p))
        g.reject_unknown(precisions)
        tables = []
        for k, row in enumerate(f.raw("attention", []) or []):
            r = Fields(row, f.where, f"{f.prefix}attention[{k}].")
            points = r.raw("tflops")
            if not isinstance(points, dict) or not points:
                raise r.error("tflops", "expected a mapping of sequence length to TFLOP/s, e.g. {4096: 294}")
            pts = Fields({str(s): v for s, v in points.items()}, f.where, f"{r.prefix}tflops.")
            try:
                seqs = sorted(int(s) for s in points)
            except (TypeError, ValueError):
                raise r.error("tflops", "sequence lengths must be integers") from None
            tables.append(AttentionTable(kernel=r.choice("kernel", KERNELS), causal=r.bool("causal"),
                                         head_dim=r.int("head_dim"),
                                         points=tuple((s, pts.float(str(s))) for s in seqs)))
            r.reject_unknown()
        m = cls(gemm_fraction=gemm, hbm_fraction=f.float("hbm_fraction", maximum=1.0), attention=tuple(tables),
                source=f.str("source", ""))
        f.reject_unknown()
        if not m.gemm("bf16"):
            raise SpecError(f"{f.where}: {f.prefix}gemm_fraction: expected a bf16 figure")
        return m


FLAGSHIPS = {"ampere": "a100-sxm-80g", "hopper": "h100-sxm-80g", "blackwell": "b200", "cdna3": "mi300x"}
"""the preset whose measurements a GPU of its family without its own stands in for"""
UNMEASURED = Measured(gemm_fraction=(("bf16", 0.6),), hbm_fraction=0.8,
                      source="assumed: no microbenchmark of this family in the presets (GEMM 60 %, HBM 80 %)")


@lru_cache(maxsize=16)
def typical(family: str) -> Measured:
    """The measurements of the family's flagship preset (FLAGSHIPS), or UNMEASURED."""
    from planner.spec.hardware import load_gpu

    flagship = FLAGSHIPS.get(family)
    found = load_gpu(flagship).measured if flagship else None
    return found if found is not None else UNMEASURED


@lru_cache(maxsize=4096)
def _attention_tflops(m: Measured, kernel: str, causal: bool, head_dim: float, seq_len: float) -> float | None:
    """Measured.attention_tflops, cached: the cost model asks for the same few points many times."""
    rows = sorted((t for t in m.attention if t.kernel == kernel and t.causal == causal),
                  key=lambda t: t.head_dim)
    if not rows:
        return None
    below = [t for t in rows if t.head_dim <= head_dim]
    above = [t for t in rows if t.head_dim >= head_dim]
    if not below or not above:
        return (above or below)[0 if above else -1].tflops(seq_len)
    lo, hi = below[-1], above[0]
    if lo.head_dim == hi.head_dim:
        return lo.tflops(seq_len)
    w = (head_dim - lo.head_dim) / (hi.head_dim - lo.head_dim)
    return (1 - w) * lo.tflops(seq_len) + w * hi.tflops(seq_len)
