"""Mixture-of-experts models (`memo_sim.model.config`, `memo_sim.model.hf_config`): parameter
counts against transformers, presets equal to their config.json, refusals in one line.

The counts are transformers 5.24.0's models built on the meta device from the config.json files
in tests/data/hf (tests/data/hf/count_params.py, run on 2026-11-25 and again on 2026-11-28 with Qwen3-235B-A22B
added, every earlier count unchanged; its output is
tests/data/hf/moe_param_counts.json, read here)."""

import json
from pathlib import Path

import pytest

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS, ModelConfig, get_model, with_overrides
from memo_sim.model.hf_config import hf_model_fields

HF = Path(__file__).parent / "data" / "hf"
COUNTS = json.loads((HF / "moe_param_counts.json").read_text())
FAMILIES = {"mixtral-8x7b": "mixtral", "qwen2-moe-a2.7b": "qwen2_moe", "qwen3-30b-a3b": "qwen3_moe",
            "qwen3-235b-a22b": "qwen3_moe", "deepseek-v2-lite": "deepseek_v2", "deepseek-v3": "deepseek_v3",
            "gpt-oss-20b": "gpt_oss", "gpt-oss-120b": "gpt_oss", "glm-4.5-air": "glm4_moe"}


def test_the_counts_file_is_transformers_run():
    assert COUNTS["transformers"] == "5.24.0" and set(COUNTS["models"]) == set(FAMILIES)


@pytest.mark.parametrize("folder", sorted(FAMILIES))
def test_parameter_counts_match_transformers(folder):
    m = get_model(str(HF / folder / "config.json"))
    want = COUNTS["models"][folder]
    assert json.loads((HF / folder / "config.json").read_text())["model_type"] == FAMILIES[folder]
    assert m.params() == want["total"]
    assert m.active_params() == want["active"]


@pytest.mark.parametrize("folder", sorted(FAMILIES))
def test_presets_equal_their_config_json(folder):
    """The presets are the architectures; a file's checkpoint quantization is named only when read from it."""
    from dataclasses import replace

    m = get_model(str(HF / folder))
    notes = "; ".join(x for x in m.not_modelled.split("; ") if not x.startswith("quantization_config"))
    assert PRESETS[folder] == replace(m, not_modelled=notes)


def test_dense_models_are_their_own_active_params_and_keep_their_dict_shape():
    m = PRESETS["llama-3.1-8b"]
    assert m.active_params() == m.params() and not m.moe and m.moe_layers == 0
    assert "experts" not in m.to_dict() and "head_dim" not in m.to_dict()
    assert ModelConfig.from_dict(PRESETS["deepseek-v3"].to_dict()) == PRESETS["deepseek-v3"]


def test_deepseek_v3_counts_its_multi_token_prediction_module_apart():
    """DeepSeek-V3's MTP module (num_nextn_predict_layers 1) is read and counted apart from ``params`` (which stays
    transformers' count, tests/data/hf): its MoE layer, the 2h -> h projection and three norms. With the embedding
    and classifier copies its checkpoint stores for it, memo's counts give the model card's split: 'the total size of
    DeepSeek-V3 models on Hugging Face is 685B, which includes 671B of the Main Model weights and 14B of the
    Multi-Token Prediction (MTP) Module weights' (deepseek-ai/DeepSeek-V3 README)."""
    m = PRESETS["deepseek-v3"]
    assert m.mtp_layers == 1 and m.mtp_moe and not m.not_modelled
    assert m.mtp_params() == m.layer_params() + 2 * m.hidden ** 2 + 3 * m.norm_params
    copies = 2 * m.vocab * m.hidden  # embed_tokens and shared_head.head of layer 61
    assert round(m.params() / 1e9) == 671 and round((m.mtp_params() + copies) / 1e9) == 13  # 13.46B: "14B" above
    assert round((m.params() + m.mtp_params() + copies) / 1e9) == 684  # 684.49B: "685B" above
    assert m.trained_params() == m.params() + m.mtp_params()
    assert hf_model_fields(_raw("deepseek-v3"))["mtp_layers"] == 1
    assert "mtp_layers" not in PRESETS["llama-3.1-8b"].to_dict()  # plans of models without keep their shape


def test_a_checkpoints_quantization_config_is_named_not_trained_in():
    """DeepSeek-V3's fp8 and gpt-oss's mxfp4 checkpoints: the model trains in torch_dtype (bf16) and the
    quantization is named beside multi-token prediction; a file without one names nothing."""
    v3 = hf_model_fields(_raw("deepseek-v3"))
    assert v3["dtype"] == "bf16" and "multi-token prediction" not in v3["not_modelled"] and v3["mtp_layers"] == 1
    assert "quantization_config (quant_method fp8, fmt e4m3, weight_block_size [128, 128])" in v3["not_modelled"]
    oss = hf_model_fields(_raw("gpt-oss-20b"))
    assert oss["dtype"] == "bf16" and "quant_method mxfp4" in oss["not_modelled"]
    assert "quantization_config" not in hf_model_fields(_raw("mixtral-8x7b")).get("not_modelled", "")
    dense = hf_model_fields(_raw("llama-3.1-8b", quantization_config={"quant_method": "fp8"}))
    assert "quant_method fp8" in dense["not_modelled"]
    assert len(ModelConfig(**{**dense, "name": "q"}).not_modelled) <= 500


def test_dense_layers_not_first_are_placed_or_named():
    """Qwen3-MoE with decoder_sparse_step 2: every other layer dense (0, 2, 4, ...): placed by dense_period; dense
    layers of no period (mlp_only_layers 5 and 9) are named; DeepSeek-V3's first 3 are neither."""
    d = hf_model_fields(_raw("qwen3-30b-a3b", decoder_sparse_step=2))
    assert d["dense_layers"] == 24 and d["dense_period"] == 2 and "dense-FFN" not in d.get("not_modelled", "")
    d = hf_model_fields(_raw("qwen3-30b-a3b", mlp_only_layers=[5, 9]))
    assert d["dense_layers"] == 2 and "layers 5, 9, neither the first 2" in d["not_modelled"]
    assert "dense-FFN layers" not in hf_model_fields(_raw("deepseek-v3")).get("not_modelled", "")
    assert "dense-FFN layers" not in hf_model_fields(_raw("qwen3-30b-a3b", mlp_only_layers=[0, 1])).get(
        "not_modelled", "")


def _raw(folder, **over):
    raw = json.loads((HF / folder / "config.json").read_text())
    raw.update(over)
    return raw


@pytest.mark.parametrize("folder,over,field", [
    ("mixtral-8x7b", dict(num_experts_per_tok=9), "num_experts_per_tok"),
    ("qwen3-30b-a3b", dict(num_experts=0), "num_experts"),
    ("qwen3-30b-a3b", dict(hidden_act="gelu"), "hidden_act"),
    ("qwen3-30b-a3b", dict(use_sliding_window=True, max_window_layers="all"), "max_window_layers"),
    ("deepseek-v3", dict(scoring_func="softmax2"), "scoring_func"),
    ("deepseek-v3", dict(first_k_dense_replace=61), "first_k_dense_replace"),  # named num_hidden_layers before
    ("deepseek-v3", dict(n_group="8"), "n_group"),  # a reviewer's finding, 2026-11-27: a traceback
    ("deepseek-v3", dict(n_group=7), "n_group"),
    ("deepseek-v3", dict(topk_group=True), "topk_group"),
    ("deepseek-v3", dict(routed_scaling_factor="abc"), "routed_scaling_factor"),
    ("deepseek-v3", dict(routed_scaling_factor=True), "routed_scaling_factor"),
    ("gpt-oss-20b", dict(layer_types=["full_attention"]), "layer_types"),
    ("gpt-oss-20b", dict(swiglu_limit=0), "swiglu_limit"),
    ("gpt-oss-20b", dict(swiglu_limit="7"), "swiglu_limit"),
    ("llama-3.1-8b", dict(num_experts=64), "num_experts"),
    ("deepseek-v3", dict(seq_aux="yes"), "seq_aux"),
    ("gpt-oss-20b", dict(model_type="gpt-oss"), "model_type"),  # a user's review: named num_local_experts before
    ("gpt-oss-20b", dict(model_type=None), "model_type"),
    ("mixtral-8x7b", dict(model_type="mixtal"), "model_type"),
    ("glm-4.5-air", dict(partial_rotary_factor=1.5), "partial_rotary_factor"),  # accepted and echoed before
])
def test_bad_moe_configs_are_refused_naming_the_field(folder, over, field):
    with pytest.raises(MemoError) as e:
        hf_model_fields(_raw(folder, **over), source="config.json")
    msg = str(e.value)
    assert f": {field}: " in msg and "\n" not in msg
    if over.get("model_type") == "mixtal":  # a MoE family is named, and listed among those read
        assert "did you mean 'mixtral'?" in msg and "gpt_oss" in msg
    elif over.get("model_type"):
        assert "did you mean 'gpt_oss'?" in msg
    elif "model_type" in over:
        assert "missing" in msg and "gpt_oss" in msg


@pytest.mark.parametrize("over,needle", [
    (dict(experts=8, top_k=9), "top_k"),
    (dict(experts=8), "top_k is missing"),
    (dict(experts=8, top_k=2, dense_layers=32), "dense_layers"),
    (dict(top_k=2), "give experts"),
    (dict(sliding_window=128), "sliding_window and sliding_layers"),
    (dict(sliding_window=128, sliding_layers=12, sliding_period=2), "gives 16 sliding layers of 32"),
    (dict(sliding_window=128, sliding_layers=32, sliding_period=1), "give N >= 2"),
    (dict(kv_lora_rank=512), "latent attention"),
    (dict(experts=8, top_k=2, router_groups=4), "give both or neither"),
    (dict(experts=8, top_k=2, router_groups=3, router_group_topk=1), "must divide"),
    (dict(experts=8, top_k=4, router_groups=4, router_group_topk=1), "exceeds the experts"),
    (dict(router_groups=2, router_group_topk=1), "give experts"),
    (dict(experts=8, top_k=2, router_scaling=0.0), "router_scaling"),
    (dict(router_scaling=2.5), "give experts"),
])
def test_bad_moe_model_fields_are_refused(over, needle):
    with pytest.raises(MemoError) as e:
        ModelConfig.from_dict({"layers": 32, "hidden": 4096, "heads": 32, "ffn": 14336, **over})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sliding_window_shrinks_attention_flops_only_past_the_window():
    m = PRESETS["gpt-oss-20b"]
    assert m.attention_flop_fraction(128) == 1.0
    f = m.attention_flop_fraction(32768)
    # 12 of 24 layers attend to 128 keys: about half the layers' score elements remain
    assert 0.5 < f < 0.51


def test_group_limited_routing_is_read_where_the_router_uses_it():
    """n_group / topk_group under DeepSeek-V3's noaux_tc and V2's group_limited_greedy (its 236B config), not under
    greedy (V2-Lite), and routed_scaling_factor beside them (a user's review, 2026-11-27: all three were dropped)."""
    v3 = hf_model_fields(_raw("deepseek-v3"))
    assert (v3["router_groups"], v3["router_group_topk"], v3["router_scaling"]) == (8, 4, 2.5)
    lite = hf_model_fields(_raw("deepseek-v2-lite"))
    assert "router_groups" not in lite and lite.get("router_scaling", 1.0) == 1.0
    v2 = hf_model_fields({**_raw("deepseek-v2-lite"), "topk_method": "group_limited_greedy", "n_group": 8,
                          "topk_group": 3, "n_routed_experts": 160, "num_experts_per_tok": 6,
                          "routed_scaling_factor": 16.0})
    assert (v2["router_groups"], v2["router_group_topk"], v2["router_scaling"]) == (8, 3, 16.0)
    assert ModelConfig.from_dict(PRESETS["deepseek-v3"].to_dict()).router_groups == 8
    assert "router_groups" not in PRESETS["mixtral-8x7b"].to_dict()  # dense and ungrouped plans keep their shape


def test_glm_4_5_reads_as_its_own_family():
    """GLM-4.5 (model_type glm4_moe: DeepSeek-V3's sigmoid routing beside grouped-query attention with q/k/v biases,
    QK norms in the 355B) was refused as a family memo does not read (a user's review). The 355B's shape from the Air
    fixture: transformers 5.24.0 builds 352,797,814,784 parameters on the meta device (2026-11-28; the MTP layer is
    not built)."""
    raw = json.loads((HF / "glm-4.5-air" / "config.json").read_text())
    air = get_model(str(HF / "glm-4.5-air" / "config.json"))
    assert (air.router, air.bias, air.qk_norm, air.dense_layers, air.head_dim) == ("sigmoid", "qkv", False, 1, 128)
    assert air.mtp_layers == 1 and not air.not_modelled and air.rotary_fraction == 0.5
    big = dict(raw, hidden_size=5120, num_hidden_layers=92, intermediate_size=12288, moe_intermediate_size=1536,
               n_routed_experts=160, first_k_dense_replace=3, use_qk_norm=True, routed_scaling_factor=2.5)
    m = ModelConfig.from_dict(hf_model_fields(big, name="glm-4.5"))
    assert (m.params(), m.qk_norm, m.router_scaling) == (352_797_814_784, True, 2.5)


def test_llama_4_reads_with_its_chunked_attention():
    """Llama 4 (the llama4 wrapper's llama4_text) was refused (a user's review). Scout: 16 experts top-1 with a
    shared expert on every layer, chunked attention (8192-token chunks) on 36 of 48 layers, every fourth full; the
    counts are transformers 5.24.0's Llama4ForCausalLM of the text_config on the meta device (2026-11-28; its
    attn_temperature_tuning set true, as 5.24's config takes a bool: no parameter depends on it), and Maverick's
    shape (128 experts on every other layer, dense layers of 16384 between) 400,711,848,960."""
    from dataclasses import replace

    scout = get_model(str(HF / "llama-4-scout" / "config.json"))
    assert (scout.params(), scout.active_params()) == (107_769_861_120, 17_172_894_720)
    assert (scout.attention_chunk, scout.chunked_layers, scout.chunked_period, scout.qk_norm) == (8192, 36, 4, False)
    assert "vision_config" in scout.not_modelled and "L2 norm" in scout.not_modelled
    assert scout.nope_period == 4 and "NoPE" not in scout.not_modelled
    assert PRESETS["llama-4-scout"] == replace(scout, name="llama-4-scout", not_modelled=PRESETS[
        "llama-4-scout"].not_modelled)
    text = json.loads((HF / "llama-4-scout" / "config.json").read_text())["text_config"]
    mav = ModelConfig.from_dict(hf_model_fields(dict(text, interleave_moe_layer_step=2, num_local_experts=128),
                                                name="maverick"))
    assert (mav.params(), mav.dense_layers, mav.ffn, mav.expert_width) == (400_711_848_960, 24, 16384, 8192)
    assert mav.dense_period == 2 and "dense-FFN layers are" not in mav.not_modelled  # alternating: placed


def test_dense_layers_placed_where_the_config_puts_them():
    """Maverick's dense layers alternate with its MoE layers (layers 0, 2, ..., 46 dense; transformers'
    interleave_moe_layer_step 2), and memo placed a MoE model's dense layers first: a pipeline stage's states, the
    executor's layers and Megatron's --moe-layer-freq put all 24 dense layers on the first half of the model
    (`([0]*24+[1]*24)`, a review). ``dense_period`` places them; a pattern of no period stays first and named."""
    from memo_sim.cost.sppo import stage_dense_layer_count, stage_params
    from memo_sim.export.megatron import moe_layer_pattern
    from memo_sim.layout.parallel import Layout

    text = json.loads((HF / "llama-4-scout" / "config.json").read_text())["text_config"]
    mav = ModelConfig.from_dict(hf_model_fields(dict(text, interleave_moe_layer_step=2, num_local_experts=128),
                                                name="maverick"))
    assert [mav.dense_layer_at(i) for i in range(4)] == [True, False, True, False]
    lay = Layout(tp=8, pp=4)
    assert [stage_dense_layer_count(mav, lay, s) for s in range(4)] == [6, 6, 6, 6]
    assert stage_params(mav, lay, 1) == stage_params(mav, lay, 2)  # middle stages alike
    pattern = moe_layer_pattern(mav)
    assert pattern == "([0]*1+[1]*1)*24"
    assert eval(pattern) == [0 if mav.dense_layer_at(i) else 1 for i in range(48)]  # noqa: S307 - digits only
    ds = PRESETS["deepseek-v3"]
    assert not ds.dense_period and moe_layer_pattern(ds) == "([0]*3+[1]*58)"
    assert [stage_dense_layer_count(ds, Layout(pp=4, first_stage_layers=13), s) for s in range(4)] == [3, 0, 0, 0]
    # Qwen's decoder_sparse_step 3 over 10 layers: MoE at 2, 5, 8; the rest dense, the last one too
    qwen = json.loads((HF / "qwen2-moe-a2.7b" / "config.json").read_text())
    q = ModelConfig.from_dict(hf_model_fields(dict(qwen, num_hidden_layers=10, decoder_sparse_step=3), name="q"))
    assert (q.dense_layers, q.dense_period) == (7, 3)
    assert eval(moe_layer_pattern(q)) == [0, 0, 1, 0, 0, 1, 0, 0, 1, 0]  # noqa: S307
    odd = ModelConfig.from_dict(hf_model_fields(dict(qwen, num_hidden_layers=10, mlp_only_layers=[3, 7]), name="o"))
    assert (odd.dense_layers, odd.dense_period) == (2, 0) and "layers 3, 7, neither the first 2" in odd.not_modelled
    with pytest.raises(MemoError, match=r"dense_period \(2\): every N-th layer MoE, the N - 1 before it dense, gives "
                       r"24 dense layers of 48, not dense_layers \(20\)"):
        ModelConfig.from_dict({**mav.to_dict(), "dense_layers": 20})
    with pytest.raises(MemoError, match="dense_period"):
        ModelConfig.from_dict({**PRESETS["llama-3.1-8b"].to_dict(), "dense_period": 2})
    short = with_overrides(mav, layers=8)
    assert (short.dense_layers, short.dense_period) == (4, 2)


def test_chunked_attention_counts_each_chunks_causal_square():
    """A chunked layer's query attends causally inside its own chunk: (n·c² + r²) / s² of full causal attention's
    score elements; every fourth layer full."""
    from dataclasses import replace

    m = PRESETS["llama-4-scout"]
    assert m.attention_flop_fraction(8192) == 1.0
    assert m.attention_flop_fraction(16384) == pytest.approx((36 * 0.5 + 12) / 48)
    assert m.attention_flop_fraction(20480) == pytest.approx((36 * (2 * 8192**2 + 4096**2) / 20480**2 + 12) / 48)
    with pytest.raises(MemoError, match=r"attention_chunk \(0\) and chunked_layers \(36\) go together"):
        ModelConfig.from_dict({**m.to_dict(), "attention_chunk": 0})
    from memo_sim.layout.parallel import Layout
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy import get_policy

    # the executor masks the chunks on a rank holding its heads' whole sequence (tests/test_exec_llama4.py)
    assert plan_why_not(m, Layout(ep=2, dp=2), get_policy("store_all"), "single_stage", 2, 2, 16384) is None
    why = plan_why_not(m, Layout(ep=2, cp=2), get_policy("store_all"), "single_stage", 2, 2, 16384)
    assert "attention_chunk with cp 2" in why, why
    from memo_sim.policy import policy_class

    dense = replace(m, experts=0, top_k=0, shared_experts=0, shared_ffn=0, router="softmax", name="dense-chunked")
    assert "chunked attention" in policy_class("sppo").model_why_not(dense)


def test_llama_4s_router_is_its_own_and_megatron_writes_no_expert_bias():
    """Llama 4 routes by the sigmoid of the chosen logits with no correction bias: the Megatron script turned on
    --moe-router-enable-expert-bias (DeepSeek-V3's aux-loss-free bias; a user's review); DeepSeek-V3 keeps it. The
    executor's routers are the contract's list, every router the simulator prices."""
    pytest.importorskip("torch")
    from memo_exec.moe.routers import ROUTERS as EXEC
    from memo_sim.export.megatron import arguments
    from memo_sim.layout.parallel import Layout
    from memo_sim.plan.executor_scope import EXEC_ROUTERS, moe_why_not
    from tests.exec_helpers import make_plan
    from memo_sim.policy import get_policy

    assert set(EXEC.names()) == set(EXEC_ROUTERS)
    for name, bias in (("llama-4-scout", False), ("deepseek-v3", True)):
        m = PRESETS[name]
        args = dict(arguments(make_plan(m, 4096, get_policy("store_all")), []))
        assert args["--moe-router-score-function"] == "sigmoid"
        assert ("--moe-router-enable-expert-bias" in args) == bias, (name, args)
    assert PRESETS["llama-4-scout"].router == "sigmoid_topk"
    # the executor runs it since 2026-11-30 (its weight on the experts' input, tests/test_exec_moe.py), and every
    # router the simulator prices
    assert moe_why_not(PRESETS["llama-4-scout"], Layout(ep=2, dp=2)) is None
    from memo_sim.model.moe_routers import ROUTER_NAMES

    assert set(EXEC_ROUTERS) == set(ROUTER_NAMES)


def test_llama_4_exports_name_its_chunked_attention_and_price_a_frameworks_plan_without_it():
    """torchtitan's export of a Scout plan listed neither its chunked attention nor its rotary scaling; the Megatron
    export's fallback plan was priced with chunked attention its script does not run (a user's review): a
    framework without it trains the model with full causal attention, and its search prices it so."""
    from memo_sim.export import export_plan
    from memo_sim.layout.parallel import Layout
    from memo_sim.policy import get_policy
    from memo_sim.search.frameworks import get_framework
    from tests.exec_helpers import make_plan

    m = PRESETS["llama-4-scout"]
    plan = make_plan(m, 32768, get_policy("store_all"))
    plan = replace_layout(plan, Layout(ep=2, dp=2))
    words = [g.what for g in export_plan(plan, "torchtitan", price=False, nearest=True).gaps]
    assert any(w.startswith("chunked attention (8192-token chunks on 36 of 48 layers)") for w in words), words
    assert any(w.startswith("rotary scaling (llama3 factor 16") for w in words), words
    meg = get_framework("megatron").for_model(m)
    assert (meg.chunked_layers, meg.attention_chunk) == (0, 0) and "megatron has none" in meg.not_modelled
    assert get_framework("any").for_model(m).chunked_layers == 36


def replace_layout(plan, layout):
    from dataclasses import replace

    return replace(plan, layout=layout, gpus=layout.gpus, batch=layout.dp)


def test_partial_rotary_and_nope_layers_are_written_for_megatron():
    """GLM-4.5's partial rotary (0.5 of each head) and Llama 4's NoPE layers (every fourth) were named and not
    written: Megatron-LM's script trained them with rotary embeddings over every head dimension on every layer
    (arguments.py at d98e8a64 has --rotary-percent and --no-rope-freq). Megatron-DeepSpeed has --rotary-percent
    and no NoPE; torchtitan's models neither: gaps."""
    from dataclasses import replace

    from memo_sim.export import deepspeed, megatron, torchtitan
    from memo_sim.policy.registry import policy_class
    from tests.exec_helpers import make_plan

    def args(m, mod):
        plan = make_plan(m, 4096, policy_class("store_all")())
        return dict(a if len(a) == 2 else (a[0], None) for a in mod.arguments(plan, [])), plan

    glm, _ = args(PRESETS["glm-4.5-air"], megatron)
    assert glm["--rotary-percent"] == "0.5" and "--no-rope-freq" not in glm
    scout, plan = args(PRESETS["llama-4-scout"], megatron)
    assert scout["--no-rope-freq"] == "4" and "--rotary-percent" not in scout
    odd, _ = args(replace(PRESETS["llama-4-scout"], layers=10, chunked_layers=8, nope_period=4), megatron)
    assert eval(odd["--no-rope-freq"]) == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0]  # noqa: S307 - digits only
    assert any("NoPE" in g.what for g in deepspeed.gaps(plan)) and any("NoPE" in g.what for g in torchtitan.gaps(plan))
    with pytest.raises(MemoError, match="nope_period"):
        ModelConfig.from_dict({**PRESETS["llama-4-scout"].to_dict(), "nope_period": 1})
    # a toy Scout of fewer layers than the period (--layers 2) is a model without NoPE layers, not an error
    assert with_overrides(PRESETS["llama-4-scout"], layers=2).nope_period == 0
    assert with_overrides(PRESETS["llama-4-scout"], layers=8).nope_period == 4


def test_gpt_oss_reads_its_clamped_swiglu():
    """GPT-OSS's experts run gate * sigmoid(1.702 gate) * (up + 1), clamped at swiglu_limit (7.0 in its config.json,
    GptOssConfig's default where absent); memo read plain SwiGLU and said nothing (a review). It is read, named in the
    model's notes (priced as SwiGLU: the same GEMMs) and equal to the preset's."""
    oss = hf_model_fields(_raw("gpt-oss-20b"))
    assert oss["swiglu_limit"] == 7.0 == PRESETS["gpt-oss-20b"].swiglu_limit
    raw = _raw("gpt-oss-20b")
    raw.pop("swiglu_limit", None)
    assert hf_model_fields(raw)["swiglu_limit"] == 7.0
    assert any("clamped SwiGLU" in n for n in PRESETS["gpt-oss-120b"].model_notes())
    assert not PRESETS["mixtral-8x7b"].swiglu_limit


def test_a_config_json_without_model_type_says_which_key_to_add(tmp_path):
    """Without model_type and architectures a config.json read as a memo model file and answered 'layers: missing
    field' though it has num_hidden_layers (a review): the line says what the file looks like and what to add."""
    from click.testing import CliRunner  # noqa: PLC0415

    from memo_sim.cli import cli  # noqa: PLC0415

    raw = _raw("qwen3-30b-a3b")
    raw.pop("model_type")
    raw.pop("architectures", None)
    (tmp_path / "noarch.json").write_text(json.dumps(raw))
    r = CliRunner().invoke(cli, ["whatif", "--model", str(tmp_path / "noarch.json"), "--gpus", "8", "--no-plan"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "neither model_type nor architectures" in r.output and "add its model_type" in r.output


def test_llama_4s_input_weighting_is_an_op_and_keeps_the_weighted_copies():
    """Llama 4's router weights each dispatched copy before the experts (Megatron-Core's --moe-apply-probs-on-input):
    the layer graph has the multiply (moe_in -> moe_in_w, which the first expert GEMM reads) and keeps both copies,
    k x hidden per token of the layer more than a router weighting the output (as memo-exec's block keeps them,
    tests/test_exec_moe_memory.py); no other router has the op."""
    from dataclasses import replace

    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.layer_graph import forward_ops, layer_tensors

    m = PRESETS["llama-4-scout"]
    ops = {op.name: op for op in forward_ops(m)}
    assert (ops["weight_input"].inputs, ops["weight_input"].outputs) == (("moe_in",), ("moe_in_w",))
    assert ops["expert_fc1"].inputs == ("moe_in_w",) and layer_tensors(m)["moe_in_w"].saved
    out_weighted = replace(m, router="sigmoid")  # the same shapes, the weight on the experts' output
    assert "weight_input" not in {op.name for op in forward_ops(out_weighted)}
    lay, seq = Layout(), 4096
    extra = skeletal_bytes(m, lay, 1, seq)["total"] - skeletal_bytes(out_weighted, lay, 1, seq)["total"]
    assert extra == m.top_k * m.hidden * seq * 2  # bf16 copies of the one-GPU layer's tokens
    assert skeletal_bytes(m, lay, 1, seq)["moe_block"] - skeletal_bytes(out_weighted, lay, 1, seq)["moe_block"] == extra


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_memos_recompute_rebuilds_every_other_tensor_the_layer_keeps(name):
    """MEMO drops alpha of every "other" skeletal tensor's rows and re-runs ops to rebuild them: each such tensor
    is an op's output among `recompute_ops` (a review: Llama 4's weighted expert input had no op re-run)."""
    from memo_sim.model.layer_graph import layer_tensors, recompute_ops

    m = PRESETS[name]
    rebuilt = {o for op in recompute_ops(m) for o in op.outputs}
    other = {t.name for t in layer_tensors(m).values() if t.saved and t.role == "other"}
    assert other <= rebuilt, (name, sorted(other - rebuilt))
