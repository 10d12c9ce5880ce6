"""``bf16``: the layer GEMMs in the model's own dtype (bf16 or fp16; fp32 for an fp32 model), no
casts and no quantised copies: every framework's default."""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

BF16 = FORMATS.add("bf16", GemmFormat(
    "bf16", "GEMMs in the model dtype (no quantisation)",
    ("every framework's default",)))
