"""Where a framework's FP8 library casts the layer weights (`memo_sim.cost.gemm_format.weight_use_cast_seconds`):
torchao eab345c (torchtitan@2024-12, ``fp8_weights_saved``) casts each weight in every forward and recompute and its
backward reads the saved copy; the later torchao (``fp8_weights_per_use``) casts it at every use; TransformerEngine
keeps a per-step cache re-cast after the optimizer step. A GEMM priced as async TP's token chunks casts its weight
once, not once a chunk."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.gemm_format import weight_recast_bytes
from memo_sim.cost.layer_time import backward_costs, forward_costs, full_recompute_costs
from memo_sim.frameworks import load_frameworks
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
BASE = replace(PRESETS["llama-3.1-70b"], gemm_format="fp8-tensorwise")
SAVED = replace(BASE, fp8_weights_saved=True)
PER_USE = replace(BASE, fp8_weights_per_use=True)


def _seconds(costs) -> float:
    return sum(c.seconds for c in costs if c.stream == "compute")


def _phases(model, lay, batch=1, seq=8192):
    return (forward_costs(model, lay, batch, seq, H100), full_recompute_costs(model, lay, batch, seq, H100),
            backward_costs(model, lay, batch, seq, H100))


def test_torchtitan_2024_12_casts_each_weight_in_every_forward_and_recompute_not_in_the_backward():
    assert load_frameworks()["torchtitan@2024-12"].fp8_weights_saved
    lay = Layout(tp=8, sp=True)
    fwd, rec, bwd = (_seconds(s) - _seconds(b) for s, b in zip(_phases(SAVED, lay), _phases(BASE, lay)))
    assert fwd > 0 and rec == pytest.approx(fwd)
    assert bwd == pytest.approx(0.0, abs=1e-12)
    # the backward reads the saved copy: no cast after the optimizer step either (a cache would be re-cast there)
    assert weight_recast_bytes(SAVED, 80, lay) == 0 and weight_recast_bytes(BASE, 80, lay) > 0
    # per use: the backward casts it again for the data gradient
    per_use_bwd = _seconds(backward_costs(PER_USE, lay, 1, 8192, H100)) - _seconds(backward_costs(BASE, lay, 1, 8192, H100))
    assert per_use_bwd == pytest.approx(fwd)


@pytest.mark.parametrize("model", [SAVED, PER_USE], ids=["saved", "per_use"])
def test_async_tp_casts_a_weight_once_not_once_a_chunk(model):
    """The micro-pipeline pass splits the matmul into tp chunks of the tokens, all reading the one quantised weight:
    the weight casts of a layer under async TP are those of the same layer under Megatron TP (a review found them
    counted once a chunk, tp times over)."""
    sync, asyn = Layout(tp=8, sp=True), Layout(tp=8, sp=True, tp_mode="async_tp")
    for s_model, s_base, a_model, a_base in zip(_phases(model, sync), _phases(BASE, sync), _phases(model, asyn),
                                                _phases(BASE, asyn)):
        assert _seconds(a_model) - _seconds(a_base) == pytest.approx(_seconds(s_model) - _seconds(s_base), rel=1e-9)
    fwd = forward_costs(model, asyn, 1, 8192, H100)
    casts = [c for c in fwd if c.name.endswith("_weight_cast")]
    assert casts and all(c.kind == "elementwise" and c.overlaps == 0 for c in casts)
    # each cast runs before its pair's collective, which runs beside the chunks
    for c in casts:
        k = fwd.index(c)
        assert fwd[k + 1].stream == "comm" and fwd[k + 1].overlaps == 1


def test_torchao_tp_styles_cast_the_gathered_operands_on_the_shard_and_gather_them_quantised():
    """torchao eab345c's Float8 TP styles (``fp8_sp_gathers``, torchtitan@2024-12): PrepareFloat8ModuleInput casts a
    column-parallel GEMM's input on the rank's sequence shard and the forward all-gathers the FP8 copy;
    Float8RowwiseParallel's NoopFwToFloat8BwDynamic casts a row-parallel GEMM's output gradient to e5m2 on the shard
    before the backward's all-gather (a review found that gather priced in bf16 and both casts on the gathered
    tokens)."""
    from memo_sim.cost.gemm_format import cast_seconds

    tt = replace(BASE, fp8_saved_inputs=True)
    gathers = replace(tt, fp8_sp_gathers=True)
    lay = Layout(tp=8, sp=True)
    batch, seq = 2, 8192
    fwd = {c.name: c for c in forward_costs(gathers, lay, batch, seq, H100)}
    fwd0 = {c.name: c for c in forward_costs(tt, lay, batch, seq, H100)}
    bwd = {c.name: c for c in backward_costs(gathers, lay, batch, seq, H100)}
    bwd0 = {c.name: c for c in backward_costs(tt, lay, batch, seq, H100)}
    for name in ("allgather_ln1", "allgather_ln2", "allgather_out_proj", "allgather_fc2"):
        src = fwd if name in fwd else bwd
        base = fwd0 if name in fwd0 else bwd0
        assert src[name].nbytes == pytest.approx(base[name].nbytes / 2), name  # e4m3 / e5m2 against bf16
    # the re-gathers of the column-parallel inputs for the weight gradient stay as they were (not modelled: torch
    # keeps the gathered tensor; the framework data says so)
    assert bwd["allgather_qkv_input"].nbytes == bwd0["allgather_qkv_input"].nbytes
    tokens = batch * seq
    h = BASE.hidden
    # qkv's input cast: on 1/8 of the tokens (the shard) instead of all of them
    saved = cast_seconds(tt, H100, tokens * h) - cast_seconds(tt, H100, tokens * h / 8)
    assert fwd0["qkv"].seconds - fwd["qkv"].seconds == pytest.approx(saved, rel=1e-9)
    # the row-parallel GEMMs' forward is as before; their backward's output-gradient cast on the shard
    assert fwd["out_proj"].seconds == pytest.approx(fwd0["out_proj"].seconds, rel=1e-12)
    saved_b = cast_seconds(tt, H100, tokens * h) - cast_seconds(tt, H100, tokens * h / 8)
    assert bwd0["out_proj"].seconds - bwd["out_proj"].seconds == pytest.approx(saved_b, rel=1e-9)
    # a column-parallel GEMM's backward (its output gradient is local) is unchanged
    assert bwd["qkv"].seconds == pytest.approx(bwd0["qkv"].seconds, rel=1e-12)


def test_a_gemm_fed_by_a_collective_and_draining_into_its_own_is_paired_once():
    """A GEMM both fed by an all-gather and followed by its own reduce-scatter (none of today's layer graphs has one)
    is paired with the first and leaves the second on the critical path: its chunks priced once (a review: the check
    for 'already paired' read the pair's first op, which the per-use weight cast now is)."""
    from memo_sim.cost.layer_time import _ops_with_comm
    from memo_sim.model.layer_graph import OpSpec

    h = BASE.hidden
    ops = [OpSpec("ln1", "norm", ("x",), ("ln1",), tp_comm_after="gather"),
           OpSpec("qkv", "gemm", ("ln1",), ("q",), gemm=(h, h), tp_comm_after="reduce", scope="tp")]
    for model in (BASE, PER_USE):
        sync = _ops_with_comm(ops, model, Layout(tp=8, sp=True), 1, 8192, H100, "fwd")
        asyn = _ops_with_comm(ops, model, Layout(tp=8, sp=True, tp_mode="async_tp"), 1, 8192, H100, "fwd")
        assert sum(c.flops for c in asyn if c.kind == "gemm") == pytest.approx(sum(c.flops for c in sync
                                                                                   if c.kind == "gemm"))
        assert [c.name for c in asyn if c.stream == "comm"] == ["allgather_ln1", "reducescatter_qkv"]
        assert len([c for c in asyn if c.name.endswith("_weight_cast")]) == (model is PER_USE)
