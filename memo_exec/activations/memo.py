"""MEMO: layer input and attention output to host whole, the first alpha of every other skeletal
tensor's tokens too; the rest recomputed token-wise before the backward (`TokenOffload` with the
simulator policy's ``offload_fraction_other`` = alpha)."""

from __future__ import annotations

from memo_exec.activations.registry import register
from memo_exec.activations.token_offload import TokenOffload


@register("memo")
class Memo(TokenOffload):
    pass
