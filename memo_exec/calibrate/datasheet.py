"""The shipped profile that describes a CUDA device, read from ``hardware_profiles/``.

The datasheet peaks (with their sources) and the fields a one-node box cannot measure live in
the shipped profiles, one place; calibrate reads them from there instead of keeping its own
table of GPU names. A profile describes a device when its ``gpu.model`` without a trailing
parenthesised note equals the name torch reports (case-insensitive): ``NVIDIA H100 80GB HBM3
(SXM5)`` describes ``NVIDIA H100 80GB HBM3``. Variants with other datasheet numbers (H100 PCIe,
H200 NVL, ...) match none, and calibrate then asks for ``--peak-tflops``. Only datasheet
profiles count (a calibrated file in the folder carries measured, not datasheet, peaks); the
first by file name wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memo_sim.profile.loader import REPO_PROFILES, load_profile
from memo_sim.profile.schema import HardwareProfile

FALLBACK_BASE = "h100-sxm5-80gb"  # the base for a CUDA device no shipped profile describes
_NOTE = re.compile(r"\s*\([^)]*\)\s*$")


@dataclass(frozen=True)
class PeakSpec:
    bf16_tflops: float
    fp32_tflops: float
    source: str


def _device_key(name: str) -> str:
    return " ".join(_NOTE.sub("", name).split()).casefold()


def shipped_profiles() -> list[HardwareProfile]:
    """The datasheet profiles shipped in ``hardware_profiles/``, by file name."""
    out = []
    for p in sorted(REPO_PROFILES.glob("*.yaml")):
        prof = load_profile(p)
        if not prof.calibrated:
            out.append(prof)
    return out


def profile_for_device(device_name: str) -> HardwareProfile | None:
    """The shipped datasheet profile of a CUDA device (``torch.cuda.get_device_name``), or None."""
    key = _device_key(device_name)
    return next((p for p in shipped_profiles() if _device_key(p.gpu.model) == key), None)


def known_peak(device_name: str) -> PeakSpec | None:
    """Dense bf16 and fp32 peaks of a CUDA device from its shipped profile, or None (never guessed)."""
    prof = profile_for_device(device_name)
    if prof is None or "bf16" not in prof.gpu.peak_flops or "fp32" not in prof.gpu.peak_flops:
        return None
    bf16, fp32 = prof.gpu.peak_flops["bf16"], prof.gpu.peak_flops["fp32"]
    return PeakSpec(bf16.value / 1e12, fp32.value / 1e12,
                    f"hardware_profiles/{prof.name}.yaml: bf16 {bf16.source}; fp32 {fp32.source}")


def default_base(device_name: str) -> str:
    """The shipped profile closest to a CUDA device (for fields a one-node box cannot measure)."""
    prof = profile_for_device(device_name)
    return prof.name if prof is not None else FALLBACK_BASE
