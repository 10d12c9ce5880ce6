"""Mixture-of-experts routers (``ModelConfig.router``), one module each, registered by name
(`base` says what a router is and prices):

- ``softmax`` (`softmax`): softmax top-k with an auxiliary balancing loss (Mixtral, Qwen-MoE, GPT-OSS);
- ``sigmoid`` (`sigmoid`): sigmoid top-k with bias balancing (DeepSeek-V3, GLM-4.5);
- ``sigmoid_topk`` (`sigmoid_topk`): top-k of the logits weighted by their sigmoid, no bias (Llama 4).

A new router is its module here (imported below), registering a `Router`.
"""

from __future__ import annotations

from memo_sim.model.moe_routers import softmax  # noqa: F401  (each module registers its router, in this order)
from memo_sim.model.moe_routers import sigmoid  # noqa: F401
from memo_sim.model.moe_routers import sigmoid_topk  # noqa: F401
from memo_sim.model.moe_routers.base import Router  # noqa: F401  (re-exported)
from memo_sim.model.moe_routers.registry import ROUTERS

ROUTER_NAMES: tuple[str, ...] = ROUTERS.names()


def router(name: str) -> Router:
    """The router called ``name`` (a one-line `MemoError` listing the known ones otherwise)."""
    return ROUTERS.get(name)
