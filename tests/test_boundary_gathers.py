"""The embedding's and the head's units are gathered as a layer's are from ZeRO 1 on (`memo_sim.cost.grad_sync`,
``embedding_gather`` / ``head_gather``): torchtitan's ``fully_shard(model.tok_embeddings)`` and
``fully_shard([model.norm, model.output])``, Megatron-LM's distributed optimizer gathering every bucket. Before, the
simulator gathered the layers only, while memo-exec gathers its embedding-and-head unit every step: with Llama 3's
128K vocabulary the two hold 1.05B of 8.0B parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from memo_sim.cost import collectives as coll
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.memory import model_state_parts
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.policy import get_policy
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.search.estimate import estimate_iteration

H100 = load_profile("h100-sxm5-80gb")
TOY = ModelConfig("toy", layers=4, hidden=2048, heads=16, ffn=8192, vocab=128256, tied_embeddings=False)
STORE = get_policy("store_all")


def _ops(layout, model=TOY, batch=1, **kw):
    r = simulate(model, layout, batch, 4096, STORE, H100, record=True, keep_timeline=False, **kw)
    assert r.status == "OK", r.status
    return r, r.ops


def _named(ops, name):
    return [o for o in ops if o.name == name]


def test_the_units_are_priced_as_a_ring_all_gather_of_their_weights():
    lay = Layout(dp=8, zero=1)
    sync = grad_sync(TOY, lay, H100)
    link = coll.group_link(H100, 8, 1)
    w = TOY.recipe.weight_bytes
    assert sync.embedding_gather == pytest.approx(coll.ring_allgather_time(
        w * TOY.vocab * TOY.hidden, 8, *coll.link_params(link, "all_gather")))
    assert sync.head_gather == pytest.approx(coll.ring_allgather_time(
        w * (TOY.vocab * TOY.hidden + TOY.norm_params), 8, *coll.link_params(link, "all_gather")))
    # the embedding here is 2.5 layers' worth of weights: no small thing next to a layer's gather
    assert sync.embedding_gather > 2 * sync.layer_gather
    # TP splits them by vocabulary; tied on one stage the head's unit is the final norm alone
    assert grad_sync(TOY, Layout(dp=4, tp=2, zero=1), H100).embedding_gather < sync.embedding_gather
    tied = grad_sync(replace(TOY, tied_embeddings=True), lay, H100)
    assert 0 < tied.head_gather < sync.head_gather / 10
    for none in (Layout(dp=8), Layout(tp=8, zero=1)):  # no ZeRO, or no replicas: nothing gathered
        s = grad_sync(TOY, none, H100)
        assert s.embedding_gather == s.head_gather == 0.0


def test_zero1_gathers_each_unit_once_before_the_op_that_reads_it():
    for mb in (1, 2):
        r, ops = _ops(Layout(dp=8, zero=1), batch=2, micro_batch=1 if mb == 2 else None)
        (emb_g,), (head_g,) = _named(ops, "allgather_embedding"), _named(ops, "allgather_head")
        first_emb = min((o for o in ops if o.name.startswith("embedding") and o.phase == "fwd"), key=lambda o: o.start)
        cls = min((o for o in ops if o.name.startswith("classifier")), key=lambda o: o.start)
        assert emb_g.end <= first_emb.start + 1e-12 and head_g.end <= cls.start + 1e-12
        assert emb_g.stream == head_g.stream == "dp_comm"
    _r0, ops0 = _ops(Layout(dp=8))
    assert not _named(ops0, "allgather_embedding") and not _named(ops0, "allgather_head")


def test_the_embedding_gather_is_exposed_at_the_step_start():
    """Nothing runs before the embedding: its gather adds its seconds to the step, in the simulation and in the
    analytic estimate (the layer gathers behind it are as they were)."""
    lay = Layout(dp=8, zero=1)
    sync = grad_sync(TOY, lay, H100)
    r, ops = _ops(lay)
    (emb_g,) = _named(ops, "allgather_embedding")
    assert emb_g.start == pytest.approx(0.0, abs=1e-12)
    emb = min((o for o in ops if o.name.startswith("embedding")), key=lambda o: o.start)
    assert emb.start >= sync.embedding_gather - 1e-12
    est = estimate_iteration(TOY, lay, 1, 4096, STORE, H100)
    assert est.grad_sync_exposed_s >= sync.embedding_gather


def test_zero3_gathers_the_embedding_again_for_its_backward_and_fsdp_keeping_weights_does_not():
    z3 = Layout(dp=8, zero=3)
    _r, ops = _ops(z3)
    embs = _named(ops, "allgather_embedding")
    assert sorted(o.phase for o in embs) == ["weight_gather", "weight_gather_bwd"]
    emb_bwd = [o for o in ops if o.name.startswith("embedding") and o.phase == "bwd"][0]
    assert max(o.end for o in embs) <= emb_bwd.start + 1e-12
    assert len(_named(ops, "allgather_head")) == 1  # the head's op holds its forward and backward
    keep = Layout(dp=8, zero=3, dp_mode="fsdp", reshard_after_forward=False)
    _r, ops = _ops(keep)
    assert [o.phase for o in _named(ops, "allgather_embedding")] == ["weight_gather"]
    # ... and then holds the embedding gathered to its backward (untied: a unit of its own)
    w = TOY.recipe.weight_bytes
    assert model_state_parts(TOY, keep)["gathered_embedding"] == pytest.approx(w * TOY.vocab * TOY.hidden)
    assert model_state_parts(TOY, z3)["gathered_embedding"] == 0
    assert model_state_parts(replace(TOY, tied_embeddings=True), keep)["gathered_embedding"] == 0


def test_on_a_pipeline_the_first_stage_gathers_the_embedding_and_the_last_the_head():
    lay = Layout(dp=4, pp=2, zero=1)
    _r, ops = _ops(lay, batch=4, micro_batch=1, schedule="1f1b")
    stage_of = {d: i for i, d in enumerate(sorted({o.device for o in ops}))}
    (e,), (h,) = _named(ops, "allgather_embedding"), _named(ops, "allgather_head")
    assert stage_of[e.device] == 0 and stage_of[h.device] == 1
    # SPPO's stages the same way
    sppo = dataclasses.replace(Sppo(None, subseqs=2).with_bounds(TOY, lay, 1, 8192), alphas=(0.5, 0.5))
    r = simulate(TOY, lay, 1, 8192, sppo, H100, record=True, keep_timeline=False)
    assert r.status == "OK"
    stage_of = {d: i for i, d in enumerate(sorted({o.device for o in r.ops}))}
    (e,), (h,) = _named(r.ops, "allgather_embedding"), _named(r.ops, "allgather_head")
    assert stage_of[e.device] == 0 and stage_of[h.device] == 1


def test_a_large_vocabulary_model_steps_slower_by_its_exposed_embedding_gather(monkeypatch):
    """Llama 3.1 8B under ZeRO 1 over 16 GPUs of two nodes: the embedding's gather (2 x 128256 x 4096 bytes over the
    inter-node ring) is exposed before the first layer's, so the step grows by at least its seconds over the same
    step with the two units left out."""
    from memo_sim.engine.schedules import single_stage

    m = PRESETS["llama-3.1-8b"]
    lay = Layout(dp=16, zero=1)
    sync = grad_sync(m, lay, H100)
    assert sync.link == "internode" and sync.embedding_gather > 1e-3
    policy = get_policy("full_recompute")
    with_units = simulate(m, lay, 1, 8192, policy, H100, keep_timeline=False).iteration_s
    monkeypatch.setattr(single_stage, "grad_sync",
                        lambda *a, **k: replace(grad_sync(*a, **k), embedding_gather=0.0, head_gather=0.0))
    without = simulate(m, lay, 1, 8192, policy, H100, keep_timeline=False).iteration_s
    assert with_units - without >= sync.embedding_gather * 0.99


def test_a_one_layer_model_gathers_the_embedding_for_its_backward_two_units_ahead():
    """Issued at the forward's end beside the layer's own (a review: it was issued after the one layer's backward,
    wholly exposed)."""
    one = replace(TOY, layers=1)
    _r, ops = _ops(Layout(dp=8, zero=3), model=one)
    (bwd_g,) = [o for o in _named(ops, "allgather_embedding") if o.phase == "weight_gather_bwd"]
    layer_bwd = [o for o in ops if o.layer == 0 and o.phase == "bwd" and o.stream == "compute"]
    assert bwd_g.start < min(o.start for o in layer_bwd)


def test_the_head_is_gathered_again_for_its_backward_where_the_flavour_drops_it():
    """DeepSpeed's ZeRO-3 releases the head's parameters after its forward, torchtitan keeps [norm, output] gathered;
    on one stage with resharding a tied embedding is gathered again for the head that reads it."""
    z3, keep = Layout(dp=8, zero=3), Layout(dp=8, zero=3, dp_mode="fsdp", reshard_after_forward=False)
    fsdp = Layout(dp=8, zero=3, dp_mode="fsdp")
    once = grad_sync(TOY, fsdp, H100).head_gather
    assert grad_sync(TOY, z3, H100).head_gather == pytest.approx(2 * once)
    assert grad_sync(TOY, keep, H100).head_gather == pytest.approx(once)
    tied = replace(TOY, tied_embeddings=True)
    emb = grad_sync(tied, z3, H100).embedding_gather
    assert grad_sync(tied, z3, H100).head_gather > emb  # ZeRO-3: the embedding gathered again, with the norm
    # FSDP2 (torchtitan's apply_fsdp_to_decoder): a tied [tok_embeddings, norm, lm_head] is one unit, kept from the
    # embedding's forward whether or not the layers reshard: nothing gathered for the head
    # (tests/test_review_fixes_fsdp_dec1b.py; the review found it gathered three times)
    for lay in (fsdp, keep):
        s = grad_sync(tied, lay, H100)
        assert s.head_gather == 0.0 and s.embedding_kept and s.embedding_gather > emb
    assert grad_sync(tied, Layout(dp=8, zero=1), H100).head_gather < emb / 10


def test_sppo_on_one_stage_reduces_the_heads_bucket_too():
    """`GradSync.end_bucket` of a single stage holds the embedding's and the head's buckets (a review: SPPO at pp 1
    left the head's out)."""
    lay = Layout(dp=8, zero=1)
    sync = grad_sync(TOY, lay, H100)
    assert sync.end_bucket(0, 1) == pytest.approx(sync.embedding_grad + sync.head_grad)
    assert sync.end_bucket(0, 2) == sync.embedding_grad and sync.end_bucket(1, 2) == sync.head_grad
    sppo = dataclasses.replace(Sppo(None, subseqs=2).with_bounds(TOY, lay, 1, 8192), alphas=(0.5, 0.5))
    r = simulate(TOY, lay, 1, 8192, sppo, H100, record=True, keep_timeline=False)
    ends = [o for o in r.ops if o.name == "reducescatter_grads" and o.layer is None]
    assert len(ends) == 1 and ends[0].end - ends[0].start >= sync.embedding_grad + sync.head_grad - 1e-12
