"""What a mixture-of-experts block costs on one GPU, op by op, written once: the expert GEMMs
(grouped over the rank's local experts), the router's score pass, and the token dispatcher's
collectives (`memo_sim.layout.moe_dispatchers`) on the links of their groups.

Tokens. Each rank routes its own sequence shard (``shard_tokens``: T / tp under sequence
parallelism); the EP group's ranks exchange top-k copies of them, so a rank's local experts
receive on average top_k x shard tokens (times etp: each expert tensor-parallel rank computes the
ETP group's tokens on its 1/etp slice of every local expert), and the busiest rank
``routed_load`` times that (`memo_sim.layout.moe_balance`). The step waits for the busiest rank:
every per-GPU figure here is that rank's.

Expert GEMMs. ``experts / ep`` local experts, each an (m_e x k) @ (k x n / etp) GEMM with m_e the
rank's routed tokens over its local experts: a grouped GEMM runs them as one kernel, but each
expert's tile work is its own, so each is priced at the profile's GEMM efficiency for its own
FLOPs (small GEMMs of 768-2048-wide experts on few tokens run far below peak) and at the roofline's
memory bound on its weights (a few tokens per expert read the whole expert). Backward: the data-
and weight-gradient GEMMs, twice the forward, as for every layer GEMM.

Collectives. An all-to-all over EP moves each rank's top-k copies (``routed``): of its ``size``
bytes, the share bound for ranks on the same node rides NVLink and the rest the inter-node link,
at the same time, so it takes the longer of the two (`ep_alltoall_time`). Every group of the layout is looked at
(`group_placements`): where a group crosses a node boundary (EP 6 on nodes of 8: ranks 6-11) its rank with the
fewest peers on its node sends the most over the inter-node link, and the step waits for it; a group's collective
rides the inter-node link where any group spans nodes (`step_link`). All-gathers and
reduce-scatters over ETP (routed copies) or ETP x EP (each token once: the all-gather
dispatcher) are rings on their group's link (`memo_sim.cost.collectives`); DeepEP's deduplicated
all-to-all sends each token over the inter-node link once per destination node and over NVLink once per
destination rank (`ep_alltoall_dedup_time`). The collectives run on their own stream (``ep_comm``), on the layer's
critical path (each waits for the op before it and the next op waits for it; beside the other micro-batch's compute
under Megatron-Core's EP overlap, `memo_sim.engine.schedules.ep_overlap`). Backward runs each
collective's transpose over the same bytes. Expert ranks order ETP innermost, then EP
(Megatron-Core's folding, `memo_sim.layout.parallel`), so an EP group's ranks are etp apart.
Group-limited routing (``router_groups`` / ``router_group_topk``: DeepSeek-V3 takes a token's 8 experts from
its best 4 of 8 groups) bounds the nodes a token reaches where the groups fall on whole nodes (each node
holding whole groups) and the ranks it reaches where they fall on whole ranks: the deduplicated all-to-all sends
it to fewer of them (`nodes_hit`); a plain all-to-all moves every routed copy either way. The SMs a dispatcher's
kernels hold from the compute beside them are the event simulator's (`memo_sim.cost.comm_sms`: NCCL's channels,
DeepEP's 20). Not modelled: DeepEP's own overlap hooks, FP8 dispatch, token dropping's savings below capacity, the routing map and probabilities the all-gather
dispatcher gathers beside the tokens (k fp32 values per token).

Buffers. A rank receives the dispatch's tokens, and the combine sends the expert outputs from, a buffer the
dispatcher sizes itself (`dispatcher_buffer_bytes`): the bytes of its ``buffer_step``, as that step is priced
(`step_bytes`): the all-to-all's routed copies, the all-gather dispatcher's whole ETP x EP group's tokens (its
gather's output, and the unpermuted outputs its reduce-scatter starts from). The memory planner's layer traces
allocate it (`memo_sim.memplan.trace_gen`).
"""

from __future__ import annotations

from math import comb

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import routed_load, shard_tokens, tokens_per_gpu
from memo_sim.cost.gemm_format import gemm_cast_seconds, layer_gemm_time
from memo_sim.cost.kernel_time import memory_bound_op_time
from memo_sim.cost.opcost import OpCost
from memo_sim.layout.moe_dispatchers import Step
from memo_sim.layout.moe_dispatchers.base import GROUPS
from memo_sim.layout.parallel import Layout, expert_group_placements
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, OpSpec
from memo_sim.profile.schema import HardwareProfile, Link

GEMM_BWD_FACTOR = 2.0


def routed_tokens(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Token copies the busiest rank's local experts compute (module docs)."""
    return model.top_k * shard_tokens(layout, batch, seq) * layout.etp * routed_load(layout, batch, seq, model.top_k)


def expert_gemm_shape(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int,
                      fraction: float = 1.0) -> tuple[int, float, float, float]:
    """(local experts, m per expert, k, n) of an expert GEMM on the busiest rank: the expert's FFN
    width is split by etp (fc1's output, fc2's input)."""
    local = model.experts // layout.ep
    m = routed_tokens(model, layout, batch, seq) * fraction / local
    i, o = op.gemm
    if op.name == "expert_fc1":
        return local, m, i, o / layout.etp
    return local, m, i / layout.etp, o


def expert_gemm_cost(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                     phase: str, fraction: float = 1.0) -> OpCost:
    """The grouped GEMM of the rank's local experts (module docs), with a quantised format's casts around each
    expert's GEMM as a dense layer's (`memo_sim.cost.gemm_format.gemm_cast_seconds`; the permuted tokens' copies
    are not kept for backward by any framework memo models: MoE inputs are not in ``FP8_SAVED_INPUTS``)."""
    local, m, k, n = expert_gemm_shape(op, model, layout, batch, seq, fraction)
    one = layer_gemm_time(model, profile, m, k, n)
    f, t = local * 2.0 * m * k * n, local * one
    if phase == "bwd":
        f, t = f * GEMM_BWD_FACTOR, t * GEMM_BWD_FACTOR
    t += gemm_cast_seconds(model, profile, phase, m, k, n, groups=local)
    return OpCost(op.name, "gemm", phase, "compute", t, flops=f)


def route_cost(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, phase: str,
               fraction: float = 1.0) -> OpCost:
    """The router's score pass (softmax or sigmoid, top-k, balancing) over the rank's shard."""
    nbytes = model.moe_router.score_bytes(shard_tokens(layout, batch, seq) * fraction, model.experts)
    return OpCost("route", "elementwise", phase, "compute", memory_bound_op_time(nbytes, profile), nbytes=nbytes)


def group_size_stride(group: str, layout: Layout) -> tuple[int, int]:
    """(ranks, stride) of a dispatcher group (expert ranks: ETP innermost, then EP)."""
    if group == "ep":
        return layout.ep, layout.etp
    if group == "etp":
        return layout.etp, 1
    return layout.etp * layout.ep, 1


def group_placements(group: str, layout: Layout, profile: HardwareProfile) -> tuple[tuple[int, ...], ...]:
    """How every group of a dispatcher group kind sits on the profile's nodes (each placement its ranks' counts
    per node; `memo_sim.layout.parallel.expert_group_placements`: every group of every stage, memoised; on one named
    stage's shard, `memo_sim.layout.parallel.stage_shards`, that stage's groups alone)."""
    g, stride = group_size_stride(group, layout)
    return expert_group_placements(layout, g, stride, profile.node_gpus)


def step_link(step_group: str, layout: Layout, profile: HardwareProfile) -> Link:
    """The link a dispatcher group's collective rides: the inter-node link where any group of the layout (of one
    named stage on that stage's shard) spans nodes (`group_placements`: the step waits for its slowest group),
    NVLink otherwise."""
    spans = any(len(p) > 1 for p in group_placements(step_group, layout, profile))
    return profile.internode if spans else profile.nvlink


def ep_alltoall_time(size: float, layout: Layout, profile: HardwareProfile) -> float:
    """An all-to-all of ``size`` bytes per rank over the EP group (``ep`` ranks ``etp`` apart): the peers on the
    node over NVLink, the others over the inter-node link, both at once, the slowest rank of every EP group of the
    layout (`memo_sim.cost.collectives.group_alltoall_time`, which Ulysses' all-to-all reads too)."""
    return coll.group_alltoall_time(size, layout.ep, layout.etp, layout, profile)


def nodes_hit(nodes: int, top_k: int, groups: int = 0, group_topk: int = 0) -> float:
    """The chance that one given node of ``nodes`` (or one rank of an EP group's ``nodes`` ranks: any units the
    experts are spread over evenly) holds at least one of a token's ``top_k`` experts, its
    experts spread uniformly: 1 - (1 - 1/n)^k; under group-limited routing whose ``groups`` fall on whole
    nodes (groups a multiple of nodes), the token picks ``group_topk`` of the groups uniformly and its experts
    among theirs, so a node holding ``h`` groups is missed when the j of them picked (hypergeometric) take
    none of the k experts: the sum of P(j) (1 - j / group_topk)^k (equal to the first form when every group
    is picked)."""
    if not (groups and group_topk and groups % nodes == 0 and group_topk < groups):
        return 1.0 - (1.0 - 1.0 / nodes) ** top_k
    h = groups // nodes
    total = comb(groups, group_topk)
    missed = sum(comb(h, j) * comb(groups - h, group_topk - j) / total * (1.0 - j / group_topk) ** top_k
                 for j in range(min(h, group_topk) + 1))
    return 1.0 - missed


def ep_alltoall_dedup_time(tokens: float, top_k: int, token_bytes: float, layout: Layout,
                           profile: HardwareProfile, groups: int = 0, group_topk: int = 0) -> float:
    """DeepEP's all-to-all of a rank's ``tokens`` (the busiest rank's, each ``top_k`` routed copies of
    ``token_bytes``) over the EP group: a token crosses to each other node of the group holding one of
    its experts once (each other node hit with the chance `nodes_hit` gives: 1 - (1 - 1/n)^k for experts
    spread uniformly over the group's n nodes, less under group-limited routing), and to each rank holding one
    of its experts once over NVLink (DeepEP's layout, ``get_dispatch_layout``: ``is_token_in_rank`` [tokens,
    ranks], ``num_tokens_per_rank``; the rank expands it to its experts' copies itself): g x `nodes_hit` of the
    g ranks on average, at most top_k, the share of them on other ranks of the node crossing NVLink (as each
    copy of the all-to-all does); the two at once (module docs)."""
    g = layout.ep
    if g <= 1:
        return 0.0
    sends = tokens * g * nodes_hit(g, top_k, groups, group_topk)  # one per EP rank a token reaches
    return max(_dedup_rank_time(tokens, sends, top_k, token_bytes, g, p, i, profile, groups, group_topk)
               for p in group_placements("ep", layout, profile) for i in range(len(p)) if p.index(p[i]) == i)


def _dedup_rank_time(tokens: float, sends: float, top_k: int, token_bytes: float, g: int, placement: tuple[int, ...],
                     at: int, profile: HardwareProfile, groups: int, group_topk: int) -> float:
    """`ep_alltoall_dedup_time` for a rank on the ``at``-th node of its group's ``placement`` (its ranks per node):
    the other nodes it reaches, each with the chance one of a token's experts is there (`nodes_hit` where the
    group's nodes hold as many of its ranks each, 1 - (1 - c / g)^k for a node holding c of them otherwise), and
    what arrives at its own node's network ports from the other nodes' ranks, spread over the node's c ranks'
    ports: every rank of node j sends each token there with that node's chance, so a node holding few of the
    group's ranks receives from many (a review: EP 64 as 8 + 56 ranks across two racks, 17.3 GB into the small
    side's 8 ports, 43 ms, priced as the 9.5 ms its ranks send); the same as the send side where every node
    holds as many ranks."""
    nv, ib = profile.nvlink, profile.internode
    per_node, nodes = placement[at], len(placement)
    t_nv = (per_node - 1) * float(nv.latency) + sends * token_bytes * (per_node - 1) / per_node / float(nv.bandwidth)
    if nodes <= 1:
        return t_nv
    if len(set(placement)) == 1:
        remote = received = (nodes - 1) * nodes_hit(nodes, top_k, groups, group_topk)
    else:
        remote = sum(1.0 - (1.0 - c / g) ** top_k for j, c in enumerate(placement) if j != at)
        received = (g - per_node) * (1.0 - (1.0 - per_node / g) ** top_k) / per_node
    t_ib = (nodes - 1) * float(ib.latency) + tokens * token_bytes * max(remote, received) / float(ib.bandwidth)
    return max(t_nv, t_ib)


def step_bytes(step: Step, model: ModelConfig, layout: Layout, batch: int, seq: int, fraction: float) -> float:
    """Bytes of one dispatcher step per rank (what an all-to-all sends, what an all-gather ends with and a
    reduce-scatter starts with), in the model dtype."""
    d = DTYPE_BYTES[model.dtype] * model.hidden * fraction
    if step.moves == "tokens":
        g, _ = group_size_stride(step.group, layout)
        return shard_tokens(layout, batch, seq) * g * d
    copies = model.top_k * shard_tokens(layout, batch, seq) * routed_load(layout, batch, seq, model.top_k)
    if step.collective in ("alltoall", "alltoall_dedup"):
        return copies * d
    return copies * layout.etp * d  # the ETP group's copies, gathered on every ETP rank


def dispatcher_buffer_bytes(op_name: str, model: ModelConfig, layout: Layout, batch: int, seq: int,
                            fraction: float = 1.0) -> float:
    """A rank's receive buffer of the layer graph's ``dispatch`` or ``combine`` op (and of its gradients in the
    backward: the transpose moves the same bytes), in the model dtype: the bytes of the step the dispatcher names
    for it (`memo_sim.layout.moe_dispatchers.base.Dispatcher.buffer_step`), as its collective is priced
    (`step_bytes`): the all-to-all's routed copies (gathered over ETP), the all-gather dispatcher's every token of
    the ETP x EP group."""
    return step_bytes(layout.dispatcher.buffer_step(op_name), model, layout, batch, seq, fraction)


def step_cost(op: OpSpec, step: Step, model: ModelConfig, layout: Layout, batch: int, seq: int,
              profile: HardwareProfile, phase: str, fraction: float) -> OpCost | None:
    g, stride = group_size_stride(step.group, layout)
    if g <= 1:
        return None
    size = step_bytes(step, model, layout, batch, seq, fraction)
    if step.collective == "alltoall":
        t = ep_alltoall_time(size, layout, profile)
    elif step.collective == "alltoall_dedup":
        tokens = shard_tokens(layout, batch, seq) * routed_load(layout, batch, seq, model.top_k) * fraction
        t = ep_alltoall_dedup_time(tokens, model.top_k, DTYPE_BYTES[model.dtype] * model.hidden, layout, profile,
                                   model.router_groups, model.router_group_topk)
    else:
        link = step_link(step.group, layout, profile)
        kind = "all_gather" if step.collective == "allgather" else "reduce_scatter"
        t = coll.ring_allgather_time(size, g, *coll.group_ring_params(profile, layout, link, kind, g, stride))
    return OpCost(f"moe_{op.name}_{step.collective}_{step.group}", "collective", phase, "ep_comm", t, nbytes=size)


def dispatcher_costs(op: OpSpec, model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                     phase: str, fraction: float = 1.0) -> list[OpCost]:
    """The dispatcher's collectives standing for the layer graph's ``dispatch`` / ``combine`` op."""
    steps = layout.dispatcher.dispatch if op.name == "dispatch" else layout.dispatcher.combine
    out = [step_cost(op, s, model, layout, batch, seq, profile, phase, fraction) for s in steps]
    return [c for c in out if c is not None]


def moe_group_link(name: str, layout: Layout, profile: HardwareProfile) -> Link:
    """The link of a ``moe_*`` collective (its name ends in its group: ``_etp_ep``, ``_etp`` or ``_ep``, before
    any ``@`` tag the schedules add)."""
    base = name.split("@", 1)[0]
    group = next(g for g in sorted(GROUPS, key=len, reverse=True) if base.endswith("_" + g))
    return step_link(group, layout, profile)


def scoped_gemm_shape(op: OpSpec, layout: Layout, batch: int, seq: int, fraction: float) -> tuple[float, float, float]:
    """(m, k, n) of a GEMM whose weights are not TP-split: ``replicated`` on the TP group's tokens,
    ``shard`` on the rank's own sequence shard (`memo_sim.model.layer_graph.OpSpec.scope`)."""
    i, o = op.gemm
    if op.scope == "shard":
        return shard_tokens(layout, batch, seq) * fraction, i, o
    return tokens_per_gpu(layout, batch, seq) * fraction, i, o
