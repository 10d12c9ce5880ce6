"""Store all: every layer's skeletal tensors stay on the device (one preallocated block per layer).

On a MoE layer the block keeps its internal activations, its autograd graph, beside that storage
(`memo_exec.moe.block`; counted in ``skeletal_resident``: `memo_exec.moe.memory`), and the layer's storage has
no fc1 and act (`ActivationPolicy.layer_names`: its block writes neither; a model mixing dense and MoE layers gave
every layer a dense layer's, DeepSeek-V3's 58 MoE layers each a dense FFN's fc1 and act of width 18432 unused).
"""

from __future__ import annotations

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes, written_skeletal


@register("store_all")
class StoreAll(ActivationPolicy):
    def _names(self, i: int) -> tuple[str, ...]:
        """The skeletal tensors layer ``i``'s block holds: those it writes."""
        return self.layer_names(written_skeletal(self.model), i)

    def _layer_bytes(self, i: int) -> int:
        return storage_bytes(self.model, self.tokens, self.dtype, self._names(i), shapes=self.shapes)

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal_resident": sum(self._layer_bytes(i) for i in range(n)) + self.moe_kept_bytes(lambda i: True),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        self.blocks = [self.layer_block(f"layer {i}", self._layer_bytes(i)) for i in range(self.layers)]
        self.storages = [LayerStorage(carve_storage(b, self.model, self.tokens, self.dtype, self._names(i),
                                                    shapes=self.shapes), self._stats(f"stats {i}"))
                         for i, b in enumerate(self.blocks)]
        for st in self.storages:  # a MoE block keeps its internal activations (its autograd graph) too
            st.keep_moe_internals = True
