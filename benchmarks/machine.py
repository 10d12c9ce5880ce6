"""What a benchmark report says about the machine it ran on (shared by the benchmarks)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def uptime() -> str:
    """`uptime`'s line (the load it reports is part of every timing), else the load averages."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def git_state(repo: Path) -> str:
    """The commit a run measures, and whether the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=repo,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=repo,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    n = len(dirty.splitlines())
    return head + (f" with {n} file{'s' if n != 1 else ''} changed or new in the working tree" if dirty else "")
