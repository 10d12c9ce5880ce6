"""A profile's values as the YAML writes them: ``{value, unit, source}`` on one line, curves as
``[flops, efficiency]`` pairs, numbers to four significant digits.

The calibrate modules that build profile sections (`writer`, `allocator`) share these; the
module imports nothing of theirs.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

GiB, MiB = 2**30, 2**20


class FlowMap(dict):
    """Dumped on one line: ``{value: 3.35, unit: TB/s, source: ...}``."""


class FlowList(list):
    """Dumped on one line: ``[1.0e+9, 0.35]``."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FlowMap, lambda d, m: d.represent_mapping("tag:yaml.org,2002:map", m.items(), flow_style=True))
_Dumper.add_representer(FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump_yaml(d: dict) -> str:
    return yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def plain(obj: Any) -> Any:
    """FlowMap/FlowList -> dict/list (for validation with the loader, which expects plain types)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (as a plain float)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits - 1}e}")


def q(value: float, unit: str, source: str) -> FlowMap:
    v = int(value) if unit == "count" else sig(value)
    return FlowMap(value=v, unit=unit, source=source)


def q_bytes(n: float, source: str) -> FlowMap:
    return q(n / GiB, "GiB", source) if n >= GiB else q(n / MiB, "MiB", source)


def q_bw(bps: float, source: str) -> FlowMap:
    return q(bps / 1e9, "GB/s", source)


def q_time(s: float, source: str) -> FlowMap:
    return q(s * 1e6, "us", source)


def curve(points: list[list[float]], source: str) -> dict:
    return {"x": "FLOP", "points": [FlowList([sig(f), round(e, 4)]) for f, e in points], "source": source}
