"""FLOPs, written once. Tokens T = b·s of one sequence (or of one GPU's share where noted).

- GEMM of widths (i, o) on T tokens: 2·T·i·o.
- Causal attention forward over a sequence of s tokens: 2·b·s²·h (half of the full 4·b·s²·h).
  FlashAttention's backward runs 2.5x the forward's matmul FLOPs (it recomputes the scores).
- Model FLOPs per sample (for MFU): 6·s·P + 6·n·h·s².
"""

from __future__ import annotations

from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import OpSpec, forward_ops

ATTN_BWD_FACTOR = 2.5  # FlashAttention backward / forward matmul FLOPs
NORM_FLOPS_PER_ELEM = 8  # mean, var, normalise, scale, shift (negligible next to the GEMMs)


def gemm_flops(tokens: float, in_width: int, out_width: int) -> float:
    return 2.0 * tokens * in_width * out_width


def causal_attention_flops(batch: int, seq: int, hidden: int) -> float:
    """Forward FLOPs of causal attention (QK^T and PV over the lower triangle)."""
    return 2.0 * batch * seq * seq * hidden


def attention_score_elements(fwd_flops: float, head_dim: int) -> float:
    """Score elements (query-key pairs of one head) behind ``fwd_flops`` of causal attention:
    each costs a multiply-add over the head size in QK^T and another in PV (4·head_dim FLOPs;
    `causal_attention_flops` counts the lower triangle, so does this)."""
    return fwd_flops / (4.0 * head_dim)


def op_flops(op: OpSpec, model: ModelConfig, batch: int, seq: int) -> float:
    """Forward FLOPs of one op of one layer for a whole (unsplit) sequence batch."""
    tokens = batch * seq
    if op.kind == "gemm":
        return gemm_flops(tokens, *op.gemm)
    if op.kind == "attention":
        return causal_attention_flops(batch, seq, model.attention_width)
    if op.kind == "norm":
        return NORM_FLOPS_PER_ELEM * tokens * model.hidden
    width = model.ffn if op.name == "act" else model.hidden
    return 2.0 * tokens * width


def layer_forward_flops(model: ModelConfig, batch: int, seq: int) -> dict[str, float]:
    """GEMM and attention forward FLOPs of one layer: 24·b·s·h² + 2·b·s²·h for GPT (f = 4h). A MoE
    layer's expert GEMMs count the top-k experts each token runs."""
    gemm = sum(op_flops(op, model, batch, seq) * (model.top_k if op.scope == "expert" else 1)
               for op in forward_ops(model) if op.kind == "gemm")
    attn = causal_attention_flops(batch, seq, model.attention_width) * model.attention_flop_fraction(seq)
    return {"gemm": gemm, "attention": attn}


def classifier_flops(model: ModelConfig, batch: int, seq: int) -> float:
    return gemm_flops(batch * seq, model.hidden, model.vocab)


def model_flops_per_iteration(model: ModelConfig, batch: int, seq: int) -> float:
    """MISSION's model FLOPs: (6·s·P + 6·n·h·s²) per sample; recompute is not counted. A mixture of
    experts counts the parameters a token uses (`ModelConfig.active_params`); attention counts the
    width its FLOPs scale with and a sliding window's fewer scores (`ModelConfig.attention_width`,
    ``attention_flop_fraction``), which are hidden and 1 for a standard layer. Multi-token-prediction
    modules count as one more layer each and a classifier pass (`mtp_head_params`)."""
    attn = model.layers * model.attention_width * seq * seq * model.attention_flop_fraction(seq)
    mtp = model.mtp_layers * (model.attention_width * seq * seq * model.attention_flop_fraction(seq))
    return batch * (6.0 * seq * (model.active_params() + mtp_head_params(model)) + 6.0 * (attn + mtp))


def mtp_head_params(model: ModelConfig) -> int:
    """The parameters a token's multi-token-prediction modules use (`ModelConfig.mtp_active_params`) and the
    classifier each runs again (Megatron-LM's training.py counts the logits (1 + mtp_num_layers) times); 0 without
    modules."""
    return model.mtp_active_params() + model.mtp_layers * model.vocab * model.hidden


def mfu(model: ModelConfig, batch: int, seq: int, iteration_s: float, gpus: int, peak_flops: float) -> float:
    return model_flops_per_iteration(model, batch, seq) / iteration_s / (gpus * peak_flops)


def tgs(batch: int, seq: int, iteration_s: float, gpus: int) -> float:
    """Tokens per GPU per second."""
    return batch * seq / iteration_s / gpus
