"""Autograd wrappers of METP's ring FFN and two-level MHA, for the tests only (the executor's
layer, `memo_exec.metp.flavour`, calls the plain forward / backward functions itself): they let a
test differentiate a METP layer with torch.autograd and compare it with a dense reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memo_exec.device import acc_dtype
from memo_exec.metp.blocks import HeadGroups
from memo_exec.metp.ffn import ffn_backward, ffn_forward
from memo_exec.metp.lane import RingOptions
from memo_exec.metp.ledger import Ledger
from memo_exec.metp.mha import mha_backward, mha_forward


@dataclass
class FFNRun:
    """What the autograd wrapper needs besides the tensors.

    ``mode``: ``ring`` (the paper: only A_i is kept, the backward recomputes every block),
    ``store`` (store-all: this rank's fc1 / act rows are kept), ``memo`` (rows ``[0, keep)`` of fc1 /
    act are kept, rows ``[keep, r)`` dropped after the forward and rebuilt by a ring before the
    backward, MEMO's token-wise recompute)."""

    opts: RingOptions
    swiglu: bool
    mode: str = "ring"
    keep: int = 0
    ledger: Ledger = field(default_factory=Ledger)


class MetpFFN(torch.autograd.Function):
    """O_i = sum_j f(A_i B_j) C_j with the ring's backward; b1 is None for SwiGLU."""

    @staticmethod
    def forward(ctx, a, w1, b1, w2, run: FFNRun):
        own = {"w1": w1.detach(), "w2": w2.detach()}
        if b1 is not None:
            own["b1"] = b1.detach()
        fc1 = act = None
        if run.mode in ("store", "memo"):
            n, f = a.shape[0], w2.shape[1] * run.opts.size
            fc1 = torch.empty(n, 2 * f if run.swiglu else f, dtype=a.dtype, device=a.device)
            act = torch.empty(n, f, dtype=a.dtype, device=a.device)
        out = ffn_forward(a.detach(), own, run.opts, run.swiglu, run.ledger, fc1, act)
        if run.mode == "memo":  # the dropped rows are gone: anything that reads them unrebuilt is wrong
            fc1[run.keep:].fill_(float("nan"))
            act[run.keep:].fill_(float("nan"))
        ctx.run, ctx.has_b1 = run, b1 is not None
        ctx.save_for_backward(a, w1, b1 if b1 is not None else torch.empty(0), w2)
        ctx.fc1, ctx.act = fc1, act
        return out

    @staticmethod
    def backward(ctx, d_out):
        run = ctx.run
        a, w1, b1, w2 = ctx.saved_tensors
        own = {"w1": w1, "w2": w2}
        if ctx.has_b1:
            own["b1"] = b1
        if run.mode == "memo":
            ffn_forward(a, own, run.opts, run.swiglu, run.ledger, ctx.fc1, ctx.act, start=run.keep,
                        with_out=False, phase="recompute")
        grads = {k: torch.zeros_like(v) for k, v in own.items()}
        d_a = ffn_backward(a, d_out.contiguous(), own, grads, run.opts, run.swiglu, run.ledger, ctx.fc1, ctx.act)
        ctx.fc1 = ctx.act = None
        return d_a, grads["w1"], grads.get("b1"), grads["w2"], None


@dataclass
class MHARun:
    opts: RingOptions
    groups: HeadGroups
    batch: int = 1
    order: str = "contiguous"  # the rank's token rows: `ring_attention.ORDERS`
    ledger: Ledger = field(default_factory=Ledger)


class MetpMHA(torch.autograd.Function):
    """O_i = sum_j A_ij W_proj_j (without ``bo``) with Algorithm 6's backward."""

    @staticmethod
    def forward(ctx, x, wqkv, bqkv, wo, run: MHARun):
        n, h = x.shape
        hg = run.groups
        attn = torch.empty(n, hg.heads * hg.head_dim, dtype=x.dtype, device=x.device)
        lse = torch.empty(run.batch, hg.heads, n // run.batch, dtype=acc_dtype(x.dtype), device=x.device)
        own = {"wqkv": wqkv.detach(), "bqkv": bqkv.detach(), "wo": wo.detach()}
        out = mha_forward(x.detach(), own, hg, run.batch, run.opts, attn, lse, run.ledger, run.order)
        ctx.run = run
        ctx.save_for_backward(x, wqkv, bqkv, wo, attn, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):
        run = ctx.run
        x, wqkv, bqkv, wo, attn, lse = ctx.saved_tensors
        own = {"wqkv": wqkv, "bqkv": bqkv, "wo": wo}
        grads = {k: torch.zeros_like(v) for k, v in own.items()}
        dx = mha_backward(x, d_out.contiguous(), attn, lse, own, grads, run.groups, run.batch, run.opts, run.ledger,
                          run.order)
        return dx, grads["wqkv"], grads["bqkv"], grads["wo"], None
