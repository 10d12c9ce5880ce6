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
                         (replace(LLAMA, gemm_format="fp8-tensorwise"), "_scaled_mm")):
        assert words in get_policy("op_sac").model_why_not(model)
        with pytest.raises(MemoError, match=words):
            simulate(model, Layout(tp=8, sp=True), 1, 4096, get_policy("op_sac"), PROF, keep_timeline=False)


def test_torchtitan_searches_it_and_leaves_it_out_under_fp8():
    from memo_sim import api

    # torchtitan@2024-12: its Float8 ran the tensorwise recipe (the current torchtitan's are rowwise only)
    req = dict(model=LLAMA, seq=8192, gpus=8, profile=PROF, framework="torchtitan@2024-12", simulate_top=0, jobs=1)
    ans = api.whatif(api.WhatifRequest(**req))
    assert "op_sac" in {c.policy.name for c in ans.result.candidates}
    ans = api.whatif(api.WhatifRequest(**{**req, "model": replace(LLAMA, gemm_format="fp8-tensorwise")}))
    assert "op_sac" not in {c.policy.name for c in ans.result.candidates}
    with pytest.raises(MemoError, match="policies='op_sac'"):
        api.whatif(api.WhatifRequest(**{**req, "model": replace(LLAMA, gemm_format="fp8-tensorwise"),
                                        "policies": ("op_sac",)}))
