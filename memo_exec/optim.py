"""AdamW with fp32 master weights for 16-bit parameters (the 16 bytes per parameter that
`memo_sim.cost.memory` counts: 2 weight + 2 gradient + 4 master + 4 m + 4 v).

The update is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments), applied one
parameter at a time so the fp32 copy of a 16-bit gradient exists for one tensor only. For fp32/fp64
parameters the parameter is its own master copy.
"""

from __future__ import annotations

import math

import torch


class AdamW:
    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.step_count = 0
        self.master: list[torch.Tensor] = []
        self.m: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        for p in self.params:
            state_dtype = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32
            self.master.append(p.detach() if p.dtype == state_dtype else p.detach().to(state_dtype))
            self.m.append(torch.zeros_like(p, dtype=state_dtype))
            self.v.append(torch.zeros_like(p, dtype=state_dtype))

    def state_bytes(self) -> int:
        tot = 0
        for p, mp, m, v in zip(self.params, self.master, self.m, self.v):
            tot += m.numel() * m.element_size() + v.numel() * v.element_size()
            if mp.data_ptr() != p.data_ptr():
                tot += mp.numel() * mp.element_size()
        return tot

    @staticmethod
    def state_bytes_for(numel: int, dtype: torch.dtype) -> int:
        if dtype in (torch.float32, torch.float64):
            return 2 * numel * torch.empty((), dtype=dtype).element_size()
        return 12 * numel

    @staticmethod
    def step_temporary_bytes(numel: int, dtype: torch.dtype) -> int:
        """Temporaries of one parameter's update: the state-dtype gradient (16-bit parameters) and
        the two tensors of ``sqrt(v) / bc2_sqrt``."""
        if dtype in (torch.float32, torch.float64):
            return 2 * numel * torch.empty((), dtype=dtype).element_size()
        return 3 * numel * 4

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        b1, b2 = self.betas
        bc1 = 1 - b1 ** self.step_count
        bc2 = 1 - b2 ** self.step_count
        step_size = self.lr / bc1
        bc2_sqrt = math.sqrt(bc2)
        for p, mp, m, v in zip(self.params, self.master, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad if p.grad.dtype == mp.dtype else p.grad.to(mp.dtype)
            mp.mul_(1 - self.lr * self.wd)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / bc2_sqrt).add_(self.eps)
            mp.addcdiv_(m, denom, value=-step_size)
            if mp.data_ptr() != p.data_ptr():
                p.copy_(mp)
