"""Store-all and full-recompute policies."""

from __future__ import annotations

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.layer import SKELETAL, LayerStorage, LayerWeights, carve_storage, storage_bytes


class StoreAll(ActivationPolicy):
    """Every layer's skeletal tensors stay on the device (one preallocated block per layer)."""

    name = "store_all"

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal": n * storage_bytes(self.model, self.tokens, self.dtype),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        nb = storage_bytes(self.model, self.tokens, self.dtype)
        self.blocks = [torch.empty(nb, dtype=torch.uint8, device=self.device) for _ in range(self.layers)]
        self.storages = [LayerStorage(carve_storage(b, self.model, self.tokens, self.dtype), self._stats())
                         for b in self.blocks]

    def output_for(self, i: int) -> torch.Tensor | None:
        return self.storages[i + 1].x if i + 1 < self.layers else None


class FullRecompute(ActivationPolicy):
    """Each layer keeps its input; one shared buffer set is rebuilt before each layer's backward."""

    name = "full_recompute"
    _work_names = tuple(n for n in SKELETAL if n != "x")

    def device_bytes(self) -> dict[str, int]:
        return {"layer_inputs": self.layers * storage_bytes(self.model, self.tokens, self.dtype, ("x",)),
                "recompute_buffer": storage_bytes(self.model, self.tokens, self.dtype, self._work_names),
                "norm_stats": self._stats_bytes(), "lse": self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        xb = storage_bytes(self.model, self.tokens, self.dtype, ("x",))
        self.x_block = torch.empty(self.layers * xb, dtype=torch.uint8, device=self.device)
        xs = [carve_storage(self.x_block[i * xb:(i + 1) * xb], self.model, self.tokens, self.dtype, ("x",))["x"]
              for i in range(self.layers)]
        self.work_block = torch.empty(storage_bytes(self.model, self.tokens, self.dtype, self._work_names),
                                      dtype=torch.uint8, device=self.device)
        work = carve_storage(self.work_block, self.model, self.tokens, self.dtype, self._work_names)
        stats = self._stats()
        self.storages = [LayerStorage({**work, "x": xs[i]}, stats) for i in range(self.layers)]

    def output_for(self, i: int) -> torch.Tensor | None:
        return self.storages[i + 1].x if i + 1 < self.layers else None

    def after_forward(self, i: int) -> None:
        self.storages[i].aux = None  # the attention lse is rebuilt with everything else

    def storage_for_backward(self, i: int, weights: LayerWeights) -> LayerStorage:
        s = self.storages[i]
        self.compute.recompute_full(weights, s, i)
        return s

    def after_backward(self, i: int) -> None:
        self.storages[i].aux = None
