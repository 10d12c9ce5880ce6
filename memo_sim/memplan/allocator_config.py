"""The caching-allocator model's settings: PyTorch's size constants and rounding rules
(`memo_sim.memplan.caching_allocator` describes the model)."""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import ROUNDUP_INTERVALS, AllocConf

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
    unlimited, PyTorch's default); PyTorch requires at least ``kLargeBuffer`` (20 MiB).
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
    # PYTORCH_CUDA_ALLOC_CONF's roundup_power2_divisions, one entry per power-of-two size class
    # from 1 MiB (`memo_sim.layout.alloc_conf`); 0 or 1: plain 512-byte rounding
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0  # PYTORCH_CUDA_ALLOC_CONF's; active only with a memory fraction
    memory_fraction: float | None = None  # torch.cuda.set_per_process_memory_fraction: limit = fraction x device
    device_bytes: int | None = None  # the device's total memory, which the fraction is of (None: capacity_bytes)

    @classmethod
    def from_conf(cls, capacity_bytes: int, conf: AllocConf, device_bytes: int | None = None) -> "AllocatorConfig":
        """The model's settings from a parsed ``PYTORCH_CUDA_ALLOC_CONF`` (`memo_sim.layout.alloc_conf`);
        ``device_bytes``: the device's total memory (what a memory fraction is a share of)."""
        return cls(capacity_bytes=int(capacity_bytes), expandable_segments=bool(conf.expandable_segments),
                   max_split_size_bytes=None if conf.max_split_size_mb is None else conf.max_split_size_mb * MiB,
                   roundup_power2_divisions=conf.roundup_power2_divisions,
                   garbage_collection_threshold=conf.garbage_collection_threshold,
                   memory_fraction=conf.per_process_memory_fraction,
                   device_bytes=None if device_bytes is None else int(device_bytes))

    @property
    def limit_bytes(self) -> int:
        """What the allocator may reserve: the capacity, or less under a memory fraction: PyTorch's
        ``allowed_memory_maximum`` is the fraction of the device's total memory (cudaMemGetInfo's
        total, ``device_bytes``), and the device never gives more than the capacity."""
        if self.memory_fraction is None:
            return self.capacity_bytes
        total = self.capacity_bytes if self.device_bytes is None else self.device_bytes
        return min(self.capacity_bytes, int(self.memory_fraction * total))

    @property
    def gc_active(self) -> bool:
        """PyTorch collects cached blocks only when a memory fraction is set and the threshold > 0."""
        return self.memory_fraction is not None and self.garbage_collection_threshold > 0.0

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
            if self.max_split_size_bytes < self.large_buffer:
                raise MemoError(
                    f"AllocatorConfig.max_split_size_bytes must be at least large_buffer ({self.large_buffer} B) "
                    f"as in PyTorch, got {self.max_split_size_bytes}; use None for no limit"
                )
        if len(self.roundup_power2_divisions) != ROUNDUP_INTERVALS or any(
                d < 0 or (d & (d - 1)) for d in self.roundup_power2_divisions):
            raise MemoError(f"AllocatorConfig.roundup_power2_divisions must be {ROUNDUP_INTERVALS} powers of two "
                            f"(or 0), got {self.roundup_power2_divisions!r}")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise MemoError("AllocatorConfig.garbage_collection_threshold must be in [0, 1), got "
                            f"{self.garbage_collection_threshold!r}")
        if self.memory_fraction is not None and not 0.0 < self.memory_fraction <= 1.0:
            raise MemoError(f"AllocatorConfig.memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        object.__setattr__(self, "_rounds_power2", any(d > 1 for d in self.roundup_power2_divisions))
        if self.small_buffer < self.small_size:
            raise MemoError("AllocatorConfig.small_buffer must be >= small_size (a small segment holds "
                            "at least one small request)")

    def round_size(self, size: int) -> int:
        """Size of the block a request of ``size`` bytes needs (PyTorch's ``round_size``: 512-byte
        multiples, or the next of ``divisions`` equal steps between two powers of two where
        ``roundup_power2_divisions`` sets more than one for the size's class)."""
        m = self.min_block_size
        if size < m:
            return m
        divs = self.roundup_power2_divisions
        if self._rounds_power2:
            d = divs[min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)]  # 1 MiB = 2^20 starts
            if d > 1 and size > m * d:
                return roundup_power2_next_division(size, d)
        return m * ((size + m - 1) // m)

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


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """PyTorch's ``roundup_power2_next_division``: the next of ``divisions`` equal steps between
    the powers of two around ``size`` (a power of two itself stays)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step
