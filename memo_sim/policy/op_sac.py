"""torchtitan's per-op selective activation checkpointing (``--activation_checkpoint.mode selective
--activation_checkpoint.selective_ac_option op`` at 9dec370, ``SelectiveAC.Config()`` at b5bcd76c: the default of its
Llama, Qwen3 and DeepSeek-V3 configs): each block runs under ``torch.utils.checkpoint`` with a policy that saves the
outputs of every ``nn.Linear``'s GEMM but every second one, of the attention kernels, the reduce-scatters, the
all-to-alls and topk, and re-runs every other op before the block's backward. What it saves of a layer is
`memo_sim.cost.op_sac_saves` (the rules, read in both versions' sources) and `memo_sim.cost.activations._op_sac_bytes`
(their bytes); this module prices the time.

In a dense Llama block the linears run in the order wq, wk, wv, wo, w1, w3, w2, so wk, wo and w3 re-run (their
share of memo's fused qkv and fc1 GEMMs); in latent attention wq_a, wq_b, wkv_a, wkv_b, wo re-run wq_b and wkv_b,
and the shared experts' w1, w3, w2 after them re-run w1 and w2; the MoE router's gate and the routed experts' grouped
GEMMs re-run whole (`memo_sim.cost.op_sac_saves`). Re-run too: the norms (with their sequence-parallel all-gathers),
the rotary embedding, the first residual add, the activations, and a MoE block's routing scores, permutes, the
experts' activation and the combine's weighting; the all-to-alls' and the reduce-scatters' outputs are saved, so no
token exchange and no reduce-scatter runs again (an all-reduce of TP without sequence parallelism does). Recomputation
stops after the last tensor the backward needs (PyTorch's non-reentrant checkpoint stops early, as at 9dec370), so
the last residual add does not re-run (torchtitan today passes early_stop=False, which re-runs it too: one
elementwise op, not priced). torchtitan's exports write it as ``SelectiveAC.Config()``.

Under a quantised GEMM format the same linears' outputs are kept: torchao's training linears run their GEMM as
``torch.mm`` on tensor-subclass operands (Float8Linear's ``manual_float8_matmul_with_args_in_float8`` at eab345c and
``matmul_with_hp_or_float8_args`` at 36027d82, MXFP8Linear's ``mx_mm`` in torchao/prototype/moe_training/
mxfp8_linear.py), whose ``__torch_dispatch__`` calls ``_scaled_mm``; the checkpoint's dispatch mode sees the ``aten.mm``
before the subclass does (a mode runs before a subclass), so it counts and saves them as bf16 GEMMs, and under
torch.compile the nodes the subclass traces inherit the mode's tag. What the casts leave: where the framework's
library saves the casts' outputs for the backward (``fp8_saved_inputs``, ``fp8_weights_saved``: torchao eab345c),
they are not on the save list and the recompute makes them again, for the kept GEMMs too (`saved_gemm_casts`; the
weight copy is a rebuilt extra, not a kept one), and where the save list names aten.abs (``fp8_abs_saved``: 9dec370's
``_save_list`` keeps aten.abs and aten.max 'for low precision training'), each cast's abs output is kept
(`memo_sim.cost.activations.op_sac_abs_bytes`); torchtitan at b5bcd76c keeps aten.max (a scalar) and not abs. Not
priced: the recompute's casts of the re-run GEMMs take no amax pass where the save list keeps it (priced with one).
``nvfp4`` is refused: torchao's NVFP4Linear runs its GEMMs as Triton kernels (nvfp4_mm_triton), no aten op the save
list names. Refused too: Ulysses (torchtitan has none; its all-to-alls would be on the b5bcd76c list), a MoE token
dispatcher other than the all-to-all (torchtitan's standard backend; the save list's DeepEP and HybridEP entries are
not priced) and expert tensor parallelism (torchtitan has none). memo's executor does not run it (its registry
refuses the policy in one line).
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost import op_sac_saves
from memo_sim.cost.gemm_format import cast_seconds, weight_use_cast_seconds
from memo_sim.cost.layer_time import forward_costs, gemm_cast_shards, gemm_shape
from memo_sim.cost.opcost import OpCost, base_op_name
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import forward_ops
from memo_sim.policy.recompute_modules import RecomputeModules
from memo_sim.policy.registry import register

# the quantised formats whose torchao training linears present their GEMM to the checkpoint as aten.mm (module docs)
SUBCLASS_LINEAR_FORMATS = ("fp8-tensorwise", "fp8-rowwise", "mxfp8")


def saved_gemm_casts(model: ModelConfig, layout, batch: int, seq: int, profile) -> list[OpCost]:
    """The casts the recompute makes again for the GEMMs whose outputs the save list keeps (their share of each
    linear GEMM, `memo_sim.cost.op_sac_saves.gemm_kept_shares`: wq and wv of the qkv projection, w1 of a gated fc1,
    w2, ...), where the framework's library saves what the casts make for the GEMM's backward: the input's quantised
    copy (``fp8_saved_inputs``; its amax kept, so one read and one write) and the weight's (``fp8_weights_saved``).
    None where the library keeps the high-precision tensors and casts them in the backward (torchao at 36027d82), or
    under bf16."""
    if not (model.gemm.quantised and (model.fp8_saved_inputs or model.fp8_weights_saved)):
        return []
    kept_shares, out = op_sac_saves.gemm_kept_shares(model), []
    for op in forward_ops(model):
        kept = kept_shares.get(op.name, 0.0)
        if op.kind != "gemm" or op.scope != "tp" or kept == 0:
            continue
        m, k, n = gemm_shape(op, layout, batch, seq)
        # a column-parallel GEMM's input cast on the rank's sequence shard before its all-gather, as the forward does
        shards = gemm_cast_shards(op, model, layout, "fwd")
        t = cast_seconds(model, profile, m * k * kept / shards, amax_fused=True) if model.fp8_saved_inputs else 0.0
        t += weight_use_cast_seconds(model, profile, k * n * kept, "recompute") if model.fp8_weights_saved else 0.0
        if t > 0:
            out.append(OpCost(f"{op.name}_cast", "elementwise", "recompute", "compute", t))
    return out


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
        if model.gemm.quantised and model.gemm_format not in SUBCLASS_LINEAR_FORMATS:
            return (f"op_sac under {model.gemm_format} GEMMs is not priced: it is priced where torchao's linears run "
                    f"their GEMMs as aten.mm on tensor subclasses ({', '.join(SUBCLASS_LINEAR_FORMATS)}), which the "
                    f"save list sees; NVFP4Linear runs Triton kernels, which it does not")
        return None

    @staticmethod
    def own_layout_why_not(layout) -> str | None:
        why = RecomputeModules.own_layout_why_not(layout)
        if why:
            return why
        if layout.ulysses > 1:
            return ("op_sac is torchtitan's per-op checkpointing, and torchtitan has no Ulysses: its save list over "
                    "Ulysses' all-to-alls is not priced; use context parallelism (--cp) or another policy")
        if layout.ep > 1 and layout.moe_dispatcher != "alltoall":
            return (f"op_sac is priced with torchtitan's all-to-all token dispatch (its exchanges' outputs on the save "
                    f"list), not the {layout.moe_dispatcher} dispatcher: use --moe-dispatcher alltoall or another "
                    f"policy")
        if layout.etp > 1:
            return ("op_sac is priced for torchtitan's MoE layers, which have no expert tensor parallelism: use "
                    "--etp 1 or another policy")
        return None

    def rebuilt(self) -> tuple:
        return ("op_sac_dropped",), ("save_list",)  # its save list's complement, re-run (`memo_sim.cost.op_sac_saves`)

    def dropped(self, sk) -> float:
        return sk.get("op_sac_dropped", 0.0) - sk.get("op_sac_extra", 0.0)  # net of w2's output, which it keeps

    def recompute_allocated(self, sk):
        # and what eager norms and activations save inside the re-run ops (`rebuilt_extras`; none when compiled)
        return [("recomputed", sk.get("op_sac_dropped", 0.0))] + self.rebuilt_extras(sk)

    def buffer_bytes(self, sk):
        return sum(b for _n, b in self.recompute_allocated(sk))  # one layer's rebuilt tensors at a time

    def shared_blocks(self, sk, steps, n_layers):
        return [("recompute_buffer", self.buffer_bytes(sk), steps.bwd(n_layers - 1), steps.end_of_backward)]

    def _extras(self, sk):
        # the quantised weight copy a library saves for the backward is a cast's output, not on the save list: the
        # recompute makes it again (module docs)
        return tuple((n, b, True if n == "fp8_weights" else rebuilt) for n, b, rebuilt in super()._extras(sk))

    def recompute_costs(self, model, layout, batch, seq, profile):
        kept = op_sac_saves.gemm_kept_shares(model)
        out = []
        for c in forward_costs(model, layout, batch, seq, profile):
            name = base_op_name(c.name)  # async TP prices a GEMM in parts (`memo_sim.cost.opcost`)
            if c.kind == "collective":  # the TP all-gathers and all-reduces; saved: reduce-scatters, all-to-alls
                if c.name.startswith(op_sac_saves.RERUN_COLLECTIVES):
                    out.append(replace(c, phase="recompute"))
            elif c.kind == "attention" or name in op_sac_saves.NOT_RERUN:
                continue
            elif kept.get(name, 0.0) < 1.0:  # a GEMM's re-run share, or an op the list does not name
                f = 1.0 - kept.get(name, 0.0)
                out.append(replace(c, phase="recompute", seconds=c.seconds * f, flops=c.flops * f, nbytes=c.nbytes * f))
        return out + saved_gemm_casts(model, layout, batch, seq, profile)
