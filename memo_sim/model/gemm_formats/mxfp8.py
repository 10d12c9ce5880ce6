"""``mxfp8``: the OCP microscaling format: FP8 (E4M3) elements with one E8M0 (one-byte, power of
two) scale per 32 consecutive elements along the reduction dimension, which Blackwell's tensor
cores apply in hardware (peak key ``mxfp8``: profiles of GPUs without it refuse the format). Row-
wise and column-wise quantisations are separate copies (the scales run along K)."""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

MXFP8 = FORMATS.add("mxfp8", GemmFormat(
    "mxfp8", "MXFP8 GEMMs: E4M3 with one E8M0 scale per 32 elements (Blackwell)",
    ("Open Compute Project, OCP Microscaling Formats (MX) v1.0 Specification (2023): MXFP8, block of 32, "
     "E8M0 shared scale",
     "NVIDIA/Megatron-LM megatron/training/arguments.py: --fp8-recipe mxfp8 (TransformerEngine "
     "MXFP8BlockScaling)",
     "pytorch/torchtitan: MX training through torchao (mxfp8 recipe)"),
    peak="mxfp8", element_bytes=1, copies=2, amax_pass=False, scale_block=32, weight_scale_block=32, scale_bytes=1,
    needs="MX tensor cores (Blackwell B200/GB200 and newer)"))
