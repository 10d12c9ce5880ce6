"""Memory per GPU and per node: model states, skeletal activations by policy, transients,
classifier, and pinned host memory for offloaded activations (with allocation rounding).

Model states follow the ZeRO paper's mixed-precision accounting, 16 bytes per parameter:
2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master weights, Adam m and v). ZeRO stage 1
shards the 12 over the DP x CP x Ulysses group, stage 2 also the gradients, stage 3 also the
weights (and keeps two layers' gathered weights live for prefetch). TP divides everything,
the embedding/classifier too (vocab-parallel).

Transient activations: the largest live set of non-skeletal tensors inside one layer's forward
or backward (gathered sequence-parallel inputs, pre-reduce-scatter outputs, gradients), from the
layer graph. MEMO places them by a static plan (its arena is that max-live peak, which the
bi-level planner reaches on these traces: reports/memplan-gpt.md); the other policies run on
PyTorch's caching allocator, whose reserved peak on the same requests (rounding, segments,
fragmentation) is what they occupy. The classifier runs in chunks of ``classifier_chunk_tokens`` tokens: one chunk's
logits in bf16 plus fp32 softmax/gradient.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memo_sim.cost.activations import skeletal_bytes, tokens_per_gpu
from memo_sim.cost.transfer import pinned_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.policy.policies import NO_OFFLOAD_LAST_LAYERS, PolicyChoice
from memo_sim.profile.schema import HardwareProfile

BYTES_WEIGHT, BYTES_GRAD, BYTES_OPTIM = 2, 2, 12
DEFAULT_CLASSIFIER_CHUNK = 8192


@dataclass(frozen=True)
class MemoryBreakdown:
    model_states_bytes: float
    skeletal_resident_bytes: float  # kept on the GPU across layers (all layers, or layer inputs)
    rounding_buffer_bytes: float  # MEMO / full offload: two layers' skeletal buffers; recompute: one layer
    lse_bytes: float
    transient_peak_bytes: float  # the one used: planned arena (memo) or caching-allocator reserved (others)
    transient_planned_bytes: float  # static plan: max-live of one layer's requests (the planner reaches it)
    transient_caching_allocator_bytes: float  # caching-allocator model: reserved peak on the same requests
    classifier_peak_bytes: float
    peak_gpu_bytes: float
    gpu_capacity_bytes: float
    host_bytes_per_gpu: float  # raw offloaded bytes
    host_bytes_per_node: float  # pinned, after allocation rounding
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


def model_state_bytes(model: ModelConfig, layout: Layout) -> float:
    p = model.params() / layout.tp
    n = layout.state_shards
    z = layout.zero
    weights = BYTES_WEIGHT * p / (n if z >= 3 else 1)
    grads = BYTES_GRAD * p / (n if z >= 2 else 1)
    optim = BYTES_OPTIM * p / (n if z >= 1 else 1)
    gathered = 2 * BYTES_WEIGHT * model.layer_params() / layout.tp if z >= 3 else 0.0
    return weights + grads + optim + gathered


def transient_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         policy: PolicyChoice | None = None) -> float:
    """Largest transient live set of one layer's forward or backward on one GPU: the max-live
    bytes of the level-1 request traces (`memo_sim.memplan.trace_gen`), the one place where a
    layer's transient tensors and their lifetimes are enumerated."""
    from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace

    fwd = layer_forward_trace(model, layout, batch, seq).max_live_bytes()
    bwd = layer_backward_trace(model, layout, batch, seq, policy).max_live_bytes()
    return float(max(fwd, bwd))


def classifier_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                          chunk_tokens: int = DEFAULT_CLASSIFIER_CHUNK) -> float:
    tokens = min(chunk_tokens, tokens_per_gpu(layout, batch, seq))
    vocab_share = model.vocab / layout.tp
    logits = tokens * vocab_share * (DTYPE_BYTES[model.dtype] + 4 + 4)  # bf16 logits, fp32 softmax, fp32 grad
    final_hidden = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    return logits + 2 * final_hidden  # final norm output + its gradient stay live over all chunks


def offloaded_bytes_per_layer(model: ModelConfig, layout: Layout, batch: int, seq: int,
                              policy: PolicyChoice) -> float:
    """Bytes of one layer copied to host under an offloading policy (one GPU)."""
    if not policy.offloads:
        return 0.0
    sk = skeletal_bytes(model, layout, batch, seq)
    return sk["input"] + sk["attn"] + policy.offload_fraction_other * sk["other"]


def memory_breakdown(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: PolicyChoice,
                     profile: HardwareProfile, classifier_chunk_tokens: int = DEFAULT_CLASSIFIER_CHUNK,
                     active_gpus_per_node: int | None = None) -> MemoryBreakdown:
    sk = skeletal_bytes(model, layout, batch, seq)
    n = model.layers
    states = model_state_bytes(model, layout)
    lse_all = n * sk["lse"]
    if policy.policy == "store_all":
        resident, buffers = n * sk["total"], 0.0
    elif policy.policy == "full_recompute":
        # inputs kept; one layer's other skeletal tensors rebuilt at a time (its input is already resident)
        resident, buffers = n * sk["input"], sk["total"] - sk["input"]
    else:  # full_offload, memo: two rounding buffers hold whole layers
        resident, buffers = 0.0, 2 * sk["total"]
    from memo_sim.memplan.baseline import caching_allocator_layer_report

    planned = transient_peak_bytes(model, layout, batch, seq, policy)
    cached = float(caching_allocator_layer_report(model, layout, batch, seq, policy).peak_reserved_bytes)
    transient = planned if policy.policy == "memo" else cached
    classifier = classifier_peak_bytes(model, layout, batch, seq, classifier_chunk_tokens)
    # embedding output / final layer output (the next layer's input) is live beside a layer's work
    boundary = sk["input"]
    peak = states + resident + buffers + lse_all + max(transient + boundary, classifier)
    per_layer = offloaded_bytes_per_layer(model, layout, batch, seq, policy)
    offloaded_layers = max(n - NO_OFFLOAD_LAST_LAYERS, 0) if policy.offloads else 0
    host_gpu = offloaded_layers * per_layer
    gpus_node = active_gpus_per_node or min(layout.gpus, profile.node_gpus)
    host_node = gpus_node * offloaded_layers * pinned_bytes(per_layer, profile.host.pinned_rounding)
    return MemoryBreakdown(
        model_states_bytes=states, skeletal_resident_bytes=resident, rounding_buffer_bytes=buffers,
        lse_bytes=lse_all, transient_peak_bytes=transient, transient_planned_bytes=planned,
        transient_caching_allocator_bytes=cached, classifier_peak_bytes=classifier,
        peak_gpu_bytes=peak, gpu_capacity_bytes=profile.usable_gpu_memory, host_bytes_per_gpu=host_gpu,
        host_bytes_per_node=host_node, host_capacity_bytes=profile.usable_host_memory)
