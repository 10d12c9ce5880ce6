"""Mixed-precision recipes: bytes per parameter of each model state, written once.

A recipe says what training keeps per parameter: the working weights (model dtype), the
gradient buffer the optimizer step reads (the "main grads"), fp32 master weights, Adam's two
fp32 moments, and the element width of the data-parallel gradient reduction. ZeRO stage 1
(Megatron's distributed optimizer) shards master weights and moments over the group that holds
the same weights, stage 2 also the gradients, stage 3 also the working weights.

- ``megatron`` (default): Megatron-LM bf16 training. bf16 weights (2), fp32 main grads (4;
  Megatron accumulates and all-reduces gradients in fp32 under bf16), fp32 master weights (4),
  Adam m and v (4 + 4): 18 bytes per parameter before sharding.
- ``zero``: the ZeRO paper's mixed-precision accounting: 16-bit weights (2) and gradients (2),
  fp32 master weights, m and v (12): 16 bytes per parameter.
- ``fp32``: everything fp32 (CPU runs of the executor): weights 4, grads 4, no separate master,
  Adam m and v 8: 16 bytes per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrecisionRecipe:
    name: str
    weight_bytes: int  # working weights
    grad_bytes: int  # gradient buffer the optimizer step reads
    master_bytes: int  # fp32 master copy (0 when the working weights are the master)
    optimizer_bytes: int  # Adam moments
    grad_reduce_bytes: int  # element width of the gradient all-reduce / reduce-scatter
    summary: str

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    def state_bytes(self, params: float, shards: int, zero: int) -> float:
        """Model-state bytes of ``params`` parameters on one GPU, sharded ``shards`` ways by ZeRO ``zero``."""
        n = max(1, shards)
        weights = self.weight_bytes * params / (n if zero >= 3 else 1)
        grads = self.grad_bytes * params / (n if zero >= 2 else 1)
        optim = (self.master_bytes + self.optimizer_bytes) * params / (n if zero >= 1 else 1)
        return weights + grads + optim


RECIPES = {
    "megatron": PrecisionRecipe("megatron", 2, 4, 4, 8, 4,
                                "Megatron-LM bf16: bf16 weights, fp32 main grads, fp32 master weights and Adam"),
    "zero": PrecisionRecipe("zero", 2, 2, 4, 8, 2, "ZeRO paper: 16-bit weights and grads, fp32 master and Adam"),
    "fp32": PrecisionRecipe("fp32", 4, 4, 0, 8, 4, "fp32 weights, grads and Adam (no master copy)"),
}


def default_recipe(dtype: str) -> str:
    """Megatron's bf16 recipe for 16-bit models, all-fp32 for fp32 models."""
    return "fp32" if dtype == "fp32" else "megatron"
