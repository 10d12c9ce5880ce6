"""The inner loop of METP's MHA (papers/metp.txt Algorithms 3 and 4): causal attention of this
rank's query block against every rank's K/V block, the K/V blocks travelling the ring.

Rank i holds ``[batch, s/p]`` token rows of every sequence, in one of two orders (``order``):
``contiguous``, the i-th block of every sequence, or ``interleaved``, positions i, i+p, i+2p, ...
(the order Megatron SP and the distributed executor use, `memo_exec.distributed.context`). At
inner step t the rank holds the K/V block of rank (i - t) mod p in one half of a double buffer
(the next block arrives in the other half while it computes, `lane`). Causality across blocks:
contiguous: an earlier rank's block is attended in full, the own block causally (the diagonal
block is square, so the kernel's causal mask is the global one), a later rank's block is all
in the future and skipped; interleaved: local row r is position r*p + i, so a block of a rank
src <= i is attended causally (keys c <= r) and one of a rank src > i strictly causally (c < r:
query rows 1.. against key rows ..n-1, causally), every step doing about the same work. The
per-block outputs and log-sum-exps merge online (the FlashAttention / ring-attention
recurrence), in the accumulation dtype.

Backward: the same ring; each block's dQ, dK, dV come from the kernel's backward given the
block's Q, K, V and the *final* output and log-sum-exp (P_ij = exp(S_ij - lse_i), D_i = rowsum(dA_i
A_i), exactly Algorithm 4's lines 6-12). dQ accumulates locally; dK, dV travel one step behind
their K/V block (`memo_exec.metp.ffn` does the same for dB, dC) and a last hop brings each
finished block home.

Every use of the double buffers is declared to the lane's guard (`memo_exec.metp.lane`) with
what it expects there (the K/V or partial dK/dV of which rank's block), so a skipped wait, a
half chosen wrongly or two halves aliased fails at once, naming the transfer. ``Lane.half`` is
the one place the halves are chosen (tests swap it per site).

The block kernel and the merge are `memo_exec.block_attention`'s (the ones ring CP and SPPO's
prefix attention use): PyTorch's fused SDPA kernels per block, forward and backward (CPU flash;
CUDA flash for 16-bit, memory-efficient for fp32), a query-chunked math block otherwise.
"""

from __future__ import annotations

import torch

from memo_exec.block_attention import block_backward, block_forward, merge_
from memo_exec.device import acc_dtype
from memo_exec.metp.lane import Lane, RingOptions
from memo_exec.metp.ledger import Ledger

ORDERS = ("contiguous", "interleaved")


def _kv(src: int, p: int, tag: str) -> str:
    return f"K/V{tag} of rank {src % p}"


def _dkv(src: int, p: int, tag: str) -> str:
    return f"partial dK/dV{tag} of rank {src % p}'s block"


def block_plan(src: int, rank: int, rows: int, order: str):
    """(query rows, key rows, causal) of the block of rank ``src``'s keys, or None when all masked."""
    if order == "contiguous":
        return None if src > rank else (slice(None), slice(None), src == rank)
    if src <= rank:
        return slice(None), slice(None), True
    return (slice(1, None), slice(0, rows - 1), True) if rows > 1 else None


def _bhsd(t: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """token-major ``[batch*n, heads*d]`` -> ``[batch, heads, n, d]`` view."""
    rows, w = t.shape
    return t.view(batch, rows // batch, heads, w // heads).transpose(1, 2)


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, q_heads: int,
                           k_heads: int, out: torch.Tensor, lse_out: torch.Tensor, opts: RingOptions, lane: Lane,
                           ledger: Ledger, tag: str, order: str = "contiguous") -> None:
    """q ``[rows, q_heads*d]``, k/v ``[rows, k_heads*d]`` token-major; writes ``out`` (same layout as q)
    and ``lse_out`` ``[batch, q_heads, rows/batch]``."""
    p, i = opts.size, opts.rank
    qb = _bhsd(q, batch, q_heads).contiguous()
    kb, vb = _bhsd(k, batch, k_heads), _bhsd(v, batch, k_heads)
    d = qb.shape[-1]
    scale = d ** -0.5
    shape = (2,) + tuple(kb.shape)
    nb = min(p, 2)
    bufs = ledger.halves(f"metp_kv_double_buffer{tag}", shape, k.dtype, k.device, "kv_buffer", nb)
    since = lane.mark()  # the outer loop's broadcast in flight is not this ring's
    lane.use(f"mha_attn{tag} own K/V", writes=[(bufs[0], _kv(i, p, tag))])
    bufs[0][0].copy_(kb)
    bufs[0][1].copy_(vb)
    ad = acc_dtype(q.dtype)
    acc = ledger.alloc(f"metp_attn_accumulator_fp32_{tag}", tuple(qb.shape), ad, q.device, "attn_acc", zero=True)
    lse = ledger.alloc(f"metp_attn_lse{tag}", tuple(qb.shape[:3]), ad, q.device, "attn_acc")
    lse.fill_(float("-inf"))
    for t in range(p):
        cur = bufs[Lane.half("forward K/V", t)]
        pend = lane.ring(f"p2p_kv{tag}.{t}", cur, bufs[Lane.half("forward K/V receive", t + 1)],
                         _kv(i - t - 1, p, tag)) if t < p - 1 else None
        plan = block_plan((i - t) % p, i, qb.shape[2], order)
        if plan is not None:
            qs, ks, causal = plan
            lane.use(f"mha_attn{tag}.{t}", reads=[(cur, _kv(i - t, p, tag))])
            with opts.timer.span(f"mha_attn{tag}.{t}", opts.layer, lane.phase, "compute"):
                o_b, lse_b = block_forward(qb[:, :, qs], cur[0][:, :, ks], cur[1][:, :, ks], causal, scale)
                merge_(acc[:, :, qs], lse[:, :, qs], o_b, lse_b)
                del o_b, lse_b
        lane.wait(pend)
    lane.drain()
    lane.finish(f"mha_attn{tag}", since)
    _bhsd(out, batch, q_heads).copy_(acc)
    lse_out.copy_(lse)
    ledger.free(f"metp_kv_double_buffer{tag}", f"metp_attn_accumulator_fp32_{tag}", f"metp_attn_lse{tag}")


def ring_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                            lse: torch.Tensor, batch: int, q_heads: int, k_heads: int, dq: torch.Tensor,
                            dk: torch.Tensor, dv: torch.Tensor, opts: RingOptions, lane: Lane, ledger: Ledger,
                            tag: str, order: str = "contiguous") -> None:
    """Writes dq, dk, dv (token-major, like q, k, v) of this rank's rows."""
    p, i = opts.size, opts.rank
    qb = _bhsd(q, batch, q_heads).contiguous()
    ob = _bhsd(o, batch, q_heads).contiguous()
    dob = _bhsd(do, batch, q_heads).contiguous()
    lse_c = lse.contiguous()
    kb, vb = _bhsd(k, batch, k_heads), _bhsd(v, batch, k_heads)
    scale = qb.shape[-1] ** -0.5
    shape = (2,) + tuple(kb.shape)
    nb = min(p, 2)
    bufs = ledger.halves(f"metp_kv_double_buffer{tag}", shape, k.dtype, k.device, "kv_buffer", nb)
    dbufs = ledger.halves(f"metp_dkv_in_flight{tag}", shape, k.dtype, k.device, "dkv_buffer", nb)
    since = lane.mark()
    lane.use(f"mha_attn_bwd{tag} own K/V", writes=[(bufs[0], _kv(i, p, tag)), (dbufs[0], _dkv(i, p, tag))])
    bufs[0][0].copy_(kb)
    bufs[0][1].copy_(vb)
    dbufs[0].zero_()
    dqb = ledger.alloc(f"metp_dq_accumulator_fp32_{tag}", tuple(qb.shape), acc_dtype(q.dtype), q.device, "attn_acc",
                       zero=True)
    for t in range(p):
        cur = bufs[Lane.half("backward K/V", t)]
        dcur = dbufs[Lane.half("dK/dV", t)]
        pend = lane.ring_many([(f"p2p_kv_dkv{tag}.{t}", cur, bufs[Lane.half("backward K/V receive", t + 1)],
                                _kv(i - t - 1, p, tag)) if t < p - 1 else None,
                               (f"p2p_dkv{tag}.{t - 1}", dbufs[Lane.half("dK/dV send", t - 1)], dcur,
                                _dkv(i - t, p, tag)) if t > 0 else None])
        pend_kv = pend.pop(0) if t < p - 1 else None
        pend_d = pend.pop(0) if t > 0 else None
        plan = block_plan((i - t) % p, i, qb.shape[2], order)
        grads = None
        if plan is not None:
            qs, ks, causal = plan
            lane.use(f"mha_attn_bwd{tag}.{t}", reads=[(cur, _kv(i - t, p, tag))])
            with opts.timer.span(f"mha_attn_bwd{tag}.{t}", opts.layer, lane.phase, "compute"):
                gq, gk, gv = block_backward(dob[:, :, qs], qb[:, :, qs], cur[0][:, :, ks], cur[1][:, :, ks],
                                            ob[:, :, qs], lse_c[:, :, qs], causal, scale)
                dqb[:, :, qs].add_(gq)
                grads = (gk, gv)
                del gq, gk, gv
        lane.wait(pend_d)  # the partial dK, dV of this block is in
        if grads is not None:
            mine = [(dcur, _dkv(i - t, p, tag))]
            lane.use(f"mha_attn_bwd{tag}.{t} dK/dV", reads=mine, writes=mine)
            dcur[0][:, :, ks].add_(grads[0])
            dcur[1][:, :, ks].add_(grads[1])
        del grads
        lane.wait(pend_kv)
    if p > 1:
        lane.wait(lane.ring(f"p2p_dkv{tag}_home", dbufs[Lane.half("dK/dV send", p - 1)],
                            dbufs[Lane.half("dK/dV home", p)], _dkv(i, p, tag)))
    lane.drain()
    lane.finish(f"mha_attn_bwd{tag}", since)
    fin = dbufs[Lane.half("dK/dV home", p)] if p > 1 else dbufs[0]
    lane.use(f"mha_attn_bwd{tag} own dK/dV", reads=[(fin, _dkv(i, p, tag))])
    _bhsd(dq, batch, q_heads).copy_(dqb)
    _bhsd(dk, batch, k_heads).copy_(fin[0])
    _bhsd(dv, batch, k_heads).copy_(fin[1])
    ledger.free(f"metp_kv_double_buffer{tag}", f"metp_dkv_in_flight{tag}", f"metp_dq_accumulator_fp32_{tag}")
