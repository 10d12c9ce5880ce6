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
and ``dp_mode: fsdp``; single-stage layouts of dense models (pipelines keep ZeRO at most 1, MoE
experts their own expert-data-parallel sharding)."""

from __future__ import annotations

from memo_sim.dp.base import DPFlavour
from memo_sim.dp.registry import DP_FLAVOURS


class Fsdp(DPFlavour):
    name = "fsdp"
    label_part = "fsdp"

    def shard_group(self, layout) -> int:
        return layout.fsdp_shard or layout.state_shards

    def gathers_in_backward(self, layout) -> bool:
        return layout.reshard_after_forward

    def gathered_layers(self, layout, n_layers: int) -> float:
        # resharded: this layer and the next one's prefetch; kept: every layer from its forward to its backward
        return 2.0 if layout.reshard_after_forward else float(n_layers)

    def check(self, layout, model) -> str | None:
        if layout.zero != 3:
            return "FSDP shards weights, gradients and optimizer states: it runs as ZeRO stage 3 (zero 3)"
        if layout.pp > 1:
            return "FSDP is priced for single-stage layouts (pipeline stages keep ZeRO at most 1)"
        if getattr(model, "moe", False):
            return "FSDP is priced for dense models (MoE experts shard over their own expert-data-parallel ranks)"
        s = layout.fsdp_shard
        if s and (s < 2 or layout.state_shards % s):
            return (f"the FSDP shard group ({s}) must divide the {layout.state_shards} ranks that hold the same "
                    f"weights (dp x cp x ulysses) and be at least 2")
        return None


DP_FLAVOURS.add("fsdp", Fsdp())
