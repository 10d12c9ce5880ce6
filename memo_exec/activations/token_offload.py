"""Token-wise offload through MEMO's two rounding buffers (paper sec. 4.1); ``full_offload`` and
``memo`` are this class with the simulator policy's fractions.

Rounding buffers: two preallocated device blocks, each holding one layer's skeletal tensors
(x, ln1, q, k, v, attn, h1, ln2, fc1, act); layer i uses block ``rounding_buffer(i)``. Layer i-1's
last op writes layer i's input straight into that block. Of every role-"other" tensor the first
``n_off = offload_token_count(offload_fraction_other, T)`` tokens go to host (whole rows, floored:
`memo_sim.policy.host_layout`, the rule the simulator sizes host memory with) (a contiguous prefix of a
token-major tensor); x and attn go whole. The rest is recomputed token-wise before the backward.

The copies follow the dependency rule of `memo_sim.policy.rounding_buffers` (the simulator's
schedule follows the same functions), one method per edge:

1. ``_offload_waits_for_forward``: the offload stream waits for forward(i) before copying it out.
2. ``_output_write_waits_for_offload``: right before forward(i)'s last op writes layer i+1's input
   into the buffer that offload(i-1) still reads, the compute stream waits for that offload.
   Everything else of forward(i) runs beside the copy.
3. ``_prefetch_waits_for_backward``: prefetch(j) waits for backward(j+2), the last kernel that
   reads the buffer it overwrites, and then runs beside backward(j+1).
4. ``_backward_waits_for_prefetch``: the recompute and backward of layer j wait for prefetch(j).

Every compute op and copy declares the rows it reads and writes to the engine's happens-before
race detector (`memo_exec.happens_before`), so a missing or misplaced wait is an error at issue
time. The last ``KEPT_LAYERS`` layers are neither offloaded nor recomputed (a MoE layer among them keeps
its block's autograd graph, as under store all; an offloaded MoE layer keeps its routing only and
re-runs the block before its backward, `memo_exec.moe.block`).

On a pipeline rank (``pipelined``, set by `memo_exec.pipeline` on every instance) the device buffers are the
rank's, shared by its instances, and the rule runs over the rank's units, as the simulator's 1F1B and interleaved
schedules price it: `memo_exec.activations.pipeline_rounding` (four blocks: two forward, two prefetch buffers; every
unit offloaded but the rank's last two of the step; a backward step's first prefetches beside the step before it).
The four edges below are the same, between units of the rank.

On a rank of a tensor-parallel layout the tensors have the rank's shapes (``shapes``,
`memo_exec.layer.storage_shapes`): with sequence parallelism the TP-split tensors (q, k, v, attn,
fc1, act) hold ``row_mult`` gathered rows per local token, so token rows ``[lo, hi)`` are their
rows ``[lo*m, hi*m)`` (the interleaved token order makes those the same tokens); the copies move
those rows and the race detector's regions stay in token units. The attention lse and
the LayerNorm statistics stay on the device for every layer.
"""

from __future__ import annotations

import math

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.host_pool import HostPool
from memo_exec.activations.pipeline_rounding import PipelineRounding
from memo_exec.happens_before import Region
from memo_exec.layer import LayerStorage, carve_storage, skeletal_names, skeletal_roles, storage_bytes
from memo_exec.streams import CopyLabel
from memo_exec.wait_switch import wait_primitive
from memo_sim.policy.host_layout import offload_token_count
from memo_sim.policy.rounding_buffers import (
    KEPT_LAYERS, N_BUFFERS, is_offloaded, offloaded_layer_count, output_write_waits_for,
    prefetch_launched_after_backward, rounding_buffer,
)


class TokenOffload(ActivationPolicy):
    moe_block_differs = ("keeps an offloaded MoE layer's routing only and re-runs the whole MoE block (router, "
                         "dispatch, every token's expert GEMMs, combine, shared experts) before the layer's backward "
                         "(the last layers, kept, keep the block's graph as the simulator's keep every tensor), where the "
                         "simulator's policy offloads the block's saved tensors' first alpha of rows and re-runs "
                         "only the ops that rebuild the rest (on an H200 MEMO's plans carried 6 to 17 points more "
                         "step-time error than store all's, the re-run the likely cause: "
                         "reports/gpu-h200-2026-11-26-moe.md)")

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.fraction = float(self.choice.offload_fraction_other)
        self.n_off = offload_token_count(self.fraction, self.tokens)  # the simulator's rule: floor(alpha * T)
        roles = skeletal_roles(self.model)
        # the tensors the instance's layers write: every skeletal one, less fc1 and act where no layer of it is a
        # dense one (`ActivationPolicy.layer_names`: a MoE layer's block replaces them). A review: a MoE model's
        # rounding buffers and host slots carried the dense FFN's, copied both ways every step and never written
        # (51-62% of a block for Qwen3-30B-A3B and Mixtral)
        every = skeletal_names(self.model)
        written = {n for i in range(self.layers) for n in self.layer_names(every, i)}
        self.names = tuple(n for n in every if n in written)
        # what goes to host whole (the simulator policy's ``offloaded_roles``: MEMO's x and attn) and what by rows
        self.whole = [n for n in self.names if roles[n] in self.choice.offloaded_roles]
        self.split = [n for n in self.names if roles[n] == "other"]
        self.widths = {n: w for n, (_, w) in self.shapes.items()}
        self.row_mult = {n: m for n, (m, _) in self.shapes.items()}

    rounding: PipelineRounding | None = None  # a pipeline rank's buffers and numbering (`allocate`, pipelined)

    @property
    def shares_buffers(self) -> bool:  # a pipeline rank's four blocks, counted once (module docs)
        return self.pipelined

    def offloaded(self, i: int) -> bool:
        if self.rounding is not None:
            return self.rounding.offloaded(self.unit[i])
        return is_offloaded(i, self.layers)

    # a pipeline rank: the host slots this instance takes, set by the schedule before `allocate`
    # (`memo_exec.pipeline.schedules.PipelineSchedule.host_layers`); None: one for every layer (an upper bound)
    host_layers: int | None = None

    @property
    def n_offloaded(self) -> int:
        """The layers that get a host slot (layers 0 .. n-1: the offloaded layers of a chunk are a prefix of it).
        One process: every layer but the last `KEPT_LAYERS`. A pipeline rank: the layers of the (chunk,
        micro-batch)s its slot serves whose units the rank's order offloads (``host_layers``), as the simulator
        counts a stage's host blocks; a host slot for every layer of every slot took twice the plan's pinned
        bytes (a review: pp 2, 4 layers, 2 micro-batches; stage 0's second slot serves the rank's last two units,
        which stay on the device)."""
        if not self.pipelined:
            return offloaded_layer_count(self.layers)
        return self.layers if self.host_layers is None else min(self.layers, self.host_layers)

    # -- sizes -------------------------------------------------------------------------------------
    def _moved(self) -> list[tuple[str, tuple[int, int]]]:
        """(tensor, token rows) that go to host and come back."""
        rows = [(n, (0, self.tokens)) for n in self.whole]
        return rows + ([(n, (0, self.n_off)) for n in self.split] if self.n_off else [])

    def _host_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [(((hi - lo) * self.row_mult[n], self.widths[n]), self.dtype) for n, (lo, hi) in self._moved()]

    def layer_offload_bytes(self) -> int:
        esize = torch.empty((), dtype=self.dtype, device="meta").element_size()
        return sum(math.prod(s) for s, _ in self._host_shapes()) * esize

    def rounding_blocks(self) -> int:
        """The one-layer blocks the policy's rule runs over: two, or a pipeline rank's four (forward and prefetch)."""
        return (2 if self.pipelined else 1) * N_BUFFERS

    def device_bytes(self) -> dict[str, int]:
        # a MoE layer's routing; a kept one's block graph too (`_device_storages`)
        blocks = self.rounding_blocks()
        resident = self.moe_kept_bytes(lambda i: not self.offloaded(i))
        rank = {}
        if self.pipelined:  # a rank keeps its last two units, in one instance or two: their MoE graphs, once per rank
            resident = self.moe_kept_bytes()  # (an upper bound: a kept unit may be a dense layer)
            rank = {"rank_resident": KEPT_LAYERS * self.moe_graph_bytes()}
        return {"skeletal_resident": resident, **rank,
                "buffers": blocks * storage_bytes(self.model, self.tokens, self.dtype, self._rank_names,
                                                  shapes=self.shapes),
                "norm_stats": self.layers * self._stats_bytes(), "lse": self.layers * self.lse_bytes_per_layer()}

    def host_bytes(self) -> int:
        return self.host_bytes_for(self.n_offloaded)

    def host_bytes_for(self, layers: int) -> int:
        """The pinned bytes of ``layers`` host slots (each one layer's offloaded rows, in the pool's layout)."""
        return layers * HostPool.layout_bytes(self._host_shapes())

    # -- allocation --------------------------------------------------------------------------------
    def _device_storages(self) -> list[LayerStorage]:
        """Each layer's storage: its rounding buffer's tensors (``self.blocks``: the device blocks)."""
        names = tuple(self._rank_names)
        nb = storage_bytes(self.model, self.tokens, self.dtype, names, shapes=self.shapes)
        self.blocks = [torch.empty(nb, dtype=torch.uint8, device=self.device) for _ in range(N_BUFFERS)]
        bufs = [carve_storage(b, self.model, self.tokens, self.dtype, names, shapes=self.shapes) for b in self.blocks]
        storages = [LayerStorage(bufs[rounding_buffer(i)], self._stats()) for i in range(self.layers)]
        for i, st in enumerate(storages):  # a kept layer keeps its MoE block's graph: nothing of it is re-run, as
            st.keep_moe_internals = not self.offloaded(i)  # the simulator's kept layers keep every tensor
        return storages

    # the tensors its rounding blocks hold (every skeletal tensor the layers write; checkpoint offload: x), and a
    # layer's storage over one of them
    @property
    def _rank_names(self) -> tuple[str, ...]:
        return self.names

    def _rank_tensors(self, block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return block

    def _rank_rounding(self) -> PipelineRounding:
        """The pipeline rank's four blocks (`ActivationPolicy.shared`), made by its first instance."""
        names = tuple(self._rank_names)
        nb = storage_bytes(self.model, self.tokens, self.dtype, names, shapes=self.shapes)

        def carve(name: str) -> list[dict[str, torch.Tensor]]:
            return [carve_storage(self.buffer_block(f"{name}{b}", nb), self.model, self.tokens, self.dtype, names,
                                  shapes=self.shapes) for b in range(N_BUFFERS)]

        return self.shared.state("rounding", lambda: PipelineRounding(self.engine, carve("forward"),
                                                                       carve("prefetch")))

    def _pipeline_storages(self) -> list[LayerStorage]:
        """Each layer's storage on a pipeline rank, re-pointed at a rank block per unit (`bind`, `prefetch_unit`)."""
        return [LayerStorage(self._rank_tensors(self.rounding.fwd[rounding_buffer(i)]), self._stats(f"stats {i}"))
                for i in range(self.layers)]

    def allocate(self) -> None:
        if self.pipelined:
            self.rounding = self._rank_rounding()
            self.storages = self._pipeline_storages()
            self.unit, self.k_of, self.where = list(range(self.layers)), {}, {}
        else:
            self.storages = self._device_storages()
        self.pool = self._host_pool()
        self.host: list[dict[str, torch.Tensor]] = [
            {n: self.pool.take(((hi - lo) * self.row_mult[n], self.widths[n]), self.dtype)
             for n, (lo, hi) in self._moved()}
            for _ in range(self.n_offloaded)]
        if self.rounding is not None:  # a pipeline rank's events are its units' (`PipelineRounding`)
            return
        ev = self.engine.event
        self.ev_fwd = [ev(f"forward_done({i})") for i in range(self.layers)]
        self.ev_off = [ev(f"offloaded({i})") for i in range(self.layers)]
        self.ev_bwd = [ev(f"backward_done({i})") for i in range(self.layers)]
        self.ev_pf = [ev(f"prefetched({i})") for i in range(self.layers)]

    def _host_pool(self) -> HostPool:
        """The instance's host slots: its own pool, or on a pipeline rank its slot's (`SlotBlocks`: an instance over
        fewer layers takes the first of the slot's host slots, each layer's the same size)."""
        if self.slot_blocks is None:
            return HostPool(self.host_bytes(), self.device)
        return self.slot_blocks.take("host slots", self.host_bytes(), lambda n: HostPool(n, self.device))

    @property
    def pinned_bytes(self) -> int:
        """The host pool this instance allocated (0 where it took its slot's: counted once, by its owner)."""
        return self.pool.nbytes if hasattr(self, "pool") and self.pool.owner else 0

    def close(self) -> None:
        if hasattr(self, "pool"):
            self.engine.synchronize()
            self.pool.close()

    # -- regions the race detector sees --------------------------------------------------------------
    # Physical (`Region.of`): the bytes of the very views the ops and copies use, labelled with what
    # they must hold ("layer i x"), so a copy to or from the wrong slot is a race or a mismatch.
    def _host_slot(self, i: int, to_host: bool) -> dict[str, torch.Tensor]:
        """The host tensors layer i's offload (``to_host``) writes or its prefetch reads (the slot choice)."""
        if i >= len(self.host):  # the schedule sized the instance's host slots for fewer layers than it offloads
            raise RuntimeError(f"layer {i}{self.tag} is offloaded but the instance holds {len(self.host)} host slots")
        return self.host[i]

    def _content(self, i: int, n: str) -> str:
        return f"layer {self.layer_base + i}{self.tag} {n}"

    def _rows(self, t: torch.Tensor, n: str, lo: int, hi: int) -> torch.Tensor:
        """Token rows [lo, hi) of tensor ``n`` (its rows [lo*m, hi*m))."""
        return t[lo * self.row_mult[n]:hi * self.row_mult[n]]

    def _slot(self, i: int, n: str) -> str:
        """The device buffer layer i's tensor ``n`` lies in, in the race detector's words."""
        if self.rounding is not None:
            return f"{self.where[i]} {n}"
        return f"rounding buffer {rounding_buffer(i)} {n}"

    def _buf(self, i: int, names, rows: tuple[int, int] | None = None) -> list[Region]:
        lo, hi = rows or (0, self.tokens)
        dev = self.storages[i].tensors
        return [Region.of(self._rows(dev[n], n, lo, hi), f"{self._slot(i, n)}[{lo}:{hi}]", self._content(i, n))
                for n in names]

    def _copy(self, i: int, to_host: bool):
        """(dst, src) pairs of layer i's offload (to_host) or prefetch, with the regions each reads and writes."""
        dev, host = self.storages[i].tensors, self._host_slot(i, to_host)
        pairs, on_dev, on_host = [], [], []
        for n, (lo, hi) in self._moved():
            d = self._rows(dev[n], n, lo, hi)
            pairs.append((host[n], d) if to_host else (d, host[n]))
            on_dev.append(Region.of(d, f"{self._slot(i, n)}[{lo}:{hi}]", self._content(i, n)))
            on_host.append(Region.of(host[n], f"host slot of layer {i} {n}[{lo}:{hi}]", self._content(i, n)))
        return (pairs, on_dev, on_host) if to_host else (pairs, on_host, on_dev)

    def _declare(self, what: str, reads=(), writes=()) -> None:
        self.engine.compute.access(what, reads, writes)

    # -- the four edges of the dependency rule -------------------------------------------------------
    @wait_primitive
    def _stall(self, ev, what: str, i: int) -> None:
        i = i if self.rounding is None else self._cur  # a pipeline rank's unit: the span names the layer waiting
        with self.timer.span(f"wait_{what}", i, "stall"):
            self.engine.compute.wait_event(ev)

    # on a pipeline rank the indices are the rank's units (forward u for edges 1 and 2, backward k for 3 and 4)
    def _events(self, kind: str) -> list:
        return getattr(self.rounding if self.rounding is not None else self, f"ev_{kind}")

    def _offload_waits_for_forward(self, i: int) -> None:  # edge 1
        self.engine.d2h.wait_event(self._events("fwd")[i])

    def _output_write_waits_for_offload(self, j: int) -> None:  # edge 2
        self._stall(self._events("off")[j], "offload", j)

    def _prefetch_waits_for_backward(self, i: int) -> None:  # edge 3
        self.engine.h2d.wait_event(self._events("bwd")[i])

    def _backward_waits_for_prefetch(self, j: int) -> None:  # edge 4
        self._stall(self._events("pf")[j], "prefetch", j)

    # -- a pipeline rank: which units the instance runs (module docs) ----------------------------------
    def bind(self, kind: str, chunk: int, mb: int) -> None:
        """The schedule binds the instance to a forward or backward step of (chunk, mb): a forward numbers its layers
        as the rank's units and points them at their forward buffers; a backward numbers them in backward order (the
        offloaded ones are pointed at their prefetch buffer when their prefetch is issued, `prefetch_unit`)."""
        r = self.rounding
        if r is None:
            return
        if kind == "fwd":
            u0 = r.fwd_base[(chunk, mb)]
            self.unit = [u0 + i for i in range(self.layers)]
            for i, st in enumerate(self.storages):
                b = rounding_buffer(u0 + i)
                st.tensors, self.where[i] = self._rank_tensors(r.fwd[b]), f"forward buffer {b}"
                st.keep_moe_internals = not r.offloaded(u0 + i)  # a kept unit keeps its MoE block's graph
        else:
            k0 = r.bwd_base[(chunk, mb)]
            self.k_of = {i: k0 + self.layers - 1 - i for i in range(self.layers)}

    def prefetch_unit(self, i: int, k: int, u: int) -> None:
        """Issue the prefetch of layer i, the rank's backward unit k (forward unit u), into prefetch buffer k % 2."""
        r, eng = self.rounding, self.engine
        b = rounding_buffer(k)
        self.storages[i].tensors, self.where[i] = self._rank_tensors(r.pf[b]), f"prefetch buffer {b}"
        if k >= N_BUFFERS:
            self._prefetch_waits_for_backward(k - N_BUFFERS)
        eng.h2d.wait_event(r.ev_off[u])  # the host slot the offload wrote
        pairs, reads, writes = self._copy(i, to_host=False)
        eng.h2d.copy_group(pairs, CopyLabel("prefetch" + self.tag, self.layer_base + i, "prefetch",
                                            self.layer_offload_bytes()), reads, writes)
        eng.h2d.record(r.ev_pf[k])

    # -- per layer -----------------------------------------------------------------------------------
    def storage_for_forward(self, i: int) -> LayerStorage:
        self._cur = i
        x, body = self._buf(i, ["x"]), self._buf(i, [n for n in self.names if n != "x"])
        if i == 0:  # layer 0's input is copied in from the embedding output
            j = self.rounding.input_write_waits_for(self.unit[0]) if self.rounding is not None else None
            if j is not None:  # a pipeline rank: the buffer's unit before it may still be on its way out
                self._output_write_waits_for_offload(j)
            self._declare("forward(0)", writes=x + body)
        else:  # later inputs were written by the previous layer's last op
            self._declare(f"forward({i})", reads=x, writes=body)
        return self.storages[i]

    def before_output_write(self, i: int) -> None:
        if i + 1 >= self.layers:
            return
        self._cur = i
        r = self.rounding
        j = output_write_waits_for(i, self.layers) if r is None else r.output_write_waits_for(self.unit[i])
        if j is not None:
            self._output_write_waits_for_offload(j)
        self._declare(f"forward({i}) output", writes=self._buf(i + 1, ["x"]))

    def after_forward(self, i: int) -> None:
        if not self.offloaded(i):
            return
        eng = self.engine
        e = i if self.rounding is None else self.unit[i]  # the event's index: the layer, or the rank's unit
        eng.compute.record(self._events("fwd")[e])
        self._offload_waits_for_forward(e)
        pairs, reads, writes = self._copy(i, to_host=True)
        eng.d2h.copy_group(pairs, CopyLabel("offload" + self.tag, self.layer_base + i, "offload", self.layer_offload_bytes()), reads, writes)
        eng.d2h.record(self._events("off")[e])
        if self.rounding is not None:
            self.rounding.after_offload(e)

    def recompute(self, compute, weights, storage, i: int) -> None:
        if not self.offloaded(i) or self.n_off >= self.tokens:
            return
        if self.engine is not None:
            self._declare(f"recompute({i})", reads=self._buf(i, self.whole),
                          writes=self._buf(i, self.split, (self.n_off, self.tokens)))
        compute.recompute_tokens(weights, storage, self.n_off, i)

    def storage_for_backward(self, i: int, weights) -> LayerStorage:
        self._cur = i
        if self.offloaded(i):
            if self.rounding is not None:
                self.rounding.check_prefetched(self.k_of[i])
            self._backward_waits_for_prefetch(i if self.rounding is None else self.k_of[i])
        s = self.storages[i]
        self.recompute(self.compute, weights, s, i)
        self._declare(f"backward({i})", reads=self._buf(i, self.names))
        return s

    def after_backward(self, i: int) -> None:
        if self.rounding is not None:  # the rank's rule issues what waited for this unit
            self.rounding.after_backward(self.k_of[i])
            return
        j = prefetch_launched_after_backward(i, self.layers)
        if j is None:
            return
        eng = self.engine
        eng.compute.record(self.ev_bwd[i])
        self._prefetch_waits_for_backward(i)
        pairs, reads, writes = self._copy(j, to_host=False)
        eng.h2d.copy_group(pairs, CopyLabel("prefetch" + self.tag, self.layer_base + j, "prefetch", self.layer_offload_bytes()), reads, writes)
        eng.h2d.record(self.ev_pf[j])

    def end_step(self) -> None:
        self.engine.raise_if_failed()

    def describe(self) -> dict:
        return {"policy": self.name, "fraction": self.fraction, "offload_tokens": self.n_off, "tokens": self.tokens,
                "offloaded_layers": self.n_offloaded, "layer_offload_bytes": self.layer_offload_bytes(),
                # what moves (a tensor this rank keeps none of, e.g. METP's fc1 and act, is not named)
                "whole": [n for n in self.whole if self.widths[n]], "split": [n for n in self.split if self.widths[n]]}
