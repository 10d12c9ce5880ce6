"""ZeRO 2 / 3's buckets of whole gradients (`memo_sim.cost.memory.unsharded_grad_units`, ``Layout.reduce_bucket``):
two buckets whole at once where the reductions overlap the backward (the one being reduce-scattered and the next
being made: memo-exec's two layer workspaces, FSDP2's reduce-scatter input beside the next layer's gradients,
DeepSpeed's two ipg buckets), one where they do not; a bucket is one layer's, or the elements the framework's
configuration states (XTuner's deepspeed_zero3.json: 3e8); memo's DeepSpeed export writes the bucket it priced."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.memory import model_state_parts, sharded_layer_params, unsharded_grad_units
from memo_sim.search.frameworks import get_framework
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model


def _unsharded(model, lay) -> float:
    return model_state_parts(model, lay)["unsharded_grads"]


@pytest.mark.parametrize("zero", [2, 3])
def test_overlapped_reductions_hold_two_layers_whole_gradients(zero):
    m = get_model("llama-3.1-8b")
    lay = Layout(dp=8, zero=zero)
    layer = sharded_layer_params(m, lay)
    two, one = _unsharded(m, lay), _unsharded(m, replace(lay, grad_overlap=False))
    assert unsharded_grad_units(lay) == 2 and unsharded_grad_units(replace(lay, grad_overlap=False)) == 1
    assert two - one == pytest.approx(m.recipe.grad_bytes * layer)  # one more layer's gradients, nothing else
    assert layer == m.layer_params()  # Llama 3.1 8B: 218M a layer on one GPU (no TP)


def test_a_stated_bucket_smaller_than_a_layer_bounds_them():
    m = get_model("llama-3.1-8b")  # 218M a layer
    lay = Layout(dp=8, zero=3)
    small = replace(lay, reduce_bucket=50_000_000)
    big = replace(lay, reduce_bucket=10**9)  # larger than a layer: the layer's, as the reduction takes a layer
    g = m.recipe.grad_bytes
    assert _unsharded(m, lay) - _unsharded(m, small) == pytest.approx(2 * g * (m.layer_params() - 50_000_000))
    assert _unsharded(m, big) == _unsharded(m, lay)


def test_zero_below_2_holds_no_bucket_and_frameworks_set_theirs():
    m = get_model("llama-3.1-8b")
    assert _unsharded(m, Layout(dp=8, zero=1)) == 0.0
    xt = get_framework("xtuner")
    assert xt.adapt(Layout(ulysses=8, zero=3)).reduce_bucket == 300_000_000
    assert xt.adapt(Layout(ulysses=8, zero=1)).reduce_bucket == 0  # ZeRO 1 keeps the gradients whole
    for name in ("any", "deepspeed", "torchtitan", "megatron"):
        assert get_framework(name).adapt(Layout(dp=8, zero=2)).reduce_bucket == 0  # a layer's


def test_layout_files_name_the_bucket_only_where_stated():
    assert "reduce_bucket" not in Layout(dp=8, zero=3).to_dict()
    d = Layout(dp=8, zero=3, reduce_bucket=300_000_000).to_dict()
    assert d["reduce_bucket"] == 300_000_000


def test_the_deepspeed_export_writes_the_priced_bucket():
    from memo_sim.export.deepspeed import _reduce_bucket

    m = get_model("llama-3.1-8b")
    assert _reduce_bucket(m, Layout(dp=8, zero=2)) == {"reduce_bucket_size": m.layer_params()}
    assert _reduce_bucket(m, Layout(dp=8, zero=3, reduce_bucket=5 * 10**7)) == {"reduce_bucket_size": 5 * 10**7}
    assert _reduce_bucket(m, Layout(dp=8, zero=0)) == {}
