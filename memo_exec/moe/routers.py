"""MoE routers by name (``ModelConfig.router``): the score function, then top-k (over the scores, or within
groups), the chosen weights from the scores.

A score function ``logits [T, E] -> scores [T, E]`` is registered by the router's name with ``ROUTERS.add``;
`router_for` makes the model's `Router` of it, with what the router's description says
(`memo_sim.model.moe_routers`: whether the chosen weights are normalised, whether they scale the experts'
input): ``(logits, k, idx=None) -> (idx [T, k] int64, weights [T, k])``. ``idx`` given (the routing a
forward chose, kept for the backward) selects those
experts instead of choosing again, so a recompute from a slightly different input never changes
where tokens go (and so never changes the all-to-all's split sizes). Top-k is deterministic: a
stable descending sort, so tied scores pick the lower expert index (a tied group the lower group).
The chosen weights are normalised to sum to 1 where the model says so (`ModelConfig.weights_normalised`:
Hugging Face's norm_topk_prob, Mixtral's, Qwen3-MoE's and DeepSeek-V3's; under softmax routing a softmax over the
k chosen logits, Megatron-LM's default), else each the score as it is (DeepSeek-V2's and Qwen2-MoE's: the softmax
over all the experts, Megatron-LM's --moe-router-pre-softmax; Llama 4's ``sigmoid_topk``: the sigmoid of each chosen
logit, applied to the expert's input, as transformers' Llama4TextMoe and Megatron-LM's --moe-apply-probs-on-input
do, `memo_exec.moe.block`), then multiplied by the model's ``router_scaling`` (DeepSeek-V3's and GLM-4.5's
routed_scaling_factor, Megatron-LM's --moe-router-topk-scaling-factor).

Group-limited routing (``router_groups`` / ``router_group_topk``: DeepSeek-V3's n_group / topk_group,
Megatron-LM's --moe-router-num-groups / --moe-router-group-topk): the experts in equal groups, a group
scored by the sum of its ``top_k // router_group_topk`` best scores, as Megatron-LM's `group_limited_topk`
(DeepSeek-V3's top-2 of 8 over 4 groups; at least one score where top_k is below the groups picked), on the
logits under normalised softmax routing (Megatron-LM's default runs top-k on them before its softmax), on the
probabilities under unnormalised softmax routing (--moe-router-pre-softmax runs top-k after it; HF DeepSeek-V2's
group_limited_greedy takes a group's best probability instead), each token's experts the top-k of its
``router_group_topk`` best groups.
The sigmoid router's DeepSeek-V3 correction bias (a buffer for the selection only, updated from the
loads outside the gradient) starts at zero and is not updated here, so it is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from memo_exec.errors import ExecError
from memo_sim.model.config import ModelConfig
from memo_sim.registry import Registry

ROUTERS: Registry = Registry("model.router", error=ExecError, unknown="{what} {name!r}: the executor runs {known}")


def _descending(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def top_k(scores: torch.Tensor, k: int, groups: int = 0, group_topk: int = 0) -> torch.Tensor:
    """Indices of the k largest scores of each row; ties go to the lower index. With ``groups``, only
    from each row's ``group_topk`` best groups of experts (`router_groups_why_not` holds for them)."""
    s = scores.detach()
    if groups:
        T, E = s.shape
        per_group = s.view(T, groups, E // groups)
        best = torch.sort(per_group, dim=-1, descending=True).values[..., :max(1, k // group_topk)].sum(-1)
        keep = torch.zeros(T, groups, dtype=torch.bool, device=s.device)
        keep.scatter_(1, _descending(best, group_topk), True)
        s = s.masked_fill(~keep.repeat_interleave(E // groups, dim=1), float("-inf"))
    return _descending(s, k).contiguous()


# score functions, each monotonic per expert (so top-k of the scores is top-k of the logits)
ROUTERS.add("softmax", lambda logits: torch.softmax(logits, dim=-1))  # softmax over all experts' logits
ROUTERS.add("sigmoid", torch.sigmoid)  # a sigmoid per expert
ROUTERS.add("sigmoid_topk", torch.sigmoid)  # Llama 4's: the chosen logits' sigmoid, not normalised, on the input


@dataclass(frozen=True)
class Router:
    """A model's router: its score function, group limit, output scale, and (from the router's description)
    whether the chosen weights are normalised and whether they scale the experts' input."""

    scores: Callable[[torch.Tensor], torch.Tensor]
    groups: int = 0
    group_topk: int = 0
    scaling: float = 1.0
    normalised: bool = True
    on_input: bool = False
    groups_on_logits: bool = False  # groups scored on the logits (normalised softmax routing), not on the scores

    def __call__(self, logits: torch.Tensor, k: int, idx: torch.Tensor | None = None):
        s = self.scores(logits)
        if idx is None:
            idx = top_k(logits if self.groups and self.groups_on_logits else s, k, self.groups, self.group_topk)
        w = s.gather(1, idx)
        if self.normalised:
            w = w / w.sum(-1, keepdim=True)
        return idx, (w * self.scaling if self.scaling != 1.0 else w)


def router_for(model: ModelConfig) -> Router:
    spec, normalised = model.moe_router, model.weights_normalised
    return Router(ROUTERS.get(model.router), model.router_groups, model.router_group_topk, model.router_scaling,
                  normalised, spec.weights_input, spec.score_function == "softmax" and normalised)
