"""Time of FLOPs and bytes on one GPU: a smooth roofline with calibrated efficiencies.

GEMM (and attention core) time: t = F / (P * e) * (1 + I_half / I), where F is FLOPs, P the dense
peak of the precision, e = gemm_peak_fraction, I the arithmetic intensity (FLOP per element
moved) and I_half = gemm_intensity_half. Large GEMMs approach e * P; small per-GPU GEMMs (high tp,
short sequences, few tokens per expert) fall off as the roofline predicts (Williams et al. 2009).
Memory-bound ops: t = bytes / (HBM bandwidth * hbm_fraction).
"""

from __future__ import annotations

from planner.spec.hardware import Efficiency


def gemm_time_s(flops: float, intensity: float, peak_flops: float, eff: Efficiency) -> float:
    return flops / (peak_flops * eff.gemm_peak_fraction) * (1.0 + eff.gemm_intensity_half / intensity)


def memory_time_s(n_bytes: float, hbm_Bps: float, eff: Efficiency) -> float:
    return n_bytes / (hbm_Bps * eff.hbm_fraction)
