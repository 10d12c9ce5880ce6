"""Sequence-aware offloading of a stage's activations (papers/sppo.txt sec. 5.2), on the executor's
copy streams (`memo_exec.streams`: worker threads with event semantics on CPU, side streams on CUDA).

A *unit* is one piece (subsequence, or part of one) through one layer of the stage. While a unit's
forward runs, a `torch.autograd.graph.saved_tensors_hooks` pair catches what autograd saves for
its backward. Token-major activations (``[b, n, width]`` with the piece's ``n`` tokens, or the
``[b*n, width]`` view F.linear saves of its input: x, ln1, q, attn, h1, ln2, fc1, act, ...) are the
offloadable ones, the same tensors the simulator's policy offloads; weights, the LayerNorm statistics, the
lse and the K/V chunks of every piece but the stage's last (which live in the K/V cache, `memo_exec.sppo.kvcache`)
stay. The stage's last piece's K/V is read by no later piece: `memo_exec.sppo.kvcache.PrefixAttention` saves it
through autograd, so it is offloaded and prefetched here with that piece's other activations (the simulator's
``cached_kv`` false for the stage's last piece, `memo_sim.policy.sppo`). After the
unit's forward its first ``floor(alpha_i * n)`` token rows of every offloadable tensor are copied
to pinned host memory on the d2h stream (alpha_i of the unit's subsequence i, from the plan), the
other rows are kept on the device and the full tensor is let go, so the copy runs while the next
unit computes. Each offloaded unit's host rows are one exact-size block (`memo_exec.activations.host_pool
.HostPool`, MEMO's pool: page-locked in place with ``cudaHostRegister``), made at the unit's first offload from the
shapes autograd saved and reused every step, its tensors' views at ``HOST_ALIGN`` offsets: the ``registered_pool``
layout the simulator sizes SPPO's host memory by (`memo_sim.memplan.footprint.sppo_host_stages`). A review: one
``torch.empty(..., pin_memory=True)`` per tensor went through PyTorch's pinned host allocator, which rounds each
request up to a power of two (gpt-7b, 384K, tp 2 pp 4: ~1.69 TiB pinned where the simulator said 1.22 TiB).
A stage's last two units go straight into backward and are not offloaded (the
simulator's rule, `memo_sim.policy.sppo.unit_is_offloaded`).

Before a piece's backward, every offloaded unit of that piece is prefetched on the h2d stream (it
waits for its offload's event); the unpack hook makes the compute stream wait for the prefetch's
event before autograd reads the tensor, so a late copy delays the backward but never changes it.
How long the compute stream waited there is the measured exposure of the prefetch: two marks of
the step clock (`memo_exec.sppo.clock`; CUDA events on the compute stream around the
``wait_event``), read at the end of the step. At the end of a step the streams are synchronised,
so the next step's offloads never overwrite host rows a prefetch still reads.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import torch

from memo_exec.activations.host_pool import HostPool
from memo_exec.errors import ExecError
from memo_exec.happens_before import Region
from memo_exec.sppo.clock import StepClock
from memo_exec.streams import CopyLabel
from memo_sim.policy.host_layout import offload_token_count
from memo_sim.policy.sppo import unit_is_offloaded


@dataclass
class _Saved:
    """One saved activation of one unit: whole on the device until the unit's offload, then split."""

    full: torch.Tensor | None
    shape: torch.Size
    rows: int = 0  # token rows on host
    host: torch.Tensor | None = None
    tail: torch.Tensor | None = None  # the rows kept on the device
    back: torch.Tensor | None = None  # the prefetched tensor


@dataclass
class UnitStats:
    piece: int
    layer: int
    offload_bytes: int = 0
    tensors: int = 0
    prefetch_wait_s: float = 0.0


@dataclass
class _Unit:
    key: tuple[int, int]
    saved: list[_Saved] = field(default_factory=list)
    by_id: dict = field(default_factory=dict)
    offloaded: bool = False
    off_ev: object = None
    pf_ev: object = None
    waited: bool = False
    stats: UnitStats | None = None
    wait_marks: list = field(default_factory=list)  # (before, after) the compute stream's prefetch wait


class SequenceOffload:
    """The offload of one stage (module docs). ``alphas[k]`` is piece k's ratio (its subsequence's
    alpha_i); ``layers`` the stage's layer count; ``streams`` a `memo_exec.streams` engine."""

    def __init__(self, streams, device: torch.device, alphas: list[float], layers: int, batch: int,
                 piece_tokens: list[int], param_ptrs: set[int], enabled: bool = True,
                 layer_ids: list[int] | None = None, tags: list[str] | None = None, timer=None,
                 clock: StepClock | None = None) -> None:
        self.streams, self.device = streams, device
        self.alphas, self.layers, self.batch = list(alphas), layers, batch
        self.tokens = list(piece_tokens)
        self.params = param_ptrs
        self.enabled = enabled
        self.layer_ids = layer_ids or list(range(layers))  # the model's layer index of each stage layer
        self.tags = tags or [str(k) for k in range(len(piece_tokens))]
        self.timer = timer  # `memo_exec.measure.Recorder` (optional): the prefetch waits become stall spans
        self.clock = clock or StepClock(device)  # the prefetch waits' marks, read in `end_step`
        self.n_units = len(piece_tokens) * layers
        self.pin = device.type == "cuda"
        self.pin_warning: str | None = None  # set when page-locking a unit's block failed (`HostPool`'s fallbacks)
        self.pool: dict[tuple, torch.Tensor] = {}  # host slot -> its view in a unit's block
        self.host_pools: list[HostPool] = []  # every unit's block, in the order they were made
        self.units: dict[tuple[int, int], _Unit] = {}
        self.stats: list[UnitStats] = []

    # -- forward ---------------------------------------------------------------------------------------
    def offloaded(self, k: int, j: int) -> bool:
        return self.enabled and unit_is_offloaded(k * self.layers + j, self.n_units) and \
            offload_token_count(self.alphas[k], self.tokens[k]) > 0

    @contextlib.contextmanager
    def unit(self, k: int, j: int):
        """Wrap the forward of unit (piece k, stage layer j); its offload is issued on exit."""
        if not self.offloaded(k, j):
            yield
            return
        u = self.units[(k, j)] = _Unit((k, j), stats=UnitStats(k, j))
        n = self.tokens[k]

        def pack(t: torch.Tensor):
            tok = self._token_view(t, n)
            if tok is None:
                return t
            key = (tok.data_ptr(), tuple(tok.shape), tuple(tok.stride()))
            if key not in u.by_id:
                u.by_id[key] = len(u.saved)
                u.saved.append(_Saved(tok, tok.shape))
            return (u, u.by_id[key], t.shape)

        def unpack(obj):
            if not isinstance(obj, tuple):
                return obj
            unit, i, shape = obj
            s = unit.saved[i]
            if s.full is not None:
                return s.full.view(shape)
            if not unit.waited:
                if unit.pf_ev is None:
                    raise ExecError(f"sppo: unit {unit.key} was not prefetched before its backward")
                span = self.timer.span("wait_prefetch", self.layer_ids[unit.key[1]], "stall") if self.timer \
                    else contextlib.nullcontext()
                with span:
                    before = self.clock.mark()
                    self._backward_waits_for_prefetch(unit)
                    unit.wait_marks.append((before, self.clock.mark()))
                unit.waited = True
            self.streams.compute.access(f"backward{unit.key}", reads=[self._region(s.back, unit, i, "prefetched")])
            return s.back.view(shape)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        with torch.no_grad():
            self._offload(u, n)

    def _token_view(self, t: torch.Tensor, n: int) -> torch.Tensor | None:
        """``t`` as ``[b, n, ...]`` when it is a token-major activation of the unit's ``n`` tokens,
        else None (weights, LayerNorm statistics, non-float tensors). F.linear saves its input
        flattened to ``[b*n, width]``: that view counts too (as ``[b, n, width]``), so the inputs
        of the QKV, out-proj, FC1 and FC2 GEMMs are offloaded like the other skeletal tensors, as
        the simulator's policy offloads them (`memo_sim.policy.sppo`)."""
        if t.dim() < 2 or t.shape[-1] == 1 or not t.is_floating_point() or t.data_ptr() in self.params:
            return None
        if t.dim() >= 3 and t.shape[0] == self.batch and t.shape[1] == n:
            return t
        if t.dim() == 2 and t.shape[0] == self.batch * n and t.is_contiguous():
            return t.view(self.batch, n, t.shape[1])
        return None

    def pool_bytes(self) -> int:
        """Host bytes the offload holds for its rows (page-locked on CUDA): every offloaded unit's exact-size block
        (`HostPool.held_bytes`), what the simulator prices as SPPO's pinned host memory."""
        return sum(p.held_bytes() for p in self.host_pools)

    def host_pool_describe(self) -> dict:
        """What ``measured.json`` may report of the blocks (as MEMO's ``meta.host_pool``)."""
        methods = sorted({p.method for p in self.host_pools})
        return {"bytes": self.pool_bytes(), "blocks": len(self.host_pools), "method": ", ".join(methods) or None,
                "pinned": bool(methods) and all(m in ("registered", "pinned_allocator") for m in methods),
                "warning": self.pin_warning}

    def _host_slots(self, k: int, j: int, specs: list[tuple[tuple, torch.dtype]]) -> list[torch.Tensor]:
        """The host slots of unit (piece k, layer j)'s saved tensors of ``specs`` (shape, dtype): the views made at its
        first offload, or views of a new exact-size block (`HostPool.layout_bytes`) where they are not there yet."""
        keys = [self._slot(k, j, i) for i in range(len(specs))]
        have = [self.pool.get(key) for key in keys]
        if all(t is not None and tuple(t.shape) == tuple(sh) and t.dtype == dt for t, (sh, dt) in zip(have, specs)):
            return have
        block = self._new_block(HostPool.layout_bytes(specs))
        out = [block.take(tuple(sh), dt) for sh, dt in specs]
        self.pool.update(zip(keys, out))
        return out

    def _new_block(self, nbytes: int) -> HostPool:
        """One unit's block, page-locked on CUDA. Where page-locking fails `HostPool` falls back (PyTorch's pinned
        allocator, then pageable memory: the copies then go through the driver's staging buffer and overlap compute
        less than planned); said once, as a ``RuntimeWarning``, and after a pageable fallback the later blocks are
        pageable at once."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            block = HostPool(nbytes, self.device, pin=self.pin)
        if block.warning and self.pin_warning is None:
            self.pin_warning = f"sppo: {block.warning}"
            warnings.warn(self.pin_warning, RuntimeWarning, stacklevel=3)
        if block.method == "pageable":
            self.pin = False
        self.host_pools.append(block)
        return block

    def close(self) -> None:
        """Unregister the blocks (after the streams' last copies: `HostPool.close` synchronises)."""
        for block in self.host_pools:
            block.close()

    # -- what the race detector sees (`memo_exec.happens_before`: physical regions with content) ---------
    def _region(self, t: torch.Tensor, u: _Unit, i: int, where: str) -> Region:
        return Region.of(t, f"{where} tensor {i} of unit {u.key}", f"unit {u.key} tensor {i}")

    def _slot(self, k: int, j: int, i: int) -> tuple:
        """The host slot (pool key) of saved tensor i of unit (piece k, layer j): the slot choice."""
        return (k, j, i)

    def _prefetch_source(self, u: _Unit, i: int) -> torch.Tensor:
        """The host rows the prefetch of unit ``u``'s tensor i reads (the slot its offload wrote)."""
        return u.saved[i].host

    # -- the waits (one method each; tests remove them one at a time) ------------------------------------
    def _offload_waits_for_forward(self, made) -> None:
        self.streams.d2h.wait_event(made)

    def _prefetch_waits_for_alloc(self, ready) -> None:
        self.streams.h2d.wait_event(ready)

    def _prefetch_waits_for_offload(self, u: _Unit) -> None:
        if u.off_ev is not None:
            self.streams.h2d.wait_event(u.off_ev)

    def _backward_waits_for_prefetch(self, u: _Unit) -> None:
        self.streams.compute.wait_event(u.pf_ev)

    def _offload(self, u: _Unit, n: int) -> None:
        k, j = u.key
        r = offload_token_count(self.alphas[k], n)
        pairs, reads, writes = [], [], []
        if u.saved:  # what the unit's forward wrote
            self.streams.compute.access(f"forward{u.key}", writes=[self._region(s.full, u, i, "saved")
                                                                   for i, s in enumerate(u.saved)])
        hosts = self._host_slots(k, j, [((s.full.shape[0], r) + tuple(s.full.shape[2:]), s.full.dtype)
                                        for s in u.saved]) if u.saved else []
        for i, s in enumerate(u.saved):
            t = s.full.detach()
            s.rows = r
            s.host = hosts[i]
            pairs.append((s.host, t[:, :r]))
            reads.append(self._region(t[:, :r], u, i, "saved"))
            writes.append(self._region(s.host, u, i, "host slot of"))
            s.tail = t[:, r:].clone()
            self.streams.compute.access(f"keep{u.key}", reads=[self._region(t[:, r:], u, i, "saved")],
                                        writes=[self._region(s.tail, u, i, "kept rows of")])
            u.stats.offload_bytes += s.host.numel() * s.host.element_size()
        u.stats.tensors = len(u.saved)
        if pairs:
            made = self.streams.event(f"forward({k},{j})")  # the copy reads what the compute stream wrote
            self.streams.compute.record(made)
            self._offload_waits_for_forward(made)
            self.streams.d2h.copy_group(pairs, CopyLabel(f"offload@{self.tags[k]}", self.layer_ids[j], "offload",
                                                           u.stats.offload_bytes), reads, writes)
            u.off_ev = self.streams.event(f"offload({k},{j})")
            self.streams.d2h.record(u.off_ev)
        self.streams.compute.release(f"offload{u.key}", [s.full for s in u.saved])
        for s in u.saved:
            s.full = None  # the copy stream holds the source until it has read it (record_stream on CUDA)
        u.offloaded = True

    # -- backward --------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefetch_piece(self, k: int) -> None:
        """Start the prefetch of every offloaded unit of piece k (before the piece's backward)."""
        for j in range(self.layers - 1, -1, -1):
            u = self.units.get((k, j))
            if u is None or not u.offloaded:
                continue
            pairs, reads, writes, fresh = [], [], [], []
            for i, s in enumerate(u.saved):
                s.back = torch.empty(s.shape, dtype=s.tail.dtype, device=self.device)
                src = self._prefetch_source(u, i)
                pairs += [(s.back[:, :s.rows], src), (s.back[:, s.rows:], s.tail)]
                fresh.append(Region.of(s.back, f"new tensor {i} of unit {u.key}"))
                reads += [self._region(src, u, i, "host slot of"), self._region(s.tail, u, i, "kept rows of")]
                writes.append(self._region(s.back, u, i, "prefetched"))
            self.streams.compute.access(f"alloc{u.key}", writes=fresh)
            ready = self.streams.event(f"alloc({k},{j})")  # the new device tensors and the kept rows exist
            self.streams.compute.record(ready)
            self._prefetch_waits_for_alloc(ready)
            self._prefetch_waits_for_offload(u)
            self.streams.h2d.copy_group(pairs, CopyLabel(f"prefetch@{self.tags[k]}", self.layer_ids[j], "prefetch",
                                                           u.stats.offload_bytes), reads, writes)
            u.pf_ev = self.streams.event(f"prefetch({k},{j})")
            self.streams.h2d.record(u.pf_ev)
            self.streams.compute.release(f"prefetch{u.key}", [s.tail for s in u.saved])
            for s in u.saved:
                s.tail = None

    def release_piece(self, k: int) -> None:
        """After piece k's backward: drop its units' prefetched tensors (statistics are kept)."""
        for j in range(self.layers):
            u = self.units.get((k, j))
            if u is not None:
                self.stats.append(u.stats)
                self.streams.compute.release(f"release{u.key}", [s.back for s in u.saved if s.back is not None])
                u.saved.clear()

    def end_step(self) -> list[UnitStats]:
        """Synchronise the copy streams, read the prefetch waits' marks, drop the step's units and
        return their statistics."""
        self.streams.synchronize()
        self.clock.synchronize()
        for u in self.units.values():
            u.stats.prefetch_wait_s = sum(self.clock.between(a, b) for a, b in u.wait_marks)
        out = [u.stats for u in self.units.values()]
        self.units.clear()
        self.stats = []
        return out
