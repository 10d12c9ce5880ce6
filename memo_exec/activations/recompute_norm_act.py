"""Megatron-LM's ``--recompute-granularity selective --recompute-modules layernorm moe_act``
(`memo_sim.policy.recompute_modules.RecomputeNormAct`): every layer keeps store all's skeletal tensors but the two
norms' outputs Megatron rebuilds, which live in one shared buffer and are rebuilt before each layer's backward
(as `memo_exec.activations.recompute_moe`), and each MoE block keeps its autograd graph, as under store all, but
the routed experts' activation output (``eact``): the experts' second GEMM keeps how to rebuild it from their first
GEMM's output, which the activation's backward keeps anyway, and the backward recomputes the activation when it
reads it (`memo_exec.moe.experts.rebuilt_act`), as Megatron-Core's experts checkpoint their activation alone.
"""

from __future__ import annotations

from memo_exec.activations.recompute_moe import RecomputeMoe
from memo_exec.activations.registry import register

REBUILT = ("eact",)  # the MoE block's kept tensors this policy rebuilds (`memo_exec.moe.memory.graph_bytes`)


@register("recompute_norm_act")
class RecomputeNormAct(RecomputeMoe):
    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        # the buffers: the norms' shared one and, while a MoE layer's backward runs, its rebuilt activation output
        # (the simulator's recompute buffer holds both: `memo_sim.policy.recompute_modules`)
        return {"skeletal_resident": self._kept_bytes() + self.moe_kept_bytes(lambda i: True, REBUILT),
                "buffers": self._bytes(self.norms) + sum(self.moe_graph_part(name) for name in REBUILT),
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    def allocate(self) -> None:
        super().allocate()
        for st in self.storages:  # the block's graph, less the experts' activation output, over the rebuilt ln2
            st.keep_moe_internals = st.moe_recompute_act = st.ln2_rebuilt = True
