"""Draw a static memory plan: address over time, one rectangle per buffer, the large ones labelled
with their tensor's name and size."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from memo_sim.fileio import save_png
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.units import fmt_bytes

LABEL_MIN_FRACTION = 0.04  # a rectangle at least this share of the plot's width and height carries its name
TALL_FRACTION = 0.12  # ... or this share of its height and a step wide: its name alone, written upwards


def is_large(b: Buffer, x_span: float, y_span_bytes: float) -> bool:
    """Whether buffer ``b``'s rectangle is large enough to carry a label."""
    w, h = (b.upper - b.lower) / x_span, b.size / y_span_bytes
    return h >= LABEL_MIN_FRACTION and (w >= LABEL_MIN_FRACTION or (h >= TALL_FRACTION and w >= 0.01))


def draw_placement(trace: RequestTrace, offsets: dict[str, int], arena_bytes: int, path: str | Path,
                   title: str = "") -> Path:
    from matplotlib import colormaps
    from matplotlib.collections import PolyCollection

    fig = Figure(figsize=(10, 5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    cmap = colormaps["tab20"]
    unit, uname = (2**30, "GiB") if arena_bytes >= 2**30 else (2**20, "MiB")
    lb = trace.max_live_bytes()
    x0, x1 = min(b.lower for b in trace.buffers), max(b.upper for b in trace.buffers)
    top = max(arena_bytes, lb)
    boxes = []  # one collection, not a patch per buffer: a 100k-buffer plan draws in seconds
    for b in trace.buffers:
        y0, y1 = offsets[b.id] / unit, (offsets[b.id] + b.size) / unit
        boxes.append(((b.lower, y0), (b.upper, y0), (b.upper, y1), (b.lower, y1)))
    ax.add_collection(PolyCollection(boxes, facecolors=[cmap(k % 20) for k in range(len(boxes))],
                                     edgecolors="black", linewidths=0.3))
    for b in trace.buffers:
        if is_large(b, x1 - x0, top):
            narrow = (b.upper - b.lower) < LABEL_MIN_FRACTION * (x1 - x0)
            tall = b.size / top > (b.upper - b.lower) / (x1 - x0)
            ax.text(b.lower + (b.upper - b.lower) / 2, (offsets[b.id] + b.size / 2) / unit,
                    f"{b.name or b.id}" + ("" if narrow else f"\n{fmt_bytes(b.size)}"), ha="center", va="center",
                    fontsize=6 if narrow else 7, rotation=90 if tall else 0, clip_on=True, gid=f"buffer:{b.id}")
    ax.axhline(arena_bytes / unit, color="red", linestyle="--", linewidth=1, label="arena (planned peak)")
    ax.axhline(lb / unit, color="grey", linestyle=":", linewidth=1, label="max-live lower bound")
    ax.set_xlim(x0, x1)
    ax.set_ylim(0, top / unit * 1.05)
    ax.set_xlabel("allocation step")
    ax.set_ylabel(f"address ({uname})")
    ax.set_title((title or trace.name) + f"\nlabelled: buffers over {LABEL_MIN_FRACTION:.0%} of the steps and "
                 f"of the arena, or a step wide and over {TALL_FRACTION:.0%} of the arena", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return save_png(fig, path, dpi=100)
