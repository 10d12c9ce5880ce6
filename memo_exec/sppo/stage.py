"""One pipeline stage's math, one piece (subsequence or part of one) at a time.

The weights are the executor's own (`memo_exec.model.GPT`: the embedding, the layers'
`memo_exec.layer.LayerWeights`, the final norm, an untied classifier), in the plan model's
architecture (LayerNorm or RMSNorm, the biases it has), so one seeded model runs whole in the
executor and split into stages and pieces here. A stage holds the layers `stage_layer_ids` gives it
(the simulator's even split); stage 0 also embeds, the last stage also applies the final norm and the
chunked classifier (`memo_exec.model.ChunkedHead`, the executor's loss), and with more than one stage
both hold a tied embedding, whose two gradients are summed after the backward.

The layer is the executor's op sequence (ln1, qkv, attention, out_proj, add1, ln2, fc1, act, fc2,
add2; `memo_exec.layer`) written with autograd ops over a ``[b, n, width]`` piece, the attention
core being `memo_exec.sppo.kvcache.PrefixAttention`. The executor's `LayerCompute` cannot be
driven per piece: its attention backends take queries and keys of one length, and its storage is
carved for one fixed token count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memo_exec.layer import LayerWeights
from memo_exec.model import GPT, norm
from memo_exec.sppo.kvcache import KVCache, PrefixAttention
from memo_sim.layout.parallel import stage_layers
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Piece  # the simulator's piece (memo_sim.cost.sppo)


def stage_layer_ids(n_layers: int, pp: int, stage: int) -> list[int]:
    """The layers of stage ``stage``: the layout's even split, as the simulator prices it."""
    return list(stage_layers(n_layers, pp)[stage])


class SwiGLU(torch.autograd.Function):
    """``silu(g) * u`` for ``a = [g | u]``, keeping ``a`` alone for the backward and rebuilding silu(g) there, as
    the simulator's layer keeps fc1 and act (`memo_sim.model.layer_graph`) and memo's hand-written layer does. A
    review: autograd's composition also kept silu(g), [n, ffn] a piece more than priced, which the SPPO offload hook
    moved to the host with the rest (17.04 against 14.60 MiB a subsequence for a SwiGLU toy; GELU matched)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, f: int) -> torch.Tensor:
        ctx.save_for_backward(a)
        ctx.f = f
        return F.silu(a[..., :f]) * a[..., f:]

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (a,) = ctx.saved_tensors
        g, u = a[..., :ctx.f], a[..., ctx.f:]
        sig = torch.sigmoid(g)
        silu = g * sig
        dg = dy * u * sig * (1 + g * (1 - sig))
        return torch.cat([dg, dy * silu], dim=-1), None


def layer_forward(m: ModelConfig, p: LayerWeights, x: torch.Tensor, cache: KVCache, layer: int,
                  piece: int) -> torch.Tensor:
    """One layer over one piece ``x`` ``[b, n, h]``; ``layer`` indexes the stage's cache."""
    kv, f, d = m.kv_dim, m.ffn, m.qk_head_dim
    ln1 = norm(x, p.ln1_w, p.ln1_b)
    q, k, v = F.linear(ln1, p.wqkv, p.bqkv).split([m.q_dim, kv, kv], dim=-1)
    if m.qk_norm:  # Qwen3: an RMSNorm over each query and key head (the layer's `memo_exec.layer.head_rms_norm`)
        q = norm(q.reshape(*q.shape[:-1], -1, d), p.lnq_w, None).flatten(-2)
        k = norm(k.reshape(*k.shape[:-1], -1, d), p.lnk_w, None).flatten(-2)
    attn = PrefixAttention.apply(q.contiguous(), k, v, cache, layer, piece)
    h1 = x + F.linear(attn, p.wo, p.bo)
    fc1 = F.linear(norm(h1, p.ln2_w, p.ln2_b), p.w1, p.b1)
    if m.ffn_type == "swiglu":
        act = SwiGLU.apply(fc1, f)
    else:
        act = F.gelu(fc1)
    return h1 + F.linear(act, p.w2, p.b2)


class Stage:
    """Stage ``stage`` of ``pp`` over its pieces: the weights it holds and its K/V cache."""

    def __init__(self, gpt: GPT, stage: int, pp: int, pieces: list[Piece], batch: int, seq: int,
                 classifier_chunk: int, layer_weights: list[LayerWeights] | None = None,
                 norm_tokens: int | None = None) -> None:
        """``layer_weights``: the stage's layers in order (default: its layers of ``gpt.layers``, a
        whole model); ``norm_tokens``: the loss divisor (default batch x seq: the mean loss)."""
        m = gpt.cfg
        self.cfg, self.gpt, self.stage, self.pp = m, gpt, stage, pp
        self.pieces, self.batch, self.seq = pieces, batch, seq
        self.first, self.last = stage == 0, stage == pp - 1
        self.layer_ids = stage_layer_ids(m.layers, pp, stage)
        self.layers = layer_weights if layer_weights is not None else [gpt.layers[i] for i in self.layer_ids]
        if len(self.layers) != len(self.layer_ids):
            raise ValueError(f"stage {stage} holds layers {self.layer_ids}, got {len(self.layers)} layer weights")
        self.chunk = classifier_chunk
        self.norm_tokens = norm_tokens or batch * seq
        self.cache = KVCache(len(self.layers), [p.start for p in pieces], [p.end for p in pieces], m.heads,
                             m.n_kv_heads, m.qk_head_dim)

    def parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name in `GPT.named_parameters`, parameter) of what this stage holds."""
        tied = self.gpt.lm_head is None
        out = [(n, p) for n, p in self.gpt.outer_parameters()  # the embedding first, the rest last
               if (n == "wte" and (self.first or (self.last and tied))) or (n != "wte" and self.last)]
        for i, lw in zip(self.layer_ids, self.layers):
            out += [(f"layers.{i}.{n}", p) for n, p in lw.named_parameters()]
        return out

    def embed(self, inputs: torch.Tensor, k: int) -> torch.Tensor:
        pc = self.pieces[k]
        return self.gpt.embed(inputs[:, pc.start:pc.end])

    def layer(self, x: torch.Tensor, j: int, k: int) -> torch.Tensor:
        """The stage's layer j over piece k."""
        return layer_forward(self.cfg, self.layers[j], x, self.cache, j, k)

    def loss(self, x: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
        """This piece's share of the mean cross-entropy (its summed loss / ``norm_tokens``)."""
        pc = self.pieces[k]
        hf = self.gpt.final_norm(x).reshape(-1, self.cfg.hidden)
        return self.gpt.classify(hf, targets[:, pc.start:pc.end].reshape(-1), self.chunk, self.norm_tokens)
