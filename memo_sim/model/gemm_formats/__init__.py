"""GEMM formats (``ModelConfig.gemm_format``), one module each, registered by name: the number
format the layer's linear GEMMs run in (`base` says what a format is and prices; the costs are
`memo_sim.cost.gemm_format`'s).

- ``bf16`` (`bf16`): the model dtype, no quantisation (the default);
- ``fp8-tensorwise`` (`fp8_tensorwise`): FP8 with a per-tensor scale from the current amax;
- ``fp8-rowwise`` (`fp8_rowwise`): FP8 with a scale per row of each operand (torchao's rowwise recipe);
- ``fp8-blockwise`` (`fp8_blockwise`): FP8 with 1x128 / 128x128 block scales (DeepSeek-V3);
- ``mxfp8`` (`mxfp8`): OCP MXFP8, 32-element blocks with E8M0 scales (Blackwell);
- ``nvfp4`` (`nvfp4`): NVIDIA's NVFP4, E2M1 with E4M3 scales per 16 elements and an fp32 one per tensor
  (Blackwell).

A new format is its module here (imported below), registering a `GemmFormat`; frameworks name the
formats each version offers (``precision.gemm_formats`` in `memo_sim/frameworks/data/`).
"""

from __future__ import annotations

from memo_sim.model.gemm_formats import bf16  # noqa: F401  (each module registers its format, in this order)
from memo_sim.model.gemm_formats import fp8_tensorwise  # noqa: F401
from memo_sim.model.gemm_formats import fp8_rowwise  # noqa: F401
from memo_sim.model.gemm_formats import fp8_blockwise  # noqa: F401
from memo_sim.model.gemm_formats import mxfp8  # noqa: F401
from memo_sim.model.gemm_formats import nvfp4  # noqa: F401
from memo_sim.model.gemm_formats.base import GemmFormat  # noqa: F401  (re-exported)
from memo_sim.model.gemm_formats.registry import FORMATS

GEMM_FORMATS: tuple[str, ...] = FORMATS.names()


def gemm_format(name: str) -> GemmFormat:
    """The format called ``name`` (a one-line `MemoError` listing the known ones otherwise)."""
    return FORMATS.get(name)
