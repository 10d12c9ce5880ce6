"""``metp_ffn``: the FFN as memory-efficient tensor parallelism (METP, papers/metp.txt sections 3-4)
beside Megatron TP+SP attention. Each of the p = tp ranks holds 1/p of the tokens and the W_in /
W_out blocks travel a ring by send/recv, so fc1 and act exist only as per-step blocks (T_ij, D_ij)
and the FFN keeps only its input ln2. The executor's flavour is `memo_exec.metp.flavour.METPFfn`."""

from __future__ import annotations

from memo_sim.tp.base import TPFlavour
from memo_sim.tp.registry import FLAVOURS

# the FFN ring's weight double buffer and the double buffer of its partial weight gradients
FFN_RING_BUFFERS = ("metp_ffn_w", "metp_ffn_dw")


class MetpFfn(TPFlavour):
    name = "metp_ffn"
    ring_groups = ("ffn",)
    block_tensors = frozenset({"fc1", "act"})
    comm_buffer_prefixes = FFN_RING_BUFFERS
    requires_sp = True
    min_tp = 2
    spans_nodes = False  # a ring over whole nodes only where asked (--metp-across-nodes)
    across_nodes_refusal = "a METP ring stays inside a node unless --metp-across-nodes lets it span whole nodes"

    def label(self, layout) -> str:
        return f"tp{layout.tp}+{self.name}"

    def recompute_scratch(self, layout, frac, tb, full_h, blocks):
        """fc1 and act are not rebuilt: ln2 needs no gather (Megatron's first two buffers)."""
        return super().recompute_scratch(layout, frac, tb, full_h, blocks)[:2]


METP_FFN = FLAVOURS.add(MetpFfn.name, MetpFfn())
