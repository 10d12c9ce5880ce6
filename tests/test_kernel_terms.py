"""Attention's per-score-element time and a memory-bound op's per-call latency: fitted from the
calibration's measurements, read from a profile, priced by the simulator."""

import dataclasses

import pytest

from memo_exec.calibrate.fit import SCORE_TIME_HEADROOM, fit_call_latency, fit_score_time
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, memory_bound_op_time, memory_bound_time
from memo_sim.model.flops import ATTN_BWD_FACTOR, attention_score_elements, causal_attention_flops
from memo_sim.profile.loader import REPO_PROFILES, parse_profile
from memo_sim.profile.schema import Quantity


def _cases(rate, c, seqs=(128, 512, 1024), heads=4, dims=(32, 64)):
    """Synthetic forward timings t = FLOPs / rate + elements * c."""
    out = []
    for s in seqs:
        for d in dims:
            f = causal_attention_flops(1, s, heads * d)
            e = attention_score_elements(f, d)
            out.append(((s, heads, 1), f, e, f / rate + e * c))
    return out


def test_score_elements_are_the_causal_half_of_the_score_matrix():
    f = causal_attention_flops(2, 1000, 8 * 64)
    assert attention_score_elements(f, 64) == pytest.approx(2 * 8 * 1000 * 1000 / 2)


def test_score_time_fit_recovers_a_synthetic_kernel():
    c, per_group = fit_score_time(_cases(50e9, 4e-9))
    assert c == pytest.approx(4e-9, rel=1e-6) and len(per_group) == 3
    # one head size per (seq, heads): nothing to separate
    assert fit_score_time(_cases(50e9, 4e-9, dims=(64,))) == (0.0, [])
    # never negative, and never the whole of a case's time
    assert fit_score_time(_cases(50e9, -1e-9))[0] == 0.0
    cases = _cases(1e15, 4e-9)  # all time in the score term
    c, _ = fit_score_time(cases)
    assert c <= SCORE_TIME_HEADROOM * min(t / e for _k, _f, e, t in cases) + 1e-18


def test_call_latency_fit():
    large = {"norm": (8e6, 1e-3), "gelu": (32e6, 8e-3)}  # 8 and 4 GB/s
    small = {"norm": (8e4, 1e-5 + 50e-6), "gelu": (32e4, 8e-5 + 200e-6)}
    assert fit_call_latency(small, large, {"norm": 2, "gelu": 1}) == pytest.approx((2 * 50e-6 + 200e-6) / 3)
    assert fit_call_latency({"norm": (8e4, 1e-6)}, large, {}) == 0.0  # faster than the rate: no latency
    assert fit_call_latency({}, large, {}) == 0.0


def _profile(**eff):
    import yaml

    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    raw["efficiency"].update(eff)
    return parse_profile(raw, "test")


def test_profile_fields_are_optional_and_priced():
    plain = _profile()
    assert float(plain.efficiency.kernel_latency) == 0.0 and "not measured" in plain.efficiency.kernel_latency.source
    f = causal_attention_flops(1, 4096, 4096)
    assert attention_fwd_time(f, plain, "bf16", 128) == attention_fwd_time(f, plain, "bf16")
    assert memory_bound_op_time(1e6, plain) == memory_bound_time(1e6, plain)
    p = _profile(attention_fwd_score_time={"value": 2, "unit": "ns", "source": "test"},
                 attention_bwd_score_time={"value": 3, "unit": "ns", "source": "test"},
                 kernel_latency={"value": 100, "unit": "us", "source": "test"})
    e = attention_score_elements(f, 128)
    assert attention_fwd_time(f, p, "bf16", 128) == pytest.approx(attention_fwd_time(f, plain, "bf16") + e * 2e-9)
    fb = ATTN_BWD_FACTOR * f
    assert attention_bwd_time(fb, p, "bf16", 128) == pytest.approx(attention_bwd_time(fb, plain, "bf16") + e * 3e-9)
    assert memory_bound_op_time(1e6, p) == pytest.approx(memory_bound_time(1e6, p) + 100e-6)
    assert memory_bound_op_time(0, p) == 0.0
    with pytest.raises(Exception, match="kernel_latency"):
        _profile(kernel_latency={"value": -1, "unit": "us", "source": "test"})


def test_a_layer_prices_the_terms(tmp_path):
    """The simulator's layer ops carry them: attention by the model's head size, each memory-bound op once."""
    from memo_sim.cost.layer_time import forward_costs
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import ModelConfig

    model = ModelConfig("toy", 2, 128, 4, 512, vocab=500, dtype="fp32")
    plain = _profile()
    lat = dataclasses.replace(plain, efficiency=dataclasses.replace(
        plain.efficiency, kernel_latency=Quantity(1e-4, "t"), attention_fwd_score_time=Quantity(1e-9, "t")))
    a = {c.name: c.seconds for c in forward_costs(model, Layout(), 1, 512, plain)}
    b = {c.name: c.seconds for c in forward_costs(model, Layout(), 1, 512, lat)}
    assert b["ln1"] == pytest.approx(a["ln1"] + 1e-4) and b["qkv"] == a["qkv"]
    assert b["attention"] == pytest.approx(a["attention"] + 4 * 512 * 512 / 2 * 1e-9)
