"""Request traces from the layer op graph (`memo_sim.model.layer_graph`), per GPU.

Level 1 (one layer): the transient tensors of one layer's forward and of its backward, with
their real per-GPU sizes under a layout. Skeletal tensors are not in these traces: offloading
policies keep them in the preallocated rounding buffers, the others in per-layer blocks that
the level-2 trace carries.

Forward: a sequence-parallel all-gather output (the gemm input at full local sequence length)
lives until its gemm ends; a row-parallel gemm output lives at full length until its
reduce-scatter / all-reduce, whose output lives until the residual add; the layer output y
lives to the end of the phase (it becomes the next layer's input). Attention and its
communication add the buffers of `attention_buffers` while the attention kernel runs. Under a
quantised GEMM format each layer GEMM's casts write their quantised copies beside the
high-precision tensors while the GEMM runs (`fp8_casts`): the input's in forward, the output
gradient's and the input's again in backward.

Backward (ops in reverse): the incoming gradient dy, the gradients each op produces, the
gathered inputs the weight gradients need again under sequence parallelism, and MEMO's
token-wise recompute scratch (the dropped tokens' gathered inputs under sequence parallelism; without it the
gather is the identity and the recomputed rows are the rounding buffer's, `layer_graph.RECOMPUTE_GATHERS`) at the
start.

METP (``layout.tp_mode``, `memo_sim.tp`; `memo_sim.cost.metp`; the blocks in `memo_sim.memplan.ring_trace`): the ring replaces the FFN (and with ``metp``
the MHA) and its all-gathers / reduce-scatters. Forward FFN: the double buffer of received
W_in / W_out blocks (``metp_ffn_w_double_buffer``, 2 x (B + C) blocks) and the output
accumulator O_i (``fc2``) for the whole ring; per step j the T_ij block (``metp_fc1_block<j>``),
whose activation D_ij = f(T_ij) is computed in place (the executor's ring does the same; only the
backward, which needs both T_ij and D_ij, holds ``metp_act_block<j>`` beside it). Backward FFN: the
weight double buffer, the double buffer of the partial dB / dC blocks travelling the ring
(``metp_ffn_dw_double_buffer``), the dA_i accumulator (``d_ln2``); per step the recomputed T_ij
and D_ij, dD_ij (``metp_d_act_block<j>``) and dT_ij (``metp_d_fc1_block<j>``). Forward MHA: the
double buffer of broadcast W_qkv / W_proj blocks (``metp_mha_w_double_buffer``), the output
accumulator (``proj``); per outer step the Q/K/V head block (``metp_qkv_block<j>``) and, while
the inner ring runs, its K/V double buffer (``metp_kv_double_buffer<j>``, 2 x K/V block), the
fp32 accumulator of A_ij (``metp_attn_accumulator_fp32_<j>``) and the kernel's lse scratch.
Backward MHA: the weight double buffer, the double buffer of dW_qkv / dW_proj blocks being
computed and reduced (``metp_mha_dw_reduce_buffers``), the dX_i accumulator (``d_ln1``); per outer
step dA_ij, the recomputed Q/K/V block, its gradient block, the inner ring's K/V double buffer
and dK/dV in flight (``metp_dkv_in_flight<j>``, 2 x K/V block) and FlashAttention's workspace
(2 x lse block + fp32 dQ accumulator). MEMO's recompute scratch under ``metp`` is the dropped
tokens' proj and the W_proj ring's double buffer (each flavour's ``recompute_scratch``).

Level 2 (whole model): embedding output, one pseudo block per layer forward and backward of the
level-1 peak, skeletal blocks by policy (all layers' skeletal tensors for store-all, layer
inputs for full recompute, two rounding buffers for offloading policies), lse of every layer
where the policy keeps it (`Policy.keeps_lse`; full recompute's one rebuilt lse is in its recompute
buffer), one classifier chunk's logits, the final hidden state and its gradient.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from memo_sim.cost.activations import skeletal_bytes, tensor_bytes, tokens_per_gpu
from memo_sim.cost.attention_kernel import score_matrices
from memo_sim.cost.gemm_format import gemm_cast_buffers
from memo_sim.cost.layer_time import gemm_shape
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes
from memo_sim.cost.moe import dispatcher_buffer_bytes, expert_gemm_shape, scoped_gemm_shape
from memo_sim.layout.parallel import Layout
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.cost.metp import block_sizes
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import (DTYPE_BYTES, FP8_SAVED_INPUTS, RECOMPUTE_GATHERS, UNPLACED,
                                        attention_bwd_workspace_bytes, fp8_cast_name, fp8_input_kept, forward_ops,
                                        layer_tensors, sp_regathered)
from memo_sim.memplan.ring_trace import RING_TRACES
from memo_sim.policy.base import Policy
from memo_sim.policy.rounding_buffers import offloaded_layer_count

ALIGN = 512  # the CUDA caching allocator's granularity; planned sizes are rounded to it

# Level-1 tensors that MEMO's runtime does not place in the planned arena (they still take memory,
# so the traces and peaks count them): written straight into another buffer, allocated inside a
# kernel, or handed to autograd. plan.json lists them per phase with the reason (``unplaced``).


def placed_only(trace: RequestTrace, phase: str) -> RequestTrace:
    """The tensors of a level-1 trace the runtime places in the static arena (`UNPLACED` left out:
    kernels and the caching allocator allocate those outside it, so a slot for them in the
    arena would be reserved memory nothing uses)."""
    skip = UNPLACED.get(phase, {})
    return RequestTrace([b for b in trace.buffers if (b.name or b.id) not in skip], name=trace.name)


def static_plan_peak_bytes(trace: RequestTrace, phase: str) -> float:
    """A layer phase's transient bytes under a static plan: the arena holds the tensors the
    runtime places for the whole phase (their max-live, which the plan reaches) and the ones
    kernels and the caching allocator allocate (`UNPLACED`) live outside it, beside it (their
    own max-live). At least the max-live of all the phase's tensors, which would need the
    kernel's workspace inside the arena."""
    return float(placed_only(trace, phase).max_live_bytes() + outside_peak_bytes(trace, phase))


def outside_peak_bytes(trace: RequestTrace, phase: str) -> float:
    """The max-live of a layer phase's tensors that kernels and the caching allocator allocate beside the static
    arena (`UNPLACED`)."""
    skip = UNPLACED.get(phase, {})
    return float(RequestTrace([b for b in trace.buffers if (b.name or b.id) in skip], name=trace.name)
                 .max_live_bytes())


def static_plan_phase_bytes(fwd: RequestTrace, bwd: RequestTrace) -> dict[str, float]:
    """Each layer phase's transient bytes under a static plan, ``{"fwd": ..., "bwd": ...}``: the one arena, sized
    for the phase that places the most (memo_exec/arena.py: "one layer's forward and backward reuse it", allocated
    once), plus the phase's own tensors beside it (`outside_peak_bytes`). The arena is live in both phases, the
    tensors beside it only in theirs: the backward's incoming and outgoing gradients (dy, dx, d_h1_part) and its
    attention workspace are not the forward's (a review: explain put them in layer 31's forward)."""
    arena = max(placed_only(fwd, "fwd").max_live_bytes(), placed_only(bwd, "bwd").max_live_bytes())
    return {"fwd": float(arena + outside_peak_bytes(fwd, "fwd")), "bwd": float(arena + outside_peak_bytes(bwd, "bwd"))}


def unplaced_in(trace: RequestTrace, phase: str) -> dict[str, str]:
    """The tensors of a level-1 trace that the runtime does not place, with the reason."""
    names = {b.name or b.id for b in trace.buffers}
    return {n: why for n, why in UNPLACED.get(phase, {}).items() if n in names}
FP32 = 4


def attention_buffers(model: ModelConfig, layout: Layout, tb: dict[str, float], phase: str,
                      batch: int = 1, seq: int = 1) -> list[tuple[str, float]]:
    """Transient buffers live while one layer's attention runs on one GPU, (name, bytes).

    With q, k, v, attn the per-GPU bytes of those tensors and d the model dtype's bytes:

    - forward: the kernel's fp32 log-sum-exp-sized scratch (lse bytes);
      ring CP (cp > 1): the K/V double buffer, the chunk being received beside the one in use,
      2·(k + v); the fp32 output accumulator the partial results merge into, attn·4/d (TransformerEngine's p2p
      CP, ``fwd_kv_held`` and ``fwd_step_outputs``: every K/V chunk the ring brought, cp of (k + v), and every
      step's output in the model dtype until its merge after the ring, cp of attn, each its own allocation,
      instead); a ring that
      gathers K/V at once (`memo_sim.layout.ring_merge` ``kv_allgather``: PyTorch's CP) holds the cp
      gathered chunks, the packed one it sent and its contiguous copy of K/V instead of the double
      buffer (`RingMerge.buffers`); where the ring sees K/V repeated to the query heads
      (``kv_at_query_heads``) each chunk is q + attn;
      Ulysses (u > 1): the all-to-all outputs, head-sharded q, k, v (q + r·(k + v), r the K/V
      repeat factor of `memo_sim.layout.kv_heads`: each rank one repeated K/V head where tp·u
      exceeds the K/V heads; ring CP's K/V buffers are r·(k + v) then too) and the attention
      output before its all-to-all back (attn).
    - QK norms (``model.qk_norm``), both phases: the normalised queries and keys the kernel reads (q + k),
      beside the projections the layer keeps.
    - backward: the kernel's scratch (2·lse) plus FlashAttention's fp32 dQ accumulator, q·4/d
      (one buffer, ``attention_bwd_workspace``); ring CP: the K/V double buffer 2·(k + v) and the
      dK/dV travelling the ring, in use and in flight, 2·(k + v)·a/d, a the element size they travel in
      (`RingMerge.dkv_element_bytes`: 4 where the framework accumulates them in fp32, memo's executor; the
      model dtype's for TransformerEngine's p2p CP), and where the framework accumulates in fp32
      (``layout.ring_dkv_fp32``) the fp32 dQ accumulator beside the layer's dq, q·4/d (TransformerEngine adds each
      step's dQ into the dq it returns: no buffer; `RingMerge.buffers`) (PyTorch's CP: its K/V
      chunks as in the forward, three fp32 dK/dV chunks, the last step's dK/dV kernel outputs and an fp32
      dQ accumulator, `RingMerge.buffers`); Ulysses: the
      all-to-all buffers of the incoming attention gradient (attn) and of dq, dk, dv (q + r·(k + v)), and where
      the backward re-sends the forward's q, k, v and out (``layout.ulysses_bwd_resend``, memo's executor:
      memo_exec/distributed/attention.py ``UlyssesAttention.backward``) their head-sharded copies again,
      q + r·(k + v) and attn (a framework that keeps the forward's holds them among the saved tensors instead:
      `memo_sim.cost.activations.ulysses_kept_scale`).
    - materialised attention (``layout.attention``, `memo_sim.cost.attention_kernel`), e the
      GPU's score elements n_b·s²: forward, at the dropout, the softmax output, the dropout mask
      and the dropped probabilities, e·(2d + 1) (the scores are freed after the softmax);
      backward, those three again plus the gradients of the dropped and of the probabilities,
      e·(4d + 1). (Under store all the three forward tensors are also counted as kept until the
      layer's backward, `memo_sim.cost.activations.skeletal_bytes`: the backward's transient
      counts them once more, one layer's e·(2d + 1) too much.)
    """
    d = DTYPE_BYTES[model.dtype]
    mat = score_matrices(model, layout, batch) * seq * seq if layout.attention == "materialised" else 0.0
    # K and V as the kernel (and ring CP) sees them: under Ulysses after the all-to-all, each head repeated r
    # times where tp x ulysses exceeds the K/V heads (`memo_sim.layout.kv_heads`); r = 1 otherwise
    kv = layout.kv_repeat(model.n_kv_heads, model.heads) * (tb["k"] + tb["v"])
    qkv = tb["q"] + kv
    ring = ring_merge(layout.ring_merge)
    ring_kv = tb["q"] + tb["attn"] if ring.kv_at_query_heads else kv  # one K/V chunk as the ring holds it
    # the ring's K/V and gradient buffers, its dK/dV in the element size they travel in
    ring_bufs = ring.buffers(layout.cp, ring_kv, tb["q"], d, phase, ring.dkv_element_bytes(d, layout.ring_dkv_fp32),
                             layout.ring_dkv_fp32, tb["attn"])
    # QK norms (Qwen3): the normalised queries and keys the kernel reads, beside the kept projections (the executor
    # normalises in scratch where the kernel runs, `memo_exec.layer.LayerCompute._attention_qk`)
    # (a framework that keeps them, ``qk_norm_kept``, holds them among the saved tensors instead)
    qk = [("q_normed", tb["q"]), ("k_normed", tb["k"])] if model.qk_norm and not model.qk_norm_kept else []
    if phase == "fwd":
        out = qk + ([("materialised_scores", mat * (2 * d + 1))] if mat else [("attention_workspace", tb["lse"])])
        if layout.cp > 1:
            out += ring_bufs  # with the output accumulator, or the steps' outputs kept (`RingMerge.buffers`)
        if layout.ulysses > 1:
            out += [("ulysses_qkv_alltoall", qkv), ("ulysses_attn_alltoall", tb["attn"])]
        return out
    out = qk + ([("materialised_scores_bwd", mat * (4 * d + 1))] if mat
                else [("attention_bwd_workspace", attention_bwd_workspace_bytes(tb["lse"], tb["q"], d))])
    if layout.cp > 1:
        out += ring_bufs
    if layout.ulysses > 1:
        if layout.ulysses_bwd_resend:  # the forward's q, k, v and out sent again (their head-sharded copies)
            out += [("ulysses_qkv_resend_alltoall", qkv), ("ulysses_attn_resend_alltoall", tb["attn"])]
        out += [("ulysses_dattn_alltoall", tb["attn"]), ("ulysses_dqkv_alltoall", qkv)]
    return out


def fp8_casts(model: ModelConfig, layout: Layout, op, batch: int, seq: int, phase: str) -> list[tuple[str, float]]:
    """The quantised copies a layer GEMM's casts write beside their high-precision inputs while it runs on one GPU,
    (tensor name, bytes) (`memo_sim.cost.gemm_format.gemm_cast_buffers`; none in the model dtype, none for the
    router, which runs in it): the GEMM's shape on the GPU as its time prices it (`gemm_shape`; latent attention's
    replicated projections and the experts' grouped GEMM theirs). The input's copy the framework keeps for the weight
    gradient (``fp8_saved_inputs``: the norms' and the activation's, and the output projection's copy of the attention
    output, `memo_sim.model.layer_graph.fp8_attention_copy`) is a saved tensor, not one of these."""
    if op.kind != "gemm" or op.scope == "shard" or not model.gemm.quantised:
        return []
    groups = 1
    if op.scope == "expert":
        groups, m, k, n = expert_gemm_shape(op, model, layout, batch, seq)
    elif op.scope == "replicated":
        m, k, n = scoped_gemm_shape(op, layout, batch, seq, 1.0)
    else:
        m, k, n = gemm_shape(op, layout, batch, seq)
    return [(fp8_cast_name(op.name, what), nbytes)
            for what, nbytes in gemm_cast_buffers(model, phase, m, k, n, fp8_input_kept(model, op.inputs[0]), groups)]


def _align(n: float) -> int:
    n = int(round(n))
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


class _Builder:
    def __init__(self, phase: str, layer: int | None = None):
        self.phase, self.layer = phase, layer
        self.step = 0
        self.open: dict[str, tuple[int, int, str]] = {}
        self.done: list[Buffer] = []

    def alloc(self, name: str, nbytes: float) -> None:
        if nbytes <= 0:
            return
        self.open[name] = (self.step, _align(nbytes), name)

    def free(self, name: str) -> None:
        if name in self.open:
            lower, size, nm = self.open.pop(name)
            self.done.append(Buffer(f"{self.phase}.{nm}", size, lower, max(self.step, lower + 1), phase=self.phase,
                                    layer=self.layer, kind="transient", name=nm))

    def tick(self) -> None:
        self.step += 1

    def finish(self) -> list[Buffer]:
        self.tick()
        for name in list(self.open):
            self.free(name)
        return sorted(self.done, key=lambda b: (b.lower, b.id))


@lru_cache(maxsize=1 << 16)
def per_gpu_shard(layout: Layout) -> Layout:
    """The part of a layout that shapes one GPU's layer tensors (DP and ZeRO do not); memoised
    (`dataclasses.replace` re-validates the layout; the what-if asks for every candidate)."""
    return replace(layout, dp=1, zero=0)


def layer_forward_trace(model: ModelConfig, layout: Layout, batch: int, seq: int) -> RequestTrace:
    """One layer's forward transient requests on one GPU (memoised per model and GPU shard)."""
    return _layer_forward_trace(model, per_gpu_shard(layout), batch, seq)


def layer_backward_trace(model: ModelConfig, layout: Layout, batch: int, seq: int,
                         policy: Policy | None = None) -> RequestTrace:
    """One layer's backward transient requests on one GPU, with the policy's token-wise
    recompute scratch (memoised per model, GPU shard and recompute fraction). A model too short
    for any layer to be offloaded (`offloaded_layer_count` is 0: the kept layers are all of them)
    recomputes nothing, so its backward has no recompute scratch."""
    frac = policy.recompute_fraction if policy is not None else 0.0
    if offloaded_layer_count(model.layers) == 0:
        frac = 0.0
    return _layer_backward_trace(model, per_gpu_shard(layout), batch, seq, frac)


@lru_cache(maxsize=1 << 14)
def _layer_forward_trace(model: ModelConfig, layout: Layout, batch: int, seq: int) -> RequestTrace:
    tens = layer_tensors(model, layout.tp_mode)
    tb = {n: tensor_bytes(t, layout, batch, seq) for n, t in tens.items()}
    full_h = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    sp = layout.sp and layout.tp > 1
    regathered = sp_regathered(model)  # the GEMMs whose input SP gathers (the one rule the cost's gathers follow)
    tp = layout.tp > 1
    bs = block_sizes(model, layout, batch, seq) if layout.metp else {}
    flavour = layout.flavour
    b = _Builder("fwd")
    rings: set[str] = set()
    for op in forward_ops(model):
        group = flavour.group_of(op.name)
        if group is not None:
            if group not in rings:  # the ring's blocks, at its first op
                rings.add(group)
                RING_TRACES[group].forward(b, bs, layout.tp, tb, DTYPE_BYTES[model.dtype])
            continue
        if op.kind == "moe_comm":  # the dispatcher's receive buffer, as it sizes it (its output replaces its input)
            b.alloc(f"{op.name}_recv", dispatcher_buffer_bytes(op.name, model, layout, batch, seq))
            b.tick()
            b.free(f"{op.name}_recv")
            continue
        if sp and op.name in regathered and not layout.sp_input_kept:  # kept: the saved tensor is the gathered one
            b.alloc(f"{op.name}_input_gathered", full_h)  # all-gather output
            b.tick()
        attn_bufs = attention_buffers(model, layout, tb, "fwd", batch, seq) if op.kind == "attention" else []
        for name, nbytes in attn_bufs:
            b.alloc(name, nbytes)
        casts = fp8_casts(model, layout, op, batch, seq, "fwd")
        for name, nbytes in casts:
            b.alloc(name, nbytes)
        for o in op.outputs:
            if not tens[o].saved and o not in op.inputs:
                b.alloc(o + ("_partial" if op.tp_comm_after == "reduce" and tp else ""),
                        full_h if op.tp_comm_after == "reduce" and tp else tb[o])
        b.tick()
        b.free(f"{op.name}_input_gathered")
        for name, _ in attn_bufs + casts:
            b.free(name)
        if op.tp_comm_after == "reduce" and tp:
            for o in op.outputs:
                b.alloc(o, tb[o])  # reduce-scatter / all-reduce output
                b.tick()
                b.free(o + "_partial")
        if op.name == "add1":
            b.free("proj")
        if op.name == "add2":
            for i in op.inputs:
                if i != "h1":
                    b.free(i)  # fc2, or the MoE block's output and its shared experts'
    return RequestTrace(b.finish(), name=f"{model.name}-{layout.label()}-{seq}-layer-fwd")


@lru_cache(maxsize=1 << 14)
def _layer_backward_trace(model: ModelConfig, layout: Layout, batch: int, seq: int, frac: float) -> RequestTrace:
    tens = layer_tensors(model, layout.tp_mode)
    tb = {n: tensor_bytes(t, layout, batch, seq) for n, t in tens.items()}
    # an input's gradient is in the model dtype where the layer keeps a quantised copy of the input (FP8_SAVED_INPUTS:
    # ln1, ln2, act at the format's bytes; d_ln1, d_ln2, d_act are not quantised)
    gb = {n: tensor_bytes(replace(t, dtype_bytes=DTYPE_BYTES[model.dtype]), layout, batch, seq)
          if n in FP8_SAVED_INPUTS else tb[n] for n, t in tens.items()}
    full_h = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    sp = layout.sp and layout.tp > 1
    regathered = sp_regathered(model)
    bs = block_sizes(model, layout, batch, seq) if layout.metp else {}
    flavour = layout.flavour
    b = _Builder("bwd")
    b.alloc("dy", tb["y"])
    if frac > 0:  # the flavour's token-wise recompute scratch (weight blocks do not depend on the tokens)
        for nm, nbytes in flavour.recompute_scratch(layout, frac, tb, full_h, lambda: block_sizes(model, layout, 1, 1)):
            if nm in RECOMPUTE_GATHERS and not sp:
                continue  # no gather without SP: the recomputed rows are the rounding buffer's slot (layer_graph)
            b.alloc(nm, nbytes)
            b.tick()
            b.free(nm)
    grads: dict[str, str] = {"y": "dy", "fc2": "dy", "h1": "dy"}
    rings: set[str] = set()
    for op in reversed(forward_ops(model)):
        group = flavour.group_of(op.name)
        if group is not None:
            if group not in rings:  # the ring's blocks, at its last op (the first in backward)
                rings.add(group)
                RING_TRACES[group].backward(b, bs, layout.tp, tb, DTYPE_BYTES[model.dtype])
            continue
        if op.kind == "elementwise" and op.name.startswith("add"):
            b.tick()  # residual: gradient flows through unchanged (accumulated in place)
            continue
        if op.kind == "moe_comm" or set(op.outputs) <= set(op.inputs):
            if op.kind == "moe_comm":  # the gradients' exchange (the transpose): a buffer of the forward's size
                b.alloc(f"{op.name}_grad_recv", dispatcher_buffer_bytes(op.name, model, layout, batch, seq))
                b.tick()
                b.free(f"{op.name}_grad_recv")
            else:
                b.tick()  # in place (the router's score pass): its gradient overwrites its input's
            continue
        out_grad = grads.get(op.outputs[0], f"d_{op.outputs[0]}")
        gathered = None
        if op.kind == "gemm" and sp and op.tp_comm_after == "reduce":
            gathered = f"{out_grad}_gathered"  # backward of reduce-scatter is an all-gather
            b.alloc(gathered, full_h)
            b.tick()
        if sp and op.name in regathered and not layout.sp_input_kept:
            b.alloc(f"{op.name}_input_regathered", full_h)  # weight gradient needs the full input
        attn_bufs = attention_buffers(model, layout, tb, "bwd", batch, seq) if op.kind == "attention" else []
        attn_bufs += fp8_casts(model, layout, op, batch, seq, "bwd")  # live, and freed, as the kernel's buffers
        for name, nbytes in attn_bufs:
            b.alloc(name, nbytes)
        produced = []
        for i in op.inputs:
            if i == "x" and op.name == "ln1":
                name = "dx"
            elif i in ("x", "h1"):
                name = f"d_{i}_part"
            else:
                name = f"d_{i}"
            partial = op.kind == "gemm" and op.tp_comm_after != "reduce" and layout.tp > 1 and op.scope == "tp"
            b.alloc(name + ("_partial" if partial else ""), full_h if partial else gb[i])
            produced.append((name, partial))
        b.tick()
        for o in op.outputs:
            g = grads.get(o, f"d_{o}")
            if g != "dy":
                b.free(g)
        if gathered:
            b.free(gathered)
        b.free(f"{op.name}_input_regathered")
        for name, _ in attn_bufs:
            b.free(name)
        for name, partial in produced:
            if partial:
                b.alloc(name, gb[op.inputs[0]])  # reduce-scatter / all-reduce output (the model dtype)
                b.tick()
                b.free(name + "_partial")
            if name.endswith("_part"):
                b.tick()
                b.free(name)  # accumulated into dy / dx
    b.free("dy")
    return RequestTrace(b.finish(), name=f"{model.name}-{layout.label()}-{seq}-layer-bwd")


class _ModelSteps:
    """Steps of the level-2 timeline: 0 embedding forward, 1..n layer forwards, n+1 classifier,
    n+2..2n+1 layer backwards (last layer first), 2n+2 embedding backward."""

    def __init__(self, n_layers: int):
        self.n = n_layers

    def fwd(self, layer: int) -> int:
        return 1 + layer

    def bwd(self, layer: int) -> int:
        return self.n + 2 + (self.n - 1 - layer)

    @property
    def classifier(self) -> int:
        return self.n + 1

    @property
    def end_of_backward(self) -> int:
        return 2 * self.n + 2

    @property
    def end(self) -> int:
        return 2 * self.n + 3


def model_trace(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                fwd_block: int, bwd_block: int,
                classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> RequestTrace:
    """Level-2 trace: one pseudo block per layer phase plus the blocks that cross layers (the
    policy's skeletal blocks from `Policy.layer_blocks` and `Policy.shared_blocks`)."""
    n = model.layers
    sk = skeletal_bytes(model, layout, batch, seq)
    x = sk["input"]
    st = _ModelSteps(n)
    bufs: list[Buffer] = []

    def add(id_, size, lo, hi, kind, layer=None, phase=None):
        if size > 0:
            bufs.append(Buffer(id_, _align(size), lo, hi, kind=kind, layer=layer, phase=phase, name=id_))

    add("embedding_out", x, 0, 2, "transient", phase="fwd")
    for i in range(n):
        add(f"layer{i}.fwd", fwd_block, st.fwd(i), st.fwd(i) + 1, "pseudo", i, "fwd")
        add(f"layer{i}.bwd", bwd_block, st.bwd(i), st.bwd(i) + 1, "pseudo", i, "bwd")
        for name, nbytes in policy.layer_kept_blocks(sk):  # the lse where kept (`keeps_lse`), ...
            add(f"layer{i}.{name}", nbytes, st.fwd(i), st.bwd(i) + 1, "skeletal", i)
    for name, nbytes, lo, hi in policy.shared_blocks(sk, st, n):
        add(name, nbytes, lo, hi, "skeletal")
    c = st.classifier
    add("final_hidden", x, c, c + 1, "transient")
    add("final_hidden_grad", x, c, c + 2, "transient")
    head = classifier_peak_bytes(model, layout, batch, seq, classifier_chunk_tokens,
                                 recompute_mtp=policy.recomputes_mtp)
    add("classifier_chunk", head - 2 * x,
        c, c + 1, "transient")
    add("embedding_grad", x, st.end_of_backward, st.end, "transient")
    return RequestTrace(bufs, name=f"{model.name}-{layout.label()}-{seq}-{policy.name}-model")
