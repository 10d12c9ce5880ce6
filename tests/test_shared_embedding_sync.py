"""A weight two pipeline stages hold: the tied embedding (or the embedding the multi-token-prediction modules read
on the last stage) has its two gradients summed between the first and last stage after the data-parallel
reduction, before the optimizer step (`memo_sim.cost.grad_sync.shared_embedding_seconds`; Megatron-LM's
finalize_model_grads ``_allreduce_word_embedding_grads``), in every pipeline schedule and analytic tier; and an end
stage reduces its own V x h / TP, not the embedding and the classifier both."""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.cost import collectives as coll
from memo_sim.cost.grad_sync import grad_sync, shared_embedding_seconds
from memo_sim.cost.sppo import stage_grad_sync
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout, stages_cross_nodes
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.policy import get_policy
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.search.estimate import estimate_pipeline
from memo_sim.search.sppo import estimate_sppo, solve_alphas

A800 = load_profile("a800-80gb")
GPT7 = get_model("gpt-7b")  # tied embeddings
LLAMA = get_model("llama-2-7b")  # untied


def test_the_sum_is_a_two_rank_all_reduce_of_the_embedding_gradient():
    for lay in (Layout(tp=8, pp=2, dp=2), Layout(tp=2, pp=2, dp=1), Layout(tp=1, pp=4, dp=2)):
        link = A800.internode if stages_cross_nodes(lay, 0, lay.pp - 1, A800.node_gpus) else A800.nvlink
        nbytes = GPT7.recipe.grad_reduce_bytes * GPT7.vocab * GPT7.hidden / lay.tp
        want = coll.allreduce_time(nbytes, 2, *coll.link_params(link, "all_reduce"))
        got, kind = shared_embedding_seconds(GPT7, lay, A800)
        assert got == pytest.approx(want) and got > 0
        assert kind == coll.link_kind(A800, link)
        assert stage_grad_sync(GPT7, lay, A800).shared_embedding == pytest.approx(want)
    # tp 8 x pp 2: the two stages on two nodes (the inter-node link); tp 2 x pp 2 inside one node
    assert shared_embedding_seconds(GPT7, Layout(tp=8, pp=2, dp=2), A800)[1] == "internode"
    assert shared_embedding_seconds(GPT7, Layout(tp=2, pp=2, dp=1), A800)[1] == "nvlink"


def test_only_where_two_stages_hold_the_embedding():
    assert shared_embedding_seconds(GPT7, Layout(tp=8, dp=2), A800)[0] == 0.0  # one stage: one copy
    assert shared_embedding_seconds(LLAMA, Layout(tp=8, pp=2, dp=2), A800)[0] == 0.0  # untied, no modules
    mtp = dataclasses.replace(LLAMA, mtp_layers=1)  # the modules read the embedding on the last stage
    assert shared_embedding_seconds(mtp, Layout(tp=8, pp=2, dp=2), A800)[0] > 0.0


def test_the_head_bucket_goes_out_first_and_the_embeddings_last():
    """Megatron-LM's buckets follow the parameters in reverse: the head's (classifier and final norm, on a pipeline's
    last stage or a tied embedding's copy there) is complete once the last micro-batch's head has run its backward and
    is reduced first; the embedding's, complete after the embedding's backward, last. Each V x h / TP; a tied
    embedding on one stage is one matrix, complete only at the end (its head bucket the norm's alone)."""
    one = grad_sync(LLAMA, Layout(tp=8, dp=4), A800)
    two = grad_sync(LLAMA, Layout(tp=8, pp=2, dp=4), A800)
    assert one.embedding_grad == pytest.approx(two.embedding_grad)
    assert one.head_grad == pytest.approx(one.embedding_grad, rel=0.02) and two.head_grad == pytest.approx(
        one.head_grad)
    tied = grad_sync(GPT7, Layout(tp=8, dp=4), A800)
    assert tied.head_grad < 0.01 * tied.embedding_grad
    assert grad_sync(GPT7, Layout(tp=8, pp=2, dp=4), A800).head_grad == pytest.approx(tied.embedding_grad, rel=0.02)
    # the modules' bucket on the last stage carries the embedding copy they read there
    mtp = dataclasses.replace(LLAMA, mtp_layers=1)
    with_copy = grad_sync(mtp, Layout(tp=8, pp=2, dp=4), A800).mtp_grad
    alone = grad_sync(mtp, Layout(tp=8, dp=4), A800).mtp_grad
    assert with_copy > alone * 1.1
    for lay, schedule, dev in ((Layout(tp=8, pp=2, dp=2), "1f1b", 1), (Layout(tp=8, dp=2), "single_stage", 0)):
        r = simulate(LLAMA, lay, 4, 4096, get_policy("full_recompute"), A800, schedule=schedule, micro_batch=1,
                     record=True, keep_timeline=False)
        buckets = sorted((o for o in r.ops if o.device == dev and o.phase == "grad_sync"), key=lambda o: o.start)
        last_head = max(o.end for o in r.ops if o.device == dev and o.name.startswith("classifier"))
        assert buckets[0].layer is None and buckets[0].start == pytest.approx(last_head)  # the head's, first
        assert all(o.layer is not None for o in buckets[1:-1])
        assert (buckets[-1].layer is None) == (dev == 0)  # a first / single stage ends on the embedding's


def _shared_ops(r):
    return [o for o in r.ops if o.name == "sum_shared_embedding_grad"]


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved_1f1b", 2)])
def test_micro_batch_pipelines_wait_for_the_sum(schedule, vpp):
    lay = Layout(tp=8, pp=2, dp=2, vpp=vpp)
    r = simulate(GPT7, lay, 4, 4096, get_policy("full_recompute"), A800, schedule=schedule, micro_batch=1,
                 record=True, keep_timeline=False)
    ops = _shared_ops(r)
    sync = stage_grad_sync(GPT7, lay, A800)
    assert sorted(o.device for o in ops) == [0, 1]
    assert all(o.end - o.start == pytest.approx(sync.shared_embedding, rel=1e-6) for o in ops)
    start = max(o.start for o in ops)
    before = [o for o in r.ops if o.phase in ("bwd", "grad_sync") and o.name != "sum_shared_embedding_grad"]
    assert all(o.end <= start + 1e-12 for o in before)  # after both stages' backward and reduction
    opt = [o for o in r.ops if o.phase == "optimizer" and o.device in (0, 1)]
    assert all(o.start >= min(x.end for x in ops) - 1e-12 for o in opt)


def test_untied_pipelines_have_no_sum_and_one_stage_none():
    lay = Layout(tp=8, pp=2, dp=2)
    r = simulate(LLAMA, lay, 4, 4096, get_policy("full_recompute"), A800, schedule="1f1b", micro_batch=1,
                 record=True, keep_timeline=False)
    assert not _shared_ops(r)
    r = simulate(GPT7, Layout(tp=8, dp=2), 4, 4096, get_policy("full_recompute"), A800, micro_batch=1,
                 record=True, keep_timeline=False)
    assert not _shared_ops(r)


def test_the_analytic_tier_counts_the_sum():
    """dp = 1: no data-parallel buckets, so the estimate's exposed synchronisation is the sum alone."""
    lay = Layout(tp=8, pp=2)
    est = estimate_pipeline(GPT7, lay, 4, 1, 4096, get_policy("full_recompute"), A800)
    assert est.grad_sync_exposed_s == pytest.approx(shared_embedding_seconds(GPT7, lay, A800)[0])
    r = simulate(GPT7, lay, 4, 4096, get_policy("full_recompute"), A800, schedule="1f1b", micro_batch=1,
                 contention=False)
    assert r.iteration_s == pytest.approx(est.iteration_s, rel=0.02)


def test_sppo_waits_for_the_sum():
    toy = ModelConfig("toy", layers=4, hidden=1024, heads=8, ffn=4096, vocab=4096)  # tied (GPT's defaults)
    assert toy.tied_embeddings
    lay, seq = Layout(tp=2, pp=2), 64 * 1024
    a100 = load_profile("a100-sxm4-80gb")
    pol = Sppo(None, subseqs=4, multiplex=False).with_bounds(toy, lay, 1, seq)
    pol = solve_alphas(toy, lay, 1, seq, pol, a100)[0]
    r = simulate(toy, lay, 1, seq, pol, a100, record=True, contention=False)
    ops = _shared_ops(r)
    assert sorted(o.device for o in ops) == [0, 1]
    opt = [o for o in r.ops if o.phase == "optimizer"]
    assert all(o.start >= max(x.end for x in ops) - 1e-12 for o in opt)
    est, _ = estimate_sppo(toy, lay, 1, seq, pol, a100)
    assert r.iteration_s == pytest.approx(est.iteration_s, rel=0.02)


def test_a_stage_sync_is_cached_by_its_stage_count():
    """`stage_grad_sync` is memoised: a single-stage layout with the same group, TP and stride product asked for
    first must not hand a pipeline its (shared-embedding-free) answer (a review found the key without pp)."""
    from memo_sim.cost.memo import clear_caches

    clear_caches()
    one, two = Layout(tp=2, cp=2), Layout(tp=2, pp=2, dp=2)
    assert stage_grad_sync(GPT7, one, A800).shared_embedding == 0.0
    assert stage_grad_sync(GPT7, two, A800).shared_embedding == pytest.approx(
        shared_embedding_seconds(GPT7, two, A800)[0]) and shared_embedding_seconds(GPT7, two, A800)[0] > 0
