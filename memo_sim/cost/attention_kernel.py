"""Attention kernels on one GPU: FlashAttention, or the materialised softmax frameworks ran before it.

``layout.attention`` (`memo_sim.profile.attention_kernels`) picks one; this module is
the one place each is priced.

- ``flash`` (FlashAttention-2): one fused kernel over the causal half of the score matrix;
  forward FLOPs 2·b·s²·h (causal), backward 2.5x that (`memo_sim.model.flops`), each at the
  profile's attention efficiency curves. ``cudnn`` (cuDNN's fused attention, TransformerEngine's
  FusedAttention) is the same kernel shape at the profile's cudnn curves where it gives them
  (`HardwareProfile.efficiency.attention_curves`; Hopper profiles do, the rest price it as flash).
- ``materialised`` (Megatron-LM's `ParallelAttention` before FlashAttention, e.g. commit
  e64507f06d of 2021-10-31, megatron/model/transformer.py): per GPU there are
  n_b = b · heads / (tp · ulysses) score matrices of s x s (the whole sequence: ring CP cannot
  run it). Forward, in order:

    scores  = baddbmm(Q, K^T)           batched GEMM, n_b x (s x s x d): 2·n_b·s²·d FLOPs over the
                                        whole matrix (the causal mask is applied afterwards)
    probs   = scale_mask_softmax(scores) fused kernel: reads and writes n_b·s² elements
    dropped = dropout(probs)             (``--attention-dropout``, default 0.1): reads n_b·s²,
                                        writes n_b·s² and a one-byte mask per element
    context = bmm(dropped, V)           batched GEMM, n_b x (s x d x s): 2·n_b·s²·d FLOPs

  Backward: dropped-gradient and dV (two batched GEMMs of the context's FLOPs), dropout backward
  (reads the gradient and the mask, writes the gradient), softmax backward (reads probs and
  their gradient, writes the scores' gradient), dQ and dK (two batched GEMMs of the scores'
  FLOPs): twice the forward GEMM FLOPs. The GEMMs are priced with their operand bytes
  (`memo_sim.cost.kernel_time.gemm_time`'s roofline: with k = d = 64..128 the score GEMMs sit
  near the HBM ridge), the softmax and dropout passes as bytes over HBM bandwidth.

  Memory: the score-sized buffers live inside a layer's forward and backward are its transients
  (`memo_sim.memplan.trace_gen.attention_buffers`); the softmax output, dropout mask and dropped
  probabilities the backward reads, n_b·s²·(2d + 1), are kept by store all
  (`memo_sim.cost.activations.skeletal_bytes`'s ``scores``).
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.cost.kernel_time import gemm_bytes, gemm_time, memory_bound_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.profile.schema import HardwareProfile

DROPOUT_MASK_BYTES = 1  # torch.nn.Dropout keeps a bool mask per element


@dataclass(frozen=True)
class AttentionCost:
    seconds: float
    flops: float  # GEMM FLOPs the kernels run (the whole score matrix for ``materialised``)
    nbytes: float  # bytes the memory-bound passes (softmax, dropout) move


def score_matrices(model: ModelConfig, layout: Layout, batch: int) -> float:
    """n_b: s x s score matrices one GPU holds (its heads of each of the ``batch`` sequences)."""
    return batch * model.heads / (layout.tp * layout.ulysses)


def materialised_attention(model: ModelConfig, layout: Layout, batch: int, seq: int,
                           profile: HardwareProfile, phase: str) -> AttentionCost:
    """Seconds, GEMM FLOPs and memory-pass bytes of the materialised attention of one layer on one
    GPU; ``phase`` fwd or recompute (the forward again) or bwd."""
    nb = score_matrices(model, layout, batch)
    s, d, dt = seq, model.qk_head_dim, DTYPE_BYTES[model.dtype]
    elems = nb * s * s
    f_one = 2.0 * elems * d  # one batched GEMM over the whole score matrix
    qk_bytes = gemm_bytes(s, s, d, dt, nb)  # Q, K in; scores out
    pv_bytes = gemm_bytes(s, d, s, dt, nb)  # probs, V in; context out
    if phase == "bwd":
        gemms = [(f_one, pv_bytes)] * 2 + [(f_one, qk_bytes)] * 2
        passes = elems * (dt + DROPOUT_MASK_BYTES + dt) + elems * 3 * dt  # dropout bwd, softmax bwd
    else:
        gemms = [(f_one, qk_bytes), (f_one, pv_bytes)]
        passes = elems * 2 * dt + elems * (dt + dt + DROPOUT_MASK_BYTES)  # softmax, dropout
    t = sum(gemm_time(f, profile, model.dtype, b) for f, b in gemms) + memory_bound_time(passes, profile)
    return AttentionCost(t, sum(f for f, _b in gemms), passes)
