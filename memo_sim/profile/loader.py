"""Load and validate hardware profiles (YAML or JSON) into `HardwareProfile`.

A quantity is written ``{value: 80, unit: GiB, source: "NVIDIA datasheet"}``; a curve is
``{x: FLOP, points: [[1e9, 0.3], [1e12, 0.75]], source: "..."}``. The file is validated once,
by the pydantic models below: an unknown key, a missing field, a wrong unit, a missing source,
a value that is not a finite number or lies outside its dimension's physical range (`RANGES`)
is a `ProfileError` of one line naming the file, the field and the fix. Then `memo_sim.profile.plausible`
checks each datasheet field against the devices it describes (a 1000x unit slip: ``80 TB`` of GPU memory), the
fields against each other (an fp8 peak below the bf16 one, ``gpus_per_host`` not dividing ``gpus_per_node``) and
the ``efficiency.gemm_formats`` keys against the GEMM formats; a key given twice in one mapping of the file is
refused before any of it (YAML and JSON keep the last silently; `profile_document`).
The optional ``validation`` section records the iteration-time error measured for the profile
(``median_abs_iteration_error`` as a fraction, ``plans``, ``device``, ``date``, the Kendall tau of
the step-time ordering and the ``validation.json`` it came from); ``memo-exec validate`` writes it
(`memo_sim.profile.record`) and answers on the profile print it beside its provenance.
The optional section ``gpu.allocator`` (what cudaMalloc, cudaFree and a reorganisation's
synchronise cost), is complete or absent: profiles written before it existed load with
`memo_sim.profile.schema.DEFAULT_ALLOCATOR_COSTS`, whose sources say they are assumed defaults.

Profiles are looked up by name in, in order: the folders of ``$MEMO_PROFILES`` (os.pathsep
separated), ``./hardware_profiles`` and the repository's ``hardware_profiles/``: first by file name (``NAME.yaml``,
whose ``name:`` must then be ``NAME``: `_named`), else by the ``name:`` a file declares.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from memo_sim.errors import MemoError, ProfileError, validated
from memo_sim.fileio import DuplicateKeyError, load_yaml, read_utf8
from memo_sim.profile.plausible import PRECISION_BITS, check_profile
from memo_sim.profile.schema import (
    ATTENTION_TIME_KERNELS, COLLECTIVES, DEFAULT_ALLOCATOR_COSTS, AllocatorCosts, AttentionTimes, CollectiveFit, Curve,
    Efficiency, GPUSpec, HardwareProfile, HostLink, HostSpec, Link, Quantity,
)
from memo_sim.units import convert

SCHEMA = "memo-hardware-profile/1"
REPO_PROFILES = Path(__file__).resolve().parents[2] / "hardware_profiles"
PINNED_ROUNDING = ("power_of_two", "page", "none")

MAX_COUNT = 1 << 20  # GPUs per node / per switch / per socket: more is a typo, not hardware
# Physical range of each dimension, in base units: a value outside is a typo (or NaN / inf),
# refused at the boundary before any arithmetic runs on it.
RANGES: dict[str, tuple[float, float, str]] = {
    "bytes": (1.0, 2.0**60, "1 B .. 1 EiB"),
    "bandwidth": (1e3, 1e16, "1 KB/s .. 10 PB/s"),
    "flops": (1e6, 1e21, "1 MFLOP/s .. 1 ZFLOP/s"),
    "time": (0.0, 3600.0, "0 .. 1 hour"),
    "ratio": (0.0, 1.0, "0 .. 1"),
}

_NonEmpty = Annotated[str, StringConstraints(strict=True, min_length=1, pattern=r"\S")]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)")  # YAML 1.1 reads 3e9 (no dot) as a string


class _QuantityIn(_In):
    value: float = Field(strict=True, allow_inf_nan=False)
    unit: str = Field("", strict=True)
    source: _NonEmpty

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, d: Any) -> Any:
        """A quantity is {value, unit, source}: a bare number says so with the fix; an exponent without a decimal
        point (3e9, a string to YAML 1.1) is the number it reads as."""
        if not isinstance(d, dict):
            raise ValueError(f"a quantity is a mapping, got {d!r}; write {{value: {d!r}, unit: ..., source: ...}}")
        v = d.get("value")
        if isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
            return {**d, "value": float(v)}
        return d


def _dim(dimension: str, positive: bool = False):
    def check(q: _QuantityIn) -> Quantity:
        if dimension == "count":
            if q.unit not in ("", "count") or q.value != int(q.value) or not 1 <= q.value <= MAX_COUNT:
                raise ValueError(f"expected a whole count in 1..{MAX_COUNT} (unit 'count'), got {q.value!r} "
                                 f"{q.unit!r}; write e.g. {{value: 8, unit: count, source: ...}}")
            return Quantity(float(q.value), q.source)
        try:
            base = convert(q.value, q.unit, dimension, "unit")
        except MemoError as e:
            raise ValueError(f"{str(e).split(': ', 1)[-1]}") from None
        lo, hi, text = RANGES[dimension]
        if positive and base == 0:
            raise ValueError(f"must be more than 0, got {q.value!r}; a zero {dimension} here divides or empties "
                             f"what it scales")
        if not (lo <= base <= hi) or (base == 0 and (positive or dimension not in ("time", "ratio"))):
            raise ValueError(f"{q.value!r} {q.unit} is outside the physical range of a {dimension} quantity "
                             f"({text}); check the value and its unit")
        return Quantity(base, q.source)
    return Annotated[_QuantityIn, AfterValidator(check)]


Bytes, Bandwidth, Flops, Time, Ratio, Count = (_dim(d) for d in ("bytes", "bandwidth", "flops", "time", "ratio",
                                                                  "count"))
Share = _dim("ratio", positive=True)  # a fraction that must not be zero (a rate or a capacity multiplies by it)
_Point = tuple[Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1e30)],
               Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]]


class _CurveIn(_In):
    x: Literal["FLOP"]
    points: list[_Point] = Field(min_length=1, max_length=4096)
    source: _NonEmpty

    @model_validator(mode="after")
    def _sorted(self):
        if any(b[0] <= a[0] for a, b in zip(self.points, self.points[1:])):
            raise ValueError("points must be sorted by strictly increasing flops; sort them")
        return self

    def typed(self) -> Curve:
        return Curve(tuple((float(a), float(b)) for a, b in self.points), self.source)


_Seconds = Annotated[float, Field(strict=False, allow_inf_nan=False, gt=0, le=3600)]
_Positive = Annotated[int, Field(strict=True, ge=1, le=1 << 30)]


class _AttentionTimeIn(_In):
    kernel: Literal[ATTENTION_TIME_KERNELS]
    heads: _Positive
    head_dim: _Positive
    seq: _Positive
    fwd_s: _Seconds
    bwd_s: _Seconds


class _AttentionTimesIn(_In):
    """``{rows: [{kernel: whole, heads: 8, head_dim: 32, seq: 1024, fwd_s: 0.031, bwd_s: 0.052}, ...],
    source: ...}`` (`memo_sim.profile.schema.AttentionTimes`)."""

    rows: list[_AttentionTimeIn] = Field(min_length=1)
    source: _NonEmpty

    def typed(self) -> AttentionTimes:
        return AttentionTimes(tuple((r.kernel, r.heads, r.head_dim, r.seq, float(r.fwd_s), float(r.bwd_s))
                                    for r in self.rows), self.source)


class _AllocatorIn(_In):
    sync: Time
    cuda_malloc_latency: Time
    cuda_malloc_throughput: Bandwidth
    cuda_free_latency: Time
    cuda_free_throughput: Bandwidth


class _CapabilityIn(_In):
    """``gpu.compute_capability``: {value: "10.0", source: ...} (major.minor, as torch.cuda.get_device_capability)."""
    value: Annotated[str, StringConstraints(strict=True, pattern=r"^\d{1,2}\.\d$")]
    source: _NonEmpty


class _GPUIn(_In):
    model: _NonEmpty
    memory: Bytes
    reserved: Bytes
    peak_flops: dict[Annotated[str, StringConstraints(strict=True, pattern=r"^[a-z0-9_]+$")], Flops] = \
        Field(min_length=1)
    hbm_bandwidth: Bandwidth
    copy_compute_slowdown: Ratio
    allocator: _AllocatorIn | None = None  # optional: profiles written before it exist
    compute_capability: _CapabilityIn | None = None  # optional: profiles written before it exist
    sm_count: Count | None = None  # optional, both or neither: profiles written before them exist
    comm_sms: Count | None = None

    @model_validator(mode="after")
    def _reserved_below_memory(self):
        if float(self.reserved) >= float(self.memory):
            raise ValueError("reserved must be smaller than memory; check both values and units")
        if (self.sm_count is None) != (self.comm_sms is None):
            raise ValueError("sm_count and comm_sms go together (the SMs an NCCL kernel holds out of the GPU's): "
                             "give both, or neither (no SM contention priced)")
        if self.sm_count is not None and float(self.comm_sms) >= float(self.sm_count):
            raise ValueError(f"comm_sms ({float(self.comm_sms):g}) must be fewer than sm_count "
                             f"({float(self.sm_count):g}): an NCCL kernel holds some of the GPU's SMs, not all")
        return self


_BLOCK_EXTRAS = ("attention_block_causal_fwd", "attention_block_causal_bwd", "attention_block_fwd_score_time",
                 "attention_block_bwd_score_time")
_EFFICIENCY_TIMES = ("attention_fwd_score_time", "attention_bwd_score_time", "kernel_latency",
                     "attention_block_fwd_score_time", "attention_block_bwd_score_time")
_EFFICIENCY_CURVES = ("attention_cudnn_fwd", "attention_cudnn_bwd", "attention_flash_triton_fwd",
                      "attention_flash_triton_bwd", "attention_block_fwd", "attention_block_bwd",
                      "attention_block_causal_fwd", "attention_block_causal_bwd")


class _EfficiencyIn(_In):
    gemm: _CurveIn
    attention_fwd: _CurveIn
    attention_bwd: _CurveIn
    elementwise: Share
    attention_fwd_score_time: Time | None = None  # optional: profiles written before memo measured them
    attention_bwd_score_time: Time | None = None
    kernel_latency: Time | None = None
    attention_cudnn_fwd: _CurveIn | None = None  # optional: cuDNN's fused attention (default: the curves above)
    attention_cudnn_bwd: _CurveIn | None = None
    # optional: FlashAttention's Triton kernel (default: none, a layout running it is refused)
    attention_flash_triton_fwd: _CurveIn | None = None
    attention_flash_triton_bwd: _CurveIn | None = None
    # optional: ring CP's block kernel where it is not the whole-sequence one (`Efficiency`'s docs)
    attention_block_fwd: _CurveIn | None = None
    attention_block_bwd: _CurveIn | None = None
    attention_block_causal_fwd: _CurveIn | None = None
    attention_block_causal_bwd: _CurveIn | None = None
    attention_block_fwd_score_time: Time | None = None
    attention_block_bwd_score_time: Time | None = None
    attention_times: _AttentionTimesIn | None = None  # optional: the kernels timed at given shapes
    # optional: a quantised GEMM format's own curve (`memo_sim.model.gemm_formats` names: fp8-tensorwise, ...),
    # efficiency against that format's peak; a format without one runs at the gemm curve's fractions
    gemm_formats: dict[str, _CurveIn] | None = None

    @model_validator(mode="after")
    def _pairs(self):
        for a, b in (("attention_cudnn_fwd", "attention_cudnn_bwd"),
                     ("attention_flash_triton_fwd", "attention_flash_triton_bwd"),
                     ("attention_block_fwd", "attention_block_bwd"),
                     ("attention_block_causal_fwd", "attention_block_causal_bwd")):
            if (getattr(self, a) is None) != (getattr(self, b) is None):
                raise ValueError(f"efficiency.{a} and {b} go together; give both or neither")
        if self.attention_block_fwd is None:
            extra = [k for k in _BLOCK_EXTRAS if getattr(self, k) is not None]
            if extra:
                raise ValueError(f"efficiency.{extra[0]} describes the ring's block kernel beside "
                                 "attention_block_fwd and attention_block_bwd; give those too or leave it out")
        return self


class _NodeIn(_In):
    gpus_per_node: Count
    gpus_per_host: Count | None = None  # GPUs one OS instance (torchrun's node) drives, where fewer than the node's


class _CollectiveFitIn(_In):
    bandwidth: Bandwidth
    latency: Time


class _LinkIn(_In):
    bandwidth: Bandwidth
    latency: Time
    # a measured fit per collective (`memo_sim.profile.schema.COLLECTIVES`), optional
    collectives: dict[Literal[COLLECTIVES], _CollectiveFitIn] | None = None

    def typed(self) -> Link:
        fits = {k: CollectiveFit(f.bandwidth, f.latency) for k, f in (self.collectives or {}).items()}
        return Link(self.bandwidth, self.latency, fits)


class _HostLinkIn(_In):
    d2h_bandwidth: Bandwidth
    h2d_bandwidth: Bandwidth
    latency: Time
    gpus_per_pcie_switch: Count
    pcie_switch_bandwidth: Bandwidth
    gpus_per_socket: Count


class _PinnedIn(_In):
    value: Literal[PINNED_ROUNDING]
    source: _NonEmpty


class _HostIn(_In):
    memory: Bytes
    usable_fraction: Share
    memory_bandwidth: Bandwidth
    pinned_rounding: _PinnedIn


class _ValidationIn(_In):
    """The validation error measured for this profile: predicted against measured iteration times
    of plans run on the device (``memo-exec validate``), as fractions (0.12 = 12%)."""
    median_abs_iteration_error: float = Field(strict=False, ge=0.0, allow_inf_nan=False)
    mean_abs_iteration_error: float | None = Field(None, strict=False, ge=0.0, allow_inf_nan=False)
    max_abs_iteration_error: float | None = Field(None, strict=False, ge=0.0, allow_inf_nan=False)
    plans: int = Field(strict=True, ge=1)
    device: _NonEmpty
    date: _NonEmpty
    kendall_tau: float | None = Field(None, strict=False, ge=-1.0, le=1.0, allow_inf_nan=False)
    report: str = Field("", strict=True)  # the validation.json the numbers come from
    tool: str = Field("memo-exec validate", strict=True)
    note: str = Field("", strict=True)


class _ProfileIn(_In):
    schema_: Literal[SCHEMA] = Field(alias="schema")
    name: _NonEmpty
    description: str = Field("", strict=True)
    provenance: dict[str, Any] | None = None
    validation: _ValidationIn | None = None
    gpu: _GPUIn
    efficiency: _EfficiencyIn
    node: _NodeIn
    nvlink: _LinkIn
    internode: _LinkIn
    host_link: _HostLinkIn
    host: _HostIn


def parse_profile(raw: Any, source: str) -> HardwareProfile:
    """Validate a profile's raw mapping (pydantic, once) into a `HardwareProfile`; the first
    problem is a `ProfileError` of one line naming the file, the field and the fix."""
    if isinstance(raw, dict) and raw.get("schema") != SCHEMA and ("schema" not in raw or "gpu" not in raw):
        what = ("a memo plan" if str(raw.get("schema", "")).startswith("memo-plan/")
                else f"schema {raw['schema']!r}" if "schema" in raw else "no 'schema' line")
        raise ProfileError(f"{source}: not a memo hardware profile ({what}); --profile takes a name `memo-sim "
                           f"profiles` lists or a YAML with 'schema: {SCHEMA}' (copy one of hardware_profiles/, "
                           f"or measure one with memo-exec calibrate)")
    d = validated(_ProfileIn, raw, source, ProfileError)
    check_profile(d, raw, source)  # each datasheet field plausible, the fields consistent (plausible.py)
    _narrow_peaks_bounded(dict(d.gpu.peak_flops), raw, source)
    g, e, hl, h = d.gpu, d.efficiency, d.host_link, d.host
    al = g.allocator
    return HardwareProfile(
        name=d.name,
        description=d.description,
        gpu=GPUSpec(g.model, g.memory, g.reserved, dict(g.peak_flops), g.hbm_bandwidth, g.copy_compute_slowdown,
                    AllocatorCosts(al.sync, al.cuda_malloc_latency, al.cuda_malloc_throughput, al.cuda_free_latency,
                                   al.cuda_free_throughput) if al is not None else DEFAULT_ALLOCATOR_COSTS,
                    tuple(int(x) for x in g.compute_capability.value.split(".")) if g.compute_capability else None,
                    g.sm_count, g.comm_sms),
        efficiency=Efficiency(e.gemm.typed(), e.attention_fwd.typed(), e.attention_bwd.typed(), e.elementwise,
                              **{k: q for k in _EFFICIENCY_TIMES if (q := getattr(e, k)) is not None},
                              **{k: c.typed() for k in _EFFICIENCY_CURVES if (c := getattr(e, k)) is not None},
                              attention_times=e.attention_times.typed() if e.attention_times is not None else None,
                              gemm_formats=tuple((k, c.typed()) for k, c in sorted((e.gemm_formats or {}).items()))),
        gpus_per_node=d.node.gpus_per_node,
        gpus_per_host=d.node.gpus_per_host,
        nvlink=d.nvlink.typed(),
        internode=d.internode.typed(),
        host_link=HostLink(hl.d2h_bandwidth, hl.h2d_bandwidth, hl.latency, hl.gpus_per_pcie_switch,
                           hl.pcie_switch_bandwidth, hl.gpus_per_socket),
        host=HostSpec(h.memory, h.usable_fraction, h.memory_bandwidth, h.pinned_rounding.value,
                      h.pinned_rounding.source),
        path=source,
        provenance=dict(d.provenance or {}),
        validation=d.validation.model_dump() if d.validation is not None else {},
    )


# the most a narrow format's dense peak is of the bf16 one, by bits (`PRECISION_BITS`): every datasheet's FP8 (and
# MXFP8, FP6) rate is twice its bf16 one (H100, H200, B200, GB200, GB300), FP4 four times (B200, GB200) to six
# (Blackwell Ultra GB300: 15 of 2.5 PFLOP/s dense); a little over, so that a datasheet rounding passes and a
# sparse or mistyped peak (fp8 19790 on an H100: 20x) does not
NARROW_PEAK_MAX = {8: 2.5, 6: 2.5, 4: 6.5}


def _narrow_peaks_bounded(peaks: dict, raw: Any, source: str) -> None:
    """A `ProfileError` of one line where an FP8/FP6/FP4 peak is more than `NARROW_PEAK_MAX` times the bf16 one
    (plausible.py orders the peaks from below only)."""
    bf16 = peaks.get("bf16")
    if not bf16:
        return
    for key, value in peaks.items():
        most = NARROW_PEAK_MAX.get(PRECISION_BITS.get(key, 0))
        if most is not None and float(value) > most * float(bf16):
            written = raw["gpu"]["peak_flops"][key]
            written = f"{written.get('value')} {written.get('unit', '')}" if isinstance(written, dict) else written
            raise ProfileError(f"{source}: gpu.peak_flops.{key}: {written} is "
                               f"{float(value) / float(bf16):.1f}x gpu.peak_flops.bf16, more than {most}x (no GPU's "
                               f"datasheet has more); check the value and its unit (dense, not sparse)")


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


# parsed profiles by (file as named, its text): the file is read on every load (a profile written again, by
# `memo-exec calibrate` or `validate` or by hand, is the new one), the YAML parse and the validation done once per
# text, where a what-if, a plan check and the executor each loaded it again (4-10 ms a load; 1,564 loads, about 8%
# of a 500-plan property test, 2026-12-02). `HardwareProfile` is frozen, so callers share one.
_PARSED: dict[tuple[str, str], HardwareProfile] = {}


def _parse_file(path: Path) -> HardwareProfile:
    """`parse_profile` of the file at ``path`` (its errors name ``path`` as given)."""
    try:
        text = read_utf8(path, ProfileError)
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror})") from None
    key = (str(path), text)
    hit = _PARSED.get(key)
    if hit is None:
        if len(_PARSED) >= 64:  # a long session's many files (tests write hundreds): the oldest first
            del _PARSED[next(iter(_PARSED))]
        hit = _PARSED[key] = parse_profile(profile_document(text, str(path), path.suffix == ".json"), str(path))
    return hit


class _Twice(Exception):
    """A key given twice in one JSON object."""


def profile_document(text: str, source: str, json_file: bool) -> Any:
    """A profile file's document: JSON, or YAML as `memo_sim.fileio.load_yaml` reads it. A key given twice in
    one mapping (``hbm_bandwidth:`` twice under ``gpu:``) is a `ProfileError` naming it: YAML and JSON keep the
    last one silently, which hides the value a reader of the file sees first."""
    kind = "JSON" if json_file else "YAML"
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs) if json_file else load_yaml(text)
    except (_Twice, DuplicateKeyError) as e:
        where = e.args[0] if isinstance(e, _Twice) else str(e)
        raise ProfileError(f"{source}: {where}") from None
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProfileError(f"{source}: not valid {kind} ({first})") from None
    except RecursionError:
        raise ProfileError(f"{source}: nested too deeply to be a profile; check the file") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object's pairs as a dict; a key given twice raises `_Twice`."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(f"key {k!r} is given twice in one object; JSON keeps the last one silently: delete one "
                         f"of them")
        out[k] = v
    return out


def list_profiles() -> dict[str, Path]:
    """Profile name -> file, first folder wins."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.iterdir()):
            if p.suffix in (".yaml", ".yml", ".json") and p.stem not in found:
                found[p.stem] = p
    return found


def _declared_name(path: Path) -> str | None:
    """The ``name:`` a profile file declares (its top-level key; JSON's "name"), or None."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r'^\s*"?name"?\s*:\s*"?([^"\s,]+)"?', text, re.MULTILINE)
    return m.group(1) if m else None


def load_profile(name_or_path: str | os.PathLike) -> HardwareProfile:
    """Load a profile by name (see `list_profiles`) or by file path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.exists():
            raise ProfileError(f"{p}: no such profile file (a plan records its profile file's path: put the file "
                               f"there or beside the plan, or pass --profile FILE)")
        return _parse_file(p)
    known = list_profiles()
    if str(name_or_path) not in known:  # a profile is also found by its own name: field (answers print that one)
        named = [f for f in known.values() if _declared_name(f) == str(name_or_path)]
        if len(named) == 1:
            return _parse_file(named[0])
        asked = str(name_or_path).lower()
        same = [k for k in known if k.lower() == asked]  # the name in other case (a review: H100-SXM5-80GB refused
        if len(same) == 1:  # where --model Llama-3.1-70B was found): the profile it names, by its own name
            return _named(_parse_file(known[same[0]]), same[0])
        near = sorted(k for k in known if k.startswith(asked)) or difflib.get_close_matches(asked, known, n=2,
                                                                                             cutoff=0.6)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise ProfileError(
            f"profile {str(name_or_path)!r} not found; {hint}known: {', '.join(sorted(known)) or 'none'} "
            f"(or pass a file path, or add a folder to $MEMO_PROFILES)"
        )
    return _named(_parse_file(known[str(name_or_path)]), str(name_or_path))


def _named(profile: HardwareProfile, asked: str) -> HardwareProfile:
    """``profile``, found by its file name ``asked``, where its ``name:`` is ``asked`` too; else a `ProfileError`.
    Every answer prints the ``name:`` and a plan records the profile by name, which the loader looks up again
    (`memo_sim.plan.schema.with_profile_reference`): a copy of b200-180gb.yaml saved as my-b200.yaml with its
    ``name:`` kept printed ``(b200-180gb)`` on its own numbers, and its plan re-priced on the stock B200 (a review:
    9.11 s predicted, 942.68 ms re-simulated, no warning). A file found by the name it declares is consistent by
    construction; one loaded by its path is recorded by that path."""
    if profile.name == asked:
        return profile
    raise ProfileError(f"{profile.path}: name: is {profile.name!r}, but the file was found as profile {asked!r} "
                       f"(its file name); answers print the name: and plans look the profile up by it again, so the "
                       f"two must agree: set `name: {asked}` in the file (or pass the file's path to --profile)")
