"""``async_tp``: Megatron-style TP with sequence parallelism whose collectives are decomposed and
overlapped with the GEMM each feeds or drains, as PyTorch's "async" (micro-pipeline) tensor
parallelism runs it (torchtitan ``enable_async_tensor_parallel``, on by ``torch._inductor.config.
_micro_pipeline_tp`` with symmetric memory: the compiled graph's all-gather + matmul and matmul +
reduce-scatter pairs become ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, which
split the GEMM into one chunk per TP rank and move the shards by copy engine while the chunks run).

The layer's math, tensors and memory are Megatron TP+SP's; what differs is the time, priced once in
`memo_sim.cost.layer_time` for any flavour with ``async_collectives``: a TP collective the pass can
fuse runs beside its GEMM, the GEMM runs as ``tp`` chunks of ``1/tp`` of its tokens (each at its own
size on the efficiency curve) and its last chunk waits for the collective, so the pair takes
max(G (tp-1)/tp, C) + G/tp for GEMM chunks G and collective C (a lower bound for the reduce-scatter
side, whose last chunk's reduction follows the last chunk). The pass fuses an all-gather along the
tokens into the matmuls that read it as their left operand and a reduce-scatter of one matmul's
output: every pair of the forward (and of full recompute's second forward), but in the backward only
the all-gather of a row-parallel GEMM's output gradient into its data-gradient matmul; the backward's
reduce-scatters scatter a sum of data gradients (q, k and v; the FFN's two input GEMMs) and SP's
re-gathered input feeds the weight gradient on its contracted dimension, so those stay on the
critical path. torchtitan requires torch.compile for it.
The executor has no flavour of this name: it refuses such a plan in one line.
"""

from __future__ import annotations

from memo_sim.tp.base import TPFlavour
from memo_sim.tp.registry import FLAVOURS


class AsyncTP(TPFlavour):
    name = "async_tp"
    requires_sp = True
    min_tp = 2
    async_collectives = True
    executor = False
    spans_nodes = False
    across_nodes_refusal = ("memo prices async TP's decomposed collectives as copies between the GPUs of one node "
                            "(symmetric memory over NVLink), not over the inter-node links")

    def check(self, layout, model) -> str | None:
        if layout.tp < self.min_tp:
            return f"async TP decomposes the TP collectives: it needs a tensor-parallel degree of at least {self.min_tp}"
        if not layout.sp:
            return "async TP overlaps sequence parallelism's all-gathers and reduce-scatters: sp must be on"
        if layout.kernel_fusion == "eager":
            return ("async TP is a torch.compile pass (torch._inductor.config._micro_pipeline_tp): it needs compiled "
                    "blocks, not kernel_fusion eager")
        return None

    def label(self, layout) -> str:
        return f"tp{layout.tp}+sp+async"


ASYNC_TP = FLAVOURS.add(AsyncTP.name, AsyncTP())
