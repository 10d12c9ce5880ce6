"""PyTorch's caching allocator over whole training iterations of one GPU (unplanned policies).

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

Streams: by default a freed block is reusable at once (the GPU keeps up with the CPU). With
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

Contract: this describes runs on PyTorch's caching allocator. A policy with a static memory plan
(`Policy.static_memory_plan`, MEMO) places its transients at planned addresses and has no
reorganisation by construction; the caller decides that (`replay_iteration` replays whatever it
is given and says ``static_memory_plan``). Left out: NCCL's own workspaces (outside the
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
"""

from __future__ import annotations

import copy
import math
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from itertools import count

from memo_sim.tp import comm_buffer_prefixes
from memo_sim.cost.activations import skeletal_bytes, tensor_bytes
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes, model_state_parts
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.caching_allocator import (
    AllocatorConfig, AllocatorOutOfMemory, CachingAllocatorModel, OomEvent, fragmentation,
)
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, per_gpu_shard
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import forward_ops, layer_tensors
from memo_sim.policy.base import Policy
from memo_sim.profile.schema import AllocatorCosts, HardwareProfile

MALLOC, FREE, FREE_STREAM = 1, 0, 2  # FREE_STREAM: the buffer was used by a collective (record_stream)
ROLES = ("input", "attn", "other", "lse")

# One request: (MALLOC, FREE or FREE_STREAM, buffer id, bytes; 0 for a free).
Request = tuple[int, str, int]


# ---------------------------------------------------------------------------------- the stream
@dataclass(frozen=True)
class IterationStream:
    """The requests of one GPU: ``static`` once before the first iteration, ``iteration`` per
    iteration (it frees everything it allocates). ``phase_of[j]`` numbers the phase request j
    belongs to, in order (``embedding``, ``L<i>.fwd`` for each layer, ``classifier``,
    ``L<i>.bwd`` (recompute and backward) from the last layer down, ``embedding.bwd``: the names
    in ``phase_names``); empty means one phase."""

    static: tuple[Request, ...]
    iteration: tuple[Request, ...]
    phase_of: tuple[int, ...] = ()
    name: str = ""
    phase_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.phase_of and (len(self.phase_of) != len(self.iteration)
                              or sorted(self.phase_of) != list(self.phase_of)):  # non-decreasing
            raise MemoError("IterationStream.phase_of must give each request a phase, in non-decreasing order")
        if self.phase_names and len(self.phase_names) != self.phases:
            raise MemoError("IterationStream.phase_names must name every phase")
        _check_balanced(self)

    def phase_name(self, k: int) -> str:
        return self.phase_names[k] if self.phase_names else f"phase{k}"

    @property
    def static_bytes(self) -> int:
        return sum(r[2] for r in self.static)

    @property
    def phases(self) -> int:
        return (self.phase_of[-1] + 1) if self.phase_of else 1

    def max_live_bytes(self) -> int:
        """Largest sum of live request sizes (static included): the lower bound on any allocator."""
        return self.static_bytes + _iteration_facts(self.iteration).max_live

    @property
    def mallocs(self) -> int:
        """Requests that allocate, per iteration."""
        return _iteration_facts(self.iteration).mallocs

    def to_trace(self) -> RequestTrace:
        """One iteration as a `RequestTrace` (step j = request j; the static buffers live through
        it), for the DSA tools and plots."""
        n = len(self.iteration)
        bufs = [Buffer(bid, size, 0, n + 1, kind="other", name=bid) for _k, bid, size in self.static]
        open_: dict[str, tuple[int, int]] = {}
        for j, (kind, bid, size) in enumerate(self.iteration):
            if kind == MALLOC:
                open_[bid] = (j, size)
            else:
                lo, sz = open_.pop(bid)
                bufs.append(Buffer(f"it.{bid}", sz, lo, j, name=bid))
        return RequestTrace(bufs, name=self.name)


def _check_balanced(stream: IterationStream) -> None:
    static: set[str] = set()
    for kind, bid, size in stream.static:
        if kind != MALLOC or not isinstance(size, int) or size <= 0:
            raise MemoError(f"iteration stream: static request {bid!r} must be a malloc of a positive size")
        static.add(bid)
    clash = _iteration_facts(stream.iteration).allocated & static
    if clash:  # allocated while allocated, or freed by the iteration
        raise MemoError(f"iteration stream: {sorted(clash)[0]!r} is a static buffer: the iteration cannot "
                        f"allocate or free it")


@dataclass(frozen=True)
class _IterationFacts:
    allocated: frozenset  # every buffer id the iteration allocates
    max_live: int  # the most bytes its requests hold at once
    mallocs: int


_FACTS: OrderedDict[int, tuple[tuple, _IterationFacts]] = OrderedDict()


def _iteration_facts(iteration: tuple[Request, ...]) -> _IterationFacts:
    """Check that an iteration's requests balance (every buffer allocated once at a time with a
    positive integer size, freed only while allocated, nothing left at the end) and return what
    the stream reads of them. Remembered by identity (the entry keeps the tuple alive): streams
    built from one recipe share their iteration's tuple (`_iteration_requests`)."""
    hit = _FACTS.get(id(iteration))
    if hit is not None and hit[0] is iteration:
        return hit[1]
    live: dict[str, int] = {}
    allocated: set[str] = set()
    cur = peak = mallocs = 0
    for kind, bid, size in iteration:
        if kind == MALLOC:
            if bid in live:
                raise MemoError(f"iteration stream: {bid!r} allocated while allocated")
            if not isinstance(size, int) or size <= 0:
                raise MemoError(f"iteration stream: {bid!r} needs a positive integer size, got {size!r}")
            live[bid] = size
            allocated.add(bid)
            mallocs += 1
            cur += size
            if cur > peak:
                peak = cur
        elif kind == FREE or kind == FREE_STREAM:
            if bid not in live:
                raise MemoError(f"iteration stream: {bid!r} freed while not allocated in the iteration")
            cur -= live.pop(bid)
        else:
            raise MemoError(f"iteration stream: unknown request kind {kind!r}")
    if live:
        raise MemoError(f"iteration stream: {sorted(live)[:3]} still allocated at the end of the iteration")
    facts = _IterationFacts(frozenset(allocated), peak, mallocs)
    _FACTS[id(iteration)] = (iteration, facts)
    if len(_FACTS) > 256:
        _FACTS.popitem(last=False)
    return facts


def _nbytes(x: float) -> int:
    return max(1, int(math.ceil(x - 1e-6)))


def _basis(role: str) -> dict[str, float]:
    d = {r: 0.0 for r in ROLES}
    d[role] = 1.0
    d["total"] = 1.0 if role in ("input", "attn", "other") else 0.0
    return d


def _split_by_role(lumps_of, sk: dict[str, float]) -> list[tuple[str, dict[str, float] | None, float]]:
    """A policy's (name, bytes) lumps as (name, {role: share}, bytes); the share map is None for a
    lump whose bytes are not a linear combination of the role bytes."""
    actual = list(lumps_of(sk))
    probes = {r: dict(lumps_of(_basis(r))) for r in ROLES}
    out = []
    for name, nbytes in actual:
        comp = {r: float(probes[r].get(name, 0.0)) for r in ROLES}
        recon = sum(comp[r] * sk[r] for r in ROLES)
        ok = all(c >= 0 for c in comp.values()) and math.isclose(recon, nbytes, rel_tol=1e-9, abs_tol=1.0)
        out.append((name, comp if ok else None, float(nbytes)))
    return out


def _forward_op_steps(model: ModelConfig, layout: Layout) -> dict[str, int]:
    """Step of `layer_forward_trace` at which each forward op allocates its outputs (the same walk
    of the op list and the same ticks; `tests/test_allocator_iteration.py` checks they agree)."""
    sp = layout.sp and layout.tp > 1
    tp = layout.tp > 1
    step, out = 0, {}
    for op in forward_ops(model):
        if op.kind == "gemm" and sp and op.tp_comm_after != "reduce":
            step += 1  # all-gather of the input
        out[op.name] = step
        step += 1
        if op.tp_comm_after == "reduce" and tp:
            step += len(op.outputs)  # reduce-scatter / all-reduce outputs
    return out


def _backward_op_steps(model: ModelConfig, trace: RequestTrace) -> dict[str, int]:
    """Step of a `layer_backward_trace` at which each (non-add) op's backward runs: where it
    allocates the gradients of its inputs (trace_gen's names: dx, d_<t>_part, d_<t>[_partial])."""
    lower = {b.id: b.lower for b in trace.buffers}
    out: dict[str, int] = {}
    for op in forward_ops(model):
        if op.kind == "elementwise" and op.name.startswith("add"):
            continue  # residual adds: the gradient flows through, nothing is allocated
        steps = []
        for i in op.inputs:
            n = "dx" if (i == "x" and op.name == "ln1") else (f"d_{i}_part" if i in ("x", "h1") else f"d_{i}")
            for cand in (f"bwd.{n}", f"bwd.{n}_partial"):
                if cand in lower:
                    steps.append(lower[cand])
        if steps:
            out[op.name] = min(steps)
    return out


def _release_op(model: ModelConfig) -> dict[str, str]:
    """Saved tensor -> the forward op whose backward is the last to need it (the earliest op in
    forward order among those that read it; the attention backward also reads its outputs)."""
    ops = forward_ops(model)
    out: dict[str, str] = {}
    for t, spec in layer_tensors(model).items():
        if not spec.saved:
            continue
        users = [k for k, op in enumerate(ops) if t in op.inputs
                 or (op.kind == "attention" and t in op.outputs)]
        if users:
            out[t] = ops[min(users)].name
    return out


# buffers collectives read or write on their own streams: trace_gen.attention_buffers (ring-CP P2P,
# all-to-all) and the TP flavours' ring and broadcast buffers (`memo_sim.tp`)
_COMM_BUFFERS = ("cp_kv_", "cp_dkv_", "ulysses_") + comm_buffer_prefixes()


def _collective(name: str, names: set[str]) -> bool:
    """Whether a level-1 transient is read or written by a collective on another stream
    (trace_gen's names: a TP all-gather output ``*_gathered``, a reduce input ``*_partial`` or
    the reduce output beside it, the ring-CP K/V and dK/dV buffers, the Ulysses all-to-all
    buffers)."""
    return (name.endswith(("_gathered", "_partial")) or name.startswith(_COMM_BUFFERS)
            or f"{name}_partial" in names)


class _Phase:
    """Requests of one phase keyed by (step, free-before-malloc, order), emitted in that order."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int, int, int, str, int]] = []

    def add(self, step: int, kind: int, bid: str, size: int = 0) -> None:
        self.items.append((step, 1 if kind == MALLOC else 0, len(self.items), kind, bid, size))

    def requests(self) -> list[Request]:
        return [(k, b, s) for _st, _o, _n, k, b, s in sorted(self.items)]


def _expand(lumps, model: ModelConfig, layout: Layout, batch: int, seq: int, prefix: str):
    """Kept lumps -> [(tensor name or None, id suffix, bytes, share)], one entry per layer tensor
    (share: the part of that tensor the lump holds; a lump that is not linear in the role bytes
    comes back whole, tensor None)."""
    tensors = layer_tensors(model, layout.tp_mode)
    out = []
    for name, comp, nbytes in lumps:
        if comp is None:
            if nbytes > 0:
                out.append((None, f"{prefix}{name}", _nbytes(nbytes), 1.0))
            continue
        for t, spec in tensors.items():
            share = comp.get(spec.role, 0.0) if spec.saved else 0.0
            if share <= 0:
                continue
            b = share * tensor_bytes(spec, layout, batch, seq)
            if b > 0:
                out.append((t, f"{prefix}{name}.{t}", _nbytes(b), share))
    return out


@dataclass(frozen=True)
class _LayerTemplates:
    forward: tuple[Request, ...]
    backward: tuple[Request, ...]  # without recompute
    backward_recompute: tuple[Request, ...]  # recompute + backward


# Chain names, substituted per layer: the layer's input and output activations and gradients.
X_IN, X_OUT, G_IN, G_OUT = "@x_in", "@x_out", "@g_in", "@g_out"


def _layer_templates(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy) -> _LayerTemplates:
    sk = skeletal_bytes(model, layout, batch, seq)
    fwd = layer_forward_trace(model, layout, batch, seq)
    fsteps = _forward_op_steps(model, layout)
    producer = {o: op.name for op in forward_ops(model) for o in op.outputs}
    release = _release_op(model)
    fwd_end = max(b.upper for b in fwd.buffers) if fwd.buffers else max(fsteps.values()) + 1
    fnames = {b.name for b in fwd.buffers}

    kept = _expand(_split_by_role(policy.forward_kept, sk), model, layout, batch, seq, "keep.")
    # keeping the whole layer input is keeping the previous layer's output allocation (no copy)
    keeps_input = any(t == "x" and math.isclose(share, 1.0) for t, _, _, share in kept)
    kept = [k for k in kept if not (k[0] == "x" and math.isclose(k[3], 1.0))]
    rec = _expand(_split_by_role(policy.recompute_allocated, sk), model, layout, batch, seq, "rec.")

    def forward_phase(ph: _Phase, saved, local: str, y_name: str) -> int:
        """The layer forward's requests into ``ph``; returns the phase's end step."""
        for b in fwd.buffers:
            if b.name == "y":  # the layer output: its free is the caller's
                ph.add(b.lower, MALLOC, y_name, b.size)
                continue
            ph.add(b.lower, MALLOC, f"{local}{b.name}", b.size)
            ph.add(b.upper, FREE_STREAM if _collective(b.name, fnames) else FREE, f"{local}{b.name}")
        for t, bid, size, _share in saved:
            step = fsteps.get(producer.get(t, ""), 0) if t is not None else 0
            ph.add(step, MALLOC, bid, size)
        return fwd_end

    # ---- forward
    ph = _Phase()
    end = forward_phase(ph, kept, "fwd.", X_OUT)
    if not keeps_input:
        ph.add(end, FREE, X_IN)
    forward = tuple(ph.requests())

    # ---- backward (with or without recompute)
    def backward_phase(recompute: bool) -> tuple[Request, ...]:
        ph = _Phase()
        offset = 0
        full_forward = recompute and policy.recomputes_attention
        rec_saved = rec if recompute else []
        if full_forward:
            # the whole layer forward runs again; its output (the recomputed y) is what the
            # backward differentiates, held until the backward ends
            offset = forward_phase(ph, rec_saved, "rfwd.", "rfwd.y") + 1
        bwd = layer_backward_trace(model, layout, batch, seq, None if full_forward else policy)
        bsteps = _backward_op_steps(model, bwd)
        bnames = {b.name for b in bwd.buffers}
        bwd_end = offset + (max(b.upper for b in bwd.buffers) if bwd.buffers else 0)
        if recompute and not full_forward:
            for _t, bid, size, _share in rec_saved:
                ph.add(offset, MALLOC, bid, size)
        for b in bwd.buffers:
            lo, up = b.lower + offset, b.upper + offset
            if b.name == "dy":
                ph.add(up, FREE, G_IN)  # the gradient the layer above handed down
            elif b.name == "dx":
                ph.add(lo, MALLOC, G_OUT, b.size)  # handed to the layer below
            else:
                ph.add(lo, MALLOC, f"bwd.{b.name}", b.size)
                ph.add(up, FREE_STREAM if _collective(b.name, bnames) else FREE, f"bwd.{b.name}")

        def free_after_use(t: str | None, bid: str) -> None:
            op = release.get(t) if t is not None else None
            step = offset + bsteps[op] + 1 if op in bsteps else bwd_end
            ph.add(step, FREE, bid)

        for t, bid, _size, _share in kept + list(rec_saved):
            free_after_use(t, bid)
        if keeps_input:
            free_after_use("x", X_IN)
        if full_forward:
            ph.add(bwd_end, FREE, "rfwd.y")
        return tuple(ph.requests())

    return _LayerTemplates(forward, backward_phase(False), backward_phase(True))


def _model_state_requests(model: ModelConfig, layout: Layout) -> list[Request]:
    """Model states as Megatron holds them: one contiguous buffer per part
    (`memo_sim.cost.memory.model_state_parts`), allocated before the first iteration."""
    return [(MALLOC, f"model.{name}", _nbytes(b)) for name, b in model_state_parts(model, layout).items() if b > 0]


@dataclass(frozen=True)
class _StreamRecipe:
    """Everything one GPU's request stream is built from but its name (`_build_stream`): equal
    recipes give equal streams, so a replay is memoised by its recipe (`replay_iteration`)."""

    static: tuple[Request, ...]
    x: int  # the activation handed between layers (embedding output, gradients, final norm)
    logits: int  # one classifier chunk's working bytes
    templates: _LayerTemplates
    recomputes: tuple[bool, ...]  # per layer: its backward runs the recompute template

    def request_sizes(self) -> set[int]:
        """The sizes the iteration's requests ask for."""
        t = self.templates
        return {self.x, self.logits} | {size for tpl in (t.forward, t.backward, t.backward_recompute)
                                        for kind, _bid, size in tpl if kind == MALLOC}

    def content_key(self, static: bool = True) -> bytes:
        """The recipe, losslessly encoded (the ``repr`` of its ints, strings and bools, compressed):
        equal keys, equal recipes. About 1 KB, where the recipe's objects take some 15 KB: what
        the replay memo keeps. ``static=False`` leaves the static requests out (the iteration's
        requests and phases alone)."""
        t = self.templates
        text = repr((self.static if static else None, self.x, self.logits, t.forward, t.backward,
                     t.backward_recompute, self.recomputes))
        return zlib.compress(text.encode(), 1)


@lru_cache(maxsize=64)
def _shard_templates(model: ModelConfig, shard: Layout, batch: int, seq: int, policy: Policy) -> _LayerTemplates:
    """`_layer_templates` of one GPU's shard: DP and ZeRO change the model states, not a layer's
    requests, so layouts that differ only in them share one."""
    return _layer_templates(model, shard, batch, seq, policy)


@lru_cache(maxsize=64)
def _stream_recipe(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                   classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> _StreamRecipe:
    n = model.layers
    sk = skeletal_bytes(model, layout, batch, seq)
    x = _nbytes(sk["input"])
    static = _model_state_requests(model, layout)
    static += [(MALLOC, f"static.{name}", _nbytes(b)) for name, b in policy.static_gpu(sk) if b > 0]
    logits = _nbytes(max(1.0, classifier_peak_bytes(model, layout, batch, seq, classifier_chunk_tokens)
                         - 2 * sk["input"]))
    return _StreamRecipe(tuple(static), x, logits, _shard_templates(model, per_gpu_shard(layout), batch, seq, policy),
                         tuple(bool(policy.recomputes_layer(i, n)) for i in range(n)))


def _stream_name(model: ModelConfig, layout: Layout, seq: int, policy: Policy) -> str:
    return f"{model.name}-{layout.label()}-{seq}-{policy.label()}-iteration"


def _build_stream(r: _StreamRecipe, name: str) -> IterationStream:
    reqs, phase_of, names = _iteration_requests(r.x, r.logits, r.templates, r.recomputes)
    return IterationStream(r.static, reqs, phase_of, name=name, phase_names=names)


@lru_cache(maxsize=64)
def _iteration_requests(x: int, logits: int, tpl: _LayerTemplates, recomputes: tuple[bool, ...]) -> tuple:
    """(requests, phase of each, phase names) of one iteration: what a stream holds besides its
    static requests and name (recipes that differ only in those share one)."""
    n = len(recomputes)
    reqs: list[Request] = [(MALLOC, "x0", x)]  # embedding output = layer 0's input
    phase_of: list[int] = [0]

    def emit(template: tuple[Request, ...], i: int, phase: int) -> None:
        chain = {X_IN: f"x{i}", X_OUT: f"x{i + 1}", G_IN: f"g{i + 1}", G_OUT: f"g{i}"}
        pre = f"L{i}."
        reqs.extend([(kind, chain[bid] if bid[0] == "@" else pre + bid, size) for kind, bid, size in template])
        phase_of.extend([phase] * len(template))

    phase = 0
    for i in range(n):
        phase += 1
        emit(tpl.forward, i, phase)
    # classifier: final norm output, one chunk's logits (+ fp32 softmax and gradient), the gradient
    # of the last layer's output; the last layer's output dies with the final norm's backward
    phase += 1
    cls = ((MALLOC, "cls.final_norm", x), (MALLOC, "cls.chunk", logits), (FREE, "cls.chunk", 0),
           (MALLOC, f"g{n}", x), (FREE, "cls.final_norm", 0), (FREE, f"x{n}", 0))
    reqs.extend(cls)
    phase_of.extend([phase] * len(cls))
    for i in range(n - 1, -1, -1):
        phase += 1
        emit(tpl.backward_recompute if recomputes[i] else tpl.backward, i, phase)
    phase += 1
    reqs.append((FREE, "g0", 0))  # embedding backward
    phase_of.append(phase)
    names = (("embedding",) + tuple(f"L{i}.fwd" for i in range(n)) + ("classifier",)
             + tuple(f"L{i}.bwd" for i in range(n - 1, -1, -1)) + ("embedding.bwd",))
    return tuple(reqs), tuple(phase_of), names


@lru_cache(maxsize=64)
def iteration_stream(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                     classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> IterationStream:
    """The request stream of one GPU's training iteration (memoised; see the module docs)."""
    return _build_stream(_stream_recipe(model, layout, batch, seq, policy, classifier_chunk_tokens),
                         _stream_name(model, layout, seq, policy))


# ---------------------------------------------------------------------------------- the replay
@dataclass
class IterationReplay:
    """The caching allocator over a steady-state training iteration of one GPU.

    ``iterations`` were replayed back to back and the last is reported (``steady``: it left the
    cache as it found it, so every later iteration repeats it). Bytes are per GPU.
    ``peak_reserved_bytes`` includes the segments cached by earlier iterations;
    ``fragmentation_at_peak`` = 1 - allocated / reserved at the moment allocated bytes peak in
    the reported iteration. Counts (reorganisations, cudaMalloc / cudaFree calls and their bytes,
    fragmentation failures) are the reported iteration's; ``warmup`` holds the earlier ones'
    together. ``reorganization_requests`` names the requests that triggered a reorganisation.
    On OOM the replay stops: ``oom_iteration`` (0-based; -1: the static requests, model states
    and the policy's static buffers, do not fit) and ``oom_event`` say where (the OOM request is
    ``oom_request``); the counts are those of the failing iteration up to there.
    """

    name: str
    policy: str
    capacity_bytes: int
    iterations: int
    steady: bool
    requests_per_iteration: int  # mallocs
    static_bytes: int  # model states and the policy's static buffers
    max_live_bytes: int  # the most bytes live at once (static included): the bound for any allocator
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    reserved_at_peak_allocated_bytes: int
    fragmentation_at_peak: float
    reorganizations: int
    reorganization_requests: list[str]
    cuda_mallocs: int
    cuda_malloc_bytes: int
    cuda_frees: int
    cuda_free_bytes: int
    reorganization_cuda_frees: int
    fragmentation_failures: int
    phase_counts: dict  # phase name -> its counts (reorganizations, cuda_free(_bytes), cuda_malloc(_bytes))
    warmup: dict  # counters of the iterations before the reported one, summed
    oom: bool
    oom_iteration: int | None
    oom_event: OomEvent | None
    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    stream_lag_phases: int = 0
    static_memory_plan: bool = False  # the policy has one: these numbers do not apply to it
    series_reserved_bytes: list[int] = field(default_factory=list)  # per request, reported iteration
    series_allocated_bytes: list[int] = field(default_factory=list)

    @property
    def oom_request(self) -> str | None:
        return self.oom_event.buffer_id if self.oom_event is not None else None

    def stall_breakdown(self, profile: HardwareProfile | AllocatorCosts) -> dict[str, float]:
        """Seconds the reported iteration's allocator calls stall the compute stream, by kind:
        one device synchronise per reorganisation, every cudaFree and every cudaMalloc (in a
        steady state all of them follow from reorganisations: the segments a flush released are
        cudaMalloc'd again later in the iteration)."""
        costs = profile.gpu.allocator if isinstance(profile, HardwareProfile) else profile
        out = {
            "sync_s": self.reorganizations * float(costs.sync),
            "cuda_free_s": costs.free_seconds(self.cuda_frees, self.cuda_free_bytes),
            "cuda_malloc_s": costs.malloc_seconds(self.cuda_mallocs, self.cuda_malloc_bytes),
        }
        out["total_s"] = out["sync_s"] + out["cuda_free_s"] + out["cuda_malloc_s"]
        return out

    def stall_by_phase(self, profile: HardwareProfile | AllocatorCosts) -> dict[str, float]:
        """`stall_seconds` split by the phase whose requests made the calls (``L<i>.fwd``,
        ``L<i>.bwd``, ``classifier``, ...; phases without a call are left out): where an event
        simulator puts the stall on the compute stream. The values add up to `stall_seconds`."""
        costs = profile.gpu.allocator if isinstance(profile, HardwareProfile) else profile
        return {name: (c["reorganizations"] * float(costs.sync)
                       + costs.free_seconds(c["cuda_free"], c["cuda_free_bytes"])
                       + costs.malloc_seconds(c["cuda_malloc"], c["cuda_malloc_bytes"]))
                for name, c in self.phase_counts.items()}

    def stall_seconds(self, profile: HardwareProfile | AllocatorCosts) -> float:
        """Seconds per iteration the compute stream waits for the allocator (`stall_breakdown`)."""
        return self.stall_breakdown(profile)["total_s"]

    def to_json_obj(self) -> dict:
        d = asdict(self)
        d["oom_request"] = self.oom_request
        return d


MAX_ITERATIONS = 8  # replay at most this many iterations looking for a steady state
_PRICED = ("reorganizations", "cuda_free", "cuda_free_bytes", "cuda_malloc", "cuda_malloc_bytes")


def replay_stream(stream: IterationStream, config: AllocatorConfig, iterations: int | None = None,
                  series: bool = False, policy: Policy | None = None,
                  stream_lag_phases: int | None = None, miss_margins: list | None = None) -> IterationReplay:
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
    """
    if iterations is not None and (not isinstance(iterations, int) or isinstance(iterations, bool)
                                   or iterations < 1):
        raise MemoError(f"iterations must be None or a positive integer, got {iterations!r}")
    lag = stream_lag_phases or 0
    if not isinstance(lag, int) or isinstance(lag, bool) or lag < 0:
        raise MemoError(f"stream_lag_phases must be None or a non-negative integer, got {stream_lag_phases!r}")
    m = CachingAllocatorModel(config)
    oom: OomEvent | None = None
    oom_it: int | None = None
    for _k, bid, size in stream.static:
        try:
            m.malloc(bid, size, 0)
        except AllocatorOutOfMemory as e:
            oom, oom_it = e.event, -1  # the model states and static buffers do not fit
            break
    if miss_margins is not None:
        m.miss_margins = []
    reqs = stream.iteration
    n = len(reqs)
    phase_of = stream.phase_of or (0,) * n
    n_phases = stream.phases
    after_static = start = m.counters()
    by_phase: dict[str, dict[str, int]] = {}
    reorg_start = 0
    peak_alloc = reserved_at_peak = 0
    res_series: list[int] = []
    alloc_series: list[int] = []
    malloc, free = m.malloc, m.free
    limit = MAX_ITERATIONS if iterations is None else iterations
    steady = False
    done = 0
    while oom is None and done < limit:
        it = done
        start = m.counters()
        reorg_start = len(m.reorganization_steps)
        sig_start = m.layout_signature()
        m.reset_peak_stats()
        peak_alloc, reserved_at_peak = m.allocated_bytes, m.reserved_bytes
        res_series, alloc_series = [], []
        base = 1 + it * n
        phase_base = it * n_phases
        cur = -1
        marks: list[tuple[int, dict[str, int]]] = []
        missed = len(m.miss_margins) if miss_margins is not None else 0
        try:
            for step, (kind, bid, size), ph in zip(count(base), reqs, phase_of):
                if ph != cur:
                    cur = ph
                    marks.append((cur, m.counters()))
                    if lag and m.pending_bytes:
                        m.complete_pending(phase_base + cur)
                if kind == MALLOC:
                    malloc(bid, size, step)
                    if m.allocated_bytes > peak_alloc:
                        peak_alloc, reserved_at_peak = m.allocated_bytes, m.reserved_bytes
                elif kind == FREE_STREAM and lag:
                    free(bid, step, pending_until=phase_base + ph + lag)
                else:
                    free(bid, step)
                if series:
                    res_series.append(m.reserved_bytes)
                    alloc_series.append(m.allocated_bytes)
        except AllocatorOutOfMemory as e:
            oom, oom_it = e.event, it
        marks.append((-1, m.counters()))
        if miss_margins is not None:
            miss_margins.append([x for small, x in m.miss_margins[missed:] if not small])
        by_phase = {}
        for (k, c0), (_k1, c1) in zip(marks, marks[1:]):
            d = {key: c1[key] - c0[key] for key in _PRICED}
            if any(d.values()):
                by_phase[stream.phase_name(k)] = d
        done += 1
        if oom is not None:
            break
        m.complete_pending()  # the iteration ends with a synchronisation (loss.item(), gradient norm)
        steady = m.layout_signature() == sig_start
        if iterations is None and steady and done >= 2:
            break
    now = m.counters()
    cnt = {k: now[k] - start[k] for k in now}
    warmup = {k: start[k] - after_static[k] for k in now}
    last_base = 1 + (done - 1) * n
    reorg_ids = [reqs[s - last_base][1] if 0 <= s - last_base < n else f"step {s}"
                 for s in m.reorganization_steps[reorg_start:]]
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
        peak_allocated_bytes=peak_alloc,
        reserved_at_peak_allocated_bytes=reserved_at_peak,
        fragmentation_at_peak=fragmentation(peak_alloc, reserved_at_peak),
        reorganizations=cnt["reorganizations"],
        reorganization_requests=reorg_ids,
        phase_counts=by_phase,
        cuda_mallocs=cnt["cuda_malloc"],
        cuda_malloc_bytes=cnt["cuda_malloc_bytes"],
        cuda_frees=cnt["cuda_free"],
        cuda_free_bytes=cnt["cuda_free_bytes"],
        reorganization_cuda_frees=cnt["reorganization_cuda_frees"],
        fragmentation_failures=cnt["fragmentation_failures"],
        warmup=warmup,
        oom=oom is not None,
        oom_iteration=oom_it,
        oom_event=oom,
        expandable_segments=config.expandable_segments,
        max_split_size_bytes=config.max_split_size_bytes,
        stream_lag_phases=lag,
        static_memory_plan=bool(policy is not None and policy.static_memory_plan),
        series_reserved_bytes=res_series,
        series_allocated_bytes=alloc_series,
    )


def replay_iteration(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                     profile: HardwareProfile, *, iterations: int | None = None,
                     classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                     capacity_bytes: int | None = None, expandable_segments: bool = False,
                     max_split_size_bytes: int | None = None, stream_lag_phases: int | None = None,
                     series: bool = False) -> IterationReplay:
    """Replay one GPU's training iterations through the caching-allocator model; report the last.

    Capacity: ``profile.usable_gpu_memory`` (device memory minus what lives outside the
    allocator), or ``capacity_bytes``. ``expandable_segments`` / ``max_split_size_bytes`` are
    ``PYTORCH_CUDA_ALLOC_CONF``'s settings. ``stream_lag_phases`` (default None: the GPU keeps
    up) models ``record_stream`` on the TP collectives' buffers with the GPU that many layers
    behind the CPU (see `replay_stream`). ``series`` keeps reserved and allocated bytes after
    every request of the reported iteration.

    Applies to policies that run on the caching allocator. For a policy with a static memory plan
    (``policy.static_memory_plan``: MEMO) the caller should charge no reorganisation: its
    transients sit at planned addresses; the replay still runs (and says ``static_memory_plan``).
    """
    cap = int(profile.usable_gpu_memory if capacity_bytes is None else capacity_bytes)
    cfg = AllocatorConfig(capacity_bytes=cap, expandable_segments=expandable_segments,
                          max_split_size_bytes=max_split_size_bytes)
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
            "static_memory_plan": bool(policy.static_memory_plan)}
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
    return r


REPLAY_CACHE_SIZE = 4096  # replays remembered by `replay_iteration` (least recently used go first)
_REPLAYS: OrderedDict[tuple, IterationReplay] = OrderedDict()
_SHARED: OrderedDict[tuple, tuple[IterationReplay, "_StaticBase", list]] = OrderedDict()  # replay, base, margins


def _remember(memo: OrderedDict, key, value) -> None:
    memo[key] = value
    if len(memo) > REPLAY_CACHE_SIZE:
        memo.popitem(last=False)


def clear_replay_cache() -> None:
    """Forget the replays `replay_iteration` remembers."""
    _REPLAYS.clear()
    _SHARED.clear()


@dataclass(frozen=True)
class _StaticBase:
    """The allocator after a stream's static requests (model states, the policy's static
    buffers), as far as the iteration's requests can tell.

    Static blocks are never freed, so their segments are never released and never merge with
    anything the iteration frees. What the iteration can see of them: the reserved bytes
    (a cudaMalloc fails where reserved + segment > capacity); each static segment's free
    remainder that some iteration request could take (``visible``: its pool and size, in address
    order; static segments come first), where a large-pool remainder smaller than the smallest
    large request never serves one; the large pool's free bytes (``large_free``: a request the
    cache cannot serve counts as a fragmentation failure where the pool's free bytes would hold
    it); and, in the statistics, the allocated bytes.

    Two streams with the same iteration requests and the same visible remainders are served the
    same way wherever no cudaMalloc fails; with none failing the allocator never frees a segment,
    so the reserved bytes only grow and the last reported peak bounds them all. Such a replay
    (`holds`) serves any capacity with at least that much room above its own static bytes
    (`reserved_above`): its byte counts move by the difference of the static ones and its
    fragmentation failures are recounted from the margins of the requests the cache missed
    (`moved_to`). Expandable segments size their virtual ranges by the capacity: never shared.
    """

    reserved: int
    allocated: int
    visible: tuple[tuple[bool, int], ...]
    large_free: int

    @staticmethod
    def of(recipe: _StreamRecipe, cfg: AllocatorConfig) -> "_StaticBase | None":
        if cfg.expandable_segments:
            return None
        m = CachingAllocatorModel(cfg)
        try:
            for _k, bid, size in recipe.static:
                m.malloc(bid, size, 0)
        except AllocatorOutOfMemory:
            return None
        smallest = min((q for q in map(cfg.round_size, recipe.request_sizes()) if not cfg.is_small(q)), default=None)
        visible, large_free = [], 0
        for small, _expandable, blocks in m.layout_signature():
            for size, allocated, _mapped in blocks:
                if allocated:
                    continue
                if not small:
                    large_free += size
                if small or (smallest is not None and size >= smallest):
                    visible.append((small, size))
        return _StaticBase(m.reserved_bytes, m.allocated_bytes, tuple(visible), large_free)

    @staticmethod
    def holds(r: IterationReplay) -> bool:
        """No cudaMalloc failed in any replayed iteration: every failure ends in a cudaFree
        (a reorganisation or an oversize release) or in OOM."""
        return (not r.oom and r.cuda_frees == 0 and r.warmup.get("cuda_free", 0) == 0
                and r.reorganizations == 0 and r.warmup.get("reorganizations", 0) == 0)

    def reserved_above(self, r: IterationReplay) -> int:
        """The most bytes ``r``'s iterations reserved on top of the static segments."""
        return r.peak_reserved_bytes - self.reserved

    def moved_to(self, other: "_StaticBase", r: IterationReplay, margins: list[list[int]], capacity: int,
                 static: tuple[Request, ...]) -> IterationReplay:
        """``r`` (replayed on this base, with the large pool's ``margins`` per iteration) as
        replayed on ``other`` at ``capacity``."""
        dr, da = other.reserved - self.reserved, other.allocated - self.allocated
        df = other.large_free - self.large_free

        def recount(failures: int, its: list[list[int]]) -> int:
            return failures + sum((x + df >= 0) - (x >= 0) for it in its for x in it)

        static_bytes = sum(q[2] for q in static)
        peak, at_peak = r.peak_allocated_bytes + da, r.reserved_at_peak_allocated_bytes + dr
        warmup = dict(r.warmup)
        warmup["fragmentation_failures"] = recount(warmup["fragmentation_failures"], margins[:-1])
        return replace(  # shares r's lists and dicts: the caller copies what it keeps or hands out
            r, capacity_bytes=capacity, static_bytes=static_bytes,
            max_live_bytes=r.max_live_bytes - r.static_bytes + static_bytes,
            peak_reserved_bytes=r.peak_reserved_bytes + dr, peak_allocated_bytes=peak,
            reserved_at_peak_allocated_bytes=at_peak,
            fragmentation_at_peak=fragmentation(peak, at_peak),
            fragmentation_failures=recount(r.fragmentation_failures, margins[-1:]), warmup=warmup,
            series_reserved_bytes=[x + dr for x in r.series_reserved_bytes],
            series_allocated_bytes=[x + da for x in r.series_allocated_bytes])


def _copy_replay(r: IterationReplay, **changes) -> IterationReplay:
    """A copy of ``r`` that shares nothing mutable with it (the cache keeps its own)."""
    out = copy.deepcopy(r)
    for k, v in changes.items():
        setattr(out, k, v)
    return out
