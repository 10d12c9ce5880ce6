"""Models from Hugging Face config.json files (`memo_sim.model.hf_config`) and the new presets."""

import json
import shutil

import pytest

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS, ModelConfig, get_model
from memo_sim.model.hf_config import hf_model_fields
from pathlib import Path

HF = Path(__file__).parent / "data" / "hf"

# published parameter counts (the model cards), billions
PUBLISHED_B = {"llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55, "llama-3.1-405b": 405.85, "qwen2.5-7b": 7.62,
               "qwen2.5-72b": 72.71, "mistral-7b": 7.25,
               "llama-2-7b": 6.74, "llama-2-70b": 68.98}  # Llama-2: 6,738,415,616 and 68,976,648,192


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_presets_count_published_parameters(name):
    assert PRESETS[name].params() / 1e9 == pytest.approx(PUBLISHED_B[name], abs=0.006)


def test_gpt_presets_unchanged_by_the_architecture_fields():
    m = PRESETS["gpt-7b"]
    h, f, V = 4096, 16384, 50257
    layer = h * 3 * h + 3 * h + h * h + h + 2 * h * f + f + h + 4 * h
    assert m.params() == 32 * layer + V * h + 2 * h


# Qwen3 (dense): sum(p.numel() for p in model.parameters()) of transformers 5.24.0's Qwen3ForCausalLM built on the
# meta device from tests/data/hf/qwen3-*/config.json (AutoConfig.from_pretrained(folder), then
# AutoModelForCausalLM.from_config under torch.device("meta"); torch 2.13.0; run 2026-11-28 in a scratch venv, as
# tests/data/hf/count_params.py does for the MoE fixtures). The files carry the fields of Qwen/Qwen3-8B, -14B and
# -32B's config.json (the sizes cross-checked against several published copies; the model cards say 8.2B, 14.8B
# and 32.8B)
QWEN3_TRANSFORMERS = {"qwen3-8b": 8_190_735_360, "qwen3-14b": 14_768_307_200, "qwen3-32b": 32_762_123_264}


@pytest.mark.parametrize("name", sorted(QWEN3_TRANSFORMERS))
def test_qwen3_presets_and_configs_count_what_transformers_builds(name):
    m = get_model(str(HF / name))
    assert m == PRESETS[name]
    assert m.params() == QWEN3_TRANSFORMERS[name]
    assert m.qk_norm and m.qk_head_dim == 128 and m.q_dim == m.heads * 128  # 32B: 8192-wide queries, hidden 5120


@pytest.mark.parametrize("folder,preset", [("llama-3.1-8b", "llama-3.1-8b"), ("qwen2.5-7b", "qwen2.5-7b")])
def test_config_json_equals_the_preset(folder, preset):
    assert get_model(str(HF / folder / "config.json")) == PRESETS[preset]
    assert get_model(str(HF / folder)) == PRESETS[preset]  # the folder holding it


def test_mistral_slides_every_layer_and_reads_its_head_dim(tmp_path):
    """Mistral-7B-v0.1's 4096-token window is on every layer (transformers' Mistral masks each layer so; it was
    refused as 'not modelled' while memo models windows); Mistral-Small-3.x's 32 heads of 128 in a 5120-wide model
    were refused on head_dim (a user's review). Counts: transformers 5.24.0 on the meta device, 2026-11-28
    (MistralForCausalLM from the configs below: Mistral-Small-3.1-24B's text_config, Ministral-8B-Instruct-2410)."""
    m = get_model(str(HF / "mistral-7b-v0.1" / "config.json"))
    assert (m.sliding_window, m.sliding_layers, m.params()) == (4096, 32, 7_241_732_096)
    small = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 5120, "intermediate_size": 32768, "num_attention_heads": 32, "num_hidden_layers": 40,
             "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None,
             "vocab_size": 131072, "torch_dtype": "bfloat16"}
    s = ModelConfig.from_dict(hf_model_fields(small, name="small"))
    assert (s.head_dim, s.q_dim, s.qk_norm, s.sliding_window, s.params()) == (128, 4096, False, 0, 23_572_403_200)
    ministral = {**small, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "rope_theta": 100000000.0, "sliding_window": 32768, "tie_word_embeddings": False}
    mi = ModelConfig.from_dict(hf_model_fields(ministral, name="ministral"))
    assert (mi.head_dim, mi.sliding_window, mi.sliding_layers, mi.params()) == (128, 32768, 36, 8_019_808_256)
    # the same text model inside Mistral-3's multimodal wrapper: read from text_config, the vision tower named
    wrapper = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
               "torch_dtype": "bfloat16", "text_config": {k: v for k, v in small.items() if k != "architectures"},
               "vision_config": {"model_type": "pixtral", "hidden_size": 1024, "num_hidden_layers": 24}}
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    w = get_model(str(tmp_path / "config.json"))
    assert w.params() == 23_572_403_200 and "'mistral3'" in w.not_modelled
    assert "its vision_config and the projector not modelled" in w.not_modelled, w.not_modelled


def test_a_family_read_by_its_architectures_or_refused_by_its_text_config(tmp_path):
    """Kimi-K2 names its own model_type (kimi_k2) but DeepSeek-V3's class: read as deepseek_v3 and said so (it was
    refused); a wrapper whose language model memo does not read (Gemma-3's gemma3_text) is refused naming
    text_config.model_type, and no 'did you mean llama' for llama4 (Llama-4 is not Llama: a user followed that
    hint)."""
    v3 = json.loads((HF / "deepseek-v3" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**v3, "model_type": "kimi_k2"}))
    k = get_model(str(tmp_path / "config.json"))
    assert k.params() == get_model(str(HF / "deepseek-v3" / "config.json")).params()
    assert "model_type 'kimi_k2' read as deepseek_v3 by its architectures (DeepseekV3ForCausalLM)" in k.not_modelled
    gemma = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62}}
    (tmp_path / "config.json").write_text(json.dumps(gemma))
    with pytest.raises(MemoError) as e:
        get_model(str(tmp_path / "config.json"))
    msg = str(e.value)
    assert ": text_config.model_type: 'gemma3_text': the 'gemma3' model's language model" in msg, msg
    assert "did you mean" not in msg and "Model files and profiles" in msg and "\n" not in msg
    for mt, hint in (("llama4", None), ("mistral3", None), ("deepseekv3", "deepseek_v3"), ("Qwen3-MoE", "qwen3_moe"),
                     ("deepseek_v4", None), ("qwen3_omni_moe", None), ("glm4v_moe", None), ("qwen4", None),
                     ("lama", "llama"), ("qwen3_mo", "qwen3_moe"), ("mixtrel", "mixtral")):
        with pytest.raises(MemoError) as e:
            hf_model_fields(_llama(model_type=mt), source="x/config.json")
        assert (f"did you mean {hint!r}" in str(e.value)) if hint else "did you mean" not in str(e.value), str(e.value)


def _llama(**over):
    raw = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    raw.update(over)
    return raw


@pytest.mark.parametrize("over,field", [
    (dict(model_type="t5"), "model_type"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(model_type="qwen2", head_dim=256), "head_dim"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(is_encoder_decoder=True), "is_encoder_decoder"),
    (dict(num_experts=64), "num_experts"),
    (dict(torch_dtype="int8"), "torch_dtype"),
    (dict(hidden_size=-1), "hidden_size"),
    (dict(num_hidden_layers=None), "num_hidden_layers"),
])
def test_field_refusals(over, field):
    with pytest.raises(MemoError) as e:
        hf_model_fields(_llama(**over), source="x/config.json")
    assert f"x/config.json: {field}: " in str(e.value)


def test_a_config_json_that_breaks_a_model_rule_names_its_own_keys(tmp_path):
    """memo's rule names its fields (hidden, heads); a config.json's author knows hidden_size and
    num_attention_heads: both are named (a user's review)."""
    from memo_sim.model.config import model_from_file

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama(num_attention_heads=30, num_key_value_heads=30)))
    with pytest.raises(MemoError) as e:
        model_from_file(path)
    msg = str(e.value)
    assert "must be divisible by heads (30)" in msg and "\n" not in msg
    assert msg.endswith("(in the config.json: hidden is hidden_size, heads is num_attention_heads)"), msg
    odd = tmp_path / "vocab-experts-layers"  # memo's field names in the path are not the rule's
    odd.mkdir()
    (odd / "config.json").write_text(path.read_text())
    with pytest.raises(MemoError) as e:
        model_from_file(odd / "config.json")
    assert str(e.value).endswith("(in the config.json: hidden is hidden_size, heads is num_attention_heads)")


def test_a_mistyped_family_gets_the_near_one_named():
    with pytest.raises(MemoError) as e:
        hf_model_fields(_llama(model_type="qwen3_mo"), source="x/config.json")
    assert "'qwen3_mo' is not a family memo reads; did you mean 'qwen3_moe'?" in str(e.value)
    with pytest.raises(MemoError) as e:
        hf_model_fields(_llama(model_type="t5"), source="x/config.json")
    assert "did you mean" not in str(e.value)


def test_families_map_to_the_architecture_fields():
    q = ModelConfig.from_dict(hf_model_fields(_llama(model_type="qwen2"), name="q"))
    assert (q.norm, q.bias, q.tied_embeddings, q.ffn_type) == ("rmsnorm", "qkv", False, "swiglu")
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "activation_function": "gelu_new"}
    g = ModelConfig.from_dict(hf_model_fields(gpt2, name="gpt2"))
    assert (g.norm, g.bias, g.tied_embeddings, g.ffn, g.ffn_type) == ("layernorm", "all", True, 3072, "gelu")
    assert g.params() == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small without its 1024 x 768 position table
    q3 = ModelConfig.from_dict(hf_model_fields(_llama(model_type="qwen3", head_dim=256), name="q3"))
    assert (q3.qk_norm, q3.head_dim, q3.bias, q3.q_dim) == (True, 256, "none", 32 * 256)
    q3b = ModelConfig.from_dict(hf_model_fields(_llama(model_type="qwen3", attention_bias=True), name="q3b"))
    assert (q3b.bias, q3b.head_dim) == ("all", 128)  # head_dim 128 x 32 heads = hidden: kept
    with pytest.raises(MemoError, match="x/config.json: max_window_layers: "):  # which layers slide: unsaid
        hf_model_fields(_llama(model_type="qwen3", use_sliding_window=True), source="x/config.json")
    # Qwen's window covers the layers from max_window_layers on: none of the 32 at 32, the last 4 at 28
    slid = {k: _llama(model_type="qwen3", use_sliding_window=True, sliding_window=4096, max_window_layers=k)
            for k in (32, 28)}
    assert ModelConfig.from_dict(hf_model_fields(slid[32], name="a")).sliding_layers == 0
    m = ModelConfig.from_dict(hf_model_fields(slid[28], name="b"))
    assert (m.sliding_window, m.sliding_layers) == (4096, 4)
    neox = {"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
            "intermediate_size": 2048, "vocab_size": 50304}
    with pytest.raises(MemoError, match="use_parallel_residual"):
        hf_model_fields(neox)
    n = ModelConfig.from_dict(hf_model_fields({**neox, "use_parallel_residual": False}, name="n"))
    assert (n.norm, n.bias, n.tied_embeddings) == ("layernorm", "all", False)


def test_whatif_on_a_config_equals_the_preset(tmp_path):
    from click.testing import CliRunner

    from memo_sim.cli import cli as main

    shutil.copytree(HF / "llama-3.1-8b", tmp_path / "llama-3.1-8b")
    runner = CliRunner()
    # single-stage layouts only (--pp 1): every row of that search is compared, the pipelines' search is not the point
    args = ["whatif", "--gpus", "8", "--seq", "128K", "--json", "--no-plan", "--simulate-top", "2", "--jobs", "1",
            "--pp", "1"]
    a = runner.invoke(main, args + ["--model", str(tmp_path / "llama-3.1-8b" / "config.json")])
    b = runner.invoke(main, args + ["--model", "llama-3.1-8b"])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    def answer(out):  # every number but the simulator's own wall time
        return [{k: v for k, v in row.items() if not k.endswith("_wall_s")} for row in json.loads(out)["candidates"]]

    assert answer(a.output) == answer(b.output)
    (tmp_path / "q2.json").write_text(json.dumps({**_llama(), "model_type": "qwen2", "head_dim": 256}))
    bad = runner.invoke(main, ["whatif", "--model", str(tmp_path / "q2.json"), "--gpus", "8"])
    assert bad.exit_code == 2 and "head_dim" in bad.output


def test_whatif_answers_for_qwen3_32b_and_refuses_sppo_for_it_in_one_line():
    """Qwen3-32B's queries (64 heads of 128) are wider than its 5120-wide model, which SPPO's pieces do not price:
    the default what-if leaves SPPO out (it stopped with SPPO's error before), and --policy sppo is one line."""
    from click.testing import CliRunner

    from memo_sim.cli import cli as main

    runner = CliRunner()
    args = ["whatif", "--model", "qwen3-32b", "--gpus", "8", "--seq", "16K", "--no-plan", "--simulate-top", "1",
            "--jobs", "1", "--pp", "2"]
    r = runner.invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["candidates"] and out["model"]["params"] == QWEN3_TRANSFORMERS["qwen3-32b"]
    r = runner.invoke(main, args + ["--policy", "sppo"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0 and "head_dim" in r.output, r.output


def test_presets_answer_to_hugging_face_spellings_and_an_fp32_config_says_its_dtype(tmp_path):
    """`--model Qwen3-32B` (or the repo id Qwen/Qwen3-32B) was 'unknown' with no hint, and a config.json saved in
    float32 planned fp32 training without saying so (a user's review)."""
    from click.testing import CliRunner

    from memo_sim.cli import cli as main

    assert get_model("Qwen3-32B") is PRESETS["qwen3-32b"] and get_model("Qwen/Qwen3-32B") is PRESETS["qwen3-32b"]
    with pytest.raises(MemoError, match="did you mean 'qwen3-32b'"):
        get_model("qwen3-23b")
    raw = json.loads((HF / "qwen3-8b" / "config.json").read_text())
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps({**raw, "torch_dtype": "float32"}))
    r = CliRunner().invoke(main, ["whatif", "--model", str(tmp_path / "q"), "--gpus", "8", "--seq", "4K", "--no-plan",
                                  "--jobs", "1", "--simulate-top", "1", "--pp", "1"])  # the answer is single stage
    assert r.exit_code == 0 and "fp32 training (--dtype bf16 plans bf16)" in r.output.splitlines()[1], r.output


def test_a_wrappers_quantization_and_key_hints_are_its_text_models(tmp_path):
    """A multimodal wrapper's quantization_config is named as a dense file's is, and a rule broken under text_config
    names text_config's keys (a review of this session's diff)."""
    text = {k: v for k, v in _llama().items() if k != "architectures"}
    wrapper = {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
               "quantization_config": {"quant_method": "fp8"}, "text_config": {**text, "model_type": "mistral",
                                                                              "sliding_window": None},
               "vision_config": {"model_type": "pixtral"}, "audio_config": {"model_type": "x"}}
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    m = get_model(str(tmp_path / "config.json"))
    assert "quantization_config (quant_method fp8)" in m.not_modelled
    assert "its audio_config, vision_config and the projector not modelled" in m.not_modelled
    (tmp_path / "config.json").write_text(json.dumps(dict(wrapper, text_config={"model_type": "mistral"})))
    with pytest.raises(MemoError, match=r"config.json text_config: hidden_size: missing"):  # where the field lies
        get_model(str(tmp_path / "config.json"))
    bad = dict(wrapper, text_config={**wrapper["text_config"], "num_attention_heads": 30, "num_key_value_heads": 30})
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(MemoError) as e:
        get_model(str(tmp_path / "config.json"))
    assert str(e.value).endswith("(in the config.json: hidden is hidden_size, heads is num_attention_heads)"), e.value
