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
