"""A mixture of experts' layout label says where the experts are under TP (an audit, 2026-12-02: Qwen3-30B-A3B's
`tp2+sp-ep1etp2-dp8-z3` and `tp2+sp-dp8-z3`, the second with every expert whole on both TP ranks, looked alike
and ran 1.67x apart): "ep1" where TP > 1 keeps them whole; dense layouts' labels unchanged."""

import json

from click.testing import CliRunner

from memo_sim import api
from memo_sim.cli import cli


def test_the_label_says_experts_whole_under_tp_and_a_plan_keeps_it(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--profile",
                                 "h100-sxm5-80gb", "--tp", "2", "--dp", "8", "--zero", "3", "--policy", "memo",
                                 "--ep", "1", "--etp", "1", "--out", str(tmp_path), "--json", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["candidates"][0]["layout"].startswith("tp2+sp-ep1-dp8")
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert "moe" not in plan["layout"]  # the model's, which the plan carries
    assert api.read_plan(tmp_path / "plan.json").layout.label().startswith("tp2+sp-ep1-dp8")
    r = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "plan.json")])
    assert r.exit_code == 0 and "tp2+sp-ep1-dp8" in r.output, r.output


def test_simulate_labels_a_mixtures_layout_and_leaves_a_dense_ones():
    moe = api.get_model("qwen3-30b-a3b")
    lay = api.Layout(tp=2, dp=8, zero=3)
    assert not lay.moe and lay.label() == "tp2+sp-dp8-z3" and lay == api.Layout(tp=2, dp=8, zero=3, moe=True)
    res = api.simulate(moe, lay, 1, 4096, "full_recompute", "h100-sxm5-80gb", keep_timeline=False)
    assert res.layout.label().startswith("tp2+sp-ep1-dp8"), res.layout.label()
    dense = api.simulate(api.get_model("llama-3.1-8b"), lay, 1, 4096, "full_recompute", "h100-sxm5-80gb",
                         keep_timeline=False)
    assert dense.layout.label() == "tp2+sp-dp8-z3", dense.layout.label()
    assert api.Layout(tp=1, moe=True).label() == "tp1"  # no TP: nothing to say


def test_an_exports_throughput_gain_says_it_is_on_less_work_without_the_mtp_modules():
    """An audit (2026-12-02): the torchtitan export of a DeepSeek-V3 plan said "It gives 7.2% more throughput than
    memo's plan" right after saying its time leaves the MTP module's work out."""
    from memo_sim.export.base import instead_lines

    i = {"framework": "torchtitan", "plan_label": "tp4+sp-ep16-pp16f3l2-dp4-z1", "label": "x", "iteration_s": 4.9,
         "peak_gpu_bytes": 1e9, "source": "simulated", "plan_iteration_s": 5.29, "mtp_dropped": 1}
    text = " ".join(instead_lines(i, "torchtitan"))
    assert "more throughput than memo's plan (5.29 s/iteration) on less work" in text, text
    del i["mtp_dropped"]
    assert "on less work" not in " ".join(instead_lines(i, "torchtitan"))
