"""The routed experts' gradients and optimizer under expert parallelism (ep or etp > 1).

Each rank holds its EP coordinate's experts (under etp > 1 its ETP coordinate's slice of each,
`memo_exec.moe.weights`); the tokens of its whole EP group (and ETP group) reach them through the
all-to-all (and the ETP all-gather, `memo_exec.moe.etp`), so their gradients are summed over the
``expert_dp`` group only (the ranks holding the same slice of the same experts: `memo_exec.moe.groups`),
never over the dense layers' data group, and never over TP. They are kept out of
`memo_exec.distributed.zero.GradSync`'s units (whose flat buffers are reduced and ZeRO-sharded over the data
group) and updated here by their own AdamW
(the same elementwise update, so the step equals the single process's). ZeRO does not shard them.
With ep == etp == 1 the experts are ordinary replicated parameters of their layer's unit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from memo_exec.moe.weights import join_etp
from memo_exec.optim_offload import make_adamw


class ExpertGradSync:
    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], group, lr: float, weight_decay: float,
                 timer, offload: bool = False) -> None:
        self.named, self.group, self.timer = named, group, timer
        for _, p in named:
            p.grad = torch.zeros_like(p)
        self.optimizer = make_adamw([p for _, p in named], offload, lr=lr, weight_decay=weight_decay,
                                    check_finite=False)

    def end_backward(self) -> None:
        if self.group is None:
            return
        for _, p in self.named:
            with self.timer.span("expert_grad_all_reduce", None, "comm", stream="dp_comm",
                                 nbytes=p.grad.numel() * p.grad.element_size()):
                dist.all_reduce(p.grad, group=self.group)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grads(self) -> None:
        for _, p in self.named:
            p.grad.zero_()

    def state_bytes(self) -> int:
        return sum(p.numel() * p.element_size() * 2 for _, p in self.named) + self.optimizer.state_bytes()


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
