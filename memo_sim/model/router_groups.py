"""Group-limited MoE routing (DeepSeek-V2/V3's ``n_group`` / ``topk_group``, Megatron-LM's
``--moe-router-num-groups`` / ``--moe-router-group-topk``): the one rule of which group settings can route a
token, shared by the model's validation and the Hugging Face reader (which says it under the config's keys)."""

from __future__ import annotations


def router_groups_why_not(experts: int, top_k: int, groups: int, group_topk: int) -> str | None:
    """Why group-limited routing of ``groups`` groups, ``group_topk`` picked, cannot route ``top_k`` of
    ``experts`` experts (None: it can, or there are no groups)."""
    if not (groups or group_topk):
        return None
    if not (groups and group_topk):
        return ("router_groups and router_group_topk go together (group-limited routing: n_group and topk_group): "
                "give both or neither")
    if experts % groups or not 1 <= group_topk <= groups:
        return (f"router_groups ({groups}) must divide the {experts} experts and router_group_topk ({group_topk}) "
                f"lie between 1 and it; change one of them")
    if top_k > group_topk * (experts // groups):
        return (f"top_k ({top_k}) exceeds the experts of router_group_topk ({group_topk}) groups of "
                f"{experts // groups}; change one of them")
    return None
