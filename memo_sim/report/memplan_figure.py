"""Draw a static memory plan: address over time, one rectangle per buffer."""

from __future__ import annotations

from pathlib import Path

from memo_sim.fileio import save_png
from memo_sim.request_trace import RequestTrace


def draw_placement(trace: RequestTrace, offsets: dict[str, int], arena_bytes: int, path: str | Path,
                   title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(10, 5))
    cmap = plt.get_cmap("tab20")
    unit, uname = (2**30, "GiB") if arena_bytes >= 2**30 else (2**20, "MiB")
    for k, b in enumerate(trace.buffers):
        ax.add_patch(Rectangle((b.lower, offsets[b.id] / unit), b.upper - b.lower, b.size / unit,
                               facecolor=cmap(k % 20), edgecolor="black", linewidth=0.3))
    ax.axhline(arena_bytes / unit, color="red", linestyle="--", linewidth=1, label="arena (planned peak)")
    lb = trace.max_live_bytes()
    ax.axhline(lb / unit, color="grey", linestyle=":", linewidth=1, label="max-live lower bound")
    ax.set_xlim(min(b.lower for b in trace.buffers), max(b.upper for b in trace.buffers))
    ax.set_ylim(0, max(arena_bytes, lb) / unit * 1.05)
    ax.set_xlabel("allocation step")
    ax.set_ylabel(f"address ({uname})")
    ax.set_title(title or trace.name)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    out = save_png(fig, path, dpi=110)
    plt.close(fig)
    return out
