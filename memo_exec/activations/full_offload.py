"""Full offload: every skeletal tensor of a layer goes to host after its forward and comes back
before its backward (`TokenOffload` with the simulator policy's offload fraction 1, nothing
recomputed)."""

from __future__ import annotations

from memo_exec.activations.registry import register
from memo_exec.activations.token_offload import TokenOffload


@register("full_offload")
class FullOffload(TokenOffload):
    pass
