"""Attention sinks (GPT-OSS, ``ModelConfig.attention_sinks``): one learned logit s_h per query head that joins
every row's softmax as a key with no value, so a row's weights sum to Z / (Z + e^s_h) instead of 1 (Z = e^lse, its
own keys' sum). As the Hugging Face model computes it (the sink appended to the scores, softmax, the sink's column
dropped), here around any attention kernel that returns its log-sum-exp and reads it back in its backward:

- forward: lse' = logaddexp(lse, s_h), out' = out * e^(lse - lse') (the kernel's output, rescaled), lse' kept in
  the kernel's own state in place of lse;
- backward: the kernel's own backward given out' and lse' is exactly the sink-augmented attention's (it rebuilds
  P = e^(S - lse') and D = rowsum(dO * O') from them, and the sink's column has no value), and the sink's gradient
  is -sum over rows of e^(s_h - lse') * D (the sink's probability times its score's gradient, 0 - D).

Under tensor parallelism each rank holds its query heads' sinks (`memo_exec.layer.LayerWeights.TP_ROWS`) and sees
every token of them, so its gradient is whole there.
"""

from __future__ import annotations

import torch

from memo_exec.attention import AttnDims


def lse_rows(aux: dict, dims: AttnDims) -> torch.Tensor:
    """The kernel's log-sum-exp as a [batch, heads, seq] view (the memory-efficient kernel pads its rows to a
    multiple of 32, cuDNN's keeps a trailing 1)."""
    t = aux["lse"]
    if t.dim() == 4:
        t = t.squeeze(-1)
    return t[..., :dims.seq]


def _heads(t: torch.Tensor, dims: AttnDims) -> torch.Tensor:
    """Token-major [T, heads * d] as [batch, heads, seq, d] (a view)."""
    return t.view(dims.batch, dims.seq, dims.heads, dims.head_dim).transpose(1, 2)


@torch.no_grad()
def apply_sinks(out: torch.Tensor, aux: dict, sinks: torch.Tensor, dims: AttnDims) -> None:
    """Rescale the kernel's output ``out`` (in place) and turn its log-sum-exp into the sink-augmented one."""
    lse = lse_rows(aux, dims)
    new = torch.logaddexp(lse, sinks.detach().to(lse.dtype).view(1, -1, 1))
    o = _heads(out, dims)
    o.copy_((o.to(lse.dtype) * (lse - new).exp_().unsqueeze(-1)).to(out.dtype))
    lse.copy_(new)


@torch.no_grad()
def sinks_grad(dout: torch.Tensor, out: torch.Tensor, aux: dict, sinks: torch.Tensor, dims: AttnDims) -> torch.Tensor:
    """d loss / d sinks [heads] from the output gradient ``dout`` and the rescaled output ``out`` (module docs)."""
    lse = lse_rows(aux, dims)
    delta = (_heads(dout, dims).to(lse.dtype) * _heads(out, dims).to(lse.dtype)).sum(-1)  # [b, H, s]
    prob = (sinks.detach().to(lse.dtype).view(1, -1, 1) - lse).exp_()
    return -(prob * delta).sum((0, 2)).to(sinks.dtype)
