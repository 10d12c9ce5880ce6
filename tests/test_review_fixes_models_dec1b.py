"""A review of model ingestion (presets, memo model files, Hugging Face config.json files; 2026-12-01): each test
failed on the code before its fix."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.export import export_plan
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import EXPERT_FIELDS, PRESETS, ModelConfig, get_model, model_from_file, with_overrides
from memo_sim.model.hf_config import hf_model_fields, language_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy
from memo_sim.tp.metp import METP
from tests.cli_run import one_error

HF = Path(__file__).parent / "data" / "hf"


def _hf(name: str, drop: tuple = (), **over) -> dict:
    """A shipped config.json's decoder (Llama 4's text_config) without the keys ``drop``, with ``over`` on it."""
    raw = {**language_model(json.loads((HF / name / "config.json").read_text()))[0], **over}
    return {k: v for k, v in raw.items() if k not in drop}


def _write(tmp_path, name: str, fields: dict) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(fields))
    return p


# 1: qwen2.5-72b and mistral-7b left the rotary base and epsilon unstated: the exports fell back to Megatron's 10000
def test_presets_state_the_rotary_base_and_epsilon_of_their_config_json():
    assert (PRESETS["qwen2.5-72b"].rope_theta, PRESETS["qwen2.5-72b"].norm_eps) == (1e6, 1e-5)
    assert (PRESETS["mistral-7b"].rope_theta, PRESETS["mistral-7b"].norm_eps) == (1e6, 1e-5)
    # every preset of a released model (RMSNorm: the GPT and LLaMA-paper presets are shapes) states both
    unstated = [n for n, m in PRESETS.items() if m.norm == "rmsnorm" and not (m.rope_theta and m.norm_eps)]
    assert not unstated, unstated
    plan = Plan(model=get_model("qwen2.5-72b"), batch=1, seq_tokens=8192, gpus=8, layout=Layout(tp=8, sp=True),
                policy=get_policy("full_recompute"), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 10.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})
    ex = export_plan(plan, "megatron", price=False, nearest=True)
    assert "--rotary-base 1000000" in ex.files["megatron.sh"], ex.files["megatron.sh"]
    assert not any("rotary base" in g.what for g in ex.gaps), [g.what for g in ex.gaps]


# 2: --kv-heads on a latent-attention model renamed it and held its layouts to K/V heads the cost never had
def test_kv_heads_is_refused_under_latent_attention(tmp_path):
    msg = one_error(lambda: with_overrides(get_model("deepseek-v2-lite"), kv_heads=8))
    assert msg.startswith("--kv-heads 8: deepseek-v2-lite has multi-head latent attention") and "leave" in msg, msg
    fields = {**get_model("deepseek-v2-lite").to_dict(), "name": "mla", "kv_heads": 2}
    msg = one_error(lambda: model_from_file(_write(tmp_path, "mla.json", fields)))
    assert "kv_heads (2) with kv_lora_rank (512)" in msg and "leave kv_heads out" in msg, msg
    r = CliRunner().invoke(cli, ["whatif", "--model", "deepseek-v2-lite", "--kv-heads", "1", "--tp", "2",
                                 "--gpus", "8", "--seq", "16K", "--no-plan"])
    assert r.exit_code == 2 and "--kv-heads 1" in r.output and "not divisible by tp" not in r.output, r.output


# 3: a head_dim stated at hidden / heads passed the simulator's METP check and memo-exec refused the plan
def test_full_metp_is_offered_only_for_what_the_executor_builds():
    toy = ModelConfig("toyhd", 2, 256, 4, 1024, vocab=1024, dtype="fp32", head_dim=64)
    why = METP.check(Layout(tp=2, tp_mode="metp"), toy)
    assert why and "head_dim 64, which is hidden / heads" in why and "--head-dim 0" in why, why
    assert METP.check(Layout(tp=2, tp_mode="metp"), dataclasses.replace(toy, head_dim=0)) is None


def test_full_metp_check_is_the_executors_rule():
    """The simulator offers a full-METP plan exactly where the executor builds it (its time: torch's first import)."""
    pytest.importorskip("torch")
    from memo_exec.metp.flavour import FULL_METP_ARCHITECTURE
    from memo_exec.model import check_architecture

    toy = ModelConfig("toyhd", 2, 256, 4, 1024, vocab=1024, dtype="fp32", head_dim=64)
    for m in (toy, dataclasses.replace(toy, head_dim=0), get_model("qwen3-8b"), get_model("llama-3.1-8b")):
        built = check_architecture(m, FULL_METP_ARCHITECTURE, "metp", "") is None
        assert built == (METP.check(Layout(tp=2, tp_mode="metp"), m) is None), m


# 4: swiglu_limit on a GELU model was described as GPT-OSS's SwiGLU, priced as GELU and dropped by the executor
def test_swiglu_limit_needs_a_swiglu_ffn(tmp_path):
    fields = {"name": "t", "layers": 2, "hidden": 256, "heads": 4, "ffn": 512, "ffn_type": "gelu",
              "swiglu_limit": 7.0}
    msg = one_error(lambda: model_from_file(_write(tmp_path, "t.json", fields)))
    assert "swiglu_limit (7) clamps GPT-OSS's SwiGLU and ffn_type is gelu" in msg, msg
    assert ModelConfig.from_dict({**fields, "ffn_type": "swiglu"}).swiglu_limit == 7.0


# 5: moe_bias, router, shared_gate, router_normalised, aux_loss_coef, seq_aux (and shared_ffn) on a dense model were
# read and ignored
EXPERT_VALUES = {"top_k": 2, "expert_ffn": 64, "shared_experts": 1, "shared_ffn": 64, "shared_gate": True,
                 "dense_layers": 1, "dense_period": 2, "router": "sigmoid", "moe_bias": True, "router_groups": 2,
                 "router_group_topk": 1, "router_scaling": 2.0, "router_normalised": False, "aux_loss_coef": 0.01,
                 "seq_aux": True}


def test_the_value_table_covers_every_expert_field():
    assert set(EXPERT_VALUES) == set(EXPERT_FIELDS)


@pytest.mark.parametrize("field", sorted(EXPERT_VALUES))
def test_expert_fields_on_a_dense_model_are_refused(tmp_path, field):
    fields = {"name": "t", "layers": 4, "hidden": 256, "heads": 4, "ffn": 512, "ffn_type": "swiglu",
              field: EXPERT_VALUES[field]}
    path = _write(tmp_path, "t.json", fields)
    msg = one_error(lambda: model_from_file(path))
    assert msg.startswith(f"{path}: {field}: it describes experts and the model has none"), msg
    if field not in ("dense_period", "router_groups", "router_group_topk"):  # those need a partner field
        assert model_from_file(_write(tmp_path, "moe.json", {"top_k": 2, **fields, "experts": 4})).moe


def test_a_dense_view_of_a_mixture_of_experts_still_builds():
    """memo_exec.layer.dense_view drops the experts of a model built in code and keeps its router's settings: no
    file gave them, nothing to refuse."""
    for name in ("mixtral-8x7b", "deepseek-v3", "qwen2-moe-a2.7b"):
        m = get_model(name)
        view = dataclasses.replace(m, experts=0, top_k=0, expert_ffn=0, shared_experts=0, shared_ffn=0,
                                   shared_gate=False, dense_layers=0, dense_period=0, moe_bias=False, router_groups=0,
                                   router_group_topk=0, router_scaling=1.0)
        assert not view.moe and view.aux_loss_coef == m.aux_loss_coef


# 6: a config.json without num_key_value_heads was read as multi-head attention, not as its configuration class's
# default
@pytest.mark.parametrize("folder,over,kv", [
    ("mixtral-8x7b", {}, 8), ("qwen3-30b-a3b", {}, 4), ("gpt-oss-20b", {}, 8), ("glm-4.5-air", {}, 8),
    ("llama-4-scout", {}, 8), ("qwen2-moe-a2.7b", {"num_attention_heads": 32}, 16), ("mistral-7b-v0.1", {}, 8),
    ("qwen2.5-7b", {"num_attention_heads": 64}, 32), ("qwen3-8b", {"num_attention_heads": 64}, 32),
    ("llama-3.1-8b", {}, None),  # LlamaConfig's None: the query heads
])
def test_an_absent_kv_heads_is_the_familys_default(folder, over, kv):
    assert hf_model_fields(_hf(folder, drop=("num_key_value_heads",), **over)).get("kv_heads") == kv
    # a null is the query heads (the classes' `num_key_value_heads is None` branch)
    assert hf_model_fields(_hf(folder, num_key_value_heads=None, **over)).get("kv_heads") is None


# 7: an out-of-range epsilon was refused under memo's field name alone
@pytest.mark.parametrize("folder,key,value,hint", [
    ("llama-3.1-8b", "rms_norm_eps", 5, "norm_eps is rms_norm_eps"),
    ("mixtral-8x7b", "router_aux_loss_coef", 5000, "aux_loss_coef is router_aux_loss_coef"),
])
def test_a_refusal_names_the_config_jsons_key(tmp_path, folder, key, value, hint):
    (tmp_path / folder).mkdir()
    raw = json.loads((HF / folder / "config.json").read_text())
    _write(tmp_path / folder, "config.json", {**raw, key: value})
    msg = one_error(lambda: model_from_file(tmp_path / folder))
    assert f"(in the config.json: {hint})" in msg, msg


# 8: the notes were cut at 500 characters mid-word and could lose the vision tower's
def test_notes_keep_whole_sentences_the_wrappers_first(tmp_path):
    raw = json.loads((HF / "llama-4-scout" / "config.json").read_text())
    text = {**raw["text_config"], "moe_layers": [1, 2, 5, 9, 13, 20]}  # dense layers in no period: a note
    quant = {"quant_method": "fbgemm_fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "scout").mkdir()
    _write(tmp_path / "scout", "config.json", {**raw, "text_config": text, "quantization_config": quant})
    notes = model_from_file(tmp_path / "scout").not_modelled
    assert len(notes) > 500 and notes.startswith("the 'llama4' wrapper's language model"), notes
    assert "vision_config" in notes.split("; ")[0] and notes.endswith(("priced)", "fp8-blockwise)", "freq)")), notes


# 9: a near name of another release was offered the preset without saying which release it is
def test_a_near_name_says_which_release_the_preset_is():
    msg = one_error(lambda: get_model("mistral-7b-v0.1"))
    assert "did you mean 'mistral-7b' (mistral-7b-v0.3: vocab 32768, no sliding window;" in msg, msg
