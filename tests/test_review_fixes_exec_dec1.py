"""Review fixes of 2026-12-01 (executor): a pipelined MEMO rank's pinned pool sized for the units its order
offloads; relative errors that are only the dtype change; no ratio beside "not comparable"; ``--dtype``'s help."""

from __future__ import annotations

import pytest
import torch

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from tests.dist_cases import policy_of
from tests.dist_harness import spawn
from tests.exec_helpers import make_plan, one_process_run

SEQ, BATCH = 32, 4
TOL = 1e-9  # fp64 against the one-process fp64 run


def _model(layers: int) -> ModelConfig:
    return ModelConfig(f"pool-{layers}", layers, 32, 4, 64, vocab=64, dtype="fp32")


def _pp_plan(layers: int, micro: int, pol: str = "memo"):
    plan = make_plan(_model(layers), SEQ, policy_of(pol), batch=BATCH, chunk=48)
    plan.layout = Layout(pp=2)
    plan.gpus = 2
    plan.schedule = "1f1b"
    plan.micro_batch = micro
    return plan


def _pp_rank(rank: int, world: int, cases) -> list[dict]:
    """Each case (layers, micro-batch size, policy): one fp64 step of the pipelined run; the rank's pinned pool, its
    policy's description, its offloaded bytes, loss and (rank 0) gradients."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions

    out = []
    for layers, micro, pol in cases:
        plan = _pp_plan(layers, micro, pol)
        ctx = build_context(plan.layout, torch.device("cpu"))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1), ctx, DeviceSpec("cpu"))
        ex.allocate()
        try:
            rec = ex.step(0, optimizer=False)
            grads = ex.full_gradients()
        finally:
            ex.close()
        out.append({"pinned": int(ex.policy.pinned_bytes), "describe": ex.policy.describe(), "loss": rec.loss,
                    "offloaded": sum(e.nbytes for e in rec.events if e.stream == "d2h"),
                    "grads": grads if ctx.rank == 0 else None})
    return out


def _simulated_per_stage(plan) -> list[tuple[float, float]]:
    """Per stage, the simulator's pinned host bytes of its GPU (`memo_sim.search.pipeline.pipeline_memory`) and the
    bytes its timeline offloads in the step (pipeline.md's "simulated offload")."""
    from memo_sim.api import load_profile, simulate
    from memo_sim.search.pipeline import pipeline_memory

    prof = load_profile(plan.profile)
    res = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, prof, schedule=plan.schedule,
                   micro_batch=plan.micro_batch, classifier_chunk_tokens=plan.classifier_chunk_tokens)
    return [(pipeline_memory(plan.model, plan.layout, plan.batch, plan.micro_batch, plan.seq_tokens, plan.policy,
                             prof, plan.schedule, stage=s)[0].host_bytes_per_gpu,
             sum(e.nbytes for e in res.timeline.events if e.device == s and e.stream == "d2h"))
            for s in range(plan.layout.pp)]


# (layers, micro-batch size, policy): 2 micro-batches (stage 0 holds both at once, so the rank's last two units,
# micro-batch 1's, stay on the device and its slot takes no host slot), the same with one layer a stage (nothing
# offloaded), and 4 micro-batches (every slot offloads) under checkpoint offload (the same rule, x alone)
POOL_CASES = [(4, 2, "memo"), (2, 2, "memo"), (4, 1, "checkpoint_offload")]


@pytest.fixture(scope="module")
def pool_results():
    return spawn(_pp_rank, 2, POOL_CASES, timeout=120)


def test_pipelined_offload_pool_is_the_simulators_host_bytes(pool_results):
    """Bug 1: a pipelined MEMO rank's pinned pool is the simulator's per-GPU host bytes of its stage (an fp64 run of
    an fp32 plan: twice them), not a host slot for every layer of every slot; 4 layers over pp 2 with 2 micro-batches
    took 2 x 2 layers' host slots on stage 0 where it offloads 2 units. The offload line counts the rank's units."""
    for i, (layers, micro, pol) in enumerate(POOL_CASES):
        sim = _simulated_per_stage(_pp_plan(layers, micro, pol))
        for r in (0, 1):
            host, moved = sim[r]
            got = pool_results[r][i]
            # the host blocks live at once, never more than the stage offloads in the step: the simulator's tier-1
            # count gives stage 1 of the 2-layer case one block where its own timeline offloads nothing (the rank's
            # two units are its last two), a simulator bug reported beside this fix
            assert got["pinned"] == 2 * min(host, moved), ((layers, micro, pol), r, got["pinned"], sim)
            d = got["describe"]
            assert d["offloaded_units"] * d["layer_offload_bytes"] == got["offloaded"] == 2 * moved, (
                (layers, micro, pol), r, d, got["offloaded"], sim)
    assert _simulated_per_stage(_pp_plan(4, 2))[0] == (114688.0, 114688.0)  # 2 units of 57344 bytes, not 4
    for r in (0, 1):  # one layer a stage: nothing offloaded, no pool
        two = pool_results[r][POOL_CASES.index((2, 2, "memo"))]
        assert two["pinned"] == 0 and two["describe"]["offloaded_units"] == 0, two


def test_pipelined_offload_pool_keeps_the_gradients(pool_results):
    """The smaller pool changes no number: loss and every gradient as one process (fp64)."""
    for i, (layers, micro, pol) in enumerate(POOL_CASES):
        loss, want, _ = one_process_run(make_plan(_model(layers), SEQ, policy_of("store_all"), batch=BATCH,
                                                  chunk=48))
        got = pool_results[0][i]
        assert abs(got["loss"] - loss) <= TOL * abs(loss), (layers, micro, pol, got["loss"], loss)
        for k in want:
            err = float((got["grads"][k] - want[k]).norm() / want[k].norm())
            assert err < TOL, (layers, micro, pol, k, err)


def test_offload_line_of_a_pipeline_rank_counts_its_units():
    """The report's offload line on a pipeline rank names the (layer, micro-batch) units the rank offloads, as
    pipeline.md's offloaded bytes count them, not the layers of one instance."""
    from memo_exec.report import offload_line

    pd = {"offloaded_layers": 2, "offloaded_units": 0, "units": 2, "layer_offload_bytes": 2**20,
          "whole": ["x"], "split": [], "offload_tokens": 0, "tokens": 64}
    line = offload_line(pd, 0)
    assert "0 of the rank's 2 (layer, micro-batch) units" in line and "1 layers" not in line, line


# ---------------------------------------------------------------- bug 2: bytes of another element width
PRED = {"status": "OK", "iteration_s": 0.05, "mfu": 0.4, "tgs_tokens_per_gpu_s": 5000.0, "peak_gpu_bytes": 2.0e8,
        "peak_host_bytes_per_node": 1.0e6, "exposed_copy_s": 0.0}


def _report_rows(tmp_path, dtype: str, *args: str) -> dict[str, str]:
    """report.md's measured-vs-predicted rows (quantity -> its rel. error cell) of a MEMO plan in ``dtype``
    run for one step on the CPU (4 layers: the first 2 offloaded)."""
    from click.testing import CliRunner

    from memo_exec.cli import cli
    from memo_sim.plan.schema import write_plan
    from tests.exec_helpers import policy

    model = ModelConfig("dtype-rows", 4, 64, 4, 256, vocab=128, dtype=dtype)
    plan = write_plan(make_plan(model, 128, policy("memo", 0.3), predicted=PRED, chunk=100), tmp_path / f"{dtype}.json")
    out = tmp_path / dtype
    r = CliRunner().invoke(cli, ["run", str(plan), "--device", "cpu", "--steps", "1", "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    table = md.split("## Measured vs predicted")[1].split("\n\n")[1]
    return {c[1].strip(): c[4].strip() for ln in table.splitlines() if len(c := ln.split("|")) > 5}


@pytest.mark.slow
def test_memory_rows_of_another_element_width_read_not_comparable(tmp_path):
    """Bug 2: a bf16 plan run in fp32 read "executor's memory estimate +57.2%" and "pinned host memory +100.0%", the
    widths' ratio, beside a term table reading the same bytes "not comparable"; they read "not comparable (ran fp32,
    plan bf16)" (an fp32 plan keeps its percentages: `test_dtype_not_comparable_names_both_dtypes`,
    tests/test_exec_cli.py)."""
    rows = _report_rows(tmp_path, "bf16", "--dtype", "fp32")
    for q in ("executor's memory estimate", "pinned host memory"):
        assert rows[q] == "not comparable (ran fp32, plan bf16)", rows


def test_dtype_not_comparable_names_both_dtypes():
    from memo_exec.report import dtype_not_comparable, totals_rows
    from types import SimpleNamespace

    assert dtype_not_comparable("fp32", "float64") == "not comparable (ran fp64, plan fp32)"
    assert dtype_not_comparable("bf16", "float32") == "not comparable (ran fp32, plan bf16)"
    assert dtype_not_comparable("fp32", "float32") is None and dtype_not_comparable("bf16", None) is None
    lay = SimpleNamespace(optimizer_offload=False, dp=1, tp=1)
    res = SimpleNamespace(steady={"iteration_s": 2.0}, estimate=SimpleNamespace(not_estimated=()),
                          plan=SimpleNamespace(profile="h100-sxm5-80gb", layout=lay, model=_model(2), batch=1,
                                               seq_tokens=32, layer_timings_s={}),
                          meta={"world": 1, "pinned_host_bytes": 20, "tokens": 32, "device_kind": "cpu", "layers": 2,
                                "memory_estimate_total_bytes": 7, "dtype": "float64"})
    rows = {r["quantity"]: r for r in totals_rows(res, {"peak_host_bytes_per_node": 10.0}, "sim")}
    pinned = rows["pinned host memory"]  # the JSON row carries no error either
    assert pinned["rel_error"] is None and pinned["not_comparable"] == "not comparable (ran fp64, plan fp32)"
    res.meta["dtype"] = "float32"  # the plan's width: the error stands
    pinned = next(r for r in totals_rows(res, {"peak_host_bytes_per_node": 10.0}, "sim")
                  if r["quantity"] == "pinned host memory")
    assert pinned["rel_error"] == 1.0 and "not_comparable" not in pinned, pinned


def _pipeline_cmp(dtype: str):
    """pipeline.md's comparison of a two-stage timeline of a run in ``dtype`` (torch's name) against a 4-layer fp32
    MEMO plan (pp 2, 2 micro-batches)."""
    from memo_exec.pipeline.report import compare
    from memo_sim.timeline import Timeline, TimelineEvent

    ev = []
    for s in (0, 1):
        ev += [TimelineEvent("fwd@c0.mb0", None, "pipe_fwd", "pipeline", s, 0.0, 1.0),
               TimelineEvent("bwd@c0.mb0", None, "pipe_bwd", "pipeline", s, 1.0, 2.0),
               TimelineEvent("offload@c0.mb0", 0, "offload", "d2h", s, 0.5, 0.6, nbytes=2 * 114688.0)]
    tl = Timeline(ev, [], {"dtype": dtype, "layers": 4, "device": "cpu"})
    return compare(tl, _pp_plan(4, 2))[0]


def test_pipeline_md_says_its_bytes_are_another_dtypes():
    """Bug 2: pipeline.md showed offload 72.00 beside simulated 36.00 MiB for an fp64 run of an fp32 plan, the dtype
    unsaid; its simulated bytes say "not comparable (ran fp64, plan fp32)", an fp32 run's do not."""
    from memo_exec.pipeline.report import markdown

    md = markdown(_pipeline_cmp("float64"), "CPU memory (process RSS)")
    row = next(ln for ln in md.splitlines() if ln.startswith("| 0 |"))
    assert "0.11, not comparable (ran fp64, plan fp32)" in row, row
    assert "**Bytes: not comparable (ran fp64, plan fp32)**" in md
    md = markdown(_pipeline_cmp("float32"), "CPU memory (process RSS)")
    assert "not comparable" not in md, md


def test_sppo_pipeline_md_says_its_bytes_are_another_dtypes():
    """Bug 2: sppo_pipeline.md showed 3.773 beside simulated 1.887 MiB per subsequence for an fp64 run of an fp32
    plan; its simulated bytes say "not comparable (ran fp64, plan fp32)"."""
    from memo_exec.sppo.report import compare, markdown
    from memo_sim.cost.sppo import partition_bounds
    from memo_sim.policy.sppo import Sppo
    from memo_sim.timeline import Timeline, TimelineEvent

    model = _model(4)
    pol = Sppo(None, subseqs=2, bounds=partition_bounds(model, 1, 64, 2, "flops"), alphas=(0.5, 0.25),
               partition="flops", multiplex=False)
    plan = make_plan(model, 64, pol, chunk=40)
    plan.layout, plan.gpus = Layout(pp=2), 2
    ev = [TimelineEvent("stage_fwd@s0", None, "fwd", "compute", s, 0.0, 1.0) for s in (0, 1)]
    ev += [TimelineEvent("offload@s0", 0, "offload", "d2h", s, 0.1, 0.2, nbytes=2.0 * 2**20) for s in (0, 1)]
    sim_tl = Timeline([TimelineEvent("offload@s0", 0, "offload", "d2h", s, 0.1, 0.2, nbytes=2**20) for s in (0, 1)])
    for dtype, said in (("float64", True), ("float32", False)):
        md = markdown(compare(Timeline(ev, [], {"dtype": dtype, "device": "cpu"}), plan, None, sim_tl))
        row = next(ln for ln in md.splitlines() if ln.startswith("| 0 | 0 |"))
        assert ("1.000, not comparable (ran fp64, plan fp32)" in row) == said, row
        assert ("**Bytes: not comparable (ran fp64, plan fp32)**" in md) == said, md


# ---------------------------------------------------------------- bug 3: no ratio beside "not comparable"
def test_alltoall_table_prints_no_ratio_where_the_error_is_not_comparable():
    from memo_exec.report import _not_comparable, _pct, alltoall_markdown

    rows = [{"layer": 0, "predicted_s": 1e-5, "predicted_count": 2, "measured_s": 1.4e-2, "measured_count": 2,
             "ratio": 1402.53, "rel_error": 1401.53}]
    row = alltoall_markdown(rows, "sim", 2, _not_comparable).splitlines()[-1]
    assert "1402.53" not in row and row.endswith("| — | not comparable |"), row
    assert "1402.53" in alltoall_markdown(rows, "sim", 2, _pct).splitlines()[-1]


# ---------------------------------------------------------------- bug 4: --dtype's help
def test_run_dtype_help_says_the_plans_dtype_on_cuda():
    """memo-exec run's --dtype help said "default bf16 on CUDA"; `memo_exec.device.compute_dtype` takes the plan's
    model dtype on CUDA (an fp32 plan runs fp32 there)."""
    from memo_exec.cli import cli
    from memo_exec.device import DeviceSpec, compute_dtype

    opt = next(p for p in cli.commands["run"].params if p.name == "dtype")
    assert "default bf16 on CUDA" not in opt.help and "the plan's model dtype on CUDA" in opt.help, opt.help
    assert compute_dtype("fp32", DeviceSpec("cuda")) == torch.float32  # what the help says (no GPU needed)
    assert compute_dtype("bf16", DeviceSpec("cpu")) == torch.float32
