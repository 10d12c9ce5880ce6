"""The METP tensor-parallel flavours of the distributed executor (`memo_exec.distributed.tp`):
``metp_ffn`` (the FFN as the METP ring, the attention Megatron TP+SP) and ``metp`` (the FFN ring
and the two-level METP MHA), registered by ``tp_mode``.

Both split the tokens over the TP group like Megatron SP (rank t holds rows t, t+p, ... of its
shard: the ``interleaved`` order of `memo_exec.metp.ring_attention`) and hold exactly Megatron's
weight shards: METP's block i of W_in / b1 (its rows, gate and up halves for SwiGLU), of W_out
(its columns) and of the MHA's head group i (W_qkv / b_qkv rows, W_proj columns) are the slices
`memo_exec.distributed.tp.megatron.MegatronTP` gives rank i, so weights, sharding, gradient
gathering and which parameters are replicated are Megatron's. What differs is the layer compute
(`METPLayerCompute`) and what it saves:

- ``metp_ffn``: x, ln1, h1, ln2 local rows; q, k, v, attn Megatron's gathered head shards;
- ``metp``: x, ln1, attn (all heads), h1, ln2 local rows; no q, k, v (the MHA backward
  recomputes them per head group); the attention's log-sum-exp in ``S.aux``.

Neither keeps fc1 or act: they exist only as the FFN ring's per-step blocks, which the backward's steps
recompute (papers/metp.txt sec. 3: "the forward pass evicts intermediate results to save memory, we recompute
them in the backward pass"; the simulator's ``block_tensors``, `memo_sim.tp.metp_ffn`). They were kept as every
FFN column of the rank's rows before, with the backward reading them: a review measured 2x the simulator's
skeletal bytes under store-all and 2.4x its offload under MEMO.

MEMO's token-wise recompute rebuilds local rows [start, T): ln1, h1 (``metp``: the W_proj ring
of `memo_exec.metp.mha.proj_recompute`; ``metp_ffn``: Megatron's row-parallel projection of the
gathered rows) and ln2. Every ring step and transfer is a span of the executor's timer under
the simulator's op names (`memo_exec.metp.ffn`, `memo_exec.metp.mha`).

The rings count their tensors in a `memo_exec.metp.ledger.Ledger` built on the layer's scratch:
their double buffers and per-step blocks come from ``X.get`` / ``X.free`` under the simulator's
names (`memo_sim.memplan.trace_gen`), so a memory plan that places them is honoured.
"""

from __future__ import annotations

import torch

from memo_exec.attention import AttnDims
from memo_exec.device import acc_dtype
from memo_exec.distributed.tp.registry import register_tp
from memo_exec.distributed.tp.megatron import MegatronComm, MegatronTP
from memo_exec.layer import LN_EPS, SKELETAL, HeadNorms, _layer_norm_backward, _linear_backward, rms_norm, \
    rms_norm_backward, skeletal_widths
from memo_exec.metp.blocks import HeadGroups
from memo_exec.metp.ffn import ffn_backward, ffn_forward
from memo_exec.metp.lane import RingOptions
from memo_exec.metp.ledger import Ledger
from memo_exec.metp.mha import mha_backward, mha_forward, proj_recompute
from memo_exec.model import check_architecture
from memo_sim.tp.metp import METP_QKV_BIASES

# the two-level MHA's travelling weight block carries the QKV bias (`memo_exec.metp.blocks.mha_pack`)
# the layout rule's own biases (memo_sim.tp.metp); its head-group rings run heads of hidden / heads without QK norms
# (metp_ffn's attention is Megatron's: it runs both, `memo_exec.layer.HeadNorms`)
FULL_METP_ARCHITECTURE = {"bias": METP_QKV_BIASES, "qk_norm": (False,), "head_dim": (0,)}

ORDER = "interleaved"  # the executor's token order over the TP group (memo_exec.distributed.context)


class METPLayerCompute(HeadNorms):
    """One METP rank's layer (the `memo_exec.layer.LayerCompute` contract)."""

    def __init__(self, model, batch, seq, dtype, device, backend, scratch, timer, comm: MegatronComm, group,
                 full_mha: bool) -> None:
        self.model, self.batch, self.seq, self.dtype, self.device = model, batch, seq, dtype, device
        self.backend, self.scratch, self.timer, self.comm, self.group = backend, scratch, timer, comm, group
        self.full_mha = full_mha
        p = comm.size
        self.p = p
        self.Tg = batch * seq
        self.T = self.Tg // p
        self.h = model.hidden
        self.hq, self.kv = model.q_dim // p, model.kv_dim // p
        self.dims = AttnDims(batch, seq, model.heads // p, model.n_kv_heads // p, model.qk_head_dim)
        self.hg = HeadGroups(model.heads, model.n_kv_heads, model.qk_head_dim, p)
        self.swiglu = model.ffn_type == "swiglu"
        self.rms = model.norm == "rmsnorm"
        self.ones = torch.ones(self.Tg, dtype=dtype, device=device)
        self.ledger = None  # tests: one `Ledger` to count every ring in; else a fresh one per ring call
        self.eps = LN_EPS
        self.qk_norm, self.head = model.qk_norm, model.qk_head_dim  # QK norms: metp_ffn only (FULL_METP_ARCHITECTURE)

    def _ledger(self) -> Ledger:
        """The ledger a ring call counts in; its ring-internal tensors come from the layer's scratch."""
        return self.ledger if self.ledger is not None else Ledger(self.scratch)

    def _opts(self, layer: int) -> RingOptions:
        return RingOptions(group=self.group, timer=self.timer, layer=layer)

    def _norm(self, x, w, b, out, mean_out, rstd_out) -> None:
        """LayerNorm or RMSNorm, as `memo_exec.layer.LayerCompute._norm`."""
        if self.rms:
            rms_norm(x, w, self.eps, out, rstd_out)
            return
        o, mean, rstd = torch.native_layer_norm(x, [self.h], w, b, self.eps)
        out.copy_(o)
        mean_out.copy_(mean.view(-1))
        rstd_out.copy_(rstd.view(-1))

    def _norm_backward(self, dout, x, mean, rstd, w, b) -> torch.Tensor:
        if self.rms:
            return rms_norm_backward(dout, x, rstd, w, w.grad)
        return _layer_norm_backward(dout, x, mean, rstd, w, b)

    @staticmethod
    def _ffn_own(p) -> dict:
        own = {"w1": p.w1, "w2": p.w2}
        if p.b1 is not None:
            own["b1"] = p.b1
        return own

    # ------------------------------------------------------------------ forward
    def _fwd_ops(self, p, S, layer: int, phase: str, start: int, attention: bool, y_out, before_output=None) -> None:
        X, sp, T, h = self.scratch, self.timer.span, self.T, self.h
        r, n = slice(start, T), T - start
        opts = self._opts(layer)
        with sp("ln1", layer, phase):
            self._norm(S.x[r], p.ln1_w, p.ln1_b, S.ln1[r], S.stats[0, r], S.stats[1, r])
        proj = X.get("proj", (n, h), self.dtype)
        if self.full_mha:
            own = {"wqkv": p.wqkv, "bqkv": p.bqkv, "wo": p.wo}
            if attention:
                lse = torch.empty(self.batch, self.model.heads, self.seq // self.p, dtype=acc_dtype(self.dtype),
                                  device=self.device)
                o = mha_forward(S.ln1, {k: v.detach() for k, v in own.items()}, self.hg, self.batch, opts,
                                S.attn, lse, self._ledger(), ORDER)
                S.aux = lse
            else:  # MEMO: h1's projection for the dropped rows, from the kept attention output
                o = proj_recompute(S.attn[r], p.wo.detach(), self.hg, opts, self._ledger())
            if p.bo is None:
                proj.copy_(o)
            else:
                torch.add(o, p.bo, out=proj)
            del o
        else:
            rg = slice(start * self.p, self.Tg)
            hq, kv = self.hq, self.kv
            with sp("qkv", layer, phase):
                ln1 = self.comm.gather(S.ln1[r], X, "ln1_gathered")
                ws = (p.wqkv[:hq], p.wqkv[hq:hq + kv], p.wqkv[hq + kv:])
                bs = (p.bqkv[:hq], p.bqkv[hq:hq + kv], p.bqkv[hq + kv:]) if p.bqkv is not None else (None,) * 3
                for w, b, out in zip(ws, bs, (S.q, S.k, S.v)):
                    if b is None:
                        torch.mm(ln1, w.t(), out=out[rg])
                    else:
                        torch.addmm(b, ln1, w.t(), out=out[rg])
                self.comm.release(X, "ln1_gathered")
                del ln1
            if attention:
                with sp("attention", layer, phase):
                    q, k = self._attention_qk(p, S)
                    S.aux = self.backend.forward(q, k, S.v, S.attn, self.dims, X)
                    self._release_qk()
                    del q, k
            with sp("out_proj", layer, phase):
                part = X.get("proj_partial", (n * self.p, h), self.dtype)
                torch.mm(S.attn[rg], p.wo.t(), out=part)
                self.comm.reduce(part, proj)
                X.free("proj_partial")
                del part
                if p.bo is not None:
                    proj.add_(p.bo)
        with sp("add1", layer, phase):
            torch.add(S.x[r], proj, out=S.h1[r])
            X.free("proj")
            del proj
        with sp("ln2", layer, phase):
            self._norm(S.h1[r], p.ln2_w, p.ln2_b, S.ln2[r], S.stats[2, r], S.stats[3, r])
        if y_out is None:  # a recompute: fc1 and act are never kept (the backward's ring steps rebuild each block)
            return
        own = {k: v.detach() for k, v in self._ffn_own(p).items()}
        out = ffn_forward(S.ln2, own, opts, self.swiglu, self._ledger(), phase=phase)
        if before_output is not None:
            before_output()
        with sp("add2", layer, phase):
            if p.b2 is not None:
                out.add_(p.b2)
            torch.add(S.h1, out, out=y_out)
        del out

    def forward(self, p, S, y_out, layer: int, before_output=None) -> None:
        self.scratch.set_phase("fwd")
        with torch.no_grad():
            self._fwd_ops(p, S, layer, "fwd", 0, True, y_out, before_output)

    def recompute_tokens(self, p, S, start: int, layer: int) -> None:
        if start >= self.T:
            return
        self.scratch.set_phase("bwd")
        self.scratch.prefix = "rc_"
        try:
            with torch.no_grad():
                self._fwd_ops(p, S, layer, "recompute", start, False, None)
        finally:
            self.scratch.prefix = ""

    def recompute_full(self, p, S, layer: int) -> None:
        self.scratch.set_phase("bwd")
        self.scratch.prefix = "rc_"
        try:
            with torch.no_grad():
                self._fwd_ops(p, S, layer, "recompute", 0, True, None)
        finally:
            self.scratch.prefix = ""

    # ------------------------------------------------------------------ backward
    def backward(self, p, S, dy: torch.Tensor, layer: int) -> torch.Tensor:
        with torch.no_grad():
            return self._backward(p, S, dy, layer)

    def _backward(self, p, S, dy, layer):
        X, sp, T, Tg, h, dt = self.scratch, self.timer.span, self.T, self.Tg, self.h, self.dtype
        self.scratch.set_phase("bwd")
        opts = self._opts(layer)
        dy = dy.reshape(T, h)
        if not dy.is_contiguous() or dy._base is not None:
            dy = dy.clone(memory_format=torch.contiguous_format)
        one, oneg = self.ones[:T], self.ones
        if p.b2 is not None:
            p.b2.grad.addmv_(dy.t(), one)
        own = self._ffn_own(p)
        grads = {k: v.grad for k, v in own.items()}
        d_ln2 = ffn_backward(S.ln2, dy, {k: v.detach() for k, v in own.items()}, grads, opts, self.swiglu,
                             self._ledger())  # each step recomputes its T_ij, D_ij block (Algorithm 2)
        with sp("ln2", layer, "bwd"):
            dn = self._norm_backward(d_ln2, S.h1, S.stats[2].view(T, 1), S.stats[3].view(T, 1), p.ln2_w, p.ln2_b)
            del d_ln2
            d_h1 = dy.add_(dn)
            del dn
        if p.bo is not None:
            p.bo.grad.addmv_(d_h1.t(), one)
        if self.full_mha:
            own = {"wqkv": p.wqkv, "bqkv": p.bqkv, "wo": p.wo}
            d_ln1 = mha_backward(S.ln1, d_h1, S.attn, S.aux, {k: v.detach() for k, v in own.items()},
                                 {k: v.grad for k, v in own.items()}, self.hg, self.batch, opts, self._ledger(), ORDER)
        else:
            hq, kv = self.hq, self.kv
            with sp("out_proj", layer, "bwd"):
                d_h1g = self.comm.gather(d_h1, X, "d_h1_gathered")
                d_attn = _linear_backward(d_h1g, S.attn, p.wo, None, oneg, X.get("d_attn", (Tg, hq), dt))
                self.comm.release(X, "d_h1_gathered")
                del d_h1g
            with sp("attention", layer, "bwd"):
                d_q = X.get("d_q", (Tg, hq), dt)
                d_k = X.get("d_k", (Tg, kv), dt)
                d_v = X.get("d_v", (Tg, kv), dt)
                q, k = self._attention_qk(p, S)
                self.backend.backward(d_attn, q, k, S.v, S.attn, S.aux, d_q, d_k, d_v, self.dims, X)
                self._release_qk()
                X.free("d_attn")
                del d_attn, q, k
                self._qk_norm_backward(p, S, d_q, d_k)
            with sp("qkv", layer, "bwd"):
                ln1 = self.comm.gather(S.ln1, X, "ln1_gathered")
                ws = (p.wqkv[:hq], p.wqkv[hq:hq + kv], p.wqkv[hq + kv:])
                g = p.wqkv.grad
                gws = (g[:hq], g[hq:hq + kv], g[hq + kv:])
                gb = p.bqkv.grad if p.bqkv is not None else None
                gbs = (gb[:hq], gb[hq:hq + kv], gb[hq + kv:]) if gb is not None else (None,) * 3
                for d, gw, gbb in zip((d_q, d_k, d_v), gws, gbs):
                    gw.addmm_(d.t(), ln1)
                    if gbb is not None:
                        gbb.addmv_(d.t(), oneg)
                self.comm.release(X, "ln1_gathered")
                del ln1
                d_ln1 = X.get("d_ln1", (T, h), dt)
                part = X.get("d_ln1_partial", (Tg, h), dt)
                torch.mm(d_q, ws[0], out=part)
                part.addmm_(d_k, ws[1])
                part.addmm_(d_v, ws[2])
                self.comm.reduce(part, d_ln1)
                X.free("d_ln1_partial")
                del part
                for nm in ("d_q", "d_k", "d_v"):
                    X.free(nm)
                del d_q, d_k, d_v
        with sp("ln1", layer, "bwd"):
            dx = self._norm_backward(d_ln1, S.x, S.stats[0].view(T, 1), S.stats[1].view(T, 1), p.ln1_w, p.ln1_b)
            if not self.full_mha:
                X.free("d_ln1")
            del d_ln1
            dx.add_(d_h1)
        return dx


class _METPBase(MegatronTP):
    full_mha = False

    def check(self) -> str | None:
        why = super().check() or (check_architecture(self.model, FULL_METP_ARCHITECTURE, f"tp_mode {self.name}",
                                                     "plan it with tp_mode metp_ffn or megatron")
                                  if self.full_mha else None)
        if why:
            return why
        lay = self.ctx.layout
        if self.size > 1 and not self.ctx.sp_tokens:
            return f"{self.name} splits the tokens over the TP group: plan with sp on"
        if self.full_mha and (lay.cp > 1 or lay.ulysses > 1):
            return "two-level METP attention is not combined with ring CP or Ulysses: use tp_mode metp_ffn"
        return None

    def storage_shapes(self) -> dict[str, tuple[int, int]]:
        p = self.size
        w = skeletal_widths(self.model)
        out = {n: (1, w[n]) for n in SKELETAL}  # local rows, every column (ln1, h1, ln2, attn, x)
        out.update(fc1=(1, 0), act=(1, 0))  # blocks of the FFN ring only, recomputed by its backward steps
        if self.full_mha:
            out.update(q=(1, 0), k=(1, 0), v=(1, 0))  # recomputed per head group in the backward
        else:
            for n in ("q", "k", "v", "attn"):  # Megatron TP+SP attention: gathered rows, this rank's heads
                out[n] = (p, w[n] // p)
        return out

    def make_compute(self, batch: int, seq: int, dtype, device, backend, scratch, timer) -> METPLayerCompute:
        return METPLayerCompute(self.model, batch, seq, dtype, device, backend, scratch, timer, self.comm,
                                self.group, self.full_mha)


@register_tp("metp_ffn")
class METPFfn(_METPBase):
    full_mha = False


@register_tp("metp")
class METPFull(_METPBase):
    full_mha = True
