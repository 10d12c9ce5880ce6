"""AdamW with fp32 master weights for 16-bit parameters, and the gradients it reads by the plan's
precision recipe (`memo_sim.model.precision`): Megatron's recipe (the default for 16-bit models)
keeps fp32 main gradients, 2 weight + 4 main gradient + 4 master + 4 m + 4 v = 18 bytes per
parameter (`memo_exec.model.MainGrads`); the ZeRO paper's keeps 16-bit gradients (16 bytes); fp32
models keep fp32 everything with no master copy.

The update is torch.optim's fused Adam kernel with decoupled weight decay (AdamW), called through
its functional form (`torch.optim.adamw.adamw` with ``fused=True``, public since torch 2.0: the
update `torch.optim.AdamW(fused=True)` makes, bias-corrected moments, one kernel reading and
writing the master weight, gradient and moments, as the fused Adam kernels frameworks train with,
and as `memo_sim.cost.boundary.optimizer_step_bytes` prices it), over the fp32 master weights with
this class's moment tensors and per-parameter step counts as its state. The functional form, not
the class: constructing a `torch.optim.Optimizer` imports TorchDynamo (its ``add_param_group`` is
wrapped to disable it), 2 s of every executor process's start on a CPU. A gradient of
another dtype than its master (16-bit gradients of 16-bit parameters) is cast to fp32 and applied
one parameter at a time, so that copy exists for one tensor only. For fp32/fp64 parameters the
parameter is its own master copy. Measured on an H100 (2026-11-25, 1.82e9 parameters of 8 layers
of GPT-7B with fp32 main gradients, benchmarks/gpu/probe_executor.py): the fused step 24.3 ms, the
previous one-op-at-a-time update 56.9 ms.
"""

from __future__ import annotations

import math

import torch
from torch.optim.adamw import adamw

from memo_exec.gemm_formats import weights_changed


def main_grad_dtype(recipe, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the gradients the optimizer step reads: fp32 main gradients where the plan's
    precision recipe keeps gradients wider than the 16-bit compute dtype (Megatron's: 4 bytes),
    else the parameters' own dtype."""
    if recipe is None or dtype in (torch.float32, torch.float64):
        return dtype
    return torch.float32 if recipe.grad_bytes > torch.empty((), dtype=dtype).element_size() else dtype


def model_state_bytes(numel: int, dtype: torch.dtype, grad_dtype: torch.dtype | None = None) -> int:
    """Weights, the gradients the step reads (``grad_dtype``, default the weights') and AdamW's states."""
    e = torch.empty((), dtype=dtype).element_size()
    ge = torch.empty((), dtype=grad_dtype or dtype).element_size()
    return numel * (e + ge) + AdamW.state_bytes_for(numel, dtype)


class NonFiniteGradient(ArithmeticError):
    """The gradients' global norm is not a finite number: no parameter was updated."""

    def __init__(self, norm: float) -> None:
        super().__init__(f"the gradient norm is {norm}")
        self.norm = norm


class AdamW:
    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1, main_grads: dict | None = None, check_finite: bool = True) -> None:
        """``main_grads``: parameter -> its fp32 main gradient (`memo_exec.model.MainGrads`), read
        instead of ``.grad``. ``check_finite``: refuse a non-finite gradient norm (`step`); off
        for one rank's shard of a distributed optimizer, whose ranks would have to agree first."""
        self.main_grads = main_grads
        self.check_finite = check_finite
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay  # a schedule may set lr
        self.step_count = 0
        self.master: list[torch.Tensor] = []
        self.m: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        for p in self.params:
            state_dtype = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32
            self.master.append(p.detach() if p.dtype == state_dtype else p.detach().to(state_dtype))
            self.m.append(torch.zeros_like(p, dtype=state_dtype))
            self.v.append(torch.zeros_like(p, dtype=state_dtype))
        # per-parameter step counts, as torch.optim keeps them (a parameter without a gradient is not stepped)
        self.steps = [torch.zeros((), dtype=torch.float32, device=mp.device) for mp in self.master]

    def _fused_update(self, idx: list[int], grads: list[torch.Tensor]) -> None:
        """The fused AdamW update of the master weights ``idx`` with ``grads`` (their master's dtype); the
        kernel adds one to each of their step counts."""
        if not idx:
            return
        b1, b2 = self.betas
        adamw([self.master[i] for i in idx], grads, [self.m[i] for i in idx], [self.v[i] for i in idx], [],
              [self.steps[i] for i in idx], fused=True, amsgrad=False, beta1=b1, beta2=b2, lr=self.lr,
              weight_decay=self.wd, eps=self.eps, maximize=False)

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
    def step_temporary_bytes(numel: int, dtype: torch.dtype, grad_dtype: torch.dtype | None = None) -> int:
        """Temporaries of one parameter's update: the fused kernel makes none; a gradient of
        another dtype than the master weight (``grad_dtype``, default the parameters') is cast to
        the master's dtype first."""
        state = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        return 0 if (grad_dtype or dtype) == state else numel * torch.empty((), dtype=state).element_size()

    def grads(self) -> list[torch.Tensor]:
        out = [self.main_grads[p] if self.main_grads is not None else p.grad for p in self.params]
        return [g for g in out if g is not None]

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW update; raise `NonFiniteGradient` before touching any parameter when the
        gradients' global L2 norm is not finite (one fused reduction over every gradient)."""
        grads = self.grads() if self.check_finite else []
        if grads:
            norm = float(torch.nn.utils.get_total_norm(grads))
            if not math.isfinite(norm):
                raise NonFiniteGradient(norm)
        weights_changed()  # FP8 weight copies are cast again at their next use (`memo_exec.gemm_formats`)
        self.step_count += 1
        same, same_grads, cast = [], [], []  # cast: gradients of another dtype than their master, one at a time
        for i, (p, mp) in enumerate(zip(self.params, self.master)):
            grad = self.main_grads[p] if self.main_grads is not None else p.grad
            if grad is None:
                continue
            if grad.dtype == mp.dtype:
                same.append(i)
                same_grads.append(grad)
            else:
                cast.append((i, grad))
        self._fused_update(same, same_grads)
        for i, grad in cast:
            self._fused_update([i], [grad.to(self.master[i].dtype)])
        for p, mp in zip(self.params, self.master):
            if mp.data_ptr() != p.data_ptr():
                p.copy_(mp)
