"""A review's findings on reading Hugging Face config.json files and on the exports of what they describe: each test
failed on the code before its fix."""

import json
from pathlib import Path

import pytest

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS, get_model, with_overrides
from memo_sim.model.hf_config import hf_model_fields, language_model

HF = Path(__file__).parent / "data" / "hf"
# meta-llama/Llama-3.2-1B's config.json (a review's repro): its head_dim 64 is hidden / heads
L1B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64, "hidden_act": "silu",
       "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
       "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
       "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256}


def _hf(name: str, **over) -> dict:
    """A shipped config.json's decoder (Llama 4's text_config) with ``over`` on it."""
    return {**language_model(json.loads((HF / name / "config.json").read_text()))[0], **over}


def _refused(raw: dict, field: str) -> str:
    """The one-line refusal of ``raw``, which must name ``field``."""
    with pytest.raises(MemoError) as e:
        hf_model_fields(raw, source="x/config.json")
    msg = str(e.value)
    assert msg.startswith(f"x/config.json: {field}: ") and "\n" not in msg, msg
    return msg


# A: num_key_value_heads 0 was read as absent (multi-head attention)
@pytest.mark.parametrize("raw,absent_kv", [(L1B, None), (_hf("mixtral-8x7b"), 8), (_hf("llama-4-scout"), 8)],
                         ids=["llama", "mixtral", "llama4"])
def test_zero_kv_heads_refused(raw, absent_kv):
    _refused({**raw, "num_key_value_heads": 0}, "num_key_value_heads")
    absent = {k: v for k, v in raw.items() if k != "num_key_value_heads"}
    # absent: the configuration class's default (MixtralConfig's and Llama4TextConfig's 8; LlamaConfig's None, the
    # query heads: multi-head attention), not multi-head attention for every family (a review)
    assert hf_model_fields(absent).get("kv_heads") == absent_kv


# B: booleans given as strings were read by their truthiness
@pytest.mark.parametrize("raw,field", [
    ({**L1B, "attention_bias": "false"}, "attention_bias"),
    ({**L1B, "mlp_bias": "false"}, "mlp_bias"),
    ({**L1B, "model_type": "qwen3", "use_sliding_window": "false", "sliding_window": 4096, "max_window_layers": 0},
     "use_sliding_window"),
    (_hf("llama-4-scout", use_qk_norm="false"), "use_qk_norm"),
    (_hf("glm-4.5-air", use_qk_norm="false"), "use_qk_norm"),
    (_hf("qwen2-moe-a2.7b", qkv_bias="false"), "qkv_bias"),
    (_hf("qwen3-30b-a3b", attention_bias="false"), "attention_bias"),
    (_hf("deepseek-v3", attention_bias="false"), "attention_bias"),
    ({**L1B, "add_cross_attention": "false"}, "add_cross_attention"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_boolean_strings_refused(raw, field):
    assert "must be true or false, got 'false'" in _refused(raw, field)


@pytest.mark.parametrize("value", ["llama3", 32.0])
def test_rope_scaling_must_be_a_mapping(value):
    assert "or null" in _refused({**L1B, "rope_scaling": value}, "rope_scaling")
    # booleans and nulls read as before
    assert hf_model_fields({**L1B, "attention_bias": True})["bias"] == "all"
    assert hf_model_fields({**L1B, "attention_bias": None, "rope_scaling": None})["bias"] == "none"


# C: a sliding window in a family that does not read it was planned as full attention in silence
@pytest.mark.parametrize("raw", [
    {**L1B, "sliding_window": 4096},
    {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "sliding_window": 256},
    _hf("deepseek-v3", sliding_window=4096),
], ids=["llama", "gpt2", "deepseek_v3"])
def test_sliding_window_refused_where_not_read(raw):
    _refused(raw, "sliding_window")
    assert "sliding_window" not in hf_model_fields({**raw, "sliding_window": None})  # null: full attention


# D: DeepSeek's k above its experts was refused under n_group
@pytest.mark.parametrize("raw", [_hf("deepseek-v3", num_experts_per_tok=300),
                                 _hf("deepseek-v2-lite", topk_method="group_limited_greedy", n_group=8, topk_group=3,
                                     num_experts_per_tok=100)], ids=["v3", "v2"])
def test_deepseek_top_k_bound_named(raw):
    assert " is not between 1 and the " in _refused(raw, "num_experts_per_tok")


# E: --hidden kept the head size only where head_dim differed from hidden / heads
@pytest.mark.parametrize("model,head", [(str(HF / "qwen3-8b" / "config.json"), 128), ("qwen3-8b", 128),
                                        (str(HF / "llama-4-scout" / "config.json"), 128), ("llama-4-scout", 128)])
def test_hidden_override_keeps_the_configs_head_dim(model, head):
    m = with_overrides(get_model(model), hidden=2048)
    assert (m.head_dim, m.q_dim) == (head, m.heads * head)


def test_llama_head_dim_kept_and_counts_unchanged():
    m = with_overrides(get_model_from(L1B), hidden=1024)
    assert m.head_dim == 64
    no_key = {k: v for k, v in L1B.items() if k != "head_dim"}  # absent: it follows the width, as before
    assert hf_model_fields(no_key).get("head_dim") is None
    assert get_model_from(L1B).params() == get_model_from(no_key).params() == 1_235_814_400


def get_model_from(raw: dict):
    from memo_sim.model.config import ModelConfig  # noqa: PLC0415
    return ModelConfig.from_dict(hf_model_fields(raw, name="l1b"))


# F: presets by their Hugging Face names
@pytest.mark.parametrize("hf_name,preset", [("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
                                            ("meta-llama/Llama-4-Scout-17B-16E", "llama-4-scout"),
                                            ("mistralai/Mistral-7B-v0.3", "mistral-7b"),
                                            ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
                                            ("Qwen/Qwen1.5-MoE-A2.7B", "qwen2-moe-a2.7b"),
                                            ("meta-llama/Llama-2-7b-hf", "llama-2-7b")])
def test_presets_found_by_hugging_face_names(hf_name, preset):
    assert get_model(hf_name) is PRESETS[preset]


# G: LayerNorm models were exported with learned absolute positions, which memo neither counts nor prices
NEOX = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 2048,
        "intermediate_size": 8192, "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 50304,
        "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": False, "hidden_act": "gelu",
        "torch_dtype": "float16"}


def _export_words(model, framework: str) -> list[str]:
    from memo_sim.export import export_plan  # noqa: PLC0415
    from memo_sim.layout.parallel import Layout  # noqa: PLC0415
    from memo_sim.plan.schema import Plan  # noqa: PLC0415
    from memo_sim.policy import get_policy  # noqa: PLC0415

    m = get_model(model) if isinstance(model, str) else model
    plan = Plan(model=m, batch=8, seq_tokens=4096, gpus=8, layout=Layout(dp=8), policy=get_policy("full_recompute"),
                profile="h100-sxm5-80gb", predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, framework=framework)
    script = export_plan(plan, framework, price=False, nearest=True).files[f"{framework}.sh"]
    return " ".join(script.split()).replace("\\ ", "").split()


def _after(words: list[str], option: str) -> str | None:
    return words[words.index(option) + 1] if option in words else None


def test_gpt_neox_reads_its_rotary_share():
    assert hf_model_fields(NEOX)["rotary_fraction"] == 0.25
    assert hf_model_fields({k: v for k, v in NEOX.items() if k != "rotary_pct"})["rotary_fraction"] == 0.25  # default
    assert "rotary_fraction" not in hf_model_fields({**NEOX, "rotary_pct": 1.0})
    _refused({**NEOX, "rotary_pct": 0}, "rotary_pct")


@pytest.mark.parametrize("model", ["gpt-7b", "neox"])
def test_megatron_export_writes_rotary_positions(model):
    from memo_sim.model.config import ModelConfig  # noqa: PLC0415
    m = ModelConfig.from_dict(hf_model_fields(NEOX, name="neox")) if model == "neox" else model
    words = _export_words(m, "megatron")
    assert _after(words, "--position-embedding-type") == "rope"
    assert _after(words, "--rotary-percent") == ("0.25" if model == "neox" else None)


@pytest.mark.parametrize("model", ["gpt-7b", "neox"])
def test_deepspeed_export_writes_rotary_positions(model):
    from memo_sim.model.config import ModelConfig  # noqa: PLC0415
    m = ModelConfig.from_dict(hf_model_fields(NEOX, name="neox")) if model == "neox" else model
    words = _export_words(m, "deepspeed")
    assert "--use-rotary-position-embeddings" in words and "--no-position-embedding" in words
    assert _after(words, "--rotary-percent") == ("0.25" if model == "neox" else None)


# H: torchtitan ships DeepSeek-V2-Lite's shape as deepseek_v3_16b; the export started from deepseek_v3_671b and raised
@pytest.mark.parametrize("model", ["deepseek-v2-lite", str(HF / "deepseek-v2-lite" / "config.json")])
def test_torchtitan_starts_deepseek_v2_lite_from_its_16b(model):
    from memo_sim.export import export_plan  # noqa: PLC0415
    from memo_sim.layout.parallel import Layout  # noqa: PLC0415
    from memo_sim.plan.schema import Plan  # noqa: PLC0415
    from memo_sim.policy import get_policy  # noqa: PLC0415

    plan = Plan(model=get_model(model), batch=8, seq_tokens=32768, gpus=8, layout=Layout(dp=8, ep=8),
                policy=get_policy("full_recompute"), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, framework="torchtitan")
    text = export_plan(plan, "torchtitan", price=False, nearest=True).files["memo_torchtitan.py"]
    assert "deepseek_v3_16b" in text and "NotImplementedError" not in text and "deepseek_v3_671b" not in text
    assert "rope.max_context_length = 32768" in text.replace("'", "")  # the 16B flavour's table is 4096 * 4
