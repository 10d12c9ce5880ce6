"""Load and validate hardware profiles (YAML or JSON) into `HardwareProfile`.

A quantity is written ``{value: 80, unit: GiB, source: "NVIDIA datasheet"}``; a curve is
``{x: FLOP, points: [[1e9, 0.3], [1e12, 0.75]], source: "..."}``. An unknown key, a missing
field, a wrong unit or a missing source is a `ProfileError` naming the file and the field.
The one optional section, ``gpu.allocator`` (what cudaMalloc, cudaFree and a reorganisation's
synchronise cost), is complete or absent: profiles written before it existed load with
`memo_sim.profile.schema.DEFAULT_ALLOCATOR_COSTS`, whose sources say they are assumed defaults.

Profiles are looked up by name in, in order: the folders of ``$MEMO_PROFILES`` (os.pathsep
separated), ``./hardware_profiles`` and the repository's ``hardware_profiles/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from memo_sim.errors import MemoError, ProfileError
from memo_sim.fileio import read_utf8
from memo_sim.profile.schema import (
    DEFAULT_ALLOCATOR_COSTS, AllocatorCosts, Curve, Efficiency, GPUSpec, HardwareProfile, HostLink, HostSpec, Link,
    Quantity,
)
from memo_sim.units import convert

SCHEMA = "memo-hardware-profile/1"
REPO_PROFILES = Path(__file__).resolve().parents[2] / "hardware_profiles"
PINNED_ROUNDING = ("power_of_two", "page", "none")

# Field spec: a leaf is ("q", dimension) for a quantity, ("curve",), ("str",), ("dtypes", dim).
SPEC: dict[str, Any] = {
    "schema": ("str",),
    "name": ("str",),
    "description": ("str",),
    "provenance": ("any",),
    "gpu": {
        "model": ("str",),
        "memory": ("q", "bytes"),
        "reserved": ("q", "bytes"),
        "peak_flops": ("dtypes", "flops"),
        "hbm_bandwidth": ("q", "bandwidth"),
        "copy_compute_slowdown": ("q", "ratio"),
        "allocator": {  # optional: profiles written before it exist (see OPTIONAL)
            "sync": ("q", "time"),
            "cuda_malloc_latency": ("q", "time"),
            "cuda_malloc_throughput": ("q", "bandwidth"),
            "cuda_free_latency": ("q", "time"),
            "cuda_free_throughput": ("q", "bandwidth"),
        },
    },
    "efficiency": {
        "gemm": ("curve",),
        "attention_fwd": ("curve",),
        "attention_bwd": ("curve",),
        "elementwise": ("q", "ratio"),
    },
    "node": {"gpus_per_node": ("q", "count")},
    "nvlink": {"bandwidth": ("q", "bandwidth"), "latency": ("q", "time")},
    "internode": {"bandwidth": ("q", "bandwidth"), "latency": ("q", "time")},
    "host_link": {
        "d2h_bandwidth": ("q", "bandwidth"),
        "h2d_bandwidth": ("q", "bandwidth"),
        "latency": ("q", "time"),
        "gpus_per_pcie_switch": ("q", "count"),
        "pcie_switch_bandwidth": ("q", "bandwidth"),
        "gpus_per_socket": ("q", "count"),
    },
    "host": {
        "memory": ("q", "bytes"),
        "usable_fraction": ("q", "ratio"),
        "memory_bandwidth": ("q", "bandwidth"),
        "pinned_rounding": {"value": ("str",), "source": ("str",)},
    },
}
OPTIONAL = {"provenance", "description", "allocator"}


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, field: str, msg: str) -> ProfileError:
        return ProfileError(f"{self.source}: {field}: {msg}")

    def quantity(self, raw: Any, dim: str, field: str) -> Quantity:
        if not isinstance(raw, dict):
            raise self.fail(field, "expected {value: ..., unit: ..., source: ...}")
        extra = set(raw) - {"value", "unit", "source"}
        if extra:
            raise self.fail(field, f"unknown key {sorted(extra)[0]!r}; a quantity has value, unit, source")
        for k in ("value", "source"):
            if k not in raw:
                raise self.fail(field, f"missing {k!r}")
        v = raw["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(field, f"value must be a number, got {v!r}")
        if not str(raw["source"]).strip():
            raise self.fail(field, "source is empty; say where the number comes from")
        unit = str(raw.get("unit", ""))
        if dim == "count":
            if unit not in ("", "count") or v != int(v) or v <= 0:
                raise self.fail(field, f"expected a positive whole count (unit 'count'), got {v!r} {unit!r}")
            return Quantity(float(v), str(raw["source"]))
        try:
            base = convert(v, unit, dim, f"{self.source}: {field}")
        except MemoError as e:
            raise ProfileError(str(e)) from None
        if base < 0 or (dim != "ratio" and base == 0 and dim != "time"):
            raise self.fail(field, f"must be positive, got {v!r}")
        if dim == "ratio" and base > 1:
            raise self.fail(field, f"a ratio must lie in [0, 1], got {v!r}")
        return Quantity(base, str(raw["source"]))

    def curve(self, raw: Any, field: str) -> Curve:
        if not isinstance(raw, dict):
            raise self.fail(field, "expected {x: FLOP, points: [[flops, efficiency], ...], source: ...}")
        extra = set(raw) - {"x", "points", "source"}
        if extra:
            raise self.fail(field, f"unknown key {sorted(extra)[0]!r}")
        if raw.get("x") != "FLOP":
            raise self.fail(field, f"x must be 'FLOP' (the kernel's FLOPs), got {raw.get('x')!r}")
        if not str(raw.get("source", "")).strip():
            raise self.fail(field, "missing 'source'")
        pts = raw.get("points")
        if not isinstance(pts, list) or len(pts) < 1:
            raise self.fail(field, "points must be a non-empty list of [flops, efficiency]")
        out = []
        for i, p in enumerate(pts):
            if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p)):
                raise self.fail(f"{field}.points[{i}]", "expected [flops, efficiency]")
            if p[0] <= 0 or not (0 < p[1] <= 1):
                raise self.fail(f"{field}.points[{i}]", "flops must be > 0 and efficiency in (0, 1]")
            out.append((float(p[0]), float(p[1])))
        if any(b[0] <= a[0] for a, b in zip(out, out[1:])):
            raise self.fail(field, "points must be sorted by strictly increasing flops")
        return Curve(tuple(out), str(raw["source"]))

    def walk(self, raw: Any, spec: dict, prefix: str) -> dict:
        if not isinstance(raw, dict):
            raise self.fail(prefix or "(top)", "expected a mapping")
        for k in raw:
            if k not in spec:
                raise self.fail(f"{prefix}{k}", f"unknown key; expected one of {', '.join(spec)}")
        out: dict[str, Any] = {}
        for k, leaf in spec.items():
            field = f"{prefix}{k}"
            if k not in raw:
                if k in OPTIONAL:
                    continue
                raise self.fail(field, "missing field")
            v = raw[k]
            if isinstance(leaf, dict):
                out[k] = self.walk(v, leaf, field + ".")
            elif leaf[0] == "q":
                out[k] = self.quantity(v, leaf[1], field)
            elif leaf[0] == "curve":
                out[k] = self.curve(v, field)
            elif leaf[0] == "str":
                if not isinstance(v, str) or not v.strip():
                    raise self.fail(field, "expected a non-empty string")
                out[k] = v
            elif leaf[0] == "dtypes":
                if not isinstance(v, dict) or not v:
                    raise self.fail(field, "expected a mapping dtype -> quantity, e.g. bf16: {...}")
                out[k] = {d: self.quantity(q, leaf[1], f"{field}.{d}") for d, q in v.items()}
            else:
                out[k] = v
        return out


def parse_profile(raw: Any, source: str) -> HardwareProfile:
    r = _Reader(source)
    d = r.walk(raw, SPEC, "")
    if d["schema"] != SCHEMA:
        raise r.fail("schema", f"is {d['schema']!r}; this memo reads {SCHEMA!r}")
    pr = d["host"]["pinned_rounding"]
    if pr["value"] not in PINNED_ROUNDING:
        raise r.fail("host.pinned_rounding.value", f"must be one of {', '.join(PINNED_ROUNDING)}")
    g = d["gpu"]
    if float(g["reserved"]) >= float(g["memory"]):
        raise r.fail("gpu.reserved", "must be smaller than gpu.memory")
    hl = d["host_link"]
    return HardwareProfile(
        name=d["name"],
        description=d.get("description", ""),
        gpu=GPUSpec(g["model"], g["memory"], g["reserved"], g["peak_flops"], g["hbm_bandwidth"],
                    g["copy_compute_slowdown"],
                    AllocatorCosts(**g["allocator"]) if "allocator" in g else DEFAULT_ALLOCATOR_COSTS),
        efficiency=Efficiency(**d["efficiency"]),
        gpus_per_node=d["node"]["gpus_per_node"],
        nvlink=Link(**d["nvlink"]),
        internode=Link(**d["internode"]),
        host_link=HostLink(**hl),
        host=HostSpec(d["host"]["memory"], d["host"]["usable_fraction"], d["host"]["memory_bandwidth"],
                      pr["value"], pr["source"]),
        path=source,
        provenance=dict(raw.get("provenance") or {}),
    )


def profile_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("MEMO_PROFILES", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "hardware_profiles", REPO_PROFILES]
    seen, out = set(), []
    for d in dirs:
        key = d.resolve()
        if key not in seen and d.is_dir():
            seen.add(key)
            out.append(d)
    return out


def _read_file(path: Path) -> Any:
    try:
        text = read_utf8(path, ProfileError)
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProfileError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({first})") from None


def list_profiles() -> dict[str, Path]:
    """Profile name -> file, first folder wins."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.iterdir()):
            if p.suffix in (".yaml", ".yml", ".json") and p.stem not in found:
                found[p.stem] = p
    return found


def load_profile(name_or_path: str | os.PathLike) -> HardwareProfile:
    """Load a profile by name (see `list_profiles`) or by file path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.exists():
            raise ProfileError(f"{p}: no such profile file")
        return parse_profile(_read_file(p), str(p))
    known = list_profiles()
    if str(name_or_path) not in known:
        raise ProfileError(
            f"profile {str(name_or_path)!r} not found; known: {', '.join(sorted(known)) or 'none'} "
            f"(or pass a file path, or add a folder to $MEMO_PROFILES)"
        )
    return parse_profile(_read_file(known[str(name_or_path)]), str(known[str(name_or_path)]))
