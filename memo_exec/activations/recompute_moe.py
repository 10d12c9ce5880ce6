"""Megatron-LM's ``--recompute-granularity selective --recompute-modules layernorm moe``
(`memo_sim.policy.recompute_modules.RecomputeMoe`): every layer keeps store all's skeletal tensors
but the norms' outputs Megatron rebuilds (`memo_sim.model.layer_graph.separate_norms`: the pre-MLP norm's, and the
input norm's under multi-latent attention, whose input norm is a module of its own), which live in one shared buffer
and are rebuilt from the kept h1 (and x) before each layer's backward
(`memo_exec.layer.LayerCompute.recompute_norms`), and the MoE block
keeps only its routing: its backward re-runs the block's forward (router, dispatch, experts,
combine, the all-to-alls too) from the rebuilt ln2 (`memo_exec.moe.block`).
``recompute_norm_act`` (``layernorm moe_act``: the experts' activation alone rebuilt inside the
block) is its own module, `memo_exec.activations.recompute_norm_act`.
"""

from __future__ import annotations

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.errors import ExecError
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes, written_skeletal
from memo_sim.model.layer_graph import separate_norms


@register("recompute_moe")
class RecomputeMoe(ActivationPolicy):
    shares_buffers = True  # the rebuilt tensors' one buffer (`ActivationPolicy.buffer_block`)

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.norms = separate_norms(self.model)  # the rebuilt norms' outputs
        self._kept = tuple(n for n in written_skeletal(self.model) if n not in self.norms)

    def _bytes(self, names) -> int:
        return storage_bytes(self.model, self.tokens, self.dtype, names, shapes=self.shapes)

    def _kept_at(self, i: int) -> tuple[str, ...]:
        """What layer ``i`` keeps: `_kept` less fc1 and act on a MoE layer (`ActivationPolicy.layer_names`)."""
        return self.layer_names(self._kept, i)

    def _kept_bytes(self) -> int:
        return sum(self._bytes(self._kept_at(i)) for i in range(self.layers))

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal_resident": self._kept_bytes() + self.moe_kept_bytes(),  # MoE: the routing only
                "buffers": self._bytes(self.norms),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        if self.compute is not None and not hasattr(self.compute, "recompute_norms"):
            raise ExecError(f"policy recompute_moe: the {type(self.compute).__name__} layer does not rebuild its norms "
                            "on their own; plan with tp_mode megatron or another policy")
        self.blocks = [self.layer_block(f"layer {i}", self._bytes(self._kept_at(i))) for i in range(self.layers)]
        self.norm_block = self.buffer_block("norms", self._bytes(self.norms))
        norms = carve_storage(self.norm_block, self.model, self.tokens, self.dtype, self.norms, shapes=self.shapes)
        self.storages = [LayerStorage({**carve_storage(b, self.model, self.tokens, self.dtype, self._kept_at(i),
                                                       shapes=self.shapes), **norms}, self._stats(f"stats {i}"))
                         for i, b in enumerate(self.blocks)]  # keep_moe_internals stays False: its routing only

    def recompute(self, compute, weights, storage, i: int) -> None:
        compute.recompute_norms(weights, storage, i, self.norms)
