"""Keep freed host memory in the process while a CPU device computes: the CPU's caching allocator.

On a CPU the executor's tensors come from glibc's malloc. By default glibc serves a large request
(over its mmap threshold, 128 KiB at start, raised as such blocks are freed, up to 32 MiB) with a
fresh ``mmap`` and gives the top of the heap back to the kernel when more than the trim threshold
is free. Every step of a layer allocates and frees the same large temporaries (the attention's
score chunks, a GEMM's output, the backward's gradients), so each of them may come back as fresh
pages that the kernel zeroes on first touch: page faults inside the kernels. How many depends on
the process's history (the dynamic threshold moves with what was freed before), so the same
kernel at the same shape took 28.3 ms in one fresh process and 37.3 ms in the next (math attention
at s=1024, 8x32 heads, one thread, four calls in each of four fresh processes: 28.3-37.3 ms; 2-core
AMD EPYC VM, 2026-11-26, `python benchmarks/cpu_loop_probes.py malloc --repeats 4`), and a
calibration and a run disagreed by as much.

`keep_freed_memory` fixes the policy the way CUDA's caching allocator does on a GPU: freed blocks
stay with the process for reuse. It sets ``M_MMAP_THRESHOLD`` to glibc's largest (32 MiB, which also
stops the dynamic adjustment), ``M_TRIM_THRESHOLD`` to 1 GiB and ``M_TOP_PAD`` to 64 MiB with
``mallopt``: with it the same kernel took 27.3-29.7 ms in every call of every process (same probe).
`memo-exec calibrate` on a CPU and every CPU run of the executor call it, so both measure the same
allocator. A request above 32 MiB is still mapped fresh each time (glibc caps the threshold).
Where the C library is not glibc, nothing is changed and the reason is returned.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the largest it accepts
TRIM_THRESHOLD = 2**30
TOP_PAD = 64 * 2**20

_state: dict[str, str] = {}


def keep_freed_memory() -> str:
    """Set the policy (module docs) once per process; return what was done, in words."""
    if "done" in _state:
        return _state["done"]
    words = _apply()
    _state["done"] = words
    return words


def _apply() -> str:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "host malloc policy unchanged: no glibc mallopt in this C library"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = [mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            mallopt(M_TOP_PAD, TOP_PAD)]
    if not all(done):
        return "host malloc policy partly unchanged: glibc refused a mallopt setting"
    return (f"host malloc keeps freed memory (glibc mallopt: mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
            f"trim threshold {TRIM_THRESHOLD >> 30} GiB, top pad {TOP_PAD >> 20} MiB)")
