"""The caching-allocator model's settings: PyTorch's size constants and rounding rules
(`memo_sim.memplan.caching_allocator` describes the model)."""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.errors import MemoError

MiB = 1 << 20

# PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp).
K_MIN_BLOCK_SIZE = 512  # every size is rounded up to a multiple of this
K_SMALL_SIZE = 1 * MiB  # largest "small" request
K_SMALL_BUFFER = 2 * MiB  # small segments, and expandable small-pool pages
K_LARGE_BUFFER = 20 * MiB  # segments for 1-10 MiB requests, and expandable large-pool pages
K_MIN_LARGE_ALLOC = 10 * MiB  # requests below this (and > 1 MiB) get a kLargeBuffer segment
K_ROUND_LARGE = 2 * MiB  # larger requests get a segment rounded up to this


@dataclass(frozen=True)
class AllocatorConfig:
    """Settings of the modelled allocator.

    ``capacity_bytes`` is the device memory the allocator may reserve (total memory minus the
    CUDA context, NCCL buffers and anything else outside the allocator).
    ``max_split_size_bytes`` is ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`` in bytes (``None``:
    unlimited, PyTorch's default); PyTorch requires it to exceed ``kLargeBuffer``.
    The remaining fields are PyTorch's constants; change them only to study variants.
    """

    capacity_bytes: int
    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    min_block_size: int = K_MIN_BLOCK_SIZE
    small_size: int = K_SMALL_SIZE
    small_buffer: int = K_SMALL_BUFFER
    large_buffer: int = K_LARGE_BUFFER
    min_large_alloc: int = K_MIN_LARGE_ALLOC
    round_large: int = K_ROUND_LARGE
    expandable_small_page_bytes: int = K_SMALL_BUFFER
    expandable_large_page_bytes: int = K_LARGE_BUFFER

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise MemoError(f"AllocatorConfig.{name} must be a positive integer of bytes, got {v!r}")

        for name in ("capacity_bytes", "min_block_size", "small_size", "small_buffer", "large_buffer",
                     "min_large_alloc", "round_large", "expandable_small_page_bytes",
                     "expandable_large_page_bytes"):
            positive(name)
        if self.max_split_size_bytes is not None:
            positive("max_split_size_bytes")
            if self.max_split_size_bytes <= self.large_buffer:
                raise MemoError(
                    f"AllocatorConfig.max_split_size_bytes must exceed large_buffer ({self.large_buffer} B) "
                    f"as in PyTorch, got {self.max_split_size_bytes}; use None for no limit"
                )
        if self.small_buffer < self.small_size:
            raise MemoError("AllocatorConfig.small_buffer must be >= small_size (a small segment holds "
                            "at least one small request)")

    def round_size(self, size: int) -> int:
        """Size of the block a request of ``size`` bytes needs (PyTorch's ``round_size``)."""
        m = self.min_block_size
        return m if size < m else m * ((size + m - 1) // m)

    def is_small(self, rounded: int) -> bool:
        """Whether a rounded request belongs to the small pool."""
        return rounded <= self.small_size

    def allocation_size(self, rounded: int) -> int:
        """Size of the segment cudaMalloc'd for a rounded request (``get_allocation_size``)."""
        if rounded <= self.small_size:
            return self.small_buffer
        if rounded < self.min_large_alloc:
            return self.large_buffer
        r = self.round_large
        return r * ((rounded + r - 1) // r)

    def page_bytes(self, small: bool) -> int:
        """Page size of the expandable segment of the small or large pool."""
        return self.expandable_small_page_bytes if small else self.expandable_large_page_bytes
