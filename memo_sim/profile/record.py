"""Write a profile's ``validation`` block: what ``memo-exec validate`` measured for it.

The block replaces any earlier one; the rest of the file is kept as written (a YAML profile's
comments and layout included): in YAML the old top-level ``validation:`` block is cut out and the
new one appended; in JSON the key is set. The result is parsed by the loader before it replaces
the file (atomically), so a profile never becomes unreadable by being recorded into.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from memo_sim.errors import ProfileError
from memo_sim.fileio import atomic_write_text, load_yaml, read_utf8
from memo_sim.profile.schema import HardwareProfile

_TOP_KEY = re.compile(r"^[^\s#-][^:]*:")  # a top-level mapping key of a block-style YAML file


def validation_block(*, median: float, mean: float | None, worst: float | None, plans: int, device: str,
                     date: str, kendall_tau: float | None, report: str, note: str = "") -> dict:
    """The ``validation`` mapping, errors as fractions (0.12 = 12%), in the loader's field names."""
    block = {"median_abs_iteration_error": round(float(median), 6), "plans": int(plans), "device": device,
             "date": date, "tool": "memo-exec validate", "report": report}
    if mean is not None:
        block["mean_abs_iteration_error"] = round(float(mean), 6)
    if worst is not None:
        block["max_abs_iteration_error"] = round(float(worst), 6)
    if kendall_tau is not None:
        block["kendall_tau"] = round(float(kendall_tau), 4)
    if note:
        block["note"] = note
    return block


def _without_yaml_block(text: str, key: str) -> str:
    """``text`` without its top-level ``key:`` block (the key's line and every indented, blank or
    comment line under it)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"{key}:"):
            skipping = True
            continue
        if skipping and _TOP_KEY.match(line):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


def with_validation(text: str, block: dict, json_file: bool) -> str:
    """The profile file's text with its ``validation`` block set to ``block``."""
    if json_file:
        doc = json.loads(text)
        doc["validation"] = block
        return json.dumps(doc, indent=1) + "\n"
    body = _without_yaml_block(text, "validation").rstrip("\n") + "\n"
    return body + yaml.safe_dump({"validation": block}, sort_keys=False, width=120, allow_unicode=True)


def record_validation(profile: HardwareProfile, block: dict) -> Path:
    """Write ``block`` as the ``validation`` of the file ``profile`` was loaded from; the new file
    is checked by the loader before it replaces the old one. Returns the file's path."""
    from memo_sim.profile.loader import parse_profile  # noqa: PLC0415 - the loader imports the schema

    if not profile.path:
        raise ProfileError(f"profile {profile.name}: loaded from no file, so there is none to record its "
                           f"validation in; pass the profile as a file (--profile path.yaml) or use --no-record")
    path = Path(profile.path)
    json_file = path.suffix == ".json"
    text = with_validation(read_utf8(path, ProfileError), block, json_file)
    raw = json.loads(text) if json_file else load_yaml(text)
    parse_profile(raw, str(path))  # refuse to write a profile the loader would not read
    return atomic_write_text(path, text)
