"""A review of the outputs (2026-12-01): SPPO memory snapshots, memplan's offsets outside --json, the Gantt
axis's origin, and CSV's missing numbers and byte columns."""

from __future__ import annotations

import csv
import io
import json
import pickle
import re

import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.report.formats import Answer, render
from memo_sim.report.memory_snapshot import Allocation, _snapshot, trace_peak_bytes
from memo_sim.memplan.caching_allocator import AllocatorConfig

TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K"]


def _csv_rows(text: str) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(text)) if row and not row[0].startswith("#")]


# ---- 1: SPPO's memory snapshot ------------------------------------------------------------------------------
@pytest.mark.parametrize("pp, seq", [(1, "256K"), (2, "64K")])  # each best plan offloads (pp 1 at 64K does not)
def test_sppo_memory_snapshot_is_written_with_the_summary_peak(tmp_path, pp, seq):
    """`simulate --memory-snapshot` of any SPPO plan failed ("frees 'L0@s0.skeletal.offloaded' ... without an
    allocation", exit 2, nothing written): each pickle is written now and its trace peaks where summary.json's
    stage peaks."""
    w, s = tmp_path / "w", tmp_path / "s"
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "2", "--gpus", "8", "--seq", seq,
                                 "--policy", "sppo", "--pp", str(pp), "--jobs", "1", "--out", str(w)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", str(w / "plan.json"), "--out", str(s), "--memory-snapshot"])
    assert r.exit_code == 0, r.output
    summary = json.loads((s / "summary.json").read_text())
    peaks = [st["peak_gpu_bytes"] for st in summary["pipeline"]["stages"]]
    pickles = sorted(s.glob("memory_snapshot*.pickle"))
    assert len(pickles) == pp == len(peaks)
    for f, peak in zip(pickles, peaks):
        assert trace_peak_bytes(pickle.loads(f.read_bytes())) == int(round(peak)), f
    assert max(peaks) == summary["peak_gpu_bytes"]


def test_a_free_without_its_allocation_is_an_internal_error_not_bad_input():
    """The simulator's own events freeing what they never allocated is a bug in memo, not the user's input
    (it was a MemoError: one line, exit 2, as for a bad flag)."""
    stream = [Allocation(0.0, "a", 1024.0, None, "static"), Allocation(1.0, "b", -1024.0, 0, "fwd")]
    with pytest.raises(RuntimeError, match="internal error") as e:
        _snapshot(stream, AllocatorConfig(capacity_bytes=1 << 40), 0)
    assert not isinstance(e.value, MemoError)


# ---- 2: memplan's offsets in every format --------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["table", "csv", "md"])
def test_memplan_of_a_csv_prints_its_offsets_in_every_format(tmp_path, fmt):
    """`memplan --csv problem.csv` (the README's) printed the offsets, the DSA problem's answer, only in --json."""
    problem = tmp_path / "problem.csv"
    problem.write_text("id,lower,upper,size\na,0,2,4096\nb,1,3,8192\nc,2,4,4096\n")
    r = CliRunner().invoke(cli, ["memplan", "--csv", str(problem), "--json"])
    assert r.exit_code == 0, r.output
    offsets = json.loads(r.stdout)["offsets"]
    sizes = {"a": 4096, "b": 8192, "c": 4096}
    assert json.loads(r.stdout)["sizes"] == sizes  # --json too: each buffer's size beside its offset (a review)
    r = CliRunner().invoke(cli, ["memplan", "--csv", str(problem), "--format", fmt])
    assert r.exit_code == 0, r.output
    if fmt == "csv":
        rows = _csv_rows(r.stdout)
        i = rows.index(["tensor", "offset (bytes)", "size (bytes)"])
        got = {row[0]: (int(row[1]), int(row[2])) for row in rows[i + 1:i + 4]}
    else:
        pat = r"^\|? *([abc]) *\|? *(\d+) *\|? *(\d+) *\|?$"
        got = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(pat, r.stdout, re.M)}
    assert got == {t: (offsets[t], sizes[t]) for t in sizes}, r.stdout


# ---- 3: the Gantt panel's origin -----------------------------------------------------------------------------
def test_gantt_axis_origin_is_printed_in_the_panels_unit_to_its_span():
    """A panel from 0.909 ms over 0.5 ms read "us from 0.001 s" (the origin off by 9% of the span)."""
    from memo_sim.report.figures import _gantt_panel, time_unit

    for t0, t1 in ((0.909e-3, 1.409e-3), (1.4262, 1.4267), (47.25, 47.9), (0.0, 3.2)):
        ax = Figure().add_subplot()
        _gantt_panel(ax, [], ["compute"], t0, t1)
        scale, unit = time_unit(t1 - t0)
        m = re.fullmatch(rf"{unit} from ([0-9,.]+) {unit}", ax.get_xlabel())
        assert m, ax.get_xlabel()
        assert abs(float(m.group(1).replace(",", "")) * scale - t0) <= 1e-3 * (t1 - t0), (ax.get_xlabel(), t0)


# ---- 4 and 5: CSV's missing numbers and byte columns ------------------------------------------------------------
def test_csv_missing_numbers_are_empty_in_every_number_column():
    """sweep-seq's CSV had `...,OOM,sim,,,-,,caching allocator,,,-`: a failed run's TGS (a number without a unit)
    '-' beside empty cells; every number column writes a missing number empty, a word column stays."""
    a = Answer("answer: x")
    a.table(["seq", "status", "tier", "iter (sim)", "MFU", "TGS", "peak GPU (sim)", "alpha", "allocator stalls"],
            [["256K", "OK", "sim", "2.63 s", "45.3%", "1,234", "4.13 GiB", "0.855", "not replayed"],
             ["1M", "OOM", "sim", "-", "-", "-", "-", "-", "-"]])
    rows = _csv_rows(render(a, "csv"))
    assert rows[1][3:8] == ["2.63", "45.3", "1234", "4.13", "0.855"], rows
    assert rows[2] == ["1M", "OOM", "sim", "", "", "", "", "", "-"], rows


def test_csv_byte_columns_keep_the_printed_digits_in_a_named_unit():
    """check-plan's CSV wrote 'model states' 2276332667 (2.12 GiB times 2**30) where JSON says 2275605504: a byte
    column is written in the largest unit it prints, each cell to its own printed digits, never a made-up integer."""
    a = Answer("answer: x")
    a.table(["term", "size"], [["model states", "2.12 GiB"], ["lse", "102.44 MiB"], ["none", "0 B"]])
    rows = _csv_rows(render(a, "csv"))
    assert rows == [["term", "size (GiB)"], ["model states", "2.12"], ["lse", "0.10004"], ["none", "0"]]
    b = Answer("answer: x")
    b.table(["tensor", "size"], [["a", "12.00 KiB"], ["b", "512 B"]])
    assert _csv_rows(render(b, "csv")) == [["tensor", "size (KiB)"], ["a", "12.00"], ["b", "0.5"]]


def test_check_plan_csv_memory_column_reads_the_tables_digits(tmp_path):
    """Through the CLI: every cell of check-plan's CSV memory column is the aligned table's printed number."""
    out = tmp_path / "toy"
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--gpus", "1", "--policy", "memo", "--alpha", "0.3", "--jobs", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = CliRunner().invoke(cli, ["check-plan", str(out / "plan.json")]).stdout
    r = CliRunner().invoke(cli, ["check-plan", str(out / "plan.json"), "--format", "csv"])
    assert r.exit_code == 0, r.output
    block = r.stdout.split("# GPU memory per GPU:\n", 1)[1].split("\n#", 1)[0]
    rows = list(csv.reader(io.StringIO(block)))
    j = next(i for i, h in enumerate(rows[0]) if h.startswith("size ("))
    unit = rows[0][j][len("size ("):-1]
    assert unit in ("KiB", "MiB", "GiB", "TiB"), rows[0]
    line = next(ln for ln in text.splitlines() if ln.startswith("usable GPU memory"))
    printed = re.search(r"([0-9.]+) " + unit, line)
    usable = next(row[j] for row in rows if row[0] == "usable GPU memory")
    assert printed and usable == printed.group(1), (line, usable)
