"""Figures shared by ``memo-exec run`` and ``memo-exec validate``.

- `overlay_gantt`: predicted over measured busy spans per stream; for a run of several ranks one
  panel per drawn rank (`ranks_to_draw`), each against the simulated GPU that stands for it.
- `rank_host_samples`: every drawn rank's host memory, for the memory figure's stacked host panel.
- `layer_figure`: one layer's op times, predicted beside every drawn rank's measurement (a log
  axis where they differ by more than `LOG_RATIO`, each predicted value written on its bar), and
  the measured time of every layer per rank.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from memo_sim.fileio import save_png
from memo_sim.timeline import MemorySample, Timeline

STREAM_ORDER = ("compute", "d2h", "h2d", "comm", "cp_comm", "ep_comm", "tp_p2p", "tp_bcast", "dp_comm")
COORDS = ("dp", "pp", "cp", "ulysses", "tp")
MAX_RANKS_DRAWN = 8  # beyond, one rank per pipeline stage and context position (`ranks_to_draw`)
LOG_RATIO = 20.0  # bar heights spanning more than this ratio go on a log axis
# one layer's op classes: (label, the plan's layer_timings_s key, the run's steady-state key)
LAYER_OPS = (("forward", "forward", "layer_forward_s"), ("backward", "backward", "layer_backward_s"),
             ("recompute", "recompute", "layer_recompute_s"), ("offload (d2h)", "offload", "layer_offload_s"),
             ("prefetch (h2d)", "prefetch", "layer_prefetch_s"))
PHASE_COLOUR = {"fwd": "#4C72B0", "bwd": "#DD8452", "recompute": "#C44E52", "offload": "#55A868",
                "prefetch": "#8172B3"}
RANK_STYLES = ("-", "--", ":", "-.")
RANK_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def rank_coords(rows: list[dict]) -> dict[int, str]:
    """rank -> its coordinates in the parallel groups that have more than one rank (``cp1 tp0``)."""
    used = [d for d in COORDS if len({r.get(d, 0) for r in rows}) > 1]
    return {r["rank"]: " ".join(f"{'uly' if d == 'ulysses' else d}{r.get(d, 0)}" for d in used) for r in rows}


def ranks_to_draw(rows: list[dict]) -> tuple[list[dict], str]:
    """The ranks a figure draws and a note saying which: every rank up to `MAX_RANKS_DRAWN`;
    beyond, one per (pipeline stage, context / Ulysses position), the one with tp = dp = 0 (its
    tensor- and data-parallel peers run the same schedule on the other shards)."""
    rows = sorted(rows, key=lambda r: r["rank"])
    if len(rows) <= MAX_RANKS_DRAWN:
        return rows, (f"all {len(rows)} ranks" if len(rows) > 1 else "")
    picked = [r for r in rows if r.get("tp", 0) == 0 and r.get("dp", 0) == 0][:MAX_RANKS_DRAWN]
    return picked, (f"{len(picked)} of {len(rows)} ranks: one per pipeline stage and context position "
                    f"(tp = dp = 0; their tensor- and data-parallel peers run the same schedule)")


def rank_host_samples(payloads: list[dict], ranks: list[int]) -> list[MemorySample]:
    """The host memory samples of every rank in ``ranks`` (its pinned pool, recorded by each rank
    under the node's number) under the rank's own number, so that
    `memo_sim.report.figures.memory_figure` draws each rank's host memory, stacked, instead of
    rank 0's alone."""
    return [replace(m, device=p["rank"]) for p in payloads if p["rank"] in ranks
            for m in p["memory"] if m.kind == "host"]


def _overlay_panel(ax, pred_events, meas_events, streams, spans, relative) -> None:
    for events, y0, colour, name, span in ((pred_events, 0.45, "#9ecae1", "predicted", spans[0]),
                                           (meas_events, 0.05, "#08519c", "measured", spans[1])):
        t0 = min((e.start for e in events), default=0.0)
        k = 1.0 / span if relative else 1.0
        for i, s in enumerate(streams):
            bars = [((e.start - t0) * k, e.duration * k) for e in events
                    if e.stream == s and e.duration > 0 and e.phase != "stall"]
            ax.broken_barh(bars, (i + y0, 0.4), facecolors=colour, edgecolors="none",
                           label=f"{name} ({span:.4g} s)" if i == 0 else None)
    ax.set_yticks([i + 0.45 for i in range(len(streams))], streams)
    ax.set_ylim(-0.1, len(streams))


def _span(events) -> float:
    return max(max((e.end for e in events), default=0.0) - min((e.start for e in events), default=0.0), 1e-12)


def overlay_gantt(pred: Timeline, meas: Timeline, path: Path, title: str, ranks: list[dict] | None = None,
                  note: str = "") -> Path:
    """Predicted (light, upper half of each row) and measured (dark, lower half) busy spans per
    stream, each from its own iteration start; compute-stream stalls (waits) are not drawn. When the
    two iterations differ in length by more than 2x (a CPU run of a GPU plan) both are drawn as
    fractions of their own iteration, so that their shapes can still be compared. ``ranks`` (rows
    with ``rank`` and the parallel coordinates): one panel per rank, its measured events (device =
    rank) against the simulated GPU of its pipeline stage."""
    ranks = ranks or [{"rank": None}]
    stages = sorted({e.device for e in pred.events})
    labels = rank_coords([r for r in ranks if r["rank"] is not None]) if ranks[0]["rank"] is not None else {}
    panels = []
    for r in ranks:
        mev = [e for e in meas.events if r["rank"] is None or e.device == r["rank"]]
        stage = r.get("pp", 0) if len(stages) > 1 else None
        pev = [e for e in pred.events if stage is None or e.device == stage]
        panels.append((r, pev, mev))
    present = {e.stream for _r, pev, mev in panels for e in pev + mev}
    streams = [s for s in STREAM_ORDER if s in present] + sorted(present - set(STREAM_ORDER))
    spans = [(_span(pev), _span(mev)) for _r, pev, mev in panels]
    relative = any(max(a, b) > 2 * min(a, b) for a, b in spans)
    row_h = 0.45 * len(streams) + 0.5
    fig = Figure(figsize=(11, 1.2 + row_h * len(panels) + 0.5 * (len(panels) - 1)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=relative)[:, 0]
    for ax, (r, pev, mev), sp in zip(axes, panels, spans):
        _overlay_panel(ax, pev, mev, streams, sp, relative)
        if r["rank"] is not None:
            who = f"rank {r['rank']}" + (f" ({labels[r['rank']]})" if labels.get(r["rank"]) else "")
            ax.set_title(f"{who}: predicted {sp[0]:.4g} s, measured {sp[1]:.4g} s", fontsize=9, loc="left")
    axes[-1].set_xlabel("fraction of each iteration (lengths differ by more than 2x)" if relative
                        else "seconds from iteration start")
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=11)
    handles = [Line2D([], [], color=c, lw=6, label=n) for c, n in (("#9ecae1", "predicted"), ("#08519c", "measured"))]
    fig.legend(handles=handles, loc="upper right", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return save_png(fig, path, dpi=100, tight=False)  # laid out above: no second, cropping layout pass


def layer_figure(predicted: dict, measured: list[tuple[str, dict]], per_layer: list[tuple[str, dict]],
                 step: int, path: Path, note: str = "", predicted_from: str = "") -> Path:
    """Left: one layer's time per op class, the prediction (``predicted``: layer_timings_s; the plan's, or the
    re-simulation's where the report's per-layer rows use it: ``predicted_from`` names them in the legend, as
    the rows' source column does, `memo_exec.report.predicted_layer_timings`) beside each rank's measurement
    (``measured``: (label, steady-state dict)); on a log axis when the bars differ by more than `LOG_RATIO` (a
    CPU run of a GPU plan), every predicted value written on its bar. Right: the measured time of every layer
    in the last step, a colour per op class and a line style per rank (``per_layer``: (label, {phase: {layer:
    seconds}}))."""
    fig = Figure(figsize=(12, 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    ops = [op for op in LAYER_OPS if predicted.get(op[1]) or any(st.get(op[2]) for _l, st in measured)]
    label = "\n".join(textwrap.wrap(f"predicted ({predicted_from})", 48)) if predicted_from else "predicted"
    series = [(label, "#8C8C8C", [predicted.get(k) for _l, k, _m in ops])]
    blues = ("#4C72B0", "#2F4B7C", "#6A8FD0", "#1B2F57", "#8FA9DD", "#3A5A98", "#A9BFE8", "#243B66")
    series += [(f"measured, {lab}" if lab else "measured", blues[i % len(blues)], [st.get(m) for *_x, m in ops])
               for i, (lab, st) in enumerate(measured)]
    vals = [v * 1e3 for _n, _c, vs in series for v in vs if v]
    log = bool(vals) and max(vals) > LOG_RATIO * min(vals)
    floor = min(vals) / 3 if log else 0.0
    if log:
        ax1.set_yscale("log", nonpositive="clip")
        ax1.set_ylim(bottom=floor, top=max(vals) * 3)
    width = 0.8 / len(series)
    for j, (name, colour, vs) in enumerate(series):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(ops))]
        ax1.bar(xs, [(v or 0) * 1e3 for v in vs], width, label=name, color=colour)
        for x, v in zip(xs, vs):  # the prediction's value on its bar, readable however small; a gap named
            if j == 0 or v is None:
                words = ("not predicted" if j == 0 else "not measured") if v is None else f"{v * 1e3:.3g}"
                ax1.annotate(words, (x, max((v or 0) * 1e3, floor)), xytext=(0, 2), textcoords="offset points",
                             ha="center", va="bottom", fontsize=7, rotation=90, annotation_clip=False)
    ax1.set_xticks(range(len(ops)), [op[0] for op in ops], fontsize=8)
    ax1.set_ylabel("ms per layer" + (" (log scale)" if log else ""))
    ax1.legend(fontsize=7)
    ax1.grid(axis="y", alpha=0.3)
    ax1.set_title("one layer: predicted vs measured" + (" (they differ by orders of magnitude)" if log else ""),
                  fontsize=10)
    phases_drawn: set[str] = set()
    for k, (lab, per) in enumerate(per_layer):
        for phase, colour in PHASE_COLOUR.items():
            d = per.get(phase) or {}
            if d:
                phases_drawn.add(phase)
                ax2.plot([int(x) for x in d], [v * 1e3 for v in d.values()], color=colour,
                         ls=RANK_STYLES[k % len(RANK_STYLES)], marker=RANK_MARKERS[k % len(RANK_MARKERS)], ms=3)
    handles = [Line2D([], [], color=PHASE_COLOUR[p], lw=2, label=p) for p in PHASE_COLOUR if p in phases_drawn]
    if len(per_layer) > 1:
        handles += [Line2D([], [], color="#444444", ls=RANK_STYLES[k % len(RANK_STYLES)],
                           marker=RANK_MARKERS[k % len(RANK_MARKERS)], ms=3, label=lab)
                    for k, (lab, _p) in enumerate(per_layer)]
    ax2.legend(handles=handles, fontsize=7, ncol=2 if len(handles) > 6 else 1)
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("layer")
    ax2.set_ylabel("ms")
    ax2.set_title(f"measured per layer (step {step})", fontsize=10)
    ax2.grid(alpha=0.3)
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, dpi=100, tight=False)  # laid out above: no second, cropping layout pass
