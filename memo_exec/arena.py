"""Scratch tensors of one layer: from the caching allocator, or at planned offsets in one arena.

A layer asks its scratch allocator for every transient tensor by name (``get``) and gives it back
(``free``). `CachingScratch` takes them from PyTorch's caching allocator; `ArenaScratch` places
the ones that ``plan.memory_plan`` names at their byte offsets in one preallocated byte arena
(views through ``untyped_storage``-backed ``uint8`` slices and ``view(dtype)``; the layer's ops
write into them with ``out=``), and the rest go to the caching allocator and are reported.
Both can feed an `AllocRecorder`, which turns the malloc/free sequence into a
`memo_sim.request_trace.RequestTrace` (``memo-exec trace``, and the plan check below).

plan.json ``memory_plan``::

    {"arena_bytes": int, "phases": {"fwd"|"bwd": {"peak_bytes": int, "offsets": {name: byte_offset}}}}

The arena is the largest level-1 phase peak (``phases.*.peak_bytes``): one layer's forward and
backward reuse it, layer after layer. A bi-level plan's top-level ``arena_bytes`` is its level-2
(whole-model) arena, which also holds the rounding buffers, hidden states and the classifier
chunk; the executor allocates those once on their own, so it does not allocate that arena.

Offsets are for the plan's dtype (or for ``memory_plan.element_bytes`` when the plan says at which
element width its sizes were recorded); when the executor computes in a wider dtype (fp32 on CPU
for a bf16 plan) every offset and the arena size are multiplied by the width ratio, which keeps any
valid placement valid. Before anything is allocated the plan is checked against the layer's real
request sequence (recorded on the meta device): an unknown phase or name, a tensor that runs past
the arena, or two simultaneously live tensors whose ranges overlap is a `MemoryPlanError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from memo_exec.errors import ExecError, MemoryPlanError
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.model.layer_graph import UNPLACED
from memo_sim.plan.contract import MemoryPlan

PLAN_PHASES = ("fwd", "bwd")

TP_SUFFIXES = ("_gathered", "_regathered", "_partial")  # tensor/sequence-parallel scratch of a plan run on one device


def unplaced_reason(ap: "ArenaPlan", phase: str, name: str) -> str | None:
    """Why a plan name that this executor does not place is still a legitimate name (the plan's
    own ``unplaced`` list, from the simulator's traces; for plans written before plans carried
    it, the simulator's table of such tensors), or None."""
    r = ap.unplaced.get(phase, {}).get(name)
    if r is None:
        r = UNPLACED.get(phase, {}).get(name)
    if r is not None:
        return r
    if name.endswith(TP_SUFFIXES) and not ap.split:  # a TP rank's layer requests them: not placed is a mismatch
        return "tensor/sequence-parallel tensor; this executor runs one device (tp=1)"
    return None


def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype, device="meta").element_size()


class AllocRecorder:
    """Malloc/free requests in order: ``(op, phase, name, nbytes)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, int]] = []

    def malloc(self, phase: str, name: str, nbytes: int) -> None:
        self.events.append(("malloc", phase, name, nbytes))

    def free(self, phase: str, name: str) -> None:
        self.events.append(("free", phase, name, 0))

    def names(self, phase: str) -> list[str]:
        return [n for op, ph, n, _ in self.events if op == "malloc" and ph == phase]

    def buffers(self, layer: int = 0, kind: str = "transient") -> list[Buffer]:
        """One buffer per malloc: lifetime [its malloc step, its free step) in request steps."""
        open_: dict[tuple[str, str], tuple[int, int]] = {}
        seen: dict[tuple[str, str], int] = {}
        out: list[Buffer] = []
        for step, (op, ph, name, nb) in enumerate(self.events):
            key = (ph, name)
            if op == "malloc":
                if key in open_:
                    raise ExecError(f"scratch {ph}:{name} allocated twice without a free")
                open_[key] = (step, nb)
            else:
                if key not in open_:
                    raise ExecError(f"scratch {ph}:{name} freed but not allocated")
                lo, nb0 = open_.pop(key)
                k = seen.get(key, 0)
                seen[key] = k + 1
                bid = f"{ph}:{name}" + (f"#{k}" if k else "")
                out.append(Buffer(id=bid, size=nb0, lower=lo, upper=step, phase=ph, layer=layer, kind=kind,
                                  name=name))
        end = len(self.events)
        for (ph, name), (lo, nb0) in open_.items():
            out.append(Buffer(id=f"{ph}:{name}", size=nb0, lower=lo, upper=end, phase=ph, layer=layer, kind=kind,
                              name=name))
        out.sort(key=lambda b: (b.lower, b.id))
        return out

    def trace(self, name: str = "", meta: dict | None = None, layer: int = 0) -> RequestTrace:
        return RequestTrace(self.buffers(layer=layer), name=name, meta=dict(meta or {}))


class CachingScratch:
    """Transient tensors from PyTorch's caching allocator."""

    def __init__(self, device: torch.device, recorder: AllocRecorder | None = None) -> None:
        self.device = torch.device(device)
        self.recorder = recorder
        self.phase = "fwd"
        self.prefix = ""
        self._live: dict[str, torch.Tensor] = {}

    def set_phase(self, phase: str) -> None:
        if self._live:
            raise ExecError(f"scratch tensors still live at the end of phase {self.phase}: {sorted(self._live)}")
        self.phase = phase

    def _full(self, name: str) -> str:
        return self.prefix + name

    def _alloc(self, full: str, shape, dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def get(self, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
        full = self._full(name)
        if full in self._live:
            raise ExecError(f"scratch {self.phase}:{full} requested twice while live")
        shape = tuple(int(s) for s in shape)
        if self.recorder is not None:
            self.recorder.malloc(self.phase, full, _nbytes(shape, dtype))
        t = self._alloc(full, shape, dtype)
        self._live[full] = t
        return t

    def free(self, name: str) -> None:
        full = self._full(name)
        if full not in self._live:
            raise ExecError(f"scratch {self.phase}:{full} freed but not live")
        del self._live[full]
        self._release(full)
        if self.recorder is not None:
            self.recorder.free(self.phase, full)

    def _release(self, full: str) -> None:
        return None


@dataclass
class ArenaPlan:
    arena_bytes: int  # the largest phase peak (scaled): what the executor allocates
    offsets: dict[str, dict[str, int]]  # phase -> executor tensor name -> byte offset (already scaled)
    scale: int = 1
    peaks: dict[str, int] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)  # "phase:plan name" -> why it is not placed
    model_arena_bytes: int = 0  # the plan's top-level (level-2) arena_bytes, scaled; not allocated
    unplaced: dict[str, dict[str, str]] = field(default_factory=dict)  # phase -> plan name -> why not placed
    renamed: dict[str, dict[str, str]] = field(default_factory=dict)  # phase -> plan name -> executor name
    split: bool = False  # checked against a TP rank's layer (``names`` given to `parse_memory_plan`)


def parse_memory_plan(mp: MemoryPlan, plan_elem_bytes: int, exec_elem_bytes: int,
                      names: dict[str, dict[str, str]] | None = None) -> ArenaPlan:
    """plan.memory_plan -> `ArenaPlan` with offsets scaled to the executor's element width; ``names``: phase ->
    {plan name: executor name} where the executor's layer names a planned tensor otherwise (a TP rank's buffers,
    `memo_exec.distributed.tp.megatron.PLAN_NAMES`), applied to the offsets and the plan's ``unplaced`` alike."""
    scale = max(1, math.ceil(exec_elem_bytes / plan_elem_bytes))
    phases = mp.phases
    unknown = sorted(set(phases) - set(PLAN_PHASES))
    if unknown:
        raise MemoryPlanError(f"memory_plan.phases: unknown phase {unknown[0]!r}; this executor plans "
                              f"{', '.join(PLAN_PHASES)}")
    offsets: dict[str, dict[str, int]] = {}
    renamed: dict[str, dict[str, str]] = {}
    for ph, body in phases.items():
        rename = (names or {}).get(ph, {})
        mine: dict[str, int] = {}
        for n, o in body.offsets.items():
            mine[rename.get(str(n), str(n))] = int(o) * scale
        if len(mine) < len(body.offsets):
            raise MemoryPlanError(f"memory_plan.phases.{ph}.offsets: two plan names map to one executor tensor "
                                  f"({rename}); re-plan with memo-sim")
        offsets[ph] = mine
        renamed[ph] = {n: e for n, e in rename.items() if n in body.offsets}
    peaks = {ph: body.peak_bytes * scale for ph, body in phases.items()}
    return ArenaPlan(max(peaks.values(), default=0), offsets, scale, peaks,
                     model_arena_bytes=mp.arena_bytes * scale,
                     unplaced={ph: {(names or {}).get(ph, {}).get(n, n): r for n, r in body.unplaced.items()}
                               for ph, body in phases.items()},
                     renamed={ph: r for ph, r in renamed.items() if r}, split=names is not None)


def validate_memory_plan(ap: ArenaPlan, recorder: AllocRecorder, backend: str = "",
                         fewer_layers: tuple[int, int] | None = None) -> list[str]:
    """Check the plan against the recorded request sequence (recorded with attention backend
    ``backend``; ``fewer_layers``: (the run's, the plan's) layer counts where the run has fewer, whose layer may
    request fewer tensors than the plan places); return the names it leaves unplaced."""
    for ph, offs in ap.offsets.items():
        known = set(recorder.names(ph))
        for name in sorted(offs):
            if name in known:
                continue
            why = unplaced_reason(ap, ph, name)
            if why is None and fewer_layers is not None and name.startswith("rc_") and \
                    not any(n.startswith("rc_") for n in known):  # (a review: --layers 2 of MEMO was refused here)
                why = (f"a re-run tensor, and a run of {fewer_layers[0]} of the plan's {fewer_layers[1]} layers "
                       f"(--layers) re-runs nothing")
            if why is None:
                other = (f"; the plan was recorded with the math attention backend (attn_* scratch) and this run "
                         f"uses {backend}: record the layer trace with --attention-backend {backend}"
                         if name.startswith(("attn_", "rc_attn_")) and backend and backend != "math" else "")
                raise MemoryPlanError(
                    f"memory_plan.phases.{ph}.offsets: {name!r} is not a tensor this executor's layer allocates in "
                    f"{ph} with the {backend or 'chosen'} attention backend (it allocates: "
                    f"{', '.join(sorted(known)) or 'nothing'}){other}")
            ap.ignored[f"{ph}:{name}"] = why
        for name in [n for n in offs if f"{ph}:{n}" in ap.ignored]:
            del offs[name]
    live: dict[tuple[str, str], tuple[int, int]] = {}
    unplanned: list[str] = []
    for op, ph, name, nb in recorder.events:
        off = ap.offsets.get(ph, {}).get(name)
        if off is None:
            if op == "malloc" and f"{ph}:{name}" not in unplanned:
                unplanned.append(f"{ph}:{name}")
            continue
        if op == "free":
            live.pop((ph, name), None)
            continue
        end = off + nb
        if end > ap.arena_bytes:
            scaled = f", offsets scaled x{ap.scale} for the wider dtype" if ap.scale > 1 else ""
            raise MemoryPlanError(f"memory_plan: {ph}:{name} at offset {off} with {nb} bytes runs past the arena "
                                  f"({ap.arena_bytes} bytes{scaled})")
        for (ph2, n2), (o2, e2) in live.items():
            if off < e2 and o2 < end:
                raise MemoryPlanError(f"memory_plan: {ph}:{name} [{off}, {end}) overlaps {ph2}:{n2} [{o2}, {e2}) "
                                      f"while both are live")
        live[(ph, name)] = (off, end)
    return unplanned


class ArenaScratch(CachingScratch):
    """Planned names at their offsets in one byte arena; other names from the caching allocator."""

    def __init__(self, device: torch.device, plan: ArenaPlan, recorder: AllocRecorder | None = None) -> None:
        super().__init__(device, recorder)
        self.plan = plan
        self.arena = torch.empty(plan.arena_bytes, dtype=torch.uint8, device=self.device)
        self._ranges: dict[str, tuple[int, int]] = {}
        self.unplanned: set[str] = set()

    def _alloc(self, full: str, shape, dtype) -> torch.Tensor:
        off = self.plan.offsets.get(self.phase, {}).get(full)
        if off is None:
            self.unplanned.add(f"{self.phase}:{full}")
            return super()._alloc(full, shape, dtype)
        nb = _nbytes(shape, dtype)
        esize = torch.empty((), dtype=dtype, device="meta").element_size()
        if off % esize:
            raise MemoryPlanError(f"memory_plan: {self.phase}:{full} offset {off} is not aligned to {dtype}")
        if off + nb > self.arena.numel():
            raise MemoryPlanError(f"memory_plan: {self.phase}:{full} needs [{off}, {off + nb}) beyond the "
                                  f"{self.arena.numel()}-byte arena")
        for n2, (o2, e2) in self._ranges.items():
            if off < e2 and o2 < off + nb:
                raise MemoryPlanError(f"memory_plan: {self.phase}:{full} overlaps live {n2} in the arena")
        self._ranges[full] = (off, off + nb)
        return self.arena[off:off + nb].view(dtype).view(shape)

    def _release(self, full: str) -> None:
        self._ranges.pop(full, None)

    def between_layers(self) -> torch.Tensor | None:
        """The whole arena while no layer tensor is placed in it (between the last forward and the
        first backward): the classifier's chunk tensors go there, as the plan's level-2 arena puts
        ``classifier_chunk`` over the layer blocks; None while a layer tensor is live."""
        return None if self._ranges else self.arena
