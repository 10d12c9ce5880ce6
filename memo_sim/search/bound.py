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
  gradient bucket and the optimizer step (`memo_sim.engine.schedules.single_stage`); and no shorter than its
  data-parallel stream, which issues every weight gather and gradient reduction one after another
  (`memo_sim.search.estimate.dp_stream_seconds`, each at its work): ZeRO-3 over data-parallel groups across nodes
  is that stream's time, which the chain alone left out (Llama-3.1-405B on 16,384 H100s at 128K, TP 4 x Ulysses 32
  x ZeRO-3 over 128: a chain of 8.7 s, a stream of 18.6 s, 25.0 s simulated; such bounds 2x above the simulated
  throughput kept memo's own search simulating 1,400 plans); and no shorter than what its links and SMs carry
  (`_contention_seconds`): each link of the GPU (its NVLink port, its share of the node's NICs) runs its collectives
  as fluid flows of at most its capacity in all, so the iteration lasts at least their seconds alone summed; and while
  they run the compute stream's kernels get at most the SMs an NCCL kernel leaves them (`memo_sim.cost.comm_sms`), so
  ``T >= work + (1 - share) x u`` (``work`` the compute stream's seconds alone, ``u`` the time some of those kernels
  run). Context- and sequence-parallel groups across nodes beside ZeRO over nodes were bounded 1.2-1.5x below their
  simulation by the chain and stream alone (Llama-3.1-70B on 512 H100s at 128K: ``tp2+sp-cp256-z3`` 3.30 s against
  5.02 s simulated, 4.66 s with the links);
- 1F1B / interleaved 1F1B: rank s cannot start before the first micro-batch's first chunk has
  run forward on ranks 0..s-1, then runs every unit of its own (m micro-batches x its layers,
  forward, recompute and backward) one after another on its compute stream, and its last
  backward (the last micro-batch's first chunk) then runs backward on ranks s-1..0 before rank
  0's embedding backward and optimizer step (`memo_sim.engine.schedules.microbatch`); under the EP all-to-all
  overlap (`Layout.ep_overlap`) a merged step runs one micro-batch's collectives beside the other's compute, so
  the rank's own units count their compute-stream seconds alone (every kernel of the rank runs one after another
  on that stream), while the warm-up forward and the cool-down backward ahead of and behind it, never merged,
  keep their chains;
- SPPO: its tier-1 (stage, piece) recurrence with the host copies' and weight gathers' waits left
  out (`sppo_bound`: the argument is written there) (`memo_sim.engine.schedules.sppo`).

Tests (tests/test_search_prune.py) check the bound against the simulator over a sweep of
candidates of every schedule and policy. `lower_bound` reads a `Candidate`; the rules are
registered by schedule name (`register_bound`).
"""

from __future__ import annotations

from typing import Callable

from memo_sim.cost.boundary import boundary_times, pipeline_boundary_times
from memo_sim.cost.comm_sms import collective_sms, compute_share, nccl_sms
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.memo import memoised
from memo_sim.cost.layer_time import backward_costs, critical_time, forward_costs
from memo_sim.cost.sppo import stage_layer_counts, stage_optimizer_time
from memo_sim.engine.schedules.single_stage import collective_link
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import distinct_shards, stage_shards
from memo_sim.memplan.trace_gen import per_gpu_shard
from memo_sim.model.layer_kinds import distinct_kinds, ffn_kinds, kind_model, layer_kinds
from memo_sim.model.flops import tgs
from memo_sim.search.estimate import (_forward_backward_times, compute_stream_times, dp_stream_seconds, ep_overlap_times,
                                      stage_shard)
from memo_sim.search.sppo.estimate import recurrence

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


@memoised(maxsize=1 << 15)
def _phase_times(model, shard, batch, seq, policy, profile) -> tuple[float, float, float]:
    """Critical seconds of one layer's forward, backward and recompute on one GPU (memoised: every micro-batch
    count, ZeRO stage and schedule of a shard and policy asks again)."""
    f, b = _forward_backward_times(model, shard, batch, seq, profile)
    rec = policy.recompute_costs(model, shard, batch, seq, profile)
    return f, b, critical_time(rec) if rec else 0.0


def _recompute_on_compute(model, shard, batch, seq, policy, profile) -> float:
    """A policy's recompute chain's compute-stream seconds (a merged step's bound, `pipeline_iteration_bound`)."""
    return sum(c.seconds for c in policy.recompute_costs(model, shard, batch, seq, profile) if c.stream == "compute")


@register_bound("single_stage")
def single_stage_bound(c) -> float:
    model, lay, policy, profile = c.model, c.layout, c.policy, c.profile
    mb = c.micro_batch or c.batch
    m = c.batch // mb
    f, b, r = _phase_times(model, per_gpu_shard(lay), mb, c.seq, policy, profile)
    n = model.layers
    recomputed = policy.recomputed_count(n) if r > 0 else 0
    bt = boundary_times(model, lay, mb, c.seq, profile, recompute_mtp=policy.recomputes_mtp)
    sync = grad_sync(model, lay, profile)
    bucket = (sync.embedding_grad if sync.overlapped else sync.all_grads) if sync.active else 0.0
    if ffn_kinds(model):  # each layer at its kind's times (a mixture of experts' dense layers)
        one = bt.embedding + _kinds_chain(model, per_gpu_shard(lay), mb, c.seq, policy, profile, r > 0) + bt.classifier
    else:
        one = bt.embedding + n * (f + b) + recomputed * r + bt.classifier
    stream = dp_stream_seconds(sync, n, m, lay.zero)
    return max(m * one + bucket + bt.optimizer, stream, _contention_seconds(c, m, r > 0, sync, stream))


@memoised(maxsize=1 << 12)
def _kinds_chain(model, shard, batch, seq, policy, profile, recomputes: bool) -> float:
    """The single stage's layers of one micro-batch, each at its kind's forward, backward and (where the policy
    re-runs it) recompute seconds (`memo_sim.model.layer_kinds.ffn_kinds`)."""
    n, kinds = model.layers, ffn_kinds(model)
    times = {k: _phase_times(kind_model(model, k), shard, batch, seq, policy, profile) for k in dict.fromkeys(kinds)}
    return sum(times[k][0] + times[k][1] + (times[k][2] if recomputes and policy.recomputes_layer(i, n) else 0.0)
               for i, k in enumerate(kinds))


def _link_seconds(costs, layout, profile) -> dict[str, tuple[float, float]]:
    """Per engine link (``nvlink`` / ``internode``): the seconds alone of a phase list's collectives on it, summed,
    and the fewest SMs one of them holds (`memo_sim.engine.schedules.single_stage.collective_link`,
    `memo_sim.cost.comm_sms`)."""
    out: dict[str, tuple[float, float]] = {}
    nccl = nccl_sms(profile)
    for k in costs:
        if k.stream == "compute" or k.seconds <= 0.0:
            continue
        link = collective_link(k, layout, profile)
        sms = collective_sms(k.name, layout)
        work, held = out.get(link, (0.0, float("inf")))
        out[link] = (work + k.seconds, min(held, nccl if sms is None else sms))
    return out


@memoised(maxsize=1 << 15)
def _layer_streams(model, shard, batch, seq, policy, profile) -> tuple:
    """One layer's (forward + backward compute-stream seconds, its recompute's, the forward's and backward's
    collectives per link, the recompute's): what the single stage's link and SM bounds add up (memoised as
    `_phase_times`)."""
    f_on, b_on = compute_stream_times(model, shard, batch, seq, profile)
    rec = policy.recompute_costs(model, shard, batch, seq, profile)
    fb = _link_seconds([*forward_costs(model, shard, batch, seq, profile),
                        *backward_costs(model, shard, batch, seq, profile)], shard, profile)
    return (f_on + b_on, _recompute_on_compute(model, shard, batch, seq, policy, profile), fb,
            _link_seconds(rec, shard, profile) if rec else {})


@memoised(maxsize=1 << 15)
def _layers_streams(model, shard, batch, seq, policy, profile, recomputes: bool) -> tuple:
    """One micro-batch's layers, every one (at its kind's lists where they differ, `ffn_kinds`), the recomputed ones
    again: (compute-stream seconds, {link: (its collectives' seconds alone, summed; the fewest SMs one holds)})."""
    n, kinds = model.layers, ffn_kinds(model)
    of = ({k: _layer_streams(kind_model(model, k), shard, batch, seq, policy, profile) for k in dict.fromkeys(kinds)}
          if kinds else {None: _layer_streams(model, shard, batch, seq, policy, profile)})
    work, links = 0.0, {}
    for i in range(n):
        fb_on, r_on, fb_links, r_links = of[kinds[i] if kinds else None]
        again = recomputes and policy.recomputes_layer(i, n)
        work += fb_on + (r_on if again else 0.0)
        for link, (w, held) in (*fb_links.items(), *(r_links.items() if again else ())):
            had, few = links.get(link, (0.0, float("inf")))
            links[link] = (had + w, min(few, held))
    return work, links


def _contention_seconds(c, m: int, recomputes: bool, sync, stream: float) -> float:
    """The single stage's links and SMs (module docs). Links: each of the GPU's links (its NVLink port, its share
    of the node's NICs) carries its collectives one fluid flow each, at most its capacity in all, so the iteration
    lasts at least the seconds alone of every collective on one link, summed: the layers' (every micro-batch, the
    recomputed ones again) and, on the data-parallel group's link, the data-parallel stream's. SMs: while any of
    these communication kernels runs (at least ``u`` seconds, the longest of those sums and ``stream``) the layers'
    kernels (``work`` seconds one after another at their stand-alone times) run at most at the SM share the
    fewest SMs a kernel among them holds leave (`memo_sim.cost.comm_sms.compute_share`), so an iteration of ``T``
    runs ``work <= (T - u) + share x u``: ``T >= work + (1 - share) x u``."""
    work, links = _layers_streams(c.model, per_gpu_shard(c.layout), c.micro_batch or c.batch, c.seq, c.policy,
                                  c.profile, recomputes)
    nccl, none = nccl_sms(c.profile), float("inf")
    busy = [(stream, nccl)] if stream > 0.0 else []  # (seconds some communication kernels run, the fewest SMs one holds)
    for link, (w, held) in links.items():
        dp = stream > 0.0 and link == sync.link
        busy.append((m * w + (stream if dp else 0.0), min(held, nccl) if dp else held))
    work *= m
    return max((max(u, work + (1.0 - (compute_share(held, c.profile) if held < none else 1.0)) * u)
                for u, held in busy if u > 0.0), default=0.0)


@register_bound("1f1b", "interleaved_1f1b")
def pipeline_bound(c) -> float:
    return pipeline_iteration_bound(c.model, c.layout, c.policy, c.batch, c.micro_batch, c.seq, c.profile)


def pipeline_iteration_bound(model, lay, policy, batch: int, micro_batch: int, seq: int, profile) -> float:
    """`pipeline_bound` of a micro-batch pipeline candidate; ``policy`` None: its recompute left
    out, a bound for every policy of the layout, batch split and schedule at once (a policy
    adds recompute chains, never removes an op: `pipeline_family_tgs_bound`). Each rank's units, and micro-batch
    0's way through the ranks before it, at that rank's own layer times (`memo_sim.layout.parallel.stage_shards`:
    the shard the micro-batch pipeline prices the rank's layers on, `PipelineCosts.stage_phases`; one shard for
    every rank where every stage's groups sit alike)."""
    p = lay.pp
    mb = micro_batch
    m = batch // mb
    shard = stage_shard(lay)
    shards = stage_shards(lay, profile.node_gpus)
    # a policy that re-runs whole layers re-runs the multi-token-prediction modules too; None: left out as recompute is
    # (the head on the last rank's own shard, as the micro-batch pipeline prices it)
    bt = pipeline_boundary_times(model, shard, shards[-1], mb, seq, profile,
                                 recompute_mtp=policy is not None and policy.recomputes_mtp)
    opt0 = stage_optimizer_time(model, lay, 0, profile)
    # rank s cannot start before micro-batch 0 has run forward through virtual stages 0 .. s-1 (chunk 0 of
    # ranks 0 .. s-1), then runs its own units, then micro-batch 0's backward returns through them
    vr = lay.virtual_stage_ranges(model.layers)
    counts = stage_layer_counts(model, lay)
    # each layer's forward, backward and recompute: its attention kind's where those differ (the chains the
    # micro-batch pipeline emits per layer, `memo_sim.engine.schedules.microbatch.PipelineCosts.phases_of`)
    kinds = layer_kinds(model)

    def shard_times(sh) -> tuple:  # (r, the least r, forward, backward and both per layer) on one shard
        if policy is None:
            f, b = _forward_backward_times(model, sh, mb, seq, profile)
            r = 0.0
        else:
            f, b, r = _phase_times(model, sh, mb, seq, policy, profile)
        times = {k: _phase_times(kind_model(model, k), sh, mb, seq, policy, profile) if policy is not None
                 else (*_forward_backward_times(kind_model(model, k), sh, mb, seq, profile), 0.0)
                 for k in distinct_kinds(model)}

        def fbr(i: int) -> tuple[float, float, float]:
            return times[kinds[i]] if kinds else (f, b, r)

        r_least = min((t[2] for t in times.values()), default=r)  # the recomputed units' count, not which: the least
        # per layer once (a family's ranks each walked every layer before them: O(pp x layers) calls a family, 5.2 of
        # a 15 s cluster-scale what-if, 2026-12-02); the sums keep their order, so every bound is the same to the bit
        per_layer = [fbr(i) for i in range(model.layers)]
        both = [sum(t[:2]) for t in per_layer]
        if lay.ep_overlap:  # a merged step hides collectives under the other micro-batch's compute: a rank's own units
            # are bounded by their compute-stream seconds alone (module docs), the recompute's by the least chain's
            on = {k: sum(ep_overlap_times(kind_model(model, k), sh, mb, seq, profile)[1:]) for k in distinct_kinds(model)}
            plain = sum(ep_overlap_times(model, sh, mb, seq, profile)[1:])
            both = [on[kinds[i]] if kinds else plain for i in range(model.layers)]
            r_least = min(r_least, _recompute_on_compute(model, sh, mb, seq, policy, profile)) if r > 0 else r_least
        return r, r_least, [t[0] for t in per_layer], [t[1] for t in per_layer], both

    own_times = [(sh, shard_times(sh)) for sh in distinct_shards(shards)]
    of = [next(t for o, t in own_times if o is sh) for sh in shards]  # each rank's shard's times
    ahead_f = ahead_b = 0  # micro-batch 0's forward and backward through virtual stages 0 .. s-1, summed in order
    best = 0.0
    for s in range(p):
        r, r_least, _fwd, _bwd, both = of[s]
        fwd, bwd = of[s - 1][2], of[s - 1][3]  # virtual stage s-1 is rank s-1's chunk 0
        n_f = m * counts[s]  # forward units of the rank
        recomputed = policy.recomputed_count(n_f) if r > 0 else 0
        # the rank's layers over its chunks (chunk c is virtual stage c x pp + s: `stage_layer_indices`)
        own = m * sum(both[i] for c in range(lay.vpp) for i in vr[c * p + s]) + recomputed * r_least
        own += m * (bt.embedding if s == 0 else 0.0) + m * (bt.classifier if s == p - 1 else 0.0)
        if s:
            for i in vr[s - 1]:
                ahead_f += fwd[i]
                ahead_b += bwd[i]
        lead = bt.embedding_fwd + ahead_f if s else 0.0
        tail = ahead_b + bt.embedding_bwd if s else 0.0
        best = max(best, lead + own + tail + opt0)
    return best


def pipeline_family_tgs_bound(model, lay, batch: int, micro_batch: int, seq: int, profile) -> float:
    """The most tokens per GPU per second any candidate of one micro-batch pipeline family (a
    layout with its chunks, batch and micro-batch size, in 1F1B or interleaved 1F1B: every policy,
    MEMO at any alpha) can reach in the simulator: the tokens over `pipeline_iteration_bound`
    without recompute. Each policy's own bound adds its recompute chains to the same chains, so
    its bound is at least this one's iteration time. Read before the family is built
    (`memo_sim.search.pipeline.pipeline_candidates`' ``floor``)."""
    lb = pipeline_iteration_bound(model, lay, None, batch, micro_batch, seq, profile)
    return tgs(batch * lay.dp, seq, lb, lay.gpus) if lb > 0 else float("inf")


@register_bound("sppo")
def sppo_bound(c) -> float:
    """SPPO's (stage, piece) recurrence with every copy and weight-gather wait left out
    (`memo_sim.search.sppo.estimate.recurrence` with ``copies=False``), at the exact piece timer.

    Why it is a lower bound on the simulated iteration (`memo_sim.engine.schedules.sppo` wires
    every edge used here; each op lasts at least its ``work``: a kernel beside host copies runs
    slower, a send or collective sharing a link gets less of it):

    - forward: piece k of stage s starts after piece k-1 of stage s has ended (its first op
      depends on that piece's last) and after the forward sends of the overlapping pieces of
      stage s-1, each of which starts after that piece's forward on s-1 and lasts at least its
      latency plus bytes over bandwidth; it then runs its embedding (stage 0), one compute chain
      per layer of the stage (at least the chain's critical time, the piece timer's value, in the
      ``units`` detail too: `collapse_unit` keeps the chain's compute and collective seconds) and
      its classifier forward and backward (last stage), one after another;
    - backward: pieces in reverse order, piece k after piece k+1 of the same stage and after the
      backward sends of the overlapping pieces of stage s+1 (the last stage's first backward after
      its last classifier); the same chains backward, and stage 0's embedding backward per piece;
    - the end: the stage's gradient buckets run one after another on its data-parallel stream,
      the last starting after the stage's last layer unit, the end stages' embedding bucket after
      the stage's last op; the optimizer step starts after the stage's last op and the last bucket.

    What it omits, each of which only delays an op: the offload each unit's last op waits for
    under the rounding-buffer rule, the prefetch each backward unit waits for, ZeRO's weight
    gathers, the p2p stream's order (a stage's sends one at a time), contention for links and
    memory bandwidth, and the caching allocator's stalls. So every term is the length of a chain
    of ops the simulator runs in that order, and the iteration lasts at least the longest.
    Checked against the simulator over random SPPO candidates (tests/test_search_prune.py)."""
    return max(recurrence(c.model, c.layout, c.batch, c.policy, c.profile, copies=False).stage_end)


__all__ = ["lower_bound", "pipeline_bound", "pipeline_family_tgs_bound", "pipeline_iteration_bound",
           "register_bound", "single_stage_bound", "sppo_bound"]
