"""The ranked candidates of a ``whatif --json`` answer: every one in full up to `LISTED_MAX`;
beyond that (a cluster-scale query ranks tens of thousands, 111 MB of JSON for GPT-175B on 1,024
GPUs with pipelines) every fitting candidate in full, then the closest non-fitting ones up to
`LISTED_MAX` rows, and the rest counted by status and schedule (``candidates_left_out``);
``everything`` (``whatif --all-candidates``) lists every one. Each row keeps its rank in the
whole ranking, so a listed row reads the same either way."""

from __future__ import annotations

from collections import Counter

from memo_sim.report.peaks import candidate_peak

LISTED_MAX = 2000  # rows listed in full by default when the ranking holds more


def candidate_row(rank: int, c) -> dict:
    """One candidate's row: its rank (1 = best), `Candidate.to_json`, its one peak and, for a plan that fits, the
    proved upper bound on its throughput the bound search ranks and skips it by (`memo_sim.search.prune.
    tgs_upper_bound`), so a reader can check that no simulated row beats its bound and that every skipped one lies
    below the best (a review could check it only through the Python API)."""
    from memo_sim.search.prune import tgs_upper_bound  # noqa: PLC0415

    bound = float(tgs_upper_bound(c)) if c.status == "OK" else None
    return dict(rank=rank, **c.to_json(), peak=candidate_peak(c).to_json(), proved_bound_tgs_tokens_per_gpu_s=bound)


def listed(shown: list, everything: bool = False) -> tuple[list[int], list[int]]:
    """Positions in ``shown`` (the ranking, duplicates folded) of the rows listed in full and of
    those left out (module docs)."""
    if everything or len(shown) <= LISTED_MAX:
        return list(range(len(shown))), []
    fitting = [i for i, c in enumerate(shown) if c.status == "OK"]
    rest = [i for i, c in enumerate(shown) if c.status != "OK"]
    room = max(0, LISTED_MAX - len(fitting))
    return sorted(fitting + rest[:room]), rest[room:]


def candidates_json(shown: list, everything: bool = False) -> dict:
    """``candidates`` (the rows listed) and ``candidates_left_out`` (None when every row is listed;
    else how many are not, by status and by schedule, and the flag that lists them)."""
    keep, left = listed(shown, everything)
    rows = [candidate_row(i + 1, shown[i]) for i in keep]
    if not left:
        return {"candidates": rows, "candidates_left_out": None}
    return {"candidates": rows, "candidates_left_out": {
        "count": len(left),
        "by_status": dict(Counter(shown[i].status for i in left)),
        "by_schedule": dict(Counter(shown[i].schedule for i in left)),
        "why": f"the ranking holds {len(shown)} rows: every fitting one and the closest others are listed, up to "
               f"{LISTED_MAX}; --all-candidates lists every one"}}


__all__ = ["LISTED_MAX", "candidate_row", "candidates_json", "listed"]
