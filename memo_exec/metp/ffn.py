"""The METP FFN ring (papers/metp.txt Algorithms 1 and 2), on one rank's row block.

O = f(A B) C, A = this rank's rows of ln2 ([r, h], the activations stay sequence-sharded),
B = W_in^T split by columns and C = W_out^T split by rows over the p ranks (`blocks`). Rank i
computes O_i = sum_j f(A_i B_j) C_j while the (B_j, C_j) blocks travel the ring: at step j it holds
block (i - j) mod p in one half of a double buffer, and the transfer that brings step j+1's block
into the other half is posted before step j computes and waited after it (`lane`).

Backward (Algorithm 2): the blocks travel the ring again; step j recomputes T_ij = A_i B_j and
D_ij = f(T_ij) (or reads them from the saved fc1 / act rows under store-all or after MEMO's
token-wise recompute), then dD = dO_i C_j^T, dT = f'(T) dD, dA_i += dT B_j^T; the partial
gradient of block j travels with it one step behind: step j posts the send of the partial it
finished at step j-1 and the receive of the partial the previous rank finished, waits for it
right before its own dB_j / dC_j GEMMs accumulate into it, and after the last step one more hop
returns each finished gradient block to its owner. Two weight buffers and two gradient buffers,
as the simulator plans (`memo_sim.memplan.ring_trace`: ``metp_ffn_w_double_buffer``,
``metp_ffn_dw_double_buffer``).

The activation is computed in place in the T_ij block (D_ij overwrites it; SwiGLU writes it into
the gate half), so the forward holds one [r, fc1/p] block per step: the paper's 4bsh/p^2.
``b2`` is not part of the ring (every rank adds it to its own rows).

Op names in the trace are the simulator's (`memo_sim.cost.metp.ffn_costs`): ``ffn_block<j>`` on
the compute stream, ``p2p_ffn_w<j>`` and ``p2p_ffn_dw<j>`` on ``tp_p2p`` (``p2p_ffn_dw_home`` is
the final hop the paper's count leaves out).

Every use of the double buffers is declared to the lane's transfer guard with the block it
expects there (``W block b``, ``partial dW of block b``) and every half is chosen by
``Lane.half`` (`memo_exec.metp.lane`), so a skipped wait or a wrong half fails at once, naming the
transfer or the block.
"""

from __future__ import annotations

import torch

from memo_exec.metp.blocks import ffn_cols, ffn_pack
from memo_exec.metp.lane import Lane, RingOptions
from memo_exec.metp.ledger import Ledger


def _w(blk: int, p: int) -> str:
    """What a weight buffer holds (for the lane's transfer guard)."""
    return f"W block {blk % p}"


def _dw(blk: int, p: int) -> str:
    return f"partial dW of block {blk % p}"


def _act_inplace(t: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """D = f(T) written over T; returns D (a view of T)."""
    if swiglu:
        fb = t.shape[1] // 2
        gate, up = t[:, :fb], t[:, fb:]
        torch.ops.aten.silu_(gate)
        return gate.mul_(up)
    return torch.ops.aten.gelu_(t, approximate="none")


def _act_into(t: torch.Tensor, out: torch.Tensor, swiglu: bool) -> None:
    if swiglu:
        fb = out.shape[1]
        torch.ops.aten.silu.out(t[:, :fb], out=out)
        out.mul_(t[:, fb:])
    else:
        torch.ops.aten.gelu.out(t, approximate="none", out=out)


def _fc1(a: torch.Tensor, w: dict[str, torch.Tensor], out: torch.Tensor) -> None:
    if "b1" in w:
        torch.addmm(w["b1"], a, w["w1"].t(), out=out)
    else:
        torch.mm(a, w["w1"].t(), out=out)


def ffn_forward(a: torch.Tensor, own: dict[str, torch.Tensor], opts: RingOptions, swiglu: bool,
                ledger: Ledger | None = None, fc1_out: torch.Tensor | None = None,
                act_out: torch.Tensor | None = None, start: int = 0, with_out: bool = True,
                phase: str = "fwd") -> torch.Tensor | None:
    """O_i for rows ``[start, r)`` of ``a`` (``with_out``), writing those rows of ``fc1_out`` / ``act_out``
    when given. ``own`` is this rank's blocks {w1, b1 (GeLU), w2}. ``with_out=False`` is MEMO's
    token-wise recompute of fc1 / act: only the W_in blocks travel."""
    ledger = ledger if ledger is not None else Ledger()
    p, i = opts.size, opts.rank
    h = a.shape[1]
    fc1b = own["w1"].shape[0]
    fb = fc1b // 2 if swiglu else fc1b
    f = fb * p
    rows = a[start:]
    n = rows.shape[0]
    pack = ffn_pack(h, f, p, swiglu, with_out)
    lane = Lane(opts, a.device, phase)
    dt, dev = own["w1"].dtype, a.device
    bufs = ledger.halves("metp_ffn_w_double_buffer", (pack.numel,), dt, dev, "w_buffer", min(p, 2))
    lane.use(f"ffn {phase} own W", writes=[(bufs[0], _w(i, p))])
    pack.fill(bufs[0], own)
    out = ledger.alloc("fc2", (n, h), a.dtype, dev, "out", zero=True) if with_out else None
    flops = 2 * n * h * fc1b + (2 * n * fb * h if with_out else 0)
    for j in range(p):
        cur = bufs[Lane.half("ffn W", j)]
        pend = lane.ring(f"p2p_ffn_w{j}", cur, bufs[Lane.half("ffn W receive", j + 1)], _w(i - j - 1, p)) \
            if j < p - 1 else None
        blk = (i - j) % p
        lane.use(f"ffn_block{j}", reads=[(cur, _w(blk, p))])
        w = pack.views(cur)
        with opts.timer.span(f"ffn_block{j}", opts.layer, phase, "compute", 0, flops):
            t = ledger.alloc(f"metp_fc1_block{j}", (n, fc1b), a.dtype, dev, "block")
            _fc1(rows, w, t)
            fc1_cols, act_col = ffn_cols(blk, p, f, swiglu)
            if fc1_out is not None:
                for k, c in enumerate(fc1_cols):
                    fc1_out[start:, c].copy_(t[:, k * fb:(k + 1) * fb])
            d = _act_inplace(t, swiglu)
            if act_out is not None:
                act_out[start:, act_col].copy_(d)
            if out is not None:
                out.addmm_(d, w["w2"].t())
            ledger.free(f"metp_fc1_block{j}")  # D_ij was computed over it
            del t, d
        lane.wait(pend)
    lane.drain()
    lane.finish(f"ffn {phase}")
    ledger.free("metp_ffn_w_double_buffer")
    if out is not None:
        ledger.free("fc2")  # handed to the caller
    return out


def ffn_backward(a: torch.Tensor, d_out: torch.Tensor, own: dict[str, torch.Tensor],
                 grads: dict[str, torch.Tensor], opts: RingOptions, swiglu: bool, ledger: Ledger | None = None,
                 fc1: torch.Tensor | None = None, act: torch.Tensor | None = None) -> torch.Tensor:
    """Returns dA_i; accumulates this rank's complete block gradients into ``grads`` {w1, b1, w2}.
    With ``fc1`` / ``act`` (this rank's saved rows, every column) the blocks are read, not recomputed."""
    ledger = ledger if ledger is not None else Ledger()
    p, i = opts.size, opts.rank
    n, h = a.shape
    fc1b = own["w1"].shape[0]
    fb = fc1b // 2 if swiglu else fc1b
    f = fb * p
    pack = ffn_pack(h, f, p, swiglu)
    lane = Lane(opts, a.device, "bwd")
    dt, dev = own["w1"].dtype, a.device
    nb = min(p, 2)
    bufs = ledger.halves("metp_ffn_w_double_buffer", (pack.numel,), dt, dev, "w_buffer", nb)
    dbufs = ledger.halves("metp_ffn_dw_double_buffer", (pack.numel,), dt, dev, "dw_buffer", nb)
    lane.use("ffn bwd own W", writes=[(bufs[0], _w(i, p)), (dbufs[0], _dw(i, p))])
    pack.fill(bufs[0], own)
    dbufs[0].zero_()
    d_a = ledger.alloc("d_ln2", (n, h), a.dtype, dev, "out", zero=True)
    saved = fc1 is not None and act is not None
    flops = 2 * n * h * fc1b * 2 + 2 * n * fb * h * 2 + (0 if saved else 2 * n * h * fc1b)
    ones = torch.ones(n, dtype=a.dtype, device=dev) if not swiglu else None
    for j in range(p):
        cur = bufs[Lane.half("ffn bwd W", j)]
        dcur = dbufs[Lane.half("ffn dW", j)]
        # the next weight block and, one step behind it, the partial gradient of the block the previous
        # rank held at step j-1 come in beside this step (one exchange: their order is fixed)
        pend = lane.ring_many([(f"p2p_ffn_w{j}", cur, bufs[Lane.half("ffn bwd W receive", j + 1)], _w(i - j - 1, p))
                               if j < p - 1 else None,
                               (f"p2p_ffn_dw{j - 1}", dbufs[Lane.half("ffn dW send", j - 1)], dcur, _dw(i - j, p))
                               if j > 0 else None])
        pend_w = pend.pop(0) if j < p - 1 else None
        pend_dw = pend.pop(0) if j > 0 else None
        blk = (i - j) % p
        lane.use(f"ffn_block{j}", reads=[(cur, _w(blk, p))])
        w = pack.views(cur)
        with opts.timer.span(f"ffn_block{j}", opts.layer, "bwd", "compute", 0, flops):
            fc1_cols, act_col = ffn_cols(blk, p, f, swiglu)
            names = []
            if saved:
                parts = [fc1[:, c] for c in fc1_cols]  # T_ij: the gate and up columns (SwiGLU) or one block
                d = act[:, act_col]
            else:
                t = ledger.alloc(f"metp_fc1_block{j}", (n, fc1b), a.dtype, dev, "block")
                d = ledger.alloc(f"metp_act_block{j}", (n, fb), a.dtype, dev, "block")
                names += [f"metp_fc1_block{j}", f"metp_act_block{j}"]
                _fc1(a, w, t)
                _act_into(t, d, swiglu)
                parts = [t[:, :fb], t[:, fb:]] if swiglu else [t]
            dd = ledger.alloc(f"metp_d_act_block{j}", (n, fb), a.dtype, dev, "block")
            torch.mm(d_out, w["w2"], out=dd)  # dD = dO C_j^T  (w2 block is [h, fb])
            dtb = ledger.alloc(f"metp_d_fc1_block{j}", (n, fc1b), a.dtype, dev, "block")
            names += [f"metp_d_act_block{j}", f"metp_d_fc1_block{j}"]
            if swiglu:
                gate, up = parts
                sg = ledger.alloc("metp_silu_gate", (n, fb), a.dtype, dev, "block")
                torch.ops.aten.silu.out(gate, out=sg)
                torch.mul(dd, sg, out=dtb[:, fb:])
                torch.mul(dd, up, out=sg)
                torch.ops.aten.silu_backward.grad_input(sg, gate, grad_input=dtb[:, :fb])
                ledger.free("metp_silu_gate")
                del sg
            else:
                torch.ops.aten.gelu_backward.grad_input(dd, parts[0], approximate="none", grad_input=dtb)
            d_a.addmm_(dtb, w["w1"])  # dA_i += dT B_j^T
            lane.wait(pend_dw)  # the partial is in: accumulate this rank's share into it
            lane.use(f"ffn_block{j} dW", reads=[(dcur, _dw(blk, p))], writes=[(dcur, _dw(blk, p))])
            g = pack.views(dcur)
            g["w1"].addmm_(dtb.t(), a)  # dB_j += A_i^T dT
            if "b1" in g:
                g["b1"].addmv_(dtb.t(), ones)
            g["w2"].addmm_(d_out.t(), d)  # dC_j += D^T dO
            ledger.free(*names)
            del parts, d, dd, dtb
            t = None
        lane.wait(pend_w)
    # the finished gradient of block (i + 1) mod p goes home; this rank's own comes in
    if p > 1:
        home = lane.ring("p2p_ffn_dw_home", dbufs[Lane.half("ffn dW send", p - 1)], dbufs[Lane.half("ffn dW home", p)],
                         _dw(i, p))
        lane.wait(home)
    lane.drain()
    lane.finish("ffn bwd")
    fin = dbufs[Lane.half("ffn dW home", p)] if p > 1 else dbufs[0]
    lane.use("ffn bwd own dW", reads=[(fin, _dw(i, p))])
    g = pack.views(fin)
    for k, v in grads.items():
        v.add_(g[k])
    ledger.free("metp_ffn_w_double_buffer", "metp_ffn_dw_double_buffer")
    ledger.free("d_ln2")  # handed to the caller
    return d_a
