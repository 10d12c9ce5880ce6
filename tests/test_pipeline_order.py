"""Megatron-LM's 1F1B and interleaved orders (`memo_exec.pipeline.order`): warm-up counts, every
forward before its backward, the activation slots a rank needs, and that the whole pipeline
finishes when every rank sends without blocking and waits for each message right before use, with
each directed pair's messages matched in order."""

from __future__ import annotations

import pytest

from memo_exec.pipeline.order import interleaved, messages_from, one_f_one_b, slots, stage_order, virtual_stage


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 4), (4, 8), (3, 2)])
def test_1f1b_warmup_and_in_flight(pp, m):
    for r in range(pp):
        order = one_f_one_b(pp, m, r)
        w = min(pp - r - 1, m)
        assert [a.kind for a in order[:w]] == ["fwd"] * w
        assert sorted((a.kind, a.mb) for a in order) == sorted([("fwd", k) for k in range(m)] +
                                                               [("bwd", k) for k in range(m)])
        assert slots(order)[1] == min(pp - r, m)  # 1F1B keeps p - s micro-batches on stage s


def test_interleaved_matches_megatron_for_pp2_v2_m4():
    got = [(a.kind[0], a.chunk, a.mb) for a in interleaved(2, 2, 4, 0)]
    assert got[:5] == [("f", 0, 0), ("f", 0, 1), ("f", 1, 0), ("f", 1, 1), ("f", 0, 2)]
    assert got[5] == ("b", 1, 0)  # the first backward is the last chunk's first micro-batch
    with pytest.raises(ValueError):
        interleaved(4, 2, 6, 0)


def _run_pipeline(schedule, pp, vpp, m):
    """Event-free replay: each rank advances while the message its next action needs has been sent."""
    orders = {r: stage_order(schedule, pp, vpp, m, r) for r in range(pp)}
    v = vpp if schedule == "interleaved_1f1b" else 1
    last = pp * v - 1
    sent = {(src, dst): [] for src in range(pp) for dst in range(pp)}
    expect = {r: messages_from(schedule, pp, vpp, m, r) for r in range(pp)}
    pos = {r: 0 for r in range(pp)}
    got = {(src, r): 0 for r in range(pp) for src in range(pp)}
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            if pos[r] == len(orders[r]):
                continue
            a = orders[r][pos[r]]
            vs = virtual_stage(a.chunk, r, pp)
            need = None
            if a.kind == "fwd" and vs > 0:
                need = ((vs - 1) % pp, ("fwd", a.chunk, a.mb))
            if a.kind == "bwd" and vs < last:
                need = ((vs + 1) % pp, ("bwd", a.chunk, a.mb))
            if need is not None:
                src, key = need
                chan = sent[(src, r)]
                i = got[(src, r)]
                # the receiver consumes the channel in order: the message must be the next one expected
                if key not in expect[r][src] or len(chan) <= expect[r][src].index(key):
                    continue
                assert chan[expect[r][src].index(key)] == key, "messages matched out of order"
                got[(src, r)] = max(i, expect[r][src].index(key) + 1)
            if a.kind == "fwd" and vs < last:
                sent[(r, (vs + 1) % pp)].append(("fwd", (vs + 1) // pp, a.mb))
            if a.kind == "bwd" and vs > 0:
                sent[(r, (vs - 1) % pp)].append(("bwd", (vs - 1) // pp, a.mb))
            pos[r] += 1
            progress = True
    return all(pos[r] == len(orders[r]) for r in range(pp))


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 2, 1, 4), ("1f1b", 4, 1, 4), ("1f1b", 4, 1, 2),
                                               ("interleaved_1f1b", 2, 2, 4), ("interleaved_1f1b", 4, 2, 4),
                                               ("interleaved_1f1b", 4, 2, 8), ("interleaved_1f1b", 2, 3, 6)])
def test_orders_finish_and_messages_match(schedule, pp, vpp, m):
    assert _run_pipeline(schedule, pp, vpp, m)
    for r in range(pp):
        for src, msgs in messages_from(schedule, pp, vpp, m, r).items():
            assert len(set(msgs)) == len(msgs)
