"""Pure memory formulas per GPU: model states, the chunked classifier, offloaded bytes.

Model states follow the ZeRO paper's mixed-precision accounting, 16 bytes per parameter:
2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master weights, Adam m and v). ZeRO stage 1
shards the 12 over the DP x CP x Ulysses group, stage 2 also the gradients, stage 3 also the
weights (and keeps two layers' gathered weights live for prefetch). TP divides everything,
the embedding/classifier too (vocab-parallel).

The classifier runs in chunks of ``CLASSIFIER_CHUNK_TOKENS`` tokens (the one default; plans
carry their own value): one chunk's logits in bf16 plus fp32 softmax and gradient.

The whole-GPU peak by policy (these terms plus skeletal activations and transients) is
`memo_sim.memplan.footprint.memory_breakdown`.
"""

from __future__ import annotations

from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES

BYTES_WEIGHT, BYTES_GRAD, BYTES_OPTIM = 2, 2, 12
CLASSIFIER_CHUNK_TOKENS = 8192
CLASSIFIER_BYTES_PER_LOGIT_FP32 = 4 + 4  # fp32 softmax + fp32 gradient beside the model-dtype logits


def model_state_bytes(model: ModelConfig, layout: Layout) -> float:
    p = model.params() / layout.tp
    n = layout.state_shards
    z = layout.zero
    weights = BYTES_WEIGHT * p / (n if z >= 3 else 1)
    grads = BYTES_GRAD * p / (n if z >= 2 else 1)
    optim = BYTES_OPTIM * p / (n if z >= 1 else 1)
    gathered = 2 * BYTES_WEIGHT * model.layer_params() / layout.tp if z >= 3 else 0.0
    return weights + grads + optim + gathered


def classifier_peak_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int,
                          chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> float:
    tokens = min(chunk_tokens, tokens_per_gpu(layout, batch, seq))
    vocab_share = model.vocab / layout.tp
    logits = tokens * vocab_share * (DTYPE_BYTES[model.dtype] + CLASSIFIER_BYTES_PER_LOGIT_FP32)
    final_hidden = tokens_per_gpu(layout, batch, seq) * model.hidden * DTYPE_BYTES[model.dtype]
    return logits + 2 * final_hidden  # final norm output + its gradient stay live over all chunks
