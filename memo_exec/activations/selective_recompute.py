"""Selective recompute (Korthikanti et al. 2022, sec. 5; Megatron-LM ``--recompute-granularity
selective``), as `memo_sim.policy.selective_recompute` prices it: every layer keeps its skeletal
tensors as under store all, but not the attention core's own state (the backend's lse; a
materialised kernel's scores are never kept), and re-runs the attention core from the kept q, k, v
before the layer's backward (`memo_exec.layer.LayerCompute.recompute_attention`): one attention
forward more per layer, the memory of store all less the lse.
"""

from __future__ import annotations

from memo_exec.activations.registry import register
from memo_exec.activations.store_all import StoreAll
from memo_exec.errors import ExecError


@register("selective_recompute")
class SelectiveRecompute(StoreAll):
    def device_bytes(self) -> dict[str, int]:
        return {**super().device_bytes(), "lse": self.lse_bytes_per_layer()}  # one layer's, while it is rebuilt

    def allocate(self) -> None:
        if self.compute is not None and not hasattr(self.compute, "recompute_attention"):
            raise ExecError(f"policy selective_recompute: the {type(self.compute).__name__} layer has no attention "
                            "core to re-run on its own; plan with tp_mode megatron or another policy")
        super().allocate()

    def after_forward(self, i: int) -> None:
        self.storages[i].aux = None  # the attention core's state is rebuilt before the backward

    def recompute(self, compute, weights, storage, i: int) -> None:
        compute.recompute_attention(weights, storage, i)

    def after_backward(self, i: int) -> None:
        self.storages[i].aux = None
