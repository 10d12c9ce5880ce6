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
* the latencies (links, a collective's fitted step, a memory-bound op's call, the allocator's calls) and the
  allocator's throughputs, by the same ranges: a latency in seconds or milliseconds where microseconds were meant
  (NVLink at ``{value: 8, unit: s}`` or ``ms``) priced a what-if at up to 1632 s an iteration, exit 0 (a review);
* the counts: ``node.gpus_per_host`` divides ``node.gpus_per_node`` (hosts of equal size), and
  ``host_link.gpus_per_socket`` and ``host_link.gpus_per_pcie_switch`` are at most the GPUs of one host and divide
  them (a calibrated profile's node is the GPUs it saw, 6 of an 8-GPU box say, whose sockets and switches it may
  fill unevenly: there only "at most").

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
    # the latencies: every shipped profile assumes 8 us (NVLink), 12-15 us (inter-node over IB) and 10 us (a
    # cudaMemcpyAsync's launch); a GPU's transports reach down to about a microsecond (an NVLink hop, NCCL's LL
    # protocol) and up to tens of microseconds (a TCP socket between nodes): the ranges keep a decade on each side
    "nvlink.latency": ("time", 1e-7, 1e-4, "0.1 us .. 100 us per message, an NVLink hop to a PCIe peer copy"),
    "internode.latency": ("time", 1e-7, 1e-3, "0.1 us .. 1 ms per message, RDMA to a TCP socket"),
    "host_link.latency": ("time", 1e-7, 1e-4, "0.1 us .. 100 us per copy, a cudaMemcpyAsync's launch and setup"),
    # a collective's fitted per-step latency is a line's intercept (`memo_sim.cost.collectives.fit_params`): 0 is
    # a fit, not a slip (the committed CPU calibrations fit all_to_all at 0 us)
    "collectives.latency": ("time", 0.0, 1e-3, "0 .. 1 ms per step, a fitted intercept"),
    "efficiency.kernel_latency": ("time", 1e-7, 1e-3, "0.1 us .. 1 ms per memory-bound op call, a kernel launch "
                                                      "and its operands' first touch"),
    # PyTorch's caching allocator's device calls (`memo_sim.profile.schema.AllocatorCosts`): the shipped profiles
    # assume 20 us per synchronise and 50 us per cudaMalloc / cudaFree, 2 and 1 TB/s mapped and unmapped
    "gpu.allocator.sync": ("time", 1e-7, 1e-2, "0.1 us .. 10 ms per reorganisation's synchronise"),
    "gpu.allocator.cuda_malloc_latency": ("time", 1e-7, 1e-2, "0.1 us .. 10 ms per cudaMalloc call"),
    "gpu.allocator.cuda_free_latency": ("time", 1e-7, 1e-2, "0.1 us .. 10 ms per cudaFree call"),
    "gpu.allocator.cuda_malloc_throughput": ("bandwidth", 1e9, 1e14, "1 GB/s .. 100 TB/s of device memory mapped"),
    "gpu.allocator.cuda_free_throughput": ("bandwidth", 1e9, 1e14, "1 GB/s .. 100 TB/s of device memory unmapped"),
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
    # gloo over shared memory or loopback TCP: the committed CPU calibrations measured 1 ms send/recv and 1-8 ms
    # collective steps (measured, so not range-checked; a hand-written CPU profile gets these ranges)
    "nvlink.latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "internode.latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "host_link.latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "collectives.latency": ("time", 0.0, 0.1, "0 .. 100 ms per step, a fitted intercept"),
    "efficiency.kernel_latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "gpu.allocator.sync": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "gpu.allocator.cuda_malloc_latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "gpu.allocator.cuda_free_latency": ("time", 1e-7, 0.1, "0.1 us .. 100 ms"),
    "gpu.allocator.cuda_malloc_throughput": ("bandwidth", 1e6, 1e15, "1 MB/s .. 1 PB/s"),
    "gpu.allocator.cuda_free_throughput": ("bandwidth", 1e6, 1e15, "1 MB/s .. 1 PB/s"),
}

ALLOCATOR_FIELDS = ("sync", "cuda_malloc_latency", "cuda_malloc_throughput", "cuda_free_latency",
                    "cuda_free_throughput")

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
              ("host.memory", d.host.memory), ("host.memory_bandwidth", d.host.memory_bandwidth),
              ("nvlink.latency", d.nvlink.latency), ("internode.latency", d.internode.latency),
              ("host_link.latency", d.host_link.latency),
              *((f"{name}.collectives.{k}.latency", fit.latency) for name, link in (("nvlink", d.nvlink),
                                                                                   ("internode", d.internode))
                for k, fit in (link.collectives or {}).items())]
    if d.efficiency.kernel_latency is not None:
        fields.append(("efficiency.kernel_latency", d.efficiency.kernel_latency))
    if g.allocator is not None:  # absent: `DEFAULT_ALLOCATOR_COSTS`, not the file's
        fields += [(f"gpu.allocator.{k}", getattr(g.allocator, k)) for k in ALLOCATOR_FIELDS]
    table = CPU if cpu else ACCELERATOR
    for field, q in fields:
        dimension, lo, hi, words = table[_range_key(field)]
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


def _range_key(field: str) -> str:
    """The `ACCELERATOR` / `CPU` key of ``field``: a dtype's peak takes gpu.peak_flops', a collective's fitted latency
    (nvlink.collectives.all_gather.latency) ``collectives.latency``."""
    parts = field.split(".")
    if field.startswith("gpu.peak_flops."):
        return "gpu.peak_flops"
    if len(parts) == 4 and parts[1] == "collectives":
        return "collectives.latency"
    return field


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
    """gpus_per_host divides gpus_per_node; gpus_per_socket and gpus_per_pcie_switch at most (and, uncalibrated, a
    divisor of) one host's."""
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
    # a PCIe switch (a GB200's NVLink-C2C link) sits in one host and its uplink is shared by the GPUs under it
    # (`memo_sim.cost.transfer`: min(copying GPUs, gpus_per_pcie_switch) share it): more than a host's GPUs, or
    # switches holding unequal counts, is no host's board (a review: 16 on an 8-GPU node priced 10.78 s, not 2.76 s)
    switch = int(float(d.host_link.gpus_per_pcie_switch))
    for field, count, what in (("host_link.gpus_per_socket", socket, "sockets"),
                               ("host_link.gpus_per_pcie_switch", switch, "PCIe switches")):
        if count > per or (per % count and not calibrated):
            raise ProfileError(
                f"{source}: {field}: {count} {'is more than' if count > per else 'does not divide'} {name} ({per}); "
                f"a host's GPUs are split evenly over its {what}: give one of {_divisors(per)}")


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
