"""A provable lower bound on a candidate's simulated iteration time, one rule per schedule.

Why each is a lower bound (the event simulator, `memo_sim.engine`): every op starts after the ops
it depends on have ended and after the op before it on its stream has ended; a compute or comm
op takes at least its ``work`` seconds (a kernel slowed beside host copies, a collective
sharing a link only take longer); host copies and memory only ever add waits. So the iteration
lasts at least as long as any chain of dependent ops, each counted at its ``work``. The chains
used here are the ones the schedules wire (the phase op lists are `memo_sim.cost.opcost` chains,
whose longest path is `critical_time`):

- single stage: embedding -> every layer's forward -> classifier -> every layer's [recompute]
  backward -> embedding backward, once per micro-batch, then (the last micro-batch) the final
  gradient bucket and the optimizer step (`memo_sim.engine.schedules.single_stage`);
- 1F1B / interleaved 1F1B: rank s cannot start before the first micro-batch's first chunk has
  run forward on ranks 0..s-1, then runs every unit of its own (m micro-batches x its layers,
  forward, recompute and backward) one after another on its compute stream, and its last
  backward (the last micro-batch's first chunk) then runs backward on ranks s-1..0 before rank
  0's embedding backward and optimizer step (`memo_sim.engine.schedules.microbatch`);
- SPPO: the same per stage over its pieces (piece 0 forward through the stages before it, every
  unit of the stage, piece 0 backward through the stages before it, then stage 0's embedding
  backward and optimizer step) (`memo_sim.engine.schedules.sppo`).

Tests (tests/test_search_prune.py) check the bound against the simulator over a sweep of
candidates of every schedule and policy. `lower_bound` reads a `Candidate`; the rules are
registered by schedule name (`register_bound`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.layer_time import critical_time
from memo_sim.cost.sppo import piece_timer, stage_layer_counts, stage_layers, stage_optimizer_time
from memo_sim.errors import MemoError
from memo_sim.memplan.trace_gen import per_gpu_shard
from memo_sim.search.estimate import _forward_backward_times

BoundRule = Callable[[object], float]  # Candidate -> seconds
_BOUNDS: dict[str, BoundRule] = {}


def register_bound(*schedules: str):
    def deco(fn: BoundRule) -> BoundRule:
        for name in schedules:
            _BOUNDS[name] = fn
        return fn
    return deco


def lower_bound(c) -> float:
    """Seconds the event simulator cannot beat for candidate ``c`` (module docs)."""
    rule = _BOUNDS.get(c.schedule)
    if rule is None:
        raise MemoError(f"no lower bound for schedule {c.schedule!r}: register one in memo_sim.search.bound")
    return rule(c)


def _phase_times(model, shard, batch, seq, policy, profile) -> tuple[float, float, float]:
    """Critical seconds of one layer's forward, backward and recompute on one GPU."""
    f, b = _forward_backward_times(model, shard, batch, seq, profile)
    rec = policy.recompute_costs(model, shard, batch, seq, profile)
    return f, b, critical_time(rec) if rec else 0.0


@register_bound("single_stage")
def single_stage_bound(c) -> float:
    model, lay, policy, profile = c.model, c.layout, c.policy, c.profile
    mb = c.micro_batch or c.batch
    m = c.batch // mb
    f, b, r = _phase_times(model, per_gpu_shard(lay), mb, c.seq, policy, profile)
    n = model.layers
    recomputed = sum(1 for i in range(n) if policy.recomputes_layer(i, n)) if r > 0 else 0
    bt = boundary_times(model, lay, mb, c.seq, profile)
    sync = grad_sync(model, lay, profile)
    bucket = (sync.embedding_grad if sync.overlapped else sync.all_grads) if sync.active else 0.0
    one = bt.embedding + n * (f + b) + recomputed * r + bt.classifier
    return m * one + bucket + bt.optimizer


@register_bound("1f1b", "interleaved_1f1b")
def pipeline_bound(c) -> float:
    model, lay, policy, profile = c.model, c.layout, c.policy, c.profile
    p, v = lay.pp, lay.vpp
    mb = c.micro_batch
    m = c.batch // mb
    shard = replace(lay, pp=1, vpp=1, dp=1, zero=0)
    f, b, r = _phase_times(model, shard, mb, c.seq, policy, profile)
    bt = boundary_times(model, shard, mb, c.seq, profile)
    opt0 = stage_optimizer_time(model, lay, 0, profile)
    # rank s cannot start before micro-batch 0 has run forward through virtual stages 0 .. s-1 (chunk 0 of
    # ranks 0 .. s-1), then runs its own units, then micro-batch 0's backward returns through them
    vr = lay.virtual_stage_ranges(model.layers) if lay.uneven else None
    lc = model.layers // (p * v)  # layers per chunk (even split)
    counts = stage_layer_counts(model, lay) if lay.uneven else [v * lc] * p
    best = 0.0
    for s in range(p):
        n_f = m * counts[s]  # forward units of the rank
        recomputed = sum(1 for u in range(n_f) if policy.recomputes_layer(u, n_f)) if r > 0 else 0
        own = n_f * (f + b) + recomputed * r
        own += m * (bt.embedding if s == 0 else 0.0) + m * (bt.classifier if s == p - 1 else 0.0)
        before = sum(len(vr[i]) for i in range(s)) if vr is not None else s * lc
        lead = bt.embedding_fwd + before * f if s else 0.0
        tail = before * b + bt.embedding_bwd if s else 0.0
        best = max(best, lead + own + tail + opt0)
    return best


@register_bound("sppo")
def sppo_bound(c) -> float:
    model, lay, policy, profile = c.model, c.layout, c.policy, c.profile
    batch = c.batch
    shard = replace(lay, pp=1, dp=1, zero=0)
    timer = piece_timer(model, shard, batch, profile)
    pieces = policy.stage_pieces(model, lay, batch)
    layers = stage_layers(model.layers, lay.pp)
    bts: dict[int, object] = {}

    def bt(tokens: int):
        v = bts.get(tokens)
        if v is None:
            v = bts[tokens] = boundary_times(model, shard, batch, tokens, profile)
        return v

    p = lay.pp
    opt0 = stage_optimizer_time(model, lay, 0, profile)
    first = [timer(ps[0].start, ps[0].tokens) for ps in pieces]  # piece 0 of each stage: (fwd, bwd)
    emb_f, emb_b = bt(pieces[0][0].tokens).embedding_fwd, bt(pieces[0][0].tokens).embedding_bwd
    best = 0.0
    lead = tail = 0.0
    for s in range(p):
        n_l = len(layers[s])
        own = 0.0
        for pc in pieces[s]:
            fw, bw = timer(pc.start, pc.tokens)
            own += n_l * (fw + bw)
            if s == 0:
                own += bt(pc.tokens).embedding
            if s == p - 1:
                own += bt(pc.tokens).classifier
        if s:
            best = max(best, emb_f + lead + own + tail + emb_b + opt0)
        else:
            best = max(best, own + opt0)
        lead += n_l * first[s][0]
        tail += n_l * first[s][1]
    return best


__all__ = ["lower_bound", "pipeline_bound", "register_bound", "single_stage_bound",
           "sppo_bound"]
