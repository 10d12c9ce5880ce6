"""The micro-batch pipelines (1F1B and interleaved 1F1B) as an op graph, one representative GPU
per stage (`memo_sim.engine.schedules.stages`), for every activation policy.

A schedule module gives the per-rank order of steps (`Step`: the forward or backward of one
micro-batch through one model chunk; `memo_sim.engine.schedules.one_f_one_b`,
`memo_sim.engine.schedules.interleaved`); this module turns the orders into ops:

- **Chunks and layers.** Each of the ``pp`` ranks holds ``vpp`` model chunks; chunk c of rank s is
  virtual stage ``c·pp + s`` and runs layers ``[vs·Lc, (vs+1)·Lc)`` with Lc = layers / (pp·vpp).
  The embedding runs at the start of virtual stage 0's forward (and its backward at the end of
  its backward), the classifier (forward and backward, chunked) at the end of the last virtual
  stage's forward.
- **Per unit** (one layer of one micro-batch): the layer's forward, backward and the policy's
  recompute chains of `memo_sim.cost.layer_time` at the micro-batch's size (TP/SP, CP and Ulysses
  collectives inside, as on a single stage), each phase holding one working block. Each stage's
  chains ride its own groups' links (`memo_sim.layout.parallel.stage_shards`: where a stage's expert,
  CP, TP or Ulysses groups sit inside a node and another stage's cross one, the first is priced on
  NVLink, the second on the inter-node link; the chains are priced once per distinct placement).
- **P2P.** A forward step's output goes to the next virtual stage's rank as a ``send_fwd`` op on
  the sender's ``p2p`` stream (the activation of its SP shard, `memo_sim.cost.sppo.p2p_bytes`),
  a backward step's input gradient to the previous one as ``send_bwd``; over NVLink where both
  ranks' GPUs share a node, over the inter-node link where they do not
  (`memo_sim.layout.parallel.stages_cross_nodes`). The receiving step waits for the send.
- **Order.** Every rank's compute stream runs its steps in the schedule's order; a step also
  waits for the send it receives. Bubbles are the time a rank's compute stream waits.
- **Activations** (the policy object decides; no branch on its name): a unit allocates the
  policy's forward-kept bytes (`Policy.forward_kept`: every skeletal tensor for store all, the
  layer input for full recompute, the lse for the offloading policies that keep it) at its forward and frees them
  after its backward, so a rank holds them for every micro-batch in flight (1F1B: p - s on stage
  s). An offloading policy's unit writes its skeletal tensors into a slot of the rank's rounding blocks (two forward
  and two prefetch blocks of `unit_slot_bytes` each, held through the step as memo-exec allocates them and the
  level-2 memory plan places them, `Policy.pipeline_rank_blocks`; a review found the slots allocated per unit and
  freed at each copy's end, a stage's peak below its own arena) and copies them to host on ``d2h`` after its
  forward. MEMO's rounding-buffer rule (`memo_sim.policy.rounding_buffers`) runs
  over the rank's forward units in order: a unit's output write waits for the offload of the
  unit before it, and the rank's last two forward units are not offloaded (they stay in their
  slots until their backward). Every micro-batch in flight offloads: each offloaded unit holds
  its pinned host block from the offload's start to the prefetch's end, so the host memory of a
  node counts every micro-batch in flight on every stage it holds. In backward, a unit's
  prefetch (``h2d``) writes a prefetch block. The rounding-buffer rule runs over the rank's
  units in backward order (across its backward steps, the kept last two included): the k-th
  unit's prefetch waits for the backward of the (k-2)-th (the slot it overwrites), and none is
  issued before the step before its own backward step starts (so a backward step's first
  prefetches overlap the forward step before it in the steady state); the policy's recompute
  (MEMO's token-wise one, or the whole layer for full recompute, into
  `Policy.recompute_allocated`) runs before the backward.
- **Gradients.** Accumulated over the micro-batches; each layer's gradient bucket (all-reduce, or
  reduce-scatter with ZeRO-1) goes out on ``dp_comm`` after the layer's backward of the last
  micro-batch (overlapping the rest of that backward), the head's (with the multi-token-prediction
  modules') on the last rank after the last micro-batch's head, before the layers' (FSDP beside stages:
  after the rank's last step), the embedding's after the first rank's last step; the end ranks then sum
  a shared embedding's gradients (`memo_sim.cost.grad_sync`); each rank's optimizer step waits for its
  last bucket. FSDP
  beside stages (`memo_sim.dp.fsdp`, as torchtitan and ``torch.distributed.pipelining`` run it)
  sends a chunk's buckets only after the chunk's last micro-batch backward has ended, one per
  layer, and gathers each layer's weights once, before the first micro-batch's forward. With
  ``layout.grad_overlap`` off (Megatron-LM 2021's local DDP) there are no buckets: after the rank's
  last step one collective reduces every gradient the stage holds (its layers', and the embedding's
  or classifier's on the first or last stage: `memo_sim.cost.sppo.stage_serial_grad_reduce`),
  wholly exposed before its optimizer step.
- **Attention kernel.** The unit costs and its memory come from the single stage's functions
  (`layer_plan`, `memory_breakdown` on the stage's shard), so ``layout.attention`` is priced there
  and only there: materialised attention's kernel times (`memo_sim.cost.attention_kernel`) in each
  layer's forward, recompute and backward, its score-sized buffers in the layer's transient block,
  and (store all) its kept softmax output, dropout mask and dropped probabilities among the
  layer's skeletal tensors, held for every micro-batch in flight.
  ZeRO-1's weight gathers run before each layer's first forward, two layers ahead.

Not modelled: the caching allocator's reorganisations inside a pipeline stage (its transient
block is the allocator's reserved peak of one layer, as on a single stage), and P2P sends
sharing the NVLink port with TP collectives beyond the link model's sharing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable

from memo_sim.cost.boundary import pipeline_boundary_times
from memo_sim.cost.grad_sync import GradSync
from memo_sim.cost.memory import mtp_activation_bytes
from memo_sim.cost.opcost import OpCost
from memo_sim.cost.sppo import (
    p2p_bytes, p2p_link_time, stage_grad_sync, stage_model_state_bytes, stage_optimizer_time, stage_serial_grad_reduce,
)
from memo_sim.engine.core import Engine, Failure, gc_paused
from memo_sim.engine.periodic import unfold_window
from memo_sim.engine.graph import Device, MemAction, Op, OpGraph, gpus_on_nodes
from memo_sim.engine.result import (
    SimResult, _span, check_deadlock, exposed_wait_by_device, exposed_wait_parts_of, rates,
    timeline_events,
)
from memo_sim.engine.schedules.ep_overlap import (
    FWD_SEGMENTS, PAIR_ORDER, delay_weight_grads, merged_pairs, overlapped_order, split_layer,
)
from memo_sim.engine.schedules.microbatch_fold import MICRO_BATCHES, mb_name, mb_tensor, plan_window_fold
from memo_sim.engine.schedules.single_stage import emit_chain, kind_phases, layer_plan
from memo_sim.engine.schedules.stages import FINE_OPS_LIMIT, collapse_unit, shared_embedding_sums, stage_devices
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import gpu_limit_bytes
from memo_sim.layout.parallel import (
    Layout, distinct_shards, stage_groups_key, stage_shard, stage_shards, stages_cross_nodes,
)
from memo_sim.layout.schedule import ideal_bubble_fraction
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.model.layer_kinds import layer_kinds
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy, uses_memory_plan
from memo_sim.policy.rounding_buffers import N_BUFFERS, is_offloaded, output_write_waits_for
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import COPY_STREAMS, Timeline

P2P_STREAM = "p2p"


@dataclass(frozen=True)
class Step:
    """One step of a rank: the forward (``F``) or backward (``B``) of micro-batch ``mb`` through
    the rank's model chunk ``chunk`` (0 .. vpp-1)."""

    kind: str
    mb: int
    chunk: int = 0


Order = Callable[[int, int, int, int], list[Step]]  # (pp, micro_batches, vpp, rank) -> the rank's steps

_ORDERS: dict[str, Order] = {}
_VIRTUAL: set[str] = set()  # the schedules whose ranks hold more than one model chunk


def register_order(name: str, order: Order, *, virtual_stages: bool = False) -> None:
    """A micro-batch pipeline schedule's per-rank order, by the schedule's name (its module calls
    this; the search reads the in-flight counts off it). ``virtual_stages``: the order runs vpp >= 2
    model chunks per rank (interleaved 1F1B); else one (1F1B)."""
    _ORDERS[name] = order
    if virtual_stages:
        _VIRTUAL.add(name)
    else:
        _VIRTUAL.discard(name)


def takes_virtual_stages(name: str) -> bool:
    """Whether the micro-batch pipeline schedule ``name`` runs more than one model chunk per rank (the search
    tries vpp > 1 for it alone: `memo_sim.search.pipeline.pipeline_candidates`)."""
    pipeline_order(name)  # a one-line error for a name that is not a micro-batch pipeline
    return name in _VIRTUAL


def pipeline_order(name: str) -> Order:
    """The per-rank order of the micro-batch pipeline schedule ``name``."""
    try:
        return _ORDERS[name]
    except KeyError:
        raise MemoError(f"{name!r} is not a micro-batch pipeline schedule ({', '.join(_ORDERS)})") from None


def micro_batch_pipelines() -> tuple[str, ...]:
    """The names of the registered micro-batch pipeline schedules."""
    return tuple(_ORDERS)


def _order_of(name: str, ep_overlap: bool) -> Order:
    """Schedule ``name``'s order, with the EP overlap's extra warm-up forward where ``ep_overlap``
    (`memo_sim.engine.schedules.ep_overlap`)."""
    order = pipeline_order(name)
    return overlapped_order(order) if ep_overlap else order


def stage_in_flight(name: str, pp: int, micro_batches: int, vpp: int, ep_overlap: bool = False) -> list[int]:
    """Per rank, the most chunk forwards held at once under schedule ``name`` (memoised: the
    what-if asks for the same few (pp, micro-batches, vpp) for thousands of candidates); ``ep_overlap``: the
    layout's `Layout.ep_overlap` (one more warm-up forward)."""
    return list(_stage_in_flight(_order_of(name, ep_overlap), pp, micro_batches, vpp))


@lru_cache(maxsize=4096)
def _stage_in_flight(order, pp: int, micro_batches: int, vpp: int) -> tuple[int, ...]:
    return tuple(in_flight(order(pp, micro_batches, vpp, s)) for s in range(pp))


def stage_in_flight_layers(name: str, pp: int, micro_batches: int, vpp: int,
                           chunk_sizes: tuple[tuple[int, ...], ...], ep_overlap: bool = False) -> list[int]:
    """Per rank, the most layers of chunk forwards held at once under schedule ``name``, rank s's chunk c
    holding ``chunk_sizes[s][c]`` layers (uneven chunks: the count of `stage_in_flight` times the largest
    chunk overstates it where a rank's chunks differ); ``ep_overlap`` as `stage_in_flight`'s."""
    return list(_stage_in_flight_layers(_order_of(name, ep_overlap), pp, micro_batches, vpp, chunk_sizes))


@lru_cache(maxsize=4096)
def _stage_in_flight_layers(order, pp: int, micro_batches: int, vpp: int, chunk_sizes) -> tuple[int, ...]:
    out = []
    for s in range(pp):
        live = peak = 0
        for st in order(pp, micro_batches, vpp, s):
            live += chunk_sizes[s][st.chunk] if st.kind == "F" else -chunk_sizes[s][st.chunk]
            peak = max(peak, live)
        out.append(peak)
    return tuple(out)


def unit_slot_bytes(policy: Policy, sk: dict) -> float:
    """The rounding-buffer slot one unit of an offloading policy writes and one prefetch allocates again: one of the
    policy's own `N_BUFFERS` buffers (`Policy.static_gpu`; a pipeline rank's four of `Policy.pipeline_rank_blocks`
    are the same size), so ``skeletal.total`` for MEMO and full offload, the layer input alone for checkpoint offload
    (its recompute buffer is `Policy.recompute_allocated`'s, as under full recompute; memo_exec allocates the same:
    `memo_exec.activations.checkpoint_offload`). 0 for a policy that does not offload. A review found the whole
    skeletal slot priced for checkpoint offload, 15 GiB above its analytic peak for gpt-7b at 64K, pp 4, tp 2."""
    if not policy.offloads:
        return 0.0
    return sum(b for _n, b in policy.static_gpu(sk)) / N_BUFFERS


def in_flight(order: list[Step]) -> int:
    """The most chunk forwards a rank holds whose backward has not run (its activations' count)."""
    live = peak = 0
    for st in order:
        live += 1 if st.kind == "F" else -1
        peak = max(peak, live)
    return peak


def check_order(order: list[Step], micro_batches: int, vpp: int) -> None:
    """Every (micro-batch, chunk) once forward and once backward, the backward after the forward."""
    seen_f: set[tuple[int, int]] = set()
    seen_b: set[tuple[int, int]] = set()
    for st in order:
        key = (st.mb, st.chunk)
        if st.kind == "F":
            if key in seen_f:
                raise ValueError(f"forward of {key} twice")
            seen_f.add(key)
        else:
            if key not in seen_f or key in seen_b:
                raise ValueError(f"backward of {key} before its forward or twice")
            seen_b.add(key)
    want = {(mb, c) for mb in range(micro_batches) for c in range(vpp)}
    if seen_f != want or seen_b != want:
        raise ValueError("the order does not run every micro-batch through every chunk")


@dataclass(frozen=True)
class StagePhases:
    """One stage shard's (`memo_sim.layout.parallel.stage_shards`) layer op lists, where the stages' groups sit
    differently: its forward, backward and recompute, and each attention kind's (`PipelineCosts.kind_phases`)."""

    shard: Layout
    forward: list[OpCost]
    backward: list[OpCost]
    recompute: list[OpCost]
    kind_phases: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineCosts:
    """What one unit (a layer of one micro-batch) and the stages' boundaries cost: from the model
    (`pipeline_costs`) or, in tests, a toy."""

    forward: list[OpCost]
    backward: list[OpCost]
    recompute: list[OpCost]
    embedding_fwd: float
    embedding_bwd: float
    classifier: float
    optimizer: tuple[float, ...]  # per stage
    model_states: tuple[float, ...]  # per stage, bytes on one GPU
    skeletal: dict  # one layer's per-GPU skeletal bytes of one micro-batch, by role
    working_bytes: float  # the larger phase's transient block + the activation handed on
    classifier_bytes: float
    offload_bytes: float  # per offloaded unit and GPU
    host_block_bytes: float  # pinned bytes per offloaded unit and GPU
    p2p_bytes: float  # one send of one micro-batch's activation (or its gradient)
    p2p_seconds: dict  # link kind -> seconds of one send alone on it
    sync: GradSync
    serial_grads: tuple[float, ...] = ()  # per stage: seconds of all its gradients in one collective (grad_overlap off)
    # the multi-token-prediction modules' activations one micro-batch keeps on the last stage from its head to its
    # backward step (`memo_sim.cost.memory.mtp_activation_bytes`; within the head they are in ``classifier_bytes``)
    mtp_kept_bytes: float = 0.0
    # where the layers' attention differs and its placement is stated (`memo_sim.model.layer_kinds`): each
    # layer's kind, and the forward, backward and recompute op lists of each kind (() / {}: every layer's the above)
    layer_kinds: tuple = ()
    kind_phases: dict = field(default_factory=dict)
    # each layer phase's working block where they differ (`MemoryBreakdown.phase_working_bytes`; {}: working_bytes)
    working_by_phase: dict = field(default_factory=dict)
    # where the stages' groups sit differently (`memo_sim.layout.parallel.stage_shards`): per stage, its own shard's
    # op lists (one `StagePhases` object for the stages of one placement), or None where the lists above (priced on
    # ``stage_shard(layout)``, every stage's groups looked at) are its own; (): every stage prices the lists above
    stage_phases: tuple = ()

    def of_stage(self, stage: int | None) -> StagePhases | None:
        """Stage ``stage``'s own op lists where they are not the lists above (None: they are)."""
        return self.stage_phases[stage] if stage is not None and self.stage_phases else None

    def phases_of(self, layer: int, stage: int | None = None) -> tuple[list[OpCost], list[OpCost], list[OpCost]]:
        """(forward, backward, recompute) of model layer ``layer``: its kind's, or the repeated layer's (on stage
        ``stage``'s own shard where it has one)."""
        own = self.of_stage(stage)
        if own is not None:
            return own.kind_phases[self.layer_kinds[layer]] if self.layer_kinds else (own.forward, own.backward,
                                                                                       own.recompute)
        if self.layer_kinds:
            return self.kind_phases[self.layer_kinds[layer]]
        return self.forward, self.backward, self.recompute


def pipeline_costs(model: ModelConfig, layout: Layout, micro_batch: int, seq: int, policy: Policy,
                   profile: HardwareProfile) -> PipelineCosts:
    """The costs of one unit at ``micro_batch`` sequences, from the same functions the single
    stage uses (`layer_plan`, `memo_sim.cost.boundary`, `memo_sim.cost.sppo`'s per-stage terms). Where the
    stages' groups sit differently (`memo_sim.layout.parallel.stage_shards`), each distinct stage shard's layer
    op lists too (`PipelineCosts.stage_phases`), over the same memory terms (where a group sits moves no byte)."""
    shard = stage_shard(layout)
    mem = memory_breakdown(model, shard, micro_batch, seq, policy, profile)
    lp = layer_plan(model, shard, micro_batch, seq, policy, profile, mem)
    stage_phases: tuple = ()
    shards = stage_shards(layout, profile.node_gpus)
    if any(sh is not shard for sh in shards):
        whole_key = stage_groups_key(shard, profile.node_gpus)
        own: dict[int, StagePhases | None] = {}
        for sh in distinct_shards(shards):
            if stage_groups_key(sh, profile.node_gpus) == whole_key:  # prices as the lists above
                own[id(sh)] = None
                continue
            slp = layer_plan(model, sh, micro_batch, seq, policy, profile, mem)
            own[id(sh)] = StagePhases(sh, slp.forward, slp.backward, slp.recompute,
                                      kind_phases(model, sh, micro_batch, seq, policy, profile, mem))
        stage_phases = tuple(own[id(sh)] for sh in shards)
    bt = pipeline_boundary_times(model, shard, shards[-1], micro_batch, seq, profile,
                                 recompute_mtp=policy.recomputes_mtp)
    secs = {link: p2p_link_time(model, layout, micro_batch, seq, profile, link) for link in ("nvlink", "internode")}
    return PipelineCosts(
        lp.forward, lp.backward, lp.recompute,
        bt.embedding_fwd, bt.embedding_bwd, bt.classifier,
        tuple(stage_optimizer_time(model, layout, s, profile) for s in range(layout.pp)),
        tuple(stage_model_state_bytes(model, layout, s) for s in range(layout.pp)),
        dict(lp.skeletal), lp.working_bytes, mem.classifier_peak_bytes, lp.offload_bytes, lp.host_block_bytes,
        p2p_bytes(model, layout, micro_batch, seq), secs, stage_grad_sync(model, layout, profile),
        tuple(stage_serial_grad_reduce(model, layout, profile, s) for s in range(layout.pp)),
        mtp_activation_bytes(model, shard, micro_batch, seq, policy.recomputes_mtp),
        layer_kinds(model), kind_phases(model, shard, micro_batch, seq, policy, profile, mem),
        {ph: mem.phase_working_bytes(ph) for ph in ("fwd", "bwd", "recompute")}, stage_phases)


@dataclass
class MicrobatchSchedule:
    graph: OpGraph
    devices: list[Device]
    orders: list[list[Step]]
    costs: PipelineCosts
    layers_per_chunk: int
    phases: dict = field(default_factory=dict)  # (stage, mb, layer, fwd|bwd|recompute) -> ops
    copies: dict = field(default_factory=dict)  # (stage, mb, layer, offload|prefetch) -> op
    sends: dict = field(default_factory=dict)  # (fwd|bwd, mb, virtual stage) -> op
    forwards: dict = field(default_factory=dict)  # (stage, mb, chunk) -> the first op of that forward step
    detail: str = "ops"
    ranges: tuple[range, ...] = ()  # each virtual stage's layers where they differ (uneven stages)

    def chunk_layers(self, stage: int, chunk: int) -> range:
        vs = chunk * len(self.devices) + stage
        if self.ranges:
            return self.ranges[vs]
        return range(vs * self.layers_per_chunk, (vs + 1) * self.layers_per_chunk)


@dataclass
class _Rank:
    tail: list[Op] = field(default_factory=list)  # what the rank's next compute op follows
    prev_launch: list[Op] = field(default_factory=list)  # the tail when the previous step started
    u: int = 0  # forward units laid out so far
    unit_of: dict = field(default_factory=dict)  # (mb, chunk, j) -> unit
    fwd_tail: dict = field(default_factory=dict)
    offload: dict = field(default_factory=dict)  # unit -> offload op
    bwd_end: dict = field(default_factory=dict)
    backward_order: list = field(default_factory=list)  # the rank's units in the order their backwards run
    last_dp: Op | None = None


@dataclass
class _StepCtx:
    """One step being laid out: its virtual stage and layers, what its next op waits for, the ops it made."""
    vs: int
    rg: range
    deps: list
    ops: list = field(default_factory=list)
    before: list = field(default_factory=list)  # a backward step's dependencies before its first layer

    def add(self, op: Op) -> Op:
        self.ops.append(op)
        return op


def _drain(gen) -> None:
    """Run a layer generator (`_MicrobatchBuilder._fwd_layer`, ``_bwd_layer``) to its end."""
    for _ in gen:
        pass


def _resume(gen) -> None:
    """Emit a layer generator's next segment (nothing where it has emitted all of them)."""
    next(gen, None)


def resolve_detail(detail: str, costs: PipelineCosts, pp: int, micro_batches: int, vpp: int,
                   layers_per_chunk: int) -> str:
    """``ops`` or ``units`` for ``auto``: op by op while the graph stays under `FINE_OPS_LIMIT` ops."""
    if detail != "auto":
        return detail
    per_unit = len(costs.forward) + len(costs.backward) + len(costs.recompute)
    return "ops" if pp * micro_batches * vpp * layers_per_chunk * per_unit <= FINE_OPS_LIMIT else "units"


def build_microbatch_pipeline(costs: PipelineCosts, layout: Layout, profile: HardwareProfile, policy: Policy,
                              n_layers: int, micro_batches: int, order: Order, *,
                              devices: list[Device] | None = None, detail: str = "auto") -> MicrobatchSchedule:
    """The op graph of one iteration of a micro-batch pipeline (see the module docs)."""
    with gc_paused():
        return _build(costs, layout, profile, policy, n_layers, micro_batches, order, devices, detail)


def _build(costs, layout, profile, policy, n_layers, micro_batches, order, devices, detail) -> MicrobatchSchedule:
    return _MicrobatchBuilder(costs, layout, profile, policy, n_layers, micro_batches, order, devices, detail).build()


class _MicrobatchBuilder:
    """One build of `build_microbatch_pipeline`: the ranks' orders and unit costs, then the steps
    laid out rank by rank as their receives allow, then each stage's gradient sync and optimizer."""

    def __init__(self, costs, layout, profile, policy, n_layers, micro_batches, order, devices, detail):
        p, v, m = layout.pp, layout.vpp, micro_batches
        n_vs = p * v
        if layout.uneven:  # each virtual stage its own layer count (`Layout.virtual_stage_ranges`)
            ranges = tuple(layout.virtual_stage_ranges(n_layers))
        elif n_layers % n_vs:
            raise MemoError(f"{n_layers} layers do not split evenly into pp x vpp = {n_vs} model chunks")
        else:
            k = n_layers // n_vs
            ranges = tuple(range(vs * k, (vs + 1) * k) for vs in range(n_vs))
        lc = max(len(rg) for rg in ranges)
        devices = devices or stage_devices(layout, profile)
        if layout.ep_overlap:  # one more warm-up forward (`memo_sim.engine.schedules.ep_overlap`)
            order = overlapped_order(order)
        orders = [order(p, m, v, s) for s in range(p)]
        for o in orders:
            check_order(o, m, v)
        detail = resolve_detail(detail, costs, p, m, v, lc)
        if detail not in ("ops", "units"):
            raise MemoError(f"detail must be ops, units or auto, got {detail!r}")
        shard = stage_shard(layout)  # the layout the chains are emitted on (their links)

        def lists(fwd, bwd, rec, shard=shard) -> dict:  # a layer's op lists by phase, one op each for ``units``
            if detail == "units":
                fwd, bwd = collapse_unit(fwd, "fwd", shard, profile), collapse_unit(bwd, "bwd", shard, profile)
                rec = collapse_unit(rec, "recompute", shard, profile) if rec else rec
            return {"fwd": fwd, "bwd": bwd, "recompute": rec}

        self.costs, self.layout, self.profile, self.policy = costs, layout, profile, policy
        self.p, self.m, self.n_vs, self.lc = p, m, n_vs, lc
        self.devices, self.orders, self.detail = devices, orders, detail
        # the merged steps of `Layout.ep_overlap`: per rank, the positions of its order whose forward runs with the
        # backward after it (`memo_sim.engine.schedules.ep_overlap.merged_pairs`)
        self.pairs = [merged_pairs(order, p, m, v, s) if layout.ep_overlap else set() for s in range(p)]
        self.base = lists(costs.forward, costs.backward, costs.recompute)
        # layers whose attention differs (`PipelineCosts.layer_kinds`): each kind's lists
        self.kind_lists = {k: lists(*ph) for k, ph in costs.kind_phases.items()}
        self.rec = self.base["recompute"]
        self.shard = shard
        # each stage's (base lists, kind lists, shard): its own shard's where its groups sit apart
        # (`PipelineCosts.stage_phases`), made once per distinct shard; index 0 the lists above
        self.stage_sets: list[tuple[dict, dict, Layout]] = [(self.base, self.kind_lists, shard)]
        # the same lists uncollapsed, which a merged step cuts into segments before collapsing each (`segments`)
        raw = lambda fwd, bwd, rec: {"fwd": fwd, "bwd": bwd, "recompute": rec}  # noqa: E731
        self.raw_sets: list[tuple[dict, dict]] = [(raw(costs.forward, costs.backward, costs.recompute),
                                                   {k: raw(*ph) for k, ph in costs.kind_phases.items()})]
        self.stage_set = [0] * p
        made: dict[int, int] = {}
        for s_ in range(p):
            own = costs.of_stage(s_) if len(costs.stage_phases) == p else None
            if own is None:
                continue
            if id(own) not in made:
                made[id(own)] = len(self.stage_sets)
                self.stage_sets.append((lists(own.forward, own.backward, own.recompute, own.shard),
                                        {k: lists(*ph, own.shard) for k, ph in own.kind_phases.items()}, own.shard))
                self.raw_sets.append((raw(own.forward, own.backward, own.recompute),
                                      {k: raw(*ph) for k, ph in own.kind_phases.items()}))
            self.stage_set[s_] = made[id(own)]
        self.g = g = OpGraph(devices)
        self.sched = MicrobatchSchedule(g, devices, orders, costs, lc, detail=detail,
                                        ranges=ranges if layout.uneven else ())
        self.ranges = ranges
        # every op of micro-batch k is named ``<op>@m<k>`` (the figures colour by it); one list per phase and k
        self.tagged: dict[tuple, list[OpCost]] = {}
        sk = costs.skeletal
        self.kept = tuple(policy.forward_kept(sk))
        self.rec_alloc = tuple(policy.recompute_allocated(sk))
        self.slot = unit_slot_bytes(policy, sk)  # an offloading policy's rounding-buffer slot per unit
        # forward units per rank: its chunks' layers x micro-batches
        self.n_f_of = [m * sum(len(ranges[c * p + s]) for c in range(v)) for s in range(p)]
        self.sync = costs.sync
        self.grad_op = "reducescatter_grads" if layout.zero >= 1 else "allreduce_grads"
        self.after_chunk = layout.grads_reduced_per_chunk
        # the head's bucket goes out after the last micro-batch's head (Megatron-LM's buckets follow the parameters
        # in reverse: `memo_sim.cost.grad_sync`), except where a chunk's buckets follow its whole backward (FSDP)
        head = self.sync.head_grad + self.sync.mtp_grad
        self.head_bucket_early = self.sync.overlapped and not self.after_chunk and head > 0
        for s, dev in enumerate(devices):
            g.add_static(dev.index, MemAction("gpu", "model_states", costs.model_states[s]))
            if self.slot:  # the rank's forward and prefetch rounding blocks, held through the step (module docs)
                g.add_static(dev.index, MemAction("gpu", "rounding_blocks", 2 * N_BUFFERS * self.slot))
        self.ranks = [_Rank() for _ in range(p)]
        self.send_f: dict[tuple[int, int], Op] = {}
        self.send_b: dict[tuple[int, int], Op] = {}
        self.fwd_done: dict[tuple[int, int], list[Op]] = {}

    def build(self) -> MicrobatchSchedule:
        self.lay_out()
        self.finish()
        return self.sched

    def phase_costs(self, phase: str, mb: int, layer: int, stage: int = 0) -> list[OpCost]:
        """Model layer ``layer``'s ops of ``phase`` for micro-batch ``mb`` on stage ``stage`` (its attention kind's
        where they differ, its own shard's where its groups sit apart from another stage's)."""
        kind = self.costs.layer_kinds[layer] if self.costs.layer_kinds else None
        k = self.stage_set[stage]
        key = (phase, mb, kind) if k == 0 else (phase, mb, kind, k)  # the single set's keys as they were
        hit = self.tagged.get(key)
        if hit is None:
            base_lists, kind_lists, _shard = self.stage_sets[k]
            base = (base_lists if kind is None else kind_lists[kind])[phase]
            hit = self.tagged[key] = [replace(c, name=mb_name(c.name, mb)) for c in base]
        return hit

    def shard_of(self, stage: int) -> Layout:
        """The shard stage ``stage``'s chains are emitted on (their links)."""
        return self.stage_sets[self.stage_set[stage]][2]

    def link(self, a: int, b: int) -> str:
        return "internode" if stages_cross_nodes(self.layout, a, b, self.profile.node_gpus) else "nvlink"

    def send(self, kind: str, s: int, to: int, mb: int, vs: int, layer: int, deps: list[Op]) -> Op:
        costs = self.costs
        lk = self.link(s, to)
        op = self.g.add(mb_name(f"send_{kind}", mb), device=self.devices[s].index, stream=P2P_STREAM, kind="comm",
                        phase=f"p2p_{kind}", layer=layer, work=costs.p2p_seconds[lk], nbytes=costs.p2p_bytes, link=lk,
                        deps=deps)
        self.sched.sends[(kind, mb, vs)] = op
        (self.send_f if kind == "fwd" else self.send_b)[(mb, vs)] = op
        return op

    @staticmethod
    def held(mb: int, layer: int, items, sign: float = 1.0) -> tuple[MemAction, ...]:
        return tuple(MemAction("gpu", mb_tensor(mb, f"L{layer}.{name}"), sign * nbytes) for name, nbytes in items)

    def working(self, mb: int, layer: int, phase: str, sign: float = 1.0) -> MemAction:
        nbytes = self.costs.working_by_phase.get(phase, self.costs.working_bytes)
        return MemAction("gpu", mb_tensor(mb, f"L{layer}.{phase}.working"), sign * nbytes)

    def lay_out(self) -> None:
        """Lay the steps out in an order that respects every rank's own order and every receive."""
        p, orders, ranks = self.p, self.orders, self.ranks
        pos = [0] * p
        total = sum(len(o) for o in orders)
        laid = 0
        while laid < total:
            progressed = False
            for s in range(p):
                o = orders[s]
                while pos[s] < len(o):
                    st = o[pos[s]]
                    pair = pos[s] in self.pairs[s]
                    steps = (st, o[pos[s] + 1]) if pair else (st,)
                    if not all(self.ready(x, x.chunk * p + s) for x in steps):
                        break
                    launch = list(ranks[s].tail)
                    if pair:
                        self.merged_step(s, *steps)
                    else:
                        (self.forward_step if st.kind == "F" else self.backward_step)(s, st)
                    ranks[s].prev_launch = launch
                    pos[s] += len(steps)
                    laid += len(steps)
                    progressed = True
            if not progressed:
                stuck = [(s, orders[s][pos[s]]) for s in range(p) if pos[s] < len(orders[s])]
                raise RuntimeError(f"pipeline order deadlocks: every rank waits ({stuck[:3]})")

    def ready(self, st: Step, vs: int) -> bool:
        """Whether step ``st`` of virtual stage ``vs`` has what it receives (its input, or its output's gradient)."""
        if st.kind == "F":
            return vs == 0 or (st.mb, vs - 1) in self.send_f
        return (st.mb, vs + 1) in self.send_b if vs < self.n_vs - 1 else (st.mb, vs) in self.fwd_done

    def finish(self) -> None:
        """Each stage's last gradient sync and its optimizer step."""
        g, sync, grad_op, costs, p = self.g, self.sync, self.grad_op, self.costs, self.p
        for s, r in enumerate(self.ranks):
            d = self.devices[s].index
            if sync.active and not sync.overlapped:  # every gradient of the stage at once, after its whole backward
                r.last_dp = g.add(grad_op, device=d, stream="dp_comm", kind="comm", phase="grad_sync", layer=None,
                                  work=costs.serial_grads[s], deps=r.tail, link=sync.link)
            elif sync.end_bucket(s, p) > 0 and not (s == p - 1 and self.head_bucket_early):
                # the embedding's bucket after its backward; the head's here only where it did not go out early
                r.last_dp = g.add(grad_op, device=d, stream="dp_comm", kind="comm", phase="grad_sync", layer=None,
                                  work=sync.end_bucket(s, p), deps=r.tail, link=sync.link)
        ends = [r.tail + ([r.last_dp] if r.last_dp else []) for r in self.ranks]
        shared = shared_embedding_sums(g, sync, self.devices, ends)
        for s, r in enumerate(self.ranks):
            g.add("optimizer", device=self.devices[s].index, stream="compute", kind="compute", phase="optimizer",
                  layer=None, work=costs.optimizer[s], deps=ends[s] + ([shared[s]] if s in shared else []))

    def forward_step(self, s: int, st: Step) -> None:
        ctx = self._fwd_begin(s, st)
        for j in range(len(ctx.rg)):
            _drain(self._fwd_layer(s, st, ctx, j, None))
        self.ranks[s].tail = self._fwd_end(s, st, ctx)

    def backward_step(self, s: int, st: Step) -> None:
        ctx = self._bwd_begin(s, st)
        for j in range(len(ctx.rg) - 1, -1, -1):
            _drain(self._bwd_layer(s, st, ctx, j, None))
        self.ranks[s].tail = self._bwd_end(s, st, ctx)

    def merged_step(self, s: int, f: Step, b: Step) -> None:
        """A forward step and the backward step after it run as one (`Layout.ep_overlap`,
        `memo_sim.engine.schedules.ep_overlap`): the forward's layer i beside the backward's layer n-1-i, their
        segments issued in `PAIR_ORDER`; a layer the other step has no partner for runs its segments alone."""
        fctx, bctx = self._fwd_begin(s, f), self._bwd_begin(s, b)
        nf, nb = len(fctx.rg), len(bctx.rg)
        pending = None  # the forward layer whose post segment is issued as the next pair starts
        for i in range(max(nf, nb)):
            if pending is not None:
                _drain(pending)
                pending = None
            fl = self._fwd_layer(s, f, fctx, i, self.segments("fwd", f.mb, fctx.rg[i], s)) if i < nf else None
            bl = (self._bwd_layer(s, b, bctx, nb - 1 - i, self.segments("bwd", b.mb, bctx.rg[nb - 1 - i], s))
                  if i < nb else None)
            for who, _seg in PAIR_ORDER:
                gen = fl if who == "F" else bl
                if gen is None or (who == "F" and _seg == "post"):
                    continue
                if who == "B" and _seg == "pre":
                    _drain(gen)
                else:
                    _resume(gen)
            pending = fl
        if pending is not None:
            _drain(pending)
        f_tail = self._fwd_end(s, f, fctx)
        b_tail = self._bwd_end(s, b, bctx)
        self.ranks[s].tail = f_tail + b_tail

    def segments(self, phase: str, mb: int, layer: int, stage: int) -> list[list[OpCost]]:
        """Model layer ``layer``'s ``phase`` chain for micro-batch ``mb`` cut for a merged step
        (`memo_sim.engine.schedules.ep_overlap.split_layer`; each segment collapsed on its own at ``units`` detail):
        the forward's five segments, the backward's five with its expert GEMMs' weight gradients as a sixth after
        its ``mlp`` (`delay_weight_grads`). One whole chain where the layer's dispatcher moves nothing."""
        kind = self.costs.layer_kinds[layer] if self.costs.layer_kinds else None
        k = self.stage_set[stage]
        key = ("segments", phase, mb, kind, k)
        hit = self.tagged.get(key)
        if hit is not None:
            return hit
        own = self.raw_sets[k]
        raw = (own[0] if kind is None else own[1][kind])[phase]
        shard = self.shard_of(stage)
        cut = split_layer(raw, backward=phase == "bwd")
        ends = ("pre", "post")  # a chain's first and last segments carry its memory actions: never empty
        if cut is None or not all(cut[n] for n in ends):
            parts = [raw]
        elif phase == "fwd":
            parts = [cut[n] for n in FWD_SEGMENTS]
        else:
            dgrad, wgrad = delay_weight_grads(cut["mlp"])
            parts = [cut["post"], cut["combine"], dgrad, wgrad, cut["dispatch"], cut["pre"]]
        if self.detail == "units":
            parts = [collapse_unit(p_, phase, shard, self.profile) for p_ in parts]
        hit = self.tagged[key] = [[replace(c, name=mb_name(c.name, mb)) for c in p_] for p_ in parts]
        return hit

    def _fwd_begin(self, s: int, st: Step) -> "_StepCtx":
        """A forward step's start: its receive, or on virtual stage 0 the embedding (and its gather)."""
        g, costs, sync, p = self.g, self.costs, self.sync, self.p
        r, d = self.ranks[s], self.devices[s].index
        vs = st.chunk * p + s
        ctx = _StepCtx(vs, self.ranges[vs], list(r.tail))
        if vs > 0:
            ctx.deps.append(self.send_f[(st.mb, vs - 1)])
        else:
            if sync.embedding_gather > 0 and st.mb == 0:  # its unit, as a layer's (once an iteration)
                ctx.deps.append(ctx.add(g.add("allgather_embedding", device=d, stream="dp_comm", kind="comm",
                                              phase="weight_gather", layer=None, work=sync.embedding_gather, deps=[],
                                              link=sync.link)))
            ctx.deps = [ctx.add(g.add(mb_name("embedding", st.mb), device=d, stream="compute", kind="compute",
                                      phase="fwd", layer=None, work=costs.embedding_fwd, deps=ctx.deps))]
        return ctx

    def _fwd_layer(self, s: int, st: Step, ctx: "_StepCtx", j: int, segments):
        """Generator: the forward of the step's ``j``-th layer, one segment of ``segments`` per resumption (None:
        the whole chain at once); the layer's gather, kept tensors and offload as `forward_step` lays them."""
        g, sched, costs, sync, n_f = self.g, self.sched, self.costs, self.sync, self.n_f_of[s]
        slot, held, working = self.slot, self.held, self.working
        r, d = self.ranks[s], self.devices[s].index
        layer = ctx.rg[j]
        deps = ctx.deps
        u = r.u
        r.u += 1
        r.unit_of[(st.mb, st.chunk, j)] = u
        if sync.layer_gather > 0 and st.mb == 0:
            deps = deps + [ctx.add(g.add("allgather_weights", device=d, stream="dp_comm", kind="comm",
                                         phase="weight_gather", layer=layer, work=sync.layer_gather,
                                         deps=r.fwd_tail.get(u - 2, []), link=sync.link))]
        start = held(st.mb, layer, self.kept)  # its slot: one of the rank's static blocks
        w = output_write_waits_for(u, n_f) if slot else None
        parts = [self.phase_costs("fwd", st.mb, layer, s)] if segments is None else segments
        done: list[Op] = []
        tail = deps
        for k, part in enumerate(parts):
            if k:
                yield
            last = k == len(parts) - 1
            ops, tail = emit_chain(g, part, device=d, layer=layer, phase="fwd", deps=tail,
                                   layout=self.shard_of(s), profile=self.profile,
                                   mem_start=start + (working(st.mb, layer, "fwd"),) if k == 0 else (),
                                   mem_end=(working(st.mb, layer, "fwd", -1.0),) if last else (),
                                   last_deps=[r.offload[w]] if last and w in r.offload else [])
            done += ops
            ctx.ops += ops
        sched.phases[(s, st.mb, layer, "fwd")] = done
        r.fwd_tail[u] = tail
        if slot and is_offloaded(u, n_f) and costs.offload_bytes > 0:
            op = ctx.add(g.add(mb_name("offload", st.mb), device=d, stream="d2h", kind="copy", phase="offload",
                               layer=layer, work=costs.offload_bytes, nbytes=costs.offload_bytes, direction="d2h",
                               deps=tail, mem_start=(MemAction("host", mb_tensor(st.mb, f"L{layer}.offload"),
                                                               costs.host_block_bytes),)))
            r.offload[u] = op
            sched.copies[(s, st.mb, layer, "offload")] = op
        ctx.deps = tail

    def _fwd_end(self, s: int, st: Step, ctx: "_StepCtx") -> list[Op]:
        """A forward step's end: its send, or on the last virtual stage the head; the rank's new tail."""
        g, sched, costs, sync, p = self.g, self.sched, self.costs, self.sync, self.p
        r, d = self.ranks[s], self.devices[s].index
        vs, rg, tail = ctx.vs, ctx.rg, ctx.deps
        last = rg[-1] if len(rg) else None  # the first chunk may hold the embedding alone
        if vs < self.n_vs - 1:
            ctx.add(self.send("fwd", s, (vs + 1) % p, st.mb, vs, last, tail))
        else:
            head_deps = list(tail)
            if sync.mtp_gather > 0 and st.mb == 0:  # the modules' weights, as a layer's (once an iteration)
                head_deps.append(ctx.add(g.add("allgather_weights", device=d, stream="dp_comm", kind="comm",
                                               phase="weight_gather", layer=None, work=sync.mtp_gather,
                                               deps=r.fwd_tail.get(r.u - 2, []), link=sync.link)))
            if sync.head_gather > 0 and st.mb == 0:  # the head's unit, kept (`memo_sim.cost.grad_sync`)
                head_deps.append(ctx.add(g.add("allgather_head", device=d, stream="dp_comm", kind="comm",
                                               phase="weight_gather", layer=None, work=sync.head_gather,
                                               deps=r.fwd_tail.get(r.u - 2, []), link=sync.link)))
            # the modules' activations stay from the head to the micro-batch's backward step (they run backward
            # first in it), one set per micro-batch in flight on the last chunk (interleaved: several)
            kept = ((MemAction("gpu", mb_tensor(st.mb, "mtp.kept"), costs.mtp_kept_bytes),)
                    if costs.mtp_kept_bytes > 0 else ())
            cls = ctx.add(g.add(mb_name("classifier", st.mb), device=d, stream="compute", kind="compute",
                                phase="classifier", layer=None, work=costs.classifier, deps=head_deps,
                                mem_start=(MemAction("gpu", "classifier.working", costs.classifier_bytes),),
                                mem_end=(MemAction("gpu", "classifier.working", -costs.classifier_bytes),) + kept))
            tail = [cls]
            self.fwd_done[(st.mb, vs)] = tail
            if self.head_bucket_early and st.mb == self.m - 1:  # the head's bucket, complete after its last pass
                r.last_dp = g.add(self.grad_op, device=d, stream="dp_comm", kind="comm", phase="grad_sync",
                                  layer=None, work=sync.head_grad + sync.mtp_grad, deps=tail, link=sync.link)
        if ctx.ops:
            sched.forwards[(s, st.mb, st.chunk)] = ctx.ops[0]
        return tail

    def _bwd_begin(self, s: int, st: Step) -> "_StepCtx":
        """A backward step's start: the gradient it receives, or on the last virtual stage its head's end."""
        vs = st.chunk * self.p + s
        ctx = _StepCtx(vs, self.ranges[vs], list(self.ranks[s].tail))
        ctx.deps += [self.send_b[(st.mb, vs + 1)]] if vs < self.n_vs - 1 else self.fwd_done[(st.mb, vs)]
        ctx.before = list(ctx.deps)
        return ctx

    def _bwd_layer(self, s: int, st: Step, ctx: "_StepCtx", j: int, segments):
        """Generator: the backward of the step's ``j``-th layer, one segment of ``segments`` per resumption (None:
        the whole chain at once; a merged step's fourth segment, the delayed weight gradients, runs beside the
        chain: its dispatch does not wait for it); its prefetch and recompute first, as `backward_step` lays them."""
        g, sched, costs, sync, n_f = self.g, self.sched, self.costs, self.sync, self.n_f_of[s]
        held, working, rec_alloc = self.held, self.working, self.rec_alloc
        rec = self.stage_sets[self.stage_set[s]][0]["recompute"]
        r, d = self.ranks[s], self.devices[s].index
        layer = ctx.rg[j]
        deps = ctx.deps
        u = r.unit_of[(st.mb, st.chunk, j)]
        k = len(r.backward_order)
        r.backward_order.append(u)
        if u in r.offload:
            # the rounding-buffer rule over the rank's backward units in order: the k-th unit's
            # prefetch overwrites the slot the (k-2)-th unit's backward read last; none is
            # issued before the step before its own backward step starts
            after = list(r.prev_launch) + (r.bwd_end[r.backward_order[k - 2]] if k >= 2 else [])
            pf = ctx.add(g.add(mb_name("prefetch", st.mb), device=d, stream="h2d", kind="copy", phase="prefetch",
                               layer=layer, work=costs.offload_bytes, nbytes=costs.offload_bytes, direction="h2d",
                               deps=list(after) + [r.offload[u]],
                               mem_end=(MemAction("host", mb_tensor(st.mb, f"L{layer}.offload"),
                                                  -costs.host_block_bytes),)))
            sched.copies[(s, st.mb, layer, "prefetch")] = pf
            deps = deps + [pf]
        if rec and self.policy.recomputes_layer(u, n_f):
            ops, deps = emit_chain(g, self.phase_costs("recompute", st.mb, layer, s), device=d, layer=layer,
                                   phase="recompute", deps=deps, layout=self.shard_of(s), profile=self.profile,
                                   mem_start=held(st.mb, layer, rec_alloc) + (working(st.mb, layer, "recompute"),),
                                   mem_end=(working(st.mb, layer, "recompute", -1.0),))
            sched.phases[(s, st.mb, layer, "recompute")] = ops
            ctx.ops += ops
        freed = held(st.mb, layer, rec_alloc + self.kept, -1.0)
        parts = [self.phase_costs("bwd", st.mb, layer, s)] if segments is None else segments
        side = 3 if segments is not None and len(parts) == 6 else -1  # the delayed weight gradients (`segments`)
        done: list[Op] = []
        tail, side_tail = deps, []
        for k, part in enumerate(parts):
            if k:
                yield
            last = k == len(parts) - 1
            ops, out = emit_chain(g, part, device=d, layer=layer, phase="bwd",
                                  deps=tail + (side_tail if last else []),
                                  layout=self.shard_of(s), profile=self.profile,
                                  mem_start=(working(st.mb, layer, "bwd"),) if k == 0 else (),
                                  mem_end=(working(st.mb, layer, "bwd", -1.0),) + freed if last else ())
            done += ops
            ctx.ops += ops
            if k == side:
                side_tail = out
            else:
                tail = out
        sched.phases[(s, st.mb, layer, "bwd")] = done
        r.bwd_end[u] = tail
        if st.mb == self.m - 1 and sync.active and sync.overlapped and not self.after_chunk:
            r.last_dp = g.add(self.grad_op, device=d, stream="dp_comm", kind="comm", phase="grad_sync",
                              layer=layer, work=sync.layer_grad, deps=tail, link=sync.link)
        ctx.deps = tail

    def _bwd_end(self, s: int, st: Step, ctx: "_StepCtx") -> list[Op]:
        """A backward step's end: its buckets beside stages under FSDP, its send, or on virtual stage 0 the
        embedding's backward; the rank's new tail."""
        g, costs, sync, p = self.g, self.costs, self.sync, self.p
        r, d = self.ranks[s], self.devices[s].index
        vs, rg, tail = ctx.vs, ctx.rg, ctx.deps
        if st.mb == self.m - 1 and sync.active and sync.overlapped and self.after_chunk:
            # FSDP beside stages (`memo_sim.dp.fsdp`): the chunk's buckets after its last backward, not beside it
            for layer in reversed(rg):
                r.last_dp = g.add(self.grad_op, device=d, stream="dp_comm", kind="comm", phase="grad_sync",
                                  layer=layer, work=sync.layer_grad, deps=tail, link=sync.link)
        if vs > 0:
            self.send("bwd", s, (vs - 1) % p, st.mb, vs, rg[0] if len(rg) else None, tail)
        else:
            tail = [g.add(mb_name("embedding", st.mb), device=d, stream="compute", kind="compute", phase="bwd",
                          layer=None, work=costs.embedding_bwd, deps=tail)]
        if vs == self.n_vs - 1 and costs.mtp_kept_bytes > 0:  # the modules' activations, freed as the step starts
            self.free_mtp_kept(st.mb, ctx.ops, ctx.before)
        return tail

    def free_mtp_kept(self, mb: int, ops: list, deps: list) -> None:
        """Free the modules' kept activations as the micro-batch's backward step starts: at its first compute op,
        or, where the last chunk holds no layers (a layout ending ``|mL``: the head and the modules alone, whose
        backward the classifier op already carries), as its last compute dependency ends, so the block is gone
        before the next step's ops allocate (a send of the step would start beside them at the same instant). A
        classifier right before the step never holds it at all (Megatron-LM runs the modules' backward first in
        the step, megatron/core/pipeline_parallel/schedules.py:539 ``backward_step``)."""
        tensor, size = mb_tensor(mb, "mtp.kept"), self.costs.mtp_kept_bytes
        op = next((o for o in ops if o.stream == "compute"), None)
        if op is not None:
            op.mem_start = (MemAction("gpu", tensor, -size),) + op.mem_start
            return
        last = max((o for o in deps if o.stream == "compute"), key=lambda o: o.uid, default=None)
        if last is None:  # nothing computed before it either: the step's first op, as before
            ops[0].mem_start = (MemAction("gpu", tensor, -size),) + ops[0].mem_start
            return
        alloc = MemAction("gpu", tensor, size)
        if alloc in last.mem_end:  # the step follows its own classifier: the block never outlives it
            last.mem_end = tuple(a for a in last.mem_end if a != alloc)
        else:
            last.mem_end = last.mem_end + (MemAction("gpu", tensor, -size),)


def stage_rows(sched: MicrobatchSchedule, orders: list[list[Step]], end_time: float, failure, peak_gpu: dict,
               busy: dict, p2p_waits: dict, transfer_waits: dict) -> list[dict]:
    """Per stage: its node, chunks, micro-batches in flight, peak, busy and idle time, bubble (idle over busy:
    every wait, as a measurement sees it), and of the idle time the waits on other stages (``stage_wait_s``:
    their work, then the transfer; the rest waits on the stage's own collectives and copies) and of those the
    transfers' own part (``transfer_wait_s``)."""
    it = end_time if failure is None else None
    rows = []
    for s, dev in enumerate(sched.devices):
        b = busy[dev.index]
        rows.append({"stage": s, "node": dev.node, "gpus_on_node": dev.group,
                     "chunks": [[c.start, c.stop - 1] if len(c) else [] for c in
                                (sched.chunk_layers(s, k) for k in range(1 + max(st.chunk for st in orders[s])))],
                     "in_flight": in_flight(orders[s]),
                     "peak_gpu_bytes": peak_gpu[dev.index], "model_states_bytes": sched.costs.model_states[s],
                     "compute_busy_s": b, "idle_s": (it - b) if it else None,
                     "stage_wait_s": p2p_waits.get(dev.index, 0.0),
                     "transfer_wait_s": transfer_waits.get(dev.index, 0.0),
                     "bubble_ratio": ((it - b) / b) if it and b > 0 else None})
    return rows


def _compute_busy(sched: MicrobatchSchedule) -> dict[int, float]:
    # the graph keeps each (device, stream)'s ops in issue order
    return {dev.index: sum(o.end - o.start for o in sched.graph.streams.get((dev.index, "compute"), ())
                           if o.end is not None) for dev in sched.devices}


def host_capacity(sched: MicrobatchSchedule, profile: HardwareProfile) -> float:
    """A node's usable pinned host memory for the pipeline's GPUs on it, every stage's (`HardwareProfile.host_capacity`
    of the fullest node)."""
    return profile.host_capacity(max(gpus_on_nodes(sched.devices).values()))


def run_microbatch_pipeline(sched: MicrobatchSchedule, profile: HardwareProfile, *, contention: bool = True,
                            record: bool = False, keep_memory: bool = True, gpu_capacity: float | None = None,
                            rows: bool = True):
    """Run the graph in the engine; (engine, run, per-stage rows). ``gpu_capacity``: the layout's
    (`memo_sim.layout.alloc_conf.gpu_limit_bytes`; default the profile's usable memory). ``rows`` False: None for
    the rows (a caller that makes its own from the run's waits, as `simulate_microbatch` does: one pass over the
    ops less, 0.5 s of a 15 s whole run of 300,000 ops)."""
    cap = profile.usable_gpu_memory if gpu_capacity is None else gpu_capacity
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=cap,
                    host_capacity=host_capacity(sched, profile), record_links=record, keep_memory=keep_memory)
    run = engine.run()
    check_deadlock(engine, run, "pipeline schedule")
    if not rows:
        return engine, run, None
    return engine, run, stage_rows(sched, sched.orders, run.end_time, run.failure, run.peak_gpu_bytes,
                                   _compute_busy(sched), *exposed_wait_by_device(run.ops, _WAIT_GROUPS[1:],
                                                                                 _WAIT_MOVING[1:]))


@dataclass
class _Outcome:
    """What one engine run (whole, or folded and unfolded) gives `simulate_microbatch`."""

    sched: MicrobatchSchedule
    end_time: float
    failure: Failure | None
    peak_gpu: dict
    peak_host: dict
    start_gpu: dict
    end_gpu: dict
    end_host: dict
    n_ops: int
    busy: dict  # device -> compute-stream seconds
    copy_waits: dict  # device -> its compute path's seconds waiting on host copies (`exposed_wait_by_device`)
    p2p_waits: dict  # device -> the same on the pipeline's transfers (other stages' work, then the transfer)
    transfer_waits: dict  # device -> of those, the transfers' own part (`exposed_wait_parts_of`'s ``moving``)
    layer_timings: dict
    events: list
    memory: list
    link_capacity: dict
    link_carried: dict
    link_log: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    folded: int = 0  # micro-batches unfolded from a periodic short run


# the waits `_Outcome` keeps: on host copies, on the pipeline's transfers (the other stage's work before each
# included: a stage's wait), and on the transfers alone (their own part: the exposed P2P)
_WAIT_GROUPS = (COPY_STREAMS, (P2P_STREAM,), (P2P_STREAM,))
_WAIT_MOVING = (False, False, True)


def _run_whole(costs, layout, profile, policy, n_layers, m, order, *, detail, contention, keep_timeline,
               record) -> _Outcome:
    sched = build_microbatch_pipeline(costs, layout, profile, policy, n_layers, m, order, detail=detail)
    engine, run, _rows = run_microbatch_pipeline(sched, profile, contention=contention, record=record,
                                                 keep_memory=keep_timeline, rows=False,
                                                 gpu_capacity=gpu_limit_bytes(profile, layout.alloc_conf))
    return _Outcome(sched, run.end_time, run.failure, run.peak_gpu_bytes, run.peak_host_bytes, run.start_gpu_bytes,
                    run.end_gpu_bytes, run.end_host_bytes, len(run.ops), _compute_busy(sched),
                    *exposed_wait_by_device(run.ops, _WAIT_GROUPS, _WAIT_MOVING), _layer_timings(sched),
                    timeline_events(run) if keep_timeline else [], list(run.memory), run.link_capacity,
                    run.link_carried, run.link_log, run.ops if record else [])


def _run_folded(costs, layout, profile, policy, n_layers, m, order, *, detail, contention,
                keep_timeline) -> _Outcome | None:
    """The steady state simulated a few windows long and unfolded
    (`memo_sim.engine.schedules.microbatch_fold`); None where there is no fold to make, the short
    run is not periodic, or it failed and a timeline is wanted (the whole run then gives it)."""
    p, v = layout.pp, layout.vpp
    if n_layers % (p * v) or layout.uneven:  # uneven stages: simulated whole
        return None
    lc = n_layers // (p * v)
    plan = plan_window_fold(order, p, m, v, lc, policy, bool(unit_slot_bytes(policy, costs.skeletal)))
    if plan is None:
        return None
    detail = resolve_detail(detail, costs, p, m, v, lc)  # the whole iteration's
    sched = build_microbatch_pipeline(costs, layout, profile, policy, n_layers, plan.short, order, detail=detail)
    inf = float("inf")
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=inf, host_capacity=inf, log=True)
    run = engine.run()
    check_deadlock(engine, run, "pipeline schedule")
    anchors = [sched.forwards.get((0, w * plan.step, 0)) for w in plan.anchor_windows()]
    if any(a is None for a in anchors):
        return None
    u = unfold_window(run, anchors, plan.copies, plan.step, MICRO_BATCHES,
                      gpu_capacity=gpu_limit_bytes(profile, layout.alloc_conf),
                      host_capacity=host_capacity(sched, profile), devices=sched.graph.devices,
                      routes=engine.routes if contention else None)
    if u is None or (u.failure is not None and (keep_timeline or u.tie)):
        return None
    copy_parts, p2p_parts, transfer_parts = ({uid: x for _s, uid, x in part}
                                             for part in exposed_wait_parts_of(run.ops, _WAIT_GROUPS, _WAIT_MOVING))
    stage, layer = timed_layer(sched)
    dev0 = sched.devices[stage].index
    spans = u.phase_spans(0, tuple(ph for _k, ph in _PHASES), _COPIES,
                          keep=lambda op: op.device == dev0 and op.layer == layer)
    timings = {k: spans[ph] for k, ph in _PHASES}
    timings.update({c: spans[c] for c in _COPIES})
    failure = u.failure
    return _Outcome(
        # a static allocation that does not fit stops the engine before the iteration starts
        sched, u.end_time, failure, u.peak_gpu, u.peak_host,
        u.end_gpu if failure is not None and failure.op is None else run.start_gpu_bytes, u.end_gpu, u.end_host,
        u.n_ops, _unfolded_busy(u, sched), _waits_by_device(u, run.ops, copy_parts),
        _waits_by_device(u, run.ops, p2p_parts), _waits_by_device(u, run.ops, transfer_parts),
        timings, u.timeline_events() if keep_timeline else [], list(u.samples()) if keep_timeline else [],
        run.link_capacity, u.link_carried, folded=plan.copies * plan.step)


def _waits_by_device(u, ops: list, parts: dict[int, float]) -> dict[int, float]:
    """Per GPU, the whole run's exposed waits (``parts``: the short run's, op uid -> seconds;
    `memo_sim.engine.result.exposed_wait_by_device`)."""
    device = {op.uid: op.device for op in ops}
    mine: dict[int, dict[int, float]] = {}
    for uid, x in parts.items():
        mine.setdefault(device[uid], {})[uid] = x
    return {d: u.exposed_wait_seconds(p) for d, p in mine.items()}


def _unfolded_busy(u, sched: MicrobatchSchedule) -> dict[int, float]:
    """Per device, the compute-stream seconds of the whole run's ops that ended."""
    if u.failure is None:
        return {dev.index: u.exposed_wait_seconds({o.uid: o.end - o.start
                                                   for o in sched.graph.streams.get((dev.index, "compute"), ())})
                for dev in sched.devices}
    busy = {dev.index: 0.0 for dev in sched.devices}
    for op, _dt, _dl, ended in u.op_instances():
        if ended and op.stream == "compute":
            busy[op.device] += op.end - op.start
    return busy


def simulate_microbatch(name: str, order: Order, model: ModelConfig, layout: Layout, batch: int, seq: int,
                        policy: Policy, profile: HardwareProfile, *, micro_batch: int, contention: bool = True,
                        keep_timeline: bool = True, record: bool = False, detail: str = "auto", fold: bool = True,
                        **_single_stage_options) -> SimResult:
    """A micro-batch pipeline schedule's runner (``name``, its ``order``): one iteration of
    ``batch`` sequences per replica in ``batch / micro_batch`` micro-batches. ``peak_gpu_bytes``
    is the fullest stage's, the host peak the fullest node's; ``pipeline`` holds the per-stage
    rows (peak, micro-batches in flight, busy and idle time, bubble) and the bubble share.
    ``fold`` (default; not with ``record``): the steady state is simulated a few windows long
    where it repeats (`memo_sim.engine.schedules.microbatch_fold`; ``folded`` says how many
    micro-batches the short run stood for), else the whole schedule runs."""
    t0 = time.perf_counter()
    m = batch // micro_batch
    if layout.ep_overlap:  # one more warm-up forward (`memo_sim.engine.schedules.ep_overlap`)
        order = overlapped_order(order)
    costs = pipeline_costs(model, layout, micro_batch, seq, policy, profile)
    args = (costs, layout, profile, policy, model.layers, m, order)
    out = None
    if fold and not record:
        out = _run_folded(*args, detail=detail, contention=contention, keep_timeline=keep_timeline)
    if out is None:
        out = _run_whole(*args, detail=detail, contention=contention, keep_timeline=keep_timeline, record=record)
    sched = out.sched
    orders = [order(layout.pp, m, layout.vpp, s) for s in range(layout.pp)]
    rows = stage_rows(sched, orders, out.end_time, out.failure, out.peak_gpu, out.busy, out.p2p_waits,
                      out.transfer_waits)
    failure = out.failure
    status = failure.status if failure else "OK"
    it, mfu, tgs = rates(out.end_time, failure, model, layout, batch, seq, profile)
    worst = max(sched.devices, key=lambda dv: out.peak_gpu[dv.index])
    busy = sum(r["compute_busy_s"] for r in rows)
    pipe = {"schedule": name, "pp": layout.pp, "vpp": layout.vpp, "micro_batches": m, "micro_batch": micro_batch,
            "detail": sched.detail, "stages": rows, "worst_stage": worst.index,
            # the transfers' own exposed time on the stage that waits longest on them; its wait on other stages'
            # work (fill, drain, unequal stages) before them is each stage's stage_wait_s
            "exposed_p2p_s": max(out.transfer_waits.values(), default=0.0),
            "bubble_fraction": (1 - busy / (len(rows) * it)) if it else None,
            # the equal-stage bubble two ways: over the work ((p - 1)/(v m), the analytic tier's ratio,
            # `memo_sim.search.estimate.pipeline_bubble`) and as the iteration's share, beside bubble_fraction
            "ideal_bubble_ratio": (layout.pp - 1) / (layout.vpp * m),
            "ideal_bubble_fraction": ideal_bubble_fraction(layout.pp, layout.vpp, m)}
    meta = {
        "source": "simulated", "model": model.name, "layers": model.layers, "layout": layout.label(),
        "policy": policy.label(), "profile": profile.name, "seq_tokens": seq, "batch": batch, "gpus": layout.gpus,
        "schedule": name, "micro_batch": micro_batch,
        "status": status, "iteration_s": it, "mfu": mfu, "contention": contention,
        "gpu_capacity_bytes": gpu_limit_bytes(profile, layout.alloc_conf),
        "host_capacity_bytes": host_capacity(sched, profile),
        "representative": {"device": worst.index, "gpus_on_node": worst.group, "gpus_on_pcie_switch": worst.switch_group},
        "middle_layer": timed_layer(sched)[1],
        "failure": failure.to_dict() if failure else None,
        "allocator": {"static_memory_plan": uses_memory_plan(policy, layout), "reorganizations": 0, "stall_s": 0.0,
                      "replayed": False},
        "pipeline": {"schedule": name, "pp": layout.pp, "vpp": layout.vpp, "micro_batches": m,
                     "stages": [{"stage": r["stage"], "device": sched.devices[r["stage"]].index,
                                 "node": r["node"], "gpus_on_node": r["gpus_on_node"], "chunks": r["chunks"],
                                 **({"layers": r["chunks"][0]} if len(r["chunks"]) == 1 else {})}
                                for r in rows]},
    }
    tl = Timeline(out.events, out.memory, meta) if keep_timeline else None
    node = worst.node
    return SimResult(
        model=model, layout=layout, batch=batch, seq=seq, policy=policy, profile=profile.name, status=status,
        iteration_s=it, mfu=mfu, tgs=tgs, peak_gpu_bytes=max(out.peak_gpu.values()),
        peak_host_bytes_per_node=max(out.peak_host.values()),
        gpu_capacity_bytes=gpu_limit_bytes(profile, layout.alloc_conf), host_capacity_bytes=host_capacity(sched, profile),
        exposed_copy_s=max(out.copy_waits.values(), default=0.0), layer_timings=out.layer_timings,
        timeline=tl, failure=failure, contention=contention, sim_wall_s=time.perf_counter() - t0,
        n_ops=out.n_ops, start_gpu_bytes=out.start_gpu.get(worst.index, 0.0),
        end_gpu_bytes=out.end_gpu[worst.index], end_host_bytes=out.end_host[node],
        link_log=out.link_log, link_capacity=out.link_capacity, link_carried=out.link_carried,
        ops=out.ops, static_memory=[(d, a.tensor, a.nbytes) for d, a in sched.graph.static if a.space == "gpu"]
        if record else [], allocator=dict(meta["allocator"]), pipeline=pipe, schedule=name,
        micro_batch=micro_batch, folded=out.folded)


def timed_layer(sched: MicrobatchSchedule) -> tuple[int, int]:
    """(stage, layer) whose phases the plan's layer timings report: the middle layer of stage 0's first
    model chunk, or of the first chunk that holds a layer where the embedding takes a chunk of its own
    (Megatron-LM's one-slot chunks with --account-for-embedding-in-pipeline-split)."""
    p = len(sched.devices)
    for vs in range(len(sched.ranges) or p):
        rg = sched.chunk_layers(vs % p, vs // p)
        if len(rg):
            return vs % p, rg[len(rg) // 2]
    raise ValueError("no model chunk holds a layer")


_PHASES = (("forward", "fwd"), ("backward", "bwd"), ("recompute", "recompute"))  # layer_timings key, phase
_COPIES = ("offload", "prefetch")


def _layer_timings(sched: MicrobatchSchedule) -> dict[str, float]:
    """Simulated seconds of the middle layer of stage 0's first chunk, first micro-batch."""
    stage, layer = timed_layer(sched)

    out = {k: _span(sched.phases.get((stage, 0, layer, ph))) for k, ph in _PHASES}
    for kind in _COPIES:
        op = sched.copies.get((stage, 0, layer, kind))
        out[kind] = (op.end - op.start) if op is not None and op.end is not None else 0.0
    return out
