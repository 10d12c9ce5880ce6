"""Figures shared by ``memo-exec run`` and ``memo-exec validate``."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from memo_sim.fileio import save_png
from memo_sim.timeline import Timeline

STREAM_ORDER = ("compute", "d2h", "h2d", "comm", "cp_comm", "dp_comm")


def overlay_gantt(pred: Timeline, meas: Timeline, path: Path, title: str) -> Path:
    """Predicted (light, upper half of each row) and measured (dark, lower half) busy spans per
    stream, each from its own iteration start; compute-stream stalls (waits) are not drawn. When the
    two iterations differ in length by more than 2x (a CPU run of a GPU plan) both are drawn as
    fractions of their own iteration, so that their shapes can still be compared."""
    present = set(pred.streams()) | set(meas.streams())
    streams = [s for s in STREAM_ORDER if s in present]
    spans_p, spans_m = max(pred.makespan, 1e-12), max(meas.makespan, 1e-12)
    relative = max(spans_p, spans_m) > 2 * min(spans_p, spans_m)
    fig = Figure(figsize=(11, 1 + 0.8 * len(streams)))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for tl, y0, colour, name, span in ((pred, 0.45, "#9ecae1", "predicted", spans_p),
                                       (meas, 0.05, "#08519c", "measured", spans_m)):
        t0 = min((e.start for e in tl.events), default=0.0)
        k = 1.0 / span if relative else 1.0
        for i, s in enumerate(streams):
            spans = [((e.start - t0) * k, e.duration * k) for e in tl.events
                     if e.stream == s and e.duration > 0 and e.phase != "stall"]
            ax.broken_barh(spans, (i + y0, 0.4), facecolors=colour, edgecolors="none",
                           label=f"{name} ({span:.4g} s)" if i == 0 else None)
    ax.set_yticks([i + 0.45 for i in range(len(streams))], streams)
    ax.set_xlabel("fraction of each iteration (lengths differ by more than 2x)" if relative
                  else "seconds from iteration start")
    ax.set_title(title, pad=22)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return save_png(fig, path, dpi=100)
