"""PyTorch's caching allocator over whole training iterations of one GPU (beside a memory plan's arena too).

`memo_sim.memplan.baseline` replays one layer's transient requests alone on unlimited memory;
that gives the transient footprint but never a reorganisation, because nothing else lives on the
device. Here the request stream of a whole iteration goes through the caching-allocator model
(`memo_sim.memplan.caching_allocator`) against the device's real capacity
(``profile.usable_gpu_memory``), with everything that shares the allocator with the transients:

* before the first iteration, the model states (bf16 weights, bf16 gradients, fp32 optimizer
  states, ZeRO-3's two gathered layers; one request each, as Megatron's contiguous buffers) and
  the policy's static GPU buffers (`Policy.static_gpu`: rounding buffers);
* the embedding output, i.e. layer 0's input;
* for each layer i, its forward: the level-1 transients of
  `memo_sim.memplan.trace_gen.layer_forward_trace`, and the skeletal tensors the policy keeps
  (`Policy.forward_kept`) allocated one tensor at a time at the op that produces them, as
  PyTorch's autograd saves them. The layer output ``y`` is the next layer's input (the same
  allocation); the input is freed at the end of the forward unless the policy keeps it;
* the classifier: final-norm output, one chunk's logits (`classifier_peak_bytes`), and the
  gradient handed to the last layer's backward;
* for each layer, last first: when the policy recomputes it, the recompute, then the backward
  (`layer_backward_trace`), whose incoming gradient ``dy`` is the gradient the layer above
  produced (its ``dx``). A policy that re-runs the whole layer forward (`recomputes_attention`,
  full recompute) replays the layer forward trace again, with the tensors of
  `Policy.recompute_allocated` allocated at their producing ops, and the backward trace without
  the token-wise recompute scratch; a token-wise recompute allocates them when the backward
  starts and keeps the trace's recompute scratch. Each saved tensor is freed right after the
  backward of the last op that needs it (attention frees q, k, v, attn and lse; ln1's backward
  frees the layer input), as autograd releases saved tensors;
* the embedding backward frees the gradient of layer 0's input.

A policy's kept tensors are named by role only (``[("skeletal", total + lse)]`` for store-all);
they are split into the layer's tensors (`memo_sim.model.layer_graph.layer_tensors`) by asking
the policy's functions for their bytes on one-role inputs (every policy's bytes are linear in
the role bytes; a lump that is not is allocated whole, at the start of its phase).

Steady state: iterations are replayed back to back, so the segments cached by one serve the
next as in real training, until one leaves the cache exactly as it found it (from then on every
iteration repeats it) or `MAX_ITERATIONS`; that last iteration is reported (``iterations=2``
replays exactly two, and so on). A *reorganisation* is the allocator freeing every cached
unsplit segment and retrying a cudaMalloc that did not fit (PyTorch's ``num_alloc_retries``);
`IterationReplay.stall_seconds` prices the reorganisations, cudaFree and cudaMalloc calls of the
reported iteration with the profile's ``gpu.allocator`` costs.

Streams: by default a freed block is reusable at once (the GPU keeps up with the CPU), unless the
layout's collectives record their streams (``layout.nccl_record_stream``: `record_stream_lag`). With
``stream_lag_phases=k`` the buffers that collectives read or write on their own streams (TP
all-gather outputs and reduce buffers, ring-CP K/V and dK/dV buffers, Ulysses all-to-all
buffers; ProcessGroupNCCL calls ``record_stream`` on them) come back to the cache only k phases
(layers) after their free, as when the CPU runs k layers ahead of the GPU and the allocator
waits for the collective's event; a reorganisation synchronises the device and returns them all
(the CPU's lead is assumed to come back within a phase). What
the replay says for GPT-7B with full recompute on an A800 (tests/test_allocator_iteration.py):
with the GPU keeping up, an iteration that fits repeats the first iteration's placements in
its cache and never reorganises (and where the cache needs more than the capacity it runs out
of memory instead, because every segment holds a live layer input); with the collectives'
blocks held a few layers, it reorganises many times per iteration.

Static memory plan (`memo_sim.policy.base.uses_memory_plan`: MEMO, or ``whatif --allocator plan``):
the transients the plan places sit in one arena allocated before the first iteration (the
largest placed max-live of a layer's phases, as memo_exec/arena.py allocates it); what the plan
leaves to the caching allocator (`memo_sim.model.layer_graph.UNPLACED`: kernel workspaces, the
gradients autograd hands between layers, the layer chain, the kept tensors, the final norm's output)
is replayed as above, and the rounding buffers' rows are in the static buffers. The classifier's
chunks sit in the arena, free between the last forward and the first backward, wherever at least
memo-exec's minimum of their rows fits it (memo_exec/arena.py ``between_layers``, memo_exec/model.py
``ChunkPlace``; `memo_sim.memplan.iteration_requests.chunk_in_arena`), and ask the caching
allocator for nothing. The arena is MEMO's for every layout, a layer split by tp, cp or Ulysses too (the
paper plans a TP+SP+CP layer's transients; memo-exec's distributed executor follows a Megatron TP, ring-CP or
re-sending Ulysses rank's plan, with or without SP, memo-sim's own plans included, not yet a METP, a keeping Ulysses
(``ulysses_bwd_resend`` false) or an expert layer's, and says so in one line when it runs one: memo_exec/distributed/runner.py ``memory_plan_not_followed``). The
engine replays a memory-planned run like any other (`engine_replay`): the replay decides its fit and charges its
reorganisations (``static_memory_plan`` says the plan is there). Left out: NCCL's own workspaces (outside the
allocator), Megatron's global all-gather buffer (the level-1 traces allocate gathered inputs
afresh), gradient-reduction buckets, optimizer temporaries, and per-parameter weight tensors
(model states are a few contiguous buffers).

Wall time: the request stream depends only on (model, layout, batch, seq, policy, classifier
chunk) and is memoised; a replay of 7B (32 layers) takes about 10-30 ms, of an 80-layer model
about 50 ms (up to 0.25 s with a stream lag, which needs more iterations to settle).
`replay_iteration` also remembers its last `REPLAY_CACHE_SIZE` replays by content: the stream's
recipe (`_StreamRecipe`: static requests, layer templates, the recompute pattern, the
classifier's sizes; equal recipes build equal requests and phases), losslessly encoded, and the
allocator's settings, iterations, series and stream lag. Layouts whose GPUs see the same
requests (e.g. ones that differ only in dp without ZeRO) share one replay; each call gets its
own copy, under its own stream name and policy label, equal to what an uncached replay returns
(tests/test_replay_cache.py). A replay in which no cudaMalloc failed is also shared by streams
that differ only in their static buffers' sizes (ZeRO stage, dp) wherever their capacity holds
what it reserved (`_StaticBase`): in the what-if benchmark's 4,938 replaying candidates that
leaves 1,829 replays of 3,295 distinct streams.

Modules: the stream type (`memo_sim.memplan.iteration_stream`), how an iteration becomes requests
(`memo_sim.memplan.iteration_requests`), what a replay reports (`memo_sim.memplan.replay_result`),
the replays remembered (`memo_sim.memplan.replay_cache`); the replay itself is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import count

from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import merged_alloc_conf
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.caching_allocator import (
    AllocatorConfig, AllocatorOutOfMemory, CachingAllocatorModel, OomEvent, fragmentation,
)
from memo_sim.memplan.iteration_requests import ARENA_ID, _stream_name, _stream_recipe, iteration_stream
from memo_sim.memplan.iteration_stream import FREE, FREE_STREAM, MALLOC, IterationStream, Request  # noqa: F401
from memo_sim.memplan.replay_cache import (  # noqa: F401  (clear_replay_cache: part of this module's API)
    _REPLAYS, _SHARED, _copy_replay, _remember, _StaticBase, clear_replay_cache,
)
from memo_sim.memplan.replay_result import IterationReplay
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy, uses_memory_plan
from memo_sim.profile.schema import HardwareProfile

MAX_ITERATIONS = 8  # replay at most this many iterations looking for a steady state
_PRICED = ("reorganizations", "cuda_free", "cuda_free_bytes", "cuda_malloc", "cuda_malloc_bytes")


@dataclass
class _Reported:
    """What the replay keeps of the iteration it reports (the last one replayed)."""

    start: dict  # the allocator's counters when it began
    reorg_start: int = 0  # reorganisations before it
    peak_alloc: int = 0
    reserved_at_peak: int = 0
    by_phase: dict = field(default_factory=dict)  # phase name -> its priced counts
    res_series: list[int] = field(default_factory=list)
    alloc_series: list[int] = field(default_factory=list)


def _check_replay_args(iterations, stream_lag_phases) -> int:
    """The stream lag as an int (MemoError naming the argument when either is not valid)."""
    if iterations is not None and (not isinstance(iterations, int) or isinstance(iterations, bool)
                                   or iterations < 1):
        raise MemoError(f"iterations must be None or a positive integer, got {iterations!r}")
    lag = stream_lag_phases or 0
    if not isinstance(lag, int) or isinstance(lag, bool) or lag < 0:
        raise MemoError(f"stream_lag_phases must be None or a non-negative integer, got {stream_lag_phases!r}")
    return lag


def _replay_static(m: CachingAllocatorModel, stream: IterationStream, observer=None) -> OomEvent | None:
    """Allocate the static requests (model states, static buffers); the OOM event if they do not fit."""
    for _k, bid, size in stream.static:
        try:
            m.malloc(bid, size, 0)
        except AllocatorOutOfMemory as e:
            return e.event
        if observer is not None:
            observer(m, -1, -1, MALLOC, bid, size)
    return None


def _replay_one(m: CachingAllocatorModel, stream: IterationStream, it: int, lag: int, series: bool,
                miss_margins: list | None, observer=None) -> tuple[_Reported, OomEvent | None]:
    """Replay iteration ``it`` (0-based) of ``stream`` on ``m``; what it reports and its OOM event.
    ``observer(m, it, phase, kind, bid, size)`` (`replay_stream`) is called after each request is served."""
    rep = _Reported(m.counters(), len(m.reorganization_steps))
    m.reset_peak_stats()
    rep.peak_alloc, rep.reserved_at_peak = m.allocated_bytes, m.reserved_bytes
    reqs = stream.iteration
    n = len(reqs)
    phase_of = stream.phase_of or (0,) * n
    phase_base = it * stream.phases
    cur = -1
    marks: list[tuple[int, dict[str, int]]] = []
    missed = len(m.miss_margins) if miss_margins is not None else 0
    malloc, free = m.malloc, m.free
    oom = None
    try:
        for step, (kind, bid, size), ph in zip(count(1 + it * n), reqs, phase_of):
            if ph != cur:
                cur = ph
                marks.append((cur, m.counters()))
                if lag and m.pending_bytes:
                    m.complete_pending(phase_base + cur)
            if kind == MALLOC:
                malloc(bid, size, step)
                if m.allocated_bytes > rep.peak_alloc:
                    rep.peak_alloc, rep.reserved_at_peak = m.allocated_bytes, m.reserved_bytes
            elif kind == FREE_STREAM and lag:
                free(bid, step, pending_until=phase_base + ph + lag)
            else:
                free(bid, step)
            if series:
                rep.res_series.append(m.reserved_bytes)
                rep.alloc_series.append(m.allocated_bytes)
            if observer is not None:
                observer(m, it, ph, kind, bid, size)
    except AllocatorOutOfMemory as e:
        oom = e.event
    marks.append((-1, m.counters()))
    if miss_margins is not None:
        miss_margins.append([x for small, x in m.miss_margins[missed:] if not small])
    for (k, c0), (_k1, c1) in zip(marks, marks[1:]):
        d = {key: c1[key] - c0[key] for key in _PRICED}
        if any(d.values()):
            rep.by_phase[stream.phase_name(k)] = d
    return rep, oom


def replay_stream(stream: IterationStream, config: AllocatorConfig, iterations: int | None = None,
                  series: bool = False, policy: Policy | None = None,
                  stream_lag_phases: int | None = None, miss_margins: list | None = None,
                  observer=None) -> IterationReplay:
    """Replay ``stream``'s static requests, then iterations of it; report the last.

    ``iterations``: None (default) replays until an iteration leaves the cache exactly as it
    found it (`CachingAllocatorModel.layout_signature`), so that every later iteration repeats it
    (the steady state; at least two iterations, at most `MAX_ITERATIONS`); an integer replays
    exactly that many. Either way ``steady`` says whether the reported iteration is a fixed point.

    ``stream_lag_phases``: None or 0 (default) returns every freed block to the cache at once.
    k >= 1 models ``record_stream`` on the collectives' buffers (``FREE_STREAM`` requests) with
    the GPU k phases (layers) behind the CPU: such a block is reusable only from the k-th phase
    after the one that freed it, or after a reorganisation or the end of the iteration (both
    synchronise the device).

    ``miss_margins``: a list that receives, per replayed iteration, the large pool's free bytes
    minus the rounded request at each request the cache could not serve (a fragmentation
    failure where >= 0).

    ``observer``: called as ``observer(model, iteration, phase, kind, buffer_id, size)`` after every request the
    allocator model served (``iteration`` and ``phase`` -1 for the static requests), with the model itself, whose
    addresses and segments it may read but must not change (`memo_sim.report.memory_snapshot` writes the
    replay's allocations in PyTorch's snapshot format so).
    """
    lag = _check_replay_args(iterations, stream_lag_phases)
    m = CachingAllocatorModel(config)
    oom = _replay_static(m, stream, observer)
    oom_it: int | None = -1 if oom is not None else None  # -1: the model states and static buffers do not fit
    if miss_margins is not None:
        m.miss_margins = []
    after_static = m.counters()
    rep = _Reported(after_static)
    limit = MAX_ITERATIONS if iterations is None else iterations
    steady = False
    done = 0
    by_it: list[int] = []
    while oom is None and done < limit:
        sig_start = m.layout_signature()
        rep, oom = _replay_one(m, stream, done, lag, series, miss_margins, observer)
        by_it.append(len(m.reorganization_steps) - rep.reorg_start)
        if oom is not None:
            oom_it = done
        done += 1
        if oom is not None:
            break
        m.complete_pending()  # the iteration ends with a synchronisation (loss.item(), gradient norm)
        steady = m.layout_signature() == sig_start
        if iterations is None and steady and done >= 2:
            break
    return _report(stream, config, policy, m, rep, after_static, done, steady, oom, oom_it, lag, by_it)


def _report(stream: IterationStream, config: AllocatorConfig, policy: Policy | None, m: CachingAllocatorModel,
            rep: _Reported, after_static: dict, done: int, steady: bool, oom: OomEvent | None,
            oom_it: int | None, lag: int, by_iteration: list[int] | None = None) -> IterationReplay:
    """The `IterationReplay` of the reported iteration ``rep`` after ``done`` iterations; ``by_iteration``: the
    allocation retries of each replayed iteration (``reorganizations_by_iteration``, with ``steady`` what a caller
    shows where the replay found no repeating iteration: `IterationReplay.steadiness`)."""
    now = m.counters()
    cnt = {k: now[k] - rep.start[k] for k in now}
    reqs, n = stream.iteration, len(stream.iteration)
    last_base = 1 + (done - 1) * n
    reorg_ids = [reqs[s - last_base][1] if 0 <= s - last_base < n else f"step {s}"
                 for s in m.reorganization_steps[rep.reorg_start:]]
    return IterationReplay(
        name=stream.name,
        policy=policy.label() if policy is not None else "",
        capacity_bytes=config.capacity_bytes,
        iterations=done,
        steady=steady and oom is None,
        requests_per_iteration=stream.mallocs,
        static_bytes=stream.static_bytes,
        max_live_bytes=stream.max_live_bytes(),
        peak_reserved_bytes=m.peak_reserved_bytes,
        peak_allocated_bytes=rep.peak_alloc,
        reserved_at_peak_allocated_bytes=rep.reserved_at_peak,
        fragmentation_at_peak=fragmentation(rep.peak_alloc, rep.reserved_at_peak),
        reorganizations=cnt["reorganizations"],
        reorganization_requests=reorg_ids,
        phase_counts=rep.by_phase,
        cuda_mallocs=cnt["cuda_malloc"],
        cuda_malloc_bytes=cnt["cuda_malloc_bytes"],
        cuda_frees=cnt["cuda_free"],
        cuda_free_bytes=cnt["cuda_free_bytes"],
        reorganization_cuda_frees=cnt["reorganization_cuda_frees"],
        fragmentation_failures=cnt["fragmentation_failures"],
        warmup={k: rep.start[k] - after_static[k] for k in now},
        oom=oom is not None,
        oom_iteration=oom_it,
        oom_event=oom,
        expandable_segments=config.expandable_segments,
        max_split_size_bytes=config.max_split_size_bytes,
        stream_lag_phases=lag,
        static_memory_plan=(any(bid == ARENA_ID for _k, bid, _s in stream.static)
                            or bool(policy is not None and policy.static_memory_plan)),
        series_reserved_bytes=rep.res_series,
        series_allocated_bytes=rep.alloc_series,
        segments=m.num_segments(),
        reorganizations_by_iteration=list(by_iteration or []),
    )


def record_stream_lag(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                      classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> int:
    """The stream lag of a layout whose collectives ``recordStream`` their tensors
    (``layout.nccl_record_stream``): the iteration's phase count, i.e. a freed collective buffer
    comes back only at the next synchronisation (a retry or the iteration's end). The allocator
    returns such a block when it finds the collective's event complete, and the CPU, which only
    enqueues kernels, runs ahead of a GPU busy with long-sequence layers until something
    synchronises it (pytorch/pytorch#76861 describes the thrashing this causes; Megatron-LM's
    long-sequence runs synchronise only at the iteration's end)."""
    return iteration_stream(model, layout, batch, seq, policy, classifier_chunk_tokens).phases


def allocator_config(profile: HardwareProfile, capacity_bytes: int | None = None, expandable_segments: bool = False,
                     max_split_size_bytes: int | None = None, alloc_conf: str = "") -> AllocatorConfig:
    """The caching allocator a GPU of ``profile`` runs with ``PYTORCH_CUDA_ALLOC_CONF``'s settings
    (`replay_iteration`'s arguments): its capacity ``profile.usable_gpu_memory`` unless ``capacity_bytes``."""
    cap = int(profile.usable_gpu_memory if capacity_bytes is None else capacity_bytes)
    if alloc_conf:
        cfg = AllocatorConfig.from_conf(cap, merged_alloc_conf(expandable_segments, alloc_conf),
                                        device_bytes=int(float(profile.gpu.memory_bytes)))
        return cfg if max_split_size_bytes is None else replace(cfg, max_split_size_bytes=max_split_size_bytes)
    return AllocatorConfig(capacity_bytes=cap, expandable_segments=expandable_segments,
                           max_split_size_bytes=max_split_size_bytes)


def replay_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                     profile: HardwareProfile, *, iterations: int | None = None,
                     classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                     capacity_bytes: int | None = None, expandable_segments: bool = False,
                     max_split_size_bytes: int | None = None, stream_lag_phases: int | None = None,
                     series: bool = False, alloc_conf: str = "") -> IterationReplay:
    """Replay one GPU's training iterations through the caching-allocator model; report the last.

    Capacity: ``profile.usable_gpu_memory`` (device memory minus what lives outside the
    allocator), or ``capacity_bytes``. ``expandable_segments`` / ``max_split_size_bytes`` are
    ``PYTORCH_CUDA_ALLOC_CONF``'s settings; ``alloc_conf`` the rest of that string (a layout's
    ``alloc_conf``, `memo_sim.layout.alloc_conf`: roundup_power2_divisions, the garbage
    collection under a memory fraction, and max_split_size_mb where ``max_split_size_bytes``
    is None). ``stream_lag_phases`` models ``record_stream`` on the TP collectives' buffers with
    the GPU that many layers behind the CPU (see `replay_stream`); None (default): the layout's
    (`record_stream_lag` where ``layout.nccl_record_stream``, else the GPU keeps up). ``series`` keeps reserved and allocated bytes after
    every request of the reported iteration.

    Under a static memory plan (`memo_sim.policy.base.uses_memory_plan`) the planned transients
    are one static arena and the rest is replayed (see the module docs; ``static_memory_plan``
    says so).
    """
    cfg = allocator_config(profile, capacity_bytes, expandable_segments, max_split_size_bytes, alloc_conf)
    cap = cfg.capacity_bytes
    if stream_lag_phases is None and layout.nccl_record_stream:
        stream_lag_phases = record_stream_lag(model, layout, batch, seq, policy, classifier_chunk_tokens)
    plain = (iterations is None or type(iterations) is int) and (stream_lag_phases is None
                                                                 or type(stream_lag_phases) is int)
    if not plain:  # let replay_stream say what is wrong with them
        return replay_stream(iteration_stream(model, layout, batch, seq, policy, classifier_chunk_tokens), cfg,
                             iterations=iterations, series=series, policy=policy, stream_lag_phases=stream_lag_phases)
    # memoised by content: what the replay reads of the stream (its recipe: equal recipes, equal
    # requests and phases) and the allocator's settings; the name and the policy's label are
    # this call's
    recipe = _stream_recipe(model, layout, batch, seq, policy, classifier_chunk_tokens)
    mode = (("until steady", MAX_ITERATIONS) if iterations is None else iterations, bool(series),
            stream_lag_phases or 0)
    key = (recipe.content_key(), cfg) + mode
    mine = {"name": _stream_name(model, layout, seq, policy), "policy": policy.label(),
            "static_memory_plan": uses_memory_plan(policy, layout)}
    hit = _REPLAYS.get(key)
    if hit is not None:
        _REPLAYS.move_to_end(key)
        return _copy_replay(hit, **mine)
    # a replay that never found the device full is shared by streams that differ only in the
    # sizes of their static buffers, wherever their capacity holds what it reserved (`_StaticBase`)
    base = _StaticBase.of(recipe, cfg)
    skey = None if base is None else (
        (recipe.content_key(static=False), base.visible, replace(cfg, capacity_bytes=1)) + mode)
    shared = _SHARED.get(skey) if skey is not None else None
    if shared is not None and cap - base.reserved >= shared[1].reserved_above(shared[0]):
        _SHARED.move_to_end(skey)
        r = shared[1].moved_to(base, shared[0], shared[2], cap, recipe.static)
        _remember(_REPLAYS, key, _copy_replay(r))
        return _copy_replay(r, **mine)
    margins: list[list[int]] = []
    r = replay_stream(iteration_stream(model, layout, batch, seq, policy, classifier_chunk_tokens), cfg,
                      iterations=iterations, series=series, policy=policy, stream_lag_phases=stream_lag_phases,
                      miss_margins=margins if skey is not None else None)
    _remember(_REPLAYS, key, _copy_replay(r))
    if skey is not None and base.holds(r):
        _remember(_SHARED, skey, (_copy_replay(r), base, margins))
    # the layout's plan says so, as a cached copy does
    r.static_memory_plan = mine["static_memory_plan"]
    return r


def engine_replay(model: ModelConfig, layout: Layout, micro_batch: int, seq: int, policy: Policy,
                  profile: HardwareProfile, *, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                  allocator_lag: int = 0) -> IterationReplay | None:
    """The replay the engine charges a single-stage run of one micro-batch of ``micro_batch``
    sequences (`memo_sim.engine.schedules.single_stage.simulate`; the allocator's cache is warm for
    the ones after it): the layout's allocator settings (``expandable_segments``, ``alloc_conf``),
    ``allocator_lag`` layers of stream lag (0: the layout's). Under a static memory plan (`uses_memory_plan`) too:
    the plan's arena is allocated up front (memo_exec/arena.py) and everything else (the layer chain, kept rows,
    gradients, the workspaces the plan does not place, the classifier's chunks outside the arena, model states)
    through PyTorch's caching allocator, which fragments; a review found MEMO plans reported as fitting whose replay
    ran out of memory (gpt-7b tp1-cp8-z3 at 1376K), so the replay decides their fit and stalls as for any plan."""
    return replay_iteration(model, layout, micro_batch, seq, policy, profile,
                            expandable_segments=layout.expandable_segments, alloc_conf=layout.alloc_conf,
                            classifier_chunk_tokens=classifier_chunk_tokens, stream_lag_phases=allocator_lag or None)


def fragmentation_words(model: ModelConfig, layout: Layout, policy: Policy) -> str:
    """What runs out of memory where a run's replay does, in words: the caching allocator's fragmentation, under a
    static memory plan of the tensors outside its arena."""
    if not uses_memory_plan(policy, layout):
        return "caching-allocator fragmentation"
    return "caching-allocator fragmentation of the tensors outside the memory plan's arena"
