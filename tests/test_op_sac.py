"""torchtitan's per-op selective activation checkpointing (`memo_sim.policy.op_sac`): what it keeps and re-runs,
where it sits between store-all and full recompute, and where it is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.activations import layer_tensor_bytes, skeletal_bytes
from memo_sim.cost.layer_time import forward_costs
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

LLAMA = PRESETS["llama-3.1-8b"]
PROF = load_profile("h100-sxm5-80gb")
DROPPED = ("ln1", "k", "h1", "ln2", "act")  # a dense block's skeletal tensors the save list does not keep


def test_it_drops_the_even_gemms_outputs_and_the_cheap_ops_and_keeps_w2s_output():
    lay = Layout(dp=8, zero=3)
    sk, tb = skeletal_bytes(LLAMA, lay, 1, 8192), layer_tensor_bytes(LLAMA, lay, 1, 8192)
    assert sk["op_sac_dropped"] == pytest.approx(sum(tb[n] for n in DROPPED) + tb["fc1"] / 2)
    assert sk["op_sac_extra"] == pytest.approx(tb["fc2"])
    gpt = get_model("gpt-7b")  # no gate: w1, w2 are the 5th and 6th GEMMs, so fc1 is kept and fc2 not
    sk = skeletal_bytes(gpt, lay, 1, 8192)
    tb = layer_tensor_bytes(gpt, lay, 1, 8192)
    assert sk["op_sac_dropped"] == pytest.approx(sum(tb[n] for n in DROPPED)) and sk["op_sac_extra"] == 0


def test_it_reruns_wk_wo_w3_and_the_memory_bound_ops():
    """The sequence-parallel all-gathers run again (on no list); the reduce-scatters' outputs are saved
    (_c10d_functional.reduce_scatter_tensor on 9dec370's and b5bcd76c's lists), so wo re-runs without its own."""
    lay = Layout(tp=2, sp=True)
    fwd = {c.name: c for c in forward_costs(LLAMA, lay, 1, 8192, PROF)}
    re = {c.name: c for c in get_policy("op_sac").recompute_costs(LLAMA, lay, 1, 8192, PROF)}
    assert set(re) == {"ln1", "allgather_ln1", "qkv", "out_proj", "add1", "ln2", "allgather_ln2", "fc1", "act"}
    assert "reducescatter_out_proj" in fwd
    share = LLAMA.kv_dim / (LLAMA.q_dim + LLAMA.kv_dim + LLAMA.v_dim)
    assert re["qkv"].seconds == pytest.approx(fwd["qkv"].seconds * share)
    assert re["fc1"].seconds == pytest.approx(fwd["fc1"].seconds / 2)
    assert re["out_proj"].seconds == pytest.approx(fwd["out_proj"].seconds)
    assert all(c.phase == "recompute" for c in re.values())


def _assert_between_store_all_and_full_recompute(model, lay, seq, prof):
    res = {p: simulate(model, lay, 1, seq, get_policy(p), prof, keep_timeline=False)
           for p in ("store_all", "op_sac", "full_recompute")}
    assert all(r.status == "OK" for r in res.values())
    t = {p: r.iteration_s for p, r in res.items()}
    m = {p: r.peak_gpu_bytes for p, r in res.items()}
    assert t["store_all"] < t["op_sac"] < t["full_recompute"]
    assert m["store_all"] > m["op_sac"] > m["full_recompute"]


def test_it_sits_between_store_all_and_full_recompute():
    _assert_between_store_all_and_full_recompute(LLAMA, Layout(dp=8, zero=3, dp_mode="fsdp"), 8192,
                                                 load_profile("h100-sxm5-96gb-500w"))


def test_refused_where_it_is_not_priced():
    for model, words in ((replace(LLAMA, gemm_format="nvfp4"), "NVFP4Linear runs Triton kernels"),):
        assert words in get_policy("op_sac").model_why_not(model)
        with pytest.raises(MemoError, match=words):
            simulate(model, Layout(tp=8, sp=True), 1, 4096, get_policy("op_sac"), load_profile("b200-180gb"),
                     keep_timeline=False)
    sac = get_policy("op_sac")
    assert "torchtitan has no Ulysses" in sac.layout_why_not(Layout(ulysses=2, dp=4))
    assert "not the allgather dispatcher" in sac.layout_why_not(Layout(dp=8, ep=8, moe_dispatcher="allgather"))
    assert "no expert tensor parallelism" in sac.layout_why_not(Layout(tp=2, sp=True, dp=4, ep=4, etp=2))
    assert sac.layout_why_not(Layout(dp=8, ep=8)) is None and sac.layout_why_not(Layout(dp=4, cp=2)) is None
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


def _titan(name: str):
    from memo_sim.search.frameworks import get_framework

    return get_framework("torchtitan").for_model(PRESETS[name])


def test_the_gemm_count_follows_torchtitans_order_through_latent_attention_and_the_shared_experts():
    """The router's gate is forced to re-run and not counted (b5bcd76c force_recompute_mm_shapes_by_fqns), the grouped
    expert GEMMs are on no list; latent attention's wq_a, wq_b, wkv_a, wkv_b, wo put the shared experts' w1 at the
    6th place (re-run), w3 7th (saved), w2 8th (re-run); without q_lora_rank wq, wkv_a, wkv_b, wo put w1 5th."""
    from memo_sim.cost.op_sac_saves import gemm_kept_shares

    v3, lite = PRESETS["deepseek-v3"], PRESETS["deepseek-v2-lite"]
    assert v3.q_lora_rank and not lite.q_lora_rank
    assert gemm_kept_shares(v3) == {"q_down": 1.0, "q_up": 0.0, "kv_down": 1.0, "kv_up": 0.0, "out_proj": 1.0,
                                    "router": 0.0, "expert_fc1": 0.0, "expert_fc2": 0.0, "shared_fc1": 0.5,
                                    "shared_fc2": 0.0}
    assert gemm_kept_shares(lite) == {"q_proj": 1.0, "kv_down": 0.0, "kv_up": 1.0, "out_proj": 0.0, "router": 0.0,
                                      "expert_fc1": 0.0, "expert_fc2": 0.0, "shared_fc1": 0.5, "shared_fc2": 1.0}
    share = LLAMA.kv_dim / (LLAMA.q_dim + LLAMA.kv_dim + LLAMA.v_dim)
    dense = gemm_kept_shares(LLAMA)
    assert dense["qkv"] == pytest.approx(1 - share) and dense["out_proj"] == 0 and dense["fc1"] == 0.5
    assert dense["fc2"] == 1.0


def test_a_moe_block_keeps_the_all_to_alls_outputs_and_reruns_router_experts_and_permutes():
    """Qwen3-30B-A3B under torchtitan with EP 8: kept are the block's input, wq's and wv's outputs, the attention
    output, the dispatched tokens (the all-to-all's output) and, beside the skeletal tensors, the combine's all-to-all
    output and topk's outputs; the routing scores, the QK norms' outputs and the experts' intermediates are made again.
    The recompute re-runs the router, the permutes and the experts' GEMMs, not the token exchanges."""
    m = _titan("qwen3-30b-a3b")
    lay = Layout(dp=8, zero=3, dp_mode="fsdp", ep=8, kernel_fusion="eager")
    sk, tb = skeletal_bytes(m, lay, 1, 8192), layer_tensor_bytes(m, lay, 1, 8192)
    dropped = ("ln1", "k", "q_normed", "k_normed", "h1", "ln2", "probs", "efc1", "eact")
    assert sk["op_sac_dropped"] == pytest.approx(sum(tb[n] for n in dropped))
    routed = 8192 * m.top_k
    assert sk["op_sac_extra"] == pytest.approx(routed * m.hidden * 2 + routed * (4 + 8))
    compiled = skeletal_bytes(m, replace(lay, kernel_fusion="compiled"), 1, 8192)
    assert compiled["op_sac_extra"] == pytest.approx(routed * m.hidden * 2 + routed * 8)
    # without EP the tokens are reordered in place (torchtitan's LocalTokenDispatcher): nothing exchanged, nothing kept
    local = skeletal_bytes(m, Layout(dp=8, zero=3, dp_mode="fsdp", kernel_fusion="eager"), 1, 8192)
    tl = layer_tensor_bytes(m, Layout(dp=8, zero=3, dp_mode="fsdp"), 1, 8192)
    assert local["op_sac_dropped"] == pytest.approx(sum(tl[n] for n in dropped + ("moe_in",)))
    assert local["op_sac_extra"] == pytest.approx(routed * (4 + 8))
    names = {c.name for c in get_policy("op_sac").recompute_costs(m, lay, 1, 8192, PROF)}
    fwd = {c.name for c in forward_costs(m, lay, 1, 8192, PROF)}
    assert {"router", "route", "permute", "expert_fc1", "expert_act", "expert_fc2", "unpermute", "qkv",
            "out_proj", "ln1", "ln2", "add1"} <= names
    assert not {n for n in names if n.startswith("moe_")} and {n for n in fwd if n.startswith("moe_")}
    assert not names & {"attention", "add2"}


def test_latent_attention_keeps_the_saved_linears_outputs_and_w2_beside_them():
    """DeepSeek-V2-Lite (no q_lora_rank): wq's, wkv_b's and the shared experts' w1 half and w2 outputs kept, the
    latent kv_a output and its norm made again; the shared w2's output is no skeletal tensor (no shared gate), kept
    beside them in eager PyTorch at its GEMM's size."""
    m = _titan("deepseek-v2-lite")
    lay = Layout(dp=8, zero=3, dp_mode="fsdp", ep=8, kernel_fusion="eager")
    sk, tb = skeletal_bytes(m, lay, 1, 4096), layer_tensor_bytes(m, lay, 1, 4096)
    shared_w2 = 4096 * m.hidden * 2
    routed = 4096 * m.top_k
    assert sk["op_sac_extra"] == pytest.approx(shared_w2 + routed * m.hidden * 2 + routed * 12)
    kv_b = 4096 * m.heads * (m.head_dim + m.value_head_dim) * 2  # wkv_b's output, before the rotary part joins k
    kept = tb["x"] + tb["q"] + kv_b + tb["attn"] + tb["moe_in"] + tb["sfc1"] / 2
    total = sum(b for n, b in tb.items() if n in {t for t in skeletal_names(m)})
    assert sk["op_sac_dropped"] == pytest.approx(total - kept)


def skeletal_names(model):
    from memo_sim.model.layer_graph import layer_tensors

    return [n for n, t in layer_tensors(model).items() if t.saved and t.role != "lse"]


def test_torchtitan_plans_its_moe_models_with_it():
    """A torchtitan user's Qwen3-30B-A3B on 8 GPUs: op_sac is among the candidates, and at 2K tokens, where all three
    fit beside the 60 GB of model states, it sits between store-all and full recompute in time and memory."""
    from memo_sim import api

    m = PRESETS["qwen3-30b-a3b"]
    req = dict(model=m, seq=8192, gpus=8, profile=PROF, framework="torchtitan", simulate_top=0, jobs=1)
    ans = api.whatif(api.WhatifRequest(**req))
    assert "op_sac" in {c.policy.name for c in ans.result.candidates}
    _assert_between_store_all_and_full_recompute(_titan("qwen3-30b-a3b"), Layout(dp=8, zero=3, dp_mode="fsdp", ep=8),
                                                 2048, PROF)
