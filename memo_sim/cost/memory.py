"""Pure memory formulas per GPU: model states, the chunked classifier, offloaded bytes.

Model states follow the model's mixed-precision recipe (`memo_sim.model.precision`; default
Megatron-LM bf16: 2 + 4 + 4 + 8 = 18 bytes per parameter), sharded by ZeRO over the DP x CP x
Ulysses group as the recipe says; ZeRO-3 also keeps two layers' gathered weights live for
prefetch, and ZeRO-2 and 3 a layer's and the output head's whole gradients (memo's executor: the embedding /
head / final norm unit's, ``Layout.head_grads_unit``) before they are reduce-scattered into their shards (a MoE
layer's routed experts only where their expert data-parallel group shards them: `sharded_layer_params`). TP divides
everything, the embedding/classifier too (vocab-parallel).

A quantised GEMM format (FP8) adds its copies of the linear weights (`memo_sim.cost.gemm_format`).

The loss holds the logits of as many tokens as its kernel (`Layout.cross_entropy`, a framework
mechanism) materialises at once: memo's chunked kernel one chunk of ``CLASSIFIER_CHUNK_TOKENS``
tokens (the one default; plans carry their own value), the frameworks' kernels every token of the
micro-batch; at the bytes per logit each keeps live (`loss_bytes_per_logit`).

The whole-GPU peak by policy (these terms plus skeletal activations and transients) is
`memo_sim.memplan.footprint.memory_breakdown`.
"""

from __future__ import annotations

from memo_sim.cost.activations import skeletal_bytes, tokens_per_gpu
from memo_sim.cost.gemm_format import weight_cache_bytes
from memo_sim.cost.loss_kernels import loss_kernel
from memo_sim.cost.param_split import layer_gpu_params, model_gpu_params
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES

CLASSIFIER_CHUNK_TOKENS = 8192
def loss_bytes_per_logit(kernel: str, dtype_bytes: int) -> float:
    """Bytes per logit the loss keeps live at its peak (`memo_sim.cost.loss_kernels`)."""
    return loss_kernel(kernel).live_bytes_per_logit(dtype_bytes)


def loss_tokens(layout: Layout, batch: int, seq: int, chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> int:
    """Tokens whose logits the loss holds at once on one GPU: one chunk under memo's chunked kernel or
    torchtitan's chunked wrapper, the micro-batch's every token (``batch`` sequences) under the others."""
    return loss_kernel(layout.cross_entropy).chunk_tokens(tokens_per_gpu(layout, batch, seq), chunk_tokens)


def model_state_parts(model: ModelConfig, layout: Layout, experts_only: bool = False) -> dict[str, float]:
    """Model-state bytes on one GPU by part: weights, grads, master weights + optimizer, ZeRO-3's two gathered
    layers and gathered output head (and embedding, where FSDP keeps gathered weights to the backward), and (ZeRO 2 and 3) the whole gradients of a layer and of the head before their
    reduce-scatter; ``experts_only``: the routed experts' share of each part (they are split and
    sharded over other groups than the dense parameters, so each part has its own share)."""
    r = model.recipe
    g = model_gpu_params(model, layout)  # dense and routed-expert parts (`memo_sim.cost.param_split`)
    p, sh = (g.expert_local, g.expert_sharded) if experts_only else (g.local, g.sharded)
    z = layout.zero
    flavour = layout.dp_flavour
    # ZeRO 0 run as FSDP2 over a shard group of one (``Layout.replicate_fsdp``, torchtitan; on one stage: beside
    # pipeline stages `memo_sim.cost.sppo.stage_model_state_bytes` counts the kept bf16 layers as the weights): FSDP's
    # states, its bf16 copies of two layers made as a resharding shard group's gathers are
    as_fsdp = z == 0 and layout.replicate_fsdp and layout.pp == 1
    fsdp_like = z >= 3 or as_fsdp
    gathered = 2.0 if as_fsdp else flavour.gathered_layers(layout, model.layers)
    reshards = as_fsdp or flavour.gathers_in_backward(layout)
    # ZeRO 3 under a flavour whose fp32 master shard is the parameter (FSDP2), or ZeRO 0 run as FSDP2: no working
    # copy beside it; with the optimizer on the host the master lives there and the device keeps the working shard
    working = (r.master_bytes == 0 or layout.optimizer_offload
               or (not as_fsdp and (z < 3 or flavour.shards_working_weights)))
    # without a working copy (FSDP2) a one-rank expert group's experts are cast and held whole for a while too
    layer = sharded_layer_params(model, layout, experts_only, cast_when_gathered=fsdp_like and not working)
    vocab_share = model.vocab * model.hidden / layout.tp  # the embedding's (or the head's) weights on this GPU
    return {"weights": r.weight_bytes * (sh if z >= 3 else p) if working else 0.0,
            "grads": r.grad_bytes * (sh if z >= 2 else p),
            # on the host under optimizer offload (`memo_sim.cost.optimizer_offload.host_state_bytes`)
            "master_and_optimizer": 0.0 if layout.optimizer_offload
            else (r.master_bytes + r.optimizer_bytes) * (sh if z >= 1 else p),
            # ZeRO-3 / FSDP: the layers whose whole weights a GPU holds at its peak (`memo_sim.dp`: two, or every
            # layer when FSDP keeps them from forward to backward)
            "gathered_layers": gathered * r.weight_bytes * layer if fsdp_like else 0.0,
            # ZeRO-3 / FSDP: the output head gathered whole for the classifier's forward and backward (its vocab share
            # under TP; the tied embedding where it is the head), as the layers' gathers are counted (a review:
            # torchtitan's [norm, output] unit kept gathered through the loss)
            "gathered_head": r.weight_bytes * vocab_share if fsdp_like and not experts_only else 0.0,
            # ZeRO-3 / FSDP keeping gathered weights from forward to backward (FSDP2 without resharding): the
            # embedding's unit too, where it is not the head (`memo_sim.cost.grad_sync`)
            "gathered_embedding": r.weight_bytes * vocab_share
            if fsdp_like and not experts_only and not model.tied_embeddings and not reshards
            else 0.0,
            # ZeRO 2 / 3: gradients sharded, but each one is produced whole by the backward and reduce-scattered into
            # its shard afterwards: buckets of a layer's whole gradients, two where the reductions overlap the backward
            # (`unsharded_grad_units`: memo's executor's two layer workspaces; DeepSpeed: the buckets they are copied
            # into; FSDP2: the unsharded gradient cast to its reduce dtype beside the previous reduce-scatter's input)
            # and the output head's (its vocab share under TP: a framework's buckets reduce-scatter it before the
            # embedding's gradient is made), or where the layout says so (``head_grads_unit``: memo's executor) the
            # unit of the embedding, the untied head and the final norm, whole together to the step
            "unsharded_grads": r.grad_bytes * (unsharded_grad_units(layout) * reduce_bucket_elements(layout, layer)
                                               + (0.0 if experts_only else unsharded_head_params(model, layout)
                                                  if layout.head_grads_unit else vocab_share))
            if z >= 2 or as_fsdp else 0.0,
            # a quantised GEMM format's weight copies: every layer's, or only the gathered ones under ZeRO-3
            "quantised_weights": weight_cache_bytes(model, gathered if fsdp_like else model.layers + model.mtp_layers,
                                                    layout, experts_only)}


def unsharded_grad_units(layout: Layout) -> int:
    """How many buckets of whole gradients ZeRO 2 / 3 holds at once (a bucket: one layer's, or
    ``layout.reduce_bucket`` elements): two where the reductions overlap the backward (``layout.grad_overlap``: the
    bucket being reduced and the next one being made; memo's executor double-buffers its layer workspace,
    memo_exec/distributed/zero.py; FSDP2's reduce-scatter input lives until the next layer's post-backward waits
    for it, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward`` /
    ``reduce_scatter_state``; DeepSpeed's ZeRO 1 / 2 allocate two ``ipg_buffer`` buckets under ``overlap_comm``,
    deepspeed/runtime/zero/stage_1_and_2.py ``backward``, and its ZeRO 3 fills the next bucket while its flat one
    is reduced, stage3.py ``__reduce_and_partition_ipg_grads``), one where each is reduced before the next
    is made."""
    return 2 if layout.grad_overlap else 1


def reduce_bucket_elements(layout: Layout, layer: float) -> float:
    """One bucket's gradient elements: ``layout.reduce_bucket`` where the framework states one smaller than a
    layer (XTuner's 3e8), else the layer's (``layer``; memo's DeepSpeed export writes this as reduce_bucket_size)."""
    return min(float(layout.reduce_bucket), layer) if layout.reduce_bucket else layer


def sharded_layer_params(model: ModelConfig, layout: Layout, experts_only: bool = False,
                         cast_when_gathered: bool = False) -> float:
    """One layer's parameters on one GPU that ZeRO 2 / 3 shards, and so holds whole only for a while (its gradients
    before their reduce-scatter, under ZeRO 3 its gathered weights): the dense part, and the routed experts only where
    their expert data-parallel group (``Layout.expert_dp``) has more than one rank. With ep x etp = dp x tp the group
    is one rank: nothing shards the experts, whose whole weights and gradients the ``weights`` and ``grads`` parts
    already count (memo's executor: its experts' `memo_exec.distributed.zero.GradSync` runs ZeRO 0 over a group of
    one, ``zero = zero if size > 1 else 0``; Megatron-Core's distributed optimizer shards them over the expert
    data-parallel group, ``megatron/core/distributed/distributed_data_parallel.py`` ``expt_dp_group``, line 150, as
    `memo_sim.cost.param_split` prices them). ``cast_when_gathered``: the flavour keeps no working copy and makes the
    layer's model-dtype weights (and whole gradients) at each gather whatever its group's size, as FSDP2 does: torchtitan
    puts a block's routed experts in the block's ``fully_shard`` unit over their expert-data-parallel mesh however
    small (torchtitan/distributed/fsdp.py ``apply_fsdp`` at b5bcd76), and a one-rank mesh's unshard still casts the
    fp32 parameters into a bf16 all-gather output and its post-backward makes a whole gradient in the reduce dtype
    (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, _fsdp_collectives.py): the experts count
    then at any expert-data-parallel size (a review found a one-rank group's bf16 copies counted nowhere).
    ``experts_only``: the experts' part alone."""
    lay = layer_gpu_params(model, layout)
    experts = lay.expert_local if layout.expert_dp > 1 or cast_when_gathered else 0.0
    return experts if experts_only else lay.local - lay.expert_local + experts


def unsharded_head_params(model: ModelConfig, layout: Layout) -> float:
    """The parameters of the unit outside the layers on one GPU -- the token embedding, the head where it is not tied
    to it (each its vocab share under TP) and the final norm (whole on every TP rank) -- whose gradients memo's
    executor keeps whole to the step under ZeRO 2 / 3 (`memo_exec.distributed.zero`, unit 0: "unit 0 keeps its
    own"); `ModelConfig.embedding_params` split as the model's are."""
    matrices = (1 if model.tied_embeddings else 2) * model.vocab * model.hidden
    return matrices / layout.tp + model.norm_params


def model_state_bytes(model: ModelConfig, layout: Layout) -> float:
    return sum(model_state_parts(model, layout).values())


def classifier_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                          chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS, recompute_mtp: bool = False) -> float:
    """The head's peak on one GPU: the loss's live logits (`loss_bytes_per_logit`), the final norm's output and its
    gradient, and what the multi-token-prediction modules keep meanwhile (`mtp_activation_bytes`; ``recompute_mtp``:
    a policy that re-runs whole layers re-runs them too)."""
    tokens = loss_tokens(layout, batch, seq, chunk_tokens)
    vocab_share = model.vocab / layout.tp
    logits = tokens * vocab_share * loss_bytes_per_logit(layout.cross_entropy, DTYPE_BYTES[model.dtype])
    d = DTYPE_BYTES[model.dtype]
    final_hidden = tokens_per_gpu(layout, batch, seq) * model.hidden
    # final norm output + its gradient stay live over all chunks
    return (logits + final_hidden * (d + loss_kernel(layout.cross_entropy).hidden_grad_bytes(d))
            + mtp_activation_bytes(model, layout, batch, seq, recompute_mtp))


def mtp_activation_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int, recompute: bool = False) -> float:
    """What the multi-token-prediction modules keep from their forward to their backward on one GPU (each module
    after the one before: all of them at once while the main head peaks), per module: its layer's saved tensors as a
    store-all layer keeps them (`memo_sim.cost.activations.skeletal_bytes`, the attention's log-sum-exp and score
    matrices included), the projection's input (the two normed halves, 2h a token) and the normed embedding and
    hidden state feeding it (2h); under ``recompute`` (Megatron-LM checkpoints the module under full uniform
    recompute, multi_token_prediction.py `_checkpointed_forward`) its two inputs alone, the hidden state and the
    embedding (2h a token); its final norm's output and that output's gradient, which the head holds as it holds
    the model's (`mtp_head_row_bytes`); and its loss's state where the loss kernel keeps one between forward and
    backward (`memo_sim.cost.loss_kernels`, ``kept_fp32``: Megatron's fp32 softmax of every token). 0 without
    modules."""
    if not model.mtp_layers:
        return 0.0
    parts = mtp_module_parts(model, layout, batch, seq, recompute)
    return model.mtp_layers * sum(parts.values())


def mtp_module_parts(model: ModelConfig, layout: Layout, batch: int, seq: int, recompute: bool = False) -> dict:
    """One multi-token-prediction module's part of `mtp_activation_bytes` on one GPU, by kind: ``kept`` (its layer's
    saved tensors and the projection's inputs, or under ``recompute`` its two inputs), ``loss`` (its loss's state)
    and ``head_rows`` (its final-normed rows and their gradient, `mtp_head_row_bytes`); the caching-allocator
    replay requests each apart (`memo_sim.memplan.iteration_requests`)."""
    d = DTYPE_BYTES[model.dtype]
    tokens = tokens_per_gpu(layout, batch, seq)
    if recompute:
        kept = tokens * 2 * model.hidden * d
    else:
        sk = skeletal_bytes(model, layout, batch, seq)
        kept = sk["total"] + sk["lse"] + sk["scores"] + tokens * 4 * model.hidden * d
    loss = tokens * model.vocab / layout.tp * loss_kernel(layout.cross_entropy).kept_fp32
    rows = mtp_head_row_bytes(model, layout, batch, seq) / model.mtp_layers if model.mtp_layers else 0.0
    return {"kept": kept, "loss": loss, "head_rows": rows}


def mtp_head_row_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Every multi-token-prediction module's final-normed rows and their gradient on one GPU, held over the head as
    the model's own final norm output and its gradient are (`classifier_peak_bytes`)."""
    d = DTYPE_BYTES[model.dtype]
    per_token = model.hidden * (d + loss_kernel(layout.cross_entropy).hidden_grad_bytes(d))
    return model.mtp_layers * tokens_per_gpu(layout, batch, seq) * per_token
