"""``fp8-blockwise``: FP8 GEMMs with fine-grained scales as DeepSeek-V3 trained: one fp32 scale per
1 x 128 tile of activations and gradients and per 128 x 128 block of weights, computed inside
the cast kernel (no separate amax pass); two quantised copies (row-wise and transposed). Its GEMMs run
tensorwise FP8's MMAs and apply a scale per 128-element block of the reduction (in the main loop on
Hopper): the Hopper profiles' ``fp8-blockwise`` curve is their tensorwise one over the block-wise kernel's time per
tensorwise time on the same shapes in one run on an H200 (torch._scaled_mm on cuBLASLt's 1x128 / 128x128 scale modes:
1.10x at 1e11-2e11 FLOPs to 1.16x at 4e12, 2026-12-04: benchmarks/gpu/hopper_curves.py); on a profile with no blockwise
curve of its own they run no faster than its tensorwise one (`GemmFormat.no_faster_than`; a user's review,
2026-11-27: priced on the bf16 curve's fractions they came out faster than tensorwise on every Hopper profile)."""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

FP8_BLOCKWISE = FORMATS.add("fp8-blockwise", GemmFormat(
    "fp8-blockwise", "FP8 GEMMs, 1x128 activation tiles and 128x128 weight blocks (DeepSeek-V3)",
    ("DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv 2412.19437), sec. 3.3: fine-grained quantisation, "
     "1x128 tiles for activations, 128x128 blocks for weights, FP8 Fprop, Dgrad and Wgrad",
     "NVIDIA/Megatron-LM megatron/training/arguments.py: --fp8-recipe blockwise (TransformerEngine "
     "Float8BlockScaling)"),
    peak="fp8", element_bytes=1, copies=2, amax_pass=False, scale_block=128, weight_scale_block=128 * 128,
    scale_bytes=4, needs="FP8 tensor cores (Hopper H100/H200 and newer)", no_faster_than="fp8-tensorwise"))
