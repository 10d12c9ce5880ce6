"""Identical layers simulated once: fold a periodic iteration, check it, unfold the result.

A transformer's middle layers get the same ops and dependencies
(`memo_sim.engine.schedules.layer_signature`), and once the streams have settled the simulated
iteration repeats itself from one layer to the next: every event of layer k+1 (an op starting
or ending, a memory sample) comes one *period* after its counterpart of layer k, with the layer
index one up (forward) or down (backward), and every memory value higher by the bytes one layer
leaves behind. So `simulate` lays out `FOLD_LAYERS` layers instead of the model's n
(`build_iteration(layers=...)`), runs that short schedule once with the engine's event log and
no memory limit, and this module

1. **checks** that the short run is periodic around its middle layer ``CUT``: in the forward,
   the windows between the first ops of consecutive layers' forwards, the copied one (layer
   ``CUT - 1``'s), ``CHECKED`` before it and two after it, hold the same events in the same order (same op up to the layer index, same
   memory action), each one period after the one in the window before, within `TIME_TOLERANCE`
   of the short run's length, every memory value shifted by the same bytes per window; the same
   for the backward windows (first op of each layer's recompute or backward), the copied one
   (layer ``CUT``'s), ``CHECKED`` before it and two after it; and no op that started before those windows is still running
   when the copied window starts. A run that fails a check is not folded: `unfold` returns None
   and `simulate` runs the whole schedule.
2. **unfolds**: the whole run is the short one with G = n - FOLD_LAYERS copies of the forward
   window before the cut (layer ``CUT - 1``'s) inserted at the cut, and G copies of the backward
   window before the backward cut (layer ``CUT``'s) inserted there. An event after a cut moves by
   the inserted periods and bytes; an op's layer index moves by G between the two cuts (short
   layer i >= CUT is layer i + G of the model). An op moves with its start, so an op started
   before a cut and still running after it keeps both its times (in the whole run, the copies
   run where the short run's later layers ran).
3. **finds a failure** as the engine would: the first allocation in the unfolded event order
   that takes GPU or pinned host memory past capacity; the run stops there (ops started before
   it ran, the rest did not). Before the cut the short run's events are the whole run's, in the
   same order. After it, where another stream has an event at the failing instant, which of the
   two came first is up to the order in which SimPy scheduled them, which rounding can change
   between a short and a whole run: `Unfolded.tie` says so and `simulate` runs the whole
   schedule (5 of 247 failed runs tied, on every 11th of the sim-speed benchmark's candidates).
   A failing run is folded too: though the whole one stops at its failure, building and
   running 10 layers costs less than building them all (reports/sim-speed.md's breakdown times
   both, by outcome).

The same machinery folds a micro-batch pipeline's steady state (`unfold_window`, planned by
`memo_sim.engine.schedules.microbatch_fold`): one family of windows (between rank 0's forwards
of consecutive micro-batch groups, every rank's events inside) instead of the forward and
backward ones, checked and unfolded as above. What an op's index is (its layer here, its
micro-batch there), how it is compared between windows and how names move with it is a
`Labels` object's.

Exactness: tests/test_engine_pipeline_fold.py holds folded pipelines to whole runs the same way;
tests/test_engine_periodic.py holds folded results (status, times, peaks, failures,
exposed copy and P2P time, layer timings, the timeline's events and memory samples) to whole
runs within 1e-9 for every policy with TP/SP, CP, Ulysses, METP and ZeRO-3, OOM and OOHM cases.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from memo_sim.engine.core import HOST_DEVICE_BASE, EngineRun, Failure
from memo_sim.engine.events import MEMORY_SAMPLE, OP_END, OP_START
from memo_sim.engine.graph import Op
from memo_sim.engine.result import busy_time
from memo_sim.timeline import MemorySample, TimelineEvent

FOLD_LAYERS = 10  # layers the short schedule lays out
CUT = 5  # its layer where the copies go in (layers below are the model's, from here on + G)
CHECKED = 1  # windows checked before the copied one (and two after it)
MIN_COPIES = 4  # fold only when it saves at least this many layers
TIME_TOLERANCE = 1e-12  # of the short run's length
BYTES_TOLERANCE = 1e-12  # of the largest memory value


@dataclass(frozen=True)
class Fold:
    """Which short schedule stands for the model's: ``simulated`` of its ``layers`` layers, and
    the allocator stalls keyed by the short schedule's layers (``allocator_stall``)."""

    layers: int
    simulated: int = FOLD_LAYERS
    cut: int = CUT
    allocator_stall: dict | None = None

    @property
    def copies(self) -> int:
        return self.layers - self.simulated

    def model_layer(self, short: int) -> int:
        """The model's layer that the short schedule's layer ``short`` is (outside the copies)."""
        return short if short < self.cut else short + self.copies


def plan_fold(layers: int, signature, allocator_stall: dict[str, float] | None = None,
              kinds: tuple = ()) -> Fold | None:
    """The fold for a model of ``layers`` layers, or None where there is none to make.

    ``signature(i, n)``: what the schedule does with layer i of n
    (`memo_sim.engine.schedules.layer_signature` for a policy); a layer's allocator stalls
    (``allocator_stall`` keys ``L<i>.fwd`` / ``L<i>.bwd``, by the model's layer) are part of it, and so is its
    kind where the model's layers differ (``kinds``, by the model's layer: `memo_sim.model.layer_kinds`).
    The model's layer sequence must be the short one's with G copies of its layer ``CUT - 1``
    inserted at ``CUT``, and the layers the check reads must all look alike. Where the kinds differ, a short run
    one layer longer, its cut one layer later, is tried next, up to `MAX_SHIFT` (DeepSeek-V3's first three dense
    layers reach into the checked windows of the shortest)."""
    for shift in range(MAX_SHIFT + 1 if kinds else 1):
        fold = _fold_at(Fold(layers, FOLD_LAYERS + shift, CUT + shift), signature, allocator_stall, kinds)
        if fold is not None:
            return fold
    return None


MAX_SHIFT = 6  # layers a fold's cut may move past CUT where the layers' kinds differ


def _fold_at(fold: Fold, signature, allocator_stall: dict[str, float] | None, kinds: tuple) -> Fold | None:
    """`plan_fold`'s checks of one short run and cut, and its allocator stalls by short layer; None where they fail."""
    layers = fold.layers
    g, c, n_short = fold.copies, fold.cut, fold.simulated
    if g < MIN_COPIES:
        return None
    stall = dict(allocator_stall or {})

    def stalls(i: int) -> tuple[float, float]:
        return stall.get(f"L{i}.fwd", 0.0), stall.get(f"L{i}.bwd", 0.0)

    def kind(i: int) -> tuple:
        return (kinds[i],) if kinds else ()

    short = [signature(i, n_short) + stalls(fold.model_layer(i)) + kind(fold.model_layer(i)) for i in range(n_short)]
    whole = [signature(i, layers) + stalls(i) + kind(i) for i in range(layers)]
    if whole != short[:c] + [short[c - 1]] * g + short[c:]:
        return None
    lo, hi = c - CHECKED - 2, c + CHECKED + 1  # every layer the checked windows touch
    if lo < 0 or hi >= n_short or any(short[i] != short[c] for i in range(lo, hi + 1)):
        return None
    short_stall = {}
    for key, v in stall.items():
        layer, dot, rest = key.partition(".")
        if key.startswith("L") and dot and layer[1:].isdigit():
            i = int(layer[1:])
            if v > 0:  # those in the copies are equal to their template's (checked above)
                if c <= i < c + g:
                    continue
                short_stall[f"L{i if i < c else i - g}.{rest}"] = v
        else:
            short_stall[key] = v
    return Fold(layers, n_short, c, allocator_stall=short_stall)


# ------------------------------------------------------------------------------------- labels
class Labels:
    """What repeats from one window to the next: each op's *index* (the layer, for the layer
    fold; the micro-batch, for a pipeline's `memo_sim.engine.schedules.microbatch.MicroBatchLabels`)
    moves by the window's step, and everything else about the op stays. A fold reads and writes
    the index only through these methods."""

    def index(self, op: Op) -> int | None:
        return op.layer

    def same(self, a: Op, b: Op, step: int) -> bool:
        """``b`` is ``a`` one window later: the same op, its index ``step`` further."""
        if a.name != b.name or (a.layer is None) != (b.layer is None):
            return False
        return a.layer is None or b.layer - a.layer == step

    def name(self, op: Op, d: int) -> str:
        """The op's name in the whole run, its index moved by ``d``."""
        return op.name

    def layer(self, op: Op, d: int) -> int | None:
        return None if op.layer is None else op.layer + d

    def tensor(self, tensor: str, op: Op | None, d: int) -> str:
        """A tensor's name in the whole run (what a failure names)."""
        if op is None or op.layer is None:
            return tensor
        return _relabel(tensor, op.layer, op.layer + d)


LAYERS = Labels()


# ----------------------------------------------------------------------------------- segments
@dataclass
class _Segment:
    """Events ``lo:hi`` of the short run's log, appearing in the whole run once per ``m`` in
    ``reps``: times + dt + m * period, layer indices + dl + m * step, bytes + dv + m * dbytes."""

    lo: int
    hi: int
    reps: range
    dt: float
    dl: int
    dv: dict
    period: float = 0.0
    step: int = 0
    dbytes: dict = field(default_factory=dict)
    repeats: bool = False  # a copied window: an event past its end continues in the next copy

    def shift(self, m: int) -> tuple[float, int, dict]:
        if not self.repeats:
            return self.dt, self.dl, self.dv
        dv = {k: self.dv.get(k, 0.0) + m * self.dbytes.get(k, 0.0) for k in set(self.dv) | set(self.dbytes)}
        return self.dt + m * self.period, self.dl + m * self.step, dv


def _key(s: MemorySample) -> tuple[int, str]:
    return (s.device, s.kind)


class _Log:
    """The short run's event log, indexed."""

    def __init__(self, run: EngineRun):
        self.run = run
        self.events = run.events
        self.samples = run.memory
        self.src = run.sample_src
        self.start_pos: dict[int, int] = {}
        self.end_pos: dict[int, int] = {}
        self.started: list[Op] = []  # in start order
        self.start_positions: list[int] = []
        for i, (kind, x) in enumerate(self.events):
            if kind == OP_START:
                self.start_pos[x.uid] = i
                self.started.append(x)
                self.start_positions.append(i)
            elif kind == OP_END:
                self.end_pos[x.uid] = i

    def ops_between(self, lo: int, hi: int) -> list[Op]:
        """Ops that started at events ``lo:hi``, in start order."""
        return self.started[bisect_left(self.start_positions, lo):bisect_left(self.start_positions, hi)]

    def samples_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(event position, sample index) of the memory samples at events ``lo:hi``."""
        return [(pos, x) for pos, (kind, x) in enumerate(self.events[lo:hi], lo) if kind == MEMORY_SAMPLE]


def _same_window(log: _Log, a0: int, a1: int, b0: int, b1: int, period: float, step: int,
                 tol_t: float, tol_v: float, labels: Labels = LAYERS) -> dict | None:
    """Window ``b0:b1`` is window ``a0:a1`` one period later: the bytes it is shifted by per
    (device, space), or None."""
    if a1 - a0 != b1 - b0:
        return None
    ev, samples, src = log.events, log.samples, log.src
    dv: dict[tuple[int, str], float] = {}
    for i in range(a1 - a0):
        ka, xa = ev[a0 + i]
        kb, xb = ev[b0 + i]
        if ka != kb:
            return None
        if ka == MEMORY_SAMPLE:
            sa, sb = samples[xa], samples[xb]
            if sa.device != sb.device or sa.kind != sb.kind or src[xa][2] != src[xb][2]:
                return None
            if abs(sb.time - sa.time - period) > tol_t:
                return None
            key, d = _key(sa), sb.nbytes - sa.nbytes
            if key in dv:
                if abs(d - dv[key]) > tol_v:
                    return None
            else:
                dv[key] = d
            continue
        if (xa.stream != xb.stream or xa.device != xb.device or xa.phase != xb.phase or xa.kind != xb.kind
                or not labels.same(xa, xb, step)):
            return None
        ta, tb = (xa.start, xb.start) if ka == OP_START else (xa.end, xb.end)
        if abs(tb - ta - period) > tol_t:
            return None
    return dv


def _periodic(log: _Log, anchors: list[Op], copied: Op, step: int, tol_t: float,
              tol_v: float, labels: Labels = LAYERS) -> tuple[float, dict] | None:
    """Consecutive windows between ``anchors`` (first ops of consecutive layers, in run order)
    all repeat with one period, and no op that started before them still runs when the window
    that starts at ``copied`` does: (period, bytes per window), or None."""
    pos = [log.start_pos.get(a.uid) for a in anchors]
    if any(p is None for p in pos) or any(b <= a for a, b in zip(pos, pos[1:])):
        return None
    period = anchors[1].start - anchors[0].start
    shift = None
    for k in range(len(anchors) - 2):
        p = anchors[k + 2].start - anchors[k + 1].start
        if abs(p - period) > tol_t:
            return None
        dv = _same_window(log, pos[k], pos[k + 1], pos[k + 1], pos[k + 2], period, step, tol_t, tol_v, labels)
        if dv is None:
            return None
        if shift is None:
            shift = dv
        elif set(dv) != set(shift) or any(abs(dv[key] - shift[key]) > tol_v for key in dv):
            return None
    # nothing from before the checked windows may still run when the copied window starts
    for op, p in zip(log.started, log.start_positions):
        if p >= pos[0]:
            break
        if op.end is None or op.end > copied.start + tol_t:
            return None
    return period, shift or {}


def _relabel(tensor: str, layer: int | None, new: int | None) -> str:
    if layer is None or new is None or new == layer:
        return tensor
    prefix = f"L{layer}."
    return f"L{new}." + tensor[len(prefix):] if tensor.startswith(prefix) else tensor


class Unfolded:
    """The whole run a folded one stands for (see the module docs): filled by `unfold`."""

    def __init__(self, fold, log: _Log, segments: list[_Segment], gpu_capacity: float, host_capacity: float,
                 labels: Labels = LAYERS):
        self.fold, self.log, self.segments, self.labels = fold, log, segments, labels
        self.gpu_capacity, self.host_capacity = gpu_capacity, host_capacity
        self.end_time = 0.0
        self.failure: Failure | None = None
        self.failure_at: tuple[int, int, int] | None = None  # (segment, copy m, event) of the failing sample
        self.peak_gpu: dict[int, float] = {}
        self.peak_host: dict[int, float] = {}
        self.end_gpu: dict[int, float] = {}
        self.end_host: dict[int, float] = {}
        self.n_ops = 0
        self.link_carried: dict[str, float] = {}
        self.tie = False  # another stream has an event at the failure's time (see `_tie_at`)
        self._ops = [log.ops_between(seg.lo, seg.hi) for seg in segments]
        self._samples = [log.samples_between(seg.lo, seg.hi) for seg in segments]
        self._by_index: list[dict[int, list[Op]]] = []  # per segment: its ops by their index (`Labels`)
        for ops in self._ops:
            d: dict[int, list[Op]] = {}
            for op in ops:
                i = labels.index(op)
                if i is not None:
                    d.setdefault(i, []).append(op)
            self._by_index.append(d)

    # -- order ---------------------------------------------------------------------------------
    def _order(self):
        """(segment index, copy m) in the whole run's order."""
        for si, seg in enumerate(self.segments):
            for m in seg.reps:
                yield si, m

    def _before_failure(self, si: int, m: int, pos: int) -> bool:
        return self.failure_at is None or (si, m, pos) < self.failure_at

    def _end_at(self, si: int, m: int, end_pos: int) -> tuple[int, int, int]:
        """Where an op's end lands in the whole run's order, its start being in copy ``m`` of
        segment ``si``: past the segment's end it continues in the next copy (one window
        earlier in the log) or in the next segment."""
        seg = self.segments[si]
        while end_pos >= seg.hi and si < len(self.segments) - 1:
            if seg.repeats and m < seg.reps.stop - 1:
                end_pos -= seg.hi - seg.lo
                m += 1
                continue
            si += 1
            seg = self.segments[si]
            if seg.repeats:
                end_pos -= seg.hi - seg.lo
            m = seg.reps.start
        return si, m, end_pos

    def _ended(self, si: int, m: int, op: Op) -> bool:
        ep = self.log.end_pos.get(op.uid)
        return ep is not None and self._before_failure(*self._end_at(si, m, ep))

    # -- instances (whole-run views, for timelines) ---------------------------------------------
    def op_instances(self):
        """Every op of the whole run that started, as (op, dt, dl, ended): its short-run op, the
        time and layer shifts, whether it ended (a failed run stops at the failure)."""
        for si, m in self._order():
            seg = self.segments[si]
            dt, dl, _dv = seg.shift(m)
            for op in self._ops[si]:
                if not self._before_failure(si, m, self.log.start_pos[op.uid]):
                    return
                yield op, dt, dl, self._ended(si, m, op)

    def samples(self):
        """Every memory sample of the whole run, in order (up to a failure)."""
        log = self.log
        for si, m in self._order():
            dt, _dl, dv = self.segments[si].shift(m)
            for pos, x in self._samples[si]:
                if not self._before_failure(si, m, pos):
                    return
                s = log.samples[x]
                yield MemorySample(s.time + dt, s.device, s.kind, s.nbytes + dv.get(_key(s), 0.0))

    def timeline_events(self) -> list[TimelineEvent]:
        lb = self.labels
        out = [TimelineEvent(lb.name(op, dl), lb.layer(op, dl), op.phase, op.stream, op.device,
                             op.start + dt, op.end + dt, op.nbytes, op.flops)
               for op, dt, dl, ended in self.op_instances() if ended]
        out.sort(key=lambda e: (e.start, e.device, e.stream))
        return out

    # -- summaries (per segment, without walking every copy) ------------------------------------
    def exposed_wait_seconds(self, parts: dict[int, float]) -> float:
        """Sum of the short run's per-op exposed waits (``parts``: op uid -> seconds, from
        `memo_sim.engine.simulate.exposed_wait_parts`) over the whole run's ops that started."""
        at = [(self.log.start_pos[uid], x) for uid, x in parts.items() if x]
        total = 0.0
        for si, seg in enumerate(self.segments):
            mine = [(p, x) for p, x in at if seg.lo <= p < seg.hi]
            if self.failure_at is None or si < self.failure_at[0]:
                total += len(seg.reps) * sum(x for _p, x in mine)
                continue
            if si > self.failure_at[0]:
                break
            for m in seg.reps:
                if m < self.failure_at[1]:
                    total += sum(x for _p, x in mine)
                elif m == self.failure_at[1]:
                    total += sum(x for p, x in mine if p < self.failure_at[2])
            break
        return total

    def phase_spans(self, index: int, phases: tuple[str, ...], copies: tuple[str, ...],
                    keep=None) -> dict[str, float]:
        """Seconds of the phases of the whole run's ops of index ``index`` (a layer, or a
        micro-batch; `Labels`) that ``keep(op)`` keeps (default all: the time some of them ran, the union of
        their intervals, `memo_sim.engine.result.busy_time`; 0 unless all ran) and of its copies (0 unless it
        ran), as `memo_sim.engine.simulate.layer_timings`."""
        spans: dict[str, list] = {p: [] for p in phases}
        out: dict[str, float] = {}
        for si, seg in enumerate(self.segments):
            for m in seg.reps:
                dt, dl, _dv = seg.shift(m)
                for op in self._by_index[si].get(index - dl, ()):
                    if (keep is not None and not keep(op)) or not self._before_failure(si, m, self.log.start_pos[op.uid]):
                        continue
                    ended = self._ended(si, m, op)
                    if op.phase in spans:
                        spans[op.phase].append(op.end + dt if ended else None)
                        spans[op.phase].append(op.start + dt)
                    elif op.phase in copies:
                        out[op.phase] = (op.end - op.start) if ended else 0.0
        for p, xs in spans.items():
            ends, starts = xs[0::2], xs[1::2]
            out[p] = 0.0 if not xs or any(e is None for e in ends) else busy_time(list(zip(starts, ends)))
        for c in copies:
            out.setdefault(c, 0.0)
        return out


def unfold(run: EngineRun, phases: dict[tuple[int, str], list[Op]], fold: Fold, *, gpu_capacity: float,
           host_capacity: float, devices: dict, routes: dict | None = None) -> Unfolded | None:
    """The whole run of ``fold``'s model from the short run ``run`` (engine ``log=True``, no
    memory limit), or None when the short run is not periodic around the cut.

    ``phases``: the short schedule's (layer, fwd|bwd|recompute) -> ops; ``devices``: the graph's
    devices (host bytes scale by their group); ``routes``: the engine's link routes, to count the
    bytes each link carried (None: no contention, nothing counted)."""
    if run.failure is not None:
        return None
    log = _Log(run)
    c, g = fold.cut, fold.copies
    tol_t, tol_v = _tolerances(run)

    def first(layer: int, names: tuple[str, ...]) -> Op | None:
        for nm in names:
            ops = phases.get((layer, nm))
            if ops:
                return ops[0]
        return None

    # windows from CHECKED layers before the copied one to one past the cut; the copied windows:
    # forward of short layer c-1 (up to the cut, layer c's first op), backward of layer c
    fwd = {k: first(k, ("fwd",)) for k in range(c - 1 - CHECKED, c + 3)}
    bwd = {k: first(k, ("recompute", "bwd")) for k in range(c + CHECKED, c - 4, -1)}
    if any(a is None for a in list(fwd.values()) + list(bwd.values())):
        return None
    pf = _periodic(log, list(fwd.values()), fwd[c - 1], 1, tol_t, tol_v)
    pb = _periodic(log, list(bwd.values()), bwd[c], -1, tol_t, tol_v)
    if pf is None or pb is None:
        return None
    period_f, dbytes_f = pf
    period_b, dbytes_b = pb
    f_lo, f_cut = log.start_pos[fwd[c - 1].uid], log.start_pos[fwd[c].uid]
    b_lo, b_cut = log.start_pos[bwd[c].uid], log.start_pos[bwd[c - 1].uid]
    if not (f_cut <= b_lo):
        return None
    dv_f = {k: g * v for k, v in dbytes_f.items()}
    dv_mid = dict(dv_f)
    dv_b = {k: dv_f.get(k, 0.0) + g * dbytes_b.get(k, 0.0) for k in set(dv_f) | set(dbytes_b)}
    end = len(log.events)
    segments = [
        _Segment(0, f_cut, range(1), 0.0, 0, {}),
        _Segment(f_lo, f_cut, range(1, g + 1), 0.0, 0, {}, period_f, 1, dbytes_f, True),
        _Segment(f_cut, b_lo, range(1), g * period_f, g, dv_mid),
        _Segment(b_lo, b_cut, range(1), g * period_f, g, dv_mid),
        _Segment(b_lo, b_cut, range(1, g + 1), g * period_f, g, dv_mid, period_b, -1, dbytes_b, True),
        _Segment(b_cut, end, range(1), g * (period_f + period_b), 0, dv_b),
    ]
    return _unfolded(fold, log, segments, run, gpu_capacity, host_capacity, devices, routes, tol_t, LAYERS)


def _tolerances(run: EngineRun) -> tuple[float, float]:
    top = max((abs(s.nbytes) for s in run.memory), default=1.0)
    return TIME_TOLERANCE * max(1.0, run.end_time), BYTES_TOLERANCE * max(1.0, top)


def _unfolded(fold, log: _Log, segments: list[_Segment], run: EngineRun, gpu_capacity: float, host_capacity: float,
              devices: dict, routes: dict | None, tol_t: float, labels: Labels) -> Unfolded:
    u = Unfolded(fold, log, segments, gpu_capacity, host_capacity, labels)
    _find_failure(u, devices, tol_t)
    _tally(u, run, routes)
    return u


def unfold_window(run: EngineRun, anchors: list[Op], copies: int, step: int, labels: Labels, *, gpu_capacity: float,
                  host_capacity: float, devices: dict, routes: dict | None = None) -> Unfolded | None:
    """The whole run from a short one in which one window repeats (a pipeline's steady state,
    the window the schedule's `Labels` index moves ``step`` through), or None when it does not.

    ``anchors``: ``CHECKED + 4`` ops, the first op of consecutive windows in run order; the window
    that starts at ``anchors[CHECKED]`` (ending where ``anchors[CHECKED + 1]``'s starts: the cut)
    is the copied one, and the windows from the first anchor to the last are checked as the layer
    fold checks its forward windows (`unfold`). The whole run is the short one with ``copies``
    copies of the copied window inserted at the cut: past it, events move by ``copies`` periods
    and bytes per window, indices by ``copies * step``. ``run``, ``devices``, ``routes``: as for
    `unfold`."""
    if run.failure is not None or len(anchors) != CHECKED + 4 or copies < 1:
        return None
    log = _Log(run)
    tol_t, tol_v = _tolerances(run)
    found = _periodic(log, anchors, anchors[CHECKED], step, tol_t, tol_v, labels)
    if found is None:
        return None
    period, dbytes = found
    lo, cut = log.start_pos[anchors[CHECKED].uid], log.start_pos[anchors[CHECKED + 1].uid]
    segments = [
        _Segment(0, cut, range(1), 0.0, 0, {}),
        _Segment(lo, cut, range(1, copies + 1), 0.0, 0, {}, period, step, dbytes, True),
        _Segment(cut, len(log.events), range(1), copies * period, copies * step,
                 {k: copies * v for k, v in dbytes.items()}),
    ]
    return _unfolded(None, log, segments, run, gpu_capacity, host_capacity, devices, routes, tol_t, labels)


def _find_failure(u: Unfolded, devices: dict, tol: float) -> None:
    """The first allocation past capacity in the unfolded order; peaks and end bytes up to it.
    A segment none of whose copies can fail is taken whole: per (device, space) its highest and
    last values plus the shift of its first or last copy."""
    log = u.log
    level: dict[tuple[int, str], float] = {}
    peak: dict[tuple[int, str], float] = {}
    for si, seg in enumerate(u.segments):
        smp = u._samples[si]
        if not smp:
            continue
        first, last = seg.shift(seg.reps.start)[2], seg.shift(seg.reps.stop - 1)[2]
        top: dict[tuple[int, str], float] = {}
        end: dict[tuple[int, str], float] = {}
        risky = False
        for _pos, x in smp:
            s = log.samples[x]
            key = _key(s)
            v = s.nbytes
            if key not in top or v > top[key]:
                top[key] = v
            end[key] = v
            if log.src[x][2] > 0:
                cap = u.gpu_capacity if s.kind == "gpu" else u.host_capacity
                if v + max(first.get(key, 0.0), last.get(key, 0.0)) > cap:
                    risky = True
        if not risky:
            for key, v in top.items():
                hi = v + max(first.get(key, 0.0), last.get(key, 0.0))
                if hi > peak.get(key, 0.0):
                    peak[key] = hi
            for key, v in end.items():
                level[key] = v + last.get(key, 0.0)
            continue
        for m in seg.reps:
            dt, dl, dv = seg.shift(m)
            for pos, x in smp:
                s = log.samples[x]
                key = _key(s)
                v = s.nbytes + dv.get(key, 0.0)
                op, action, delta = log.src[x]
                cap = u.gpu_capacity if s.kind == "gpu" else u.host_capacity
                if delta > 0 and v > cap:
                    lb = u.labels
                    new_layer = None if op is None else lb.layer(op, dl)
                    tensor = lb.tensor(action.tensor, op, dl)
                    u.failure = Failure("OOM" if s.kind == "gpu" else "OOHM", s.time + dt, tensor, delta,
                                        level.get(key, 0.0), cap, s.device, lb.name(op, dl) if op else None,
                                        new_layer)
                    u.failure_at = (si, m, pos)
                    u.end_time = s.time + dt
                    # before the cut the short run's events are the whole run's, in the same
                    # order even where they tie; later, a tie leaves the order open
                    u.tie = si > 0 and _tie_at(u, si, m, pos, op, s.time + dt, tol)
                    _levels(u, level, peak, devices)
                    return
                level[key] = v
                if v > peak.get(key, 0.0):
                    peak[key] = v
    _levels(u, level, peak, devices)
    u.end_time = log.run.end_time + u.segments[-1].dt


def _tie_at(u: Unfolded, si: int, m: int, pos: int, op: Op | None, t: float, tol: float) -> bool:
    """Whether another stream has an event at the failing allocation's time ``t``: which of two
    simultaneous events the engine ran first is not fixed by their times (it follows the order
    SimPy scheduled them, which rounding can change), so what had happened when the run stopped
    is not settled by the short run; `simulate` then runs the whole schedule."""
    log = u.log
    mine = None if op is None else (op.device, op.stream)

    def step(si: int, m: int, pos: int, d: int):
        seg = u.segments[si]
        pos += d
        if seg.lo <= pos < seg.hi:
            return si, m, pos
        m += d
        if m in seg.reps:
            return si, m, seg.lo if d > 0 else seg.hi - 1
        si += d
        if not 0 <= si < len(u.segments):
            return None
        seg = u.segments[si]
        return (si, seg.reps.start, seg.lo) if d > 0 else (si, seg.reps.stop - 1, seg.hi - 1)

    for d in (-1, 1):
        at = step(si, m, pos, d)
        while at is not None:
            s_i, m_i, p = at
            seg = u.segments[s_i]
            if not seg.lo <= p < seg.hi:  # an empty segment
                at = step(s_i, m_i, p, d)
                continue
            dt = seg.shift(m_i)[0]
            kind, x = log.events[p]
            if kind == MEMORY_SAMPLE:
                src = log.src[x][0]
                tp, who = log.samples[x].time, None if src is None else (src.device, src.stream)
            else:
                tp, who = (x.start if kind == OP_START else x.end), (x.device, x.stream)
            if abs(tp + dt - t) > tol:
                break
            if who != mine:
                return True
            at = step(s_i, m_i, p, d)
    return False


def _levels(u: Unfolded, level: dict, peak: dict, devices: dict) -> None:
    for d, dev in devices.items():
        u.peak_gpu[d] = peak.get((d, "gpu"), 0.0)
        u.end_gpu[d] = level.get((d, "gpu"), 0.0)
        node = dev.node
        u.peak_host[node] = peak.get((HOST_DEVICE_BASE - node, "host"), 0.0)
        u.end_host[node] = level.get((HOST_DEVICE_BASE - node, "host"), 0.0)


def _tally(u: Unfolded, run: EngineRun, routes: dict | None) -> None:
    """Op count of the whole graph; bytes per link (a run that did not fail)."""
    log = u.log
    extra = 0
    for seg in u.segments:
        if seg.repeats:
            extra += len(seg.reps) * len(log.ops_between(seg.lo, seg.hi))
    u.n_ops = len(run.ops) + extra
    if u.failure is not None:
        return  # a failed run stops flows half way: not counted (see SimResult.link_carried)
    carried = dict(run.link_carried)
    if routes is not None:
        for seg in u.segments:
            if not seg.repeats:
                continue
            for op in log.ops_between(seg.lo, seg.hi):
                for name, nbytes in _op_link_bytes(op, routes):
                    carried[name] = carried.get(name, 0.0) + len(seg.reps) * nbytes
    u.link_carried = carried


def _op_link_bytes(op: Op, routes: dict) -> list[tuple[str, float]]:
    """Bytes (weighted as the fluid network counts them) an op puts on each link of its route."""
    if op.work <= 0:
        return []
    if op.kind == "comm" and op.link:
        route = routes[(op.device, op.link)]
        return [(lk.name, w * op.work * route[0][0].capacity) for lk, w in route]
    if op.kind == "copy":
        return [(lk.name, w * op.work) for lk, w in routes[(op.device, op.direction)]]
    return []
