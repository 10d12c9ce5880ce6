"""How a framework's memory-bound kernels are built (``Layout.kernel_fusion``), written once from the
layer's op graph (`memo_sim.model.layer_graph.forward_ops`).

- ``fused``: each norm, activation and residual add of the op graph is one hand-written fused kernel
  (Megatron-LM / TransformerEngine, Apex; memo's default): it reads its inputs and writes its
  outputs once, and pays one launch.
- ``compiled``: the layer (a transformer block) is compiled by ``torch.compile`` (Inductor), as
  torchtitan's ``--training.compile`` does per block. Inductor also fuses *across* ops where one
  memory-bound op reads what the memory-bound op just before it wrote ("vertical" fusion: the
  residual add before the second norm writes h1 and the norm reads it in the same kernel, so h1 is
  read once less and the norm pays no launch of its own), and a quantised GEMM format's amax
  reduction into the kernel that writes the tensor (the cast then reads the tensor once, not
  twice) where that kernel is a memory-bound op of the block: the norms' outputs and the FFN
  activation in forward, the gradients the residual adds and the activation's backward write.
  GEMMs and the attention kernel are extern kernels to Inductor: their outputs are not fused with
  anything. The fusion does not cross the block (torchtitan compiles each block on its own).
- ``eager``: neither: the layer's RMSNorms and SwiGLU activations are built from separate tensor ops,
  a kernel each (Hugging Face transformers' layers as XTuner trains them, torchtitan without
  ``--training.compile``): their kernels, bytes and the tensors their autograd keeps are counted in
  `memo_sim.model.eager_kernels`.
  LayerNorm, GELU and the residual adds are one kernel each in eager PyTorch too, priced as ``fused``.

The rotary embedding follows the framework's own kernels (``Layout.rope``), one fused kernel per tensor in a
compiled block (`memo_sim.model.rope_kernels`).
"""

from __future__ import annotations

from functools import lru_cache

from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import forward_ops

KERNEL_FUSIONS = ("fused", "compiled", "eager")
_MEMORY_BOUND = ("norm", "elementwise")


@lru_cache(maxsize=256)
def fused_inputs(model: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Op name -> the inputs a compiled block does not read from memory again: those the memory-bound
    op just before it wrote, when it is memory-bound too (vertical fusion: add1 -> ln2's h1 in every
    layer kind; a MoE layer's unpermute -> add2's moe_out). Ops without any are left out."""
    ops = forward_ops(model)
    out = {}
    for prev, op in zip(ops, ops[1:]):
        if prev.kind in _MEMORY_BOUND and op.kind in _MEMORY_BOUND:
            shared = tuple(t for t in op.inputs if t in prev.outputs)
            if shared:
                out[op.name] = shared
    return out


@lru_cache(maxsize=256)
def _kinds(model: ModelConfig, rope: bool = True) -> tuple[dict[str, str], dict[str, str]]:
    """(tensor -> kind of the op writing it, tensor -> kind of the first op reading it) in forward; without the
    rotary op where the layout runs none (``rope`` False: ``Layout.rope`` none)."""
    writer, reader = {}, {}
    for op in forward_ops(model):
        if op.name == "rope" and not rope:
            continue
        for t in op.inputs:
            reader.setdefault(t, op.kind)
        for t in op.outputs:
            writer.setdefault(t, op.kind)
    return writer, reader


def amax_fused_forward(model: ModelConfig, kernel_fusion: str, tensor: str) -> bool:
    """Whether a compiled block computes ``tensor``'s amax in the memory-bound kernel that writes it
    (its forward cast then reads it once)."""
    return kernel_fusion == "compiled" and _kinds(model)[0].get(tensor) in _MEMORY_BOUND


def amax_fused_backward(model: ModelConfig, kernel_fusion: str, output: str, rope: bool = True) -> bool:
    """Whether the gradient of a GEMM's ``output`` is written by a memory-bound kernel of a compiled
    block (the backward of the op that reads ``output`` in forward: the rotary op's for q and k where the layout
    runs one, ``rope``), which then computes its amax."""
    return kernel_fusion == "compiled" and _kinds(model, rope)[1].get(output) in _MEMORY_BOUND
