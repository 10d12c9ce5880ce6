"""torchtitan's per-op selective activation checkpointing (``--activation_checkpoint.mode selective
--activation_checkpoint.selective_ac_option op``; torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py
``_save_list`` and ``_custom_policy``, the default of its Llama configs): each block runs under
``torch.utils.checkpoint`` with a policy that saves the output of every ``aten.mm`` but every second one, of the
SDPA kernels and of the reduce-scatters, and recomputes every other op before the block's backward.

In a dense Llama block the linear GEMMs run in the order wq, wk, wv, wo, w1, w3, w2 (w1, w2 without a gate), so
the outputs of wq, wv, w1 and w2 are kept and wk, wo and w3 re-run; the attention output and its log-sum-exp are
kept; the norms, the rotary embedding (of wq's kept output and wk's re-run one), the residual adds and the
activation re-run. Memory: store-all's skeletal bytes without ln1, k,
h1, ln2, act and the up half of fc1, with w2's output (which store-all does not keep) added
(`memo_sim.cost.activations.OP_SAC_DROPPED`). Time: store-all's plus, before each layer's backward, the norms (with
their sequence-parallel all-gathers), wk's and w3's share of the fused qkv and fc1 GEMMs, the rotary op, the output
projection (with its reduce), the residual add and the activation (`recompute_costs`). Recomputation stops after
the last tensor the backward needs (PyTorch's non-reentrant checkpoint stops early, as at 9dec370), so the last
residual add does not re-run (torchtitan today passes early_stop=False, which re-runs it too: one elementwise op,
not priced). torchtitan's exports write it as ``SelectiveAC.Config()``.

Dense models with standard attention only (`model_why_not`): under a quantised GEMM format torchao's Float8Linear
calls ``_scaled_mm``, not ``aten.mm``, so the save list keeps no linear output but its ``abs`` passes' outputs,
which memo does not price; MoE and latent-attention blocks order their GEMMs otherwise. memo's executor does not
run it (its registry refuses the policy in one line).
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.layer_time import forward_costs
from memo_sim.cost.opcost import base_op_name
from memo_sim.model.config import ModelConfig
from memo_sim.policy.recompute_modules import RecomputeModules
from memo_sim.policy.registry import register

# the ops re-run whole before a layer's backward, and the GEMMs re-run in part (their share of the fused GEMM)
_WHOLE = ("ln1", "rope", "out_proj", "add1", "ln2", "act")


@register
class OpSac(RecomputeModules):
    rebuilds_memory_bound_ops = True  # the norms, the residual adds and the activation re-run (module docs)
    name = "op_sac"
    summary = ("torchtitan's per-op selective checkpointing: keep every other GEMM's output and the attention's; "
               "re-run the rest of the layer before its backward")
    needs_experts = False

    @staticmethod
    def model_why_not(model: ModelConfig) -> str | None:
        """Why the policy cannot price ``model`` (None: it can)."""
        if model.moe or model.mla:
            return "op_sac is priced for dense blocks with standard attention (torchtitan's Llama order of GEMMs)"
        if model.gemm.quantised:
            return (f"op_sac under {model.gemm_format} GEMMs is not priced: Float8Linear calls _scaled_mm, so the "
                    f"save list keeps no linear output but its abs passes' outputs")
        return None

    def rebuilt(self) -> tuple:
        return ("op_sac_dropped",), _WHOLE  # its save list's complement, re-run (with the GEMMs' shares)

    def dropped(self, sk) -> float:
        return sk.get("op_sac_dropped", 0.0) - sk.get("op_sac_extra", 0.0)  # net of w2's output, which it keeps

    def recompute_allocated(self, sk):
        # and what eager norms and activations save inside the re-run ops (`rebuilt_extras`; none when compiled)
        return [("recomputed", sk.get("op_sac_dropped", 0.0))] + self.rebuilt_extras(sk)

    def buffer_bytes(self, sk):
        return sum(b for _n, b in self.recompute_allocated(sk))  # one layer's rebuilt tensors at a time

    def shared_blocks(self, sk, steps, n_layers):
        return [("recompute_buffer", self.buffer_bytes(sk), steps.bwd(n_layers - 1), steps.end_of_backward)]

    def recompute_costs(self, model, layout, batch, seq, profile):
        gated = model.ffn_type == "swiglu"
        share = {"qkv": model.kv_dim / (model.q_dim + model.kv_dim + model.v_dim), "fc1": 0.5 if gated else 0.0}
        out = []
        for c in forward_costs(model, layout, batch, seq, profile):
            name = base_op_name(c.name)  # async TP prices a GEMM in parts (`memo_sim.cost.opcost`)
            base = c.name.split("_", 1)[1] if c.kind == "collective" and "_" in c.name else name
            if name in _WHOLE or (c.kind == "collective" and base in ("ln1", "ln2", "out_proj")):
                out.append(replace(c, phase="recompute"))
            elif share.get(name):
                f = share[name]
                out.append(replace(c, phase="recompute", seconds=c.seconds * f, flops=c.flops * f))
        return out
