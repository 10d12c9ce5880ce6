"""What happens to a layer's skeletal activations between its forward and its backward.

- store_all: everything stays on the GPU.
- full_recompute: only the layer input stays; the layer forward re-runs before its backward.
- full_offload: every skeletal tensor is copied to host after the forward (the last two layers
  go straight into backward and are not offloaded) and prefetched before the backward.
- memo: layer input and attention output offloaded whole; of the other skeletal tensors a
  fraction alpha of the tokens is offloaded, the rest dropped and recomputed token-wise.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.errors import MemoError

POLICIES = ("store_all", "full_recompute", "full_offload", "memo")
OFFLOADING = ("full_offload", "memo")
NO_OFFLOAD_LAST_LAYERS = 2


@dataclass(frozen=True)
class PolicyChoice:
    policy: str
    alpha: float | None = None  # only for memo

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise MemoError(f"policy {self.policy!r} unknown; choose one of {', '.join(POLICIES)}")
        if self.policy == "memo":
            if self.alpha is None or not (0.0 <= self.alpha <= 1.0):
                raise MemoError(f"alpha must lie in [0, 1] for the memo policy, got {self.alpha!r}")
        elif self.alpha is not None:
            raise MemoError(f"alpha applies only to the memo policy, not {self.policy}")

    @property
    def offloads(self) -> bool:
        return self.policy in OFFLOADING

    @property
    def offload_fraction_other(self) -> float:
        """Fraction of the 'other' skeletal bytes copied to host."""
        return {"full_offload": 1.0, "memo": self.alpha or 0.0}.get(self.policy, 0.0)

    @property
    def recompute_fraction(self) -> float:
        """Fraction of the tokens whose 'other' skeletal tensors are recomputed."""
        if self.policy == "memo":
            return 1.0 - (self.alpha or 0.0)
        return 0.0

    def label(self) -> str:
        return f"memo(a={self.alpha:.3f})" if self.policy == "memo" else self.policy

    def to_dict(self) -> dict:
        return {"policy": self.policy, "alpha": self.alpha}
