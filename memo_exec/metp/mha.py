"""The two-level METP MHA (papers/metp.txt Algorithms 5 and 6) on one rank's token rows.

Outer loop over the p head groups: step j's weight block (group j's rows of W_qkv / b_qkv and
columns of W_proj, `blocks.mha_pack`) is broadcast from its owner, rank j, into one half of a
double buffer while step j-1 computes (step 0's is issued first); the step computes
Q_ij, K_ij, V_ij = X_i W_qkv_j, runs the inner K/V ring (`ring_attention`, Algorithms 3 / 4) for
group j's heads and accumulates O_i += A_ij W_proj_j. The attention output rows (all groups) and
their log-sum-exp are written into the caller's ``attn`` / ``lse`` (the layer's saved tensors).

Backward (Algorithm 6): the weight blocks are broadcast again; step j computes dW_proj_j =
A_ij^T dO_i, recomputes Q/K/V, dA_ij = dO_i W_proj_j^T, the inner backward ring, dX_i +=
[dQ dK dV] W_qkv_j and dW_qkv_j = [dQ dK dV]^T X_i, and reduces the gradient block to rank j
beside the next step (double-buffered; the owner adds the reduced block to its gradients when
the reduce has completed). ``bo`` is not part of the loop (every rank adds it to its own rows).

Op names in the trace are the simulator's (`memo_sim.cost.metp.mha_costs`, per inner step where
the simulator aggregates): ``bcast_w<j>``, ``mha_qkv<j>``, ``mha_attn<j>.<t>``, ``p2p_kv<j>.<t>``,
``mha_proj<j>``; backward ``mha_bwd_proj<j>``, ``mha_attn_bwd<j>.<t>``, ``p2p_kv_dkv<j>.<t>``,
``p2p_dkv<j>.<t>``, ``mha_bwd_qkv<j>``, ``reduce_dw<j>``.

Every broadcast and reduce is posted to the lane's transfer guard (an in-place collective owns its
buffer on every rank until its wait) and every read or write of the weight and gradient buffers is
declared with the head group it expects, each half chosen by ``Lane.half`` (`memo_exec.metp.lane`):
a skipped wait or a wrong half fails at once on every rank, naming the transfer or the block.
"""

from __future__ import annotations

import torch

from memo_exec.metp.blocks import HeadGroups, mha_pack
from memo_exec.metp.lane import Lane, RingOptions
from memo_exec.metp.ledger import Ledger
from memo_exec.metp.ring_attention import ring_attention_backward, ring_attention_forward


def _split(t: torch.Tensor, hg: HeadGroups):
    return t[:, :hg.qw], t[:, hg.qw:hg.qw + hg.kw], t[:, hg.qw + hg.kw:]


def _w(j: int) -> str:
    """What a weight buffer holds (for the lane's transfer guard)."""
    return f"W_qkv/W_proj of head group {j}"


def _dw(j: int) -> str:
    return f"this rank's dW of head group {j}"


def _bcast(lane: Lane, bufs, pack, own, j: int, rank: int, phase: str):
    buf = bufs[Lane.half(f"mha {phase} W broadcast", j)]
    if rank == j:
        lane.use(f"fill bcast_w{j}", writes=[(buf, _w(j))])
        pack.fill(buf, own)
    return lane.broadcast(f"bcast_w{j}", buf, j, _w(j))


def mha_forward(x: torch.Tensor, own: dict[str, torch.Tensor], hg: HeadGroups, batch: int, opts: RingOptions,
                attn: torch.Tensor, lse: torch.Tensor, ledger: Ledger | None = None,
                order: str = "contiguous") -> torch.Tensor:
    """O_i (without ``bo``) for this rank's rows ``x`` ``[rows, h]``; fills ``attn`` ``[rows, h]`` and
    ``lse`` ``[batch, heads, rows/batch]``."""
    ledger = ledger if ledger is not None else Ledger()
    p, i = opts.size, opts.rank
    n, h = x.shape
    pack = mha_pack(h, hg)
    lane = Lane(opts, x.device, "fwd")
    dt, dev = own["wqkv"].dtype, x.device
    bufs = ledger.halves("metp_mha_w_double_buffer", (pack.numel,), dt, dev, "w_buffer", min(p, 2))
    out = ledger.alloc("proj", (n, h), x.dtype, dev, "out", zero=True)
    pend = _bcast(lane, bufs, pack, own, 0, i, "fwd")
    for j in range(p):
        nxt = _bcast(lane, bufs, pack, own, j + 1, i, "fwd") if j < p - 1 else None
        lane.wait(pend)
        cur = bufs[Lane.half("mha fwd W", j)]
        lane.use(f"mha_qkv{j}", reads=[(cur, _w(j))])
        w = pack.views(cur)
        qkv = ledger.alloc(f"metp_qkv_block{j}", (n, hg.width), x.dtype, dev, "block")
        with opts.timer.span(f"mha_qkv{j}", opts.layer, "fwd", "compute", 0, 2 * n * h * hg.width):
            torch.addmm(w["bqkv"], x, w["wqkv"].t(), out=qkv)
        q, k, v = _split(qkv, hg)
        cols = hg.attn_cols(j)
        heads = slice(j * hg.q_heads, (j + 1) * hg.q_heads)
        ring_attention_forward(q, k, v, batch, hg.q_heads, hg.k_heads, attn[:, cols], lse[:, heads], opts, lane,
                               ledger, str(j), order)
        ledger.free(f"metp_qkv_block{j}")
        del qkv, q, k, v
        with opts.timer.span(f"mha_proj{j}", opts.layer, "fwd", "compute", 0, 2 * n * hg.qw * h):
            out.addmm_(attn[:, cols], w["wo"].t())
        pend = nxt
    lane.drain()
    lane.finish("mha fwd")
    ledger.free("metp_mha_w_double_buffer", "proj")
    return out


def mha_backward(x: torch.Tensor, d_out: torch.Tensor, attn: torch.Tensor, lse: torch.Tensor,
                 own: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], hg: HeadGroups, batch: int,
                 opts: RingOptions, ledger: Ledger | None = None, order: str = "contiguous") -> torch.Tensor:
    """dX_i; accumulates this rank's reduced block gradients into ``grads`` {wqkv, bqkv, wo}."""
    ledger = ledger if ledger is not None else Ledger()
    p, i = opts.size, opts.rank
    n, h = x.shape
    pack = mha_pack(h, hg)
    lane = Lane(opts, x.device, "bwd")
    dt, dev = own["wqkv"].dtype, x.device
    nb = min(p, 2)
    bufs = ledger.halves("metp_mha_w_double_buffer", (pack.numel,), dt, dev, "w_buffer", nb)
    dbufs = ledger.halves("metp_mha_dw_reduce_buffers", (pack.numel,), dt, dev, "dw_buffer", nb)
    dx = ledger.alloc("d_ln1", (n, h), x.dtype, dev, "out", zero=True)
    reduces: list = [None] * p

    def collect(j: int) -> None:  # reduce j has completed: the owner keeps its block's gradient
        lane.wait(reduces[j])
        if j == i:
            done = dbufs[Lane.half("mha dW collect", j)]
            lane.use(f"collect reduce_dw{j}", reads=[(done, f"reduced {_dw(j)}")])
            g = pack.views(done)
            for k_, v_ in grads.items():
                v_.add_(g[k_])

    pend = _bcast(lane, bufs, pack, own, 0, i, "bwd")
    for j in range(p):
        nxt = _bcast(lane, bufs, pack, own, j + 1, i, "bwd") if j < p - 1 else None
        lane.wait(pend)
        if j >= 2:
            collect(j - 2)  # its buffer is reused now
        if p > 1 and j >= 2:
            lane.drain()  # (test hook) a deferred reduce must finish before its buffer is reused
        cur, dcur = bufs[Lane.half("mha bwd W", j)], dbufs[Lane.half("mha dW", j)]
        lane.use(f"mha_bwd_proj{j}", reads=[(cur, _w(j))], writes=[(dcur, _dw(j))])
        w = pack.views(cur)
        g = pack.views(dcur)
        cols = hg.attn_cols(j)
        heads = slice(j * hg.q_heads, (j + 1) * hg.q_heads)
        a_j = attn[:, cols]
        qkv = ledger.alloc(f"metp_qkv_block{j}", (n, hg.width), x.dtype, dev, "block")
        da = ledger.alloc(f"metp_d_attn_block{j}", (n, hg.qw), x.dtype, dev, "block")
        with opts.timer.span(f"mha_bwd_proj{j}", opts.layer, "bwd", "compute"):
            torch.mm(d_out.t(), a_j, out=g["wo"])  # dW_proj_j = A_ij^T dO_i
            torch.addmm(w["bqkv"], x, w["wqkv"].t(), out=qkv)  # recompute Q, K, V
            torch.mm(d_out, w["wo"], out=da)  # dA_ij = dO_i W_proj_j^T
        dqkv = ledger.alloc(f"metp_d_qkv_block{j}", (n, hg.width), x.dtype, dev, "block")
        q, k, v = _split(qkv, hg)
        dq, dk, dv = _split(dqkv, hg)
        ring_attention_backward(q, k, v, a_j, da, lse[:, heads], batch, hg.q_heads, hg.k_heads, dq, dk, dv, opts,
                                lane, ledger, str(j), order)
        with opts.timer.span(f"mha_bwd_qkv{j}", opts.layer, "bwd", "compute"):
            dx.addmm_(dqkv, w["wqkv"])
            torch.mm(dqkv.t(), x, out=g["wqkv"])
            torch.sum(dqkv, 0, out=g["bqkv"])
        ledger.free(f"metp_qkv_block{j}", f"metp_d_attn_block{j}", f"metp_d_qkv_block{j}")
        del qkv, da, dqkv, q, k, v, dq, dk, dv
        reduces[j] = lane.reduce(f"reduce_dw{j}", dbufs[Lane.half("mha dW reduce", j)], j, _dw(j), f"reduced {_dw(j)}")
        pend = nxt
    for j in range(max(0, p - 2), p):
        collect(j)
    lane.drain()
    lane.finish("mha bwd")
    ledger.free("metp_mha_w_double_buffer", "metp_mha_dw_reduce_buffers", "d_ln1")
    return dx


def _wproj(src: int, p: int) -> str:
    return f"W_proj block {src % p}"


def proj_recompute(attn_rows: torch.Tensor, own_wo: torch.Tensor, hg: HeadGroups, opts: RingOptions,
                   ledger: Ledger | None = None) -> torch.Tensor:
    """MEMO's token-wise recompute under ``metp``: sum_j A_ij W_proj_j for the given rows of the
    saved attention output (without ``bo``), the W_proj blocks travelling the ring beside the p
    block GEMMs (`memo_sim.cost.metp.proj_recompute_costs`: ``p2p_wproj``, ``mha_proj_recompute``)."""
    ledger = ledger if ledger is not None else Ledger()
    p, i = opts.size, opts.rank
    n, h = attn_rows.shape[0], own_wo.shape[0]
    lane = Lane(opts, attn_rows.device, "recompute")
    bufs = ledger.halves("metp_wproj_double_buffer", tuple(own_wo.shape), own_wo.dtype, own_wo.device, "w_buffer",
                         min(p, 2))
    lane.use("own W_proj", writes=[(bufs[0], _wproj(i, p))])
    bufs[0].copy_(own_wo)
    out = ledger.alloc("metp_proj_rows", (n, h), attn_rows.dtype, attn_rows.device, "out", zero=True)
    for t in range(p):
        cur = bufs[Lane.half("wproj", t)]
        pend = lane.ring(f"p2p_wproj{t}", cur, bufs[Lane.half("wproj receive", t + 1)], _wproj(i - t - 1, p)) \
            if t < p - 1 else None
        src = (i - t) % p
        lane.use(f"mha_proj_recompute{t}", reads=[(cur, _wproj(src, p))])
        with opts.timer.span(f"mha_proj_recompute{t}", opts.layer, "recompute", "compute", 0, 2 * n * hg.qw * h):
            out.addmm_(attn_rows[:, hg.attn_cols(src)], cur.t())
        lane.wait(pend)
    lane.drain()
    lane.finish("mha proj recompute")
    ledger.free("metp_wproj_double_buffer", "metp_proj_rows")
    return out
