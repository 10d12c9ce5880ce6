"""``nvfp4``: NVIDIA's 4-bit recipe (TransformerEngine's ``NVFP4BlockScaling``, Megatron-LM's ``--fp4-format e2m1
--fp4-recipe nvfp4``): E2M1 elements (half a byte) with two levels of scale, one FP8 E4M3 scale (one byte) per 16
consecutive elements along the reduction dimension and one fp32 scale per tensor from the tensor's amax, which
Blackwell's FP4 tensor cores apply in hardware (peak key ``fp4``: the datasheets' dense FP4 rate; profiles of GPUs
without it refuse the format).

As TransformerEngine runs it (docs/features/low_precision_training/nvfp4 and ``NVFP4Quantizer::quantize_impl``):

- an input or an output gradient is read three times: one kernel (``nvte_hadamard_transform_amax``) takes the
  per-tensor amax of the row-wise operand and of the Hadamard-rotated column-wise one (``amax_pass``), the cast
  (``nvte_quantize_v2``) writes the row-wise copy, and a kernel of its own
  (``nvte_hadamard_transform_cast_fusion_columnwise``) rotates the tensor by a 16 x 16 random Hadamard transform
  and writes the column-wise copy the weight gradient reads (``separate_columnwise_cast``; NVFP4 GEMMs take the
  TN layout only, so that copy is a transposed one: ``copies`` 2); the gradients are rounded stochastically there
  (no bytes of their own);
- a weight has no rotation: its amax, then one cast writes both copies (two reads). Its scales are 2D (one value
  per 16 x 16 block, so the two copies agree), stored as the 1D ones are, one E4M3 byte per 16 elements of each
  copy (the quantiser's scale shape does not depend on 2D scaling): ``weight_scale_block`` 16.

The copy a framework keeps of a GEMM input for the weight gradient (TransformerEngine's) is half a byte an element
and its E4M3 scales (`GemmFormat.saved_element_bytes`: 0.5625 bytes).

Not modelled: ``--fp4-param-gather`` (parameters kept and all-gathered in NVFP4), layers kept in bf16
(``--first-last-layers-bf16``): the frameworks' ``not_modelled`` say so where they offer the format.
"""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

NVFP4 = FORMATS.add("nvfp4", GemmFormat(
    "nvfp4", "NVFP4 GEMMs: E2M1 with an E4M3 scale per 16 elements (one per 16 x 16 block of a weight) and an fp32 "
    "one per tensor (Blackwell)",
    ("NVIDIA/TransformerEngine docs/features/low_precision_training/nvfp4/nvfp4.rst: E2M1, an FP8 E4M3 scale per 16 "
     "consecutive elements and an FP32 scale per tensor; 2D 16x16 weight scaling by default; random Hadamard "
     "transform on the column-wise (wgrad) copies of inputs and gradients; stochastic rounding of gradients; TN "
     "layout only",
     "NVIDIA/TransformerEngine transformer_engine/pytorch/csrc/quantizer.cpp NVFP4Quantizer::quantize_impl: "
     "nvte_hadamard_transform_amax (row-wise and rotated column-wise amax in one kernel), nvte_quantize_v2 (the "
     "row-wise copy), nvte_hadamard_transform_cast_fusion_columnwise (the rotated column-wise copy); a weight: its "
     "amax, then one cast of both copies",
     "NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py at d98e8a64: fp4 (--fp4-format e2m1), "
     "fp4_recipe nvfp4 (NVFP4BlockScaling, TransformerEngine >= 2.7)"),
    peak="fp4", element_bytes=0.5, copies=2, amax_pass=True, separate_columnwise_cast=True, scale_block=16,
    weight_scale_block=16, scale_bytes=1, needs="FP4 tensor cores (Blackwell B200/GB200 and newer)"))
