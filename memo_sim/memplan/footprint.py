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
    # the layers' saved weight copies and eager ops' tensors (`Policy.kept_extras`) kept beside their skeletal tensors
    resident = policy.resident_bytes(sk, n) + n * sum(b for _n, b in policy.kept_extras(sk))
    return (sk, resident, policy.buffer_bytes(sk), policy.backward_buffer_bytes(sk),
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


@dataclass(frozen=True)
class StageUnits:
    """One SPPO stage's units (piece k through layer j, unit u = k·n_l + j, in forward order) as `sppo_stage_walk`
    reads them: per piece, its unit's skeletal bytes (lse aside), lse and offloaded bytes, each as (offloaded,
    kept) values (the first ``n_off`` units offload, the rest keep everything: `offloaded_layer_count`); its K/V
    (an earlier piece's, cached until its dK/dV is done) and the gradient of its final hidden state (the last
    stage's, held from the classifier to the piece's backward); the dK/dV accumulators the last piece's backward
    allocates per layer (``dkv_last``)."""

    n_l: int
    n_off: int
    skeletal: tuple[list[float], list[float]]
    lse: tuple[list[float], list[float]]
    offload: tuple[list[float], list[float]]
    kv: list[float]
    dgrad: list[float]
    dkv_last: float

    def unit_values(self, per_piece: tuple[list[float], list[float]]):
        """A per-piece (offloaded, kept) pair as one value per unit."""
        import numpy as np

        off, keep = (np.repeat(np.asarray(v, dtype=np.float64), self.n_l) for v in per_piece)
        return np.where(np.arange(off.size) < self.n_off, off, keep)

    def first_units_sum(self, per_piece: list[float]) -> float:
        """A per-piece value summed over the offloaded units (the first ``n_off``), one after the other."""
        import numpy as np

        if self.n_off == 0:
            return 0.0
        return float(np.cumsum(np.repeat(np.asarray(per_piece, dtype=np.float64), self.n_l)[:self.n_off])[-1])


def sppo_stage_walk(units: StageUnits, states: float, work: float, classifier: float,
                    last_stage: bool) -> tuple[float, tuple[str, int], tuple, float, float]:
    """Peak bytes of one SPPO stage over its schedule (`sppo_memory`'s docs): (peak, (phase, unit), the peak's
    (skeletal, lse, dK/dV, final-hidden gradients, working block, classifier) bytes, the skeletal bytes left after
    the forward, the largest dK/dV accumulators held).

    The schedule, unit by unit: forward u allocates its skeletal bytes and lse (a peak candidate with the working
    block), then unit u-1's offload has left; on the last stage the classifier follows a piece's last layer (a
    candidate with the classifier's peak instead of the working block) and its gradient stays. After the forward the
    last unit's offload leaves. Backward v (last first): unit v-1's prefetch arrives (an offloaded one), the
    classifier's gradient of the piece is consumed at its last layer, the last piece's backward adds one layer's
    dK/dV accumulators; a candidate with the working block; then v's bytes go, and an earlier piece's K/V cache with
    it. Every running total is one running sum of these steps in this order (``numpy.cumsum`` adds one after the
    other, as a loop would), and the peak is the first largest candidate."""
    import numpy as np

    n_l, n_off = units.n_l, units.n_off
    sk, lse, off = (units.unit_values(v) for v in (units.skeletal, units.lse, units.offload))
    n_u = sk.size
    n_k = n_u // n_l
    piece = np.arange(n_u) // n_l
    head = (np.arange(n_u) % n_l == n_l - 1) if last_stage else np.zeros(n_u, dtype=bool)
    dgrad_u = np.asarray(units.dgrad, dtype=np.float64)[piece]
    kv_u = np.asarray(units.kv, dtype=np.float64)[piece]
    # steps: forward (n_u x 5: +skeletal, [candidate], -previous offload, [classifier], +hidden grad), one step
    # (the last offload), backward (n_u x 5 in reverse: +prefetch, -hidden grad, +dK/dV, [candidate], -unit)
    f_skel, f_lse, f_dg = (np.zeros((n_u, 5)) for _ in range(3))
    f_skel[:, 0] = sk
    f_skel[1:, 2] = -off[:-1]
    f_lse[:, 0] = lse
    f_dg[:, 4] = np.where(head, dgrad_u, 0.0)
    rev = slice(None, None, -1)
    b_skel, b_lse, b_dg, b_dkv = (np.zeros((n_u, 5)) for _ in range(4))
    v = np.arange(n_u)[rev]
    prefetch = (v > 0) & (v <= n_off)
    b_skel[:, 0] = np.where(prefetch, off[np.maximum(v - 1, 0)], 0.0)
    b_skel[:, 4] = -sk[rev]
    b_lse[:, 4] = -lse[rev]
    b_dg[:, 1] = -np.where(head, dgrad_u, 0.0)[rev]
    last_piece = piece[rev] == n_k - 1
    b_dkv[:, 2] = np.where(last_piece, units.dkv_last, 0.0)
    b_dkv[:, 4] = -np.where(last_piece, 0.0, kv_u[rev])

    def run(f, mid, b):
        return np.cumsum(np.concatenate([f.ravel(), [mid], b.ravel()]))

    skel = run(f_skel, -off[-1] if n_u else 0.0, b_skel)
    lse_t = run(f_lse, 0.0, b_lse)
    dg = run(f_dg, 0.0, b_dg)
    dkv = np.cumsum(np.concatenate([np.zeros(5 * n_u + 1), b_dkv.ravel()]))
    fwd = np.arange(n_u) * 5  # a unit's first step
    bwd = 5 * n_u + 1 + np.arange(n_u) * 5
    f_at, c_at, b_at = fwd, fwd + 2, bwd + 2  # the totals each candidate reads (after these steps)
    cand_f = states + skel[f_at] + lse_t[f_at] + dg[f_at] + work
    cand_c = np.where(head, states + skel[c_at] + lse_t[c_at] + dg[c_at] + classifier, -np.inf)
    cand_b = states + skel[b_at] + lse_t[b_at] + dkv[b_at] + dg[b_at] + work
    order = np.concatenate([np.stack([cand_f, cand_c], axis=1).ravel(), cand_b])
    i = int(np.argmax(order))
    if i < 2 * n_u:
        u, classifier_peak = divmod(i, 2)
        at = c_at[u] if classifier_peak else f_at[u]
        where = ("classifier" if classifier_peak else "fwd", int(u))
        snap = (float(skel[at]), float(lse_t[at]), 0.0, float(dg[at]), 0.0 if classifier_peak else work,
                classifier if classifier_peak else 0.0)
    else:
        j = i - 2 * n_u
        at = b_at[j]
        where = ("bwd", int(v[j]))
        snap = (float(skel[at]), float(lse_t[at]), float(dkv[at]), float(dg[at]), work, 0.0)
    dkv_peak = max(0.0, float(dkv[b_at][last_piece].max())) if last_piece.any() and n_k > 1 else 0.0
    return float(order[i]), where, snap, float(skel[5 * n_u]), dkv_peak


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
    return SppoMemoryWalk(model, layout, batch, policy, profile).memory(policy)


class SppoMemoryWalk:
    """`sppo_memory` for one SPPO partition (``policy``'s bounds, partition and multiplexing) at any offload ratios:
    what does not depend on the alphas (the stages' pieces, model states, working blocks, the units' skeletal
    bytes, lse, K/V and kept rows) is found once here, and `memory` adds the offloaded units' copies for the
    alphas it is given (SPPO's alpha search asks for one partition at up to a dozen thresholds:
    `memo_sim.search.sppo.alphas.solve_alphas`)."""

    def __init__(self, model: ModelConfig, layout: Layout, batch: int, policy: Policy, profile: HardwareProfile):
        from memo_sim.cost.sppo import kv_cache_bytes, stage_gpu_shard, stage_layers, stage_model_state_bytes
        from memo_sim.policy.rounding_buffers import offloaded_layer_count
        from memo_sim.policy.sppo import unit_rows

        self.model, self.layout, self.batch, self.profile = model, layout, batch, profile
        self.partition = (policy.bounds, policy.partition, policy.multiplex)
        self.shard = shard = stage_gpu_shard(layout)
        self.pieces = policy.stage_pieces(model, layout, batch)
        self.layers = stage_layers(model.layers, layout.pp)
        self.scheme, self.rounding = layout.host_pool, profile.host.pinned_rounding
        dt = DTYPE_BYTES[model.dtype]
        self.states = [stage_model_state_bytes(model, layout, s) for s in range(len(self.pieces))]
        # the stages that share their pieces, layers, place and states (a pipeline's middle stages) walk once
        self.walk_of: list[int] = []
        self.walks: list[tuple] = []  # (pieces, n_l, last stage, states, working bytes, kept-unit bytes)
        seen: dict[tuple, int] = {}
        for s, pieces in enumerate(self.pieces):
            n_l, last = len(self.layers[s]), s == layout.pp - 1
            key = (tuple((p.sub, p.part, p.parts, p.start, p.end) for p in pieces), n_l, last, self.states[s])
            if key not in seen:
                seen[key] = len(self.walks)
                n_k = len(pieces)
                working = sppo_unit_working_bytes(model, layout, batch, max(p.tokens for p in pieces))
                keep = [policy.shard_unit_bytes(model, shard, batch, p, k < n_k - 1, self.scheme, self.rounding,
                                                False) for k, p in enumerate(pieces)]
                rows = [unit_rows(model, shard, batch, p.tokens, k < n_k - 1) for k, p in enumerate(pieces)]
                units = StageUnits(
                    n_l=n_l, n_off=offloaded_layer_count(n_k * n_l), skeletal=([], [b.skeletal for b in keep]),
                    lse=([], [b.lse for b in keep]), offload=([], [b.offload for b in keep]),
                    kv=[b.kv for b in keep],
                    dgrad=[shard_tokens_bytes(shard, batch, p.tokens, model.hidden, dt) for p in pieces],
                    dkv_last=kv_cache_bytes(model, shard, batch, pieces[-1].start) if n_k > 1 else 0.0)
                self.walks.append((pieces, n_l, last, self.states[s], working, units, rows))
            self.walk_of.append(seen[key])

    def _walk(self, policy: Policy, pieces, n_l: int, last_stage: bool, states: float, working: tuple,
              units: StageUnits, rows: list) -> tuple:
        """One stage's walk (`sppo_stage_walk`) at ``policy``'s alphas: an offloaded unit's skeletal bytes and lse
        are a kept one's; its copy is alpha_i of its rows (`memo_sim.policy.sppo.UnitRows`)."""
        transient, boundary, classifier = working
        alphas, scheme, rounding = policy.alphas, self.scheme, self.rounding
        off = [r.copies(float(alphas[p.sub]), scheme, rounding) for p, r in zip(pieces, rows)]
        units = replace(units, skeletal=(units.skeletal[1], units.skeletal[1]), lse=(units.lse[1], units.lse[1]),
                        offload=([c for c, _h in off], units.offload[1]))
        peak, where, snap, skel_end, dkv_peak = sppo_stage_walk(units, states, transient + boundary, classifier,
                                                                last_stage)
        kv_all = sum(units.kv[:-1]) * n_l
        kept = skel_end - kv_all  # after the forward: kept rows of every unit (K/V cache aside)
        host_gpu = units.first_units_sum([h for _c, h in off])
        return (peak, where, snap, transient, boundary, kv_all, dkv_peak, kept, host_gpu,
                units.first_units_sum(units.offload[0]))

    def memory(self, policy: Policy) -> PipelineMemory:
        """The plan's memory (`sppo_memory`) at ``policy``'s alphas; ``policy`` has this walk's partition."""
        from memo_sim.layout.parallel import node_stage_gpus

        if (policy.bounds, policy.partition, policy.multiplex) != self.partition:
            raise ValueError("SppoMemoryWalk.memory: the policy's partition is not the one this walk was made for")
        layout, profile, layers = self.layout, self.profile, self.layers
        done = [self._walk(policy, *w) for w in self.walks]
        out: list[StageMemory] = []
        for s, pieces in enumerate(self.pieces):
            n_l, states = len(layers[s]), self.states[s]
            peak, (phase, u), snap, transient, boundary, kv_all, dkv_peak, kept, host_gpu, host_per_gpu = \
                done[self.walk_of[s]]
            k, j = divmod(u, n_l)
            at = (f"classifier {pieces[k].tag()}" if phase == "classifier"
                  else f"{phase} {pieces[k].tag()} L{layers[s][j]}")
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
