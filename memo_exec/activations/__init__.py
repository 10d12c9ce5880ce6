"""Activation policies: where each layer's skeletal tensors live between its forward and backward.

- `StoreAll`: every layer keeps all its skeletal tensors on the device.
- `FullRecompute`: every layer keeps only its input; one shared set of buffers is rebuilt by
  re-running the layer forward before its backward.
- `TokenOffload` (``full_offload`` = all tokens, ``memo`` = a fraction alpha of the tokens):
  MEMO's two rounding buffers, an offload and a prefetch stream, token-wise recompute.
"""

from memo_exec.activations.base import ActivationPolicy, make_policy
from memo_exec.activations.offload import TokenOffload, offload_token_count
from memo_exec.activations.simple import FullRecompute, StoreAll

__all__ = ["ActivationPolicy", "FullRecompute", "StoreAll", "TokenOffload", "make_policy", "offload_token_count"]
