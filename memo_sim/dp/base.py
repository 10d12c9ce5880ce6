"""What a data-parallel flavour is: how the model states of the ranks that hold the same weights
(the DP x CP x Ulysses group, ``layout.state_shards``) are sharded and kept in step, as data and
rules the memory formulas and the gradient collectives ask for (`memo_sim.cost.memory`,
`memo_sim.cost.grad_sync`).

A flavour says over how many of those ranks the states are sharded (``shard_group``; the rest of
the group holds replicas of each shard, HSDP), whether a layer's gathered weights are dropped after
its forward and gathered again for its backward (``gathers_in_backward``), and how many layers'
gathered weights a GPU holds at its peak (``gathered_layers``). The arguments ``layout`` and
``model`` are read by attribute: this package sits below both.
"""

from __future__ import annotations


class DPFlavour:
    """One data-parallel flavour; the defaults are the ZeRO stages over the whole group."""

    name = "base"
    label_part = ""

    def shard_group(self, layout) -> int:
        """Ranks over which the sharded states are split."""
        return layout.state_shards

    def replicas(self, layout) -> int:
        """Copies of each shard (HSDP: the replicate group; 1 when the whole group shards)."""
        return layout.state_shards // self.shard_group(layout)

    def gathers_in_backward(self, layout) -> bool:
        """Whether each layer's weights are gathered again before its backward."""
        return layout.zero >= 3

    def gathered_layers(self, layout, n_layers: int) -> float:
        """Layers whose gathered (whole) weights a GPU holds at its peak, beside its shards."""
        return 2.0 if layout.zero >= 3 else 0.0

    def check(self, layout, model) -> str | None:
        """None, or why the layout cannot run this flavour."""
        return None
