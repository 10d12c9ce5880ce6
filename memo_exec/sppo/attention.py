"""Causal attention of one subsequence's queries against the K/V of every token before it.

The queries are the tokens ``[start, start + n)`` of the sequence, the keys and values the tokens
``[0, start + n)`` (the K/V cache of the subsequences before it, then its own): query ``i`` sees
key ``j`` iff ``j <= start + i`` (the causal mask aligned to the chunk's offset, "lower right").
With ``start = 0`` this is ordinary causal attention.

The forward returns the log-sum-exp of every query row; the backward rebuilds the probabilities
from it (the FlashAttention recurrence), so nothing of size queries x keys is kept between them.
Both are two blocks of `memo_exec.block_attention` (the block kernel ring CP and METP use: a
fused SDPA kernel per block, or a query-chunked math block under ``budget``): the queries against
the earlier pieces' keys ``[0, start)`` (full) and against their own keys ``[start, start + n)``
(the square causal block), merged with the log-sum-exp; each block's backward is given the final
output and lse. Grouped-query attention: K/V carry ``kv_heads`` heads, each shared by
``heads / kv_heads`` query heads (dK/dV are summed over the group).

Why not the executor's backends (`memo_exec.attention`): they take queries and keys of one length
with the mask aligned at the top left; a subsequence needs the queries of its own rows against a
longer key range, which the split into a full and a causal block gives with any kernel.
"""

from __future__ import annotations

import torch

from memo_exec.block_attention import MATH_BUDGET_BYTES, block_backward, block_forward, merge_
from memo_exec.device import acc_dtype

SCORE_BUDGET_BYTES = MATH_BUDGET_BYTES  # the math kernel's query chunk (scores and probabilities)


def _keys(k: torch.Tensor, n: int, start: int) -> None:
    if k.shape[2] != start + n:
        raise ValueError(f"prefix attention: {k.shape[2]} keys for queries [{start}, {start + n})")


def prefix_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                             budget: int = SCORE_BUDGET_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[b, H, n, d]`` at sequence offset ``start``, ``k``/``v`` ``[b, Hk, start + n, d]``.
    Returns (out ``[b, H, n, d]`` in q's dtype, lse ``[b, H, n]`` in the accumulation dtype)."""
    _keys(k, q.shape[2], start)
    own_o, own_lse = block_forward(q, k[:, :, start:], v[:, :, start:], True, budget=budget)
    if start == 0:
        return own_o, own_lse
    o, lse = block_forward(q, k[:, :, :start], v[:, :, :start], False, budget=budget)
    acc = o.to(acc_dtype(q.dtype))
    merge_(acc, lse, own_o, own_lse)
    return acc.to(q.dtype), lse


def prefix_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              out: torch.Tensor, lse: torch.Tensor, start: int, budget: int = SCORE_BUDGET_BYTES
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `prefix_attention_forward`: (dq ``[b, H, n, d]``, dk, dv ``[b, Hk, start + n, d]``),
    dk/dv in the accumulation dtype (the caller adds them into accumulators)."""
    _keys(k, q.shape[2], start)
    acc = acc_dtype(q.dtype)
    dq, dk, dv = block_backward(dout, q, k[:, :, start:], v[:, :, start:], out, lse, True, budget=budget)
    if start == 0:
        return dq, dk.to(acc), dv.to(acc)
    dq_p, dk_p, dv_p = block_backward(dout, q, k[:, :, :start], v[:, :, :start], out, lse, False, budget=budget)
    dq = (dq.to(acc) + dq_p.to(acc)).to(q.dtype)
    return dq, torch.cat([dk_p, dk], dim=2).to(acc), torch.cat([dv_p, dv], dim=2).to(acc)
