"""SM contention (`memo_sim.cost.comm_sms`): a communication kernel holds some of the GPU's SMs while it runs, and a
kernel beside it on its device runs on the rest, in the event simulator's fast paths and its reference alike; the
profile fields, their rules, DeepEP's own SM count, and what `memo-sim explain` says of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from memo_sim.cost.comm_sms import collective_sms, compute_share, nccl_sms, priced
from memo_sim.engine import Device, Engine, OpGraph
from memo_sim.engine.schedules import one_f_one_b
from memo_sim.engine.schedules.microbatch import build_microbatch_pipeline, pipeline_costs
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from memo_sim.profile import list_profiles, load_profile
from memo_sim.profile.loader import parse_profile
from memo_sim.report.explain import time_breakdown

H100 = load_profile("h100-sxm5-80gb")  # 132 SMs, an NCCL kernel 24
BARE = dataclasses.replace(H100, gpu=dataclasses.replace(H100.gpu, sm_count=None, comm_sms=None))
SHARE = (132 - 24) / 132
PROFILES = Path(__file__).resolve().parents[1] / "hardware_profiles"


def _run(profile, *, fast=True, contention=True, sms=None, copy=False, second=False):
    """A 1 s kernel beside a 0.5 s collective from t = 0 (optionally a second collective on another stream and link,
    and a host copy); returns (kernel, collective) after the run."""
    g = OpGraph([Device(0)])
    k = g.add("gemm", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0)
    c = g.add("allgather", device=0, stream="comm", kind="comm", phase="fwd", layer=0, work=0.5, link="nvlink",
              sms=sms)
    if second:
        g.add("grads", device=0, stream="dp_comm", kind="comm", phase="fwd", layer=0, work=0.5, link="internode")
    if copy:
        g.add("offload", device=0, stream="d2h", kind="copy", phase="fwd", layer=0, work=1e12, direction="d2h")
    Engine(g, profile, contention=contention, fast_paths=fast).run()
    return k, c


@pytest.mark.parametrize("fast", [True, False])
def test_a_kernel_beside_an_nccl_kernel_runs_on_the_sms_left(fast):
    k, c = _run(H100, fast=fast)
    assert c.end == pytest.approx(0.5)  # the collective keeps its own time
    # 0.5 s at 108/132 of its speed, the rest alone
    assert k.end == pytest.approx(0.5 + (1.0 - 0.5 * SHARE))
    # two NCCL kernels at once hold 48 SMs
    k2, _ = _run(H100, fast=fast, second=True)
    assert k2.end == pytest.approx(0.5 + (1.0 - 0.5 * (132 - 48) / 132))


@pytest.mark.parametrize("fast", [True, False])
def test_an_op_of_its_own_sm_count_and_host_copies(fast):
    k, _ = _run(H100, fast=fast, sms=20)  # DeepEP's 20
    assert k.end == pytest.approx(0.5 + (1.0 - 0.5 * 112 / 132))
    k0, _ = _run(H100, fast=fast, sms=0)  # copy-engine transfers hold none
    assert k0.end == pytest.approx(1.0)
    # a host copy in flight all along: the copies' HBM slowdown times the SMs' share while the collective runs
    slow = 1.0 / (1.0 + float(H100.gpu.copy_compute_slowdown))
    kc, _ = _run(H100, fast=fast, copy=True)
    assert kc.end == pytest.approx(0.5 + (1.0 - 0.5 * slow * SHARE) / slow)


def test_fast_paths_equal_the_reference_on_a_pipeline():
    """A 1F1B pipeline with TP collectives, pipeline sends and overlapped gradient reductions: the fast paths' kernels
    re-timed at each collective's start and end give the reference's flows' times."""
    lay, policy = Layout(tp=2, sp=True, pp=2, dp=2, zero=1), get_policy("store_all")
    model = ModelConfig("toy", layers=4, hidden=1024, heads=8, ffn=4096, vocab=32000)
    costs = pipeline_costs(model, lay, 1, 4096, policy, H100)
    ends = []
    for fast in (True, False):
        sched = build_microbatch_pipeline(costs, lay, H100, policy, model.layers, 8, one_f_one_b.order)
        ends.append(Engine(sched.graph, H100, fast_paths=fast).run().end_time)
    assert ends[0] == pytest.approx(ends[1], rel=1e-9)
    res = simulate(model, lay, 8, 4096, policy, H100, schedule="1f1b", micro_batch=1, fold=False, keep_timeline=False)
    assert res.iteration_s == pytest.approx(ends[0], rel=1e-9)
    bare = simulate(model, lay, 8, 4096, policy, BARE, schedule="1f1b", micro_batch=1, fold=False, keep_timeline=False)
    assert res.iteration_s > bare.iteration_s


def test_no_contention_or_a_profile_without_sm_counts_prices_none():
    assert _run(H100, contention=False)[0].end == pytest.approx(1.0)
    assert _run(BARE)[0].end == pytest.approx(1.0)
    assert not priced(BARE) and nccl_sms(BARE) == 0.0 and compute_share(24, BARE) == 1.0
    assert compute_share(24, H100) == pytest.approx(SHARE) and compute_share(500, H100) == pytest.approx(1 / 132)


def test_every_shipped_profile_says_both_with_sources():
    for name in list_profiles():
        p = load_profile(name)
        assert priced(p), name
        assert 0 < float(p.gpu.comm_sms) < float(p.gpu.sm_count) <= 160, name
        assert p.gpu.sm_count.source and p.gpu.comm_sms.source


def _raw(**gpu):
    raw = yaml.safe_load((PROFILES / "h100-sxm5-80gb.yaml").read_text())
    for k, v in gpu.items():
        if v is None:
            raw["gpu"].pop(k)
        else:
            raw["gpu"][k] = v
    return raw


def test_profile_rules_one_line_each():
    with pytest.raises(MemoError, match="sm_count and comm_sms go together"):
        parse_profile(_raw(comm_sms=None), "p.yaml")
    with pytest.raises(MemoError, match=r"comm_sms \(132\) must be fewer than sm_count \(132\)"):
        parse_profile(_raw(comm_sms={"value": 132, "unit": "count", "source": "x"}), "p.yaml")
    with pytest.raises(MemoError, match="whole count"):
        parse_profile(_raw(sm_count={"value": 13.5, "unit": "count", "source": "x"}), "p.yaml")
    p = parse_profile(_raw(sm_count=None, comm_sms=None), "p.yaml")  # profiles written before them still load
    assert not priced(p)


TOY = ModelConfig("toy-moe", layers=4, hidden=1024, heads=8, ffn=2048, vocab=32000, ffn_type="swiglu", norm="rmsnorm",
                  bias="none", tied_embeddings=False, experts=16, top_k=2, expert_ffn=512)


@pytest.mark.parametrize("dispatcher,want", [("deepep", 20.0), ("alltoall", None)])
def test_deepep_holds_its_own_sms_nccl_dispatchers_the_profiles(dispatcher, want):
    lay = Layout(tp=1, ep=8, dp=8, zero=1, moe=True, moe_dispatcher=dispatcher)
    assert collective_sms("moe_dispatch_alltoall_ep", lay) == want and collective_sms("allgather_ln1", lay) is None
    res = simulate(TOY, lay, 1, 4096, get_policy("store_all"), H100, record=True)
    moe = [o for o in res.ops if o.kind == "comm" and o.name.startswith("moe_")]
    assert moe and {o.sms for o in moe} == {want}
    assert all(o.sms is None for o in res.ops if o.kind == "comm" and not o.name.startswith("moe_"))


def test_explain_counts_the_slowed_busy_time():
    lay = Layout(tp=2, sp=True, dp=4, zero=3)
    model = ModelConfig("toy", layers=4, hidden=2048, heads=16, ffn=8192, vocab=32000)
    on = simulate(model, lay, 2, 4096, get_policy("store_all"), H100, record=True)
    off = simulate(model, lay, 2, 4096, get_policy("store_all"), BARE, record=True)
    t_on, t_off = time_breakdown(on, 0), time_breakdown(off, 0)
    # ZeRO 3's gathers run beside the layers: the kernels beside them slow down, the step with them
    assert t_on.slowed_s > 0 and on.iteration_s > off.iteration_s
    assert t_off.slowed_s == pytest.approx(0.0, abs=1e-12)
    assert sum(t_on.busy_s.values()) == pytest.approx(sum(t_off.busy_s.values()) + t_on.slowed_s, rel=1e-9)
