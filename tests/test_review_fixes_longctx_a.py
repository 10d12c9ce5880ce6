"""Review fixes (long context, a): maxseq's scan past a failure of the caching allocator's replay restarts its
look-ahead at every fit it finds there, bounded and said; sweep-seq prices an SPPO plan with the what-if's own
search for N, so that at the plan's length it gives the plan."""

from __future__ import annotations

import pytest

from memo_sim.search import maxseq as ms

K = 1024
STEP = 32 * K
# the review's non-monotone fit (checkpoint_offload, cp8 z3, 8 x H100, --step 32K): up to 53 steps (1696K) fit, 54-56
# fail, 57-63 (1824K-2016K) fit, 64 (2048K) and above fail
REVIEW_FITS = set(range(1, 54)) | set(range(57, 64))


# 1. maxseq past a failure

def test_past_failure_scan_restarts_its_look_ahead_at_each_fit():
    """A review: the scan ended 4 steps past the first failure (1856K) and reported 1.8125M, where every 32K up to
    2016K fits; the look-ahead now counts failing steps above the longest fit."""
    looked = []

    def fits(k):
        looked.append(k)
        return k in REVIEW_FITS

    found, last, capped = ms._past_failure(54, fits)
    assert found == list(range(57, 64)) and last == 63 + ms.PAST_FAILURE_STEPS and not capped
    assert looked == list(range(55, last + 1))  # each step once, in order


def test_past_failure_scan_stops_at_its_cap():
    """A fit every other step forever: the scan stops at its cap (its cost bound) and says so."""
    found, last, capped = ms._past_failure(20, lambda k: k % 2 == 1)
    assert capped and last == 20 + ms.PAST_FAILURE_MAX_STEPS and found[-1] == last - 1
    assert ms._past_failure(20, lambda k: False) == ([], 20 + ms.PAST_FAILURE_STEPS, False)
    assert ms._past_failure(2, lambda k: False) == ([], 3, False)  # +25% of a short length, at least one step


def test_max_seq_reports_the_longest_fit_past_a_failure_and_what_it_looked_at(monkeypatch):
    """`_max_seq` on the review's fit (the ranking and the replay replaced by the predicate): answer 1696K, fails at
    1728K, fits past the failure up to 2016K, looked up to 2144K; the words say the range and why the scan stopped."""
    monkeypatch.setattr(ms, "_ranked", lambda model, seq, *a, **k: seq // STEP)
    monkeypatch.setattr(ms, "_fits", lambda k: k in REVIEW_FITS)
    monkeypatch.setattr(ms, "_replay_failed", lambda k: True)
    monkeypatch.setattr(ms, "binding_constraint", lambda k: f"fails at {k} steps")
    ans = ms._max_seq(None, 8, None, "checkpoint_offload", step=STEP, simulate=False)
    assert (ans.max_seq, ans.next_seq) == (1696 * K, 1728 * K)
    assert ans.fits_past_failure == tuple(k * STEP for k in range(57, 64))
    assert ans.looked_past_failure_to == 67 * STEP and not ans.past_failure_capped and ans.looked_past == 1728 * K
    d = ans.to_json()
    assert d["longest_fit_past_failure_tokens"] == 2016 * K and d["looked_past_failure_to_tokens"] == 2144 * K
    assert d["looked_past_tokens"] == 1728 * K and d["past_failure_capped"] is False
    words = ms.past_failure_words(ans)
    assert words.startswith("longer lengths fit past a failure: 1.78125M, 1.8125M, ") and "1.96875M (" in words
    assert "looked at every 32K from 1.71875M up to 2.09375M" in words
    assert "the scan stops after 4 failing lengths in a row above 1.96875M" in words


def test_past_failure_words_without_a_fit_and_at_the_cap():
    """The words where nothing fit past the failure (also where the event simulator bound below the replay's failing
    length: the scan started past the latter), and where the scan stopped at its cap."""
    none = ms.MaxSeqAnswer("full_recompute", STEP, 416 * K, None, 448 * K, "x", looked_past_failure_to=640 * K,
                           looked_past=512 * K)
    assert ms.past_failure_words(none) == (
        "no longer length fits past the failure (the caching allocator's replay is not monotone in the length: its "
        "segments fall differently at each length; looked at every 32K from 544K up to 640K; the scan stops after 4 "
        "failing lengths in a row above 512K)")
    capped = ms.MaxSeqAnswer("full_recompute", STEP, 480 * K, None, 512 * K, "x", fits_past_failure=(2560 * K,),
                             looked_past_failure_to=2560 * K, past_failure_capped=True)
    assert f"the scan stops at {ms.PAST_FAILURE_MAX_STEPS} lengths past the failure, so a longer length may still " \
           f"fit" in ms.past_failure_words(capped)
    assert ms.past_failure_words(ms.MaxSeqAnswer("memo", STEP, 480 * K, None, 512 * K, "x")) == ""


# 2. sweep-seq on an SPPO plan

SPPO_PLAN = ["--model", "gpt-7b", "--gpus", "32", "--seq", "512K", "--profile", "a100-sxm4-80gb", "--policy", "sppo",
             "--tp", "8", "--pp", "4", "--dp", "1", "--zero", "0", "--jobs", "1"]


@pytest.mark.parametrize("seq", [512 * K, 1 << 20])
def test_resolve_for_layout_is_the_what_ifs_sppo_search(seq):
    """A review: sweep-seq priced gpt-7b's tp8+sp-pp4 SPPO plan with the heuristic's N only (N=64 at 1M, 177.72 s
    analytic) where the what-if's search chose N=128 (175.77 s). A fixed layout's SPPO point is now the what-if's
    best point of that layout (`sppo_candidates` with the layout's degrees fixed)."""
    from memo_sim.api import get_model, load_profile
    from memo_sim.layout.parallel import Layout
    from memo_sim.search.sppo import resolve_for_layout, sppo_candidates

    model, prof, lay = get_model("gpt-7b"), load_profile("a100-sxm4-80gb"), Layout(tp=8, sp=True, pp=4, dp=1)
    _, cands, _, _ = sppo_candidates(model, seq, 32, prof, tp=8, pp=4, dp=1, zero=0)
    whatif = next(c for c in cands if "layout best" in c.sppo["roles"])
    pt = resolve_for_layout(model, lay, 1, seq, prof)
    assert pt.layout == lay and pt.policy == whatif.policy
    assert pt.estimate.iteration_s == whatif.estimate.iteration_s
    if seq == 1 << 20:
        assert pt.policy.subseqs == 128  # the review's plan-sppo.json


def test_resolve_for_layout_keeps_its_layout_and_prices_a_length_nothing_fits():
    """A layout beside the search's defaults (expandable segments) keeps them; where no point's memory floor fits
    (llama-3.1-70b's model states on 8 GPUs), the least-over point is solved (an OOM row), not refused."""
    from dataclasses import replace

    from memo_sim.api import get_model, load_profile
    from memo_sim.layout.parallel import Layout
    from memo_sim.search.sppo import resolve_for_layout

    lay = Layout(tp=8, sp=True, pp=4, dp=1, expandable_segments=True)
    pt = resolve_for_layout(replace(get_model("gpt-7b"), layers=4), lay, 1, 1 << 20, load_profile("a100-sxm4-80gb"))
    assert pt.layout == lay and pt.policy.subseqs == 128
    over = resolve_for_layout(get_model("llama-3.1-70b"), Layout(tp=8, sp=True), 1, 64 * K,
                              load_profile("h100-sxm5-80gb"))
    assert over.status == "OOM"


def test_sweep_seq_gives_an_sppo_plan_its_own_n_and_time(tmp_path):
    """The review's commands on 4 layers at 512K: the what-if's SPPO plan, then sweep-seq over it; at the plan's own
    length the sweep runs the plan's N and simulates the plan's step time (N=32 against the plan's N=64 before)."""
    import json

    from click.testing import CliRunner

    from memo_sim.cli import cli

    def run(args):
        r = CliRunner().invoke(cli, [str(a) for a in args])
        assert r.exit_code == 0, r.output
        return r.output

    run(["whatif", *SPPO_PLAN, "--layers", "4", "--out", tmp_path / "p"])
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    rows = json.loads(run(["sweep-seq", tmp_path / "p" / "plan.json", "--seqs", "512K", "--jobs", "1", "--json",
                           "--out", tmp_path / "s"]))
    row = next(r for r in rows if r["seq_tokens"] == 512 * K)
    assert (row["policy"]["subseqs"], row["policy"]["multiplex"], row["policy"]["partition"]) == \
        (plan["policy"]["subseqs"], plan["policy"]["multiplex"], plan["policy"]["partition"])
    assert row["iteration_s"] == pytest.approx(plan["predicted"]["iteration_s"], rel=1e-9)
    # the SPPO row's allocator words are explain's (no caching-allocator replay), not 'caching allocator'
    text = run(["sweep-seq", tmp_path / "p" / "plan.json", "--seqs", "512K", "--jobs", "1", "--out", tmp_path / "t"])
    assert "allocated: no caching-allocator replay" in text
