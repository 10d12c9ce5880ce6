"""One host buffer for every offloaded tensor, allocated before the first step.

On CUDA the pool is an ordinary host tensor that is page-locked in place with
``cudaHostRegister`` (what ``torch.cuda._pin_memory_utils`` does), so it takes exactly the bytes
asked for: PyTorch's pinned caching allocator would round a single request up to a power of two.
On CPU it is a plain tensor. Views are cut at ``HOST_ALIGN``-aligned offsets, the
``registered_pool`` layout of `memo_sim.policy.host_layout` that the simulator sizes host memory by.

If registering fails (a container's locked-memory limit, an old driver), the pool falls back to
``torch.empty(..., pin_memory=True)`` (PyTorch's pinned allocator: page-locked, but it may reserve
up to twice the bytes), and if that fails too, to pageable memory (copies then go through a staging
buffer and do not overlap compute as planned). Either fallback is a ``RuntimeWarning`` and is
reported: ``method`` and ``warning`` go into ``measured.json``'s ``meta.host_pool``.
"""

from __future__ import annotations

import math
import warnings

import torch

from memo_exec.errors import ExecError
from memo_sim.policy.host_layout import HOST_ALIGN as ALIGN  # the layout the simulator sizes host memory by


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _register(ptr: int, nbytes: int) -> int:
    """``cudaHostRegister`` of host memory in place; the CUDA error code (0: registered)."""
    return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))


def _pinned_empty(nbytes: int) -> torch.Tensor:
    """A page-locked buffer from PyTorch's pinned host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


# how the pool's memory was obtained
METHODS = ("registered", "pinned_allocator", "pageable", "host")  # host: the device is the CPU


class HostPool:
    def __init__(self, nbytes: int, device: torch.device, pin: bool | None = None) -> None:
        """``pin``: page-lock the pool (default: where ``device`` is a CUDA device)."""
        self.nbytes = int(nbytes)
        self.device = device
        self.registered = False
        self.method = "host"
        self.warning: str | None = None
        self.buf = torch.empty(self.nbytes, dtype=torch.uint8)
        if (device.type == "cuda" if pin is None else pin) and self.nbytes > 0:
            self._page_lock()
        self._off = 0
        self.owner = True  # False: a view of another pool's first bytes (`view_of`), which it neither counts nor frees

    def view_of(self, nbytes: int) -> "HostPool":
        """A pool over this one's first ``nbytes``, taking its slots from the start again: a pipeline slot's instance
        over fewer layers reuses the slot's host slots (`memo_exec.activations.base.SlotBlocks`)."""
        if nbytes > self.nbytes:
            raise ExecError(f"host pool view of {nbytes} bytes over a pool of {self.nbytes}")
        view = object.__new__(HostPool)
        view.__dict__.update(self.__dict__)
        view.nbytes, view.buf, view._off, view.owner, view.registered = nbytes, self.buf[:nbytes], 0, False, False
        return view

    def _page_lock(self) -> None:
        rc = _register(self.buf.data_ptr(), self.nbytes)
        if rc == 0:
            self.registered = True
            if not self.buf.is_pinned():
                raise ExecError("the host pool was registered with CUDA but torch does not see it as pinned")
            self.method = "registered"
            return
        why = f"cudaHostRegister of the {self.nbytes}-byte host pool failed (CUDA error {rc})"
        try:
            self.buf = _pinned_empty(self.nbytes)
            self.method = "pinned_allocator"
            self.warning = (f"{why}; using torch.empty(pin_memory=True) instead (page-locked, but PyTorch's "
                            "pinned allocator may reserve up to twice the bytes)")
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.method = "pageable"
            self.warning = (f"{why}, and pinned allocation failed too ({first}); the pool is pageable: copies "
                            "are staged by the driver and will not overlap compute as planned")
        warnings.warn(self.warning, RuntimeWarning, stacklevel=3)

    def held_bytes(self) -> int:
        """Host bytes the pool holds: its size, or where PyTorch's pinned allocator took it (``pinned_allocator``), the
        power of two that allocator reserves (its CachingHostAllocator rounds a request up: this module's docs)."""
        if self.method == "pinned_allocator" and self.nbytes > 0:
            return 1 << (self.nbytes - 1).bit_length()
        return self.nbytes

    def describe(self) -> dict:
        """What `measured.json` reports about the pool (``meta.host_pool``)."""
        pinned = self.method in ("registered", "pinned_allocator")
        return {"bytes": self.nbytes, "method": self.method, "pinned": pinned, "warning": self.warning}

    @staticmethod
    def layout_bytes(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
        return sum(_align(math.prod(s) * torch.empty((), dtype=d, device="meta").element_size()) for s, d in shapes)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nb = math.prod(shape) * torch.empty((), dtype=dtype, device="meta").element_size()
        if self._off + nb > self.nbytes:
            raise ExecError("host pool exhausted (layout and allocation disagree)")
        t = self.buf[self._off:self._off + nb].view(dtype).view(shape)
        self._off += _align(nb)
        return t

    def close(self) -> None:
        if self.registered:
            torch.cuda.synchronize(self.device)
            torch.cuda.cudart().cudaHostUnregister(self.buf.data_ptr())
            self.registered = False
