#!/usr/bin/env python
"""Regenerate the tested dependency set: ``constraints.txt`` (pip-tools' ``pip-compile`` over
``pyproject.toml``'s ranges with the ``exec`` and ``test`` extras and the README's torch pin), then
``benchmarks/gpu/wheels.txt`` derived from it (the runtime closure the GPU image lacks).

    pip install pip-tools                     # once, in the environment that runs this script
    python benchmarks/lock_deps.py            # keep the locked versions, add what a new range needs
    python benchmarks/lock_deps.py --upgrade  # move every package to today's newest allowed version
    python benchmarks/lock_deps.py --check    # compile nothing: is wheels.txt the lock's? (exit 1 if not)

Both files are written atomically. pip-compile resolves for the Python running this script
(the README's and CI's: 3.11 on Linux x86-64) with pip's own configuration, so on this project's
machines torch resolves to the CPU wheel on disk; its local label (``+cpu``) is dropped so that the
same line accepts PyPI's ``torch==2.13.0`` on any machine. After ``--upgrade``, run the tests in a
new venv with the new lock before committing it (``python benchmarks/dependency_drift.py --lock``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "constraints.txt"
# The torch release the README's first command installs: the CPU wheel on this project's machines'
# disk (any other torch spec may pull gigabytes of CUDA packages). tests/test_dependency_lock.py checks
# that the README, CI and the lock say the same.
TORCH_PIN = "torch==2.13.0"
COMMAND = "python benchmarks/lock_deps.py"


def fetch_wheels_module():
    spec = importlib.util.spec_from_file_location("fetch_wheels", REPO / "benchmarks" / "gpu" / "fetch_wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def strip_local_labels(text: str) -> str:
    """``torch==2.13.0+cpu`` -> ``torch==2.13.0``: a pin with a local label matches only that build."""
    return re.sub(r"^([A-Za-z0-9._-]+==[^\s+#]+)\+[A-Za-z0-9.]+", r"\1", text, flags=re.M)


def compile_lock(upgrade: bool) -> str:
    try:
        import piptools  # noqa: F401, PLC0415
    except ImportError:
        raise SystemExit("error: pip-tools is not installed here; fix: pip install pip-tools") from None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "constraints.txt"
        if LOCK.exists() and not upgrade:
            out.write_text(LOCK.read_text())  # pip-compile keeps the pins of an existing output file
        argv = [sys.executable, "-m", "piptools", "compile", "--quiet", "--extra", "exec", "--extra", "test",
                "--strip-extras", "--allow-unsafe", "--no-emit-index-url", "--no-emit-find-links",
                "--upgrade-package", TORCH_PIN, "--output-file", str(out), "pyproject.toml"]
        if upgrade:
            argv.insert(4, "--upgrade")
        env = dict(os.environ, CUSTOM_COMPILE_COMMAND=COMMAND + (" --upgrade" if upgrade else ""))
        r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        if r.returncode:
            tail = [ln for ln in r.stderr.splitlines() if "is ignored" not in ln][-5:]
            raise SystemExit(f"error: pip-compile failed (exit {r.returncode}): {' | '.join(tail)}")
        return strip_local_labels(out.read_text())


def main() -> int:
    try:
        return _main()
    except SystemExit as e:  # a one-line refusal (pip-tools missing, a lock the wheel set cannot follow): exit 2
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        raise


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upgrade", action="store_true", help="re-resolve every package to its newest allowed version")
    ap.add_argument("--check", action="store_true", help="compile nothing; check wheels.txt against the lock")
    args = ap.parse_args()
    fw = fetch_wheels_module()
    if args.check:
        want = fw.wheels_text(LOCK.read_text())
        if fw.PINS.read_text() != want:
            print(f"error: {fw.PINS} is not the one {LOCK.name} gives; fix: {COMMAND}", file=sys.stderr)
            return 1
        print(f"{fw.PINS.relative_to(REPO)} agrees with {LOCK.name}")
        return 0
    lock = compile_lock(args.upgrade)
    wheels = fw.wheels_text(lock)  # before writing anything: a lock the wheel set cannot follow writes nothing
    write_atomic(LOCK, lock)
    write_atomic(fw.PINS, wheels)
    n = sum(1 for ln in lock.splitlines() if "==" in ln and not ln.startswith("#"))
    print(f"{LOCK.name}: {n} packages; {fw.PINS.relative_to(REPO)}: {len(fw.pins())} wheels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
