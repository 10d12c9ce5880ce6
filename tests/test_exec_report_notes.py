"""report.md (and the run's --json) say where the run did otherwise than the plan priced: ZeRO's overlapped
collectives, a materialised attention's score matrix, PyTorch's caching host allocator; a pipeline's rank 0 is
compared with its own stage's prediction; validate counts a measured exposure where none was predicted; and the
dtype advice names only what memo-sim whatif accepts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.timeline import MemorySample, Timeline, TimelineEvent  # noqa: E402

MODEL = ModelConfig("t", 4, 64, 4, 256, vocab=128)


def _plan(schedule="sppo", **lay):
    return SimpleNamespace(layout=Layout(**lay), model=MODEL, policy=SimpleNamespace(name="store_all"),
                           profile="a800-80gb", schedule=schedule)


# --------------------------------------------------------------------------------------------- 1: ZeRO overlap
def test_zero1_overlapped_reduction_and_gather_are_named_under_sppo():
    """SPPO's stage runs its layers without the layer hooks: ZeRO 1 reduces after the whole backward and gathers
    after the optimizer step (`memo_exec.distributed.zero.GradSync`)."""
    from memo_exec.report import grad_sync_note

    note = grad_sync_note(_plan(dp=2, zero=1))
    assert note is not None
    assert "grad_overlap" in note and "param_gather" in note
    assert "after the whole backward" in note and "after the optimizer step" in note
    assert "reduce-scatter" in note and "sppo schedule" in note and note.count(". ") == 0  # one sentence


def test_zero0_names_the_all_reduce_only():
    from memo_exec.report import grad_sync_note

    note = grad_sync_note(_plan(dp=2, zero=0))
    assert "all-reduces every gradient unit after the whole backward" in note and "param_gather" not in note


@pytest.mark.parametrize("schedule", ["single_stage", "1f1b", "interleaved_1f1b"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_schedules_with_layer_hooks_overlap_as_priced(schedule, zero):
    """Every schedule that calls the layer hooks overlaps the reductions and ZeRO 1 / 2's gathers as the plan prices
    them (tests/test_exec_grad_overlap.py runs it): nothing to note."""
    from memo_exec.report import grad_sync_note

    assert grad_sync_note(_plan(schedule, dp=2, zero=zero)) is None


def test_no_zero_note_where_nothing_differs():
    from memo_exec.report import grad_sync_note

    assert grad_sync_note(_plan(dp=1, zero=1)) is None  # one replica: nothing reduced
    assert grad_sync_note(_plan(dp=2, zero=1, grad_overlap=False, param_gather="after_step")) is None
    assert grad_sync_note(_plan(dp=2, zero=0, grad_overlap=False)) is None
    # ZeRO 1 priced gathering after the step: the reduction's clause alone
    note = grad_sync_note(_plan(dp=2, zero=1, param_gather="after_step"))
    assert "grad_overlap" in note and "param_gather" not in note


def test_plan_notes_hold_the_zero_note_and_reach_the_json():
    from memo_exec.report import Comparison, plan_notes

    notes = plan_notes(_plan(dp=2, zero=1), {"pinned_host_bytes": 0})
    assert any("grad_overlap" in n for n in notes)
    c = Comparison([], [], [], [], "s", "s", notes=notes)
    assert c.to_dict()["plan_notes"] == notes


# --------------------------------------------------------------------------- 2: materialised attention
def test_materialised_attention_is_named_on_any_device():
    from memo_exec.attention import priced_kernel_note

    for device in ("cpu", "cuda"):
        note = priced_kernel_note("materialised", "math", device)
        assert note is not None and "materialised" in note and "score matrix" in note
        assert "transient" in note and "not comparable" in note
    assert priced_kernel_note("flash", "math", "cpu") is None


def test_a_materialised_plan_says_so_in_its_notes():
    from memo_exec.report import plan_notes

    notes = plan_notes(_plan(attention="materialised"), {"attention_kernel_priced": "materialised",
                                                         "attention_backend": "math", "device_kind": "cpu"})
    assert any("materialised" in n for n in notes)


# ------------------------------------------------------------------------------ 3: caching host allocator
def test_caching_host_allocator_plan_is_named_where_the_run_offloads():
    from memo_exec.report import host_pool_note

    note = host_pool_note(_plan(host_pool="caching_host_allocator"), {"pinned_host_bytes": 1 << 20})
    assert note is not None and "caching_host_allocator" in note and "exact" in note and "power" in note
    assert host_pool_note(_plan(host_pool="caching_host_allocator"), {"pinned_host_bytes": 0}) is None
    assert host_pool_note(_plan(), {"pinned_host_bytes": 1 << 20}) is None


# ------------------------------------------------------------------------- 4: a pipeline's rank 0 rows
def _ev(op, phase, stream, device, start, end, nbytes=0.0):
    return TimelineEvent(op=op, layer=0, phase=phase, stream=stream, device=device, start=start, end=end,
                         nbytes=nbytes)


def _pipe_sim(copies_on_0: bool):
    """Stage 1 (device 1) offloads 100 bytes; stage 0 offloads 50 where ``copies_on_0``; the node's peak 300 (the
    blocks 2x the copied bytes: aligned)."""
    ev = [_ev("fwd", "fwd", "compute", 0, 0, 1), _ev("fwd", "fwd", "compute", 1, 1, 2),
          _ev("offload", "offload", "d2h", 1, 2, 3, 100.0), _ev("prefetch", "prefetch", "h2d", 1, 4, 5, 100.0)]
    if copies_on_0:
        ev += [_ev("offload", "offload", "d2h", 0, 1, 2, 50.0), _ev("prefetch", "prefetch", "h2d", 0, 5, 6, 50.0)]
    stages = [{"stage": 0, "device": 0, "node": 0, "gpus_on_node": 1}, {"stage": 1, "device": 1, "node": 0,
                                                                       "gpus_on_node": 1}]
    tl = Timeline(ev, [MemorySample(0.0, -1, "host", 300.0 if copies_on_0 else 200.0)],
                  {"pipeline": {"stages": stages}})
    return SimpleNamespace(timeline=tl, peak_host_bytes_per_node=300.0 if copies_on_0 else 200.0,
                           exposed_copy_s=0.5)


def test_pipeline_rank0_is_compared_with_its_own_stage():
    from memo_exec.report import pipeline_rank0_prediction

    plan = SimpleNamespace(layout=Layout(pp=2), model=MODEL)
    got = pipeline_rank0_prediction(plan, _pipe_sim(False))
    assert got["pinned"][0] == 0.0  # stage 0 offloads nothing in the prediction
    assert got["exposed"][0] == 0.0  # and copies nothing: nothing to wait on
    got = pipeline_rank0_prediction(plan, _pipe_sim(True))
    assert got["pinned"][0] == pytest.approx(100.0)  # its 50 copied bytes of the node's 150, of 300 held
    assert got["exposed"][0] is None and "most exposed stage" in got["exposed"][1]  # max over two copying stages
    assert pipeline_rank0_prediction(SimpleNamespace(layout=Layout(), model=MODEL), _pipe_sim(True)) is None


def test_pinned_row_of_a_pipeline_rank_uses_its_stage():
    from memo_exec.report import _pinned_row

    lay = SimpleNamespace(optimizer_offload=False, dp=1, pp=2)
    res = SimpleNamespace(meta={"world": 2, "pinned_host_bytes": 0, "host_optimizer_bytes": 0},
                          plan=SimpleNamespace(profile="a800-80gb", layout=lay))
    q, _u, pred, meas, _s = _pinned_row(res, {"peak_host_bytes_per_node": 200.0}, "sim",
                                        rank0={"pinned": (0.0, "rank 0's stage")})
    assert pred == 0.0 and meas == 0 and "rank 0" in q
    # no per-stage figure: not the node's over the ranks
    q, _u, pred, _m, _s, why = _pinned_row(res, {"peak_host_bytes_per_node": 200.0}, "sim",
                                           rank0={"pinned": (None, "why")})
    assert pred is None and why == "not comparable (why)"


# ------------------------------------------------------------------------ 5: validate's exposure misses
def test_validate_counts_a_measured_exposure_where_none_was_predicted():
    from memo_exec import validate as V

    doc = {"totals": [{"quantity": "iteration time", "predicted": 1.0, "measured": 1.1}],
           "streams": [{"stream": "d2h", "quantity": "exposed", "predicted_s": 0.0, "measured_s": 0.002},
                       {"stream": "h2d", "quantity": "exposed", "predicted_s": 0.0, "measured_s": 0.0}]}
    q = V.quantities_from_run(doc, {k: None for k, _, _ in V.QUANTITIES})
    assert V.miss_seconds("d2h_exposed_s", q["d2h_exposed_s"]) == pytest.approx(0.002)
    assert V.miss_seconds("h2d_exposed_s", q["h2d_exposed_s"]) is None  # none measured either
    row = V.ValidationRow("p", "ran", q)
    s = V.summarize([row])
    assert s["errors"]["d2h_exposed_s"]["misses"] == 1 and s["errors"]["d2h_exposed_s"]["compared"] == 1
    assert s["errors"]["d2h_exposed_s"]["max_abs_miss"] == pytest.approx(0.002)
    assert "miss" in V._err_cell(q["d2h_exposed_s"], "d2h_exposed_s")
    # another device's prediction (a GPU profile's plan run on a CPU): not comparable, no miss
    q = V.quantities_from_run({**doc, "times_comparable": False}, {k: None for k, _, _ in V.QUANTITIES})
    assert q["d2h_exposed_s"].get("not_comparable") and V.miss_seconds("d2h_exposed_s", q["d2h_exposed_s"]) is None
    assert "misses" not in V.summarize([V.ValidationRow("p", "ran", q)])["errors"]["d2h_exposed_s"]


def test_validate_report_counts_the_miss():
    from memo_exec import validate as V

    q = {k: {"predicted": None, "measured": None, "error_pct": None} for k, _, _ in V.QUANTITIES}
    q["step_s"] = {"predicted": 1.0, "measured": 1.1, "error_pct": 10.0}
    q["d2h_exposed_s"] = {"predicted": 0.0, "measured": 0.002, "error_pct": None}
    row = V.ValidationRow("p", "ran", q)
    s = V.summarize([row])
    prof = SimpleNamespace(name="x", path="x", provenance={})
    text = V.render_report([row], s, MODEL, prof, "cpu", "cmd", None)
    line = next(ln for ln in text.splitlines() if ln.startswith("| d2h exposed | "))
    assert line.startswith("| d2h exposed | 1 |") and "miss" in line


# ------------------------------------------------------------------------------ 6: dtype advice
def test_dtype_advice_names_only_whatif_dtypes():
    from memo_exec.report import dtype_advice

    assert "`--dtype fp32`" in dtype_advice("float32")
    adv = dtype_advice("float64")
    assert "--dtype fp64" not in adv and "no fp64" in adv


def test_dtype_line_of_an_fp64_run_does_not_suggest_fp64():
    from memo_exec.report import dtype_line, dtype_not_comparable

    line = dtype_line(dtype_not_comparable("fp32", "float64"))
    assert "plan in the run's dtype" not in line and "no fp64" in line
    assert "plan in the run's dtype" in dtype_line(dtype_not_comparable("bf16", "float32"))


def test_exposed_row_of_a_pipeline_rank_uses_its_stage_or_says_why_not():
    from memo_exec.report import _exposed_row

    r = _exposed_row({"exposed_copy_s": 0.5}, {"exposed_copy_s": 0.0}, "plan.predicted",
                     {"exposed": (0.0, "rank 0's stage copies nothing"), "from": "re-simulated"})
    assert r[2] == 0.0 and r[4] == "re-simulated" and len(r) == 5
    r = _exposed_row({"exposed_copy_s": 0.5}, {"exposed_copy_s": 0.0}, "plan.predicted", {"exposed": (None, "why")})
    assert r[2] == 0.5 and r[5] == "not comparable (why)"
    assert _exposed_row({"exposed_copy_s": 0.5}, {"exposed_copy_s": 0.1}, "p")[2] == 0.5  # not a pipeline


def test_a_stated_gradient_bucket_is_named():
    """XTuner's DeepSpeed states reduce_bucket_size 3e8 (``layout.reduce_bucket``): memo-exec holds a layer's
    gradients in each workspace, and says so in one sentence; a layer's bucket (0) or ZeRO below 2 says nothing."""
    from memo_exec.report import plan_notes, reduce_bucket_note

    note = reduce_bucket_note(_plan("single_stage", dp=2, zero=3, reduce_bucket=30_000))
    assert note is not None and "30,000 elements" in note and "reduce_bucket" in note and ". " not in note
    assert any("gradient buckets" in n for n in plan_notes(_plan("single_stage", dp=2, zero=2,
                                                                  reduce_bucket=1000), {"pinned_host_bytes": 0}))
    assert reduce_bucket_note(_plan("single_stage", dp=2, zero=3)) is None
    assert reduce_bucket_note(_plan("single_stage", dp=2, zero=1, reduce_bucket=1000)) is None
    assert reduce_bucket_note(_plan("single_stage", dp=1, zero=3, reduce_bucket=1000)) is None
    # a bucket no smaller than a layer on a GPU is priced as the layer's: nothing differs (this model: 49,984 a layer)
    assert reduce_bucket_note(_plan("single_stage", dp=2, zero=3, reduce_bucket=10**6)) is None
