"""A run of several ranks draws its four figures once, with every rank (`memo_exec.report.rank_figures`), not
first with rank 0 and then over it (before 2026-12-05 rank 0 drew eight PNGs: about half the figure time of a
multi-rank run's rank 0, 112 s of CPU over the slow selection's memo-exec processes under py-spy); a figure that
fails with every rank is drawn with rank 0 alone, and the report says so.

Two ranks are stood in for by one: rank 0 of a one-process torchrun world whose payload is handed over twice (the
second as rank 1), so the multi-rank path runs in this process, where the drawings can be counted and broken."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_review_fixes_docs_dec1b import toy_plan, torchrun_env  # noqa: F401  (fixtures)


def _run_as_two_ranks(plan: Path, out: Path, monkeypatch, fail_every_rank_gantt: bool = False,
                      fail_rank0_gantt: bool = False, said: list | None = None) -> list[str]:
    import memo_exec.rank_payload as rank_payload
    import memo_exec.report as report
    from memo_exec.distributed.launch import run_rank
    from memo_exec.runner import RunOptions

    real_gantt = report.gantt_figure
    drawn: list[str] = []

    def two(payload):
        return [payload, {**payload, "rank": 1}]

    def gantt(tl, path, *a, devices=None, **k):
        drawn.append("every rank" if devices is not None else "rank 0")
        if fail_every_rank_gantt and devices is not None:
            raise RuntimeError("broken on purpose")
        if fail_rank0_gantt and devices is None:
            raise ValueError("rank 0's broken too")
        return real_gantt(tl, path, *a, devices=devices, **k)

    monkeypatch.setattr(rank_payload, "gather_payloads", two)
    monkeypatch.setattr(report, "gantt_figure", gantt)
    said = [] if said is None else said
    run_rank(str(plan), RunOptions(device="cpu", steps=1), str(out), True, 60.0, False,
             lambda m=None, err=False, **k: said.append(m))
    return drawn


def test_several_ranks_draw_each_figure_once_with_every_rank(tmp_path, toy_plan, torchrun_env, monkeypatch):
    out = tmp_path / "run"
    drawn = _run_as_two_ranks(toy_plan, out, monkeypatch)
    assert drawn == ["every rank"]  # timeline.png: once, with both ranks (before: rank 0's, then both)
    report = (out / "report.md").read_text()
    assert "The figures draw all 2 ranks" in report and "shows rank 0 only" not in report
    for name in ("timeline.png", "memory.png", "layers.png"):
        assert (out / name).stat().st_size > 0 and f"]({name})" in report, name
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"timeline.png", "memory.png", "layers.png"} <= {f["name"] for f in files}


def test_a_figure_that_fails_with_every_rank_is_rank_zeros(tmp_path, toy_plan, torchrun_env, monkeypatch):
    out = tmp_path / "run"
    drawn = _run_as_two_ranks(toy_plan, out, monkeypatch, fail_every_rank_gantt=True)
    assert drawn == ["every rank", "rank 0"]
    report = (out / "report.md").read_text()
    assert "timeline.png shows rank 0 only (RuntimeError: broken on purpose)" in report
    assert (out / "timeline.png").stat().st_size > 0 and "](timeline.png)" in report


def test_one_rank_draws_its_figures_in_write_outputs(tmp_path, toy_plan, torchrun_env, monkeypatch):
    import memo_exec.report as report
    from memo_exec.distributed.launch import run_rank
    from memo_exec.runner import RunOptions

    real = report.gantt_figure
    drawn: list = []
    monkeypatch.setattr(report, "gantt_figure",
                        lambda tl, p, *a, **k: drawn.append(k.get("devices")) or real(tl, p, *a, **k))
    run_rank(str(toy_plan), RunOptions(device="cpu", steps=1), str(tmp_path / "run"), True, 60.0, False,
             lambda m=None, err=False, **k: None)
    assert drawn == [None] and "The figures draw" not in (tmp_path / "run" / "report.md").read_text()


def test_the_other_ranks_import_no_figures():
    """What a rank other than 0 imports to run and send its payload draws nothing: no matplotlib."""
    import subprocess
    import sys

    code = ("import sys; import memo_exec.distributed.launch, memo_exec.distributed.runner, memo_exec.rank_payload; "
            "print('matplotlib' in sys.modules, 'memo_exec.report' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], (r.stdout, r.stderr[-2000:])


def test_a_figure_drawn_neither_way_is_named_not_drawn_and_not_listed(tmp_path, toy_plan, torchrun_env, monkeypatch):
    out, said = tmp_path / "run", []
    drawn = _run_as_two_ranks(toy_plan, out, monkeypatch, fail_every_rank_gantt=True, fail_rank0_gantt=True,
                              said=said)
    assert drawn == ["every rank", "rank 0"]
    report = (out / "report.md").read_text()
    assert ("timeline.png: not drawn (RuntimeError: broken on purpose; rank 0's alone: ValueError: rank 0's broken "
            "too)") in report
    assert not (out / "timeline.png").exists() and (out / "memory.png").exists()
    doc = json.loads(next(m for m in said if m and m.lstrip().startswith("{")))
    assert "timeline" not in doc["files"] and "memory" in doc["files"]
