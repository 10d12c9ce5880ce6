"""Review fixes: Hugging Face's ``norm_topk_prob`` and Qwen's ``mlp_only_layers`` range.

- ``norm_topk_prob`` was ignored: DeepSeek-V2(-Lite) and Qwen1.5-MoE / Qwen2-MoE keep the softmax over all the
  experts as the chosen weights (not renormalised), Mixtral and Qwen3-MoE renormalise them, and a config.json saying
  true or false gave a byte-identical plan and Megatron script. It is read as ``router_normalised`` (each family's
  transformers default where the file leaves it out), the Megatron export writes --moe-router-pre-softmax where the
  weights are not renormalised (and names what Megatron-Core cannot write), and memo-exec's router computes the
  weights so. The simulator's cost is the same either way.
- ``mlp_only_layers: [100]`` in a 48-layer Qwen3-MoE config.json was accepted silently; it is refused in one line.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS, ModelConfig, get_model
from memo_sim.model.hf_config import hf_model_fields

HF = Path(__file__).parent / "data" / "hf"


def _cfg(folder: str, **over) -> dict:
    raw = json.loads((HF / folder / "config.json").read_text())
    raw = copy.deepcopy(raw.get("text_config", raw)) if "text_config" in raw else raw
    for k, v in over.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return raw


def _model(folder: str, **over) -> ModelConfig:
    return ModelConfig.from_dict(hf_model_fields(_cfg(folder, **over), name=folder))


@pytest.mark.parametrize("folder, absent, false, true", [
    ("deepseek-v2-lite", False, False, True),   # DeepseekV2Config: norm_topk_prob False
    ("qwen2-moe-a2.7b", False, False, True),    # Qwen2MoeConfig: False
    ("qwen3-30b-a3b", False, False, True),      # Qwen3MoeConfig: False (the checkpoints say true)
    ("deepseek-v3", True, False, True),         # DeepseekV3Config: True
    ("glm-4.5-air", True, False, True),         # Glm4MoeConfig: True
    ("mixtral-8x7b", True, True, True),         # Mixtral always renormalises: the key is not read
    ("gpt-oss-20b", True, True, True),          # GPT-OSS: a softmax over the top-k logits, always
])
def test_norm_topk_prob_is_read_with_each_familys_default(folder, absent, false, true):
    assert _model(folder, norm_topk_prob=None).router_normalised is absent
    assert _model(folder, norm_topk_prob=False).router_normalised is false
    assert _model(folder, norm_topk_prob=True).router_normalised is true


def test_the_presets_of_the_unnormalised_families_say_so_and_llama_4_never_normalises():
    assert not PRESETS["deepseek-v2-lite"].weights_normalised
    assert not PRESETS["qwen2-moe-a2.7b"].weights_normalised
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "glm-4.5-air", "gpt-oss-20b"):
        assert PRESETS[name].weights_normalised, name
    assert get_model(str(HF / "deepseek-v2-lite")).router_normalised is False  # the checkpoint's own file
    scout = PRESETS["llama-4-scout"]
    assert scout.router_normalised and not scout.weights_normalised  # its sigmoid_topk router never normalises
    # a plan's model keeps it, and leaves it out where it is the default
    v2 = PRESETS["deepseek-v2-lite"]
    assert v2.to_dict()["router_normalised"] is False and ModelConfig.from_dict(v2.to_dict()) == v2
    assert "router_normalised" not in PRESETS["mixtral-8x7b"].to_dict()


def test_a_norm_topk_prob_not_a_bool_is_refused_in_one_line():
    with pytest.raises(MemoError) as e:
        hf_model_fields(_cfg("qwen2-moe-a2.7b", norm_topk_prob="yes"))
    msg = str(e.value)
    assert "norm_topk_prob" in msg and "true or false" in msg and "\n" not in msg


def _megatron(m: ModelConfig) -> tuple[dict, list]:
    from memo_sim.export import megatron
    from memo_sim.policy import get_policy
    from tests.exec_helpers import make_plan

    plan = make_plan(m, 4096, get_policy("store_all"))
    return dict(megatron.arguments(plan, [])), megatron.gaps(plan)


def test_megatron_writes_pre_softmax_where_the_weights_are_not_renormalised():
    for name, pre in (("deepseek-v2-lite", True), ("qwen2-moe-a2.7b", True), ("mixtral-8x7b", False),
                      ("qwen3-30b-a3b", False), ("deepseek-v3", False), ("llama-4-scout", False)):
        args, gaps = _megatron(PRESETS[name])
        assert ("--moe-router-pre-softmax" in args) is pre, name
        assert not any("renormalised" in g.what for g in gaps), (name, gaps)
    # the two config.json files of the review: only norm_topk_prob differs, and so do the scripts
    off, _ = _megatron(_model("deepseek-v2-lite", norm_topk_prob=False))
    on, _ = _megatron(_model("deepseek-v2-lite", norm_topk_prob=True))
    assert set(off) - set(on) == {"--moe-router-pre-softmax"} and set(on) <= set(off)
    # DeepSeek-V3's sigmoid router keeps its options
    v3, _ = _megatron(PRESETS["deepseek-v3"])
    assert (v3["--moe-router-score-function"], v3["--moe-router-topk-scaling-factor"]) == ("sigmoid", "2.5")
    assert "--moe-router-enable-expert-bias" in v3


def test_megatron_names_the_weights_it_cannot_write():
    """Megatron-Core's sigmoid router renormalises every top-k above 1 (pre-softmax or not), and it refuses softmax
    top-1 without --moe-router-pre-softmax, whose weight is then the probability, not 1."""
    args, gaps = _megatron(replace(PRESETS["deepseek-v3"], router_normalised=False))
    assert "--moe-router-pre-softmax" not in args
    assert [g.what for g in gaps if "sigmoid weights" in g.what] == [
        "the router's top-8 sigmoid weights not renormalised (norm_topk_prob false)"]
    top1 = replace(PRESETS["mixtral-8x7b"], top_k=1)
    args, gaps = _megatron(top1)
    assert "--moe-router-pre-softmax" in args and any("top-1 weight renormalised" in g.what for g in gaps)
    args, gaps = _megatron(replace(top1, router_normalised=False))  # Switch's: the probability, as Megatron runs it
    assert "--moe-router-pre-softmax" in args and not any("renormalised" in g.what for g in gaps)


def test_torchtitan_and_deepspeed_name_unnormalised_weights():
    from memo_sim.export import deepspeed, torchtitan
    from memo_sim.policy import get_policy
    from tests.exec_helpers import make_plan

    qwen3 = _model("qwen3-30b-a3b", norm_topk_prob=None)  # transformers' default: not renormalised
    plan = make_plan(qwen3, 4096, get_policy("store_all"))
    assert any("not renormalised (norm_topk_prob false)" in g.what for g in torchtitan.gaps(plan))
    assert any("norm_topk_prob false" in w for w in deepspeed.moe_why_not(qwen3))
    normal = _model("qwen3-30b-a3b")
    assert not any("renormalised" in g.what for g in torchtitan.gaps(make_plan(normal, 4096, get_policy("store_all"))))
    assert deepspeed.moe_why_not(normal) == []


def test_whatif_and_export_of_two_configs_differing_in_norm_topk_prob(tmp_path):
    """The review's reproduction: `memo-sim whatif` then `memo-sim export --to megatron` of a DeepSeek-V2-Lite-like
    config.json with norm_topk_prob false and true gave identical plans and scripts. The plans' predictions stay
    equal: the router's cost does not depend on it."""
    from click.testing import CliRunner

    from memo_sim.cli import cli

    out = {}
    for flag in (False, True):
        d = tmp_path / str(flag) / "dsv2-lite-like"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(_cfg("deepseek-v2-lite", norm_topk_prob=flag, num_hidden_layers=4)))
        r = CliRunner().invoke(cli, ["whatif", "--model", str(d), "--seq", "4K", "--gpus", "8", "--profile",
                                     "h100-sxm5-80gb", "--policy", "store_all", "--out", str(d / "p"), "--no-progress"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(cli, ["export", str(d / "p" / "plan.json"), "--to", "megatron", "--nearest",
                                     "--no-price", "--out", str(d / "x"), "--no-progress"])
        assert r.exit_code == 0, r.output
        plan = json.loads((d / "p" / "plan.json").read_text())
        out[flag] = plan, (d / "x" / "megatron.sh").read_text()
    (p_off, sh_off), (p_on, sh_on) = out[False], out[True]
    assert p_off["model"]["router_normalised"] is False and "router_normalised" not in p_on["model"]
    assert p_off["predicted"] == p_on["predicted"]
    assert "    --moe-router-pre-softmax \\" in sh_off.splitlines() and "--moe-router-pre-softmax" not in sh_on


def test_the_executors_routing_weights_sum_to_one_only_when_normalised():
    torch = pytest.importorskip("torch")
    from memo_exec.moe.routers import router_for

    logits = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    base = ModelConfig("r", 2, 64, 4, 128, experts=8, top_k=3, ffn_type="swiglu", norm="rmsnorm", bias="none")
    for router in ("softmax", "sigmoid"):
        normed = replace(base, router=router)
        idx, w = router_for(normed)(logits, 3)
        assert torch.allclose(w.sum(-1), torch.ones(16, dtype=torch.float64)), router
        raw = replace(normed, router_normalised=False)
        idx2, w2 = router_for(raw)(logits, 3)
        scores = torch.softmax(logits, -1) if router == "softmax" else torch.sigmoid(logits)
        assert torch.equal(idx2, idx) and torch.allclose(w2, scores.gather(1, idx))
        assert not torch.allclose(w2.sum(-1), torch.ones(16, dtype=torch.float64)), router
        if router == "softmax":  # DeepSeek-V2's and Qwen2-MoE's: the k largest probabilities, summing below 1
            assert bool((w2.sum(-1) < 1).all())
            # the normalised weights are the softmax over the k chosen logits (Megatron-LM's default)
            assert torch.allclose(w, torch.softmax(logits.gather(1, idx), -1))


def test_unnormalised_groups_are_scored_on_the_probabilities():
    """Under --moe-router-pre-softmax Megatron-Core's group-limited top-k scores the groups on the softmax
    probabilities, not on the logits (its default): the executor's groups follow the weights' rule."""
    torch = pytest.importorskip("torch")
    from memo_exec.moe.routers import router_for

    m = ModelConfig("g", 2, 64, 4, 128, experts=4, top_k=2, router_groups=2, router_group_topk=1,
                    ffn_type="swiglu", norm="rmsnorm", bias="none")
    assert router_for(m).groups_on_logits and not router_for(replace(m, router_normalised=False)).groups_on_logits
    # top-2 of one group of two: group 0's logits (3, -9) sum below group 1's (0, 0), its probabilities above
    logits = torch.tensor([[3.0, -9.0, 0.0, 0.0]], dtype=torch.float64)
    assert router_for(m)(logits, 2)[0].tolist() == [[2, 3]]
    assert router_for(replace(m, router_normalised=False))(logits, 2)[0].tolist() == [[0, 1]]


def test_the_executors_block_weighs_the_experts_by_the_unnormalised_probabilities():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from memo_exec.model import GPT
    from memo_exec.moe.block import MoEBlock
    from memo_exec.moe.experts import ffn

    model = ModelConfig("moe-unnormalised", 2, 64, 4, 128, vocab=128, dtype="fp32", experts=4, top_k=2,
                        expert_ffn=48, ffn_type="swiglu", norm="rmsnorm", bias="none", router_normalised=False)
    gpt = GPT(model, model.layers, torch.device("cpu"), torch.float64)
    gpt.init_(0)
    mb = gpt.layers[0].moe
    x = torch.randn(12, model.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, idx, _ = MoEBlock(model).math(mb, x)
        p = torch.softmax(F.linear(x, mb.router_w, mb.router_b), -1)
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for e in sorted(range(model.experts), key=lambda e: (-float(p[t, e]), e))[:model.top_k]:
                want[t] += p[t, e] * ffn(x[t:t + 1], mb.expert_w1[e], mb.expert_w2[e], None, None, True)[0]
    assert float((y - want).norm() / want.norm()) < 1e-12


def test_mlp_only_layers_out_of_range_is_refused_in_one_line(tmp_path):
    raw = _cfg("qwen3-30b-a3b", mlp_only_layers=[100])
    assert raw["num_hidden_layers"] == 48
    with pytest.raises(MemoError) as e:
        hf_model_fields(raw)
    msg = str(e.value)
    assert "mlp_only_layers" in msg and "out of range 0..47" in msg and "100" in msg and "\n" not in msg
    with pytest.raises(MemoError, match="mlp_only_layers"):
        hf_model_fields(_cfg("qwen2-moe-a2.7b", mlp_only_layers=[-1]))
    assert _model("qwen3-30b-a3b", mlp_only_layers=[0, 47]).dense_layers == 2  # the ends of the range are layers
    # the CLI: exit status 2, the one line, no traceback
    from click.testing import CliRunner

    from memo_sim.cli import cli

    f = tmp_path / "q" / "config.json"
    f.parent.mkdir()
    f.write_text(json.dumps(raw))
    r = CliRunner().invoke(cli, ["whatif", "--model", str(f), "--gpus", "8", "--seq", "4K", "--no-progress",
                                 "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "mlp_only_layers: index 100 out of range 0..47" in r.output, r.output
    assert "Traceback" not in r.output
