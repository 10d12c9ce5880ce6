"""Kernel times on one GPU from the profile's peak and efficiency curves, written once."""

from __future__ import annotations

from memo_sim.profile.schema import HardwareProfile


def gemm_time(flops: float, profile: HardwareProfile, dtype: str = "bf16") -> float:
    if flops <= 0:
        return 0.0
    return flops / (profile.peak(dtype) * profile.efficiency.gemm(flops))


def attention_fwd_time(flops: float, profile: HardwareProfile, dtype: str = "bf16") -> float:
    if flops <= 0:
        return 0.0
    return flops / (profile.peak(dtype) * profile.efficiency.attention_fwd(flops))


def attention_bwd_time(flops: float, profile: HardwareProfile, dtype: str = "bf16") -> float:
    """``flops`` are the backward kernel's own FLOPs (2.5x the forward's for FlashAttention)."""
    if flops <= 0:
        return 0.0
    return flops / (profile.peak(dtype) * profile.efficiency.attention_bwd(flops))


def memory_bound_time(nbytes: float, profile: HardwareProfile) -> float:
    if nbytes <= 0:
        return 0.0
    return nbytes / (float(profile.gpu.hbm_bandwidth) * float(profile.efficiency.elementwise))
