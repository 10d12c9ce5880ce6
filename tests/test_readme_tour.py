"""[robust-ux] The README's commands, run as written: every line of every fenced ``bash`` block of
README.md, in the order written, in one scratch folder, must succeed (exit 0), and no command
may overwrite a file an earlier one wrote (plans go under distinct names).

The commands are parsed from README.md, so a line added there is run here. Rules:

* ``memo-sim`` and ``memo-exec`` lines run in-process (click's CliRunner); any other line (e.g.
  ``printf ... > problem.csv``) runs in ``bash`` in the scratch folder.
* Skipped: the set-up lines (``pip install ...``, ``python -m pytest ...``: installing memo and
  running this suite), and, without CUDA, the lines that measure a GPU: ``memo-exec run`` or
  ``trace`` with ``--device cuda``, ``memo-exec calibrate`` and ``memo-exec validate`` (on a CPU
  they would take minutes and measure the CPU). With CUDA they run too.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.fileio import MANIFEST

README = Path(__file__).resolve().parents[1] / "README.md"
SETUP = ("pip", "python", "python3")  # installing memo, running the test suite itself
GPU_ONLY = ("calibrate", "validate")  # memo-exec subcommands that measure the device


def tour_commands(text: str) -> list[str]:
    """Every command line of the fenced bash blocks, in order (comments and blank lines dropped)."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(line)
    return out


def skip_reason(words: list[str], cuda: bool) -> str | None:
    if words[0] in SETUP:
        return "set-up line"
    if cuda or words[0] != "memo-exec":
        return None
    if len(words) > 1 and words[1] in GPU_ONLY:
        return f"memo-exec {words[1]} measures a GPU; no CUDA here"
    device = words[words.index("--device") + 1] if "--device" in words[:-1] else ""
    if device.startswith("cuda"):
        return "--device cuda without CUDA"
    return None


def test_the_parser_finds_the_tour():
    cmds = tour_commands(README.read_text(encoding="utf-8"))
    assert any(c.startswith("memo-sim whatif") for c in cmds)
    assert any(c.startswith("memo-exec run") for c in cmds)
    words = shlex.split("memo-exec run plan.json --device cuda --steps 5  # a comment", comments=True)
    assert words[-1] == "5" and skip_reason(words, cuda=False) and not skip_reason(words, cuda=True)
    assert skip_reason(["memo-exec", "calibrate", "--name", "x"], cuda=False)
    assert skip_reason(["memo-sim", "models"], cuda=False) is None


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_readme_tour_runs_as_written(tmp_path, monkeypatch):
    import torch

    from memo_exec.cli import cli as exec_cli
    from memo_sim.cli import cli as sim_cli

    cuda = torch.cuda.is_available()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MEMO_PROFILES", raising=False)
    clis = {"memo-sim": sim_cli, "memo-exec": exec_cli}
    ran, skipped = [], []
    written: dict[str, str] = {}  # file -> the command that wrote it
    for line in tour_commands(README.read_text(encoding="utf-8")):
        words = shlex.split(line, comments=True)
        why = skip_reason(words, cuda)
        if why:
            skipped.append((line, why))
            continue
        before = _files(tmp_path)
        if words[0] in clis:
            r = CliRunner().invoke(clis[words[0]], words[1:], prog_name=words[0])
            detail = f"{r.output[-2000:]}{r.exception!r}"
            code = r.exit_code
        else:
            p = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            detail, code = p.stdout[-2000:] + p.stderr[-2000:], p.returncode
        assert code == 0, f"README command failed (exit {code}): {line}\n{detail}"
        after = _files(tmp_path)
        for f, stamp in after.items():
            if Path(f).name == MANIFEST:  # each command's output set rewrites its folder's manifest
                continue
            if f in before and before[f] != stamp and f in written:
                pytest.fail(f"{line!r} overwrote {f}, which {written[f]!r} wrote: give it a distinct name")
            if f not in before or before[f] != stamp:
                written[f] = line
        ran.append(line)
    assert len(ran) >= 10, (ran, skipped)
    claims = _same_loss_claims(ran)
    assert claims, "README's '# same losses' line (a plan under --nproc and under torchrun) is gone"
    for first, second in claims:
        _assert_same_losses(tmp_path / first, tmp_path / second)


def _run_out(line: str) -> tuple[str, str] | None:
    """(plan file, --out folder) of a ``memo-exec run`` / ``torchrun ... memo_exec run`` line."""
    words = shlex.split(line, comments=True)
    if "run" not in words or "--out" not in words[:-1]:
        return None
    return words[words.index("run") + 1], words[words.index("--out") + 1]


def _same_loss_claims(ran: list[str]) -> list[tuple[str, str]]:
    """(--out of the earlier run, --out of this one) for each line whose comment says '# same losses':
    the same plan run earlier in the tour, launched another way."""
    out = []
    for k, line in enumerate(ran):
        if "# same losses" not in line or not _run_out(line):
            continue
        plan, here = _run_out(line)
        before = [_run_out(b) for b in ran[:k] if _run_out(b) and _run_out(b)[0] == plan]
        assert before, f"{line!r}: no earlier run of {plan} to compare losses with"
        out.append((before[-1][1], here))
    return out


def _step_losses(out: Path) -> list[str]:
    report = (out / "report.md").read_text().split("## Steps", 1)[1].split("\n## ", 1)[0]
    return [row.split("|")[2].strip() for row in report.splitlines() if row.startswith("| ") and row[2].isdigit()]


def _assert_same_losses(a: Path, b: Path) -> None:
    """Every step's loss (report.md) and every rank's last loss (measured.json, full precision) equal."""
    import json

    la, lb = _step_losses(a), _step_losses(b)
    assert la and la == lb, (a, la, b, lb)
    ranks = [[r["last_loss"] for r in json.loads((d / "measured.json").read_text())["meta"]["per_rank"]]
             for d in (a, b)]
    assert ranks[0] and ranks[0] == ranks[1], ranks
