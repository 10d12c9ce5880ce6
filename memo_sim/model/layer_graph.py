"""The op graph of one pre-norm transformer layer: the single place where its tensors live.

Every other part of memo (FLOPs, activation bytes, the MEMO offload split, memory-plan traces,
the SimPy schedules and the executor's layer) reads tensor widths and op order from here.

Forward, per layer (x is the layer input, y its output = the next layer's input)::

    ln1 = norm(x)                       [TP+SP: all-gather ln1 over the sequence]
    q, k, v = ln1 @ Wqkv                (gemm)
    q, k = rope(q, k)                   (the rotary embedding, in place: `memo_sim.model.rope_kernels`; none for
                                         learned positions, ``ModelConfig.positions``)
    attn, lse = causal_attention(q,k,v) (attention; lse = fp32 log-sum-exp per head)
    proj = attn @ Wo                    (gemm)   [TP: all-reduce, or reduce-scatter with SP]
    h1 = x + proj
    ln2 = norm(h1)                      [TP+SP: all-gather]
    fc1 = ln2 @ W1                      (gemm; SwiGLU: gate and up, 2f wide)
    act = gelu(fc1)  | silu(gate)*up
    fc2 = act @ W2                      (gemm)   [TP: all-reduce / reduce-scatter]
    y = h1 + fc2

Multi-head latent attention (``model.mla``, DeepSeek-V2/V3) replaces the QKV GEMM with down
projections to the latents (``q_down``: hidden -> q_lora_rank, ``kv_down``: hidden -> kv_lora_rank +
rope; weights replicated over TP, as Megatron-Core's MLA keeps them, on the TP group's tokens),
their norms, and up projections (``q_up``, ``kv_up``: column-parallel) to per-head queries, keys
and values (`_mla_ops`). A mixture-of-experts layer (``model.moe``) replaces fc1/act/fc2 with the
MoE block (`_moe_ops`)::

    probs = route(ln2 @ Wg)             (router gemm on the rank's own sequence shard; score pass)
    moe_in = permute(ln2)               (top-k copies of each token, grouped by expert)
    [dispatch: the token dispatcher's collectives, `memo_sim.layout.moe_dispatchers`]
    efc1 = moe_in @ W1[e]               (grouped GEMM over the rank's local experts)
    eact = act(efc1)
    efc2 = eact @ W2[e]
    [combine: the dispatcher's collectives back]
    moe_out = unpermute(efc2, probs)    (weighted sum of each token's top-k outputs)
    [shared experts: sfc1 = ln2 @ Ws1, sact, sfc2 = sact @ Ws2, TP-split as a dense FFN]
    y = h1 + moe_out (+ sfc2, times sigmoid(ln2 @ w) under a shared gate)

A router that weights the experts' input (Llama 4's ``sigmoid_topk``; Megatron-Core's --moe-apply-probs-on-input)
multiplies each dispatched copy by its weight before the experts (``weight_input``: moe_in -> moe_in_w, which
expert_fc1 reads); the multiply keeps moe_in for its weight's gradient, the GEMM keeps moe_in_w.

The routed tensors (moe_in, moe_in_w, efc1, eact, efc2) hold top-k rows per token (``routed``: the busiest
expert-parallel rank holds more, `memo_sim.cost.activations.tensor_bytes`); moe_in, moe_in_w and efc2 are
whole over the expert tensor-parallel ranks (``etp_whole``: each ETP rank holds the ETP group's
tokens at full width). Qwen3's QK norms (two RMSNorms over q and k) are not priced as ops.

What the MoE block keeps for its backward follows Megatron-Core's experts, which apply each copy's
router weight inside their fused activation (``weighted_bias_swiglu_impl``; memo-exec's
`memo_exec.moe.experts` does the same): probs, moe_in, efc1 and eact are kept, the experts' outputs
efc2 are not (a combine that multiplies them by the weights would keep them: k rows of h per token
more). A shared-expert gate (``shared_gate``, Qwen2-MoE) multiplies the shared output by
sigmoid(ln2 @ w), so sfc2 is kept (role "other"; MEMO re-runs shared_fc2 for its dropped rows); the
gate's GEMM (h -> 1) and its [T, 1] scores are not priced.

Skeletal (saved for backward) tensors of a dense layer: x, ln1, q, k, v, attn, lse, h1, ln2, fc1, act. For a GPT
layer (f = 4h) they are 16 elements per token of width h, i.e. 32·b·s·h bytes in 16-bit, of
which x and attn are 2·b·s·h each (MEMO offloads them whole: roles "input" and "attn"); the
other 28·b·s·h (role "other") are split token-wise by alpha. Without sequence parallelism the
tensors with ``tp_split=False`` (x, ln1, h1, ln2: 8·b·s·h bytes) are replicated on every TP
rank. lse is kept on the GPU by every policy (it is a few MB).

Tensor-parallel modes (``tp_mode``, the flavours of `memo_sim.tp`; METP, papers/metp.txt sections 3-4): under
``megatron`` the tensors above are as described. Under METP the ranks of the TP group each hold
1/p of the tokens of every activation (as Megatron SP) and the weight blocks travel a ring, so
some tensors never exist whole on a GPU: they are built block by block inside the ring loops and
rebuilt in backward (Algorithms 2 and 6), and so are not saved. ``metp_ffn`` (METP for the FFN,
Megatron TP+SP attention): fc1 and act exist only as per-step blocks (T_ij, D_ij of
(tokens/p) x (width/p)); the FFN keeps only its input ln2. ``metp`` (METP FFN and the two-level
MHA): also q, k, v exist only as per-outer-step head blocks; the MHA keeps only its input ln1 and
the attention output attn (and lse). `block_tensors` names them; `layer_tensors` marks them not
saved (role "transient") under the mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from memo_sim.model.config import ModelConfig
from memo_sim.tp import tp_flavour

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LSE_BYTES = 4  # the attention's log-sum-exp: fp32 per (token, head)
FP32_BYTES = 4


def attention_bwd_workspace_bytes(lse_bytes: float, q_bytes: float, dtype_bytes: int) -> float:
    """What the attention backward kernel allocates for itself beside its gradients: two
    lse-sized fp32 vectors (the lse in the kernel's layout and rowsum(dO * O)) and FlashAttention's
    fp32 dQ accumulator (q in fp32; ``q_bytes`` in the model dtype of ``dtype_bytes``). The
    simulator's ``attention_bwd_workspace`` buffers (`memo_sim.memplan.trace_gen`) and the
    executor's estimate for its kernel backends (`memo_exec.attention.kernel_bwd_workspace`) both
    take it from here."""
    return 2 * lse_bytes + q_bytes * FP32_BYTES / dtype_bytes

ROLES = ("input", "attn", "other", "lse", "transient")

# attention kernels (`memo_sim.layout.parallel.Layout.attention`): `memo_sim.profile.attention_kernels`, each by name
# cross-entropy implementations (`memo_sim.layout.parallel.Layout.cross_entropy`; HBM passes per
# logit and the bytes it keeps live in `memo_sim.cost.loss_kernels`)
CROSS_ENTROPY_KERNELS = ("chunked", "vocab_parallel", "torch_fused", "chunked_wrapper")

def block_tensors(tp_mode: str) -> frozenset[str]:
    """Tensors that under ``tp_mode`` exist only as per-step blocks inside METP's ring loops (never
    whole on a GPU, not saved for backward): the flavour's (`memo_sim.tp`)."""
    return tp_flavour(tp_mode).block_tensors


@dataclass(frozen=True)
class TensorSpec:
    name: str
    width: int  # elements per token for the whole layer (before any parallel split)
    dtype_bytes: float  # an element's bytes (a quantised saved input: the format's, NVFP4's half a byte)
    tp_split: bool  # split across TP ranks even without sequence parallelism
    role: str  # MEMO category: input / attn / other (skeletal), lse (kept), transient
    saved: bool  # skeletal: kept from forward for backward
    routed: int = 0  # top-k copies per token: a routed MoE tensor (its width counts them), else 0
    etp_whole: bool = False  # a routed tensor each expert-TP rank holds for the whole ETP group's tokens

    def bytes_per_token(self) -> float:
        return self.width * self.dtype_bytes


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str  # gemm | attention | norm | elementwise
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    gemm: tuple[int, int] | None = None  # (in_width, out_width) of a gemm
    tp_comm_after: str | None = None  # "gather" (all-gather with SP), "reduce" (all-reduce / reduce-scatter)
    token_wise: bool = True  # False only for the attention core: a token subset needs all keys
    # where a gemm's weights and tokens sit: "tp" (split over TP, the TP group's tokens), "replicated"
    # (whole weights, the TP group's tokens: MLA's down projections), "shard" (whole weights, the rank's
    # own sequence shard: the router), "expert" (the rank's local experts, its routed tokens)
    scope: str = "tp"


# One layer's tensors in op order: (name, width, tp_split, role, saved). Widths: h hidden, kv the
# K/V width, f1 the first FFN GEMM's output (2f for SwiGLU), f the FFN width, heads (lse: fp32).
_TENSORS = (
    ("x", "h", False, "input", True),
    ("ln1", "h", False, "other", True),
    ("q", "h", True, "other", True),
    ("k", "kv", True, "other", True),
    ("v", "kv", True, "other", True),
    ("attn", "h", True, "attn", True),
    ("lse", "heads", True, "lse", True),
    ("proj", "h", False, "transient", False),
    ("h1", "h", False, "other", True),
    ("ln2", "h", False, "other", True),
    ("fc1", "f1", True, "other", True),
    ("act", "f", True, "other", True),
    ("fc2", "h", False, "transient", False),
    ("y", "h", False, "transient", False),
)
# GEMM inputs read in backward only by their GEMM's weight gradient (the norms' outputs feed QKV and the
# FFN's first GEMM, the activation the second; the attention output is also the attention kernel's, so not it)
FP8_SAVED_INPUTS = ("ln1", "ln2", "act")


def fp8_attention_copy(model: ModelConfig) -> bool:
    """Whether a layer keeps the attention output twice: where the framework keeps the quantised copies of the GEMM
    inputs for the weight gradients (``fp8_saved_inputs``: TransformerEngine's Linear saves its quantised
    ``inputmat``), the output projection keeps its copy of the attention output beside the attention kernel's own
    output, which the kernel's backward reads (`FP8_SAVED_INPUTS` leaves attn out for that reason: the copy is a
    tensor of its own, ``attn_fp8``, at the format's bytes; a review found it uncounted), unless the framework has
    the projection keep the original (``fp8_attention_copy`` off: Megatron-LM, which then casts it again for the
    weight gradient, `fp8_input_kept`; a review found the copy counted there)."""
    return bool(model.fp8_saved_inputs and model.gemm.quantised and model.fp8_attention_copy)


def fp8_input_kept(model: ModelConfig, gemm_input: str) -> bool:
    """Whether a GEMM's quantised input copy is kept for its weight gradient, so backward does not cast the input
    again: the norms' and the activation's copies (`FP8_SAVED_INPUTS`) and the output projection's copy of the
    attention output (`fp8_attention_copy`), where the framework keeps them (``fp8_saved_inputs``). The one rule the
    cast's time (`memo_sim.cost.layer_time`) and its buffers (`memo_sim.memplan.trace_gen.fp8_casts`) follow."""
    return bool(model.fp8_saved_inputs and (gemm_input in FP8_SAVED_INPUTS
                                            or (gemm_input == "attn" and fp8_attention_copy(model))))


def separate_norms(model: ModelConfig) -> tuple[str, ...]:
    """The norm outputs Megatron-LM's ``--recompute-modules layernorm`` rebuilds: the norms that are modules of their
    own (megatron/core/transformer/transformer_layer.py: ``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm``
    only where the norm is not an ``IdentityOp``). Its TransformerEngine layer spec fuses the input norm into QKV
    (``TELayerNormColumnParallelLinear``, which keeps the norm's output for its weight gradient) except under
    multi-latent attention, whose ``input_layernorm`` is a ``TENorm``; a MoE layer's pre-MLP norm is its own
    ``TENorm`` (the experts cannot fuse it). So: both norms with MLA, the pre-MLP norm alone otherwise."""
    return ("ln1", "ln2") if model.mla else ("ln2",)
# the tensors a Megatron-mode layer keeps for its backward in activation buffers (lse, a few MB,
# stays with the attention kernel's state)
SKELETAL_NAMES = tuple(n for n, _w, _s, role, saved in _TENSORS if saved and role != "lse")


def _tensor_rows(model: ModelConfig) -> tuple:
    """(name, width key, tp_split, role, saved) of one layer's tensors, in op order, for the model's
    attention and FFN kinds (the dense table `_TENSORS` unchanged for a dense standard layer)."""
    kept_qk = model.qk_norm and model.qk_norm_kept
    twin = fp8_attention_copy(model)
    if not (model.mla or model.moe or kept_qk or twin):
        return _TENSORS
    rows = list(_TENSORS[:2])  # x, ln1
    if model.mla:
        if model.q_lora_rank:
            rows += [("q_lat", "qlr", False, "other", True), ("q_latn", "qlr", False, "other", True)]
        rows += [("kv_lat", "kvlr_rope", False, "other", True), ("kv_latn", "kvlr", False, "other", True)]
    rows += list(_TENSORS[2:5])  # q, k, v
    if kept_qk:  # the QK norms' outputs the attention kernel keeps, beside their inputs (``qk_norm_kept``)
        rows += [("q_normed", "q", True, "other", True), ("k_normed", "kv", True, "other", True)]
    rows.append(_TENSORS[5])  # attn
    if twin:  # the output projection's quantised copy of it, beside the kernel's own (`fp8_attention_copy`)
        rows.append(("attn_fp8", "attn", True, "other", True))
    rows += list(_TENSORS[6:10])  # lse, proj, h1, ln2
    if not model.moe:
        return tuple(rows + list(_TENSORS[10:]))
    rows += [("probs", "experts32", False, "other", True),
             ("moe_in", "k_h", True, "other", True)]
    if model.moe_router.weights_input:  # the weighted copies the experts' first GEMM reads (Llama 4)
        rows.append(("moe_in_w", "k_h", True, "other", True))
    rows += [
             ("efc1", "k_ef1", True, "other", True),
             ("eact", "k_ef", True, "other", True),
             ("efc2", "k_h", True, "transient", False),
             ("moe_out", "h", False, "transient", False)]
    if model.shared_experts:
        # a shared-expert gate (Qwen2-MoE: sfc2 * sigmoid(ln2 @ w)) keeps the shared output for the gate's gradient
        gated = bool(model.shared_gate)
        rows += [("sfc1", "sf1", True, "other", True), ("sact", "sf", True, "other", True),
                 ("sfc2", "h", False, "other" if gated else "transient", gated)]
    return tuple(rows + [("y", "h", False, "transient", False)])


_ROUTED = ("moe_in", "moe_in_w", "efc1", "eact", "efc2")
_ETP_WHOLE = ("moe_in", "moe_in_w", "efc2")


@lru_cache(maxsize=256)
def layer_tensors(model: ModelConfig, tp_mode: str = "megatron") -> MappingProxyType:
    """Tensor name -> `TensorSpec` of one layer, in op order (read-only, built once per model and
    mode). Under a METP mode the `block_tensors` are not saved (role "transient")."""
    blocks = block_tensors(tp_mode)
    b = DTYPE_BYTES[model.dtype]
    # the GEMM inputs that only their GEMM's weight gradient reads: kept as the format's quantised copy
    # where the framework keeps that one (`ModelConfig.fp8_saved_inputs`; with its block scales:
    # `GemmFormat.saved_element_bytes`)
    fp8 = FP8_SAVED_INPUTS + ("attn_fp8",) if model.fp8_saved_inputs and model.gemm.quantised else ()
    k = model.top_k
    width = {"h": model.hidden, "kv": model.kv_dim, "f1": model.fc1_width, "f": model.ffn, "heads": model.heads,
             "q": model.q_dim, "v": model.v_dim, "attn": model.attn_dim, "qlr": model.q_lora_rank,
             "kvlr": model.kv_lora_rank, "kvlr_rope": model.kv_lora_rank + model.qk_rope_dim,
             "experts32": model.experts * FP32_BYTES // b if b else model.experts, "k_h": k * model.hidden,
             "k_ef1": k * model.expert_fc1_width, "k_ef": k * model.expert_width,
             "sf1": model.fc1_of(model.shared_width), "sf": model.shared_width}
    # q, v and attn are as wide as the queries, the values and the attention output (hidden for a standard layer)
    rename = {"q": "q", "v": "v", "attn": "attn", "q_normed": "q", "attn_fp8": "attn"}
    specs = [TensorSpec(n, width[rename.get(n, w)], LSE_BYTES if role == "lse" else
                        model.gemm.saved_element_bytes if n in fp8 else b, split,
                        "transient" if n in blocks else role, saved and n not in blocks,
                        routed=k if n in _ROUTED else 0, etp_whole=n in _ETP_WHOLE)
             for n, w, split, role, saved in _tensor_rows(model)]
    return MappingProxyType({s.name: s for s in specs})


def _mla_ops(model: ModelConfig) -> list[OpSpec]:
    """Latent attention's projections, from ln1 to q, k, v (module docs)."""
    h, heads = model.hidden, model.heads
    ops = []
    if model.q_lora_rank:
        r = model.q_lora_rank
        ops += [OpSpec("q_down", "gemm", ("ln1",), ("q_lat",), gemm=(h, r), scope="replicated"),
                OpSpec("q_lnorm", "norm", ("q_lat",), ("q_latn",)),
                OpSpec("q_up", "gemm", ("q_latn",), ("q",), gemm=(r, model.q_dim))]
    else:
        ops.append(OpSpec("q_proj", "gemm", ("ln1",), ("q",), gemm=(h, model.q_dim)))
    r = model.kv_lora_rank
    ops += [OpSpec("kv_down", "gemm", ("ln1",), ("kv_lat",), gemm=(h, r + model.qk_rope_dim), scope="replicated"),
            OpSpec("kv_lnorm", "norm", ("kv_lat",), ("kv_latn",)),
            OpSpec("kv_up", "gemm", ("kv_latn",), ("k", "v"), gemm=(r, heads * (model.head_dim + model.value_head_dim)))]
    return ops


def _moe_ops(model: ModelConfig) -> list[OpSpec]:
    """The MoE block, from ln2 to y (module docs). ``dispatch`` / ``combine`` stand for the
    dispatcher's collectives (priced by `memo_sim.cost.moe`)."""
    h, fe, fe1 = model.hidden, model.expert_width, model.expert_fc1_width
    e = model.moe_router.gemm(h, model.experts)
    ops = [OpSpec("router", "gemm", ("ln2",), ("probs",), gemm=e, scope="shard"),
           OpSpec("route", "elementwise", ("probs",), ("probs",)),
           OpSpec("permute", "elementwise", ("ln2",), ("moe_in",)),
           OpSpec("dispatch", "moe_comm", ("moe_in",), ("moe_in",))]
    fc1_in = "moe_in"
    if model.moe_router.weights_input:  # each copy times its router weight before the experts (Llama 4)
        ops.append(OpSpec("weight_input", "elementwise", ("moe_in",), ("moe_in_w",)))
        fc1_in = "moe_in_w"
    ops += [OpSpec("expert_fc1", "gemm", (fc1_in,), ("efc1",), gemm=(h, fe1), scope="expert"),
           OpSpec("expert_act", "elementwise", ("efc1",), ("eact",)),
           OpSpec("expert_fc2", "gemm", ("eact",), ("efc2",), gemm=(fe, h), scope="expert"),
           OpSpec("combine", "moe_comm", ("efc2",), ("efc2",)),
           OpSpec("unpermute", "elementwise", ("efc2", "probs"), ("moe_out",))]
    out = ("h1", "moe_out")
    if model.shared_experts:
        sw = model.shared_width
        sw1 = model.fc1_of(sw)
        # the shared experts are a dense FFN on the TP group's tokens: ln2's all-gather (`forward_ops`) feeds
        # them, their output is reduce-scattered
        ops += [OpSpec("shared_fc1", "gemm", ("ln2",), ("sfc1",), gemm=(h, sw1)),
                OpSpec("shared_act", "elementwise", ("sfc1",), ("sact",)),
                OpSpec("shared_fc2", "gemm", ("sact",), ("sfc2",), gemm=(sw, h), tp_comm_after="reduce")]
        out += ("sfc2",)
    return ops + [OpSpec("add2", "elementwise", out, ("y",))]


def forward_ops(model: ModelConfig) -> list[OpSpec]:
    h, kv, f1, f = model.hidden, model.kv_dim, model.fc1_width, model.ffn
    qkv = _mla_ops(model) if model.mla else [
        OpSpec("qkv", "gemm", ("ln1",), ("q", "k", "v"), gemm=(h, model.q_dim + kv + model.v_dim))]
    if model.positions == "rotary":  # the query and key heads turned by their positions (`memo_sim.model.rope_kernels`)
        qkv.append(OpSpec("rope", "elementwise", ("q", "k"), ("q", "k")))
    # the FFN's input is all-gathered over TP for a dense FFN (and a MoE block's shared experts); the
    # routed experts read each rank's own shard
    ffn = _moe_ops(model) if model.moe else [
        OpSpec("fc1", "gemm", ("ln2",), ("fc1",), gemm=(h, f1)),
        OpSpec("act", "elementwise", ("fc1",), ("act",)),
        OpSpec("fc2", "gemm", ("act",), ("fc2",), gemm=(f, h), tp_comm_after="reduce"),
        OpSpec("add2", "elementwise", ("h1", "fc2"), ("y",))]
    return [
        OpSpec("ln1", "norm", ("x",), ("ln1",), tp_comm_after="gather"),
        *qkv,
        OpSpec("attention", "attention", ("q", "k", "v"), ("attn", "lse"), token_wise=False),
        OpSpec("out_proj", "gemm", ("attn",), ("proj",), gemm=(model.attn_dim, h), tp_comm_after="reduce"),
        OpSpec("add1", "elementwise", ("x", "proj"), ("h1",)),
        OpSpec("ln2", "norm", ("h1",), ("ln2",),
               tp_comm_after=None if model.moe and not model.shared_experts else "gather"),
        *ffn,
    ]


@lru_cache(maxsize=256)
def sp_regathered(model: ModelConfig) -> frozenset[str]:
    """The GEMMs whose input sequence parallelism all-gathers in the forward (the output of an op with
    ``tp_comm_after == "gather"``) and all-gathers again in the backward for the weight gradient: the
    forward keeps only the rank's shard of it (Megatron-LM's ColumnParallelLinear with SP, memo's
    executor alike). The router reads the rank's own shard, the experts their routed tokens."""
    ops = forward_ops(model)
    gathered = {o for op in ops if op.tp_comm_after == "gather" for o in op.outputs}
    return frozenset(op.name for op in ops if op.kind == "gemm" and op.tp_comm_after != "reduce"
                     and op.scope in ("tp", "replicated") and op.inputs[0] in gathered)


@lru_cache(maxsize=256)
def sp_kept_inputs(model: ModelConfig) -> MappingProxyType:
    """The saved tensors sequence parallelism all-gathers for column-parallel GEMMs (the inputs of `sp_regathered`'s
    GEMMs), name -> how many rank shards of it a layer keeps beyond the TP group's whole where the GEMMs keep the
    gathered tensor for their weight gradients (``Layout.sp_input_kept``; `memo_sim.cost.activations.kept_scale`):
    0, or 1 where a GEMM that is not gathered (the router beside a MoE layer's shared experts) reads the rank's own
    shard too. memo's executor keeps these rows gathered in a layer's storage (`memo_exec.layer.storage_shapes`)."""
    ops = forward_ops(model)
    gathered = sp_regathered(model)
    names = {op.inputs[0] for op in ops if op.name in gathered}
    return MappingProxyType({n: int(any(op.kind == "gemm" and op.name not in gathered and n in op.inputs
                                        for op in ops)) for n in names})


def skeletal_tensors(model: ModelConfig, tp_mode: str = "megatron") -> list[TensorSpec]:
    return [t for t in layer_tensors(model, tp_mode).values() if t.saved]


def recompute_ops(model: ModelConfig, tp_mode: str = "megatron") -> list[OpSpec]:
    """Ops MEMO re-runs for the dropped tokens before a layer's backward.

    From the offloaded layer input x and attention output attn every "other" skeletal tensor is
    rebuilt token-wise: ln1, q/k/v (turned by the rotary op again), proj (only to rebuild h1), h1, ln2, fc1,
    act. The attention core and fc2 are not re-run. Under METP the block tensors are not skeletal, so their ops are
    not re-run: ``metp_ffn`` drops fc1 and act, ``metp`` also qkv (only ln1, out_proj, add1 and ln2
    remain; out_proj runs as a ring of W_proj blocks, `memo_sim.cost.metp`).
    """
    blocks = block_tensors(tp_mode)
    tensors = layer_tensors(model, tp_mode)
    return [op for op in forward_ops(model)
            if (op.name in RECOMPUTED or (op.name in RECOMPUTED_IF_KEPT and all(tensors[o].saved for o in op.outputs)))
            and not set(op.outputs) <= blocks]


# the ops MEMO's token-wise recompute re-runs (`recompute_ops`): every op rebuilding an "other" skeletal
# tensor (the rotary op turning the rebuilt q and k), and out_proj + add1 for h1; latent attention's projections and the MoE block's routing, dispatch
# (the recomputed rows go to their experts again, Llama 4's weighted again) and expert / shared FFN inputs
RECOMPUTED = frozenset({"ln1", "qkv", "rope", "out_proj", "add1", "ln2", "fc1", "act",
                        "q_down", "q_lnorm", "q_up", "q_proj", "kv_down", "kv_lnorm", "kv_up",
                        "router", "route", "permute", "dispatch", "weight_input", "expert_fc1", "expert_act",
                        "shared_fc1", "shared_act"})
# ops turning their input in place whose backward reads none of the layer's tensors (the rotary op's reads only its
# position tables): they neither produce a saved tensor nor hold one for their backward (`memo_sim.memplan.
# iteration_requests`)
IN_PLACE_NO_SAVED = frozenset({"rope"})
# ops re-run only where the model keeps their output: the shared experts' second GEMM under a shared gate
RECOMPUTED_IF_KEPT = frozenset({"shared_fc2"})


# MEMO's token-wise recompute re-gathers the dropped rows' norm outputs for the QKV and first FFN GEMMs
# (`memo_sim.tp.base.TPFlavour.recompute_scratch`). The recomputed rows themselves are written into the rounding
# buffer's ln1 / ln2 slot; the gather's output is not: memo-exec's recompute (memo_exec/layer.py
# ``LayerCompute._fwd_ops`` under ``recompute_tokens``, the gather of memo_exec/distributed/tp/megatron.py
# ``MegatronComm.gather``) asks its scratch for ``rc_ln1_gathered`` / ``rc_ln2_gathered``, the TP group's dropped rows
# at full width (p times the slot's rows), frees it after its GEMM, before the backward's own tensors: a layer
# transient like the forward's gathered GEMM inputs, placed with them (a review: it was counted beside the arena by
# the static plan, not at all by the iteration replay, which took it for the rounding buffer's). Without sequence
# parallelism the gather is the identity (``MegatronComm.gather`` returns the slot's rows): no tensor, and the
# backward trace leaves it out (`memo_sim.memplan.trace_gen`).
RECOMPUTE_GATHERS = ("recompute_ln1_gathered", "recompute_ln2_gathered")
# Transient tensors of a layer's level-1 traces that the runtime does not place in the static
# arena, with the reason (the plan records them as `unplaced`; the executor accepts these names).
UNPLACED = {
    "fwd": {"y": "written straight into the next layer's input slot (a skeletal buffer)",
            "attention_workspace": "allocated inside the attention kernel"},
    "bwd": {"dy": "incoming gradient, allocated by the previous layer's backward (caching allocator)",
            "dx": "LayerNorm-1 backward output, returned to autograd (caching allocator)",
            "d_x_part": "LayerNorm-1 backward output, returned to autograd (caching allocator)",
            "d_h1_part": "LayerNorm-2 backward output, allocated by the norm's backward kernel and accumulated "
                         "into dy",
            "attention_bwd_workspace": "allocated inside the attention kernel"},
}
# The MoE block's transients and gradients: the executor's MoE block (memo_exec/moe) allocates them through the
# caching allocator, beside the static arena (the simulator counts them there too, `memo_sim.memplan.trace_gen`)
_MOE_WHY = "the MoE block's tensor: allocated by the caching allocator beside the static arena (memo_exec/moe)"
_MOE_TENSORS = ("probs", "moe_in", "moe_in_w", "efc1", "eact", "efc2", "moe_out", "sfc1", "sact", "sfc2")
UNPLACED["fwd"].update({n: _MOE_WHY for n in ("dispatch_recv", "combine_recv", "efc2", "moe_out", "sfc2")})
UNPLACED["bwd"].update({f"d_{n}": _MOE_WHY for n in _MOE_TENSORS})
UNPLACED["bwd"].update({n: _MOE_WHY for n in ("dispatch_grad_recv", "combine_grad_recv")})
# A quantised GEMM format's cast outputs (`memo_sim.memplan.trace_gen.fp8_casts`): the cast kernel allocates its
# quantised copies itself (memo_exec.gemm_formats.quantize through the caching allocator; TransformerEngine's
# quantisers likewise), beside the static arena
_GEMM_OPS = ("qkv", "q_down", "q_up", "q_proj", "kv_down", "kv_up", "out_proj", "fc1", "fc2", "expert_fc1",
             "expert_fc2", "shared_fc1", "shared_fc2")
_CAST_WHY = "a quantised GEMM format's cast output: allocated by the cast (caching allocator) beside the static arena"
FP8_CASTS = {"fwd": ("input", "weight"), "bwd": ("dout", "input", "weight")}


def fp8_cast_name(op: str, what: str) -> str:
    """The trace's name of a GEMM's cast output: ``what`` is input, dout (the output gradient) or weight."""
    return f"{op}_{what}_fp8"


for _ph, _whats in FP8_CASTS.items():
    UNPLACED[_ph].update({fp8_cast_name(op, w): _CAST_WHY for op in _GEMM_OPS for w in _whats})
