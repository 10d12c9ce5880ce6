"""Peak GPU memory and pinned host memory of one training iteration, by policy.

peak = model states + skeletal bytes the policy keeps resident + its static skeletal buffers
+ every layer's lse where the policy keeps it (`Policy.keeps_lse`; a policy that re-runs the attention
holds one layer's, in its recompute buffer) + max(one layer's transient peak + the activation handed
between layers, the classifier's peak).

Transients: the largest live set of one layer's forward or backward requests (the level-1
traces of `memo_sim.memplan.trace_gen`). A policy with a static memory plan (MEMO) occupies
one arena, the max-live of the phase that places the most, which the bi-level planner reaches on
these traces (reports/memplan-gpt.md), in both phases, and beside it each phase's own tensors that
kernels and the caching allocator allocate (`MemoryBreakdown.phase_transient_bytes`: the backward's
gradients are not the forward's); the others run on PyTorch's caching allocator, whose reserved
peak on the same requests (`memo_sim.memplan.baseline`) is what they occupy.

Host: each offloaded layer's bytes as the policy's host layout allocates them
(`memo_sim.policy.host_layout`: memo's executor registers one exact pool per GPU), times the
offloaded layers and the active GPUs of the node.

SPPO (`sppo_memory`): per pipeline stage, a walk over the stage's units (piece x layer) in
schedule order: the stage's model states, every unit's skeletal bytes less what its offload
has taken to host, the K/V cache of the earlier pieces (two-level activation management), the
dK/dV accumulators in backward, one working block and, on the last stage, the classifier; host
bytes per node summed over the stages whose GPUs sit in the node.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache, partial
from typing import Callable

from memo_sim.policy.base import uses_memory_plan
from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.memo import memoised
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes, model_state_bytes
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.cost.optimizer_offload import host_state_bytes
from memo_sim.layout.alloc_conf import gpu_limit_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.baseline import caching_allocator_layer_report
from memo_sim.memplan.trace_gen import (_layer_backward_trace, layer_forward_trace, per_gpu_shard,
                                        static_plan_phase_bytes)
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.policy.base import Policy
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True, eq=False)
class MemoryBreakdown:
    model_states_bytes: float
    skeletal_resident_bytes: float  # kept on the GPU across layers (all layers, or layer inputs)
    rounding_buffer_bytes: float  # static skeletal buffers: rounding buffers, or the recompute buffer
    lse_bytes: float
    transient_peak_bytes: float  # the one used: planned arena (memo) or caching-allocator reserved (others)
    transient_planned_bytes: float  # static plan: max-live of one layer's requests (the planner reaches it)
    # caching-allocator model: reserved peak on the same requests (`transient_caching_allocator_bytes`), or how
    # to replay them where the candidate does not run on it (a memory-planned policy: read only by explain and
    # the JSON, so a cluster-scale query's thousands of MEMO alphas replay nothing until asked)
    transient_caching_allocator: float | Callable[[], float]
    layer_boundary_bytes: float  # the activation handed between layers, live beside a layer's transients
    classifier_peak_bytes: float
    peak_gpu_bytes: float
    gpu_capacity_bytes: float
    host_bytes_per_gpu: float  # raw offloaded bytes
    host_bytes_per_node: float  # pinned, as the host layout allocates them
    host_capacity_bytes: float
    # the part of ``rounding_buffer_bytes`` allocated at a layer's recompute and freed after its backward (full
    # recompute's buffer: `Policy.backward_buffer_bytes`): live beside a layer's backward, not beside the classifier
    backward_buffer_bytes: float = 0.0
    # a layer's forward and backward transients where they differ (a static plan: the arena in both, each phase's
    # unplaced tensors in its own, `memo_sim.memplan.trace_gen.static_plan_phase_bytes`); None: both are
    # ``transient_peak_bytes`` (the caching allocator keeps what it reserved from one phase to the next)
    transient_forward_bytes: float | None = None
    transient_backward_bytes: float | None = None

    @property
    def held_bytes(self) -> float:
        """What is live beside both sides of the peak: model states, kept activations, lse and the static buffers."""
        return (self.model_states_bytes + self.skeletal_resident_bytes + self.rounding_buffer_bytes
                - self.backward_buffer_bytes + self.lse_bytes)

    def phase_transient_bytes(self, phase: str) -> float:
        """A layer phase's transients (``fwd``; ``bwd`` or ``recompute``, which runs at the backward's start with the
        backward's arena and gradients): the larger of the two is ``transient_peak_bytes``."""
        v = self.transient_forward_bytes if phase == "fwd" else self.transient_backward_bytes
        return self.transient_peak_bytes if v is None else v

    def phase_working_bytes(self, phase: str) -> float:
        """What a layer phase holds beside the kept activations: its transients and the activation handed between
        layers (the schedules' ``L{i}.{phase}.working``)."""
        return self.phase_transient_bytes(phase) + self.layer_boundary_bytes

    def layer_side_bytes(self, transient: float | None = None) -> float:
        """A layer's side of the peak: its transients (``transient``, default the ones used), the activation handed
        between layers and the buffer the policy allocates for the backward."""
        t = self.transient_peak_bytes if transient is None else transient
        return t + self.layer_boundary_bytes + self.backward_buffer_bytes

    def peak_with(self, transient: float | None = None) -> float:
        """The peak, the larger of a layer's side and the classifier's beside what both hold, with a layer's
        transients at ``transient`` (default the ones used: ``peak_gpu_bytes``)."""
        return self.held_bytes + max(self.layer_side_bytes(transient), self.classifier_peak_bytes)

    @property
    def oom_by(self) -> float:
        return max(0.0, self.peak_gpu_bytes - self.gpu_capacity_bytes)

    @property
    def oohm_by(self) -> float:
        return max(0.0, self.host_bytes_per_node - self.host_capacity_bytes)

    @cached_property
    def transient_caching_allocator_bytes(self) -> float:
        v = self.transient_caching_allocator
        return float(v() if callable(v) else v)

    def _values(self) -> tuple:
        """Every field's value, the caching-allocator figure replayed where it was deferred."""
        return tuple(self.transient_caching_allocator_bytes if f.name == "transient_caching_allocator"
                     else getattr(self, f.name) for f in fields(self))

    def __eq__(self, other) -> bool:  # by value: a deferred figure equals the same figure computed
        if not isinstance(other, MemoryBreakdown):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    @property
    def over_share(self) -> float:
        """How far the plan is from fitting: each overflow (GPU memory, pinned host memory per node) as a share of its
        own capacity, the two added. Bytes over a GPU's 80 GiB and over a node's 1.6 TiB are not comparable as bytes,
        and `status` names one overflow only (OOM before OOHM), so a plan over both is farther than one over either by
        the same amount (a review: a ZeRO-0 row 75 GiB over the GPU and 1.11 TiB over the host ranked "closest" ahead
        of ZeRO-3 rows over the host alone by the same 1.11 TiB). A capacity of zero with bytes on it is infinitely
        over."""
        return (over_capacity_share(self.oom_by, self.gpu_capacity_bytes)
                + over_capacity_share(self.oohm_by, self.host_capacity_bytes))

    @cached_property  # read for every sort and filter of a query's candidates; the fields are frozen
    def status(self) -> str:
        """The plan file's status (`memo_sim.plan.contract.STATUSES`): OOM where the GPU overflows (whatever the host
        does: `oohm_by` and `over_share` keep the host's overflow), else OOHM where the pinned host memory does."""
        if self.oom_by > 0:
            return "OOM"
        if self.oohm_by > 0:
            return "OOHM"
        return "OK"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "transient_caching_allocator"}
        d["transient_caching_allocator_bytes"] = self.transient_caching_allocator_bytes
        d["status"] = self.status
        return d


def over_capacity_share(over: float, capacity: float) -> float:
    """``over`` bytes as a share of ``capacity`` (infinite over a capacity of zero; none over, zero)."""
    if over <= 0:
        return 0.0
    return over / capacity if capacity > 0 else float("inf")


def transient_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         policy: Policy | None = None) -> float:
    """Transient bytes of one layer's forward or backward on one GPU under a static plan (the
    larger phase): the arena of the tensors the runtime places plus the phase's tensors kernels and the
    caching allocator allocate beside it (`memo_sim.memplan.trace_gen.static_plan_phase_bytes`),
    from the level-1 request traces, the one place where a layer's transient tensors and their
    lifetimes are enumerated. Memoised per model, GPU shard and recompute fraction."""
    return max(transient_phase_bytes(model, layout, batch, seq, policy).values())


def transient_phase_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                          policy: Policy | None = None) -> dict[str, float]:
    """`transient_peak_bytes` of each phase, ``{"fwd": ..., "bwd": ...}``: the one arena (the phase that places the
    most) and the phase's own tensors beside it (`memo_sim.memplan.trace_gen.static_plan_phase_bytes`)."""
    frac = policy.recompute_fraction if policy is not None else 0.0
    return _transient_phases(model, per_gpu_shard(layout), batch, seq, frac)


@lru_cache(maxsize=1 << 14)
def _transient_phases(model: ModelConfig, shard: Layout, batch: int, seq: int, frac: float) -> dict[str, float]:
    """Shared between callers: read, never modify."""
    return static_plan_phase_bytes(layer_forward_trace(model, shard, batch, seq),
                                   _layer_backward_trace(model, shard, batch, seq, frac))


def memory_breakdown(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                     profile: HardwareProfile, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                     active_gpus_per_node: int | None = None) -> MemoryBreakdown:
    """Memoised: what depends only on (model, per-GPU shard, batch, seq, policy) -- skeletal bytes,
    level-1 traces, the caching-allocator replay, offloaded and pinned bytes per layer -- is
    computed once (`_shard_terms`); model states (DP and ZeRO) and the node's GPUs are arithmetic."""
    sk, resident, buffers, backward_buffer, planned, cached, classifier, host_layer, pinned_layer = _shard_terms(
        model, per_gpu_shard(layout), batch, seq, policy, profile, classifier_chunk_tokens)
    n = model.layers
    states = model_state_bytes(model, layout)
    lse_all = n * sum(b for _n, b in policy.kept_lse(sk))  # none where the recompute rebuilds it (`keeps_lse`)
    plan_phases = uses_memory_plan(policy, layout)
    transient = planned if plan_phases else cached
    phases = transient_phase_bytes(model, layout, batch, seq, policy) if plan_phases else {}
    # embedding output / final layer output (the next layer's input) is live beside a layer's work
    boundary = sk["input"]
    offloaded_layers = policy.offloaded_layers(n)
    optim_host = host_state_bytes(model, layout, model_gpu_params(model, layout))  # under optimizer offload
    host_gpu = offloaded_layers * host_layer + optim_host
    gpus_node = active_gpus_per_node or min(layout.gpus, profile.node_gpus)
    host_node = gpus_node * (offloaded_layers * pinned_layer + optim_host)
    mem = MemoryBreakdown(
        model_states_bytes=states, skeletal_resident_bytes=resident, rounding_buffer_bytes=buffers,
        lse_bytes=lse_all, transient_peak_bytes=transient, transient_planned_bytes=planned,
        transient_caching_allocator=cached, layer_boundary_bytes=boundary, classifier_peak_bytes=classifier,
        peak_gpu_bytes=0.0, gpu_capacity_bytes=gpu_limit_bytes(profile, layout.alloc_conf), host_bytes_per_gpu=host_gpu,
        host_bytes_per_node=host_node, host_capacity_bytes=profile.host_capacity(gpus_node),
        backward_buffer_bytes=backward_buffer, transient_forward_bytes=phases.get("fwd"),
        transient_backward_bytes=phases.get("bwd"))
    # the peak: the larger of a layer's side (with full recompute's buffer, allocated for the backward only) and the
    # classifier's, which runs before any backward (`MemoryBreakdown.peak_with`)
    return replace(mem, peak_gpu_bytes=mem.peak_with())


@memoised(maxsize=1 << 14)
def _shard_terms(model: ModelConfig, shard: Layout, batch: int, seq: int, policy: Policy,
                 profile: HardwareProfile, classifier_chunk_tokens: int) -> tuple:
    """The terms of `memory_breakdown` that one GPU's shard of the layer fixes (DP and ZeRO do
    not): skeletal bytes by role, the policy's resident and buffer bytes (and the part of them allocated for the
    backward only), the planned and the
    caching-allocator transient peak, the classifier's peak, raw and pinned host bytes per
    offloaded layer. Shared between callers: read, never modify."""
    sk = skeletal_bytes(model, shard, batch, seq)
    n = model.layers
    cached = partial(_caching_reserved, model, shard, batch, seq, policy)
    return (sk, policy.resident_bytes(sk, n), policy.buffer_bytes(sk), policy.backward_buffer_bytes(sk),
            transient_peak_bytes(model, shard, batch, seq, policy),
            cached if uses_memory_plan(policy, shard) else cached(),
            classifier_peak_bytes(model, shard, batch, seq, classifier_chunk_tokens,
                                  recompute_mtp=policy.recomputes_mtp),
            policy.offload_bytes(model, shard, batch, seq),
            policy.host_bytes_per_layer(model, shard, batch, seq, profile))


def _caching_reserved(model: ModelConfig, shard: Layout, batch: int, seq: int, policy: Policy) -> float:
    """The caching allocator's reserved peak on one layer's requests (`memo_sim.memplan.baseline`)."""
    return float(caching_allocator_layer_report(model, shard, batch, seq, policy).peak_reserved_bytes)


# ---------------------------------------------------------------------------------------------- SPPO
@dataclass(frozen=True)
class StageMemory:
    """Peak GPU memory of one pipeline stage under SPPO (one GPU of the stage) and where it falls."""

    stage: int
    breakdown: MemoryBreakdown  # skeletal_resident_bytes: kept rows + cached K/V + dK/dV accumulators at the peak
    kv_cache_bytes: float  # K/V of every cached piece, all of the stage's layers (the two-level cache)
    dkv_peak_bytes: float  # dK/dV accumulators of earlier pieces at their largest
    kept_bytes: float  # skeletal bytes the alphas leave on the GPU after the forward (K/V excluded)
    peak_at: str  # "fwd s3 L12", "bwd s0.1 L4", "classifier s7" ...
    host_bytes_per_gpu: float  # pinned host bytes one GPU of the stage holds at most

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.breakdown.to_dict().items()}
        d.update(stage=self.stage, kv_cache_bytes=self.kv_cache_bytes, dkv_peak_bytes=self.dkv_peak_bytes,
                 kept_bytes=self.kept_bytes, peak_at=self.peak_at, host_bytes_per_gpu_stage=self.host_bytes_per_gpu)
        return d


@dataclass(frozen=True)
class PipelineMemory:
    stages: list[StageMemory]
    host_bytes_per_node: float  # the fullest node's pinned host bytes

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda m: m.breakdown.peak_gpu_bytes)

    @property
    def breakdown(self) -> MemoryBreakdown:
        """The fullest stage's breakdown (host bytes: the fullest node's)."""
        return self.worst.breakdown

    @property
    def status(self) -> str:
        return self.breakdown.status

    def reason(self) -> str:
        """Why it does not fit, naming the stage and the unit (empty when it fits)."""
        from memo_sim.units import fmt_bytes

        b, w = self.breakdown, self.worst
        if b.status == "OOM":  # the host's overflow too, where there is one (the status names the GPU's only)
            host = (f"; pinned host too: {fmt_bytes(b.host_bytes_per_node)} per node of "
                    f"{fmt_bytes(b.host_capacity_bytes)}" if b.oohm_by > 0 else "")
            return (f"OOM on stage {w.stage} at {w.peak_at}: {fmt_bytes(b.peak_gpu_bytes)} of "
                    f"{fmt_bytes(b.gpu_capacity_bytes)} (K/V cache {fmt_bytes(w.kv_cache_bytes)}, dK/dV "
                    f"{fmt_bytes(w.dkv_peak_bytes)}, kept activations {fmt_bytes(w.kept_bytes)}){host}")
        if b.status == "OOHM":
            return (f"OOHM: {fmt_bytes(b.host_bytes_per_node)} pinned per node of "
                    f"{fmt_bytes(b.host_capacity_bytes)}")
        return ""

    def to_dict(self) -> dict:
        return {"status": self.status, "host_bytes_per_node": self.host_bytes_per_node,
                "worst_stage": self.worst.stage, "stages": [m.to_dict() for m in self.stages]}


def sppo_unit_working_bytes(model: ModelConfig, layout: Layout, batch: int, tokens: int) -> tuple[float, float, float]:
    """(transient reserved peak, boundary activation, classifier peak) of one unit of ``tokens``
    tokens on one GPU of a stage: the caching allocator's reserved peak on one layer's requests
    at that length (SPPO's transients run on PyTorch's allocator; one arena sized for the
    stage's longest piece serves every unit), the layer input handed between layers, and the
    chunked classifier."""
    from memo_sim.cost.sppo import stage_gpu_shard

    shard = stage_gpu_shard(layout)
    cached = float(caching_allocator_layer_report(model, shard, batch, tokens, None).peak_reserved_bytes)
    boundary = skeletal_bytes(model, shard, batch, tokens)["input"]
    return cached, boundary, classifier_peak_bytes(model, shard, batch, tokens)


def sppo_memory(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                profile: HardwareProfile) -> PipelineMemory:
    """Peak GPU memory per stage of an SPPO plan and pinned host memory per node, by walking each
    stage's units as the pipeline schedule runs them (`memo_sim.engine.schedules.sppo`), assuming every
    offload is done by the end of the next unit's forward (the rounding-buffer rule guarantees it)
    and each prefetch runs beside the backward of the unit after it.

    Per unit (piece k through layer j of the stage): its skeletal bytes (+ lse) are allocated at
    its forward; alpha_k of the offloadable rows leave when its copy ends; they come back when its
    prefetch starts; everything goes after its backward. The backward of the stage's last piece
    allocates, layer by layer, the dK/dV accumulators of every earlier piece, each freed after
    that piece's backward. One working block (transients + the activation handed between layers)
    per running unit; the last stage also runs the classifier per piece and keeps the final hidden
    state's gradient until the piece's backward."""
    from memo_sim.cost.sppo import kv_cache_bytes, stage_gpu_shard, stage_layers, stage_model_state_bytes
    from memo_sim.layout.parallel import node_stage_gpus
    from memo_sim.policy.rounding_buffers import offloaded_layer_count

    shard = stage_gpu_shard(layout)
    stage_pieces = policy.stage_pieces(model, layout, batch)
    layers = stage_layers(model.layers, layout.pp)
    out: list[StageMemory] = []
    dt = DTYPE_BYTES[model.dtype]
    scheme, rounding = layout.host_pool, profile.host.pinned_rounding
    unit_cache: dict[tuple, object] = {}

    def ub(piece, cached_kv: bool, offloaded: bool):
        key = (piece.sub, piece.tokens, cached_kv, offloaded)
        v = unit_cache.get(key)
        if v is None:
            v = unit_cache[key] = policy.shard_unit_bytes(model, shard, batch, piece, cached_kv, scheme, rounding,
                                                          offloaded)
        return v

    def walk(pieces, n_l: int, last_stage: bool, states: float) -> tuple:
        """One stage's walk (module docs): what it gives depends on these only, so the stages that share them (a
        pipeline's middle stages) walk once."""
        n_k = len(pieces)
        n_u = n_k * n_l
        longest = max(p.tokens for p in pieces)
        transient, boundary, classifier = sppo_unit_working_bytes(model, layout, batch, longest)
        work = transient + boundary
        ub_off = [ub(p, k < n_k - 1, True) for k, p in enumerate(pieces)]
        ub_keep = [ub(p, k < n_k - 1, False) for k, p in enumerate(pieces)]
        kv_piece = [u.kv for u in ub_keep]
        dgrad_piece = [shard_tokens_bytes(shard, batch, p.tokens, model.hidden, dt) for p in pieces]
        n_off = offloaded_layer_count(n_u)
        # per unit: (skeletal, lse, offload) in forward order
        sk_u = [0.0] * n_u
        lse_u = [0.0] * n_u
        off_u = [0.0] * n_u
        for u in range(n_u):
            b = (ub_off if u < n_off else ub_keep)[u // n_l]
            sk_u[u], lse_u[u], off_u[u] = b.skeletal, b.lse, b.offload
        skel = lse = dkv = dgrad = 0.0
        peak, where, snap = -1.0, None, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        for u in range(n_u):  # forward
            skel += sk_u[u]
            lse += lse_u[u]
            tot = states + skel + lse + dgrad + work
            if tot > peak:
                peak, where, snap = tot, ("fwd", u), (skel, lse, 0.0, dgrad, work, 0.0)
            if u > 0:
                skel -= off_u[u - 1]
            if last_stage and u % n_l == n_l - 1:
                tot = states + skel + lse + dgrad + classifier
                if tot > peak:
                    peak, where, snap = tot, ("classifier", u), (skel, lse, 0.0, dgrad, 0.0, classifier)
                dgrad += dgrad_piece[u // n_l]
        if n_u > 0:
            skel -= off_u[n_u - 1]
        kv_all = sum(kv_piece[:-1]) * n_l
        kept = skel - kv_all  # after the forward: kept rows of every unit (K/V cache aside)
        dkv_peak = 0.0
        dkv_last = kv_cache_bytes(model, shard, batch, pieces[-1].start) if n_k > 1 else 0.0
        for v in range(n_u - 1, -1, -1):  # backward
            k, j = divmod(v, n_l)
            if 0 < v <= n_off:  # prefetch(v-1) runs beside this backward
                skel += off_u[v - 1]
            if last_stage and j == n_l - 1:
                dgrad -= dgrad_piece[k]
            if k == n_k - 1:
                dkv += dkv_last
                if dkv > dkv_peak:
                    dkv_peak = dkv
            tot = states + skel + lse + dkv + dgrad + work
            if tot > peak:
                peak, where, snap = tot, ("bwd", v), (skel, lse, dkv, dgrad, work, 0.0)
            skel -= sk_u[v]
            lse -= lse_u[v]
            if k < n_k - 1:
                dkv -= kv_piece[k]
        host_gpu = sum(ub_off[u // n_l].host_block for u in range(n_off))
        return (peak, where, snap, transient, boundary, kv_all, dkv_peak, kept, host_gpu, sum(off_u[:n_off]))

    walks: dict[tuple, tuple] = {}
    for s, pieces in enumerate(stage_pieces):
        n_l = len(layers[s])
        states = stage_model_state_bytes(model, layout, s)
        key = (tuple((p.sub, p.part, p.parts, p.start, p.end) for p in pieces), n_l, s == layout.pp - 1, states)
        if key not in walks:
            walks[key] = walk(pieces, n_l, s == layout.pp - 1, states)
        peak, (phase, u), snap, transient, boundary, kv_all, dkv_peak, kept, host_gpu, host_per_gpu = walks[key]
        k, j = divmod(u, n_l)
        at = f"classifier {pieces[k].tag()}" if phase == "classifier" else f"{phase} {pieces[k].tag()} L{layers[s][j]}"
        sk_p, lse_p, dkv_p, dgrad_p, work_p, cls_p = snap
        bd = MemoryBreakdown(
            model_states_bytes=states, skeletal_resident_bytes=sk_p + dkv_p + dgrad_p,
            rounding_buffer_bytes=0.0, lse_bytes=lse_p, transient_peak_bytes=transient if work_p else 0.0,
            transient_planned_bytes=transient, transient_caching_allocator=transient,
            layer_boundary_bytes=boundary if work_p else 0.0, classifier_peak_bytes=cls_p,
            peak_gpu_bytes=peak, gpu_capacity_bytes=gpu_limit_bytes(profile, layout.alloc_conf),
            host_bytes_per_gpu=host_per_gpu, host_bytes_per_node=0.0,
            host_capacity_bytes=profile.host_capacity(min(layout.gpus, profile.node_gpus)))
        out.append(StageMemory(s, bd, kv_all, dkv_peak, max(0.0, kept), at, host_gpu))
    per_node = node_stage_gpus(layout, profile.node_gpus)
    host_node = max(sum(n * out[st].host_bytes_per_gpu for st, n in stages.items()) for stages in per_node.values())
    out = [replace(m, breakdown=replace(m.breakdown, host_bytes_per_node=host_node)) for m in out]
    return PipelineMemory(out, host_node)


def sppo_host_stages(model: ModelConfig, layout: Layout, batch: int, policy: Policy,
                     profile: HardwareProfile) -> list[tuple[int, int, int, float]]:
    """Per stage of an SPPO plan: (layers, subsequences, offloaded units, pinned host bytes one GPU of the stage
    holds): the units (subsequence x layer) in schedule order, all but the stage's last `offloaded_layer_count`
    keep out offloaded, each at its subsequence's alpha (`Policy.shard_unit_bytes`). What `sppo_memory` walks to,
    without the GPU walk; `sppo_host_bytes_per_node` and the what-if's words (`memo_sim.search.candidate`) read it."""
    from memo_sim.cost.sppo import stage_gpu_shard, stage_layers
    from memo_sim.policy.rounding_buffers import offloaded_layer_count

    shard = stage_gpu_shard(layout)
    scheme, rounding = layout.host_pool, profile.host.pinned_rounding
    n_l = len(stage_layers(model.layers, layout.pp)[0])
    out = []
    for pieces in policy.stage_pieces(model, layout, batch):
        n_k = len(pieces)
        n_off = offloaded_layer_count(n_k * n_l)
        out.append((n_l, n_k, n_off, sum(policy.shard_unit_bytes(model, shard, batch, pieces[k], k < n_k - 1, scheme,
                                                                  rounding).host_block
                                         * max(0, min(n_l, n_off - k * n_l)) for k in range(n_k))))
    return out


def sppo_host_bytes_per_node(model: ModelConfig, layout: Layout, batch: int, policy: Policy,
                             profile: HardwareProfile) -> float:
    """The fullest node's pinned host bytes of an SPPO plan (what `sppo_memory` reports, without the
    GPU walk: the planner's host-memory bisection asks for it many times)."""
    from memo_sim.layout.parallel import node_stage_gpus

    per_stage = [b for _l, _k, _o, b in sppo_host_stages(model, layout, batch, policy, profile)]
    per_node = node_stage_gpus(layout, profile.node_gpus)
    return max(sum(n * per_stage[st] for st, n in stages.items()) for stages in per_node.values())


def shard_tokens_bytes(layout: Layout, batch: int, tokens: int, width: int, dtype_bytes: int) -> float:
    """Bytes of a ``width``-wide, sequence-sharded activation of ``tokens`` tokens on one GPU."""
    return batch * tokens / layout.seq_split * width * dtype_bytes / (layout.tp if layout.sp else 1)
