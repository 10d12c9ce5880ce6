"""[robust-ux] Calibration sanity: implausible fits are found, re-measured once, and flagged."""

from __future__ import annotations

import dataclasses

import pytest

from memo_exec.calibrate.sanity import TOLERANCE, check
from memo_sim.profile.loader import load_profile
from memo_sim.profile.schema import Curve

CUDA_RAW = {"env": {"device_kind": "cuda"}}


@pytest.mark.parametrize("name", ["a800-80gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-141gb"])
def test_the_builtin_profiles_are_plausible(name):
    assert check(load_profile(name), CUDA_RAW, "bf16") == []


def _with(prof, **eff):
    return dataclasses.replace(prof, efficiency=dataclasses.replace(prof.efficiency, **eff))


def test_a_kernel_time_falling_with_size_is_found():
    p = load_profile("a800-80gb")
    # efficiency x10 over one decade of FLOPs at the same time: 10x the work in the same time is fine,
    # but x30 over one decade means the bigger kernel runs 3x faster than the smaller one
    bad = _with(p, gemm=Curve(((1e9, 0.01), (1e10, 0.3)), "test"))
    found = check(bad, CUDA_RAW, "bf16")
    assert [f.check for f in found] == ["monotone"] and found[0].part == "gemm"
    assert "efficiency.gemm" in found[0].line()
    ok = _with(p, gemm=Curve(((1e9, 0.01), (1e10, 0.1)), "test"))
    assert check(ok, CUDA_RAW, "bf16") == []


def test_a_backward_faster_than_its_forward_is_found():
    p = load_profile("a800-80gb")
    rows = [{"seq": 1024, "heads": 8, "head_dim": 128, "fwd_s": 1e-3, "bwd_s": 1e-3 / 15},
            {"seq": 4096, "heads": 8, "head_dim": 128, "fwd_s": 1e-2, "bwd_s": 2.5e-2}]
    found = check(p, dict(CUDA_RAW, attention={"rows": rows}), "bf16")
    assert len(found) == 1 and found[0].check == "backward_vs_forward" and found[0].part == "attention"
    assert "15.0x faster" in found[0].message and "s=1024" in found[0].message
    # fitted: a backward curve 10x the forward's efficiency makes the 2.5x-FLOP backward 4x faster
    fwd = p.efficiency.attention_fwd
    fast = Curve(tuple((f * 2.5, min(1.0, e * 10)) for f, e in fwd.points), "test")
    found = check(_with(p, attention_bwd=fast), CUDA_RAW, "bf16")
    assert any(f.check == "backward_vs_forward" and "fitted" in f.message for f in found)


def test_a_copy_faster_than_its_link_is_found():
    p = load_profile("a800-80gb")
    switch = float(p.host_link.pcie_switch_bandwidth)
    hl = dataclasses.replace(p.host_link, d2h_bandwidth=dataclasses.replace(
        p.host_link.d2h_bandwidth, value=switch * (1 + 2 * TOLERANCE)))
    found = check(dataclasses.replace(p, host_link=hl), CUDA_RAW, "bf16")
    assert [f.field for f in found] == ["host_link.d2h_bandwidth"] and found[0].part == "copies"
    # on a CPU there is no PCIe switch: the same number is not checked against it
    assert check(dataclasses.replace(p, host_link=hl), {"env": {"device_kind": "cpu"}}, "bf16") == []


def test_calibrate_remeasures_once_then_flags(monkeypatch, tmp_path):
    """The command re-measures the flagged part once and records what is still implausible."""
    from memo_exec.calibrate import command
    from memo_exec.calibrate.sanity import Finding

    calls = {"suite": 0, "remeasure": []}
    finding = Finding("backward_vs_forward", "efficiency.attention_bwd", "measured backward 15.0x faster")
    raw = {"dtype": "fp32"}

    def fake_suite(opts, prog):
        calls["suite"] += 1
        return dict(raw)

    def fake_remeasure(opts, r, parts, prog):
        calls["remeasure"].append(parts)
        return dict(r, remeasured=list(parts))

    prof_dict = {"provenance": {}}
    monkeypatch.setattr("memo_exec.calibrate.suite.run_suite", fake_suite)
    monkeypatch.setattr("memo_exec.calibrate.suite.remeasure", fake_remeasure)
    monkeypatch.setattr("memo_exec.calibrate.suite.check_options", lambda opts: (type("S", (), {"is_cuda": False, "describe": lambda self: "cpu (stand-in)"})(),
                                                                                  {}))
    monkeypatch.setattr("memo_exec.calibrate.writer.build_profile", lambda *a, **k: prof_dict)
    monkeypatch.setattr("memo_exec.calibrate.writer.write_profile", lambda d, path: None)
    monkeypatch.setattr(command, "implausible", lambda prof, r, source: [finding])
    notes = []
    prog = type("P", (), {"note": lambda self, m: notes.append(m), "elapsed": lambda self: 0.0})()
    command.calibrate("x", device="cpu", out_dir=tmp_path, progress=prog)
    assert calls["suite"] == 1 and calls["remeasure"] == [("attention",)]
    san = prof_dict["provenance"]["sanity"]
    assert san["remeasured"] == ["attention"] and san["warnings"] == [finding.line()]
    assert any(n.startswith("warning: implausible calibration") for n in notes)
