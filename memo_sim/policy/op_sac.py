"""torchtitan's per-op selective activation checkpointing (``--activation_checkpoint.mode selective
--activation_checkpoint.selective_ac_option op``; torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py
``_save_list`` and ``_custom_policy``, the default of its Llama configs): each block runs under
``torch.utils.checkpoint`` with a policy that saves the output of every ``aten.mm`` but every second one, of the
SDPA kernels and of the reduce-scatters, and recomputes every other op before the block's backward.

In a dense Llama block the linear GEMMs run in the order wq, wk, wv, wo, w1, w3, w2 (w1, w2 without a gate), so
the outputs of wq, wv, w1 and w2 are kept and wk, wo and w3 re-run; the attention output and its log-sum-exp are
kept; the norms, the rotary embedding (of wq's kept output and wk's re-run one), the residual adds and the
activation re-run. Memory: store-all's skeletal bytes without ln1, k,
h1, ln2, act and the up half of fc1, with w2's output (which store-all does not keep) added in eager PyTorch, whose
checkpoint stores what the list names; a compiled block's partitioner saves a tagged output only where the backward
reads it, not w2's (`memo_sim.cost.activations.OP_SAC_DROPPED`, ``_op_sac_bytes``). Time: store-all's plus, before each layer's backward, the norms (with
their sequence-parallel all-gathers), wk's and w3's share of the fused qkv and fc1 GEMMs, the rotary op, the output
projection (with its reduce), the residual add and the activation (`recompute_costs`). Recomputation stops after
the last tensor the backward needs (PyTorch's non-reentrant checkpoint stops early, as at 9dec370), so the last
residual add does not re-run (torchtitan today passes early_stop=False, which re-runs it too: one elementwise op,
not priced). torchtitan's exports write it as ``SelectiveAC.Config()``.

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
list names. MoE and latent-attention blocks order their GEMMs otherwise. memo's executor does not run it (its
registry refuses the policy in one line).
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.gemm_format import cast_seconds, fp8_gather_shards, weight_use_cast_seconds
from memo_sim.cost.layer_time import forward_costs, gemm_shape
from memo_sim.cost.opcost import base_op_name
from memo_sim.cost.opcost import OpCost
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import forward_ops, sp_regathered
from memo_sim.policy.recompute_modules import RecomputeModules
from memo_sim.policy.registry import register

# the ops re-run whole before a layer's backward, and the GEMMs re-run in part (their share of the fused GEMM)
_WHOLE = ("ln1", "rope", "out_proj", "add1", "ln2", "act")
# the quantised formats whose torchao training linears present their GEMM to the checkpoint as aten.mm (module docs)
SUBCLASS_LINEAR_FORMATS = ("fp8-tensorwise", "fp8-rowwise", "mxfp8")


def _rerun_shares(model: ModelConfig) -> dict[str, float]:
    """The share of each fused GEMM the recompute re-runs: wk's of the qkv projection, w3's of a gated fc1."""
    return {"qkv": model.kv_dim / (model.q_dim + model.kv_dim + model.v_dim),
            "fc1": 0.5 if model.ffn_type == "swiglu" else 0.0}


def saved_gemm_casts(model: ModelConfig, layout, batch: int, seq: int, profile) -> list[OpCost]:
    """The casts the recompute makes again for the GEMMs whose outputs the save list keeps (wq and wv of the qkv
    projection, w1 of a gated fc1 (all of fc1 otherwise), w2), where the framework's library saves what the casts make
    for the GEMM's backward: the input's quantised copy (``fp8_saved_inputs``; its amax kept, so one read and one
    write) and the weight's (``fp8_weights_saved``). None where the library keeps the high-precision tensors and casts
    them in the backward (torchao at 36027d82), or under bf16."""
    if not (model.gemm.quantised and (model.fp8_saved_inputs or model.fp8_weights_saved)):
        return []
    share, out = _rerun_shares(model), []
    for op in forward_ops(model):
        if op.kind != "gemm" or op.name == "out_proj" or op.scope != "tp":
            continue
        kept = 1.0 - share.get(op.name, 0.0)
        m, k, n = gemm_shape(op, layout, batch, seq)
        # a column-parallel GEMM's input cast on the rank's sequence shard before its all-gather, as the forward does
        shards = fp8_gather_shards(model, layout, False, "fwd") if op.name in sp_regathered(model) else 1
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
        if model.moe or model.mla:
            return "op_sac is priced for dense blocks with standard attention (torchtitan's Llama order of GEMMs)"
        if model.gemm.quantised and model.gemm_format not in SUBCLASS_LINEAR_FORMATS:
            return (f"op_sac under {model.gemm_format} GEMMs is not priced: it is priced where torchao's linears run "
                    f"their GEMMs as aten.mm on tensor subclasses ({', '.join(SUBCLASS_LINEAR_FORMATS)}), which the "
                    f"save list sees; NVFP4Linear runs Triton kernels, which it does not")
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

    def _extras(self, sk):
        # the quantised weight copy a library saves for the backward is a cast's output, not on the save list: the
        # recompute makes it again (module docs)
        return tuple((n, b, True if n == "fp8_weights" else rebuilt) for n, b, rebuilt in super()._extras(sk))

    def recompute_costs(self, model, layout, batch, seq, profile):
        share = _rerun_shares(model)
        out = []
        for c in forward_costs(model, layout, batch, seq, profile):
            name = base_op_name(c.name)  # async TP prices a GEMM in parts (`memo_sim.cost.opcost`)
            base = c.name.split("_", 1)[1] if c.kind == "collective" and "_" in c.name else name
            if name in _WHOLE or (c.kind == "collective" and base in ("ln1", "ln2", "out_proj")):
                out.append(replace(c, phase="recompute"))
            elif share.get(name):
                f = share[name]
                out.append(replace(c, phase="recompute", seconds=c.seconds * f, flops=c.flops * f))
        return out + saved_gemm_casts(model, layout, batch, seq, profile)
