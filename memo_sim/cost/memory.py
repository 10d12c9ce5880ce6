"""Memory per GPU and per node: model states, skeletal activations by policy, transients,
classifier, and pinned host memory for offloaded activations (with allocation rounding).

Model states follow the ZeRO paper's mixed-precision accounting, 16 bytes per parameter:
2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master weights, Adam m and v). ZeRO stage 1
shards the 12 over the DP x CP x Ulysses group, stage 2 also the gradients, stage 3 also the
weights (and keeps two layers' gathered weights live for prefetch). TP divides everything,
the embedding/classifier too (vocab-parallel).

Transient activations: the largest live set of non-skeletal tensors inside one layer's forward
or backward (gathered sequence-parallel inputs, pre-reduce-scatter outputs, gradients), from the
layer graph. The classifier runs in chunks of ``classifier_chunk_tokens`` tokens: one chunk's
logits in bf16 plus fp32 softmax/gradient.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memo_sim.cost.activations import skeletal_bytes, tensor_bytes, tokens_per_gpu
from memo_sim.cost.transfer import pinned_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, forward_ops, layer_tensors
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
    transient_peak_bytes: float
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


def _live_peak(steps: list[list[tuple[str, float]]]) -> float:
    """Peak of the summed sizes of the tensors live at each step (name, bytes) lists."""
    return max((sum(b for _, b in step) for step in steps), default=0.0)


def transient_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Largest transient live set of one layer's forward or backward on one GPU.

    Forward: a gathered (sequence-parallel) gemm input lives with the gemm; a row-parallel gemm
    output lives at full sequence length until its reduce-scatter (or all-reduce) ends.
    Backward: the incoming gradient, the gradients an op produces, and the gathered inputs its
    weight gradient needs.
    """
    tens = layer_tensors(model)
    tb = {n: tensor_bytes(t, layout, batch, seq) for n, t in tens.items()}
    full_h = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    sp = layout.sp and layout.tp > 1
    fwd_steps: list[list[tuple[str, float]]] = []
    for op in forward_ops(model):
        live = [(f"out:{o}", tb[o]) for o in op.outputs if not tens[o].saved]
        if op.kind == "gemm" and sp and op.tp_comm_after != "reduce":
            live.append(("gathered_input", full_h))
        if op.tp_comm_after == "reduce" and layout.tp > 1:
            live = [(f"out:{o}", full_h) for o in op.outputs] + [("reduced", tb[op.outputs[0]])]
        if op.kind == "attention":
            live.append(("attn_workspace", tb["lse"]))
        fwd_steps.append(live)
    bwd_steps: list[list[tuple[str, float]]] = []
    grad_out = tb["y"]
    for op in reversed(forward_ops(model)):
        live = [("grad_out", sum(tb[o] for o in op.outputs if o != "lse") if op.kind != "elementwise" else grad_out)]
        live += [(f"grad:{i}", tb[i]) for i in op.inputs]
        if op.kind == "gemm" and sp and op.tp_comm_after != "reduce":
            live.append(("gathered_input", full_h))  # weight gradient needs the gathered input again
            live.append(("grad_input_full", full_h))  # before its reduce-scatter
        if op.kind == "attention":
            live.append(("attn_bwd_workspace", 2 * tb["lse"]))
        live.append(("residual_grad", tb["h1"]))
        bwd_steps.append(live)
    return max(_live_peak(fwd_steps), _live_peak(bwd_steps))


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
        resident, buffers = n * sk["input"], sk["total"]  # inputs kept; one layer rebuilt at a time
    else:  # full_offload, memo: two rounding buffers hold whole layers
        resident, buffers = 0.0, 2 * sk["total"]
    transient = transient_peak_bytes(model, layout, batch, seq)
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
        lse_bytes=lse_all, transient_peak_bytes=transient, classifier_peak_bytes=classifier,
        peak_gpu_bytes=peak, gpu_capacity_bytes=profile.usable_gpu_memory, host_bytes_per_gpu=host_gpu,
        host_bytes_per_node=host_node, host_capacity_bytes=profile.usable_host_memory)
