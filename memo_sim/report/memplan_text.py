"""`memo-sim memplan`'s answer in words and tables (its JSON is the result object itself)."""

from __future__ import annotations

from memo_sim.report.formats import Answer
from memo_sim.units import fmt_bytes, fmt_count, fmt_time

LEVELS = {"level1_fwd": ("level 1 fwd", "one layer's forward transients"),
          "level1_bwd": ("level 1 bwd", "one layer's backward transients"),
          "level2_model": ("level 2", "the iteration: the layer arenas and what lives across layers")}


def _solution_row(name: str, what: str, sol: dict) -> list[str]:
    return [name, what, fmt_bytes(sol["peak_bytes"]), fmt_bytes(sol["lower_bound_bytes"]),
            f"{100 * sol['gap']:.2f}%", sol["method"], "yes" if sol["proven_optimal"] else "no",
            fmt_time(sol["solve_time_s"])]


HEAD = ["level", "what it places", "peak", "lower bound", "gap", "method", "optimal", "solve time"]


def _allocator_words(ca: dict) -> str:
    return (f"peak allocated {fmt_bytes(ca['peak_allocated_bytes'])}, reserved {fmt_bytes(ca['peak_reserved_bytes'])}"
            f" (fragmentation when the allocation peaks {100 * ca['fragmentation_at_peak']:.1f}%), "
            f"{ca['num_reorganizations']} reorganisations, {ca['num_cuda_malloc']} cudaMalloc calls"
            + (", out of memory" if ca["oom"] else ""))


PLACEMENT_HEAD = ["tensor", "offset (bytes)", "size (bytes)"]


def memplan_answer(result: dict, placement: list[tuple[str, int, int]] | None = None) -> Answer:
    """A verdict, the solutions as one table, the caching allocator on the same requests, figures. A file's
    problem (``--csv``/``--trace``) also gets its answer, ``placement``: each buffer's (id, offset, size) in the
    file's order, as whole bytes (the ``offsets`` of ``--json``; a review: table, csv and md printed no offset)."""
    if "level2_model" in result:
        a = Answer(f"answer: {result['model']} {result['layout']} {result['policy']}, {fmt_count(result['seq_tokens'])} tokens: "
                   f"static plan arena {fmt_bytes(result['arena_bytes'])} (level 2, memory plan)")
        a.table(HEAD, [_solution_row(*LEVELS[k], result[k]) for k in LEVELS])
        a.line("caching allocator on one layer's forward and backward requests: "
               + _allocator_words(result["caching_allocator_layer"]))
    else:
        a = Answer(f"answer: {result['source']}: {result['buffers']} buffers placed in {fmt_bytes(result['peak_bytes'])}"
                   f" ({'optimal' if result['proven_optimal'] else 'gap ' + format(100 * result['gap'], '.2f') + '%'}"
                   f" against the lower bound {fmt_bytes(result['lower_bound_bytes'])}), {result['method']}, "
                   f"{fmt_time(result['solve_time_s'])}")
        if result.get("capacity_bytes") is not None:
            a.line(f"capacity {fmt_bytes(result['capacity_bytes'])}: "
                   + ("fits" if result.get("fits_capacity") else "does not fit"))
        phases = result.get("phases") or []
        if phases:
            a.table(["phase", "time", "peak", "detail"],
                    [[ph["phase"], fmt_time(ph["time_s"]), fmt_bytes(ph["peak_bytes"]), ph.get("detail", "")]
                     for ph in phases])
        if placement:
            a.table(PLACEMENT_HEAD, [[str(t), str(off), str(size)] for t, off, size in placement],
                    title=f"placement: each buffer's offset in the {result['peak_bytes']} B arena")
        a.line("caching allocator on the same requests: " + _allocator_words(result["caching_allocator"]))
    for f in result.get("figures") or ():
        a.line(f"figure: {f}")
    return a
