"""What the PyTorch caching allocator reserves for one layer's transient requests (unplanned runs).

One layer's forward and backward request traces are replayed back to back through the
caching-allocator model; since every layer repeats the same requests, the reserved peak of that
replay is the steady-state transient footprint of a run without a static memory plan.
"""

from __future__ import annotations

from functools import lru_cache

from memo_sim.layout.parallel import Layout
from memo_sim.layout.alloc_conf import merged_alloc_conf
from memo_sim.memplan.caching_allocator import AllocatorConfig, AllocatorReport, replay
from memo_sim.request_trace import RequestTrace
from memo_sim.memplan.trace_gen import _layer_backward_trace, layer_forward_trace, per_gpu_shard
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy


def layer_fwd_bwd_trace(model: ModelConfig, layout: Layout, batch: int, seq: int,
                        policy: Policy | None) -> RequestTrace:
    return _fwd_bwd_trace(model, layout, batch, seq, policy.recompute_fraction if policy is not None else 0.0)


def _fwd_bwd_trace(model: ModelConfig, layout: Layout, batch: int, seq: int, frac: float) -> RequestTrace:
    """The policy enters the trace only through its recompute fraction."""
    fwd = layer_forward_trace(model, layout, batch, seq)
    bwd = _layer_backward_trace(model, per_gpu_shard(layout), batch, seq, frac)
    shift = max(b.upper for b in fwd.buffers) + 1
    return RequestTrace(list(fwd.buffers) + [b.shifted(shift) for b in bwd.buffers], name="layer fwd+bwd")


def caching_allocator_layer_report(model: ModelConfig, layout: Layout, batch: int, seq: int,
                                   policy: Policy | None, capacity_bytes: int | None = None) -> AllocatorReport:
    """Memoised per model, GPU shard and the policy's recompute fraction: the what-if asks for it
    for every candidate."""
    frac = policy.recompute_fraction if policy is not None else 0.0  # the policy enters the trace only through it
    return _report(model, per_gpu_shard(layout), batch, seq, frac, capacity_bytes)


@lru_cache(maxsize=1 << 14)  # a cluster-scale query with pipelines replays a few thousand shards
def _report(model: ModelConfig, layout: Layout, batch: int, seq: int, frac: float,
            capacity_bytes: int | None) -> AllocatorReport:
    trace = _fwd_bwd_trace(model, layout, batch, seq, frac)
    cap = capacity_bytes or 8 * trace.max_live_bytes() + 2**30  # large enough to measure, not to fail
    conf = merged_alloc_conf(layout.expandable_segments, layout.alloc_conf)
    return replay(trace, AllocatorConfig.from_conf(int(cap), conf))
