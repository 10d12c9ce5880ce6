"""Megatron-LM's ``--recompute-granularity selective --recompute-modules mlp`` for a dense model
(`memo_sim.policy.recompute_modules.RecomputeMlp`): every layer keeps store all's skeletal tensors but the MLP's
(the pre-MLP norm's output, fc1's and the activation's: TransformerEngine fuses that norm into fc1, so Megatron's
checkpoint of the MLP starts from the residual stream h1), which live in one shared buffer and are rebuilt from the
kept h1 before each layer's backward, fc2 with its reduce-scatter re-run too, as Megatron's checkpoint re-runs the
whole MLP forward (`memo_exec.layer.LayerCompute.recompute_mlp`). Dense models only (the simulator's policy says so
for a mixture of experts, whose blocks recompute_moe and recompute_norm_act rebuild).
"""

from __future__ import annotations

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.errors import ExecError
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes, written_skeletal

MLP = ("ln2", "fc1", "act")  # `memo_sim.cost.activations.RECOMPUTE_GROUPS["mlp"]`


@register("recompute_mlp")
class RecomputeMlp(ActivationPolicy):
    shares_buffers = True  # the rebuilt tensors' one buffer (`ActivationPolicy.buffer_block`)

    def __init__(self, *args) -> None:
        super().__init__(*args)
        names = written_skeletal(self.model)
        self._kept = tuple(n for n in names if n not in MLP)
        self._rebuilt = tuple(n for n in names if n in MLP)

    def _bytes(self, names) -> int:
        return storage_bytes(self.model, self.tokens, self.dtype, names, shapes=self.shapes)

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        return {"skeletal_resident": n * self._bytes(self._kept), "buffers": self._bytes(self._rebuilt),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        if getattr(self.model, "moe", False):
            raise ExecError(f"policy recompute_mlp re-runs a dense MLP: {self.model.name} is a mixture of experts "
                            "(plan recompute_moe or recompute_norm_act)")
        if self.compute is not None and not hasattr(self.compute, "recompute_mlp"):
            raise ExecError(f"policy recompute_mlp: the {type(self.compute).__name__} layer does not re-run its MLP "
                            "on its own; plan with tp_mode megatron or another policy")
        kb = self._bytes(self._kept)
        self.blocks = [self.layer_block(f"layer {i}", kb) for i in range(self.layers)]
        self.mlp_block = self.buffer_block("mlp", self._bytes(self._rebuilt))
        mlp = carve_storage(self.mlp_block, self.model, self.tokens, self.dtype, self._rebuilt, shapes=self.shapes)
        self.storages = [LayerStorage({**carve_storage(b, self.model, self.tokens, self.dtype, self._kept,
                                                       shapes=self.shapes), **mlp}, self._stats(f"stats {i}"))
                         for i, b in enumerate(self.blocks)]

    def recompute(self, compute, weights, storage, i: int) -> None:
        compute.recompute_mlp(weights, storage, i)
