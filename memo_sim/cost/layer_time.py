"""Per-op time of one transformer layer on one GPU: forward, backward, token-wise recompute.

Each entry is an `OpCost` (`memo_sim.cost.opcost`) on a stream: "compute" for kernels, "comm"
for TP / Ulysses collectives that Megatron-style training runs on the critical path, "cp_comm"
for ring-CP K/V exchange, which overlaps the attention kernel it feeds (the layer waits for the
later of the two). Under METP (``layout.tp_mode``) the FFN, and with ``metp`` also the MHA, run
as the rings of `memo_sim.cost.metp` (send/recv on "tp_p2p", broadcasts and reduces on
"tp_bcast", each beside the compute it overlaps), and the Megatron all-gathers / reduce-scatters
around them are gone. The dependency rule of a phase's list is `memo_sim.cost.opcost`'s.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from memo_sim.cost import attention_measured
from memo_sim.cost import collectives as coll
from memo_sim.cost import metp
from memo_sim.cost import moe
from memo_sim.cost import ring_attention
from memo_sim.cost.activations import tensor_bytes, tokens_per_gpu
from memo_sim.model.flops import ATTN_BWD_FACTOR, op_flops
from memo_sim.cost.memo import memoised
from memo_sim.cost.rope import rope_cost
from memo_sim.cost.attention_kernel import materialised_attention
from memo_sim.cost.gemm_format import (fp8_gather_shards, gemm_cast_seconds, layer_gemm_time,
                                       weight_use_cast_seconds)
from memo_sim.cost.kernel_time import (attention_bwd_time, attention_fwd_time, gemm_time, memory_bound_op_time,
                                       memory_bound_time)
from memo_sim.cost.opcost import OpCost, chain_dependencies, chain_tail, critical_time  # noqa: F401  (re-exported)
from memo_sim.layout.parallel import Layout
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.model.config import ModelConfig
from memo_sim.model.eager_kernels import eager_op
from memo_sim.model.kernel_fusion import amax_fused_backward, amax_fused_forward, fused_inputs
from memo_sim.model.layer_graph import (DTYPE_BYTES, FP8_SAVED_INPUTS, OpSpec, forward_ops, fp8_input_kept,
                                       layer_tensors, recompute_ops, sp_regathered)
from memo_sim.profile.schema import HardwareProfile
from memo_sim.tp import RING_GROUPS, TPFlavour

GEMM_BWD_FACTOR = 2.0  # two kernels: data gradient + weight gradient, each of the forward's FLOPs
ELEMENTWISE_BWD_FACTOR = 2.0


def _elementwise_bytes(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    return sum(tensor_bytes(t, layout, batch, seq) for t in _op_tensors(op, model, layout.tp_mode))


@lru_cache(maxsize=1024)
def _op_tensors(op: OpSpec, model: ModelConfig, tp_mode: str) -> tuple:
    """The `TensorSpec`s an op reads and writes, in order (looked up once per op, model and mode). A GEMM input the
    layer keeps as the format's quantised copy (``fp8_saved_inputs``: ln1, ln2, act) is written by its norm or
    activation kernel in the model dtype, and the GEMM's cast (`gemm_cast_seconds`) reads it from there: the kernel
    moves the model dtype's bytes, not the kept copy's (a review: they were priced at the copy's size)."""
    tensors = layer_tensors(model, tp_mode)
    hp = DTYPE_BYTES[model.dtype]
    kept = FP8_SAVED_INPUTS if model.fp8_saved_inputs and model.gemm.quantised else ()
    return tuple(replace(tensors[name], dtype_bytes=hp) if name in kept else tensors[name]
                 for name in op.inputs + op.outputs)


def gemm_cast_shards(op: OpSpec, model: ModelConfig, layout: Layout, phase: str) -> int:
    """The sequence shards a layer GEMM's cast runs on (`fp8_gather_shards`): a column-parallel GEMM's input gathered
    by sequence parallelism, a row-parallel GEMM's output gradient; 1 for any other GEMM."""
    row = op.tp_comm_after == "reduce"
    return fp8_gather_shards(model, layout, row, phase) if row or op.name in sp_regathered(model) else 1


def gemm_shape(op: OpSpec, layout: Layout, batch: int, seq: int, fraction: float = 1.0) -> tuple[float, float, float]:
    """(m, k, n) of a layer GEMM's forward kernel on one GPU: m tokens (the replica's tokens of the
    sequence split; TP ranks see all of them, after SP's all-gather), k the input width and n the
    output width, the output split by TP for a column-parallel GEMM and the input for a
    row-parallel one (those followed by a reduce)."""
    i, o = op.gemm
    m = tokens_per_gpu(layout, batch, seq) * fraction
    if op.tp_comm_after == "reduce":
        return m, i / layout.tp, o
    return m, i, o / layout.tp


def _compute_cost(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                  profile: HardwareProfile, phase: str, fraction: float = 1.0, weight_cast: bool = True) -> OpCost:
    shards = layout.tp * layout.seq_split
    if op.kind == "gemm" and op.scope == "expert":  # the rank's local experts (`memo_sim.cost.moe`)
        return moe.expert_gemm_cost(op, model, layout, batch, seq, profile, phase, fraction)
    if op.kind == "gemm" and op.scope == "shard":  # the router: model dtype, whole weights, the rank's shard
        m, k, n = moe.scoped_gemm_shape(op, layout, batch, seq, fraction)
        f = 2.0 * m * k * n * (GEMM_BWD_FACTOR if phase == "bwd" else 1.0)
        return OpCost(op.name, "gemm", phase, "compute", gemm_time(f, profile, model.dtype, 0.0), flops=f)
    if op.name == "route":
        return moe.route_cost(model, layout, batch, seq, profile, phase, fraction)
    if op.name == "rope":  # the rotary embedding, its framework's kernels (`memo_sim.cost.rope`)
        return rope_cost(model, layout, batch, seq, profile, phase, fraction)
    if op.kind == "gemm":
        # forward: out[m, n] = x[m, k] W[k, n]; backward: two kernels of the same FLOPs, the data
        # gradient dx[m, k] = dy[m, n] W^T and the weight gradient dW[k, n] = x^T dy, each reading
        # and writing the same three operands (GEMM_BWD_FACTOR kernels)
        # a quantised format (`memo_sim.cost.gemm_format`) runs the three at its peak on quantised
        # operands and casts the GEMM's input (forward) or its output gradient (backward) first
        m, k, n = (moe.scoped_gemm_shape(op, layout, batch, seq, fraction) if op.scope == "replicated"
                   else gemm_shape(op, layout, batch, seq, fraction))
        f = 2.0 * m * k * n
        t = layer_gemm_time(model, profile, m, k, n)
        if phase == "bwd":
            f *= GEMM_BWD_FACTOR
            t *= GEMM_BWD_FACTOR
        # backward: the output gradient, and the input again for the weight gradient (memo keeps the
        # high-precision input for backward, as torchao's Float8Linear does, and re-casts it there)
        # (a compiled block takes the amax where a memory-bound kernel writes the tensor: `model.kernel_fusion`)
        # torchao's Float8 TP styles cast a gathered operand on the rank's sequence shard (`fp8_gather_shards`)
        fused = layout.kernel_fusion
        shards = gemm_cast_shards(op, model, layout, phase)
        t += gemm_cast_seconds(model, profile, phase, m, k, n, amax_fused_forward(model, fused, op.inputs[0]),
                               amax_fused_backward(model, fused, op.outputs[0], layout.rope != "none"),
                               fp8_input_kept(model, op.inputs[0]), weight_cast=weight_cast, input_shards=shards,
                               dout_shards=shards)
        return OpCost(op.name, "gemm", phase, "compute", t, flops=f)
    if op.kind == "attention":
        if layout.attention == "materialised":
            a = materialised_attention(model, layout, batch, seq, profile, phase)
            return OpCost(op.name, "attention", phase, "compute", a.seconds, flops=a.flops, nbytes=a.nbytes)
        f = op_flops(op, model, batch, seq) * model.attention_flop_fraction(seq) / shards
        if phase == "bwd":
            f *= ATTN_BWD_FACTOR
        return OpCost(op.name, "attention", phase, "compute",
                      _attention_time(f, model, layout, batch, seq, profile, phase), flops=f)
    if layout.kernel_fusion == "eager":
        eager = eager_op(model, op, DTYPE_BYTES[model.dtype])
        if eager is not None:  # the op's separate eager kernels (`memo_sim.model.eager_kernels`)
            per_element, kernels = eager.phase(phase)
            elements = sum(tensor_bytes(t, layout, batch, seq) / t.dtype_bytes
                           for t in _op_tensors(op, model, layout.tp_mode)[len(op.inputs):]) * fraction
            nbytes = per_element * elements
            return OpCost(op.name, op.kind, phase, "compute", memory_bound_op_time(nbytes, profile, kernels),
                          nbytes=nbytes)
    nbytes = _elementwise_bytes(op, model, layout, batch, seq) * fraction
    # a compiled block fuses the op into the memory-bound op before it: what that one wrote is not read again,
    # and the op pays no launch of its own (`memo_sim.model.kernel_fusion`)
    fused = fused_inputs(model).get(op.name, ()) if layout.kernel_fusion == "compiled" else ()
    if fused:
        nbytes -= sum(tensor_bytes(t, layout, batch, seq) for t in _op_tensors(op, model, layout.tp_mode)
                      if t.name in fused) * fraction
    if phase == "bwd":
        nbytes *= ELEMENTWISE_BWD_FACTOR
    seconds = memory_bound_time(nbytes, profile) if fused else memory_bound_op_time(nbytes, profile)
    return OpCost(op.name, op.kind, phase, "compute", seconds, nbytes=nbytes)


def _attention_time(flops: float, model: ModelConfig, layout: Layout, batch: int, seq: int,
                    profile: HardwareProfile, phase: str) -> float:
    """One rank's attention kernel(s) of ``flops`` (the backward's own for "bwd"): from the executor's
    kernels timed at the rank's shape where the profile has them (`memo_sim.cost.attention_measured`),
    else ring CP's blocks as the executor runs them (`memo_sim.cost.ring_attention`), else one kernel
    over the rank's share, at the efficiency curves."""
    ring = ring_attention.applies(model, layout, seq)
    measured = attention_measured.layer_attention_seconds(model, layout, batch, seq, profile, phase, ring)
    if measured is not None:
        return measured
    if ring:
        return ring_attention.ring_attention_time(flops, profile, model.dtype, model.qk_head_dim, layout.block_kernel,
                                                  layout.cp, phase, ring_merge(layout.ring_merge).step_kernels)
    kernel = layout.attention_kernel()  # a ring's sliding-window layers run on its blocks' kernel too
    if phase == "bwd":
        return attention_bwd_time(flops, profile, model.dtype, model.qk_head_dim, kernel)
    return attention_fwd_time(flops, profile, model.dtype, model.qk_head_dim, kernel)


def _tp_collective(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile, phase: str, fraction: float = 1.0) -> OpCost | None:
    if layout.tp == 1 or op.tp_comm_after is None:
        return None
    size = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype] * fraction
    if layout.sp:
        # forward: all-gather before a column-parallel gemm, reduce-scatter after a row-parallel one;
        # backward swaps them.
        gather = (op.tp_comm_after == "gather") == (phase != "bwd")
        if gather and fp8_gather_shards(model, layout, op.tp_comm_after == "reduce", phase) > 1:
            # the quantised copy gathered, not the model-dtype tensor (`fp8_gather_shards`, the one rule for
            # which gathers carry it and where their casts run): forward, the column-parallel GEMM input after a
            # norm; backward, a row-parallel GEMM's output gradient
            size = model.gemm.quantised_bytes(size / DTYPE_BYTES[model.dtype]) / max(1, model.gemm.copies)
        name = ("allgather" if gather else "reducescatter") + f"_{op.name}"
        t = coll.ring_allgather_time(size, layout.tp,
                                     *coll.tp_params(profile, layout, "all_gather" if gather else "reduce_scatter"))
    else:
        # forward: all-reduce after the row-parallel gemms; backward: after the column-parallel ones
        if (op.tp_comm_after == "reduce") == (phase == "bwd"):
            return None
        name = f"allreduce_{op.name}"
        t = coll.allreduce_time(size, layout.tp, *coll.tp_params(profile, layout, "all_reduce"))
    return OpCost(name, "collective", phase, "comm", t, nbytes=size)


def _sp_regather(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                 profile: HardwareProfile) -> list[OpCost]:
    """Sequence parallelism keeps only the rank's shard of a column-parallel GEMM's gathered input, so
    its backward all-gathers it again for the weight gradient (`layer_graph.sp_regathered`): before the
    GEMM's backward, on the critical path as the layer's other TP collectives (memo's executor), or
    beside it where the framework issues it asynchronously next to the data-gradient GEMM
    (``layout.sp_regather_overlap``: Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication, whose GEMM
    memo then prices as its two kernels, `_split_column_backward`: the data-gradient half beside the gather, the
    input gradient's reduce-scatter beside the other). None where the layout keeps the gathered input for the weight
    gradient (``layout.sp_input_kept``: torch's ColwiseParallel)."""
    if layout.tp == 1 or not layout.sp or layout.sp_input_kept or op.name not in sp_regathered(model):
        return []
    size = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    t = coll.ring_allgather_time(size, layout.tp, *coll.tp_params(profile, layout, "all_gather"))
    return [OpCost(f"allgather_{op.name}_input", "collective", "bwd", "comm", t, nbytes=size,
                   overlaps=1 if layout.sp_regather_overlap else 0)]


def _ulysses_alltoall(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                      phase: str, width: int, name: str) -> OpCost:
    size = tokens_per_gpu(layout, batch, seq) * width * DTYPE_BYTES[model.dtype] / layout.tp
    # a group across nodes sends only its off-node peers' shares over the inter-node link, the others' over
    # NVLink at the same time (`coll.group_alltoall_time`, as expert parallelism's all-to-all)
    t = coll.group_alltoall_time(size, layout.ulysses, layout.tp, layout, profile)
    return OpCost(name, "collective", phase, "comm", t, nbytes=size)


def _ulysses_backward_resend(model: ModelConfig, layout: Layout, batch: int, seq: int,
                             profile: HardwareProfile) -> list[OpCost]:
    """The all-to-alls a Ulysses backward that keeps no head-sharded tensors sends besides the gradients'
    (``layout.ulysses_bwd_resend``, True for memo's own plans): memo's executor (memo_exec/distributed/attention.py
    UlyssesAttention.backward, which follows the flag) sends q, k and v (each K/V head repeated r times) and the attention output out to
    head-sharded again before the kernel's backward, beside dout, and dq, dk, dv back after it: 8 all-to-alls where
    an autograd Ulysses sends the 4 of the gradients (DeepSpeed's _SeqAllToAll; TransformerEngine's
    AttnFuncWithCPAndQKVOA2A.backward, dout then dq, dk, dv), which ``alltoall_qkv`` and ``alltoall_attn`` price.
    So q, k, v and out once more, before the kernel (its inputs); one op for the four of them."""
    if not layout.ulysses_bwd_resend or layout.ulysses == 1:
        return []
    kv = layout.kv_repeat(model.n_kv_heads, model.heads) * (model.kv_dim + model.v_dim)
    width = model.q_dim + kv + model.attn_dim
    return [_ulysses_alltoall(model, layout, batch, seq, profile, "bwd", width, "alltoall_bwd_inputs")]


def _ulysses_qkv_width(model: ModelConfig, layout: Layout) -> int:
    """Width of q, k and v (or dq, dk, dv) on a Ulysses all-to-all: K and V with each head repeated r times."""
    return model.q_dim + layout.kv_repeat(model.n_kv_heads, model.heads) * (model.kv_dim + model.v_dim)


def _ulysses_before(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    phase: str) -> list[OpCost]:
    """The Ulysses all-to-alls before the attention kernel, in the order they run. Forward (and recompute): q, k,
    v to head-sharded (``alltoall_qkv``). Backward: the inputs the executor sends again (`_ulysses_backward_resend`),
    then dout, the attention output's gradient, at the attention output's width (``alltoall_attn``): the kernel's
    backward reads it (memo_exec/distributed/attention.py UlyssesAttention.backward: q, k, v, out, then dout, then
    the inner backward; DeepSpeed's _SeqAllToAll.backward and TransformerEngine's AttnFuncWithCPAndQKVOA2A.backward,
    dout before the kernel). A review: the backward kept the forward's order, the q/k/v-wide op before the kernel."""
    if phase != "bwd":
        return [_ulysses_alltoall(model, layout, batch, seq, profile, phase, _ulysses_qkv_width(model, layout),
                                  "alltoall_qkv")]
    return (_ulysses_backward_resend(model, layout, batch, seq, profile)
            + [_ulysses_alltoall(model, layout, batch, seq, profile, phase, model.attn_dim, "alltoall_attn")])


def _ulysses_after(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                   phase: str) -> list[OpCost]:
    """The Ulysses all-to-all after the attention kernel: forward, its output back to sequence-sharded
    (``alltoall_attn``); backward, dq, dk and dv back to sequence-sharded at q, k and v's width (``alltoall_qkv``,
    the same bytes as the forward's: each rank's copies of a repeated K/V head sum on the way back)."""
    if phase != "bwd":
        return [_ulysses_alltoall(model, layout, batch, seq, profile, phase, model.attn_dim, "alltoall_attn")]
    return [_ulysses_alltoall(model, layout, batch, seq, profile, phase, _ulysses_qkv_width(model, layout),
                              "alltoall_qkv")]


def _cp_shift_seconds(nbytes: float, layout: Layout, profile: HardwareProfile) -> float:
    """One ring-CP shift of ``nbytes`` to the next rank of the CP group, on the link that group spans."""
    link = coll.layout_group_link(profile, layout, layout.cp, layout.tp * layout.ulysses)
    return coll.sendrecv_time(nbytes, float(link.bandwidth), float(link.latency))


def _cp_ring(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
             phase: str) -> OpCost:
    """The ring's shifts beside the attention kernel (`memo_sim.cost.ring_attention`): the K/V chunk
    cp-1 times; in backward also the dK/dV accumulators cp-1 times (their last shift is `_cp_dkv_home`)."""
    kv = ring_attention.ring_shift_bytes(model, layout, batch, seq)
    if phase == "bwd":  # K/V and the dK/dV accumulators of the same elements
        kv += ring_attention.ring_shift_bytes(model, layout, batch, seq, grads=True)
    steps = layout.cp - 1
    return OpCost("cp_ring_kv", "collective", phase, "cp_comm", steps * _cp_shift_seconds(kv, layout, profile),
                  nbytes=kv * steps, overlaps=1)


def _cp_gathered(att: OpCost, model: ModelConfig, layout: Layout, batch: int, seq: int,
                 profile: HardwareProfile) -> list[OpCost]:
    """An attention pass whose ring gathers K/V at once (`memo_sim.layout.ring_merge` ``kv_allgather``): the
    all-gather beside ring step 0's blocks alone, the later steps after it (``<op>_ring_steps``); in backward
    the dK/dV shifts of those steps beside them (their last shift is `_cp_dkv_home`)."""
    kv = ring_attention.ring_shift_bytes(model, layout, batch, seq)
    stride = layout.tp * layout.ulysses
    link = coll.layout_group_link(profile, layout, layout.cp, stride)
    gather = OpCost("cp_allgather_kv", "collective", att.phase, "cp_comm",
                    coll.ring_allgather_time(kv * layout.cp, layout.cp,
                                             *coll.group_ring_params(profile, layout, link, "all_gather",
                                                                     layout.cp, stride)),
                    nbytes=kv * (layout.cp - 1), overlaps=1)
    share = ring_attention.first_step_share(att.flops, profile, model.dtype, model.qk_head_dim, layout.block_kernel,
                                            layout.cp, att.phase, ring_merge(layout.ring_merge).step_kernels)
    first = replace(att, seconds=att.seconds * share, flops=att.flops * share)
    rest = replace(att, name=f"{att.name}_ring_steps", seconds=att.seconds * (1 - share), flops=att.flops * (1 - share))
    if att.phase != "bwd":
        return [gather, first, rest]
    dkv = ring_attention.ring_shift_bytes(model, layout, batch, seq, grads=True)
    steps = layout.cp - 1
    shifts = OpCost("cp_ring_dkv", "collective", "bwd", "cp_comm", steps * _cp_shift_seconds(dkv, layout, profile),
                    nbytes=dkv * steps, overlaps=1)
    return [gather, first, shifts, rest]


def _cp_dkv_home(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> OpCost:
    """The backward's last dK/dV shift, posted after the last step's blocks and waited for before the
    attention's backward returns: on the critical path (`memo_sim.cost.ring_attention`); none where the ring's last
    step is the rank's own chunk (``RingMerge.dkv_home`` False: TransformerEngine's p2p CP)."""
    dkv = ring_attention.ring_shift_bytes(model, layout, batch, seq, grads=True)
    return OpCost("cp_ring_dkv_home", "collective", "bwd", "cp_comm", _cp_shift_seconds(dkv, layout, profile),
                  nbytes=dkv)


@lru_cache(maxsize=256)
def _metp_free_comm(model: ModelConfig, flavour: TPFlavour) -> frozenset[str]:
    """Ops whose Megatron TP collective METP removes: each ring group's ops and the op whose
    output the group reads (the norm whose all-gather would feed it)."""
    ops = _forward_ops(model)
    producer = {o: op.name for op in ops for o in op.outputs}
    out: set[str] = set()
    for g in flavour.ring_groups:
        names = RING_GROUPS[g]
        out |= set(names)
        first = next(op for op in ops if op.name == names[0])
        out |= {producer[i] for i in first.inputs if i in producer}
    return frozenset(out)


def _ffn_ring_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    phase: str, fraction: float) -> list[OpCost]:
    return metp.ffn_costs(model, layout, batch, seq, profile, phase)


def _mha_ring_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    phase: str, fraction: float) -> list[OpCost]:
    if phase == "recompute":  # MEMO's token-wise recompute needs only proj (to rebuild h1)
        return metp.proj_recompute_costs(model, layout, batch, seq, profile, fraction)
    return metp.mha_costs(model, layout, batch, seq, profile, phase)


# The op costs of each ring group of `memo_sim.tp.RING_GROUPS` (``fn(model, layout, batch, seq,
# profile, phase, fraction)``), and the op a group prices beside the op before it (the MHA's step-0
# weight broadcast, `memo_sim.cost.metp.mha_prologue`), written once per group for every flavour.
RING_COSTS = {"ffn": _ffn_ring_costs, "mha": _mha_ring_costs}
RING_PROLOGUES = {"mha": metp.mha_prologue}


def _async_pair(c: OpCost, op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                profile: HardwareProfile, phase: str, fraction: float) -> list[OpCost]:
    """Async TP (`memo_sim.tp.async_tp`): TP collective ``c`` beside the GEMM ``op`` it feeds or
    drains, the GEMM as ``tp`` chunks of 1/tp of its tokens, each priced at its own size: the
    collective runs beside the first tp - 1 chunks and the last chunk waits for it, so the pair
    takes max(G (tp-1)/tp, C) + G/tp. In backward only the data-gradient matmul (half of memo's
    backward GEMM: two kernels of the forward's FLOPs) is chunked; the weight gradient, which reads
    the gathered tensor on its contracted dimension, runs whole after it. A weight the framework's FP8
    library casts per use (`memo_sim.cost.gemm_format.weight_use_cast_seconds`) is cast once, before the
    pair (the fused op's chunks read the one quantised weight), not once a chunk."""
    chunk = _compute_cost(op, model, layout, batch, seq, profile, phase, fraction / layout.tp, weight_cast=False)
    part = 1.0
    tail: list[OpCost] = []
    if phase == "bwd":
        part = 1.0 / GEMM_BWD_FACTOR
        whole = _compute_cost(op, model, layout, batch, seq, profile, phase, fraction, weight_cast=False)
        tail = [replace(whole, name=f"{op.name}_wgrad", seconds=whole.seconds * (1 - part), flops=whole.flops * (1 - part))]
    rest = replace(chunk, seconds=chunk.seconds * part * (layout.tp - 1), flops=chunk.flops * part * (layout.tp - 1))
    last = replace(chunk, name=f"{op.name}_last_chunk", seconds=chunk.seconds * part, flops=chunk.flops * part)
    _, k, n = gemm_shape(op, layout, batch, seq, fraction)
    cast = weight_use_cast_seconds(model, profile, k * n, phase)
    head = [OpCost(f"{op.name}_weight_cast", "elementwise", phase, "compute", cast)] if cast > 0 else []
    return [*head, replace(c, overlaps=1), rest, last, *tail]


def _gathering_norms(model: ModelConfig) -> dict[str, str]:
    """The tensors sequence parallelism all-gathers before column-parallel GEMMs, each by the op (a norm) whose
    output it is and after which the forward gathers it (``tp_comm_after == "gather"``)."""
    return {o: op.name for op in forward_ops(model) if op.tp_comm_after == "gather" for o in op.outputs}


def _split_column_backward(cost: OpCost) -> list[OpCost]:
    """A column-parallel GEMM's backward as Megatron-LM runs it (megatron/core/tensor_parallel/layers.py
    LinearWithGradAccumulationAndAsyncCommunication.backward at d98e8a64, ``layout.sp_regather_overlap``): under
    sequence parallelism the input's re-gather issued asynchronously before the data-gradient matmul and waited for
    right after it, then the input gradient's reduce-scatter issued asynchronously ('scheduled before the weight
    gradient computation') and waited for after the weight-gradient matmul; with TP alone the input gradient's
    all-reduce so (``allreduce_dgrad``; ``async_grad_allreduce`` in megatron/mpu/layers.py at bbab79f869, on unless
    --no-async-tensor-model-parallel-allreduce). So the GEMM's two kernels (half of memo's backward GEMM each,
    `GEMM_BWD_FACTOR`) apart: the re-gather (`_sp_regather`, a side op before it) runs beside the data gradient, the
    reduce-scatter or all-reduce `_ops_with_comm` places before ``<name>_wgrad`` beside the weight gradient, and the
    norm's backward after them waits for it."""
    return list(backward_kernels(cost))


def backward_kernels(cost: OpCost, dgrad_suffix: str = "") -> tuple[OpCost, OpCost]:
    """A GEMM's backward ``cost`` as its two kernels (`GEMM_BWD_FACTOR`, each of the forward's FLOPs): the data
    gradient (named ``<name><dgrad_suffix>``) and the weight gradient (``<name>_wgrad``), an equal share each."""
    part = 1.0 / GEMM_BWD_FACTOR
    share = lambda f: dict(seconds=cost.seconds * f, flops=cost.flops * f, nbytes=cost.nbytes * f)  # noqa: E731
    return (replace(cost, name=f"{cost.name}{dgrad_suffix}", **share(part)),
            replace(cost, name=f"{cost.name}_wgrad", **share(1 - part)))


def _ops_with_comm(ops: list[OpSpec], model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile, phase: str, fraction: float = 1.0) -> list[OpCost]:
    out: list[OpCost] = []
    flavour = layout.flavour
    free = _metp_free_comm(model, flavour)
    emitted: set[str] = set()
    # async TP (``flavour.async_collectives``): a TP collective beside the GEMM it feeds or drains
    # (`_async_pair`) where PyTorch's micro-pipeline pass fuses the pair (torch/_inductor/fx_passes/
    # micro_pipeline_tp.py: an all-gather along the tokens into the left operand of its matmuls,
    # ``fused_all_gather_matmul``; a reduce-scatter of one matmul's output, ``fused_matmul_reduce_scatter``):
    # forward and recompute, the all-gather after a norm feeding the next GEMM and a row-parallel GEMM's
    # reduce-scatter; backward, the all-gather of a row-parallel GEMM's output gradient into its data-
    # gradient matmul. The backward's reduce-scatter after a norm stays on the critical path (it scatters
    # the sum of the data gradients of every GEMM that read the norm's output, not one matmul's), and so
    # does SP's re-gather of a GEMM's input (it feeds the weight-gradient matmul on its contracted dimension)
    asyn = flavour.async_collectives and layout.tp > 1
    feeds: OpCost | None = None  # a collective waiting for the next GEMM (async TP)
    gemm_at: tuple[int, OpSpec] | None = None  # where the last unpaired GEMM's op lies in ``out`` (async TP)
    # Megatron-LM's column-parallel backward (`_split_column_backward`): each GEMM that reads a norm's gathered (SP)
    # or replicated (TP alone) output with its data and weight gradients apart, and where the norm's reduce-scatter
    # (SP) or all-reduce (TP alone) follows, the last such GEMM before it (by the norm's name) whose weight gradient
    # it runs beside
    split = (phase == "bwd" and not asyn and layout.sp_regather_overlap and layout.tp > 1
             and not (layout.sp and layout.sp_input_kept) and not layout.ep_overlap)
    regathered = sp_regathered(model) if split else frozenset()
    norm_of = _gathering_norms(model) if split else {}
    wgrad_at: dict[str, int] = {}  # a norm's name -> the index in ``out`` of its last split GEMM's weight gradient
    for k, op in enumerate(ops):
        group = flavour.group_of(op.name)
        if group is not None:
            if group not in emitted:
                emitted.add(group)
                out += RING_COSTS[group](model, layout, batch, seq, profile, phase, fraction)
            continue
        nxt = flavour.group_of(ops[k + 1].name) if k + 1 < len(ops) else None
        if nxt in RING_PROLOGUES and nxt not in emitted and phase != "recompute":  # a ring's first step beside this
            # op (not beside an op inside the ring's span: the rotary op between its QKV and attention)
            out.append(RING_PROLOGUES[nxt](model, layout, batch, seq, profile, phase))
        if op.kind == "moe_comm":  # the token dispatcher's collectives (`memo_sim.cost.moe`)
            out += moe.dispatcher_costs(op, model, layout, batch, seq, profile, phase, fraction)
            continue
        if op.kind == "attention" and layout.ulysses > 1:
            out += _ulysses_before(model, layout, batch, seq, profile, phase)
        gathered = op.kind == "attention" and ring_attention.gathers_kv(model, layout, seq)
        if op.kind == "attention" and layout.cp > 1 and not gathered:
            out.append(_cp_ring(model, layout, batch, seq, profile, phase))
        if phase == "bwd" and op.name not in free:
            out += _sp_regather(op, model, layout, batch, seq, profile)
        if asyn and op.kind == "gemm" and op.scope == "tp":
            if feeds is not None:  # paired with the collective that feeds it (its own collective, if any, apart)
                out += _async_pair(feeds, op, model, layout, batch, seq, profile, phase, fraction)
                feeds, gemm_at = None, None
            else:
                gemm_at = (len(out), op)
                out.append(_compute_cost(op, model, layout, batch, seq, profile, phase, fraction))
        else:
            if feeds is not None:  # no GEMM right after it: the collective on the critical path
                out.append(feeds)
                feeds = None
            cost = _compute_cost(op, model, layout, batch, seq, profile, phase, fraction)
            if op.name == "rope" and cost.seconds == 0.0:  # no rotary op run (rope none, learned positions)
                continue
            if op.name in regathered:
                out += _split_column_backward(cost)
                wgrad_at[norm_of[op.inputs[0]]] = len(out) - 1
            else:
                out += _cp_gathered(cost, model, layout, batch, seq, profile) if gathered else [cost]
        if op.kind == "attention" and layout.cp > 1 and ring_attention.applies(model, layout, seq):
            merge = ring_attention.ring_merge_cost(model, layout, batch, seq, profile, phase, fraction)
            if merge is not None:  # the ring's merge / accumulation passes (`memo_sim.layout.ring_merge`)
                out.append(merge)
        if op.kind == "attention" and layout.cp > 1 and phase == "bwd" and ring_merge(layout.ring_merge).dkv_home:
            out.append(_cp_dkv_home(model, layout, batch, seq, profile))
        if op.kind == "attention" and layout.ulysses > 1:
            out += _ulysses_after(model, layout, batch, seq, profile, phase)
        c = None if op.name in free else _tp_collective(op, model, layout, batch, seq, profile, phase, fraction)
        if c is None:
            continue
        if op.name in wgrad_at:  # the norm's reduce-scatter beside its GEMM's weight gradient (`_split_column_backward`)
            out.insert(wgrad_at.pop(op.name), replace(c, overlaps=1))
        elif not asyn:
            out.append(c)
        elif gemm_at is not None and op.kind == "gemm" and gemm_at[1] is op:  # not yet paired (above)
            # the GEMM's own collective (forward: the row-parallel GEMM's reduce-scatter; backward: the
            # all-gather of its output gradient)
            i, g = gemm_at
            del out[i]
            out[i:i] = _async_pair(c, g, model, layout, batch, seq, profile, phase, fraction)
            gemm_at = None
        elif phase != "bwd" and op.kind != "gemm":
            feeds = c
        else:
            out.append(c)
    if feeds is not None:
        out.append(feeds)
    return out


def forward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> list[OpCost]:
    return list(_forward_costs(model, layout, batch, seq, profile))


def backward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> list[OpCost]:
    """Backward ops in execution order (reverse of forward)."""
    return list(_backward_costs(model, layout, batch, seq, profile))


def recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    fraction: float) -> list[OpCost]:
    """MEMO's token-wise recompute of ``fraction`` of the tokens (1 - alpha) before backward."""
    if fraction <= 0:
        return []
    return list(_recompute_costs(model, layout, batch, seq, profile, fraction))


# Memoised per (model, layout, batch, seq, profile): the what-if prices every policy of a layout
# on the same op lists, and the event schedule asks for them again.
@memoised()
def _forward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile) -> tuple[OpCost, ...]:
    return tuple(_ops_with_comm(_forward_ops(model), model, layout, batch, seq, profile, "fwd"))


@memoised()
def _backward_costs(model: ModelConfig, layout: Layout, batch: int, seq: int,
                    profile: HardwareProfile) -> tuple[OpCost, ...]:
    return tuple(_ops_with_comm(_backward_ops(model), model, layout, batch, seq, profile, "bwd"))


@lru_cache(maxsize=256)
def _forward_ops(model: ModelConfig) -> tuple[OpSpec, ...]:
    """`forward_ops`, built once per model (op lists are priced for many shards and lengths)."""
    return tuple(forward_ops(model))


@lru_cache(maxsize=256)
def _backward_ops(model: ModelConfig) -> tuple[OpSpec, ...]:
    return tuple(reversed(_forward_ops(model)))


@memoised()
def _recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                     fraction: float) -> tuple[OpCost, ...]:
    costs = _ops_with_comm(recompute_ops(model, layout.tp_mode), model, layout, batch, seq, profile, "recompute",
                           fraction)
    return tuple(c for c in costs if c.stream == "compute" or c.kind == "collective")


def full_recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         profile: HardwareProfile) -> list[OpCost]:
    """Full activation checkpointing re-runs the whole layer forward before its backward."""
    return list(_full_recompute_costs(model, layout, batch, seq, profile))


@memoised()
def _full_recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int,
                          profile: HardwareProfile) -> tuple[OpCost, ...]:
    return tuple(replace(c, phase="recompute") for c in _forward_costs(model, layout, batch, seq, profile))
