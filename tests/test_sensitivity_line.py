"""The what-if's sensitivity line for an uncalibrated profile: a perturbation under which none of the
re-estimated plans fits is said so (the README's Mixtral-8x7B at 128K on 8 H100s hit it: a traceback
sorting None beside the plans' labels)."""

from __future__ import annotations

from memo_sim.profile.loader import load_profile
from memo_sim.report import sensitivity as S


def test_a_perturbation_under_which_nothing_fits_is_named(monkeypatch):
    prof = load_profile("h100-sxm5-80gb")
    assert not prof.calibrated
    fake = {"base": "A memo", "checked": 8, "groups": {
        "kernel efficiency": {"-20%": None, "+20%": "B memo"},
        "host-link bandwidth": {"-25%": "A memo", "+25%": "A memo"}}}
    monkeypatch.setattr(S, "sensitivity", lambda shown, profile, alpha=None: fake)
    line = S.sensitivity_line([], prof)
    assert "kernel efficiency -20% -> none of them fits, +20% -> B memo" in line
    assert "stays with host-link bandwidth ±25%" in line and "\n" not in line


def test_the_line_is_about_the_answer_not_the_analytic_tiers_best(monkeypatch):
    """A plan the simulator ranks first (A: 110 tokens/GPU/s simulated) but the analytic tier second (100 vs B's 105)
    is the base, and a perturbation that moves both alike keeps it; an analytic row (C, an upper estimate above both)
    is left out; the line spoke of the analytic best before (a user's review: 'the analytic best tp8+sp-cp8-dp8-z3
    stays best' beside a pipeline answer)."""
    from types import SimpleNamespace as NS

    analytic = {"A": 100.0, "B": 105.0, "C": 200.0}

    def cand(name, tgs, simulated=True):
        return NS(status="OK", sppo=None, tgs=tgs, simulated={"tgs": tgs} if simulated else None,
                  layout=NS(label=lambda: name), policy=NS(label=lambda: "memo"), estimate=NS(tgs=analytic[name]))

    a, b, c = cand("A", 110.0), cand("B", 105.0), cand("C", 200.0, simulated=False)
    monkeypatch.setattr(S, "_scores", lambda cands, profile, alpha: [
        analytic[x.layout.label()] * (1.0 if profile is None else 0.9) for x in cands])
    monkeypatch.setattr(S, "perturbed", lambda profile, what, f: None)
    # C, the analytic row, could overtake by its estimate: simulated (a copy), it runs at 90 and stays behind
    from memo_sim.search import prune

    monkeypatch.setattr(prune, "tgs_upper_bound", lambda x: x.estimate.tgs)
    monkeypatch.setattr(S, "_simulated", lambda x: NS(tgs=90.0))
    s = S.sensitivity([a, b, c], profile="base")
    assert s["base"] == "A memo" and s["answer"] and s["checked"] == 2
    assert all(v == "A memo" for g in s["groups"].values() for v in g.values())
    prof = load_profile("h100-sxm5-80gb")
    monkeypatch.setattr(S, "sensitivity", lambda shown, profile, alpha=None: s)
    assert "the answer A memo stays best" in S.sensitivity_line([], prof)


def test_the_line_names_the_answer_the_ranking_gives():
    """Llama-3.1-8B at 128K on 8 H100s with one plan simulated: the line named an analytic row (an upper estimate
    above the simulated answer) as 'the answer' (a review of this session's diff)."""
    from click.testing import CliRunner

    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "128K", "--profile",
                                 "h100-sxm5-80gb", "--jobs", "1", "--no-plan", "--simulate-top", "1"])
    assert r.exit_code == 0, r.output
    answer = r.output.split("answer: ", 1)[1].split(" fits:")[0]
    line = next(ln for ln in r.output.splitlines() if ln.startswith("sensitivity"))
    assert f"the answer {answer} " in line, (answer, line)


def test_a_tie_keeps_the_answer_not_the_label_last_in_the_alphabet(monkeypatch):
    """Two plans of the same throughput (ZeRO 2 and 3 of a tiny MoE: 1,883,719 tokens/GPU/s each) read 'changes with
    kernel efficiency -20% -> ...z3, +20% -> ...z3' (a review): the larger label won the max's tie-break."""
    from types import SimpleNamespace as NS

    def cand(name, tgs):
        return NS(status="OK", sppo=None, tgs=tgs, simulated={}, layout=NS(label=lambda: name),
                  policy=NS(label=lambda: "memo"))

    z2, z3 = cand("tp1-dp2-z2", 1883719.0), cand("tp1-dp2-z3", 1883719.0)
    monkeypatch.setattr(S, "_scores", lambda cands, profile, alpha: [1.0 if profile is None else 0.8 for _ in cands])
    monkeypatch.setattr(S, "perturbed", lambda profile, what, f: None)
    s = S.sensitivity([z2, z3], profile="base")
    assert all(v == "tp1-dp2-z2 memo" for g in s["groups"].values() for v in g.values()), s
