"""[moe] A router's measured expert loads as the balance input (``--moe-balance loads:FILE``,
`memo_sim.layout.moe_balance.measured_balance`): per EP degree, the mean over the layers of the busiest
contiguous block of experts' share over the mean; kept in the plan as numbers; the expert time and the
what-if follow it; a file of another model or a bad file is refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.activations import routed_load
from memo_sim.cost.layer_time import forward_costs
from memo_sim.layout.moe_balance import measured_balance, parse_balance
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
TOY = ModelConfig("toy-moe", layers=8, hidden=2048, heads=16, ffn=4096, vocab=32000, ffn_type="swiglu",
                  norm="rmsnorm", bias="none", tied_embeddings=False, experts=4, top_k=2, expert_ffn=1024)


def test_the_busiest_contiguous_block_of_experts_per_ep_degree_averaged_over_layers():
    text = measured_balance([[4, 2, 1, 1], [1, 1, 1, 1]])
    b = parse_balance(text)
    assert b.kind == "measured" and b.experts == 4
    # layer 1: ep 2 -> blocks (6, 2) of mean 4: 1.5; ep 4 -> 4 of mean 2: 2.0; layer 2 even: 1.0
    assert dict(b.factors) == pytest.approx({1: 1.0, 2: 1.25, 4: 1.5})
    assert parse_balance(measured_balance([[5, 5, 5, 5]])).factors == ((1, 1.0), (2, 1.0), (4, 1.0))


@pytest.mark.parametrize("rows,needle", [
    ([], "no layer"), ([[1, 2], [1, 2, 3]], "every layer needs 2"), ([[1, -1]], ">= 0"), ([[0, 0]], "above 0"),
])
def test_bad_loads_name_what_is_wrong(rows, needle):
    with pytest.raises(ValueError, match=needle):
        measured_balance(rows)


def test_the_busiest_rank_follows_the_measured_loads_and_another_models_loads_are_refused():
    text = measured_balance([[4, 2, 1, 1]])
    lay = Layout(dp=4, ep=2, moe_balance=text)
    assert check_layout(lay, TOY, 4, 8, 8192) is None
    assert routed_load(lay, 1, 8192, 2) == pytest.approx(1.5)
    assert lay.label().endswith("-measured")
    fc1 = {b: next(c for c in forward_costs(TOY, replace(lay, moe_balance=b), 1, 8192, H100) if c.name == "expert_fc1")
           for b in ("forced", text)}
    assert fc1[text].seconds > fc1["forced"].seconds
    why = check_layout(replace(lay, moe_balance=measured_balance([[1] * 8])), TOY, 4, 8, 8192)
    assert why and "8 experts" in why and "\n" not in why


def _whatif(*args):
    return CliRunner().invoke(cli, ["whatif", "--no-plan", "--jobs", "1", "--gpus", "16", "--seq", "32K",
                                    "--model", "qwen3-30b-a3b", "--profile", "h100-sxm5-80gb", "--ep", "8",
                                    "--tp", "1", "--policy", "full_recompute", "--format", "json", *args])


def test_whatif_reads_a_loads_file_and_the_plan_keeps_the_numbers(tmp_path):
    skew = [[40 if e < 16 else 10 for e in range(128)] for _ in range(4)]  # the first EP rank's experts 4x busier
    path = tmp_path / "loads.json"
    path.write_text(json.dumps({"loads": skew}))
    plain, measured = _whatif(), _whatif("--moe-balance", f"loads:{path}")
    assert plain.exit_code == 0 and measured.exit_code == 0, (plain.output, measured.output)
    p, m = json.loads(plain.output)["candidates"][0], json.loads(measured.output)["candidates"][0]
    assert m["simulated_layout"]["moe_balance"].startswith("measured:e128:") and m["layout"].endswith("-measured")
    assert m["simulated_iteration_s"] > p["simulated_iteration_s"]


@pytest.mark.parametrize("content,needle", [("not json", "cannot be read"),
                                            ("[1, 2, 3]", "loads are of 3 experts, the model has 128"),
                                            ("[[1e308, 1e308]]", "finite"), ("[[1, -2]]", ">= 0"),
                                            # one expert with most of a layer's copies: no top-8 router's counts
                                            (json.dumps([[1000] + [1] * 127]), "a top-8 router can send one expert")])
def test_a_bad_loads_file_is_one_line(tmp_path, content, needle):
    path = tmp_path / "loads.json"
    path.write_text(content)
    r = CliRunner().invoke(cli, ["whatif", "--no-plan", "--gpus", "4", "--seq", "8K", "--model", "qwen3-30b-a3b",
                                 "--moe-balance", f"loads:{path}"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1 and needle in r.output, r.output


@pytest.mark.parametrize("text", ["measured:e4:0=1,1=1", "measured:e8:1=1", "measured:e4:1=1,2=1.5,4=5",
                                  "measured:e4:1=1,2=1,3=1,4=1", "measured:e0:1=1", "measured:x"])
def test_a_measured_setting_that_does_not_cover_the_ep_degrees_is_one_line(text):
    """A plan's measured balance must give one factor per EP degree dividing the experts, each in [1, ep]:
    a degree missing would silently read as perfectly balanced."""
    why = check_layout(Layout(dp=4, ep=2, moe_balance="forced"), TOY, 4, 8, 8192)
    assert why is None
    from memo_sim.layout.moe_balance import balance_why_not
    msg = balance_why_not(text)
    assert msg and "\n" not in msg and "measured" in msg, msg
