"""SPPO's planner: the offload ratios, the analytic pipeline estimate, the heuristic (SP, PP, N)
solver of the paper's section 6.1 and an exhaustive search over the same space.

**Offload ratios** (`solve_alphas`, paper sec. 5.2): alpha_i·A_i = M_threshold with A_i subsequence
i's offloadable bytes per layer and GPU (its skeletal bytes less the cached K/V). The threshold
is first the overlap one, M_threshold = B·(T_min − latency) with B one GPU's share of the host
links while every GPU of the node copies and T_min the shortest per-layer forward of a
subsequence (so every unit's copy hides under the next unit's compute). Where the stage then
does not fit the GPU, M_threshold rises (bisection) until it does (copies then show); where the
node's pinned host memory overflows it falls. ``binding`` says which limit set it.

**Analytic estimate** (`estimate_sppo`, tier 1): per stage and piece the forward time is the sum
over the stage's layers of max(forward, offload) (the rounding-buffer rule hides a unit's copy
under the next unit) plus the embedding (stage 0) or the classifier (last stage); backward
likewise with the prefetch. The pipeline is the recurrence over the (stage, piece) grid: a
piece starts after the previous piece of its stage and after the P2P send of every overlapping
piece of the stage before it (forward) or after it (backward, pieces in reverse). The stage
then adds its last gradient bucket and its optimizer step. No link contention; tier 2 replays
the op graph in the event simulator (`memo_sim.engine.schedules.sppo`).

**Heuristic solver** (`heuristic_choice`, sec. 6.1): SP (the TP+SP degree) and PP inside one
node (SP x PP <= GPUs per node), N such that each device's share of a subsequence, l/SP, lies in
the efficient range of 2K-16K tokens (powers of two; the nearest one where none does), the
FLOPs-balanced partition, multiplexed partitioning where the bubble ratio (p − 1)/N exceeds 1/8
(the paper's workflow step 3; pipelines of at most 8 stages); of these the fastest by the analytic
estimate that fits. Where
nothing inside a node fits, PP grows across nodes with SP = a whole node.

**Exhaustive search** (`exhaustive_search`): every pipeline layout (TP+SP x PP x DP, ZeRO 0/1) x
N in powers of two (each device's share of a subsequence at least 1K tokens) x partition
(flops, length) x multiplexing (off, on; on only up to 8 stages, where a split subsequence's
pieces stay few): each point's estimate with the overlap-threshold
alphas is a lower bound on its final estimate (larger alphas only add copy time), so points are
solved in order of that bound until the best fitting one is proven and ``keep`` fitting points
are known (branch and bound; the what-if then simulates the best few).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, replace

from memo_sim.cost.boundary import boundary_times
from memo_sim.tp import tp_flavour
from memo_sim.cost.sppo import (
    EFFICIENT_TOKENS_PER_DEVICE, PARTITIONS, bubble_ratio, kv_cache_bytes, p2p_bytes, p2p_link, piece_timer,
    stage_grad_sync, stage_layers, stage_model_state_bytes, stage_optimizer_time,
)
from memo_sim.cost.transfer import host_bandwidth_per_gpu
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout, enumerate_pipeline_layouts
from memo_sim.memplan.footprint import PipelineMemory, sppo_host_bytes_per_node, sppo_memory
from memo_sim.model.config import ModelConfig
from memo_sim.model.flops import mfu, tgs
from memo_sim.policy.rounding_buffers import offloaded_layer_count
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.candidate import Candidate
from memo_sim.search.estimate import IterationEstimate, LayerTimes

MIN_TOKENS_PER_DEVICE = 1024  # exhaustive grid: no subsequence share below this
MAX_SUBSEQS = 512
MULTIPLEX_BUBBLE = 1 / 8  # the heuristic multiplexes above this bubble ratio
MULTIPLEX_MAX_PP = 8  # the search multiplexes pipelines of at most this many stages (the generator any)
BOUND_QUANTUM = 0.01  # the bounding pass prices pieces on a 1 % length grid ...
BOUND_SLACK = 0.01  # ... and takes 1 % off, so its value stays below the point's estimate


@dataclass(frozen=True)
class AlphaChoice:
    alphas: tuple[float, ...]
    threshold_bytes: float
    binding: str  # overlap | gpu_memory | host_memory | none
    note: str


@dataclass
class SppoPoint:
    """One solved point of the (SP, PP, N, partition, multiplex) space."""

    layout: Layout
    policy: Sppo
    estimate: IterationEstimate
    memory: PipelineMemory
    alpha: AlphaChoice
    lower_bound_s: float  # the estimate with the overlap-threshold alphas
    grid: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.memory.status

    @property
    def tgs(self) -> float:
        return self.estimate.tgs

    @property
    def over_bytes(self) -> float:
        b = self.memory.breakdown
        return b.oom_by if b.status == "OOM" else b.oohm_by

    def key(self) -> tuple:
        return (self.layout.tp, self.layout.pp, self.layout.dp, self.layout.zero, self.policy.subseqs,
                self.policy.partition, self.policy.multiplex)

    def label(self) -> str:
        return f"{self.layout.label()} {self.policy.label()}"

    def to_dict(self) -> dict:
        return {"layout": self.layout.label(), "sp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp,
                "zero": self.layout.zero, "subseqs": self.policy.subseqs, "partition": self.policy.partition,
                "multiplex": self.policy.multiplex, "status": self.status, "reason": self.memory.reason(),
                "analytic_iteration_s": self.estimate.iteration_s, "analytic_tgs_tokens_per_gpu_s": self.tgs,
                "analytic_mfu": self.estimate.mfu, "peak_gpu_bytes": self.memory.breakdown.peak_gpu_bytes,
                "worst_stage": self.memory.worst.stage, "peak_at": self.memory.worst.peak_at,
                "host_bytes_per_node": self.memory.host_bytes_per_node, "alpha_binding": self.alpha.binding,
                "threshold_bytes": self.alpha.threshold_bytes, "alphas": list(self.alpha.alphas),
                "bounds": list(self.policy.bounds), "bubble_ratio": bubble_ratio(self.layout.pp, self.policy.subseqs)}


# ------------------------------------------------------------------------------------------ timing
def _active(layout: Layout, profile: HardwareProfile) -> int:
    return min(layout.gpus, profile.node_gpus)


def estimate_sppo(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Sppo,
                  profile: HardwareProfile, quantum: float = 0.0) -> tuple[IterationEstimate, dict]:
    """Tier 1 for an SPPO plan (module docs): the (stage, piece) recurrence. Returns the estimate
    and the grid's details (per-stage forward / backward end, busy time). ``quantum``: price
    the pieces' non-attention ops on a geometric length grid (`memo_sim.cost.sppo.piece_timer`;
    the search's bounding pass)."""
    shard = replace(layout, pp=1, dp=1, zero=0)
    pieces = policy.stage_pieces(model, layout, batch)
    layers = stage_layers(model.layers, layout.pp)
    active = _active(layout, profile)
    sync = stage_grad_sync(model, layout, profile)
    pp = layout.pp
    tf: list[list[float]] = []
    tb: list[list[float]] = []
    exposed = 0.0
    mid = None
    bts: dict[int, object] = {}
    per_piece: dict[tuple, tuple] = {}
    bw_o = host_bandwidth_per_gpu(profile, "d2h", active)
    bw_p = host_bandwidth_per_gpu(profile, "h2d", active)
    lat = float(profile.host_link.latency)
    n_l = len(layers[0])
    timer = piece_timer(model, shard, batch, profile, quantum)
    starts_of = [[p.start for p in ps] for ps in pieces]
    base_rows: dict[tuple, tuple] = {}
    for s in range(pp):
        ps = pieces[s]
        n_k = len(ps)
        n_off_units = offloaded_layer_count(n_l * n_k)
        if 0 < s < pp - 1 and sync.layer_gather == 0:
            sig = (ps[0].start, ps[-1].start, n_k, id(ps) if n_k < 3 else ps[1].start)
            hit = base_rows.get(sig)
            if hit is not None and starts_of[s] == starts_of[hit[3]]:
                tf.append(list(hit[0]))
                tb.append(list(hit[1]))
                exposed += hit[2]
                continue
        exposed_before = exposed
        rowf, rowb = [], []
        for k, pc in enumerate(ps):
            n_off = max(0, min(n_l, n_off_units - k * n_l))
            key = (pc.sub, pc.start, pc.end, k < n_k - 1, n_off)
            hit = per_piece.get(key)
            if hit is None:
                f, b = timer(pc.start, pc.tokens)
                off = policy.offload_bytes_of(model, shard, batch, pc, k < n_k - 1)
                o = (lat + off / bw_o) if off > 0 else 0.0
                p = (lat + off / bw_p) if off > 0 else 0.0
                hit = per_piece[key] = (
                    n_off * max(f, o) + (n_l - n_off) * f, n_off * max(b, p) + (n_l - n_off) * b,
                    n_off * (max(0.0, o - f) + max(0.0, p - b)), f, b, o, p)
            t_f, t_b, exp, f, b, o, p = hit
            exposed += exp
            if s == 0 or s == pp - 1:
                bt = bts.get(pc.tokens)
                if bt is None:
                    bt = bts[pc.tokens] = boundary_times(model, shard, batch, pc.tokens, profile)
                if s == 0:
                    t_f += bt.embedding_fwd
                    t_b += bt.embedding_bwd
                if s == pp - 1:
                    t_f += bt.classifier
            if sync.layer_gather > 0 and k == 0:
                t_f += n_l * max(0.0, sync.layer_gather - f)
            rowf.append(t_f)
            rowb.append(t_b)
            if s == 0 and k == n_k // 2:
                mid = LayerTimes(f, b, 0.0, o if n_off else 0.0, p if n_off else 0.0)
        tf.append(rowf)
        tb.append(rowb)
        if 0 < s < pp - 1 and sync.layer_gather == 0:
            base_rows[(ps[0].start, ps[-1].start, n_k, id(ps) if n_k < 3 else ps[1].start)] = (
                rowf, rowb, exposed - exposed_before, s)

    per_token = p2p_bytes(model, layout, batch, 1)
    links = [profile.internode if p2p_link(layout, profile, s) == "internode" else profile.nvlink
             for s in range(max(0, pp - 1))]
    hop_lat = [float(lk.latency) for lk in links]
    hop_bw = [float(lk.bandwidth) for lk in links]

    def hop(s: int, tokens: int) -> float:  # `memo_sim.cost.sppo.p2p_time`, linear in the tokens
        return hop_lat[s] + tokens * per_token / hop_bw[s]

    def overlapping(stage: int, a: int, b: int) -> range:
        starts = starts_of[stage]
        return range(max(0, bisect_right(starts, a) - 1), bisect_left(starts, b))

    same = [s > 0 and starts_of[s] == starts_of[s - 1] for s in range(pp)]  # no multiplexed split between
    fend: list[list[float]] = []
    for s in range(pp):
        row, t = [], 0.0
        if s == 0:
            for x in tf[0]:
                t += x
                row.append(t)
        elif same[s]:  # piece k waits for piece k of the stage before
            prev, lat, bw = fend[s - 1], hop_lat[s - 1], hop_bw[s - 1]
            for k, pc in enumerate(pieces[s]):
                ready = prev[k] + lat + pc.tokens * per_token / bw
                t = (t if t > ready else ready) + tf[s][k]
                row.append(t)
        else:
            up = pieces[s - 1]
            for k, pc in enumerate(pieces[s]):
                ready = max((fend[s - 1][q] + hop(s - 1, up[q].tokens) for q in overlapping(s - 1, pc.start, pc.end)),
                            default=0.0)
                t = max(t, ready) + tf[s][k]
                row.append(t)
        fend.append(row)
    bend: list[list[float]] = [[0.0] * len(pieces[s]) for s in range(pp)]
    stage_end = [0.0] * pp
    for s in range(pp - 1, -1, -1):
        t = fend[s][-1]
        row, tbs = bend[s], tb[s]
        if s == pp - 1:
            for k in range(len(pieces[s]) - 1, -1, -1):
                ready = fend[s][k]
                t = (t if t > ready else ready) + tbs[k]
                row[k] = t
        elif same[s + 1]:
            nxt, lat, bw = bend[s + 1], hop_lat[s], hop_bw[s]
            ps = pieces[s]
            for k in range(len(ps) - 1, -1, -1):
                ready = nxt[k] + lat + ps[k].tokens * per_token / bw
                t = (t if t > ready else ready) + tbs[k]
                row[k] = t
        else:
            dn = pieces[s + 1]
            for k in range(len(pieces[s]) - 1, -1, -1):
                pc = pieces[s][k]
                ready = max((bend[s + 1][q] + hop(s, dn[q].tokens) for q in overlapping(s + 1, pc.start, pc.end)),
                            default=0.0)
                t = max(t, ready) + tbs[k]
                row[k] = t
        tail = sync.layer_grad + (sync.embedding_grad if s in (0, pp - 1) else 0.0)
        stage_end[s] = t + tail + stage_optimizer_time(model, layout, s, profile)
    total = max(stage_end)
    sequences = batch * layout.dp
    bt = boundary_times(model, shard, batch, seq, profile)
    est = IterationEstimate(
        iteration_s=total, mfu=mfu(model, sequences, seq, total, layout.gpus, profile.peak(model.dtype)),
        tgs=tgs(sequences, seq, total, layout.gpus), layer=mid or LayerTimes(0, 0, 0, 0, 0),
        embedding_s=bt.embedding, classifier_s=bt.classifier,
        grad_sync_exposed_s=sync.layer_grad + sync.embedding_grad,
        optimizer_s=max(stage_optimizer_time(model, layout, s, profile) for s in range(pp)), exposed_copy_s=exposed)
    busy = [sum(tf[s]) + sum(tb[s]) for s in range(pp)]
    grid = {"stage_forward_end_s": [r[-1] for r in fend], "stage_backward_end_s": [bend[s][0] for s in range(pp)],
            "stage_busy_s": busy, "bubble_fraction": 1 - sum(busy) / (pp * total) if total else 0.0}
    return est, grid


# ------------------------------------------------------------------------------------------ alphas
def _subseq_tokens(policy: Sppo) -> list[int]:
    b = policy.bounds
    return [b[i + 1] - b[i] for i in range(policy.subseqs)]


def overlap_threshold(model: ModelConfig, layout: Layout, batch: int, policy: Sppo, profile: HardwareProfile) -> float:
    """M_threshold = B·(T_min − latency): the bytes one unit may copy while the shortest
    subsequence's layer forward runs."""
    shard = replace(layout, pp=1, dp=1, zero=0)
    b = policy.bounds
    timer = piece_timer(model, shard, batch, profile)
    t_min = min(timer(b[i], b[i + 1] - b[i])[0] for i in range(policy.subseqs))
    bw = host_bandwidth_per_gpu(profile, "d2h", _active(layout, profile))
    return max(0.0, bw * (t_min - float(profile.host_link.latency)))


def solve_alphas(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Sppo, profile: HardwareProfile,
                 threshold: float | None = None, steps: int = 10) -> tuple[Sppo, AlphaChoice, PipelineMemory]:
    """The sequence-aware offload ratios for ``policy``'s partition (module docs). Where no
    threshold satisfies both the GPU and the host, the plan returned fails on the one that the
    other's limit forces past capacity."""
    from memo_sim.cost.sppo import sequence_aware_alphas

    a_i = [policy.offloadable_bytes(model, layout, batch, t) for t in _subseq_tokens(policy)]
    top = max(a_i) if a_i else 0.0

    def at(m: float) -> tuple[Sppo, PipelineMemory]:
        pol = replace(policy, alphas=sequence_aware_alphas(a_i, m), threshold_bytes=m)
        return pol, sppo_memory(model, layout, batch, seq, pol, profile)

    m = min(overlap_threshold(model, layout, batch, policy, profile) if threshold is None else threshold, top)
    binding = "overlap" if m < top else "none"
    pol, mem = at(m)
    if mem.breakdown.oom_by > 0 and m < top:  # raise the threshold until the stage fits
        hi_pol, hi_mem = at(top)
        if hi_mem.breakdown.oom_by > 0:
            pol, mem, m = hi_pol, hi_mem, top  # not even everything offloaded fits
        else:
            lo, hi = m, top
            pol, mem = hi_pol, hi_mem
            for _ in range(steps):
                mid = (lo + hi) / 2
                p2, m2 = at(mid)
                if m2.breakdown.oom_by > 0:
                    lo = mid
                else:
                    hi, pol, mem = mid, p2, m2
            m = hi
        binding = "gpu_memory"
    elif mem.breakdown.oohm_by > 0:  # lower it until the node's pinned memory holds the offload
        cap = profile.usable_host_memory

        def host(mm: float) -> float:
            trial = replace(policy, alphas=sequence_aware_alphas(a_i, mm))
            return sppo_host_bytes_per_node(model, layout, batch, trial, profile)

        lo, hi = 0.0, m
        for _ in range(2 * steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if host(mid) <= cap else (lo, mid)
        m = lo
        pol, mem = at(m)
        binding = "host_memory"
    notes = {"overlap": "alpha_i·A_i = offload bytes hidden by the shortest subsequence's layer forward",
             "gpu_memory": "threshold raised until the stage fits the GPU (copies partly exposed)",
             "host_memory": "threshold lowered until pinned host memory holds the offload",
             "none": "every subsequence offloads all its rows within the overlap limit"}
    return pol, AlphaChoice(pol.alphas, m, binding, notes[binding]), mem


# ------------------------------------------------------------------------------------------ points
def solve_point(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, subseqs: int,
                partition: str = "flops", multiplex: bool = False, bounds: tuple[int, ...] | None = None,
                lower_bound: float | None = None) -> SppoPoint:
    """Solve one point: partition, alphas, memory, estimate. Raises `MemoError` where the point
    cannot exist (the sequence does not split into N SP-divisible subsequences)."""
    pol = Sppo(None, subseqs=subseqs, bounds=tuple(bounds) if bounds else (), partition=partition,
               multiplex=multiplex and layout.pp > 1)
    pol = pol.with_bounds(model, layout, batch, seq)
    pol, ac, mem = solve_alphas(model, layout, batch, seq, pol, profile)
    est, grid = estimate_sppo(model, layout, batch, seq, pol, profile)
    return SppoPoint(layout, pol, est, mem, ac, est.iteration_s if lower_bound is None else lower_bound, grid)


def _lower_bound(model, layout, batch, seq, profile, subseqs, partition, multiplex) -> tuple[float, Sppo] | None:
    """(the estimate with the overlap-threshold alphas, that plan), or None where the point cannot
    exist or certainly overflows the GPU (`memory_floor`)."""
    try:
        pol = Sppo(None, subseqs=subseqs, partition=partition, multiplex=multiplex and layout.pp > 1)
        pol = pol.with_bounds(model, layout, batch, seq)
    except MemoError:
        return None
    if memory_floor(model, layout, batch, pol) > profile.usable_gpu_memory:
        return None
    m = overlap_threshold(model, layout, batch, pol, profile)
    a_i = [pol.offloadable_bytes(model, layout, batch, t) for t in _subseq_tokens(pol)]
    from memo_sim.cost.sppo import sequence_aware_alphas

    pol = replace(pol, alphas=sequence_aware_alphas(a_i, m), threshold_bytes=m)
    est = estimate_sppo(model, layout, batch, seq, pol, profile, quantum=BOUND_QUANTUM)[0].iteration_s
    return est * (1 - BOUND_SLACK), pol


def memory_floor(model: ModelConfig, layout: Layout, batch: int, policy: Sppo) -> float:
    """Bytes the fullest stage certainly holds at the end of its last piece's backward, whatever
    the alphas: its model states, the K/V cache of every earlier subsequence in each of its layers
    and as many bytes of dK/dV accumulators (a lower bound used to prune)."""
    shard = replace(layout, pp=1, dp=1, zero=0)
    n_l = model.layers // layout.pp
    kv = kv_cache_bytes(model, shard, batch, policy.bounds[-2]) if policy.subseqs > 1 else 0.0
    return max(stage_model_state_bytes(model, layout, s) for s in range(layout.pp)) + 2 * n_l * kv


def subseq_grid(seq: int, sp: int, lo_tokens: int = MIN_TOKENS_PER_DEVICE, max_n: int = MAX_SUBSEQS) -> list[int]:
    """N in powers of two with each device's share of a subsequence at least ``lo_tokens``."""
    out, n = [], 1
    while n <= max_n and seq / (n * sp) >= lo_tokens:
        out.append(n)
        n *= 2
    return out or [1]


def efficient_subseqs(seq: int, sp: int) -> list[int]:
    """The heuristic's N: powers of two with seq/(N·SP) in the efficient 2K-16K range (the nearest
    one where none is)."""
    lo, hi = EFFICIENT_TOKENS_PER_DEVICE
    grid = subseq_grid(seq, sp, 1, MAX_SUBSEQS * 8)
    inside = [n for n in grid if lo <= seq / (n * sp) <= hi]
    if inside:
        return inside
    return [min(grid, key=lambda n: min(abs(math.log2(seq / (n * sp) / lo)), abs(math.log2(seq / (n * sp) / hi))))]


@dataclass
class SppoSearch:
    """What the SPPO planner found: the heuristic's choice, the exhaustive search's best, every
    solved point (best first) and the layouts rejected."""

    heuristic: SppoPoint | None
    heuristic_note: str
    best: SppoPoint | None  # exhaustive, analytic tier
    points: list[SppoPoint]
    space_size: int
    solved: int
    rejected_layouts: list[tuple[Layout, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"heuristic": self.heuristic.to_dict() if self.heuristic else None,
                "heuristic_note": self.heuristic_note, "exhaustive_best": self.best.to_dict() if self.best else None,
                "space_size": self.space_size, "solved_points": self.solved,
                "points": [p.to_dict() for p in self.points]}


def _rank_key(p: SppoPoint) -> tuple:
    return (p.status != "OK", p.over_bytes if p.status != "OK" else 0.0, -p.tgs)


def exhaustive_search(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                      tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                      subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                      multiplex: tuple[bool, ...] = (False, True), keep: int = 4, max_solves: int = 400,
                      ) -> tuple[list[SppoPoint], int, int, list[tuple[Layout, str]]]:
    """Branch and bound over the space (module docs): (solved points best first, space size,
    points solved, rejected layouts)."""
    layouts, rejected = enumerate_pipeline_layouts(model, gpus, profile.node_gpus, seq, tp=tp, pp=pp, dp=dp,
                                                   zero=zero)
    space: list[tuple[float, Layout, Sppo]] = []
    size = 0
    for lay in layouts:
        ns = [subseqs] if subseqs else subseq_grid(seq, lay.tp)
        for n in ns:
            for part in partitions:
                for mux in multiplex:
                    if mux and not 1 < lay.pp <= MULTIPLEX_MAX_PP:
                        continue
                    size += 1
                    lb = _lower_bound(model, lay, batch, seq, profile, n, part, mux)
                    if lb is not None:
                        space.append((lb[0], lay, lb[1]))
    # rank by the throughput bound: tokens per GPU per second at the lower-bound time
    space.sort(key=lambda t: t[0] / t[1].dp)
    solved: list[SppoPoint] = []
    fits: list[SppoPoint] = []
    for lb, lay, pol in space:
        if len(solved) >= max_solves:
            break
        if len(fits) >= keep and fits[0].estimate.iteration_s / fits[0].layout.dp <= lb / lay.dp:
            break
        pt = solve_point(model, lay, batch, seq, profile, pol.subseqs, pol.partition, pol.multiplex, pol.bounds, lb)
        solved.append(pt)
        if pt.status == "OK":
            fits.append(pt)
            fits.sort(key=lambda p: p.estimate.iteration_s / p.layout.dp)
    solved.sort(key=_rank_key)
    return solved, size, len(solved), rejected


def heuristic_choice(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                     ) -> tuple[SppoPoint | None, str]:
    """The paper's section 6.1 heuristic (module docs): (the point, how it was chosen)."""
    gpn = profile.node_gpus
    inside, across = [], []
    for sp in sorted({d for d in range(1, gpn + 1) if gpn % d == 0}, reverse=True):
        for p in range(1, model.layers + 1):
            if model.layers % p or gpus % (sp * p):
                continue
            lay = Layout(tp=sp, sp=True, pp=p, dp=gpus // (sp * p))
            if check_layout(lay, model, gpus, gpn, seq, batch):
                continue
            (inside if sp * p <= gpn else across).append(lay)
    cap = profile.usable_gpu_memory

    def best_of(layouts: list[Layout]) -> SppoPoint | None:
        found = []
        for lay in layouts:
            for n in efficient_subseqs(seq, lay.tp):
                mux = 1 < lay.pp <= MULTIPLEX_MAX_PP and bubble_ratio(lay.pp, n) > MULTIPLEX_BUBBLE
                try:
                    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(model, lay, batch, seq)
                except MemoError:
                    continue
                if memory_floor(model, lay, batch, pol) > cap:
                    continue
                found.append(solve_point(model, lay, batch, seq, profile, n, "flops", mux, pol.bounds))
        found.sort(key=_rank_key)
        return found[0] if found else None

    pt = best_of(inside)
    if pt is not None and pt.status == "OK":
        return pt, "SP and PP inside a node, N in the efficient range (2K-16K tokens per device)"
    full = [lay for lay in across if lay.tp == max(d for d in range(1, gpn + 1) if gpn % d == 0
                                                   and model.heads % d == 0)]
    full.sort(key=lambda lay: lay.pp)
    for lay in full:
        q = best_of([lay])
        if q is not None and q.status == "OK":
            return q, (f"nothing fits inside a node; SP = {lay.tp} (a node) and PP = {lay.pp} across nodes, "
                       "N in the efficient range")
    return pt, "nothing fits: the heuristic's least-over point inside a node"


def search_sppo(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                multiplex: tuple[bool, ...] = (False, True), keep: int = 4) -> SppoSearch:
    """The heuristic's choice and the exhaustive search (with any degree fixed by the caller)."""
    points, size, solved, rejected = exhaustive_search(
        model, seq, gpus, profile, batch=batch, tp=tp, pp=pp, dp=dp, zero=zero, subseqs=subseqs,
        partitions=partitions, multiplex=multiplex, keep=keep)
    fixed = any(v is not None for v in (tp, pp, dp, zero, subseqs))
    if fixed:
        heur, note = None, "degrees fixed by flags: no heuristic choice"
    else:
        heur, note = heuristic_choice(model, seq, gpus, profile, batch=batch)
    ok = [p for p in points if p.status == "OK"]
    best = ok[0] if ok else (points[0] if points else None)
    return SppoSearch(heur, note, best, points, size, solved, rejected)


def resolve_for_layout(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                       subseqs: int | None = None, multiplex: bool | None = None) -> SppoPoint:
    """The best SPPO point for one fixed layout (N from the grid unless given): for commands that
    hold the layout (sweeps) and for plans asked for with --pp/--subseqs."""
    if layout.pp > 1 and (layout.cp > 1 or layout.ulysses > 1):
        raise MemoError(f"sppo: {layout.label()}: pipeline stages use TP+SP only")
    why = Sppo(None).check(model, layout, batch, seq)
    if why and "not solved" not in why:
        raise MemoError(f"sppo: {layout.label()}: {why}")
    best: SppoPoint | None = None
    for n in ([subseqs] if subseqs else efficient_subseqs(seq, layout.tp)):
        muxes = [False, True] if 1 < layout.pp <= MULTIPLEX_MAX_PP else [False]
        for mux in ([multiplex] if multiplex is not None else muxes):
            try:
                pt = solve_point(model, layout, batch, seq, profile, n, "flops", mux)
            except MemoError:
                continue
            if best is None or _rank_key(pt) < _rank_key(best):
                best = pt
    if best is None:
        raise MemoError(f"sppo: {seq} tokens do not split into subsequences for {layout.label()}")
    return best


# ------------------------------------------------------------------------------------------ what-if
def point_candidate(model: ModelConfig, pt: SppoPoint, batch: int, seq: int, profile: HardwareProfile,
                    *roles: str):
    """A what-if `memo_sim.search.candidate.Candidate` for one solved point."""
    info = pt.to_dict()
    info["roles"] = list(roles)
    note = pt.memory.reason() or f"alphas: {pt.alpha.note}"
    return Candidate(model, pt.layout, pt.policy, batch, seq, profile, pt.estimate, pt.memory.breakdown, note,
                     sppo=info, schedule="sppo")


def sppo_candidates(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                    tp: int | None = None, cp: int | None = None, ulysses: int | None = None, dp: int | None = None,
                    zero: int | None = None, sp: bool | None = None, tp_mode: str = "all", pp: int | None = None,
                    subseqs: int | None = None, partition: str | None = None, multiplex: bool | None = None):
    """(search, candidates, rejected layouts, why none) for the what-if: each pipeline layout's
    best point, the heuristic's choice and the exhaustive best, tagged with their roles."""
    if (cp or 1) > 1 or (ulysses or 1) > 1:
        return None, [], [], "sppo stages split the sequence by TP+SP only (no --cp / --ulysses)"
    if sp is False:
        return None, [], [], "sppo needs Megatron sequence parallelism inside a stage (no --no-sp)"
    if tp_mode != "all" and tp_flavour(tp_mode).runs_rings:
        return None, [], [], f"sppo stages run Megatron TP+SP, not {tp_mode}"
    if partition is not None and partition not in PARTITIONS:
        raise MemoError(f"--partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if subseqs is not None and subseqs < 1:
        raise MemoError(f"--subseqs must be at least 1, got {subseqs}")
    search = search_sppo(model, seq, gpus, profile, batch=batch, tp=tp, pp=pp, dp=dp, zero=zero, subseqs=subseqs,
                         partitions=(partition,) if partition else PARTITIONS,
                         multiplex=(multiplex,) if multiplex is not None else (False, True))
    groups: dict[tuple, SppoPoint] = {}
    for p in search.points:
        k = (p.layout.tp, p.layout.pp, p.layout.dp, p.layout.zero)
        if k not in groups or _rank_key(p) < _rank_key(groups[k]):
            groups[k] = p
    chosen: list[tuple[SppoPoint, list[str]]] = [(p, ["layout best"]) for p in groups.values()]

    def tag(pt: SppoPoint | None, role: str) -> None:
        if pt is None:
            return
        for q, roles in chosen:
            if q.key() == pt.key():
                roles.append(role)
                return
        chosen.append((pt, [role]))

    tag(search.best, "exhaustive best")
    tag(search.heuristic, "heuristic")
    cands = [point_candidate(model, p, batch, seq, profile, *roles) for p, roles in chosen]
    why = "" if cands else (search.rejected_layouts[0][1] if search.rejected_layouts else
                            "no pipeline layout of the GPUs fits the fixed degrees")
    return search, cands, search.rejected_layouts, why


def _summary_of(c) -> dict:
    sim = c.simulated or {}
    return {"label": f"{c.layout.label()} {c.policy.label()}", "sp": c.layout.tp, "pp": c.layout.pp,
            "dp": c.layout.dp, "subseqs": c.policy.subseqs, "partition": c.policy.partition,
            "multiplex": c.policy.multiplex, "status": c.status,
            "analytic_iteration_s": c.estimate.iteration_s, "analytic_tgs_tokens_per_gpu_s": c.estimate.tgs,
            "simulated_iteration_s": sim.get("iteration_s"), "simulated_tgs_tokens_per_gpu_s": sim.get(
                "tgs_tokens_per_gpu_s"), "simulated_mfu": sim.get("mfu"),
            "peak_gpu_bytes": sim.get("peak_gpu_bytes", c.memory.peak_gpu_bytes),
            "peak_host_bytes_per_node": sim.get("peak_host_bytes_per_node", c.memory.host_bytes_per_node),
            "worst_stage": (c.sppo or {}).get("worst_stage"), "peak_at": (c.sppo or {}).get("peak_at")}


def summarize(search: SppoSearch, candidates: list) -> dict:
    """The heuristic's choice against the best SPPO plan found (simulated where tier 2 ran)."""
    sppo = [c for c in candidates if c.sppo is not None]
    heur = next((c for c in sppo if "heuristic" in c.sppo.get("roles", ())), None)
    ok = [c for c in sppo if c.status == "OK"]
    best = min(ok, key=lambda c: (c.simulated is None, -c.tgs)) if ok else None
    out = {"space_size": search.space_size, "solved_points": search.solved, "heuristic_note": search.heuristic_note,
           "heuristic": _summary_of(heur) if heur else None, "best": _summary_of(best) if best else None,
           "analytic_best": search.best.to_dict() if search.best else None}
    if heur is not None and best is not None and heur.status == "OK":
        out["heuristic_tgs_fraction_of_best"] = heur.tgs / best.tgs if best.tgs else None
        out["compared_on"] = "simulated" if heur.simulated and best.simulated else "analytic"
    return out
