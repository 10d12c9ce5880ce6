"""SPPO's formulas (papers/sppo.txt sections 3-6), written once: subsequence partitions, the cost of
one subsequence's kernels at its own length, the K/V cache, sequence-aware offload ratios, the
memory recurrence, the pipeline's closed forms, multiplexed sequence partitioning and the
per-stage pieces of a pipeline.

Notation: b batch, s sequence, h hidden, p pipeline stages, N subsequences, [a, a + l) the tokens
of one subsequence (or piece).

- Forward FLOPs of one layer over the tokens [a, a + l): the GEMMs, linear in l (24·b·l·h² for a
  GPT layer), plus causal attention of those queries against every key before them,
  2·b·h·((a + l)² − a²) (the difference of `causal_attention_flops` over the prefixes, so the N
  subsequences add up to 2·b·s²·h exactly and a subsequence starting at 0 is priced as the whole
  sequence would be).
- Partitions (`partition_bounds`): ``length`` balances token counts; ``flops`` solves
  C(x_k) = k/N · C(s) for the cumulative forward FLOPs C(x) = G·x + 2·b·h·x² (G the GEMM FLOPs per
  token), so early subsequences are longer. Bounds are rounded to a granularity (the TP+SP
  degree: every GPU of a stage holds l/tp tokens).
- Kernel times (`piece_costs`): the layer's `memo_sim.cost.layer_time` op lists at the piece's own
  token count, the attention kernels re-priced at the piece's prefix FLOPs, every kernel read off
  the profile's efficiency curve at its own FLOPs, so short subsequences lose efficiency (what
  bounds N).
- K/V cache (`kv_cache_bytes`): K and V of every token of the sequence per layer: 2·b·s·h
  elements (the paper's "2BSH", counting elements; 4·b·s·h bytes in 16-bit, divided by the TP+SP
  degree per GPU; kv_dim instead of h with grouped-query attention).
- Sequence-aware offloading (`sequence_aware_alphas`): alpha_i·A_i = M_threshold, capped at 1;
  memory `memory_recurrence`: M_i = M_{i−1} + A_i − alpha_{i−1}·A_{i−1}.
- Pipeline closed forms: bubble ratio (p − 1)/N, iteration (p − 1 + N)/N · F(N).
- Multiplexed sequence partitioning (`multiplex_phases`): Table 3 of the paper. For stage i:
  Left-SP ids {0 .. p−2−i}, Steady {p−1−i .. N−1−i}, Right-SP {N−i .. N−1}; SP ranges
  {i .. p−1} (left) and {0 .. i} (right), empty where the phase has no subsequence. (The paper's
  Definition 6.1 writes the bounds one off, {0 .. p−1−i} and {p−1−i .. N−i}, which overlap; its
  Table 3 is the partition used here.) `stage_pieces` turns it into work: a subsequence in a
  stage's Left-SP (Right-SP) phase is split again, FLOPs-balanced, into as many pieces as the SP
  range has members; the pieces run one after another on the stage's GPUs (each priced at its
  own length), so the neighbouring stage can start on the first piece instead of waiting for the
  whole subsequence: the fill and drain bubbles shrink at no extra activation memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from memo_sim.cost import collectives as coll
from memo_sim.cost.grad_sync import GradSync, grad_sync, params_reduce_time
from memo_sim.cost.boundary import optimizer_seconds
from memo_sim.cost.gemm_format import weight_cache_bytes
from memo_sim.cost.optimizer_offload import host_state_bytes
from memo_sim.cost.activations import tensor_bytes, tokens_per_gpu
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, memory_bound_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.param_split import GpuParams, gpu_params
from memo_sim.cost.memo import memoised_by, memoising, profile_key
from memo_sim.cost.opcost import OpCost, critical_time
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, stage_hop_crosses_nodes, stage_layers  # noqa: F401 (stage_layers re-exported)
from memo_sim.layout.rank_order import data_group_stride
from memo_sim.model.config import ModelConfig
from memo_sim.model.flops import ATTN_BWD_FACTOR, causal_attention_flops, layer_forward_flops
from memo_sim.model.layer_graph import DTYPE_BYTES, layer_tensors
from memo_sim.profile.schema import HardwareProfile

PARTITIONS = ("flops", "length")
EFFICIENT_TOKENS_PER_DEVICE = (2048, 16384)  # paper sec. 6.1: per-layer, per-device subsequence work


# ---------------------------------------------------------------------------------------- FLOPs
def prefix_attention_flops(batch: int, start: int, length: int, hidden: int) -> float:
    """Causal attention forward FLOPs of the queries [start, start + length) against every key
    before them: 2·b·h·((a + l)² − a²)."""
    if start == 0:
        return causal_attention_flops(batch, length, hidden)
    return causal_attention_flops(batch, start + length, hidden) - causal_attention_flops(batch, start, hidden)


@lru_cache(maxsize=256)
def gemm_flops_per_token(model: ModelConfig, batch: int) -> float:
    """Forward GEMM FLOPs of one layer per token of the sequence (24·b·h² for a GPT layer)."""
    return layer_forward_flops(model, batch, 1)["gemm"]


def forward_flops(model: ModelConfig, batch: int, start: int, length: int) -> float:
    """Forward FLOPs of one layer over the tokens [start, start + length) (GEMMs + causal attention)."""
    return gemm_flops_per_token(model, batch) * length + prefix_attention_flops(batch, start, length, model.hidden)


def _cumulative(model: ModelConfig, batch: int, x: float) -> float:
    return gemm_flops_per_token(model, batch) * x + causal_attention_flops(batch, 1, model.hidden) * x * x


def _inverse_cumulative(model: ModelConfig, batch: int, c: float) -> float:
    g = gemm_flops_per_token(model, batch)
    a = causal_attention_flops(batch, 1, model.hidden)
    return (-g + math.sqrt(g * g + 4 * a * c)) / (2 * a)


def balanced_bounds(model: ModelConfig, batch: int, start: int, end: int, parts: int, kind: str = "flops",
                    granularity: int = 1) -> tuple[int, ...]:
    """Bounds start = x_0 < x_1 < ... < x_parts = end splitting [start, end) into ``parts`` pieces
    of equal forward FLOPs (``flops``) or equal length (``length``), each a multiple of
    ``granularity`` tokens long (as near as rounding allows). Fewer pieces when the interval is
    too short for ``parts`` of them."""
    if kind not in PARTITIONS:
        raise MemoError(f"partition must be one of {', '.join(PARTITIONS)}, got {kind!r}")
    g = max(1, int(granularity))
    units = (end - start) // g
    parts = max(1, min(int(parts), units))
    if parts <= 1:
        return (start, end)
    if kind == "length":
        raw = [start + (end - start) * k / parts for k in range(1, parts)]
    else:
        c0, c1 = _cumulative(model, batch, start), _cumulative(model, batch, end)
        raw = [_inverse_cumulative(model, batch, c0 + (c1 - c0) * k / parts) for k in range(1, parts)]
    pts = [start]
    for k, x in enumerate(raw, start=1):
        q = start + round((x - start) / g) * g
        lo = pts[-1] + g
        hi = end - (parts - k) * g
        pts.append(int(min(max(q, lo), hi)))
    pts.append(end)
    return tuple(pts)


def partition_bounds(model: ModelConfig, batch: int, seq: int, n: int, kind: str = "flops",
                     granularity: int = 1) -> tuple[int, ...]:
    """The N subsequences' bounds 0 = x_0 < ... < x_N = seq (``flops``: equal forward FLOPs, longer
    early subsequences; ``length``: equal lengths). Raises when the sequence has fewer than N
    granules."""
    if n < 1:
        raise MemoError(f"the subsequence count must be at least 1, got {n}")
    if seq // max(1, granularity) < n:
        raise MemoError(f"{seq} tokens do not split into {n} subsequences of at least {granularity} tokens")
    return balanced_bounds(model, batch, 0, seq, n, kind, granularity)


# ---------------------------------------------------------------------------------------- kernels
@lru_cache(maxsize=1024)
def stage_gpu_shard(layout: Layout) -> Layout:
    """What one GPU of an SPPO pipeline stage holds of ``layout``: its TP+SP shard, without the pipeline
    and data-parallel degrees and ZeRO (what a stage's per-GPU costs and bytes are priced on). The
    micro-batch pipelines' per-GPU layout also drops the virtual stages
    (`memo_sim.layout.parallel.stage_shard`). Every piece's attention runs as a block over its prefix, so the shard's
    attention kernel is the layout's block kernel (`Layout.block_kernel`: memo-exec's pieces run FlashAttention-2)."""
    return replace(layout, pp=1, dp=1, zero=0, attention=layout.block_kernel, block_attention="")


_COSTS: dict[tuple, tuple[HardwareProfile, tuple[list[OpCost], list[OpCost]]]] = {}
_COSTS_MAX = 20000


def _reprice_attention(costs: list[OpCost], flops_fwd: float, profile: HardwareProfile, dtype: str,
                       head_dim: int, kernel: str = "flash") -> list[OpCost]:
    out = []
    for c in costs:
        if c.kind == "attention" and c.stream == "compute":
            if c.phase == "bwd":
                f = flops_fwd * ATTN_BWD_FACTOR
                c = replace(c, seconds=attention_bwd_time(f, profile, dtype, head_dim, kernel), flops=f)
            else:
                c = replace(c, seconds=attention_fwd_time(flops_fwd, profile, dtype, head_dim, kernel), flops=flops_fwd)
        out.append(c)
    return out


def piece_costs(model: ModelConfig, layout: Layout, batch: int, start: int, length: int,
                profile: HardwareProfile, memo: bool = True) -> tuple[list[OpCost], list[OpCost]]:
    """(forward, backward) op lists of one layer over the tokens [start, start + length) on one GPU
    of a stage: the layer's ops at the piece's own token count, attention at its prefix FLOPs.
    Memoised unless ``memo`` is false (the schedule asks for the same pieces in every stage)."""
    shard = stage_gpu_shard(layout)
    key = (id(profile), model, shard, batch, start, length)
    hit = _COSTS.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    fwd = forward_costs(model, shard, batch, length, profile)
    bwd = backward_costs(model, shard, batch, length, profile)
    if start > 0:
        f = prefix_attention_flops(batch, start, length, model.hidden) / (shard.tp * shard.seq_split)
        fwd = _reprice_attention(fwd, f, profile, model.dtype, model.qk_head_dim, shard.attention)
        bwd = _reprice_attention(bwd, f, profile, model.dtype, model.qk_head_dim, shard.attention)
    if memo:
        if len(_COSTS) > _COSTS_MAX:
            _COSTS.clear()
        _COSTS[key] = (profile, (fwd, bwd))
    return fwd, bwd


_TIMES: dict[tuple, tuple[HardwareProfile, dict, dict, dict]] = {}


def piece_timer(model: ModelConfig, layout: Layout, batch: int, profile: HardwareProfile, quantum: float = 0.0):
    """A function (start, length) -> (forward, backward) critical time of one layer over a piece on
    one GPU of a stage: the critical times of `piece_costs`, memoised per model, GPU shard, batch,
    profile and ``quantum`` (`memo_sim.cost.memo.unmemoised` turns it off). Where the layer's ops form one chain (TP+SP stages) that is the sum of the ops at
    the piece's length but attention, plus attention at the piece's prefix FLOPs, so one op list
    is built per length, not per piece.

    ``quantum`` > 0 (the planner's bounding pass): the non-attention ops are priced at the length
    rounded to a geometric grid of ratio 1 + quantum and scaled linearly to the true length (the
    kernel-efficiency curves move by far less than the length does over one step)."""
    shard = stage_gpu_shard(layout)
    key = (id(profile), model, shard, batch)
    entry = _TIMES.get(key) if memoising() else None
    if entry is None or entry[0] is not profile:
        if len(_TIMES) > 64:
            _TIMES.clear()
        entry = (profile, {}, {}, {})
        if memoising():
            _TIMES[key] = entry
    times, rests = entry[1], entry[2]
    shards = shard.tp * shard.seq_split
    h, dtype = model.hidden, model.dtype
    step = math.log1p(quantum) if quantum > 0 else 0.0
    qtimes: dict = entry[3].setdefault(quantum, {}) if step else times

    def rest_of(length: int):
        rest = rests.get(length, False)
        if rest is False:
            f, b = piece_costs(model, shard, batch, 0, length, profile, memo=False)
            chain = all(c.overlaps == 0 for c in f + b)
            rest = rests[length] = ((sum(c.seconds for c in f if not _is_attention(c)),
                                     sum(c.seconds for c in b if not _is_attention(c))) if chain else None)
        return rest

    def timer(start: int, length: int) -> tuple[float, float]:
        memo = qtimes
        out = memo.get((start, length))
        if out is not None:
            return out
        scale = 1.0
        if step:
            lq = max(1, int(round(math.exp(round(math.log(length) / step) * step))))
            rest = rest_of(lq)
            scale = length / lq
        else:
            rest = rest_of(length)
        if rest is None:
            f, b = piece_costs(model, shard, batch, start, length, profile, memo=False)
            out = (critical_time(f), critical_time(b))
        else:
            fl = prefix_attention_flops(batch, start, length, h) / shards
            out = (rest[0] * scale + attention_fwd_time(fl, profile, dtype, model.qk_head_dim, shard.attention),
                   rest[1] * scale + attention_bwd_time(fl * ATTN_BWD_FACTOR, profile, dtype, model.qk_head_dim,
                                                        shard.attention))
        memo[(start, length)] = out
        return out

    return timer


def piece_times(model: ModelConfig, layout: Layout, batch: int, start: int, length: int,
                profile: HardwareProfile) -> tuple[float, float]:
    """(forward, backward) critical time of one layer over one piece (`piece_timer`)."""
    return piece_timer(model, layout, batch, profile)(start, length)


def _is_attention(c: OpCost) -> bool:
    return c.kind == "attention" and c.stream == "compute"


# ---------------------------------------------------------------------------------------- memory
def kv_cache_elements(model: ModelConfig, batch: int, tokens: int) -> float:
    """K and V of ``tokens`` tokens of one layer, whole (before any split): 2·b·s·kv_dim elements
    (2·b·s·h for multi-head attention: the paper's 2BSH)."""
    return 2.0 * batch * tokens * model.kv_dim


def kv_cache_bytes(model: ModelConfig, layout: Layout, batch: int, tokens: int) -> float:
    """Bytes of one layer's K and V for ``tokens`` tokens on one GPU of a stage (split by TP)."""
    t = layer_tensors(model, layout.tp_mode)
    return tensor_bytes(t["k"], layout, batch, tokens) + tensor_bytes(t["v"], layout, batch, tokens)


def sequence_aware_alphas(activations: list[float], threshold: float) -> tuple[float, ...]:
    """Per-subsequence offload ratios with alpha_i·A_i = M_threshold (capped at 1; 0 where A_i = 0)."""
    return tuple(0.0 if a <= 0 else max(0.0, min(1.0, threshold / a)) for a in activations)


def memory_recurrence(activations: list[float], alphas: list[float], m0: float = 0.0) -> list[float]:
    """GPU activation memory after each subsequence's compute: M_i = M_{i−1} + A_i − alpha_{i−1}·A_{i−1}
    (the previous subsequence's offload has finished while subsequence i computed)."""
    out, m = [], m0
    for i, a in enumerate(activations):
        m = m + a - (alphas[i - 1] * activations[i - 1] if i > 0 else 0.0)
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------- pipeline
def bubble_ratio(pp: int, n: int) -> float:
    """Idle fraction of a stage relative to its work, (p − 1)/N (paper sec. 3.3)."""
    return (pp - 1) / n


def pipeline_time(pp: int, n: int, f_n: float) -> float:
    """Iteration time of the subsequence pipeline: (p − 1 + N)/N · F(N), F(N) the forward and
    backward time of all N subsequences on one stage."""
    return (pp - 1 + n) / n * f_n


def stage_layer_counts(model: ModelConfig, layout: Layout) -> list[int]:
    """Layers of each pipeline rank over its model chunks (the layout's even or uneven split,
    `Layout.stage_layer_counts`)."""
    if not layout.uneven:
        return [model.layers // layout.pp] * layout.pp
    return layout.stage_layer_counts(model.layers)


def stage_layer_count(model: ModelConfig, layout: Layout, stage: int) -> int:
    """Layers of one pipeline stage (`stage_layer_counts`)."""
    return stage_layer_counts(model, layout)[stage]


def stage_split_key(model: ModelConfig, layout: Layout) -> tuple:
    """What of a layout decides which layers (and so which parameters) each pipeline rank holds: the
    memo key of the per-stage terms (`memo_sim.search.estimate`, `memo_sim.search.pipeline`). The
    virtual-stage count matters where the split is uneven, or where a MoE model's dense layers fall
    into chunks (`stage_dense_layer_count`)."""
    return (layout.pp, layout.first_stage_layers, layout.last_stage_layers, layout.account_embedding_loss,
            layout.chunk_layers, layout.vpp if layout.uneven or model.mixes_dense_layers else 1)


def stage_layer_indices(model: ModelConfig, layout: Layout, stage: int) -> list[int]:
    """The model layers one pipeline rank holds over its chunks (chunk c is virtual stage c x pp + stage)."""
    vr = layout.virtual_stage_ranges(model.layers)
    return [i for c in range(layout.vpp) for i in vr[c * layout.pp + stage]]


def stage_dense_layer_count(model: ModelConfig, layout: Layout, stage: int) -> int:
    """A MoE model's dense-FFN layers among one pipeline rank's (where `ModelConfig.dense_layer_at` places
    them, the pattern memo's Megatron export writes as --moe-layer-freq); 0 for a dense model."""
    if not model.mixes_dense_layers:
        return 0
    return sum(model.dense_layer_at(i) for i in stage_layer_indices(model, layout, stage))


def stage_params(model: ModelConfig, layout: Layout, stage: int) -> float:
    """Parameters one stage holds: its layers (a MoE model's dense layers with their own FFN), the
    embedding on the first stage and the classifier (its own matrix, or the tied embedding's copy)
    with the final norm on the last (with pp = 1 a tied embedding is one copy); the multi-token-prediction
    modules on the last, with a copy of an untied embedding for their input (Megatron-LM builds the embedding
    on the stage that runs them)."""
    pp = layout.pp
    dense = stage_dense_layer_count(model, layout, stage)
    p = (stage_layer_count(model, layout, stage) - dense) * model.layer_params() + dense * model.dense_layer_params()
    if stage == pp - 1:
        p += model.mtp_params()
    if pp == 1:
        return p + model.embedding_params()
    if stage == 0:
        p += model.vocab * model.hidden
    if stage == pp - 1:
        p += model.vocab * model.hidden + model.norm_params
        if model.mtp_layers and not model.tied_embeddings:
            p += model.vocab * model.hidden
    return p


def stage_gpu_params(model: ModelConfig, layout: Layout, stage: int) -> GpuParams:
    """A stage's parameters on one of its GPUs, dense and routed-expert parts apart
    (`memo_sim.cost.param_split`; a MoE model's dense layers hold no experts and no router)."""
    n = stage_layer_count(model, layout, stage)
    moe = n - stage_dense_layer_count(model, layout, stage)
    experts = moe * model.expert_layer_params() if model.moe else 0
    router = model.moe_router.params(model.hidden, model.experts, model.moe_bias) if model.moe else 0
    replicated = n * (model.replicated_layer_params() - router) + moe * router
    if stage == layout.pp - 1:
        experts += model.mtp_routed_params()
        replicated += model.mtp_replicated_params()
    return gpu_params(model, layout, stage_params(model, layout, stage), experts, replicated)


def stage_model_state_bytes(model: ModelConfig, layout: Layout, stage: int, experts_only: bool = False) -> float:
    """Model-state bytes on one GPU of a stage (weights, grads, master + optimizer; ZeRO-1 shards
    the last over the data-parallel group, and so does FSDP beside stages, whose gathered weights
    and gradients accumulated in its reduce dtype a stage keeps whole through its micro-batches:
    `memo_sim.dp.fsdp`); ``experts_only``: the routed experts' share (`memo_sim.cost.memory.model_state_parts`)."""
    r = model.recipe
    g = stage_gpu_params(model, layout, stage)
    local, sharded = (g.expert_local, g.expert_sharded) if experts_only else (g.local, g.sharded)
    optim = 0.0 if layout.optimizer_offload else (r.master_bytes + r.optimizer_bytes) * (
        sharded if layout.zero >= 1 else local)
    grads = layout.dp_flavour.pipeline_grad_bytes(r) if layout.pp > 1 else r.grad_bytes
    mtp = model.mtp_layers if stage == layout.pp - 1 else 0
    # FSDP beside stages holds its layers gathered (the weights above) beside their shards: the fp32 master shard, or
    # without a master (working weights in fp32) the sharded parameter itself, which FSDP2 gathers into a new buffer
    kept_shard = r.weight_bytes * sharded if (layout.grads_reduced_per_chunk and r.master_bytes == 0
                                              and sharded < local) else 0.0
    return (r.weight_bytes + grads) * local + optim + kept_shard + weight_cache_bytes(
        model, stage_layer_count(model, layout, stage) + mtp, layout, experts_only)


def stage_host_state_bytes(model: ModelConfig, layout: Layout, stage: int) -> float:
    """Host bytes one GPU of a stage holds for its offloaded optimizer (0 without offload)."""
    return host_state_bytes(model, layout, stage_gpu_params(model, layout, stage))


def stage_optimizer_time(model: ModelConfig, layout: Layout, stage: int, profile: HardwareProfile) -> float:
    mtp = model.mtp_layers if stage == layout.pp - 1 else 0
    return optimizer_seconds(model, layout, stage_gpu_params(model, layout, stage),
                             stage_layer_count(model, layout, stage) + mtp, profile)


@memoised_by(lambda model, layout, profile: (model, layout.state_shards, layout.tp, layout.zero, layout.grad_overlap,
                                            layout.stage_stride, layout.pp, layout.ep, layout.etp, layout.dp_mode,
                                            layout.rank_order, layout.fsdp_shard, layout.reshard_after_forward,
                                            layout.gpus, layout.dp, profile_key(profile)))
def stage_grad_sync(model: ModelConfig, layout: Layout, profile: HardwareProfile) -> GradSync:
    """Data-parallel collectives of one stage: over the stage's dp replicas, where the rank order puts them
    (`memo_sim.layout.rank_order.data_group_stride`; `memo_sim.cost.grad_sync`; memoised by what that reads: the
    group, TP, ZeRO, the overlap, the stride, the order and the stage count, whose end stages may share the
    embedding, and the job's GPUs, over which every group's link is looked at)."""
    return grad_sync(model, layout, profile, stride=data_group_stride(layout))


def stage_serial_grad_reduce(model: ModelConfig, layout: Layout, profile: HardwareProfile, stage: int) -> float:
    """Seconds of a stage's serial gradient reduction (``layout.grad_overlap`` off): every gradient
    the stage holds (`stage_params`: its layers, and the embedding or classifier on the first or
    last stage), per GPU of its TP group, in one collective over its dp replicas after its whole
    backward (Megatron-LM 2021's local DDP, `memo_sim.cost.grad_sync`)."""
    return params_reduce_time(model, layout, profile, stage_gpu_params(model, layout, stage),
                              stride=data_group_stride(layout))


def p2p_bytes(model: ModelConfig, layout: Layout, batch: int, tokens: int) -> float:
    """Bytes one GPU of a stage sends to the next stage for ``tokens`` tokens: its SP shard of the
    hidden state (forward) or of its gradient (backward)."""
    return tokens_per_gpu(layout, batch, tokens) * model.hidden * DTYPE_BYTES[model.dtype] / (
        layout.tp if layout.sp else 1)  # the pipeline does not split a stage's tokens


def p2p_link(layout: Layout, profile: HardwareProfile, stage: int) -> str:
    """``nvlink`` or ``internode``: the link of the hop between stage ``stage`` and ``stage + 1``."""
    return "internode" if stage_hop_crosses_nodes(layout, stage, profile.node_gpus) else "nvlink"


def p2p_time(model: ModelConfig, layout: Layout, batch: int, tokens: int, profile: HardwareProfile,
             stage: int) -> float:
    return p2p_link_time(model, layout, batch, tokens, profile, p2p_link(layout, profile, stage))


def p2p_link_time(model: ModelConfig, layout: Layout, batch: int, tokens: int, profile: HardwareProfile,
                  link: str) -> float:
    """`p2p_time` over a hop whose link (`p2p_link`) is known."""
    lk = profile.internode if link == "internode" else profile.nvlink
    return coll.sendrecv_time(p2p_bytes(model, layout, batch, tokens), float(lk.bandwidth), float(lk.latency))


# ---------------------------------------------------------------------------------------- multiplexing
@dataclass(frozen=True)
class MultiplexPhase:
    """One stage's row of the paper's Table 3."""

    stage: int
    left: tuple[int, ...]
    steady: tuple[int, ...]
    right: tuple[int, ...]
    left_sp: tuple[int, ...]
    right_sp: tuple[int, ...]

    def parts(self, sub: int) -> int:
        """How many pieces subsequence ``sub`` is split into on this stage."""
        if sub in self.left:
            return max(1, len(self.left_sp))
        if sub in self.right:
            return max(1, len(self.right_sp))
        return 1

    def to_dict(self) -> dict:
        return {"stage": self.stage, "left": list(self.left), "steady": list(self.steady), "right": list(self.right),
                "left_sp_range": list(self.left_sp), "right_sp_range": list(self.right_sp)}


def multiplex_phases(pp: int, n: int) -> list[MultiplexPhase]:
    """Left-SP / Steady / Right-SP subsequence ids and SP ranges of every stage for any PP and N
    (Table 3 of the paper for PP = 4, N = 8). When N < PP - 1 a subsequence both phases claim
    goes to Left-SP."""
    if pp < 1 or n < 1:
        raise MemoError(f"multiplexed partitioning needs pp >= 1 and N >= 1, got pp={pp}, N={n}")
    out = []
    for i in range(pp):
        left = tuple(x for x in range(n) if x <= pp - 2 - i)
        right = tuple(x for x in range(n) if n - i <= x and x not in left)
        steady = tuple(x for x in range(n) if x not in left and x not in right)
        out.append(MultiplexPhase(i, left, steady, right, tuple(range(i, pp)) if left else (),
                                  tuple(range(0, i + 1)) if right else ()))
    return out


@dataclass(frozen=True)
class Piece:
    """A unit of a stage's work: the tokens [start, end) of subsequence ``sub`` (part ``part`` of
    ``parts`` where multiplexing split it)."""

    sub: int
    part: int
    parts: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start

    def tag(self) -> str:
        return f"s{self.sub}" + (f".{self.part}" if self.parts > 1 else "")


def stage_pieces(model: ModelConfig, batch: int, bounds: tuple[int, ...], pp: int, multiplex: bool,
                 granularity: int = 1) -> list[list[Piece]]:
    """Each stage's pieces in forward order: the subsequences of ``bounds``, with multiplexing the
    bubble-adjacent ones split again (FLOPs-balanced) as `multiplex_phases` says (memoised; do
    not mutate the lists)."""
    return _stage_pieces(model, batch, tuple(bounds), pp, bool(multiplex), int(granularity))


@lru_cache(maxsize=4096)
def _stage_pieces(model: ModelConfig, batch: int, bounds: tuple[int, ...], pp: int, multiplex: bool,
                  granularity: int) -> list[list[Piece]]:
    n = len(bounds) - 1
    phases = multiplex_phases(pp, n) if multiplex else None
    out = []
    for s in range(pp):
        pieces = []
        for i in range(n):
            k = phases[s].parts(i) if phases else 1
            pts = balanced_bounds(model, batch, bounds[i], bounds[i + 1], k, "flops", granularity) if k > 1 \
                else (bounds[i], bounds[i + 1])
            m = len(pts) - 1
            pieces += [Piece(i, j, m, pts[j], pts[j + 1]) for j in range(m)]
        out.append(pieces)
    return out
