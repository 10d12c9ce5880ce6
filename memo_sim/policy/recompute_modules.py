"""Megatron-LM's selective recompute of named modules (``--recompute-granularity selective
--recompute-modules ...``, megatron/core/transformer/transformer_config.py ``recompute_modules`` at
d98e8a64): keep every skeletal tensor but those the named modules produce, and re-run those
modules' forward before each layer's backward. One policy per module set memo prices:

- ``recompute_norm_act`` (``layernorm moe_act``): the norms' outputs and the MoE activation's
  (SwiGLU) output are dropped and rebuilt by re-running the norms and the experts' activation (the norms that are
  modules of their own in Megatron's TransformerEngine layer: the pre-MLP norm, and the input norm only under
  multi-latent attention, `memo_sim.model.layer_graph.separate_norms`; a review found both counted for Qwen3's);
- ``recompute_moe`` (``layernorm moe``, the MoE block checkpointed whole): the norms' outputs and
  every tensor the MoE block saves (router probabilities, the dispatched tokens, the experts' and
  shared experts' intermediates) are dropped; the norms and the whole MoE block (router, dispatch,
  expert GEMMs, combine: its all-to-alls too) re-run before the backward.

- ``recompute_mlp`` (``mlp``, for a dense model): the MLP checkpointed whole (Megatron's
  ``CheckpointFunction`` over ``self.mlp``); under TransformerEngine its pre-MLP norm is fused into fc1
  (``TELayerNormColumnParallelLinear``), so the norm's output, fc1's and the activation's are dropped
  and the norm, fc1 with its sequence-parallel all-gather, the activation and fc2 with its
  reduce-scatter re-run before the layer's backward.

Memory: store all's minus the group's bytes (`memo_sim.cost.activations.RECOMPUTE_GROUPS`), which
the recompute allocates again while the layer's backward runs. The first two are for mixture-of-experts
models (``needs_experts``), the third for dense ones (`RecomputeMlp.model_why_not`); the what-if leaves each
out for the other kind. memo's executor runs ``recompute_moe`` (`memo_exec.activations.recompute_moe`) and
``recompute_norm_act`` (`memo_exec.activations.recompute_norm_act`: the MoE block's graph kept but the experts'
activation output, rebuilt when the backward reads it) and ``recompute_mlp`` (`memo_exec.activations.recompute_mlp`:
the MLP's tensors in one shared buffer, the MLP re-run, fc2 with its reduce-scatter too, before each backward).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from memo_sim.cost.layer_time import forward_costs
from memo_sim.cost.opcost import base_op_name
from memo_sim.model.layer_graph import separate_norms
from memo_sim.policy.registry import register
from memo_sim.policy.store_all import StoreAll, megatron_layer_why_not

_MOE_BLOCK_OPS = ("router", "route", "permute", "weight_input", "expert_fc1", "expert_act", "expert_fc2", "unpermute",
                  "shared_fc1", "shared_act", "shared_fc2")


class RecomputeModules(StoreAll):
    """Keep every skeletal tensor but the groups named; re-run the ops that rebuild them."""

    groups: ClassVar[tuple[str, ...]] = ()
    ops: ClassVar[tuple[str, ...]] = ()
    comm_prefixes: ClassVar[tuple[str, ...]] = ()  # collectives re-run with the ops (the MoE block's all-to-alls)
    needs_experts: ClassVar[bool] = True
    megatron_modules: ClassVar[tuple[str, ...]] = ()  # its --recompute-modules words (`memo_sim.export.megatron`)

    @staticmethod
    def own_layout_why_not(layout) -> str | None:
        # the modules are Megatron TP's layer parts (its LayerNormColumnParallelLinear, its MoE layer): METP's layer
        # has none of them, and memo-exec re-runs them in the Megatron layer only (a review found the what-if
        # answering with recompute_mlp on metp_ffn, which memo-exec refused)
        return megatron_layer_why_not(layout, "Megatron-LM's --recompute-modules re-run parts")

    def dropped(self, sk) -> float:
        return sum(sk.get(g, 0.0) for g in self.groups)

    def recomputes_layer(self, layer, n_layers):
        return True

    def rebuilt(self) -> tuple:
        return self.groups, self.ops, self.comm_prefixes

    def recompute_costs(self, model, layout, batch, seq, profile):
        # the norms among the ops: those that are modules of their own (`separate_norms`: an input norm fused into
        # QKV keeps its output and is not re-run)
        ops = tuple(o for o in self.ops if o not in ("ln1", "ln2") or o in separate_norms(model)) \
            if "norms" in self.groups else self.ops
        return [replace(c, phase="recompute") for c in forward_costs(model, layout, batch, seq, profile)
                if base_op_name(c.name) in ops or c.name.startswith(self.comm_prefixes or ("\0",))]

    def not_kept(self, sk) -> float:
        return self.dropped(sk)

    def recompute_allocated(self, sk):
        return [("recomputed", self.dropped(sk))]

    def buffer_bytes(self, sk):
        return self.dropped(sk)  # one layer's rebuilt tensors at a time

    def shared_blocks(self, sk, steps, n_layers):
        return [("recompute_buffer", self.dropped(sk), steps.bwd(n_layers - 1), steps.end_of_backward)]


@register
class RecomputeNormAct(RecomputeModules):
    name = "recompute_norm_act"
    summary = "keep the skeletal activations but the norms' and the MoE activation's outputs; re-run those"
    groups = ("norms", "moe_act")
    ops = ("ln1", "ln2", "expert_act")
    megatron_modules = ("layernorm", "moe_act")


@register
class RecomputeMoe(RecomputeModules):
    name = "recompute_moe"
    summary = "keep the skeletal activations but the norms' and the MoE block's; re-run the norms and the block"
    groups = ("norms", "moe_block")
    ops = ("ln1", "ln2") + _MOE_BLOCK_OPS
    comm_prefixes = ("moe_dispatch", "moe_combine")
    megatron_modules = ("layernorm", "moe")
    ep_overlap_ok = False
    ep_overlap_refusal = ("Megatron-Core asserts 'disable moe in recompute_modules when enabling "
                          "overlap_moe_expert_parallel_comm'")

    def dropped(self, sk) -> float:
        return sk.get("norms", 0.0) + sk.get("moe_block", 0.0)


@register
class RecomputeMlp(RecomputeModules):
    name = "recompute_mlp"
    summary = "keep the skeletal activations but the MLP's (its norm's, fc1's, the activation's); re-run the MLP"
    groups = ("mlp",)
    ops = ("ln2", "fc1", "act", "fc2")
    # fc1's sequence-parallel all-gather and fc2's reduce-scatter, or without SP fc2's all-reduce (a review)
    comm_prefixes = ("allgather_ln2", "reducescatter_fc2", "allreduce_fc2")
    needs_experts = False
    megatron_modules = ("mlp",)

    @staticmethod
    def model_why_not(model) -> str | None:
        if model.moe:
            return (f"recompute_mlp is priced for dense models (every layer's MLP checkpointed): {model.name} is a "
                    f"mixture of experts; use recompute_moe or recompute_norm_act")
        return None
