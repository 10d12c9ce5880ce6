"""The routed experts' gradients and optimizer under expert parallelism (ep or etp > 1).

Each rank holds its EP coordinate's experts (under etp > 1 its ETP coordinate's slice of each,
`memo_exec.moe.weights`); the tokens of its whole EP group (and ETP group) reach them through the
all-to-all (and the ETP all-gather, `memo_exec.moe.etp`), so their gradients are summed over the
``expert_dp`` group only (the ranks holding the same slice of the same experts: `memo_exec.moe.groups`),
never over the dense layers' data group, and never over TP. They are kept out of the dense units'
`memo_exec.distributed.zero.GradSync` and get their own (the distributed runner's ``expert_sync``: a unit per
layer, over the expert-DP group, ``over``), with the layout's ZeRO stage: from ZeRO 1 the experts' optimizer
states are sharded over the expert-DP ranks, from ZeRO 2 their gradients, from ZeRO 3 their weights (gathered
around each layer's forward and backward; under FSDP as the dense layers, resharded after the forward or kept,
as torchtitan's ``efsdp`` shards them), as Megatron-Core's distributed optimizer does and the simulator prices
(`memo_sim.cost.param_split`: a ZeRO shard holds (dense + expert) / (tp x state_shards)). With ep == etp == 1
the experts are ordinary replicated parameters of their layer's unit.

`gather_experts` puts a layer's whole routed-expert gradient together from the EP ranks' experts and the ETP
ranks' slices (the tests' comparison with one process).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from memo_exec.moe.weights import join_etp


def _all_gather(t: torch.Tensor, size: int, group) -> list[torch.Tensor]:
    if size == 1:
        return [t.detach().clone()]
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def gather_experts(grad: torch.Tensor, groups, name: str, model) -> torch.Tensor:
    """The whole layer's ``name`` [E, ...] from each EP rank's [E/ep, ...] (a collective over the EP group), each
    expert's ETP slices joined (over the ETP group, `memo_exec.moe.weights.join_etp`); ``groups`` the rank's
    `memo_exec.moe.groups.ExpertGroups`."""
    whole = torch.cat(_all_gather(grad, groups.ep, groups.ep_group), 0)
    return join_etp(name, _all_gather(whole, groups.etp, groups.etp_group), model)
