"""Store all: every layer's skeletal tensors stay on the device (one preallocated block per layer).

On a MoE layer the block keeps its internal activations, its autograd graph, beside that storage
(`memo_exec.moe.block`; counted in ``skeletal_resident``: `memo_exec.moe.memory`), and where every layer is
a MoE layer the storage has no fc1 and act (`memo_exec.layer.written_skeletal`: no layer writes them).
"""

from __future__ import annotations

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes, written_skeletal


@register("store_all")
class StoreAll(ActivationPolicy):
    def _names(self) -> tuple[str, ...]:
        """The skeletal tensors each layer's block holds: those some layer of the model writes."""
        return written_skeletal(self.model)

    def _layer_bytes(self) -> int:
        return storage_bytes(self.model, self.tokens, self.dtype, self._names(), shapes=self.shapes)

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal_resident": n * self._layer_bytes() + self.moe_kept_bytes(lambda i: True),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        names = self._names()
        self.blocks = [torch.empty(self._layer_bytes(), dtype=torch.uint8, device=self.device)
                       for _ in range(self.layers)]
        self.storages = [LayerStorage(carve_storage(b, self.model, self.tokens, self.dtype, names, shapes=self.shapes),
                                      self._stats()) for b in self.blocks]
        for st in self.storages:  # a MoE block keeps its internal activations (its autograd graph) too
            st.keep_moe_internals = True
