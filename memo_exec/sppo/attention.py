"""Causal attention of one subsequence's queries against the K/V of every token before it.

The queries are the tokens ``[start, start + n)`` of the sequence, the keys and values the tokens
``[0, start + n)`` (the K/V cache of the subsequences before it, then its own): query ``i`` sees
key ``j`` iff ``j <= start + i`` (the causal mask aligned to the chunk's offset, "lower right").
With ``start = 0`` this is ordinary causal attention.

The forward returns the log-sum-exp of every query row; the backward rebuilds the probabilities
from it (the FlashAttention recurrence), so nothing of size queries x keys is kept between them.
Both run query-chunked so the score block stays under a budget, in plain PyTorch (the same code
on CPU and CUDA), with the softmax statistics in the accumulation dtype (fp32 for 16-bit models).
Grouped-query attention: K/V carry ``kv_heads`` heads, each shared by ``heads / kv_heads`` query
heads (dK/dV are summed over the group).

Why not the executor's backends (`memo_exec.attention`): they take queries and keys of one length
with the mask aligned at the top left; a subsequence needs the queries of its own rows against a
longer key range. torch's SDPA ``is_causal`` has the same top-left alignment for L != S and does
not return the lse on every device.
"""

from __future__ import annotations

import math

import torch

from memo_exec.attention import expand_kv_heads, reduce_kv_heads
from memo_exec.device import acc_dtype

SCORE_BUDGET_BYTES = 64 * 2**20  # one query chunk's scores and probabilities


def _chunk_rows(batch: int, heads: int, keys: int, acc: torch.dtype, budget: int) -> int:
    per_row = 2 * batch * heads * keys * torch.empty((), dtype=acc, device="meta").element_size()
    return max(1, budget // max(1, per_row))


def _mask(start: int, r0: int, r1: int, keys: int, device) -> torch.Tensor:
    """True where key j lies after query (start + i): the masked scores of query rows [r0, r1)."""
    qpos = torch.arange(start + r0, start + r1, device=device).unsqueeze(1)
    kpos = torch.arange(keys, device=device).unsqueeze(0)
    return kpos > qpos


def prefix_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                             budget: int = SCORE_BUDGET_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[b, H, n, d]`` at sequence offset ``start``, ``k``/``v`` ``[b, Hk, start + n, d]``.
    Returns (out ``[b, H, n, d]`` in q's dtype, lse ``[b, H, n]`` in the accumulation dtype)."""
    b, H, n, d = q.shape
    S = k.shape[2]
    if S != start + n:
        raise ValueError(f"prefix attention: {S} keys for queries [{start}, {start + n})")
    acc = acc_dtype(q.dtype)
    group = H // k.shape[1]
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty(b, H, n, dtype=acc, device=q.device)
    rows = _chunk_rows(b, H, S, acc, budget)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        kk = expand_kv_heads(k[:, :, :start + r1], group).to(acc)  # keys after the chunk's last query are all masked
        vv = expand_kv_heads(v[:, :, :start + r1], group).to(acc)
        s = torch.matmul(q[:, :, r0:r1].to(acc), kk.transpose(-1, -2)).mul_(scale)
        s.masked_fill_(_mask(start, r0, r1, start + r1, q.device), float("-inf"))
        m = torch.logsumexp(s, dim=-1)
        lse[:, :, r0:r1] = m
        p = s.sub_(m.unsqueeze(-1)).exp_()
        out[:, :, r0:r1] = torch.matmul(p, vv).to(q.dtype)
    return out, lse


def prefix_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              out: torch.Tensor, lse: torch.Tensor, start: int, budget: int = SCORE_BUDGET_BYTES
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `prefix_attention_forward`: (dq ``[b, H, n, d]``, dk, dv ``[b, Hk, start + n, d]``),
    dk/dv in the accumulation dtype (the caller adds them into accumulators)."""
    b, H, n, d = q.shape
    S = k.shape[2]
    acc = acc_dtype(q.dtype)
    group = H // k.shape[1]
    scale = 1.0 / math.sqrt(d)
    dq = torch.empty_like(q)
    dk = torch.zeros(b, H, S, d, dtype=acc, device=q.device)
    dv = torch.zeros(b, H, S, d, dtype=acc, device=q.device)
    rows = _chunk_rows(b, H, S, acc, budget)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        e = start + r1
        kk = expand_kv_heads(k[:, :, :e], group).to(acc)
        vv = expand_kv_heads(v[:, :, :e], group).to(acc)
        qc = q[:, :, r0:r1].to(acc)
        do = dout[:, :, r0:r1].to(acc)
        s = torch.matmul(qc, kk.transpose(-1, -2)).mul_(scale)
        s.masked_fill_(_mask(start, r0, r1, e, q.device), float("-inf"))
        p = s.sub_(lse[:, :, r0:r1].unsqueeze(-1)).exp_()
        dv[:, :, :e] += torch.matmul(p.transpose(-1, -2), do)
        dp = torch.matmul(do, vv.transpose(-1, -2))
        delta = (do * out[:, :, r0:r1].to(acc)).sum(-1, keepdim=True)
        ds = p.mul_(dp.sub_(delta)).mul_(scale)
        dq[:, :, r0:r1] = torch.matmul(ds, kk).to(q.dtype)
        dk[:, :, :e] += torch.matmul(ds.transpose(-1, -2), qc)
    return dq, reduce_kv_heads(dk, group), reduce_kv_heads(dv, group)
