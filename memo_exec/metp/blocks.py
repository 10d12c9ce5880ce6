"""How a layer's weights split into METP blocks, and the packed layout in which a block travels.

FFN (O = f(A B) C with B = W_in^T, C = W_out^T): rank i owns column block i of B, i.e. rows
``[i f/p, (i+1) f/p)`` of the executor's ``w1`` ([fc1 width, h]; with SwiGLU the same rows of the
gate half and of the up half, gate first), the matching slice of ``b1``, and row block i of C,
i.e. columns ``[i f/p, (i+1) f/p)`` of ``w2`` ([h, f]). ``b2`` is not split: every rank adds it to
its own rows (its gradient is a per-rank partial sum, reduced like the norms').

MHA: rank i owns head group i (heads ``[i n/p, (i+1) n/p)`` and kv heads ``[i n_kv/p, ...)``):
the q, k and v rows of ``wqkv`` / ``bqkv`` for those heads (q first, then k, then v) and the
matching columns of ``wo`` ([h, h]); ``bo`` is not split.

A travelling block is one flat buffer (`Pack`), so one ring step is one transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pack:
    """Named 2-D (or 1-D) pieces laid end to end in one flat buffer."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def numel(self) -> int:
        n = 0
        for _, s in self.shapes:
            k = 1
            for d in s:
                k *= d
            n += k
        return n

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        out, off = {}, 0
        for name, s in self.shapes:
            k = 1
            for d in s:
                k *= d
            out[name] = buf[off:off + k].view(s)
            off += k
        return out

    def fill(self, buf: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        v = self.views(buf)
        for name, _ in self.shapes:
            v[name].copy_(tensors[name])


# ------------------------------------------------------------------------------------------ FFN
def ffn_cols(blk: int, p: int, f: int, swiglu: bool) -> tuple[list[slice], slice]:
    """Columns of the rank-rows fc1 ([r, fc1 width]) and act ([r, f]) that block ``blk`` produces."""
    fb = f // p
    act = slice(blk * fb, (blk + 1) * fb)
    fc1 = [act, slice(f + blk * fb, f + (blk + 1) * fb)] if swiglu else [act]
    return fc1, act


def ffn_blocks(w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, rank: int, p: int,
               swiglu: bool) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s FFN blocks (copies) out of the full weights: w1 [fc1/p, h], b1 [f/p], w2 [h, f/p]."""
    f = w2.shape[1]
    if f % p:
        raise ValueError(f"METP: ffn width {f} not divisible by the degree {p}")
    rows, cols = ffn_cols(rank, p, f, swiglu)
    out = {"w1": torch.cat([w1[r] for r in rows]).clone(), "w2": w2[:, cols].clone()}
    if b1 is not None:
        out["b1"] = b1[cols].clone()
    return out


def ffn_pack(h: int, f: int, p: int, swiglu: bool, with_out: bool = True) -> Pack:
    """One travelling FFN block: W_in rows, b1 (GeLU) and, unless only fc1 is recomputed, W_out columns."""
    fb = f // p
    fc1b = 2 * fb if swiglu else fb
    shapes = [("w1", (fc1b, h))]
    if not swiglu:
        shapes.append(("b1", (fb,)))
    if with_out:
        shapes.append(("w2", (h, fb)))
    return Pack(tuple(shapes))


# ------------------------------------------------------------------------------------------ MHA
@dataclass(frozen=True)
class HeadGroups:
    heads: int
    kv_heads: int
    head_dim: int
    p: int

    def __post_init__(self) -> None:
        if self.heads % self.p or self.kv_heads % self.p:
            raise ValueError(f"METP MHA: heads ({self.heads}) and kv heads ({self.kv_heads}) must be divisible "
                             f"by the degree {self.p}")

    @property
    def q_heads(self) -> int:  # per group
        return self.heads // self.p

    @property
    def k_heads(self) -> int:  # per group
        return self.kv_heads // self.p

    @property
    def qw(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kw(self) -> int:
        return self.k_heads * self.head_dim

    @property
    def width(self) -> int:  # q, k, v columns of one group
        return self.qw + 2 * self.kw

    def qkv_rows(self, g: int) -> list[slice]:
        h, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [slice(g * self.qw, (g + 1) * self.qw),
                slice(h + g * self.kw, h + (g + 1) * self.kw),
                slice(h + kv + g * self.kw, h + kv + (g + 1) * self.kw)]

    def attn_cols(self, g: int) -> slice:
        return slice(g * self.qw, (g + 1) * self.qw)


def mha_blocks(wqkv: torch.Tensor, bqkv: torch.Tensor, wo: torch.Tensor, rank: int,
               hg: HeadGroups) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s MHA blocks (copies): wqkv [group width, h], bqkv [group width], wo [h, q width]."""
    rows = hg.qkv_rows(rank)
    return {"wqkv": torch.cat([wqkv[r] for r in rows]).clone(),
            "bqkv": torch.cat([bqkv[r] for r in rows]).clone(),
            "wo": wo[:, hg.attn_cols(rank)].clone()}


def mha_pack(h: int, hg: HeadGroups) -> Pack:
    return Pack((("wqkv", (hg.width, h)), ("bqkv", (hg.width,)), ("wo", (h, hg.qw))))
