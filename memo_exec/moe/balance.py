"""Who picks each token's experts (``Layout.moe_balance``, `memo_sim.layout.moe_balance`), by name.

A balance is either the model's router choosing (``dropless``, ``measured``: `memo_exec.moe.routers`' top-k) or a
routing registered here with ``@ROUTINGS.register("name")``: ``(positions [T] int64, k, experts, layer) -> idx
[T, k]``, the experts of each of the rank's T rows from its position in its sequence (and the layer's index). The
router then weighs the chosen experts as always (its scores at those experts, normalised), so its gate still learns
from every copy.

- ``forced``: every expert the same tokens, round-robin as torchtitan's ``debug.moe_force_load_balance`` routes
  (``_debug_force_load_balance_routing``: copy i to expert i mod E), counted over each sequence's positions rather
  than the rank's rows: copy j of the token at position p goes to expert (p x k + j) mod E. The rows a rank holds
  (a CP shard's two chunks, a TP rank's interleaved rows) then route as they would on one process, and every
  expert receives the same copies of every sequence whenever seq x k is a multiple of E (at most one more
  otherwise), what the simulator prices (load factor 1).

- ``random``: each token's k experts a uniform draw, the loads of Megatron-Core's
  ``--moe-router-force-load-balancing`` (its gate's logits replaced by normal noise per token, ``RandomSTE`` in
  megatron/core/transformer/moe/moe_utils.py, so top-k picks a uniform random k-subset of the experts), what the
  simulator prices as the busiest of the EP ranks under uniform routing (`memo_sim.layout.moe_balance`). The draw is
  a counter-based hash of (layer, position in the sequence, expert), the k largest taken, so every rank computes its
  rows' draw alone and a sharded run routes as one process does. Unlike Megatron's draw it is the same every step and
  every micro-batch, and the sequences of one micro-batch share it (a micro-batch of one sequence, as long-context
  runs take, loads the experts as one of Megatron's draws does); the weights are the router's scores at the drawn
  experts, not the noise's softmax with a straight-through gradient (the loads and the copies' bytes are Megatron's,
  the gate's gradient is not).

A capacity factor (``capacity:F``) keeps the router's choice and drops and pads it per expert
(`memo_exec.moe.capacity`).
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_sim.registry import Registry

ROUTINGS: Registry = Registry("layout.moe_balance", error=ExecError,
                              unknown="{what} {name!r}: the executor runs {known}")
# the model's router picks (measured loads are a dropless router's; a capacity then drops and pads its choice,
# `memo_exec.moe.capacity`)
ROUTER_CHOOSES = ("dropless", "measured", "capacity")


@ROUTINGS.register("forced")
def round_robin(positions: torch.Tensor, k: int, experts: int, layer: int = 0) -> torch.Tensor:
    """Copy j of the token at position p to expert (p*k + j) mod E: [T, k] int64 (the same in every layer)."""
    return (positions.to(torch.int64).unsqueeze(1) * k + torch.arange(k, device=positions.device)) % experts


_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # below 2**31: a product with a 32-bit value stays inside int64, nothing wraps


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 ``x`` (each value taken modulo 2**32), elementwise, in [0, 2**32): two rounds
    of xor-shift and multiply, then a xor-shift (the avalanche of a well-mixed integer hash; plain int64 arithmetic,
    the same on every device)."""
    x = x & _MASK32
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    return (x >> 16) ^ x


@ROUTINGS.register("random")
def uniform_draw(positions: torch.Tensor, k: int, experts: int, layer: int = 0) -> torch.Tensor:
    """The k experts with the largest hash of (layer, position, expert) for each row: a uniform random k-subset
    per position and layer, [T, k] int64 (ties, at 2**-32 odds, to the lower expert)."""
    key = mix32(mix32(torch.full_like(positions, layer, dtype=torch.int64) + 0x9E3779B9) ^ positions.to(torch.int64))
    e = torch.arange(experts, device=positions.device, dtype=torch.int64)
    scores = mix32(key.unsqueeze(1) ^ (e * 0x3C6EF372 + 0x6A09E667).unsqueeze(0))
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k].contiguous()


def routing_for(kind: str):
    """The routing of balance ``kind`` (a `memo_sim.layout.moe_balance.Balance` kind), None where the router picks."""
    return None if kind in ROUTER_CHOOSES else ROUTINGS.get(kind)
