"""`answer.best.to_plan()` names the framework the search was for, as `answer.plans()` and the command's plan.json do
(a review, 2026-12-02: under framework="megatron" it wrote ``"framework": "any"``)."""

from __future__ import annotations

from dataclasses import replace

from memo_sim import api


def test_best_to_plan_names_the_requests_framework():
    model = replace(api.get_model("gpt-7b"), layers=2)
    for fw in ("megatron", "any"):
        ans = api.whatif(api.WhatifRequest(model=model, seq=8192, gpus=8, profile=api.load_profile("a800-80gb"),
                                           framework=fw))
        assert ans.best.to_plan().framework == fw == ans.plans()["plan.json"].framework
        if ans.memo_best is not None:  # memo's own best beside a named framework is memo's (`any`)
            assert ans.memo_best.to_plan().framework == "any"


def test_rank_alone_names_the_framework_too():
    """`memo_sim.api.rank` (the search without the answer around it) made plans named ``any`` under
    framework="megatron" (a review): the framework is stamped where the candidates are made."""
    model = replace(api.get_model("gpt-7b"), layers=2)
    best = api.rank(model, 8192, 8, api.load_profile("a800-80gb"), framework="megatron").best
    assert best.to_plan().framework == "megatron"
