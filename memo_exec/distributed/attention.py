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
its part of that block's dK/dV (the kernels' own outputs, summed), so its shift overlaps the block's
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
beside the policy's sequence-sharded q, k, v and attn: the sequence-sharded q, k, v per layer more than the
simulator prices for such a plan, which holds what DeepSpeed holds (its kernel's head-sharded q, k, v and out, its
output projection's sequence-sharded attn: `memo_sim.cost.activations.ulysses_kept_scale`), counted by the
distributed runner's estimate (`memo_exec.distributed.runner.DistExecutor._estimate`, ``skeletal_resident``).
Where tp x u exceeds the model's K/V heads (a GQA model, r =
tp·u / n_kv, `memo_sim.layout.kv_heads`), each of the rank's K/V heads is repeated r times on the
head dimension before the all-to-all (`repeat_kv_heads`: head i becomes heads i·r .. i·r + r - 1,
so query head j still meets K/V head j // (heads / n_kv)), as XTuner's and DeepSpeed's Ulysses do,
and every rank receives one repeated head; the backward sums the r gradients of each head
(`sum_kv_repeats`) after the all-to-all back. The saved k and v stay un-repeated.

Memory plan: both ask the layer's scratch allocator (`memo_exec.arena`) for the buffers the simulator places in the
plan's level 1 (memo_sim/memplan/trace_gen.py ``attention_buffers``), under its names, so that a rank that follows the
plan puts them at the plan's offsets (`memo_exec.distributed.runner.rank_layer_arena`): the ring's
``cp_out_accumulator_fp32`` (forward), ``cp_kv_double_buffer`` (both passes; ``cur`` / ``nxt`` its halves),
``cp_dkv_in_flight`` (``acc_a`` / ``acc_b``) and, with fp32 accumulators (``dkv_fp32``), ``cp_dq_accumulator_fp32``
(without them dQ accumulates in the layer's dq, as TransformerEngine's); this rank's part of a block's dK/dV is the
kernels' own outputs summed in place, no buffer of its own. Ulysses' head-sharded q, k, v (one buffer,
``ulysses_qkv_alltoall``), the inner attention's output (``ulysses_attn_alltoall``), with ``resend`` their copies
sent again in the backward (``ulysses_qkv_resend_alltoall``, ``ulysses_attn_resend_alltoall``), the incoming gradient
(``ulysses_dattn_alltoall``) and dq, dk, dv (``ulysses_dqkv_alltoall``); without ``resend`` the forward's are kept in
the aux and come from the caching allocator. Outside the plan, as on one device: the kernels' outputs and workspace,
the attention lse (kept in the aux), each all-to-all's send and receive copies (as DeepSpeed's ``single_all_to_all``
makes them) and the K/V heads repeated before it. On the meta device (a sizes-only run) they request the same
buffers and compute and communicate nothing.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from memo_exec.arena import CachingScratch
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
        # the plan's level-1 tensors (memo_sim/memplan/trace_gen.py ``attention_buffers``), from the layer's scratch:
        # the fp32 output accumulator and the K/V double buffer (the block in use and the one arriving)
        scratch = scratch if scratch is not None else CachingScratch(q.device)
        o = scratch.get("cp_out_accumulator_fp32", (b, H, s, d), acc)
        kv2 = scratch.get("cp_kv_double_buffer", (2, q.shape[0], k.shape[1] + v.shape[1]), q.dtype)
        lse = torch.full((b, H, s), float("-inf"), dtype=acc, device=q.device)  # kept in the aux (the layer's lse)
        cur, nxt = kv2[0], kv2[1]
        if q.device.type != "meta":  # a sizes-only run (the plan check) records the requests alone
            o.zero_()
            cur[:, :k.shape[1]].copy_(k)
            cur[:, k.shape[1]:].copy_(v)
            self._use("forward: own K/V", writes=[(cur, self._kv(self.rank))])
            for j in range(self.cp):
                src = (self.rank - j) % self.cp
                tr = (self._shift(cur, nxt, f"cp_kv_ring forward step {j}", self._kv(src - 1))
                      if j < self.cp - 1 else None)
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
        del o, kv2, cur, nxt
        scratch.free("cp_kv_double_buffer")
        scratch.free("cp_out_accumulator_fp32")
        return {"lse": lse}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims: AttnDims, scratch):
        acc = acc_dtype(q.dtype)
        b, s, H, hk, d = dims.batch, dims.seq, dims.heads, dims.kv_heads, dims.head_dim
        k_chunk = s // 2
        scale = 1.0 / math.sqrt(d)
        lse = aux["lse"]
        qb, dob, ob = (_bhsd(t, b, s, H, d) for t in (q, dout, out))
        meta = q.device.type == "meta"  # a sizes-only run (the plan check) records the requests alone
        scratch = scratch if scratch is not None else CachingScratch(q.device)
        # the plan's level-1 tensors (memo_sim/memplan/trace_gen.py ``attention_buffers``, memo_sim/layout/ring_merge.py
        # ``RingMerge.buffers``), from the layer's scratch: the K/V double buffer, the dK/dV accumulators in use and
        # in flight (``acc_a`` / ``acc_b``: the one being added to and sent, the one being received; neither is
        # touched before its transfer is waited), in the accumulation dtype or the model's where the plan says so
        # (module docs), as TransformerEngine's p2p CP holds them (``AttnFuncWithCPAndKVP2P.backward``:
        # ``p2p_comm_buffers``, two (2, *kv.shape) buffers, K/V and dK/dV; TransformerEngine d0067d0da)
        kv2 = scratch.get("cp_kv_double_buffer", (2, q.shape[0], k.shape[1] + v.shape[1]), q.dtype)
        dkv_dt = acc if self.dkv_fp32 else q.dtype
        dkv2 = scratch.get("cp_dkv_in_flight", (2, 2, b, hk, s, d), dkv_dt)
        # dQ over the ring's steps: in the accumulation dtype (fp32) beside the layer's dq where the dK/dV are
        # (``cp_dq_accumulator_fp32``, priced with them: ``Layout.ring_dkv_fp32``), else in the layer's dq itself, in
        # the model's dtype, as TransformerEngine's ``dq_buffer = torch.empty_like(q)`` (its returned dq)
        dqb = (scratch.get("cp_dq_accumulator_fp32", (b, H, s, d), acc) if self.dkv_fp32
               else dq.view(b, s, H, d).permute(0, 2, 1, 3))
        cur, nxt = kv2[0], kv2[1]
        acc_a, acc_b = dkv2[0], dkv2[1]
        if not meta:
            home = self._ring_backward(qb, dob, ob, lse, k, v, cur, nxt, acc_a, acc_b, dqb, dims, k_chunk, scale)
            if self.dkv_fp32:
                dq.view(b, s, H, d).copy_(dqb.permute(0, 2, 1, 3))
            dk.view(b, s, hk, d).copy_(home[0].permute(0, 2, 1, 3))
            dv.view(b, s, hk, d).copy_(home[1].permute(0, 2, 1, 3))
            del home
        del kv2, dkv2, cur, nxt, acc_a, acc_b, dqb
        if self.dkv_fp32:
            scratch.free("cp_dq_accumulator_fp32")
        scratch.free("cp_dkv_in_flight")
        scratch.free("cp_kv_double_buffer")

    def _ring_backward(self, qb, dob, ob, lse, k, v, cur, nxt, acc_a, acc_b, dqb, dims: AttnDims, k_chunk: int,
                       scale: float) -> torch.Tensor:
        """The ring's backward into the given buffers: dQ accumulated in ``dqb``; returns the accumulator (one of
        ``acc_a`` / ``acc_b``) that holds this rank's own block's dK/dV, home after cp shifts."""
        cur[:, :k.shape[1]].copy_(k)
        cur[:, k.shape[1]:].copy_(v)
        dqb.zero_()
        dkv_tr = None  # the accumulator shift posted after the previous block
        self._use("backward: own K/V", writes=[(cur, self._kv(self.rank))])
        for j in range(self.cp):
            src = (self.rank - j) % self.cp
            tr = self._shift(cur, nxt, f"cp_kv_ring backward step {j}", self._kv(src - 1)) if j < self.cp - 1 else None
            self._use(f"backward block {j}", reads=[(cur, self._kv(src))])
            kb, vb = self._unpack(cur, dims)
            # this rank's part of block src's dK/dV, per key chunk: the kernels' own outputs (two pairs of one key
            # chunk summed in the accumulators' dtype, into the first's where it is that dtype), as TransformerEngine
            # adds each step's kernel outputs ``dk_``/``dv_`` into the received dkv; held until that block's
            # accumulator has arrived, so its shift overlaps the block's compute (no buffer of the block's size
            # beside the accumulators)
            parts: dict[int, tuple[slice, torch.Tensor, torch.Tensor]] = {}
            for qs, ks, causal in self._pairs(src, k_chunk):
                gq, gk, gv = block_backward(dob[:, :, qs], qb[:, :, qs], kb[:, :, ks], vb[:, :, ks], ob[:, :, qs],
                                            lse[:, :, qs], causal, scale)
                dqb[:, :, qs] += gq
                got = parts.get(ks.start)
                if got is None:
                    parts[ks.start] = (ks, gk, gv)
                else:
                    parts[ks.start] = (ks, got[1].to(acc_a.dtype).add_(gk), got[2].to(acc_a.dtype).add_(gv))
                del gq, gk, gv, got
            if dkv_tr is None:  # the first block: this rank starts its accumulator
                self._use(f"backward block {j} dK/dV", writes=[(acc_a, self._dkv(src))])
                acc_a.zero_()
            else:  # block src's accumulator from the previous rank arrived in acc_b
                self._wait(dkv_tr, "cp_dkv_ring", acc_b)
                acc_a, acc_b = self._swap("dK/dV accumulator", acc_a, acc_b)
                self._use(f"backward block {j} dK/dV", reads=[(acc_a, self._dkv(src))],
                          writes=[(acc_a, self._dkv(src))])
            for ks, gk, gv in parts.values():
                acc_a[0][:, :, ks] += gk
                acc_a[1][:, :, ks] += gv
            del parts
            dkv_tr = self._shift(acc_a, acc_b, f"cp_dkv_ring backward step {j}", self._dkv(src - 1))
            if tr is not None:
                self._wait(tr, "cp_kv_ring", cur)
                cur, nxt = self._swap("backward K/V", cur, nxt)
        self._wait(dkv_tr, "cp_dkv_ring", acc_b)  # this rank's own block, home after cp shifts
        self._use("backward: own dK/dV", reads=[(acc_b, self._dkv(self.rank))])
        self._finish("ring CP backward")
        return acc_b


def seq_to_heads(t: torch.Tensor, b: int, s_local: int, group, u: int, into: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """``[b*s_local, W]`` (this rank's tokens, all local heads) -> ``[b*s_local*u, W/u]`` (the
    group's tokens in rank order, this rank's 1/u of the heads), written into ``into`` where given (a planned
    buffer; the all-to-all's send and receive copies are its own, as DeepSpeed's ``single_all_to_all`` makes them:
    deepspeed/sequence/layer.py ``pre_all2all_fun`` and the ``empty_like`` output, DeepSpeed edaa72212)."""
    w = t.shape[1] // u
    send = t.view(b, s_local, u, w).permute(2, 0, 1, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    if into is None:
        return recv.permute(1, 0, 2, 3).reshape(b * u * s_local, w)
    into.view(b, u, s_local, w).copy_(recv.permute(1, 0, 2, 3))
    return into


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

    def _a2a_kv(self, t, dims, into=None):
        """K or V to head-sharded, each local K/V head repeated r times first."""
        return self._a2a(repeat_kv_heads(t, dims.kv_heads, self.r), dims, into)

    def _back_kv(self, t, out, dims) -> None:
        """A head-sharded K or V gradient back to ``out`` (un-repeated: its repeats summed)."""
        if self.r == 1:
            return self._back(t, out, dims)
        g = torch.empty(out.shape[0], out.shape[1] * self.r, dtype=out.dtype, device=out.device)
        self._back(t, g, dims)
        sum_kv_repeats(g, out, dims.kv_heads, self.r)

    def _a2a(self, t, dims, into=None):
        with self._span(t):
            return seq_to_heads(t, dims.batch, dims.seq, self.group, self.u, into)

    def _back(self, t, out, dims) -> None:
        with self._span(t):
            heads_to_seq(t, out, dims.batch, dims.seq, self.group, self.u)

    def _widths(self, q, k, v, dims: AttnDims) -> tuple[int, list[int]]:
        """Rows and widths of the head-sharded q, k, v (each K/V head repeated r times) this rank's inner attention
        sees."""
        return dims.batch * dims.seq * self.u, [q.shape[1] // self.u, k.shape[1] * self.r // self.u,
                                                v.shape[1] * self.r // self.u]

    @staticmethod
    def _get(X, name: str, shape, dtype, device, kept: bool) -> torch.Tensor:
        """A head-sharded buffer: from the layer's scratch (the plan's level-1 name; memo_sim/memplan/trace_gen.py
        ``attention_buffers``), or, where it is ``kept`` in the aux to the backward, from the caching allocator (it
        outlives the phase's arena)."""
        return torch.empty(shape, dtype=dtype, device=device) if kept else X.get(name, shape, dtype)

    @staticmethod
    def _carve(buf: torch.Tensor, rows: int, widths: list[int]) -> list[torch.Tensor]:
        """Contiguous ``[rows, w]`` tensors one after another in the flat buffer ``buf`` (one planned tensor)."""
        out, o = [], 0
        for w in widths:
            out.append(buf[o:o + rows * w].view(rows, w))
            o += rows * w
        return out

    def forward(self, q, k, v, out, dims: AttnDims, scratch):
        # the all-to-alls' outputs, head-sharded q, k, v (one buffer) and the inner attention's output, are the
        # plan's ``ulysses_qkv_alltoall`` and ``ulysses_attn_alltoall``, in the layer's scratch; where the backward
        # does not re-send them (module docs) they are kept in the aux and come from the caching allocator
        X = scratch if scratch is not None else CachingScratch(q.device)
        meta, kept = q.device.type == "meta", not self.resend
        rows, widths = self._widths(q, k, v, dims)
        qkv = self._get(X, "ulysses_qkv_alltoall", (rows * sum(widths),), q.dtype, q.device, kept)
        qh, kh, vh = self._carve(qkv, rows, widths)
        oh = self._get(X, "ulysses_attn_alltoall", (rows, out.shape[1] // self.u), out.dtype, out.device, kept)
        if not meta:  # a sizes-only run (the plan check) records the requests alone
            self._a2a(q, dims, qh)
            self._a2a_kv(k, dims, kh)
            self._a2a_kv(v, dims, vh)
        aux = self.inner.forward(qh, kh, vh, oh, self._dims(dims), scratch)
        if not meta:
            self._back(oh, out, dims)
        if kept:  # kept for the backward (module docs)
            return {**aux, "ulysses_heads": (qh, kh, vh, oh)}
        del qkv, qh, kh, vh, oh
        X.free("ulysses_attn_alltoall")
        X.free("ulysses_qkv_alltoall")
        return aux

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims: AttnDims, scratch):
        X = scratch if scratch is not None else CachingScratch(q.device)
        meta = q.device.type == "meta"
        rows, widths = self._widths(q, k, v, dims)
        wo = out.shape[1] // self.u
        kept = aux.get("ulysses_heads") if isinstance(aux, dict) else None
        if kept is not None:
            qh, kh, vh, oh = kept
        else:  # re-sent (the plan's ``ulysses_qkv_resend_alltoall`` / ``ulysses_attn_resend_alltoall``)
            qkv = X.get("ulysses_qkv_resend_alltoall", (rows * sum(widths),), q.dtype)
            qh, kh, vh = self._carve(qkv, rows, widths)
            oh = X.get("ulysses_attn_resend_alltoall", (rows, wo), out.dtype)
            if not meta:
                self._a2a(q, dims, qh)
                self._a2a_kv(k, dims, kh)
                self._a2a_kv(v, dims, vh)
                self._a2a(out, dims, oh)
        doh = X.get("ulysses_dattn_alltoall", (rows, wo), dout.dtype)
        dqkv = X.get("ulysses_dqkv_alltoall", (rows * sum(widths),), q.dtype)
        dqh, dkh, dvh = self._carve(dqkv, rows, widths)
        if not meta:
            self._a2a(dout, dims, doh)
        self.inner.backward(doh, qh, kh, vh, oh, aux, dqh, dkh, dvh, self._dims(dims), scratch)
        if not meta:
            self._back(dqh, dq, dims)
            self._back_kv(dkh, dk, dims)
            self._back_kv(dvh, dv, dims)
        del doh, dqkv, dqh, dkh, dvh, qh, kh, vh, oh
        X.free("ulysses_dqkv_alltoall")
        X.free("ulysses_dattn_alltoall")
        if kept is None:
            del qkv
            X.free("ulysses_attn_resend_alltoall")
            X.free("ulysses_qkv_resend_alltoall")
