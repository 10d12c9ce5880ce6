"""Causal attention forward and backward throughput vs sequence length, heads and head size.

The kernels are the executor's own backends (`memo_exec.attention`): the one ``auto`` picks
(flash-attn when installed, else torch's SDPA flash kernel on CUDA; the query-chunked math
backend on CPU) or the one named. FLOPs follow `memo_sim.model.flops`: forward
2·b·s²·(heads·head_dim) (causal half), backward 2.5x that; the efficiency curves are fitted
against those FLOPs, as `memo_sim.cost.kernel_time` looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memo_exec.arena import CachingScratch
from memo_exec.attention import AttnDims, select_backend
from memo_exec.calibrate.microbench import Bench, Progress, randn
from memo_sim.model.flops import ATTN_BWD_FACTOR, causal_attention_flops


@dataclass(frozen=True)
class AttnCase:
    seq: int
    heads: int
    head_dim: int
    batch: int = 1

    @property
    def fwd_flops(self) -> float:
        return causal_attention_flops(self.batch, self.seq, self.heads * self.head_dim)

    @property
    def bwd_flops(self) -> float:
        return ATTN_BWD_FACTOR * self.fwd_flops


def attention_cases(seqs: list[int], heads_dims: list[tuple[int, int]]) -> list[AttnCase]:
    cases = [AttnCase(s, h, d) for s in seqs for h, d in heads_dims]
    return sorted(cases, key=lambda c: c.fwd_flops)


def pick_backend(name: str, device: torch.device, dtype: torch.dtype, head_dim: int):
    """The backend the executor would use (probed on a tiny problem), as `select_backend` does."""
    return select_backend(name, device, dtype, AttnDims(1, 64, 1, 1, head_dim))


def _time_case(bench: Bench, be, c: AttnCase, dtype: torch.dtype) -> tuple:
    """(forward, backward) `Timing` of one case; its tensors are freed on return."""
    device = bench.device
    dims = AttnDims(c.batch, c.seq, c.heads, c.heads, c.head_dim)
    w = c.heads * c.head_dim
    q, k, v = (randn(dims.tokens, w, device=device, dtype=dtype, scale=0.5) for _ in range(3))
    out = torch.empty_like(q)
    dout = randn(dims.tokens, w, device=device, dtype=dtype, scale=0.1)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scratch = CachingScratch(device)
    state = {}

    def fwd():
        state["aux"] = be.forward(q, k, v, out, dims, scratch)

    def bwd():
        be.backward(dout, q, k, v, out, state["aux"], dq, dk, dv, dims, scratch)

    return bench.time(fwd), bench.time(bwd)


def run_attention(bench: Bench, cases: list[AttnCase], dtype: torch.dtype, backend_name: str,
                  progress: Progress) -> tuple[str, list[dict]]:
    """Time forward and backward of each case; return the backend's name and one record per case."""
    device = bench.device
    backends = {}
    rows = []
    progress.stage("causal attention forward + backward", len(cases))
    for c in cases:
        if c.head_dim not in backends:
            backends[c.head_dim] = pick_backend(backend_name, device, dtype, c.head_dim)
        tf, tb = _time_case(bench, backends[c.head_dim], c, dtype)
        rows.append({"seq": c.seq, "heads": c.heads, "head_dim": c.head_dim, "batch": c.batch,
                     "fwd_flops": c.fwd_flops, "fwd_s": tf.seconds, "fwd_flops_per_s": tf.rate(c.fwd_flops),
                     "bwd_flops": c.bwd_flops, "bwd_s": tb.seconds, "bwd_flops_per_s": tb.rate(c.bwd_flops)})
        progress.step(f"s={c.seq} heads={c.heads} d={c.head_dim}: fwd {tf.rate(c.fwd_flops) / 1e12:.3f} "
                      f"TFLOP/s ({tf.seconds * 1e3:.2f} ms), bwd {tb.rate(c.bwd_flops) / 1e12:.3f} TFLOP/s "
                      f"({tb.seconds * 1e3:.2f} ms)")
    if bench.cuda:
        torch.cuda.empty_cache()
    name = next(iter(backends.values())).name if backends else backend_name
    return name, rows
