"""MoE routers by name (``ModelConfig.router``): the score function and top-k over the gate's logits.

A router is a function ``(logits [T, E], k, idx=None) -> (idx [T, k] int64, weights [T, k])``
registered with ``@ROUTERS.register("name")``. ``idx`` given (the routing a forward chose, kept
for the backward) selects those experts instead of choosing again, so a recompute from a slightly
different input never changes where tokens go (and so never changes the all-to-all's split sizes).
Top-k is deterministic: a stable descending sort, so tied scores pick the lower expert index.
Both routers normalise the chosen weights to sum to 1 (the sim's `memo_sim.model.moe_routers`).
The sigmoid router's DeepSeek-V3 correction bias (a buffer for the selection only, updated from the
loads outside the gradient) starts at zero and is not updated here, so it is left out.
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_sim.registry import Registry

ROUTERS: Registry = Registry("model.router", error=ExecError, unknown="{what} {name!r}: the executor runs {known}")


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores of each row; ties go to the lower index."""
    return torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[:, :k].contiguous()


def _normalised(scores: torch.Tensor, k: int, idx: torch.Tensor | None):
    if idx is None:
        idx = top_k(scores, k)
    w = scores.gather(1, idx)
    return idx, w / w.sum(-1, keepdim=True)


@ROUTERS.register("softmax")
def softmax_router(logits: torch.Tensor, k: int, idx: torch.Tensor | None = None):
    """Softmax over all experts' logits, top-k, the k weights renormalised to sum to 1."""
    return _normalised(torch.softmax(logits, dim=-1), k, idx)


@ROUTERS.register("sigmoid")
def sigmoid_router(logits: torch.Tensor, k: int, idx: torch.Tensor | None = None):
    """A sigmoid per expert, top-k, the k weights normalised to sum to 1."""
    return _normalised(torch.sigmoid(logits), k, idx)


def router_for(name: str):
    return ROUTERS.get(name)
