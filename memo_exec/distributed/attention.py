"""Sequence-parallel attention: ring context parallelism and Ulysses, as attention backends.

Both wrap the layer's attention core (`memo_exec.attention.AttentionBackend`: forward writes the
output into the layer's tensor and returns what its backward needs), so the layer and the
activation policy are unchanged: q, k, v and attn stay sequence-sharded in the layer's storage.

`RingAttention` (ring CP over the ``cp`` group): each rank holds the zig-zag chunks c and
2cp-1-c of every sequence (`memo_exec.distributed.context.zigzag_positions`). K/V blocks travel
the ring with `memo_exec.distributed.p2p.ring_shift` (the next block's transfer is posted before
the current block is computed and waited on before it is read); each (query chunk, key chunk)
pair is skipped (key chunk later), causal (same chunk) or full, and partial results are merged
with the log-sum-exp (`memo_exec.block_attention`: one fused SDPA kernel call per pair, flash /
memory-efficient on CUDA, the CPU flash kernel on CPU, so no pair's score matrix is built; the
output and lse accumulate in the accumulation dtype, `memo_exec.device.acc_dtype`). Backward: K/V
travel the ring again with their dK/dV accumulators (kv heads), which arrive back at their owner
after cp shifts; the accumulators travel and accumulate in the plan's ``Layout.ring_dkv_fp32`` dtype
(``dkv_fp32``): the accumulation dtype (True, the ``any`` framework's), or the model's dtype (False: as
TransformerEngine's p2p CP, Megatron-LM's, does: transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py ``AttnFuncWithCPAndKVP2P.backward``, its ``p2p_comm_buffers`` of ``kv.dtype``, as quoted, with
the version checked, in `memo_sim.cost.ring_attention`'s docs; a review: fp32 always, 1.67x the priced bytes in
bf16), as `memo_sim.cost.ring_attention.ring_shift_bytes` prices them; each pair's gradients come from the
kernel's backward given the final output and lse; a block's accumulator is waited on only after this rank has computed
its part of that block's dK/dV (into a separate buffer), so its shift overlaps the block's
compute. On CUDA the NCCL P2P runs on NCCL's own stream, so the transfer of block j+1 overlaps
the attention of block j.

`UlyssesAttention` (DeepSpeed-Ulysses over the ``ulysses`` group): ``all_to_all_single`` turns
sequence-sharded q, k, v (all local heads) into head-sharded ones (1/u of the heads, the whole CP
shard), runs the inner backend (the plan's kernel, or `RingAttention` with CP) and sends the
output back. The backward follows the plan's ``Layout.ulysses_bwd_resend`` (``resend``): True (the ``any``
framework's) re-does the forward all-to-alls from the saved q, k, v, attn rather than keeping head-sharded
copies (8 all-to-alls: q, k, v, out, dout in, dq, dk, dv back); False keeps the head-sharded q, k, v and out of the
forward in the backend's ``aux`` (``ulysses_heads``) and sends dout alone before the inner backward, then dq, dk,
dv back (4 all-to-alls), as an autograd Ulysses does (DeepSpeed's ``_SeqAllToAll``, whose backward all-to-alls
the incoming gradient only; TransformerEngine's ``AttnFuncWithCPAndQKVOA2A.backward``: dout, then dq, dk, dv; as
`memo_sim.cost.layer_time._ulysses_backward_resend` cites them, not re-checked here). Those copies live as long as
the aux does (to the layer's backward, or under a policy that rebuilds the attention from its recompute),
beside the policy's sequence-sharded q, k, v and attn: one more set of the four per layer than DeepSpeed holds
(its attention saves the head-sharded ones alone), counted by the distributed runner's estimate
(`memo_exec.distributed.runner.DistExecutor._estimate`, ``skeletal_resident``).
Where tp x u exceeds the model's K/V heads (a GQA model, r =
tp·u / n_kv, `memo_sim.layout.kv_heads`), each of the rank's K/V heads is repeated r times on the
head dimension before the all-to-all (`repeat_kv_heads`: head i becomes heads i·r .. i·r + r - 1,
so query head j still meets K/V head j // (heads / n_kv)), as XTuner's and DeepSpeed's Ulysses do,
and every rank receives one repeated head; the backward sums the r gradients of each head
(`sum_kv_repeats`) after the all-to-all back. The saved k and v stay un-repeated.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from memo_exec.attention import AttentionBackend, AttnDims
from memo_exec.block_attention import block_backward, block_forward, merge_
from memo_exec.device import acc_dtype
from memo_exec.distributed.p2p import ring_shift
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.wait_switch import wait_primitive


def _bhsd(t: torch.Tensor, b: int, s: int, heads: int, d: int) -> torch.Tensor:
    return t.view(b, s, heads, d).permute(0, 2, 1, 3)


class RingAttention(AttentionBackend):
    name = "ring_cp"
    uses_scratch = False

    def __init__(self, group, cp: int, rank: int, delay_s: float = 0.0, dkv_fp32: bool = True) -> None:
        self.group, self.cp, self.rank, self.delay_s = group, cp, rank, delay_s
        self.dkv_fp32 = dkv_fp32  # dK/dV accumulators in the accumulation dtype, else the model's (module docs)
        self.timer = None  # set by the runner: each ring transfer's wait is a span on "cp_comm"
        self.guard = transfer_guard()  # every ring buffer's transfers and uses (module docs; None: off)

    @staticmethod
    def _swap(site: str, a, b):
        """The double buffer ``(a, b)`` after a step at ``site``: the received one becomes current."""
        return b, a

    def _shift(self, send, recv, name: str, received: str):
        return ring_shift(send, recv, self.group, self.delay_s, self.guard, name, received)

    def _use(self, what: str, reads=(), writes=()) -> None:
        """The attention reads / writes these (tensor, content) buffers now."""
        if self.guard is None:
            return
        self.guard.access(what, [Region.of(t, f"a ring buffer ({c})", c) for t, c in reads],
                          [Region.of(t, f"a ring buffer ({c})", c) for t, c in writes])

    def _finish(self, what: str) -> None:
        if self.guard is not None:
            self.guard.finish(what)

    def _kv(self, src: int) -> str:
        return f"K/V of block {src % self.cp}"

    def _dkv(self, src: int) -> str:
        return f"dK/dV accumulator of block {src % self.cp}"

    @wait_primitive
    def _wait(self, tr, what: str, t: torch.Tensor) -> None:
        if self.timer is None:
            tr.wait()
            return
        with self.timer.span(what, None, "comm", stream="cp_comm", nbytes=t.numel() * t.element_size()):
            tr.wait()

    def _chunks(self, owner: int) -> tuple[int, int]:
        return owner, 2 * self.cp - 1 - owner

    def _pairs(self, src: int, k: int):
        """(query slice, key slice, causal) of the chunk pairs that are not fully masked."""
        out = []
        for a, qi in enumerate(self._chunks(self.rank)):
            for bb, ki in enumerate(self._chunks(src)):
                if ki <= qi:
                    out.append((slice(a * k, (a + 1) * k), slice(bb * k, (bb + 1) * k), ki == qi))
        return out

    @staticmethod
    def _unpack(kv, dims: AttnDims):
        """The K/V block travelling the ring (``[T, 2*Hk*d]``) as ``[b, Hk, s, d]`` views."""
        b, s, hk, d = dims.batch, dims.seq, dims.kv_heads, dims.head_dim
        kw = hk * d
        return _bhsd(kv[:, :kw], b, s, hk, d), _bhsd(kv[:, kw:], b, s, hk, d)

    def forward(self, q, k, v, out, dims: AttnDims, scratch):
        acc = acc_dtype(q.dtype)
        b, s, H, d = dims.batch, dims.seq, dims.heads, dims.head_dim
        k_chunk = s // 2
        scale = 1.0 / math.sqrt(d)
        qb = _bhsd(q, b, s, H, d)
        o = torch.zeros(b, H, s, d, dtype=acc, device=q.device)
        lse = torch.full((b, H, s), float("-inf"), dtype=acc, device=q.device)
        cur = torch.cat([k, v], dim=1)
        nxt = torch.empty_like(cur)
        self._use("forward: own K/V", writes=[(cur, self._kv(self.rank))])
        for j in range(self.cp):
            src = (self.rank - j) % self.cp
            tr = self._shift(cur, nxt, f"cp_kv_ring forward step {j}", self._kv(src - 1)) if j < self.cp - 1 else None
            self._use(f"forward block {j}", reads=[(cur, self._kv(src))])
            kb, vb = self._unpack(cur, dims)
            for qs, ks, causal in self._pairs(src, k_chunk):
                ob, lb = block_forward(qb[:, :, qs], kb[:, :, ks], vb[:, :, ks], causal, scale)
                merge_(o[:, :, qs], lse[:, :, qs], ob, lb)
                del ob, lb
            if tr is not None:
                self._wait(tr, "cp_kv_ring", cur)
                cur, nxt = self._swap("forward K/V", cur, nxt)
        self._finish("ring CP forward")
        out.view(b, s, H, d).copy_(o.permute(0, 2, 1, 3))
        return {"lse": lse}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims: AttnDims, scratch):
        acc = acc_dtype(q.dtype)
        b, s, H, hk, d = dims.batch, dims.seq, dims.heads, dims.kv_heads, dims.head_dim
        k_chunk = s // 2
        scale = 1.0 / math.sqrt(d)
        lse = aux["lse"]
        qb, dob, ob = (_bhsd(t, b, s, H, d) for t in (q, dout, out))
        dqb = torch.zeros(b, H, s, d, dtype=acc, device=q.device)
        cur = torch.cat([k, v], dim=1)
        nxt = torch.empty_like(cur)
        # dK/dV of the block held (its kv heads): this rank's part of block j is computed into
        # ``part`` while the accumulator of that block (the sum of the ranks before) is still
        # travelling; it is waited on only when ``part`` is ready to be added to it, then sent on.
        # After cp shifts every accumulator is home. ``acc_a`` / ``acc_b``: the accumulator in
        # flight and the one being received (neither is touched before its transfer is waited).
        # the accumulators' dtype: the accumulation dtype, or the model's where the plan says so (module docs)
        part = torch.empty(2, b, hk, s, d, dtype=acc if self.dkv_fp32 else q.dtype, device=q.device)
        acc_a, acc_b = torch.empty_like(part), torch.empty_like(part)
        dkv_tr = None  # the accumulator shift posted after the previous block
        self._use("backward: own K/V", writes=[(cur, self._kv(self.rank))])
        for j in range(self.cp):
            src = (self.rank - j) % self.cp
            tr = self._shift(cur, nxt, f"cp_kv_ring backward step {j}", self._kv(src - 1)) if j < self.cp - 1 else None
            self._use(f"backward block {j}", reads=[(cur, self._kv(src))])
            kb, vb = self._unpack(cur, dims)
            part.zero_()
            for qs, ks, causal in self._pairs(src, k_chunk):
                gq, gk, gv = block_backward(dob[:, :, qs], qb[:, :, qs], kb[:, :, ks], vb[:, :, ks], ob[:, :, qs],
                                            lse[:, :, qs], causal, scale)
                dqb[:, :, qs] += gq
                part[0][:, :, ks] += gk
                part[1][:, :, ks] += gv
                del gq, gk, gv
            if dkv_tr is None:  # the first block: this rank starts its accumulator
                self._use(f"backward block {j} dK/dV", writes=[(acc_a, self._dkv(src))])
                acc_a.copy_(part)
            else:  # block src's accumulator from the previous rank arrived in acc_b
                self._wait(dkv_tr, "cp_dkv_ring", acc_b)
                acc_a, acc_b = self._swap("dK/dV accumulator", acc_a, acc_b)
                self._use(f"backward block {j} dK/dV", reads=[(acc_a, self._dkv(src))],
                          writes=[(acc_a, self._dkv(src))])
                acc_a += part
            dkv_tr = self._shift(acc_a, acc_b, f"cp_dkv_ring backward step {j}", self._dkv(src - 1))
            if tr is not None:
                self._wait(tr, "cp_kv_ring", cur)
                cur, nxt = self._swap("backward K/V", cur, nxt)
        dq.view(b, s, H, d).copy_(dqb.permute(0, 2, 1, 3))
        self._wait(dkv_tr, "cp_dkv_ring", acc_b)  # this rank's own block, home after cp shifts
        self._use("backward: own dK/dV", reads=[(acc_b, self._dkv(self.rank))])
        self._finish("ring CP backward")
        dk.view(b, s, hk, d).copy_(acc_b[0].permute(0, 2, 1, 3))
        dv.view(b, s, hk, d).copy_(acc_b[1].permute(0, 2, 1, 3))


def seq_to_heads(t: torch.Tensor, b: int, s_local: int, group, u: int) -> torch.Tensor:
    """``[b*s_local, W]`` (this rank's tokens, all local heads) -> ``[b*s_local*u, W/u]`` (the
    group's tokens in rank order, this rank's 1/u of the heads)."""
    w = t.shape[1] // u
    send = t.view(b, s_local, u, w).permute(2, 0, 1, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3).reshape(b * u * s_local, w)


def heads_to_seq(t: torch.Tensor, out: torch.Tensor, b: int, s_local: int, group, u: int) -> None:
    """Inverse of `seq_to_heads`, written into ``out`` ``[b*s_local, W]``."""
    w = t.shape[1]
    send = t.view(b, u, s_local, w).permute(1, 0, 2, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out.view(b, s_local, u, w).copy_(recv.permute(1, 2, 0, 3))


def repeat_kv_heads(t: torch.Tensor, heads: int, r: int) -> torch.Tensor:
    """``[T, heads*d]`` -> ``[T, heads*r*d]``: each K/V head repeated ``r`` times in place (head i
    becomes heads i·r .. i·r + r - 1: ``repeat_interleave`` on the head dimension, as DeepSpeed's
    deepspeed/runtime/sequence_parallel/ulysses_sp.py at edaa722126 does before its all-to-all, and
    XTuner's repeat_kv in xtuner/v1/module/attention/mha.py at b934f46209); ``t`` itself when r = 1."""
    if r == 1:
        return t
    return t.view(t.shape[0], heads, -1).repeat_interleave(r, dim=1).reshape(t.shape[0], -1)


def sum_kv_repeats(g: torch.Tensor, out: torch.Tensor, heads: int, r: int) -> None:
    """The gradient of `repeat_kv_heads`: ``g`` ``[T, heads*r*d]`` summed over each head's ``r``
    repeats, written into ``out`` ``[T, heads*d]``."""
    out.view(out.shape[0], heads, -1).copy_(g.view(g.shape[0], heads, r, -1).sum(dim=2))


class UlyssesAttention(AttentionBackend):
    name = "ulysses"
    uses_scratch = False

    def __init__(self, inner: AttentionBackend, group, u: int, kv_repeat: int = 1, resend: bool = True) -> None:
        self.inner, self.group, self.u = inner, group, u
        self.resend = resend  # the backward re-sends q, k, v, out (True) or keeps the forward's (module docs)
        self.r = kv_repeat  # each K/V head's copies before the all-to-all (`memo_sim.layout.kv_heads`)
        self.name = f"ulysses({inner.name})"
        self.timer = None  # set by the runner: each all-to-all is a span on the "comm" stream

    def _span(self, t: torch.Tensor):
        if self.timer is None:
            return contextlib.nullcontext()
        return self.timer.span("ulysses_all_to_all", None, "comm", stream="comm",
                               nbytes=t.numel() * t.element_size())

    def _dims(self, dims: AttnDims) -> AttnDims:
        return AttnDims(dims.batch, dims.seq * self.u, dims.heads // self.u, dims.kv_heads * self.r // self.u,
                        dims.head_dim)

    def _a2a_kv(self, t, dims):
        """K or V to head-sharded, each local K/V head repeated r times first."""
        return self._a2a(repeat_kv_heads(t, dims.kv_heads, self.r), dims)

    def _back_kv(self, t, out, dims) -> None:
        """A head-sharded K or V gradient back to ``out`` (un-repeated: its repeats summed)."""
        if self.r == 1:
            return self._back(t, out, dims)
        g = torch.empty(out.shape[0], out.shape[1] * self.r, dtype=out.dtype, device=out.device)
        self._back(t, g, dims)
        sum_kv_repeats(g, out, dims.kv_heads, self.r)

    def _a2a(self, t, dims):
        with self._span(t):
            return seq_to_heads(t, dims.batch, dims.seq, self.group, self.u)

    def _back(self, t, out, dims) -> None:
        with self._span(t):
            heads_to_seq(t, out, dims.batch, dims.seq, self.group, self.u)

    def forward(self, q, k, v, out, dims: AttnDims, scratch):
        qh, kh, vh = self._a2a(q, dims), self._a2a_kv(k, dims), self._a2a_kv(v, dims)
        oh = torch.empty_like(qh)
        aux = self.inner.forward(qh, kh, vh, oh, self._dims(dims), scratch)
        self._back(oh, out, dims)
        if not self.resend:  # kept for the backward (module docs)
            aux = {**aux, "ulysses_heads": (qh, kh, vh, oh)}
        return aux

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims: AttnDims, scratch):
        kept = aux.get("ulysses_heads") if isinstance(aux, dict) else None
        if kept is not None:
            qh, kh, vh, oh = kept
        else:
            qh, kh, vh = self._a2a(q, dims), self._a2a_kv(k, dims), self._a2a_kv(v, dims)
            oh = self._a2a(out, dims)
        doh = self._a2a(dout, dims)
        dqh, dkh, dvh = torch.empty_like(qh), torch.empty_like(kh), torch.empty_like(vh)
        self.inner.backward(doh, qh, kh, vh, oh, aux, dqh, dkh, dvh, self._dims(dims), scratch)
        self._back(dqh, dq, dims)
        self._back_kv(dkh, dk, dims)
        self._back_kv(dvh, dv, dims)
