"""``fp8-tensorwise``: FP8 GEMMs with one scale per tensor computed from the tensor itself
("current scaling"): E4M3 in forward, E5M2 for gradients (the "hybrid" format). The amax is a
reduction over the whole tensor, so the cast reads its input twice (amax, then cast); the cast
writes the row-wise and the transposed copy Hopper's tensor cores need (one copy on Blackwell under
TransformerEngine: ``transposed_copy``, `memo_sim.cost.gemm_format.for_profile`)."""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

FP8_TENSORWISE = FORMATS.add("fp8-tensorwise", GemmFormat(
    "fp8-tensorwise", "FP8 GEMMs, one scale per tensor from its current amax (E4M3 forward, E5M2 gradients)",
    ("NVIDIA/Megatron-LM megatron/training/arguments.py: --fp8-format {e4m3,hybrid}, --fp8-recipe "
     "{tensorwise,delayed,mxfp8,blockwise}",
     "NVIDIA/TransformerEngine: Float8CurrentScaling recipe (amax of the tensor, then the cast; fused cast-transpose)",
     "pytorch/torchtitan: Float8 training through torchao's Float8Linear, recipe 'tensorwise'"),
    peak="fp8", element_bytes=1, copies=2, transposed_copy=True, amax_pass=True, scale_block=0, weight_scale_block=0,
    scale_bytes=4, needs="FP8 tensor cores (Hopper H100/H200 and newer)"))
