"""A review's bad-input findings of 2026-12-01 (memo-exec trace / validate / calibrate, memo_sim.fileio): each bad
input is one line naming the option and its fix, exit status 2, no traceback, refused before any work and before
any file is written; an output path that is a device, a named pipe or a symbolic link is not replaced by a file.

Every node these tests make (named pipes, device nodes, links) lies in pytest's tmp_path."""

import json
import os

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_sim.cli import cli as sim_cli  # noqa: E402

PROFILE = "h100-sxm5-80gb"  # a GPU profile: a CPU validation is not recorded in it (no profile file written)


def _one_line(r, code: int = 2) -> str:
    assert r.exit_code == code and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.output


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The review's toy plan (2 layers, hidden 256, MEMO at alpha 0.3)."""
    out = tmp_path_factory.mktemp("toy")
    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                     "--vocab", "1024", "--seq", "1K", "--gpus", "1", "--policy", "memo", "--alpha",
                                     "0.3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def _trace(plan, *args):
    return CliRunner().invoke(exec_cli, ["trace", str(plan), *map(str, args)])


# ------------------------------------------------------------------- 1. outputs that are devices, pipes, links
def test_trace_out_on_a_named_pipe_is_refused_and_left_as_it_is(toy, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    line = _one_line(_trace(toy, "--out", fifo))
    assert line.startswith(f"error: --out {fifo}: is a named pipe (FIFO), not a regular file"), line
    assert "give the path of a regular file" in line
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]


def test_trace_out_on_a_character_device_is_refused(toy, tmp_path):
    """The review's ``mknod fakenull c 1 3``: made in tmp_path (skipped where mknod is not allowed)."""
    dev = tmp_path / "fakenull"
    try:
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR: a copy of /dev/null's node
    except (PermissionError, OSError) as e:
        pytest.skip(f"mknod not allowed here ({e})")
    line = _one_line(_trace(toy, "--out", dev))
    assert line.startswith(f"error: --out {dev}: is a character device, not a regular file"), line
    assert dev.is_char_device()


def test_trace_out_through_a_symlink_writes_its_target_and_keeps_the_link(toy, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to("real.json")
    r = _trace(toy, "--out", link)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert json.loads(real.read_text())["format"] == "memo-trace"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_atomic_writes_follow_links_and_refuse_other_nodes(tmp_path):
    """Every writer that goes through memo_sim.fileio (plans, traces, reports, profiles)."""
    from memo_sim.fileio import NotAFileError, atomic_write_text

    (tmp_path / "t.txt").write_text("a")
    (tmp_path / "l.txt").symlink_to(tmp_path / "t.txt")
    assert atomic_write_text(tmp_path / "l.txt", "b") == tmp_path / "l.txt"
    assert (tmp_path / "l.txt").is_symlink() and (tmp_path / "t.txt").read_text() == "b"
    os.mkfifo(tmp_path / "f")
    with pytest.raises(NotAFileError, match="named pipe"):
        atomic_write_text(tmp_path / "f", "x")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    with pytest.raises(NotAFileError, match="loops"):
        atomic_write_text(tmp_path / "loop1", "x")
    with pytest.raises(IsADirectoryError):
        atomic_write_text(tmp_path, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "l.txt", "loop1", "loop2", "t.txt"]


def test_trace_write_plan_on_a_named_pipe_is_refused_before_the_trace(toy, tmp_path):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    line = _one_line(_trace(toy, "--out", tmp_path / "t.json", "--write-plan", fifo))
    assert line.startswith(f"error: --write-plan {fifo}: is a named pipe"), line
    assert not (tmp_path / "t.json").exists() and fifo.is_fifo()


# ------------------------------------------------------------------------------ 2. trace refuses what run refuses
def test_trace_refuses_a_latent_attention_plan_as_run_does(tmp_path):
    # (latent attention on one rank runs since 2026-12-03: its TP 2 plan is what run refuses)
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "deepseek-v2-lite", "--layers", "2", "--gpus", "2", "--tp",
                                     "2", "--seq", "2K", "--profile", "h200-141gb", "--out", str(tmp_path / "g")])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "g" / "plan.json"
    run = _one_line(CliRunner().invoke(exec_cli, ["run", str(plan), "--device", "cpu", "--out", str(tmp_path / "r")]))
    line = _one_line(_trace(plan, "--out", tmp_path / "t.json"))
    assert "kv_lora_rank" in line and "latent attention" in line and line == run, (line, run)
    assert not (tmp_path / "t.json").exists()


# --------------------------------------------------------------------- 3, 8. validate's model sizes and lists
@pytest.fixture
def no_validation(monkeypatch):
    """Fail the test (exit status 1 with this exception) if validate gets as far as planning or running."""
    import memo_exec.validate as v

    def ran(*a, **k):
        raise RuntimeError("validate went on to plan and run")

    monkeypatch.setattr(v, "plan_set", ran)
    monkeypatch.setattr(v, "validate", ran)


def _validate(tmp_path, *args):
    return CliRunner().invoke(exec_cli, ["validate", "--profile", PROFILE, "--device", "cpu",
                                         "--out", str(tmp_path / "v"), *map(str, args)])


@pytest.mark.parametrize("flag", ["--hidden", "--heads", "--ffn", "--vocab"])
@pytest.mark.parametrize("value", ["0", "-4"])
def test_validate_refuses_a_model_size_below_one(tmp_path, no_validation, flag, value):
    line = _one_line(_validate(tmp_path, flag, value))
    assert f"'{flag}'" in line and "not in the range x>=1" in line, line
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("flag, text, what", [("--seqs", "1K,,2K", "length"), ("--seqs", "1K,", "length"),
                                              ("--alphas", "0.25,,0.5", "alpha"), ("--policies", "memo,,store_all",
                                                                                  "policy")])
def test_validate_refuses_an_empty_item_between_commas(tmp_path, no_validation, flag, text, what):
    line = _one_line(_validate(tmp_path, flag, text))
    assert line.startswith(f"error: {flag} {text!r}: an empty {what} between commas; give a list like "), line


# ------------------------------------------------------------------------ 4, 5. validate's output paths up front
def test_validate_report_that_cannot_be_written_is_refused_before_any_work(tmp_path, no_validation):
    (tmp_path / "afile").write_text("")
    line = _one_line(_validate(tmp_path, "--report", tmp_path / "afile" / "r.md"))
    assert line.startswith(f"error: --report {tmp_path / 'afile' / 'r.md'}: cannot write there "
                           f"({tmp_path / 'afile'} is a file, not a folder)"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no --out, plans/ or runs/


def test_validate_report_in_a_read_only_folder_is_refused(tmp_path, monkeypatch, no_validation):
    """A read-only folder (the tests run as root, which chmod cannot stop: os.access answers as a read-only mount)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(ro) else real(p, mode, **kw))
    line = _one_line(_validate(tmp_path, "--report", ro / "r.md"))
    assert line.startswith(f"error: --report {ro / 'r.md'}: cannot write there ({ro} is read-only"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]


def test_validate_api_checks_its_outputs_before_running(tmp_path):
    from memo_exec.validate import TOY_MODEL, PlanSpec, validate
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile

    (tmp_path / "afile").write_text("")

    def runner(*a, **k):
        raise RuntimeError("ran a plan")

    from memo_sim.errors import MemoError

    with pytest.raises(MemoError, match="--report"):
        validate(TOY_MODEL, load_profile(PROFILE), [PlanSpec(1024, get_policy("store_all"))], device="cpu", steps=1,
                 out_dir=tmp_path / "v", report_path=tmp_path / "afile" / "r.md", command="", runner=runner)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_validate_out_under_a_file_is_refused_as_run_refuses_it(tmp_path, toy, no_validation):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub"
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", PROFILE, "--device", "cpu", "--out", str(out)])
    line = _one_line(r)
    want = f"error: --out {out}: cannot write there ({tmp_path / 'afile'} is a file, not a folder); choose a folder"
    assert line.startswith(want), line
    run = _one_line(CliRunner().invoke(exec_cli, ["run", str(toy), "--device", "cpu", "--out", str(out)]))
    assert run.startswith(want), run


# --------------------------------------------------------------------- 6. trace's --cuda-history, --write-plan
def test_trace_cuda_history_without_cuda_is_refused_before_writing(toy, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --cuda-history can record here")
    line = _one_line(_trace(toy, "--out", tmp_path / "tr3.json", "--cuda-history", tmp_path / "ch.json"))
    assert line.startswith("error: --cuda-history records the CUDA caching allocator, which needs a CUDA device"), line
    assert "--device cpu" not in line and not list(tmp_path.iterdir())


def test_trace_cuda_history_on_cpu_names_the_device_it_needs(toy, tmp_path):
    line = _one_line(_trace(toy, "--device", "cpu", "--out", tmp_path / "t.json", "--cuda-history",
                            tmp_path / "ch.json"))
    assert line.startswith("error: --cuda-history records the CUDA caching allocator: it needs --device cuda"), line
    assert not list(tmp_path.iterdir())


def test_trace_write_plan_that_cannot_be_written_is_refused_before_the_trace(toy, tmp_path):
    (tmp_path / "afile").write_text("")
    line = _one_line(_trace(toy, "--out", tmp_path / "tr2.json", "--write-plan", tmp_path / "afile" / "p.json"))
    assert line.startswith(f"error: --write-plan {tmp_path / 'afile' / 'p.json'}: cannot write there"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# ----------------------------------------------------------------------- 7. calibrate's outputs before measuring
@pytest.mark.parametrize("where", ["out-dir", "raw-out"])
def test_calibrate_output_paths_are_checked_before_measuring(tmp_path, monkeypatch, where):
    import memo_exec.calibrate.suite as suite

    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: pytest.fail("measured before checking its outputs"))
    (tmp_path / "afile").write_text("")
    bad = tmp_path / "afile" / "sub"
    args = ["calibrate", "--device", "cpu", "--quick", "--no-collectives", "--base", "a800-80gb", "--name", "t9",
            "--out-dir", str(bad if where == "out-dir" else tmp_path / "profiles")]
    if where == "raw-out":
        args += ["--raw-out", str(bad / "raw.json")]
    line = _one_line(CliRunner().invoke(exec_cli, args))
    shown = bad if where == "out-dir" else bad / "raw.json"
    assert line.startswith(f"error: --{where} {shown}: cannot write there ({tmp_path / 'afile'} is a file"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
