"""Selective recompute (Korthikanti et al. 2022, sec. 5; Megatron-LM ``--recompute-granularity
selective``): keep every skeletal tensor but the attention core's, re-run the attention core
(scores, softmax, dropout, attention over V) of each layer before its backward.

Memory is store-all's in memo's accounting: the score-sized tensors selective recompute drops are
the ones the footprint does not count as kept under store-all either (`memo_sim.cost.attention_kernel`
with materialised attention; FlashAttention keeps none). Time: store-all's plus one forward of
each layer's attention kernel (with ring CP, its K/V exchange beside it) before the backward.
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.layer_time import forward_costs
from memo_sim.policy.registry import register
from memo_sim.policy.store_all import StoreAll


@register
class SelectiveRecompute(StoreAll):
    name = "selective_recompute"
    summary = "keep every layer's skeletal activations; re-run each layer's attention core before its backward"

    def recomputes_layer(self, layer, n_layers):
        return True

    def recompute_costs(self, model, layout, batch, seq, profile):
        return [replace(c, phase="recompute") for c in forward_costs(model, layout, batch, seq, profile)
                if c.kind == "attention" or c.stream == "cp_comm"]
