"""The SPPO builder's shortcuts (`memo_sim.engine.schedules.sppo`) are the plain definitions: the
pieces of a neighbouring stage a piece waits for, found by bisection, are the ones a scan finds,
and the per-piece op lists shared by a stage's layers carry each piece's own names and costs."""

from __future__ import annotations

import dataclasses
import random

import pytest

from memo_sim.cost.sppo import Piece, piece_costs
from memo_sim.engine.schedules.sppo import _overlap_finder, _overlapping, build_pipeline_iteration, collapse_unit
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile

K = 1024
A100 = load_profile("a100-sxm4-80gb")
TOY = ModelConfig("toy", layers=4, hidden=1024, heads=8, ffn=4096, vocab=4096)


def _plan(lay, seq, n, mux):
    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(TOY, lay, 1, seq)
    return dataclasses.replace(pol, alphas=(0.5,) * n)


@pytest.mark.parametrize("pp,n,mux", [(2, 4, False), (4, 6, True), (4, 2, True), (8, 16, True), (3, 1, False)])
def test_bisected_overlaps_are_the_scanned_ones(pp, n, mux):
    lay = Layout(tp=1, pp=pp)
    pieces = _plan(lay, 64 * K, n, mux).stage_pieces(TOY, lay, 1)
    rng = random.Random(pp * 100 + n)
    for s in range(pp):
        find = _overlap_finder(pieces[s])
        spans = [(p.start, p.end) for t in range(pp) for p in pieces[t]]
        spans += [tuple(sorted(rng.sample(range(0, 64 * K + 2), 2))) for _ in range(200)]
        spans += [(0, 1), (64 * K - 1, 64 * K), (64 * K, 64 * K + 5), (3, 3)]
        for a, b in spans:
            assert list(find(a, b)) == _overlapping(pieces[s], a, b), (s, a, b)


def test_pieces_out_of_order_are_scanned():
    ps = [Piece(1, 0, 1, 100, 200), Piece(0, 0, 1, 0, 100), Piece(2, 0, 1, 150, 300)]
    find = _overlap_finder(ps)
    for a, b in ((0, 50), (90, 160), (199, 201), (250, 400), (0, 300)):
        assert list(find(a, b)) == _overlapping(ps, a, b)


@pytest.mark.parametrize("detail", ["ops", "units"])
def test_shared_piece_lists_keep_each_units_names_and_costs(detail):
    """Every unit's ops are its piece's cost list (collapsed for ``units``), renamed
    ``<op>@<piece tag>`` where the stage has several pieces, on every layer of every stage."""
    lay = Layout(tp=2, sp=True, pp=2)
    pol = _plan(lay, 32 * K, 4, True)
    sched = build_pipeline_iteration(TOY, lay, 1, 32 * K, pol, A100, detail=detail)
    shard = Layout(tp=2, sp=True)
    seen = 0
    for (s, k, layer, phase), ops in sched.phases.items():
        pc = sched.pieces[s][k]
        fc, bc = piece_costs(TOY, shard, 1, pc.start, pc.tokens, A100)
        costs = fc if phase == "fwd" else bc
        if detail == "units":
            costs = collapse_unit(costs, phase, shard, A100)
        many = len(sched.pieces[s]) > 1
        assert [o.name for o in ops] == [c.name + (f"@{pc.tag()}" if many else "") for c in costs]
        assert [o.work for o in ops] == [float(c.seconds) if c.seconds > 0 else 0.0 for c in costs]
        assert all(o.layer == layer and o.phase == phase for o in ops)
        seen += 1
    assert seen == 2 * sum(len(p) * len(r) for p, r in zip(sched.pieces, sched.layers))
