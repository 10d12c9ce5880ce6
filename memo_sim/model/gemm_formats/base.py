"""What a GEMM format is: the number format a layer's linear GEMMs (QKV, output projection, the
FFN's two) run in, and what running them in it moves and keeps beside the GEMMs.

A quantised format (FP8) runs the forward GEMM and both backward GEMMs (data gradient, weight
gradient) at the profile's ``peak`` for it, on operands of ``element_bytes``, and pays for it:

- **casts**: each GEMM's input activation is quantised in forward, and in backward its output
  gradient and (memo keeps the high-precision input for backward, as torchao's Float8Linear does)
  its input again for the weight gradient: a read of the high-precision tensor (a second one first for the amax where the
  scale is computed from the tensor itself before the cast: ``amax_pass``) and a write of
  ``copies`` quantised copies with their scales. Hopper's FP8 tensor cores take only the
  "TN" layout, so the weight-gradient GEMM needs the transposed input and gradient, and the
  data-gradient GEMM the transposed weight: TransformerEngine's fused cast-transpose writes both
  (``copies`` = 2); MXFP8's scales run along the reduction dimension, so its row-wise and
  column-wise quantisations are two copies too. Blackwell's FP8 GEMMs take any layout, so a per-tensor-scaled
  format's second copy, a plain transpose (``transposed_copy``), is not written there where the framework's library
  knows it (``ModelConfig.fp8_transposes``, `memo_sim.cost.gemm_format.for_profile`).
- **weights**: the quantised copies of every linear weight (``copies`` of them with scales)
  are kept across the iteration's micro-batches and re-cast once per step, after the optimizer
  updates the high-precision weights (memory: `memo_sim.cost.gemm_format.weight_cache_bytes`;
  time: the step's extra bytes).
- **scales**: one fp32 scale per tensor (``scale_block`` 0), or one per ``scale_block``
  consecutive elements along the reduction dimension (``scale_bytes`` each): 1 x 128 tiles of
  activations and 128 x 128 blocks of weights for DeepSeek-V3's blockwise recipe, 32-element
  blocks with E8M0 (one byte) scales for MXFP8.

What stays in the model dtype: the attention core (FlashAttention), the norms and elementwise
ops, the embedding, the classifier (the output layer), and the gradient and optimizer states
(the precision recipe, `memo_sim.model.precision`). Which copy of a GEMM input backward reads is the
framework's (``ModelConfig.fp8_saved_inputs``, `memo_sim.model.layer_graph.FP8_SAVED_INPUTS`):
TransformerEngine keeps the quantised copy, torchao's Float8Linear the high-precision tensor (then
cast again in backward). Whether sequence parallelism all-gathers a GEMM input's quantised copy is
the framework's too (``ModelConfig.fp8_sp_gathers``: torchao's Float8 TP styles cast a column-parallel
GEMM's input before the forward's gather and a row-parallel GEMM's output gradient before the backward's, each on
the rank's sequence shard: `memo_sim.cost.gemm_format.fp8_gather_shards`). Not modelled yet (said in each framework's ``not_modelled`` where it runs FP8): FP8
all-gathers of FSDP parameters, delayed scaling's amax history, TransformerEngine's FP8 gathers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmFormat:
    name: str
    summary: str
    sources: tuple[str, ...]
    peak: str | None = None  # the profile's peak key for the layer GEMMs; None: the model's dtype
    element_bytes: float = 0.0  # bytes per quantised element (0: not quantised; NVFP4's E2M1: 0.5)
    copies: int = 0  # quantised copies a cast writes (row-wise and column-wise / transposed)
    # the second copy is the first one transposed (a per-tensor scale: the same numbers), which only a GPU whose FP8
    # GEMMs take the TN layout alone needs (module docs); a per-row or per-block scale makes it a copy of its own
    transposed_copy: bool = False
    amax_pass: bool = False  # the scale needs the tensor's amax first: one more read before the cast
    # an activation's or gradient's column-wise copy is written by a kernel of its own, which reads the tensor again
    # (NVFP4's Hadamard-rotated copy for the weight gradient); a weight's copies come from one cast
    separate_columnwise_cast: bool = False
    scale_block: int = 0  # activation / gradient elements per scale along the reduction dim (0: per tensor)
    weight_scale_block: int = 0  # weight elements per scale (0: per tensor)
    scale_bytes: int = 4  # bytes per scale (fp32; MXFP8's E8M0 and NVFP4's E4M3: 1)
    needs: str = ""  # which GPUs have the tensor cores, for the refusal
    # a format whose kernels run another's tensor-core work and more (fp8-blockwise: tensorwise FP8's MMAs plus
    # a scale per block): where the profile measured no curve of its own, it runs no faster than that one's
    no_faster_than: str | None = None

    @property
    def quantised(self) -> bool:
        return self.peak is not None

    def quantised_bytes(self, elements: float, weight: bool = False) -> float:
        """Bytes of ``copies`` quantised copies of ``elements`` elements with their scales."""
        block = self.weight_scale_block if weight else self.scale_block
        scales = elements / block * self.scale_bytes if block else self.scale_bytes
        return self.copies * (elements * self.element_bytes + scales)

    def cast_output_bytes(self, elements: float) -> float:
        """Bytes one cast of an activation or an output gradient of ``elements`` elements writes beside its
        high-precision input and holds while its GEMMs run: its ``copies`` quantised copies with their scales (two
        1-byte copies for FP8 on Hopper, the row-wise and the column-wise / transposed one: TransformerEngine's
        quantiser with both usages in transformer_engine/pytorch/module/linear.py ``_Linear.forward``, which drops
        the row-wise one after the GEMM, ``inputmat.update_usage(rowwise_usage=False)``, keeping the column-wise one
        for the weight gradient; one where ``transposed_copy`` is dropped, `memo_sim.cost.gemm_format.for_profile`).
        The one place that says it: the traces' cast tensors (`memo_sim.cost.gemm_format.gemm_cast_buffers`)."""
        return self.quantised_bytes(elements) if self.quantised else 0.0

    def cast_bytes(self, elements: float, hp_bytes: int, weight: bool = False) -> float:
        """HBM bytes of quantising ``elements`` elements of ``hp_bytes`` each: the reads (one more with an
        amax pass, and one more where an activation's column-wise copy has its own kernel) and the quantised
        copies written."""
        if not self.quantised:
            return 0.0
        reads = 1 + self.amax_pass + (self.separate_columnwise_cast and not weight)
        return elements * hp_bytes * reads + self.quantised_bytes(elements, weight)

    @property
    def saved_element_bytes(self) -> float:
        """Bytes per element of the one quantised copy a framework keeps of a GEMM input for its weight gradient
        (`memo_sim.model.layer_graph.FP8_SAVED_INPUTS`): the element and its share of the block scales (a per-tensor
        scale counts nothing)."""
        return self.element_bytes + (self.scale_bytes / self.scale_block if self.scale_block else 0.0)
