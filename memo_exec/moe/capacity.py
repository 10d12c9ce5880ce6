"""Token dropping at an expert capacity (``Layout.moe_balance`` ``capacity:F``), as Megatron-Core runs
``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity`` (`memo_sim.layout.moe_balance`: every expert
padded or dropped to exactly F x its even share, load factor F on every rank).

Megatron-Core (``apply_router_token_dropping`` in megatron/core/transformer/moe/moe_utils.py, ``get_capacity``
there) works on the router's output of one rank's own tokens: ``routing_probs`` [T, E] (the top-k weights at the
chosen experts, zero elsewhere), the capacity ``C = ceil(T * k / E * F)``; when C exceeds T every token goes to every
expert, else each expert keeps the C tokens with the largest probabilities (``drop_policy`` probs, its default:
``topk`` over the token dimension). With padding the kept set *is* the routing: each expert receives exactly C
tokens, the routed copies above the capacity dropped (their weight lost, the others not renormalised) and, where
fewer than C tokens chose the expert, tokens that did not choose it sent as padding with weight zero.

Here (`padded_copies`): the same selection per group of rows, ties to the lower row (Megatron's unsorted ``topk``
leaves them to the kernel), expert-major: copy i of expert e is row ``src[e*C + i]``. A group is one rank's rows of
one micro-batch, what each rank's router sees; a single process routes one group a call unless given the groups of
the ranks it stands for (`memo_exec.moe.block.MoEBlock.set_balance`). The block dispatches the copies as tokens of
one choice each (the dispatchers' ``k`` = 1) and sums each token's copies back (`sum_copies`: an ``index_add``
whose backward gathers by ``src`` and keeps nothing else; autograd's own ``index_add`` keeps its [N, h] source).
"""

from __future__ import annotations

import math

import torch


def capacity_factor(balance) -> float | None:
    """The capacity factor of a `memo_sim.layout.moe_balance.Balance` (None: every routed copy computed)."""
    return balance.capacity if balance is not None and balance.kind == "capacity" else None


def capacity(tokens: int, k: int, experts: int, factor: float) -> int:
    """Copies each expert receives from a group of ``tokens`` rows: Megatron-Core's ``get_capacity(tokens * k,
    experts, factor)``, every row where that exceeds the rows."""
    return min(tokens, math.ceil(tokens * k / experts * factor))


def copies_of(tokens: int, k: int, experts: int, factor: float | None) -> int:
    """The copies a group of ``tokens`` rows sends: ``tokens * k`` routed, or every expert's capacity under
    ``factor`` (None: no capacity)."""
    return tokens * k if factor is None else experts * capacity(tokens, k, experts, factor)


class _SumCopies(torch.autograd.Function):
    """``out[t] = sum of y[i] over the copies i with src[i] == t`` ([T, h]); backward ``dy = dout[src]``."""

    @staticmethod
    def forward(ctx, y, src, tokens):
        ctx.save_for_backward(src)
        return y.new_zeros(tokens, *y.shape[1:]).index_add_(0, src, y)

    @staticmethod
    def backward(ctx, g):
        (src,) = ctx.saved_tensors
        return g.index_select(0, src), None, None


def sum_copies(y: torch.Tensor, src: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each of ``tokens`` rows' copies summed (``y`` [N, h], copy i of row ``src[i]``), differentiable in ``y``."""
    return _SumCopies.apply(y, src, tokens)


def padded_copies(idx: torch.Tensor, weights: torch.Tensor, experts: int, factor: float,
                  groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(``src`` [N] int64, ``exp`` [N] int64): the copies each expert computes under capacity factor ``factor``
    (module docs) for the routing ``idx`` [T, k] and its weights [T, k] (ranked, not differentiated), per group of
    rows (``groups`` [T] the group of each row; None: one group), groups in ascending id, each expert-major."""
    T, k = idx.shape
    probs = torch.zeros(T, experts, dtype=weights.dtype, device=weights.device).scatter_(1, idx, weights.detach())
    rows = torch.arange(T, device=idx.device)
    src, exp = [], []
    for g in ([None] if groups is None else torch.unique(groups).tolist()):
        mine = rows if g is None else rows[groups == g]
        c = capacity(mine.numel(), k, experts, factor)
        top = torch.sort(probs[mine], dim=0, descending=True, stable=True).indices[:c]  # [c, E] rows of the group
        src.append(mine[top.t().reshape(-1)])
        exp.append(torch.arange(experts, device=idx.device).repeat_interleave(c))
    return torch.cat(src), torch.cat(exp)
