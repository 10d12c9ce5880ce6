"""The executor report compares a rank's pinned host pool with its share of the node's prediction."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from memo_exec.report import _pinned_row  # noqa: E402


def _res(world, pool, optimizer_offload=False, host_optimizer=0, dp=1):
    lay = SimpleNamespace(optimizer_offload=optimizer_offload, dp=dp)
    return SimpleNamespace(meta={"world": world, "pinned_host_bytes": pool, "host_optimizer_bytes": host_optimizer},
                           plan=SimpleNamespace(profile="a800-80gb", layout=lay))


def test_single_rank_compares_the_node():
    q, _u, pred, meas, _s = _pinned_row(_res(1, 100), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert q == "pinned host memory" and pred == 100.0 and meas == 100


def test_a_rank_of_four_compares_its_share():
    # tp2cp2 on one host: the plan's node holds the 4 ranks (a800: 8 GPUs per node), each its quarter
    q, _u, pred, meas, _s = _pinned_row(_res(4, 25), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert pred == 25.0 and meas == 25 and "4 ranks" in q
    q, _u, pred, _m, _s = _pinned_row(_res(16, 25), {"peak_host_bytes_per_node": 800.0}, "sim")
    assert pred == 100.0 and "8 ranks" in q  # 16 ranks: 8 per a800 node


def test_an_offloaded_optimizer_is_measured_beside_the_pool():
    """The simulator's host bytes hold the optimizer's states on the host too (review of 2026-11-26: the
    pool alone read -100%): the measured side adds what the host optimizer allocated."""
    q, _u, pred, meas, _s = _pinned_row(_res(1, 10, True, 90), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert meas == 100 and pred == 100.0 and "optimizer" in q
    q, _u, _p, meas, _s = _pinned_row(_res(1, 10, False, 90), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert meas == 10 and q == "pinned host memory"


def test_tokens_per_gpu_divide_the_jobs_tokens_over_its_ranks():
    from memo_exec.report import _replica_gpus

    # a multi-rank run's meta["tokens"] is the job's (batch x seq x dp): per GPU it is over every rank
    assert _replica_gpus(_res(2, 0, dp=1)) == 2  # TP 2: one sequence over two GPUs
    assert _replica_gpus(_res(2, 0, dp=2)) == 2  # DP 2: two sequences over two GPUs
    assert _replica_gpus(_res(8, 0, dp=2)) == 8
    assert _replica_gpus(_res(1, 0, dp=1)) == 1


def test_a_plans_loss_kernel_other_than_the_executors_is_named():
    """memo-exec computes the loss in its chunked head whatever the plan's cross_entropy: a plan priced with
    Megatron's vocab_parallel loss (and with modules, their kept loss state) says so in report.md."""
    from memo_exec.report import loss_kernel_note
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import ModelConfig

    m = ModelConfig("t", 8, 256, 4, 512, vocab=96)

    def plan(ce, mtp=0):
        return SimpleNamespace(layout=Layout(cross_entropy=ce), model=replace(m, mtp_layers=mtp))

    assert loss_kernel_note(plan("chunked", 1)) is None
    note = loss_kernel_note(plan("vocab_parallel"))
    assert "priced with the vocab_parallel loss" in note and "multi-token" not in note
    assert "loss state of the 1 multi-token-prediction module(s)" in loss_kernel_note(plan("vocab_parallel", 1))
    assert "multi-token" not in loss_kernel_note(plan("chunked_wrapper", 1))  # keeps nothing between its passes


def _totals_res(world, dp, *, not_estimated=()):
    from memo_sim.model.config import get_model

    model = get_model("gpt-7b")
    lay = SimpleNamespace(optimizer_offload=False, dp=dp, tp=1)
    plan = SimpleNamespace(profile="h100-sxm5-80gb", layout=lay, model=model, batch=1, seq_tokens=4096,
                           layer_timings_s={})
    meta = {"world": world, "pinned_host_bytes": 0, "host_optimizer_bytes": 0, "tokens": 4096 * dp,
            "device_kind": "cuda", "layers": model.layers, "memory_estimate_total_bytes": 7}
    return SimpleNamespace(steady={"iteration_s": 2.0}, plan=plan, meta=meta,
                           estimate=SimpleNamespace(not_estimated=not_estimated))


def test_measured_mfu_counts_every_rank_of_a_multi_rank_run():
    """Review of 2026-11-26: the MFU row of a multi-rank run divided the plan's per-replica batch over one GPU
    (too high by the ranks per replica). The job's sequences over every rank: one replica over one GPU and
    two replicas over two GPUs give the same MFU; TP 2 halves it."""
    from memo_exec.report import totals_rows

    def measured_mfu(world, dp):
        rows = totals_rows(_totals_res(world, dp), {"mfu": 0.5}, "sim")
        return next(r["measured"] for r in rows if r["quantity"] == "MFU")

    one, dp2, tp2 = measured_mfu(1, 1), measured_mfu(2, 2), measured_mfu(2, 1)
    assert one > 0 and dp2 == pytest.approx(one) and tp2 == pytest.approx(one / 2)


def test_a_static_terms_estimate_is_not_compared_with_the_peak():
    from memo_exec.report import totals_rows

    def est_row(res):
        return next(r for r in totals_rows(res, {"peak_gpu_bytes": 10.0}, "sim")
                    if r["quantity"] == "executor's memory estimate")

    assert est_row(_totals_res(1, 1))["measured"] == 7 and est_row(_totals_res(1, 1))["rel_error"] is not None
    r = est_row(_totals_res(2, 2, not_estimated=("transient_peak", "peak_total")))
    assert r["measured"] is None and r["rel_error"] is None


def test_whole_prediction_names_where_it_comes_from():
    from memo_exec.report import whole_prediction

    plan = SimpleNamespace(model=SimpleNamespace(layers=4), profile="a100-sxm4-80gb",
                           predicted=SimpleNamespace(to_dict=lambda: {"iteration_s": 1.0}))
    sim = SimpleNamespace(to_dict=lambda: {"iteration_s": 2.0})
    assert whole_prediction(plan, 4, sim, "re-simulated", False) == ({"iteration_s": 1.0}, "plan.predicted")
    pred, src = whole_prediction(plan, 4, sim, "re-simulated", True)
    assert pred == {"iteration_s": 2.0} and "--profile a100-sxm4-80gb" in src
    # --profile with every layer, and the simulator refused: said as such, not as a layer-count mismatch
    pred, src = whole_prediction(plan, 4, None, "the simulator refused the plan (x)", True)
    assert pred == {} and src.startswith("not predicted with --profile a100-sxm4-80gb") and "4 ran" not in src
    pred, src = whole_prediction(plan, 2, None, "no simpy", False)
    assert pred == {} and "the plan is for 4 layers, 2 ran" in src


def test_a_pipelines_memory_rows_compare_rank_0s_stage():
    """A review (2026-12-03): a pp 2 run's top table read the estimate +58.5% against the plan's peak (the fullest
    stage's) while the memory table below read +7.2% against stage 0's terms. With rank 0's stage peak known
    (`pipeline_rank0_prediction`'s ``peak``) both device memory rows compare with it and name it; without it, or on
    one rank, the plan's peak as before."""
    from memo_exec.report import totals_rows

    def rows(world, rank0):
        out = totals_rows(_totals_res(world, 1), {"peak_gpu_bytes": 10.0}, "sim", rank0=rank0)
        return {r["quantity"]: r for r in out}

    r = rows(2, {"peak": (7.0, "its stage's simulated peak"), "from": "re-simulated"})
    for q in ("peak device memory (allocated)", "executor's memory estimate"):
        assert r[q]["predicted"] == 7.0 and r[q]["predicted_from"].startswith("rank 0's stage"), r[q]
    assert r["executor's memory estimate"]["rel_error"] == pytest.approx(0.0)
    assert rows(2, None)["executor's memory estimate"]["predicted"] == 10.0
    assert rows(1, {"peak": (7.0, "x"), "from": "y"})["executor's memory estimate"]["predicted"] == 10.0
