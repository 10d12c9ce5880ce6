"""PNG figures (matplotlib, Agg canvas; no display and no global pyplot state), 100 dpi.

- `gantt_figure`: one row per stream of one GPU over a layer range, forward and backward side by
  side (they are far apart in time), only the range's events drawn, bars coloured by phase and
  labelled by layer, a legend of the phases drawn with their time; the title says which GPUs of
  the plan the simulated GPU stands for (`memo_sim.report.ranks`).
- `memory_figure`: GPU memory per device and pinned host memory per node over the iteration,
  from 0, with capacities; per interval of the time axis the highest level as steps and the range
  to the lowest shaded (`envelope`), so that a spike of any length shows.
- `alpha_sweep_figure`: MFU (axis zoomed to the data, the alpha = 0 level as a baseline) and peak
  memory (from 0) against MEMO's alpha, OOM / OOHM runs marked.
- `mfu_vs_seq_figure`: MFU against sequence length, one line per policy (colour per layout and
  line style per policy, where the sweep has several layouts); runs that do not fit on a strip of
  their own, never as an MFU value.
- `seq_sweep_figure`: peak GPU memory (with the capacity) and step time against sequence length,
  one line per series of `memo_sim.search.seq_sweep` (e.g. METP, Megatron TP+SP, Ulysses): one
  colour per layout, one line style per policy, plain-number ticks; plans that do not fit marked
  on the time axis, crossovers drawn as vertical lines.
- SPPO: `pipeline_gantt_figure` (stages x time, subsequences coloured, bubbles shaded, P2P /
  offload / prefetch streams per stage; the paper's Figure 8), `stage_memory_figure` (GPU memory
  per stage over time) and `subseq_sweep_figure` (iteration time and peak memory against N).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from memo_sim.errors import MemoError
from memo_sim.fileio import save_png
from memo_sim.report.ranks import device_role, represented_gpus
from memo_sim.timeline import STREAMS, Timeline, TimelineEvent
from memo_sim.units import fmt_count, fmt_time

if TYPE_CHECKING:
    from memo_sim.engine.simulate import SimResult
    from memo_sim.search.seq_sweep import Crossover, SeqPoint

GiB = 1024**3
TiB = 1024**4
PHASE_COLOR = {
    "fwd": "#4C72B0", "bwd": "#DD8452", "recompute": "#C44E52", "offload": "#55A868", "prefetch": "#8172B3",
    "classifier": "#937860", "optimizer": "#DA8BC3", "grad_sync": "#8C8C8C", "weight_gather": "#CCB974",
    "weight_gather_bwd": "#CCB974", "comm": "#64B5CD", "stall": "#4D4D4D",
}
PHASE_LABEL = {  # what each phase is, for legends
    "fwd": "forward", "bwd": "backward", "recompute": "recompute (before backward)", "offload": "offload (GPU to host)",
    "prefetch": "prefetch (host to GPU)", "classifier": "classifier", "optimizer": "optimizer step",
    "grad_sync": "gradient sync", "weight_gather": "ZeRO weight gather for forward",
    "weight_gather_bwd": "ZeRO-3 weight gather for backward", "allocator": "allocator reorganisation",
    "comm": "collective (measured)", "stall": "stall (compute waits for a copy)",
}
FAIL_STYLE = {"OOM": ("x", "#C44E52"), "OOHM": ("v", "#8172B3")}
TIME_UNITS = ((1e-3, 1e-6, "us"), (1.0, 1e-3, "ms"), (120.0, 1.0, "s"), (float("inf"), 60.0, "min"))


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for an axis spanning ``span_s`` seconds: us below 1 ms, ms
    below 1 s, s below 2 minutes, min beyond."""
    for limit, scale, name in TIME_UNITS:
        if span_s < limit:
            return scale, name
    return 60.0, "min"


def origin_label(t0: float, span_s: float) -> str:
    """A time axis's label, ``<unit> from <t0> <unit>``: the axis counts from ``t0`` in the unit of its span
    (`time_unit`), and so does the origin, to 1e-4 of the span (a review: a panel from 0.909 ms read
    "us from 0.001 s", its origin off by 9% of its span)."""
    scale, unit = time_unit(span_s)
    digits = max(0, math.ceil(-math.log10(max(span_s, 1e-12) / scale * 1e-4)))
    return f"{unit} from {t0 / scale:,.{digits}f} {unit}"


def phase_label(phase: str) -> str:
    return PHASE_LABEL.get(phase, phase)
FWD_PHASES = ("fwd", "offload", "weight_gather")
BWD_PHASES = ("bwd", "recompute", "prefetch", "grad_sync", "weight_gather_bwd")


FIGURE_DPI = 100  # PNGs of a few hundred KB at most


def _save(fig: Figure, path: str | Path, tight: bool = True) -> Path:
    """Render ``fig`` to ``path``; ``tight=False`` for a figure whose margins are fixed in inches
    (`_margins`): no cropping pass, whose extra layout of every text is a fifth of the drawing."""
    FigureCanvasAgg(fig)
    return save_png(fig, path, dpi=FIGURE_DPI, tight=tight)


def parse_layer_range(text: str | None, n_layers: int | None = None) -> tuple[int, int] | None:
    """``"A:B"`` -> (A, B), both included; ``None`` -> None. ``A:`` runs to the last layer."""
    if text is None:
        return None
    parts = str(text).split(":")
    if len(parts) != 2:
        raise MemoError(f"--layers: expected A:B (e.g. 14:16), got {text!r}")
    try:
        a = int(parts[0]) if parts[0].strip() else 0
        b = int(parts[1]) if parts[1].strip() else (n_layers - 1 if n_layers else a)
    except ValueError:
        raise MemoError(f"--layers: A and B must be layer numbers, got {text!r}") from None
    if a < 0 or b < a:
        raise MemoError(f"--layers: need 0 <= A <= B, got {text!r}")
    if n_layers is not None and b >= n_layers:
        raise MemoError(f"--layers: the model has layers 0..{n_layers - 1}, got {text!r} "
                        f"(e.g. --layers {min(a, n_layers - 1)}:{n_layers - 1})")
    return a, b


def default_layer_range(timeline: Timeline) -> tuple[int, int]:
    mid = timeline.meta.get("middle_layer")
    layers = sorted({e.layer for e in timeline.events if e.layer is not None})
    if not layers:
        return 0, 0
    if mid is None or not layers[0] <= mid <= layers[-1]:  # a run that stopped early (OOM) before its middle layer
        mid = layers[len(layers) // 2]
    return max(layers[0], mid - 1), min(layers[-1], mid + 1)


def _window(events: list[TimelineEvent], layers: tuple[int, int], phases: tuple[str, ...]) -> tuple[float, float] | None:
    sel = [e for e in events if e.layer is not None and layers[0] <= e.layer <= layers[1] and e.phase in phases]
    if not sel:
        return None
    return min(e.start for e in sel), max(e.end for e in sel)


def _in_range(e: TimelineEvent, layers: tuple[int, int]) -> bool:
    """Whether a Gantt panel draws ``e``: an event of a layer in ``layers``, or one of no layer (a
    gradient bucket, an allocator stall) inside the panel's window."""
    return e.layer is None or layers[0] <= e.layer <= layers[1]


def _device_panels(timeline: Timeline, device: int, layers: tuple[int, int]):
    """(name, t0, t1, events) of the forward and backward panels of ``device`` over ``layers``
    and the streams they draw; each panel spans the layers' own phases (a ZeRO-3 backward weight
    gather, phase weight_gather_bwd, belongs to the backward panel, never stretches the forward one)."""
    events = [e for e in timeline.events if e.device == device]
    if not events:
        have = sorted({e.device for e in timeline.events})
        raise MemoError(f"the timeline has no events on device {device}; it has device"
                        f"{'s' if len(have) != 1 else ''} {', '.join(map(str, have)) or 'none'}")
    windows = [(name, w) for name, w in (("forward", _window(events, layers, FWD_PHASES)),
                                         ("backward", _window(events, layers, BWD_PHASES))) if w]
    if not windows:
        known = sorted({e.layer for e in events if e.layer is not None})
        raise MemoError(f"no events for layers {layers[0]}..{layers[1]}; the timeline has layers "
                        f"{known[0] if known else '-'}..{known[-1] if known else '-'}")
    panels = [(name, t0, t1, [e for e in events if _in_range(e, layers) and e.end >= t0 and e.start <= t1])
              for name, (t0, t1) in windows]
    drawn = {e.stream for *_w, evs in panels for e in evs}
    return panels, sorted(drawn, key=lambda s: (STREAMS.index(s) if s in STREAMS else len(STREAMS), s))


def has_gantt_panels(timeline: Timeline, device: int = 0, layers: tuple[int, int] | None = None) -> bool:
    """Whether `gantt_figure` has a panel to draw for ``device`` (a run that stopped before any layer's forward,
    out of memory at its start, has none)."""
    try:
        _device_panels(timeline, device, layers or default_layer_range(timeline))
    except MemoError:
        return False
    return True


def gantt_figure(timeline: Timeline, path: str | Path, layers: tuple[int, int] | None = None,
                 device: int = 0, devices: list[int] | None = None, note: str = "") -> Path:
    """Gantt chart of every stream of ``device`` over ``layers`` (inclusive): only those layers'
    events (and events of no layer inside the panels) are drawn, only the streams and phases drawn
    get a row and a legend entry. ``devices``: one row of panels per device instead (a measured
    run's ranks, each from its own step start), labelled by `device_role`; ``note`` goes under
    the title (e.g. which ranks were drawn)."""
    layers = layers or default_layer_range(timeline)
    devs = list(devices) if devices else [device]
    rows, skipped = [], []
    for d in devs:  # a pipeline rank holding none of the layers drawn (the embedding or the loss alone) has no row
        try:
            rows.append((d, *_device_panels(timeline, d, layers)))
        except MemoError:
            if len(devs) == 1:
                raise
            skipped.append(d)
    if not rows:
        raise MemoError(f"no device of {devs} has events for layers {layers[0]}..{layers[1]}")
    if skipped:
        note = (note + "; " if note else "") + f"no row for device{'s' if len(skipped) > 1 else ''} " \
            f"{', '.join(map(str, skipped))}: none of layers {layers[0]}..{layers[1]} runs there"
    columns = [c for c in ("forward", "backward") if any(p[0] == c for _d, panels, _s in rows for p in panels)]
    heights = [0.55 * len(streams) + 0.6 for _d, _p, streams in rows]
    gap = 0.9  # inches between rows of panels: a row's x label and the next one's title
    fig = Figure(figsize=(7 * len(columns), sum(heights) + gap * (len(rows) - 1) + 1.2))
    axes = fig.subplots(len(rows), len(columns), squeeze=False, gridspec_kw={"height_ratios": heights})
    seen: dict[str, float] = {}  # phase -> seconds drawn, over every panel
    for r, (d, panels, streams) in enumerate(rows):
        by_name = {p[0]: p for p in panels}
        for c, column in enumerate(columns):
            ax = axes[r][c]
            if column not in by_name:
                ax.set_visible(False)
                continue
            _name, t0, t1, evs = by_name[column]
            for ph, sec in _gantt_panel(ax, evs, streams, t0, t1).items():
                seen[ph] = seen.get(ph, 0.0) + sec
            who = f"{device_role(timeline, d)}: " if len(rows) > 1 else ""
            ax.set_title(f"{who}{column}, layers {layers[0]}..{layers[1]}", fontsize=9 if who else 10)
            if c:  # the same rows: their names once, on the left
                ax.tick_params(labelleft=False)
    meta = timeline.meta or {}
    head = (" | ".join(str(meta[k]) for k in ("model", "layout", "policy", "profile") if meta.get(k))
            + (f" | {fmt_count(meta['seq_tokens'])} tokens" if meta.get("seq_tokens") else ""))
    sub = note or (device_role(timeline, devs[0]) if len(rows) == 1 else
                   f"{len(rows)} {timeline.device_word}s, each from its own step start")
    fig.suptitle(head + f"\n{sub}", fontsize=10)
    handles = [Patch(color=PHASE_COLOR.get(p, "#999999"), label=f"{phase_label(p)} ({fmt_time(sec)})")
               for p, sec in sorted(seen.items())]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    _margins(fig, bottom_in=0.55 + 0.25 * ((len(handles) + 3) // 4), top_in=0.75 + 0.2 * (len(rows) > 1), wspace=0.12,
             hspace=gap * len(rows) / sum(heights) if len(rows) > 1 else None)
    return _save(fig, path, tight=False)


def _gantt_panel(ax, events: list[TimelineEvent], streams: list[str], t0: float, t1: float) -> dict[str, float]:
    """One Gantt panel: a row per stream, ``events`` clipped to [t0, t1]; the seconds drawn per phase."""
    span = max(t1 - t0, 1e-9)
    scale, unit = time_unit(span)
    seen: dict[str, float] = {}
    by_stream: dict[str, list[TimelineEvent]] = {}
    for e in events:
        by_stream.setdefault(e.stream, []).append(e)
    for row, s in enumerate(streams):
        bars, colors = [], []
        for e in by_stream.get(s, ()):
            a, b = max(e.start, t0), min(e.end, t1)
            seen[e.phase] = seen.get(e.phase, 0.0) + (b - a)
            bars.append(((a - t0) / scale, max(b - a, span * 1e-4) / scale))
            colors.append(PHASE_COLOR.get(e.phase, "#999999"))
            if e.layer is not None and (b - a) > 0.06 * span and s in ("compute", "d2h", "h2d"):
                ax.text(((a + b) / 2 - t0) / scale, row, f"L{e.layer}", ha="center", va="center", fontsize=6,
                        color="white")
        if bars:  # one artist per stream
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colors, edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels(streams)
    ax.set_ylim(len(streams) - 0.5, -0.5)
    ax.set_xlim(0, span / scale)
    ax.set_xlabel(origin_label(t0, span))
    ax.grid(axis="x", alpha=0.3)
    return seen


def _margins(fig: Figure, bottom_in: float, top_in: float, left_in: float = 1.0, right_in: float = 0.2,
             wspace: float | None = None, hspace: float | None = None) -> None:
    """Fixed margins in inches instead of ``tight_layout`` (which draws the whole figure once
    more; the PNG is cropped to its content when saved anyway)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=min(0.4, left_in / w), right=1 - min(0.2, right_in / w),
                        bottom=min(0.45, bottom_in / h), top=1 - min(0.3, top_in / h), wspace=wspace, hspace=hspace)


def _levels(samples) -> tuple[list[float], list[float]]:
    """(times, GiB) of a memory curve; of several samples at one instant (a free and an alloc back
    to back) the last one is the level that holds, so the zero-width dips in between are dropped."""
    last: dict[float, float] = {}
    for m in sorted(samples, key=lambda m: m.time):
        last[m.time] = m.nbytes
    return list(last), [v / GiB for v in last.values()]


ENVELOPE_BINS = 500  # intervals of a memory panel's time axis: a spike shorter than one is drawn one wide


def envelope(xs: list[float], ys: list[float], end: float, bins: int = ENVELOPE_BINS):
    """(edges, lowest, highest) level of a step curve (level ``ys[i]`` from ``xs[i]``) in each of
    ``bins`` equal intervals of [0, end]: a spike or a dip of any length shows as at least one
    interval wide, and the highest of all intervals is the curve's peak."""
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    edges = np.linspace(0.0, max(end, x[-1] if len(x) else 0.0, 1e-12), bins + 1)
    k = np.clip(np.searchsorted(x, edges[:-1], side="right") - 1, 0, len(y) - 1)  # level at each interval's start
    lo, hi = y[k].copy(), y[k].copy()
    if len(x) and x[0] > 0:  # before the first sample: nothing allocated
        first = edges[:-1] < x[0]
        lo[first] = np.minimum(lo[first], 0.0)
    inside = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    np.minimum.at(lo, inside, y)
    np.maximum.at(hi, inside, y)
    return edges, lo, hi


def _stairs(ax, values, edges, baseline=None, **kw) -> None:
    """``ax.stairs`` without its per-segment data-limit walk (matplotlib's ``add_patch`` iterates
    every Bezier segment of the path to update the limits, most of a memory figure's time): the
    step patch is added as an artist and the limits grow by its bounding box."""
    import numpy as np
    from matplotlib.patches import StepPatch

    fill = kw.pop("fill", False)
    color = kw.pop("color")
    kw.setdefault("facecolor" if fill else "edgecolor", color)
    patch = StepPatch(values, edges, baseline=baseline, fill=fill, **kw)
    ax.add_artist(patch)
    patch.set_clip_path(ax.patch)
    ys = np.asarray(values, dtype=float)
    base = np.asarray(baseline if baseline is not None else ys, dtype=float)
    ax.update_datalim([(float(edges[0]), float(min(ys.min(), base.min()))),
                       (float(edges[-1]), float(max(ys.max(), base.max())))])
    ax.autoscale_view()


def _memory_panel(ax, timeline: Timeline, kind: str, devices: list[int], end: float, capacity: float | None,
                  ylabel: str, label, color: str | None, scale: float = 1.0) -> None:
    """One memory-over-time panel from 0 GiB: per device the highest level in each of
    `ENVELOPE_BINS` intervals as steps, the range from lowest to highest shaded (short spikes
    stay visible), the usable capacity as a dashed line; times divided by ``scale``."""
    for k, d in enumerate(devices):
        xs, ys = _levels([m for m in timeline.memory if m.kind == kind and m.device == d])
        if not xs:
            continue
        edges, lo, hi = envelope(xs, ys, end)
        c = color or f"C{k % 10}"
        _stairs(ax, hi, edges / scale, color=c, lw=1.2, label=label(d))
        _stairs(ax, hi, edges / scale, baseline=lo, fill=True, color=c, alpha=0.3, lw=0)
    if capacity:
        ax.axhline(capacity / GiB, color="#C44E52", ls="--", lw=1, label="usable capacity")
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)


def _rank_host_panel(ax, timeline: Timeline, ranks: list[int], end: float, capacity: float | None,
                     scale: float) -> None:
    """Host memory of a measured run's ranks stacked, a band per rank (its pool; the colour of its
    device in the panel above), the top the ranks' sum: the node's where they share one machine."""
    import numpy as np

    labels = (timeline.meta or {}).get("rank_labels") or {}
    base, edges = None, None
    for k, r in enumerate(ranks):
        xs, ys = _levels([m for m in timeline.memory if m.kind == "host" and m.device == r])
        if not xs:
            continue
        edges, _lo, hi = envelope(xs, ys, end)
        lo = base if base is not None else np.zeros_like(hi)
        base = lo + hi
        coords = labels.get(str(r))
        _stairs(ax, base, edges / scale, baseline=lo, fill=True, color=f"C{k % 10}", alpha=0.45, lw=0,
                label=f"rank {r}" + (f" ({coords})" if coords else ""))
    if base is not None and base.max() > 0:
        _stairs(ax, base, edges / scale, color="#333333", lw=1.0,
                label=f"sum of the {len(ranks)} ranks' pools")
    else:
        ax.text(0.5, 0.5, f"no host memory on any of the {len(ranks)} ranks (0 B)", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="#555555")
    if capacity:
        ax.axhline(capacity / GiB, color="#C44E52", ls="--", lw=1, label="usable capacity")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.6)  # head room for the legend above the stack
    ax.set_ylabel("host memory (GiB),\nstacked by rank", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    ax.grid(alpha=0.3)


def _allocator_levels(ax, alloc: dict) -> None:
    """Where the caching allocator runs the plan: its replay's peak reserved memory and its peak
    allocated memory (`memo_sim.memplan.iteration_replay`), as two levels beside the simulated
    curve; the fragmentation is the share of the memory reserved when the allocation peaked that
    is not allocated (the two peaks fall at different moments where the allocator retried).

    A static memory plan's levels are its replay's too (`memo_sim.memplan.iteration_replay.engine_replay`: the
    plan's arena one request, reserved and allocated whole, memo_exec/arena.py; the tensors outside it through the
    caching allocator; summary.json's ``allocator`` block with ``static_memory_plan`` true): the legend says the
    reserved level holds the arena and the unallocated share lies outside it. Nothing is drawn where no replay ran
    (a micro-batch pipeline's or SPPO's run, ``"replayed": False``: no reserved level)."""
    reserved, frag = alloc.get("peak_reserved_bytes"), alloc.get("fragmentation_at_peak")
    allocated = alloc.get("peak_allocated_bytes")
    if alloc.get("replayed") is False or not reserved or frag is None or not allocated:
        return
    retries = alloc.get("reorganizations", 0)
    planned = bool(alloc.get("static_memory_plan"))
    ax.axhline(reserved / GiB, color="#333333", ls=":", lw=1.2,
               label=(f"memory plan's arena + caching allocator beside it: peak reserved ({retries} retries/iteration)"
                      if planned else f"caching allocator: peak reserved ({retries} retries/iteration)"))
    ax.axhline(allocated / GiB, color="#8172B2", ls="-.", lw=1.0,
               label=f"peak allocated ({100 * frag:.1f}% of the memory then reserved unallocated"
                     f"{', all outside the arena' if planned else ''})")
    ax.legend(fontsize=8, loc="best")


def memory_figure(timeline: Timeline, path: str | Path) -> Path:
    """GPU memory per device and pinned host memory per node over time, with capacities; host
    series under a device number >= 0 are a measured run's ranks' pools, drawn stacked by rank."""
    meta = timeline.meta or {}
    gpu = sorted({m.device for m in timeline.memory if m.kind == "gpu"})
    host = sorted({m.device for m in timeline.memory if m.kind == "host" and m.device < 0})
    rank_host = sorted({m.device for m in timeline.memory if m.kind == "host" and m.device >= 0})
    rows = 2 if host or rank_host else 1
    fig = Figure(figsize=(10, 3.2 * rows))
    axes = fig.subplots(rows, 1, squeeze=False, sharex=True)[:, 0]
    end = max([e.end for e in timeline.events] + [m.time for m in timeline.memory] + [0.0])
    scale, unit = time_unit(end)
    dev = timeline.device_word
    _memory_panel(axes[0], timeline, "gpu", gpu, end, meta.get("gpu_capacity_bytes"), f"{dev} memory (GiB)",
                  lambda d: device_role(timeline, d), None, scale)
    _allocator_levels(axes[0], meta.get("allocator") or {})
    if rank_host:
        _rank_host_panel(axes[1], timeline, rank_host, end, meta.get("host_capacity_bytes"), scale)
    elif host:
        _memory_panel(axes[1], timeline, "host", host, end, meta.get("host_capacity_bytes"), "host memory (GiB)",
                      lambda h: f"node {-1 - h} pinned host", "#55A868", scale)
    axes[-1].set_xlabel(f"time in the iteration ({unit})")
    fail = meta.get("failure")
    title = " | ".join(str(meta[k]) for k in ("model", "layout", "policy") if meta.get(k))
    if fail and fail.get("time_s") is None:  # found by the caching-allocator replay, which has no clock
        title += f" | {fail['status']} in the caching-allocator replay ({fail['tensor']})"
    elif fail:
        title += f" | {fail['status']} at {fail['time_s']:.3f} s ({fail['tensor']})"
        for ax in axes:
            ax.axvline(fail["time_s"] / scale, color="#C44E52", lw=1)
    fig.suptitle(title + f"\nline: highest level in each 1/{ENVELOPE_BINS} of the iteration; shaded: lowest to "
                 "highest (short spikes drawn one interval wide)", fontsize=9)
    _margins(fig, bottom_in=0.55, top_in=0.6, hspace=0.12)
    return _save(fig, path, tight=False)


def _mark_failures(ax, xs, statuses, y):
    for st, (marker, color) in FAIL_STYLE.items():
        pts = [x for x, s in zip(xs, statuses) if s == st]
        if pts:
            ax.scatter(pts, [y] * len(pts), marker=marker, color=color, s=50, zorder=5, label=st, clip_on=False)


def alpha_sweep_figure(results: list["SimResult"], path: str | Path, solver_alpha: float | None = None) -> Path:
    """MFU (top; the axis zoomed to the data, whose spread is often a point or two, with the
    smallest alpha's MFU as a dotted baseline and a note that the axis does not start at 0) and
    peak GPU / host memory (bottom, from 0) against alpha; OOM / OOHM marked; the solver's alpha
    (MEMO's closed form, `memo_sim.search.estimate.memo_alpha`) a vertical line."""
    if not results:
        raise MemoError("alpha sweep: no results to plot")
    rs = sorted(results, key=lambda r: r.policy.alpha or 0.0)
    alphas = [r.policy.alpha or 0.0 for r in rs]
    fig = Figure(figsize=(7, 6))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ok = [(a, 100 * r.mfu) for a, r in zip(alphas, rs) if r.ok]
    lo, hi = _zoom([m for _, m in ok])
    if ok:
        ax1.plot([a for a, _ in ok], [m for _, m in ok], "o-", color="#4C72B0", label="MFU")
        base = ok[0]  # the smallest alpha that fits (alpha = 0: no offload, recompute only)
        ax1.axhline(base[1], color="#777777", ls=":", lw=1, label=f"alpha = {base[0]:g}: {base[1]:.1f}%")
        ax1.text(0.99, 0.02, f"MFU axis zoomed to {lo:.1f}..{hi:.1f}% (not from 0); best {max(m for _, m in ok):.1f}%",
                 transform=ax1.transAxes, ha="right", va="bottom", fontsize=7, color="#555555")
    ax1.set_ylim(lo, hi)
    _mark_failures(ax1, alphas, [r.status for r in rs], lo)
    ax1.set_ylabel("MFU (%)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    nan = float("nan")  # a failed run has no peak (what it had in use when it stopped is not one): a gap
    ax2.plot(alphas, [r.peak_gpu_bytes / GiB if r.ok else nan for r in rs], "s-", color="#DD8452",
             label="peak GPU (GiB)")
    ax2.axhline(rs[0].gpu_capacity_bytes / GiB, color="#DD8452", ls="--", lw=1, label="usable GPU memory")
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("peak GPU memory (GiB)")
    ax3 = ax2.twinx()
    ax3.plot(alphas, [r.peak_host_bytes_per_node / TiB if r.ok else nan for r in rs], "^-", color="#55A868",
             label="peak host / node (TiB)")
    ax3.axhline(rs[0].host_capacity_bytes / TiB, color="#55A868", ls=(0, (2, 2)), lw=1, label="usable host / node")
    ax3.set_ylim(bottom=0)
    ax3.set_ylabel("peak pinned host / node (TiB)")
    ax2.set_xlabel("alpha (offloaded fraction of the other skeletal tensors)")
    ax2.grid(alpha=0.3)
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left", ncol=2)
    if solver_alpha is not None:
        for ax in (ax1, ax2):
            ax.axvline(solver_alpha, color="#333333", ls="-.", lw=1.2,
                       label=f"solver's alpha = {solver_alpha:.3f}" if ax is ax1 else None)
        ax1.legend(fontsize=8)
    r0 = rs[0]
    fig.suptitle(f"{r0.model.name} {fmt_count(r0.seq)} tokens, {r0.layout.label()}, {r0.profile}: MEMO alpha sweep",
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _zoom(values: list[float], pad: float = 0.15, min_span: float = 1.0) -> tuple[float, float]:
    """y-limits that hold ``values`` with ``pad`` of their range (at least ``min_span``) either side."""
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    span = max(hi - lo, min_span)
    return max(0.0, lo - pad * span), hi + pad * span


def mfu_vs_seq_figure(results: list["SimResult"], path: str | Path) -> Path:
    """MFU against sequence length, one line per policy (per layout where the sweep has several);
    runs that do not fit have no MFU: they are marked (x OOM, v OOHM) on a strip below the plot,
    one row per series, never drawn as an MFU value."""
    if not results:
        raise MemoError("MFU vs sequence length: no results to plot")
    by_policy: dict[str, list] = {}
    several = len({r.layout for r in results}) > 1
    for r in results:
        by_policy.setdefault(f"{r.layout.label()} {r.policy.name}" if several else r.policy.name, []).append(r)
    # several layouts: one colour per layout, one line style per policy (as `seq_sweep_figure`)
    lay_colour = {lb: f"C{k % 10}" for k, lb in enumerate(dict.fromkeys(r.layout.label() for r in results))}
    pol_style = {p: SERIES_STYLES[k % len(SERIES_STYLES)]
                 for k, p in enumerate(dict.fromkeys(r.policy.name for r in results))}
    failed = {pol for pol, rs in by_policy.items() if any(not r.ok for r in rs)}
    strip = [pol for pol in by_policy if pol in failed]
    fig = Figure(figsize=(7.5, 4.2 + (0.22 * len(strip) + 0.3 if strip else 0)))
    if strip:
        ax, ax_f = fig.subplots(2, 1, sharex=True, height_ratios=[4.0, 0.25 * len(strip) + 0.35])
    else:
        ax, ax_f = fig.subplots(), None
    for k, (pol, rs) in enumerate(by_policy.items()):
        rs.sort(key=lambda r: r.seq)
        color = lay_colour[rs[0].layout.label()] if several else f"C{k % 10}"
        ls, marker = pol_style[rs[0].policy.name] if several else ("-", "o")
        ok = [r for r in rs if r.ok]
        ax.plot([r.seq for r in ok], [100 * r.mfu for r in ok], ls=ls, marker=marker, color=color, label=pol)
        if pol in strip:
            row = strip.index(pol)
            for st, (marker, _c) in FAIL_STYLE.items():
                xs = [r.seq for r in rs if r.status == st]
                if xs:
                    ax_f.scatter(xs, [row] * len(xs), marker=marker, color=color, s=40, zorder=5)
    seqs = sorted({r.seq for r in results})
    for a in (ax, ax_f) if ax_f is not None else (ax,):
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
    bottom = fig.axes[-1]
    bottom.set_xticks(seqs)
    bottom.set_xticklabels([fmt_count(s) for s in seqs])
    bottom.set_xticks([], minor=True)
    bottom.set_xlabel("sequence length (tokens)")
    if ax_f is not None:
        ax_f.set_ylim(len(strip) - 0.5, -0.5)
        ax_f.set_yticks(range(len(strip)))
        ax_f.set_yticklabels(strip, fontsize=7)
        ax_f.set_title("does not fit (x OOM: GPU memory, v OOHM: host memory): no MFU", fontsize=8, loc="left")
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(0, max([100 * r.mfu for r in results if r.ok] + [1.0]) * 1.12)
    if several:
        _series_legends(fig, list(lay_colour), list(pol_style), lay_colour, pol_style)
    else:
        ax.legend(fontsize=7, loc="lower left", ncol=2)
    r0 = results[0]
    where = "by layout" if several else r0.layout.label()
    fig.suptitle(f"{r0.model.name}, {where}, {r0.profile}: MFU by policy", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.78, 1) if several else None)
    return _save(fig, path)


def _sparse_ticks(seqs: list[int], min_ratio: float = 1.3) -> list[int]:
    """Ticks for a log-scale length axis: every length, less those too close to the one before."""
    out: list[int] = []
    for x in sorted(seqs):
        if not out or x >= out[-1] * min_ratio:
            out.append(x)
    return out


SERIES_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1, 1, 1)), "v"),
                 ((0, (1, 3)), "P"), ((0, (8, 3)), "X"))  # line style and marker per policy of a sequence sweep


def readable_log_ticks(ax, axis: str = "y") -> None:
    """Plain-number ticks (1, 2, 5, 10, 20, 50, ...; 1.5, 3, 7 too over a narrow range) on a log axis,
    instead of powers of two or ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    subs = (1.0, 2.0, 5.0) if hi > 8 * lo else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _flavour_and_rest(label: str) -> tuple[str, str]:
    """A sequence-sweep series label ``tp8+sp memo`` -> (``tp8+sp``, ``memo``); ``tp8+metp`` -> (``tp8+metp``, "")."""
    head, _, rest = label.partition(" ")
    return head, rest


def seq_sweep_figure(points: list["SeqPoint"], path: str | Path, title: str,
                     crossovers: list["Crossover"] = (), reference: str | None = None) -> Path:
    """Peak GPU memory (analytic, with the usable capacity), simulated step time and, with a
    ``reference`` series, step time relative to it, against sequence length. A series is a
    layout flavour (e.g. METP, Megatron TP+SP) and, where the sweep keeps policies apart, a policy:
    one colour per flavour, one line style and marker per policy, so that the flavours of one
    policy pair up; a legend for each. A plan that does not fit is an x at the foot of the time
    axis; crossovers (`memo_sim.search.seq_sweep.crossover_seq`) are dashed vertical lines."""
    pts = [p for p in points if p.status != "invalid"]
    if not pts:
        raise MemoError("sequence sweep: no points to plot")
    rows = 3 if reference else 2
    fig = Figure(figsize=(9.5, 3.2 * rows + 0.6))
    axes = fig.subplots(rows, 1, sharex=True)
    ax1, ax2 = axes[0], axes[1]
    series: dict[str, list] = {}
    for p in pts:
        series.setdefault(p.label, []).append(p)
    flavours = list(dict.fromkeys(_flavour_and_rest(lb)[0] for lb in series))
    rests = list(dict.fromkeys(_flavour_and_rest(lb)[1] for lb in series))
    colour = {f: f"C{k % 10}" for k, f in enumerate(flavours)}
    style = {r: SERIES_STYLES[k % len(SERIES_STYLES)] for k, r in enumerate(rests)}
    failed, kw = [], {}
    for label, ps in series.items():
        ps.sort(key=lambda p: p.seq)
        fl, rest = _flavour_and_rest(label)
        kw[label] = {"color": colour[fl], "ls": style[rest][0], "marker": style[rest][1], "ms": 4, "lw": 1.3}
        ax1.plot([p.seq for p in ps], [p.peak_gpu_bytes / GiB for p in ps], label=label, **kw[label])
        ok = [p for p in ps if p.iteration_s is not None]
        if ok:
            ax2.plot([p.seq for p in ok], [p.iteration_s for p in ok], **kw[label])
        failed.append(([p.seq for p in ps if p.iteration_s is None], kw[label], rest))
    ax2.set_yscale("log")
    bottom, top = ax2.get_ylim()
    for k, (xs, style_kw, rest) in enumerate(failed):  # staggered so that coinciding failures stay visible
        if xs:
            y = bottom * (top / bottom) ** (0.03 + 0.04 * k)
            ax2.scatter(xs, [y] * len(xs), marker="x", color=style_kw["color"], s=40, zorder=5, clip_on=False)
            for x in xs if rest else ():  # which policy does not fit (the colour says which layout)
                ax2.text(x, y, f"  {rest}", fontsize=6, va="center", ha="left", color=style_kw["color"])
    if reference:
        ax3 = axes[2]
        ref = {p.seq: p.iteration_s for p in series.get(reference, []) if p.iteration_s is not None}
        for label, ps in series.items():
            rel = [(p.seq, p.iteration_s / ref[p.seq]) for p in ps if p.iteration_s is not None and p.seq in ref]
            if rel and label != reference:
                ax3.plot([x for x, _ in rel], [y for _, y in rel], **kw[label])
        ax3.axhline(1.0, color=kw.get(reference, {}).get("color", "k"), lw=1)
        ax3.set_ylabel(f"step time / {reference}", fontsize=8)
    cap = pts[0].gpu_capacity_bytes / GiB
    ax1.axhline(cap, color="#C44E52", ls=":", lw=1)
    ax1.text(min(p.seq for p in pts), cap, f" usable GPU memory {cap:.1f} GiB", va="bottom", fontsize=8,
             color="#C44E52")
    for c in crossovers:
        if c.time_seq is not None:
            for ax in axes:
                ax.axvline(c.time_seq, color="#555555", ls="--", lw=1)
            ax2.text(c.time_seq, ax2.get_ylim()[1], f" {c.a} = {c.b}\n at {c.time_seq / 1024:.0f}K tokens",
                     fontsize=7, va="top")
    seqs = sorted({p.seq for p in pts})
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
    ax1.set_yscale("log")
    for ax in (ax1, ax2):
        readable_log_ticks(ax)
    ticks = _sparse_ticks(seqs)
    axes[-1].set_xticks(ticks)
    axes[-1].set_xticklabels([fmt_count(s) for s in ticks], rotation=45)
    axes[-1].set_xticks([], minor=True)
    ax1.set_ylabel("peak GPU memory (GiB, analytic)", fontsize=9)
    ax2.set_ylabel("step time (s, simulated); x: does not fit", fontsize=9)
    axes[-1].set_xlabel("sequence length (tokens)")
    _series_legends(fig, flavours, rests, colour, style)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    return _save(fig, path)


def _series_legends(fig: Figure, flavours, rests, colour, style) -> None:
    """Two legends right of the plots: colour = layout flavour, line style = policy."""
    from matplotlib.lines import Line2D

    by_colour = [Line2D([], [], color=colour[f], lw=2.5, label=f) for f in flavours]
    fig.legend(handles=by_colour, title="colour: layout", loc="upper left", bbox_to_anchor=(0.8, 0.93),
               fontsize=8, title_fontsize=8, frameon=False)
    if any(rests):
        by_style = [Line2D([], [], color="#444444", ls=style[r][0], marker=style[r][1], ms=4, label=r or "-")
                    for r in rests]
        fig.legend(handles=by_style, title="line: policy", loc="center left", bbox_to_anchor=(0.8, 0.5),
                   fontsize=8, title_fontsize=8, frameon=False)


# ------------------------------------------------------------------------------------------------ SPPO
PIPELINE_ROWS = (("compute", ("compute", "comm")), ("p2p", ("p2p",)), ("d2h", ("d2h",)), ("h2d", ("h2d",)))


def subsequence_of(op_name: str) -> int | None:
    """The subsequence an SPPO op belongs to, from its name (``qkv@s3``, ``offload@s3.1``); None for an
    op without a tag (one subsequence, or per-iteration work)."""
    return _tag_index(op_name, "@s")


def micro_batch_of(op_name: str) -> int | None:
    """The micro-batch a micro-batch pipeline's op belongs to, from its name (``qkv@m3``); None for
    per-iteration work (gradient buckets, the optimizer)."""
    return _tag_index(op_name, "@m")


def _tag_index(op_name: str, marker: str) -> int | None:
    if marker not in op_name:
        return None
    tag = op_name.split(marker, 1)[1]
    try:
        return int(tag.split(".")[0])
    except ValueError:
        return None


def _merged_spans(events: list[TimelineEvent], tol: float,
                  item_of=subsequence_of) -> list[tuple[float, float, TimelineEvent]]:
    """Consecutive events of one (subsequence or micro-batch: ``item_of``, phase) merged where they
    are less than ``tol`` apart."""
    out: list[list] = []
    for e in sorted(events, key=lambda e: e.start):
        key = (item_of(e.op), e.phase if e.phase not in ("p2p_fwd", "p2p_bwd") else e.phase)
        if out and out[-1][3] == key and e.start - out[-1][1] <= tol:
            out[-1][1] = max(out[-1][1], e.end)
        else:
            out.append([e.start, e.end, e, key])
    return [(a, b, e) for a, b, e, _ in out]


def pipeline_gantt_figure(timeline: Timeline, path: str | Path) -> Path:
    """A pipeline over the whole iteration (like SPPO's Figure 8): per stage its compute (kernels
    and TP collectives), P2P, offload and prefetch streams against time, bars coloured by
    subsequence (SPPO) or micro-batch (1F1B, interleaved 1F1B; ``meta.pipeline.micro_batches``),
    forward solid, backward hatched, recompute dotted, copies lighter, idle compute time (the
    bubbles) shaded, each stage's bubble share written beside it."""
    from matplotlib import colormaps
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    pipe = (timeline.meta or {}).get("pipeline")
    if not pipe:
        raise MemoError("the timeline is not a pipeline timeline: no meta.pipeline")
    stages = [st["stage"] for st in pipe["stages"]]
    by_mb = "micro_batches" in pipe
    n_sub = max(1, int((pipe.get("micro_batches") if by_mb else pipe.get("subseqs")) or 1))
    item_of = micro_batch_of if by_mb else subsequence_of
    cmap = colormaps["viridis"]
    end = max((e.end for e in timeline.events), default=0.0)
    tol = end * 2e-3
    rows: list[tuple[int, str, tuple[str, ...]]] = []
    for s in stages:
        present = {e.stream for e in timeline.events if e.device == s}
        rows += [(s, label, streams) for label, streams in PIPELINE_ROWS if present & set(streams)]
    fig = Figure(figsize=(14, 0.32 * len(rows) + 2.2))
    ax = fig.subplots(1, 1)
    busy: dict[int, float] = {}
    drawn: set[str] = set()  # legend entries: only the kinds of bar drawn
    by_device: dict[int, list[TimelineEvent]] = {}
    for e in timeline.events:
        by_device.setdefault(e.device, []).append(e)
    for r, (s, label, streams) in enumerate(rows):
        evs = [e for e in by_device.get(s, []) if e.stream in streams]
        if label == "compute":
            ax.broken_barh([(0, end)], (r - 0.45, 0.9), facecolors="#F4D6D6", edgecolors="none")  # idle = bubble
            busy[s] = sum(e.duration for e in evs)
        groups: dict[tuple, list[tuple[float, float]]] = {}
        for a, b, e in _merged_spans(evs, tol if label == "compute" else 5 * tol, item_of):
            sub = item_of(e.op)
            if sub is None and not by_mb and pipe.get("subseqs") == 1 and e.phase in (
                    "fwd", "bwd", "offload", "prefetch", "classifier", "p2p_fwd", "p2p_bwd"):
                sub = 0
            hatch = "////" if e.phase in ("bwd", "p2p_bwd", "prefetch") else "..." if e.phase == "recompute" else None
            groups.setdefault((sub, hatch), []).append((a, max(b - a, end * 1e-4)))
        light = label in ("d2h", "h2d", "p2p")
        for hatch in (None, "////", "..."):  # one artist per row and hatch, a colour per bar
            verts, colors = [], []
            for (sub, h), spans in groups.items():
                if h != hatch:
                    continue
                rgba = to_rgba(cmap(sub / max(1, n_sub - 1)) if sub is not None else "#9E9E9E",
                               0.55 if light else 1.0)
                for a, w in spans:
                    verts.append([(a, r - 0.4), (a + w, r - 0.4), (a + w, r + 0.4), (a, r + 0.4)])
                    colors.append(rgba)
            if verts:
                ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="none", hatch=hatch),
                                  autolim=False)
                drawn.add("copies" if light else {None: "forward", "////": "backward", "...": "recompute"}[hatch])
        drawn |= {"other" for (sub, _h) in groups if sub is None}
        if label == "compute" and end > 0:
            ax.text(end * 1.005, r, f"idle {100 * (1 - busy[s] / end):.0f}%", va="center", fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {s} {label}" for s, label, _ in rows], fontsize=7)
    ax.set_xlim(0, end * 1.06 if end else 1)
    ax.set_xlabel("time in the iteration (s)")
    ax.grid(axis="x", alpha=0.3)
    meta = timeline.meta or {}
    ax.set_title(" | ".join(str(meta[k]) for k in ("model", "layout", "policy", "profile") if meta.get(k))
                 + (f" | {fmt_count(meta['seq_tokens'])} tokens" if meta.get("seq_tokens") else "")
                 + (f" | {pipe.get('schedule')}, {n_sub} micro-batches, PP={len(stages)}"
                    + (f" x {pipe.get('vpp')} chunks" if (pipe.get("vpp") or 1) > 1 else "") if by_mb
                    else f" | N={n_sub}, PP={len(stages)}")
                 + (f"\neach stage's rows: one of its {represented_gpus(timeline)} identical GPUs (simulated)"
                    if represented_gpus(timeline) else ""), fontsize=10)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    sm = ScalarMappable(norm=Normalize(0, max(1, n_sub - 1)), cmap=cmap)
    from matplotlib.ticker import MaxNLocator

    cb = fig.colorbar(sm, ax=ax, label="micro-batch" if by_mb else "subsequence", fraction=0.025, pad=0.06)
    cb.locator = MaxNLocator(integer=True)  # whole micro-batches / subsequences
    cb.update_ticks()
    kinds = {"forward": Patch(facecolor="#777777", label="forward"),
             "backward": Patch(facecolor="#777777", hatch="////", label="backward"),
             "recompute": Patch(facecolor="#777777", hatch="...", label="recompute"),
             "copies": Patch(facecolor="#777777", alpha=0.55, label="P2P / offload / prefetch"),
             "other": Patch(facecolor="#9E9E9E", label=f"not of one {'micro-batch' if by_mb else 'subsequence'}")}
    handles = [h for k, h in kinds.items() if k in drawn]
    if any(busy[s] < end for s in busy):
        handles.append(Patch(facecolor="#F4D6D6", label="idle compute (bubble)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, path)


def stage_memory_figure(timeline: Timeline, path: str | Path) -> Path:
    """GPU memory of each pipeline stage's GPU over the iteration (the right plot of the paper's
    Figure 8), and pinned host memory per node, with capacities."""
    meta = timeline.meta or {}
    pipe = meta.get("pipeline") or {}
    gpu = sorted({m.device for m in timeline.memory if m.kind == "gpu"})
    host = sorted({m.device for m in timeline.memory if m.kind == "host"})
    fig = Figure(figsize=(10, 3.4 * (2 if host else 1)))
    axes = fig.subplots(2 if host else 1, 1, squeeze=False, sharex=True)[:, 0]
    end = max([e.end for e in timeline.events] + [m.time for m in timeline.memory] + [0.0])
    layers = {st["stage"]: st.get("layers") for st in pipe.get("stages", [])}
    scale, unit = time_unit(end)
    _memory_panel(axes[0], timeline, "gpu", gpu, end, meta.get("gpu_capacity_bytes"), "GPU memory (GiB)",
                  lambda d: f"stage {d}" + (f" (layers {layers[d][0]}-{layers[d][1]})" if layers.get(d) else ""), None,
                  scale)
    if host:
        _memory_panel(axes[1], timeline, "host", host, end, meta.get("host_capacity_bytes"), "host memory (GiB)",
                      lambda h: f"node {-1 - h} pinned host", None, scale)
    axes[-1].set_xlabel(f"time in the iteration ({unit})")
    fig.suptitle(" | ".join(str(meta[k]) for k in ("model", "layout", "policy") if meta.get(k))
                 + " | GPU memory per pipeline stage", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def subseq_sweep_figure(points: list[dict], path: str | Path, title: str = "") -> Path:
    """Iteration time (simulated and analytic, with SPPO's closed form (p-1+N)/N·F(N)) and peak GPU
    memory against the subsequence count N; plans that do not fit marked."""
    fig = Figure(figsize=(8, 6.4))
    ax_t, ax_m = fig.subplots(2, 1, sharex=True)
    ns = [p["subseqs"] for p in points]
    sim = [p.get("iteration_s") for p in points]
    ana = [p.get("analytic_iteration_s") for p in points]
    closed = [p.get("closed_form_iteration_s") for p in points]
    ax_t.plot([n for n, v in zip(ns, ana) if v], [v for v in ana if v], "s--", color="#8C8C8C", label="analytic")
    if any(closed):
        ax_t.plot([n for n, v in zip(ns, closed) if v], [v for v in closed if v], ":", color="#C44E52",
                  label="(p-1+N)/N·F(N)")
    ax_t.plot([n for n, v in zip(ns, sim) if v], [v for v in sim if v], "o-", color="#4C72B0", label="simulated")
    top = max([v for v in sim + ana if v] + [1.0])
    _mark_failures(ax_t, ns, [p["status"] for p in points], top)
    ax_t.set_ylabel("iteration (s)")
    ax_t.legend(fontsize=8)
    ax_t.grid(alpha=0.3)
    ax_m.plot(ns, [p["peak_gpu_bytes"] / GiB for p in points], "o-", color="#55A868", label="peak GPU (fullest stage)")
    cap = points[0].get("gpu_capacity_bytes") if points else None
    if cap:
        ax_m.axhline(cap / GiB, color="#C44E52", ls="--", lw=1, label="usable capacity")
    ax_m.set_ylim(bottom=0)
    ax_t.set_ylim(bottom=0)
    ax_m.set_ylabel("peak GPU memory (GiB)")
    ax_m.set_xlabel("subsequences N")
    ax_m.set_xscale("log", base=2)
    ax_m.set_xticks(ns)
    ax_m.set_xticklabels([str(n) for n in ns])
    ax_m.legend(fontsize=8)
    ax_m.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)
