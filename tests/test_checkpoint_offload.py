"""Checkpoint offload (`memo_sim.policy.checkpoint_offload`, DeepSpeed's cpu_checkpointing): only the
layer inputs go to host, the whole layer is recomputed, the device keeps two input buffers and one
recompute buffer; the deepspeed framework offers it and the what-if prices and simulates it; and the
loss's memory follows its kernel (`memo_sim.cost.memory.loss_tokens`, `loss_bytes_per_logit`).
The executor's side (gradients, races, memory terms, the plan run on gloo ranks) is in
tests/test_exec_grads.py, test_exec_mutations.py, test_exec_memory.py and test_exec_every_plan_kind.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes, loss_bytes_per_logit, loss_tokens
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import candidates_for

K = 1024
M = get_model("gpt-7b")
A100 = load_profile("a100-sxm4-80gb")
LAY = Layout(ulysses=8, zero=3)


def test_only_the_layer_inputs_go_to_host():
    ck, mo = get_policy("checkpoint_offload"), get_policy("memo", 0.0)
    moved = ck.offloaded_tensors(M, LAY, 1, 256 * K)
    assert [t.name for t in moved if t.rows] == ["x"]  # the input's role only; every other row is rebuilt
    sk = skeletal_bytes(M, LAY, 1, 256 * K)
    assert ck.offload_bytes(M, LAY, 1, 256 * K) == pytest.approx(sk["input"])
    assert mo.offload_bytes(M, LAY, 1, 256 * K) > ck.offload_bytes(M, LAY, 1, 256 * K)  # MEMO also moves attn
    # the two input buffers and the recompute buffer, with the one layer's lse the recompute rebuilds (keeps_lse)
    assert ck.buffer_bytes(sk) == pytest.approx(2 * sk["input"] + sk["total"] - sk["input"] + sk["lse"])
    assert ck.recomputes_attention and ck.recompute_fraction == 1.0
    assert ck.behaviour(8) != get_policy("full_recompute").behaviour(8) != mo.behaviour(8)


def test_simulated_it_holds_less_than_full_recompute_and_takes_no_less_time():
    seq = 128 * K
    lay = replace(LAY, cross_entropy="vocab_parallel")
    ck = simulate(M, lay, 1, seq, get_policy("checkpoint_offload"), A100, keep_timeline=False)
    fr = simulate(M, lay, 1, seq, get_policy("full_recompute"), A100, keep_timeline=False)
    assert ck.status == fr.status == "OK"
    assert ck.peak_gpu_bytes < fr.peak_gpu_bytes  # no layer input kept on the device past its forward
    assert ck.iteration_s >= fr.iteration_s * (1 - 1e-9)  # the same kernels, and copies only add waits
    assert ck.peak_host_bytes_per_node > 0


def test_the_deepspeed_framework_offers_it_and_memos_own_too():
    """DeepSpeed's cpu_checkpointing; memo's own search (any) offers it too since 2026-11-28, as memo-exec runs it;
    a framework without it refuses it in one line."""
    res = candidates_for(M, 128 * K, 8, A100, framework="deepspeed", ulysses=8, zero=3,
                         policies=("checkpoint_offload",))
    assert res.candidates and all(c.policy.name == "checkpoint_offload" for c in res.candidates)
    res = candidates_for(M, 128 * K, 8, A100, framework="any", ulysses=8, zero=3, policies=("checkpoint_offload",))
    assert res.candidates and all(c.policy.name == "checkpoint_offload" for c in res.candidates)
    with pytest.raises(MemoError, match="checkpoint_offload"):
        candidates_for(M, 128 * K, 8, A100, framework="megatron", policies=("checkpoint_offload",))


@pytest.mark.parametrize("kernel,d,want", [
    ("chunked", 2, 10), ("vocab_parallel", 2, 6), ("torch_fused", 2, 12),
    ("chunked", 4, 12), ("vocab_parallel", 4, 4), ("torch_fused", 4, 12)])
def test_loss_bytes_per_logit_by_kernel(kernel, d, want):
    assert loss_bytes_per_logit(kernel, d) == want


def test_the_frameworks_losses_hold_every_tokens_logits_memos_one_chunk():
    seq = 256 * K  # 32K tokens per GPU under Ulysses 8: four of memo's chunks
    chunked, megatron = replace(LAY, cross_entropy="chunked"), replace(LAY, cross_entropy="vocab_parallel")
    assert loss_tokens(chunked, 1, seq) == CLASSIFIER_CHUNK_TOKENS
    assert loss_tokens(megatron, 1, seq) == seq // 8
    small = 4 * K  # fewer tokens than a chunk: the same tokens either way
    assert loss_tokens(chunked, 1, small) == loss_tokens(megatron, 1, small) == small // 8
    hidden = 2 * (seq // 8) * M.hidden * 2  # the final norm output and its gradient, bf16
    assert classifier_peak_bytes(M, megatron, 1, seq) - hidden == pytest.approx((seq // 8) * M.vocab * 6)
    assert classifier_peak_bytes(M, chunked, 1, seq) - hidden == pytest.approx(CLASSIFIER_CHUNK_TOKENS * M.vocab * 10)


@pytest.mark.parametrize("seq,zero", [(64 * K, 1), (256 * K, 3)])
def test_its_proved_bound_never_exceeds_the_simulation(seq, zero):
    from memo_sim.search.bound import lower_bound
    from memo_sim.search.whatif import simulate_candidates

    res = candidates_for(M, seq, 8, A100, framework="deepspeed", ulysses=8, zero=zero,
                         policies=("checkpoint_offload",))
    ok = [c for c in res.candidates if c.memory.status == "OK"][:2]
    assert ok
    simulate_candidates(ok, jobs=1)
    for c in ok:
        assert c.simulated["status"] == "OK"
        assert 0 < lower_bound(c) <= c.simulated["iteration_s"] * (1 + 1e-9)


def test_the_loss_kernels_are_the_layouts_names():
    from memo_sim.cost.loss_kernels import KERNELS
    from memo_sim.model.layer_graph import CROSS_ENTROPY_KERNELS

    assert tuple(KERNELS) == CROSS_ENTROPY_KERNELS  # one kernel table for time and memory, the layout's names


def test_pipeline_rank_holds_four_input_buffers_and_one_recompute_buffer():
    """On a micro-batch pipeline the rank's micro-batches in flight share two forward and two prefetch input buffers
    and one recompute buffer (`memo_exec.activations.checkpoint_offload` on a pipeline rank); the stage memory counts
    them so, where it counted the single stage's buffers twice (the recompute buffer too), and MEMO's four whole
    rounding slots are unchanged."""
    from memo_sim.search.pipeline import pipeline_memory

    lay = Layout(pp=4)
    sk = skeletal_bytes(M, lay, 1, 8 * K)
    mem, _rows = pipeline_memory(M, lay, 8, 1, 8 * K, get_policy("checkpoint_offload"), A100, "1f1b")
    # the recompute buffer with the one layer's lse the recompute rebuilds (`Policy.keeps_lse`)
    assert mem.rounding_buffer_bytes == pytest.approx(4 * sk["input"] + sk["total"] - sk["input"] + sk["lse"])
    mem, _rows = pipeline_memory(M, lay, 8, 1, 8 * K, get_policy("memo", 0.5), A100, "1f1b")
    assert mem.rounding_buffer_bytes == pytest.approx(4 * sk["total"])
