"""What a validated hardware profile must also be: plausible per field, consistent across fields (`check_profile`).

The loader's schema checks each quantity against its dimension's physical range (1 B .. 1 EiB, 1 KB/s .. 10 PB/s):
wide enough that a 1000x unit slip passes (``gpu.memory: {value: 80, unit: TB}``, ``hbm_bandwidth: {value: 3.35,
unit: GB/s}``, a bf16 peak in GFLOP/s) and the what-if answers on it. Here, after that:

* each datasheet field against the range of the devices it describes (`ACCELERATOR`: every GPU from a V100 to a
  GB300, with room on both sides; `CPU`: a profile ``memo-exec calibrate --device cpu`` writes, whose
  ``provenance.device_kind`` is ``cpu``). A field the profile's ``provenance.measured_fields`` lists is not
  range-checked: ``memo-exec calibrate`` measured it on the device and wrote its unit itself (no one typed it), and
  a slow device's measurement is what it did;
* the peaks' order: a narrower floating-point format's dense peak is at least a wider one's where both are given
  (fp32 <= tf32 <= bf16, fp16 <= fp8 <= fp6 <= fp4), on accelerators (a CPU without bf16 instructions runs bf16
  slower than fp32);
* the counts: ``node.gpus_per_host`` divides ``node.gpus_per_node`` (hosts of equal size), and
  ``host_link.gpus_per_socket`` is at most the GPUs of one host and divides them (a calibrated profile's node is the
  GPUs it saw, 6 of an 8-GPU box say, whose sockets it may fill unevenly: there only "at most").

``efficiency.gemm_formats``' keys name GEMM formats, which are registered downstream of the profile
(`memo_sim.model.gemm_formats`): `memo_sim.cost.gemm_format.check_profile_gemm_formats` checks them, for the
what-if and for `memo-sim profiles`' listing alike.

The first problem is a `ProfileError` of one line naming the file, the field and the fix.
"""

from __future__ import annotations

import math
from typing import Any

from memo_sim.errors import ProfileError
from memo_sim.units import DIMENSIONS

GiB, TiB, PiB = 1024.0**3, 1024.0**4, 1024.0**5

# field -> (dimension, low, high, words), in base units. The accelerator numbers behind the words: NVIDIA's Tesla
# V100 datasheet (16 or 32 GB HBM2 at 900 GB/s, 15.7 TFLOP/s fp32, NVLink 2 at 300 GB/s both directions) and this
# repository's gb300-nvl72 / gb200-nvl72 profiles (their sources: 288 GB HBM3e at 8 TB/s, 15 PFLOP/s dense fp4,
# NVLink 5 at 900 GB/s a direction, 17 TB and 18.4 TB/s of Grace memory a rack).
ACCELERATOR: dict[str, tuple[str, float, float, str]] = {
    "gpu.memory": ("bytes", 1 * GiB, 2 * TiB, "1 GiB .. 2 TiB, a V100's 16 GB to a GB300's 288 GB with room"),
    "gpu.hbm_bandwidth": ("bandwidth", 1e11, 5e13, "100 GB/s .. 50 TB/s, a V100's 900 GB/s to a GB300's 8 TB/s"),
    "gpu.peak_flops": ("flops", 1e12, 1e17, "1 TFLOP/s .. 100 PFLOP/s dense, a V100's 15.7 TFLOP/s fp32 to a "
                                            "GB300's 15 PFLOP/s fp4"),
    "nvlink.bandwidth": ("bandwidth", 1e9, 2e12, "1 GB/s .. 2 TB/s a direction, PCIe peer copies to NVLink 5's "
                                                 "900 GB/s"),
    "internode.bandwidth": ("bandwidth", 1e8, 2.5e11, "100 MB/s .. 250 GB/s per GPU and direction, a share of one "
                                                      "10 GbE port to 2 Tb/s a GPU"),
    "host_link.d2h_bandwidth": ("bandwidth", 1e9, 2e12, "1 GB/s .. 2 TB/s, PCIe to NVLink-C2C"),
    "host_link.h2d_bandwidth": ("bandwidth", 1e9, 2e12, "1 GB/s .. 2 TB/s, PCIe to NVLink-C2C"),
    "host_link.pcie_switch_bandwidth": ("bandwidth", 1e9, 2e12, "1 GB/s .. 2 TB/s, PCIe to NVLink-C2C"),
    "host.memory": ("bytes", 1 * GiB, 1 * PiB, "1 GiB .. 1 PiB a node, a workstation to a GB200 NVL72 rack's "
                                               "17 TB"),
    "host.memory_bandwidth": ("bandwidth", 1e9, 1e14, "1 GB/s .. 100 TB/s a node, one DDR channel to a GB200 "
                                                      "NVL72 rack's 18.4 TB/s"),
}
# a CPU calibrated as a device (`memo-exec calibrate --device cpu`): its "GPU memory" is the budget of host RAM a
# rank may use, its links shared-memory copies; the ranges keep a small VM's and a large server's
CPU: dict[str, tuple[str, float, float, str]] = {
    "gpu.memory": ("bytes", 2.0**20, 64 * TiB, "1 MiB .. 64 TiB of host RAM as the device's budget"),
    "gpu.hbm_bandwidth": ("bandwidth", 1e7, 1e13, "10 MB/s .. 10 TB/s of RAM bandwidth"),
    "gpu.peak_flops": ("flops", 1e7, 1e16, "10 MFLOP/s .. 10 PFLOP/s"),
    "nvlink.bandwidth": ("bandwidth", 1e6, 1e13, "1 MB/s .. 10 TB/s"),
    "internode.bandwidth": ("bandwidth", 1e6, 1e13, "1 MB/s .. 10 TB/s"),
    "host_link.d2h_bandwidth": ("bandwidth", 1e6, 1e13, "1 MB/s .. 10 TB/s"),
    "host_link.h2d_bandwidth": ("bandwidth", 1e6, 1e13, "1 MB/s .. 10 TB/s"),
    "host_link.pcie_switch_bandwidth": ("bandwidth", 1e6, 1e13, "1 MB/s .. 10 TB/s"),
    "host.memory": ("bytes", 2.0**20, 1 * PiB, "1 MiB .. 1 PiB"),
    "host.memory_bandwidth": ("bandwidth", 1e7, 1e15, "10 MB/s .. 1 PB/s"),
}

# bits of the floating-point formats whose dense tensor-core peaks are ordered (integer formats are not: Blackwell
# Ultra cut its INT8 rate below its bf16 one); formats of equal width are not compared (a V100 has no bf16 units)
PRECISION_BITS = {"fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "fp8": 8, "mxfp8": 8, "fp6": 6, "mxfp6": 6,
                  "fp4": 4, "nvfp4": 4, "mxfp4": 4}


def check_profile(d: Any, raw: dict, source: str) -> None:
    """Refuse (`ProfileError`, one line) what the loader's schema let through in ``d`` (the validated profile,
    quantities in base units): module docs. ``raw`` is the file's mapping, for the value and unit as written."""
    prov = d.provenance or {}
    cpu = prov.get("device_kind") == "cpu"
    measured = prov.get("measured_fields")
    measured = {m for m in measured if isinstance(m, str)} if isinstance(measured, list) else set()

    def is_measured(field: str) -> bool:
        return any(field == m or field.startswith(m + ".") for m in measured)

    g = d.gpu
    fields = [("gpu.memory", g.memory), ("gpu.hbm_bandwidth", g.hbm_bandwidth),
              *((f"gpu.peak_flops.{k}", q) for k, q in g.peak_flops.items()),
              ("nvlink.bandwidth", d.nvlink.bandwidth), ("internode.bandwidth", d.internode.bandwidth),
              ("host_link.d2h_bandwidth", d.host_link.d2h_bandwidth),
              ("host_link.h2d_bandwidth", d.host_link.h2d_bandwidth),
              ("host_link.pcie_switch_bandwidth", d.host_link.pcie_switch_bandwidth),
              ("host.memory", d.host.memory), ("host.memory_bandwidth", d.host.memory_bandwidth)]
    table = CPU if cpu else ACCELERATOR
    for field, q in fields:
        dimension, lo, hi, words = table[field.rsplit(".", 1)[0] if field.startswith("gpu.peak_flops.") else field]
        if not is_measured(field) and not lo <= float(q) <= hi:
            who = "a CPU profile (provenance.device_kind: cpu)" if cpu else "a GPU or accelerator"
            value, unit = _written(raw, field)
            other = _unit_meant(value, unit, dimension, lo, hi)
            hint = f"did you mean {_num(value)} {other}? " if other else ""
            raise ProfileError(f"{source}: {field}: {_num(value)} {unit} is not plausible for {who} ({words}); "
                               f"{hint}check the value and its unit")
    if not cpu:
        _peaks_in_order(g.peak_flops, raw, source, is_measured)
    _counts(d, source)


def _peaks_in_order(peaks: dict, raw: dict, source: str, is_measured) -> None:
    """A narrower format's dense peak at least a wider one's (`PRECISION_BITS`)."""
    given = sorted((k for k in peaks if k in PRECISION_BITS), key=lambda k: -PRECISION_BITS[k])
    for i, wide in enumerate(given):
        for narrow in given[i + 1:]:
            if PRECISION_BITS[narrow] == PRECISION_BITS[wide] or is_measured(f"gpu.peak_flops.{narrow}") \
                    or is_measured(f"gpu.peak_flops.{wide}"):
                continue
            if float(peaks[narrow]) < float(peaks[wide]):
                nv, nu = _written(raw, f"gpu.peak_flops.{narrow}")
                wv, wu = _written(raw, f"gpu.peak_flops.{wide}")
                raise ProfileError(
                    f"{source}: gpu.peak_flops.{narrow}: {_num(nv)} {nu} is below gpu.peak_flops.{wide} "
                    f"({_num(wv)} {wu}); a narrower format's dense peak is at least a wider one's on every "
                    f"accelerator: check both values and units (dense, not sparse)")


def _counts(d: Any, source: str) -> None:
    """gpus_per_host divides gpus_per_node; gpus_per_socket at most (and, uncalibrated, a divisor of) one host's."""
    node = int(float(d.node.gpus_per_node))
    host = int(float(d.node.gpus_per_host)) if d.node.gpus_per_host is not None else None
    if host is not None and (host > node or node % host):
        raise ProfileError(
            f"{source}: node.gpus_per_host: {host} {'is more than' if host > node else 'does not divide'} "
            f"node.gpus_per_node ({node}); a node's GPUs are split evenly over its hosts: give one of "
            f"{_divisors(node)}, or leave gpus_per_host out where one host drives the whole node")
    per, name = (host, "node.gpus_per_host") if host is not None else (node, "node.gpus_per_node")
    socket = int(float(d.host_link.gpus_per_socket))
    prov = d.provenance or {}
    calibrated = prov.get("method") == "calibrated" or prov.get("tool") == "memo-exec calibrate"
    if socket > per or (per % socket and not calibrated):
        raise ProfileError(
            f"{source}: host_link.gpus_per_socket: {socket} {'is more than' if socket > per else 'does not divide'} "
            f"{name} ({per}); a host's GPUs are split evenly over its sockets: give one of {_divisors(per)}")


def _written(raw: dict, field: str) -> tuple[Any, str]:
    """(value, unit) of ``field`` as the file writes them."""
    node: Any = raw
    for part in field.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return (node.get("value"), str(node.get("unit", ""))) if isinstance(node, dict) else (None, "")


def _num(value: Any) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return repr(value)


def _family(unit: str) -> str:
    """decimal (GB, GB/s), binary (GiB, GiB/s) or bit (Gb/s, Gbit/s) units: a slip keeps the family."""
    if "bit" in unit or unit.endswith("b/s"):
        return "bit"
    return "binary" if "iB" in unit else "decimal"


def _unit_meant(value: Any, unit: str, dimension: str, lo: float, hi: float) -> str | None:
    """The unit of ``unit``'s family, nearest to it, that puts ``value`` in [lo, hi] (a unit slip's fix), or None."""
    table = DIMENSIONS[dimension]
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if unit not in table or v <= 0:
        return None
    fits = [u for u, f in table.items() if u and _family(u) == _family(unit) and lo <= v * f <= hi]
    return min(fits, key=lambda u: abs(math.log(table[u] / table[unit])), default=None)


def _divisors(n: int, most: int = 10) -> str:
    """The divisors of ``n`` in words (the first ``most``, then the largest)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    every = sorted(set(small + [n // k for k in small]))
    shown = every if len(every) <= most else every[:most - 1] + ["...", every[-1]]
    return ", ".join(str(k) for k in shown)
