"""Non-layer work of one iteration on one GPU: embedding, chunked classifier, optimizer step.

- embedding: a memory-bound pass over 2·tokens·h·bytes, half in forward (lookup) and half in
  backward (gradient scatter);
- classifier: forward + backward of the vocabulary projection (three GEMM kernels of its forward
  FLOPs, split over TP and the sequence split: forward, data gradient, weight gradient, each
  priced with its operand bytes, `memo_sim.cost.kernel_time.gemm_time`) plus the cross-entropy's
  memory-bound passes over the logits (`cross_entropy_bytes_per_logit`, by ``layout.cross_entropy``);
- multi-token prediction (`ModelConfig.mtp_layers`; `mtp_seconds`): each module's layer forward and backward as
  the model's layer is priced (`memo_sim.cost.layer_time`, its collectives on the critical path), its projection's
  three GEMMs in the layers' GEMM format with their casts and its TP collectives (`mtp_projection_comm`), its norms
  and embedding lookup, and a second pass of the classifier and loss; it is part of the
  ``classifier`` time (the last stage's head: `BoundaryTimes.mtp` is its share), its activations kept from the
  head to the micro-batch's backward (on a pipeline one set per micro-batch in flight on the last chunk:
  `memo_sim.engine.schedules.microbatch`, `memo_sim.search.pipeline.pipeline_memory`), or under a policy that
  re-runs whole layers
  (``recompute_mtp``: full recompute, as Megatron-LM checkpoints the module then) its layer's forward run again;
- optimizer: Adam reads and writes master weights, moments, weights and gradients (the
  model's precision recipe) of the parameter shard this GPU updates (everything over TP, and
  over DP x CP x Ulysses from ZeRO-1), then, under a quantised GEMM format, re-casts the linear
  weights into their quantised copies (`memo_sim.cost.gemm_format.weight_recast_bytes`); under
  optimizer offload the step runs on the host (`memo_sim.cost.optimizer_offload`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.gemm_format import cast_seconds, layer_gemm_time, weight_recast_bytes
from memo_sim.cost.optimizer_offload import offloaded_step_seconds
from memo_sim.cost.param_split import GpuParams, model_gpu_params
from memo_sim.cost.memo import memoised
from memo_sim.model.flops import classifier_flops
from memo_sim.cost.kernel_time import gemm_bytes, gemm_time, memory_bound_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.loss_kernels import loss_kernel
from memo_sim.cost.opcost import critical_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.model.precision import PrecisionRecipe
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True)
class BoundaryTimes:
    """Seconds on one GPU, each alone at full speed."""

    embedding: float  # forward + backward
    classifier: float  # forward + backward, all chunks, and the multi-token-prediction modules' (`mtp`)
    optimizer: float
    mtp: float = 0.0  # the multi-token-prediction modules' share of ``classifier``

    @property
    def embedding_fwd(self) -> float:
        return self.embedding / 2

    @property
    def embedding_bwd(self) -> float:
        return self.embedding / 2


@memoised()
def boundary_times(model: ModelConfig, layout: Layout, batch: int, seq: int,
                   profile: HardwareProfile, recompute_mtp: bool = False) -> BoundaryTimes:
    """Embedding, classifier and optimizer seconds of one GPU (memoised: SPPO's search asks for
    every piece length of every plan it prices); ``recompute_mtp``: module docs."""
    toks = tokens_per_gpu(layout, batch, seq)
    dt = DTYPE_BYTES[model.dtype]
    emb = memory_bound_time(2 * toks * model.hidden * dt, profile)
    cls_flops = classifier_flops(model, batch, seq) / (layout.tp * layout.seq_split)
    cls_bytes = gemm_bytes(toks, model.vocab / layout.tp, model.hidden, dt)
    cls = 3 * gemm_time(cls_flops, profile, model.dtype, cls_bytes) + memory_bound_time(
        toks * model.vocab / layout.tp * cross_entropy_bytes_per_logit(layout.cross_entropy, dt), profile)
    mtp = mtp_seconds(model, layout, batch, seq, profile, emb + cls, recompute_mtp)
    optim = optimizer_seconds(model, layout, model_gpu_params(model, layout), model.layers + model.mtp_layers,
                              profile)
    return BoundaryTimes(emb, cls + mtp, optim, mtp)


def pipeline_boundary_times(model: ModelConfig, shard: Layout, last_shard: Layout, batch: int, seq: int,
                            profile: HardwareProfile, recompute_mtp: bool = False) -> BoundaryTimes:
    """`boundary_times` of a pipeline's stages: on the stage shard ``shard`` (`memo_sim.layout.parallel.stage_shard`),
    the head (and the multi-token-prediction modules) on the last stage's own shard ``last_shard``
    (`memo_sim.layout.parallel.stage_shards`: where its groups sit apart from the other stages'). The one rule the
    micro-batch pipeline, the analytic estimate and the proved bound price the head by."""
    bt = boundary_times(model, shard, batch, seq, profile, recompute_mtp)
    if last_shard is shard:
        return bt
    head = boundary_times(model, last_shard, batch, seq, profile, recompute_mtp)
    return replace(bt, classifier=head.classifier, mtp=head.mtp)


def mtp_seconds(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                head: float, recompute: bool = False) -> float:
    """The multi-token-prediction modules' forward and backward on one GPU (module docs): per module its layer
    (the critical path of the model's layer forward and backward), the projection of [norm(embedding);
    norm(hidden)] (2h -> h: forward, data- and weight-gradient GEMMs, split over TP as the classifier is, in the
    layers' GEMM format with its casts, and its TP collectives: `mtp_projection_comm`), three
    norms (read and write forward, read two and write one backward) and ``head``: the embedding lookup and a pass of
    the classifier and loss, as the model's own; under ``recompute`` the norms', projection's and layer's forward
    again.

    Memoised on the layout at ZeRO 0 (`zero_free`): nothing here reads the ZeRO stage (the layer's op lists,
    `memo_sim.cost.layer_time`, price no weight gather; the projection's collectives are TP's), and a what-if asks
    for every ZeRO stage of a layout (a cluster-scale MoE query priced each stage's layer op lists again, the most
    of its tier-1 time: deepseek-v3 on 256 GB200s, 2026-12-02)."""
    if not model.mtp_layers:
        return 0.0
    return _mtp_seconds(model, zero_free(layout), batch, seq, profile, head, recompute)


def zero_free(layout: Layout) -> Layout:
    """``layout`` at ZeRO stage 0: the key of the costs that do not read the stage (`mtp_seconds`)."""
    return layout if layout.zero == 0 else replace(layout, zero=0)


@memoised(maxsize=1 << 15)
def _mtp_seconds(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                 head: float, recompute: bool) -> float:
    toks = tokens_per_gpu(layout, batch, seq)
    dt = DTYPE_BYTES[model.dtype]
    h, tp = model.hidden, layout.tp
    fwd = critical_time(forward_costs(model, layout, batch, seq, profile))
    # the projection in the layers' GEMM format (Megatron-LM runs it inside the FP8 context), its input cast
    # forward and its output gradient's backward
    proj_fwd = layer_gemm_time(model, profile, toks, 2 * h, h / tp) + cast_seconds(model, profile, toks * 2 * h)
    proj_bwd = (layer_gemm_time(model, profile, toks, h / tp, 2 * h)
                + layer_gemm_time(model, profile, 2 * h, toks, h / tp) + cast_seconds(model, profile, toks * h / tp))
    comm_fwd, comm_bwd = mtp_projection_comm(model, layout, toks, profile, beside=proj_bwd)
    # the norms' passes: read and write forward, read two and write one backward (three norms)
    norms, norms_fwd = (memory_bound_time(3 * k * toks * h * dt, profile) for k in (5, 2))
    # under recompute the checkpointed module runs its norms, projection and layer forward again
    rerun = fwd + proj_fwd + comm_fwd + norms_fwd if recompute else 0.0
    layer = fwd + critical_time(backward_costs(model, layout, batch, seq, profile))
    return model.mtp_layers * (layer + proj_fwd + proj_bwd + comm_fwd + comm_bwd + norms + head + rerun)


def mtp_projection_comm(model: ModelConfig, layout: Layout, toks: float, profile: HardwareProfile,
                        beside: float = 0.0) -> tuple[float, float]:
    """Forward and backward seconds of a module projection's TP collectives on the critical path, as Megatron-LM's
    module runs them (multi_token_prediction.py: a column-parallel ``eh_proj`` without gathered output, then
    ``gather_from_tensor_model_parallel_region`` and, under sequence parallelism,
    ``scatter_to_sequence_parallel_region``): with SP, forward the [T, 2h] input all-gathered and the [T, h / tp]
    output all-gathered along the hidden dimension, backward the output gradient all-gathered along the sequence,
    the input re-gathered for the weight gradient and its gradient reduce-scattered; without SP, forward the output
    all-gathered, backward the input gradient all-reduced. (0, 0) without TP. The input's re-gather hides under
    ``beside`` (the projection's backward GEMMs) where the layout issues SP's re-gathers beside them
    (``sp_regather_overlap``: Megatron-LM's asynchronous gather, as for the layers' GEMMs), and is not run where the
    layout keeps the gathered input (``sp_input_kept``)."""
    tp = layout.tp
    if tp == 1:
        return 0.0, 0.0
    row = toks * model.hidden * DTYPE_BYTES[model.dtype]  # one [T, h] tensor of the micro-batch, all ranks' rows

    def gather(nbytes: float) -> float:
        return coll.ring_allgather_time(nbytes, tp, *coll.tp_params(profile, layout, "all_gather"))

    if layout.sp:
        scatter = coll.ring_reduce_scatter_time(2 * row, tp, *coll.tp_params(profile, layout, "reduce_scatter"))
        regather = 0.0 if layout.sp_input_kept else gather(2 * row)
        if layout.sp_regather_overlap:
            regather = max(0.0, regather - beside)
        return gather(2 * row) + gather(row), gather(row) + regather + scatter
    return gather(row), coll.allreduce_time(2 * row, tp, *coll.tp_params(profile, layout, "all_reduce"))


def cross_entropy_bytes_per_logit(kernel: str, dtype_bytes: int) -> float:
    """HBM bytes the loss moves per logit, forward and backward (`memo_sim.cost.loss_kernels`)."""
    return loss_kernel(kernel).hbm_bytes_per_logit(dtype_bytes)


def optimizer_seconds(model: ModelConfig, layout: Layout, params: GpuParams, layers: float,
                      profile: HardwareProfile) -> float:
    """One GPU's optimizer step over ``params`` (its parameters before and after ZeRO,
    `memo_sim.cost.param_split`) of ``layers`` layers: Adam on the GPU (HBM-bound), or on the host
    under optimizer offload; then the quantised weight copies re-cast."""
    if layout.optimizer_offload:
        step = offloaded_step_seconds(model, layout, params, profile)
    else:
        # a model-dtype working copy written beside the master, but where the fp32 parameter is the master (FSDP2's
        # shards, and ZeRO 0 run as FSDP2 over a shard group of one: ``Layout.replicate_fsdp``)
        working = (not (layout.zero == 0 and layout.replicate_fsdp)
                   and (layout.zero < 3 or layout.dp_flavour.shards_working_weights))
        step = memory_bound_time(optimizer_step_bytes(model.recipe, params.local, params.shards, layout.zero, working,
                                                      layout.optimizer_impl == "foreach"), profile)  # (optimizer offload: the host's step, `offloaded_step_seconds`)
    # the re-cast of the weights this GPU updates: all of them, or its 1/N shard under ZeRO-3 (each layer's
    # gathered copies are then cast again per gather, not priced)
    return step + memory_bound_time(weight_recast_bytes(model, layers, layout, owned=layout.zero >= 3), profile)


def optimizer_step_bytes(recipe: PrecisionRecipe, params: float, shards: float, zero: int,
                         working_copy: bool = True, foreach: bool = False) -> float:
    """HBM bytes of one optimizer step over ``params`` parameters held by one GPU (before ZeRO),
    sharded ``shards`` ways by ZeRO stage ``zero`` (the module's formula); ``working_copy`` False: the step writes
    no model-dtype copy of the master (FSDP2's shards: `memo_sim.dp.base.DPFlavour.shards_working_weights`).
    ``foreach`` (``Layout.optimizer_impl``): torch.optim's AdamW as foreach kernels (torch/optim/adam.py
    _multi_tensor_adam with decoupled weight decay), each a pass of its own over the tensors it reads and writes:
    the decay's mul_ of the parameter (read, write), lerp_ of the first moment by the gradient, mul_ and
    addcmul_ of the second by the gradient, sqrt into a new tensor, div_ and add_ of it, addcdiv_ of the parameter
    (4 parameter, 14 moment-sized and 2 gradient passes, where the fused kernel makes 2, 4 and 2)."""
    w, g, m, o = recipe.weight_bytes, recipe.grad_bytes, recipe.master_bytes, recipe.optimizer_bytes
    p = m or w
    n = max(1, shards)
    shard = params / (n if zero >= 1 else 1)
    # the working copy cast from the updated master (its read and the copy's write), where one is kept
    update = 4 * p + 2 * g + 7 * o if foreach else 2 * p + 2 * g + 2 * o  # o: both moments' bytes
    per_param = update + ((m + w) if m and working_copy else 0)
    grad_buffer = params / (n if zero >= 2 else 1)
    return shard * per_param + grad_buffer * g
