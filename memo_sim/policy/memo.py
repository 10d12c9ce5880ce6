"""MEMO (paper sec. 4.1): the layer input and attention output go to host whole; of the other
skeletal tensors the first alpha of the tokens go to host and the rest are dropped and
recomputed token-wise before the backward. Transients are placed by the bi-level memory plan."""

from __future__ import annotations

from memo_sim.cost.layer_time import recompute_costs
from memo_sim.policy.full_offload import FullOffload
from memo_sim.policy.registry import register


@register
class Memo(FullOffload):
    name = "memo"
    takes_alpha = True
    static_memory_plan = True
    summary = "offload input and attention output whole and alpha of the rest; recompute the other tokens"

    @property
    def offload_fraction_other(self) -> float:
        return float(self.alpha)

    @property
    def recompute_fraction(self) -> float:
        return 1.0 - float(self.alpha)

    def recomputes_layer(self, layer, n_layers):
        return layer < self.offloaded_layers(n_layers) and self.recompute_fraction > 0

    def recompute_costs(self, model, layout, batch, seq, profile):
        return recompute_costs(model, layout, batch, seq, profile, self.recompute_fraction)

    def label(self) -> str:
        return f"memo(a={self.alpha:.3f})"
