"""Optimizer offload: AdamW's fp32 master weights, moments and step on the host
(``Layout.optimizer_offload``; Megatron-Core's ``--optimizer-cpu-offload``, DeepSpeed's
ZeRO-Offload), as `memo_sim.cost.optimizer_offload` prices it.

`HostAdamW` keeps, per parameter (one rank's ZeRO shard where the caller passes shards), an fp32
master copy, an fp32 gradient buffer and AdamW's two moments on the host: pinned memory when the
parameters live on a CUDA device, plain CPU memory otherwise. A step (1) copies every gradient
(the fp32 main gradient where the precision recipe keeps one) into its host buffer and waits for
the copies, (2) runs the same `memo_exec.optim.AdamW` update on the host tensors (its
non-finite-norm check included, before any parameter changes), and (3) copies the updated master
weights back into the device parameters (cast to their dtype). So the update is the device
optimizer's, element for element, and the device keeps only the weights and the gradient buffers:
`state_bytes` (device bytes) is 0 and `host_state_bytes` holds the 16 bytes per parameter
(master 4, moments 8, gradient copy 4) the simulator counts on the host.

The three phases run one after the other while the device waits, as the simulator prices them
(Megatron's ``--overlap-cpu-optimizer-d2h-h2d`` pipelining over parameter groups is not run).
"""

from __future__ import annotations

import torch

from memo_exec.gemm_formats import weights_changed
from torch import nn

from memo_exec.optim import AdamW


class HostAdamW:
    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1, main_grads: dict | None = None, check_finite: bool = True) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.main_grads = main_grads
        self.pinned = any(p.device.type == "cuda" for p in self.params)
        self.cuda_devices = sorted({p.device for p in self.params if p.device.type == "cuda"}, key=str)
        self.masters: list[nn.Parameter] = []
        for p in self.params:
            dtype = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32
            m = nn.Parameter(torch.empty(p.shape, dtype=dtype, pin_memory=self.pinned))
            with torch.no_grad():
                m.copy_(p.detach())
            m.grad = torch.empty(p.shape, dtype=dtype, pin_memory=self.pinned)
            self.masters.append(m)
        self._grad_bufs = [m.grad for m in self.masters]
        self.inner = AdamW(self.masters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                           check_finite=check_finite)

    @property
    def step_count(self) -> int:
        return self.inner.step_count

    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value

    def grads(self) -> list[torch.Tensor]:
        out = [self.main_grads[p] if self.main_grads is not None else p.grad for p in self.params]
        return [g for g in out if g is not None]

    @torch.no_grad()
    def step(self) -> None:
        """Gradients to the host, AdamW there, the updated weights back (module docs)."""
        weights_changed()  # FP8 weight copies are cast again at their next use (`memo_exec.gemm_formats`)
        for p, m, buf in zip(self.params, self.masters, self._grad_bufs):
            g = self.main_grads[p] if self.main_grads is not None else p.grad
            if g is None:
                m.grad = None  # no gradient this step: AdamW leaves the parameter as it is
                continue
            buf.copy_(g, non_blocking=self.pinned)
            m.grad = buf
        self._sync()  # the host reads the gradients only once they are there
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m.detach(), non_blocking=self.pinned)
        self._sync()  # the pinned masters may change again at the next step

    def _sync(self) -> None:
        for d in self.cuda_devices:  # every device the parameters live on, not only the current one
            torch.cuda.synchronize(d)

    def state_bytes(self) -> int:
        """Device bytes of the optimizer's states: none (they are on the host)."""
        return 0

    def host_state_bytes(self) -> int:
        """Host bytes: master weights, the gradient copies and AdamW's moments."""
        return sum(2 * m.numel() * m.element_size() for m in self.masters) + self.inner.state_bytes()

    @staticmethod
    def host_bytes_for(numel: int, dtype: torch.dtype) -> int:
        """`host_state_bytes` before anything is allocated: master, gradient copy and two moments at
        the state width (fp32, or fp64 for fp64 parameters)."""
        return 4 * numel * (8 if dtype == torch.float64 else 4)


def make_adamw(params, offload: bool, **kw):
    """The executor's optimizer: `AdamW` on the device, or `HostAdamW` with ``offload``
    (``Layout.optimizer_offload``); one place that decides."""
    return HostAdamW(params, **kw) if offload else AdamW(params, **kw)
