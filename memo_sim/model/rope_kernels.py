"""The rotary embedding's kernels (``Layout.rope``): how a framework turns each query and key head by its position,
in every layer, before the attention kernel (the layer graph's ``rope`` op, `memo_sim.model.layer_graph`).

- ``none``: the framework runs no rotary op. memo's own executor (its layers encode no positions:
  `memo_exec.report` says so beside a plan that prices one), and Megatron-LM before its rotary embedding (2023-07,
  c156ab1ee4 'Cleanup RoPE arguments'), which had learned absolute positions only.
- ``fused``: one hand-written kernel per tensor each way, reading the head rows and writing them once: Megatron-LM's
  rope fusion (``apply_rope_fusion``, on unless ``--no-rope-fusion``, since 2d0218279a 'add knob for rope fusion',
  2023-11-19; TransformerEngine's fused_apply_rotary_pos_emb), 2 x the element's bytes forward and as many backward.
- ``hf``: transformers' ``apply_rotary_pos_emb`` in eager PyTorch, a kernel per tensor op (XTuner's Hugging Face
  layers; Megatron-LM's unfused formula is the same one): counted, `memo_sim.model.eager_kernels`.
- ``complex``: torchtitan's ``apply_rotary_emb`` in eager PyTorch (an fp32 complex multiply): counted likewise.

A compiled block (``Layout.kernel_fusion`` ``compiled``) runs an eager formula as one Inductor kernel per tensor:
priced as ``fused`` (the projection before it and the attention kernel after it are extern kernels to Inductor, so
nothing else joins it). The model says whether there is anything to turn (``ModelConfig.positions``: a learned
position table has no op in the layers) and how much: the rotary share of each head (``rotary_fraction``), the
layers without one (``nope_period``, averaged over the layers as the simulator prices one repeated layer), and
under latent attention the ``qk_rope_dim`` part of each query head and the one rope key all heads share.

Not modelled: the position tables' own build (transformers' LlamaRotaryEmbedding computes cos and sin in every
layer in the XTuner version the published rows cite: an fp32 pass over seq x head_dim, about 1 / (query + key
heads) of the op's bytes), and the partial-rotary formulas' split and concatenation of each head.
"""

from __future__ import annotations

from memo_sim.model.config import ModelConfig
from memo_sim.model.eager_kernels import EAGER_OPS, EagerOp

ROPE_KERNELS = ("none", "fused", "hf", "complex")
# the eager formulas' counted kernels (`memo_sim.model.eager_kernels`)
_EAGER = {"hf": "rope_hf", "complex": "rope_complex"}


def rope_kernel(rope: str, kernel_fusion: str) -> str:
    """The kernel a layout's rotary op runs: its framework's (``rope``), one fused kernel in a compiled block."""
    return "fused" if kernel_fusion == "compiled" and rope != "none" else rope


def rope_counts(kernel: str, dtype_bytes: int) -> EagerOp | None:
    """Bytes per element of the turned heads and kernels per tensor, forward and backward, of ``kernel``
    (`rope_kernel`'s); None for ``none``."""
    if kernel == "none":
        return None
    if kernel == "fused":  # read the rows, write them: each way
        return EagerOp(2.0 * dtype_bytes, 1, 2.0 * dtype_bytes, 1, 0.0)
    return EAGER_OPS[(_EAGER[kernel], 4 if dtype_bytes >= 4 else 2)]


def rotary_layer_share(model: ModelConfig) -> float:
    """The share of the layers with a rotary embedding: all but every ``nope_period``-th (0 for learned positions)."""
    if model.positions != "rotary":
        return 0.0
    n = model.nope_period
    return 1.0 - (model.layers // n) / model.layers if n else 1.0


def rotary_widths(model: ModelConfig) -> tuple[int, int]:
    """(query, key) elements a token's rotary op turns in a rotary layer, over every head: each query head's and each
    K/V head's rotary part (``rotary_fraction`` of the head, all of it at 0); under latent attention the rope part of
    each query head and the one shared rope key."""
    if model.mla:
        return model.heads * model.qk_rope_dim, model.qk_rope_dim
    per_head = model.qk_head_dim * (model.rotary_fraction or 1.0)
    return round(model.heads * per_head), round(model.n_kv_heads * per_head)
