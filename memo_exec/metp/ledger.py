"""The one accounting point of METP's tensors: every tensor a ring allocates is taken here, by
name and kind, and given back here, so the peak of any set of kinds can be read afterwards.

Names are the simulator's where it plans the same tensor (`memo_sim.memplan.trace_gen`:
``metp_ffn_w_double_buffer``, ``metp_fc1_block<j>``, ``fc2``, ...), so a ring's requests can be
set beside the simulator's trace. Kinds used by the rings (`memo_exec.metp.ffn`, `memo_exec.metp.mha`):

- ``w_buffer``: the double buffer of travelling weight blocks (2 x one packed block);
- ``dw_buffer``: the double buffer of travelling (FFN) or reduced (MHA) weight-gradient blocks;
- ``out``: an output / input-gradient accumulator (O_i, dA_i, dX_i);
- ``block``: a per-step block (T_ij, dD_ij, dT_ij, Q/K/V blocks, their gradients);
- ``kv_buffer``, ``dkv_buffer``: the inner attention ring's K/V and dK/dV double buffers;
- ``attn_acc``: the inner ring's output accumulator and running log-sum-exp.

Planned tensors: a ledger built with the layer's scratch (``Ledger(scratch)``, what
`memo_exec.metp.flavour` does) takes every tensor a ring allocates and frees itself -- the
double buffers and per-step blocks, kinds `SCRATCH_KINDS` -- from that scratch
(``X.get(name, shape, dtype)`` / ``X.free(name)``), so a memory plan that names them places them
at its offsets (`memo_exec.arena.ArenaScratch`; the recompute prefix ``rc_`` applies as for the
layer's own tensors). The ``out`` tensors (O_i, dA_i, dX_i: ``fc2``, ``d_ln2``, ``proj``,
``d_ln1``, ``metp_proj_rows``) are handed to the caller while still in use after the ring, so
they stay outside the scratch. A ledger without a scratch allocates from PyTorch (tests).

Callers may `hold` tensors they own (parameters, gradients, optimizer states, saved inputs) under
kinds of their own, so a test can add them to a peak (the paper's tables count model states).
A ``Ledger(None)``-style null use is not needed: every ring takes a ledger, the default one
simply keeps counting (a few dict updates per allocation).
"""

from __future__ import annotations

from collections import defaultdict

import torch


# the kinds whose tensors live and die inside one ring call (allocated and freed by the ring)
SCRATCH_KINDS = frozenset({"w_buffer", "dw_buffer", "block", "kv_buffer", "dkv_buffer", "attn_acc"})


class Ledger:
    def __init__(self, scratch=None) -> None:
        self.scratch = scratch  # the layer's scratch (`memo_exec.arena.CachingScratch`), or None
        self._in_scratch: set[str] = set()
        self.live: dict[str, tuple[str, int]] = {}  # name -> (kind, bytes)
        self.by_kind: dict[str, int] = defaultdict(int)
        self.history: list[dict[str, int]] = []  # live bytes by kind after every alloc / hold
        self.sizes: dict[str, int] = {}  # bytes of every name ever allocated (the last size)

    def _add(self, name: str, kind: str, nbytes: int) -> None:
        if name in self.live:
            raise RuntimeError(f"METP ledger: {name!r} allocated twice without a free")
        self.live[name] = (kind, nbytes)
        self.by_kind[kind] += nbytes
        self.sizes[name] = nbytes
        self.history.append(dict(self.by_kind))

    def alloc(self, name: str, shape, dtype: torch.dtype, device, kind: str, zero: bool = False) -> torch.Tensor:
        if self.scratch is not None and kind in SCRATCH_KINDS:
            if torch.device(device).type != self.scratch.device.type:
                raise RuntimeError(f"METP ledger: {name!r} asked on {device}, the scratch is on {self.scratch.device}")
            t = self.scratch.get(name, tuple(shape), dtype)
            if zero:
                t.zero_()
            self._in_scratch.add(name)
        else:
            t = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
        self._add(name, kind, t.numel() * t.element_size())
        return t

    def halves(self, name: str, shape, dtype: torch.dtype, device, kind: str, n: int = 2) -> list[torch.Tensor]:
        """A double buffer: one tensor ``name`` of ``n`` x ``shape``, returned as its ``n`` halves."""
        t = self.alloc(name, (n,) + tuple(shape), dtype, device, kind)
        return list(t.unbind(0))

    def hold(self, name: str, tensor: torch.Tensor, kind: str) -> None:
        """Count a tensor the caller owns (a parameter, a saved input) until `free`."""
        self._add(name, kind, tensor.numel() * tensor.element_size())

    def free(self, *names: str) -> None:
        for name in names:
            kind, nbytes = self.live.pop(name)
            self.by_kind[kind] -= nbytes
            if name in self._in_scratch:
                self._in_scratch.discard(name)
                self.scratch.free(name)

    def peak(self, kinds=None) -> int:
        """The largest live total over ``kinds`` (all kinds when None) at any allocation."""
        if not self.history:
            return 0
        if kinds is None:
            return max(sum(h.values()) for h in self.history)
        return max(sum(h.get(k, 0) for k in kinds) for h in self.history)

    def live_bytes(self, kinds=None) -> int:
        return sum(v for k, v in self.by_kind.items() if kinds is None or k in kinds)

    def reset_peak(self) -> None:
        self.history = [dict(self.by_kind)]
