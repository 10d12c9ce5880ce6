"""A layer's transients under MEMO's static memory plan, by phase (reviews of Dec 1).

1. The token-wise recompute's gathered ln1 / ln2 (memo-exec's ``rc_ln1_gathered``: the TP group's dropped rows at
   full width, a scratch tensor freed after its GEMM, memo_exec/layer.py ``_fwd_ops`` under ``recompute_tokens``)
   were counted beside the arena by the static plan and as the rounding buffer's by the iteration replay: they are
   layer transients the plan places (live at the backward's start, before its own tensors), and without sequence
   parallelism there is no gather at all (the rows are the rounding buffer's slot).
2. The static plan's forward was charged the backward's tensors beside the arena (dy, its attention workspace, dx):
   each phase holds the one arena and its own tensors beside it (`static_plan_phase_bytes`).
"""

from __future__ import annotations

import pytest

from memo_sim.layout import Layout
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.memplan.trace_gen import (layer_backward_trace, layer_forward_trace, outside_peak_bytes, placed_only,
                                        static_plan_phase_bytes)
from memo_sim.model import get_model
from memo_sim.model.layer_graph import RECOMPUTE_GATHERS, UNPLACED
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.request_trace import RequestTrace

K = 1024
M7 = get_model("gpt-7b")


def _names(trace) -> set[str]:
    return {b.name for b in trace.buffers}


def _max_live(trace, names) -> float:
    return float(RequestTrace([b for b in trace.buffers if b.name in names]).max_live_bytes())


def test_recompute_gather_is_a_placed_transient_not_beside_the_arena():
    lay, pol = Layout(tp=8), get_policy("memo", 0.5)
    bwd = layer_backward_trace(M7, lay, 1, 256 * K, pol)
    gathers = [b for b in bwd.buffers if b.name in RECOMPUTE_GATHERS]
    assert {b.name for b in gathers} == set(RECOMPUTE_GATHERS)
    assert not set(RECOMPUTE_GATHERS) & set(UNPLACED["bwd"])
    assert set(RECOMPUTE_GATHERS) <= _names(placed_only(bwd, "bwd"))
    # nothing the recompute adds is beside the arena: the tensors there are the backward's own, as without it
    plain = layer_backward_trace(M7, lay, 1, 256 * K, get_policy("memo", 1.0))
    assert outside_peak_bytes(bwd, "bwd") == outside_peak_bytes(plain, "bwd")
    # by hand: dy for the whole phase and the attention kernel's workspace beside it
    assert outside_peak_bytes(bwd, "bwd") == _max_live(bwd, {"dy", "attention_bwd_workspace"})


def test_no_recompute_gather_without_sequence_parallelism():
    bwd = layer_backward_trace(M7, Layout(tp=8, sp=False), 1, 64 * K, get_policy("memo", 0.5))
    assert not _names(bwd) & set(RECOMPUTE_GATHERS)
    assert "rc_proj" in _names(bwd)  # the recompute still runs (its output projection's partial sum)


def test_forward_holds_the_arena_and_its_own_tensors_only():
    lay, pol, seq = Layout(tp=8), get_policy("memo", 1.0), 256 * K
    fwd, bwd = layer_forward_trace(M7, lay, 1, seq), layer_backward_trace(M7, lay, 1, seq, pol)
    arena = max(placed_only(fwd, "fwd").max_live_bytes(), placed_only(bwd, "bwd").max_live_bytes())
    phases = static_plan_phase_bytes(fwd, bwd)
    assert phases["fwd"] == arena + _max_live(fwd, {"y", "attention_workspace"})
    assert phases["bwd"] == arena + _max_live(bwd, {"dy", "attention_bwd_workspace", "d_h1_part", "dx"})
    mem = memory_breakdown(M7, lay, 1, seq, pol, load_profile("a800-80gb"))
    assert mem.transient_forward_bytes == phases["fwd"] < mem.transient_backward_bytes == phases["bwd"]
    assert mem.transient_planned_bytes == mem.transient_peak_bytes == phases["bwd"]
    assert mem.phase_working_bytes("fwd") == phases["fwd"] + mem.layer_boundary_bytes
    assert mem.phase_working_bytes("recompute") == mem.phase_working_bytes("bwd")
    # the total stays the backward's (6.01 GiB of transients + boundary at 256K, as before)
    assert mem.layer_side_bytes() == pytest.approx(6.0078125 * 2 ** 30)


def test_caching_allocator_phases_are_the_reserved_peak():
    mem = memory_breakdown(M7, Layout(tp=8), 1, 64 * K, get_policy("store_all"), load_profile("a800-80gb"))
    assert mem.transient_forward_bytes is None
    assert mem.phase_transient_bytes("fwd") == mem.phase_transient_bytes("bwd") == mem.transient_peak_bytes
