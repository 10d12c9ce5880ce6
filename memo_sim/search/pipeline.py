"""Search strategy of the micro-batch pipelines (``1f1b``, ``interleaved_1f1b``): which pipeline
layouts, virtual stages and micro-batch sizes the what-if tries, and their analytic memory.

**Space.** pp among the divisors of the GPU count (> 1) that split the layers evenly, each with
the single stage's degrees inside a stage (TP with or without SP, METP's flavours the what-if
asks for, ring CP, Ulysses; DP beside;
ZeRO 0 or 1, or FSDP as torchtitan runs it beside stages, `memo_sim.layout.parallel.check_layout`); ``1f1b`` with one chunk per rank,
``interleaved_1f1b`` with v = 2 .. `MAX_VPP` chunks where the layers split into pp·v chunks and
the micro-batch count is a multiple of pp; micro-batch sizes among the divisors of the batch
(`micro_batch_sizes`). ``--pp``, ``--vpp`` and ``--micro-batch`` fix them.

**Memory** (`pipeline_memory`, tier 1): per stage, its model states (its layers, the embedding on
the first, the classifier on the last, `memo_sim.cost.sppo.stage_model_state_bytes`) + the
policy's forward-kept bytes of every layer of every chunk in flight (the count read off the
schedule's own order, `memo_sim.engine.schedules.microbatch.stage_in_flight`: 1F1B holds
min(p - s, m) micro-batches on stage s, the interleaved schedule its longer warm-up's chunks)
+ the policy's static buffers (`Policy.pipeline_rank_blocks`: an offloading policy's rounding-buffer
slots twice, forward slots and the prefetch slots of the backward beside them, which the rank's
micro-batches share; else its buffers once) + one layer's working block or the classifier's; host
bytes per node sum, over the stages whose GPUs the node holds, each GPU's offloaded layers in
flight. MEMO's alpha is solved with that count of host blocks per GPU
(`memo_sim.search.estimate.memo_alpha` ``units``). The fullest stage is the candidate's memory.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache, partial
from typing import Callable, NamedTuple

from memo_sim.cost.memo import memoised, memoised_by
from memo_sim.cost.memory import mtp_activation_bytes
from memo_sim.cost.sppo import stage_model_state_bytes, stage_split_key
from memo_sim.errors import MemoError
from memo_sim.engine.schedules.microbatch import (
    micro_batch_pipelines, stage_in_flight, stage_in_flight_layers, takes_virtual_stages,
)
from memo_sim.layout.alloc_conf import gpu_limit_bytes
from memo_sim.layout.parallel import (
    ExpertChoice, Layout, _divisors, check_layout, enumerate_layouts, node_stage_gpus, uneven_split, with_ep_overlap,
    virtual_split_why_not,
)
from memo_sim.layout.schedule import check_schedule
from memo_sim.layout.rank_order import DEFAULT_RANK_ORDER, order_variants
from memo_sim.memplan.footprint import MemoryBreakdown, memory_breakdown
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy, policy_class
from memo_sim.policy.base import Policy
from memo_sim.policy.rounding_buffers import KEPT_LAYERS
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.bound import pipeline_family_tgs_bound
from memo_sim.search.prune import below
from memo_sim.search.candidate import PIPELINE_HOST_WORDS, Candidate, _hosts_words, _rounding_words, need_of_capacity
from memo_sim.search.estimate import (
    active_gpus_per_node, estimate_pipeline, memo_alpha, pipeline_bubble, stage_shard,
)
from memo_sim.units import fmt_bytes

MAX_VPP = 4  # interleaving: up to this many chunks per rank (Megatron-LM's runs use 2-4; more adds P2P per micro-batch)
MAX_MICRO_BATCH_SIZES = 4  # the smallest divisors of the batch tried as micro-batch sizes


@memoised_by(lambda model, layout: (model, layout.tp, layout.state_shards, layout.zero >= 1,
                                    stage_split_key(model, layout), layout.optimizer_offload, layout.ep, layout.etp,
                                    layout.dp_mode, layout.fsdp_shard, layout.reshard_after_forward))
def _stage_states(model: ModelConfig, layout: Layout) -> tuple[float, ...]:
    """Each stage's model-state bytes on one GPU (memoised by what `stage_model_state_bytes`
    reads: every policy, micro-batch size and virtual-stage count of a layout asks)."""
    return tuple(stage_model_state_bytes(model, layout, s) for s in range(layout.pp))


def states_why_not(model: ModelConfig, layout: Layout, profile: HardwareProfile) -> str:
    """Why no candidate of a pipeline layout can fit ('' where one may): a stage's model states alone
    exceed the GPU's usable memory. Every candidate's peak on that stage is its model states plus
    bytes that are never negative (`pipeline_memory`: kept activations, buffers, the working block),
    whatever the policy, the micro-batch size or the schedule, so the family is decided without
    building it (a cluster-scale query's pipelines are mostly such families)."""
    states = _stage_states(model, layout)
    worst = max(range(layout.pp), key=states.__getitem__)
    cap = gpu_limit_bytes(profile, layout.alloc_conf)
    if states[worst] <= cap:
        return ""
    return (f"stage {worst}'s model states alone ({fmt_bytes(states[worst])}) exceed the GPU's usable "
            f"{fmt_bytes(cap)}: no policy, micro-batch or schedule fits")


def micro_batch_sizes(batch: int, fixed: int | None = None) -> list[int]:
    """Micro-batch sizes to try for ``batch`` sequences per replica: ``fixed``, else its smallest
    `MAX_MICRO_BATCH_SIZES` divisors (a smaller micro-batch holds fewer activations and, in a
    pipeline, shrinks the bubble)."""
    if fixed is not None:
        return [fixed]
    return _divisors(batch)[:MAX_MICRO_BATCH_SIZES]


def _host_units(model: ModelConfig, layout: Layout, in_flight: list[int], micro_batches: int,
                gpus_per_node: int, layers: tuple[int, ...] | None = None,
                ) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """(host layer blocks per GPU on the fullest node; per stage the layers it holds in flight, and
    of those the offloaded ones; the most offloaded layer blocks one node holds, its GPUs together).
    A rank's last `KEPT_LAYERS` forward layers stay on the GPU (`memo_sim.policy.rounding_buffers`):
    they count where the rank holds every forward at once (its peak then includes them).
    ``layers``: per stage the layers in flight where the chunks differ (`stage_in_flight_layers`).
    Memoised: every policy and micro-batch size of a layout asks."""
    return _host_units_of(model.layers, layout, tuple(in_flight), micro_batches, gpus_per_node, layers)


@memoised_by(lambda layout, gpus_per_node: (layout.stage_stride, layout.pp, layout.gpus, layout.rank_order,
                                            layout.dp, gpus_per_node))
def _node_patterns(layout: Layout, gpus_per_node: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The distinct (stage, GPUs) mixes of the nodes of `node_stage_gpus` (a thousand-GPU cluster's
    nodes repeat a few mixes; `_host_units_of` takes maxima over nodes, which repeats do not
    change), once per what it reads: the stage stride, pp, GPU count and rank order (layouts recur across
    micro-batches, virtual stages, ZeRO stages and TP flavours)."""
    return tuple(dict.fromkeys(tuple(per.items()) for per in node_stage_gpus(layout, gpus_per_node).values()))


@lru_cache(maxsize=1 << 16)  # a cluster-scale query has some 10k pipeline layouts
def _host_units_of(layers: int, layout: Layout, in_flight: tuple[int, ...], micro_batches: int,
                   gpus_per_node: int, layers_in_flight: tuple[int, ...] | None = None,
                   ) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    if layers_in_flight is not None:  # each rank's own chunk sizes, through the schedule's order
        units = layers_in_flight
    elif layout.uneven:  # without the order: in-flight chunk steps x the rank's largest chunk (an upper bound)
        vr, p = layout.virtual_stage_ranges(layers), layout.pp
        units = tuple(k * max(len(vr[c * p + s]) for c in range(layout.vpp)) for s, k in enumerate(in_flight))
    else:
        per_chunk = layers // (layout.pp * layout.vpp)
        units = tuple(k * per_chunk for k in in_flight)
    every = micro_batches * layout.vpp
    offloaded = tuple(max(0, u - KEPT_LAYERS) if k == every else u for u, k in zip(units, in_flight))
    # never more than the (layer, micro-batch) units the rank offloads over the iteration: every one but its last
    # KEPT_LAYERS (a review: the last stage of pp 2 with a layer a stage and 2 micro-batches offloads nothing, and was
    # charged a host block; memo-exec's pool, `PipelineSchedule.host_layers`, holds none)
    offloaded = tuple(min(o, max(0, micro_batches * n - KEPT_LAYERS))
                      for o, n in zip(offloaded, layout.stage_layer_counts(layers)))
    worst = node_units = 0
    for per in _node_patterns(layout, gpus_per_node):
        gpus = sum(n for _s, n in per)
        blocks = sum(offloaded[s] * n for s, n in per)
        worst = max(worst, -(-blocks // gpus))
        node_units = max(node_units, blocks)
    return worst, units, offloaded, node_units


@memoised(maxsize=1 << 14)
def _stage_unit_terms(model: ModelConfig, shard: Layout, micro_batch: int, seq: int, policy: Policy,
                      profile: HardwareProfile) -> tuple:
    """What one GPU of a stage holds per layer unit, whatever the pipeline around it (memoised per
    shard, micro-batch and policy): its single-stage memory (for the working block and the
    classifier), the forward-kept and lse bytes of one layer, the static buffers (an offloading
    policy's rank blocks), the pinned host block and the raw bytes one offloaded layer copies."""
    from memo_sim.cost.activations import skeletal_bytes

    one = memory_breakdown(model, shard, micro_batch, seq, policy, profile)
    sk = skeletal_bytes(model, shard, micro_batch, seq)
    kept = sum(b for _n, b in policy.forward_kept(sk))
    # the rank's own blocks (MEMO's forward and prefetch buffers), else the policy's buffers once (a recompute buffer)
    rank_blocks = sum(b for _n, b in policy.pipeline_rank_blocks(sk))
    buffers = rank_blocks or policy.buffer_bytes(sk)
    # a recompute buffer allocated for a layer's backward only (not beside the classifier: `MemoryBreakdown`)
    backward = 0.0 if rank_blocks else policy.backward_buffer_bytes(sk)
    host_block = policy.host_bytes_per_layer(model, shard, micro_batch, seq, profile) if policy.offloads else 0.0
    offload = policy.offload_bytes(model, shard, micro_batch, seq) if policy.offloads else 0.0
    return one, kept, sum(b for _n, b in policy.kept_lse(sk)), buffers, backward, host_block, offload


class _Shape(NamedTuple):
    """What every policy's candidate of one pipeline layout, batch split and schedule reads
    (`_shape`): computed once for them all by `pipeline_candidates`."""

    flights: list[int]  # micro-batches (chunks) in flight per stage
    host_units: tuple  # `_host_units`
    states: tuple[float, ...]  # `_stage_states`
    shard: Layout  # `stage_shard`


def _shape(model: ModelConfig, layout: Layout, batch: int, micro_batch: int, profile: HardwareProfile,
           schedule: str) -> _Shape:
    m = batch // micro_batch
    flights = stage_in_flight(schedule, layout.pp, m, layout.vpp, layout.ep_overlap)
    layers = None
    if layout.uneven:  # each rank's own chunk sizes, followed through the schedule's order
        vr, p = layout.virtual_stage_ranges(model.layers), layout.pp
        sizes = tuple(tuple(len(vr[c * p + s]) for c in range(layout.vpp)) for s in range(p))
        layers = tuple(stage_in_flight_layers(schedule, p, m, layout.vpp, sizes, layout.ep_overlap))
    return _Shape(flights, _host_units(model, layout, flights, m, profile.node_gpus, layers),
                  _stage_states(model, layout), stage_shard(layout))


def pipeline_memory(model: ModelConfig, layout: Layout, batch: int, micro_batch: int, seq: int, policy: Policy,
                    profile: HardwareProfile, schedule: str,
                    shape: _Shape | None = None, stage: int | None = None) -> tuple[MemoryBreakdown, list[dict]]:
    """The fullest stage's memory (see the module docs; ``stage``: that stage's instead) and a row per
    stage (``shape``: `_shape` of the arguments, where the caller has it)."""
    flights, (_worst, units, offloaded, node_units), all_states, shard = (
        shape or _shape(model, layout, batch, micro_batch, profile, schedule))
    one, kept, lse, buffers, backward, host_block, offload = _stage_unit_terms(model, shard, micro_batch, seq,
                                                                               policy, profile)
    # a merged step's forward layer works beside its backward layer (`Layout.ep_overlap`,
    # `memo_sim.engine.schedules.ep_overlap`): both working blocks at once, the forward's counted as a transient
    beside = one.phase_working_bytes("fwd") if layout.ep_overlap else 0.0
    work = one.transient_peak_bytes + beside + one.layer_boundary_bytes + backward
    last = layout.pp - 1
    # each stage's peak: its states, its layers in flight, the buffers and the working block (the classifier's
    # on the last stage, where larger, beside the buffers but one allocated for the backward); a stage with no
    # layer (the embedding or the loss alone) holds no layer buffers and no working block; the fullest is the
    # first of the largest
    static = buffers - backward
    peaks = [states + (u * kept + static + work if u else 0.0) for states, u in zip(all_states, units)]
    peaks[last] = (all_states[last] + (units[last] * kept + static if units[last] else 0.0)
                   + max(work if units[last] else 0.0, one.classifier_peak_bytes))
    if model.mtp_layers:  # the multi-token-prediction modules' activations of the other last-chunk micro-batches
        m = batch // micro_batch  # in flight (interleaved), kept from their head to their backward step
        sizes = tuple(tuple(int(s == last and c == layout.vpp - 1) for c in range(layout.vpp)) for s in range(last + 1))
        held = stage_in_flight_layers(schedule, layout.pp, m, layout.vpp, sizes, layout.ep_overlap)[last]
        peaks[last] += max(0, held - 1) * mtp_activation_bytes(model, shard, micro_batch, seq, policy.recomputes_mtp)
    rows = [{"stage": s, "in_flight": k, "layers_in_flight": u, "model_states_bytes": states, "peak_gpu_bytes": peak}
            for s, (k, u, states, peak) in enumerate(zip(flights, units, all_states, peaks))]
    host_node = node_units * host_block
    if stage is not None and not 0 <= stage < layout.pp:
        raise ValueError(f"stage {stage} of a {layout.pp}-stage pipeline")
    ws = peaks.index(max(peaks)) if stage is None else stage
    top = peaks[ws]
    u = units[ws]
    has = 1.0 if u else 0.0  # a stage without layers: no buffers, no working block (its terms add up to its peak)
    mem = MemoryBreakdown(
        model_states_bytes=all_states[ws], skeletal_resident_bytes=u * (kept - lse),
        rounding_buffer_bytes=has * buffers, backward_buffer_bytes=has * backward, lse_bytes=u * lse,
        transient_peak_bytes=has * (one.transient_peak_bytes + beside),
        transient_planned_bytes=has * one.transient_planned_bytes,
        transient_caching_allocator=one.transient_caching_allocator if u else 0.0,
        # only the last stage holds the classifier (a review: a middle stage's peak was given with the last one's
        # classifier among its terms, which then did not add up to it)
        layer_boundary_bytes=has * one.layer_boundary_bytes,
        classifier_peak_bytes=one.classifier_peak_bytes if ws == last else 0.0, peak_gpu_bytes=top,
        gpu_capacity_bytes=gpu_limit_bytes(profile, layout.alloc_conf),
        host_bytes_per_gpu=(max(offloaded) if stage is None else offloaded[ws]) * offload, host_bytes_per_node=host_node,
        host_capacity_bytes=profile.host_capacity(min(layout.gpus, profile.node_gpus)))
    return mem, rows


def pipeline_candidate(model: ModelConfig, layout: Layout, policy_name: str, batch: int, micro_batch: int, seq: int,
                       profile: HardwareProfile, schedule: str, alpha: float | None = None,
                       shape: _Shape | None = None) -> Candidate:
    """One pipeline candidate, estimated (tier 1); MEMO's alpha solved for the host blocks its
    GPUs hold in flight unless ``alpha`` fixes it. ``shape``: `_shape` of the arguments, where
    the caller has it."""
    note, a = "", None
    m = batch // micro_batch
    shape = shape or _shape(model, layout, batch, micro_batch, profile, schedule)
    if policy_class(policy_name).takes_alpha:
        if alpha is not None:
            a, note = alpha, "fixed by --alpha"
        else:
            res = pipeline_memo_alpha(model, layout, batch, micro_batch, seq, profile, schedule, shape)
            a, note = res.alpha_or_zero, res.note()
    choice = get_policy(policy_name, a)
    est = partial(estimate_pipeline, model, layout, batch, micro_batch, seq, choice, profile)  # priced on first read
    mem, rows = pipeline_memory(model, layout, batch, micro_batch, seq, choice, profile, schedule, shape)
    info = {"schedule": schedule, "pp": layout.pp, "vpp": layout.vpp, "micro_batches": m,
            "bubble_ratio": pipeline_bubble(layout.pp, layout.vpp, m), "stages": rows}
    return Candidate(model, layout, choice, batch, seq, profile, est, mem, note, schedule=schedule,
                     micro_batch=micro_batch, pipeline=info)


def pipeline_memo_alpha(model: ModelConfig, layout: Layout, batch: int, micro_batch: int, seq: int,
                        profile: HardwareProfile, schedule: str, shape: _Shape | None = None):
    """MEMO's alpha (`memo_sim.policy.alpha.AlphaResult`) of a pipeline: solved for the host blocks a GPU
    of its fullest node holds in flight, every stage's GPUs on that node sharing its host memory and
    copying at once (module docs)."""
    shape = shape or _shape(model, layout, batch, micro_batch, profile, schedule)
    return _stage_alpha(model, _without_pipeline(layout), micro_batch, seq, profile, max(1, shape.host_units[0]),
                        active_gpus_per_node(layout, profile))


@lru_cache(maxsize=1 << 16)
def _without_pipeline(layout: Layout) -> Layout:
    return replace(layout, pp=1, vpp=1)


@memoised(maxsize=1 << 16)
def _stage_alpha(model: ModelConfig, layout: Layout, micro_batch: int, seq: int, profile: HardwareProfile,
                 units: int, active: int):
    """`memo_alpha` of a stage's GPU holding ``units`` host blocks, its node's ``active`` GPUs (every
    stage's there) sharing the host (memoised: the schedules, virtual-stage counts and pipeline depths
    of one layout often hold as many)."""
    return memo_alpha(model, layout, micro_batch, seq, profile, units=units, active=active)


def default_pipeline_batch(pp: int, micro_batch: int | None) -> int:
    """Sequences per replica when a pipeline is searched and no batch is given: pp micro-batches
    (the fewest that fill a pipeline of pp stages once, and the fewest Megatron-LM's interleaved
    schedule accepts)."""
    return pp * (micro_batch or 1)


def _chunked(model: ModelConfig, lay: Layout, vpp: int, fixed_ends: bool, allows) -> Layout | None:
    """``lay`` with ``vpp`` model chunks per rank, its layers split as the layout says, or None where they
    cannot be: layers that do not divide into pp x vpp chunks are split with the embedding and the loss
    each taking a layer's slot (Megatron-LM's --account-for-embedding/loss-in-pipeline-split) where that
    divides and the framework offers uneven stages, unless the user fixed the end stages' counts."""
    cand = replace(lay, vpp=vpp)
    if (vpp == 1 and not lay.chunk_layers) or not cand.split_why_not(model.layers):
        return cand
    if fixed_ends:
        return None
    slots = replace(cand, first_stage_layers=0, last_stage_layers=0, account_embedding_loss=True)
    if virtual_split_why_not(model.layers, lay.pp, vpp, account=True) or not allows(slots):
        return None
    return slots


def pipeline_candidates(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *,
                        policies: tuple[str, ...], batch: int | None, global_batch: int | None,
                        micro_batch: int | None, allows, tp=None, cp=None, ulysses=None, dp=None, zero=None,
                        sp=None, pp: int | None = None, vpp: int | None = None, alpha: float | None = None,
                        schedules: tuple[str, ...] | None = None, adapt=None, first: int | None = None,
                        last: int | None = None, experts: ExpertChoice = ExpertChoice(),
                        tp_modes: tuple[str, ...] = ("megatron",), metp_across_nodes: bool = False,
                        dp_modes: tuple[str, ...] = ("zero",), floor: Callable[[], float | None] | None = None,
                        replicate_fsdp: bool = True,
                        chunks: tuple[int, ...] = (), why_not: Callable[[Layout], str | None] | None = None,
                        rank_orders: tuple[str, ...] = (DEFAULT_RANK_ORDER,),
                        schedule_why_not: Callable[[str, int, int], str | None] | None = None,
                        on_stage: Callable[[str], None] | None = None,
                        ) -> tuple[list[Candidate], list[tuple[Layout, str]], dict]:
    """Every pipeline candidate of the space (module docs) for ``policies``: (candidates,
    rejected layouts, what was searched). ``dp_modes``: the data-parallel flavours tried
    (`memo_sim.layout.parallel.enumerate_layouts`: ZeRO 3 runs beside stages only as FSDP without
    resharding, `memo_sim.dp.fsdp`). ``allows``: the framework's layout filter (``why_not``: its reason); ``adapt``:
    the layout as the framework runs it (its mechanisms; `memo_sim.frameworks.Framework.adapt`).
    ``chunks``: each model chunk's layers (`Layout.chunk_layers`: ``pp`` fixed, len(chunks) / pp chunks per rank).
    ``rank_orders``: the rank orders tried (`memo_sim.layout.rank_order`), each where it places a layout's GPUs
    apart from the first (`order_variants`).

    ``floor``: called once, before the first family (a layout with its chunks, batch split and
    schedule) is built, it returns the best throughput simulated so far (None: none). A family
    whose proved throughput bound (`memo_sim.search.bound.pipeline_family_tgs_bound`, every policy
    of it at once) is below it is not built: none of its candidates could be the best plan, so the
    bound search would skip each of them. What was searched says how many (``not_built``: the
    families, the candidates they hold and the highest bound among them).

    ``on_stage(words)``: told, for each layout and each family, which phase runs and how far it is (the pipeline
    degree and layout of how many, the families priced or bounded and how many the bound left out): the caller's
    status line throttles it (`memo_sim.cli.whatif.SearchStatus`). A review: after the bound search over the
    single-stage candidates said 'every bound left below the best simulated', 5,124 families' bounds ran for
    100 s with nothing said."""
    names = tuple(n for n in (schedules or micro_batch_pipelines()) if n in micro_batch_pipelines())
    # pp splitting the layers evenly, or unevenly where `uneven_split` finds a split (first / last fixed: any)
    if chunks and (pp is None or len(chunks) % pp):
        raise MemoError(f"{len(chunks)} model chunks need a pipeline degree that divides them, got pp {pp}")
    fixed_ends = first is not None or last is not None or bool(chunks)
    pps = [pp] if pp is not None else [d for d in _divisors(gpus) if d > 1 and (
        model.layers % d == 0 or first is not None or last is not None or uneven_split(model.layers, d))]
    out: list[Candidate] = []
    rejected: list[tuple[Layout, str]] = []
    too_big: set[int] = set()  # ids of the chunked layouts rejected by `states_why_not` (once each)
    # (layout, batch, micro-batch, schedule) families met: the even split and each uneven one (`uneven_splits`) that
    # cannot be chunked at a vpp all become one embedding-and-loss-slot layout there (`_chunked`), built once (a
    # review: llama-3.1-405b's pp16v4el family was built three times and folded into itself)
    met: set[tuple] = set()
    searched = {"schedules": list(names), "pp": [], "vpp": set(), "micro_batch": set()}
    not_built = {"families": 0, "candidates": 0, "best_bound_tgs": None, "schedules": []}
    reference: list[float | None] = []  # floor(), once it is read
    told = {"families": 0, "at": ""}  # families reached, and where (pp and layout of how many), for ``on_stage``

    def tell() -> None:
        if on_stage is None:
            return
        n, out_ = told["families"], not_built["families"]
        if reference and reference[0] is not None:
            on_stage(f"bounding pipeline families (tier 1, analytic): {n} bounded, {out_} below the best simulated "
                     f"{reference[0]:,.0f} tokens/GPU/s and not built ({told['at']})")
        elif n:
            on_stage(f"pricing pipeline families (tier 1, analytic): {n} priced ({told['at']})")
        else:  # no family reached yet: the layouts' chunks, schedules and model states checked
            on_stage(f"checking pipeline layouts (tier 1, analytic): {told['at']}")
    kv_rule = adapt(Layout()).ulysses_kv if adapt is not None else "minimal"  # the framework's K/V repeat
    for pi, p in enumerate(pps, 1):
        told["at"] = f"pp {p}, {pi} of {len(pps)} degrees; enumerating its layouts"
        tell()
        valid, rej = enumerate_layouts(model, gpus, profile.node_gpus, seq, tp=tp, cp=cp, ulysses=ulysses, dp=dp,
                                       zero=zero, sp=sp, pp=p, first=first, last=last, experts=experts,
                                       tp_modes=tp_modes, metp_across_nodes=metp_across_nodes, dp_modes=dp_modes,
                                       chunks=chunks, ulysses_kv=kv_rule, replicate_fsdp=replicate_fsdp)
        rejected += rej
        rejected += [(lay, why_not(lay) if why_not is not None else f"the framework does not offer {lay.label()}")
                     for lay in valid if not allows(lay)]
        valid = [v for lay in valid if allows(lay) for v in order_variants(lay, rank_orders, profile.node_gpus)]
        if adapt is not None:  # the framework's mechanisms, which a pipeline may not price yet
            adapted = [(adapt(lay), lay) for lay in valid]
            why = {}
            for ai, (a, _) in enumerate(adapted, 1):
                told["at"] = f"pp {p}, {pi} of {len(pps)} degrees; checking layout {ai} of {len(adapted)}"
                tell()
                why[id(a)] = check_layout(a, model, gpus, profile.node_gpus, seq)
            rejected += [(a, why[id(a)]) for a, _ in adapted if why[id(a)]]
            valid = [a for a, _ in adapted if not why[id(a)]]
        if valid:
            searched["pp"].append(p)
        for li, lay in enumerate(valid, 1):
            told["at"] = f"pp {p}, {pi} of {len(pps)} degrees; layout {li} of {len(valid)}"
            tell()
            chunked: dict[int, Layout | None] = {}  # vpp -> the layout with that many chunks (every mb and schedule's)
            said: set[str] = set()  # the schedules whose refusal of this layout is in searched["why_none"]
            b = batch
            if global_batch is not None:
                if global_batch % lay.dp:
                    rejected.append((lay, f"--global-batch {global_batch} does not split over dp {lay.dp}"))
                    searched["why_none"] = rejected[-1][1]
                    continue
                b = global_batch // lay.dp
            if b is None:
                b = default_pipeline_batch(p, micro_batch)
            for mb in micro_batch_sizes(b, micro_batch):
                if b % mb:
                    rejected.append((lay, f"micro-batch {mb} does not divide the batch {b}"))
                    searched["why_none"] = rejected[-1][1]
                    continue
                for name in names:
                    # the virtual-stage counts a schedule runs: vpp > 1 for the interleaved schedule alone (a review:
                    # 1F1B's search tried vpp 2-4 and 'do not split into pp x vpp = 24 model chunks' hid the reason
                    # 1F1B itself was refused)
                    searched_vpps = list(range(2, MAX_VPP + 1)) if takes_virtual_stages(name) else [1]
                    vpps = [lay.vpp] if chunks else [vpp] if vpp is not None else searched_vpps
                    for v in vpps:
                        if v not in chunked:
                            chunked[v] = _chunked(model, lay, v, fixed_ends=fixed_ends, allows=allows)
                        cand = chunked[v]
                        if cand is None:  # the layers do not split into these chunks (the reason: the even split's)
                            # a split at a vpp the search chose says less than a reason already found (the batch's or
                            # the schedule's at a vpp the layers split into); at a vpp asked for it is the reason
                            if vpp is not None or chunks or not searched.get("why_none"):
                                searched["why_none"] = replace(lay, vpp=v).split_why_not(model.layers)
                            continue
                        if experts.ep_overlap:  # where Megatron-Core runs it (vpp >= 2, ZeRO <= 1, ...)
                            cand = with_ep_overlap(cand, model)
                        if (cand, b, mb, name) in met:
                            continue
                        met.add((cand, b, mb, name))
                        why = check_schedule(name, pp=p, vpp=v, layers=model.layers, batch=b, micro_batch=mb,
                                             policy_name="store_all", uneven=cand.uneven)
                        if not why and schedule_why_not is not None:  # the framework's own rule (torchtitan: m >= pp)
                            why = schedule_why_not(name, p, b // mb)
                        if why:
                            # a schedule that takes other virtual stages says less than another's reason (fixed vpp 1:
                            # interleaved's 'needs 2 virtual stages' hid 1F1B's); a schedule's reason at the layout's
                            # smallest micro-batch (the most micro-batches: nearest to the m >= pp and m % pp rules)
                            # is not replaced by its reason at a larger one (a review: 'got 1 for pp 8', batch 4)
                            if name not in said and ("virtual stages" not in why or not searched.get("why_none")):
                                said.add(name)
                                searched["why_none"] = why if why.startswith(name) else f"{name}: {why}"
                            continue
                        why = states_why_not(model, cand, profile)
                        if why:  # no policy, micro-batch or schedule of this layout fits: not built
                            if id(cand) not in too_big:
                                too_big.add(id(cand))
                                rejected.append((cand, why))
                                least = max(_stage_states(model, cand))  # the layout nearest to fitting speaks
                                if least < searched.get("state_least", float("inf")):
                                    searched["state_least"] = least
                                    searched["state_why"] = f"{why} (the least of the layouts searched: {cand.label()})"
                            continue
                        searched["vpp"].add(v)
                        searched["micro_batch"].add(mb)
                        told["families"] += 1
                        if floor is not None:
                            if not reference:
                                reference.append(floor())
                            ub = pipeline_family_tgs_bound(model, cand, b, mb, seq, profile)
                            if reference[0] is not None and below(ub, reference[0]):
                                not_built["families"] += 1
                                if name not in not_built["schedules"]:
                                    not_built["schedules"].append(name)
                                not_built["candidates"] += len(policies)
                                top = not_built["best_bound_tgs"]
                                not_built["best_bound_tgs"] = ub if top is None else max(top, ub)
                                # by the TP flavour it runs: a verdict's side may have its best there
                                # (`memo_sim.report.whatif_answer.unbuilt_side_words`)
                                kind = "metp" if cand.metp else "megatron_tp" if cand.tp > 1 else "no_tp"
                                side = not_built.setdefault("best_bound_by_tp", {})
                                side[kind] = max(side.get(kind, 0.0), ub)
                                tell()
                                continue
                        tell()
                        shapes = {}  # every policy's (a policy the EP overlap does not run beside: without it)
                        for pol in policies:
                            at = cand if not cand.ep_overlap or policy_class(pol).ep_overlap_ok else \
                                replace(cand, ep_overlap=False)
                            if why := policy_class(pol).layout_why_not(at):
                                rejected.append((at, f"{pol}: {why}"))
                                continue
                            if at not in shapes:
                                shapes[at] = _shape(model, at, b, mb, profile, name)
                            out.append(pipeline_candidate(model, at, pol, b, mb, seq, profile, name, alpha, shapes[at]))
    # "state_why": the layout nearest to fitting whose model states alone do not; "why_none": the last reason a layout
    # the degrees allow was not built (its chunks, batch split or schedule): what a search that builds nothing says,
    # in that order, rather than the first layout refused (`memo_sim.search.whatif`)
    searched.pop("state_least", None)
    searched["vpp"] = sorted(searched["vpp"])
    searched["micro_batch"] = sorted(searched["micro_batch"])
    if not_built["families"]:
        searched["not_built"] = not_built
    return out, rejected, searched


def pipeline_host_words(c: Candidate) -> str:
    """A micro-batch pipeline's pinned host memory in words, from the numbers `pipeline_memory`
    prices it by: the fullest node's offloaded (layer, micro-batch) units -- per stage, of the units its GPU holds in
    flight, all but the last `KEPT_LAYERS` of the schedule's -- x the pinned bytes of one unit at the plan's alpha."""
    m = c.memory
    shape = _shape(c.model, c.layout, c.batch, c.micro_batch, c.profile, c.schedule)
    _worst, units, offloaded, node_units = shape.host_units
    terms = _stage_unit_terms(c.model, shape.shard, c.micro_batch, c.seq, c.policy, c.profile)
    block, raw = terms[5], terms[6]
    node = max(_node_patterns(c.layout, c.profile.node_gpus), key=lambda per: sum(offloaded[s] * n for s, n in per))
    stages = "; ".join(f"{n} GPU{'s' if n > 1 else ''} of stage {s}: {offloaded[s]} of the {units[s]} "
                       f"(layer, micro-batch) units in flight offloaded" for s, n in node)
    alpha = f" at alpha {c.policy.alpha:.3f}" if c.policy.takes_alpha else ""
    return (f"{node_units} offloaded (layer, micro-batch) units on the node ({stages}) x {fmt_bytes(block)} pinned "
            f"per unit{alpha} = {need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, 'usable per node')}"
            + _hosts_words(c, min(c.layout.gpus, c.profile.node_gpus)) + _rounding_words(c, raw, block, "unit"))


PIPELINE_HOST_WORDS["words"] = pipeline_host_words
