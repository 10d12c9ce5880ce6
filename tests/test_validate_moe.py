"""[#49 item 5] `memo-exec validate` compares the MoE dispatcher's all-to-all time per layer with the
simulator's: a tiny MoE plan with dp2 x ep2 runs on 2 gloo processes on CPU (`memo-exec run --nproc 2`,
as validate starts every plan), its dispatch and combine all-to-alls are ``ep_comm`` spans named as the
simulator names them (``moe_dispatch_alltoall_ep`` / ``moe_combine_alltoall_ep``, per layer, forward and
backward), and the report holds a per-layer all-to-all row with both numbers present and positive."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from memo_exec import validate as V  # noqa: E402
from memo_exec.compare import ALLTOALL_OPS, alltoall_rows, alltoall_times, op_times, stream_stats  # noqa: E402
from memo_exec.moe.dispatchers import A2A_OPS  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.profile.loader import load_profile  # noqa: E402
from memo_sim.timeline import Timeline, TimelineEvent  # noqa: E402
from tests.exec_helpers import time_limit  # noqa: E402
from tests.test_exec_moe import MOE  # noqa: E402  (4 layers, the first dense, 4 experts, top 2)

MOE_LAYERS = range(MOE.dense_layers, MOE.layers)


def test_names_match_the_simulators():
    """The executor's op names are the simulator's, read from its own prediction of an ep2 plan."""
    assert A2A_OPS == ALLTOALL_OPS
    sim = V.predict(MOE, 64, V.get_policy("store_all"), load_profile("h100-sxm5-80gb"), Layout(dp=2, ep=2))
    ep = {(e.op, e.phase) for e in sim.timeline.events if e.stream == "ep_comm"}
    assert ep == {(op, ph) for op in ALLTOALL_OPS[:2] for ph in ("fwd", "bwd")}  # the alltoall dispatcher's pair


def test_blocking_alltoall_is_not_compute_time():
    """A measured all-to-all inside the ``moe`` compute op that issued it is waiting, not compute:
    compute busy and the layer's forward leave it out; ep_comm's own row has it."""
    ev = [TimelineEvent("moe", 1, "fwd", "compute", 0, 0.0, 1.0),
          TimelineEvent("moe_dispatch_alltoall_ep", 1, "fwd", "ep_comm", 0, 0.2, 0.5),
          TimelineEvent("moe_combine_alltoall_ep", 1, "fwd", "ep_comm", 0, 0.6, 0.7)]
    tl = Timeline(events=ev)
    st = stream_stats(tl, ("ep_comm",))
    assert st["compute"]["busy_s"] == pytest.approx(0.6)
    assert st["ep_comm"]["busy_s"] == pytest.approx(0.4)
    assert op_times(tl)[(1, "forward")] == pytest.approx(0.6)
    assert alltoall_times(tl) == {1: (pytest.approx(0.4), 2)}
    rows = alltoall_rows([tl, tl], Timeline(events=ev[1:2]))
    assert rows[0]["measured_s"] == pytest.approx(0.4) and rows[0]["ratio"] == pytest.approx(0.4 / 0.3)


def test_blocking_tp_collectives_are_not_compute_time():
    """A TP all-gather the executor records on ``comm`` (layer None) inside the ``qkv`` op that issued it is waiting,
    not compute (a TP 2 CPU validation read compute busy +182% and its collectives 'overlapped' 355 ms); one on
    another rank's timeline or outside any op is left alone."""
    ev = [TimelineEvent("qkv", 0, "fwd", "compute", 0, 0.0, 1.0),
          TimelineEvent("tp_all_gather", None, "comm", "comm", 0, 0.1, 0.4),
          TimelineEvent("fc1", 0, "fwd", "compute", 0, 1.0, 2.0),
          TimelineEvent("tp_reduce_scatter", None, "comm", "comm", 0, 1.5, 1.7),
          TimelineEvent("tp_all_gather", None, "comm", "comm", 1, 0.1, 0.4),  # rank 1's: not in rank 0's ops
          TimelineEvent("tp_grad_all_reduce", None, "comm", "comm", 0, 2.5, 2.6)]  # after the layer: no op holds it
    tl = Timeline(events=ev)
    st = stream_stats(tl, ("comm",))
    assert st["compute"]["busy_s"] == pytest.approx(1.5) and st["comm"]["overlapped_s"] == pytest.approx(0.0)
    assert op_times(tl)[(0, "forward")] == pytest.approx(1.5)


def test_validate_reports_the_alltoall_per_layer(tmp_path):
    with time_limit(90):
        path, summary = V.validate(MOE, load_profile("h100-sxm5-80gb"), V.plan_set([64], ["store_all"], [0.5]),
                                   device="cpu", steps=2, out_dir=tmp_path / "val", report_path=None,
                                   command="test", record=False, speed_retries=0, budget_s=60, layout=Layout(dp=2, ep=2))
    doc = json.loads((tmp_path / "val" / "validation.json").read_text())
    (row,) = doc["rows"]
    assert row["status"] == "ran", row["status"]
    by_layer = {r["layer"]: r for r in row["moe_alltoall"]}
    for layer in MOE_LAYERS:  # every MoE layer: forward dispatch + combine, their transposes in backward
        r = by_layer[layer]
        assert r["measured_count"] == 4 and r["predicted_count"] >= 4, r
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["ratio"] > 0, r
    q = row["quantities"]["alltoall_layer_s"]
    # an H100 profile's times beside a CPU run: "not comparable", as the run's report.md says (times_comparable)
    assert q["predicted"] > 0 and q["measured"] > 0 and q["error_pct"] is None and q["not_comparable"]
    assert summary["errors"]["alltoall_layer_s"]["plans"] == 0
    assert "MoE all-to-all per layer not compared (not comparable" in V.summary_line(summary)
    text = path.read_text()
    assert "## MoE all-to-all per layer" in text and "| 64 store_all | 1 |" in text
    # the run's own outputs: ep_comm spans named as the simulator's, per MoE layer, forward and backward
    run = tmp_path / "val" / "runs" / "plan-00"
    measured = Timeline.read_json(run / "measured.json")
    seen = {(e.device, e.op, e.layer, e.phase) for e in measured.events if e.stream == "ep_comm"}
    for rank in (0, 1):
        for layer in MOE_LAYERS:
            for op in ALLTOALL_OPS[:2]:  # the alltoall dispatcher's pair (deepep's are the other two)
                assert {(rank, op, layer, "fwd"), (rank, op, layer, "bwd")} <= seen
    assert not any(e[2] is not None and e[2] < MOE.dense_layers for e in seen)  # a dense layer dispatches nothing
    report = (run / "report.md").read_text()
    assert "## MoE all-to-all per layer: measured vs predicted" in report and "ep_comm busy s" in report
