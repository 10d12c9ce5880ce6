"""Activation policies: where each layer's skeletal tensors live between its forward and backward.

One module per policy, registered under the simulator's policy name (`registry`):

- `store_all`: every layer keeps all its skeletal tensors on the device.
- `full_recompute`: every layer keeps only its input; one shared set of buffers is rebuilt by
  re-running the layer forward before its backward.
- `full_offload`, `memo` (`token_offload.TokenOffload`): MEMO's two rounding buffers, an offload
  and a prefetch stream, token-wise recompute of what was not offloaded.
- `selective_recompute`: store all's tensors; the attention core re-run before each backward.
- `recompute_moe` (Megatron's ``--recompute-modules layernorm moe``): the norms' outputs rebuilt
  and the MoE block re-run before each backward.
- `recompute_norm_act` (``layernorm moe_act``): the norms' outputs rebuilt, the MoE block's graph kept but the
  routed experts' activation output, recomputed when the backward reads it.
- `recompute_mlp` (``mlp``, a dense model): the MLP's norm output, fc1 and activation rebuilt, fc2 re-run,
  before each backward.
- `checkpoint_offload` (DeepSpeed's ``cpu_checkpointing``): full recompute with each layer's input
  on the host, through two input buffers and the rounding-buffer copy rule.
- `offload_modules` (Megatron's ``--fine-grained-activation-offloading --offload-modules core_attn attn_proj``,
  ``offload_attn``): store all's tensors, the attention's q, k, v and output through two rounding buffers to the
  host and back.
"""

# isort: off
from memo_exec.activations import store_all, full_recompute, full_offload, memo  # noqa: F401  (registration)
from memo_exec.activations import selective_recompute, recompute_moe, checkpoint_offload  # noqa: F401
from memo_exec.activations import recompute_norm_act, recompute_mlp, offload_modules  # noqa: F401
# isort: on
from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import make_policy, register, registered, sim_policy_name
from memo_exec.activations.token_offload import TokenOffload, offload_token_count

__all__ = ["ActivationPolicy", "TokenOffload", "make_policy", "offload_token_count", "register", "registered",
           "sim_policy_name"]
