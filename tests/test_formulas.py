"""Cost formulas against MISSION.md's closed forms."""

import math

import pytest

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.collectives import allreduce_time, ring_allgather_time, ring_allreduce_time
from memo_sim.model.flops import layer_forward_flops, model_flops_per_iteration
from memo_sim.cost.transfer import host_bandwidth_per_gpu, pinned_bytes
from memo_sim.layout import Layout
from memo_sim.model import PRESETS, get_model
from memo_sim.profile import load_profile

B, S = 1, 1024 * 1024


@pytest.mark.parametrize("name", ["gpt-7b", "gpt-13b", "gpt-30b", "gpt-65b"])
def test_layer_forward_flops_closed_form(name):
    m = get_model(name)
    f = layer_forward_flops(m, B, 65536)
    h, s = m.hidden, 65536
    assert f["gemm"] == pytest.approx(24 * B * s * h * h, rel=1e-12)
    assert f["attention"] == pytest.approx(2 * B * s * s * h, rel=1e-12)


def test_model_flops_formula():
    m = get_model("gpt-7b")
    s = 262144
    assert model_flops_per_iteration(m, 1, s) == pytest.approx(6 * s * m.params() + 6 * m.layers * m.hidden * s * s)


def test_paper_presets_match_memo_table():
    rows = {"gpt-7b": (32, 4096, 16384, 32), "gpt-13b": (40, 5120, 20480, 40),
            "gpt-30b": (48, 7168, 28672, 56), "gpt-65b": (80, 8192, 32768, 64)}
    for name, (n, h, f, a) in rows.items():
        m = PRESETS[name]
        assert (m.layers, m.hidden, m.ffn, m.heads, m.vocab) == (n, h, f, a, 50257)
    assert PRESETS["gpt-7b"].params() == pytest.approx(6.7e9, rel=0.02)


def test_skeletal_bytes_32bsh_and_roles():
    m = get_model("gpt-7b")
    sk = skeletal_bytes(m, Layout(), B, S)
    bsh = B * S * m.hidden
    assert sk["total"] == 32 * bsh
    assert sk["input"] == 2 * bsh and sk["attn"] == 2 * bsh and sk["other"] == 28 * bsh


def test_memo_7b_1m_is_4_tib():
    m = get_model("gpt-7b")
    total = m.layers * skeletal_bytes(m, Layout(), 1, S)["total"]
    assert total == 4 * 2**40  # "4096 GB" in the MEMO paper


@pytest.mark.parametrize("t,c", [(2, 1), (4, 2), (8, 1), (2, 4)])
def test_tp_sp_cp_split(t, c):
    m = get_model("gpt-7b")
    bsh = B * S * m.hidden
    with_sp = skeletal_bytes(m, Layout(tp=t, sp=True, cp=c, dp=1), B, S)["total"]
    assert with_sp == pytest.approx(32 * bsh / (t * c))
    no_sp = skeletal_bytes(m, Layout(tp=t, sp=False, cp=c), B, S)["total"]
    assert no_sp == pytest.approx((8 + 24 / t) * bsh / c)


def test_collective_closed_forms():
    assert ring_allgather_time(8e9, 8, 200e9, 0.0) == pytest.approx(7 / 8 * 8e9 / 200e9)
    assert ring_allreduce_time(8e9, 8, 200e9, 0.0) == pytest.approx(2 * 7 / 8 * 8e9 / 200e9)
    assert allreduce_time(8e9, 8, 200e9, 1e-5) <= ring_allreduce_time(8e9, 8, 200e9, 1e-5)
    assert ring_allgather_time(1e9, 1, 1e9, 1.0) == 0.0


def test_pinned_rounding_power_of_two():
    assert pinned_bytes(3 * 2**30, "power_of_two") == 4 * 2**30
    assert pinned_bytes(2**30 + 1, "power_of_two") == 2**31  # nearly halves usable host memory
    assert pinned_bytes(5000, "page") == 8192
    assert pinned_bytes(5000, "none") == 5000


def test_host_bandwidth_sharing():
    p = load_profile("a800-80gb")
    alone = host_bandwidth_per_gpu(p, "d2h", 1)
    eight = host_bandwidth_per_gpu(p, "d2h", 8)
    assert alone == pytest.approx(25.6e9)
    assert eight == pytest.approx(25.6e9 / 2)  # two GPUs share a PCIe switch uplink


def test_a800_calibration_points():
    """MEMO: 7B, TP=8 on 8 A800s: full-layer offload hides under forward only from ~192K;
    FlashAttention dominates the layer forward at long sequences."""
    from memo_sim.cost.layer_time import critical_time, forward_costs
    from memo_sim.cost.transfer import host_copy_time

    p, m, lay = load_profile("a800-80gb"), get_model("gpt-7b"), Layout(tp=8)

    def hides(s):
        f = critical_time(forward_costs(m, lay, 1, s, p))
        return host_copy_time(skeletal_bytes(m, lay, 1, s)["total"], p, "d2h", 8) <= f

    assert not hides(160 * 1024) and hides(224 * 1024)
    costs = forward_costs(m, lay, 1, 1024 * 1024, p)
    attn = sum(c.seconds for c in costs if c.kind == "attention")
    assert attn / critical_time(costs) > 0.9
    assert math.isfinite(attn)
