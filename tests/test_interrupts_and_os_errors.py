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

TOY = ["whatif", "--layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512", "--vocab", "512", "--seq", "1K",
       "--gpus", "1", "--policy", "store_all", "--jobs", "1"]


def test_sigint_exits_130_with_one_line(tmp_path):
    """A real SIGINT to a running memo-sim (a search long enough to be interrupted)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "memo_sim.cli", "whatif", "--model", "gpt-175b", "--gpus", "1024",
                          "--seq", "256K", "--simulate-top", "10000", "--jobs", "1", "--no-plan", "--progress"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0)
    try:
        first = p.stderr.readline()  # the progress label: the search is under way (unbuffered: nothing held back)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        err = first + err
    finally:
        p.kill()
    assert p.returncode == 130, err.decode()[-2000:]
    assert first == b"simulating\n"
    assert err.decode().strip().splitlines()[-1] == "interrupted" and b"Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_keyboard_interrupt_in_memo_exec_exits_130(monkeypatch, tmp_path):
    import memo_exec.runner as runner

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_steps", boom)
    r = CliRunner().invoke(sim_cli, TOY + ["--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(tmp_path / "run")])
    assert r.exit_code == 130 and "interrupted" in r.output


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
