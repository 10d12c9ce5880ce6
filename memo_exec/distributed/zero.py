"""Gradient synchronisation and ZeRO stages 0-3 over the ``data`` group (dp x cp x ulysses).

The model states are split into units: unit 0 holds the embedding/classifier and the final
LayerNorm, unit i+1 layer i. Each unit's parameters are views of one flat buffer (padded to a
multiple of the data-group size D); rank d of the group owns elements ``[d*n/D, (d+1)*n/D)``.

- ZeRO 0: every rank keeps whole gradients and optimizer states; gradients are all-reduced.
- ZeRO 1: whole gradients until the step ends, then reduce-scattered; each rank updates its own
  shard (its optimizer states are 1/D) and the shards are all-gathered back into the weights.
- ZeRO 2: also the gradients are sharded: the layers accumulate into one shared full-size
  gradient workspace, reduce-scattered into the unit's shard right after that layer's backward.
- ZeRO 3: also the weights: a layer's flat buffer is materialised (all-gather) before its
  forward and before its backward (the recompute runs inside the backward) and freed after each
  (``untyped_storage().resize_(0)``); the optimizer updates the owned shard only.

Before the data-group reduction, gradients of parameters that every TP rank holds whole
(LayerNorms, row-parallel biases, embedding) are all-reduced over the TP group when the tokens
are split over it (Megatron SP): each TP rank saw only its own tokens.

Why not ``torch.distributed.fsdp.fully_shard``: FSDP2 unshards in a module pre-forward hook and
reduce-scatters from post-backward hooks that it attaches through autograd to the module's
forward, and hands the module DTensor parameters with sharded DTensor gradients. The layer here
is never called as a module (one autograd Function runs a hand-written forward and backward that
read plain tensors and accumulate into preallocated ``.grad`` tensors, and the activation policy
re-runs parts of the forward inside the backward), so those hooks would not fire at the right
points; calling ``unshard()``/``reshard()`` by hand would still leave the gradient reduction to
be written here. The same collectives (``all_gather_into_tensor``, ``reduce_scatter_tensor``)
are therefore called directly, at the points the hand-written layer defines.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from memo_exec.distributed.collectives import all_gather_single, reduce_scatter_single
from torch import nn

from memo_exec.model import LayerHooks
from memo_exec.optim import AdamW


class _Unit:
    def __init__(self, index: int, named: list[tuple[str, nn.Parameter]], D: int, d: int, device, dtype) -> None:
        self.index, self.named = index, named
        self.numel = sum(p.numel() for _, p in named)
        self.padded = -(-self.numel // D) * D
        self.shard_n = self.padded // D
        self.lo = d * self.shard_n
        self.flat = torch.zeros(self.padded, device=device, dtype=dtype)
        self.nbytes = self.flat.untyped_storage().nbytes()
        off = 0
        with torch.no_grad():
            for _, p in named:
                n = p.numel()
                self.flat[off:off + n].copy_(p.detach().reshape(-1))
                p.data = self.flat[off:off + n].view(p.shape)
                off += n

    def grad_views(self, flat_grad: torch.Tensor) -> None:
        off = 0
        for _, p in self.named:
            n = p.numel()
            p.grad = flat_grad[off:off + n].view(p.shape)
            off += n

    def shard(self, t: torch.Tensor) -> torch.Tensor:
        return t[self.lo:self.lo + self.shard_n]


class GradSync(LayerHooks):
    """Owns the flat model states of one rank and the optimizer over its shard."""

    def __init__(self, ctx, units: list[list[tuple[str, nn.Parameter]]], replicated: list[list[bool]], zero: int,
                 device, dtype, lr: float, weight_decay: float, timer) -> None:
        zero = zero if ctx.size("data") > 1 else 0  # one rank per data group: nothing to shard
        self.ctx, self.zero, self.timer = ctx, zero, timer
        self.data = ctx.group("data")
        self.tp = ctx.group("tp")
        self.D = ctx.size("data") if zero >= 1 else 1
        d = ctx.coord("data") if zero >= 1 else 0
        self.units = [_Unit(i, named, self.D, d, device, dtype) for i, named in enumerate(units)]
        self.replicated = replicated
        self.tp_sync = ctx.sp_tokens and ctx.size("tp") > 1
        if zero >= 2:  # layers accumulate into one shared workspace; unit 0 keeps its own
            ws_n = max(u.padded for u in self.units[1:]) if len(self.units) > 1 else 0
            self.workspace = torch.zeros(ws_n, device=device, dtype=dtype)
        self.grads = []  # the flat gradient each unit accumulates into
        self.grad_shards = []
        for u in self.units:
            if zero >= 2 and u.index > 0:
                g = self.workspace[:u.padded]
            else:
                g = torch.zeros(u.padded, device=device, dtype=dtype)
            self.grads.append(g)
            u.grad_views(g)
            self.grad_shards.append(u.shard(g) if self.D == 1 else torch.zeros(u.shard_n, device=device, dtype=dtype))
        # the parameters the optimizer updates: each unit's owned shard
        if zero >= 3:
            self.param_shards = [nn.Parameter(u.shard(u.flat).detach().clone()) for u in self.units]
        else:
            self.param_shards = [nn.Parameter(u.shard(u.flat).detach()) for u in self.units]
        for ps, gs in zip(self.param_shards, self.grad_shards):
            ps.grad = gs
        self.optimizer = AdamW(self.param_shards, lr=lr, weight_decay=weight_decay, check_finite=False)
        if zero >= 3:
            for u in self.units[1:]:
                self._free(u)

    # ------------------------------------------------------------------ sizes
    def state_bytes(self) -> dict[str, int]:
        es = self.units[0].flat.element_size()
        full = sum(u.padded for u in self.units) * es
        return {"weights": full if self.zero < 3 else sum(u.shard_n for u in self.units) * es,
                "gradients": full if self.zero < 2 else (self.workspace.numel() + self.units[0].padded +
                                                          sum(u.shard_n for u in self.units)) * es,
                "optimizer": self.optimizer.state_bytes()}

    # ------------------------------------------------------------------ ZeRO-3 materialisation
    def _free(self, u: _Unit) -> None:
        u.flat.untyped_storage().resize_(0)

    def _gather(self, u: _Unit) -> None:
        if u.flat.untyped_storage().nbytes() == 0:
            u.flat.untyped_storage().resize_(u.nbytes)
        with self.timer.span("param_all_gather", u.index - 1 if u.index else None, "comm", stream="dp_comm",
                             nbytes=u.nbytes):
            all_gather_single(u.flat, self.param_shards[u.index].detach(), group=self.data)

    # ------------------------------------------------------------------ hooks (LayerRuntime)
    def begin_step(self) -> None:
        if self.zero >= 3:
            self._gather(self.units[0])

    def before_forward(self, i: int) -> None:
        if self.zero >= 3:
            self._gather(self.units[i + 1])

    def after_forward(self, i: int) -> None:
        if self.zero >= 3:
            self._free(self.units[i + 1])

    def before_backward(self, i: int) -> None:
        if self.zero >= 3:
            self._gather(self.units[i + 1])

    def after_backward(self, i: int) -> None:
        if self.zero >= 2:
            self._reduce(self.units[i + 1])
            self.grads[i + 1].zero_()  # the shared workspace, for the next layer
        if self.zero >= 3:
            self._free(self.units[i + 1])

    # ------------------------------------------------------------------ reductions
    def _tp_sync(self, u: _Unit) -> None:
        if not self.tp_sync:
            return
        for (name, p), rep in zip(u.named, self.replicated[u.index]):
            if rep:
                with self.timer.span("tp_grad_all_reduce", u.index - 1 if u.index else None, "comm", stream="comm",
                                     nbytes=p.grad.numel() * p.grad.element_size()):
                    dist.all_reduce(p.grad, group=self.tp)

    def _reduce(self, u: _Unit) -> None:
        self._tp_sync(u)
        g = self.grads[u.index]
        if self.data is None:
            return
        layer = u.index - 1 if u.index else None
        with self.timer.span("grad_reduce_scatter" if self.zero >= 1 else "grad_all_reduce", layer, "comm",
                             stream="dp_comm", nbytes=g.numel() * g.element_size()):
            if self.zero >= 1:
                reduce_scatter_single(self.grad_shards[u.index], g, group=self.data)
            else:
                dist.all_reduce(g, group=self.data)

    def end_backward(self) -> None:
        """After the whole backward: reduce what is not reduced yet (unit 0; every unit below ZeRO 2)."""
        for u in self.units if self.zero < 2 else self.units[:1]:
            self._reduce(u)

    def step(self) -> None:
        self.optimizer.step()
        for u in self.units:
            if self.zero in (1, 2) and self.D > 1:
                with self.timer.span("param_all_gather", u.index - 1 if u.index else None, "comm", stream="dp_comm",
                                     nbytes=u.nbytes):
                    all_gather_single(u.flat, self.param_shards[u.index].detach().clone(), group=self.data)
        if self.zero >= 3:
            self._free(self.units[0])

    def zero_grads(self) -> None:
        for g in self.grads:
            g.zero_()
        for gs in self.grad_shards:
            gs.zero_()

    # ------------------------------------------------------------------ checks (tests)
    def full_grads(self) -> list[dict[str, torch.Tensor]]:
        """Each unit's summed gradients by parameter name, whole over the data group (a collective).
        Call after `end_backward` and before `step`."""
        out = []
        for u in self.units:
            if self.D > 1:
                flat = torch.empty(u.padded, dtype=u.flat.dtype, device=u.flat.device)
                all_gather_single(flat, self.grad_shards[u.index].contiguous(), group=self.data)
            else:
                flat = self.grads[u.index]
            d, off = {}, 0
            for name, p in u.named:
                d[name] = flat[off:off + p.numel()].view(p.shape).clone()
                off += p.numel()
            out.append(d)
        return out
