"""How offloaded activations sit in pinned host memory: the one choice both packages make.

Offloading policies copy, per offloaded layer, some token rows of some skeletal tensors
(`Policy.offloaded_tensors`). Two ways to hold them in page-locked host memory:

- ``registered_pool`` (memo's executor): one ordinary host buffer per GPU, page-locked in place
  with ``cudaHostRegister``, so it takes exactly the bytes asked for; every offloaded tensor of
  every offloaded layer is a view at a ``HOST_ALIGN``-aligned offset. Host bytes per layer =
  sum of align(rows x row bytes).
- ``caching_host_allocator`` (``tensor.pin_memory()`` / PyTorch's CachingHostAllocator, as
  frameworks that offload with plain pinned tensors do): one pinned allocation per tensor per
  layer, each rounded as the profile's ``host.pinned_rounding`` says (a power of two for PyTorch).

Which one a plan uses is a runtime setting, the layout's ``host_pool`` (default memo's
executor's registered pool; a framework file can name the other, `memo_sim.frameworks`).

Token counts: of a tensor split token-wise with fraction alpha, the first
``offload_token_count(alpha, rows)`` rows go to host: alpha x rows floored to whole rows, never
rounded up past what a constraint allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memo_sim.cost.transfer import pinned_bytes
from memo_sim.layout.parallel import HOST_POOLS

HOST_ALIGN = 256  # bytes: offsets of the views in the registered pool
HOST_SCHEMES = HOST_POOLS  # the layout's ``host_pool`` names one


def offload_token_count(fraction: float, rows: int) -> int:
    """Rows of a token-wise split tensor that go to host: floor(fraction x rows)."""
    if not (0.0 <= fraction <= 1.0):
        raise ValueError(f"offload fraction must lie in [0, 1], got {fraction}")
    return min(rows, int(math.floor(fraction * rows * (1 + 1e-12))))


def host_aligned(nbytes: float) -> int:
    n = int(math.ceil(nbytes))
    return -(-n // HOST_ALIGN) * HOST_ALIGN


@dataclass(frozen=True)
class OffloadedTensor:
    name: str
    rows: int  # token rows copied to host
    row_bytes: float

    @property
    def nbytes(self) -> float:
        return self.rows * self.row_bytes


def copy_bytes(tensors: list[OffloadedTensor]) -> float:
    """Bytes one layer's offload (and prefetch) moves."""
    return float(sum(t.nbytes for t in tensors))


def host_block_bytes(tensors: list[OffloadedTensor], scheme: str, pinned_rounding: str) -> float:
    """Pinned host bytes one offloaded layer takes on one GPU, as ``scheme`` allocates them."""
    if scheme == "registered_pool":
        return float(sum(host_aligned(t.nbytes) for t in tensors if t.rows > 0))
    if scheme == "caching_host_allocator":
        return float(sum(pinned_bytes(t.nbytes, pinned_rounding) for t in tensors if t.rows > 0))
    raise ValueError(f"host allocation scheme {scheme!r} unknown; one of {HOST_SCHEMES}")
