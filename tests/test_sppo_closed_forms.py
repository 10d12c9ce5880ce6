"""[sppo] SPPO's closed forms (papers/sppo.txt sections 3-6) as `memo_sim.cost.sppo` and the
pipeline schedule compute them.

- Table 3: the Left-SP / Steady / Right-SP subsequence ids and SP ranges for PP = 4, N = 8.
- FLOPs-balanced partition points: equal forward FLOPs (GEMMs + causal attention over the prefix)
  within 1 %, longer early subsequences; the subsequences' FLOPs add up to the whole sequence's.
- K/V cache: 2·b·s·h elements per layer (the paper's 2BSH, which counts elements: K and V are
  b·s·h each), i.e. 2·b·s·h·2 bytes in 16-bit, split by the TP+SP degree per GPU.
- Memory recurrence M_i = M_{i-1} + A_i - alpha_{i-1}·A_{i-1}, as a formula and in the event
  simulation (each unit of work's bytes at the end of its forward).
- Pipeline: bubble ratio (p-1)/N and iteration (p-1+N)/N·F(N) on a toy with constant kernel
  efficiency (every other cost made negligible), simulated.
- N = 1, PP = 1, alpha = 1: the SPPO schedule's timeline is the full-offload schedule's.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from memo_sim.cost import sppo as C
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.policy import get_policy
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.profile.schema import Curve, Quantity

K = 1024
GPT7B = get_model("gpt-7b")


def test_table_3_phase_assignment_pp4_n8():
    got = [(p.left, p.steady, p.right, p.left_sp, p.right_sp) for p in C.multiplex_phases(4, 8)]
    want = [
        ((0, 1, 2), (3, 4, 5, 6, 7), (), (0, 1, 2, 3), ()),
        ((0, 1), (2, 3, 4, 5, 6), (7,), (1, 2, 3), (0, 1)),
        ((0,), (1, 2, 3, 4, 5), (6, 7), (2, 3), (0, 1, 2)),
        ((), (0, 1, 2, 3, 4), (5, 6, 7), (), (0, 1, 2, 3)),
    ]
    assert got == want


@pytest.mark.parametrize("pp,n", [(1, 1), (2, 4), (3, 2), (4, 3), (8, 8), (5, 20)])
def test_phases_partition_the_subsequences(pp, n):
    for ph in C.multiplex_phases(pp, n):
        ids = ph.left + ph.steady + ph.right
        assert sorted(ids) == list(range(n)) and len(set(ids)) == n
        assert bool(ph.left) == bool(ph.left_sp) and bool(ph.right) == bool(ph.right_sp)


@pytest.mark.parametrize("model,seq,n,g", [(GPT7B, 1 << 20, 16, 8), (GPT7B, 256 * K, 8, 1),
                                           (get_model("llama-70b"), 4 << 20, 64, 8)])
def test_flops_balanced_partition(model, seq, n, g):
    b = C.partition_bounds(model, 1, seq, n, "flops", g)
    assert b[0] == 0 and b[-1] == seq and len(b) == n + 1
    lens = [b[i + 1] - b[i] for i in range(n)]
    assert all(x % g == 0 for x in lens) and lens == sorted(lens, reverse=True)  # early ones longer
    f = [C.forward_flops(model, 1, b[i], lens[i]) for i in range(n)]
    assert max(f) / min(f) - 1 < 0.01
    whole = C.gemm_flops_per_token(model, 1) * seq + 2.0 * seq * seq * model.hidden  # 24bsh² + 2bs²h for GPT
    assert math.isclose(sum(f), whole, rel_tol=1e-12)
    eq = C.partition_bounds(model, 1, seq, n, "length", g)
    assert len({eq[i + 1] - eq[i] for i in range(n)}) <= 2  # equal up to one granule


def test_prefix_attention_flops():
    b, h = 2, 4096
    assert C.prefix_attention_flops(b, 0, 1000, h) == 2.0 * b * 1000 * 1000 * h
    assert math.isclose(C.prefix_attention_flops(b, 3000, 1000, h), 2.0 * b * h * (4000**2 - 3000**2))


@pytest.mark.parametrize("b,s,tp", [(1, 1 << 20, 1), (2, 65536, 8)])
def test_kv_cache_is_2bsh(b, s, tp):
    h = GPT7B.hidden
    assert C.kv_cache_elements(GPT7B, b, s) == 2 * b * s * h  # the paper's 2BSH (elements)
    lay = Layout(tp=tp, sp=True)
    assert C.kv_cache_bytes(GPT7B, lay, b, s) == 2 * b * s * h * 2 / tp  # bf16: 2 bytes per element


def test_sequence_aware_alphas_and_memory_recurrence():
    a = [10.0, 8.0, 6.0, 4.0]
    alphas = C.sequence_aware_alphas(a, 5.0)
    assert alphas == (0.5, 0.625, 5 / 6, 1.0)
    assert all(math.isclose(x * y, 5.0) for x, y in zip(alphas[:3], a[:3]))
    m = C.memory_recurrence(a, list(alphas))
    assert m == [10.0, 10.0 + 8 - 5, 13.0 + 6 - 5, 14.0 + 4 - 5]


TOY = ModelConfig("toy", layers=2, hidden=512, heads=8, ffn=2048, vocab=1000)


def test_memory_recurrence_holds_in_the_simulation():
    """One stage, 8 subsequences through 2 layers = 16 units: at the start of each unit's last
    forward op (the op that waits for the previous unit's offload), GPU memory is model states +
    the working block + M_u with A_u = the unit's skeletal bytes and lse and alpha_u·A_u its
    offloaded bytes (the last two units are kept), + the final hidden state's gradient the
    classifier keeps for every earlier subsequence (the one stage is also the last)."""
    prof = load_profile("a800-80gb")
    lay, seq, n = Layout(tp=2), 16 * K, 8
    pol = Sppo(None, subseqs=n).with_bounds(TOY, lay, 1, seq)
    pol = dataclasses.replace(pol, alphas=C.sequence_aware_alphas(
        [pol.offloadable_bytes(TOY, lay, 1, pol.bounds[i + 1] - pol.bounds[i]) for i in range(n)], 3e5))
    r = simulate(TOY, lay, 1, seq, pol, prof, record=True, detail="ops")
    assert r.ok
    from memo_sim.engine.schedules.sppo import build_pipeline_iteration

    sched = build_pipeline_iteration(TOY, lay, 1, seq, pol, prof, detail="ops")
    pieces = sched.pieces[0]
    units = [(k, j) for k in range(n) for j in range(2)]
    from memo_sim.policy.rounding_buffers import is_offloaded

    a_u, off_u = [], []
    for u, (k, j) in enumerate(units):
        ub = pol.unit_bytes(TOY, lay, 1, pieces[k], k < n - 1, prof, is_offloaded(u, len(units)))
        a_u.append(ub.skeletal + ub.lse)
        off_u.append(ub.offload)
    alphas = [o / a for o, a in zip(off_u, a_u)]
    want = C.memory_recurrence(a_u, alphas)
    last_ops = {}
    for op in r.ops:
        if op.device == 0 and op.phase == "fwd" and op.stream == "compute" and op.layer is not None:
            sub = int(op.name.split("@s")[1]) if "@s" in op.name else 0
            last_ops[(sub, op.layer)] = op  # issue order: the last one wins
    samples = [m for m in r.timeline.memory if m.kind == "gpu" and m.device == 0]
    states = sched.memory.stages[0].breakdown.model_states_bytes
    bd = sched.memory.stages[0].breakdown
    work = bd.transient_planned_bytes + bd.layer_boundary_bytes
    assert sum(o > 0 for o in off_u) >= 10
    from memo_sim.memplan.footprint import shard_tokens_bytes

    dgrad = [shard_tokens_bytes(lay, 1, p.tokens, TOY.hidden, 2) for p in pieces]
    for u, (k, j) in enumerate(units):
        t = last_ops[(k, j)].start
        level = [m.nbytes for m in samples if m.time <= t][-1]
        assert math.isclose(level - states - work - sum(dgrad[:k]), want[u], rel_tol=1e-9), u


def _flat(profile):
    """Constant kernel efficiency (GEMM and attention forward 0.5; attention backward 0.625, so a
    subsequence's backward, 2x its GEMM FLOPs and 2.5x its attention FLOPs, takes exactly twice its
    forward), free memory-bound ops, P2P and host links."""
    flat = lambda v: Curve(((1.0, v), (1e20, v)), "test")  # noqa: E731
    eff = dataclasses.replace(profile.efficiency, gemm=flat(0.5), attention_fwd=flat(0.5), attention_bwd=flat(0.625))
    gpu = dataclasses.replace(profile.gpu, hbm_bandwidth=Quantity(1e30, "test"), copy_compute_slowdown=Quantity(0, "t"))
    fast = dataclasses.replace(profile.nvlink, bandwidth=Quantity(1e30, "test"), latency=Quantity(0.0, "test"))
    return dataclasses.replace(profile, efficiency=eff, gpu=gpu, nvlink=fast, internode=fast)


@pytest.mark.parametrize("pp,n", [(4, 8), (2, 4), (4, 16)])
def test_bubble_ratio_and_pipeline_time(pp, n):
    prof = _flat(load_profile("a100-sxm4-80gb"))
    model = ModelConfig("toy-flat", layers=pp, hidden=2048, heads=16, ffn=8192, vocab=1)
    lay, seq = Layout(tp=1, pp=pp), 64 * K
    pol = Sppo(None, subseqs=n).with_bounds(model, lay, 1, seq)
    pol = dataclasses.replace(pol, alphas=(0.0,) * n)  # no offload: compute and P2P only
    r = simulate(model, lay, 1, seq, pol, prof, detail="ops")
    assert r.ok
    busy = [st["compute_busy_s"] for st in r.pipeline["stages"]]
    f_n = busy[0]  # F(N): forward and backward of all N subsequences on one stage
    assert max(busy) / min(busy) - 1 < 1e-3
    assert math.isclose(r.iteration_s, C.pipeline_time(pp, n, f_n), rel_tol=1e-3)
    assert math.isclose((r.iteration_s - f_n) / f_n, C.bubble_ratio(pp, n), rel_tol=1e-2)


def test_n1_pp1_is_the_full_offload_schedule():
    prof = load_profile("a800-80gb")
    lay, seq = Layout(tp=8), 64 * K
    pol = Sppo(None, subseqs=1, bounds=(0, seq), alphas=(1.0,))
    a = simulate(GPT7B, lay, 1, seq, pol, prof, detail="ops")
    b = simulate(GPT7B, lay, 1, seq, get_policy("full_offload"), prof, fold=False)  # op for op: not folded
    ev = lambda r: [(e.op, e.layer, e.phase, e.stream, e.device, e.start, e.end, e.nbytes)  # noqa: E731
                    for e in r.timeline.events]
    assert a.ok and b.ok and ev(a) == ev(b)
    assert a.iteration_s == b.iteration_s
    assert math.isclose(a.peak_gpu_bytes, b.peak_gpu_bytes, rel_tol=1e-9)
