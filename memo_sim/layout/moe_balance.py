"""How evenly routed tokens fall on the expert-parallel ranks (``Layout.moe_balance``): a named
input, because the step waits for the busiest rank (its expert GEMMs, and the all-to-all that
waits for it) and no simulator can know a router's loads in advance.

- ``forced``: every expert gets the same number of tokens (Megatron-Core's
  ``--moe-router-force-load-balancing``, as benchmark runs use): load factor 1.
- ``dropless`` (default): every routed token is computed, none dropped; the loads are those of a
  router that sends each token copy to an expert uniformly at random (what balancing aims at):
  the busiest of ``ep`` ranks receiving N copies in all holds the binomial's expected maximum,
  about N/ep + sqrt(2 ln ep · N/ep · (1 - 1/ep)) (the Gaussian tail bound on the maximum of ep
  near-independent counts). Real routers are less even than uniform, above all early in training:
  where the loads are known, ``capacity:F`` bounds them.
- ``capacity:F``: each expert processes exactly F times its even share (GShard's capacity factor,
  Megatron-Core's ``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``): tokens
  over capacity are dropped, experts under it padded, so the load factor is F on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_CAPACITY = 64.0


@dataclass(frozen=True)
class Balance:
    kind: str  # forced | dropless | capacity
    capacity: float = 1.0

    def load_factor(self, copies: float, ep: int) -> float:
        """The busiest EP rank's routed tokens over the mean, for ``copies`` token copies routed in
        the EP group."""
        if self.kind == "forced" or ep <= 1:
            return 1.0 if self.kind != "capacity" else self.capacity
        if self.kind == "capacity":
            return self.capacity
        mean = copies / ep
        if mean <= 0:
            return 1.0
        return 1.0 + math.sqrt(2.0 * math.log(ep) * (1.0 - 1.0 / ep) / mean)


def balance_why_not(text: str) -> str | None:
    """Why ``text`` is not a balance setting, or None."""
    try:
        parse_balance(text)
    except ValueError as e:
        return str(e)
    return None


def parse_balance(text: str) -> Balance:
    """``forced``, ``dropless`` or ``capacity:F`` (F a number in (0, 64]); ValueError naming the forms."""
    if text in ("forced", "dropless"):
        return Balance(text)
    if isinstance(text, str) and text.startswith("capacity:"):
        try:
            f = float(text.split(":", 1)[1])
        except ValueError:
            f = float("nan")
        if 0 < f <= MAX_CAPACITY:
            return Balance("capacity", f)
    raise ValueError(f"moe balance must be forced, dropless or capacity:F (F a capacity factor in (0, {MAX_CAPACITY:g}]), "
                     f"got {text!r}")
