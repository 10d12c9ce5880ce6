"""What a layer keeps for its backward under a Ulysses that keeps the attention kernel's head-sharded tensors
(``Layout.ulysses_bwd_resend`` False: DeepSpeed, XTuner, Megatron's a2a CP), against the closed form
(`memo_sim.cost.activations.ulysses_kept_scale`).

Found 2026-12-02: the all-to-all saves nothing (DeepSpeed's ``_SeqAllToAll``), FlashAttention saves the head-sharded
q, k, v and out it ran on, and the output projection its sequence-sharded input, so per layer such a rank keeps K and
V r times (each K/V head repeated before the all-to-all) and the attention output twice; memo priced the
sequence-sharded q, k, v and attn once, as a re-sending Ulysses (memo's executor) keeps them. Llama 3.1 8B over
Ulysses 8 with DeepSpeed's repeat to the query heads (r = 32 / 8 = 4), 64K tokens: 8,192 tokens a GPU, K and V
16 MiB each, attn 64 MiB, so (r - 1)(k + v) + attn = 160 MiB a layer more, 5 GiB over the 32 layers."""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy.registry import get_policy
from memo_sim.profile.loader import load_profile

MIB = 1 << 20
M8 = get_model("llama-3.1-8b")
SEQ = 64 * 1024
KEEP = Layout(ulysses=8, zero=3, ulysses_kv="query_heads")  # ulysses_bwd_resend False: the frameworks'
RESEND = dataclasses.replace(KEEP, ulysses_bwd_resend=True)  # memo's executor: sequence-sharded tensors re-sent
EXTRA = (4 - 1) * (16 + 16) * MIB + 64 * MIB  # (r - 1)(k + v) + attn, one layer on one GPU


def test_the_closed_form_per_layer():
    assert KEEP.kv_repeat(M8.n_kv_heads, M8.heads) == 4
    keep, resend = skeletal_bytes(M8, KEEP, 1, SEQ), skeletal_bytes(M8, RESEND, 1, SEQ)
    assert keep["total"] - resend["total"] == EXTRA
    assert keep["other"] - resend["other"] == 3 * 32 * MIB  # K/V's repeats
    assert keep["attn"] - resend["attn"] == 64 * MIB  # the kernel's head-sharded output beside the projection's input
    assert keep["input"] == resend["input"] and keep["lse"] == resend["lse"]
    # the minimal repeat (r = 1: one K/V head a rank): the attention output's second copy alone
    minimal = Layout(ulysses=8, zero=3)
    assert minimal.kv_repeat(M8.n_kv_heads, M8.heads) == 1
    assert skeletal_bytes(M8, minimal, 1, SEQ)["total"] - resend["total"] == 64 * MIB
    # no Ulysses: the layout flag changes nothing
    assert (skeletal_bytes(M8, Layout(dp=8, zero=3), 1, SEQ)["total"]
            == skeletal_bytes(M8, Layout(dp=8, zero=3, ulysses_bwd_resend=True), 1, SEQ)["total"])


def test_store_all_keeps_it_selective_recompute_does_not():
    keep, resend = skeletal_bytes(M8, KEEP, 1, SEQ), skeletal_bytes(M8, RESEND, 1, SEQ)
    store, sel = get_policy("store_all"), get_policy("selective_recompute")
    assert store.resident_bytes(keep, 32) - store.resident_bytes(resend, 32) == 32 * EXTRA
    # selective recompute checkpoints the attention core: its inputs (the sequence-sharded q, k, v) are kept, the
    # kernel's head-sharded tensors rebuilt before the backward
    assert sel.resident_bytes(keep, 32) == sel.resident_bytes(resend, 32)


def test_the_event_simulators_peak_moves_by_the_layers_extra():
    """The caching allocator's replay (`memo_sim.memplan.iteration_requests`) keeps the same bytes as the analytic
    sum: store-all's peak, 64K tokens on 8 A100s, 5 GiB higher (32 layers x 160 MiB)."""
    prof = load_profile("a100-sxm4-80gb")
    peaks = [simulate(M8, lay, 1, SEQ, get_policy("store_all"), prof, keep_timeline=False).peak_gpu_bytes
             for lay in (KEEP, RESEND)]
    assert peaks[0] - peaks[1] == pytest.approx(32 * EXTRA, rel=0.01)
