"""`memo-sim export`'s nearest plan the framework runs (`memo_sim.export.base.best_runnable`) is one search, the
framework's: before 2026-12-02 it asked `answer_whatif` for the whole answer, which beside a named framework also
searches memo's own best (and, for an FP8 model, the bf16 one) to compare with, and read its best alone: over half of
an export's time (a 70B ZeRO-3 export test 64 s -> 33 s on the 2-core VM, two alternating runs each)."""

from __future__ import annotations

from dataclasses import replace

import memo_sim.search.request as R
from memo_sim.export.base import best_runnable
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.search.request import WhatifRequest, answer_whatif
from memo_sim.profile.loader import load_profile
from tests.test_export_nearest_review import _plan

TOY = dict(layers=4)


def _counted(monkeypatch):
    calls = []
    real = R.rank

    def counted(model, *a, **k):
        calls.append(k.get("framework", "any"))
        return real(model, *a, **k)

    monkeypatch.setattr(R, "rank", counted)
    return calls


def test_the_export_searches_the_framework_alone(monkeypatch):
    plan = _plan(Layout(tp=2, dp=4), 8, "single_stage", framework="any")
    plan = replace(plan, model=replace(plan.model, **TOY))
    calls = _counted(monkeypatch)
    alt, summary = best_runnable(plan, "megatron")
    assert calls == ["megatron"], calls  # before: ["megatron", "any"] (memo's own best, then thrown away)
    assert alt is not None and summary["framework"] == "megatron"
    # the what-if's answer still compares: the framework's search and memo's own beside it, the same best
    calls.clear()
    ans = answer_whatif(WhatifRequest(model=plan.model, seq=plan.seq_tokens, gpus=plan.gpus,
                                      profile=load_profile(plan.profile), global_batch=plan.batch * plan.layout.dp,
                                      framework="megatron"))
    assert calls == ["megatron", "any"] and ans.memo_best is not None, calls
    assert ans.best.to_plan().layout == alt.layout and ans.best.to_plan().policy == alt.policy


def test_no_comparison_keeps_the_advice_when_nothing_fits():
    m = replace(get_model("llama-3.1-70b"), layers=8)
    req = WhatifRequest(model=m, seq=1 << 20, gpus=1, profile=load_profile("a100-sxm4-80gb"), framework="megatron")
    full, alone = answer_whatif(req), answer_whatif(req, comparisons=False)
    assert full.best is None and alone.best is None and alone.advice == full.advice and alone.advice
