#!/usr/bin/env python3
"""Print the README's set-up commands, one per line: the lines of the first fenced ``bash`` block
under the heading "## Set up and run". .ci/run runs exactly these (standard library only: it runs
before anything is installed); tests/test_dependency_lock.py reads them through the same function."""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def setup_commands(text: str) -> list[str]:
    m = re.search(r"^## Set up and run\n(.*?)(?=^## )", text, re.S | re.M)
    block = m and re.search(r"^```bash\n(.*?)^```", m.group(1), re.S | re.M)
    if not block:
        raise SystemExit(f"error: {README}: no ```bash block under '## Set up and run'; fix: restore the set-up block")
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


if __name__ == "__main__":
    print("\n".join(setup_commands(README.read_text(encoding="utf-8"))))
    sys.exit(0)
