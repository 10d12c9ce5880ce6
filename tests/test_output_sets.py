"""[robust-runs] item 3 for `whatif`, `plot` and the sweeps: --out is checked writable before any
work, the outputs are staged beside it and committed as one set with the manifest last, and a
failure mid-write leaves the previous output exactly as it was (no stray file, no staging folder)."""

from __future__ import annotations

import errno
import os

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli as sim_cli

SHAPE = ["--layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512", "--vocab", "512", "--seq", "1K",
         "--gpus", "1", "--jobs", "1"]


def _ok(args):
    r = CliRunner().invoke(sim_cli, args)
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    _ok(["whatif", *SHAPE, "--policy", "memo", "--out", str(d / "memo")])
    _ok(["whatif", *SHAPE, "--policy", "sppo", "--out", str(d / "sppo")])
    _ok(["simulate", str(d / "memo" / "plan.json"), "--out", str(d / "sim")])
    return {"plan": str(d / "memo" / "plan.json"), "sppo": str(d / "sppo" / "plan.json"),
            "timeline": str(d / "sim" / "timeline.json")}


# (command line without --out, the function doing the work, the function writing its figure)
COMMANDS = {
    "whatif": (lambda i: ["whatif", *SHAPE, "--policy", "memo"], "memo_sim.search.whatif.rank",
               "memo_sim.cli.whatif.write_plan"),
    "plot": (lambda i: ["plot", i["timeline"]], "memo_sim.report.chrome_trace.write_chrome_trace",
             "memo_sim.report.figures.memory_figure"),
    "sweep-alpha": (lambda i: ["sweep-alpha", i["plan"], "--alphas", "0,1"], "memo_sim.engine.simulate.sweep_alpha",
                    "memo_sim.report.figures.alpha_sweep_figure"),
    "sweep-seq": (lambda i: ["sweep-seq", i["plan"], "--seqs", "1K", "--policy", "memo"],
                  "memo_sim.engine.simulate.simulate", "memo_sim.report.figures.mfu_vs_seq_figure"),
    "sweep-subseqs": (lambda i: ["sweep-subseqs", i["sppo"], "--subseqs", "1,2", "--no-simulate"],
                      "memo_sim.search.sppo.solve_point", "memo_sim.report.figures.subseq_sweep_figure"),
}


def _patch(monkeypatch, dotted: str, fn) -> None:
    import importlib

    mod, name = dotted.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(mod), name, fn)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (an unwritable folder even for root)")
@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_unwritable_out_fails_before_the_work(monkeypatch, inputs, cmd):
    args, work, _ = COMMANDS[cmd]

    def worked(*a, **k):
        raise AssertionError(f"{cmd} did its work although --out cannot be written")

    _patch(monkeypatch, work, worked)
    r = CliRunner().invoke(sim_cli, [*args(inputs), "--out", "/proc/nope/out"])
    assert r.exit_code in (1, 2), r.output
    assert r.output.startswith("error:") and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_a_failure_mid_write_leaves_the_previous_output(monkeypatch, tmp_path, inputs, cmd):
    args, _, figure = COMMANDS[cmd]
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("the previous run's manifest\n")
    (out / "old.txt").write_text("previous\n")
    real = _resolve(figure)

    def full(*a, **k):  # writes its file, then the disk is full
        real(*a, **k)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    _patch(monkeypatch, figure, full)
    r = CliRunner().invoke(sim_cli, [*args(inputs), "--out", str(out)])
    assert r.exit_code == 1 and "No space left on device" in r.output and "Traceback" not in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "old.txt"]
    assert (out / "manifest.json").read_text() == "the previous run's manifest\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it


def _resolve(dotted: str):
    import importlib

    mod, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(mod), name)


def test_plot_refusing_a_device_leaves_no_trace_json(inputs, tmp_path):
    r = CliRunner().invoke(sim_cli, ["plot", inputs["timeline"], "--out", str(tmp_path / "p"), "--device", "5"])
    assert r.exit_code == 2 and "device 5" in r.output, r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_outputs_are_one_set_with_a_manifest(inputs, tmp_path, cmd):
    import json

    args, _, _ = COMMANDS[cmd]
    _ok([*args(inputs), "--out", str(tmp_path / "o")])
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["complete"] and m["command"].startswith("memo-sim ")
    assert sorted(f["name"] for f in m["files"]) == sorted(p.name for p in (tmp_path / "o").iterdir()
                                                           if p.name != "manifest.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_simulate_refuses_an_out_clearly_too_small_before_simulating(monkeypatch, inputs, tmp_path):
    """[robust-runs] item 3: the outputs' size is estimated (a floor: figures and the timeline's
    events per layer) before any work; a file system with less free is one line, exit 2, nothing left."""
    import memo_sim.fileio as fileio
    from memo_sim.cli.simulate import simulate_output_floor

    _patch(monkeypatch, "memo_sim.engine.simulate.simulate", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(fileio, "disk_free_bytes", lambda path: simulate_output_floor(2) - 1)
    r = CliRunner().invoke(sim_cli, ["simulate", inputs["plan"], "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "free there and the outputs take at least" in r.output
    assert list(tmp_path.iterdir()) == []


def test_simulate_summary_is_the_same_for_identical_runs(inputs, tmp_path):
    """[robust-runs] item 3: summary.json of two identical `simulate` runs is byte-identical (it held
    the wall time before); so is the timeline."""
    for name in ("a", "b"):
        _ok(["simulate", inputs["plan"], "--out", str(tmp_path / name)])
    for f in ("summary.json", "timeline.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_a_rerun_leaves_its_own_outputs_and_the_manifest_lists_every_set(tmp_path):
    """Re-running a command into the same --out kept the outputs of its earlier option set that this run does not
    write (sweep-seq's seq_by_tp_mode.png, simulate's gantt.png of a single-stage plan), and a folder shared by
    several commands (the tour's '.') had a manifest listing only the last command's files, with no options or
    time (a review): an earlier output of the same command is removed, another command's stays listed with its
    command, a file no manifest listed is never touched."""
    import json

    from memo_sim.fileio import output_folder

    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("the user's own")
    with output_folder(out, "memo-sim sweep-seq") as f:
        (f.stage / "seq.png").write_text("1")
        (f.stage / "seq_by_tp_mode.png").write_text("1")
    with output_folder(out, "memo-sim whatif") as f:
        (f.stage / "plan.json").write_text("{}")
    with output_folder(out, "memo-sim sweep-seq") as f:
        (f.stage / "seq.png").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "mine.txt", "plan.json", "seq.png"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["written_utc"].endswith("Z") and m["removed_stale"] == ["seq_by_tp_mode.png"]
    assert {f["name"]: f["command"] for f in m["files"]} == {"seq.png": "memo-sim sweep-seq",
                                                             "plan.json": "memo-sim whatif"}


def test_a_rerun_never_removes_a_file_changed_since_it_was_written(tmp_path):
    """A re-run removed its earlier output because the manifest listed it, though the user had edited it since (a
    hand-edited plan-sppo.json, a review): only a file of the size and modification time the manifest recorded is
    an untouched earlier output; an edited one stays, listed as changed."""
    import json
    import os

    from memo_sim.fileio import output_folder

    out = tmp_path / "o"
    with output_folder(out, "memo-sim whatif") as f:
        (f.stage / "plan.json").write_text("{}")
        (f.stage / "plan-sppo.json").write_text("{}")
    (out / "plan-sppo.json").write_text('{"edited": true}')
    os.utime(out / "plan-sppo.json", ns=(1, 1))  # whatever the clock: not the time the manifest recorded
    with output_folder(out, "memo-sim whatif") as f:
        (f.stage / "plan.json").write_text("{}")
    assert (out / "plan-sppo.json").read_text() == '{"edited": true}'
    m = json.loads((out / "manifest.json").read_text())
    assert "removed_stale" not in m
    assert any(e["name"] == "plan-sppo.json" and e.get("changed_since_written") for e in m["files"])
