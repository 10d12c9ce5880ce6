"""Megatron-LM's fine-grained activation offloading (``--fine-grained-activation-offloading --offload-modules ...``,
TransformerConfig ``fine_grained_activation_offloading`` / ``offload_modules`` at d98e8a64;
megatron/core/pipeline_parallel/fine_grained_activation_offload.py; docs/user-guide/features/
fine_grained_activation_offloading.md): keep every skeletal tensor on the GPU but those the named modules save,
which go to pinned host memory after the layer's forward and come back before its backward. One policy per module
set memo prices (as `memo_sim.policy.recompute_modules` registers one per --recompute-modules set):

- ``offload_attn`` (``core_attn attn_proj``, the documented attention pair; attn_proj needs core_attn): the
  attention kernel's q, k, v and the output projection's input (the kernel's output, and its quantised copy under
  FP8) of every layer;
- ``offload_attn_experts`` (``core_attn attn_proj expert_fc1``, the documentation's MoE example): those and the
  experts' first GEMM's input, the dispatched tokens (mixture-of-experts models only);
- ``offload_attn_experts_recompute``: ``offload_attn_experts`` beside ``--recompute-modules layernorm moe_act`` (the
  documentation's pairing of the two, `memo_sim.policy.recompute_modules.RecomputeNormAct`'s recompute).

The tensors of each module are `memo_sim.cost.activations.OFFLOAD_GROUPS`' (``sk["offload_<module>"]``). Memory:
store all's minus the offloaded bytes of every layer, plus two buffers of one layer's copies, which hold what is
being copied out and what is being brought back; the last two layers' stay there until their backward. Megatron
copies a tensor once for each group that saves it (`ModelConfig.offload_copies_per_group`: the attention output,
the kernel's and the projection's, goes out and back twice, its GPU bytes freed once; memo-exec moves it once).
Time: store all's, with one layer's copies on the offload and prefetch streams beside the compute, waited for by
the rule every offloading policy shares (`memo_sim.policy.rounding_buffers`).

What Megatron does otherwise, not priced: it starts a group's copy as soon as the module's forward ends (memo: at
the layer's end, beside the next layer's forward) and allocates the reloaded tensors from the caching allocator
(memo: two buffers); it keeps the last group of each module name on the GPU (one layer, against memo's two kept
layers); its ``--min-offloaded-tensor-size`` (1M elements) leaves smaller tensors on the GPU (memo offloads the
group's tensors whatever their size and keeps the attention lse, which core_attn's group holds too, on the GPU);
its ``--activation-offload-fraction`` (default 1, every eligible group) and ``--delta-offload-bytes-across-pp-ranks``
(default 0) are taken at their defaults; a D2H copy slower than the next layer's forward holds its source's memory
longer in Megatron (no wait on the main stream unless --fine-grained-offloading-max-inflight-offloads is set) where
memo's rule makes the compute wait.

Megatron's tensor-parallel layer with a fused attention kernel only (`layout_why_not`). memo's executor runs
``offload_attn`` (`memo_exec.activations.offload_modules`, so memo's own stack, the framework ``any``, offers it) and
refuses the two MoE sets in one line (its MoE block keeps the dispatched tokens in its autograd graph);
`memo-sim export --to megatron` writes each as Megatron-LM's options.
"""

from __future__ import annotations

from typing import ClassVar

from memo_sim.cost.activations import layer_rows, offload_module_tensors, saved_bytes, saved_tensors, skeletal_bytes
from memo_sim.policy.host_layout import OffloadedTensor
from memo_sim.policy.recompute_modules import RecomputeNormAct
from memo_sim.policy.registry import register
from memo_sim.policy.rounding_buffers import N_BUFFERS
from memo_sim.policy.store_all import StoreAll, megatron_layer_why_not


class OffloadModules(StoreAll):
    """Store all, less the named modules' saved tensors, which go to host through two buffers."""

    offloads = True
    offloaded_roles = ()  # by module (`offloaded_tensors`), not by MEMO role
    offload_modules: ClassVar[tuple[str, ...]] = ()  # its --offload-modules words (`memo_sim.export.megatron`)
    ep_overlap_ok = False  # Megatron-Core runs its offloads beside the overlap; memo lays no copy inside a merged step

    @staticmethod
    def own_layout_why_not(layout) -> str | None:
        if why := megatron_layer_why_not(layout, "Megatron-LM's --offload-modules mark parts"):
            return why
        if layout.attention == "materialised":
            return ("Megatron-LM's core_attn offload is priced with a fused attention kernel (the score-sized tensors "
                    "of materialised attention are not token-wise): plan with --attention flash or cudnn")
        return None

    def offloaded_names(self, model) -> tuple[str, ...]:
        """The saved tensors of one layer the modules' groups copy to host (`offload_module_tensors`; what memo-exec
        moves, `memo_exec.activations.offload_modules`)."""
        return tuple(dict.fromkeys(n for m in self.offload_modules for n in offload_module_tensors(model, m)))

    def offloaded(self, sk) -> float:
        """One layer's GPU bytes the modules' groups send to host (each tensor once: the GPU frees it once)."""
        return sum(sk.get(f"offload_{m}", 0.0) for m in self.offload_modules)

    def shares_attention_output(self) -> bool:
        """Whether both groups that save the attention output (the kernel's and the projection's) are offloaded."""
        return {"core_attn", "attn_proj"} <= set(self.offload_modules)

    def copied(self, sk) -> float:
        """One layer's bytes the groups copy to host and back: `offloaded`, and the attention output a second time
        where both its groups are offloaded and the framework copies per group (``sk["offload_shared_copy"]``)."""
        return self.offloaded(sk) + (sk.get("offload_shared_copy", 0.0) if self.shares_attention_output() else 0.0)

    def behaviour(self, n_layers: int) -> tuple:
        return super().behaviour(n_layers) + (self.offload_modules,)

    def offloaded_tensors(self, model, layout, batch, seq):
        # every token row of each tensor the groups hold, at the bytes the layer keeps of it (`saved_bytes`: a routed
        # tensor's busiest-rank load, Ulysses' kept repeats), and the attention output's second copy where the
        # framework makes one: the copies move `copied`'s bytes
        rows = layer_rows(layout, batch, seq)
        names = self.offloaded_names(model)
        out = []
        for t in saved_tensors(model, layout):
            if t.name in names and (b := saved_bytes(t, model, layout, batch, seq)) > 0:
                out.append(OffloadedTensor(t.name, rows, b / rows))
        dup = skeletal_bytes(model, layout, batch, seq)["offload_shared_copy"] if self.shares_attention_output() else 0
        if dup > 0:  # the attention output's second copy, the projection group's (`copied`)
            out.append(OffloadedTensor("attn_proj_input", rows, dup / rows))
        return out

    def not_kept(self, sk) -> float:
        return self.offloaded(sk)  # the rest is store all's (`StoreAll.resident_bytes`, `forward_kept`, `layer_blocks`)

    def buffer_bytes(self, sk):
        # what is on its way out and what is brought back (a reloaded group's tensors are its own, the attention
        # output's twice where both its groups copy it)
        return N_BUFFERS * self.copied(sk)

    def static_gpu(self, sk):
        return [("offload_buffers", N_BUFFERS * self.copied(sk))]  # (a recompute buffer beside them is not static)

    def shared_blocks(self, sk, steps, n_layers):
        return [(f"offload_buffer{b}", self.copied(sk), steps.fwd(b), steps.end_of_backward)
                for b in range(N_BUFFERS)]

    def pipeline_rank_blocks(self, sk):
        # a pipeline rank's forward and prefetch buffers, shared by its micro-batches in flight, as full offload's
        return [(f"offload_{kind}{b}", self.copied(sk)) for kind in ("forward", "prefetch") for b in range(N_BUFFERS)]


@register
class OffloadAttn(OffloadModules):
    name = "offload_attn"
    summary = "keep the skeletal activations but the attention's q, k, v and output, copied to host (Megatron)"
    needs_experts = False
    offload_modules = ("core_attn", "attn_proj")


@register
class OffloadAttnExperts(OffloadModules):
    name = "offload_attn_experts"
    summary = ("keep the skeletal activations but the attention's q, k, v and output and the experts' dispatched "
               "tokens, copied to host (Megatron)")
    needs_experts = True
    offload_modules = ("core_attn", "attn_proj", "expert_fc1")


@register
class OffloadAttnExpertsRecompute(OffloadModules, RecomputeNormAct):
    """The documentation's MoE pair of offload and recompute (``--recompute-granularity selective --recompute-modules
    layernorm moe_act --fine-grained-activation-offloading --offload-modules core_attn attn_proj expert_fc1``): the
    offloaded groups go to host as `OffloadAttnExperts` moves them and the norms' and the experts' activation outputs
    are rebuilt before each backward as `memo_sim.policy.recompute_modules.RecomputeNormAct` rebuilds them (disjoint
    tensors); the rest is store all's."""

    name = "offload_attn_experts_recompute"
    summary = ("copy the attention's q, k, v and output and the experts' dispatched tokens to host and re-run the norms "
               "and the experts' activation (Megatron's documented MoE pair)")
    needs_experts = True
    offload_modules = ("core_attn", "attn_proj", "expert_fc1")

    def not_kept(self, sk) -> float:
        return self.offloaded(sk) + self.dropped(sk)

    def buffer_bytes(self, sk):
        # the offload buffers and the one-layer recompute buffer (`RecomputeModules.buffer_bytes`)
        return OffloadModules.buffer_bytes(self, sk) + RecomputeNormAct.buffer_bytes(self, sk)

    def shared_blocks(self, sk, steps, n_layers):
        return (OffloadModules.shared_blocks(self, sk, steps, n_layers)
                + RecomputeNormAct.shared_blocks(self, sk, steps, n_layers))

    def pipeline_rank_blocks(self, sk):
        # the rank's offload buffers and its one recompute buffer (as checkpoint offload's: a review found the
        # pipeline's analytic peak without it, below the event simulator's)
        return OffloadModules.pipeline_rank_blocks(self, sk) + [("recompute_buffer", self.backward_buffer_bytes(sk))]
