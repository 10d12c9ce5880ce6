"""MEMO's rounding buffers on a pipeline rank: the simulator's rule over the rank's units, as its 1F1B and
interleaved schedules price it (`memo_sim.engine.schedules.microbatch`, `memo_sim.search.pipeline`).

A pipeline rank runs the forwards and backwards of several micro-batches (and chunks) in the schedule's order,
one `memo_exec.activations.token_offload.TokenOffload` instance per micro-batch in flight (its host slots, its
layers' norm statistics and lse). The device buffers are the rank's, shared by those instances, four one-layer
blocks where the simulator counts an offloading policy's rounding buffers twice (forward slots and the prefetch
slots of the backward beside them):

- **forward buffers** 0 and 1: the rank's forward units are numbered in the order it runs them, across its
  forward steps (``u``, 0 .. ``n_f`` - 1); unit u's skeletal tensors live in forward buffer ``u % 2`` and the
  rule of `memo_sim.policy.rounding_buffers` runs over those numbers: every unit but the rank's last
  ``KEPT_LAYERS`` of the step is offloaded (``is_offloaded(u, n_f)``), the op that writes unit u+1's input
  waits for the offload of unit u-1 (``output_write_waits_for``), and a step's first layer, whose input is
  copied in, waits for the offload of unit u-2, which last read that buffer. The kept units stay in their
  forward buffer to their backward (no forward runs after them).
- **prefetch buffers** 0 and 1: the backward units are numbered in the order the rank runs them, across its
  backward steps (``k``); an offloaded unit is prefetched into prefetch buffer ``k % 2``, after the backward of
  unit k-2 (the last that read that buffer) and its own offload, and no earlier than the start of the step
  before its own backward step, so a backward step's first prefetches run beside the step before it, as the
  simulator issues them (its ``prev_launch``). MEMO's token-wise recompute rebuilds the other rows there.

`PipelineRounding` holds the blocks, the numbering (read off the schedule's order: `plan`), the events by unit
and the prefetches not issued yet; the instances ask it where their layers are and call it at each end of a
backward; the schedule calls `launch` at the start of each action.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memo_sim.policy.rounding_buffers import N_BUFFERS, is_offloaded, output_write_waits_for


@dataclass
class _BackwardUnit:
    policy: object  # the TokenOffload instance that holds the unit's host slot and storage
    layer: int  # the instance's layer
    unit: int  # the forward unit number (its offload)
    action: int  # the index in the rank's order of the backward step it belongs to


class PipelineRounding:
    """The rank's four rounding blocks and MEMO's rule over its units (module docs)."""

    def __init__(self, engine, fwd: list[dict[str, torch.Tensor]], pf: list[dict[str, torch.Tensor]]) -> None:
        self.engine = engine
        self.fwd, self.pf = fwd, pf  # N_BUFFERS carved storages each
        self.n_f = 0
        self.fwd_base: dict[tuple[int, int], int] = {}
        self.bwd_base: dict[tuple[int, int], int] = {}
        self.backward_units: list[_BackwardUnit] = []

    # ------------------------------------------------------------------ the schedule's order
    def plan(self, order, sizes: dict[int, int], policy_of) -> None:
        """Number the rank's units from its order (``Action``s with kind, chunk, mb), ``sizes`` the layers of each
        chunk, ``policy_of(chunk, mb)`` the instance that runs it."""
        u = k = 0
        self.fwd_base.clear()
        self.bwd_base.clear()
        for a in order:
            if a.kind == "fwd":
                self.fwd_base[(a.chunk, a.mb)] = u
                u += sizes[a.chunk]
        self.n_f = u
        self.backward_units = []
        for t, a in enumerate(order):
            if a.kind != "fwd":
                n = sizes[a.chunk]
                self.bwd_base[(a.chunk, a.mb)] = k
                u0 = self.fwd_base[(a.chunk, a.mb)]
                pol = policy_of(a.chunk, a.mb) if n else None
                self.backward_units += [_BackwardUnit(pol, i, u0 + i, t) for i in range(n - 1, -1, -1)]
                k += n
        ev = self.engine.event
        self.ev_fwd = [ev(f"forward_done(u{i})") for i in range(self.n_f)]
        self.ev_off = [ev(f"offloaded(u{i})") for i in range(self.n_f)]
        self.ev_bwd = [ev(f"backward_done(k{i})") for i in range(k)]
        self.ev_pf = [ev(f"prefetched(k{i})") for i in range(k)]
        self.begin_step()

    def begin_step(self) -> None:
        self.launched = -1  # the last action whose step before it has started
        self.backward_done = 0  # backward units run so far (in order)
        self.next_prefetch = 0  # the next backward unit whose prefetch is not issued (or that needs none)
        self.prefetched: set[int] = set()
        self.offloads_issued: set[int] = set()  # forward units whose offload is issued (its event recorded after)

    # ------------------------------------------------------------------ the rule
    def offloaded(self, u: int) -> bool:
        return is_offloaded(u, self.n_f)

    def output_write_waits_for(self, u: int) -> int | None:
        return output_write_waits_for(u, self.n_f)

    def input_write_waits_for(self, u: int) -> int | None:
        """A step's first unit: its input, copied in, overwrites forward buffer u % 2, which unit u-2's offload
        reads (`output_write_waits_for` covers the units whose input the layer before writes)."""
        prev = u - N_BUFFERS
        return prev if prev >= 0 and self.offloaded(prev) else None

    def launch(self, t: int) -> None:
        """The schedule starts action ``t``: the prefetches of action t+1 may start (module docs)."""
        self.launched = t + 1
        self._issue_ready()

    def after_offload(self, u: int) -> None:
        """Unit u's offload is issued (and its event recorded on the d2h stream): a prefetch may wait for it."""
        self.offloads_issued.add(u)
        self._issue_ready()

    def after_backward(self, k: int) -> None:
        """Backward unit ``k`` ended (on the compute stream): record it, issue what waited for it."""
        if k != self.backward_done:
            raise RuntimeError(f"backward unit {k} ran out of order (expected {self.backward_done})")
        self.engine.compute.record(self.ev_bwd[k])
        self.backward_done = k + 1
        self._issue_ready()

    def _issue_ready(self) -> None:
        """Issue, in backward order, each prefetch whose step is launched, whose unit's offload is issued (a wait on
        an event not yet recorded would wait for nothing) and whose buffer's last reader (unit k-2) has run; the h2d
        stream runs them in that order."""
        while self.next_prefetch < len(self.backward_units):
            k = self.next_prefetch
            bu = self.backward_units[k]
            if self.offloaded(bu.unit):
                if bu.action > self.launched or self.backward_done < k - 1 or bu.unit not in self.offloads_issued:
                    return
                bu.policy.prefetch_unit(bu.layer, k, bu.unit)
                self.prefetched.add(k)
            self.next_prefetch = k + 1

    def check_prefetched(self, k: int) -> None:
        if k not in self.prefetched:
            raise RuntimeError(f"backward unit {k} runs before its prefetch was issued")
