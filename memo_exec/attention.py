"""Causal attention backends with an explicit forward (returning the log-sum-exp) and backward.

Every backend reads q, k, v and writes the attention output into token-major ``[T, width]``
tensors that the layer owns (T = batch x sequence), so the skeletal tensors stay where the
activation policy put them. What a backend keeps for its backward (the log-sum-exp and, for the
CUDA kernels, the RNG state) is returned as ``aux`` and kept on the device by every policy.

- ``flash_attn``: the flash-attn package (``flash_attn_func``, forward returns the lse); its
  backward re-runs the kernel under a local autograd call on the saved q, k, v.
- ``sdpa_flash`` / ``sdpa_efficient`` / ``sdpa_cudnn``: PyTorch's own SDPA kernels called through
  their aten forward and backward ops (the kernels ``torch.nn.attention.sdpa_kernel`` selects),
  so the backward uses the saved output and lse and does not recompute the forward. On CPU,
  ``sdpa_flash`` is aten's CPU flash kernel.
- ``math``: plain PyTorch, query-chunked so the score matrix never exceeds a budget; the manual
  backward rebuilds the probabilities from the saved lse (the FlashAttention recurrence).

A backend is chosen and probed on a tiny problem before anything large is allocated; a missing
or unsupported one raises `BackendError`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from memo_exec.device import acc_dtype
from memo_exec.errors import BackendError
from memo_sim.model.layer_graph import LSE_BYTES, attention_bwd_workspace_bytes
from memo_sim.plan.schema import ATTENTION_BACKENDS

BACKENDS = ATTENTION_BACKENDS  # the names plan.json may carry (memo_sim.plan.schema)
VALUE_WIDTH = "value heads of another width than the query heads"  # latent attention's (`AttnDims.dv`)
AUTO_ORDER_CUDA = ("flash_attn", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "math")
CUDA_ONLY = ("sdpa_efficient", "sdpa_cudnn", "flash_attn")  # the rest run on a CPU too
ON_CPU = tuple(sorted(n for n in BACKENDS if n != "auto" and n not in CUDA_ONLY))  # math, sdpa_flash
# the backends that run a priced kernel (`memo_sim.plan.Plan.priced_attention_kernel`) where ``auto``'s
# order would pick another: a plan priced on cuDNN's fused attention runs torch SDPA's cuDNN kernel first
PRICED_KERNEL_BACKENDS = {"cudnn": ("sdpa_cudnn",)}
MATH_SCORE_BUDGET_BYTES = 256 * 2**20
MATH_MAX_CHUNK = 256  # query rows per block: causal blocks skip the keys after the block


@dataclass(frozen=True)
class AttnDims:
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int = 0  # a sliding-window layer's: each query sees the last ``window`` tokens (0: every earlier one)
    sinks: bool = False  # the layers add attention sinks (`memo_exec.attention_sinks`): the kernel's lse is read
    chunk: int = 0  # a chunked layer's (Llama 4): each query sees the earlier keys of its own ``chunk`` tokens only
    v_head_dim: int = 0  # a value head's width where it is not the query/key head's (latent attention); 0: the same

    @property
    def dv(self) -> int:
        """One value head's width (the output's per head)."""
        return self.v_head_dim or self.head_dim

    def needs(self) -> list[str]:
        """What the layers ask of a kernel beyond causal attention (for `AttentionBackend.why_not`)."""
        return (["sliding windows"] * bool(self.window) + ["attention sinks"] * self.sinks
                + ["chunked attention"] * bool(self.chunk) + [VALUE_WIDTH] * (self.dv != self.head_dim))

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def value_width(model) -> int:
    """`AttnDims.v_head_dim` of a model's layers: its value head's width where it differs from the query/key
    head's (latent attention), else 0."""
    return model.value_head_dim if model.value_head_dim != model.qk_head_dim else 0


def layer_needs(model) -> dict:
    """What a model's layers ask of the attention kernel (`AttnDims.window`, `AttnDims.sinks`, `AttnDims.chunk`), for
    choosing one: a window where some layer slides, the lse where the layers have sinks, chunks where some layer is
    chunked."""
    return {"window": model.sliding_window if model.sliding_layers else 0, "sinks": bool(model.attention_sinks),
            "chunk": model.attention_chunk if model.chunked_layers else 0}


def kernel_bwd_workspace(dims: AttnDims, esize: int) -> int:
    """The fused kernels' backward workspace, FlashAttention's fp32 dQ accumulator and two fp32
    lse-sized vectors: the simulator's ``attention_bwd_workspace``
    (`memo_sim.model.layer_graph.attention_bwd_workspace_bytes`, one formula for both)."""
    lse = dims.tokens * dims.heads * LSE_BYTES
    return int(attention_bwd_workspace_bytes(lse, dims.tokens * dims.heads * dims.head_dim * esize, esize))


def bhsd(t: torch.Tensor, dims: AttnDims, heads: int) -> torch.Tensor:
    """``[T, heads*d]`` token-major -> ``[b, heads, s, d]`` view (last dim contiguous)."""
    return t.view(dims.batch, dims.seq, heads, dims.head_dim).transpose(1, 2)


def _copy_bhsd_into(dst_tokens: torch.Tensor, src_bhsd: torch.Tensor, dims: AttnDims, heads: int) -> None:
    dst_tokens.view(dims.batch, dims.seq, heads, dims.head_dim).copy_(src_bhsd.transpose(1, 2))


def expand_kv_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """GQA: ``[b, Hkv, s, d]`` -> ``[b, Hkv*group, s, d]`` (query head h reads kv head h // group)."""
    if group == 1:
        return t
    b, hk, s, d = t.shape
    return t.unsqueeze(2).expand(b, hk, group, s, d).reshape(b, hk * group, s, d)


def reduce_kv_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """The gradient of `expand_kv_heads`: ``[b, H, s, d]`` -> ``[b, H/group, s, d]``, summed over each group."""
    if group == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // group, group, s, d).sum(2)


class AttentionBackend(ABC):
    name = "base"
    # whether it takes scratch tensors from the layer's scratch allocator (memory-plan names attn_*)
    uses_scratch = False
    # whether it masks keys beyond a sliding window (``AttnDims.window``), whether its backward reads the lse it
    # returned, so that attention sinks can rescale its output and lse around it (`memo_exec.attention_sinks`), and
    # whether it masks the keys of earlier chunks (``AttnDims.chunk``)
    windows = False
    sinks = False
    chunks = False
    value_dims = False  # whether it runs value heads of another width than the query/key heads (`AttnDims.dv`)

    @classmethod
    def lacks(cls, dims: AttnDims) -> list[str]:
        """What of `AttnDims.needs` this backend does not run."""
        runs = {"sliding windows": cls.windows, "attention sinks": cls.sinks, "chunked attention": cls.chunks,
                VALUE_WIDTH: cls.value_dims}
        return [n for n in dims.needs() if not runs[n]]

    @classmethod
    def why_not(cls, dims: AttnDims) -> str | None:
        """Why this backend cannot run the attention of a model whose layers need ``dims.needs()``, or None."""
        lacks = cls.lacks(dims)
        if not lacks:
            return None
        can = [n for n, c in _CLASSES.items() if not c.lacks(dims)]
        cuda = [n for n in can if n in CUDA_ONLY]
        return (f"attention backend {cls.name} runs no {' or '.join(lacks)} (the model's layers have them); use "
                f"--attention-backend {' or '.join(n for n in can if n not in CUDA_ONLY)}"
                + (f" (on CUDA also {' or '.join(cuda)})" if cuda else ""))

    @abstractmethod
    def forward(self, q, k, v, out, dims: AttnDims, scratch) -> Any:
        """Write softmax(q k^T / sqrt(d), causal) v into ``out``; return what the backward needs."""

    @abstractmethod
    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims: AttnDims, scratch) -> None:
        """Write the gradients of q, k, v into ``dq``, ``dk``, ``dv``."""

    def outside_bytes(self, dims: AttnDims, esize: int, phase: str) -> int:
        """Bytes the kernel allocates itself (not through the scratch allocator, so not in a memory
        plan) while it runs in ``phase`` (fwd | bwd); the lse it keeps is counted with the lse."""
        return 0


# --------------------------------------------------------------------------------------------------
class MathAttention(AttentionBackend):
    """Query-chunked causal attention in plain PyTorch with a manual backward from the saved lse."""

    name = "math"
    uses_scratch = True
    windows = sinks = chunks = value_dims = True

    def __init__(self, score_budget_bytes: int = MATH_SCORE_BUDGET_BYTES) -> None:
        self.budget = score_budget_bytes

    def chunk_tokens(self, dims: AttnDims, acc: torch.dtype) -> int:
        per_row = 2 * dims.heads * dims.seq * torch.empty((), dtype=acc, device="meta").element_size()
        return max(1, min(dims.seq, MATH_MAX_CHUNK, self.budget // per_row))

    def _kv_scratch(self, scratch, dims, acc):
        kk = scratch.get("attn_k", (dims.kv_heads, dims.seq, dims.head_dim), acc)
        vv = scratch.get("attn_v", (dims.kv_heads, dims.seq, dims.dv), acc)
        return kk, vv

    @staticmethod
    def _rows(t: torch.Tensor, dims: AttnDims, bi: int, heads: int, width: int = 0) -> torch.Tensor:
        """Sequence ``bi``'s rows of token-major ``t`` as [seq, heads, width] (default: the query/key head's)."""
        s = dims.seq
        return t[bi * s:(bi + 1) * s].view(s, heads, width or dims.head_dim)

    def forward(self, q, k, v, out, dims: AttnDims, scratch) -> Any:
        acc = acc_dtype(q.dtype)
        b, s, hk, g, d, dv = dims.batch, dims.seq, dims.kv_heads, dims.group, dims.head_dim, dims.dv
        scale = 1.0 / math.sqrt(d)
        c = self.chunk_tokens(dims, acc)
        lse = torch.empty(b, dims.heads, s, dtype=acc, device=q.device)
        kk, vv = self._kv_scratch(scratch, dims, acc)
        qq = scratch.get("attn_q", (hk, g * c, d), acc)
        ss = scratch.get("attn_s", (hk, g * c, s), acc)
        oo = scratch.get("attn_o", (hk, g * c, dv), acc)
        mask = torch.ones(c, c, dtype=torch.bool, device=q.device).triu_(1)
        # on the meta device (dry runs that record the scratch requests) there are no values to compute
        for bi in range(b if q.device.type != "meta" else 0):
            kk.copy_(self._rows(k, dims, bi, hk).transpose(0, 1))
            vv.copy_(self._rows(v, dims, bi, hk, dv).transpose(0, 1))
            qb, ob = self._rows(q, dims, bi, dims.heads), self._rows(out, dims, bi, dims.heads, dv)
            for t0 in range(0, s, c):
                cc = min(c, s - t0)
                hi = t0 + cc
                qg = qq[:, :g * cc].view(hk, g, cc, d)
                qg.copy_(qb[t0:hi].view(cc, hk, g, d).permute(1, 2, 0, 3))
                qg.mul_(scale)
                sc = ss[:, :g * cc, :hi]
                torch.bmm(qq[:, :g * cc], kk[:, :hi].transpose(1, 2), out=sc)
                sc.view(hk, g, cc, hi)[..., t0:hi].masked_fill_(mask[:cc, :cc], float("-inf"))
                _mask_reach(sc.view(hk, g, cc, hi), t0, dims)
                l_c = torch.logsumexp(sc, -1)  # [hk, g*cc]
                lse[bi].view(hk, g, s)[:, :, t0:hi].copy_(l_c.view(hk, g, cc))
                sc.sub_(l_c.unsqueeze(-1)).exp_()
                o = oo[:, :g * cc]
                torch.bmm(sc, vv[:, :hi], out=o)
                ob[t0:hi].view(cc, hk, g, dv).copy_(o.view(hk, g, cc, dv).permute(2, 0, 1, 3))
        for n in ("attn_o", "attn_s", "attn_q", "attn_v", "attn_k"):
            scratch.free(n)
        return {"lse": lse}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv_out, dims: AttnDims, scratch) -> None:
        acc = acc_dtype(q.dtype)
        b, s, hk, g, d, dv = dims.batch, dims.seq, dims.kv_heads, dims.group, dims.head_dim, dims.dv
        scale = 1.0 / math.sqrt(d)
        c = self.chunk_tokens(dims, acc)
        lse = aux["lse"]
        kk, vv = self._kv_scratch(scratch, dims, acc)
        dkk = scratch.get("attn_dk", (hk, s, d), acc)
        dvv = scratch.get("attn_dv", (hk, s, dv), acc)
        qq = scratch.get("attn_q", (hk, g * c, d), acc)
        doo = scratch.get("attn_do", (hk, g * c, dv), acc)
        ss = scratch.get("attn_s", (hk, g * c, s), acc)
        dp = scratch.get("attn_dp", (hk, g * c, s), acc)
        dqq = scratch.get("attn_dq", (hk, g * c, d), acc)
        tmp = scratch.get("attn_tmp", (c, dims.heads * dv), acc)
        mask = torch.ones(c, c, dtype=torch.bool, device=q.device).triu_(1)
        for bi in range(b if q.device.type != "meta" else 0):
            kk.copy_(self._rows(k, dims, bi, hk).transpose(0, 1))
            vv.copy_(self._rows(v, dims, bi, hk, dv).transpose(0, 1))
            dkk.zero_()
            dvv.zero_()
            qb = self._rows(q, dims, bi, dims.heads)
            dob = self._rows(dout, dims, bi, dims.heads, dv)
            obf = out[bi * s:(bi + 1) * s]
            dobf = dout[bi * s:(bi + 1) * s]
            dqb = self._rows(dq, dims, bi, dims.heads)
            for t0 in range(0, s, c):
                cc = min(c, s - t0)
                hi = t0 + cc
                qg = qq[:, :g * cc]
                qg.view(hk, g, cc, d).copy_(qb[t0:hi].view(cc, hk, g, d).permute(1, 2, 0, 3))
                dog = doo[:, :g * cc]
                dog.view(hk, g, cc, dv).copy_(dob[t0:hi].view(cc, hk, g, dv).permute(1, 2, 0, 3))
                # delta = rowsum(dO * O) per (head, row)
                torch.mul(dobf[t0:hi], obf[t0:hi], out=tmp[:cc])
                delta = tmp[:cc].view(cc, hk, g, dv).sum(-1).permute(1, 2, 0).reshape(hk, g * cc)
                # probabilities from the saved lse
                sc = ss[:, :g * cc, :hi]
                torch.bmm(qg, kk[:, :hi].transpose(1, 2), out=sc)
                sc.mul_(scale)
                sc.view(hk, g, cc, hi)[..., t0:hi].masked_fill_(mask[:cc, :cc], float("-inf"))
                _mask_reach(sc.view(hk, g, cc, hi), t0, dims)
                sc.sub_(lse[bi].view(hk, g, s)[:, :, t0:hi].reshape(hk, g * cc).unsqueeze(-1)).exp_()
                # dV += P^T dO ; dP = dO V^T ; dS = P (dP - delta) * scale
                dvv[:, :hi].baddbmm_(sc.transpose(1, 2), dog)
                dpc = dp[:, :g * cc, :hi]
                torch.bmm(dog, vv[:, :hi].transpose(1, 2), out=dpc)
                dpc.sub_(delta.unsqueeze(-1)).mul_(sc).mul_(scale)
                # dQ = dS K ; dK += dS^T Q
                dqg = dqq[:, :g * cc]
                torch.bmm(dpc, kk[:, :hi], out=dqg)
                dkk[:, :hi].baddbmm_(dpc.transpose(1, 2), qg)
                dqb[t0:hi].view(cc, hk, g, d).copy_(dqg.view(hk, g, cc, d).permute(2, 0, 1, 3))
            self._rows(dk, dims, bi, hk).copy_(dkk.transpose(0, 1))
            self._rows(dv_out, dims, bi, hk, dv).copy_(dvv.transpose(0, 1))
        for n in ("attn_tmp", "attn_dq", "attn_dp", "attn_s", "attn_do", "attn_q", "attn_dv", "attn_dk",
                  "attn_v", "attn_k"):
            scratch.free(n)


def _mask_reach(scores: torch.Tensor, t0: int, dims: AttnDims) -> None:
    """Mask the earlier keys a layer's window or chunk hides from query rows ``t0..`` of ``scores`` [..., rows,
    keys] (the causal mask is the caller's): under a sliding window key j of query i where j <= i - window (each
    query sees itself and the window - 1 tokens before it); under chunks key j where j < (i // chunk) * chunk (each
    query sees the earlier keys of its own chunk)."""
    if not (dims.window or dims.chunk):  # plain causal attention: nothing to build
        return
    rows, keys = scores.shape[-2:]
    i = torch.arange(t0, t0 + rows, device=scores.device).unsqueeze(1)
    j = torch.arange(keys, device=scores.device).unsqueeze(0)
    if dims.window and t0 + rows - 1 >= dims.window:
        scores.masked_fill_(j <= i - dims.window, float("-inf"))
    if dims.chunk and t0 + rows - 1 >= dims.chunk:
        scores.masked_fill_(j < i // dims.chunk * dims.chunk, float("-inf"))


# --------------------------------------------------------------------------------------------------
class _AtenSDPA(AttentionBackend):
    """Shared plumbing of the aten SDPA kernels: GQA expansion and token-major copies. Their backward reads the
    saved lse (sinks run around them); their causal mask has no window."""

    sinks = True

    def _qkv(self, q, k, v, dims):
        qb = bhsd(q, dims, dims.heads)
        kb, vb = bhsd(k, dims, dims.kv_heads), bhsd(v, dims, dims.kv_heads)
        if dims.group > 1:
            kb, vb = expand_kv_heads(kb, dims.group), expand_kv_heads(vb, dims.group)
        return qb, kb, vb

    def outside_bytes(self, dims: AttnDims, esize: int, phase: str) -> int:
        T, h, kv = dims.tokens, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
        expanded = 2 * T * h * esize if dims.group > 1 else 0  # GQA: k and v expanded to every head
        if phase == "fwd":
            return T * h * esize + expanded  # the kernel's output
        # dq, dk, dv (+ GQA: expanded k, v and unreduced dk, dv) and the kernel's own workspace
        return T * (h + 2 * kv) * esize + 2 * expanded + kernel_bwd_workspace(dims, esize)

    def _store_grads(self, gq, gk, gv, dq, dk, dv, dims):
        _copy_bhsd_into(dq, gq, dims, dims.heads)
        if dims.group > 1:
            gk, gv = reduce_kv_heads(gk, dims.group), reduce_kv_heads(gv, dims.group)
        _copy_bhsd_into(dk, gk, dims, dims.kv_heads)
        _copy_bhsd_into(dv, gv, dims, dims.kv_heads)


class SDPAFlash(_AtenSDPA):
    name = "sdpa_flash"

    def forward(self, q, k, v, out, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        scale = 1.0 / math.sqrt(dims.head_dim)
        if q.is_cuda:
            r = torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, True, False, scale=scale)
            o, lse, cum_q, cum_k, max_q, max_k, seed, offset = r[:8]
            aux = {"lse": lse, "cum_q": cum_q, "cum_k": cum_k, "max_q": max_q, "max_k": max_k,
                   "seed": seed, "offset": offset}
        else:
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qb, kb, vb, 0.0, True, scale=scale)
            aux = {"lse": lse}
        _copy_bhsd_into(out, o, dims, dims.heads)
        return aux

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        ob, gob = bhsd(out, dims, dims.heads), bhsd(dout, dims, dims.heads)
        scale = 1.0 / math.sqrt(dims.head_dim)
        if q.is_cuda:
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                gob, qb, kb, vb, ob, aux["lse"], aux["cum_q"], aux["cum_k"], aux["max_q"], aux["max_k"], 0.0, True,
                aux["seed"], aux["offset"], scale=scale)
        else:
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                gob, qb, kb, vb, ob, aux["lse"], 0.0, True, scale=scale)
        self._store_grads(gq, gk, gv, dq, dk, dv, dims)


class SDPAEfficient(_AtenSDPA):
    name = "sdpa_efficient"

    def forward(self, q, k, v, out, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        scale = 1.0 / math.sqrt(dims.head_dim)
        o, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            qb, kb, vb, None, True, 0.0, True, scale=scale)
        _copy_bhsd_into(out, o, dims, dims.heads)
        return {"lse": lse, "seed": seed, "offset": offset}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        ob, gob = bhsd(out, dims, dims.heads), bhsd(dout, dims, dims.heads)
        scale = 1.0 / math.sqrt(dims.head_dim)
        gq, gk, gv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            gob, qb, kb, vb, None, ob, aux["lse"], aux["seed"], aux["offset"], 0.0, [True, True, True, False], True,
            scale=scale)
        self._store_grads(gq, gk, gv, dq, dk, dv, dims)


class SDPACudnn(_AtenSDPA):
    name = "sdpa_cudnn"

    def forward(self, q, k, v, out, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        scale = 1.0 / math.sqrt(dims.head_dim)
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(qb, kb, vb, None, True, 0.0, True, False, scale=scale)
        o, lse, cum_q, cum_k, max_q, max_k, seed, offset = r[:8]
        _copy_bhsd_into(out, o, dims, dims.heads)
        return {"lse": lse, "cum_q": cum_q, "cum_k": cum_k, "max_q": max_q, "max_k": max_k, "seed": seed,
                "offset": offset}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims, scratch):
        qb, kb, vb = self._qkv(q, k, v, dims)
        ob, gob = bhsd(out, dims, dims.heads), bhsd(dout, dims, dims.heads)
        scale = 1.0 / math.sqrt(dims.head_dim)
        gq, gk, gv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            gob, qb, kb, vb, ob, aux["lse"], aux["seed"], aux["offset"], None, aux["cum_q"], aux["cum_k"],
            aux["max_q"], aux["max_k"], 0.0, True, scale=scale)
        self._store_grads(gq, gk, gv, dq, dk, dv, dims)


class FlashAttnPackage(AttentionBackend):
    """flash-attn 2 (``flash_attn_func``): native GQA, inputs ``[b, s, H, d]`` = our token-major layout."""

    name = "flash_attn"
    windows = True  # its window_size; its backward here re-runs the forward, so it never reads a sink-rescaled lse

    def __init__(self) -> None:
        from flash_attn import flash_attn_func  # noqa: PLC0415 - optional dependency

        self.fn = flash_attn_func

    def outside_bytes(self, dims: AttnDims, esize: int, phase: str) -> int:
        T, h, kv = dims.tokens, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
        if phase == "fwd":
            return T * h * esize  # the kernel's output
        # the backward re-runs the forward, then dq, dk, dv, and the kernel's own workspace
        return T * h * esize + T * (h + 2 * kv) * esize + kernel_bwd_workspace(dims, esize)

    @staticmethod
    def _window(dims: AttnDims) -> tuple[int, int]:
        """flash-attn's window_size: the keys left of each query it sees (-1: all)."""
        return (dims.window - 1, 0) if dims.window else (-1, -1)

    def _views(self, q, k, v, dims):
        b, s, d = dims.batch, dims.seq, dims.head_dim
        return (q.view(b, s, dims.heads, d), k.view(b, s, dims.kv_heads, d), v.view(b, s, dims.kv_heads, d))

    def forward(self, q, k, v, out, dims, scratch):
        qv, kv, vv = self._views(q, k, v, dims)
        o, lse, _ = self.fn(qv, kv, vv, 0.0, None, True, window_size=self._window(dims), return_attn_probs=True)
        out.view_as(o).copy_(o)
        return {"lse": lse}

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims, scratch):
        qv, kv, vv = (t.detach().requires_grad_(True) for t in self._views(q, k, v, dims))
        with torch.enable_grad():
            o = self.fn(qv, kv, vv, 0.0, None, True, window_size=self._window(dims))
            gq, gk, gv = torch.autograd.grad(o, (qv, kv, vv), dout.view_as(o))
        dq.view_as(gq).copy_(gq)
        dk.view_as(gk).copy_(gk)
        dv.view_as(gv).copy_(gv)


_CLASSES = {"math": MathAttention, "sdpa_flash": SDPAFlash, "sdpa_efficient": SDPAEfficient,
            "sdpa_cudnn": SDPACudnn, "flash_attn": FlashAttnPackage}


def _instantiate(name: str) -> AttentionBackend:
    try:
        return _CLASSES[name]()
    except ImportError as e:
        raise BackendError(f"attention backend {name}: cannot import it ({e})") from None


def probe(backend: AttentionBackend, device: torch.device, dtype: torch.dtype, dims: AttnDims) -> None:
    """Run forward + backward on a tiny problem with the real head sizes; raise BackendError if it fails."""
    from memo_exec.arena import CachingScratch  # noqa: PLC0415 - avoid an import cycle

    small = AttnDims(1, 64, dims.heads, dims.kv_heads, dims.head_dim, v_head_dim=dims.v_head_dim)
    g = torch.Generator(device="cpu").manual_seed(0)

    def mk(w: int) -> torch.Tensor:
        return torch.randn(small.tokens, w, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)

    h, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    q, k, v = mk(h), mk(kv), mk(dims.kv_heads * small.dv)
    out = q.new_empty(small.tokens, dims.heads * small.dv)
    scr = CachingScratch(device)
    try:
        aux = backend.forward(q, k, v, out, small, scr)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        backend.backward(torch.ones_like(out), q, k, v, out, aux, dq, dk, dv, small, scr)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, TypeError, ValueError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(f"attention backend {backend.name} does not run on {device} with {dtype} and head dim "
                           f"{dims.head_dim}: {first}") from None
    if not bool(torch.isfinite(out.float()).all()):
        raise BackendError(f"attention backend {backend.name} returned non-finite values on {device}")


def preferred_backends(priced_kernel: str) -> tuple[str, ...]:
    """The backends ``auto`` tries first on CUDA for a plan priced on ``priced_kernel``
    (`PRICED_KERNEL_BACKENDS`; none: ``auto``'s own order, `AUTO_ORDER_CUDA`)."""
    return PRICED_KERNEL_BACKENDS.get(priced_kernel, ())


# the priced kernels no backend runs (`priced_kernel_note` says so on every device), each with what it is and what the
# executor's kernels do otherwise: materialised attention holds each head's whole s x s score matrix
# (`memo_sim.cost.attention_kernel`), which no backend here does; FlashAttention's Triton kernel
# (`memo_sim.profile.attention_kernels`: Megatron-DeepSpeed's --use-flash-attn-triton) is not one of the backends
UNRUN_PRICED_KERNELS = {
    "materialised": ("the materialised kernel (layout attention materialised: each head's whole s x s score matrix)",
                     f"which holds none (math: blocks of at most {MATH_MAX_CHUNK} query rows; the fused kernels: tiles), "
                     "so the attention and step times and the transient memory (transient_peak, and any kept scores)"),
    "flash_triton": ("FlashAttention's Triton kernel (layout attention flash_triton, on the profile's flash_triton "
                     "curves: well under half FlashAttention-2's speed on an A100)",
                     "which is not that kernel (memo-exec has no backend for it), so the attention and step times"),
}


def priced_kernel_note(priced_kernel: str | None, ran: str | None, device_kind: str | None) -> str | None:
    """A one-line note where a CUDA run's attention ran another kernel than the plan was priced on
    (its step and attention times then compare two kernels), or, on any device, where the plan was priced on a kernel
    no backend runs (`UNRUN_PRICED_KERNELS`: the materialised score matrix, FlashAttention's Triton kernel), else None."""
    if priced_kernel in UNRUN_PRICED_KERNELS:
        what, differs = UNRUN_PRICED_KERNELS[priced_kernel]
        return (f"note: the plan's attention was priced on {what}, this run ran {ran}, {differs} are not comparable "
                "with the prediction")
    want = PRICED_KERNEL_BACKENDS.get(priced_kernel or "", ())
    if device_kind != "cuda" or not want or ran in want:
        return None
    return (f"note: the plan's attention was priced on {priced_kernel}'s kernel ({' or '.join(want)}); this run ran "
            f"{ran}, so its attention and step times are not the kernel memo predicted "
            f"(--attention-backend {want[0]} asks for it)")


def rank_attention_dims(lay, model, micro: int, seq: int, tp: int) -> AttnDims:
    """The attention kernel's dims on one rank of ``lay`` (``tp``: the flavour's split of the heads): ``micro``
    sequences of the cp shard's ``seq // cp`` tokens over the heads left after TP and Ulysses, K/V heads repeated
    before Ulysses' all-to-all (`memo_sim.layout.kv_heads`), with what the model's layers ask of the kernel
    (`layer_needs`). What a distributed rank chooses its kernel for (`memo_exec.distributed.runner.DistExecutor`), the launcher's
    note checks it with, and a one-rank trace sizes it with (`memo_exec.trace`)."""
    u = lay.ulysses
    r = lay.kv_repeat(model.n_kv_heads, model.heads)
    return AttnDims(micro, seq // lay.cp, model.heads // (tp * u), model.n_kv_heads * r // (tp * u),
                    model.qk_head_dim, v_head_dim=value_width(model), **layer_needs(model))


def auto_backend_for(device_type: str, dtype: torch.dtype, dims: AttnDims, prefer: tuple[str, ...] = ()) -> str:
    """What ``auto`` resolves to on a device of this type, decided without running a kernel (for
    a trace recorded on the meta device): math on a CPU; on CUDA the first of ``prefer`` (the plan's
    priced kernel, `preferred_backends`) for 16-bit dtypes, else flash-attn when it imports, else
    torch's flash kernel for 16-bit dtypes and head dims up to 256, else its memory-efficient one.
    On a real device `select_backend` probes instead; only math takes scratch tensors, so every
    CUDA choice records the same scratch requests."""
    if device_type != "cuda":
        return "math"
    half = dtype in (torch.float16, torch.bfloat16)
    runs = lambda name: _CLASSES[name].why_not(dims) is None  # noqa: E731 - windows, sinks (`AttnDims.needs`)
    if half and prefer and runs(prefer[0]):
        return prefer[0]
    if half and runs("flash_attn"):
        try:
            import flash_attn  # noqa: F401, PLC0415 - optional dependency
            return "flash_attn"
        except ImportError:
            pass
    if dims.window or dims.chunk:
        return "math"  # of the kernels only flash-attn masks a window, none the keys of earlier chunks
    return "sdpa_flash" if half and dims.head_dim <= 256 else "sdpa_efficient"


class _MetaFlashAttn(SDPAFlash):
    """flash-attn on the meta device: sdpa_flash's shapes (no scratch tensors, as flash-attn's) with flash-attn's
    own reach, sliding windows and no sinks (on meta no value is computed, so the window masks none)."""

    name = "flash_attn"
    windows, sinks, chunks = FlashAttnPackage.windows, FlashAttnPackage.sinks, FlashAttnPackage.chunks


def meta_stand_in(name: str) -> AttentionBackend:
    """A backend that runs on the meta device with the same scratch requests and the same reach (sinks, windows)
    as ``name``: the backend itself when it has meta kernels (math, sdpa_flash), else sdpa_flash's kernel, which
    like every kernel backend takes no scratch tensors."""
    if name not in BACKENDS or name == "auto":
        raise BackendError(f"attention backend must be one of {', '.join(BACKENDS[1:])}, got {name!r}")
    return MathAttention() if name == "math" else _MetaFlashAttn() if name == "flash_attn" else SDPAFlash()


def device_why_not(name: str, device) -> None:
    """Refuse, in one line, an attention backend that needs CUDA on another device (every run alike: one device,
    a TP rank, or a ring CP rank, whose ring runs its own kernel)."""
    if device.type != "cuda" and name in CUDA_ONLY:
        raise BackendError(f"attention backend {name} needs a CUDA device (on CPU use math or sdpa_flash)")


def check_backend_device(flag: str | None, plan_backend: str, plan_file, device_type: str, what: str = "run") -> None:
    """Refuse, before anything runs, a CUDA-only attention backend on a device of type ``device_type`` other than
    cuda, in one line naming where the name came from and the fix: ``--attention-backend`` (``flag``) where given,
    else the plan's ``attention_backend`` field in ``plan_file``, which --attention-backend overrides (a review: the
    plan's flash_attn on a CPU run was refused as "attention backend flash_attn needs a CUDA device", naming neither
    the plan, its field nor the override)."""
    name = flag or plan_backend
    if device_type == "cuda" or name not in CUDA_ONLY:
        return
    on = " or ".join(ON_CPU)
    if flag:
        raise BackendError(f"--attention-backend {name} needs a CUDA device, and this {what} is on {device_type}; "
                           f"give --attention-backend {on}, or {what} on a GPU with --device cuda")
    raise BackendError(f"{plan_file}: attention_backend {name} needs a CUDA device, and this {what} is on "
                       f"{device_type}; override the plan's with --attention-backend {on}, or {what} on a GPU with "
                       f"--device cuda")


def select_backend(name: str, device: torch.device, dtype: torch.dtype, dims: AttnDims,
                   run_probe: bool = True, prefer: tuple[str, ...] = ()) -> AttentionBackend:
    """The backend ``name`` (or, for ``auto``, the first that works here: on CUDA ``prefer`` first,
    the backends of the kernel the plan was priced on, `preferred_backends`), probed on a tiny problem."""
    if name not in BACKENDS:
        raise BackendError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "auto":
        if device.type != "cuda":
            return select_backend("math", device, dtype, dims, run_probe)
        errors = []
        for cand in tuple(prefer) + tuple(b for b in AUTO_ORDER_CUDA if b not in prefer):
            try:
                return select_backend(cand, device, dtype, dims, run_probe)
            except BackendError as e:
                errors.append(str(e))
        raise BackendError("no attention backend runs here: " + "; ".join(errors))
    device_why_not(name, device)
    why = _CLASSES[name].why_not(dims)
    if why:
        raise BackendError(why)
    backend = _instantiate(name)
    if run_probe:
        probe(backend, device, dtype, dims)
    return backend
