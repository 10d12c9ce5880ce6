"""[answers #30 item 6] Output formats: one module renders every command's tables as aligned text,
CSV or Markdown; units that read for toy models; plurals; narrow maxseq; a human memplan."""

from __future__ import annotations

import csv
import io
import json
import re

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.report.formats import Answer, fmt_params, plural, render

TOY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512", "--vocab", "1000"]


def test_params_and_plurals_read():
    assert fmt_params(8.03e9) == "8.03B" and fmt_params(524_800) == "524.8K" and fmt_params(110.5e6) == "110.5M"
    assert plural(1, "candidate") == "1 candidate" and plural(3, "candidate") == "3 candidates"


def test_one_answer_three_formats():
    a = Answer("answer: x")
    a.table(["a", "b|c"], [["1", "2"]], title="t")
    assert render(a, "table").splitlines()[0] == "answer: x"
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in render(a, "csv").splitlines()
                                                     if not ln.startswith("#")))))
    assert rows == [["a", "b|c"], ["1", "2"]]
    assert "| a | b\\|c |" in render(a, "md")


def test_whatif_formats_and_toy_params():
    base = ["whatif", *TOY, "--seq", "4K", "--gpus", "2", "--no-plan", "--jobs", "1", "--simulate-top", "1"]
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("answer: ") and "0.00B" not in r.output and "K params" in r.output
    assert not re.search(r"\b1 candidates", r.output)  # a plural count (a substring test read "21 candidates")
    assert json.loads(CliRunner().invoke(cli, base + ["--format", "json"]).output)["candidates"]
    md = CliRunner().invoke(cli, base + ["--format", "md"]).output
    assert md.startswith("**answer: ") and "|---|" in md
    out = CliRunner().invoke(cli, base + ["--format", "csv"]).output
    # the rank column reads 'rank': a header starting with '#' was dropped with the '# title' comment lines
    data = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert any(ln.startswith("rank,layout,policy") for ln in data), out


def test_maxseq_fits_100_columns_and_memplan_reads():
    r = CliRunner().invoke(cli, ["maxseq", *TOY, "--gpus", "1", "--policy", "store_all", "--step", "16K"])
    assert r.exit_code == 0, r.output
    assert max(len(ln) for ln in r.output.splitlines()) <= 100, r.output
    r = CliRunner().invoke(cli, ["memplan", *TOY, "--seq", "4K", "--tp", "1", "--time-limit", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("answer: ") and "{" not in r.output and "level 1 fwd" in r.output


def test_csv_columns_are_plain_numbers_in_one_unit():
    """`--format csv` cells carried units as text, mixed within a column ('53.98 ms' beside '2.63 s', '4.13 GiB'
    beside '102.44 MiB', '45.3%', a review): a column of numbers with units is written in one unit, named in its
    header; a '-' is empty; a column of words stays as it is."""
    a = Answer("answer: x")
    a.table(["#", "iter", "peak GPU", "MFU", "status"], [["1", "53.98 ms", "4.13 GiB", "45.3%", "OK"],
                                                          ["2", "2.63 s", "102.44 MiB", "-", "OOM +1.00 GiB"]])
    text = "\n".join(ln for ln in render(a, "csv").splitlines() if not ln.startswith("#"))
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["rank", "iter (s)", "peak GPU (GiB)", "MFU (%)", "status"]  # bytes: the largest unit printed
    assert rows[1] == ["1", "0.05398", "4.13", "45.3", "OK"]
    assert rows[2] == ["2", "2.63", "0.10004", "", "OOM +1.00 GiB"]  # 102.44 MiB to its own 5 digits
