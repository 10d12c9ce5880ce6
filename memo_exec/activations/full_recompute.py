"""Full recompute: each layer keeps its input; one shared buffer set is rebuilt before each
layer's backward by re-running the layer forward (attention included).

A MoE layer's block keeps only its routing through the re-run too (``keep_moe_internals`` stays False), so its
backward re-runs the block once more under autograd (`memo_exec.moe.block.MoEBlock.backward`, ``saved.graph is
None``): that graph, one layer's at a time, is the rebuilt layer's MoE part, counted in ``buffers`` beside the work
buffer (`ActivationPolicy.moe_graph_bytes`, the sizes `memo_exec.moe.memory.graph_bytes` gives the block's
tensors), as the simulator's recompute buffer holds the whole rebuilt layer (a review: left out, -37% on a
qwen3-30b-a3b toy). The work buffer holds no fc1 / act where every layer is a MoE layer (`FullRecompute.work_names`:
the block keeps its own; the simulator's MoE layer has neither).
"""

from __future__ import annotations

from memo_exec.activations.base import RECOMPUTE_BUFFER_DIFFERS, ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.layer import LayerStorage, carve_storage, skeletal_names, storage_bytes


@register("full_recompute")
class FullRecompute(ActivationPolicy):
    shares_buffers = True
    allocator_differs = RECOMPUTE_BUFFER_DIFFERS

    @property
    def work_names(self) -> tuple[str, ...]:
        """The work buffer's tensors: every skeletal tensor but x that some layer of this instance writes, fc1 and
        act only where one may be a dense layer (a MoE layer's block keeps its own: `ActivationPolicy.layer_names`;
        a review: a MoE model's buffer held a dense FFN's fc1 and act that no layer wrote)."""
        every = tuple(n for n in skeletal_names(self.model) if n != "x")
        written = {n for i in range(self.layers) for n in self.layer_names(every, i)}
        return tuple(n for n in every if n in written)

    def device_bytes(self) -> dict[str, int]:
        x = storage_bytes(self.model, self.tokens, self.dtype, ("x",), shapes=self.shapes)
        return {"skeletal_resident": self.layers * x + self.moe_kept_bytes(),  # a MoE layer's routing
                "buffers": storage_bytes(self.model, self.tokens, self.dtype, self.work_names, shapes=self.shapes)
                + self._rebuilt_moe_bytes(),
                "norm_stats": self._stats_bytes(), "lse": self.lse_bytes_per_layer()}

    def _rebuilt_moe_bytes(self) -> int:
        """One MoE block's graph beyond its routing, built in its layer's backward (module docs), where some layer
        of this instance may be a MoE layer (a pipeline chunk is bound to its layers after the estimate: any run
        of this many layers), else 0."""
        m = self.model
        if not m.moe:
            return 0
        bases = [self.layer_base] if self.layers >= m.layers else range(m.layers - self.layers + 1)
        if not any(self.moe_layer(b + i) for b in bases for i in range(self.layers)):
            return 0
        return self.moe_graph_bytes()

    def allocate(self) -> None:
        xb = storage_bytes(self.model, self.tokens, self.dtype, ("x",), shapes=self.shapes)
        self.x_block = self.layer_block("x", self.layers * xb)  # a slot's smaller instance: a prefix
        xs = [carve_storage(self.x_block[i * xb:(i + 1) * xb], self.model, self.tokens, self.dtype, ("x",),
                            shapes=self.shapes)["x"] for i in range(self.layers)]
        names = self.work_names
        self.work_block = self.buffer_block("recompute", storage_bytes(self.model, self.tokens, self.dtype, names,
                                                                       shapes=self.shapes))
        work = carve_storage(self.work_block, self.model, self.tokens, self.dtype, names, shapes=self.shapes)
        self.recompute_work = work
        stats = self._stats()
        self.storages = [LayerStorage({**work, "x": xs[i]}, stats) for i in range(self.layers)]

    def after_forward(self, i: int) -> None:
        self.storages[i].aux = None  # the attention lse is rebuilt with everything else

    def recompute(self, compute, weights, storage, i: int) -> None:
        compute.recompute_full(weights, storage, i)

    def after_backward(self, i: int) -> None:
        self.storages[i].aux = None
