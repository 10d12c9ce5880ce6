"""SPPO's analytic estimate (tier 1): the (stage, piece) recurrence (`memo_sim.search.sppo`'s
"Analytic estimate")."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from typing import Sequence

from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.memo import memoised_by, profile_key
from memo_sim.cost.sppo import (
    stage_gpu_shard,
    p2p_bytes,
    p2p_link,
    piece_timer,
    stage_grad_sync,
    stage_layers,
    stage_optimizer_time,
)
from memo_sim.cost.transfer import host_bandwidth_per_gpu
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.flops import mfu, tgs
from memo_sim.policy.rounding_buffers import offloaded_layer_count
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.estimate import IterationEstimate, LayerTimes


# ------------------------------------------------------------------------------------------ timing
def _active(layout: Layout, profile: HardwareProfile) -> int:
    return min(layout.gpus, profile.node_gpus)


def estimate_sppo(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Sppo,
                  profile: HardwareProfile, quantum: float = 0.0) -> tuple[IterationEstimate, dict]:
    """Tier 1 for an SPPO plan (module docs): the (stage, piece) recurrence. Returns the estimate
    and the grid's details (per-stage forward / backward end, busy time). ``quantum``: price
    the pieces' non-attention ops on a geometric length grid (`memo_sim.cost.sppo.piece_timer`;
    the search's bounding pass)."""
    shard = stage_gpu_shard(layout)
    r = recurrence(model, layout, batch, policy, profile, quantum=quantum)
    pp = layout.pp
    total = max(r.stage_end)
    sequences = batch * layout.dp
    bt = boundary_times(model, shard, batch, seq, profile)
    est = IterationEstimate(
        iteration_s=total, mfu=mfu(model, sequences, seq, total, layout.gpus, profile.peak(model.dtype)),
        tgs=tgs(sequences, seq, total, layout.gpus), layer=r.mid or LayerTimes(0, 0, 0, 0, 0),
        embedding_s=bt.embedding, classifier_s=bt.classifier,
        grad_sync_exposed_s=r.sync.layer_grad + r.sync.embedding_grad + r.sync.shared_embedding,
        optimizer_s=max(stage_optimizer_time(model, layout, s, profile) for s in range(pp)),
        exposed_copy_s=r.exposed)
    busy = [sum(r.tf[s]) + sum(r.tb[s]) for s in range(pp)]
    grid = {"stage_forward_end_s": [row[-1] for row in r.fend],
            "stage_backward_end_s": [r.bend[s][0] for s in range(pp)],
            "stage_busy_s": busy, "bubble_fraction": 1 - sum(busy) / (pp * total) if total else 0.0}
    return est, grid


@dataclass
class Recurrence:
    """The (stage, piece) recurrence's rows: each piece's forward / backward seconds on its stage
    (``tf``, ``tb``), when each ends (``fend``, ``bend``), when each stage's backward ends
    (``done``) and its step ends (``stage_end``: gradient sync and optimizer step after it)."""

    tf: Sequence[Sequence[float]]
    tb: Sequence[Sequence[float]]
    fend: list[list[float]]
    bend: list[list[float]]
    done: list[float]
    stage_end: list[float]
    exposed: float
    mid: LayerTimes | None
    sync: object


def recurrence(model: ModelConfig, layout: Layout, batch: int, policy: Sppo, profile: HardwareProfile, *,
               quantum: float = 0.0, copies: bool = True) -> Recurrence:
    """The (stage, piece) recurrence of `estimate_sppo`. ``copies`` False leaves out every wait the
    host copies and the ZeRO weight gathers can add (a unit takes its compute chain's time, not
    the longer of it and its offload or prefetch): the proved lower bound of
    `memo_sim.search.bound.sppo_bound` (with ``quantum`` 0)."""
    shard = stage_gpu_shard(layout)
    pieces = policy.stage_pieces(model, layout, batch)
    layers = stage_layers(model.layers, layout.pp)
    sync = stage_grad_sync(model, layout, profile)
    pp = layout.pp
    starts_of = [[p.start for p in ps] for ps in pieces]
    n_l = len(layers[0])
    tf, tb, exposed, exposed_each, mid, first_f = _piece_times(model, replace(layout, zero=0), batch, policy,
                                                               profile, quantum, copies)
    if copies and sync.layer_gather > 0:
        # ZeRO's weight gathers before each layer's first forward (piece 0's), beyond its compute; the
        # exposed copy seconds summed piece by piece over every stage, as they were where the gathers
        # kept the middle stages from sharing their rows
        tf = [(row[0] + n_l * max(0.0, sync.layer_gather - first_f[s]),) + row[1:] for s, row in enumerate(tf)]
        exposed = exposed_each
    if copies and sync.embedding_gather + sync.head_gather > 0:
        # the embedding's unit before the first piece's embedding, the head's beside the last stage's last layer
        # (`memo_sim.cost.grad_sync`)
        extra = [0.0] * pp
        extra[0] += sync.embedding_gather
        extra[pp - 1] += max(0.0, sync.head_gather - first_f[pp - 1])
        tf = [(row[0] + extra[s],) + row[1:] for s, row in enumerate(tf)]
    hops = _hops(model, layout, batch, profile)
    same = [s > 0 and starts_of[s] == starts_of[s - 1] for s in range(pp)]  # no multiplexed split between
    fend = _forward_ends(pieces, tf, same, starts_of, hops)
    bend, done = _backward_ends(pieces, tb, fend, same, starts_of, hops)
    emb_bwd0 = boundary_times(model, shard, batch, pieces[0][0].tokens, profile).embedding_bwd
    stage_end = []
    for s in range(pp):
        # the stage's gradient buckets on its data-parallel stream, one per layer after piece 0's
        # backward of it (the last after the last unit, before stage 0's embedding backward), then
        # the embedding's on the end stages after everything; the step waits for both streams
        dp_end = 0.0
        if sync.layer_grad > 0 and len(layers[s]):
            dp_end = done[s] - (emb_bwd0 if s == 0 else 0.0) + sync.layer_grad
        end_bucket = sync.end_bucket(s, pp)
        if end_bucket > 0:
            dp_end = max(done[s], dp_end) + end_bucket
        stage_end.append(max(done[s], dp_end))
    if sync.shared_embedding > 0:  # the end stages' sum of the embedding they share (`memo_sim.cost.grad_sync`)
        stage_end[0] = stage_end[pp - 1] = max(stage_end[0], stage_end[pp - 1]) + sync.shared_embedding
    stage_end = [e + stage_optimizer_time(model, layout, s, profile) for s, e in enumerate(stage_end)]
    return Recurrence(tf, tb, fend, bend, done, stage_end, exposed, mid, sync)


@memoised_by(lambda model, layout, batch, policy, profile, quantum, copies: (
    model, layout, batch, policy, profile_key(profile), quantum, copies), maxsize=1024)
def _piece_times(model: ModelConfig, layout: Layout, batch: int, policy: Sppo, profile: HardwareProfile,
                 quantum: float, copies: bool = True) -> tuple:
    """Each (stage, piece)'s forward and backward seconds through the stage's layers (with the
    embedding / classifier on the end stages), the exposed copy seconds over all units (middle
    stages with the same pieces share their rows and add theirs as one sum; also summed piece by
    piece over every stage), the middle unit's `LayerTimes` of stage 0 and each stage's first
    piece's forward seconds of one layer (what `recurrence` adds ZeRO's weight gathers beyond).
    ``copies`` False: each unit at its compute chain's seconds (no copy; `recurrence`).

    Nothing here reads the layout's ZeRO stage, so `recurrence` asks with ZeRO 0 and the memo
    serves a pipeline layout's ZeRO-0 and ZeRO-1 points of the search alike (the rows are tuples:
    callers share them)."""
    shard = stage_gpu_shard(layout)
    pieces = policy.stage_pieces(model, layout, batch)
    n_l = len(stage_layers(model.layers, layout.pp)[0])
    starts_of = [[p.start for p in ps] for ps in pieces]
    first_f: list[float] = []
    pp = layout.pp
    active = _active(layout, profile)
    tf: list[list[float]] = []
    tb: list[list[float]] = []
    exposed = exposed_each = 0.0
    mid = None
    bts: dict[int, object] = {}
    per_piece: dict[tuple, tuple] = {}
    bw_o = host_bandwidth_per_gpu(profile, "d2h", active)
    bw_p = host_bandwidth_per_gpu(profile, "h2d", active)
    lat = float(profile.host_link.latency)
    timer = piece_timer(model, shard, batch, profile, quantum)
    base_rows: dict[tuple, tuple] = {}
    for s in range(pp):
        ps = pieces[s]
        n_k = len(ps)
        n_off_units = offloaded_layer_count(n_l * n_k)
        if 0 < s < pp - 1:
            sig = (ps[0].start, ps[-1].start, n_k, id(ps) if n_k < 3 else ps[1].start)
            hit = base_rows.get(sig)
            if hit is not None and starts_of[s] == starts_of[hit[3]]:
                tf.append(hit[0])
                tb.append(hit[1])
                exposed += hit[2]
                for x in hit[5]:
                    exposed_each += x
                first_f.append(hit[4])
                continue
        exposed_before = exposed
        rowf, rowb, exps = [], [], []
        for k, pc in enumerate(ps):
            n_off = max(0, min(n_l, n_off_units - k * n_l))
            key = (pc.sub, pc.start, pc.end, k < n_k - 1, n_off)
            hit = per_piece.get(key)
            if hit is None:
                f, b = timer(pc.start, pc.tokens)
                off = policy.offload_bytes_of(model, shard, batch, pc, k < n_k - 1) if copies else 0.0
                o = (lat + off / bw_o) if off > 0 else 0.0
                p = (lat + off / bw_p) if off > 0 else 0.0
                hit = per_piece[key] = (
                    n_off * max(f, o) + (n_l - n_off) * f, n_off * max(b, p) + (n_l - n_off) * b,
                    n_off * (max(0.0, o - f) + max(0.0, p - b)), f, b, o, p)
            t_f, t_b, exp, f, b, o, p = hit
            exposed += exp
            exposed_each += exp
            exps.append(exp)
            if s == 0 or s == pp - 1:
                bt = bts.get(pc.tokens)
                if bt is None:
                    bt = bts[pc.tokens] = boundary_times(model, shard, batch, pc.tokens, profile)
                if s == 0:
                    t_f += bt.embedding_fwd
                    t_b += bt.embedding_bwd
                if s == pp - 1:
                    t_f += bt.classifier
            if k == 0:
                first_f.append(f)
            rowf.append(t_f)
            rowb.append(t_b)
            if s == 0 and k == n_k // 2:
                mid = LayerTimes(f, b, 0.0, o if n_off else 0.0, p if n_off else 0.0)
        rowf, rowb = tuple(rowf), tuple(rowb)
        tf.append(rowf)
        tb.append(rowb)
        if 0 < s < pp - 1:
            base_rows[(ps[0].start, ps[-1].start, n_k, id(ps) if n_k < 3 else ps[1].start)] = (
                rowf, rowb, exposed - exposed_before, s, first_f[-1], exps)
    return tuple(tf), tuple(tb), exposed, exposed_each, mid, tuple(first_f)


def _hops(model: ModelConfig, layout: Layout, batch: int, profile: HardwareProfile):
    """(bytes per token, per-hop latency, per-hop bandwidth) of the p2p sends between stages."""
    per_token = p2p_bytes(model, layout, batch, 1)
    links = [profile.internode if p2p_link(layout, profile, s) == "internode" else profile.nvlink
             for s in range(max(0, layout.pp - 1))]
    return per_token, [float(lk.latency) for lk in links], [float(lk.bandwidth) for lk in links]


def _hop(hops, s: int, tokens: int) -> float:  # `memo_sim.cost.sppo.p2p_time`, linear in the tokens
    per_token, hop_lat, hop_bw = hops
    return hop_lat[s] + tokens * per_token / hop_bw[s]


def _overlapping(starts: list[int], a: int, b: int) -> range:
    return range(max(0, bisect_right(starts, a) - 1), bisect_left(starts, b))


def _forward_ends(pieces: list, tf: list[list[float]], same: list[bool], starts_of: list[list[int]],
                  hops) -> list[list[float]]:
    """When each (stage, piece)'s forward ends: after the stage's previous piece and the sends of
    the overlapping pieces of the stage before."""
    per_token, hop_lat, hop_bw = hops
    fend: list[list[float]] = []
    for s in range(len(tf)):
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
                ready = max((fend[s - 1][q] + _hop(hops, s - 1, up[q].tokens)
                             for q in _overlapping(starts_of[s - 1], pc.start, pc.end)), default=0.0)
                t = max(t, ready) + tf[s][k]
                row.append(t)
        fend.append(row)
    return fend


def _backward_ends(pieces: list, tb: list[list[float]], fend: list[list[float]], same: list[bool],
                   starts_of: list[list[int]], hops) -> tuple[list[list[float]], list[float]]:
    """When each (stage, piece)'s backward ends (pieces in reverse order, last stage first), and
    when each stage's backward ends."""
    per_token, hop_lat, hop_bw = hops
    pp = len(tb)
    bend: list[list[float]] = [[0.0] * len(pieces[s]) for s in range(pp)]
    done = [0.0] * pp
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
                ready = max((bend[s + 1][q] + _hop(hops, s, dn[q].tokens)
                             for q in _overlapping(starts_of[s + 1], pc.start, pc.end)), default=0.0)
                t = max(t, ready) + tbs[k]
                row[k] = t
        done[s] = t
    return bend, done
