"""SPPO's sequence-aware offload ratios (`memo_sim.search.sppo`'s "Offload ratios")."""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.sppo import (
    stage_gpu_shard,
    piece_timer,
    sequence_aware_alphas,
)
from memo_sim.cost.transfer import host_bandwidth_per_gpu
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import (
    PipelineMemory,
    SppoMemoryWalk,
    sppo_host_bytes_per_node,
)
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.sppo.estimate import _active
from memo_sim.search.sppo.points import AlphaChoice


# ------------------------------------------------------------------------------------------ alphas
def overlap_threshold(model: ModelConfig, layout: Layout, batch: int, policy: Sppo, profile: HardwareProfile,
                      active: int | None = None) -> float:
    """M_threshold = B·(T_min − latency): the bytes one unit may copy while the shortest
    subsequence's layer forward runs (``active``: the GPUs of a node copying at once, default
    the layout's, `memo_sim.search.sppo.estimate._active`)."""
    shard = stage_gpu_shard(layout)
    b = policy.bounds
    timer = piece_timer(model, shard, batch, profile)
    t_min = min(timer(b[i], b[i + 1] - b[i])[0] for i in range(policy.subseqs))
    bw = host_bandwidth_per_gpu(profile, "d2h", _active(layout, profile) if active is None else active)
    return max(0.0, bw * (t_min - float(profile.host_link.latency)))


def solve_alphas(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Sppo, profile: HardwareProfile,
                 threshold: float | None = None, steps: int = 10) -> tuple[Sppo, AlphaChoice, PipelineMemory]:
    """The sequence-aware offload ratios for ``policy``'s partition (module docs). Where no
    threshold satisfies both the GPU and the host, the plan returned fails on the one that the
    other's limit forces past capacity."""
    a_i = policy.subsequence_offloadable(model, layout, batch)
    top = max(a_i) if a_i else 0.0

    walk = SppoMemoryWalk(model, layout, batch, policy, profile)  # the partition's memory walk, at any alphas

    def at(m: float) -> tuple[Sppo, PipelineMemory]:
        pol = replace(policy, alphas=sequence_aware_alphas(a_i, m), threshold_bytes=m)
        return pol, walk.memory(pol)

    m = min(overlap_threshold(model, layout, batch, policy, profile) if threshold is None else threshold, top)
    binding = "overlap" if m < top else "none"
    pol, mem = at(m)
    if mem.breakdown.oom_by > 0 and m < top:  # raise the threshold until the stage fits
        hi_pol, hi_mem = at(top)
        if hi_mem.breakdown.oom_by > 0:
            pol, mem, m = hi_pol, hi_mem, top  # not even everything offloaded fits
        else:
            lo, hi = m, top
            pol, mem = hi_pol, hi_mem
            for _ in range(steps):
                mid = (lo + hi) / 2
                p2, m2 = at(mid)
                if m2.breakdown.oom_by > 0:
                    lo = mid
                else:
                    hi, pol, mem = mid, p2, m2
            m = hi
        binding = "gpu_memory"
    elif mem.breakdown.oohm_by > 0:  # lower it until the node's pinned memory holds the offload
        cap = profile.host_capacity(min(layout.gpus, profile.node_gpus))

        def host(mm: float) -> float:
            trial = replace(policy, alphas=sequence_aware_alphas(a_i, mm))
            return sppo_host_bytes_per_node(model, layout, batch, trial, profile)

        lo, hi = 0.0, m
        for _ in range(2 * steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if host(mid) <= cap else (lo, mid)
        m = lo
        pol, mem = at(m)
        binding = "host_memory"
    notes = {"overlap": "alpha_i·A_i = offload bytes hidden by the shortest subsequence's layer forward",
             "gpu_memory": "threshold raised until the stage fits the GPU (copies partly exposed)",
             "host_memory": "threshold lowered until pinned host memory holds the offload",
             "none": "every subsequence offloads all its rows within the overlap limit"}
    return pol, AlphaChoice(pol.alphas, m, binding, notes[binding]), mem
