"""Gradient and weight collectives over the group that holds the same weights (DP x CP x Ulysses).

- gradient buckets: all-reduce without ZeRO; reduce-scatter from ZeRO-1 on (a sharded optimizer
  needs only its shard of the gradient: Megatron's distributed optimizer and DeepSpeed's ZeRO
  both reduce-scatter); one bucket per layer, one for the head (``head_grad``: the classifier and
  final norm, with the multi-token-prediction modules' ``mtp_grad``), complete once the last
  micro-batch's head has run its backward, and one for the embedding (``embedding_grad``), complete
  only after the embedding's backward (the schedule: Megatron-LM's buckets follow the parameters in
  reverse, so the head's goes out first and the embedding's last), or all gradients at once
  (``all_grads``; the analytic estimate's exposed tail is its 1/n share); element width from the
  model's precision recipe. With ``layout.grad_overlap`` off (``overlapped`` False) the buckets do
  not overlap the backward: all gradients are reduced
  in one collective after it (Megatron-LM 2021's local DDP flattens every gradient into one
  buffer and all-reduces it after the backward: megatron/model/distributed.py,
  ``allreduce_gradients``), wholly exposed;
- ZeRO-1/2: each layer's updated weights all-gathered once per iteration, overlapping the
  forward (Megatron's overlapped parameter gather): layer i's forward waits for its gather; where the framework
  gathers them at the end of its optimizer step instead (``layout.param_gather`` ``after_step``: DeepSpeed's
  ``DeepSpeedZeroOptimizer.step`` calls ``all_gather_dp_groups`` after the step, deepspeed/runtime/zero/
  stage_1_and_2.py at edaa7221 line 2396, one ``all_gather_into_tensor`` over each parameter group's flat buffer,
  waited for before step() returns) every weight the GPU holds is gathered in one collective, ``step_gather``, after
  the optimizer step and before the next forward, with nothing else to hide it, and no unit gathers beside the
  forward;
- ZeRO-3: each layer's weights all-gathered before its forward and again before its backward.
The multi-token-prediction modules' weights are gathered as a layer's (``mtp_gather``, once; the schedules
place it before the head, whose op holds the modules' forward and backward).
The embedding's and the head's weights are gathered as a layer's are, each its own unit (torchtitan's
``fully_shard(model.tok_embeddings)`` and ``fully_shard([model.norm, model.output])``; Megatron-LM's distributed
optimizer gathers them with its other buckets): ``embedding_gather`` (the first or single stage: V x h / TP)
before the embedding's forward and, where the layers are gathered again for their backward, before its backward
(FSDP2's pre-backward unshards the unit, though a lookup's gradient reads no weight); ``head_gather`` (the last or
single stage: the final norm and the classifier, or on a pipeline the tied embedding's copy, with the embedding
copy the multi-token-prediction modules read there) once before the head, which keeps it through its backward (the
head op holds both), again for the head's backward where the flavour drops it after the forward
(``DPFlavour.regathers_head``: DeepSpeed's ZeRO-3 releases a module's parameters after its forward; torchtitan does
not reshard [norm, output] after the forward); on one stage under ZeRO-3 with resharding, a tied embedding (or one
the multi-token-prediction modules read) is gathered again for the head. Under a flavour that keeps the head's unit
(FSDP2 as torchtitan runs it) a tied embedding is one unit with the final norm and the classifier (torchtitan at
b5bcd76c, torchtitan/distributed/fsdp.py apply_fsdp_to_decoder lines 238-250: ``fully_shard([tok_embeddings, norm,
lm_head])`` 'to avoid duplicate all-gathers', resharded after the forward only under the 'always' policy, as the
[norm, output] unit is): gathered once, before the embedding's forward, and kept to the embedding's backward
(``embedding_kept``: no gather for the head nor again for the embedding's backward), its gradients, the norm's
with them, reduced as one bucket after the embedding's backward. A large vocabulary makes them
no small thing: Llama 3 8B's embedding and classifier hold 1.05B of its 8.0B parameters. On a
pipeline the first stage reduces the embedding's gradient and the last the head's (the classifier, or
a tied embedding's copy there, and the final norm), each its own V x h / TP; on one stage a tied
embedding's gradient is complete only after the embedding's backward (its head bucket is the norm's).
A weight two pipeline stages hold (`shared_embedding_seconds`): the embedding tied to the classifier, or an
embedding the multi-token-prediction modules read on the last stage, has its two gradients summed between
the first and the last stage after the data-parallel reduction (Megatron-LM's finalize_model_grads,
``_allreduce_word_embedding_grads`` over the embedding group, when the embedding is tied or
``mtp_num_layers`` > 0; memo-exec's pipeline sums a tied embedding's the same way), before the optimizer step.
FSDP (`memo_sim.dp.fsdp`) gathers over its shard group and, without resharding after the forward,
not again before the backward; under HSDP a bucket is reduce-scattered over the shard group and its
shard all-reduced across the replicas.
A MoE layer's routed experts (`memo_sim.cost.param_split`) are reduced and gathered over their own
replicas, the expert data-parallel group (etp x ep ranks apart), beside the dense part's collective
over the DP group: the bucket takes the sum of the two.

Seconds alone on the group's link (NVLink inside a node, the inter-node link across nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.cost import collectives as coll
from memo_sim.cost.kernel_time import memory_bound_op_time
from memo_sim.cost.memo import memoised
from memo_sim.cost.param_split import GpuParams, gpu_params, layer_gpu_params, model_gpu_params
from memo_sim.layout.parallel import Layout, expert_group_placements, stages_cross_nodes
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile, Link


@dataclass(frozen=True)
class _Path:
    """Where a group's collectives run: the profile's link and the fewest of the group's ranks on one node
    (`memo_sim.cost.collectives.ring_params`)."""
    profile: HardwareProfile
    link: Link
    node_ranks: int = 1
    ranks: int = 0  # the group's ranks (the ring's steps: `memo_sim.cost.collectives.ring_params`)

    def params(self, collective: str) -> tuple[float, float]:
        return coll.ring_params(self.profile, self.link, collective, self.node_ranks, self.ranks)


def _path(profile: HardwareProfile, layout: Layout, link: Link, g: int, stride: int) -> _Path:
    """The path of a group of ``g`` ranks ``stride`` apart in a stage's GPU order on ``link``."""
    return _Path(profile, link, coll.link_node_ranks(profile, layout, link, g, stride), g)


def _reduce(layout: Layout, nbytes: float, g: int, path: _Path) -> float:
    if layout.zero >= 1:
        return coll.ring_reduce_scatter_time(nbytes, g, *path.params("reduce_scatter"))
    return coll.allreduce_time(nbytes, g, *path.params("all_reduce"))


def _gather(nbytes: float, g: int, path: _Path) -> float:
    return coll.ring_allgather_time(nbytes, g, *path.params("all_gather"))


def params_reduce_time(model: ModelConfig, layout: Layout, profile: HardwareProfile, params: GpuParams,
                       stride: int | None = None) -> float:
    """Seconds of one gradient collective over ``params`` (a GPU's parameters, dense and routed-expert
    parts apart: `memo_sim.cost.param_split`) (all-reduce, or reduce-scatter from ZeRO-1 on), the dense
    part over the group that holds the same weights and the experts over theirs, alone on their links:
    a pipeline stage's serial reduction of all its gradients at once (``stride`` as in `grad_sync`)."""
    g, gr, t = layout.state_shards, model.recipe.grad_reduce_bytes, 0.0
    if g > 1:
        link = coll.group_link(profile, g, layout.tp if stride is None else stride, layout.gpus)
        t += _reduce(layout, gr * (params.local - params.expert_local), g, _path(profile, layout, link, g, layout.tp))
    ge = layout.expert_dp if model.moe else 1
    if ge > 1 and params.expert_local:
        t += _reduce(layout, gr * params.expert_local, ge, _expert_path(layout, ge, profile))
    return t


def expert_dp_link(layout: Layout, ge: int, profile: HardwareProfile):
    """The link of the routed experts' data-parallel groups (``ge`` replicas ``ep x etp`` ranks apart): the
    inter-node one where any group of any stage spans nodes (`memo_sim.layout.parallel.expert_group_placements`;
    a review: only the first group of stage 0 was looked at, so stage 1's groups across a node boundary were priced
    on NVLink)."""
    places = expert_group_placements(layout, ge, layout.ep * layout.etp, profile.node_gpus)
    return profile.internode if any(len(p) > 1 for p in places) else profile.nvlink


def _expert_path(layout: Layout, ge: int, profile: HardwareProfile) -> _Path:
    return _path(profile, layout, expert_dp_link(layout, ge, profile), ge, layout.ep * layout.etp)


@dataclass(frozen=True)
class GradSync:
    link: str  # nvlink | internode
    layer_grad: float  # one layer's gradient bucket
    embedding_grad: float  # the embedding's bucket (the first or single stage), after the embedding's backward
    all_grads: float  # every gradient in one collective
    layer_gather: float  # ZeRO >= 1: one layer's working weights all-gathered
    gather_in_backward: bool = False  # ZeRO-3 gathers again before each layer's backward
    overlapped: bool = True  # buckets reduced beside the backward; False: all at once after it
    # the multi-token-prediction modules' gradients (the last stage's, with its head bucket; on a pipeline with an
    # untied embedding, the embedding copy the modules read there too)
    mtp_grad: float = 0.0
    shared_embedding: float = 0.0  # `shared_embedding_seconds`: the first and last stages' sum of its gradients
    mtp_gather: float = 0.0  # ZeRO >= 1: the multi-token-prediction modules' working weights all-gathered, once
    shared_embedding_link: str = "nvlink"
    head_grad: float = 0.0  # the head's bucket (the last or single stage), after the last micro-batch's head
    embedding_gather: float = 0.0  # ZeRO >= 1: the embedding's working weights all-gathered (first or single stage)
    head_gather: float = 0.0  # ZeRO >= 1: the head's (last or single stage), before the head (twice where the
    # flavour regathers it for the head's backward: module docs)
    # ZeRO-1/2 gathering at the end of the optimizer step (``layout.param_gather`` after_step): every weight of the
    # GPU in one blocking collective after the step, before the next forward; the unit gathers above are 0 then
    step_gather: float = 0.0
    embedding_kept: bool = False  # the embedding's unit kept from its forward to its backward (FSDP2's tied unit)
    # FSDP2's copies on the compute stream (``Layout.fsdp_copies``: torch/distributed/fsdp/_fully_shard's
    # wait_for_unshard -> foreach_all_gather_copy_out, torch.ops.fsdp.split_with_sizes_copy, and foreach_reduce ->
    # foreach_reduce_scatter_copy_in, chunk_cat into the reduce dtype, both on the current stream): one layer's
    # gathered weights copied out of the all-gather's buffer before each forward or backward that gathers them (read
    # and write, the gather's width), and its gradients copied into the reduce-scatter's input before each reduction
    # (read at the weights' width, written at the reduction's); seconds on the compute stream. The embedding's and
    # the head's units' copies, and a pipeline stage's (gathered once a step beside stages), are not priced
    layer_copy_out: float = 0.0
    layer_copy_in: float = 0.0

    @property
    def active(self) -> bool:
        return self.layer_grad > 0

    def end_bucket(self, stage: int, pp: int) -> float:
        """The bucket an end stage of ``pp`` reduces once its whole backward is done, where it does not go out
        earlier: the embedding's on the first stage, the head's (with the modules') on the last, both on a single
        stage (SPPO's pp 1: a review found its head's bucket left out); 0 in between."""
        return ((self.embedding_grad if stage == 0 else 0.0)
                + (self.head_grad + self.mtp_grad if stage == pp - 1 else 0.0))


def shares_embedding(model: ModelConfig, layout: Layout) -> bool:
    """Whether the first and last pipeline stages both hold the embedding (module docs)."""
    return layout.pp > 1 and (model.tied_embeddings or model.mtp_layers > 0)


def shared_embedding_seconds(model: ModelConfig, layout: Layout, profile: HardwareProfile) -> tuple[float, str]:
    """Seconds and link of summing the embedding's gradient (its V x h / TP elements at the recipe's
    gradient-reduction width) between a first-stage GPU and its last-stage peer, an all-reduce of two
    ranks (module docs); (0, "nvlink") where the stages share no weight."""
    if not shares_embedding(model, layout):
        return 0.0, "nvlink"
    link = profile.internode if stages_cross_nodes(layout, 0, layout.pp - 1, profile.node_gpus) else profile.nvlink
    nbytes = model.recipe.grad_reduce_bytes * model.vocab * model.hidden / layout.tp
    return coll.allreduce_time(nbytes, 2, *coll.link_params(link, "all_reduce")), coll.link_kind(profile, link)


@memoised(maxsize=1 << 15)
def grad_sync(model: ModelConfig, layout: Layout, profile: HardwareProfile, stride: int | None = None) -> GradSync:
    """``stride``: how far apart the group's ranks are (default TP; a pipeline stage's replicas where the rank
    order puts them, `memo_sim.layout.rank_order.data_group_stride`). Memoised (a pure function; the result is
    frozen): the what-if's estimate and proved bound of every policy and micro-batch size of a layout ask for it."""
    g = layout.state_shards
    link = coll.group_link(profile, g, layout.tp if stride is None else stride, layout.gpus)
    ge = layout.expert_dp if model.moe else 1  # the routed experts' replicas (they have their own group)
    shared, shared_link = shared_embedding_seconds(model, layout, profile)
    if g <= 1 and ge <= 1:
        return GradSync(coll.link_kind(profile, link), 0.0, 0.0, 0.0, 0.0, overlapped=layout.grad_overlap,
                        shared_embedding=shared, shared_embedding_link=shared_link)
    flavour = layout.dp_flavour
    shard = flavour.shard_group(layout)
    if g <= 1:
        gather_path = _Path(profile, link)

        def reduce(nbytes: float) -> float:  # the dense weights have no replicas
            return 0.0
    elif shard != g:  # HSDP (`memo_sim.dp.fsdp`): reduce-scatter over the shard group, all-reduce the shard across replicas
        replicas = g // shard
        s_link = coll.group_link(profile, shard, layout.tp, layout.gpus)
        r_link = coll.group_link(profile, replicas, layout.tp * shard, layout.gpus)
        link = r_link if r_link is profile.internode else s_link
        s_path = _path(profile, layout, s_link, shard, layout.tp)
        r_path = _path(profile, layout, r_link, replicas, layout.tp * shard)

        def reduce(nbytes: float) -> float:
            return (coll.ring_reduce_scatter_time(nbytes, shard, *s_path.params("reduce_scatter"))
                    + coll.allreduce_time(nbytes / shard, replicas, *r_path.params("all_reduce")))
        g, gather_path = shard, s_path  # the weight gathers: the shard group
    else:
        gather_path = _path(profile, layout, link, g, layout.tp)

        def reduce(nbytes: float) -> float:
            return _reduce(layout, nbytes, g, gather_path)

    w, gr = model.recipe.weight_bytes, model.recipe.grad_reduce_bytes
    layer = layer_gpu_params(model, layout)
    layer_p = layer.local - layer.expert_local
    # the embedding's bucket (first or single stage) and the head's (last or single stage: the classifier, or on
    # a pipeline the tied embedding's copy, and the final norm); module docs
    emb_p = model.vocab * model.hidden / layout.tp
    head_p = (model.norm_params + (model.vocab * model.hidden if layout.pp > 1 or not model.tied_embeddings
                                   else 0)) / layout.tp
    every = model_gpu_params(model, layout)
    all_p = every.local - every.expert_local
    gather = _gather(w * layer_p, g, gather_path) if layout.zero >= 1 and g > 1 else 0.0
    layer_r, all_r = reduce(gr * layer_p), reduce(gr * all_p)
    if ge > 1:  # the routed experts over their own replicas, where the expert ranks sit (module docs)
        epath = _expert_path(layout, ge, profile)
        if epath.link is profile.internode:
            link = epath.link
        layer_r += _reduce(layout, gr * layer.expert_local, ge, epath)
        all_r += _reduce(layout, gr * every.expert_local, ge, epath)
        if layout.zero >= 1:
            gather += _gather(w * layer.expert_local, ge, epath)
    # the embedding's and the head's units (module docs; the embedding copy the modules read on the last stage: the
    # head's)
    copy = emb_p if model.mtp_layers and layout.pp > 1 and not model.tied_embeddings else 0.0
    # one stage, a tied embedding under a flavour that keeps the head's unit: one unit with the norm and the head
    tied_unit = (model.tied_embeddings and layout.pp == 1 and layout.zero >= 3
                 and not flavour.regathers_head(layout))
    # one stage, resharded after the embedding's forward: the head (or the modules) gathers the embedding again
    again = emb_p if (layout.pp == 1 and layout.zero >= 3 and flavour.gathers_in_backward(layout) and not tied_unit
                      and (model.tied_embeddings or model.mtp_layers)) else 0.0
    emb_unit, head_unit = (emb_p + head_p, 0.0) if tied_unit else (emb_p, head_p + copy + again)
    emb_g, head_g = ((_gather(w * emb_unit, g, gather_path), _gather(w * head_unit, g, gather_path) if head_unit
                      else 0.0) if layout.zero >= 1 and g > 1 else (0.0, 0.0))
    if layout.zero >= 3 and flavour.regathers_head(layout):
        head_g *= 2  # dropped after the head's forward and gathered again for its backward (the head op holds both)
    mtp_r = mtp_g = 0.0
    if model.mtp_layers:  # the modules' dense and routed parts, each over its own replicas, as the layers'
        mtp = gpu_params(model, layout, model.mtp_params(), model.mtp_routed_params(), model.mtp_replicated_params())
        mtp_r = reduce(gr * (mtp.local - mtp.expert_local + copy))
        if layout.zero >= 1 and g > 1:  # their weights gathered as a layer's are (the embedding copy with the head's)
            mtp_g = _gather(w * (mtp.local - mtp.expert_local), g, gather_path)
        if ge > 1:
            mtp_r += _reduce(layout, gr * mtp.expert_local, ge, epath)
            if layout.zero >= 1:
                mtp_g += _gather(w * mtp.expert_local, ge, epath)
    step_g = 0.0
    if layout.zero in (1, 2) and layout.param_gather == "after_step":  # one collective after the step (module docs)
        step_g = _gather(w * all_p, g, gather_path) if g > 1 else 0.0
        if ge > 1:
            step_g += _gather(w * every.expert_local, ge, epath)
        gather = emb_g = head_g = mtp_g = 0.0
    # the tied unit's gradients, the norm's with the embedding's, go out after the embedding's backward
    emb_r, head_r = (reduce(gr * emb_unit), 0.0) if tied_unit else (reduce(gr * emb_p), reduce(gr * head_p))
    copy_out = copy_in = 0.0
    if layout.fsdp_copies and layout.zero >= 3 and gather > 0:  # FSDP2's (GradSync.layer_copy_out)
        copy_out = memory_bound_op_time(2 * w * layer.local, profile)
        copy_in = memory_bound_op_time((w + gr) * layer.local, profile)
    return GradSync(coll.link_kind(profile, link), layer_r, emb_r,
                    all_r, gather, layout.zero >= 3 and flavour.gathers_in_backward(layout), layout.grad_overlap,
                    mtp_r, shared_embedding=shared, shared_embedding_link=shared_link, mtp_gather=mtp_g,
                    head_grad=head_r, embedding_gather=emb_g, head_gather=head_g, step_gather=step_g,
                    embedding_kept=tied_unit and emb_g > 0, layer_copy_out=copy_out, layer_copy_in=copy_in)
