"""Plain-text tables for the terminal."""

from __future__ import annotations

from memo_sim.units import fmt_bytes


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) if c[:1].isdigit() or c[:1] == "-" else c.ljust(w) for c, w in zip(r, widths))
            for r in rows]
    return "\n".join([line, sep, *body])


def status_text(status: str, over_bytes: float) -> str:
    """``OK``, or the status and the bytes over capacity; an OOM with none over (the caching allocator's replay
    found no block for a request although the peak fits: fragmentation) says so."""
    if status == "OK":
        return status
    if over_bytes <= 0 and status == "OOM":
        return "OOM frag"
    return f"{status} +{fmt_bytes(over_bytes)}"
