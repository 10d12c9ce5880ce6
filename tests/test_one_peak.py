"""[answers #30 item 4] One number per quantity: one configuration's peak GPU memory, built through
every command that prints it (whatif text and JSON, check-plan, simulate, explain, sweep-seq),
reads the same value per source (simulated or analytic, caching allocator or memory plan), and
each printed peak names its source. maxseq prints no peak of a configuration it is given (its
answer is the longest sequence, at a length it chooses), so it is not among them.
"""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.units import fmt_bytes

ASK = ["--layers", "4", "--seq", "32K", "--gpus", "8", "--tp", "8", "--policy", "full_recompute", "--jobs", "1",
       "--simulate-top", "1"]
SIM = "(simulated, caching allocator)"
ANA = "(analytic, caching allocator)"


def _run(args):
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return r.output


def test_one_configuration_one_peak_per_source(tmp_path):
    obj = json.loads(_run(["whatif", *ASK, "--json", "--no-plan"]))
    best = obj["candidates"][0]
    assert best["tier"] == "simulated" and best["peak"]["tier"] == "simulated"
    sim, ana = best["simulated_peak_gpu_bytes"], best["analytic_peak_gpu_bytes"]
    assert best["peak"]["bytes"] == sim and best["peak"]["allocator"] == "caching allocator"
    sim_text = f"{fmt_bytes(sim)} {SIM}"

    text = _run(["whatif", *ASK, "--out", str(tmp_path)])
    verdict = text.splitlines()[0]
    assert verdict.startswith("answer: tp8+sp full_recompute fits") and sim_text in verdict
    row = next(ln for ln in text.splitlines() if ln.lstrip().startswith("1 "))
    assert "sim/allocator" in row and fmt_bytes(sim) in row
    plan = str(tmp_path / "plan.json")

    assert f"predicted peak GPU {sim_text}" in _run(["check-plan", plan])
    assert sim_text in _run(["simulate", plan, "--out", str(tmp_path / "sim")])
    ex = _run(["explain", plan])
    # the memory table: each peak's size in the size column, its source in the next (one unit a CSV column)
    assert re.search(rf"peak \(the simulated iteration\)\s+{re.escape(fmt_bytes(sim))}\s+{re.escape(SIM[1:-1])}", ex)
    assert re.search(rf"peak \(the terms above\)\s+{re.escape(fmt_bytes(ana))}\s+{re.escape(ANA[1:-1])}", ex)
    exj = json.loads(_run(["explain", plan, "--json"]))
    assert exj["simulated_peak_gpu_bytes"] == sim and exj["analytic_peak_gpu_bytes"] == ana

    sweep = _run(["sweep-seq", plan, "--out", str(tmp_path / "sw"), "--seqs", "32K", "--policy", "full_recompute",
                  "--tp-mode", "megatron,metp"]).splitlines()
    assert any("peak GPU (sim)" in ln for ln in sweep)  # the runs table names its source in the header
    mine = [ln for ln in sweep if ln.lstrip().startswith("32K") and "tp8+sp" in ln and "full_recompute" in ln]
    assert len(mine) == 2, sweep  # the runs table and the tensor-parallel-mode table
    assert fmt_bytes(sim) in mine[0] and "caching allocator" in mine[0] and sim_text in mine[1], mine
    points = json.loads((tmp_path / "sw" / "seq_by_tp_mode.json").read_text())["points"]
    pt = next(p for p in points if p["layout"] == "tp8+sp")
    assert pt["simulated_peak_gpu_bytes"] == sim and pt["peak_gpu_bytes"] == ana


def test_metp_table_reads_the_rankings_peak():
    """The 1M METP candidate that read 62.91 GiB (simulated) in the ranking and 66.91 GiB
    (analytic) in the METP table now reads the ranking's number, with its source, in both."""
    from memo_sim.report.whatif_json import metp_vs_megatron
    from memo_sim.model.config import get_model
    from memo_sim.profile.loader import load_profile
    from memo_sim.report.peaks import candidate_peak
    from memo_sim.report.whatif_answer import metp_table
    from memo_sim.search.whatif import fold_duplicates, rank

    res = rank(get_model("gpt-7b"), 1 << 20, 8, load_profile("a800-80gb"), simulate_top=8, tp=8, tp_mode="all",
               jobs=1)
    shown = fold_duplicates(res.candidates)
    _head, rows = metp_table(metp_vs_megatron(res.candidates, None), shown)
    checked = 0
    for c in shown:
        label = f"{c.layout.label()} {c.policy.label()}"
        p = candidate_peak(c)
        for r in rows:
            for plan_col, peak_col in ((0, 2), (4, 6)):
                if r[plan_col] == label:
                    assert r[peak_col].startswith(fmt_bytes(p.bytes)), (label, r[peak_col], p)
                    checked += c.simulated is not None
    assert checked >= 2  # simulated configurations appear in both tables
