"""A review of maxseq on a full GB200 NVL72 rack (72 = 8 x 9 GPUs) and of the 'no valid layout' reason: maxseq
searches lengths the GPUs split over (its --step times the factor it leaves out), the split fix's search never
calls an untested length failing, and the reason named is about the layouts the fixed degrees describe."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.layout.parallel import Layout

K = 1024
RACK = ["--model", "qwen3-30b-a3b", "--layers", "4", "--gpus", "72", "--profile", "gb200-nvl72", "--framework",
        "megatron", "--tp", "1", "--ep", "8", "--jobs", "1"]


# 1. maxseq on 72 GPUs

def test_maxseq_on_a_rack_searches_lengths_the_gpus_split_over():
    """[review 1] --step 128K on 72 GPUs answered 1.5M (1.625M keeps the factor 9 out of every split) while 9216K
    fitted then: the step searched is 1152K (128K x 9), said so, and store_all's longest is a multiple of it above
    the 1.5M of the bug (5.625M since TransformerEngine's p2p ring holds its cp K/V chunks and cp step outputs
    through a layer's forward, `memo_sim.layout.ring_merge` te_p2p; 9M before)."""
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["maxseq", *RACK, "--policy", "store_all"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "step 1.125M searched (--step 128K x 9)" in text, text
    row = next(line for line in r.output.splitlines() if line.startswith("store_all"))
    longest = row.split()[1]
    assert longest.endswith("M") and float(longest[:-1]) >= 2 * 1.125, row
    assert (float(longest[:-1]) / 1.125).is_integer(), row  # a length the step reaches


def test_split_step():
    """[review 1] The step searched is --step times the odd part of the GPUs' factor it does not divide; unchanged
    where none, or where only powers of 2 are missing (--step 1001 on 2 GPUs: refused with the length that divides)."""
    from memo_sim.search.split_lengths import split_factor, split_step

    assert split_step(128 * K, 72) == 1152 * K and split_factor(1152 * K, 72) == 1
    assert split_step(128 * K, 8) == 128 * K and split_step(72 * K, 72) == 72 * K
    assert split_step(1001, 2) == 1001 and split_step(1001, 6) == 3003


def test_longest_multiple_never_calls_an_untested_length_failing():
    """[review 1] From 22 units: 22 and 44 fit, 88 > SPLIT_MAX_STEPS was never tested yet bisected as failing. Now
    the cap itself is tested, and where it fits the answer is the cap, said to be capped; every length the bisection
    treats as failing was tested and failed."""
    from memo_sim.search import maxseq

    tested: dict[int, bool] = {}

    def fits(n: int) -> bool:
        tested[n] = n <= 88
        return tested[n]

    assert maxseq._longest_multiple(1, 22, fits) == (maxseq.SPLIT_MAX_STEPS, True)
    tested.clear()
    assert maxseq._longest_multiple(1, 22, lambda n: fits(n) and n <= 50) == (50, False)
    assert 51 in tested and maxseq._longest_multiple(1, 22, lambda n: False) == (None, False)


# 2. the 'no valid layout' reason

def test_no_valid_layout_names_the_reason_of_the_fixed_degrees():
    """[review 2] --tp 1 --cp 1 --ep 8 --pp 2 --rank-order tp-cp-pp-dp on 144 GPUs: the reason named was the
    Ulysses layouts' alone (ulysses open, nobody asked for it); the rank order's expert-group rule, which refuses
    the ulysses 1 layouts, comes first now, then the Ulysses layouts' reason with the degree searched. One line,
    exit 2."""
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--layers", "8", "--gpus", "144", "--profile",
                                 "gb200-nvl72", "--seq", "32K", "--framework", "megatron", "--tp", "1", "--cp", "1",
                                 "--ep", "8", "--pp", "2", "--rank-order", "tp-cp-pp-dp", "--zero", "1", "--policy",
                                 "store_all", "--jobs", "1", "--no-plan"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "no valid layout" in lines[0], r.output
    reason = lines[0].split("degrees given: ", 1)[1]
    assert reason.startswith("megatron does not offer") and "rank order tp-cp-pp-dp" in reason, reason
    # the Ulysses layouts' own reason (since 2026-12-03 no longer 'Ulysses with MoE layers is not modelled' at
    # ulysses 2: Megatron's a2a CP splitting the 4 K/V heads whole at ulysses 8, the one the rank order allows)
    assert reason.index("rank order") < reason.index("with ulysses 8 (searched, not given): kv heads (4)"), reason


def test_default_reason():
    """[review 2] The picked reason stands where it is about a layout at the open degrees' defaults (or is not a
    rejection's); else the pick among those layouts first, then the picked reason with the degrees searched."""
    from memo_sim.layout.parallel import default_reason

    uly, plain = Layout(tp=1, ulysses=2, dp=4), Layout(tp=1, dp=8)
    rej = [(uly, "ulysses why"), (plain, "plain why")]
    first = lambda r: r[0][1]  # noqa: E731
    assert default_reason("ulysses why", rej, first) == "plain why; with ulysses 2 (searched, not given): ulysses why"
    assert default_reason("ulysses why", rej, first, ulysses=2) == "ulysses why"  # ulysses fixed: no preference
    assert default_reason("plain why", rej, first) == "plain why"
    assert default_reason("other", rej, first) == "other"
