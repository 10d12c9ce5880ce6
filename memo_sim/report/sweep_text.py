"""The sweeps' answers (`memo-sim sweep-alpha`, `sweep-seq`, `sweep-subseqs`) as tables: one row
per simulated run, its tier (``sim``: the event simulator, as the what-if's ranked table names it), its peak
with the source, and why a run that does not fit fails as a note; and a run's JSON row (`run_json`), which
names its tier as a what-if row does."""

from __future__ import annotations

from memo_sim.report.formats import Answer
from memo_sim.report.peaks import SIMULATED, Peak, allocator_of, result_peak, tier_cell
from memo_sim.units import fmt_bytes, fmt_time

RUN_HEAD = ["status", "tier", "iter (sim)", "MFU", "TGS", "peak GPU (sim)", "allocator", "host/node", "copy stall",
            "allocator stalls"]
RUN_TIER = tier_cell(SIMULATED)  # every run's numbers are the event simulator's, a failed run's too


def run_json(r) -> dict:
    """One simulated run's JSON row: `SimResult.to_dict` and its ``tier`` ("simulated": the event simulator
    produced every number of the row, as a what-if row's ``tier`` says)."""
    return {**r.to_dict(), "tier": SIMULATED}


def _stalls(r) -> str:
    """A run's caching-allocator stalls: the replay's reorganisations and the compute time they cost
    (`memo_sim.engine.result.allocator_summary`), a static memory plan's too: its replay holds the plan's arena as
    one request and replays the rest on the caching allocator (`memo_sim.memplan.iteration_replay.engine_replay`),
    whose stalls the engine charges as any plan's (`runs_answer` says so under the table). ``not replayed``: a
    micro-batch pipeline's or SPPO's run (``"replayed": False``); ``-``: a memory plan's block without the replay's
    counts (``allocator_summary``'s stub where no replay is given)."""
    a = r.allocator or {}
    if a.get("replayed") is False:
        return "not replayed"
    if a.get("static_memory_plan") and "cuda_mallocs" not in a:
        return "-"
    return f"{a['reorganizations']} reorg., {fmt_time(a['stall_s'])}"


def _plan_replayed(r) -> bool:
    """Whether ``r``'s allocator-stalls cell is a static memory plan's replay (`_stalls`)."""
    a = getattr(r, "allocator", None) or {}
    return bool(r.ok and a.get("static_memory_plan") and _stalls(r) not in ("-", "not replayed"))


def allocator_words(r) -> str:
    """Who placed a simulated run's transients, in explain's words (`memo_sim.report.peaks.Peak.allocator_words`):
    a run no caching-allocator replay reserved (a micro-batch pipeline's, SPPO's: ``"replayed": False``) reads
    ``allocated: no caching-allocator replay``, failed or not (a review: an SPPO row read 'caching allocator' beside
    'allocator stalls: not replayed')."""
    replayed = (getattr(r, "allocator", None) or {}).get("replayed") is not False
    return Peak(0.0, SIMULATED, allocator_of(r.policy, r.layout), replayed).allocator_words


def run_cells(r) -> list[str]:
    """One simulated run's cells under `RUN_HEAD`."""
    if not r.ok:
        return [r.status, RUN_TIER, "-", "-", "-", "-", allocator_words(r), "-", "-", "-"]
    p = result_peak(r)
    return [r.status, RUN_TIER, fmt_time(r.iteration_s), f"{100 * r.mfu:.1f}%", f"{r.tgs:.0f}", fmt_bytes(p.bytes),
            p.allocator_words, fmt_bytes(r.peak_host_bytes_per_node), fmt_time(r.exposed_copy_s), _stalls(r)]


def runs_answer(verdict: str, key_head: list[str], keyed_runs: list[tuple[list[str], object]]) -> Answer:
    """A table of runs keyed by ``key_head`` cells, and a note per run that failed (simulated)."""
    a = Answer(verdict)
    a.table(key_head + RUN_HEAD, [keys + run_cells(r) for keys, r in keyed_runs])
    if any(_plan_replayed(r) for _keys, r in keyed_runs):
        a.line("  allocator stalls of a memory plan: the caching allocator's, replayed for the tensors outside the "
               "plan's arena (the arena, one allocation held whole, does not fragment)")
    for keys, r in keyed_runs:
        if not r.ok:
            a.line(f"  {' '.join(k.strip() for k in keys)}: {r.failure.message()} (simulated, {allocator_words(r)})")
    return a
