"""torchtitan's per-op selective activation checkpointing (`memo_sim.policy.op_sac`): what it keeps and re-runs,
where it sits between store-all and full recompute, and where it is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.activations import OP_SAC_DROPPED, layer_tensor_bytes, skeletal_bytes
from memo_sim.cost.layer_time import forward_costs
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

LLAMA = PRESETS["llama-3.1-8b"]
PROF = load_profile("h100-sxm5-80gb")


def test_it_drops_the_even_gemms_outputs_and_the_cheap_ops_and_keeps_w2s_output():
    lay = Layout(dp=8, zero=3)
    sk, tb = skeletal_bytes(LLAMA, lay, 1, 8192), layer_tensor_bytes(LLAMA, lay, 1, 8192)
    assert sk["op_sac_dropped"] == pytest.approx(sum(tb[n] for n in OP_SAC_DROPPED) + tb["fc1"] / 2)
    assert sk["op_sac_extra"] == pytest.approx(tb["fc2"])
    gpt = get_model("gpt-7b")  # no gate: w1, w2 are the 5th and 6th GEMMs, so fc1 is kept and fc2 not
    sk = skeletal_bytes(gpt, lay, 1, 8192)
    tb = layer_tensor_bytes(gpt, lay, 1, 8192)
    assert sk["op_sac_dropped"] == pytest.approx(sum(tb[n] for n in OP_SAC_DROPPED)) and sk["op_sac_extra"] == 0


def test_it_reruns_wk_wo_w3_and_the_memory_bound_ops():
    lay = Layout(tp=2, sp=True)
    fwd = {c.name: c for c in forward_costs(LLAMA, lay, 1, 8192, PROF)}
    re = {c.name: c for c in get_policy("op_sac").recompute_costs(LLAMA, lay, 1, 8192, PROF)}
    assert set(re) == {"ln1", "allgather_ln1", "qkv", "out_proj", "reducescatter_out_proj", "add1", "ln2",
                       "allgather_ln2", "fc1", "act"}
    share = LLAMA.kv_dim / (LLAMA.q_dim + LLAMA.kv_dim + LLAMA.v_dim)
    assert re["qkv"].seconds == pytest.approx(fwd["qkv"].seconds * share)
    assert re["fc1"].seconds == pytest.approx(fwd["fc1"].seconds / 2)
    assert re["out_proj"].seconds == pytest.approx(fwd["out_proj"].seconds)
    assert all(c.phase == "recompute" for c in re.values())


def test_it_sits_between_store_all_and_full_recompute():
    lay, prof = Layout(dp=8, zero=3, dp_mode="fsdp"), load_profile("h100-sxm5-96gb-500w")
    res = {p: simulate(LLAMA, lay, 1, 8192, get_policy(p), prof, keep_timeline=False)
           for p in ("store_all", "op_sac", "full_recompute")}
    assert all(r.status == "OK" for r in res.values())
    t = {p: r.iteration_s for p, r in res.items()}
    m = {p: r.peak_gpu_bytes for p, r in res.items()}
    assert t["store_all"] < t["op_sac"] < t["full_recompute"]
    assert m["store_all"] > m["op_sac"] > m["full_recompute"]


def test_refused_where_it_is_not_priced():
    for model, words in ((PRESETS["mixtral-8x7b"], "dense blocks"),
                         (replace(LLAMA, gemm_format="nvfp4"), "NVFP4Linear runs Triton kernels")):
        assert words in get_policy("op_sac").model_why_not(model)
        with pytest.raises(MemoError, match=words):
            simulate(model, Layout(tp=8, sp=True), 1, 4096, get_policy("op_sac"), load_profile("b200-180gb"),
                     keep_timeline=False)
    for fmt in ("fp8-tensorwise", "fp8-rowwise", "mxfp8"):  # torchao's tensor-subclass linears: seen as aten.mm
        assert get_policy("op_sac").model_why_not(replace(LLAMA, gemm_format=fmt)) is None


def _titan_fp8(framework: str, fmt: str):
    from memo_sim.search.frameworks import get_framework

    return get_framework(framework).for_model(replace(LLAMA, gemm_format=fmt))


def test_under_torchtitan_2024_12_float8_eager_keeps_the_abs_outputs_and_a_compiled_block_does_not():
    """torchtitan 9dec370's save list names aten.abs: in eager PyTorch every linear's input (once per linear) and
    weight leave their absolute values saved; in a compiled block the partitioner saves what the backward reads,
    neither those nor w2's output."""
    m = _titan_fp8("torchtitan@2024-12", "fp8-tensorwise")
    assert m.fp8_abs_saved and m.fp8_saved_inputs and m.fp8_weights_saved
    lay = Layout(dp=8, zero=3, dp_mode="fsdp", kernel_fusion="eager")
    sk = skeletal_bytes(m, lay, 2, 8192)
    tb = layer_tensor_bytes(replace(m, gemm_format="bf16"), lay, 2, 8192)  # the tensors in the model dtype (bf16)
    inputs = 3 * tb["ln1"] + tb["attn"] + 2 * tb["ln2"] + tb["act"]
    weights = (m.linear_params() - m.expert_linear_params()) * 2  # bf16 absolute values of the unsharded weights
    assert sk["op_sac_extra"] == pytest.approx(tb["fc2"] + inputs + weights)
    bf16 = skeletal_bytes(replace(m, gemm_format="bf16"), lay, 2, 8192)
    assert bf16["op_sac_extra"] == pytest.approx(tb["fc2"])  # no cast, nothing of it kept
    compiled = skeletal_bytes(m, replace(lay, kernel_fusion="compiled"), 2, 8192)
    assert compiled["op_sac_extra"] == 0 and compiled["op_sac_dropped"] == pytest.approx(sk["op_sac_dropped"])
    # the current torchtitan's list has no aten.abs
    assert not _titan_fp8("torchtitan", "fp8-rowwise").fp8_abs_saved


def test_the_recompute_remakes_the_kept_gemms_casts_where_the_library_saves_them():
    """torchao eab345c saves each linear's FP8 input and weight copies for its backward: not on the save list, so the
    recompute casts them again for the kept GEMMs too, and the weight copy is rebuilt, not kept. torchao 36027d82
    keeps the high-precision tensors and casts in the backward: nothing more in the recompute."""
    from memo_sim.policy.op_sac import saved_gemm_casts

    lay = Layout(dp=8, zero=3, dp_mode="fsdp", kernel_fusion="compiled")
    old, new = _titan_fp8("torchtitan@2024-12", "fp8-tensorwise"), _titan_fp8("torchtitan", "fp8-rowwise")
    casts = {c.name: c for c in saved_gemm_casts(old, lay, 2, 8192, PROF)}
    assert set(casts) == {"qkv_cast", "fc1_cast", "fc2_cast"} and all(c.phase == "recompute" for c in casts.values())
    assert all(c.seconds > 0 for c in casts.values())
    assert saved_gemm_casts(new, lay, 2, 8192, PROF) == [] == saved_gemm_casts(LLAMA, lay, 2, 8192, PROF)
    sac = get_policy("op_sac")
    names = {c.name for c in sac.recompute_costs(old, lay, 2, 8192, PROF)}
    assert {"qkv_cast", "fc1_cast", "fc2_cast"} <= names
    sk = skeletal_bytes(old, lay, 2, 8192)
    assert sk["fp8_weights"] > 0
    assert "fp8_weights" not in dict(sac.kept_extras(sk)) and "fp8_weights" in dict(sac.rebuilt_extras(sk))
    assert "fp8_weights" in dict(get_policy("store_all").kept_extras(sk))


def test_torchtitan_searches_it_under_its_float8_and_not_under_nvfp4():
    from memo_sim import api

    # torchtitan@2024-12: its Float8 ran the tensorwise recipe (the current torchtitan's are rowwise only)
    req = dict(model=LLAMA, seq=8192, gpus=8, profile=PROF, framework="torchtitan@2024-12", simulate_top=0, jobs=1)
    ans = api.whatif(api.WhatifRequest(**req))
    assert "op_sac" in {c.policy.name for c in ans.result.candidates}
    ans = api.whatif(api.WhatifRequest(**{**req, "model": replace(LLAMA, gemm_format="fp8-tensorwise")}))
    assert "op_sac" in {c.policy.name for c in ans.result.candidates}
    ans = api.whatif(api.WhatifRequest(**{**req, "framework": "torchtitan",
                                          "model": replace(LLAMA, gemm_format="fp8-rowwise")}))
    assert "op_sac" in {c.policy.name for c in ans.result.candidates}
    b200 = load_profile("b200-180gb")
    with pytest.raises(MemoError, match="policies='op_sac'"):
        api.whatif(api.WhatifRequest(**{**req, "framework": "torchtitan", "profile": b200,
                                        "model": replace(LLAMA, gemm_format="nvfp4"), "policies": ("op_sac",)}))
