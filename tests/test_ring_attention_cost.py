"""Ring CP's attention priced as the blocks memo's executor runs (`memo_sim.cost.ring_attention`):
the zigzag decomposition covers each rank's causal/cp share exactly, blocks are priced on the
profile's block-kernel curves where it has them and on its attention curves where not, and what is
not ring CP (cp = 1, sliding-window layers) keeps the one-kernel price."""

from dataclasses import replace

import pytest
import yaml

from memo_sim.cost import ring_attention as ra
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.flops import ATTN_BWD_FACTOR, attention_score_elements
from memo_sim.profile.loader import list_profiles, load_profile, parse_profile
from memo_sim.profile.schema import Curve, Quantity

A100 = load_profile("a100-sxm4-80gb")
MODEL = ModelConfig(name="ring-test", layers=2, hidden=1024, heads=8, ffn=4096, vocab=1000)
SEQ = 8192


def _attn(costs):
    (c,) = [c for c in costs if c.kind == "attention"]
    return c


def _block_profile(prof=A100, causal=True):
    """``prof`` with ring-block curves far below its attention curves (and block score times)."""
    def flat(x):
        return Curve(((1e6, x), (1e15, x)), "test")
    extra = dict(attention_block_fwd=flat(0.01), attention_block_bwd=flat(0.02),
                 attention_block_fwd_score_time=Quantity(1e-12, "test"),
                 attention_block_bwd_score_time=Quantity(2e-12, "test"))
    if causal:
        extra.update(attention_block_causal_fwd=flat(0.005), attention_block_causal_bwd=flat(0.004))
    return replace(prof, efficiency=replace(prof.efficiency, **extra))


@pytest.mark.parametrize("cp", range(2, 9))
def test_zigzag_blocks_cover_each_ranks_causal_share_exactly(cp):
    seen = {}
    for rank in range(cp):
        blocks = ra.zigzag_blocks(cp, rank)
        full = sum(1 for *_q, causal in blocks if not causal)
        assert (full, len(blocks) - full) == ra.block_counts(cp) == (2 * cp - 1, 2)
        # in units of c^2 score elements (per head): the causal triangle of s = 2cp·c over cp ranks
        c = 3
        elements = sum(c * c / 2 if causal else c * c for *_q, causal in blocks)
        assert elements == pytest.approx((2 * cp * c) ** 2 / 2 / cp)
        for qi, ki, causal in blocks:
            assert ki <= qi and causal == (ki == qi)
            seen[(qi, ki)] = seen.get((qi, ki), 0) + 1
    # over the ranks, every chunk pair of the lower triangle exactly once
    assert seen == {(qi, ki): 1 for qi in range(2 * cp) for ki in range(qi + 1)}


def _priced(prof, cp, phase):
    """The rank's attention FLOPs and its blocks priced by hand: (2cp-1) full + 2 causal."""
    f = 2.0 * SEQ * SEQ * MODEL.hidden / cp * (ATTN_BWD_FACTOR if phase == "bwd" else 1.0)
    price = attention_bwd_time if phase == "bwd" else attention_fwd_time
    f_full = f / (2 * cp)
    t = ((2 * cp - 1) * price(f_full, prof, "bf16", MODEL.qk_head_dim, "flash", "full")
         + 2 * price(f_full / 2, prof, "bf16", MODEL.qk_head_dim, "flash", "causal"))
    return f, t


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_a_profile_without_block_curves_prices_the_blocks_on_its_attention_curves(cp):
    assert not A100.efficiency.has_block_kernel
    lay = Layout(cp=cp)
    for phase, costs in (("fwd", forward_costs(MODEL, lay, 1, SEQ, A100)),
                         ("bwd", backward_costs(MODEL, lay, 1, SEQ, A100))):
        f, t = _priced(A100, cp, phase)
        a = _attn(costs)
        assert a.flops == pytest.approx(f)  # MFU's FLOPs as before
        assert a.seconds == pytest.approx(t)
        # by hand from the attention curves: the blocks are smaller kernels, so slower than one kernel
        fwd, bwd = A100.efficiency.attention_fwd, A100.efficiency.attention_bwd
        curve, st = (bwd, A100.efficiency.attention_bwd_score_time) if phase == "bwd" else \
            (fwd, A100.efficiency.attention_fwd_score_time)
        ff = f / (2 * cp)
        by_hand = sum(n * (x / (A100.peak("bf16") * curve(x))
                           + attention_score_elements(x / (ATTN_BWD_FACTOR if phase == "bwd" else 1), 128) * float(st))
                      for n, x in ((2 * cp - 1, ff), (2, ff / 2)))
        assert a.seconds == pytest.approx(by_hand)
        one = (attention_bwd_time if phase == "bwd" else attention_fwd_time)(f, A100, "bf16", MODEL.qk_head_dim)
        assert a.seconds >= one


@pytest.mark.parametrize("causal_curves", [True, False])
def test_a_profile_with_block_curves_prices_the_blocks_on_them(causal_curves):
    prof = _block_profile(causal=causal_curves)
    lay = Layout(cp=2)
    peak = prof.peak("bf16")
    for phase, costs, factor, st in (("fwd", forward_costs(MODEL, lay, 1, SEQ, prof), 1.0, 1e-12),
                                     ("bwd", backward_costs(MODEL, lay, 1, SEQ, prof), ATTN_BWD_FACTOR, 2e-12)):
        f, t = _priced(prof, 2, phase)
        a = _attn(costs)
        assert a.flops == pytest.approx(f) and a.seconds == pytest.approx(t)
        full_eff = 0.01 if phase == "fwd" else 0.02
        causal_eff = (0.005 if phase == "fwd" else 0.004) if causal_curves else full_eff
        ff = f / 4
        by_hand = (3 * (ff / (peak * full_eff) + attention_score_elements(ff / factor, 128) * st)
                   + 2 * (ff / 2 / (peak * causal_eff) + attention_score_elements(ff / 2 / factor, 128) * st))
        assert a.seconds == pytest.approx(by_hand)


def test_cp1_and_sliding_window_keep_one_kernel():
    prof = _block_profile()
    f = 2.0 * SEQ * SEQ * MODEL.hidden
    for p in (A100, prof):  # cp = 1: the whole-sequence curves, whatever block curves the profile has
        assert _attn(forward_costs(MODEL, Layout(), 1, SEQ, p)).seconds == pytest.approx(
            attention_fwd_time(f, p, "bf16", MODEL.qk_head_dim))
        assert _attn(backward_costs(MODEL, Layout(), 1, SEQ, p)).seconds == pytest.approx(
            attention_bwd_time(f * ATTN_BWD_FACTOR, p, "bf16", MODEL.qk_head_dim))
    sw = replace(MODEL, name="ring-test-sw", sliding_window=1024, sliding_layers=1)
    frac = sw.attention_flop_fraction(SEQ)
    assert frac < 1 and not ra.applies(sw, Layout(cp=2), SEQ) and ra.applies(MODEL, Layout(cp=2), SEQ)
    assert _attn(forward_costs(sw, Layout(cp=2), 1, SEQ, prof)).seconds == pytest.approx(
        attention_fwd_time(f * frac / 2, prof, "bf16", MODEL.qk_head_dim))


def test_block_curves_in_a_profile_file_load_and_go_together(tmp_path):
    raw = yaml.safe_load(open(list_profiles()["a100-sxm4-80gb"]).read())
    eff = raw["efficiency"]
    eff["attention_block_fwd"] = {"x": "FLOP", "points": [[1e9, 0.1], [1e12, 0.3]], "source": "test"}
    eff["attention_block_bwd"] = {"x": "FLOP", "points": [[1e9, 0.1], [1e12, 0.2]], "source": "test"}
    eff["attention_block_fwd_score_time"] = {"value": 0.5, "unit": "ns", "source": "test"}
    prof = parse_profile(raw, "ok.yaml")
    e = prof.efficiency
    assert e.has_block_kernel and e.attention_curves("flash", "causal") == (e.attention_block_fwd, e.attention_block_bwd)
    assert float(e.attention_score_times("full")[0]) == pytest.approx(0.5e-9)
    assert float(e.attention_score_times("full")[1]) == 0.0
    assert e.attention_curves("cudnn") == (e.attention_fwd, e.attention_bwd)
    for drop, needle in (("attention_block_bwd", "attention_block_fwd and attention_block_bwd go together"),):
        bad = yaml.safe_load(yaml.safe_dump(raw))
        del bad["efficiency"][drop]
        with pytest.raises(MemoError, match=needle):
            parse_profile(bad, "bad.yaml")
    bad = yaml.safe_load(yaml.safe_dump(raw))
    for k in ("attention_block_fwd", "attention_block_bwd"):
        del bad["efficiency"][k]
    with pytest.raises(MemoError, match="attention_block_fwd_score_time describes the ring's block kernel"):
        parse_profile(bad, "bad.yaml")


def test_shipped_gpu_profiles_price_ring_blocks_on_their_flash_or_cudnn_curves():
    for name in list_profiles():
        e = load_profile(name).efficiency
        assert not e.has_block_kernel
        assert e.attention_curves("cudnn", "full") == e.attention_curves("cudnn")
        assert e.attention_curves("flash", "causal") == (e.attention_fwd, e.attention_bwd)
    with pytest.raises(ValueError, match="block shape"):
        A100.efficiency.attention_curves("flash", "diagonal")


def test_the_last_dkv_shift_of_the_backward_is_on_the_critical_path():
    """The ring's backward shifts K/V cp-1 times and the dK/dV accumulators cp times; the last dK/dV
    shift is posted after the last step's blocks and waited for before the backward returns
    (ring-flash-attention's and memo's executor's ``wait`` after the loop), so it is a chain op after
    the attention kernel, one K/V chunk's bytes; the forward has none and the side op keeps the other
    shifts beside the kernel."""
    from memo_sim.cost import collectives as coll
    from memo_sim.cost.opcost import critical_time

    lay = Layout(tp=2, cp=4)
    fwd, bwd = forward_costs(MODEL, lay, 1, SEQ, A100), backward_costs(MODEL, lay, 1, SEQ, A100)
    assert not [c for c in fwd if c.name == "cp_ring_dkv_home"]
    names = [c.name for c in bwd]
    home = bwd[names.index("cp_ring_dkv_home")]
    assert bwd[names.index("cp_ring_dkv_home") - 1].kind == "attention"
    assert (home.stream, home.phase, home.overlaps, home.kind) == ("cp_comm", "bwd", 0, "collective")
    kv = ra.ring_shift_bytes(MODEL, lay, 1, SEQ)
    assert kv == SEQ / 4 * (MODEL.kv_dim + MODEL.v_dim) / 2 * 2  # bf16 K and V of the rank's tokens, over TP
    link = coll.group_link(A100, 4, 2)
    assert home.nbytes == kv and home.seconds == coll.sendrecv_time(kv, float(link.bandwidth), float(link.latency))
    side = bwd[names.index("cp_ring_kv")]
    assert side.overlaps == 1 and side.nbytes == 3 * 2 * kv  # cp-1 shifts of K/V and of dK/dV beside the kernel
    without = [c for c in bwd if c.name != "cp_ring_dkv_home"]
    assert critical_time(bwd) == pytest.approx(critical_time(without) + home.seconds, rel=1e-12)
    assert "cp_ring_dkv_home" not in [c.name for c in backward_costs(MODEL, Layout(tp=2), 1, SEQ, A100)]
