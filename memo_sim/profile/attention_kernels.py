"""The attention kernels a layout can run (`memo_sim.layout.parallel.Layout.attention`), by name, with what each does
to a call's shape before its efficiency curves price it (`memo_sim.cost.kernel_time`) and how reports name it.

- ``flash``: FlashAttention-2, as flash-attn 2 and torch SDPA's flash backend run it (fused, causal, no score matrix
  in memory), at the profile's ``attention_fwd``/``attention_bwd`` curves.
- ``cudnn``: cuDNN's fused attention (TransformerEngine's FusedAttention, which TE prefers on Hopper and newer): the
  same memory as flash, its own curves where the profile gives them, else priced as flash.
- ``materialised``: Megatron-LM before FlashAttention, batched GEMMs over the whole s x s score matrix, a fused
  softmax, dropout (`memo_sim.cost.attention_kernel`).
- ``flash_triton``: FlashAttention's Triton kernel (Dao-AILab/flash-attention flash_attn/flash_attn_triton.py, 2022;
  Megatron-DeepSpeed's ``--use-flash-attn-triton`` imports it, megatron/model/transformer.py at cc3a94c6): the same
  memory as flash (output and log-sum-exp kept), its own curves where the profile gives them (no fallback: it runs
  at well under half FlashAttention-2's speed on an A100). It tiles the head dimension as a power of two
  (``BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)``, masked loads beyond d), so a call of head dim 96 does
  the work of head dim 128, and it asserts ``d <= 128`` ("FlashAttention only support head dimensions up to 128").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionKernel:
    name: str
    words: str  # how reports and exports name it
    pow2_head_dim: bool = False  # it runs the head dim padded to the next power of two (at least 16)
    max_head_dim: int = 0  # the largest head dim it runs (0: no limit memo knows of)
    fallback: str = ""  # the kernel whose curves price it where the profile has none of its own ("": none, refused)

    def priced_head_dim(self, head_dim: int) -> int:
        """The head dim a call of ``head_dim`` does the work of."""
        if not self.pow2_head_dim or head_dim <= 0:
            return head_dim
        return max(16, 1 << (head_dim - 1).bit_length())

    def why_not(self, head_dim: int) -> str | None:
        """Why the kernel cannot run a model of this (query-key) head dim, else None."""
        if self.max_head_dim and head_dim > self.max_head_dim:
            return (f"attention {self.name} ({self.words}) runs head dims up to {self.max_head_dim}; the model's is "
                    f"{head_dim}: use attention flash or cudnn")
        return None


_KERNELS = (
    AttentionKernel("flash", "FlashAttention-2"),
    AttentionKernel("cudnn", "cuDNN's fused attention", fallback="flash"),
    AttentionKernel("materialised", "materialised attention (the s x s scores)"),
    AttentionKernel("flash_triton", "FlashAttention's Triton kernel", pow2_head_dim=True, max_head_dim=128),
)
KERNELS = {k.name: k for k in _KERNELS}
ATTENTION_KERNELS = tuple(KERNELS)


def attention_kernel(name: str) -> AttentionKernel:
    """The kernel of this name (`ATTENTION_KERNELS`)."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KERNELS)}, got {name!r}") from None
