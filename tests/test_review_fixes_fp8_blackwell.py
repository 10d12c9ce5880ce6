"""FP8 tensorwise GEMMs under TransformerEngine on Blackwell keep one quantised copy of each tensor, not Hopper's two.

A review: `--precision fp8-tensorwise` under Megatron-LM added 13 GiB of model states to Llama-3.1-8B on a B200 as
on an H100 (32 layers x 218M linear parameters x 2 bytes). TransformerEngine writes a per-tensor-scaled tensor's
transposed copy only where the GPU's FP8 GEMMs take the TN layout alone (`is_non_tn_fp8_gemm_supported`: compute
capability 10.x, 11.x and 13.0 on run any layout); its tests count a Blackwell module's cached FP8 weights at one
byte per element. The profiles now state their compute capability; torchao's Float8Linear and memo's executor cast
both copies whatever the GPU, and the formats with per-row or per-block scales keep two copies everywhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.gemm_format import fp8_gemm_any_layout, for_profile, weight_cache_bytes
from memo_sim.search.frameworks import get_framework
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.profile.loader import load_profile

LLAMA = PRESETS["llama-3.1-8b"]
H100, B200 = load_profile("h100-sxm5-80gb"), load_profile("b200-180gb")


@pytest.mark.parametrize("name,cc", [("a100-sxm4-80gb", (8, 0)), ("h100-sxm5-80gb", (9, 0)), ("h200-141gb", (9, 0)),
                                     ("b200-180gb", (10, 0)), ("gb200-nvl72", (10, 0)), ("gb300-nvl72", (10, 3))])
def test_profiles_state_their_compute_capability(name, cc):
    prof = load_profile(name)
    assert prof.gpu.compute_capability == cc
    assert fp8_gemm_any_layout(prof) == (cc >= (10, 0))


def test_the_non_tn_rule_is_transformer_engines():
    def on(cc):
        return fp8_gemm_any_layout(replace(H100, gpu=replace(H100.gpu, compute_capability=cc)))
    assert [on(cc) for cc in ((9, 0), (10, 0), (11, 0), (12, 0), (12, 1), (13, 0))] == [
        False, True, True, False, False, True]
    assert not on(None)  # a profile that does not say: TN only, as Hopper


def _framework_model(framework: str, fmt: str) -> ModelConfig:
    return get_framework(framework).for_model(replace(LLAMA, gemm_format=fmt))


def test_megatron_tensorwise_keeps_one_weight_copy_on_blackwell():
    m = _framework_model("megatron", "fp8-tensorwise")
    on_b200, on_h100 = for_profile(m, B200), for_profile(m, H100)
    assert (on_b200.fp8_transposes, on_h100.fp8_transposes) == (False, True)
    assert (on_b200.gemm.copies, on_h100.gemm.copies) == (1, 2)
    lay = Layout(cp=8, zero=1)
    b, h = weight_cache_bytes(on_b200, LLAMA.layers, lay), weight_cache_bytes(on_h100, LLAMA.layers, lay)
    linear = LLAMA.layers * LLAMA.linear_params()
    assert b == pytest.approx(linear, rel=1e-6) and h == pytest.approx(2 * linear, rel=1e-6)
    assert for_profile(on_b200, H100).fp8_transposes  # another profile derives it again


@pytest.mark.parametrize("framework,fmt", [("megatron", "fp8-blockwise"), ("megatron", "mxfp8"),
                                           # torchao eab345c keeps FP8 inputs (fp8_saved_inputs) but casts both
                                           # copies: for_profile must not read it as TransformerEngine (the
                                           # cost/gemm_format.py patch of the fsdp-dec1b fix's report)
                                           ("torchtitan@2024-12", "fp8-tensorwise"),
                                           ("any", "fp8-tensorwise"),
                                           ("megatron", "bf16")])
def test_other_formats_and_libraries_keep_their_copies(framework, fmt):
    m = _framework_model(framework, fmt)
    assert for_profile(m, B200) == m  # per-row / per-block scales, torchao, memo's executor: unchanged


def test_a_plan_carries_the_single_copy_and_reads_it_back():
    m = for_profile(_framework_model("megatron", "fp8-tensorwise"), B200)
    d = m.to_dict()
    assert d["fp8_transposes"] is False
    assert ModelConfig.from_dict(d) == m
    assert "fp8_transposes" not in for_profile(m, H100).to_dict()  # the default left out, as plans were


def test_the_what_if_prices_the_blackwell_copy(tmp_path):
    """End to end: the what-if's model states on a B200 hold one FP8 copy of the linear weights."""
    from memo_sim.search.whatif import candidates_for

    m = replace(LLAMA, gemm_format="fp8-tensorwise", layers=4)
    states = {}
    for prof in (H100, B200):
        res = candidates_for(m, 16384, 8, prof, framework="megatron", tp=1, cp=8, policies=("full_recompute",),
                             zero=1, pp=1)
        c = res.candidates[0]
        states[prof.name] = c.memory.model_states_bytes
    assert states["h100-sxm5-80gb"] - states["b200-180gb"] == pytest.approx(4 * LLAMA.linear_params(), rel=1e-6)


def test_transformer_engine_keeps_the_attention_output_twice_but_under_selective_recompute():
    """TransformerEngine's Linear keeps its quantised input for the weight gradient, so under FP8 the output
    projection holds a copy of the attention output beside the kernel's own (a review: 28.5h a token kept where
    29.5h is); Megatron's selective recompute checkpoints the attention core, whose output only that copy keeps."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.policy import get_policy

    from dataclasses import replace

    meg = _framework_model("megatron", "fp8-tensorwise")
    # TransformerEngine's Linear as it keeps its input; Megatron-LM at d98e8a64 has its output projection keep the
    # original instead (set_save_original_input: `ModelConfig.fp8_attention_copy`, 2026-12-03), below
    te = replace(meg, fp8_attention_copy=True)
    lay, seq = Layout(cp=8), 128 * 1024
    sk = skeletal_bytes(te, lay, 1, seq)
    per_token = seq / 8 * te.hidden
    # 34h in bf16; ln1, ln2 and act at one byte an element (1h + 1h + 3.5h kept instead of twice that): 28.5h; and
    # the projection's one-byte copy of the attention output: 1h more
    assert sk["total"] / per_token == pytest.approx(29.5)
    assert sk["attn_kernel_out"] == pytest.approx(2 * per_token)
    store, sel = get_policy("store_all"), get_policy("selective_recompute")
    assert store.resident_bytes(sk, 32) - sel.resident_bytes(sk, 32) == pytest.approx(32 * 2 * per_token)
    # Megatron's: no copy (28.5h), and the checkpointed core's output is the projection's saved input, kept
    own = skeletal_bytes(meg, lay, 1, seq)
    assert own["total"] / per_token == pytest.approx(28.5) and own["attn_kernel_out"] == 0.0
    assert sel.resident_bytes(own, 32) == store.resident_bytes(own, 32)
    bf16 = skeletal_bytes(_framework_model("megatron", "bf16"), lay, 1, seq)
    assert bf16["attn_kernel_out"] == 0.0 and sel.resident_bytes(bf16, 32) == store.resident_bytes(bf16, 32)
