"""Differentiable collectives of the MoE block (autograd Functions over plain torch.distributed).

- `all_to_all`: ``all_to_all_single`` with per-rank split sizes; its backward is the all-to-all
  with the splits swapped. Blocking (``async_op=False``): the call returns once the data is there.
- `sp_gather` / `sp_reduce_scatter`: Megatron sequence parallelism's all-gather (entering a
  column-parallel region) and reduce-scatter (leaving a row-parallel one) in the interleaved token
  order of `memo_exec.distributed.context.local_token_index` (gathered row t*p + j is rank j's local
  row t), each the other's backward; the shared experts run between them under TP.

Every rank of a group calls these in the same order (forward: dispatch then combine; autograd's
backward: combine then dispatch), so the collectives pair up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from memo_exec.distributed.collectives import all_gather_single, reduce_scatter_single


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _a2a(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        return _a2a(g, in_splits, out_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Rows ``x[sum(in_splits[:r]) : ...]`` go to rank r; the result holds ``out_splits[r]`` rows from
    each rank r, in rank order."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


def exchange_counts(send: torch.Tensor, group) -> torch.Tensor:
    """Each rank's int64 ``send`` [ep, n] row r goes to rank r: returns [ep, n], row r from rank r."""
    out = torch.empty_like(send)
    dist.all_to_all_single(out, send.contiguous(), group=group)
    return out


def _gather(t: torch.Tensor, p: int, group) -> torch.Tensor:
    n, w = t.shape
    rank_major = t.new_empty(p * n, w)
    all_gather_single(rank_major, t.contiguous(), group=group)
    return rank_major.view(p, n, w).transpose(0, 1).reshape(n * p, w)


def _reduce_scatter(t: torch.Tensor, p: int, group) -> torch.Tensor:
    n = t.shape[0] // p
    w = t.shape[1]
    rank_major = t.reshape(n, p, w).transpose(0, 1).reshape(p * n, w).contiguous()
    out = t.new_empty(n, w)
    reduce_scatter_single(out, rank_major, group=group)
    return out


class _SPGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, p, group):
        ctx.p, ctx.group = p, group
        return _gather(t, p, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.p, ctx.group), None, None


class _SPReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, p, group):
        ctx.p, ctx.group = p, group
        return _reduce_scatter(t, p, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g.contiguous(), ctx.p, ctx.group), None, None


def sp_gather(t: torch.Tensor, p: int, group) -> torch.Tensor:
    return t if p == 1 else _SPGather.apply(t, p, group)


def sp_reduce_scatter(t: torch.Tensor, p: int, group) -> torch.Tensor:
    return t if p == 1 else _SPReduceScatter.apply(t, p, group)
