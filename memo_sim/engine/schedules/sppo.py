"""The SPPO iteration as an op graph: one representative `Device` per pipeline stage.

Stage s runs layers ``stage_layers(n, pp)[s]`` (the embedding on stage 0, the classifier on the
last) over its pieces (`memo_sim.cost.sppo.stage_pieces`: the N subsequences, split again where
multiplexed partitioning says), each piece through each of its layers being one *unit*::

    stage s, forward:   for piece k = 0..K-1: [embedding (s = 0)] layer a..b fwd
                        -> send to stage s+1 (p2p)  |  classifier fwd+bwd of the piece (last stage)
    stage s, backward:  for piece k = K-1..0: layer b..a: [prefetch] bwd, gradient bucket after the
                        last piece -> send the input gradient to stage s-1 (p2p) | embedding bwd (s = 0)
                        -> optimizer step of the stage's parameters

Dependencies: a unit's ops are one `memo_sim.cost.opcost` chain (from `memo_sim.cost.sppo.piece_costs`:
the piece's own token count, attention at its prefix FLOPs). Piece k of stage s starts after
piece k-1 of stage s (the compute stream's order and the chain) and after the sends of every
piece of stage s-1 whose tokens it overlaps (the pieces of neighbouring stages differ only where
multiplexing split a subsequence); in backward, pieces run in reverse order (a piece's backward
adds to the dK/dV of every piece before it) and a piece of stage s waits for the backward sends
of the overlapping pieces of stage s+1. Sends are ``comm`` ops on the sender's ``p2p`` stream
over NVLink, or InfiniBand where the hop leaves the node
(`memo_sim.layout.parallel.stage_hop_crosses_nodes`). Host copies follow MEMO's rounding-buffer
rule in each stage's unit order (`memo_sim.policy.sppo`). Bubbles are simply the time a stage's
compute stream waits.

Memory per stage device, as `memo_sim.memplan.footprint.sppo_memory` walks it: model states
(static); per unit at its forward the skeletal bytes and lse, the offloaded rows freed when the
offload ends and allocated again when the prefetch starts, everything freed after the unit's
backward; K/V of all but the stage's last piece stay (two-level management); the dK/dV
accumulators of earlier pieces from the stage's first backward of each layer; one working block
per running unit; classifier working memory and the kept final-hidden gradient on the last
stage. Pinned host bytes per offloaded unit from the offload's start to the prefetch's end.

Devices: stage s is represented by its first GPU (rank s·tp of the first replica), standing for
the GPUs of its node that run stage s (every replica's), of which those on its PCIe switch share
the switch (`memo_sim.engine.graph.Device`); stages whose representatives share a node share its
host memory and host-memory bandwidth. With pp = 1 the device is exactly the representative of
`memo_sim.engine.schedules.single_stage.representative_device`, and with N = 1 and alpha = 1 the op graph is
the full-offload schedule's op for op (tests/test_sppo_engine.py) without data parallelism; with it SPPO reduces the
head's bucket with the embedding's after the backward (`GradSync.end_bucket`), one collective where the single stage
sends the head's as soon as the head's backward is done.

Not modelled: PyTorch caching-allocator reorganisations of the SPPO iteration (no replay; the
working block is the allocator's reserved peak on one layer's requests) and ZeRO-1's overlapped
weight gathers beyond one per layer before its first forward.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, replace

from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.opcost import OpCost
from memo_sim.cost.sppo import (
    stage_gpu_shard,
    Piece, p2p_bytes, p2p_link, p2p_link_time, piece_costs, stage_grad_sync, stage_layers, stage_model_state_bytes,
    stage_optimizer_time,
)
from memo_sim.engine.core import Engine, gc_paused
from memo_sim.engine.graph import Device, MemAction, Op, OpGraph
from memo_sim.engine.result import (
    SimResult, _span, check_deadlock, exposed_wait_totals, rates, timeline_of,
)
from memo_sim.engine.schedules.registry import register_schedule
from memo_sim.engine.schedules.single_stage import emit_chain
from memo_sim.engine.schedules.stages import (  # noqa: F401  (re-exported)
    FINE_OPS_LIMIT, collapse_unit, shared_embedding_sums, stage_devices,
)
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import PipelineMemory, shard_tokens_bytes, sppo_memory, sppo_unit_working_bytes
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.policy.base import Policy
from memo_sim.policy.rounding_buffers import is_offloaded, output_write_waits_for, prefetch_after_backward_of
from memo_sim.policy.sppo import UnitBytes
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import COPY_STREAMS

P2P_STREAM = "p2p"


@dataclass
class PipelineSchedule:
    graph: OpGraph
    devices: list[Device]
    memory: PipelineMemory
    pieces: list[list[Piece]]
    layers: list[range]
    phases: dict[tuple[int, int, int, str], list[Op]] = field(default_factory=dict)  # (stage, piece, layer, fwd|bwd)
    copies: dict[tuple[int, int, int, str], Op] = field(default_factory=dict)  # (stage, piece, layer, offload|prefetch)
    sends: dict[tuple[int, int, str], Op] = field(default_factory=dict)  # (stage, piece, fwd|bwd)
    unit_end: dict[tuple[int, int], list[Op]] = field(default_factory=dict)  # (stage, unit) -> forward tail
    last_ops: dict[int, Op] = field(default_factory=dict)  # stage -> its optimizer step
    detail: str = "ops"

    def meta(self) -> dict:
        return {"pp": len(self.devices), "detail": self.detail, "stages": [
            {"stage": s, "layers": [r.start, r.stop - 1] if len(r) else [], "device": self.devices[s].index,
             "node": self.devices[s].node, "gpus_on_node": self.devices[s].group,
             "pieces": [[p.sub, p.part, p.start, p.end] for p in self.pieces[s]]}
            for s, r in enumerate(self.layers)]}


DETAIL = ("ops", "units")


def resolve_detail(detail: str, model: ModelConfig, layout: Layout, policy: Policy) -> str:
    """``ops`` or ``units`` for ``auto``: op by op while the graph stays under `FINE_OPS_LIMIT` ops."""
    if detail in DETAIL:
        return detail
    if detail != "auto":
        from memo_sim.errors import MemoError

        raise MemoError(f"detail must be ops, units or auto, got {detail!r}")
    pieces = sum(len(p) for p in policy.stage_pieces(model, layout, 1))
    units = pieces * model.layers // layout.pp
    return "ops" if units * 2 * 16 <= FINE_OPS_LIMIT else "units"


def _overlapping(pieces: list[Piece], a: int, b: int) -> list[int]:
    return [k for k, p in enumerate(pieces) if p.start < b and a < p.end]


def _overlap_finder(pieces: list[Piece]):
    """`_overlapping` for one stage's pieces, by bisection: a stage's pieces follow one another
    (each starts at or after the end of the one before), so the pieces that overlap [a, b) are
    a run, from the first that ends after a to the last that starts before b. Pieces that do
    not follow one another are scanned as `_overlapping` does."""
    starts = [p.start for p in pieces]
    ends = [p.end for p in pieces]
    if any(s > e for s, e in zip(starts, ends)) or any(ends[k] > starts[k + 1] for k in range(len(pieces) - 1)):
        return lambda a, b: _overlapping(pieces, a, b)

    def find(a: int, b: int) -> range:
        return range(bisect_right(ends, a), bisect_left(starts, b))

    return find


def build_pipeline_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                             profile: HardwareProfile, detail: str = "auto") -> PipelineSchedule:
    """The op graph of one SPPO training iteration (one representative device per stage).
    ``detail``: ``ops`` (every kernel and collective of every unit), ``units`` (`collapse_unit`:
    the what-if's long pipelines) or ``auto``."""
    # up to a few hundred thousand long-lived objects (ops, their dependency lists and memory
    # actions) and no garbage: the cyclic collector's passes over them cost about three times
    # the build itself (`memo_sim.engine.core.gc_paused`)
    with gc_paused():
        return _build(model, layout, batch, seq, policy, profile, detail)


def _build(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
           profile: HardwareProfile, detail: str) -> PipelineSchedule:
    return _PipelineBuilder(model, layout, batch, seq, policy, profile, detail).build()


def _name(op: str, piece: Piece, n_pieces: int) -> str:
    return op if n_pieces == 1 else f"{op}@{piece.tag()}"


class _PipelineBuilder:
    """One build of `build_pipeline_iteration`: the per-build caches (what every stage asks for
    the same pieces), the per-stage unit data, then the forward stages in order and the backward
    stages last first."""

    def __init__(self, model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                 profile: HardwareProfile, detail: str):
        detail = resolve_detail(detail, model, layout, policy)
        why = policy.check(model, layout, batch, seq)
        if why:
            from memo_sim.errors import MemoError

            raise MemoError(f"sppo plan does not fit {layout.label()} at {seq} tokens: {why}")
        self.model, self.layout, self.batch, self.policy, self.profile = model, layout, batch, policy, profile
        self.detail = detail
        self.devices = devices = stage_devices(layout, profile)
        self.pieces = pieces = policy.stage_pieces(model, layout, batch)
        self.layers = layers = stage_layers(model.layers, layout.pp)
        mem = sppo_memory(model, layout, batch, seq, policy, profile)
        self.g = OpGraph(devices)
        self.sched = PipelineSchedule(self.g, devices, mem, pieces, layers, detail=detail)
        self.shard = stage_gpu_shard(layout)
        self.sync = stage_grad_sync(model, layout, profile)
        self.dt = DTYPE_BYTES[model.dtype]
        self.pp = layout.pp
        # what every stage asks for the same pieces, worked out once per build: a piece's unit op
        # lists (`piece_costs`, collapsed for ``units``, its ops renamed ``<op>@<piece tag>`` when the
        # stage has several pieces) are one list per piece, shared by every layer of every stage
        # that runs the piece; boundary times, K/V bytes and p2p sends by token count
        self.unit_lists: dict[tuple[Piece, bool], tuple[list[OpCost], list[OpCost]]] = {}
        self.bts: dict[int, object] = {}
        self.kv_bytes: dict[int, float] = {}
        self.links = [p2p_link(layout, profile, hop) for hop in range(self.pp - 1)]
        self.sends: dict[tuple[str, int], tuple[float, float, str]] = {}
        self.overlapping = [_overlap_finder(ps) for ps in pieces]
        # the rounding-buffer rule over a stage's n_u units (most stages have the same count):
        # per unit, whether it is offloaded, the offload its forward's last op waits for, the backward
        # its prefetch waits for
        self.rules: dict[int, tuple[list[bool], list[int | None], list[int | None]]] = {}
        # the forward's ops that later stages and the backward wait for
        self.fwd_tail: dict[tuple[int, int], list[Op]] = {}
        self.offload: dict[tuple[int, int], Op] = {}
        self.classifier: dict[tuple[int, int], Op] = {}
        self.gathers: dict[tuple[int, int], Op] = {}

    def build(self) -> PipelineSchedule:
        # per-stage unit data: within a piece, units differ only in whether they are offloaded
        self.info = [self.stage_info(s) for s in range(self.pp)]
        # ---- forward, stage by stage --------------------------------------------------------------
        for s in range(self.pp):
            self.forward_stage(s)
        # ---- backward, last stage first -----------------------------------------------------------
        ends = {}
        for s in range(self.pp - 1, -1, -1):
            ends[s] = self.backward_stage(s)
        ends = [ends[s] for s in range(self.pp)]
        shared = shared_embedding_sums(self.g, self.sync, self.devices, ends)
        for s in range(self.pp):  # each stage's optimizer step, after the shared embedding's sum on the end stages
            self.sched.last_ops[s] = self.g.add(
                "optimizer", device=self.devices[s].index, stream="compute", kind="compute", phase="optimizer",
                layer=None, work=stage_optimizer_time(self.model, self.layout, s, self.profile),
                deps=ends[s] + ([shared[s]] if s in shared else []))
        return self.sched

    # ---- per-build caches ----------------------------------------------------------------------
    def dp_op(self, d: int, nm: str, layer, work: float, deps: list[Op], phase: str = "grad_sync") -> Op:
        return self.g.add(nm, device=d, stream="dp_comm", kind="comm", phase=phase, layer=layer, work=work,
                          deps=deps, link=self.sync.link)

    def unit_costs(self, pc: Piece, renamed: bool) -> tuple[list[OpCost], list[OpCost]]:
        key = (pc, renamed)
        hit = self.unit_lists.get(key)
        if hit is None:
            fc, bc = piece_costs(self.model, self.shard, self.batch, pc.start, pc.tokens, self.profile)
            if self.detail == "units":
                fc = collapse_unit(fc, "fwd", self.shard, self.profile)
                bc = collapse_unit(bc, "bwd", self.shard, self.profile)
            if renamed:
                suffix = f"@{pc.tag()}"
                fc = [replace(c, name=f"{c.name}{suffix}") for c in fc]
                bc = [replace(c, name=f"{c.name}{suffix}") for c in bc]
            hit = self.unit_lists[key] = (fc, bc)
        return hit

    def bt_of(self, tokens: int):
        v = self.bts.get(tokens)
        if v is None:
            v = self.bts[tokens] = boundary_times(self.model, self.shard, self.batch, tokens, self.profile)
        return v

    def kv_of(self, tokens: int) -> float:
        v = self.kv_bytes.get(tokens)
        if v is None:
            v = self.kv_bytes[tokens] = _kv(self.model, self.shard, self.batch, tokens)
        return v

    def send(self, hop: int, tokens: int) -> tuple[float, float, str]:
        """(seconds, bytes, link) of a send of ``tokens`` tokens over the hop between stages ``hop``
        and ``hop + 1`` (either way: the same link)."""
        link = self.links[hop]
        v = self.sends.get((link, tokens))
        if v is None:
            v = self.sends[(link, tokens)] = (
                p2p_link_time(self.model, self.layout, self.batch, tokens, self.profile, link),
                p2p_bytes(self.model, self.layout, self.batch, tokens), link)
        return v

    def rule(self, n_u: int) -> tuple[list[bool], list[int | None], list[int | None]]:
        r = self.rules.get(n_u)
        if r is None:
            offl = [is_offloaded(u, n_u) for u in range(n_u)]
            r = self.rules[n_u] = (offl, [output_write_waits_for(u, n_u) for u in range(n_u)],
                                   [prefetch_after_backward_of(u, n_u) if offl[u] else None for u in range(n_u)])
        return r

    # ---- stages --------------------------------------------------------------------------------
    def stage_info(self, s: int) -> dict:
        """Stage s's unit data (and its model states, static on its device)."""
        model, layout, batch = self.model, self.layout, self.batch
        ps = self.pieces[s]
        n_k, n_l = len(ps), len(self.layers[s])
        n_u = n_k * n_l
        longest = max(p.tokens for p in ps)
        transient, boundary, cls_peak = sppo_unit_working_bytes(model, layout, batch, longest)
        offl, waits, after = self.rule(n_u)
        units = []
        seen: dict[tuple[int, bool], object] = {}
        for u in range(n_u):
            k = u // n_l
            off = offl[u]
            ub = seen.get((k, off))
            if ub is None:
                ub = seen[(k, off)] = self.policy.unit_bytes(model, layout, batch, ps[k], k < n_k - 1,
                                                             self.profile, off)
            units.append(ub)
        self.g.add_static(self.devices[s].index,
                          MemAction("gpu", "model_states", stage_model_state_bytes(model, layout, s)))
        return dict(n_k=n_k, n_l=n_l, n_u=n_u, work=transient + boundary, cls_peak=cls_peak, units=units,
                    offl=offl, waits=waits, after=after)

    def forward_stage(self, s: int) -> None:
        """Stage s's forward: its pieces in order, each through its layers, then the send to stage
        s+1 or (last stage) the piece's classifier."""
        g, sched, pp = self.g, self.sched, self.pp
        d = self.devices[s].index
        ps, inf = self.pieces[s], self.info[s]
        n_k = inf["n_k"]
        stage_layers_s = self.layers[s]
        tail: list[Op] = []
        for k, pc in enumerate(ps):
            deps = list(tail)
            if s == 0:
                if k == 0 and self.sync.embedding_gather > 0:  # its unit, as a layer's (`memo_sim.cost.grad_sync`)
                    deps = deps + [self.dp_op(d, "allgather_embedding", None, self.sync.embedding_gather, [],
                                              "weight_gather")]
                emb = g.add(_name("embedding", pc, n_k), device=d, stream="compute", kind="compute", phase="fwd",
                            layer=None, work=self.bt_of(pc.tokens).embedding_fwd, deps=deps)
                deps = [emb]
            else:
                deps += [sched.sends[(s - 1, q, "fwd")] for q in self.overlapping[s - 1](pc.start, pc.end)]
            tail = self.forward_piece(s, k, pc, deps, tail)
            if s < pp - 1:
                seconds, nbytes, link = self.send(s, pc.tokens)
                sched.sends[(s, k, "fwd")] = g.add(
                    _name("send_fwd", pc, n_k), device=d, stream=P2P_STREAM, kind="comm", phase="p2p_fwd",
                    layer=stage_layers_s[-1], work=seconds, nbytes=nbytes, link=link, deps=tail)
            else:
                hold = shard_tokens_bytes(self.shard, self.batch, pc.tokens, self.model.hidden, self.dt)
                head = list(tail)
                if k == 0 and self.sync.head_gather > 0:  # the head's unit, two units ahead as a layer's is
                    head.append(self.dp_op(d, "allgather_head", None, self.sync.head_gather,
                                           self.fwd_tail.get((s, inf["n_l"] - 2), []), "weight_gather"))
                cls = g.add(_name("classifier", pc, n_k), device=d, stream="compute", kind="compute",
                            phase="classifier", layer=None, work=self.bt_of(pc.tokens).classifier, deps=head,
                            mem_start=(MemAction("gpu", "classifier.working", inf["cls_peak"]),),
                            mem_end=(MemAction("gpu", "classifier.working", -inf["cls_peak"]),
                                     MemAction("gpu", f"classifier.dgrad@{pc.tag()}", hold)))
                self.classifier[(s, k)] = cls
                tail = [cls]

    def forward_piece(self, s: int, k: int, pc: Piece, deps: list[Op], tail: list[Op]) -> list[Op]:
        """Piece k of stage s forward through the stage's layers (each unit's chain, its weight
        gather and offload); returns the last unit's tail (``tail`` where the stage has no layers)."""
        g, sched, sync, offload, fwd_tail = self.g, self.sched, self.sync, self.offload, self.fwd_tail
        d = self.devices[s].index
        inf = self.info[s]
        n_k, n_l = inf["n_k"], inf["n_l"]
        units, offl, waits, work_bytes = inf["units"], inf["offl"], inf["waits"], inf["work"]
        stage_layers_s = self.layers[s]
        fcosts = self.unit_costs(pc, n_k != 1)[0]
        suffix = "" if n_k == 1 else "@" + pc.tag()
        offload_name = _name("offload", pc, n_k)
        for j in range(n_l):
            u = k * n_l + j
            layer = stage_layers_s[j]
            ub = units[u]
            if sync.layer_gather > 0 and k == 0:
                self.gathers[(s, j)] = self.dp_op(d, "allgather_weights", layer, sync.layer_gather,
                                                  fwd_tail.get((s, u - 2), []), "weight_gather")
                deps = deps + [self.gathers[(s, j)]]
            tag = f"L{layer}{suffix}"
            work = MemAction("gpu", f"{tag}.fwd.working", work_bytes)
            kept = _skeletal(tag, ub, offl[u], 1.0) + (MemAction("gpu", f"{tag}.lse", ub.lse),)
            w = waits[u]
            ops, tail = emit_chain(
                g, fcosts, device=d, layer=layer, phase="fwd", deps=deps, layout=self.shard, profile=self.profile,
                mem_start=kept + (work,), mem_end=(MemAction("gpu", work.tensor, -work.nbytes),),
                last_deps=[offload[(s, w)]] if (s, w) in offload else [])
            sched.phases[(s, k, layer, "fwd")] = ops
            fwd_tail[(s, u)] = tail
            sched.unit_end[(s, u)] = tail
            deps = tail
            if offl[u] and ub.offload > 0:
                op = g.add(offload_name, device=d, stream="d2h", kind="copy", phase="offload",
                           layer=layer, work=ub.offload, nbytes=ub.offload, direction="d2h", deps=tail,
                           mem_start=(MemAction("host", f"{tag}.offload", ub.host_block),),
                           mem_end=(MemAction("gpu", f"{tag}.skeletal.offloaded", -ub.offload),))  # _skeletal's
                offload[(s, u)] = op
                sched.copies[(s, k, layer, "offload")] = op
        return tail

    def backward_stage(self, s: int) -> list[Op]:
        """Stage s's backward: its pieces in reverse order, each back through its layers, then the
        send to stage s-1 or (first stage) the embedding's backward; then the stage's gradient
        sync; returns what the stage's optimizer step waits for (`build` adds the steps)."""
        g, sched, sync, layout, pp = self.g, self.sched, self.sync, self.layout, self.pp
        d = self.devices[s].index
        ps, inf = self.pieces[s], self.info[s]
        n_k = inf["n_k"]
        stage_layers_s = self.layers[s]
        tail = [self.classifier[(s, n_k - 1)]] if s == pp - 1 else []
        bwd_end: dict[int, list[Op]] = {}
        last_dp: Op | None = None
        for k in range(n_k - 1, -1, -1):
            pc = ps[k]
            deps = list(tail)
            if s == pp - 1:
                if self.classifier[(s, k)] not in deps:
                    deps.append(self.classifier[(s, k)])
            else:
                deps += [sched.sends[(s + 1, q, "bwd")] for q in self.overlapping[s + 1](pc.start, pc.end)]
            tail, last_dp = self.backward_piece(s, k, pc, deps, tail, bwd_end, last_dp)
            if s > 0:
                seconds, nbytes, link = self.send(s - 1, pc.tokens)
                sched.sends[(s, k, "bwd")] = g.add(
                    _name("send_bwd", pc, n_k), device=d, stream=P2P_STREAM, kind="comm", phase="p2p_bwd",
                    layer=stage_layers_s[0], work=seconds, nbytes=nbytes, link=link, deps=tail)
            else:
                tail = [g.add(_name("embedding", pc, n_k), device=d, stream="compute", kind="compute", phase="bwd",
                              layer=None, work=self.bt_of(pc.tokens).embedding_bwd, deps=tail)]
        end_bucket = sync.end_bucket(s, pp)
        if end_bucket > 0:  # the embedding's (first stage) or the head's (last stage), after the stage's backward
            last_dp = self.dp_op(d, "reducescatter_grads" if layout.zero >= 1 else "allreduce_grads", None,
                                 end_bucket, tail)
        return tail + ([last_dp] if last_dp else [])

    def backward_piece(self, s: int, k: int, pc: Piece, deps: list[Op], tail: list[Op],
                       bwd_end: dict[int, list[Op]], last_dp: Op | None) -> tuple[list[Op], Op | None]:
        """Piece k of stage s back through the stage's layers, last first (each unit's prefetch and
        chain, the gradient bucket after the piece 0); returns the last unit's tail (``tail`` where
        the stage has no layers) and the stage's latest gradient-sync op (``last_dp`` if none)."""
        g, sched, sync, shard, model = self.g, self.sched, self.sync, self.shard, self.model
        d = self.devices[s].index
        inf, ps = self.info[s], self.pieces[s]
        n_k, n_l = inf["n_k"], inf["n_l"]
        units, offl, after, work_bytes = inf["units"], inf["offl"], inf["after"], inf["work"]
        stage_layers_s = self.layers[s]
        bcosts = self.unit_costs(pc, n_k != 1)[1]
        suffix = "" if n_k == 1 else "@" + pc.tag()
        prefetch_name = _name("prefetch", pc, n_k)
        # the dK/dV accumulators of the pieces before this one: allocated at the stage's first backward of each
        # layer (the last piece's), one per earlier piece, each freed after that piece's backward of the layer, so
        # each free names the allocation of its size (`memo_sim.report.memory_snapshot` pairs them by name)
        kv_start = ps[:k] if k == n_k - 1 and n_k > 1 and pc.start > 0 else []
        kv_own = self.kv_of(pc.tokens) if k < n_k - 1 else 0.0
        for j in range(n_l - 1, -1, -1):
            u = k * n_l + j
            layer = stage_layers_s[j]
            ub = units[u]
            tag = f"L{layer}{suffix}"
            if offl[u] and ub.offload > 0:
                pf = g.add(prefetch_name, device=d, stream="h2d", kind="copy", phase="prefetch",
                           layer=layer, work=ub.offload, nbytes=ub.offload, direction="h2d",
                           deps=bwd_end[after[u]],
                           mem_start=(MemAction("gpu", f"{tag}.skeletal.offloaded", ub.offload),),  # _skeletal's
                           mem_end=(MemAction("host", f"{tag}.offload", -ub.host_block),))
                sched.copies[(s, k, layer, "prefetch")] = pf
                deps = deps + [pf]
            work = MemAction("gpu", f"{tag}.bwd.working", work_bytes)
            start: tuple[MemAction, ...] = ()
            if s == self.pp - 1 and j == n_l - 1:
                start += (MemAction("gpu", f"classifier.dgrad@{pc.tag()}",
                                    -shard_tokens_bytes(shard, self.batch, pc.tokens, model.hidden, self.dt)),)
            start += tuple(MemAction("gpu", f"L{layer}.dkv_accumulators@{q.tag()}", self.kv_of(q.tokens))
                           for q in kv_start)
            end = ((MemAction("gpu", work.tensor, -work.nbytes),) + _skeletal(tag, ub, offl[u], -1.0)
                   + (MemAction("gpu", f"{tag}.lse", -ub.lse),))
            if k < n_k - 1:
                end += (MemAction("gpu", f"L{layer}.dkv_accumulators@{pc.tag()}", -kv_own),)
            ops, tail = emit_chain(
                g, bcosts, device=d, layer=layer, phase="bwd", deps=deps, layout=shard, profile=self.profile,
                mem_start=start + (work,), mem_end=end)
            sched.phases[(s, k, layer, "bwd")] = ops
            bwd_end[u] = tail
            deps = tail
            if k == 0 and sync.layer_grad > 0:
                last_dp = self.dp_op(d, "reducescatter_grads" if self.layout.zero >= 1 else "allreduce_grads",
                                     layer, sync.layer_grad, tail)
        return tail, last_dp


def _skeletal(tag: str, ub: UnitBytes, offloaded: bool, sign: float) -> tuple[MemAction, ...]:
    """A unit's skeletal tensors as GPU allocations (``sign`` 1) or frees (-1): an offloaded unit's rows that go to
    host (``ub.offload``) are their own allocation ``{tag}.skeletal.offloaded``, freed when the offload ends and
    allocated again when the prefetch starts, beside the rest ``{tag}.skeletal`` (``ub.skeletal - ub.offload``), so
    every free names a live allocation of its size (`memo_sim.report.memory_snapshot` pairs them by name). The
    bytes in use after the pair are the unit's ``ub.skeletal`` as one allocation gave them (the level between the
    two is lower, so no peak moves)."""
    if not (offloaded and ub.offload > 0):
        return (MemAction("gpu", f"{tag}.skeletal", sign * ub.skeletal),)
    rest = ub.skeletal - ub.offload  # 0 where every row goes to host (alpha 1, no K/V kept)
    return ((MemAction("gpu", f"{tag}.skeletal", sign * rest),) if rest else ()) + (
        MemAction("gpu", f"{tag}.skeletal.offloaded", sign * ub.offload),)


def _kv(model: ModelConfig, shard: Layout, batch: int, tokens: int) -> float:
    from memo_sim.cost.sppo import kv_cache_bytes

    return kv_cache_bytes(model, shard, batch, tokens)


# ------------------------------------------------------------------------------------------ runner
@register_schedule("sppo")
def simulate_sppo(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                  profile: HardwareProfile, *, micro_batch: int = 0, contention: bool = True, keep_timeline: bool = True,
                  record: bool = False, detail: str = "auto", **_single_stage_options) -> SimResult:
    """The SPPO schedule (`memo_sim.engine.simulate.simulate` calls it): one representative device
    per stage (``detail``: ops, units or auto; the whole batch is one micro-batch, SPPO splits the
    sequence instead; the single stage's allocator and fold options do not apply). ``peak_gpu_bytes`` is the
    fullest stage's, the host peak the fullest node's; ``pipeline`` holds per-stage peaks, busy
    and bubble time and the pieces."""
    t0 = time.perf_counter()
    sched = build_pipeline_iteration(model, layout, batch, seq, policy, profile, detail=detail)
    mem = sched.memory.breakdown
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=mem.gpu_capacity_bytes,
                    host_capacity=mem.host_capacity_bytes, record_links=record, keep_memory=keep_timeline)
    run = engine.run()
    check_deadlock(engine, run, "pipeline schedule")
    failure = run.failure
    status = failure.status if failure else "OK"
    it, mfu, tgs = rates(run.end_time, failure, model, layout, batch, seq, profile)
    stages = []
    for dev in sched.devices:
        # the graph keeps each (device, stream)'s ops in issue order, as run.ops has them
        busy = sum(o.end - o.start for o in sched.graph.streams.get((dev.index, "compute"), ())
                   if o.end is not None)
        stages.append({"stage": dev.index, "node": dev.node, "gpus_on_node": dev.group,
                       "peak_gpu_bytes": run.peak_gpu_bytes[dev.index], "compute_busy_s": busy,
                       "idle_s": (it - busy) if it else None,
                       "analytic_peak_gpu_bytes": sched.memory.stages[dev.index].breakdown.peak_gpu_bytes,
                       "analytic_peak_at": sched.memory.stages[dev.index].peak_at})
    worst = max(sched.devices, key=lambda dv: run.peak_gpu_bytes[dv.index])
    # the transfers' own exposed time (not the other stage's work before them: `exposed_wait_parts_of`'s moving)
    exposed_copy, exposed_p2p = exposed_wait_totals(run.ops, (COPY_STREAMS, (P2P_STREAM,)), (False, True))
    pipe = {"pp": layout.pp, "subseqs": policy.subseqs, "multiplex": policy.multiplex, "detail": sched.detail,
            "exposed_p2p_s": exposed_p2p,
            "bounds": list(policy.bounds), "alphas": list(policy.alphas), "stages": stages,
            "bubble_fraction": (1 - sum(st["compute_busy_s"] for st in stages) / (len(stages) * it)) if it else None,
            "worst_stage": worst.index, "memory": sched.memory.to_dict()}
    meta = {
        "source": "simulated", "model": model.name, "layers": model.layers, "layout": layout.label(),
        "policy": policy.label(), "profile": profile.name, "seq_tokens": seq, "batch": batch, "gpus": layout.gpus,
        "schedule": "sppo",
        "status": status, "iteration_s": it, "mfu": mfu, "contention": contention,
        "gpu_capacity_bytes": mem.gpu_capacity_bytes, "host_capacity_bytes": mem.host_capacity_bytes,
        "representative": {"device": worst.index, "gpus_on_node": worst.group,
                           "gpus_on_pcie_switch": worst.switch_group},
        "middle_layer": sched.layers[0][len(sched.layers[0]) // 2],  # the Gantt chart of stage 0 (device 0)
        "failure": failure.to_dict() if failure else None,
        "allocator": {"static_memory_plan": False, "reorganizations": 0, "stall_s": 0.0, "replayed": False},
        "pipeline": {**sched.meta(), "subseqs": policy.subseqs, "multiplex": policy.multiplex,
                     "bounds": list(policy.bounds), "alphas": list(policy.alphas)},
    }
    tl = timeline_of(run, meta) if keep_timeline else None
    wall = time.perf_counter() - t0
    node = worst.node
    return SimResult(
        model=model, layout=layout, batch=batch, seq=seq, policy=policy, profile=profile.name, status=status,
        iteration_s=it, mfu=mfu, tgs=tgs, peak_gpu_bytes=max(run.peak_gpu_bytes.values()),
        peak_host_bytes_per_node=max(run.peak_host_bytes.values()),
        gpu_capacity_bytes=mem.gpu_capacity_bytes, host_capacity_bytes=mem.host_capacity_bytes,
        exposed_copy_s=exposed_copy, layer_timings=pipeline_layer_timings(sched),
        timeline=tl, failure=failure, contention=contention, sim_wall_s=wall, n_ops=len(run.ops),
        start_gpu_bytes=run.start_gpu_bytes.get(worst.index, 0.0), end_gpu_bytes=run.end_gpu_bytes[worst.index],
        end_host_bytes=run.end_host_bytes[node], link_log=run.link_log, link_capacity=run.link_capacity,
        link_carried=run.link_carried, ops=run.ops if record else [],
        static_memory=[(d, a.tensor, a.nbytes) for d, a in sched.graph.static if a.space == "gpu"] if record else [],
        allocator=dict(meta["allocator"]), pipeline=pipe, schedule="sppo", micro_batch=batch)


def pipeline_layer_timings(sched) -> dict[str, float]:
    """Simulated seconds of one layer of the sequence (the plan's ``layer_timings_s``, as a micro-batch's layer in
    the other schedules): the middle layer of stage 0 over every piece of the sequence, each piece's forward,
    backward and copies summed (memo-exec's report measures a layer so, its copies of every subsequence; it was
    one piece's, compared there with the whole layer's)."""
    layer = sched.layers[0][len(sched.layers[0]) // 2]
    pieces = range(len(sched.pieces[0]))
    out = {"forward": sum(_span(sched.phases.get((0, k, layer, "fwd"))) for k in pieces),
           "backward": sum(_span(sched.phases.get((0, k, layer, "bwd"))) for k in pieces), "recompute": 0.0}
    for kind in ("offload", "prefetch"):
        ops = [sched.copies.get((0, k, layer, kind)) for k in pieces]
        out[kind] = sum((op.end - op.start for op in ops if op is not None and op.end is not None), 0.0)  # a float
    return out

