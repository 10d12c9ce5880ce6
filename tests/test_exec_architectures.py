"""The executor builds the plan model's architecture (`memo_sim.model.config`: norm, bias,
tied_embeddings), and its loss and every gradient match a plain-autograd reference of that
architecture (tests/exec_reference.py) under each activation policy.

Tiny shapes in fp32 on CPU; tolerance 1e-5 relative (norm-wise per parameter, and on the loss).
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_exec.layer import LayerWeights, layer_biases
from memo_exec.model import GPT
from memo_sim.cli import cli as sim_cli
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, reference_grads, time_limit

torch.set_num_threads(1)

TOL = 1e-5
SHAPES = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 160, "vocab": 96}
ARCHS = {
    # Qwen2: RMSNorm, a bias on QKV only, untied classifier, GQA, SwiGLU
    "qwen2": ModelConfig("qwen2-like", **SHAPES, kv_heads=2, ffn_type="swiglu", norm="rmsnorm", bias="qkv",
                         tied_embeddings=False),
    # Llama: RMSNorm, no biases, untied classifier
    "llama": ModelConfig("llama-like", **SHAPES, kv_heads=2, ffn_type="swiglu", norm="rmsnorm", bias="none",
                         tied_embeddings=False),
    "gpt": ModelConfig("gpt-like", **SHAPES),
    # the remaining combinations the fields allow: a GELU FFN without biases, LayerNorm untied
    "gelu-rms-nobias": ModelConfig("gelu-rms", **SHAPES, norm="rmsnorm", bias="none"),
    "layernorm-qkv-untied": ModelConfig("ln-qkv", **SHAPES, kv_heads=1, bias="qkv", tied_embeddings=False),
}
POLICIES = {"store_all": get_policy("store_all"), "full_recompute": get_policy("full_recompute"),
            "memo0.5": get_policy("memo", 0.5)}


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(120):
        yield


@pytest.mark.parametrize("arch", list(ARCHS))
def test_parameters_are_the_architectures(arch):
    m = ARCHS[arch]
    lw = LayerWeights(m, m.layers, torch.device("meta"), torch.float32)
    names = {n for n, _ in lw.named_parameters()}
    assert sum(p.numel() for p in lw.parameters()) == m.layer_params()
    assert {"ln1_b", "ln2_b"} <= names if m.norm == "layernorm" else not names & {"ln1_b", "ln2_b"}
    assert names & {"bqkv", "bo", "b1", "b2"} == set(layer_biases(m))
    gpt = GPT(m, m.layers, torch.device("meta"), torch.float32)
    assert sum(p.numel() for p in gpt.parameters()) == m.params()
    outer = {n for n, _ in gpt.outer_parameters()}
    assert ("lm_head" in outer) == (not m.tied_embeddings) and ("lnf_b" in outer) == (m.norm == "layernorm")


def test_biases_by_setting():
    q, ll, g = ARCHS["qwen2"], ARCHS["llama"], ARCHS["gpt"]
    assert layer_biases(q) == ("bqkv",) and layer_biases(ll) == ()
    assert layer_biases(g) == ("bqkv", "bo", "b1", "b2")
    assert layer_biases(ModelConfig("s", 1, 64, 4, 96, ffn_type="swiglu")) == ("bqkv", "bo")


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradients_match_autograd(arch, policy):
    m = ARCHS[arch]
    plan = make_plan(m, 96, POLICIES[policy], batch=2, chunk=70)
    loss, grads, ex = executor_grads(plan)
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{arch} {policy}: gradient of {worst} off by {err:.2e}"
    if not m.tied_embeddings:  # the untied head and the embedding are distinct, with distinct gradients
        assert ex.gpt.lm_head.data_ptr() != ex.gpt.wte.data_ptr()
        assert not torch.allclose(grads["lm_head"], grads["wte"])


def test_hf_qwen_plan_runs_one_step(tmp_path):
    """A plan made from the Qwen2.5 config.json with shape overrides keeps the architecture (GQA:
    the config's 4 KV heads under 8 heads) and runs one step on the CPU executor."""
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "tests/data/hf/qwen2.5-7b/config.json", "--layers", "2",
                                     "--hidden", "128", "--heads", "8", "--ffn", "256", "--vocab", "512",
                                     "--dtype", "fp32", "--seq", "512", "--gpus", "1", "--policy", "memo",
                                     "--alpha", "0.5", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "plan.json").read_text())["model"]
    assert (m["norm"], m["bias"], m["tied_embeddings"], m["ffn_type"], m["kv_heads"]) == \
        ("rmsnorm", "qkv", False, "swiglu", 4)
    out = tmp_path / "run"
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(out)])
    assert r.exit_code == 0, r.output
    measured = json.loads((out / "measured.json").read_text())
    assert measured["meta"]["params"] == ModelConfig.from_dict(m).params()
