"""Peak GPU memory and pinned host memory of one training iteration, by policy.

peak = model states + skeletal bytes the policy keeps resident + its static skeletal buffers
+ every layer's lse + max(one layer's transient peak + the activation handed between layers,
the classifier's peak).

Transients: the largest live set of one layer's forward or backward requests (the level-1
traces of `memo_sim.memplan.trace_gen`). A policy with a static memory plan (MEMO) occupies
that max-live peak, which the bi-level planner reaches on these traces (reports/memplan-gpt.md);
the others run on PyTorch's caching allocator, whose reserved peak on the same requests
(`memo_sim.memplan.baseline`) is what they occupy.

Host: each offloaded layer's bytes as the policy's host layout allocates them
(`memo_sim.policy.host_layout`: memo's executor registers one exact pool per GPU), times the
offloaded layers and the active GPUs of the node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes, model_state_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.baseline import caching_allocator_layer_report
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True)
class MemoryBreakdown:
    model_states_bytes: float
    skeletal_resident_bytes: float  # kept on the GPU across layers (all layers, or layer inputs)
    rounding_buffer_bytes: float  # static skeletal buffers: rounding buffers, or the recompute buffer
    lse_bytes: float
    transient_peak_bytes: float  # the one used: planned arena (memo) or caching-allocator reserved (others)
    transient_planned_bytes: float  # static plan: max-live of one layer's requests (the planner reaches it)
    transient_caching_allocator_bytes: float  # caching-allocator model: reserved peak on the same requests
    layer_boundary_bytes: float  # the activation handed between layers, live beside a layer's transients
    classifier_peak_bytes: float
    peak_gpu_bytes: float
    gpu_capacity_bytes: float
    host_bytes_per_gpu: float  # raw offloaded bytes
    host_bytes_per_node: float  # pinned, as the host layout allocates them
    host_capacity_bytes: float

    @property
    def oom_by(self) -> float:
        return max(0.0, self.peak_gpu_bytes - self.gpu_capacity_bytes)

    @property
    def oohm_by(self) -> float:
        return max(0.0, self.host_bytes_per_node - self.host_capacity_bytes)

    @property
    def status(self) -> str:
        if self.oom_by > 0:
            return "OOM"
        if self.oohm_by > 0:
            return "OOHM"
        return "OK"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        return d


def transient_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         policy: Policy | None = None) -> float:
    """Largest transient live set of one layer's forward or backward on one GPU: the max-live
    bytes of the level-1 request traces, the one place where a layer's transient tensors and
    their lifetimes are enumerated."""
    fwd = layer_forward_trace(model, layout, batch, seq).max_live_bytes()
    bwd = layer_backward_trace(model, layout, batch, seq, policy).max_live_bytes()
    return float(max(fwd, bwd))


def memory_breakdown(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                     profile: HardwareProfile, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                     active_gpus_per_node: int | None = None) -> MemoryBreakdown:
    sk = skeletal_bytes(model, layout, batch, seq)
    n = model.layers
    states = model_state_bytes(model, layout)
    lse_all = n * sk["lse"]
    resident, buffers = policy.resident_bytes(sk, n), policy.buffer_bytes(sk)
    planned = transient_peak_bytes(model, layout, batch, seq, policy)
    cached = float(caching_allocator_layer_report(model, layout, batch, seq, policy).peak_reserved_bytes)
    transient = planned if policy.static_memory_plan else cached
    classifier = classifier_peak_bytes(model, layout, batch, seq, classifier_chunk_tokens)
    # embedding output / final layer output (the next layer's input) is live beside a layer's work
    boundary = sk["input"]
    peak = states + resident + buffers + lse_all + max(transient + boundary, classifier)
    offloaded_layers = policy.offloaded_layers(n)
    host_gpu = offloaded_layers * policy.offload_bytes(model, layout, batch, seq)
    gpus_node = active_gpus_per_node or min(layout.gpus, profile.node_gpus)
    host_node = gpus_node * offloaded_layers * policy.host_bytes_per_layer(model, layout, batch, seq, profile)
    return MemoryBreakdown(
        model_states_bytes=states, skeletal_resident_bytes=resident, rounding_buffer_bytes=buffers,
        lse_bytes=lse_all, transient_peak_bytes=transient, transient_planned_bytes=planned,
        transient_caching_allocator_bytes=cached, layer_boundary_bytes=boundary, classifier_peak_bytes=classifier,
        peak_gpu_bytes=peak, gpu_capacity_bytes=profile.usable_gpu_memory, host_bytes_per_gpu=host_gpu,
        host_bytes_per_node=host_node, host_capacity_bytes=profile.usable_host_memory)
