"""Kernel times on one GPU from the profile's peak, efficiency curves and HBM bandwidth, written once.

- GEMM (roofline): a GEMM of ``flops`` that reads and writes ``nbytes`` of operands takes
  max(flops / (peak · gemm_efficiency(flops)), nbytes / (HBM bandwidth · elementwise fraction)).
  The compute side is the profile's curve (measured over the layer's GEMM shapes by `memo-exec
  calibrate`); the memory side is the roofline's bandwidth ceiling (Williams, Waterman and
  Patterson, "Roofline", CACM 2009), which binds when the arithmetic intensity flops / nbytes
  falls below peak / bandwidth (A100: 312 TFLOP/s / 2039 GB/s = 153 FLOP/byte), as for the
  batched score GEMMs of materialised attention (k = head dim) or a GEMM on few tokens.
  `gemm_bytes` gives a GEMM's operand bytes from its shape: an (m x k) by (k x n) product reads
  m·k + k·n elements and writes m·n, ``batch`` times. The transformer layer's GEMMs
  (k = hidden or FFN width) sit far above the ridge and are compute-bound.
- Attention (FlashAttention-2, or cuDNN's fused attention or FlashAttention's Triton kernel where the profile
  has their curves: ``kernel``, `memo_sim.profile.attention_kernels`): FLOPs at the attention efficiency curves
  (at the head dim the kernel pads a call to), plus the profile's time
  per causal score element (``efficiency.attention_*_score_time``) times the kernel's score
  elements when the head size is known (`memo_sim.model.flops.attention_score_elements`); ring
  CP's blocks (``block``) at the block kernel's own curves and time per element where the profile
  has them (`memo_sim.cost.ring_attention`).
- Memory-bound kernels (norms, activations, residual adds, softmax and dropout passes, Adam):
  bytes / (HBM bandwidth · elementwise fraction); one op of a layer (`memory_bound_op_time`)
  adds the profile's per-call ``efficiency.kernel_latency``.
"""

from __future__ import annotations

from memo_sim.model.flops import ATTN_BWD_FACTOR, attention_score_elements
from memo_sim.profile.attention_kernels import attention_kernel
from memo_sim.profile.schema import HardwareProfile


def gemm_bytes(m: float, n: float, k: float, dtype_bytes: int, batch: float = 1) -> float:
    """Operand bytes of ``batch`` GEMMs (m x k) @ (k x n): reads m·k + k·n, writes m·n elements each."""
    return batch * dtype_bytes * (m * k + k * n + m * n)


def gemm_time(flops: float, profile: HardwareProfile, dtype: str = "bf16", nbytes: float = 0.0,
              fmt: str | None = None) -> float:
    """A GEMM of ``flops`` at the ``dtype`` peak times the efficiency curve of ``fmt`` (a quantised
    GEMM format's name: its own curve where the profile has one, `Efficiency.gemm_curve`), or its
    ``nbytes`` at the HBM bandwidth, whichever is longer."""
    if flops <= 0:
        return 0.0
    return max(flops / (profile.peak(dtype) * profile.efficiency.gemm_curve(fmt)(flops)),
               memory_bound_time(nbytes, profile))


def _padded(flops: float, head_dim: int | None, kernel: str) -> tuple[float, int | None]:
    """A call's FLOPs and head dim as ``kernel`` runs them: a kernel that tiles the head dim as a power of two
    (`memo_sim.profile.attention_kernels`: FlashAttention's Triton kernel) does the work of the padded head dim."""
    if not head_dim:
        return flops, head_dim
    d = attention_kernel(kernel).priced_head_dim(head_dim)
    return flops * d / head_dim, d


def attention_fwd_time(flops: float, profile: HardwareProfile, dtype: str = "bf16",
                       head_dim: int | None = None, kernel: str = "flash", block: str = "") -> float:
    """Forward attention of ``flops`` in ``kernel`` (`Efficiency.attention_curves`; ``block``: one of
    ring CP's c x c blocks, `memo_sim.cost.ring_attention`); with ``head_dim``, its score elements
    at the profile's time per element too, and the head dim the kernel pads it to (`_padded`)."""
    if flops <= 0:
        return 0.0
    flops, head_dim = _padded(flops, head_dim, kernel)
    eff = profile.efficiency
    t = flops / (profile.peak(dtype) * eff.attention_curves(kernel, block)[0](flops))
    if head_dim:
        t += attention_score_elements(flops, head_dim) * float(eff.attention_score_times(block)[0])
    return t


def attention_bwd_time(flops: float, profile: HardwareProfile, dtype: str = "bf16",
                       head_dim: int | None = None, kernel: str = "flash", block: str = "") -> float:
    """``flops`` are the backward kernel's own FLOPs (2.5x the forward's for FlashAttention)."""
    if flops <= 0:
        return 0.0
    flops, head_dim = _padded(flops, head_dim, kernel)
    eff = profile.efficiency
    t = flops / (profile.peak(dtype) * eff.attention_curves(kernel, block)[1](flops))
    if head_dim:
        t += attention_score_elements(flops / ATTN_BWD_FACTOR, head_dim) * float(eff.attention_score_times(block)[1])
    return t


def memory_bound_time(nbytes: float, profile: HardwareProfile) -> float:
    if nbytes <= 0:
        return 0.0
    return nbytes / (float(profile.gpu.hbm_bandwidth) * float(profile.efficiency.elementwise))


def memory_bound_op_time(nbytes: float, profile: HardwareProfile, kernels: int = 1) -> float:
    """One memory-bound op of a layer (a norm, an activation, a residual add): its bytes over the
    bandwidth plus the profile's per-call latency for each of its ``kernels`` (more than one where eager
    PyTorch builds the op from separate tensor ops: `memo_sim.model.eager_kernels`)."""
    if nbytes <= 0:
        return 0.0
    return memory_bound_time(nbytes, profile) + kernels * float(profile.efficiency.kernel_latency)
