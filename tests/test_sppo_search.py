"""[sppo] The SPPO planner (`memo_sim.search.sppo`): offload ratios, the heuristic (SP, PP, N)
solver, the exhaustive search's branch and bound against brute force, and the what-if, plan.json,
simulate and sweep-subseqs commands."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.sppo import EFFICIENT_TOKENS_PER_DEVICE, PARTITIONS
from memo_sim.layout.parallel import Layout, enumerate_pipeline_layouts
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.plan.schema import read_plan
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.search import sppo as S

K = 1024
A100 = load_profile("a100-sxm4-80gb")
SMALL = ModelConfig("small", layers=8, hidden=2048, heads=16, ffn=8192, vocab=32000)


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_alphas_equalise_the_offload_bytes():
    m, lay, seq = get_model("gpt-7b"), Layout(tp=8, pp=4), 1 << 20
    pol = Sppo(None, subseqs=128).with_bounds(m, lay, 1, seq)
    pol, ac, mem = S.solve_alphas(m, lay, 1, seq, pol, A100)
    assert ac.binding == "overlap" and mem.status == "OK"
    a_i = [pol.offloadable_bytes(m, lay, 1, pol.bounds[i + 1] - pol.bounds[i]) for i in range(128)]
    for a, x in zip(pol.alphas, a_i):
        assert a == 1.0 or math.isclose(a * x, ac.threshold_bytes, rel_tol=1e-12)
    assert pol.alphas[0] < 1.0 and list(pol.alphas) == sorted(pol.alphas)  # longer early subsequences offload less


def test_alphas_rise_until_the_stage_fits():
    m, lay, seq = get_model("gpt-7b"), Layout(tp=8, pp=2, dp=2), 1 << 20
    pol = Sppo(None, subseqs=16).with_bounds(m, lay, 1, seq)
    lo, ac_o, mem_o = S.solve_alphas(m, lay, 1, seq, pol, A100, threshold=1e6)
    assert ac_o.binding in ("gpu_memory", "host_memory")


def test_heuristic_keeps_sp_and_pp_in_a_node_and_n_efficient():
    pt, note = S.heuristic_choice(SMALL, 256 * K, 8, A100)
    assert pt is not None and pt.status == "OK" and "inside a node" in note
    assert pt.layout.tp * pt.layout.pp <= 8
    per_device = 256 * K / (pt.policy.subseqs * pt.layout.tp)
    assert EFFICIENT_TOKENS_PER_DEVICE[0] <= per_device <= EFFICIENT_TOKENS_PER_DEVICE[1]


def test_branch_and_bound_finds_the_brute_force_best():
    seq, gpus = 128 * K, 8
    pts, size, solved, _ = S.exhaustive_search(SMALL, seq, gpus, A100, keep=1)
    best = next(p for p in pts if p.status == "OK")
    brute = []
    lays, _ = enumerate_pipeline_layouts(SMALL, gpus, 8, seq)
    for lay in lays:
        for n in S.subseq_grid(seq, lay.tp):
            for part in PARTITIONS:
                for mux in (False, True):
                    if mux and not 1 < lay.pp <= S.MULTIPLEX_MAX_PP:
                        continue
                    try:
                        brute.append(S.solve_point(SMALL, lay, 1, seq, A100, n, part, mux))
                    except Exception:
                        continue
    assert len(brute) == size
    top = max((p for p in brute if p.status == "OK"), key=lambda p: p.tgs)
    assert best.tgs == pytest.approx(top.tgs, rel=1e-12)
    assert solved < size  # the bound pruned something


def test_whatif_simulate_and_sweep_subseqs(tmp_path):
    common = ["--model", "gpt-7b", "--layers", "8", "--gpus", "8", "--seq", "128K", "--profile", "a100-sxm4-80gb"]
    r = run(["whatif", *common, "--policy", "sppo", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    sm = obj["sppo"]
    assert sm["heuristic"] and sm["best"] and sm["space_size"] >= sm["solved_points"] > 0
    assert 0 < sm["heuristic_tgs_fraction_of_best"] <= 1 + 1e-9
    assert all(c["policy"] == "sppo" and "sppo" in c for c in obj["candidates"])
    bad = [c for c in obj["candidates"] if c["status"] != "OK"]
    assert all("stage" in c["alpha_note"] for c in bad if c["status"] == "OOM")
    plan = read_plan(tmp_path / "plan.json")
    pol = plan.policy
    assert pol.name == "sppo" and len(pol.bounds) == pol.subseqs + 1 and len(pol.alphas) == pol.subseqs
    assert plan.layout.pp >= 1 and plan.layout.gpus == 8
    raw = json.loads((tmp_path / "plan.json").read_text())
    assert raw["policy"]["bounds"][-1] == 128 * K
    assert ("pp" in raw["layout"]) == (plan.layout.pp > 1)
    sim = tmp_path / "sim"
    r = run(["simulate", str(tmp_path / "plan.json"), "--out", str(sim)])
    assert r.exit_code == 0, r.output
    assert (sim / "pipeline_gantt.png").stat().st_size > 0 and (sim / "stage_memory.png").exists()
    tl = json.loads((sim / "timeline.json").read_text())
    assert tl["meta"]["pipeline"]["subseqs"] == pol.subseqs
    sw = tmp_path / "sweep"
    r = run(["sweep-subseqs", str(tmp_path / "plan.json"), "--out", str(sw), "--subseqs", "2,4,8"])
    assert r.exit_code == 0, r.output
    pts = json.loads((sw / "subseq_sweep.json").read_text())["points"]
    assert [p["subseqs"] for p in pts] == [2, 4, 8] and (sw / "subseq_sweep.png").exists()
    assert all(p["iteration_s"] and p["peak_gpu_bytes"] > 0 for p in pts if p["status"] == "OK")


def test_whatif_fixed_pipeline_flags(tmp_path):
    r = run(["whatif", "--model", "gpt-7b", "--layers", "8", "--gpus", "8", "--seq", "64K", "--profile",
             "a100-sxm4-80gb", "--pp", "4", "--subseqs", "4", "--tp", "2", "--json", "--no-plan"])
    assert r.exit_code == 0, r.output
    cands = json.loads(r.stdout)["candidates"]
    assert cands and all(c["layout_degrees"]["pp"] == 4 and c["sppo"]["subseqs"] == 4 for c in cands)
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "8", "--seq", "64K", "--pp", "3", "--no-plan"])
    assert r.exit_code == 2 and "error:" in r.output
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "8", "--seq", "64K", "--pp", "2", "--policy", "memo",
                                 "--subseqs", "4"])
    assert r.exit_code == 2 and "sppo" in r.output  # SPPO's own flags need the sppo policy
    # --pp with a plain policy plans the micro-batch pipelines (tests/test_pipeline_schedules.py)
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "8", "--seq", "64K", "--pp", "2", "--policy", "memo",
                                 "--json", "--no-plan", "--simulate-top", "0"])
    assert r.exit_code == 0, r.output
    assert {c["schedule"] for c in json.loads(r.stdout)["candidates"]} == {"1f1b", "interleaved_1f1b"}


def test_plan_file_round_trip_and_bad_sppo_fields(tmp_path):
    from memo_sim.errors import MemoError

    pol = Sppo(None, subseqs=2, bounds=(0, 100, 256), alphas=(0.5, 1.0), multiplex=True)
    assert Sppo.from_dict(pol.to_dict()) == pol
    solved = replace(pol, threshold_bytes=354122874.624656)  # the overlap threshold as solved: a real number
    assert solved.to_dict()["threshold_bytes"] == 354122875  # whole bytes in plan.json
    assert Sppo.from_dict(solved.to_dict()) == solved  # informative: not part of the plan's identity
    with pytest.raises(MemoError):
        Sppo.from_dict({**pol.to_dict(), "alphas": [0.5]})
    with pytest.raises(MemoError):
        Sppo.from_dict({**pol.to_dict(), "bounds": [0, 300, 256]})
    with pytest.raises(MemoError):
        Sppo.from_dict({**pol.to_dict(), "colour": 1})
