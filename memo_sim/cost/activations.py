"""Activation bytes per GPU under a layout, from the layer graph.

Per GPU a tensor of one layer holds ``tokens_per_gpu · width · dtype`` bytes where
tokens_per_gpu = b·s / (cp · ulysses), further divided by tp when the tensor is TP-split or when
Megatron sequence parallelism is on (then every activation is split by tp). Totals for a GPT
layer: 32·b·s·h bytes; with TP+SP and CP each GPU holds 1/(t·c); with TP alone
(8 + 24/t)·b·s·h (divided by c).
"""

from __future__ import annotations

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import TensorSpec, layer_tensors


def tokens_per_gpu(layout: Layout, batch: int, seq: int) -> float:
    return batch * seq / layout.seq_split


def tensor_bytes(t: TensorSpec, layout: Layout, batch: int, seq: int) -> float:
    """Bytes of one layer's tensor on one GPU."""
    split = layout.tp if (t.tp_split or layout.sp) else 1
    return tokens_per_gpu(layout, batch, seq) * t.bytes_per_token() / split


def layer_rows(layout: Layout, batch: int, seq: int) -> int:
    """Token rows of every activation tensor of a layer on one GPU (token-major tensors): the
    GPU's tokens, divided by TP under Megatron sequence parallelism."""
    split = layout.tp if layout.sp else 1
    return max(1, int(round(tokens_per_gpu(layout, batch, seq) / split)))


def row_bytes(t: TensorSpec, layout: Layout) -> float:
    """Bytes of one token row of a tensor on one GPU (TP-split tensors are narrower without SP)."""
    return t.bytes_per_token() / (layout.tp if (t.tp_split and not layout.sp) else 1)


def skeletal_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    """One layer's skeletal bytes on one GPU by MEMO role: input, attn, other, lse, and total.

    ``total`` is the 32·b·s·h of MISSION.md (lse excluded; it is reported on its own).
    """
    out = {"input": 0.0, "attn": 0.0, "other": 0.0, "lse": 0.0}
    for t in layer_tensors(model).values():
        if t.saved:
            out[t.role] += tensor_bytes(t, layout, batch, seq)
    out["total"] = out["input"] + out["attn"] + out["other"]
    return out


def layer_tensor_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    return {n: tensor_bytes(t, layout, batch, seq) for n, t in layer_tensors(model).items()}
