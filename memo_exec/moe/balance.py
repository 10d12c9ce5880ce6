"""Who picks each token's experts (``Layout.moe_balance``, `memo_sim.layout.moe_balance`), by name.

A balance is either the model's router choosing (``dropless``, ``measured``: `memo_exec.moe.routers`' top-k) or a
routing registered here with ``@ROUTINGS.register("name")``: ``(positions [T] int64, k, experts) -> idx [T, k]``,
the experts of each of the rank's T rows from its position in its sequence. The router then weighs the chosen
experts as always (its scores at those experts, normalised), so its gate still learns from every copy.

- ``forced``: every expert the same tokens, round-robin as torchtitan's ``debug.moe_force_load_balance`` routes
  (``_debug_force_load_balance_routing``: copy i to expert i mod E), counted over each sequence's positions rather
  than the rank's rows: copy j of the token at position p goes to expert (p x k + j) mod E. The rows a rank holds
  (a CP shard's two chunks, a TP rank's interleaved rows) then route as they would on one process, and every
  expert receives the same copies of every sequence whenever seq x k is a multiple of E (at most one more
  otherwise), what the simulator prices (load factor 1).

Random routing (Megatron-Core's --moe-router-force-load-balancing) and capacity dropping are not run
(`memo_sim.plan.executor_scope` refuses them in one line).
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_sim.registry import Registry

ROUTINGS: Registry = Registry("layout.moe_balance", error=ExecError, unknown="{what} {name!r}: the executor runs {known}")
ROUTER_CHOOSES = ("dropless", "measured")  # the model's router picks (measured loads are a dropless router's)


@ROUTINGS.register("forced")
def round_robin(positions: torch.Tensor, k: int, experts: int) -> torch.Tensor:
    """Copy j of the token at position p to expert (p*k + j) mod E: [T, k] int64."""
    return (positions.to(torch.int64).unsqueeze(1) * k + torch.arange(k, device=positions.device)) % experts


def routing_for(kind: str):
    """The routing of balance ``kind`` (a `memo_sim.layout.moe_balance.Balance` kind), None where the router picks."""
    return None if kind in ROUTER_CHOOSES else ROUTINGS.get(kind)
