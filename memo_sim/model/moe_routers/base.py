"""What a mixture-of-experts router is: the gate GEMM that scores every routed expert for every
token, the score function and top-k selection that pick ``top_k`` experts and their weights, and
how it keeps the experts' loads balanced. One module per router registers a `Router`.

Every router here runs the gate as one GEMM of the layer's normalised input (hidden -> experts; a
bias where the model has one: GPT-OSS), kept replicated across tensor-parallel ranks and in the
model dtype whatever the GEMM format (Megatron-Core and TransformerEngine keep the router in
high precision), then a memory-bound pass over the scores: the score function, top-k, the
normalisation of the chosen weights, and the balancing term. ``score_passes`` is how many times
that pass reads and writes the (tokens x experts) fp32 score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4


@dataclass(frozen=True)
class Router:
    name: str
    summary: str
    score_passes: int  # fp32 (tokens x experts) reads + writes of the score pass (softmax/sigmoid, top-k, aux loss)
    balancing: str  # how the loads are kept even, in words (what the search reports)
    buffers: str = ""  # learned state kept as a buffer, not a parameter (not counted in the parameters)
    score_function: str = "softmax"  # over the gate's logits (Megatron-Core's --moe-router-score-function)
    expert_bias: bool = False  # a per-expert correction bias balances the loads (--moe-router-enable-expert-bias)
    # the router renormalises the k chosen weights to sum to 1 where the model says so (`ModelConfig.router_normalised`,
    # Hugging Face's norm_topk_prob); False: never (Llama 4's), whatever the model says
    normalised: bool = True
    # the chosen weight scales the expert's input, not its output (Llama 4; Megatron-Core's --moe-apply-probs-on-input)
    weights_input: bool = False

    def params(self, hidden: int, experts: int, bias: bool) -> int:
        """The gate's parameters in one MoE layer."""
        return hidden * experts + (experts if bias else 0)

    def gemm(self, hidden: int, experts: int) -> tuple[int, int]:
        """(in, out) widths of the gate GEMM."""
        return hidden, experts

    def score_bytes(self, tokens: float, experts: int) -> float:
        """HBM bytes of the score pass over ``tokens`` tokens."""
        return self.score_passes * 2 * tokens * experts * FP32
