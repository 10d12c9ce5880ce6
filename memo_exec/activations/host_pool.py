"""One host buffer for every offloaded tensor, allocated before the first step.

On CUDA the pool is an ordinary host tensor that is page-locked in place with
``cudaHostRegister`` (what ``torch.cuda._pin_memory_utils`` does), so it takes exactly the bytes
asked for: PyTorch's pinned caching allocator would round a single request up to a power of two.
On CPU it is a plain tensor. Views are cut at ``HOST_ALIGN``-aligned offsets, the
``registered_pool`` layout of `memo_sim.policy.host_layout` that the simulator sizes host memory by.
"""

from __future__ import annotations

import math

import torch

from memo_exec.errors import ExecError
from memo_sim.policy.host_layout import HOST_ALIGN as ALIGN  # the layout the simulator sizes host memory by


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HostPool:
    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes = int(nbytes)
        self.device = device
        self.registered = False
        self.buf = torch.empty(self.nbytes, dtype=torch.uint8)
        if device.type == "cuda" and self.nbytes > 0:
            rc = int(torch.cuda.cudart().cudaHostRegister(self.buf.data_ptr(), self.nbytes, 0))
            if rc != 0:
                raise ExecError(f"cannot page-lock the {self.nbytes}-byte host pool (cudaHostRegister error {rc})")
            self.registered = True
            if not self.buf.is_pinned():
                raise ExecError("the host pool was registered with CUDA but torch does not see it as pinned")
        self._off = 0

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
