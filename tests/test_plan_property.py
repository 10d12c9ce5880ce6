"""[robust-runs] Every plan the what-if can write is one the executor accepts.

Plans are generated the way `memo-sim whatif` writes them (`memo_sim.search.whatif.candidates_for`
then `memo_sim.search.plan_build.build_plan`, memory plan included) over tiny shapes (1-4 layers) of GPT, Llama and Qwen2 architectures,
every policy, TP flavour, layout and schedule the search offers (1F1B and interleaved pipelines
with TP and DP inside a stage), and the GPU profiles. Each plan must
round-trip through plan.json, pass `memo-sim check-plan`'s checks, and pass the executor's
refusals: a one-device plan is set up by `memo_exec.runner.Executor` for the CPU (its memory
plan parsed against the layer's recorded requests, its memory estimate checked), a multi-device
plan passes `memo_exec.distributed.runner.check_plan_for_world` for its world size. A sample
trains one step. The default selection draws 60 plans; the slow one 500 (at least 50 trained).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memo_exec.distributed.runner import check_plan_for_world
from memo_exec.runner import Executor, RunOptions
from memo_sim.errors import MemoError
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan
from memo_sim.profile.loader import load_profile
from memo_sim.search.plan_build import build_plan
from memo_sim.search.plan_check import plan_problems
from memo_sim.search.whatif import candidates_for

PROFILES = ("a800-80gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-141gb")


@st.composite
def plans(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    hidden = heads * draw(st.sampled_from([16, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, heads) if heads % h == 0]))
    norm, bias, tied = draw(st.sampled_from([("layernorm", "all", True), ("rmsnorm", "none", False),
                                             ("rmsnorm", "qkv", False)]))  # GPT, Llama, Qwen2
    model = ModelConfig("toy", draw(st.integers(1, 4)), hidden, heads, draw(st.sampled_from([2, 4])) * hidden,
                        vocab=draw(st.sampled_from([128, 512])), kv_heads=None if kv == heads else kv,
                        ffn_type=draw(st.sampled_from(["gelu", "swiglu"])), dtype=draw(st.sampled_from(["fp32", "bf16"])),
                        norm=norm, bias=bias, tied_embeddings=tied)
    seq = draw(st.sampled_from([256, 512, 1024]))
    gpus = draw(st.sampled_from([1, 1, 2, 4]))
    profile = load_profile(draw(st.sampled_from(PROFILES)))
    fixed = {}
    if gpus > 1 and model.layers % 2 == 0 and draw(st.booleans()):
        # a micro-batch pipeline (1F1B or interleaved): the executor's stages run TP and DP inside
        # (ring CP and Ulysses with pp are priced by the simulator, not run by the executor yet)
        fixed = dict(pp=2, cp=1, ulysses=1, policies=draw(st.sampled_from(
            [("store_all",), ("full_recompute",), ("memo",), ("full_offload",)])))
    try:
        res = candidates_for(model, seq, gpus, profile, tp_mode="all", **fixed)
    except MemoError:  # a fixed pipeline the shapes cannot hold: the what-if refuses it in one line
        return None
    ok = [c for c in res.candidates if c.status == "OK"]
    if not ok:
        return None
    return build_plan(draw(st.sampled_from(ok)), time_limit_s=2.0)


def _accepted(plan: Plan, run: bool, seen: dict) -> None:
    back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back.to_dict() == plan.to_dict()
    assert plan_problems(plan) == []
    opts = RunOptions(device="cpu", steps=1)
    seen[plan.policy.name] = seen.get(plan.policy.name, 0) + 1
    seen[plan.schedule] = seen.get(plan.schedule, 0) + 1
    if plan.layout.tp_mode != "megatron":
        seen["metp"] = seen.get("metp", 0) + 1
    if plan.gpus > 1 or plan.schedule != "single_stage":
        check_plan_for_world(plan, plan.gpus, opts)
        seen["multi"] = seen.get("multi", 0) + 1
        return
    ex = Executor(plan, opts)
    try:
        if run:
            res = ex.run()
            assert len(res.steps) == 1
            seen["ran"] = seen.get("ran", 0) + 1
    finally:
        ex.close()


def _property(n: int, every: int, seen: dict):

    @settings(max_examples=n, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(plans())
    def check(plan):
        if plan is None:
            return
        seen["n"] += 1
        _accepted(plan, run=seen["n"] % every == 0, seen=seen)

    return check


def _covered(seen: dict, n: int) -> None:
    """The draws cover what the what-if writes: most give a plan, every policy and METP appear,
    one- and multi-device plans both, and the sample trains."""
    assert seen["n"] >= n // 2, seen
    for key in ("store_all", "full_recompute", "full_offload", "memo", "multi", "ran"):
        assert seen.get(key, 0) >= 1, (key, seen)


def test_what_the_whatif_writes_the_executor_accepts():
    seen = {"n": 0}
    _property(60, 10, seen)()
    _covered(seen, 60)


@pytest.mark.slow
def test_what_the_whatif_writes_the_executor_accepts_500():
    seen = {"n": 0}
    _property(500, 3, seen)()
    _covered(seen, 500)
    assert seen.get("metp", 0) >= 1 and seen.get("sppo", 0) >= 1 and seen["ran"] >= 50, seen
    assert seen.get("1f1b", 0) >= 5 and seen.get("interleaved_1f1b", 0) >= 1, seen
    print(seen)
