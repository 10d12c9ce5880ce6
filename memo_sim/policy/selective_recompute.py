"""Selective recompute (Korthikanti et al. 2022, sec. 5; Megatron-LM ``--recompute-granularity
selective``): keep every skeletal tensor but the attention core's, re-run the attention core
(scores, softmax, dropout, attention over V) of each layer before its backward.

Memory: store-all's without the score-sized tensors (``sk["scores"]``: with materialised
attention the softmax output, dropout mask and dropped probabilities, which the recompute
rebuilds as transients; FlashAttention keeps none, so there it is store-all's). Time: store-all's
plus one forward of each layer's attention kernel (with ring CP, its K/V exchange beside it)
before the backward.
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.layer_time import forward_costs
from memo_sim.policy.registry import register
from memo_sim.policy.store_all import StoreAll, megatron_layer_why_not


@register
class SelectiveRecompute(StoreAll):
    name = "selective_recompute"
    summary = "keep every layer's skeletal activations; re-run each layer's attention core before its backward"

    @staticmethod
    def own_layout_why_not(layout) -> str | None:
        # Megatron-LM's attention core, re-run from the kept q, k, v; METP's layer keeps its attention's inputs as
        # blocks on the ring (metp) and memo-exec's METP layer has no core to re-run alone (a review: a hand-made
        # METP plan was refused only after its ranks had started)
        return megatron_layer_why_not(layout, "Megatron-LM's selective recompute re-runs the attention core")

    def kept_scores(self, sk) -> float:
        return 0.0

    # where the output projection keeps a quantised copy of the attention output (TransformerEngine under FP8), the
    # kernel's own output is the checkpointed core's and is not kept: Megatron-LM's selective recompute checkpoints
    # core_attention, whose output only linear_proj (its FP8 copy) saves (`sk["attn_kernel_out"]`; 0 otherwise)
    def resident_bytes(self, sk, n_layers):
        return n_layers * (sk["total"] - sk.get("attn_kernel_out", 0.0))

    # the attention core re-run before the backward rebuilds its lse too: one layer's at a time, from the recompute
    # to the end of its backward (memo_exec/activations/selective_recompute.py counts one layer's), not every layer's
    keeps_lse = False

    def forward_kept(self, sk):
        return [("skeletal", sk["total"] - sk.get("attn_kernel_out", 0.0))] + self.kept_extras(sk)

    def recompute_allocated(self, sk):
        return [("lse", sk["lse"])]

    def buffer_bytes(self, sk):
        return sk["lse"]

    def layer_blocks(self, sk):
        return [("skeletal", sk["total"] - sk.get("attn_kernel_out", 0.0))]

    def recomputes_layer(self, layer, n_layers):
        return True

    def rebuilt(self) -> tuple:
        return ("scores",), ("attention",)  # the score-sized tensors dropped, the attention core re-run

    def recompute_costs(self, model, layout, batch, seq, profile):
        return [replace(c, phase="recompute") for c in forward_costs(model, layout, batch, seq, profile)
                if c.kind == "attention" or c.stream == "cp_comm"]
