"""Activation bytes per GPU under a layout, from the layer graph.

Per GPU a tensor of one layer holds ``tokens_per_gpu · width · dtype`` bytes where
tokens_per_gpu = b·s / (cp · ulysses), further divided by tp when the tensor is TP-split or when
Megatron sequence parallelism is on (then every activation is split by tp). Totals for a GPT
layer: 32·b·s·h bytes; with TP+SP and CP each GPU holds 1/(t·c); with TP alone
(8 + 24/t)·b·s·h (divided by c).

Under METP (``layout.tp_mode``) the tensors the layer graph names `block_tensors` never exist
whole on a GPU: `tensor_bytes` and `row_bytes` give them 0 bytes, so every sum over the layer's
tensors (skeletal bytes, offloaded rows, kept tensors) counts what METP holds; their per-step
blocks are level-1 transients sized by `memo_sim.cost.metp.block_sizes`. METP keeps per GPU
x, ln1, attn, h1, ln2 (10·b·s·h/t bytes, ``metp``) or also q, k, v (16·b·s·h/t, ``metp_ffn``
for a GPT layer) against Megatron TP+SP's 32·b·s·h/t.
"""

from __future__ import annotations

from functools import lru_cache

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.cost.attention_kernel import DROPOUT_MASK_BYTES, score_matrices
from memo_sim.cost.gemm_format import linear_params_on_gpu, saved_weight_bytes
from memo_sim.model.eager_kernels import eager_op
from memo_sim.cost import op_sac_saves
from memo_sim.model.layer_graph import (DTYPE_BYTES, FP32_BYTES, TensorSpec, block_tensors, forward_ops,
                                        fp8_attention_copy, layer_tensors, separate_norms, sp_kept_inputs)

INDEX_BYTES = 8  # an int64 index (topk's expert ids)


def tokens_per_gpu(layout: Layout, batch: int, seq: int) -> float:
    return batch * seq / layout.seq_split


def shard_tokens(layout: Layout, batch: int, seq: int) -> float:
    """Tokens of one rank's own sequence shard: the GPU's tokens, divided by TP under sequence
    parallelism (what a MoE block routes: `memo_sim.cost.moe`)."""
    return tokens_per_gpu(layout, batch, seq) / (layout.tp if layout.sp else 1)


def routed_load(layout: Layout, batch: int, seq: int, top_k: int) -> float:
    """The busiest expert-parallel rank's routed tokens over the mean (`memo_sim.layout.moe_balance`):
    the EP group routes top_k copies of each of its ranks' shard tokens."""
    return layout.balance.load_factor(top_k * shard_tokens(layout, batch, seq) * layout.ep, layout.ep)


_block_tensors = lru_cache(maxsize=None)(block_tensors)  # a few modes; asked for every tensor priced


def tensor_bytes(t: TensorSpec, layout: Layout, batch: int, seq: int) -> float:
    """Bytes of one layer's tensor on one GPU (0 for a tensor METP holds only as blocks)."""
    if t.name in _block_tensors(layout.tp_mode):
        return 0.0
    split = layout.tp if (t.tp_split or layout.sp) else 1
    b = tokens_per_gpu(layout, batch, seq) * t.bytes_per_token() / split
    if t.routed:  # the busiest EP rank's copies; the ETP group's tokens where each ETP rank holds them whole
        b *= routed_load(layout, batch, seq, t.routed) * (layout.etp if t.etp_whole else 1)
    return b


def ulysses_kept_scale(name: str, model: ModelConfig, layout: Layout) -> float:
    """How many times a saved tensor's bytes (`tensor_bytes`) a layer keeps for its backward: 1, except where Ulysses
    keeps the attention kernel's head-sharded inputs and output from the forward to the backward
    (``layout.ulysses_bwd_resend`` False). There the all-to-all saves nothing (DeepSpeed's ``_SeqAllToAll``,
    deepspeed/sequence/layer.py, whose forward keeps only the group and the indices; XTuner's and TransformerEngine's
    a2a CP alike), the kernel (FlashAttention's autograd function) saves the head-sharded q, k, v and out it ran on,
    and the output projection its sequence-sharded input: the kernel's K and V are each of the rank's K/V heads
    repeated ``r`` times before the all-to-all (`Layout.kv_repeat`; the QK norm's output where the layer keeps it,
    ``k_normed``, the norm keeping its input), r times their sequence-sharded bytes, and the attention output is kept
    twice, the kernel's head-sharded one beside the projection's (once where the projection keeps only its quantised
    copy, `fp8_attention_copy`: the kernel's is then the one counted). The head-sharded q has the sequence-sharded
    one's bytes; the sequence-sharded q, k, v are freed once sent. A re-sending Ulysses (memo's executor) keeps the
    sequence-sharded tensors and sends them again (`memo_sim.memplan.trace_gen.attention_buffers`)."""
    if layout.ulysses == 1 or layout.ulysses_bwd_resend:
        return 1.0
    kernel_k = "k_normed" if model.qk_norm and model.qk_norm_kept else "k"
    if name in (kernel_k, "v"):
        return float(layout.kv_repeat(model.n_kv_heads, model.heads))
    if name == "attn" and not fp8_attention_copy(model):
        return 2.0
    return 1.0


def kept_scale(name: str, model: ModelConfig, layout: Layout) -> float:
    """How many times a saved tensor's bytes (`tensor_bytes`) a layer keeps for its backward: Ulysses' kept kernel
    inputs (`ulysses_kept_scale`), and the TP degree's shards of a sequence-parallel GEMM input where the GEMMs keep
    the gathered tensor (``layout.sp_input_kept``: torch's ColwiseParallel, the full-length tensor in place of the
    shard; `sp_kept_inputs`)."""
    scale = ulysses_kept_scale(name, model, layout)
    if layout.sp_input_kept and layout.sp and layout.tp > 1 and not layout.metp:
        extra = sp_kept_inputs(model).get(name)
        if extra is not None:
            scale *= layout.tp + extra
    return scale


def saved_bytes(t: TensorSpec, model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Bytes one GPU keeps of a layer's saved tensor from its forward to its backward (`kept_scale`)."""
    return tensor_bytes(t, layout, batch, seq) * kept_scale(t.name, model, layout)


def layer_rows(layout: Layout, batch: int, seq: int) -> int:
    """Token rows of every activation tensor of a layer on one GPU (token-major tensors): the
    GPU's tokens, divided by TP under Megatron sequence parallelism."""
    split = layout.tp if layout.sp else 1
    return max(1, int(round(tokens_per_gpu(layout, batch, seq) / split)))


def row_bytes(t: TensorSpec, layout: Layout) -> float:
    """Bytes of one token row of a tensor on one GPU (TP-split tensors are narrower without SP;
    0 for a tensor METP holds only as blocks)."""
    if t.name in _block_tensors(layout.tp_mode):
        return 0.0
    return t.bytes_per_token() / (layout.tp if (t.tp_split and not layout.sp) else 1)


# saved tensors Megatron-LM's --recompute-modules rebuild, by module group (their bytes are keys of
# `skeletal_bytes`; `memo_sim.policy.recompute_modules`): the norms' outputs (those that are modules of their own:
# `memo_sim.model.layer_graph.separate_norms`, the pre-MLP norm alone but under MLA), the MoE activation's output,
# the MoE block's saved tensors (router probabilities, the dispatched tokens, the experts' and shared
# experts' intermediates, the shared output a shared gate keeps; a name the model does not keep counts nothing)
RECOMPUTE_GROUPS = {"norms": ("ln1", "ln2"), "moe_act": ("eact",),
                    "moe_block": ("probs", "moe_in", "moe_in_w", "efc1", "eact", "sfc1", "sact", "sfc2"),
                    # a dense MLP checkpointed whole with its norm (TransformerEngine's LayerNormColumnParallelLinear
                    # fuses the pre-MLP norm into fc1, so the checkpoint's input is the residual stream)
                    "mlp": ("ln2", "fc1", "act")}


# saved tensors Megatron-LM's fine-grained activation offloading copies to the host, by --offload-modules module
# (`memo_sim.policy.offload_modules`): each module's offload group holds what autograd saves inside the module
# (megatron/core/pipeline_parallel/fine_grained_activation_offload.py at d98e8a64: ``group_start`` hooks
# saved_tensors_hooks; attention.py, moe/experts.py mark the groups): core_attn the attention kernel's inputs (q, k,
# v: the QK norms' outputs where the layer keeps them, `offload_module_tensors`; forced_released_tensors frees them),
# attn_proj the output projection's input (the kernel's output, which the kernel saves too, freed only by this group's
# forced release, and its quantised copy under FP8), expert_fc1 the experts' first GEMM's input (the dispatched
# tokens, or Llama 4's weighted copies of them). Disjoint, so a set of modules sums its groups' GPU bytes (the one
# tensor two groups save, the attention output, is copied by each where the framework copies per group:
# ``sk["offload_shared_copy"]``)
OFFLOAD_GROUPS = {"core_attn": ("q", "k", "v"), "attn_proj": ("attn", "attn_fp8"),
                  "expert_fc1": ("moe_in", "moe_in_w")}


def offload_module_tensors(model: ModelConfig, module: str) -> tuple[str, ...]:
    """The saved tensors of one layer that Megatron-LM's ``--offload-modules`` ``module`` offloads (`OFFLOAD_GROUPS`;
    the attention kernel's q and k are the QK norms' outputs where the layer keeps those, the norms keeping their
    inputs outside the group)."""
    names = OFFLOAD_GROUPS[module]
    if module == "core_attn" and model.qk_norm and model.qk_norm_kept:
        return ("q_normed", "k_normed", "v")
    if module == "expert_fc1" and model.moe and model.moe_router.weights_input:
        # Llama 4 weights the dispatched tokens before the group opens (moe/experts.py at d98e8a64: the multiply runs
        # before expert_fc1's manager and keeps the unweighted tokens outside it): the weighted copy alone goes
        return ("moe_in_w",)
    return names


# the input of each of a dense block's linears in torchtitan's order (wq, wk, wv; wo; w1, w3 of a gated FFN; w2), one
# entry per linear: under a quantised format each torchao linear casts its own input (`op_sac_abs_bytes`)
_LINEAR_INPUTS = {True: ("ln1", "ln1", "ln1", "attn", "ln2", "ln2", "act"),  # gated FFN: w1, w3, w2
                  False: ("ln1", "ln1", "ln1", "attn", "ln2", "act")}  # w1, w2


def op_sac_abs_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """What a per-op selective checkpoint whose save list names aten.abs (``ModelConfig.fp8_abs_saved``: torchtitan
    9dec370's ``_save_list``) keeps of one dense layer's casts on one GPU in eager PyTorch: torchao eab345c's
    Float8Linear takes each cast's amax as torch.max(torch.abs(t)), and the checkpoint's caching mode stores every
    MUST_SAVE output it sees to the layer's backward, so every linear's input (once per linear: each Float8Linear casts
    its own, ln1 three times, ln2 twice under a gated FFN) and weight (cast in every forward: FSDP's float8 all-gather
    off, 9dec370's default; the rank's whole unsharded weights) leave their absolute values, in the model dtype and
    the tensor's size. 0 in a compiled block (`_op_sac_bytes`) and elsewhere."""
    if not (model.gemm.quantised and model.fp8_abs_saved) or model.moe or model.mla:
        return 0.0
    tensors = layer_tensors(model, layout.tp_mode)
    acts = sum(tensor_bytes(tensors[n], layout, batch, seq) / tensors[n].dtype_bytes
               for n in _LINEAR_INPUTS[model.ffn_type == "swiglu"])
    return (acts + linear_params_on_gpu(model, layout, 1)) * DTYPE_BYTES[model.dtype]


def _op_sac_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> tuple[float, float]:
    """(skeletal bytes torchtitan's per-op selective checkpoint drops, bytes it keeps beyond the skeletal ones) of one
    layer on one GPU, from its save list's rules (`memo_sim.cost.op_sac_saves`). Dropped: what store-all keeps of the
    skeletal tensors (`saved_bytes`: a ColwiseParallel's gathered input too, whose all-gather runs again) less what
    the checkpoint keeps in their place: the block's input, the attention output and an all-to-all's dispatched
    tokens (`kept_tensors`), and the saved linears' outputs (wq's, wv's, w1's half of a gated fc1, ...: the GEMM's
    output, latent attention's wkv_b one without the rotary part the key is concatenated with). Beyond them, in eager
    PyTorch (the checkpoint's caching mode stores what the list names whether or not the backward reads it): the
    saved linears' outputs that are no skeletal tensor (w2's; the output projection's under latent attention; a
    row-parallel one's partial sums at the TP group's tokens), the reduce-scatters' outputs of sequence parallelism,
    the MoE combine's all-to-all output (k rows of the rank's tokens) and topk's values and expert indices, and the
    casts' abs outputs where the list keeps them (`op_sac_abs_bytes`). In a compiled block the policy only tags the
    graph's nodes and AOTAutograd's partitioner saves a tagged output only where the backward graph reads it
    (`memo_sim.cost.op_sac_saves.backward_reads`: the combine's output and topk's indices of those)."""
    tensors = layer_tensors(model, layout.tp_mode)
    # summed in the layer's tensor order: a set's order of strings changes with the process's hash seed, and so did
    # the float sums over it, in their last bits (2026-12-05: two runs of one what-if differed in 121 rows' bytes)
    ordered = tuple(n for n, t in tensors.items() if t.saved and t.role != "lse")
    skeletal = frozenset(ordered)
    kept = sum(tensor_bytes(tensors[n], layout, batch, seq)
               for n in op_sac_saves.kept_tensors(model, model.moe and layout.ep > 1) if n in skeletal)
    d = DTYPE_BYTES[model.dtype]
    tokens = tokens_per_gpu(layout, batch, seq)
    ops = {op.name: op for op in forward_ops(model)}
    extras: dict[str, float] = {}
    for p in op_sac_saves.linear_parts(model):
        if not p.saved:
            continue
        # the linear's output on this GPU: the TP group's tokens, its output columns (whole where the weights are
        # replicated over TP, and for a row-parallel linear's partial sums)
        op = ops[p.op]
        whole = op.tp_comm_after == "reduce" or op.scope == "replicated"
        out = tokens * op.gemm[1] * p.share / (1 if whole else layout.tp) * d
        if op_sac_saves.in_skeleton(p, skeletal):
            kept += out
        else:
            extras[f"{p.op}_out"] = extras.get(f"{p.op}_out", 0.0) + out
    dropped = sum(saved_bytes(tensors[n], model, layout, batch, seq) for n in ordered) - kept
    if layout.sp and layout.tp > 1:
        extras["reduce_scattered"] = sum(tokens / layout.tp * model.hidden * d
                                         for op in ops.values() if op.tp_comm_after == "reduce")
    if model.moe:
        routed = shard_tokens(layout, batch, seq) * model.top_k
        extras["topk_values"], extras["topk_indices"] = routed * FP32_BYTES, routed * INDEX_BYTES
        if layout.ep > 1:
            extras["moe_combined"] = routed * model.hidden * d
    extras["abs"] = op_sac_abs_bytes(model, layout, batch, seq)
    if layout.kernel_fusion == "compiled":
        return dropped, sum(b for n, b in extras.items() if op_sac_saves.backward_reads(n))
    return dropped, sum(extras.values())


def skeletal_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    """`_skeletal_bytes`, computed once per (model, layout, batch, seq); a fresh dict for each caller."""
    return dict(_skeletal_bytes(model, layout, batch, seq))


@lru_cache(maxsize=1 << 14)
def _skeletal_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> tuple:
    return tuple(_skeletal_bytes_dict(model, layout, batch, seq).items())


def _skeletal_bytes_dict(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    """One layer's skeletal bytes on one GPU by MEMO role: input, attn, other, lse, and total.

    ``total`` is the 32·b·s·h of MISSION.md (lse excluded; it is reported on its own). The
    `RECOMPUTE_GROUPS` keys give the bytes of the tensors each Megatron recompute-module group rebuilds.
    ``scores``: with materialised attention (``layout.attention``) the score-sized tensors the
    attention's backward reads, the softmax output, the dropout mask and the dropped
    probabilities, n_b·s²·(2d + 1) (`memo_sim.cost.attention_kernel`); 0 with FlashAttention. A
    policy that keeps the layer's activations keeps them too (store all); they are not token-wise,
    so no policy offloads them.
    """
    out = {"input": 0.0, "attn": 0.0, "other": 0.0, "lse": 0.0}
    groups = dict.fromkeys(RECOMPUTE_GROUPS, 0.0)
    named = {**RECOMPUTE_GROUPS, "norms": separate_norms(model)}  # the norms that are modules of their own
    for t in layer_tensors(model, layout.tp_mode).values():
        if t.saved:
            b = saved_bytes(t, model, layout, batch, seq)
            out[t.role] += b
            for g, names in named.items():
                if t.name in names:
                    groups[g] += b
    out["total"] = out["input"] + out["attn"] + out["other"]
    out.update(groups)
    # the bytes of each fine-grained offload group (`OFFLOAD_GROUPS`), keyed ``offload_<module>``
    tens = layer_tensors(model, layout.tp_mode)
    for m in OFFLOAD_GROUPS:
        out[f"offload_{m}"] = sum(saved_bytes(tens[n], model, layout, batch, seq)
                                  for n in offload_module_tensors(model, m) if n in tens and tens[n].saved)
    # the attention output the kernel's group (core_attn) and the projection's (attn_proj) both save where it is one
    # tensor (the projection keeps no quantised copy of its own, and no keeping Ulysses gives the kernel an output of
    # its own): copied to the host and back once more by a framework whose offload copies per group
    # (`ModelConfig.offload_copies_per_group`; its GPU bytes are freed once)
    one_tensor = not fp8_attention_copy(model) and (layout.ulysses == 1 or layout.ulysses_bwd_resend)
    out["offload_shared_copy"] = (tensor_bytes(tens["attn"], layout, batch, seq)
                                  if model.offload_copies_per_group and one_tensor else 0.0)
    out["scores"] = materialised_score_bytes(model, layout, batch, seq)
    # what re-running the attention core drops (selective recompute; the checkpoint keeps its inputs q, k, v): the
    # kernel's own output where the output projection keeps a quantised copy of it too
    # (`memo_sim.model.layer_graph.fp8_attention_copy`), and what a keeping Ulysses' kernel holds beyond the
    # sequence-sharded tensors (`ulysses_kept_scale`: K/V's repeats, its head-sharded output)
    kernel_extra = sum(tensor_bytes(t, layout, batch, seq) * (ulysses_kept_scale(t.name, model, layout) - 1)
                       for t in tens.values() if t.saved)
    out["attn_kernel_out"] = kernel_extra + (tensor_bytes(tens["attn"], layout, batch, seq) if "attn_fp8" in tens
                                             else 0.0)
    out["op_sac_dropped"], out["op_sac_extra"] = _op_sac_bytes(model, layout, batch, seq)
    # a layer's quantised weight copy where autograd saves it to the layer's backward (not token-wise: no policy
    # offloads it; `memo_sim.policy.base.Policy.kept_extras`)
    out["fp8_weights"] = saved_weight_bytes(model, layout)
    # what eager norms and activations keep beyond their inputs and outputs (kept or rebuilt as `kept_extras` says)
    out["eager_saved"] = eager_saved_bytes(model, layout, batch, seq)
    return out


def eager_saved_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """What eager PyTorch's composite norms and activations keep for one layer's backward on one GPU beyond their
    inputs and outputs (``Layout.kernel_fusion`` ``eager``; `memo_sim.model.eager_kernels` ``saved_bytes`` per
    element of each op's output); 0 for fused or compiled kernels."""
    if layout.kernel_fusion != "eager":
        return 0.0
    tensors = layer_tensors(model, layout.tp_mode)
    total = 0.0
    for op in forward_ops(model):
        eager = eager_op(model, op, DTYPE_BYTES[model.dtype])
        if eager is not None:
            total += eager.saved_bytes * sum(tensor_bytes(tensors[t], layout, batch, seq) / tensors[t].dtype_bytes
                                             for t in op.outputs)
    return total


def materialised_score_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Bytes of the score-sized tensors one layer's materialised attention keeps for its backward on
    one GPU (softmax output, dropout mask, dropped probabilities); 0 with FlashAttention."""
    if layout.attention != "materialised":
        return 0.0
    d = DTYPE_BYTES[model.dtype]
    return score_matrices(model, layout, batch) * seq * seq * (2 * d + DROPOUT_MASK_BYTES)


def layer_tensor_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    return {n: tensor_bytes(t, layout, batch, seq) for n, t in layer_tensors(model, layout.tp_mode).items()}


def saved_tensors(model: ModelConfig, layout: Layout) -> list[TensorSpec]:
    """The layer's skeletal tensors under the layout's tensor-parallel mode (what a policy keeps,
    offloads or recomputes; Megatron's list without METP's block tensors)."""
    return [t for t in layer_tensors(model, layout.tp_mode).values() if t.saved]
