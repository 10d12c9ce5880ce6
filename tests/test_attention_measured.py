"""Attention priced from the executor's kernels timed at a layer's shape (`memo_sim.cost.attention_measured`),
the profile rows that hold them, `memo-exec calibrate --attention-shapes` that measures them, and the host
malloc policy both sides run with (`memo_exec.host_malloc`)."""

import dataclasses
import math

import pytest
import yaml

from memo_sim.cost.attention_measured import layer_attention_seconds, measured_seconds
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.errors import ProfileError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile.loader import load_profile, parse_profile
from memo_sim.profile.schema import AttentionTimes

BASE = load_profile("a100-sxm4-80gb")
MODEL = ModelConfig("t", 2, 256, 8, 1024, vocab=1000)  # 8 heads of 32: the executor's validation toy
ROWS = (("whole", 8, 32, 512, 0.010, 0.014), ("whole", 8, 32, 1024, 0.030, 0.045),
        ("whole", 8, 32, 2048, 0.110, 0.160), ("whole", 4, 32, 1024, 0.016, 0.025),
        ("block_full", 8, 32, 128, 0.0009, 0.0011), ("block_full", 8, 32, 512, 0.0047, 0.0114),
        ("block_causal", 8, 32, 128, 0.0008, 0.0011), ("block_causal", 8, 32, 512, 0.0048, 0.0115))


def _with_rows(prof, rows=ROWS):
    eff = dataclasses.replace(prof.efficiency, attention_times=AttentionTimes(tuple(rows), "measured: test rows"))
    return dataclasses.replace(prof, efficiency=eff)


TABLE = _with_rows(BASE)


def _attention(prof, layout, seq, batch=1, phase="fwd"):
    costs = forward_costs(MODEL, layout, batch, seq, prof) if phase == "fwd" else \
        backward_costs(MODEL, layout, batch, seq, prof)
    return next(c.seconds for c in costs if c.name == "attention")


def test_a_measured_shape_is_priced_from_its_rows_exactly_and_per_sequence():
    assert _attention(TABLE, Layout(), 1024) == pytest.approx(0.030)
    assert _attention(TABLE, Layout(), 1024, phase="bwd") == pytest.approx(0.045)
    assert _attention(TABLE, Layout(), 1024, batch=3) == pytest.approx(0.090)  # the kernels loop over the batch
    assert _attention(TABLE, Layout(tp=2), 1024) == pytest.approx(0.016)  # TP 2: 4 heads per rank
    assert _attention(TABLE, Layout(ulysses=2), 1024) == pytest.approx(0.016)  # Ulysses 2: 4 heads, whole sequence


def test_between_measured_lengths_the_time_follows_the_power_law_through_its_neighbours():
    power = math.log(0.110 / 0.030) / math.log(2)
    assert _attention(TABLE, Layout(), 1536) == pytest.approx(0.030 * 1.5 ** power)
    assert 0.030 < _attention(TABLE, Layout(), 1536) < 0.110


def test_outside_the_rows_the_curves_price_it_as_without_them():
    for lay, seq in ((Layout(), 4096), (Layout(), 256), (Layout(tp=8), 1024)):  # too long, too short, 1 head
        assert _attention(TABLE, lay, seq) == _attention(BASE, lay, seq), (lay, seq)
    assert measured_seconds(TABLE, "whole", 8, 64, 1024, "fwd") is None  # another head size
    assert layer_attention_seconds(MODEL, Layout(), 1, 1024, BASE, "fwd", False) is None  # no rows at all


def test_ring_cp_is_priced_from_its_measured_blocks():
    # cp 2 at 2K: c = 512, 3 full and 2 causal blocks per pass (`ring_attention.block_counts`)
    got = _attention(TABLE, Layout(cp=2), 2048)
    assert got == pytest.approx(3 * 0.0047 + 2 * 0.0048)
    assert _attention(TABLE, Layout(cp=2), 2048, phase="bwd") == pytest.approx(3 * 0.0114 + 2 * 0.0115)
    # without block rows the ring's blocks keep the curves
    whole_only = _with_rows(BASE, [r for r in ROWS if r[0] == "whole"])
    assert _attention(whole_only, Layout(cp=2), 2048) == _attention(BASE, Layout(cp=2), 2048)


def test_a_profile_file_carries_the_rows_and_refuses_a_bad_one_in_one_line(tmp_path):
    raw = yaml.safe_load(open(BASE.path))
    raw["efficiency"]["attention_times"] = {
        "rows": [{"kernel": k, "heads": h, "head_dim": d, "seq": s, "fwd_s": f, "bwd_s": b} for k, h, d, s, f, b in ROWS],
        "source": "measured: test"}
    prof = parse_profile(raw, "test.yaml")
    assert prof.efficiency.attention_times.points("whole", 8, 32)[1] == (1024, 0.030, 0.045)
    assert _attention(prof, Layout(), 1024) == pytest.approx(0.030)
    raw["efficiency"]["attention_times"]["rows"][0]["kernel"] = "paged"
    with pytest.raises(ProfileError) as e:
        parse_profile(raw, "test.yaml")
    assert "attention_times" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # one of the default selection's slowest, moved to balance .ci/run's two halves
def test_calibrate_keeps_the_extra_shapes_out_of_the_fits_and_in_the_rows():
    torch = pytest.importorskip("torch")
    from memo_exec.calibrate.microbench import Bench, Progress
    from memo_exec.calibrate.suite import _fit_attention, _measure_attention, grid_for, parse_attention_shapes

    grid = dataclasses.replace(grid_for("cpu", True), attn_seqs=[64, 128], attn_heads_dims=[(2, 16), (2, 32)])
    out = {"peak": {"value": 5e10}}
    # which rows go where, not their times: no cold-cache write before each repeat (600 MiB on the 2-core Xeon VM)
    bench = Bench(torch.device("cpu"), target_s=0.001, min_repeats=2, max_repeats=2, cold=False)
    torch.set_num_threads(1)
    _measure_attention(out, bench, grid, torch.float32, "auto", Progress(enabled=False),
                       parse_attention_shapes("3x16,2x16"))
    a = out["attention"]
    assert {(r["heads"], r["head_dim"]) for r in a["rows"]} == {(2, 16), (2, 32)}
    assert {(r["heads"], r["head_dim"], r["seq"]) for r in a["extra_rows"]} == {(3, 16, 64), (3, 16, 128)}
    assert a["fwd_curve"] == _fit_attention(a["rows"], 5e10)["fwd_curve"]  # the fit is the grid's alone
    rb = a["ring_blocks"]
    assert rb["measured"] and {(r["heads"], r["c"], r["causal"]) for r in rb["extra_rows"]} == \
        {(3, c, causal) for c in (64, 128) for causal in (False, True)}


@pytest.mark.parametrize("text", ["8y32", "0x32", "8x", "8x32,,4x32", "9999x32"])
def test_bad_attention_shapes_are_refused_naming_the_option(text):
    from memo_exec.calibrate.suite import parse_attention_shapes
    from memo_exec.errors import ExecError

    with pytest.raises(ExecError, match="--attention-shapes"):
        parse_attention_shapes(text)


def test_the_host_malloc_policy_is_set_once_and_said():
    from memo_exec.host_malloc import keep_freed_memory

    first = keep_freed_memory()
    assert first == keep_freed_memory()
    assert first.startswith("host malloc")


def test_validate_says_how_the_attention_of_its_plans_is_priced():
    from memo_sim.cost.attention_measured import pricing_words

    assert "timed cases" in pricing_words(MODEL, Layout(), [1024, 2048], TABLE)
    words = pricing_words(MODEL, Layout(), [1024, 4096], TABLE)
    assert "fitted curves at 4096" in words and "--attention-shapes 8x32" in words
    assert "4x32" in pricing_words(MODEL, Layout(tp=2), [512], TABLE)  # TP 2: the rank's 4 heads, not timed
    assert "ring CP's blocks" in pricing_words(MODEL, Layout(cp=2), [1024], TABLE)
    assert "keeps no timed attention cases" in pricing_words(MODEL, Layout(), [1024], BASE)
