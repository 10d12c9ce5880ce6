"""A review of `memo-sim export` and the framework data (2026-12-01, h5): Megatron-LM's ring CP beside a sliding
window (TransformerEngine asserts), DeepSpeed's TP -> Ulysses change checked with memo's leftover TP flavour and ZeRO
stage, DeepSpeed-MoE layouts priced for a model its script does not train, torchtitan's small Qwen3 flavours, and the
reason a torchtitan optimizer-offload plan keeps the optimizer on the GPU. Each test failed on the code before the
fixes."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.export import export_plan
from memo_sim.export import deepspeed as ds
from memo_sim.export import megatron as meg
from memo_sim.export import torchtitan as tt
from memo_sim.export.base import nearest_plan
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy
from memo_sim.search.frameworks import get_framework

PROFILE = "h100-sxm5-80gb"


def _plan(layout: Layout, model="llama-3.1-8b", batch=1, seq=16384, policy=("full_recompute",), framework="any",
          profile=PROFILE) -> Plan:
    m = get_model(model) if isinstance(model, str) else model
    return Plan(model=m, batch=batch, seq_tokens=seq, gpus=layout.gpus, layout=layout, policy=get_policy(*policy),
                profile=profile, predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, schedule="", framework=framework)


def _words(script: str) -> list[str]:
    return [w for ln in script.splitlines() if ln.startswith("    ") for w in ln.rstrip(" \\").split()]


def _windowed(model="llama-3.1-8b"):
    """A dense model with a sliding window on every layer (Mistral-7B-v0.1's kind)."""
    m = get_model(model)
    return dataclasses.replace(m, name="windowed", sliding_window=4096, sliding_layers=m.layers)


# 1. Megatron-LM: no ring CP beside a sliding window


def test_megatron_data_offers_no_ring_cp_for_a_windowed_model():
    """TransformerEngine asserts a sliding window runs under a2a or all_gather CP only; Megatron's default is p2p."""
    fw = get_framework("megatron").for_layouts_of(_windowed())
    why = fw.why_not(Layout(tp=2, sp=True, cp=2, dp=2))
    assert why and "sliding window" in why
    assert fw.why_not(Layout(tp=2, sp=True, ulysses=2, dp=2)) is None  # a2a alone runs a window
    assert get_framework("megatron").for_layouts_of(get_model("llama-3.1-8b")).why_not(
        Layout(tp=2, sp=True, cp=2, dp=2)) is None  # no window: the ring as before


def test_megatron_export_writes_a2a_not_a_p2p_ring_for_a_window():
    plan = _plan(Layout(tp=2, sp=True, cp=2, dp=2), model=_windowed())
    ex = export_plan(plan, "megatron", price=False, nearest=True)
    words = _words(ex.files["megatron.sh"])
    assert "--window-size" in words
    at = words.index("--cp-comm-type")
    assert words[at + 1] == "a2a" and words[words.index("--context-parallel-size") + 1] == "2"
    assert any("sliding window" in g.what for g in ex.gaps)


def test_megatron_export_refuses_a_window_ring_it_cannot_replace():
    """64 query heads over TP 8 x an all-to-all of 16 do not split, and one sequence does not split over replicas:
    one line, no script."""
    m = dataclasses.replace(_windowed("llama-3.1-70b"), name="windowed-70b")
    plan = _plan(Layout(tp=8, sp=True, cp=16), model=m, seq=131072)
    with pytest.raises(MemoError, match="sliding window"):
        meg.gaps(plan)


# 2. DeepSpeed: the TP -> Ulysses change resets TP's flavour and raises ZeRO as the writer does


def test_deepspeed_tp_change_resets_metp_and_raises_zero_for_offload():
    plan = _plan(Layout(tp=8, sp=True, tp_mode="metp", optimizer_offload=True), model="llama-3.1-70b", seq=8192)
    gaps = ds.gaps(plan)  # raised "metp needs a tensor-parallel degree of at least 2" before the fix
    lay = nearest_plan(plan, gaps)[0]
    assert (lay.tp, lay.ulysses, lay.tp_mode, lay.zero) == (1, 8, "megatron", 1)
    cfg = json.loads(ds.export(plan, price=False).files["ds_config.json"])
    assert cfg["zero_optimization"]["stage"] == lay.zero


def test_deepspeed_tp_change_raises_zero_for_offload_megatron_tp():
    """A Megatron plan's optimizer offload at ZeRO 0 over one data-parallel rank: as Ulysses ranks it is ZeRO 1."""
    plan = _plan(Layout(tp=8, sp=True, optimizer_offload=True), model="llama-3.1-70b", seq=8192)
    lay = nearest_plan(plan, ds.gaps(plan))[0]  # raised "optimizer offload runs with the distributed optimizer"
    assert (lay.ulysses, lay.zero, lay.optimizer_offload) == (8, 1, True)


# 3. DeepSpeed-MoE: a model its gate and experts cannot build is refused, not priced


def test_deepspeed_whatif_refuses_a_moe_it_cannot_build():
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-oss-20b", "--layers", "2", "--gpus", "8", "--seq", "16K",
                                  "--profile", PROFILE, "--framework", "deepspeed"])
    assert r.exit_code == 2, r.output
    assert "biases on the experts and the gate" in r.output and "Traceback" not in r.output
    assert ds.moe_why_not(get_model("gpt-oss-20b"))  # the exporter's rule is the framework data's


def test_deepspeed_export_does_not_price_a_moe_it_does_not_write():
    plan = _plan(Layout(ep=8, dp=8, zero=1), model="gpt-oss-20b", seq=16384)
    ex = ds.export(plan)
    assert ex.nearest is not None and "MoE layers" in (ex.nearest.get("error") or "")


# 4. torchtitan: Qwen3-0.6B / 1.7B / 4B are its flavours


@pytest.mark.parametrize("fields,base,flavour", [
    ({"hidden": 1024, "layers": 28, "heads": 16, "ffn": 3072}, "qwen3_0_6b", None),
    ({"hidden": 2048, "layers": 28, "heads": 16, "ffn": 6144}, "qwen3_1_7b", None),
    ({"hidden": 2560, "layers": 36, "heads": 32, "ffn": 9728}, "qwen3_1_7b", "4B")])
def test_torchtitan_small_qwen3_flavours(fields, base, flavour):
    m = dataclasses.replace(get_model("qwen3-8b"), name="my-qwen3", tied_embeddings=True, **fields)
    plan = _plan(Layout(), model=m, seq=8192)
    ex = export_plan(plan, "torchtitan", price=False, nearest=True)
    text = ex.files[tt.FILE]
    assert "NotImplementedError" not in text and f"import {base}" in text
    assert tt._flavour(plan) == flavour
    if flavour:
        assert f"model_registry({flavour!r}" in text or f'model_registry("{flavour}"' in text


# 6. torchtitan: why the optimizer stays on the GPU


def test_torchtitan_offload_gap_names_fsdp_cpu_offload():
    plan = _plan(Layout(dp=8, zero=3, optimizer_offload=True), seq=8192)
    gap = next(g for g in tt.gaps(plan) if "optimizer offload" in g.what)
    assert "enable_cpu_offload" in gap.nearest and "not the same mechanism" in gap.nearest
