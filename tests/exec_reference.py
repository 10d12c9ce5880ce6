"""A plain-autograd reference of the executor's GPT (nn.LayerNorm, nn.Linear, torch's own
``scaled_dot_product_attention(is_causal=True)``, ``F.cross_entropy``), built with the same
weights. Tests compare the executor's loss and every gradient against it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memo_exec.layer import LN_EPS
from memo_sim.model.config import ModelConfig


class RefLayer(nn.Module):
    def __init__(self, m: ModelConfig, device, dtype) -> None:
        super().__init__()
        h, kv = m.hidden, m.kv_dim
        self.m = m
        kw = {"device": device, "dtype": dtype}
        self.ln1 = nn.LayerNorm(h, eps=LN_EPS, **kw)
        self.qkv = nn.Linear(h, h + 2 * kv, **kw)
        self.out = nn.Linear(h, h, **kw)
        self.ln2 = nn.LayerNorm(h, eps=LN_EPS, **kw)
        swiglu = m.ffn_type == "swiglu"
        self.fc1 = nn.Linear(h, m.fc1_width, bias=not swiglu, **kw)
        self.fc2 = nn.Linear(m.ffn, h, bias=not swiglu, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        b, s, h = x.shape
        d, H, Hk = m.head_dim, m.heads, m.n_kv_heads
        q, k, v = self.qkv(self.ln1(x)).split([h, m.kv_dim, m.kv_dim], dim=-1)
        q = q.view(b, s, H, d).transpose(1, 2)
        k = k.view(b, s, Hk, d).transpose(1, 2)
        v = v.view(b, s, Hk, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hk != H)
        h1 = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        f1 = self.fc1(self.ln2(h1))
        if m.ffn_type == "swiglu":
            gate, up = f1.split([m.ffn, m.ffn], dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(f1)
        return h1 + self.fc2(act)


class RefGPT(nn.Module):
    def __init__(self, m: ModelConfig, layers: int, device, dtype) -> None:
        super().__init__()
        self.m = m
        self.wte = nn.Parameter(torch.empty(m.vocab, m.hidden, device=device, dtype=dtype))
        self.layers = nn.ModuleList(RefLayer(m, device, dtype) for _ in range(layers))
        self.lnf = nn.LayerNorm(m.hidden, eps=LN_EPS, device=device, dtype=dtype)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = F.embedding(inputs, self.wte)
        for lay in self.layers:
            x = lay(x)
        logits = self.lnf(x) @ self.wte.t()
        lf = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(lf.reshape(-1, lf.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def load_from(self, gpt) -> None:
        """Copy the executor GPT's weights (memo_exec.model.GPT)."""
        self.wte.copy_(gpt.wte)
        self.lnf.weight.copy_(gpt.lnf_w)
        self.lnf.bias.copy_(gpt.lnf_b)
        for ref, lw in zip(self.layers, gpt.layers):
            for name, src in self.mapping(ref, lw):
                name.copy_(src)

    @staticmethod
    def mapping(ref: RefLayer, lw) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(ref.ln1.weight, lw.ln1_w), (ref.ln1.bias, lw.ln1_b), (ref.qkv.weight, lw.wqkv),
                 (ref.qkv.bias, lw.bqkv), (ref.out.weight, lw.wo), (ref.out.bias, lw.bo),
                 (ref.ln2.weight, lw.ln2_w), (ref.ln2.bias, lw.ln2_b), (ref.fc1.weight, lw.w1),
                 (ref.fc2.weight, lw.w2)]
        if lw.b1 is not None:
            pairs += [(ref.fc1.bias, lw.b1), (ref.fc2.bias, lw.b2)]
        return pairs

    def grads_by_exec_name(self) -> dict[str, torch.Tensor]:
        """Reference gradients keyed like ``GPT.named_parameters()``."""
        names = ["ln1_w", "ln1_b", "wqkv", "bqkv", "wo", "bo", "ln2_w", "ln2_b", "w1", "w2", "b1", "b2"]
        out = {"wte": self.wte.grad, "lnf_w": self.lnf.weight.grad, "lnf_b": self.lnf.bias.grad}
        for i, ref in enumerate(self.layers):
            tens = [ref.ln1.weight, ref.ln1.bias, ref.qkv.weight, ref.qkv.bias, ref.out.weight, ref.out.bias,
                    ref.ln2.weight, ref.ln2.bias, ref.fc1.weight, ref.fc2.weight, ref.fc1.bias, ref.fc2.bias]
            for n, t in zip(names, tens):
                if t is not None:
                    out[f"layers.{i}.{n}"] = t.grad
        return out
