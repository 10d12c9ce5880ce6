"""Top-k of the gate's logits, each chosen expert weighted by the sigmoid of its logit (Llama 4's router,
transformers' Llama4Router: no normalisation of the chosen weights, no correction bias; balanced by an auxiliary
loss where the model has one). Megatron-Core's ``--moe-router-score-function sigmoid`` without the expert bias
picks the same experts with the same weights (the sigmoid is monotonic) where the weights are not normalised. The
same fp32 passes as the other routers. Llama 4 applies the weight to the experts' input, not their output: the
same GEMM FLOPs; the multiply is its own op, and the weighted copies the experts' first GEMM keeps sit beside the
unweighted ones the multiply keeps (`memo_sim.model.layer_graph`: moe_in_w); memo's executor runs it so
(`memo_exec.moe.routers`).
"""

from __future__ import annotations

from memo_sim.model.moe_routers.base import Router
from memo_sim.model.moe_routers.registry import ROUTERS

ROUTERS.add("sigmoid_topk", Router("sigmoid_topk", "top-k of the logits weighted by their sigmoid (Llama 4)",
                                   score_passes=2, balancing="auxiliary loss where the model has one",
                                   score_function="sigmoid", normalised=False, weights_input=True))
