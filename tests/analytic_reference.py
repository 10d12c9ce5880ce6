"""Test reference: the schedule's critical path, layer by layer, without SimPy (the engine's
no-contention reference; only the tests use it).

Same inputs as the engine (one place per fact): per-phase critical times of the OpCost lists
(`memo_sim.cost.layer_time.critical_time`), host copies at `host_copy_time` with every GPU of the
node copying, boundary and gradient-collective times from `memo_sim.engine.schedules`. The same
dependencies as `build_iteration`, at layer granularity, as a max-plus recurrence:

    fwd_start(i)   = max(fwd_end(i-1), weight_gather_end(i))         (ZeRO >= 1)
    fwd_end(i)     = max(fwd_start(i) + F - F_last, offload_end(i-1)) + F_last
                     (F_last: the op writing layer i+1's input into the rounding buffer)
    offload_end(i) = max(fwd_end(i), offload_end(i-1)) + O            (i < n-2, offloading policies)
    prefetch_end(i)= max(bwd_end(i+2), prefetch_end(i+1)) + P
    bwd_end(i)     = max(bwd_end(i+1), prefetch_end(i), zero3_gather_end(i)) + R(i) + Bw   (ZeRO-3)
    gradient buckets on the dp stream: max(bwd_end(i), previous bucket) + sync

When copies hide under compute and there is no data parallelism this is the plain sum of the
compute critical path (embedding + n·F + classifier + n·(R + Bw) + optimizer), and it equals
`memo_sim.search.estimate.estimate_iteration`. When they do not, it is exact where the
estimate's per-layer max(F, O) is an approximation.
"""

from __future__ import annotations

from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.layer_time import critical_time
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.cost.transfer import host_copy_time
from memo_sim.engine.schedules import layer_plan, representative_device
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.model.config import ModelConfig
from memo_sim.policy import Policy
from memo_sim.policy.rounding_buffers import output_write_waits_for
from memo_sim.profile.schema import HardwareProfile


def analytic_iteration_time(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                            profile: HardwareProfile, *,
                            classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> float:
    """Iteration seconds along the schedule's critical path with no link contention."""
    dev = representative_device(layout, profile)
    mem = memory_breakdown(model, layout, batch, seq, policy, profile, classifier_chunk_tokens,
                           active_gpus_per_node=dev.group)
    lp = layer_plan(model, layout, batch, seq, policy, profile, mem)
    bt = boundary_times(model, layout, batch, seq, profile)
    sync = grad_sync(model, layout, profile)
    f, b, r = critical_time(lp.forward), critical_time(lp.backward), critical_time(lp.recompute)
    o = host_copy_time(lp.offload_bytes, profile, "d2h", dev.group)
    p = host_copy_time(lp.offload_bytes, profile, "h2d", dev.group)
    n = model.layers
    ag = sync.layer_gather

    c = bt.embedding_fwd
    dp = 0.0  # the dp_comm stream is free from here
    fwd_end: dict[int, float] = {}
    off_end: dict[int, float] = {}
    d2h = 0.0
    for i in range(n):
        start = c
        if ag > 0:
            dp = max(dp, fwd_end.get(i - 2, 0.0)) + ag
            start = max(start, dp)
        last = lp.forward[-1].seconds
        c = start + f - last
        j = output_write_waits_for(i, n)
        if j in off_end:
            c = max(c, off_end[j])
        c += last
        fwd_end[i] = c
        if i < lp.offloaded_layers and lp.offload_bytes > 0:
            d2h = max(c, d2h) + o
            off_end[i] = d2h
    c += bt.classifier
    gather_b: dict[int, float] = {}
    if sync.gather_in_backward:
        for i in (n - 1, n - 2):
            if i >= 0:
                dp = max(dp, fwd_end[n - 1]) + ag
                gather_b[i] = dp
    if sync.active and sync.head_grad + sync.mtp_grad > 0:  # the head's bucket, complete after the head
        dp = max(dp, c) + sync.head_grad + sync.mtp_grad
    h2d = 0.0
    bwd_end: dict[int, float] = {}
    for i in range(n - 1, -1, -1):
        start = c
        if i in gather_b:
            start = max(start, gather_b[i])
        if i in off_end:
            h2d = max(bwd_end.get(i + 2, 0.0), h2d) + p
            start = max(start, h2d)
        rec = r if policy.recomputes_layer(i, n) else 0.0
        c = start + rec + b
        bwd_end[i] = c
        if sync.gather_in_backward and i - 2 >= 0:
            dp = max(dp, c) + ag
            gather_b[i - 2] = dp
        if sync.active:
            dp = max(dp, c) + sync.layer_grad
    c += bt.embedding_bwd
    if sync.active:
        dp = max(dp, c) + sync.embedding_grad
        c = max(c, dp)
    c += bt.optimizer
    return c
