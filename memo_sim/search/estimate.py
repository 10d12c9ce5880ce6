"""Analytic iteration estimate: perfect overlap, no link contention (tier 1 of the what-if).

Per layer on one GPU (from `memo_sim.cost.layer_time`):
- F = forward critical time, Bw = backward critical time, R = recompute time (full forward for
  full_recompute, (1-alpha) of the token-wise ops for memo), O / P = offload / prefetch time of
  the layer's host bytes at the per-GPU share of the host links while every GPU of the node copies.
- Offloaded layers (all but the last two) run forward at max(F, O): layer i+2 waits until buffer
  i%2 is on the host. Their backward runs at max(Bw + R, P): layer i's prefetch runs while layer
  i+1 computes its backward. The last two layers keep their activations in the rounding buffers.
- ``batch`` is sequences per data-parallel replica (the iteration trains batch x dp sequences).
- Iteration = embedding + sum of layer forwards + classifier (forward + backward) + sum of layer
  backwards + exposed gradient sync (the last layer's bucket; the rest overlaps the backward)
  + optimizer step (+ ZeRO-1/2's all-gather of the updated weights).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import skeletal_bytes, tokens_per_gpu
from memo_sim.cost.flops import classifier_flops, mfu, model_flops_per_iteration, tgs
from memo_sim.cost.kernel_time import gemm_time, memory_bound_time
from memo_sim.cost.layer_time import (
    backward_costs, critical_time, forward_costs, full_recompute_costs, recompute_costs,
)
from memo_sim.cost.memory import BYTES_GRAD, BYTES_OPTIM, BYTES_WEIGHT, offloaded_bytes_per_layer
from memo_sim.cost.transfer import host_bandwidth_per_gpu, host_copy_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.policy.alpha import AlphaProblem, AlphaResult, solve_alpha_closed_form
from memo_sim.policy.policies import NO_OFFLOAD_LAST_LAYERS, PolicyChoice
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True)
class LayerTimes:
    forward: float
    backward: float
    recompute: float
    offload: float
    prefetch: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class IterationEstimate:
    iteration_s: float
    mfu: float
    tgs: float
    layer: LayerTimes
    embedding_s: float
    classifier_s: float
    grad_sync_exposed_s: float
    optimizer_s: float
    exposed_copy_s: float  # compute stalls waiting for offload / prefetch, whole iteration

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer"] = self.layer.to_dict()
        return d


def active_gpus_per_node(layout: Layout, profile: HardwareProfile) -> int:
    return min(layout.gpus, profile.node_gpus)


def layer_times(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: PolicyChoice,
                profile: HardwareProfile) -> LayerTimes:
    f = critical_time(forward_costs(model, layout, batch, seq, profile))
    b = critical_time(backward_costs(model, layout, batch, seq, profile))
    if policy.policy == "full_recompute":
        r = critical_time(full_recompute_costs(model, layout, batch, seq, profile))
    elif policy.policy == "memo":
        r = critical_time(recompute_costs(model, layout, batch, seq, profile, policy.recompute_fraction))
    else:
        r = 0.0
    nbytes = offloaded_bytes_per_layer(model, layout, batch, seq, policy)
    active = active_gpus_per_node(layout, profile)
    o = host_copy_time(nbytes, profile, "d2h", active)
    p = host_copy_time(nbytes, profile, "h2d", active)
    return LayerTimes(f, b, r, o, p)


def memo_alpha(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
               solver=solve_alpha_closed_form) -> AlphaResult:
    """MEMO's alpha for this layout from profiled layer sizes and forward time."""
    sk = skeletal_bytes(model, layout, batch, seq)
    f = critical_time(forward_costs(model, layout, batch, seq, profile))
    active = active_gpus_per_node(layout, profile)
    bw = host_bandwidth_per_gpu(profile, "d2h", active)
    # the copy latency is paid once per layer: take it off the time budget
    budget = max(0.0, f - float(profile.host_link.latency))
    prob = AlphaProblem(sk["input"], sk["attn"], sk["other"], bw, budget, model.layers,
                        profile.usable_host_memory / active, profile.host.pinned_rounding)
    return solver(prob)


def estimate_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: PolicyChoice,
                       profile: HardwareProfile, classifier_chunk_tokens: int = 8192) -> IterationEstimate:
    lt = layer_times(model, layout, batch, seq, policy, profile)
    n = model.layers
    n_off = max(n - NO_OFFLOAD_LAST_LAYERS, 0) if policy.offloads else 0
    n_keep = n - n_off
    fwd = n_off * max(lt.forward, lt.offload) + n_keep * lt.forward
    if policy.policy == "memo":
        # the last two layers keep every token in the rounding buffers: no recompute for them
        bwd = n_off * max(lt.backward + lt.recompute, lt.prefetch) + n_keep * lt.backward
    elif policy.policy == "full_offload":
        bwd = n_off * max(lt.backward, lt.prefetch) + n_keep * lt.backward
    else:
        bwd = n * (lt.backward + lt.recompute)
    exposed = n_off * (max(0.0, lt.offload - lt.forward)
                       + max(0.0, lt.prefetch - lt.backward - lt.recompute))
    toks = tokens_per_gpu(layout, batch, seq)
    dt = DTYPE_BYTES[model.dtype]
    emb = memory_bound_time(2 * toks * model.hidden * dt, profile)
    cls_flops = classifier_flops(model, batch, seq) / (layout.tp * layout.seq_split)
    cls = 3 * gemm_time(cls_flops, profile, model.dtype) + memory_bound_time(
        toks * model.vocab / layout.tp * (dt + 8), profile)
    # gradient sync over the group that holds the same weights (DP x CP x Ulysses)
    g = layout.state_shards
    link = coll.group_link(profile, g, layout.tp)
    grad_bytes = BYTES_GRAD * model.params() / layout.tp
    if layout.zero >= 2:
        sync = coll.ring_reduce_scatter_time(grad_bytes, g, float(link.bandwidth), float(link.latency))
    else:
        sync = coll.allreduce_time(grad_bytes, g, float(link.bandwidth), float(link.latency))
    sync_exposed = sync / n if g > 1 else 0.0
    zero3 = 0.0
    if layout.zero >= 3 and g > 1:
        ag = coll.ring_allgather_time(BYTES_WEIGHT * model.layer_params() / layout.tp, g,
                                      float(link.bandwidth), float(link.latency))
        zero3 = n * (max(0.0, ag - lt.forward) + max(0.0, ag - lt.backward))
    # ZeRO-1/2: every rank updates its shard, then all-gathers the updated bf16 weights
    param_gather = coll.ring_allgather_time(BYTES_WEIGHT * model.params() / layout.tp, g, float(link.bandwidth),
                                            float(link.latency)) if layout.zero in (1, 2) and g > 1 else 0.0
    shard = model.params() / layout.tp / (g if layout.zero >= 1 else 1)
    optim = memory_bound_time(2 * (BYTES_OPTIM + BYTES_WEIGHT + BYTES_GRAD) * shard, profile)
    total = emb + fwd + cls + bwd + sync_exposed + zero3 + optim + param_gather
    return IterationEstimate(
        iteration_s=total, mfu=mfu(model, batch * layout.dp, seq, total, layout.gpus, profile.peak(model.dtype)),
        tgs=tgs(batch * layout.dp, seq, total, layout.gpus), layer=lt, embedding_s=emb, classifier_s=cls,
        grad_sync_exposed_s=sync_exposed + zero3 + param_gather, optimizer_s=optim, exposed_copy_s=exposed)


__all__ = ["IterationEstimate", "LayerTimes", "estimate_iteration", "layer_times", "memo_alpha",
           "model_flops_per_iteration"]
