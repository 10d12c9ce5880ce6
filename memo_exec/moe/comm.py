"""Differentiable collectives of the MoE block (autograd Functions over plain torch.distributed).

- `all_to_all`: ``all_to_all_single`` with per-rank split sizes; its backward is the all-to-all
  with the splits swapped. Blocking (``async_op=False``): the call returns once the data is there.
  Given an `A2ATag` (the rank's recorder, the simulator's op name, the layer, the forward's phase)
  each of the two is a span on stream ``ep_comm`` of the rank's Timeline, named as the simulator
  names it (`memo_sim.cost.moe.step_cost`: ``moe_dispatch_alltoall_ep`` / ``moe_combine_alltoall_ep``):
  the forward's in its phase (``fwd``, or ``recompute`` when the backward re-runs the block), the
  backward's transpose under the same name in phase ``bwd``, as the simulator prices a step's
  transpose. The span is the recorder's (`memo_exec.measure.Recorder.span`): on CPU the wall time
  around the blocking call (the wait for a later peer included), on CUDA a pair of timing events
  on the current stream, which NCCL's stream joins, as every other collective of the executor.
- `sp_gather` / `sp_reduce_scatter`: Megatron sequence parallelism's all-gather (entering a
  column-parallel region) and reduce-scatter (leaving a row-parallel one) in the interleaved token
  order of `memo_exec.distributed.context.local_token_index` (gathered row t*p + j is rank j's local
  row t), each the other's backward; the shared experts run between them under TP, their first GEMM
  as `sp_gather_linear` (the all-gather and the GEMM in one node that keeps the local rows and gathers
  them again in its backward, as Megatron-LM and the simulator do).

Every rank of a group calls these in the same order (forward: the rows' dispatch, the router weights'
all-to-all, then combine; autograd's backward: combine, the weights', then the rows': it runs the ready
node created last first, and `memo_exec.moe.block` creates the weights' all-to-all after the rows'
dispatch and before the expert GEMMs on every rank), so the collectives pair up.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from memo_exec.distributed.collectives import gather_interleaved, reduce_scatter_single

EP_STREAM = "ep_comm"  # the simulator's stream of the dispatcher's collectives (`memo_sim.timeline.STREAMS`)


@dataclass(frozen=True)
class A2ATag:
    """What names and times one all-to-all: the recorder (None: untimed), the simulator's op name,
    the model layer and the forward's phase (the backward's is ``bwd``)."""

    timer: object | None
    op: str
    layer: int | None
    phase: str = "fwd"

    def span(self, phase: str, nbytes: float):
        if self.timer is None:
            return contextlib.nullcontext()
        return self.timer.span(self.op, self.layer, phase, stream=EP_STREAM, nbytes=nbytes)


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group, tag: A2ATag | None = None,
         phase: str = "fwd") -> torch.Tensor:
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    x = x.contiguous()
    with (tag.span(phase, x.numel() * x.element_size()) if tag is not None else contextlib.nullcontext()):
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, tag):
        ctx.splits, ctx.group, ctx.tag = (out_splits, in_splits), group, tag
        return _a2a(x, out_splits, in_splits, group, tag, tag.phase if tag is not None else "fwd")

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        return _a2a(g, in_splits, out_splits, ctx.group, ctx.tag, "bwd"), None, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group,
               tag: A2ATag | None = None) -> torch.Tensor:
    """Rows ``x[sum(in_splits[:r]) : ...]`` go to rank r; the result holds ``out_splits[r]`` rows from
    each rank r, in rank order. ``tag``: time it (and its backward) as an ``ep_comm`` span."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group, tag)


def exchange_counts(send: torch.Tensor, group, tag: A2ATag | None = None) -> torch.Tensor:
    """Each rank's int64 ``send`` [ep, n] row r goes to rank r: returns [ep, n], row r from rank r.
    ``tag``: time it as an ``ep_comm`` span (in the tag's phase)."""
    out = torch.empty_like(send)
    send = send.contiguous()
    with (tag.span(tag.phase, send.numel() * send.element_size()) if tag is not None else contextlib.nullcontext()):
        dist.all_to_all_single(out, send, group=group)
    return out


def _gather(t: torch.Tensor, p: int, group) -> torch.Tensor:
    """Row t*p + r = rank r's row t, gathered inside its one output (`gather_interleaved`: no rank-major buffer
    beside it)."""
    n, w = t.shape
    out = t.new_empty(n * p, w)
    gather_interleaved(out, t.contiguous(), p, group)
    return out


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


class _GatherLinear(torch.autograd.Function):
    """``F.linear(gather(t), w)`` keeping only the rank's shard ``t``: the backward all-gathers it again
    for the weight's gradient, then reduce-scatters the input's (Megatron-LM's column-parallel linear under
    sequence parallelism; the simulator's ``allgather_shared_fc1_input``,
    `memo_sim.model.layer_graph.sp_regathered`)."""

    @staticmethod
    def forward(ctx, t, w, p, group):
        ctx.save_for_backward(t, w)
        ctx.p, ctx.group = p, group
        return F.linear(_gather(t, p, group), w)

    @staticmethod
    def backward(ctx, g):
        t, w = ctx.saved_tensors
        gathered = _gather(t, ctx.p, ctx.group)
        g = g.contiguous()
        dw = g.t() @ gathered if ctx.needs_input_grad[1] else None
        return _reduce_scatter(g @ w, ctx.p, ctx.group), dw, None, None


class _EPGather(torch.autograd.Function):
    """`_gather` over the expert-parallel group, timed as ``tag`` names it (the backward, its reduce-scatter,
    in phase ``bwd``)."""

    @staticmethod
    def forward(ctx, t, p, group, tag):
        ctx.p, ctx.group, ctx.tag = p, group, tag
        with tag.span(tag.phase, t.numel() * t.element_size() * p) if tag is not None else contextlib.nullcontext():
            return _gather(t, p, group)

    @staticmethod
    def backward(ctx, g):
        with ctx.tag.span("bwd", g.numel() * g.element_size()) if ctx.tag is not None else contextlib.nullcontext():
            return _reduce_scatter(g.contiguous(), ctx.p, ctx.group), None, None, None


class _EPReduceScatter(torch.autograd.Function):
    """`_reduce_scatter` over the expert-parallel group, timed as ``tag`` names it (the backward, its all-gather,
    in phase ``bwd``)."""

    @staticmethod
    def forward(ctx, t, p, group, tag):
        ctx.p, ctx.group, ctx.tag = p, group, tag
        with tag.span(tag.phase, t.numel() * t.element_size()) if tag is not None else contextlib.nullcontext():
            return _reduce_scatter(t, p, group)

    @staticmethod
    def backward(ctx, g):
        with ctx.tag.span("bwd", g.numel() * g.element_size() * ctx.p) if ctx.tag is not None else \
                contextlib.nullcontext():
            return _gather(g.contiguous(), ctx.p, ctx.group), None, None, None


def ep_gather(t: torch.Tensor, p: int, group, tag: A2ATag | None = None) -> torch.Tensor:
    """Every rank's rows [n, w] of the ``p``-rank group, gathered row t*p + r = rank r's row t (as `sp_gather`),
    differentiable (its backward reduce-scatters); an integer tensor is gathered without a graph."""
    if not t.is_floating_point():
        return _gather(t, p, group)
    return _EPGather.apply(t, p, group, tag)


def ep_reduce_scatter(t: torch.Tensor, p: int, group, tag: A2ATag | None = None) -> torch.Tensor:
    """The inverse of `ep_gather`: rows [n * p, w] summed over the group, rank r keeping rows t*p + r."""
    return _EPReduceScatter.apply(t, p, group, tag)


def sp_gather(t: torch.Tensor, p: int, group) -> torch.Tensor:
    return t if p == 1 else _SPGather.apply(t, p, group)


def sp_gather_linear(t: torch.Tensor, w: torch.Tensor, p: int, group) -> torch.Tensor:
    """``F.linear(sp_gather(t), w)`` (no bias) that keeps ``t``, not its gathered rows, for the backward
    (`_GatherLinear`)."""
    return F.linear(t, w) if p == 1 else _GatherLinear.apply(t, w, p, group)


def sp_reduce_scatter(t: torch.Tensor, p: int, group) -> torch.Tensor:
    return t if p == 1 else _SPReduceScatter.apply(t, p, group)
