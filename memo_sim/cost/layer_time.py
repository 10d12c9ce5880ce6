"""Per-op time of one transformer layer on one GPU: forward, backward, token-wise recompute.

Each entry is an `OpCost` on a stream: "compute" for kernels, "comm" for TP / Ulysses
collectives that Megatron-style training runs on the critical path, "cp_comm" for ring-CP K/V
exchange, which overlaps the attention kernel it feeds (the layer waits for the later of the two).
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import tensor_bytes, tokens_per_gpu
from memo_sim.cost.flops import ATTN_BWD_FACTOR, op_flops
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, gemm_time, memory_bound_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, OpSpec, forward_ops, layer_tensors, recompute_ops
from memo_sim.profile.schema import HardwareProfile

GEMM_BWD_FACTOR = 2.0  # data gradient + weight gradient
ELEMENTWISE_BWD_FACTOR = 2.0


@dataclass(frozen=True)
class OpCost:
    name: str
    kind: str  # gemm | attention | norm | elementwise | collective
    phase: str  # fwd | bwd | recompute
    stream: str  # compute | comm | cp_comm
    seconds: float
    flops: float = 0.0
    nbytes: float = 0.0


def _elementwise_bytes(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    tensors = layer_tensors(model)
    return sum(tensor_bytes(tensors[name], layout, batch, seq) for name in op.inputs + op.outputs)


def _compute_cost(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                  profile: HardwareProfile, phase: str, fraction: float = 1.0) -> OpCost:
    shards = layout.tp * layout.seq_split
    if op.kind == "gemm":
        f = op_flops(op, model, batch, seq) / shards * fraction
        if phase == "bwd":
            f *= GEMM_BWD_FACTOR
        return OpCost(op.name, "gemm", phase, "compute", gemm_time(f, profile, model.dtype), flops=f)
    if op.kind == "attention":
        f = op_flops(op, model, batch, seq) / shards
        if phase == "bwd":
            f *= ATTN_BWD_FACTOR
            return OpCost(op.name, "attention", phase, "compute", attention_bwd_time(f, profile, model.dtype), flops=f)
        return OpCost(op.name, "attention", phase, "compute", attention_fwd_time(f, profile, model.dtype), flops=f)
    nbytes = _elementwise_bytes(op, model, layout, batch, seq) * fraction
    if phase == "bwd":
        nbytes *= ELEMENTWISE_BWD_FACTOR
    return OpCost(op.name, op.kind, phase, "compute", memory_bound_time(nbytes, profile), nbytes=nbytes)


def _tp_collective(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile, phase: str, fraction: float = 1.0) -> OpCost | None:
    if layout.tp == 1 or op.tp_comm_after is None:
        return None
    size = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype] * fraction
    link = coll.group_link(profile, layout.tp, 1)
    bw, lat = float(link.bandwidth), float(link.latency)
    if layout.sp:
        # forward: all-gather before a column-parallel gemm, reduce-scatter after a row-parallel one;
        # backward swaps them.
        gather = (op.tp_comm_after == "gather") == (phase != "bwd")
        name = ("allgather" if gather else "reducescatter") + f"_{op.name}"
        t = coll.ring_allgather_time(size, layout.tp, bw, lat)
    else:
        # forward: all-reduce after the row-parallel gemms; backward: after the column-parallel ones
        if (op.tp_comm_after == "reduce") == (phase == "bwd"):
            return None
        name = f"allreduce_{op.name}"
        t = coll.allreduce_time(size, layout.tp, bw, lat)
    return OpCost(name, "collective", phase, "comm", t, nbytes=size)


def _ulysses_alltoall(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                      phase: str, width: int, name: str) -> OpCost:
    size = tokens_per_gpu(layout, batch, seq) * width * DTYPE_BYTES[model.dtype] / layout.tp
    link = coll.group_link(profile, layout.ulysses, layout.tp)
    t = coll.alltoall_time(size, layout.ulysses, float(link.bandwidth), float(link.latency))
    return OpCost(name, "collective", phase, "comm", t, nbytes=size)


def _cp_ring(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
             phase: str) -> OpCost:
    """K and V chunks travel c-1 steps round the ring (backward: also dK, dV)."""
    kv = 2 * tokens_per_gpu(layout, batch, seq) * model.kv_dim * DTYPE_BYTES[model.dtype] / layout.tp
    if phase == "bwd":
        kv *= 2
    link = coll.group_link(profile, layout.cp, layout.tp * layout.ulysses)
    steps = layout.cp - 1
    t = steps * coll.sendrecv_time(kv, float(link.bandwidth), float(link.latency))
    return OpCost("cp_ring_kv", "collective", phase, "cp_comm", t, nbytes=kv * steps)


def _ops_with_comm(ops: list[OpSpec], model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile, phase: str, fraction: float = 1.0) -> list[OpCost]:
    out: list[OpCost] = []
    for op in ops:
        if op.kind == "attention" and layout.ulysses > 1:
            out.append(_ulysses_alltoall(model, layout, batch, seq, profile, phase,
                                         model.hidden + 2 * model.kv_dim, "alltoall_qkv"))
        if op.kind == "attention" and layout.cp > 1:
            out.append(_cp_ring(model, layout, batch, seq, profile, phase))
        out.append(_compute_cost(op, model, layout, batch, seq, profile, phase, fraction))
        if op.kind == "attention" and layout.ulysses > 1:
            out.append(_ulysses_alltoall(model, layout, batch, seq, profile, phase, model.hidden, "alltoall_attn"))
        c = _tp_collective(op, model, layout, batch, seq, profile, phase, fraction)
        if c is not None:
            out.append(c)
    return out


def forward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> list[OpCost]:
    return _ops_with_comm(forward_ops(model), model, layout, batch, seq, profile, "fwd")


def backward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> list[OpCost]:
    """Backward ops in execution order (reverse of forward)."""
    costs = _ops_with_comm(list(reversed(forward_ops(model))), model, layout, batch, seq, profile, "bwd")
    return costs


def recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    fraction: float) -> list[OpCost]:
    """MEMO's token-wise recompute of ``fraction`` of the tokens (1 - alpha) before backward."""
    if fraction <= 0:
        return []
    costs = _ops_with_comm(recompute_ops(model), model, layout, batch, seq, profile, "recompute", fraction)
    return [c for c in costs if c.stream == "compute" or c.kind == "collective"]


def full_recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         profile: HardwareProfile) -> list[OpCost]:
    """Full activation checkpointing re-runs the whole layer forward before its backward."""
    return [OpCost(c.name, c.kind, "recompute", c.stream, c.seconds, c.flops, c.nbytes)
            for c in forward_costs(model, layout, batch, seq, profile)]


def chain_dependencies(costs: list[OpCost]) -> list[list[int]]:
    """Within one phase, the indices each op waits for: the op before it, except that a ring-CP
    K/V exchange (stream ``cp_comm``) runs beside the attention kernel that follows it, so both
    wait for the op before the exchange and the op after the attention waits for both. The
    event schedule wires its op graph from this, and `critical_time` walks it."""
    deps: list[list[int]] = []
    prev: list[int] = []
    pending_cp: int | None = None
    for k, c in enumerate(costs):
        deps.append(list(prev))
        if c.stream == "cp_comm":
            pending_cp = k
            continue
        if pending_cp is not None and c.kind == "attention":
            prev = [k, pending_cp]
            pending_cp = None
        else:
            prev = [k]
    return deps


def chain_tail(costs: list[OpCost]) -> list[int]:
    """Indices the op after the phase waits for."""
    if not costs:
        return []
    deps = chain_dependencies(costs + [OpCost("_tail", "elementwise", "", "compute", 0.0)])
    return deps[-1]


def critical_time(costs: list[OpCost]) -> float:
    """Seconds of a layer phase alone on the GPU: the longest path of `chain_dependencies`."""
    finish: list[float] = []
    for c, d in zip(costs, chain_dependencies(costs)):
        finish.append(max((finish[j] for j in d), default=0.0) + c.seconds)
    return max((finish[j] for j in chain_tail(costs)), default=0.0)
