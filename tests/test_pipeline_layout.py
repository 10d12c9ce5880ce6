"""Each model chunk's own layer count (`Layout.chunk_layers`, `memo_sim.layout.pipeline_layout`): Megatron-LM's
--pipeline-model-parallel-layout string read and written, the split it gives the simulator, the search, the plan,
the exports and the executor, and the refusals in one line."""

from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.layout.pipeline_layout import counts_label, format_layout, parse_layout, torchtitan_split
from memo_sim.model.config import ModelConfig

TOY = ModelConfig("toy", 8, 256, 8, 1024, vocab=512, dtype="fp32")


def test_megatrons_examples_read_as_its_docs_say():
    # docs/api-guide/pipeline_parallel_layout.md: DeepSeek-V3 on PP 16 x VPP 2 (its MTP stage refused, see below)
    assert parse_layout("Et*3|(tt|)*29,t|tL", 63, 16) == (3,) + (2,) * 29 + (1, 1)
    assert parse_layout("E t*2 | t*2 , t L", 5, 1) == (2, 3)  # whitespace and commas are cosmetic
    assert parse_layout("Ett|(t|)*2,tL", 5, 2) == (2, 1, 1, 1)
    # a group inside a group unrolls as written out: Et | t|t|t | t|t|t | tL
    assert parse_layout("Et|((t|)*2t|)*2,tL", 8, 1) == (1,) * 8
    assert parse_layout("Et*2|t*3L", 5, 1) == (2, 3)


@pytest.mark.parametrize("text, needle", [
    ("Et*3|(tt|)*29,m|L", "1 multi-token-prediction layers (m), the model has 0"),
    ("Et*2|t*2L|t*2|t*2", "stage 1 holds the loss"),
    ("t*4|Et*4L", "holds the embedding"),
    ("Et*4||t*2|t*2L", "stage 1 has no transformer layer"),
    ("E|t*8|L|L", "stage 2 holds the loss"),
    ("Et*4|t*3L", "7 transformer layers (t), the model has 8"),
    ("Et*4|t*4x", "'x' is not a layout symbol"),
    ("E(t*4|t*4L", "never closed"),
    ("Et*4)|t*4L", "closes no '('"),
    ("Et*|t*4L", "a '*' takes a count"),
    ("Et*4|*2t*4L", "repeats a separator"),
    ("(t|)*99999999", "expands to more than"),
    ("Et*100000000000|tL", "expands to more than"),  # refused before the string is built
    ("Et*4|t*4|t*4|t*4L", "16 transformer layers"),
    ("Et*2|t*2|t*2L", "3 stages do not divide over --pp 2"),
    ("", "empty"),
])
def test_bad_layouts_are_refused_in_one_line_naming_the_option(text, needle):
    with pytest.raises(MemoError) as e:
        parse_layout(text, 8, 2)
    msg = str(e.value)
    assert msg.startswith("--pipeline-model-parallel-layout") and "\n" not in msg and needle in msg, msg


def test_multi_token_prediction_layers_are_written_beside_the_loss():
    """A model with multi-token-prediction modules needs them in the layout (Megatron builds none a layout leaves
    out), beside the loss on the last stage where memo prices them; the export writes them there."""
    assert parse_layout("Et*4|t*4mL", 8, 2, mtp_layers=1) == (4, 4)
    assert parse_layout("Et*4|t*4mmL", 8, 2, mtp_layers=2) == (4, 4)
    assert parse_layout("Et*4|t*4|mL", 8, 3, mtp_layers=1) == (4, 4, 0)  # the loss's stage with the modules alone
    assert format_layout((4, 4), 1) == "Et*4|t*4mL" and format_layout((3,), 2) == "Et*3mmL"
    assert parse_layout(format_layout((0, 2, 2, 2, 2), 1), 8, 5, 1) == (0, 2, 2, 2, 2)
    for text, layers, pp, needle in [
            ("Et*4|t*4L", 8, 2, "0 multi-token-prediction layers (m), the model has 1: write them"),
            ("Et*4m|t*4L", 8, 2, "stage 0 holds a multi-token-prediction layer"),
            ("Et*3|(tt|)*2,m|L", 7, 5, "stage 3 holds a multi-token-prediction layer"),  # Megatron's docs' place
            ("Et*4|t*4mmL", 8, 2, "2 multi-token-prediction layers (m), the model has 1")]:
        with pytest.raises(MemoError, match=re.escape(needle)):
            parse_layout(text, layers, pp, mtp_layers=1)


def test_the_end_stages_may_hold_the_embedding_or_the_loss_alone():
    """Megatron's docs end DeepSeek-V3's layout with a stage of the loss alone ('...,m|L'); memo runs such
    one-slot chunks (as --account-for-embedding/loss-in-pipeline-split makes them), so the layout string
    may write them: the same split as the slots, and the same simulated step."""
    from dataclasses import replace

    from memo_sim.api import simulate
    from memo_sim.policy import get_policy
    from memo_sim.profile import load_profile

    assert parse_layout("E|t|t|L", 2, 2) == (0, 1, 1, 0)
    assert parse_layout("E|(t*2|)*3,t*2L", 8, 5) == (0, 2, 2, 2, 2)
    assert format_layout((0, 1, 1, 0)) == "E|(t|)*2,L" and parse_layout("E|(t|)*2,L", 2, 2) == (0, 1, 1, 0)
    with pytest.raises(MemoError, match="stage 1 has no transformer layer"):
        parse_layout("E||t*2|t*2L", 4, 2)
    m = replace(TOY, layers=2)
    slots = Layout(pp=2, vpp=2, account_embedding_loss=True)
    chunks = Layout(pp=2, vpp=2, chunk_layers=(0, 1, 1, 0))
    assert chunks.virtual_stage_ranges(2) == slots.virtual_stage_ranges(2) and check_layout(chunks, m, 2, 8, 512) is None
    assert "every model chunk runs at least one layer" in check_layout(Layout(pp=2, vpp=2, chunk_layers=(1, 0, 1, 0)),
                                                                        m, 2, 8, 512)
    prof = load_profile("h100-sxm5-80gb")
    a, b = (simulate(m, lay, 4, 512, get_policy("store_all"), prof, schedule="interleaved_1f1b", micro_batch=1)
            for lay in (slots, chunks))
    assert a.status == b.status == "OK" and b.iteration_s == pytest.approx(a.iteration_s, rel=1e-12)


def test_written_layouts_read_back_and_name_runs():
    rng = random.Random(5)
    for _ in range(200):
        counts = tuple(rng.choice([1, 2, 3, 7, 8]) for _ in range(rng.choice([1, 2, 4, 6, 16])))
        assert parse_layout(format_layout(counts), sum(counts), 1) == counts
    assert format_layout((7,) + (8,) * 14 + (7,)) == "Et*7|(t*8|)*14,t*7L"
    assert format_layout((1, 2, 2, 1)) == "Et|(t*2|)*2,tL" and format_layout((3,)) == "Et*3L"
    assert counts_label((7,) + (8,) * 14 + (7,)) == "7-8x14-7"


def test_torchtitans_generated_split():
    # torchtitan@9dec370 generate_split_points: the first stage layers // stages, the middle ones one more while the
    # remainder lasts, the last the rest (Llama 3.1 405B: 126 layers)
    assert torchtitan_split(126, 8) == (15,) + (16,) * 6 + (15,)
    assert torchtitan_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert torchtitan_split(32, 4) == (8, 8, 8, 8) and sum(torchtitan_split(61, 16)) == 61
    with pytest.raises(MemoError):
        torchtitan_split(3, 4)


def test_the_layout_field_splits_chunks_and_is_checked():
    lay = Layout(pp=2, vpp=2, dp=2, chunk_layers=(1, 3, 2, 2))
    assert lay.uneven and lay.label() == "tp1-pp2v2c1-3-2x2-dp2"
    assert [list(r) for r in lay.virtual_stage_ranges(8)] == [[0], [1, 2, 3], [4, 5], [6, 7]]
    assert lay.stage_layer_counts(8) == [3, 5]  # rank 0: chunks 0 and 2; rank 1: chunks 1 and 3
    assert lay.to_dict()["chunk_layers"] == (1, 3, 2, 2) and "chunk_layers" not in Layout(pp=2).to_dict()
    assert Layout(dp=2, chunk_layers=(8,)).chunk_layers == ()  # a single stage has no chunks
    assert Layout(pp=2, chunk_layers=[4, 4]).chunk_layers == (4, 4)
    assert check_layout(lay, TOY, 4, 8, 512) is None
    for bad, needle in (((1, 3, 2), "gives 3 model chunks, the pipeline has pp x vpp = 4"),
                        ((1, 3, 2, 3), "places 9 layers, the model has 8")):
        assert needle in check_layout(Layout(pp=2, vpp=2, dp=2, chunk_layers=bad), TOY, 4, 8, 512)
    why = check_layout(Layout(pp=2, vpp=2, dp=2, chunk_layers=(1, 3, 2, 2), first_stage_layers=4), TOY, 4, 8, 512)
    assert "not set together with first / last" in why


def _whatif(tmp_path, *extra):
    return CliRunner().invoke(cli, ["whatif", "--layers", "8", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                    "--dtype", "fp32", "--seq", "512", "--gpus", "4", "--batch", "4",
                                    "--micro-batch", "1", "--policy", "store_all", "--out", str(tmp_path / "o"),
                                    *extra])


def test_whatif_plans_a_layout_and_export_writes_it(tmp_path):
    r = _whatif(tmp_path, "--pp", "2", "--pipeline-model-parallel-layout", "Et|t*3|t*2|t*2L")
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["layout"]["chunk_layers"] == [1, 3, 2, 2] and plan["layout"]["vpp"] == 2
    assert plan["schedule"] == "interleaved_1f1b" and "pp2v2c1-3-2x2" in r.output
    sim = CliRunner().invoke(cli, ["simulate", str(tmp_path / "o" / "plan.json"), "--out", str(tmp_path / "s")])
    assert sim.exit_code == 0, sim.output
    ex = CliRunner().invoke(cli, ["export", str(tmp_path / "o" / "plan.json"), "--to", "megatron",
                                  "--out", str(tmp_path / "m")])
    assert ex.exit_code == 0, ex.output
    script = (tmp_path / "m" / "megatron.sh").read_text()
    assert "--pipeline-model-parallel-layout 'Et|t*3|t*2|t*2L'" in script
    assert "--num-virtual-stages-per-pipeline-rank" not in script  # Megatron refuses both set


def test_whatif_plans_more_stages_than_layers_where_the_ends_hold_the_embedding_and_the_loss(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                 "--dtype", "fp32", "--seq", "512", "--gpus", "4", "--batch", "4", "--micro-batch", "1",
                                 "--policy", "store_all", "--out", str(tmp_path / "o"), "--pp", "4",
                                 "--pipeline-model-parallel-layout", "E|t|t|L"])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["layout"]["chunk_layers"] == [0, 1, 1, 0] and plan["layout"]["pp"] == 4
    ex = CliRunner().invoke(cli, ["export", str(tmp_path / "o" / "plan.json"), "--to", "megatron",
                                  "--out", str(tmp_path / "m")])
    assert ex.exit_code == 0, ex.output
    assert "--pipeline-model-parallel-layout 'E|(t|)*2,L'" in (tmp_path / "m" / "megatron.sh").read_text()
    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--gpus", "4", "--pp", "4", "--no-plan"])
    assert r.exit_code == 2 and "--pipeline-model-parallel-layout" in r.output, r.output  # the fix is named


@pytest.mark.parametrize("extra, needle", [
    (("--pipeline-model-parallel-layout", "Et*4|t*4L"), "give --pp"),
    (("--pp", "2", "--vpp", "3", "--pipeline-model-parallel-layout", "Et|t*3|t*2|t*2L"), "not --vpp 3"),
    (("--pp", "2", "--decoder-first-pipeline-num-layers", "3", "--pipeline-model-parallel-layout", "Et*4|t*4L"),
     "drop --decoder-first/last-pipeline-num-layers"),
    (("--pp", "2", "--pipeline-model-parallel-layout", "Et*4|mt*4L"), "1 multi-token-prediction layers (m), the model "
                                                                      "has 0"),
    (("--pp", "2", "--schedule", "1f1b", "--pipeline-model-parallel-layout", "Et|t*3|t*2|t*2L"),
     "interleaved_1f1b schedule, which is left out"),
])
def test_whatif_refuses_a_bad_layout_in_one_line_and_writes_nothing(tmp_path, extra, needle):
    r = _whatif(tmp_path, *extra)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output
    assert not (tmp_path / "o").exists()


def test_multi_token_prediction_layers_sit_right_before_the_loss():
    """'...Lm', '...|mt*2L' and '...tmtL' were read as the same split and written back as '...mL' (a review)."""
    for text in ("Et*2|t*2Lm", "Et*2|mt*2L", "Et*2|tmtL"):
        with pytest.raises(MemoError, match="right before the loss; write ...mL"):
            parse_layout(text, 4, 2, mtp_layers=1)
    assert parse_layout("Et*2|t*2mL", 4, 2, mtp_layers=1) == (2, 2)
