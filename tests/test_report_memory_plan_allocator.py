"""A static memory plan's caching-allocator numbers in the reports (h2).

A single-stage memory plan's fit and stalls are decided by the whole-iteration caching-allocator replay beside its
arena (`memo_sim.memplan.iteration_replay.engine_replay`; summary.json's ``allocator`` block with
``static_memory_plan`` true, `memo_sim.engine.result.allocator_summary`), but the what-if's frag/retries cell,
sweep-seq's allocator-stalls column and the memory figure's allocator levels still read "-" (or drew nothing) for
memory plans as if no replay ran. A micro-batch pipeline's run has no replay (``"replayed": False``) and keeps its
"-" / "not replayed" / no levels. The layer graph's empty ``IN_ROUNDING_BUFFER`` is gone, nothing reads it."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

import memo_sim.memplan.iteration_requests as iteration_requests
import memo_sim.model.layer_graph as layer_graph
from memo_sim.cli import cli
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy.registry import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.report import figures
from memo_sim.report.sweep_text import _stalls
from memo_sim.report.whatif_answer import allocator_cell
from memo_sim.units import fmt_time

K = 1024
GiB = 1 << 30
SMALL = ["--model", "gpt-7b", "--layers", "2", "--seq", "16K", "--policy", "memo", "--jobs", "1"]
PIPELINE_STUB = {"static_memory_plan": True, "reorganizations": 0, "stall_s": 0.0, "replayed": False}


def _run(args, code=0):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


@pytest.fixture(scope="module")
def memo_run():
    """Two layers of GPT-7B at 16K under MEMO on one GPU: a single-stage memory plan, replayed."""
    m = replace(get_model("gpt-7b"), layers=2)
    r = simulate(m, Layout(), 1, 16 * K, get_policy("memo", 0.3), load_profile("a800-80gb"))
    a = r.allocator
    assert r.ok and a["static_memory_plan"] is True and a["fragmentation_at_peak"] is not None
    return r


@pytest.fixture(scope="module")
def memo_plan(tmp_path_factory):
    """The what-if's answer and plan.json of the same two-layer MEMO plan."""
    out = tmp_path_factory.mktemp("memo")
    r = _run(["whatif", *SMALL, "--gpus", "1", "--out", out])
    return r.output, out / "plan.json"


def _row(output: str, label: str) -> list[str]:
    line = next(ln for ln in output.splitlines() if re.match(rf"\d+\s+{re.escape(label)}\s", ln))
    return line.split()


def test_answer_cell_shows_a_memory_plans_replay(memo_run, memo_plan):
    """The frag/retries cell of a memory plan reads its replay's share and retries (was "-"), the table's title
    says the share counts the arena as reserved and allocated; a run without a replay still reads "-"."""
    a = memo_run.allocator
    want = f"{100 * a['fragmentation_at_peak']:.1f}% / {a['reorganizations']}"
    assert allocator_cell({"allocator": a}) == want
    assert allocator_cell({"allocator": PIPELINE_STUB}) == "-"
    output, _plan = memo_plan
    row = _row(output, "tp1")
    assert "mem plan" in " ".join(row) and re.search(r"\d+\.\d% / \d+", " ".join(row)), output
    assert "a memory plan's frag/retries: the replay of the tensors outside its arena" in output


def test_a_pipelines_memory_plan_has_no_replay_and_keeps_its_dash(tmp_path):
    """A micro-batch pipeline's memory plan is not replayed (`memo_sim.engine.schedules.microbatch`): "-", and
    the title has no words for memory-plan cells."""
    r = _run(["whatif", *SMALL, "--gpus", "2", "--pp", "2", "--tp", "1", "--cp", "1", "--out", tmp_path])
    head = next(ln for ln in r.output.splitlines() if ln.startswith("#  layout"))
    col = head.index("frag/retries")
    rows = [ln for ln in r.output.splitlines() if re.match(r"\d+\s+tp1-pp2", ln)]
    assert rows and all(ln[col:col + len("frag/retries")].strip() == "-" for ln in rows), r.output
    assert "a memory plan's frag/retries" not in r.output


def test_sweep_seq_stalls_show_a_memory_plans_replay(memo_run, memo_plan, tmp_path):
    """sweep-seq's allocator-stalls column of a memory plan reads the replay's reorganisations and stall (was "-"),
    with a note that they are the tensors outside the arena; a pipeline's reads "not replayed", a memory plan's
    summary without replay counts "-"."""
    a = memo_run.allocator
    assert _stalls(memo_run) == f"{a['reorganizations']} reorg., {fmt_time(a['stall_s'])}"
    assert _stalls(SimpleNamespace(allocator=PIPELINE_STUB)) == "not replayed"
    stub = {k: v for k, v in PIPELINE_STUB.items() if k != "replayed"}
    assert _stalls(SimpleNamespace(allocator=stub)) == "-"
    _output, plan = memo_plan
    r = _run(["sweep-seq", plan, "--out", tmp_path, "--seqs", "8K", "--policy", "memo", "--jobs", "1",
              "--no-progress"])
    row = next(ln for ln in r.output.splitlines() if ln.lstrip().startswith("8K"))
    assert "memory plan" in row and re.search(r"\d+ reorg\., [\d.]+ [mun]?s\s*$", row), r.output
    assert "allocator stalls of a memory plan: the caching allocator's, replayed for the tensors outside" in r.output


def test_memory_figure_draws_a_memory_plans_allocator_levels(memo_run):
    """The memory figure's reserved and allocated levels of a memory plan are its replay's (nothing was drawn),
    labelled as the arena plus the caching allocator beside it; a run without a replay draws none."""
    a = memo_run.allocator
    ax = Figure().subplots()
    figures._allocator_levels(ax, a)
    levels = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
    assert len(levels) == 2, levels
    reserved = next(k for k in levels if "peak reserved" in k)
    allocated = next(k for k in levels if k.startswith("peak allocated"))
    assert levels[reserved] == pytest.approx(a["peak_reserved_bytes"] / GiB)
    assert levels[allocated] == pytest.approx(a["peak_allocated_bytes"] / GiB)
    assert "arena" in reserved and f"{100 * a['fragmentation_at_peak']:.1f}%" in allocated
    assert "outside the arena" in allocated
    empty = Figure().subplots()
    figures._allocator_levels(empty, {**a, "replayed": False})
    assert not empty.get_lines()


def test_in_rounding_buffer_is_gone():
    """The empty tuple kept for one import: removed, and the importer no longer reads it."""
    assert not hasattr(layer_graph, "IN_ROUNDING_BUFFER")
    assert not hasattr(iteration_requests, "IN_ROUNDING_BUFFER")
