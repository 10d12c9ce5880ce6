"""Op graphs of one training iteration on one representative GPU, per activation policy.

Order on the representative (every layer's ops come from `memo_sim.cost.layer_time`, each phase
a chain in which every op waits for the one before it; a side op (a ring-CP K/V exchange on
``cp_comm``, a METP ring step on ``tp_p2p`` or a METP weight broadcast / reduce on ``tp_bcast``)
runs beside the ops it overlaps and the op after them waits for it too, as
`memo_sim.cost.opcost.chain_dependencies` says)::

    embedding fwd -> layer 0..n-1 fwd -> classifier (chunked fwd + bwd)
    -> layer n-1..0: [prefetch] [recompute] bwd, gradient bucket on dp_comm
    -> embedding bwd -> (wait for every gradient bucket) optimizer step

Policies (`memo_sim.policy`; the schedule asks the policy object what it keeps, allocates,
offloads and recomputes, and never branches on its name):

- ``store_all``: each layer allocates its skeletal bytes at its forward and frees them after
  its backward.
- ``full_recompute``: only the layer input stays; before each backward the whole layer forward
  (`full_recompute_costs`) re-runs and re-allocates the other skeletal tensors.
- ``full_offload`` and ``memo``: two rounding buffers (static, from `memory_breakdown`), even
  layers in buffer 0, odd in buffer 1, with the copies' dependencies of
  `memo_sim.policy.rounding_buffers` (shared with the executor). After layer i's forward its
  host bytes go out on the ``d2h`` stream (offload) while layer i+1 computes; the last op of
  layer i+1's forward, which writes layer i+2's input into buffer i%2, waits on that copy (the
  CUDA event of the paper). In backward the prefetch of layer i on the
  ``h2d`` stream starts after layer i+2's backward (buffer i%2 is free) and runs while layer
  i+1's backward computes; memo then recomputes the dropped (1 - alpha) tokens
  (`recompute_costs`) before layer i's backward. The last two layers are neither offloaded nor recomputed: their
  activations stay in the buffers. memo offloads the layer input and attention output whole
  and alpha of the other skeletal bytes; full_offload all of them.

Memory: model states (and rounding buffers) are static from `memory_breakdown`. Each layer's
forward, recompute and backward holds one working block of its phase's transients
(`MemoryBreakdown.phase_working_bytes`: under a static plan the arena and the phase's own tensors beside it, the
recompute the backward's) plus the activation handed between layers (the layer input size), as MEMO's level-2
plan treats a layer phase as one pseudo block of its level-1 peak; the classifier holds ``classifier_peak_bytes``; lse
(the attention log-sum-exp) stays on the GPU from a layer's forward to its backward under every
policy. Pinned host bytes per offloaded layer (as `memo_sim.policy.host_layout` allocates them)
are held from the offload's start to the prefetch's end.

Collectives: TP / Ulysses collectives are on ``comm`` (in the OpCost lists, on the critical
path as in Megatron); ring-CP on ``cp_comm``; METP's ring on ``tp_p2p`` (one send/recv op per
ring step beside the step's compute block, on the representative's NVLink port) and its
attention's weight broadcasts / reduces on ``tp_bcast``; where a transfer outlasts the compute it
overlaps, the next step waits (exposed P2P time, `memo_sim.engine.simulate.exposed_wait_seconds`); DP gradient buckets (one per layer, all-reduce, or
reduce-scatter from ZeRO-1 on, over the DP x CP x Ulysses group) on ``dp_comm``, each issued
after its layer's backward and overlapping the next layer's backward. From ZeRO-1 on each
layer's weights are all-gathered on ``dp_comm`` two layers ahead of its forward (ZeRO-1/2: the
previous step's updated weights, Megatron's overlapped parameter gather); ZeRO-3 gathers them
again ahead of its backward (phase ``weight_gather_bwd``).

Embedding, classifier and optimizer times come from `memo_sim.cost.boundary`, gradient and
weight collectives from `memo_sim.cost.grad_sync`, both shared with the analytic estimate.

Pipelines (SPPO) use the same graph, one representative `Device` per stage: `memo_sim.engine.schedules.sppo`
builds them (each (stage, subsequence piece, layer) phase with `emit_chain` on its stage's device,
stages connected by ``p2p`` send ops on the sender's NVLink or InfiniBand port, offload and
prefetch per unit with the rounding-buffer rule of `memo_sim.policy.rounding_buffers`); no change
to `Engine`, `OpGraph` or the link model was needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial

from memo_sim.units import fmt_bytes
from memo_sim.cost import collectives as coll
from memo_sim.cost.optimizer_offload import host_state_bytes
from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.boundary import BoundaryTimes, boundary_times
from memo_sim.cost.comm_sms import collective_sms
from memo_sim.cost.grad_sync import GradSync, grad_sync
from memo_sim.cost.layer_time import OpCost, backward_costs, chain_dependencies, chain_tail, forward_costs
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.cost.moe import moe_group_link
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.engine.core import Engine, Failure
from memo_sim.engine.graph import Device, MemAction, Op, OpGraph
from memo_sim.engine.periodic import Fold, plan_fold, unfold
from memo_sim.engine.result import (
    SimResult, _span, allocator_summary, check_deadlock, exposed_wait_parts_of, exposed_wait_totals, rates,
    timeline_events,
)
from memo_sim.engine.schedules.registry import register_schedule
from memo_sim.memplan.iteration_replay import engine_replay, fragmentation_words
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import MemoryBreakdown, memory_breakdown
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_kinds import distinct_kinds, ffn_kinds, kind_model
from memo_sim.policy.base import Policy
from memo_sim.policy.rounding_buffers import KEPT_LAYERS, output_write_waits_for, prefetch_after_backward_of
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import COPY_STREAMS, STREAMS, TP_RING_STREAMS, Timeline, TimelineEvent  # noqa: F401



def representative_device(layout: Layout, profile: HardwareProfile, index: int = 0) -> Device:
    """The one GPU simulated for a layout whose GPUs all run the same schedule.

    It stands for the min(gpus, gpus_per_node) GPUs of its node, packed onto PCIe switches in
    order, so min(that, gpus_per_pcie_switch) of them share its switch.
    """
    group = min(layout.gpus, profile.node_gpus)
    per_switch = int(profile.host_link.gpus_per_pcie_switch.value)
    return Device(index=index, node=0, switch=0, group=group, switch_group=min(group, per_switch),
                  label=f"GPU {index} (x{group} on node)")


def collective_link(cost: OpCost, layout: Layout, profile: HardwareProfile) -> str:
    """Which link an OpCost collective rides, from the group it runs over (see layer_time): ring CP
    over the CP group, Ulysses all-to-alls over theirs, TP collectives and METP's ring (``tp_p2p``,
    ``tp_bcast``: the representative's NVLink port, or the inter-node link for a METP group that
    spans nodes) over the TP group."""
    if cost.stream in TP_RING_STREAMS:
        return coll.link_kind(profile, coll.layout_group_link(profile, layout, layout.tp, 1))
    if cost.name.startswith("moe_"):  # a MoE dispatcher's collective over its expert group
        return coll.link_kind(profile, moe_group_link(cost.name, layout, profile))
    if cost.stream == "cp_comm" or cost.name.startswith("cp_"):
        return coll.link_kind(profile, coll.layout_group_link(profile, layout, layout.cp, layout.tp * layout.ulysses))
    if cost.name.startswith("alltoall"):
        return coll.link_kind(profile, coll.layout_group_link(profile, layout, layout.ulysses, layout.tp))
    return coll.link_kind(profile, coll.layout_group_link(profile, layout, layout.tp, 1))


_SHAPES: dict[tuple[int, int, int], tuple] = {}  # (id(costs), id(layout), id(profile)) -> (costs, layout, profile, (rows, tail, shape))
_SHAPES_BY_CONTENT: dict[tuple, tuple] = {}  # ((name, stream, overlaps) per op, id(layout), id(profile)) -> (layout, profile, shape)


def _chain_rows(costs: list[OpCost], layout: Layout, profile: HardwareProfile) -> tuple:
    """(rows, tail, shape) of a phase list. ``shape``: per op (its dependencies within the phase,
    its kind, its link), and the tail; ``rows``: per op (within, name, stream, kind, work, nbytes,
    flops, link), what `emit_chain` builds each op from. Every layer emits the same
    phase lists, so this is worked out once per list (the cache keeps the list, layout and
    profile alive, so their ids stay theirs)."""
    key = (id(costs), id(layout), id(profile))
    hit = _SHAPES.get(key)
    if hit is not None:
        return hit[3]
    # a list built afresh (SPPO's pieces) with the ops of one seen before has its shape: the
    # shape reads only each op's name, stream and overlaps (and the layout and profile)
    ckey = (tuple((c.name, c.stream, c.overlaps) for c in costs), id(layout), id(profile))
    hit = _SHAPES_BY_CONTENT.get(ckey)
    if hit is not None:
        shape = hit[2]
    else:
        ops = []
        for c, within in zip(costs, chain_dependencies(costs)):
            kind = "compute" if c.stream == "compute" else "comm"
            ops.append((within, kind, None if kind == "compute" else collective_link(c, layout, profile)))
        shape = (ops, chain_tail(costs))
        if len(_SHAPES_BY_CONTENT) > 256:
            _SHAPES_BY_CONTENT.clear()
        _SHAPES_BY_CONTENT[ckey] = (layout, profile, shape)
    rows = [(within, c.name, c.stream, kind, float(c.seconds) if c.seconds > 0.0 else 0.0, c.nbytes, c.flops, link,
             None if kind == "compute" else collective_sms(c.name, layout))
            for c, (within, kind, link) in zip(costs, shape[0])]
    out = (rows, shape[1], shape)
    if len(_SHAPES) > 256:
        _SHAPES.clear()
    _SHAPES[key] = (costs, layout, profile, out)
    return out


def emit_chain(g: OpGraph, costs: list[OpCost], *, device: int, layer: int | None, phase: str,
               deps: list[Op], layout: Layout, profile: HardwareProfile,
               mem_start: tuple[MemAction, ...] = (), mem_end: tuple[MemAction, ...] = (),
               last_deps: list[Op] = (),
               ) -> tuple[list[Op], list[Op]]:
    """Add one phase's OpCost list with the dependencies of `chain_dependencies`, the phase's
    last op also waiting for ``last_deps``; return (its ops, what the next op waits on)."""
    ops: list[Op] = []
    last = len(costs) - 1
    rows, tail_idx, _shape = _chain_rows(costs, layout, profile)
    if device not in g.devices:
        raise ValueError(f"phase {phase!r} on unknown device {device}")
    deps = [d for d in deps if d is not None]
    last_deps = [d for d in last_deps if d is not None]
    mem_start, mem_end = tuple(mem_start), tuple(mem_end)
    # `OpGraph.add` without its checks (the kind and device come from a validated phase shape,
    # ``deps`` holds no None, the mem actions are tuples) and without a call per op (hundreds of
    # ops per schedule): the same Op, appended to the graph and its stream the same way
    graph_ops, streams = g.ops, g.streams
    uid = len(graph_ops)
    stream_ops: dict[str, list[Op]] = {}
    for k, (within, name, stream, kind, work, nbytes, flops, link, sms) in enumerate(rows):
        op_deps = [ops[j] for j in within] if within else list(deps)
        if k == last:
            op_deps += last_deps
        op = Op(uid + k, name, device, stream, kind, phase, layer, work, nbytes, flops, None, link, op_deps,
                mem_start if k == 0 else (), mem_end if k == last else (), sms)
        ops.append(op)
        graph_ops.append(op)
        on = stream_ops.get(stream)
        if on is None:
            on = stream_ops[stream] = streams.setdefault((device, stream), [])
        on.append(op)
    tail = [ops[j] for j in tail_idx] if ops else list(deps)
    return ops, tail


@dataclass(frozen=True)
class LayerPlan:
    """Everything about one layer that the schedule and the analytic path share."""

    forward: list[OpCost]
    backward: list[OpCost]
    recompute: list[OpCost]  # for the layers that recompute (all for full_recompute, offloaded ones for memo)
    offload_bytes: float  # per GPU, per offloaded layer
    offloaded_layers: int  # layers 0 .. offloaded_layers-1 go to host
    skeletal: dict[str, float]
    working_bytes: float  # transient pseudo block + the activation handed between layers
    host_block_bytes: float  # pinned bytes per offloaded layer and GPU
    # layers of other kinds (`memo_sim.model.layer_kinds.ffn_kinds`: a mixture of experts' dense layers): each laid-out
    # layer's kind, and each kind's (forward, backward, recompute); () and {}: every layer runs the lists above
    kinds: tuple = ()
    kind_lists: dict = field(default_factory=dict)

    def phases_of(self, layer: int) -> tuple[list[OpCost], list[OpCost], list[OpCost]]:
        """(forward, backward, recompute) of laid-out layer ``layer``: its kind's, or the repeated layer's."""
        return self.kind_lists[self.kinds[layer]] if self.kinds else (self.forward, self.backward, self.recompute)


def layer_plan(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
               profile: HardwareProfile, mem: MemoryBreakdown, n_layers: int | None = None) -> LayerPlan:
    """``n_layers``: how many layers the schedule lays out (default the model's; fewer when
    `memo_sim.engine.periodic` folds identical layers)."""
    sk = skeletal_bytes(model, layout, batch, seq)
    return LayerPlan(forward_costs(model, layout, batch, seq, profile),
                     backward_costs(model, layout, batch, seq, profile),
                     policy.recompute_costs(model, layout, batch, seq, profile),
                     policy.offload_bytes(model, layout, batch, seq),
                     policy.offloaded_layers(model.layers if n_layers is None else n_layers), sk,
                     mem.transient_peak_bytes + sk["input"],
                     policy.host_bytes_per_layer(model, layout, batch, seq, profile))


def kind_phases(model: ModelConfig, shard: Layout, micro_batch: int, seq: int, policy: Policy,
                profile: HardwareProfile, mem: MemoryBreakdown, kinds=None) -> dict:
    """Each layer kind's (forward, backward, recompute) on a shard (`memo_sim.model.layer_kinds`; ``kinds`` those
    to price, default the model's `distinct_kinds`: {} where every layer is priced alike), over the repeated
    layer's memory terms (a layer's kept and transient bytes are the repeated layer's): the single stage's and the
    micro-batch pipelines' lists of layers that differ."""
    out = {}
    for kind in (distinct_kinds(model) if kinds is None else kinds):
        lp = layer_plan(kind_model(model, kind), shard, micro_batch, seq, policy, profile, mem)
        out[kind] = (lp.forward, lp.backward, lp.recompute)
    return out


@dataclass
class Schedule:
    graph: OpGraph
    device: Device
    memory: MemoryBreakdown
    plan: LayerPlan
    boundary: BoundaryTimes
    sync: GradSync
    middle_layer: int
    phases: dict[tuple[int, str], list[Op]] = field(default_factory=dict)  # (layer, fwd|bwd|recompute) -> ops
    copies: dict[tuple[int, str], Op] = field(default_factory=dict)  # (layer, offload|prefetch) -> op


def middle_layer(n_layers: int) -> int:
    """A representative layer: in the middle, and offloaded when any layer is."""
    return max(0, min(n_layers // 2, n_layers - KEPT_LAYERS - 1))


def layer_signature(policy: Policy, layer: int, n_layers: int) -> tuple:
    """Everything `build_iteration` does differently from one layer to the next, relative to the
    layer's index: whether it is offloaded and recomputed, which offload its output write waits
    for, whether its weight gathers hang on the layer two before, whether it is one of the last
    two (their ZeRO-3 gathers are issued when the backward starts). Layers with equal signatures
    get the same ops and dependencies (`memo_sim.engine.periodic` folds runs of them)."""
    w = output_write_waits_for(layer, n_layers)
    return (layer < policy.offloaded_layers(n_layers), policy.recomputes_layer(layer, n_layers),
            None if w is None else layer - w, layer >= 2, layer >= n_layers - 2)


def build_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                    profile: HardwareProfile, *, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                    device: Device | None = None, allocator_stall: dict[str, float] | None = None,
                    layers: int | None = None, micro_batches: int = 1, kinds: tuple | None = None) -> Schedule:
    """The op graph of one full training iteration on the representative GPU.

    ``allocator_stall``: seconds the caching allocator's reorganisations stall the compute stream,
    by phase (``L<i>.fwd``, ``L<i>.bwd``, ``classifier``, ``embedding``, ``embedding.bwd``; from
    `memo_sim.memplan.iteration_replay.IterationReplay.stall_by_phase`): each becomes an
    ``allocator_reorganization`` op on the compute stream at the start of its phase.

    ``layers``: lay out this many layers instead of the model's (the memory, boundary and
    gradient-sync terms stay the whole model's): the shortened schedule that
    `memo_sim.engine.periodic` simulates when it folds identical layers; ``kinds``: the kind of each laid-out layer
    where the model's layers differ (None: the model's own, `memo_sim.model.layer_kinds.ffn_kinds`; a short schedule
    gives those of the model layers it stands for).

    ``micro_batches``: gradient accumulation over that many micro-batches of ``batch`` sequences
    each, one after the other (`_micro_batch`); the optimizer steps once after the last."""
    dev = device or representative_device(layout, profile)
    mem = memory_breakdown(model, layout, batch, seq, policy, profile, classifier_chunk_tokens,
                           active_gpus_per_node=dev.group)
    n = model.layers if layers is None else layers
    lp = layer_plan(model, layout, batch, seq, policy, profile, mem, n)
    if kinds is None:
        kinds = ffn_kinds(model)
        if kinds and n != model.layers:
            raise ValueError("a short schedule of a model whose layers differ needs each laid-out layer's kind")
    if kinds:  # each kind's op lists over the repeated layer's memory terms (`memo_sim.model.layer_kinds`)
        lp = replace(lp, kinds=tuple(kinds),
                     kind_lists=kind_phases(model, layout, batch, seq, policy, profile, mem, dict.fromkeys(kinds)))
    bt = boundary_times(model, layout, batch, seq, profile, recompute_mtp=policy.recomputes_mtp)
    sync = grad_sync(model, layout, profile)
    d = dev.index
    g = OpGraph([dev])
    sched = Schedule(g, dev, mem, lp, bt, sync, middle_layer(n))
    sk = lp.skeletal

    def gpu(layer: int, held: list[tuple[str, float]], sign: float = 1.0) -> tuple[MemAction, ...]:
        return tuple(MemAction("gpu", f"L{layer}.{name}", sign * nbytes) for name, nbytes in held)

    g.add_static(d, MemAction("gpu", "model_states", mem.model_states_bytes))
    if layout.optimizer_offload:  # the optimizer's states on the host (`memo_sim.cost.optimizer_offload`)
        g.add_static(d, MemAction("host", "optimizer_states", host_state_bytes(model, layout, model_gpu_params(model, layout))))
    for name, nbytes in policy.static_gpu(sk):
        g.add_static(d, MemAction("gpu", name, nbytes))

    stall = dict(allocator_stall or {})

    def reorganize(key: str, layer, deps: list[Op]) -> list[Op]:
        """The allocator's stall at the start of a phase, if the replay put one there."""
        seconds = stall.pop(key, 0.0)
        if seconds <= 0:
            return deps
        return [g.add("allocator_reorganization", device=d, stream="compute", kind="compute", phase="allocator",
                      layer=layer, work=seconds, deps=deps)]

    def chain(costs, layer, phase, deps, kept: tuple[MemAction, ...] = (), freed: tuple[MemAction, ...] = (),
              last_deps: list[Op] = ()):
        if phase in ("fwd", "recompute") or (phase == "bwd" and (layer, "recompute") not in sched.phases):
            deps = reorganize(f"L{layer}.{'fwd' if phase == 'fwd' else 'bwd'}", layer, deps)
        # the phase's own working block: a static plan's arena with the phase's tensors beside it (the backward's
        # gradients are not the forward's, `MemoryBreakdown.phase_working_bytes`; the caching allocator's: one figure)
        work = MemAction("gpu", f"L{layer}.{phase}.working", mem.phase_working_bytes(phase))
        ops, tail = emit_chain(g, costs, device=d, layer=layer, phase=phase, deps=deps, layout=layout,
                               profile=profile, mem_start=kept + (work,),
                               mem_end=(MemAction("gpu", work.tensor, -work.nbytes),) + freed, last_deps=last_deps)
        if ops:
            sched.phases.setdefault((layer, phase), ops)  # the first micro-batch's
        return tail

    def dp_op(name, layer, work, deps, phase="grad_sync"):
        return g.add(name, device=d, stream="dp_comm", kind="comm", phase=phase, layer=layer, work=work,
                     deps=deps, link=sync.link)

    # one micro-batch after the other (gradient accumulation); ``batch`` is the micro-batch here
    tail: list[Op] = []
    last_dp: Op | None = None
    for mb in range(micro_batches):
        tail, last_dp = _micro_batch(g, sched, d, n, mb, micro_batches, tail, last_dp, layout=layout, policy=policy,
                                     lp=lp, bt=bt, sync=sync, mem=mem, sk=sk, chain=chain, dp_op=dp_op,
                                     reorganize=reorganize, gpu=gpu)
    opt = g.add("optimizer", device=d, stream="compute", kind="compute", phase="optimizer", layer=None,
                work=bt.optimizer, deps=tail + ([last_dp] if last_dp else []))
    if sync.step_gather > 0:  # ZeRO-1/2 gathering every updated weight at the end of the step (`cost.grad_sync`)
        dp_op("allgather_params", None, sync.step_gather, [opt], "weight_gather")
    if stall:  # a phase name this schedule does not have: charge it before the optimizer step
        g.add("allocator_reorganization", device=d, stream="compute", kind="compute", phase="allocator",
              layer=None, work=sum(stall.values()), deps=[])
    return sched


def _micro_batch(g: OpGraph, sched: Schedule, d: int, n: int, mb: int, micro_batches: int, tail: list[Op],
                 last_dp: Op | None, *, layout: Layout, policy: Policy, lp: LayerPlan, bt: BoundaryTimes,
                 sync: GradSync, mem: MemoryBreakdown, sk: dict, chain, dp_op, reorganize, gpu
                 ) -> tuple[list[Op], Op | None]:
    """One micro-batch's forward and backward (``mb`` of ``micro_batches``). ZeRO-1/2 gather each
    layer's updated weights once per iteration (in the first micro-batch's forward), ZeRO-3 before
    every forward and, resharding after the forward, every backward (FSDP without resharding keeps a
    layer's weights from its forward to its backward only: FSDP2 frees them after the backward, so each
    micro-batch's forward gathers them again); the gradient buckets go out once per iteration, overlapping the
    last micro-batch's backward (ZeRO-2/3 reduce-scatter every micro-batch's gradients, since a
    rank keeps only its shard of them)."""
    gather_fwd = sync.layer_gather > 0 and (mb == 0 or layout.zero >= 3)
    reduce_now = sync.active and (mb == micro_batches - 1 or layout.zero >= 2)
    # ---- forward --------------------------------------------------------------------------
    # the embedding's and the head's units are gathered as a layer's (`memo_sim.cost.grad_sync`)
    emb_deps = ([dp_op("allgather_embedding", None, sync.embedding_gather, [], "weight_gather")]
                if gather_fwd and sync.embedding_gather > 0 else [])
    emb = g.add("embedding", device=d, stream="compute", kind="compute", phase="fwd", layer=None,
                work=bt.embedding_fwd, deps=reorganize("embedding", None, emb_deps))
    tail = [emb]
    fwd_tail: dict[int, list[Op]] = {}
    offload: dict[int, Op] = {}
    gather_f: dict[int, Op] = {}

    def copy_op(name, layer, phase, seconds, deps):
        """FSDP2's copy out of the all-gather's buffer or into the reduce-scatter's, on the compute stream
        (`memo_sim.cost.grad_sync.GradSync.layer_copy_out`): the op after it waits for it."""
        if seconds <= 0:
            return deps
        return [g.add(name, device=d, stream="compute", kind="compute", phase=phase, layer=layer, work=seconds,
                      deps=deps)]

    for i in range(n):
        deps = list(tail)
        if gather_fwd:
            gather_f[i] = dp_op("allgather_weights", i, sync.layer_gather, fwd_tail.get(i - 2, []), "weight_gather")
            deps = copy_op("fsdp_copy_out", i, "fwd", sync.layer_copy_out, deps + [gather_f[i]])
        # the op writing layer i+1's input into buffer (i+1)%2 waits until offload(i-1) has read it
        j = output_write_waits_for(i, n)
        tail = chain(lp.phases_of(i)[0], i, "fwd", deps, gpu(i, policy.forward_kept(sk)),
                     last_deps=[offload[j]] if j in offload else [])
        fwd_tail[i] = tail
        if i < lp.offloaded_layers and lp.offload_bytes > 0:
            op = g.add("offload", device=d, stream="d2h", kind="copy", phase="offload", layer=i,
                       work=lp.offload_bytes, nbytes=lp.offload_bytes, direction="d2h", deps=tail,
                       mem_start=(MemAction("host", f"L{i}.offload", lp.host_block_bytes),))
            offload[i] = op
            sched.copies.setdefault((i, "offload"), op)

    head_deps = list(tail)
    if gather_fwd and sync.mtp_gather > 0:  # the modules' weights, before the head that runs them (twice: ZeRO-3)
        head_deps.append(dp_op("allgather_weights", None, sync.mtp_gather * (2 if sync.gather_in_backward else 1),
                               fwd_tail.get(n - 2, []), "weight_gather"))
    if gather_fwd and sync.head_gather > 0:  # kept through the head's backward, which its op holds
        head_deps.append(dp_op("allgather_head", None, sync.head_gather, fwd_tail.get(n - 2, []), "weight_gather"))
    cls = g.add("classifier", device=d, stream="compute", kind="compute", phase="classifier", layer=None,
                work=bt.classifier, deps=reorganize("classifier", None, head_deps),
                mem_start=(MemAction("gpu", "classifier.working", mem.classifier_peak_bytes),),
                mem_end=(MemAction("gpu", "classifier.working", -mem.classifier_peak_bytes),))
    tail = [cls]

    # ---- backward -------------------------------------------------------------------------
    gather_b: dict[int, Op] = {}
    if sync.gather_in_backward:  # issued at the forward's end, ahead of the head's bucket on the stream
        for i in (n - 1, n - 2):
            if i >= 0:
                gather_b[i] = dp_op("allgather_weights", i, sync.layer_gather, fwd_tail[n - 1], "weight_gather_bwd")
            elif i == -1 and sync.embedding_gather > 0 and not sync.embedding_kept:  # the embedding's unit, two
                # units ahead (a one-layer model), unless kept from its forward (`cost.grad_sync`)
                gather_b[-1] = dp_op("allgather_embedding", None, sync.embedding_gather, fwd_tail[n - 1],
                                     "weight_gather_bwd")
    if reduce_now and sync.overlapped and sync.head_grad + sync.mtp_grad > 0:  # the head's bucket, complete now
        last_dp = dp_op("reducescatter_grads" if layout.zero >= 1 else "allreduce_grads", None,
                        sync.head_grad + sync.mtp_grad, tail)
    bwd_end: dict[int, list[Op]] = {}
    for i in range(n - 1, -1, -1):
        deps = list(tail)
        if i in gather_b:
            deps = copy_op("fsdp_copy_out", i, "bwd", sync.layer_copy_out, deps + [gather_b[i]])
        if i in offload:
            pf = g.add("prefetch", device=d, stream="h2d", kind="copy", phase="prefetch", layer=i,
                       work=lp.offload_bytes, nbytes=lp.offload_bytes, direction="h2d",
                       # buffer i%2 is free once layer i+2's backward is done
                       deps=bwd_end[prefetch_after_backward_of(i, n)],
                       mem_end=(MemAction("host", f"L{i}.offload", -lp.host_block_bytes),))
            sched.copies.setdefault((i, "prefetch"), pf)
            deps.append(pf)
        _f, back, rec = lp.phases_of(i)
        if policy.recomputes_layer(i, n) and rec:
            tail = chain(rec, i, "recompute", deps, gpu(i, policy.recompute_allocated(sk)))
            deps = tail
        freed = gpu(i, policy.recompute_allocated(sk) + policy.forward_kept(sk), -1.0)
        tail = chain(back, i, "bwd", deps, (), freed)
        if reduce_now and sync.overlapped:  # the gradients into the reduce-scatter's input first (FSDP2)
            tail = copy_op("fsdp_copy_in", i, "bwd", sync.layer_copy_in, tail)
        bwd_end[i] = tail
        if sync.gather_in_backward and i - 2 >= 0:
            gather_b[i - 2] = dp_op("allgather_weights", i - 2, sync.layer_gather, tail, "weight_gather_bwd")
        if sync.gather_in_backward and sync.embedding_gather > 0 and not sync.embedding_kept and i == 1:  # two
            # units ahead, as a layer's, unless kept from its forward (`memo_sim.cost.grad_sync`)
            gather_b[-1] = dp_op("allgather_embedding", None, sync.embedding_gather, tail, "weight_gather_bwd")
        if reduce_now and sync.overlapped:
            last_dp = dp_op("reducescatter_grads" if layout.zero >= 1 else "allreduce_grads", i, sync.layer_grad,
                            tail)

    emb_b = g.add("embedding", device=d, stream="compute", kind="compute", phase="bwd", layer=None,
                  work=bt.embedding_bwd, deps=reorganize("embedding.bwd", None, tail + (
                      [gather_b[-1]] if -1 in gather_b else [])))
    tail = [emb_b]
    if reduce_now:  # the embedding's bucket, or (not overlapped) every gradient at once after the backward
        last_dp = dp_op("reducescatter_grads" if layout.zero >= 1 else "allreduce_grads", None,
                        sync.embedding_grad if sync.overlapped else sync.all_grads, tail)
    return tail, last_dp


# ------------------------------------------------------------------------------------------ runner
_PHASES = (("forward", "fwd"), ("backward", "bwd"), ("recompute", "recompute"))  # layer_timings key, phase
_COPIES = ("offload", "prefetch")


def layer_timings(sched: Schedule, layer: int | None = None) -> dict[str, float]:
    """Simulated seconds of one layer's forward, backward, recompute, offload and prefetch."""
    i = sched.middle_layer if layer is None else layer
    out = {k: _span(sched.phases.get((i, p))) for k, p in _PHASES}
    for k in _COPIES:
        op = sched.copies.get((i, k))
        out[k] = (op.end - op.start) if op is not None and op.end is not None else 0.0
    return out



@register_schedule("single_stage")
def simulate_single_stage(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                          profile: HardwareProfile, *, micro_batch: int, contention: bool = True,
                          classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS, keep_timeline: bool = True,
                          record: bool = False, allocator_lag: int = 0, detail: str = "auto",
                          fold: bool = True) -> SimResult:
    """The single-stage schedule (`memo_sim.engine.simulate.simulate` calls it): one training
    iteration of ``model`` at ``seq`` tokens x ``batch`` sequences per
    data-parallel replica under ``layout`` and ``policy`` on ``profile``.

    One representative GPU is simulated; the node's shared PCIe switches and host memory see the
    traffic of every GPU of the node (see `memo_sim.engine.core`). ``contention=False`` gives
    every op its stand-alone time (the analytic model's assumptions). Running out of GPU or host
    memory is a result (``status`` OOM / OOHM with ``failure``), not an exception; a bad input
    raises `MemoError`. ``record=True`` also keeps the op graph (``ops``, with dependencies) and
    the links' load at every rate change (``link_log``), for checks and debugging.

    The whole iteration is replayed through PyTorch's caching allocator (`memo_sim.memplan.iteration_replay`)
    against the GPU's capacity, each reorganisation's stall is charged on the compute stream where it happens, and
    a replay that runs out of memory (fragmentation, where the byte count alone fits) ends the run as OOM. Under a
    static memory plan the replay holds the plan's arena as one request and replays what the plan leaves to the
    caching allocator (`engine_replay`).
    ``allocator_lag`` models ``record_stream`` on collective buffers with the GPU that many layers
    behind the CPU (0: the layout's, `memo_sim.memplan.iteration_replay.record_stream_lag` where
    ``layout.nccl_record_stream``, else the GPU keeps up).

    ``fold`` (default; not with ``record``): identical layers are simulated once where the
    iteration is periodic (`memo_sim.engine.periodic`; ``folded`` says how many layers the
    short run stood for), else the whole schedule runs.
    """
    m = batch // micro_batch
    t0 = time.perf_counter()
    replay = engine_replay(model, layout, micro_batch, seq, policy, profile,
                           classifier_chunk_tokens=classifier_chunk_tokens, allocator_lag=allocator_lag)
    stall = replay.stall_by_phase(profile) if replay is not None else None
    plan = None
    if fold and not record and m == 1:
        plan = plan_fold(model.layers, partial(layer_signature, policy), stall, ffn_kinds(model))
    out = None
    if plan is not None:
        out = _run_folded(model, layout, micro_batch, seq, policy, profile, plan, contention=contention,
                          classifier_chunk_tokens=classifier_chunk_tokens, stall=stall, keep_timeline=keep_timeline)
    if out is None:
        out = _run_whole(model, layout, micro_batch, seq, policy, profile, contention=contention, micro_batches=m,
                         classifier_chunk_tokens=classifier_chunk_tokens, stall=stall, keep_timeline=keep_timeline,
                         record=record)
    sched = out.sched
    dev = sched.device.index
    failure = out.failure
    if failure is None and replay is not None and replay.oom:
        ev = replay.oom_event
        # the replay's order of requests has no clock: no time is given (a review: 'OOM at 0.0 us' for layer 77's)
        # the reserved bytes say why it failed where the allocated ones leave room (a review: 'needs 3.50 GiB with
        # 44.61 GiB of 78.00 GiB in use' named the allocated bytes alone)
        held = (f": {fmt_bytes(ev.reserved_bytes)} reserved, {fmt_bytes(ev.cached_free_bytes)} of it free in pieces of "
                f"segments still in use" if ev else "")
        failure = Failure("OOM", None, f"{replay.oom_request} ({fragmentation_words(model, layout, policy)}{held})",
                          float(ev.requested_bytes) if ev else 0.0, float(ev.allocated_bytes) if ev else 0.0,
                          sched.memory.gpu_capacity_bytes, dev, None, None)
    status = failure.status if failure else "OK"
    it, mfu, tgs = rates(out.end_time, failure, model, layout, batch, seq, profile)
    meta = {
        "source": "simulated", "model": model.name, "layers": model.layers, "layout": layout.label(),
        "policy": policy.label(), "profile": profile.name, "seq_tokens": seq, "batch": batch, "gpus": layout.gpus,
        "schedule": "single_stage", "micro_batch": micro_batch,
        "status": status, "iteration_s": it, "mfu": mfu, "contention": contention,
        "gpu_capacity_bytes": sched.memory.gpu_capacity_bytes,
        "host_capacity_bytes": sched.memory.host_capacity_bytes,
        "representative": {"device": dev, "gpus_on_node": sched.device.group,
                           "gpus_on_pcie_switch": sched.device.switch_group},
        "middle_layer": middle_layer(model.layers),
        "failure": failure.to_dict() if failure else None,
        "allocator": allocator_summary(replay, profile),
    }
    tl = Timeline(out.events, out.memory, meta) if keep_timeline else None
    wall = time.perf_counter() - t0
    node = sched.device.node
    return SimResult(
        model=model, layout=layout, batch=batch, seq=seq, policy=policy, profile=profile.name, status=status,
        iteration_s=it, mfu=mfu, tgs=tgs, peak_gpu_bytes=out.peak_gpu[dev], peak_host_bytes_per_node=out.peak_host[node],
        gpu_capacity_bytes=sched.memory.gpu_capacity_bytes, host_capacity_bytes=sched.memory.host_capacity_bytes,
        exposed_copy_s=out.exposed_copy_s, layer_timings=out.layer_timings, timeline=tl,
        failure=failure, contention=contention, sim_wall_s=wall, n_ops=out.n_ops,
        start_gpu_bytes=out.start_gpu.get(dev, 0.0), end_gpu_bytes=out.end_gpu[dev],
        end_host_bytes=out.end_host[node], link_log=out.link_log,
        link_capacity=out.link_capacity, link_carried=out.link_carried,
        ops=out.ops, allocator=allocator_summary(replay, profile),
        static_memory=[(d, a.tensor, a.nbytes) for d, a in out.sched.graph.static if a.space == "gpu"] if out.ops
        else [],
        exposed_p2p_s=out.exposed_p2p_s if layout.metp else 0.0, folded=out.folded, micro_batch=micro_batch)



@dataclass
class _Outcome:
    """What one engine run (whole, or folded and unfolded) gives `simulate`."""

    sched: Schedule
    end_time: float
    failure: Failure | None
    peak_gpu: dict[int, float]
    peak_host: dict[int, float]
    start_gpu: dict[int, float]
    end_gpu: dict[int, float]
    end_host: dict[int, float]
    n_ops: int
    exposed_copy_s: float
    exposed_p2p_s: float
    layer_timings: dict[str, float]
    events: list[TimelineEvent]
    memory: list
    link_capacity: dict
    link_carried: dict
    link_log: list = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    folded: int = 0


def _run_whole(model, layout, batch, seq, policy, profile, *, contention, classifier_chunk_tokens, stall,
               keep_timeline, record, micro_batches: int = 1) -> _Outcome:
    sched = build_iteration(model, layout, batch, seq, policy, profile, classifier_chunk_tokens=classifier_chunk_tokens,
                            allocator_stall=stall, micro_batches=micro_batches)
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=sched.memory.gpu_capacity_bytes,
                    host_capacity=sched.memory.host_capacity_bytes, record_links=record, keep_memory=keep_timeline)
    run = engine.run()
    check_deadlock(engine, run, "schedule")
    exposed = exposed_wait_totals(run.ops, (COPY_STREAMS, TP_RING_STREAMS) if layout.metp else (COPY_STREAMS,))
    return _Outcome(
        sched, run.end_time, run.failure, run.peak_gpu_bytes, run.peak_host_bytes, run.start_gpu_bytes,
        run.end_gpu_bytes, run.end_host_bytes, len(run.ops), exposed[0],
        exposed[1] if layout.metp else 0.0, layer_timings(sched),
        timeline_events(run) if keep_timeline else [], list(run.memory), run.link_capacity, run.link_carried,
        run.link_log, run.ops if record else [])


def _run_folded(model, layout, batch, seq, policy, profile, plan: Fold, *, contention, classifier_chunk_tokens, stall,
                keep_timeline) -> _Outcome | None:
    """Identical layers simulated once (`memo_sim.engine.periodic`); None where the short run is
    not periodic, or failed and a timeline is wanted (the whole run then gives it)."""
    kinds = ffn_kinds(model)  # each short layer as the model layer it stands for (`plan_fold` checked them alike)
    sched = build_iteration(model, layout, batch, seq, policy, profile, classifier_chunk_tokens=classifier_chunk_tokens,
                            allocator_stall=plan.allocator_stall, layers=plan.simulated,
                            kinds=tuple(kinds[plan.model_layer(i)] for i in range(plan.simulated)) if kinds else None)
    if not keep_timeline:
        out = _static_failure(sched, profile, plan, contention=contention)
        if out is not None:
            return out
    inf = float("inf")
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=inf, host_capacity=inf, log=True)
    run = engine.run()
    check_deadlock(engine, run, "schedule")
    u = unfold(run, sched.phases, plan, gpu_capacity=sched.memory.gpu_capacity_bytes,
               host_capacity=sched.memory.host_capacity_bytes, devices=sched.graph.devices,
               routes=engine.routes if contention else None)
    if u is None or (u.failure is not None and (keep_timeline or u.tie)):
        return None
    parts = exposed_wait_parts_of(run.ops, (COPY_STREAMS, TP_RING_STREAMS) if layout.metp else (COPY_STREAMS,))
    copy_parts = {uid: x for _s, uid, x in parts[0]}
    p2p = u.exposed_wait_seconds({uid: x for _s, uid, x in parts[1]}) if layout.metp else 0.0
    spans = u.phase_spans(middle_layer(model.layers), tuple(p for _k, p in _PHASES), _COPIES)
    timings = {k: spans[p] for k, p in _PHASES}
    timings.update({c: spans[c] for c in _COPIES})
    return _Outcome(
        # a static allocation that does not fit stops the engine before the iteration starts
        sched, u.end_time, u.failure, u.peak_gpu, u.peak_host,
        u.end_gpu if u.failure is not None and u.failure.op is None else run.start_gpu_bytes, u.end_gpu, u.end_host,
        u.n_ops, u.exposed_wait_seconds(copy_parts), p2p, timings,
        u.timeline_events() if keep_timeline else [], list(u.samples()) if keep_timeline else [],
        run.link_capacity, u.link_carried, folded=plan.copies)


def _static_failure(sched: Schedule, profile: HardwareProfile, plan: Fold, *, contention: bool) -> _Outcome | None:
    """Where the model states and static buffers alone do not fit, the run fails before its
    first op, the whole model's as the short one's: the engine applies the static allocations
    and stops (no op of the short schedule runs), and the whole graph's op count is the short
    one's plus the copied layers' (each as many ops as the short schedule's layer before the cut;
    tests/test_engine_periodic.py holds this to the whole run). None where they fit."""
    g = sched.graph
    probe = OpGraph(list(g.devices.values()))
    probe.static = list(g.static)
    engine = Engine(probe, profile, contention=contention, gpu_capacity=sched.memory.gpu_capacity_bytes,
                    host_capacity=sched.memory.host_capacity_bytes, keep_memory=False)
    run = engine.run()
    if run.failure is None:
        return None
    n_ops = len(g.ops) + plan.copies * sum(1 for op in g.ops if op.layer == plan.cut - 1)
    return _Outcome(
        sched, run.end_time, run.failure, run.peak_gpu_bytes, run.peak_host_bytes, run.start_gpu_bytes,
        run.end_gpu_bytes, run.end_host_bytes, n_ops, 0.0, 0.0, layer_timings(sched), [], [],
        run.link_capacity, run.link_carried, folded=plan.copies)

