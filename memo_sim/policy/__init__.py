"""Activation policies (store all, full recompute, full offload, MEMO, selective recompute, SPPO),
registered by name, and
MEMO's alpha solver. Importing this package registers the built-in policies, in the order the
what-if lists them."""

# isort: off
from memo_sim.policy import store_all, full_recompute, full_offload, memo  # noqa: F401  (registration order)
from memo_sim.policy import selective_recompute  # noqa: F401  (Megatron-LM's attention-core recompute)
from memo_sim.policy import recompute_modules  # noqa: F401  (Megatron-LM's --recompute-modules for MoE layers)
from memo_sim.policy import op_sac  # noqa: F401  (torchtitan's per-op selective activation checkpointing)
from memo_sim.policy import checkpoint_offload  # noqa: F401  (DeepSpeed's cpu_checkpointing)
from memo_sim.policy import offload_modules  # noqa: F401  (Megatron-LM's fine-grained activation offloading)
from memo_sim.policy import sppo  # noqa: F401  (SPPO: subsequence pipeline offloading, registered last)
# isort: on
from memo_sim.policy.base import Policy
from memo_sim.policy.registry import get_policy, policy_class, policy_names, prices_model, register

__all__ = ["Policy", "get_policy", "policy_class", "policy_names", "prices_model", "register"]
