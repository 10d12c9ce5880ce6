"""Analytic iteration estimate: perfect overlap, no link contention (tier 1 of the what-if).

Per layer on one GPU (from `memo_sim.cost.layer_time`):
- F = forward critical time, Bw = backward critical time, R = recompute time (full forward for
  full_recompute, (1-alpha) of the token-wise ops for memo), O / P = offload / prefetch time of
  the layer's host bytes at the per-GPU share of the host links while every GPU of the node copies.
- Offloaded layers (all but the last two) run forward at max(F, O): layer i+2 waits until buffer
  i%2 is on the host. Their backward runs at max(Bw + R, P): layer i's prefetch runs while layer
  i+1 computes its backward. The last two layers keep their activations in the rounding buffers.
- ``batch`` is sequences per data-parallel replica (the iteration trains batch x dp sequences).
- Iteration = embedding + sum of layer forwards + classifier (forward + backward) + sum of layer
  backwards + exposed gradient sync (the last layer's bucket; the rest overlaps the backward)
  + the exposed part of ZeRO's weight gathers + optimizer step. Without gradient overlap
  (``layout.grad_overlap`` off) the whole gradient reduction is exposed. Embedding, classifier and
  optimizer come from `memo_sim.cost.boundary`, the collectives from `memo_sim.cost.grad_sync`,
  as in the event schedule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from memo_sim.cost.activations import layer_rows, skeletal_bytes
from memo_sim.cost.boundary import boundary_times, pipeline_boundary_times
from memo_sim.cost.comm_sms import compute_share, nccl_sms
from memo_sim.model.flops import mfu, model_flops_per_iteration, tgs
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.memo import memoised, memoised_by, profile_key
from memo_sim.cost.optimizer_offload import host_state_bytes
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.cost.layer_time import backward_costs, critical_time, forward_costs
from memo_sim.cost.transfer import host_bandwidth_per_gpu, host_copy_time
from memo_sim.engine.schedules.ep_overlap import (
    delay_weight_grads, merged_pairs, overlapped_order, pair_seconds, split_layer,
)
from memo_sim.engine.schedules.microbatch import pipeline_order
from memo_sim.cost.sppo import stage_split_key
from memo_sim.layout.parallel import Layout, distinct_shards, stage_shard, stage_shards
from memo_sim.memplan.trace_gen import per_gpu_shard
from memo_sim.model.layer_kinds import distinct_kinds, ffn_kinds, kind_model, kinds_of
from memo_sim.model.config import ModelConfig
from memo_sim.policy.alpha import AlphaProblem, AlphaResult, solve_alpha_closed_form
from memo_sim.policy.base import Policy
from memo_sim.policy.host_layout import offload_token_count
from memo_sim.policy.registry import get_policy
from memo_sim.policy.rounding_buffers import offloaded_layer_count
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True)
class LayerTimes:
    forward: float
    backward: float
    recompute: float
    offload: float
    prefetch: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class IterationEstimate:
    iteration_s: float
    mfu: float
    tgs: float
    layer: LayerTimes
    embedding_s: float
    classifier_s: float
    grad_sync_exposed_s: float
    optimizer_s: float
    exposed_copy_s: float  # compute stalls waiting for offload / prefetch, whole iteration

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer"] = self.layer.to_dict()
        return d


def active_gpus_per_node(layout: Layout, profile: HardwareProfile) -> int:
    return min(layout.gpus, profile.node_gpus)


@memoised()
def _forward_backward_times(model: ModelConfig, layout: Layout, batch: int, seq: int,
                            profile: HardwareProfile) -> tuple[float, float]:
    """Critical seconds of one layer's forward and backward (policy-independent, memoised)."""
    return (critical_time(forward_costs(model, layout, batch, seq, profile)),
            critical_time(backward_costs(model, layout, batch, seq, profile)))


@memoised()
def compute_stream_times(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         profile: HardwareProfile) -> tuple[float, float]:
    """One layer's forward's and backward's compute-stream seconds: every kernel of the layer, one after another on
    the compute stream, each at its stand-alone time (what no overlap takes off a rank's compute stream; the proved
    bounds', `memo_sim.search.bound`)."""
    return (sum(c.seconds for c in forward_costs(model, layout, batch, seq, profile) if c.stream == "compute"),
            sum(c.seconds for c in backward_costs(model, layout, batch, seq, profile) if c.stream == "compute"))


@memoised()
def ep_overlap_times(model: ModelConfig, layout: Layout, batch: int, seq: int,
                     profile: HardwareProfile) -> tuple[float, float, float]:
    """One layer under `Layout.ep_overlap` (`memo_sim.engine.schedules.ep_overlap`): (seconds a merged step saves on
    it, the forward and backward as alone minus the pair as `pair_seconds` prices its segments; its forward's and its
    backward's compute-stream seconds, what no overlap takes off a rank's compute stream: the bound's,
    `memo_sim.search.bound`). The saving is 0 where the layer's dispatcher moves nothing."""
    fwd, bwd = forward_costs(model, layout, batch, seq, profile), backward_costs(model, layout, batch, seq, profile)
    on_compute = compute_stream_times(model, layout, batch, seq, profile)
    fs, bs = split_layer(fwd, backward=False), split_layer(bwd, backward=True)
    if fs is None or bs is None:
        return 0.0, *on_compute
    dgrad, wgrad = delay_weight_grads(bs["mlp"])
    ft = {k: critical_time(v) for k, v in fs.items()}
    bt = {k: critical_time(v) for k, v in bs.items()}
    bt["mlp"] = critical_time(dgrad)
    pair = pair_seconds(ft, bt, critical_time(wgrad))
    return max(0.0, critical_time(fwd) + critical_time(bwd) - pair), *on_compute


def kind_layer_times(model: ModelConfig, kind, shard: Layout, batch: int, seq: int, policy: Policy,
                     profile: HardwareProfile, active: int) -> LayerTimes:
    """A layer of ``kind`` (`memo_sim.model.layer_kinds`): its own forward, backward and recompute, and the repeated
    layer's offload and prefetch, whose bytes every layer moves (the schedules copy the repeated layer's activations:
    a layer's memory terms are the repeated layer's)."""
    own, rep = (_layer_times(kind_model(model, kind), shard, batch, seq, policy, profile, active),
                _layer_times(model, shard, batch, seq, policy, profile, active))
    return LayerTimes(own.forward, own.backward, own.recompute, rep.offload, rep.prefetch)


def layer_times(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                profile: HardwareProfile) -> LayerTimes:
    """Memoised per (model, per-GPU shard, batch, seq, policy, profile, active GPUs of the node):
    DP and ZeRO do not change one layer's op lists or copy bytes."""
    return _layer_times(model, per_gpu_shard(layout), batch, seq, policy, profile,
                        active_gpus_per_node(layout, profile))


@memoised(maxsize=1 << 14)
def _layer_times(model: ModelConfig, shard: Layout, batch: int, seq: int, policy: Policy,
                 profile: HardwareProfile, active: int) -> LayerTimes:
    f, b = _forward_backward_times(model, shard, batch, seq, profile)
    r = critical_time(policy.recompute_costs(model, shard, batch, seq, profile))
    nbytes = policy.offload_bytes(model, shard, batch, seq)
    o = host_copy_time(nbytes, profile, "d2h", active)
    p = host_copy_time(nbytes, profile, "h2d", active)
    return LayerTimes(f, b, r, o, p)


def memo_alpha(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
               solver=solve_alpha_closed_form, units: int | None = None, active: int | None = None) -> AlphaResult:
    """MEMO's alpha for this layout from profiled layer sizes and forward time.

    ``units``: layer blocks one GPU holds on host at once (default: the model's offloaded layers,
    one iteration of one micro-batch); a pipeline stage holds its layers of every micro-batch in
    flight (`memo_sim.search.pipeline`). ``batch`` is one micro-batch's sequences. ``active``: the GPUs of a
    node that share its host memory and copy at once (default: the layout's GPUs on one node; a pipeline's
    stage, solved on its shard without the pipeline, passes its whole layout's: every stage's GPUs there).

    The continuous problem's alpha is floored to whole token rows, and host memory is checked
    with the bytes exactly as the executor allocates them (`memo_sim.policy.host_layout`); where
    that check fails the row count is lowered until it holds (binary search: host bytes grow
    with the rows), so the result never exceeds a constraint."""
    sk = skeletal_bytes(model, layout, batch, seq)
    f = _forward_backward_times(model, per_gpu_shard(layout), batch, seq, profile)[0]
    active = active or active_gpus_per_node(layout, profile)
    bw = host_bandwidth_per_gpu(profile, "d2h", active)
    # the copy latency is paid once per layer: take it off the time budget
    budget = max(0.0, f - float(profile.host_link.latency))
    # the host memory one GPU's share leaves for MEMO's blocks: less the optimizer states it holds there
    m_cpu = max(0.0, profile.host_capacity(active) / active
                - host_state_bytes(model, layout, model_gpu_params(model, layout)))
    res = solver(AlphaProblem(sk["input"], sk["attn"], sk["other"], bw, budget, model.layers, m_cpu, units))
    if not res.feasible:
        return res
    rows = layer_rows(layout, batch, seq)
    k = max(1, offloaded_layer_count(model.layers) if units is None else units)

    def host_ok(n: int) -> bool:
        pol = get_policy("memo", n / rows)
        return k * pol.host_bytes_per_layer(model, layout, batch, seq, profile) <= m_cpu

    hi = offload_token_count(res.alpha, rows)
    if host_ok(hi):
        return replace(res, alpha=hi / rows)
    if not host_ok(0):
        return AlphaResult(None, "host_memory", False, res.solver)
    lo = 0  # host_ok(lo) holds, host_ok(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if host_ok(mid) else (lo, mid)
    return AlphaResult(lo / rows, "host_memory", True, res.solver)


def dp_stream_seconds(sync, n_layers: int, micro_batches: int, zero: int) -> float:
    """The single stage's data-parallel stream, busy for an iteration (`memo_sim.engine.schedules.single_stage`
    issues every weight gather and gradient reduction on it, one after another): each layer's, the embedding's, the
    head's and the multi-token-prediction modules' gathers (again before the backward under ZeRO-3; every
    micro-batch there) and every gradient's reduction (every micro-batch under ZeRO-2 and 3)."""
    twice = 2 if sync.gather_in_backward else 1
    gathers = ((n_layers * sync.layer_gather + sync.mtp_gather) * twice + sync.head_gather
               + sync.embedding_gather * (1 if sync.embedding_kept else twice))
    grads = sync.all_grads if sync.active else 0.0
    return (gathers * (micro_batches if zero >= 3 else 1) + grads * (micro_batches if zero >= 2 else 1)
            + sync.step_gather)


def estimate_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                       profile: HardwareProfile, micro_batch: int | None = None) -> IterationEstimate:
    """The single stage (module docs). ``micro_batch`` (default ``batch``): gradient accumulation
    over ``batch / micro_batch`` micro-batches, each layer's work at the micro-batch's size; the
    gradient sync's exposed tail and ZeRO-1/2's gathers once per iteration (ZeRO-2 reduces, ZeRO-3
    gathers, every micro-batch), the optimizer step once."""
    full = batch
    if micro_batch is not None and micro_batch != batch:
        batch = micro_batch
    m = full // batch
    lt = layer_times(model, layout, batch, seq, policy, profile)
    n = model.layers
    n_off = policy.offloaded_layers(n)
    # the layers' times by kind where they differ (a mixture of experts' dense layers, `memo_sim.model.layer_kinds`),
    # in groups of (how many, their times, offloaded): the repeated layer's, offloaded and kept, where they do not
    kinds = ffn_kinds(model)
    if kinds:
        active = active_gpus_per_node(layout, profile)
        of_kind = {k: kind_layer_times(model, k, per_gpu_shard(layout), batch, seq, policy, profile, active)
                   for k in dict.fromkeys(kinds)}
        per_layer = [of_kind[k] for k in kinds]
        counts: dict[tuple, int] = {}
        for i, k in enumerate(kinds):
            counts[(k, i < n_off)] = counts.get((k, i < n_off), 0) + 1
        groups = [(c, of_kind[k], off) for (k, off), c in counts.items()]
    else:
        per_layer = [lt] * n
        groups = [(n_off, lt, True), (n - n_off, lt, False)]
    fwd = sum(c * (max(t.forward, t.offload) if off else t.forward) for c, t, off in groups)
    # offloaded layers: the prefetch runs beside the previous layer's backward (and recompute)
    bwd = 0.0
    # ZeRO: a layer's weight gather is exposed where it outlasts the layer unit it runs beside (the next layer's is
    # issued one layer ahead): a forward as long as its offload where that is longer, a recompute and backward as
    # long as the prefetch beside them (a review: the gathers counted exposed beside the compute alone, so a faster
    # GPU's offload-bound plan was estimated slower)
    sync = grad_sync(model, layout, profile)
    gathers = sum(c * max(0.0, sync.layer_gather - (max(t.forward, t.offload) if off else t.forward))
                  for c, t, off in groups)
    for i in range(n):
        t = per_layer[i]
        r = t.recompute if policy.recomputes_layer(i, n) else 0.0
        unit = max(t.backward + r, t.prefetch) if i < n_off else t.backward + r
        bwd += unit
        if sync.gather_in_backward:
            gathers += max(0.0, sync.layer_gather - unit)
    exposed = sum(c * (max(0.0, t.offload - t.forward) + max(0.0, t.prefetch - t.backward - t.recompute))
                  for c, t, off in groups if off)
    lt_first, lt_last = per_layer[0], per_layer[-1]
    # FSDP2's copies on the compute stream, every micro-batch (`memo_sim.cost.grad_sync.GradSync.layer_copy_out`)
    fwd += n * sync.layer_copy_out
    bwd += n * (sync.layer_copy_out * sync.gather_in_backward + sync.layer_copy_in * sync.overlapped)
    bt = boundary_times(model, layout, batch, seq, profile, recompute_mtp=policy.recomputes_mtp)
    sync_exposed = sync.all_grads / n if sync.overlapped else sync.all_grads
    # the multi-token-prediction modules' weights, gathered beside the last layer's forward (twice under ZeRO-3)
    gathers += max(0.0, sync.mtp_gather * (2 if sync.gather_in_backward else 1) - lt_last.forward)
    # the embedding's unit before the step's first op (nothing to hide it; again beside the first layer's backward
    # under ZeRO-3), the head's beside the last layer's forward (`memo_sim.cost.grad_sync`)
    gathers += sync.embedding_gather + max(0.0, sync.head_gather - lt_last.forward)
    if sync.gather_in_backward and not sync.embedding_kept:
        gathers += max(0.0, sync.embedding_gather - lt_first.backward)
    gathers += sync.step_gather  # ZeRO-1/2 gathering after the step: nothing beside it (`memo_sim.cost.grad_sync`)
    if m == 1:
        total = bt.embedding + fwd + bt.classifier + bwd + sync_exposed + gathers + bt.optimizer
    else:
        sync_exposed *= m if layout.zero >= 2 else 1
        gathers *= m if layout.zero >= 3 else 1  # ZeRO 3 / FSDP: every micro-batch's forward gathers again
        exposed *= m
        total = m * (bt.embedding + fwd + bt.classifier + bwd) + sync_exposed + gathers + bt.optimizer
    # overlap is perfect but the data-parallel stream runs one collective at a time: its gathers and reductions
    # together (FSDP's fp32 reduce-scatters can outlast the backward they run beside: a review found the estimate
    # at half the simulated step for Llama-3.1-8B over 64 GPUs at 4K)
    # its collectives hidden beside the compute hold NCCL's SMs meanwhile: the kernels beside them run on the rest
    # (`memo_sim.cost.comm_sms`), the step longer by the hidden seconds times the SMs' share they take
    dp_s = dp_stream_seconds(sync, n, m, layout.zero)
    total += max(0.0, dp_s - sync_exposed - gathers) * (1.0 - compute_share(nccl_sms(profile), profile))
    total = max(total, dp_s + bt.optimizer)
    return IterationEstimate(
        iteration_s=total, mfu=mfu(model, full * layout.dp, seq, total, layout.gpus, profile.peak(model.dtype)),
        tgs=tgs(full * layout.dp, seq, total, layout.gpus), layer=lt, embedding_s=bt.embedding * m,
        classifier_s=bt.classifier * m, grad_sync_exposed_s=sync_exposed + gathers,
        optimizer_s=bt.optimizer, exposed_copy_s=exposed)


def estimate_pipeline(model: ModelConfig, layout: Layout, batch: int, micro_batch: int, seq: int, policy: Policy,
                      profile: HardwareProfile) -> IterationEstimate:
    """The micro-batch pipelines (1F1B, and interleaved 1F1B with ``layout.vpp`` chunks per rank;
    `memo_sim.engine.schedules.microbatch`), analytically: ``batch / micro_batch`` = m micro-batches.

    Per stage and micro-batch the forward time is its layers' ``max(F, O)`` (offloading policies;
    F alone otherwise) plus the embedding (first stage) or the classifier (last stage), the
    backward its layers' ``max(Bw + R, P)`` plus the embedding's backward; W_s = forward +
    backward. With v chunks per rank the iteration is

        (m - 1)·max_s W_s + sum_s W_s / v + (1 - 1/v)·max_s W_s + 2·sum_hops P2P

    which for equal stages is (m + (p - 1)/v)·W: the bubble (p - 1)/(v·m) of the work (1F1B:
    v = 1, (p - 1)/m), plus the fill and drain's P2P sends (one per hop each way; the steady
    state's sends overlap compute). Then the last gradient bucket of a stage (FSDP beside stages:
    its last chunk's buckets, sent after that chunk's backward; with ``grad_overlap``
    off: the slowest stage's reduction of all its gradients at once), ZeRO-1's exposed
    weight gathers (each layer's first forward), the end stages' sum of a shared embedding's gradient
    and the slowest stage's optimizer step. Each stage's layers are priced on its own shard
    (`memo_sim.layout.parallel.stage_shards`: where its groups sit; one shard for every stage where they sit
    alike), the per-layer terms (gathers, exposed copies) at the worst shard's."""
    from memo_sim.cost.sppo import stage_grad_sync, stage_layer_counts, stage_layer_indices

    p, v = layout.pp, layout.vpp
    m = batch // micro_batch
    shard = stage_shard(layout)
    active = active_gpus_per_node(layout, profile)
    shards = stage_shards(layout, profile.node_gpus)
    own = distinct_shards(shards)  # [shard] where every stage's groups sit alike
    lts = [_layer_times(model, sh, micro_batch, seq, policy, profile, active) for sh in own]
    lt = lts[0]  # stage 0's
    per_stage = stage_layer_counts(model, layout)
    per = max(per_stage)  # the fullest stage's layers: its weight gathers and exposed copies per micro-batch
    recomputes = policy.recomputes_layer(0, model.layers)

    def units(t: LayerTimes) -> float:  # one layer's forward and backward units (module docs)
        r = t.recompute if recomputes else 0.0
        f_unit = max(t.forward, t.offload) if policy.offloads else t.forward
        return f_unit + (max(t.backward + r, t.prefetch) if policy.offloads else t.backward + r)

    # a stage's layers at their kinds' times where those differ (`memo_sim.model.layer_kinds`), on its own shard
    by_kinds = [{k: units(kind_layer_times(model, k, sh, micro_batch, seq, policy, profile, active))
                 for k in distinct_kinds(model)} for sh in own]
    at = [next(i for i, o in enumerate(own) if o is sh) for sh in shards]  # each stage's shard in ``own``
    layers_work = [sum(n * by_kinds[at[s]][k] for k, n in kinds_of(model, stage_layer_indices(model, layout, s)).items())
                   if by_kinds[at[s]] else per_stage[s] * units(lts[at[s]]) for s in range(p)]
    bt = pipeline_boundary_times(model, shard, shards[-1], micro_batch, seq, profile,
                                 recompute_mtp=policy.recomputes_mtp)
    work = [layers_work[s] + (bt.embedding if s == 0 else 0.0) + (bt.classifier if s == p - 1 else 0.0)
            for s in range(p)]
    hops, serial, opt = _stage_terms(model, layout, micro_batch, seq, profile)
    top = max(work)
    pipe = (m - 1) * top + sum(work) / v + (1 - 1 / v) * top + hops
    if layout.ep_overlap:  # the merged steps' saving on the fullest stage: rank 0's merged steps, as the schedule's
        # order gives them (`memo_sim.engine.schedules.ep_overlap.merged_pairs`), each of its chunk's layers
        merged = len(merged_pairs(overlapped_order(pipeline_order("interleaved_1f1b")), p, m, v, 0))
        saved = max(ep_overlap_times(model, sh, micro_batch, seq, profile)[0] for sh in own)
        pipe -= merged * (per / v) * saved
    sync = stage_grad_sync(model, layout, profile)
    # overlapped: the last bucket (FSDP beside stages: the last chunk's, after its backward); serial
    # (``grad_overlap`` off): the slowest stage's whole reduction
    if layout.grads_reduced_per_chunk:  # each rank's last backward is its chunk 0's (virtual stage s)
        vr = layout.virtual_stage_ranges(model.layers) if layout.uneven else None
        last = max(len(vr[s]) for s in range(p)) if vr else -(-per // v)
    else:
        last = 1
    sync_exposed = last * sync.layer_grad if sync.overlapped else serial
    # each layer's gather beside the forward unit before it (as long as its offload where that is longer); where
    # the stages' shards differ, the shard that hides the least
    gathers = exposed = 0.0
    for t in lts:
        r = t.recompute if recomputes else 0.0
        f_unit = max(t.forward, t.offload) if policy.offloads else t.forward
        gathers = max(gathers, per * max(0.0, sync.layer_gather - f_unit) + max(0.0, sync.mtp_gather - t.forward)
                      + sync.embedding_gather + max(0.0, sync.head_gather - t.forward))  # the end stages' units
        exposed = max(exposed, m * per * (max(0.0, t.offload - t.forward) + max(0.0, t.prefetch - t.backward - r))
                      if policy.offloads else 0.0)
    # the end stages' sum of the embedding they share, after the last bucket (`memo_sim.cost.grad_sync`)
    sync_exposed += sync.shared_embedding
    total = pipe + sync_exposed + gathers + opt
    return IterationEstimate(
        iteration_s=total, mfu=mfu(model, batch * layout.dp, seq, total, layout.gpus, profile.peak(model.dtype)),
        tgs=tgs(batch * layout.dp, seq, total, layout.gpus), layer=lt, embedding_s=bt.embedding * m,
        classifier_s=bt.classifier * m, grad_sync_exposed_s=sync_exposed + gathers, optimizer_s=opt,
        exposed_copy_s=exposed)


@memoised_by(lambda model, layout, micro_batch, seq, profile: (
    model, layout.tp, layout.sp, layout.cp, layout.ulysses, layout.dp, layout.zero, micro_batch, seq,
    stage_split_key(model, layout), layout.optimizer_offload, layout.ep, layout.etp, layout.dp_mode,
    layout.fsdp_shard, layout.reshard_after_forward, layout.rank_order, profile_key(profile)))
def _stage_terms(model: ModelConfig, layout: Layout, micro_batch: int, seq: int,
                 profile: HardwareProfile) -> tuple[float, float, float]:
    """A pipeline's per-stage terms, policy-independent (memoised by the degrees they read: every
    policy, virtual-stage count and TP flavour of a layout asks): the fill and drain's P2P sends
    (one per hop each way), the slowest stage's serial gradient reduction and its optimizer step.
    A stage enters them only by its link to the next (P2P) and its parameters (the first, the
    last and the middle stages differ), so each distinct value is computed once and the sum and
    maxima are taken over the same values in the same order as stage by stage."""
    from memo_sim.cost.sppo import p2p_link, p2p_link_time, stage_optimizer_time, stage_serial_grad_reduce

    p = layout.pp
    per_link: dict[str, float] = {}
    for s in range(p - 1):
        link = p2p_link(layout, profile, s)
        if link not in per_link:
            per_link[link] = p2p_link_time(model, layout, micro_batch, seq, profile, link)
    hops = 2 * sum(per_link[p2p_link(layout, profile, s)] for s in range(p - 1))
    # stages 1 .. p-2 hold the same parameters (first / last counts, the embedding and loss slots); chunks of their
    # own counts, or a MoE model's dense layers falling into some, may give every stage its own
    kinds = range(p) if layout.chunk_layers or model.mixes_dense_layers else sorted({0, p - 1} | ({1} if p > 2 else set()))
    serial = max(stage_serial_grad_reduce(model, layout, profile, s) for s in kinds)
    return hops, serial, max(stage_optimizer_time(model, layout, s, profile) for s in kinds)


def pipeline_bubble(pp: int, vpp: int, micro_batches: int) -> float:
    """Idle time of a stage relative to its work with equal stage times: (p - 1)/(v·m)."""
    return (pp - 1) / (vpp * micro_batches)


__all__ = ["IterationEstimate", "LayerTimes", "stage_shard", "estimate_iteration", "estimate_pipeline", "layer_times", "memo_alpha",
           "model_flops_per_iteration", "pipeline_bubble"]
