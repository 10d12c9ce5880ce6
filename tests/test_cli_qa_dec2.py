"""QA review of Dec 2: export refuses an unwritable --out before the framework's search (as whatif and the sweeps
do, through one helper: `memo_sim.cli.common.refuse_unwritable_out`), and whatif's CSV carries the lines the
table format prints below the table (--train-tokens' answer, best and runner-up) as ``#`` comment lines."""

from __future__ import annotations

import csv
import io

import pytest
from click.testing import CliRunner

import memo_sim.cli.export as export_cli
from memo_sim.cli import cli
from memo_sim.report.formats import Answer, render

TOY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512", "--vocab", "1000"]


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--seq", "4K", "--gpus", "2", "--jobs", "1", "--simulate-top", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return str(out / "plan.json")


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "deepspeed"])
def test_export_refuses_an_unwritable_out_before_the_search(toy_plan, tmp_path, monkeypatch, framework):
    """A review: export searched a DeepSeek-V3 plan's framework plans for 69 s, then refused --out /dev/null/x."""
    def no_work(*args, **kwargs):
        raise AssertionError("the work ran before --out was checked")

    monkeypatch.setattr(export_cli, "export_plan", no_work)  # the framework's search and the files
    monkeypatch.setattr(export_cli, "_warn_if_stale", no_work)  # the stale check's simulation
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    r = CliRunner().invoke(cli, ["export", toy_plan, "--to", framework, "--out", str(afile / "x")])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and "cannot write there" in lines[0], r.output
    assert "Traceback" not in r.output and "searching" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing left behind


def test_export_still_writes_a_writable_out(toy_plan, tmp_path):
    r = CliRunner().invoke(cli, ["export", toy_plan, "--to", "torchtitan", "--out", str(tmp_path / "ex"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ex" / "manifest.json").is_file()
    assert not [p for p in (tmp_path / "ex").iterdir() if p.name.endswith(".partial")]  # the early check's stage


def _data(text: str) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(text)) if row and not row[0].startswith("#")]


def test_whatif_csv_carries_the_lines_below_the_table():
    """A review: `whatif ... --format csv --train-tokens 100B` printed the table alone; md and --json carried the
    training time and the best / runner-up lines."""
    base = ["whatif", *TOY, "--seq", "4K", "--gpus", "2", "--no-plan", "--jobs", "1", "--simulate-top", "1",
            "--train-tokens", "1B", "--top", "5", "--no-progress"]
    text = CliRunner().invoke(cli, base).output
    r = CliRunner().invoke(cli, base + ["--format", "csv"])
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    train = next(ln for ln in text.splitlines() if ln.strip().startswith("training 1B tokens"))
    best = next(ln for ln in text.splitlines() if ln.startswith("best: "))
    assert f"# {train}" in out and f"# {best}" in out, r.stdout
    head = next(i for i, ln in enumerate(out) if ln.startswith("rank,layout,policy"))
    below = out.index(f"# {best}")
    assert below > head and all(ln.startswith("# ") for ln in out[below:]), r.stdout  # after the rows, as comments
    rows = _data(r.stdout)  # a CSV reader that skips the comments reads the table unchanged
    assert rows[0][:3] == ["rank", "layout", "policy"] and len(rows) > 1
    assert all(len(row) == len(rows[0]) for row in rows), rows
    table_rows = [ln for ln in text.splitlines() if ln[:1].isdigit() and "  " in ln]
    assert [row[0] for row in rows[1:]] == [ln.split()[0] for ln in table_rows], (rows, table_rows)


def test_csv_writes_each_text_line_as_a_comment_where_the_table_format_prints_it():
    a = Answer("answer: x")
    a.line("above")
    a.table(["a", "b"], [["1", "2"]], title="t")
    a.line("below\n  indented\n")
    a.line("")
    assert render(a, "csv").splitlines() == ["# answer: x", "# above", "# t", "a,b", "1,2", "# below", "#   indented"]
