"""FSDP as PyTorch's ``fully_shard`` (FSDP2) and torchtitan run it: parameters, gradients and
optimizer states sharded over a shard group (``layout.fsdp_shard``; 0: the whole data group), the
shard group's copies kept in step by HSDP's all-reduce across the replicate group
(``data_parallel_replicate_degree``); each layer (a ``fully_shard`` unit) all-gathers its weights
before its forward, the next layer's gather prefetched; with ``reshard_after_forward`` (the
default, torchtitan's "default" for every block but the last) the gathered weights are freed
after the forward and gathered again before the backward, without it (torchtitan "never",
FSDP2 ``reshard_after_forward=False``, ZeRO-2-like) every layer keeps them from its forward to
its backward. Gradients are reduce-scattered over the shard group after each layer's backward
(then all-reduced over the replicas under HSDP). Represented with ZeRO stage 3 (what is sharded)
and ``dp_mode: fsdp``. A mixture of experts shards as torchtitan's does: the dense weights over the
data group (dp x cp x ulysses), the routed experts over their expert-data-parallel ranks
(``layout.expert_dp``, torchtitan's ``efsdp``), each gathered and reduce-scattered over its own
group (`memo_sim.cost.grad_sync`, `memo_sim.cost.param_split`, as ZeRO 3 prices them); HSDP with
experts is refused (their shard and replicate groups are not modelled).

Beside pipeline stages FSDP runs as torchtitan runs it (its ``apply_fsdp`` at 9dec370 and since:
``reshard_after_forward=False`` for every block when pipelining is on, "to avoid per-microbatch
all-gathers"), with ``torch.distributed.pipelining`` driving the backward: each stage's backward
runs with gradient sync off and, after its last micro-batch, the stage calls FSDP's post-backward
for every parameter group at once (``backward_maybe_with_nosync`` in torch 2.6, the
``REDUCE_GRAD`` action since). So a stage gathers each layer's weights once, at its first
micro-batch's forward, keeps them and its whole gradients (accumulated in the reduce dtype:
FSDP2 casts an unsharded gradient to ``reduce_dtype`` to accumulate it while sync is off,
``FSDPParam.to_accumulated_grad_if_needed``) until its last backward, and reduce-scatters a
chunk's gradients after that chunk's last backward, not beside it; only the optimizer states and
the fp32 master weights stay sharded. HSDP and resharding after the forward are refused there."""

from __future__ import annotations

from memo_sim.dp.base import DPFlavour
from memo_sim.dp.registry import DP_FLAVOURS


class Fsdp(DPFlavour):
    name = "fsdp"
    label_part = "fsdp"
    # fully_shard keeps the sharded parameters in their own dtype (fp32: torchtitan builds the model in fp32) and
    # casts them to MixedPrecisionPolicy.param_dtype (bf16) as it all-gathers them: the fp32 shard is the master and
    # no bf16 shard is kept (torch/distributed/fsdp/_fully_shard/_fsdp_param.py; torchtitan's
    # training.mixed_precision_param); Adam's moments and the fp32 gradients (reduce_dtype) are sharded beside it
    shards_working_weights = False

    def shard_group(self, layout) -> int:
        return layout.fsdp_shard or layout.state_shards

    def gathers_in_backward(self, layout) -> bool:
        return layout.reshard_after_forward

    def regathers_head(self, layout) -> bool:
        # torchtitan's [norm, output] unit is resharded after the forward only under its "always" policy, which memo
        # does not price: "do not reshard_after_forward the last layers ... since FSDP would prefetch them immediately"
        return False

    def gathered_layers(self, layout, n_layers: int) -> float:
        # resharded: this layer and the next one's prefetch; kept: every layer from its forward to its backward
        return 2.0 if layout.reshard_after_forward else float(n_layers)

    def check(self, layout, model) -> str | None:
        if layout.zero != 3:
            return "FSDP shards weights, gradients and optimizer states: it runs as ZeRO stage 3 (zero 3)"
        s = layout.fsdp_shard
        if getattr(model, "moe", False) and s and s != layout.state_shards:
            return ("HSDP (an FSDP shard group smaller than the data group) is priced for dense models: a mixture of "
                    "experts' routed experts shard over their own expert-data-parallel ranks; shard over the whole "
                    "data group (fsdp_shard 0)")
        if s and (s < 2 or layout.state_shards % s):
            return (f"the FSDP shard group ({s}) must divide the {layout.state_shards} ranks that hold the same "
                    f"weights (dp x cp x ulysses) and be at least 2")
        return None

    reduces_after_chunk = True

    def pipeline_why_not(self, layout) -> str | None:
        if layout.reshard_after_forward:
            return ("FSDP beside pipeline stages runs as torchtitan runs it, without resharding after the forward "
                    "(reshard_after_forward off): per-micro-batch all-gathers are not priced")
        if layout.fsdp_shard and layout.fsdp_shard != layout.state_shards:
            return "HSDP (an FSDP shard group smaller than the data group) is not priced beside pipeline stages"
        return None

    def pipeline_grad_bytes(self, recipe) -> int:
        return recipe.grad_reduce_bytes


DP_FLAVOURS.add("fsdp", Fsdp())
