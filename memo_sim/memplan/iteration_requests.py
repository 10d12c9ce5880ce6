"""How one GPU's training iteration becomes allocator requests (`iteration_stream`): the model
states and the policy's static buffers once, then per layer the level-1 transients of
`memo_sim.memplan.trace_gen` and the tensors the policy keeps, allocated at the ops that produce
them and freed after the backward of the last op that reads them; under a static memory plan the
transients it places are one static arena instead, the classifier's chunks inside it
(`chunk_in_arena`; the full description is `memo_sim.memplan.iteration_replay`'s). The stream is
built from a recipe (`_StreamRecipe`: static requests, layer templates, the recompute pattern, the
classifier's sizes): equal recipes build equal streams, which is what the replay cache keys on."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from functools import lru_cache

from memo_sim.cost.activations import saved_bytes, skeletal_bytes
from memo_sim.cost.loss_kernels import FP32, loss_kernel
from memo_sim.cost.memory import (CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes, loss_bytes_per_logit,
                                  loss_tokens, model_state_parts, mtp_activation_bytes, mtp_module_parts)
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.iteration_stream import FREE, FREE_STREAM, MALLOC, ROLES, IterationStream, Request
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, per_gpu_shard, placed_only
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, IN_PLACE_NO_SAVED, UNPLACED, forward_ops, layer_tensors
from memo_sim.policy.base import Policy, uses_memory_plan
from memo_sim.request_trace import RequestTrace
from memo_sim.tp import comm_buffer_prefixes


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
        users = [k for k, op in enumerate(ops) if (t in op.inputs and op.name not in IN_PLACE_NO_SAVED)
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
            b = share * saved_bytes(spec, model, layout, batch, seq)
            if b > 0:
                out.append((t, f"{prefix}{name}.{t}", _nbytes(b), share))
    return out


@dataclass(frozen=True)
class _LayerTemplates:
    forward: tuple[Request, ...]
    backward: tuple[Request, ...]  # without recompute
    backward_recompute: tuple[Request, ...]  # recompute + backward
    arena: int = 0  # under a static memory plan: the arena its placed transients share (0: none)


def _allocated(name: str, phase: str, planned: bool) -> bool:
    """Whether a level-1 transient goes through the caching allocator: all of them, except under a
    static memory plan the ones the plan places in its arena: only the plan's unplaced ones go
    through it (`memo_sim.model.layer_graph.UNPLACED`). No level-1 transient lives in the rounding
    buffers: the recompute writes its rows into their slots, and its gathers (``RECOMPUTE_GATHERS``)
    are layer scratch placed with the forward's transients (memo_exec/layer.py ``LayerCompute._fwd_ops``)."""
    if not planned:
        return True
    return name in UNPLACED.get(phase, {})


ARENA_ID = "static.memory_plan_arena"  # the static memory plan's arena among a stream's static requests

# Chain names, substituted per layer: the layer's input and output activations and gradients.
X_IN, X_OUT, G_IN, G_OUT = "@x_in", "@x_out", "@g_in", "@g_out"


def _layer_templates(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy) -> _LayerTemplates:
    sk = skeletal_bytes(model, layout, batch, seq)
    fwd = layer_forward_trace(model, layout, batch, seq)
    fsteps = _forward_op_steps(model, layout)
    producer = {o: op.name for op in forward_ops(model) if op.name not in IN_PLACE_NO_SAVED for o in op.outputs}
    release = _release_op(model)
    fwd_end = max(b.upper for b in fwd.buffers) if fwd.buffers else max(fsteps.values()) + 1
    fnames = {b.name for b in fwd.buffers}

    kept = _expand(_split_by_role(policy.forward_kept, sk), model, layout, batch, seq, "keep.")
    # keeping the whole layer input is keeping the previous layer's output allocation (no copy)
    keeps_input = any(t == "x" and math.isclose(share, 1.0) for t, _, _, share in kept)
    kept = [k for k in kept if not (k[0] == "x" and math.isclose(k[3], 1.0))]
    rec = _expand(_split_by_role(policy.recompute_allocated, sk), model, layout, batch, seq, "rec.")
    planned = uses_memory_plan(policy, layout)
    arena = [placed_only(fwd, "fwd").max_live_bytes()] if planned else []

    def forward_phase(ph: _Phase, saved, local: str, y_name: str) -> int:
        """The layer forward's requests into ``ph``; returns the phase's end step."""
        for b in fwd.buffers:
            if b.name == "y":  # the layer output: its free is the caller's
                ph.add(b.lower, MALLOC, y_name, b.size)
                continue
            if not _allocated(b.name, "fwd", planned):
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
        if planned:
            arena.append(placed_only(bwd, "bwd").max_live_bytes())
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
            elif _allocated(b.name, "bwd", planned):
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

    backward, backward_recompute = backward_phase(False), backward_phase(True)
    return _LayerTemplates(forward, backward, backward_recompute, _nbytes(max(arena)) if arena else 0)


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
    logits: tuple[Request, ...]  # the loss's requests over one chunk of logits, ids without a prefix (`_loss_requests`)
    templates: _LayerTemplates
    recomputes: tuple[bool, ...]  # per layer: its backward runs the recompute template
    # the multi-token-prediction modules' tensors kept over the head, each its own request (`_mtp_requests`)
    mtp: tuple[Request, ...] = ()
    chunk_in_arena: bool = False  # the classifier's chunks sit in the memory plan's arena (`chunk_in_arena`)

    def request_sizes(self) -> set[int]:
        """The sizes the iteration's requests ask for."""
        t = self.templates
        chunk = set() if self.chunk_in_arena else {size for kind, _bid, size in self.logits if kind == MALLOC}
        return {self.x} | chunk | {size for tpl in (t.forward, t.backward, t.backward_recompute, self.mtp)
                                   for kind, _bid, size in tpl if kind == MALLOC}

    def content_key(self, static: bool = True) -> bytes:
        """The recipe, losslessly encoded (the ``repr`` of its ints, strings and bools, compressed):
        equal keys, equal recipes. About 1 KB, where the recipe's objects take some 15 KB: what
        the replay memo keeps. ``static=False`` leaves the static requests out (the iteration's
        requests and phases alone)."""
        t = self.templates
        text = repr((self.static if static else None, self.x, self.logits, t.forward, t.backward,
                     t.backward_recompute, t.arena, self.recomputes) + ((self.mtp,) if self.mtp else ())
                    + (("chunk_in_arena",) if self.chunk_in_arena else ()))
        return zlib.compress(text.encode(), 1)


# memo_exec/model.py ``ChunkPlace``: a chunk goes into the arena when at least this many of its rows fit there
# (MIN_ARENA_ROWS), after ALIGN bytes for the fp32 copy's aligned start
_CHUNK_MIN_ARENA_ROWS, _CHUNK_ALIGN = 1024, 256


def chunk_in_arena(model: ModelConfig, layout: Layout, batch: int, seq: int, arena: int,
                   classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> bool:
    """Whether a memory-planned run puts the classifier's chunk tensors (the logits, their fp32 copy and their
    gradient, which reuses the logits) in the plan's ``arena``-byte arena instead of asking the caching allocator:
    memo-exec hands the whole arena to the classifier between the last layer's forward and the first backward
    (memo_exec/arena.py ``ArenaScratch.between_layers``) and memo_exec/model.py ``ChunkPlace`` places a chunk
    there, cut to the rows that fit (a multiple of 128), when at least ``min(chunk, MIN_ARENA_ROWS)`` rows fit; a
    row takes the loss's live bytes per logit (`loss_bytes_per_logit`) times the GPU's vocabulary share."""
    if arena <= 0:
        return False
    rows = loss_tokens(layout, batch, seq, classifier_chunk_tokens)
    per_row = model.vocab / layout.tp * loss_bytes_per_logit(layout.cross_entropy, DTYPE_BYTES[model.dtype])
    if rows <= 0 or per_row <= 0:
        return False
    fit = max(0, arena - _CHUNK_ALIGN) // per_row
    return fit >= min(rows, _CHUNK_MIN_ARENA_ROWS)


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
    templates = _shard_templates(model, per_gpu_shard(layout), batch, seq, policy)
    if templates.arena:  # the static memory plan's arena, allocated once (memo_exec/arena.py)
        static.append((MALLOC, ARENA_ID, templates.arena))
    rec_mtp = policy.recomputes_mtp
    # the main head's own term: the modules' share (`mtp_activation_bytes`) is requested tensor by tensor
    head = (classifier_peak_bytes(model, layout, batch, seq, classifier_chunk_tokens, recompute_mtp=rec_mtp)
            - mtp_activation_bytes(model, layout, batch, seq, rec_mtp))
    logits = _loss_requests(model, layout, batch, seq, head - 2 * sk["input"], classifier_chunk_tokens)
    # a review: the replay asked the caching allocator for the 14.48 GiB chunk of gpt-7b at 1M on MEMO's plan and
    # ran out of memory, where memo-exec puts it in the 20 GiB arena (`chunk_in_arena`)
    in_arena = chunk_in_arena(model, layout, batch, seq, templates.arena, classifier_chunk_tokens)
    return _StreamRecipe(tuple(static), x, logits, templates,
                         tuple(bool(policy.recomputes_layer(i, n)) for i in range(n)),
                         _mtp_requests(model, layout, batch, seq, rec_mtp), in_arena)


def _loss_requests(model: ModelConfig, layout: Layout, batch: int, seq: int, working: float,
                   classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> tuple[Request, ...]:
    """The head's requests over one chunk of logits (ids without a prefix; the head's phase frees them in the order
    given), each tensor its own malloc as PyTorch makes them, not one block of their sum (a review: a DeepSpeed
    Ulysses run's 90112 tokens x 128256 logits asked for one 64.5 GiB block, where Megatron-LM's vocab-parallel loss
    has the output layer's bf16 logits, 21.5 GiB, and their ``.float()`` copy, 43 GiB, allocated apart:
    megatron/core/tensor_parallel/cross_entropy.py). The tensors are the loss kernel's (`memo_sim.cost.loss_kernels`,
    the one place its bytes per logit live): the logits in the model dtype where it keeps them, then one fp32
    tensor of the chunk per 4 of its ``live_fp32`` bytes, the first the widened copy (memo-exec's ``ChunkedHead``,
    memo_exec/model.py, out of the arena: ``torch.mm`` then ``logits.to(acc)``, two allocations; Megatron's
    ``.float()``; torch's ``F.cross_entropy(logits.float())``), the rest what the kernel writes beside it
    (log_softmax's output). A kernel whose backward holds more (``live_floor``: torch's log_softmax backward) then
    frees the logits and the copy and allocates the nll gradient and log_softmax's input gradient beside the saved
    output. ``working``: the head's bytes less the rank's final-norm output and its gradient, which the stream
    requests apart (``x`` each); what it holds beyond the loss's tensors (the rows gathered for the vocab-parallel
    head under sequence parallelism and their gradient, or the fp32 bytes of a gradient accumulated in fp32,
    torchtitan's ``GradAccumulator``: `memo_sim.cost.memory.classifier_peak_bytes`) is one more request
    (``final_hidden_rest.chunk``), live over the head."""
    k = loss_kernel(layout.cross_entropy)
    d = DTYPE_BYTES[model.dtype]
    per_tensor = loss_tokens(layout, batch, seq, classifier_chunk_tokens) * model.vocab / layout.tp
    kept_logits = d if d != FP32 or k.chunked else 0  # fp32 logits need no copy (`LossKernel.live_bytes_per_logit`)
    fwd = ([("chunk", per_tensor * kept_logits)] if kept_logits else []) + [
        ("fp32_copy.chunk" if j == 0 else f"fp32_{j}.chunk", per_tensor * FP32) for j in range(k.live_fp32 // FP32)]
    live = [bid for bid, b in fwd if b > 0]
    rest = working - per_tensor * k.live_bytes_per_logit(d)
    reqs: list[Request] = [(MALLOC, "final_hidden_rest.chunk", _nbytes(rest))] if rest >= 1.0 else []
    reqs += [(MALLOC, bid, _nbytes(b)) for bid, b in fwd if b > 0]
    saved = k.live_fp32 - FP32 if k.live_fp32 else 0  # its forward's fp32 bytes past the copy, kept for the backward
    if k.live_floor > kept_logits + k.live_fp32:  # the backward's moment without the logits and their copy
        for bid in live[:2 if kept_logits else 1]:
            reqs.append((FREE, bid, 0))
        live = live[2 if kept_logits else 1:]
        grads = [f"fp32_grad_{j}.chunk" for j in range((k.live_floor - saved) // FP32)]
        reqs += [(MALLOC, bid, _nbytes(per_tensor * FP32)) for bid in grads]
        live += grads
    reqs += [(FREE, bid, 0) for bid in reversed(live)]
    if rest >= 1.0:
        reqs.append((FREE, "final_hidden_rest.chunk", 0))
    if not reqs:  # nothing to hold (a degenerate head): one byte, as before, so the phase has its request
        reqs = [(MALLOC, "chunk", 1), (FREE, "chunk", 0)]
    return tuple(reqs)


def _mtp_module_tensors(model: ModelConfig, layout: Layout, batch: int, seq: int, layer_part: float,
                        recompute: bool) -> list[tuple[str, float]]:
    """One module's kept tensors but its loss's and head's, ``layer_part`` bytes in all (`mtp_activation_bytes`'s
    per-module term): under ``recompute`` its two inputs, the hidden state and the embedding (Megatron-LM
    multi_token_prediction.py:1492 ``_checkpointed_forward`` saves them alone); otherwise its layer's saved tensors
    one by one (`layer_tensors`, as `skeletal_bytes` sums them), the attention's score-sized tensors, and the rest: the
    projection's input (the concatenated normed halves, 2h a token; multi_token_prediction.py
    ``_concat_embeddings``, line 1331) and the normed embedding and hidden state (h a token each)."""
    if recompute:
        return [("hidden", layer_part / 2), ("embedding", layer_part / 2)]
    out = [(t, saved_bytes(spec, model, layout, batch, seq))
           for t, spec in layer_tensors(model, layout.tp_mode).items() if spec.saved]
    out.append(("scores", skeletal_bytes(model, layout, batch, seq)["scores"]))
    rest = max(0.0, layer_part - sum(b for _, b in out))
    return out + [("projection_input", rest / 2), ("normed_embedding", rest / 4), ("normed_hidden", rest / 4)]


def _mtp_requests(model: ModelConfig, layout: Layout, batch: int, seq: int, recompute: bool) -> tuple[Request, ...]:
    """The multi-token-prediction modules' tensors kept from their forward to their backward, each its own malloc as
    PyTorch makes them (`mtp_activation_bytes`, split): per module its kept tensors (`_mtp_module_tensors`), its
    loss's saved fp32 softmax where the loss kernel keeps one (Megatron-LM's vocab-parallel cross entropy saves
    exp_logits, tensor_parallel/cross_entropy.py:181, fusions/fused_cross_entropy.py:119) and its final-normed rows
    with their gradient (`mtp_head_row_bytes`). Sending them inside the head's one request asked the allocator for
    a block no framework allocates (a review: 78.8 GiB on DeepSeek-V3). () without modules."""
    k = model.mtp_layers
    if not k:
        return ()
    parts = mtp_module_parts(model, layout, batch, seq, recompute)
    per = (_mtp_module_tensors(model, layout, batch, seq, parts["kept"], recompute)
           + [("loss", parts["loss"]), ("head_rows", parts["head_rows"])])
    return tuple((MALLOC, f"mtp{i}.{name}", _nbytes(b)) for i in range(k) for name, b in per if b > 0)


def _stream_name(model: ModelConfig, layout: Layout, seq: int, policy: Policy) -> str:
    return f"{model.name}-{layout.label()}-{seq}-{policy.label()}-iteration"


def _build_stream(r: _StreamRecipe, name: str) -> IterationStream:
    reqs, phase_of, names = _iteration_requests(r.x, r.logits, r.templates, r.recomputes, r.mtp, r.chunk_in_arena)
    return IterationStream(r.static, reqs, phase_of, name=name, phase_names=names)


def _mtp_forward(mtp: tuple[Request, ...], logits: tuple[Request, ...], in_arena: bool = False) -> tuple[Request, ...]:
    """The modules' forward, one after the other: each one's kept tensors, then its own head's logits and their
    copies (`_loss_requests`, under the module's prefix), the main head's sizes (the same output layer and loss
    over the same tokens: Megatron-LM multi_token_prediction.py:1013 ``process_mtp_loss`` calls ``output_layer``),
    freed once its loss is taken. Live beside fewer modules and no final norm, they never raise the head's peak."""
    out: list[Request] = []
    modules = sorted({bid.split(".")[0] for _kind, bid, _size in mtp})
    for m in modules:
        out += [r for r in mtp if r[1].split(".")[0] == m]
        if not in_arena:  # memo-exec joins the modules' rows to the main head's chunks (memo_exec/model.py)
            out += [(kind, f"{m}.{bid}", size) for kind, bid, size in logits]
    return tuple(out)


@lru_cache(maxsize=64)
def _iteration_requests(x: int, logits: tuple[Request, ...], tpl: _LayerTemplates, recomputes: tuple[bool, ...],
                        mtp: tuple[Request, ...] = (), chunk_in_arena: bool = False) -> tuple:
    """(requests, phase of each, phase names) of one iteration: what a stream holds besides its
    static requests and name (recipes that differ only in those share one). ``mtp``: the modules'
    kept tensors, allocated in the head's phase before the main head's and freed after its backward
    (Megatron-LM gpt_model.py:712 runs the modules after the decoder, before the output layer at
    line 807). ``chunk_in_arena``: the classifier's chunks are in the memory plan's arena, no request."""
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
    # classifier: final norm output, one chunk's logits and the loss's tensors beside them, each its own request
    # (`_loss_requests`), the gradient of the last layer's output; the last layer's output dies with the final
    # norm's backward
    phase += 1
    chunk = () if chunk_in_arena else tuple((kind, f"cls.{bid}", size) for kind, bid, size in logits)
    cls = (_mtp_forward(mtp, logits, chunk_in_arena) + ((MALLOC, "cls.final_norm", x),) + chunk
           + ((MALLOC, f"g{n}", x),)
           + tuple((FREE, bid, 0) for _kind, bid, _size in reversed(mtp))
           + ((FREE, "cls.final_norm", 0), (FREE, f"x{n}", 0)))
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
