"""The report's METP rows (`memo_exec.compare`): the ring streams' busy / overlapped / exposed
seconds on both sides, and the measured exposed ring time as the compute stream's waits."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from memo_exec.compare import ring_stall_seconds, stream_rows  # noqa: E402
from memo_sim.timeline import Timeline, TimelineEvent  # noqa: E402


def _ev(op, stream, start, end, phase="fwd"):
    return TimelineEvent(op, 0, phase, stream, 0, start, end, 0, 0)


def _rows(rows):
    return {(r["stream"], r["quantity"]): r for r in rows}


def test_ring_streams_and_stalls():
    measured = Timeline([_ev("ffn_block0", "compute", 0.0, 1.0), _ev("p2p_ffn_w0", "tp_p2p", 0.5, 1.5),
                         _ev("wait_tp_p2p", "compute", 1.0, 1.5, phase="stall"),
                         _ev("ffn_block1", "compute", 1.5, 2.0), _ev("bcast_w0", "tp_bcast", 1.6, 1.8)], [], {})
    predicted = Timeline([_ev("ffn_block0", "compute", 0.0, 1.0), _ev("p2p", "tp_p2p", 0.0, 1.2)], [], {})
    rows = _rows(stream_rows([measured], predicted))
    assert rows[("tp_p2p", "busy")]["measured_s"] == pytest.approx(1.0)
    assert rows[("tp_p2p", "exposed")]["measured_s"] == pytest.approx(0.5)  # [1.0, 1.5) not under compute
    assert rows[("tp_p2p", "exposed")]["predicted_s"] == pytest.approx(0.2)
    assert rows[("tp_bcast", "exposed")]["measured_s"] == pytest.approx(0.0)  # inside ffn_block1
    assert rows[("tp_bcast", "busy")]["predicted_s"] == 0.0
    assert rows[("compute", "busy")]["measured_s"] == pytest.approx(1.5)  # the stall is not work
    assert ring_stall_seconds(measured) == pytest.approx({"tp_p2p": 0.5, "tp_bcast": 0.0})


def test_no_ring_rows_without_metp():
    tl = Timeline([_ev("fwd", "compute", 0.0, 1.0), _ev("offload", "d2h", 0.2, 0.4)], [], {})
    assert {r["stream"] for r in stream_rows([tl], tl)} == {"compute", "d2h", "h2d"}


def test_the_collectives_streams_get_rows_where_a_timeline_has_them():
    """A TP run's collectives ('comm') were in the last step's stream table but not in 'measured vs predicted'
    (a user's review): each collective stream a timeline uses gets its rows."""
    tl = Timeline([_ev("fwd", "compute", 0.0, 1.0), _ev("fwd", "comm", 0.5, 1.2)], [], {})
    rows = _rows(stream_rows([tl], tl))
    assert rows[("comm", "busy")]["measured_s"] == pytest.approx(0.7)
    assert rows[("comm", "exposed")]["predicted_s"] == pytest.approx(0.2)  # 1.0-1.2 beside no compute
    assert "dp_comm" not in {s for s, _q in rows}
