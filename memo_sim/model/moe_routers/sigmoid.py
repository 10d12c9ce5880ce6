"""Sigmoid top-k routing with bias balancing (DeepSeek-V3; Megatron-Core's
``--moe-router-score-function sigmoid --moe-router-enable-expert-bias``): a sigmoid per expert, a
per-expert correction bias added for the selection only (updated outside the gradient, from the
experts' loads: a buffer, not a parameter), group-limited top-k, and the chosen weights
normalised where the model says so (norm_topk_prob: DeepSeek-V3's and GLM-4.5's true). The same fp32 passes as
softmax routing; no auxiliary loss term of note."""

from __future__ import annotations

from memo_sim.model.moe_routers.base import Router
from memo_sim.model.moe_routers.registry import ROUTERS

ROUTERS.add("sigmoid", Router("sigmoid", "sigmoid top-k with a per-expert correction bias (aux-loss-free)",
                              score_passes=2, balancing="per-expert bias updated from the loads",
                              buffers="e_score_correction_bias (experts per MoE layer)", score_function="sigmoid",
                              expert_bias=True))
