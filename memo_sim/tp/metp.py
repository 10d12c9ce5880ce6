"""``metp``: METP for the FFN (`memo_sim.tp.metp_ffn`) and the two-level MHA (papers/metp.txt
Algorithms 5-6): an outer loop over p head groups whose W_qkv / W_proj blocks are broadcast and an
inner ring of K/V blocks, so q, k, v too exist only as per-outer-step head blocks; the MHA keeps
only its input ln1 and the attention output attn (and lse). The executor's flavour is
`memo_exec.metp.flavour.METPFull`."""

from __future__ import annotations

from memo_sim.tp.metp_ffn import FFN_RING_BUFFERS, MetpFfn
from memo_sim.tp.registry import FLAVOURS

# The bias settings (`memo_sim.model.config`) two-level METP attention runs with: its travelling
# QKV block carries the QKV bias (the executor's `memo_exec.metp.flavour` refuses the others too).
METP_QKV_BIASES = ("all", "qkv")


class Metp(MetpFfn):
    name = "metp"
    ring_groups = ("mha", "ffn")
    block_tensors = frozenset({"q", "k", "v", "fc1", "act"})
    # the MHA's broadcast weight blocks and reduced weight gradients, the inner ring's K/V and
    # dK/dV, and the W_proj ring of MEMO's recompute
    comm_buffer_prefixes = FFN_RING_BUFFERS + ("metp_mha_w", "metp_mha_dw", "metp_kv_", "metp_dkv_", "metp_wproj")
    seq_chunk_factor = 2  # the inner K/V ring splits the sequence zigzag (2p chunks) to balance causal work

    def check(self, layout, model) -> str | None:
        why = super().check(layout, model)
        if why:
            return why
        if layout.cp > 1 or layout.ulysses > 1:
            return "two-level METP attention is not combined with ring CP or Ulysses (use metp_ffn)"
        if model.bias not in METP_QKV_BIASES:
            # the executor's build limit, kept in the simulator so that every METP plan it writes runs (a review
            # read it as the scheme's: a missing bias would only move no bias blocks)
            return (f"memo's executor builds two-level METP attention around a QKV bias (memo_exec.metp.flavour) and "
                    f"{model.name} has none (bias {model.bias}); the simulator offers only plans it runs: use "
                    f"metp_ffn (METP on the FFN, Megatron TP on attention)")
        # the executor's other build limits (memo_exec.metp.flavour FULL_METP_ARCHITECTURE), which `memo_sim.cost.metp`
        # prices no other way either (a review: --head-dim 256 priced at the hidden width, 70.7% MFU; a sliding
        # window priced as full causal attention)
        # The executor's own rule, applied as it states it (head_dim 0: heads of hidden / heads; latent attention's
        # and a value head's widths need a head_dim too): a head_dim stated at hidden / heads passed the width test
        # this had (qk_head_dim x heads == hidden) and its plan was refused by memo-exec (a review). The stated
        # head_dim is kept rather than normalised to 0, as `--hidden` keeps a stated head size (README, model files)
        if model.head_dim and not model.qk_norm and model.head_dim * model.heads == model.hidden and not model.mla:
            return (f"memo's executor builds two-level METP attention for an unstated head_dim (heads of hidden / "
                    f"heads: memo_exec.metp.flavour FULL_METP_ARCHITECTURE) and {model.name} states head_dim "
                    f"{model.head_dim}, which is hidden / heads ({model.hidden} / {model.heads}): leave head_dim out "
                    f"of the model file (or give --head-dim 0), or use metp_ffn (METP on the FFN, Megatron TP on "
                    f"attention)")
        if model.qk_norm or model.head_dim:
            return (f"two-level METP attention is built and priced for heads of hidden / heads without QK norms; "
                    f"{model.name} has {model.heads} heads of {model.qk_head_dim} in {model.hidden}"
                    f"{' and QK norms' if model.qk_norm else ''}: use metp_ffn (METP on the FFN, Megatron TP on "
                    f"attention)")
        what = [n for n, on in (("sliding windows", model.sliding_layers), ("chunked attention", model.chunked_layers),
                                ("attention sinks", model.attention_sinks)) if on]
        if what:
            return (f"two-level METP attention runs full causal attention round its inner K/V ring; {model.name} has "
                    f"{' and '.join(what)}: use metp_ffn (METP on the FFN, Megatron TP on attention)")
        if model.n_kv_heads % layout.tp:
            return f"kv heads ({model.n_kv_heads}) not divisible by tp ({layout.tp}) (METP's outer loop over head groups)"
        return None

    def recompute_scratch(self, layout, frac, tb, full_h, blocks):
        """h1 = x + attn W_proj: the dropped tokens' proj (local rows) and the double buffer of the
        W_proj blocks travelling a ring."""
        return [("recompute_proj", frac * tb["proj"]), ("metp_wproj_double_buffer", 2 * blocks()["wproj_block"])]


METP = FLAVOURS.add(Metp.name, Metp())
