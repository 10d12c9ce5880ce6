"""The cross-entropy kernels (`Layout.cross_entropy`, a framework mechanism): what each moves through HBM
per logit, what it keeps live per logit at its peak, and whether it holds one chunk of tokens' logits at a
time or every token's of the micro-batch. Counted from each implementation's tensors and kernels; logits
of ``d`` bytes, softmax in fp32, a cast to fp32 and back only when d != 4. The one place these facts
live: the classifier's time (`memo_sim.cost.boundary`) and memory (`memo_sim.cost.memory`) read them.

- ``chunked`` (memo_exec/model.py `ChunkedHead`, over chunks of `memo_sim.cost.memory.CLASSIFIER_CHUNK_TOKENS`
  tokens): HBM:
  cast; logsumexp (two reads, 8); in-place subtract and exp (16); in-place scale of the gradient (8);
  cast back: 2(d + 4) + 32. Live: the chunk's logits, their fp32 softmax and its fp32 gradient: d + 8.
- ``vocab_parallel`` (Megatron-LM's `_VocabParallelCrossEntropy`, megatron/core/tensor_parallel/
  cross_entropy.py at f2e5db402c, and mpu/cross_entropy.py of 2021), every token: HBM: ``.float()``;
  max (4); in-place subtract (8); exp (8); sum (4); in-place divide (8); backward in-place multiply (8);
  cast back: 2(d + 4) + 40. Live: the output layer's logits and their fp32 copy, on which max, exp and
  the division run in place and which the backward turns into the gradient in place, cast back beside
  it: d + 4.
- ``torch_fused`` (``F.cross_entropy(logits.float())``: torchtitan, HF transformers), every token: HBM:
  cast; log_softmax forward (max pass, sum pass, write pass: 16); nll backward writes a zeroed gradient
  (4); log_softmax backward (sum pass, write pass: 16); cast back: 2(d + 4) + 36 (counted from ATen's
  kernel structure, not measured). Live: the logits, their fp32 copy and log_softmax's saved output in
  the forward (d + 8), that output, the nll gradient and log_softmax's input gradient in the backward
  (12): the larger.
- ``chunked_wrapper`` (torchtitan's ``ChunkedLossWrapper``, torchtitan/components/loss.py at b5bcd76c: the
  micro-batch's local tokens in ``num_chunks`` = 8 equal chunks, each through the output layer and
  ``torch_fused``'s cross-entropy, forward and backward, before the next): per logit as ``torch_fused``, one
  chunk's logits at a time; the hidden states' gradient gathered chunk by chunk into an fp32 buffer of every
  token (``GradAccumulator``), live beside the final norm's output over all chunks.

What a loss keeps from its forward to its backward where the two run apart (``kept_fp32``): a
multi-token-prediction module's loss is computed in the model's forward, before the main head's (Megatron-LM
gpt_model.py), and keeps it while the main head peaks (`memo_sim.cost.memory.mtp_activation_bytes`):
``vocab_parallel`` its fp32 softmax (``save_for_backward(exp_logits)``, cross_entropy.py), ``torch_fused`` its fp32
log_softmax output; ``chunked`` and ``chunked_wrapper`` run each chunk's backward in the same pass (nothing kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.errors import MemoError

FP32 = 4


@dataclass(frozen=True)
class LossKernel:
    name: str
    chunked: bool  # holds one chunk of tokens' logits at a time (else every token's of the micro-batch)
    passes: int  # HBM bytes per logit of its fp32 passes (forward and backward), casts aside
    live_fp32: int  # fp32 bytes per logit live at its peak beside the d-byte logits (module docs)
    live_floor: int = 0  # fp32 bytes per logit live at a later moment without the logits (torch_fused's backward)
    chunks: int = 0  # > 0: the micro-batch's tokens in that many equal chunks, one chunk's logits at a time
    grad_fp32: bool = False  # the hidden states' gradient held in fp32 (else in the model dtype)
    kept_fp32: int = 0  # fp32 bytes per logit kept from its forward to its backward where they run apart (docs)

    def chunk_tokens(self, tokens: int, fixed: int) -> int:
        """Tokens whose logits the loss holds at once, of the micro-batch's ``tokens`` on one GPU: one chunk of
        ``fixed`` tokens (memo's chunked head), of ``chunks`` equal parts, or every token."""
        if self.chunks:
            return -(-tokens // self.chunks)
        return min(fixed, tokens) if self.chunked else tokens

    def hidden_grad_bytes(self, dtype_bytes: int) -> int:
        """Bytes per element of the final hidden states' gradient, live over the loss."""
        return FP32 if self.grad_fp32 else dtype_bytes

    def hbm_bytes_per_logit(self, dtype_bytes: int) -> float:
        """HBM bytes the loss moves per logit, forward and backward."""
        cast = 2 * (dtype_bytes + FP32) if dtype_bytes != FP32 else 0
        return cast + self.passes

    def live_bytes_per_logit(self, dtype_bytes: int) -> float:
        """Bytes per logit the loss keeps live at its peak."""
        logits = dtype_bytes if dtype_bytes != FP32 or self.chunked else 0  # fp32 logits need no copy
        return max(logits + self.live_fp32, self.live_floor)


KERNELS: dict[str, LossKernel] = {k.name: k for k in (
    LossKernel("chunked", True, 32, 2 * FP32),
    LossKernel("vocab_parallel", False, 40, FP32, kept_fp32=FP32),
    LossKernel("torch_fused", False, 36, 2 * FP32, 3 * FP32, kept_fp32=FP32),
    LossKernel("chunked_wrapper", False, 36, 2 * FP32, 3 * FP32, chunks=8, grad_fp32=True),
)}


def loss_kernel(name: str) -> LossKernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise MemoError(f"cross_entropy {name!r} unknown; one of {', '.join(KERNELS)}") from None


__all__ = ["KERNELS", "LossKernel", "loss_kernel"]
