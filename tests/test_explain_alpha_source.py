"""memo-sim explain / check-plan / simulate say where a MEMO plan's alpha came from: the solver's, the what-if's
alpha 0 where the solver finds none, or set by hand (a review: a what-if plan whose solver found no alpha was said
to have its alpha 0 'set by hand', while the what-if itself had said why it chose 0)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli

# a tiny model whose layer input and attention output alone take longer to offload than the layer computes
TINY = ["whatif", "--layers", "2", "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "256", "--dtype",
        "fp32", "--seq", "256", "--gpus", "2", "--model", "llama-3.1-8b", "--jobs", "1", "--simulate-top", "1"]


def test_the_whatifs_alpha_0_is_not_called_set_by_hand(tmp_path):
    r = CliRunner().invoke(cli, TINY + ["--policy", "memo", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "plan.json"
    assert json.loads(plan.read_text())["policy"]["alpha"] == 0.0
    r = CliRunner().invoke(cli, ["check-plan", str(plan)])
    assert r.exit_code == 0, r.output
    assert "alpha 0.000 is the what-if's where the solver finds none" in r.output, r.output
    assert "set by hand" not in r.output
    d = json.loads(plan.read_text())
    d["policy"]["alpha"] = 0.3  # a hand-set alpha is still called so
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["check-plan", str(hand)])
    assert r.exit_code == 0, r.output
    assert "alpha 0.300 was set by hand: the solver finds none" in r.output, r.output
