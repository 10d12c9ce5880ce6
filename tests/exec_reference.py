"""A plain-autograd reference of the executor's model (nn.LayerNorm or an autograd RMSNorm
``x * rsqrt(mean(x^2) + eps) * w``, nn.Linear with the biases the architecture names, torch's own
``scaled_dot_product_attention(is_causal=True)``, a tied or untied classifier, ``F.cross_entropy``),
built with the same weights. Tests compare the executor's loss and every gradient against it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memo_exec.layer import LN_EPS
from memo_sim.model.config import ModelConfig


class RMSNorm(nn.Module):
    """Autograd RMSNorm (weight only; ``bias`` is None like nn.LayerNorm's without one)."""

    def __init__(self, h: int, eps: float, device, dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(h, device=device, dtype=dtype))
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(m: ModelConfig, device, dtype) -> nn.Module:
    if m.norm == "rmsnorm":
        return RMSNorm(m.hidden, LN_EPS, device, dtype)
    return nn.LayerNorm(m.hidden, eps=LN_EPS, device=device, dtype=dtype)


class Fp8Linear(torch.autograd.Function):
    """y = x W^T as torchao's Float8Linear (tensorwise) computes it, in autograd and the reference's dtype: x and W
    cast to E4M3, the output gradient to E5M2, each with one scale from its own amax (`memo_exec.gemm_formats.
    quantize`), the products of the cast values in the reference's dtype. The executor's GEMMs must give this."""

    @staticmethod
    def forward(ctx, x, w):
        from memo_exec.gemm_formats import E4M3, quantize

        ctx.save_for_backward(x, w)
        xq, xs = quantize(x.reshape(-1, x.shape[-1]), E4M3)
        wq, ws = quantize(w, E4M3)
        y = (xq.to(x.dtype) * xs.to(x.dtype)) @ (wq.to(x.dtype) * ws.to(x.dtype)).t()
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        from memo_exec.gemm_formats import E4M3, E5M2, quantize

        x, w = ctx.saved_tensors
        x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dq, ds = quantize(d2, E5M2)
        d = dq.to(x.dtype) * ds.to(x.dtype)
        wq, ws = quantize(w, E4M3)
        xq, xs = quantize(x2, E4M3)
        dx = d @ (wq.to(x.dtype) * ws.to(x.dtype))
        dw = d.t() @ (xq.to(x.dtype) * xs.to(x.dtype))
        return dx.reshape(x.shape), dw


def linear(m: ModelConfig, x: torch.Tensor, lin: nn.Linear, rows: slice | None = None) -> torch.Tensor:
    """``lin`` (its rows ``rows``) applied to ``x`` in the model's GEMM format (FP8: `Fp8Linear`, the bias added)."""
    w = lin.weight if rows is None else lin.weight[rows]
    b = lin.bias if rows is None or lin.bias is None else lin.bias[rows]
    if m.gemm_format == "bf16":
        return F.linear(x, w, b)
    y = Fp8Linear.apply(x, w)
    return y if b is None else y + b


class RefLayer(nn.Module):
    def __init__(self, m: ModelConfig, device, dtype) -> None:
        super().__init__()
        h, kv = m.hidden, m.kv_dim
        self.m = m
        kw = {"device": device, "dtype": dtype}
        self.ln1 = make_norm(m, device, dtype)
        self.qkv = self.q_proj = self.q_down = self.q_lnorm = self.q_up = None
        self.kv_down = self.kv_lnorm = self.kv_up = None
        if m.mla:  # latent attention as transformers' DeepseekV3Attention computes it, without the rotary embedding
            r, lr, heads = m.q_lora_rank, m.kv_lora_rank, m.heads
            if r:
                self.q_down = nn.Linear(h, r, bias=False, **kw)
                self.q_lnorm = RMSNorm(r, LN_EPS, device, dtype)
                self.q_up = nn.Linear(r, m.q_dim, bias=False, **kw)
            else:
                self.q_proj = nn.Linear(h, m.q_dim, bias=False, **kw)
            self.kv_down = nn.Linear(h, lr + m.qk_rope_dim, bias=False, **kw)
            self.kv_lnorm = RMSNorm(lr, LN_EPS, device, dtype)
            self.kv_up = nn.Linear(lr, heads * (m.head_dim + m.value_head_dim), bias=False, **kw)
        else:
            self.qkv = nn.Linear(h, m.q_dim + 2 * kv, bias=m.bias in ("all", "qkv"), **kw)
        self.out = nn.Linear(m.attn_dim, h, bias=m.bias == "all", **kw)
        # QK norms (Qwen3): an RMSNorm over each query / key head, as transformers' Qwen3Attention applies them
        self.q_norm = RMSNorm(m.qk_head_dim, LN_EPS, device, dtype) if m.qk_norm else None
        self.k_norm = RMSNorm(m.qk_head_dim, LN_EPS, device, dtype) if m.qk_norm else None
        self.ln2 = make_norm(m, device, dtype)
        ffn_bias = m.ffn_type != "swiglu" and m.bias == "all"
        self.fc1 = nn.Linear(h, m.fc1_width, bias=ffn_bias, **kw)
        self.fc2 = nn.Linear(m.ffn, h, bias=ffn_bias, **kw)

    def _mla(self, ln1: torch.Tensor) -> torch.Tensor:
        m = self.m
        b, s, _ = ln1.shape
        H, nope, tail, dv, lr = m.heads, m.head_dim, m.qk_rope_dim, m.value_head_dim, m.kv_lora_rank
        q = self.q_proj(ln1) if self.q_proj is not None else self.q_up(self.q_lnorm(self.q_down(ln1)))
        lat, kpe = self.kv_down(ln1).split([lr, tail], dim=-1)
        k_nope, v = self.kv_up(self.kv_lnorm(lat)).view(b, s, H, nope + dv).split([nope, dv], dim=-1)
        k = torch.cat([k_nope, kpe.unsqueeze(2).expand(b, s, H, tail)], dim=-1)
        a = F.scaled_dot_product_attention(q.view(b, s, H, nope + tail).transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return a.transpose(1, 2).reshape(b, s, m.attn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        b, s, h = x.shape
        d, H, Hk = m.qk_head_dim, m.heads, m.n_kv_heads
        ln1 = self.ln1(x)
        if m.mla:
            return self._ffn(x + linear(m, self._mla(ln1), self.out))  # the fused projection: each of q, k and v its own scale (as the executor's slices)
        q, k, v = (linear(m, ln1, self.qkv, slice(a, a + n)) for a, n in ((0, m.q_dim), (m.q_dim, m.kv_dim),
                                                                         (m.q_dim + m.kv_dim, m.kv_dim)))
        q, k = q.view(b, s, H, d), k.view(b, s, Hk, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.view(b, s, Hk, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hk != H)
        return self._ffn(x + linear(m, a.transpose(1, 2).reshape(b, s, m.q_dim), self.out))

    def _ffn(self, h1: torch.Tensor) -> torch.Tensor:
        m = self.m
        f1 = linear(m, self.ln2(h1), self.fc1)
        if m.ffn_type == "swiglu":
            gate, up = f1.split([m.ffn, m.ffn], dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(f1)
        return h1 + linear(m, act, self.fc2)


class RefGPT(nn.Module):
    def __init__(self, m: ModelConfig, layers: int, device, dtype) -> None:
        super().__init__()
        self.m = m
        self.wte = nn.Parameter(torch.empty(m.vocab, m.hidden, device=device, dtype=dtype))
        self.lm_head = (None if m.tied_embeddings
                        else nn.Parameter(torch.empty(m.vocab, m.hidden, device=device, dtype=dtype)))
        self.layers = nn.ModuleList(RefLayer(m, device, dtype) for _ in range(layers))
        self.lnf = make_norm(m, device, dtype)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = F.embedding(inputs, self.wte)
        for lay in self.layers:
            x = lay(x)
        logits = self.lnf(x) @ (self.wte if self.lm_head is None else self.lm_head).t()
        lf = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(lf.reshape(-1, lf.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def load_from(self, gpt) -> None:
        """Copy the executor GPT's weights (memo_exec.model.GPT)."""
        for dst, src in ((self.wte, gpt.wte), (self.lm_head, gpt.lm_head), (self.lnf.weight, gpt.lnf_w),
                         (self.lnf.bias, gpt.lnf_b)):
            assert (dst is None) == (src is None)
            if dst is not None:
                dst.copy_(src[:dst.shape[0]])  # the executor's embedding/classifier hold padded_vocab rows
        for ref, lw in zip(self.layers, gpt.layers):
            for name, src in self.mapping(ref, lw):
                name.copy_(src)

    @staticmethod
    def mapping(ref: RefLayer, lw) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(ref.ln1.weight, lw.ln1_w), (ref.ln1.bias, lw.ln1_b), (_weight(ref.qkv), lw.wqkv),
                 (_bias(ref.qkv), lw.bqkv), (ref.out.weight, lw.wo), (ref.out.bias, lw.bo),
                 *((_weight(getattr(ref, a)), getattr(lw, b)) for a, b in MLA_PAIRS),
                 (ref.ln2.weight, lw.ln2_w), (ref.ln2.bias, lw.ln2_b), (ref.fc1.weight, lw.w1),
                 (ref.fc2.weight, lw.w2), (ref.fc1.bias, lw.b1), (ref.fc2.bias, lw.b2),
                 (_weight(ref.q_norm), lw.lnq_w), (_weight(ref.k_norm), lw.lnk_w)]
        for dst, src in pairs:  # the two models have the same parameters
            assert (dst is None) == (src is None), (dst, src)
        return [(d, s) for d, s in pairs if d is not None]

    def grads_by_exec_name(self) -> dict[str, torch.Tensor]:
        """Reference gradients keyed like ``GPT.named_parameters()``."""
        names = ["ln1_w", "ln1_b", "wqkv", "bqkv", "wo", "bo", "ln2_w", "ln2_b", "w1", "w2", "b1", "b2", "lnq_w",
                 "lnk_w", *(b for _a, b in MLA_PAIRS)]
        out = {"wte": _padded_rows(self.wte.grad), "lnf_w": self.lnf.weight.grad}
        if self.lm_head is not None:
            out["lm_head"] = _padded_rows(self.lm_head.grad)
        if self.lnf.bias is not None:
            out["lnf_b"] = self.lnf.bias.grad
        for i, ref in enumerate(self.layers):
            tens = [ref.ln1.weight, ref.ln1.bias, _weight(ref.qkv), _bias(ref.qkv), ref.out.weight, ref.out.bias,
                    ref.ln2.weight, ref.ln2.bias, ref.fc1.weight, ref.fc2.weight, ref.fc1.bias, ref.fc2.bias,
                    _weight(ref.q_norm), _weight(ref.k_norm), *(_weight(getattr(ref, a)) for a, _b in MLA_PAIRS)]
            for n, t in zip(names, tens):
                if t is not None:
                    out[f"layers.{i}.{n}"] = t.grad
        return out


def _weight(norm: nn.Module | None) -> torch.Tensor | None:
    return None if norm is None else norm.weight


def _bias(lin: nn.Module | None) -> torch.Tensor | None:
    return None if lin is None else lin.bias


# latent attention's modules and the executor's parameters (`memo_exec.layer.LayerWeights`)
MLA_PAIRS = (("q_proj", "wq"), ("q_down", "wq_down"), ("q_lnorm", "ln_qlat_w"), ("q_up", "wq_up"),
             ("kv_down", "wkv_down"), ("kv_lnorm", "ln_kvlat_w"), ("kv_up", "wkv_up"))


def _padded_rows(g: torch.Tensor) -> torch.Tensor:
    """A [vocab, h] gradient with the executor's padding rows (`memo_exec.model.padded_vocab`), whose
    gradient must be zero."""
    from memo_exec.model import padded_vocab

    return F.pad(g, (0, 0, 0, padded_vocab(g.shape[0]) - g.shape[0]))


def causal_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor):
    """Causal GQA attention over the whole sequence by autograd, [batch, seq, heads, head_dim] in and out (each K/V
    head serving heads / kv_heads query heads): (out, dq, dk, dv) of ``out.backward(do)``, the reference the
    distributed attention tests compare their ranks' shards with."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    g, s, d = q.shape[2] // k.shape[2], q.shape[1], q.shape[3]
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(g, 1), v.transpose(1, 2).repeat_interleave(g, 1)
    sc = (qb @ kb.transpose(-1, -2) / d ** 0.5).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = (sc.softmax(-1) @ vb).transpose(1, 2)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad
