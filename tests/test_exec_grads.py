"""Loss and every parameter gradient of each activation policy against a plain-autograd reference.

Small GPT (4 layers, h=256, 8 heads, ffn=1024, 2048 tokens, vocab 512) in fp32 on CPU; the
reference uses nn.LayerNorm / nn.Linear / F.scaled_dot_product_attention(is_causal=True) /
F.cross_entropy. Tolerance: 1e-5 relative (norm-wise per parameter, and on the loss); fp32 gives
about 1e-6 here, so no fp64 is needed for this file.
"""

from __future__ import annotations

import pytest
import torch

from memo_exec.model import vocab_padding_params
from memo_exec.activations import offload_token_count
from tests.exec_helpers import (bf16_within_autograd_noise, executor_grads, make_plan, max_rel_error,
                               reference_grads, time_limit)
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy

torch.set_num_threads(1)  # the test machine's cores are shared; OpenMP teams stall under contention

MODEL = ModelConfig("exec-test", 4, 256, 8, 1024, vocab=512)
SEQ = 2048
TOL = 1e-5

POLICIES = {
    "store_all": get_policy("store_all"),
    "full_recompute": get_policy("full_recompute"),
    "full_offload": get_policy("full_offload"),
    "memo0": get_policy("memo", 0.0),
    "memo0.3": get_policy("memo", 0.3),
    "memo1": get_policy("memo", 1.0),
    "checkpoint_offload": get_policy("checkpoint_offload"),
    "offload_attn": get_policy("offload_attn"),  # Megatron's --offload-modules core_attn attn_proj
}


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(180):
        yield


@pytest.fixture(scope="module")
def reference():
    _, _, ex = executor_grads(make_plan(MODEL, SEQ, POLICIES["store_all"]))
    return reference_grads(ex)


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_matches_reference(name, reference):
    ref_loss, ref_grads = reference
    loss, grads, ex = executor_grads(make_plan(MODEL, SEQ, POLICIES[name]))
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{name}: gradient of {worst} off by {err:.2e}"
    if name == "memo0.3":
        assert ex.policy.n_off == offload_token_count(0.3, SEQ) == 614  # 0.3 * 2048 = 614.4: uneven split


def test_cpu_flash_backend_matches_reference(reference):
    ref_loss, ref_grads = reference
    loss, grads, ex = executor_grads(make_plan(MODEL, SEQ, POLICIES["memo0.3"], backend="sdpa_flash"))
    assert ex.backend.name == "sdpa_flash"
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"gradient of {worst} off by {err:.2e}"


@pytest.mark.parametrize("backend", ["math", "sdpa_flash"])
@pytest.mark.parametrize("policy", [get_policy("store_all"), get_policy("memo", 0.3),
                                    get_policy("full_recompute")], ids=lambda p: p.label())
def test_gqa_swiglu_batch2(backend, policy):
    m = ModelConfig("gqa-swiglu", 3, 128, 8, 384, vocab=256, kv_heads=2, ffn_type="swiglu")
    plan = make_plan(m, 300, policy, batch=2, backend=backend, chunk=257)
    loss, grads, ex = executor_grads(plan)
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"gradient of {worst} off by {err:.2e}"
    assert sum(p.numel() for p in ex.gpt.parameters()) - vocab_padding_params(m) == m.params()


@pytest.mark.parametrize("policy", [get_policy("memo", 0.3), get_policy("full_recompute")],
                         ids=lambda p: p.label())
def test_bf16_paths_on_cpu_are_as_good_as_bf16_autograd(policy):
    """The CUDA dtype path (bf16 compute, fp32 master weights, fp32 softmax in the head) on CPU: each
    gradient is as close to the fp32 reference as plain bf16 autograd's is."""
    m = ModelConfig("bf16", 4, 128, 4, 512, vocab=256)
    loss, grads, ex = executor_grads(make_plan(m, 512, policy, chunk=200), dtype="bf16")
    ref_loss, _ = reference_grads(ex, dtype=torch.float32)
    assert abs(loss - ref_loss) <= 1e-3 * abs(ref_loss)
    bad = bf16_within_autograd_noise(ex, grads)
    assert not bad, bad
