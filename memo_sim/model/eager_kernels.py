"""The kernels eager PyTorch runs for a layer's composite memory-bound ops (``Layout.kernel_fusion`` ``eager``).

A layer that is neither hand-fused (Megatron-LM / TransformerEngine) nor compiled builds some memory-bound ops
out of separate tensor ops, each a kernel of its own that reads its inputs from HBM and writes its output there,
and autograd runs a backward for each (Hugging Face transformers' LlamaRMSNorm and LlamaMLP, which XTuner trains
without its Triton kernels, and torchtitan's RMSNorm and FeedForward without ``--training.compile``):

- RMSNorm over an fp32 upcast: ``x.float()``, ``pow(2)``, ``mean(-1)``, ``+ eps``, ``rsqrt``, ``*``, the cast
  back, ``weight *``: 8 kernels forward (6 in fp32, where the casts do nothing) and 16 backward (14), against
  the fused kernel's one, 36 bytes per element of its output forward where the fused one moves 4;
- SwiGLU, ``silu(gate) * up``: 2 kernels forward, 3 backward (``mul``'s two gradients, ``silu_backward``);
- the rotary embedding on the query or the key heads, each framework's own formula (``Layout.rope``,
  `memo_sim.model.rope_kernels`): transformers' ``apply_rotary_pos_emb`` (``rope_hf``: ``q * cos + rotate_half(q) *
  sin``, rotate_half a ``neg`` and a ``cat``: 5 kernels forward, 8 backward) and torchtitan's ``apply_rotary_emb``
  (``rope_complex``: the fp32 upcast, a complex multiply by ``freqs_cis``, the cast back: 3 forward, 4 backward),
  counted at 8 heads of 128 (the position tables, read once per kernel and broadcast over the heads, add 2 / heads
  bytes an element: 0.25 here; 0.06 at 32 heads).

Autograd also keeps more for their backward than the fused kernel's input and output: RMSNorm the fp32 copy of its
input and the normalised rows before the weight (6 bytes an element in bf16; 4 in fp32, where the copy is the input
itself), SwiGLU the silu output (one element a width): ``saved_bytes``, counted by the same script with
``torch.autograd.graph.saved_tensors_hooks`` (the storages saved but the op's inputs, weight and output). A layer keeps
them as it keeps its other saved tensors, unless its recompute re-runs these ops (`memo_sim.policy.base.Policy
.rebuilt_extras`).

LayerNorm (``F.layer_norm``) and GELU (``F.gelu``) are one kernel each way in eager PyTorch too, priced as the
fused ones (`memo_sim.cost.layer_time`). The numbers below are counted, not timed: `benchmarks/eager_kernels.py`
runs each op forward and backward under a ``TorchDispatchMode`` and counts the ATen ops the dispatcher runs and
the bytes they read and write (the same ops on any device), and `tests/test_eager_kernels.py` counts them again.
Counted with torch 2.13.0 (CPU wheel) on 2026-12-04: ``python benchmarks/eager_kernels.py`` (4,096 tokens x
1,024; at 8,192 x 4,096 the same to 0.01 byte).

Not modelled: the transient buffers of
the eager ops (an fp32 copy between two kernels) beside the layer's other transients; what SPPO's and MEMO's
token-wise policies would do with the eager saved tensors (they keep them on the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import OpSpec


@dataclass(frozen=True)
class EagerOp:
    """One composite op's kernels: bytes read and written per element of its output, and kernel launches; bytes its
    autograd keeps for the backward beyond the op's inputs and output, per element of its output."""
    fwd_bytes: float
    fwd_kernels: int
    bwd_bytes: float
    bwd_kernels: int
    saved_bytes: float

    def phase(self, phase: str) -> tuple[float, int]:
        """(bytes per output element, kernels) of the forward (and a recompute's) or the backward (``"bwd"``)."""
        return (self.bwd_bytes, self.bwd_kernels) if phase == "bwd" else (self.fwd_bytes, self.fwd_kernels)


# (op, the element's bytes: 2 for bf16 / fp16, 4 for fp32) -> the counts (benchmarks/eager_kernels.py, module docs)
EAGER_OPS: dict[tuple[str, int], EagerOp] = {
    ("rmsnorm", 2): EagerOp(36.0, 8, 92.0, 16, 6.0),
    ("rmsnorm", 4): EagerOp(28.0, 6, 92.0, 14, 4.0),
    ("swiglu", 2): EagerOp(10.0, 2, 18.0, 3, 2.0),
    ("swiglu", 4): EagerOp(20.0, 2, 36.0, 3, 4.0),
    ("rope_hf", 2): EagerOp(20.5, 5, 32.5, 8, 0.0),
    ("rope_hf", 4): EagerOp(41.0, 5, 65.0, 8, 0.0),
    ("rope_complex", 2): EagerOp(20.5, 3, 21.5, 4, 0.0),
    ("rope_complex", 4): EagerOp(8.5, 1, 9.5, 2, 0.0),
}
# the layer graph's activation ops (`memo_sim.model.layer_graph`): the dense FFN's, the routed and the shared experts'
_ACTIVATIONS = ("act", "expert_act", "shared_act")


def eager_op(model: ModelConfig, op: OpSpec, dtype_bytes: int) -> EagerOp | None:
    """The eager kernels of ``op`` where they differ from the one fused kernel memo prices (an RMSNorm model's
    norms, a SwiGLU model's activations), else None."""
    if op.kind == "norm" and model.norm == "rmsnorm":
        name = "rmsnorm"
    elif op.name in _ACTIVATIONS and model.ffn_type == "swiglu":
        name = "swiglu"
    else:
        return None
    return EAGER_OPS[(name, 4 if dtype_bytes >= 4 else 2)]
