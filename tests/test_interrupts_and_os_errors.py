"""[robust-runs] Ctrl-C exits 130 with one line; an operating-system error (read-only or missing
output folder, a full disk) is one line and exit 1, never a traceback; nothing half-written."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_sim.cli import cli as sim_cli

def _sigint_as_a_terminal_sends_it() -> None:
    """Child set-up: SIGINT's default action, whatever the test process inherited (a shell starts a
    background job with SIGINT ignored, and Python installs its KeyboardInterrupt handler only
    where SIGINT is not ignored; `timeout`, which .ci/run starts pytest under, resets it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TOY = ["whatif", "--layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512", "--vocab", "512", "--seq", "1K",
       "--gpus", "1", "--policy", "store_all", "--jobs", "1"]


def test_sigint_exits_130_with_one_line(tmp_path):
    """A real SIGINT to a running memo-sim (a search long enough to be interrupted: 64 GPUs at 64K reach
    its progress label ('what-if') in 4.5 s on the idle 2-core VM, 1,024 at 256K took 11.7 s; either then simulates for 20 s and more)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "memo_sim.cli", "whatif", "--model", "gpt-175b", "--gpus", "64",
                          "--seq", "64K", "--simulate-top", "10000", "--jobs", "1", "--no-plan", "--progress"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0,
                         preexec_fn=_sigint_as_a_terminal_sends_it)
    try:
        first = p.stderr.readline()  # the progress label: the search is under way (unbuffered: nothing held back)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        err = first + err
    finally:
        p.kill()
    assert p.returncode == 130, err.decode()[-2000:]
    assert first == b"what-if\n"
    assert err.decode().strip().splitlines()[-1] == "interrupted" and b"Traceback" not in err
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def _toy_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    r = CliRunner().invoke(sim_cli, TOY + ["--out", str(base)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(exec_cli, ["run", str(base / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(base / "run")])
    assert r.exit_code == 0, r.output
    return base


@pytest.fixture
def toy_run(tmp_path, _toy_base):
    """A toy plan and an --out folder holding a previous complete run (its files and manifest),
    copied for each test from one run per module."""
    import shutil

    shutil.copy(_toy_base / "plan.json", tmp_path / "plan.json")
    out = tmp_path / "run"
    shutil.copytree(_toy_base / "run", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "manifest.json" in before and "report.md" in before
    return tmp_path / "plan.json", out, before


def _untouched(out, before) -> None:
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def _run(plan, out):
    return CliRunner().invoke(exec_cli, ["run", str(plan), "--device", "cpu", "--steps", "2", "--out", str(out)])


def _raise(exc):
    def f(*a, **k):
        raise exc
    return f


@pytest.mark.parametrize("where", ["run", "write"])
def test_interrupt_mid_run_or_mid_write_leaves_the_previous_output(monkeypatch, toy_run, where):
    """[robust-runs] Ctrl-C while training or while the outputs are written: exit 130, one line,
    --out exactly as the previous run left it, no staging folder left behind."""
    import memo_exec.report as report
    import memo_exec.runner as runner

    plan, out, before = toy_run
    if where == "run":
        monkeypatch.setattr(runner, "run_steps", _raise(KeyboardInterrupt))
    else:
        real = report.atomic_write_text

        def half(path, text):  # the first files are written, then the interrupt comes
            if str(path).endswith("report.md"):
                raise KeyboardInterrupt
            return real(path, text)
        monkeypatch.setattr(report, "atomic_write_text", half)
    r = _run(plan, out)
    assert r.exit_code == 130 and r.output.strip().splitlines()[-1] == "interrupted"
    _untouched(out, before)


def test_disk_full_while_writing_outputs(monkeypatch, toy_run):
    import memo_sim.fileio as fileio

    plan, out, before = toy_run
    with monkeypatch.context() as m:
        m.setattr(fileio.os, "fsync", _raise(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
        r = _run(plan, out)
    assert r.exit_code == 1 and "No space left on device" in r.output and r.output.count("\n") == 1, r.output
    _untouched(out, before)


def test_unwritable_run_out_fails_before_training(monkeypatch, toy_run):
    import memo_exec.runner as runner

    plan, _, _ = toy_run
    monkeypatch.setattr(runner, "run_steps", _raise(AssertionError("trained although --out cannot be written")))
    r = _run(plan, "/proc/nope/run")
    assert r.exit_code == 2 and r.output.startswith("error: --out /proc/nope/run: cannot write there") \
        and r.output.count("\n") == 1, r.output


def test_non_finite_loss_stops_with_one_line(monkeypatch, toy_run):
    """[robust-runs] --lr that is finite but wrecks training: the run stops at the first NaN/inf
    loss with one line naming the step and the last finite loss; --out untouched."""
    from memo_exec.measure import StepRecord
    import memo_exec.runner as runner

    plan, out, before = toy_run
    real = runner.Executor.step

    def poisoned(self, k, optimizer=True):
        rec = real(self, k, optimizer)
        return StepRecord(**{**rec.__dict__, "loss": float("nan")}) if k == 1 else rec
    monkeypatch.setattr(runner.Executor, "step", poisoned)
    r = _run(plan, out)
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert r.output.startswith("error: step 1: the loss is nan (the last finite loss was ")
    _untouched(out, before)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0 and not os.path.exists("/proc/self"),
                    reason="needs /proc")
def test_unwritable_out_is_one_line(tmp_path):
    r = CliRunner().invoke(sim_cli, TOY + ["--out", "/proc/nope"])
    assert r.exit_code in (1, 2) and r.output.count("\n") == 1 and "error:" in r.output, r.output
    assert "Traceback" not in r.output


def test_disk_full_is_one_line_and_leaves_no_partial_file(monkeypatch, tmp_path):
    import memo_sim.fileio as fileio

    def full(fd):  # the data did not fit: the kernel reports it when the file is flushed to disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(fileio.os, "fsync", full)
        r = CliRunner().invoke(sim_cli, TOY + ["--out", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert r.output.strip().startswith("error:") and "No space left on device" in r.output
    assert r.output.count("\n") == 1
    assert not [p for p in tmp_path.iterdir() if p.name != "alpha_sweep.png"]


@pytest.mark.parametrize("cli,args,needle", [
    (sim_cli, ["whatif", "--policy", "store_all", "--alpha", "0.5", "--seq", "4K", "--no-plan"], "--alpha 0.5"),
    (exec_cli, ["validate", "--profile", "a800-80gb", "--layers", "0", "--device", "cpu"], "--layers"),
])
def test_flags_that_would_be_ignored_or_empty_are_refused(cli, args, needle):
    """[robust-runs] an --alpha no searched policy takes, a validation of zero layers: one line, exit 2."""
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and needle in r.output and r.output.count("\n") == 1, r.output


def test_a_million_gpu_whatif_answers_in_seconds(tmp_path):
    """[robust-runs] --gpus 1000000 (inside the cap): the layouts no rule admits are skipped and the
    pipeline's node counts computed once per period, so the search answers in seconds, not minutes."""
    import time as _time

    t0 = _time.perf_counter()
    r = CliRunner().invoke(sim_cli, ["whatif", "--gpus", "1000000", "--no-plan", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output[-500:]
    assert _time.perf_counter() - t0 < 30  # about 4 s on an idle 2-core machine; 30 s at a heavy load


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_read_only_run_out_fails_before_training(monkeypatch, toy_run, err):
    """[robust-runs] a read-only --out (errno 30; the tests run as root, so chmod cannot make one):
    one line naming --out, exit 2, before any step; the previous output untouched."""
    import memo_exec.runner as runner
    import memo_sim.fileio as fileio

    plan, out, before = toy_run
    monkeypatch.setattr(runner, "run_steps", _raise(AssertionError("trained although --out is read-only")))
    monkeypatch.setattr(fileio.tempfile, "mkdtemp", _raise(OSError(err, os.strerror(err))))
    r = _run(plan, out)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: --out {out}: cannot write there ({os.strerror(err)})"), r.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_too_little_free_space_is_refused_before_training(monkeypatch, toy_run):
    """[robust-runs] --out's file system has clearly less room than the run's outputs take: one line
    with both sizes, exit 2, before any step; no staging folder left."""
    import memo_exec.runner as runner
    import memo_sim.fileio as fileio

    plan, out, before = toy_run
    monkeypatch.setattr(runner, "run_steps", _raise(AssertionError("trained although --out is full")))
    monkeypatch.setattr(fileio, "disk_free_bytes", lambda path: 1000)
    r = _run(plan, out)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: --out {out}: 1,000 bytes free there and the outputs take at least "), r.output
    _untouched(out, before)


def test_interrupt_while_committing_marks_the_folder_incomplete(monkeypatch, toy_run):
    """[robust-runs] Ctrl-C after the first staged file has moved into --out: exit 130, and --out's
    manifest says ``"complete": false`` (the folder holds old and new files); no staging folder."""
    import json

    import memo_sim.fileio as fileio

    plan, out, before = toy_run
    real, moved = os.replace, []

    def replace(src, dst):  # the second staged file moving into --out meets Ctrl-C
        into_out = ".partial" in str(src) and os.path.dirname(os.path.abspath(dst)) == str(out)
        if into_out and moved:
            raise KeyboardInterrupt
        real(src, dst)
        if into_out:
            moved.append(dst)
    monkeypatch.setattr(fileio.os, "replace", replace)
    r = _run(plan, out)
    assert r.exit_code == 130 and r.output.strip().splitlines()[-1] == "interrupted", r.output
    m = json.loads((out / "manifest.json").read_text())
    assert moved and m["complete"] is False and m["command"] == "memo-exec run"
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


@pytest.mark.slow
def test_real_sigint_mid_run_exits_130_and_leaves_no_output(tmp_path):
    """[robust-runs] a real SIGINT to `memo-exec run` once its first step has been reported: exit
    130, the one line ``interrupted``, no traceback, --out never created, no staging folder."""
    r = CliRunner().invoke(sim_cli, TOY + ["--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "memo_exec", "run", str(tmp_path / "plan.json"), "--device", "cpu",
                          "--steps", "100000", "--progress", "--out", str(tmp_path / "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0,
                         preexec_fn=_sigint_as_a_terminal_sends_it)
    try:
        first = p.stderr.readline()
        while first and b"[memo-exec] step" not in first:
            first = p.stderr.readline()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert b"[memo-exec] step" in first and p.returncode == 130, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1] == "interrupted" and b"Traceback" not in err
    assert not (tmp_path / "run").exists() and not [q for q in tmp_path.iterdir() if q.name.endswith(".partial")]


def _rank_processes(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (a test's own folder), this one excluded."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(d))
            except OSError:
                continue
    return out


def _terminate_at_first_step(cmd, tmp_path, needle=b"[memo-exec] step"):
    """Start ``cmd``, send SIGTERM once its stderr shows ``needle``, and return (exit status, stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0,
                         start_new_session=True)
    try:
        first = p.stderr.readline()
        while first and needle not in first:
            first = p.stderr.readline()
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert needle in first, err.decode()[-2000:]
    return p.returncode, err.decode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_a_search_and_a_run_as_ctrl_c_does(tmp_path):
    """A review (2026-11-30): SIGTERM (``timeout``, ``kill``, a scheduler) took the default action, which skipped the
    clean-up Ctrl-C runs: a run's staging folder was left behind. Both tools now exit 143 with the one line
    ``terminated (SIGTERM)``, no traceback, nothing written."""
    rc, err = _terminate_at_first_step(
        [sys.executable, "-m", "memo_sim.cli", "whatif", "--model", "gpt-175b", "--gpus", "64", "--seq", "64K",
         "--simulate-top", "10000", "--jobs", "1", "--no-plan", "--progress"], tmp_path, b"what-if")
    assert rc == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)" and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())
    r = CliRunner().invoke(sim_cli, TOY + ["--out", str(tmp_path / "plan")])
    assert r.exit_code == 0, r.output
    rc, err = _terminate_at_first_step([sys.executable, "-m", "memo_exec", "run", str(tmp_path / "plan" / "plan.json"),
                                        "--device", "cpu", "--steps", "100000", "--progress", "--out",
                                        str(tmp_path / "run")], tmp_path)
    assert rc == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)" and "Traceback" not in err, err
    assert not (tmp_path / "run").exists() and not [q for q in tmp_path.iterdir() if q.name.endswith(".partial")]


@pytest.mark.slow  # torchrun and two gloo ranks: about 15 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_the_nproc_launcher_stops_its_ranks(tmp_path):
    """A review (2026-11-30): SIGTERM to `memo-exec run --nproc 2` killed the launcher alone; torchrun and both ranks
    ran on as orphans to the last step. The launcher now stops them as on Ctrl-C and says where the incomplete
    outputs are."""
    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256",
                                     "--vocab", "128", "--dtype", "fp32", "--seq", "512", "--gpus", "2", "--tp", "2",
                                     "--policy", "store_all", "--jobs", "1", "--out", str(tmp_path / "plan")])
    assert r.exit_code == 0, r.output
    rc, err = _terminate_at_first_step([sys.executable, "-m", "memo_exec", "run", str(tmp_path / "plan" / "plan.json"),
                                        "--device", "cpu", "--nproc", "2", "--steps", "100000", "--progress", "--out",
                                        str(tmp_path / "run")], tmp_path)
    assert rc == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)" and "Traceback" not in err, err
    assert "memo-exec: the 2 ranks were stopped; the incomplete outputs and launcher.log stay in " in err, err
    import time

    deadline = time.monotonic() + 20
    while _rank_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _rank_processes(str(tmp_path)), "ranks left running"
    assert not (tmp_path / "run").exists()
