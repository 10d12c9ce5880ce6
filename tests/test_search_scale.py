"""The what-if at cluster scale (issue #32): the analytic tier prices pipeline candidates from memos
keyed by what each cost reads (`memo_sim.cost.memo.memoised_by`) and defers a candidate's
estimate to its first read (`Candidate.estimate`); ``whatif --json`` lists every fitting
candidate and the closest others up to `LISTED_MAX` rows and counts the rest. Each must give
exactly what the plain path gives."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.memo import clear_caches, unmemoised
from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.report import candidate_rows
from memo_sim.search.estimate import IterationEstimate, estimate_pipeline
from memo_sim.search.whatif import candidates_for

SCHEDULES = ("single_stage", "1f1b", "interleaved_1f1b")


def _rows(result) -> list:
    return [c.to_json() for c in result.candidates] + [(lay.label(), why) for lay, why in result.rejected_layouts]


def _space():
    return replace(get_model("gpt-7b"), layers=8), load_profile("a100-sxm4-80gb")


def test_memoised_pipeline_candidates_are_the_plain_ones():
    model, prof = _space()
    kw = dict(schedules=SCHEDULES, batch=4, policies=("store_all", "memo"))
    with unmemoised():
        plain = _rows(candidates_for(model, 16384, 8, prof, **kw))
    clear_caches()
    cold = _rows(candidates_for(model, 16384, 8, prof, **kw))
    warm = _rows(candidates_for(model, 16384, 8, prof, **kw))
    assert any(r["schedule"] == "interleaved_1f1b" for r in plain if isinstance(r, dict))
    assert cold == plain  # exact: every float bit for bit
    assert warm == plain


def test_estimate_is_priced_on_first_read_and_equals_the_direct_one():
    model, prof = _space()
    res = candidates_for(model, 131072, 16, prof, schedules=("1f1b",), batch=4, policies=("store_all",))
    unfit = [c for c in res.candidates if c.memory.status != "OK"]
    assert unfit and all(not isinstance(c.priced, IterationEstimate) for c in unfit)  # never read: never priced
    c = unfit[0]
    direct = estimate_pipeline(model, c.layout, c.batch, c.micro_batch, c.seq, c.policy, prof)
    assert c.estimate == direct and isinstance(c.priced, IterationEstimate)


def test_listed_keeps_every_fitting_row_and_the_closest_others():
    shown = [SimpleNamespace(status=s, schedule="1f1b") for s in ["OK", "OOM", "OK", "OOHM", "OOM", "OK", "OOM"]]
    assert candidate_rows.listed(shown, everything=True) == (list(range(7)), [])
    keep, left = candidate_rows.listed(shown * 400)  # 2,800 rows, 1,200 of them fitting
    assert len(keep) == candidate_rows.LISTED_MAX and keep == sorted(keep)
    fitting = [i for i in range(2800) if shown[i % 7].status == "OK"]
    assert set(fitting) <= set(keep) and len(left) == 800 and not set(left) & set(keep)
    others = [i for i in range(2800) if shown[i % 7].status != "OK"]
    assert left == others[-800:]  # the farthest from fitting are counted, not listed


def test_json_lists_fitting_rows_and_counts_the_rest(monkeypatch):
    args = ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "8", "--seq", "1M", "--json", "--no-plan",
            "--simulate-top", "0", "--jobs", "1", "--policy", "memo", "--policy", "store_all"]
    full = json.loads(CliRunner().invoke(cli, args + ["--all-candidates"]).output)
    assert full["candidates_left_out"] is None
    fitting = [r for r in full["candidates"] if r["status"] == "OK"]
    monkeypatch.setattr(candidate_rows, "LISTED_MAX", len(fitting) + 1)
    short = json.loads(CliRunner().invoke(cli, args).output)
    left = short["candidates_left_out"]
    assert len(short["candidates"]) == len(fitting) + 1
    assert left["count"] == len(full["candidates"]) - len(fitting) - 1
    assert sum(left["by_status"].values()) == left["count"] == sum(left["by_schedule"].values())
    by_rank = {r["rank"]: r for r in full["candidates"]}
    strip = lambda r: {k: v for k, v in r.items() if not k.endswith("wall_s")}  # noqa: E731
    assert all(strip(r) == strip(by_rank[r["rank"]]) for r in short["candidates"])  # the same rows, same ranks
    assert {r["rank"] for r in fitting} <= {r["rank"] for r in short["candidates"]}


def test_rank_leaves_the_collector_as_it_found_it(monkeypatch):
    """The analytic tier runs with the cyclic collector paused (`memo_sim.engine.core.gc_paused`):
    a library caller gets it back as it was (on and unfrozen, or off), and the ranking is the
    one computed with the collector running throughout."""
    import contextlib
    import gc

    from memo_sim.search.whatif import rank

    model, prof = _space()
    kw = dict(simulate_top=0, schedules=("single_stage", "1f1b"), batch=2, policies=("store_all", "memo"))
    frozen = gc.get_freeze_count()
    paused = [c.to_json() for c in rank(model, 16384, 8, prof, **kw).candidates]
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()
    try:
        rank(model, 16384, 8, prof, **kw)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
    clear_caches()
    monkeypatch.setattr("memo_sim.search.whatif.gc_paused", contextlib.nullcontext)  # never paused
    running = [c.to_json() for c in rank(model, 16384, 8, prof, **kw).candidates]
    assert running == paused
