"""Full recompute (activation checkpointing): keep each layer's input, re-run the whole layer
forward before its backward into one shared buffer.

The attention lse is not kept across layers (``keeps_lse`` False): the recompute re-runs the attention
and rebuilds it, so one layer's lse lives from its recompute to the end of its backward, beside the
recomputed tensors (`recompute_allocated`), as memo-exec holds it (memo_exec/activations/full_recompute.py
``after_forward`` drops it, ``device_bytes`` counts one layer's) and as Megatron-LM's full recompute
(tensor_parallel.checkpoint, which saves the layer input alone) does."""

from __future__ import annotations

from memo_sim.cost.layer_time import full_recompute_costs
from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register


@register
class FullRecompute(Policy):
    name = "full_recompute"
    recomputes_attention = True
    keeps_lse = False  # rebuilt by the recompute (module docs)
    summary = "keep layer inputs; re-run each layer's forward before its backward"
    ep_overlap_refusal = "Megatron-Core asserts 'disable full recomputation when enabling overlap_moe_expert_parallel_comm'"

    @property
    def recompute_fraction(self) -> float:
        return 1.0

    def recomputes_layer(self, layer, n_layers):
        return True

    def recompute_costs(self, model, layout, batch, seq, profile):
        return full_recompute_costs(model, layout, batch, seq, profile)

    def resident_bytes(self, sk, n_layers):
        return n_layers * sk["input"]

    def buffer_bytes(self, sk):
        # one layer's other skeletal tensors rebuilt at a time (its input is already resident) and its rebuilt lse
        return sum(b for _n, b in self.recompute_allocated(sk))

    def forward_kept(self, sk):
        return [("input", sk["input"])] + self.kept_lse(sk) + self.kept_extras(sk)

    def recompute_allocated(self, sk):
        # the recomputed tensors and the lse the recompute's attention rebuilds (and a saved weight copy its GEMMs
        # make again: `rebuilt_extras`), freed after the backward
        return [("recomputed", sk["total"] - sk["input"]), ("lse", sk["lse"])] + self.rebuilt_extras(sk)

    def layer_blocks(self, sk):
        return [("input", sk["input"])]

    def shared_blocks(self, sk, steps, n_layers):
        # the one recompute buffer (the recomputed tensors and one layer's lse, `recompute_allocated`); the input is
        # each layer's own block (memo-exec's work buffer holds every skeletal tensor but x: ``_work_names``)
        return [("recompute_buffer", self.buffer_bytes(sk), steps.bwd(n_layers - 1), steps.end_of_backward)]
