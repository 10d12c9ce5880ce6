"""[metp] The closed forms of METP's method sections (papers/metp.txt sections 3-4), as
`memo_sim.cost.metp` computes them, against the formulas written out here.

Notation: b batch, s sequence, h hidden, p degree, n heads; element counts (the paper counts
elements; the dtype's bytes multiply them).

Table 1 (FFN, k1 = h, k2 = 4h), Memory / Peak memory / Communication volume:
    Megatron TP+SP   32h²/p + 5bsh/p   32h²/p + 4bsh/p + bsh        5(p-1)/p·bsh
    RSA              32h² + 5bsh/p     32h² + 5bsh/p                 0
    FSDP + Ulysses   32h²/p + 5bsh/p   4h² + (28h² + 5bsh)/p         24(p-1)/p·h²
    METP             32h²/p + bsh/p    32h²/p + bsh/p + 4bsh/p²      24(p-1)/p·h²
Table 2 (MHA, k = 0 with FlashAttention, 1 without):
    Megatron TP+SP   16h²/p + 5bsh/p   16h²/p + 4bsh/p + k·bns²/p + bsh          5(p-1)/p·bsh
    RSA              16h² + 5bsh/p     16h² + 5bsh/p + bns²/p                    8(p-1)/p·bsh
    FSDP + Ulysses   16h²/p + 5bsh/p   3h² + 13h²/p + k·bns²/p + 5bsh/p          12(p-1)/p·h² + 8(p-1)/p²·bsh
    METP             16h²/p + 2bsh/p   16h²/p + 3bsh/p² + k·bns²/p³ + 2bsh/p     12·log2(p)·h² + 6(p-1)/p·bsh
General forms (section 3): METP memory (mk1 + k1k2 + k2n + mn)/p + mk2/p², trained
(mk1 + 4k1k2 + 4k2n + mn)/p + mk2/p²; METP traffic 3(p-1)/p·(k1k2 + k2n); Megatron traffic
(p-1)/p·(3mk1 + 2mn). Peak-intermediate ratios METP/TP: FFN (1/p + 4/p²)/(4/p + 1) = 1/p,
MHA (3bsh/p² + 2bsh/p)/(4bsh/p + bsh) = (3 + 2p)/(p(4 + p)) (eq. 10), over L layers
r/L + (2/5)(L-1)/L (eq. 11). Overlap (eq. 4-5): intensity m/p FLOP/byte (16-bit) against
peak/bandwidth = 312 TFLOP/s / 300 GB/s = 1040 on an A100, so s > 8320 at p = 8, b = 1.
"""

import math

import pytest

from memo_sim.cost import metp
from memo_sim.profile.loader import load_profile

CASES = [(1, 8192, 4096, 8, 32), (2, 65536, 12288, 4, 96), (1, 1 << 20, 8192, 2, 64)]


@pytest.mark.parametrize("b,s,h,p,n", CASES)
def test_ffn_table_1(b, s, h, p, n):
    t = metp.ffn_table(b, s, h, p)
    bsh = b * s * h
    want = {
        "megatron_tp_sp": (32 * h**2 / p + 5 * bsh / p, 32 * h**2 / p + 4 * bsh / p + bsh, 5 * (p - 1) / p * bsh),
        "rsa": (32 * h**2 + 5 * bsh / p, 32 * h**2 + 5 * bsh / p, 0.0),
        "fsdp_ulysses": (32 * h**2 / p + 5 * bsh / p, 4 * h**2 + (28 * h**2 + 5 * bsh) / p, 24 * (p - 1) / p * h**2),
        "metp": (32 * h**2 / p + bsh / p, 32 * h**2 / p + bsh / p + 4 * bsh / p**2, 24 * (p - 1) / p * h**2),
    }
    for method, (mem, peak, comm) in want.items():
        row = t[method]
        assert math.isclose(row.memory, mem, rel_tol=1e-12)
        assert math.isclose(row.peak, peak, rel_tol=1e-12)
        assert math.isclose(row.comm, comm, rel_tol=1e-12, abs_tol=1e-9)
    # METP is always below Megatron (eq. 3)
    assert t["metp"].peak < t["megatron_tp_sp"].peak


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("b,s,h,p,n", CASES)
def test_mha_table_2(b, s, h, p, n, flash):
    t = metp.mha_table(b, s, h, p, n, flash=flash)
    bsh, k, sc = b * s * h, (0 if flash else 1), b * n * s * s
    want = {
        "megatron_tp_sp": (16 * h**2 / p + 5 * bsh / p, 16 * h**2 / p + 4 * bsh / p + k * sc / p + bsh,
                           5 * (p - 1) / p * bsh),
        "rsa": (16 * h**2 + 5 * bsh / p, 16 * h**2 + 5 * bsh / p + sc / p, 8 * (p - 1) / p * bsh),
        "fsdp_ulysses": (16 * h**2 / p + 5 * bsh / p, 3 * h**2 + 13 * h**2 / p + k * sc / p + 5 * bsh / p,
                         12 * (p - 1) / p * h**2 + 8 * (p - 1) / p**2 * bsh),
        "metp": (16 * h**2 / p + 2 * bsh / p, 16 * h**2 / p + 3 * bsh / p**2 + k * sc / p**3 + 2 * bsh / p,
                 12 * math.log2(p) * h**2 + 6 * (p - 1) / p * bsh),
    }
    for method, (mem, peak, comm) in want.items():
        row = t[method]
        assert math.isclose(row.memory, mem, rel_tol=1e-12)
        assert math.isclose(row.peak, peak, rel_tol=1e-12)
        assert math.isclose(row.comm, comm, rel_tol=1e-12)
    # without FlashAttention the scores shrink p² times more than TP's: O(s²/p³) against O(s²/p)
    if not flash:
        assert math.isclose(t["megatron_tp_sp"].peak - t["metp"].peak,
                            (16 * h**2 / p + 4 * bsh / p + sc / p + bsh)
                            - (16 * h**2 / p + 3 * bsh / p**2 + sc / p**3 + 2 * bsh / p), rel_tol=1e-12)


@pytest.mark.parametrize("b,s,h,p,n", CASES)
def test_general_forms_give_the_ffn_rows(b, s, h, p, n):
    m, k1, k2, nn = b * s, h, 4 * h, h
    # traffic: 3(p-1)/p(k1k2 + k2n) = 24(p-1)/p h²; Megatron (p-1)/p(3mk1 + 2mn) = 5(p-1)/p bsh
    assert math.isclose(metp.metp_general_comm(k1, k2, nn, p), metp.ffn_table(b, s, h, p)["metp"].comm)
    assert math.isclose(metp.megatron_general_comm(m, k1, nn, p), metp.ffn_table(b, s, h, p)["megatron_tp_sp"].comm)
    # memory: (mk1 + 4k1k2 + 4k2n + mn)/p + mk2/p² = Table 1's peak plus the output O_i (mn/p),
    # which the table leaves out
    gen = metp.metp_general_memory(m, k1, k2, nn, p, trainable=True)
    assert math.isclose(gen, metp.ffn_table(b, s, h, p)["metp"].peak + m * nn / p, rel_tol=1e-12)
    assert math.isclose(metp.metp_general_memory(m, k1, k2, nn, p),
                        (m * k1 + k1 * k2 + k2 * nn + m * nn) / p + m * k2 / p**2, rel_tol=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_peak_intermediate_ratios(p):
    b, s, h = 1, 65536, 4096
    bsh = b * s * h
    assert math.isclose(metp.ffn_peak_ratio(p), (bsh / p + 4 * bsh / p**2) / (4 * bsh / p + bsh))
    assert math.isclose(metp.ffn_peak_ratio(p), 1 / p)
    assert math.isclose(metp.mha_peak_ratio(p), (3 * bsh / p**2 + 2 * bsh / p) / (4 * bsh / p + bsh))
    assert math.isclose(metp.mha_peak_ratio(p), (3 + 2 * p) / (p * (4 + p)))
    for layers in (1, 4, 96):
        assert math.isclose(metp.mha_layers_ratio(p, layers),
                            metp.mha_peak_ratio(p) / layers + 2 / 5 * (layers - 1) / layers)


def test_ratios_at_p2():
    assert metp.ffn_peak_ratio(2) == pytest.approx(1 / 2)
    assert metp.mha_peak_ratio(2) == pytest.approx(7 / 12)
    assert 1 - metp.mha_peak_ratio(2) == pytest.approx(0.41667, abs=1e-5)  # "at least 41.7% less"
    assert all(metp.mha_peak_ratio(p) < metp.mha_peak_ratio(2) for p in (3, 4, 8, 16))


@pytest.mark.parametrize("m,p", [(8192, 8), (65536, 4), (1 << 20, 2)])
def test_ffn_intensity_is_m_over_p(m, p):
    h = 4096
    assert math.isclose(metp.ffn_intensity(m, h, 4 * h, h, p), m / p)
    assert metp.ffn_backward_intensity(m, h, 4 * h, h, p) > m / p  # eq. 6: the forward bounds overlap


def test_overlap_threshold_on_the_a100_profile():
    """The paper's figures (eq. 5) from NVLink's line rate: bf16 peak 312 TFLOP/s, NVLink 300 GB/s per direction,
    so 1040 FLOP/byte and s > 8320 at p = 8, b = 1. The profile holds the 80% of the line rate NCCL reaches (240
    GB/s), so memo's threshold is 1300 FLOP/byte, s > 10400."""
    import dataclasses

    from memo_sim.profile.schema import Quantity
    a100 = load_profile("a100-sxm4-80gb")
    assert a100.peak("bf16") == pytest.approx(312e12) and float(a100.nvlink.bandwidth) == pytest.approx(240e9)
    line = dataclasses.replace(a100, nvlink=dataclasses.replace(a100.nvlink, bandwidth=Quantity(300e9, "line rate")))
    assert metp.compute_to_comm_bound(line) == pytest.approx(1040.0)
    assert metp.overlap_threshold_seq(line, 8, 1) == pytest.approx(8320.0)
    assert metp.overlap_threshold_seq(line, 8, 2) == pytest.approx(4160.0)
    assert metp.compute_to_comm_bound(a100) == pytest.approx(1300.0)
    assert metp.overlap_threshold_seq(a100, 8, 1) == pytest.approx(10400.0)
    # the A800 profile's NVLink: 200 GB/s per direction (400 GB/s both ways) at 80%, 160 GB/s: 1950 FLOP/byte
    assert metp.compute_to_comm_bound(load_profile("a800-80gb")) == pytest.approx(1950.0)


def test_mha_outer_intensity_eq_12_13():
    h = 12288
    for s in (4096, 8320, 65536):
        i = metp.mha_outer_intensity(1, s, h, 8)
        assert i == pytest.approx((8 * s * h * h + 4 * s * s * h) / (24 * h * h + 4 * 7 / 8 * s * h))
        assert i > s / 3  # eq. 13 at p = 8, b = 1
        # eq. 12 divides the rank's FLOPs of all p outer steps by one step's traffic: per step it is p times less
        assert metp.mha_outer_step_intensity(1, s, h, 8) == pytest.approx(i / 8)


def test_memory_saving_gap_against_the_paper_is_accounted_term_by_term():
    """cost.metp's account of the paper's ~64% against memo's footprint at GPT-175B / 512K / p = 8."""
    from memo_sim.cost.metp import ffn_table, mha_table, table_layer_saving
    from memo_sim.layout.parallel import Layout
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.model.config import ModelConfig, get_model
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile

    b, s, h, p = 1, 512 * 1024, 12288, 8
    f, m = ffn_table(b, s, h, p), mha_table(b, s, h, p, 96)
    tables = 1 - (f["metp"].memory + m["metp"].memory) / (f["megatron_tp_sp"].memory + m["megatron_tp_sp"].memory)
    assert table_layer_saving(b, s, h, p) == pytest.approx(tables)
    assert table_layer_saving(b, s, h, p) == pytest.approx(0.629, abs=0.001)  # the tables' saving
    with_memo_acts = table_layer_saving(b, s, h, p, act_units=(16, 5))
    assert with_memo_acts == pytest.approx(0.642, abs=0.001)  # memo keeps x, h1 (and act under TP)
    base = get_model("gpt-175b")
    model = ModelConfig("gpt-175b-8", 8, base.hidden, base.heads, base.ffn, vocab=base.vocab)
    prof, pol = load_profile("a100-sxm4-80gb"), get_policy("store_all")
    tp, metp = (memory_breakdown(model, Layout(tp=8, tp_mode=mode), b, s, pol, prof) for mode in ("megatron", "metp"))
    layer_terms = 1 - (metp.model_states_bytes + metp.skeletal_resident_bytes) / (
        tp.model_states_bytes + tp.skeletal_resident_bytes)
    assert layer_terms == pytest.approx(0.590, abs=0.001)  # + 18-byte model states and the embedding
    assert 1 - metp.peak_gpu_bytes / tp.peak_gpu_bytes == pytest.approx(0.567, abs=0.001)  # + the peak terms
