"""What a tensor-parallel flavour is: the data and rules the layer graph, the layouts, the costs and
the traces ask it for (`memo_sim.tp` registers one instance per flavour).

A flavour runs some of the layer's op groups as METP rings (`RING_GROUPS`, papers/metp.txt:
O = f(A B) C with A the group's input, the B / C blocks travelling a ring) and the rest as
Megatron-LM's column / row parallelism. What the layers above do with a ring group is written once
per group, at the level that owns it: its op costs in `memo_sim.cost.layer_time` (from
`memo_sim.cost.metp`), its level-1 trace blocks in `memo_sim.memplan.ring_trace`. A flavour says
which groups it rings and owns everything else that is its own: the tensors that exist only as
ring blocks, its validity rules, its label, MEMO's recompute scratch and its communication buffers.

The arguments ``layout`` (`memo_sim.layout.parallel.Layout`) and ``model``
(`memo_sim.model.config.ModelConfig`) are read by attribute: this package sits below both.
"""

from __future__ import annotations

from collections.abc import Callable

# The op groups METP runs as a ring (papers/metp.txt), as op names of the layer graph
# (`memo_sim.model.layer_graph.forward_ops`), in forward order.
RING_GROUPS: dict[str, tuple[str, ...]] = {"ffn": ("fc1", "act", "fc2"), "mha": ("qkv", "attention", "out_proj")}


class TPFlavour:
    """One tensor-parallel flavour. Subclasses set the class attributes and override the rules
    that differ; the defaults are Megatron-LM's TP (with or without sequence parallelism)."""

    name = "base"
    ring_groups: tuple[str, ...] = ()  # keys of `RING_GROUPS` this flavour runs as a ring
    # tensors that exist only as per-step blocks inside the rings (never whole, not saved)
    block_tensors: frozenset[str] = frozenset()
    # prefixes of the level-1 buffers the rings' transfers read or write on their own streams
    comm_buffer_prefixes: tuple[str, ...] = ()
    requires_sp: bool = False  # shards every activation over the TP ranks (sp must be on)
    min_tp: int = 1  # the smallest TP degree the flavour runs with
    seq_chunk_factor: int = 1  # extra equal chunks its rings split the local sequence into
    # Megatron's TP collectives decomposed and run beside the GEMM each feeds or drains (async TP,
    # `memo_sim.tp.async_tp`; priced in `memo_sim.cost.layer_time`)
    async_collectives: bool = False
    executor: bool = True  # the executor runs it (`memo_exec.distributed.tp`); False: it refuses the plan in one line
    # a group over whole nodes is valid (`memo_sim.layout.parallel.check_layout`): Megatron-LM's collectives are NCCL's
    # over any group (priced on the nodes' NICs, `memo_sim.cost.collectives.tp_params`); a ring flavour spans nodes
    # only where the search is asked to (--metp-across-nodes), another flavour says why not (``across_nodes_refusal``)
    spans_nodes: bool = True
    across_nodes_refusal: str = ""

    @property
    def runs_rings(self) -> bool:
        """Whether any part of the layer runs as METP."""
        return bool(self.ring_groups)

    def group_of(self, op_name: str) -> str | None:
        """The ring group an op of the layer graph belongs to under this flavour, or None."""
        for g in self.ring_groups:
            if op_name in RING_GROUPS[g]:
                return g
        return None

    def applies(self, tp: int, sp: bool) -> bool:
        """Whether a layout of TP degree ``tp`` with sequence parallelism ``sp`` can run it (the
        search tries it only there; `check` gives the reason elsewhere)."""
        return tp >= self.min_tp and (sp or not self.requires_sp)

    def shards_tokens(self, layout) -> bool:
        """Whether the tokens of the layer's activations are split over the TP group."""
        return layout.tp > 1 and (layout.sp or self.requires_sp)

    def check(self, layout, model) -> str | None:
        """The reason this flavour cannot run ``layout`` for ``model``, or None."""
        if layout.tp < self.min_tp:
            return f"{self.name} needs a tensor-parallel degree of at least {self.min_tp}"
        if self.requires_sp and not layout.sp:
            return "METP shards every activation over the TP ranks (like Megatron SP): sp must be on"
        return None

    def label(self, layout) -> str:
        """The TP part of the layout's label (``tp4+sp``, ``tp8+metp``)."""
        return f"tp{layout.tp}{'+sp' if layout.sp and layout.tp > 1 else ''}"

    def recompute_scratch(self, layout, frac: float, tb: dict[str, float], full_h: float,
                          blocks: Callable[[], dict[str, float]]) -> list[tuple[str, float]]:
        """MEMO's token-wise recompute scratch of the dropped ``frac`` of the tokens, (name, bytes),
        one at a time: Megatron re-gathers ln1 and ln2 under SP and rebuilds h1 through the output
        projection (``rc_proj``, a full-length partial sum under TP). ``tb``: the layer tensors'
        bytes on one GPU; ``full_h``: one full-length hidden-wide tensor; ``blocks()``: the METP
        block sizes of `memo_sim.cost.metp.block_sizes` (weight blocks, one token)."""
        sp = layout.sp and layout.tp > 1
        gathered = full_h if sp else tb["ln1"]
        return [("recompute_ln1_gathered", frac * gathered), ("rc_proj", frac * full_h),
                ("recompute_ln2_gathered", frac * gathered)]
