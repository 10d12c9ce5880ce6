#!/usr/bin/env python
"""Dependency drift: install memo in a scratch venv at the NEWEST versions pyproject.toml's ranges
allow (what a user gets without ``-c constraints.txt``), run the test suite there, and write what
moved against the lock and what failed to ``reports/dependency-drift.md``. Not a test: it reaches
the package index, takes minutes, and its answer depends on the day; run it before a release, or
after ``python benchmarks/lock_deps.py --upgrade`` with ``--lock`` to try the new lock first.

    python benchmarks/dependency_drift.py                  # newest allowed versions (torch kept at its pin), default tests
    python benchmarks/dependency_drift.py --lock           # the lock's versions instead (-c constraints.txt)
    python benchmarks/dependency_drift.py --slow           # the slow selection too
    python benchmarks/dependency_drift.py --out DIR/x.md --keep-venv

Exit status: 0 when the tests pass, 1 when some fail (the report names them), 2 when the venv or
the install could not be made (one line on stderr).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from machine import cpu_name, git_state, uptime  # noqa: E402


import lock_deps  # noqa: E402  (benchmarks/, on the path above)

fw = lock_deps.fetch_wheels_module()


def _step(msg: str, t0: float) -> None:
    print(f"[{time.monotonic() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def _freeze(py: Path) -> dict[str, str]:
    r = _run([str(py), "-m", "pip", "freeze", "--exclude-editable"], 120)
    out = {}
    for line in r.stdout.splitlines():
        name, sep, ver = line.partition("==")
        if sep:
            out[fw.canonical(name)] = ver
    return out


def pytest_summary(output: str) -> tuple[str, list[str]]:
    """pytest's closing line (``N passed, ... in S s``) and the ids of the failed or errored tests."""
    summary = next((ln.strip("= ") for ln in reversed(output.splitlines())
                    if re.search(r"\b(passed|failed|error|no tests ran)\b", ln)), "no summary line")
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return summary, failed


def report(args, started: str, venv_py: Path, moved: list[tuple[str, str, str]], summary: str, failed: list[str],
           output_tail: str, wall: dict[str, float], rc: int) -> str:
    mode = "the lock's versions (-c constraints.txt)" if args.lock else "the newest versions the ranges allow"
    sel = "default and slow selections" if args.slow else "default selection"
    py = _run([str(venv_py), "--version"], 30).stdout.strip()
    lines = [
        "# Dependency drift",
        "",
        f"Command: `python benchmarks/dependency_drift.py{' --lock' if args.lock else ''}{' --slow' if args.slow else ''}`"
        f" ({mode}; the {sel}).",
        f"Run: {started} UTC on {cpu_name()} ({uptime()}); code {git_state(REPO)}; {py} in a new venv.",
        f"Install {wall['install']:.0f} s, tests {wall['tests']:.0f} s wall.",
        "",
        f"**Result: {'PASS' if rc == 0 else 'FAIL'}** - pytest: `{summary}`.",
        "",
    ]
    if moved:
        lines += ["Versions installed that differ from `constraints.txt` (the tested set):", "",
                  "| package | locked | installed |", "| --- | --- | --- |"]
        lines += [f"| {n} | {a} | {b} |" for n, a, b in moved]
    else:
        lines += ["Every installed version is the one `constraints.txt` pins: no drift today."]
    lines.append("")
    if failed:
        lines += ["Failed or errored tests (a failure here, not with the lock, is drift to fix: a range's upper bound "
                  "with its reason in pyproject.toml, or a code change, then `python benchmarks/lock_deps.py "
                  "--upgrade`):", ""]
        lines += [f"- `{t}`" for t in failed]
        lines += ["", "The run's last lines:", "", "```text", output_tail.rstrip(), "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", action="store_true", help="install the lock's versions instead of the newest allowed")
    ap.add_argument("--slow", action="store_true", help="also run the tests marked slow")
    ap.add_argument("--out", default=str(REPO / "reports" / "dependency-drift.md"), help="report file (Markdown)")
    ap.add_argument("--keep-venv", action="store_true", help="leave the scratch venv and print its path")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for each test selection (default 3600)")
    args = ap.parse_args()
    out = Path(args.out)
    if not out.parent.is_dir():
        print(f"error: --out: folder {out.parent} does not exist; fix: create it or name another", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("error: --timeout: must be positive; fix: give seconds, e.g. --timeout 3600", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    tmp = Path(tempfile.mkdtemp(prefix="memo-drift-"))
    venv = tmp / "venv"
    py = venv / "bin" / "python"
    _step(f"new venv {venv}", t0)
    try:
        r = _run([sys.executable, "-m", "venv", str(venv)], 300)
    except subprocess.TimeoutExpired:
        print("error: python -m venv took more than 300 s; fix: check the disk and retry", file=sys.stderr)
        return 2
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"error: python -m venv failed (exit {r.returncode}): {last}", file=sys.stderr)
        return 2
    # newest allowed: every package but torch, which stays at the README's pin (the CPU wheel on disk; an
    # upgrade would pull another torch's CUDA build, gigabytes)
    torch_pin = tmp / "torch-pin.txt"
    torch_pin.write_text(lock_deps.TORCH_PIN + "\n")
    pins = (["-c", str(lock_deps.LOCK)] if args.lock
            else ["--upgrade", "--upgrade-strategy", "eager", "-c", str(torch_pin)])
    for argv in ([str(py), "-m", "pip", "install", "-q", lock_deps.TORCH_PIN],
                 [str(py), "-m", "pip", "install", "-q", *pins, "-e", f"{REPO}[exec,test]"]):
        _step("$ " + " ".join(argv[1:]), t0)
        try:
            r = _run(argv, 1800)
        except subprocess.TimeoutExpired:
            print("error: the install took more than 1800 s; fix: check the package index and retry", file=sys.stderr)
            return 2
        if r.returncode:
            err = [ln for ln in r.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
            print(f"error: install failed (exit {r.returncode}): {' | '.join(err[-3:])}", file=sys.stderr)
            return 2
    wall = {"install": time.monotonic() - t0}
    lock = fw.parse_lock(lock_deps.LOCK.read_text())
    have = _freeze(py)
    moved = [(n, lock[n][0], have[n]) for n in sorted(lock) if n in have and have[n].split("+")[0] != lock[n][0]]
    moved += [(n, "(not locked)", v) for n, v in sorted(have.items()) if n not in lock and n not in ("pip",)]
    _step(f"{len(moved)} packages differ from the lock; running the tests", t0)
    t1 = time.monotonic()
    selections = [["-q", "-rfE", "-p", "no:cacheprovider"]]
    if args.slow:
        selections.append(["-q", "-rfE", "-p", "no:cacheprovider", "-m", "slow"])
    summaries, failed, tail, rc = [], [], "", 0
    for sel in selections:
        try:
            r = _run([str(py), "-m", "pytest", *sel], args.timeout, cwd=REPO)
            text, code = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            text, code = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
            text += f"\n(timed out after {args.timeout:.0f} s)"
        s, f = pytest_summary(text)
        summaries.append(s)
        failed += f
        if code:
            rc, tail = 1, "\n".join(text.splitlines()[-40:])
        _step(f"pytest {' '.join(sel[4:]) or '(default selection)'}: {s}", t0)
    wall["tests"] = time.monotonic() - t1
    text = report(args, started, py, moved, "; ".join(summaries), failed, tail, wall, rc)
    lock_deps.write_atomic(out, text)
    _step(f"wrote {out}", t0)
    if args.keep_venv:
        print(f"venv kept: {venv}", file=sys.stderr)
    else:
        subprocess.run(["rm", "-rf", str(tmp)], timeout=300)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
