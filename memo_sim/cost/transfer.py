"""GPU <-> host copies: shared PCIe bandwidth and pinned host allocation rounding.

When ``active`` GPUs copy at once, each gets the least of its own link, its share of its PCIe
switch's uplink and its share of the node's host-memory bandwidth.
"""

from __future__ import annotations

import math

from memo_sim.profile.schema import HardwareProfile
from memo_sim.units import PAGE_BYTES



def host_bandwidth_per_gpu(profile: HardwareProfile, direction: str, active_gpus: int) -> float:
    """Bytes/s one GPU gets for a host copy while ``active_gpus`` GPUs of its node copy too.

    GPUs are packed onto switches in order, so with k active GPUs a switch carries
    min(k, gpus_per_pcie_switch) of them.
    """
    hl = profile.host_link
    link = float(hl.d2h_bandwidth if direction == "d2h" else hl.h2d_bandwidth)
    active = max(1, min(active_gpus, profile.node_gpus))
    per_switch = min(active, int(hl.gpus_per_pcie_switch.value))
    switch_share = float(hl.pcie_switch_bandwidth) / per_switch
    host_share = profile.host_memory_bandwidth(active) / active
    return min(link, switch_share, host_share)


def host_copy_time(nbytes: float, profile: HardwareProfile, direction: str, active_gpus: int) -> float:
    if nbytes <= 0:
        return 0.0
    return float(profile.host_link.latency) + nbytes / host_bandwidth_per_gpu(profile, direction, active_gpus)


def pinned_bytes(nbytes: float, rounding: str) -> float:
    """Host bytes a pinned allocation of ``nbytes`` really takes."""
    if nbytes <= 0:
        return 0.0
    if rounding == "power_of_two":
        return float(2 ** math.ceil(math.log2(nbytes)))
    if rounding == "page":
        return float(math.ceil(nbytes / PAGE_BYTES) * PAGE_BYTES)
    return float(nbytes)
