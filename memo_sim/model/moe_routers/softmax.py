"""Softmax top-k routing (Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS; Megatron-Core's
``--moe-router-score-function softmax``): softmax over the experts' logits, the top-k, their
weights renormalised where the model says so (``router_normalised``, norm_topk_prob: Mixtral's and Qwen3-MoE's;
DeepSeek-V2's and Qwen2-MoE's not, Megatron-Core's ``--moe-router-pre-softmax``), and the auxiliary load-balancing
loss (Switch Transformer) on the probabilities. Passes over the fp32 score matrix: softmax (read, write), top-k
(read), the aux loss (read): four, rounded to what one fused kernel per step moves."""

from __future__ import annotations

from memo_sim.model.moe_routers.base import Router
from memo_sim.model.moe_routers.registry import ROUTERS

ROUTERS.add("softmax", Router("softmax", "softmax top-k, auxiliary load-balancing loss", score_passes=2,
                              balancing="auxiliary loss on the router probabilities"))
