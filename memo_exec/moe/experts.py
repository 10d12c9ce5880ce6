"""The routed experts of one rank: a loop of per-expert GEMMs over the contiguous rows routed to
each local expert (SwiGLU or GELU as the model's ``ffn_type``; biases with ``moe_bias``), with
autograd. An expert that received no rows computes nothing (its gradient stays as it was)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1, b2, swiglu: bool) -> torch.Tensor:
    a = F.linear(x, w1, b1)
    if swiglu:
        f = a.shape[1] // 2
        a = F.silu(a[:, :f]) * a[:, f:]
    else:
        a = F.gelu(a)
    return F.linear(a, w2, b2)


def run_experts(xe: torch.Tensor, counts: list[int], weights, swiglu: bool) -> torch.Tensor:
    """``xe`` [sum(counts), h] grouped by local expert (``counts[j]`` rows of expert j, in order)."""
    outs, off = [], 0
    for j, n in enumerate(counts):
        if n == 0:
            continue
        b1 = weights.expert_b1[j] if weights.expert_b1 is not None else None
        b2 = weights.expert_b2[j] if weights.expert_b2 is not None else None
        outs.append(ffn(xe[off:off + n], weights.expert_w1[j], weights.expert_w2[j], b1, b2, swiglu))
        off += n
    if not outs:
        return xe.new_zeros(0, xe.shape[1]) + 0 * xe.sum()  # keeps xe in the graph (its gradient: zeros)
    return torch.cat(outs, 0)
