"""Store all: every layer's skeletal tensors stay on the device (one preallocated block per layer)."""

from __future__ import annotations

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes


@register("store_all")
class StoreAll(ActivationPolicy):
    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal_resident": n * storage_bytes(self.model, self.tokens, self.dtype, shapes=self.shapes),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        nb = storage_bytes(self.model, self.tokens, self.dtype, shapes=self.shapes)
        self.blocks = [torch.empty(nb, dtype=torch.uint8, device=self.device) for _ in range(self.layers)]
        self.storages = [LayerStorage(carve_storage(b, self.model, self.tokens, self.dtype, shapes=self.shapes),
                                      self._stats()) for b in self.blocks]
        for st in self.storages:  # a MoE block keeps its internal activations (its autograd graph) too
            st.keep_moe_internals = True
