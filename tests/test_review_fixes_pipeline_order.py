"""Interleaved 1F1B with as many micro-batches as stages warms up as Megatron-LM has since 4295be1a6c (2024-11-01,
`get_pp_rank_microbatches`) and PyTorch's ScheduleInterleaved1F1B do: (p - s - 1) x 2 + (v - 1) x p chunk forwards,
not all of them (a review: every stage held 8 chunks in flight for pp 4 x vpp 2 at m = 4, where Megatron holds
8, 8, 7, 5), in the simulator's order and the executor's alike."""

from __future__ import annotations

from memo_exec.pipeline.order import in_flight_peak, stage_order
from memo_sim.engine.schedules.interleaved import order


def _sim_in_flight(steps) -> int:
    held = peak = 0
    for st in steps:
        held += 1 if st.kind == "F" else -1
        peak = max(peak, held)
    return peak


def test_m_equal_to_pp_warms_up_as_megatron_does_today():
    pp, v, m = 4, 2, 4
    assert [_sim_in_flight(order(pp, m, v, s)) for s in range(pp)] == [8, 8, 7, 5]
    assert [in_flight_peak(stage_order("interleaved_1f1b", pp, v, m, s)) for s in range(pp)] == [8, 8, 7, 5]
    # more micro-batches than stages: as before
    assert [_sim_in_flight(order(pp, 8, v, s)) for s in range(pp)] == [11, 9, 7, 5]
