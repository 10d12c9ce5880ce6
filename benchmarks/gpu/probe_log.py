"""The GPU probes' record (imported by the probe scripts as ``probe_log``, from their own folder):
each case one JSON line on stdout as soon as it is measured, with the seconds since the probe
started, and all of them written as one JSON list at the end, atomically."""

from __future__ import annotations

import json
import time
from pathlib import Path

RESULTS: list[dict] = []
T0 = time.monotonic()


def emit(**rec) -> None:
    rec["t_s"] = round(time.monotonic() - T0, 1)
    RESULTS.append(rec)
    print(json.dumps(rec), flush=True)


def write_results(out_dir: str | Path, name: str) -> Path:
    """RESULTS as ``out_dir/name`` (written to a temporary name first, then renamed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (name + ".tmp")
    tmp.write_text(json.dumps(RESULTS, indent=1))
    tmp.replace(out / name)
    return out / name
