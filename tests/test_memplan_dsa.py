"""Offline DSA planner: bounds, validator, greedy, canonical search, MIP, solve_dsa."""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from memo_sim.errors import MemoError
from memo_sim.memplan.bounds import (
    DSAInstance,
    max_live_lower_bound,
    overlap_pairs,
    pair_big_m,
    time_sections,
)
from memo_sim.memplan.greedy import (
    compact,
    greedy_place,
    orderings,
    peak_of,
    place_in_offset_order,
    place_in_order,
)
from memo_sim.memplan.mip_model import disjunction_violations, solve_mip
from memo_sim.memplan.dsa_search import CanonicalSearch, minimize_peak
from memo_sim.memplan.solve import SOLVERS, DSAInputError, solve_dsa
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.memplan.placement_check import PlacementError, check_placement, validate_placement

SUITE = Path(__file__).resolve().parent / "data" / "dsa"  # copied from ../shared/benchmarks/dsa


def make_trace(sizes, lowers, uppers, unit=1, name="t") -> RequestTrace:
    return RequestTrace([Buffer(f"b{i}", int(s) * unit, int(lo), int(up))
                         for i, (s, lo, up) in enumerate(zip(sizes, lowers, uppers))], name=name)


# A staircase: b2 [0,3) hands over to b0 [2,6) while b3 [1,2) and b1 [4,5) need 3 units each.
# Every greedy ordering puts b0 directly on the floor gap at 2 and b1 on top (peak 7); the
# optimum (5 = max live) puts b0 at 3 so that b1 fits under it.
STAIRCASE = ([2, 3, 2, 3], [2, 4, 0, 1], [6, 5, 3, 2])
# No placement reaches the max-live bound 6 here: the optimum is 7 (proved by search and MIP).
GAP = ([1, 2, 3, 1, 3, 1, 1, 2, 1, 2, 1, 3, 3, 3],
       [0, 0, 0, 2, 1, 5, 3, 2, 6, 5, 9, 10, 11, 12],
       [1, 1, 2, 3, 5, 6, 9, 10, 10, 11, 11, 12, 13, 13])


def random_instance(rng: np.random.Generator, n: int, horizon: int = 10, max_len: int = 6,
                    sizes=(1, 2, 3, 4)) -> DSAInstance:
    lo = rng.integers(0, horizon, n)
    up = lo + rng.integers(1, max_len + 1, n)
    sz = rng.choice(np.array(sizes), n)
    return DSAInstance.from_arrays(sz, lo, up)


def interleaved_layer_trace(lengths: list[int], streams: int, seed: int, hidden: int = 4096,
                            ffn: int = 16384, heads: int = 32) -> RequestTrace:
    """Forward passes of a transformer layer on sub-sequences of ``lengths`` tokens, ``streams``
    of them in flight with their malloc/free events interleaved at random (bf16 activations,
    cuBLAS workspaces, attention statistics)."""
    def chunk(p: str, s: int) -> list[tuple[str, str, int]]:
        E, st, ws = s * hidden * 2, s * heads * 4, 32 << 20
        ev: list[tuple[str, str, int]] = []
        a = lambda n, b: ev.append(("a", p + n, b))  # noqa: E731
        f = lambda n: ev.append(("f", p + n, 0))     # noqa: E731
        a("ln1", E); a("ws0", ws); a("qkv", 3 * E); f("ws0"); f("ln1")
        a("attn", E); a("lse", st); f("qkv")
        a("ws1", ws); a("proj", E); f("ws1"); f("attn"); f("lse")
        a("ln2", E); a("ws2", ws); a("fc1", E * ffn // hidden); f("ws2"); f("ln2")
        a("gelu", E * ffn // hidden); f("fc1")
        a("ws3", ws); a("fc2", E); f("ws3"); f("gelu")
        a("out", E); f("fc2"); f("proj"); f("out")
        return ev

    rng = random.Random(seed)
    queues = [chunk(f"c{c}.", s) for c, s in enumerate(lengths)]
    pending, active = list(range(len(queues))), []
    step, live, bufs = 0, {}, []
    while pending or active:
        while len(active) < streams and pending:
            active.append(pending.pop(0))
        q = rng.choice(active)
        kind, name, nbytes = queues[q].pop(0)
        if kind == "a":
            live[name] = (nbytes, step)
        else:
            nbytes, start = live.pop(name)
            bufs.append(Buffer(name, nbytes, start, step + 1, kind="transient"))
        step += 1
        if not queues[q]:
            active.remove(q)
    return RequestTrace(bufs, name=f"layer-x{len(lengths)}-s{streams}-{seed}")


# ---------------------------------------------------------------------------------- bounds
def test_overlap_pairs_and_sections_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(20):
        inst = random_instance(rng, int(rng.integers(1, 40)), horizon=15)
        brute = {(i, j) for i, j in itertools.combinations(range(inst.n), 2)
                 if inst.lower[i] < inst.upper[j] and inst.lower[j] < inst.upper[i]}
        got = {tuple(map(int, p)) for p in overlap_pairs(inst.lower, inst.upper)}
        assert got == brute
        assert len(got) == inst.conflicts.num_pairs
        sec = time_sections(inst.size, inst.lower, inst.upper)
        share = {(i, j) for i, j in itertools.combinations(range(inst.n), 2)
                 if max(sec.first[i], sec.first[j]) < min(sec.last[i], sec.last[j])}
        assert share == brute
        tr = make_trace(inst.size, inst.lower, inst.upper)
        assert sec.max_total() == max_live_lower_bound(tr) == tr.max_live_bytes()


def test_pair_big_m_is_the_peak_bound():
    size = np.array([3, 5, 2])
    pairs = np.array([[0, 1], [1, 2]])
    m = pair_big_m(size, pairs, addr_hi=10 - size)
    assert m.tolist() == [[10, 10], [10, 10]]
    m2 = pair_big_m(size, pairs, addr_hi=10 - size, addr_lo=np.array([0, 4, 1]))
    assert m2.tolist() == [[6, 10], [9, 6]]


# -------------------------------------------------------------------------------- validate
def test_validator_rejects_overlap_and_other_faults():
    tr = make_trace([4, 4, 4], [0, 1, 5], [3, 4, 6])
    assert validate_placement(tr, {"b0": 0, "b1": 4, "b2": 0}, 8) == []
    bad = validate_placement(tr, {"b0": 0, "b1": 2, "b2": 0}, 8)
    assert len(bad) == 1 and "'b0'" in bad[0] and "'b1'" in bad[0] and "overlap" in bad[0]
    with pytest.raises(PlacementError):
        check_placement(tr, {"b0": 0, "b1": 2, "b2": 0}, 8)
    assert any("past the arena" in p for p in validate_placement(tr, {"b0": 0, "b1": 4, "b2": 0}, 7))
    assert any("negative" in p for p in validate_placement(tr, {"b0": -4, "b1": 0, "b2": 0}, 8))
    assert any("no offset" in p for p in validate_placement(tr, {"b0": 0, "b1": 4}, 8))
    assert any("unknown" in p for p in validate_placement(tr, {"b0": 0, "b1": 4, "b2": 0, "x": 0}, 8))
    assert any("integer" in p for p in validate_placement(tr, {"b0": 0, "b1": 4.0, "b2": 0}, 8))
    # Buffers that are not live together may share addresses.
    assert validate_placement(tr, {"b0": 0, "b1": 4, "b2": 4}, 8) == []
    assert issubclass(PlacementError, MemoError)


# ---------------------------------------------------------------------------------- greedy
def test_greedy_orderings_are_valid_and_staircase_beats_greedy():
    inst = DSAInstance.from_arrays(*map(np.array, STAIRCASE))
    assert inst.lower_bound() == 5
    tr = make_trace(*STAIRCASE)
    for order in orderings(inst).values():
        for best in (True, False):
            off = place_in_order(inst, order, best)
            plan = {f"b{i}": int(off[i]) for i in range(inst.n)}
            assert validate_placement(tr, plan, peak_of(inst, off)) == []
    g = greedy_place(inst)
    assert g.peak == 7 and min(g.peaks.values()) == 7
    res = CanonicalSearch(inst).fit_once(5)
    assert res.status == "found" and res.peak == 5
    plan = {f"b{i}": int(res.offsets[i]) for i in range(inst.n)}
    assert validate_placement(tr, plan, 5) == []


def test_compact_keeps_valid_and_never_raises_the_peak():
    rng = np.random.default_rng(3)
    for _ in range(10):
        inst = random_instance(rng, 30)
        g = greedy_place(inst)
        spread = g.offsets * 3 + 7  # valid, with gaps
        c = compact(inst, spread)
        tr = make_trace(inst.size, inst.lower, inst.upper)
        assert validate_placement(tr, {f"b{i}": int(c[i]) for i in range(inst.n)}, peak_of(inst, c)) == []
        assert peak_of(inst, c) <= peak_of(inst, spread)


# ---------------------------------------------------------------------------------- search
def test_search_proves_the_gap_instance_and_finds_the_optimum():
    inst = DSAInstance.from_arrays(*map(np.array, GAP))
    assert inst.lower_bound() == 6
    s = CanonicalSearch(inst)
    assert s.fit_once(6).status == "infeasible"
    found = s.fit_once(7)
    assert found.status == "found" and found.peak == 7
    g = greedy_place(inst)
    res = minimize_peak(inst, g.offsets, deadline=time.perf_counter() + 10)
    assert res.peak == 7 and res.lower_bound == 7 and res.proven_optimal


def test_search_matches_exhaustive_optimum_on_random_instances():
    """Brute force: every dropped placement is some order of buffers, each resting on the
    highest conflicting buffer placed before it; try all orders of tiny instances."""
    rng = np.random.default_rng(5)
    for _ in range(25):
        inst = random_instance(rng, int(rng.integers(2, 7)), horizon=5, max_len=4)
        opt = min(peak_of(inst, place_in_offset_order(inst, np.array(p)))
                  for p in itertools.permutations(range(inst.n)))
        g = greedy_place(inst)
        res = minimize_peak(inst, g.offsets, deadline=time.perf_counter() + 5)
        assert res.proven_optimal and res.peak == opt


# ------------------------------------------------------------------------------------- MIP
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_mip_agrees_with_search(solver):
    cases = [DSAInstance.from_arrays(*map(np.array, GAP)),
             DSAInstance.from_arrays(*map(np.array, STAIRCASE))]
    rng = np.random.default_rng(11)
    while len(cases) < 5:
        inst = random_instance(rng, 12, horizon=8, max_len=5, sizes=(1, 2, 3, 5))
        if greedy_place(inst).peak > inst.lower_bound():
            cases.append(inst)
    for inst in cases:
        g = greedy_place(inst)
        sr = minimize_peak(inst, g.offsets, deadline=time.perf_counter() + 10)
        assert sr.proven_optimal
        mr = solve_mip(inst, g.offsets, solver=solver, time_limit_s=20)
        assert mr.solver == solver
        assert mr.status in ("optimal", "optimal-start")
        assert mr.peak == sr.peak and mr.bound == sr.peak


def test_mip_recheck_flags_violated_big_m_rows():
    size = np.array([4, 4, 4])
    pairs = np.array([[0, 1], [1, 2]])
    assert disjunction_violations(np.array([0, 4, 0]), size, pairs) == 0
    assert disjunction_violations(np.array([0, 3, 0]), size, pairs) == 2


# ------------------------------------------------------------------------------ solve_dsa
@pytest.mark.parametrize("solver", SOLVERS)
def test_solve_dsa_every_solver_is_valid(solver):
    tr = make_trace(*GAP, unit=256, name="gap")
    sol = solve_dsa(tr, time_limit_s=10, solver=solver)
    assert validate_placement(tr, sol.offsets, sol.peak_bytes) == []
    assert sol.lower_bound_bytes <= sol.peak_bytes
    if solver == "greedy":
        assert sol.method.startswith("greedy")
    else:
        assert sol.peak_bytes == 7 * 256 and sol.proven_optimal and sol.gap == 0.0
    obj = json.loads(json.dumps(sol.to_json_obj()))
    assert obj["peak_bytes"] == sol.peak_bytes and set(obj["offsets"]) == {b.id for b in tr.buffers}


def test_solve_dsa_rejects_bad_arguments():
    tr = make_trace(*STAIRCASE)
    with pytest.raises(DSAInputError, match="solver"):
        solve_dsa(tr, solver="gurobi")
    with pytest.raises(DSAInputError, match="time_limit_s"):
        solve_dsa(tr, time_limit_s=0)
    with pytest.raises(MemoError, match="capacity.*lower bound 5"):
        solve_dsa(tr, capacity=4)
    sol = solve_dsa(tr, capacity=6)
    assert sol.fits_capacity and sol.peak_bytes == 5 and sol.time_to_capacity_s is not None


def test_csv_round_trip_keeps_the_plan(tmp_path):
    tr = make_trace(*GAP, unit=64, name="gap")
    path = tr.write_csv(tmp_path / "gap.csv")
    back = RequestTrace.read_csv(path)
    assert [(b.id, b.size, b.lower, b.upper) for b in back.buffers] == \
        [(b.id, b.size, b.lower, b.upper) for b in tr.buffers]
    a = solve_dsa(tr, time_limit_s=5)
    b = solve_dsa(back, time_limit_s=5)
    assert a.peak_bytes == b.peak_bytes == 7 * 64
    assert validate_placement(back, a.offsets, a.peak_bytes) == []


def test_empty_trace():
    sol = solve_dsa(RequestTrace([]))
    assert sol.peak_bytes == 0 and sol.offsets == {} and sol.proven_optimal


@pytest.mark.parametrize("k,streams,seed", [(8, 2, 0), (12, 3, 1), (16, 4, 0), (24, 3, 2)])
def test_transformer_layer_traces_solve_fast_and_tight(k, streams, seed):
    r = random.Random(seed)
    tr = interleaved_layer_trace([r.choice([256, 384, 512, 640, 768, 1024]) * 4 for _ in range(k)],
                                 streams, seed)
    t0 = time.perf_counter()
    sol = solve_dsa(tr, time_limit_s=10)
    assert time.perf_counter() - t0 < 5
    assert validate_placement(tr, sol.offsets, sol.peak_bytes) == []
    assert sol.peak_bytes <= 1.01 * tr.max_live_bytes()


def test_suite_problem_reaches_capacity_with_search():
    path = SUITE / "G.1048576.csv"
    tr = RequestTrace.read_csv(path)
    t0 = time.perf_counter()
    sol = solve_dsa(tr, time_limit_s=20, solver="search", capacity=1048576)
    assert time.perf_counter() - t0 < 10
    assert sol.fits_capacity and sol.peak_bytes == tr.max_live_bytes() == 1048576
    assert sol.proven_optimal and sol.method.startswith("search")
    assert sol.greedy_peak_bytes > 1.1 * sol.peak_bytes
    assert validate_placement(tr, sol.offsets, 1048576) == []


def test_mip_answer_that_breaks_big_m_rows_is_rejected(monkeypatch):
    """Pretend the solver returned every address at 0: the re-check must refuse it."""
    import mip

    inst = DSAInstance.from_arrays(*map(np.array, STAIRCASE))
    g = greedy_place(inst)
    monkeypatch.setattr(mip.entities.Var, "x", property(lambda self: 0.0))
    mr = solve_mip(inst, g.offsets, solver="highs", time_limit_s=5)
    assert not mr.improved and mr.peak == g.peak
    assert any("rejected" in n for n in mr.notes)


def test_rel_gap_stops_early_and_is_checked():
    tr = make_trace(*GAP, unit=256)
    sol = solve_dsa(tr, rel_gap=0.2)  # greedy's 7 units are within 20% of the bound 6
    assert sol.peak_bytes == 7 * 256 and not sol.proven_optimal
    assert [p.phase for p in sol.phases] == ["greedy"]
    with pytest.raises(DSAInputError, match="rel_gap"):
        solve_dsa(tr, rel_gap=-1)


def test_round_robin_fit_on_a_suite_problem_above_its_bound():
    path = SUITE / "J.1048576.csv"
    tr = RequestTrace.read_csv(path)
    inst = DSAInstance.from_trace(tr)
    assert inst.lower_bound() < 1048576
    res = CanonicalSearch(inst).fit(1048576, deadline=time.perf_counter() + 10)
    assert res.status == "found" and res.peak <= 1048576
    plan = {b.id: int(res.offsets[i]) for i, b in enumerate(tr.buffers)}
    assert validate_placement(tr, plan, 1048576) == []


def test_solvers_stop_at_their_time_limit_with_the_best_plan_so_far():
    """[robust-runs] the greedy starts no ordering past its deadline (one is always placed), the
    MIP abandons a model it cannot build in time, and solve_dsa returns a valid plan with its gap."""
    import time as _time

    import numpy as _np

    from memo_sim.memplan.bounds import DSAInstance
    from memo_sim.memplan.greedy import greedy_place
    from memo_sim.memplan.mip_model import solve_mip
    from memo_sim.memplan.solve import solve_dsa
    from memo_sim.request_trace import Buffer, RequestTrace

    rng = _np.random.default_rng(3)
    lo = rng.integers(0, 400, 800)
    up = lo + rng.integers(1, 60, 800)
    sizes = rng.integers(1, 64, 800) * 256
    inst = DSAInstance.from_arrays(sizes, lo, up)
    g = greedy_place(inst, deadline=_time.perf_counter() - 1.0)
    assert len(g.peaks) == 1
    assert len(greedy_place(inst).peaks) == 16
    mr = solve_mip(inst, g.offsets, time_limit_s=1e-6)
    assert mr.status == "not-built" and not mr.improved and "not built within the time limit" in mr.notes[0]
    trace = RequestTrace([Buffer(f"b{i}", int(sizes[i]), int(lo[i]), int(up[i])) for i in range(800)])
    sol = solve_dsa(trace, time_limit_s=1e-6, solver="mip-highs")
    assert sol.peak_bytes >= sol.lower_bound_bytes and sol.gap >= 0
    assert "time limit reached" in sol.phases[0].detail
    # the MIP is not set up once the greedy used the whole limit (a review: a 0.1 s limit ran 0.63 s)
    assert any(p.phase.startswith("mip") and "not run: the time limit" in p.detail for p in sol.phases)
