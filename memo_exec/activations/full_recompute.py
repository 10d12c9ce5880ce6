"""Full recompute: each layer keeps its input; one shared buffer set is rebuilt before each
layer's backward by re-running the layer forward (attention included)."""

from __future__ import annotations

from memo_exec.activations.base import RECOMPUTE_BUFFER_DIFFERS, ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.layer import SKELETAL, LayerStorage, carve_storage, storage_bytes


@register("full_recompute")
class FullRecompute(ActivationPolicy):
    _work_names = tuple(n for n in SKELETAL if n != "x")
    shares_buffers = True
    allocator_differs = RECOMPUTE_BUFFER_DIFFERS

    def device_bytes(self) -> dict[str, int]:
        x = storage_bytes(self.model, self.tokens, self.dtype, ("x",), shapes=self.shapes)
        return {"skeletal_resident": self.layers * x + self.moe_kept_bytes(),  # a MoE layer's routing
                "buffers": storage_bytes(self.model, self.tokens, self.dtype, self._work_names, shapes=self.shapes),
                "norm_stats": self._stats_bytes(), "lse": self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        xb = storage_bytes(self.model, self.tokens, self.dtype, ("x",), shapes=self.shapes)
        self.x_block = self.layer_block("x", self.layers * xb)  # a slot's smaller instance: a prefix
        xs = [carve_storage(self.x_block[i * xb:(i + 1) * xb], self.model, self.tokens, self.dtype, ("x",),
                            shapes=self.shapes)["x"] for i in range(self.layers)]
        self.work_block = self.buffer_block("recompute", storage_bytes(self.model, self.tokens, self.dtype,
                                                                       self._work_names, shapes=self.shapes))
        work = carve_storage(self.work_block, self.model, self.tokens, self.dtype, self._work_names, shapes=self.shapes)
        self.recompute_work = work
        stats = self._stats()
        self.storages = [LayerStorage({**work, "x": xs[i]}, stats) for i in range(self.layers)]

    def after_forward(self, i: int) -> None:
        self.storages[i].aux = None  # the attention lse is rebuilt with everything else

    def recompute(self, compute, weights, storage, i: int) -> None:
        compute.recompute_full(weights, storage, i)

    def after_backward(self, i: int) -> None:
        self.storages[i].aux = None
