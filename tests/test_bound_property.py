"""[search-speed] The proved lower bound of every schedule (`memo_sim.search.bound`) against the event
simulator on random candidates: random model shapes, sequence lengths, GPU counts, profiles and
what-if restrictions, one fitting candidate drawn at random from each what-if, simulated; no
bound may exceed the simulated iteration time (nor its throughput bound fall below the simulated
throughput). The default run draws a few per schedule; the slow run 300 per schedule."""

from __future__ import annotations

import random

import pytest

from memo_sim.errors import MemoError
from memo_sim.model.config import ModelConfig
from memo_sim.profile.loader import load_profile
from memo_sim.search.bound import lower_bound, pipeline_family_tgs_bound
from memo_sim.search.prune import tgs_upper_bound
from memo_sim.search.whatif import candidates_for, simulate_candidates

K = 1024
SCHEDULES = ("single_stage", "1f1b", "interleaved_1f1b", "sppo")
PROFILES = ("a800-80gb", "a100-sxm4-80gb", "h100-sxm5-80gb")
TRIES = 100  # what-ifs drawn per candidate before giving up (most draws fit something)


def _model(rng: random.Random) -> ModelConfig:
    heads = rng.choice([8, 16, 32])
    hidden = heads * rng.choice([32, 64, 128])
    return ModelConfig("rand", layers=rng.choice([2, 4, 6, 8, 12, 16]), hidden=hidden, heads=heads,
                       ffn=rng.choice([3, 4]) * hidden, vocab=rng.choice([1024, 32000, 50257]))


def _plain_policies() -> tuple[str, ...]:
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.policy import policy_class, policy_names

    return tuple(p for p in policy_names() if not policy_class(p).needs_experts
                 and schedule_runs_policy("single_stage", p) and not schedule_runs_policy("sppo", p))


def _framework_offering(policy: str) -> str:
    """``any`` where memo's own framework offers the policy, else the first framework data that does."""
    from memo_sim.search.frameworks import FRAMEWORKS, get_framework

    return next(f for f in ("any", *FRAMEWORKS) if policy in get_framework(f).policies)


def _restrictions(rng: random.Random, schedule: str) -> tuple[int, int, dict]:
    """(seq, gpus, candidates_for keywords) for one random what-if of ``schedule``: one policy and
    most degrees drawn here, so that each what-if prices a handful of candidates."""
    gpus = rng.choice([2, 4, 8, 16])
    if schedule == "sppo":
        seq = rng.choice([16, 64, 256, 512]) * K
        kw: dict = dict(schedules=("sppo",), policies=("sppo",), pp=rng.choice([1, 2, 4]), tp=rng.choice([1, 2, 4]),
                        zero=rng.choice([0, 1]), subseqs=rng.choice([1, 2, 4, 8, 16, 32, 64]))
        if rng.random() < 0.5:
            kw["multiplex"] = rng.random() < 0.5
        return seq, gpus, kw
    pol = rng.choice(_plain_policies())
    kw = dict(schedules=(schedule,), policies=(pol,), tp=rng.choice([1, 2, 4]), zero=rng.choice([0, 1]))
    fw = _framework_offering(pol)
    if fw != "any":  # a framework's own policy (DeepSpeed's checkpoint offload): that framework, without TP
        kw.update(framework=fw, tp=1)
    if schedule == "single_stage":
        seq = rng.choice([4, 16, 64, 256, 1024]) * K
        kw["zero"] = rng.choice([0, 1, 2, 3])
        if rng.random() < 0.3:
            kw.update(batch=4, micro_batch=rng.choice([1, 2]))
        return seq, gpus, kw
    seq = rng.choice([4, 16, 32, 64, 128]) * K
    pp = rng.choice([2, 4])
    kw.update(pp=pp, batch=rng.choice([4, 8]))
    if schedule == "interleaved_1f1b":
        kw["vpp"] = 2
    return seq, max(gpus, pp * kw["tp"]), kw


def random_candidates(schedule: str, n: int, seed: int) -> list:
    """``n`` fitting candidates of ``schedule``, each drawn from its own random what-if."""
    rng = random.Random(seed)
    profiles = [load_profile(p) for p in PROFILES]
    out = []
    while len(out) < n:
        for _ in range(TRIES):
            model, prof = _model(rng), rng.choice(profiles)
            seq, gpus, kw = _restrictions(rng, schedule)
            try:
                cands = candidates_for(model, seq, gpus, prof, **kw)
            except MemoError:
                continue
            ok = [c for c in cands.candidates if c.memory.status == "OK" and c.schedule == schedule]
            if ok:
                out.append(rng.choice(ok))
                break
        else:
            raise AssertionError(f"{TRIES} random what-ifs of {schedule} in a row fitted nothing (seed {seed})")
    return out


def _check(schedule: str, n: int, seed: int) -> int:
    cands = random_candidates(schedule, n, seed)
    simulate_candidates(cands, jobs=1)
    ran = 0
    for c in cands:
        s = c.simulated
        if s["status"] != "OK":
            continue
        ran += 1
        lb, sim = lower_bound(c), s["iteration_s"]
        assert 0 < lb <= sim * (1 + 1e-9), (schedule, c.model.layers, c.model.hidden, c.seq, c.profile.name,
                                            c.layout.label(), c.policy.label(), c.micro_batch, lb, sim)
        assert tgs_upper_bound(c) >= s["tgs_tokens_per_gpu_s"] * (1 - 1e-9)
        if c.schedule in ("1f1b", "interleaved_1f1b"):  # the family's bound (every policy at once) is looser still
            fam = pipeline_family_tgs_bound(c.model, c.layout, c.batch, c.micro_batch, c.seq, c.profile)
            assert fam >= tgs_upper_bound(c) * (1 - 1e-12)
    return ran


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bound_never_exceeds_the_simulation_on_random_candidates(schedule):
    assert _check(schedule, 6, seed=SCHEDULES.index(schedule)) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bound_never_exceeds_the_simulation_on_300_random_candidates(schedule):
    assert _check(schedule, 300, seed=1000 + SCHEDULES.index(schedule)) >= 200


def _cross_node_candidates(n: int, seed: int) -> list:
    """``n`` fitting single-stage candidates whose context- or sequence-parallel groups span nodes (a 2-layer model of
    Llama-3.1-70B's layers on 256 H100s at 128K), where the GPU's links and SMs are shared by the layers' collectives
    and the data-parallel stream."""
    rng = random.Random(seed)
    model = ModelConfig("rand-cross", layers=2, hidden=8192, heads=64, ffn=28672, vocab=32000)
    prof = load_profile("h100-sxm5-80gb")
    cands = candidates_for(model, 128 * K, 256, prof, schedules=("single_stage",))
    ok = [c for c in cands.candidates if c.memory.status == "OK"
          and c.layout.tp * c.layout.ulysses * c.layout.cp > prof.node_gpus and c.layout.zero >= 1]
    return rng.sample(ok, min(n, len(ok)))


def test_link_and_sm_terms_bound_cross_node_single_stage_candidates(monkeypatch):
    """The single stage's link and SM terms (`memo_sim.search.bound._contention_seconds`) never put the bound above
    the simulation, and they tighten it where the links or SMs decide (the chain and data-parallel stream alone left
    cross-node CP/Ulysses candidates up to 1.5x below their simulated time, Llama-3.1-70B on 512 H100s at 128K)."""
    from memo_sim.search import bound

    cands = _cross_node_candidates(16, seed=7)
    assert len(cands) == 16
    simulate_candidates(cands, jobs=1)
    new = [lower_bound(c) for c in cands]
    monkeypatch.setattr(bound, "_contention_seconds", lambda *a, **k: 0.0)
    old = [lower_bound(c) for c in cands]
    tighter = 0
    for c, lb, lb_old in zip(cands, new, old):
        s = c.simulated
        assert s["status"] == "OK"
        assert lb_old <= lb <= s["iteration_s"] * (1 + 1e-9), (c.layout.label(), c.policy.label(), lb, lb_old, s)
        tighter += lb > lb_old * 1.01
    assert tighter >= 3, (tighter, new, old)
