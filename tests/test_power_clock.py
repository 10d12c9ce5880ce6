"""The power-limit clock ratios the 500 W profile's curves take (benchmarks/gpu/power_clock.py over the
board power and SM clock benchmarks/gpu/probe_power.py sampled on a 700 W H100), and the probe itself
(its CPU dry run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"benchmarks/gpu/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("stem", ["DATA", "REPEAT"])
def test_every_compute_kernel_ran_at_the_700w_cap_and_500w_leaves_less_clock(stem):
    pc = _load("power_clock")
    fits = pc.fits(getattr(pc, stem), 500.0)
    compute = {c: r for c, r in fits.items() if not c.startswith("copy")}
    assert len(compute) >= 6
    for case, r in compute.items():
        assert 660 <= r["power_w"] <= 720, case  # the cap (700 W), not below it
        assert r["clock_mhz"] < 1980 and r["slope_w_per_mhz"] > 0, case
        assert 0.75 < r["ratio"] < 0.95 and r["clock_at_limit"] < r["clock_mhz"], case
    copy = fits["copy_d2d"]
    assert copy["power_w"] < 500 and copy["ratio"] == 1.0 and copy["clock_mhz"] == 1980


def test_a_whole_layer_runs_at_the_cap_between_its_gemms_and_its_attentions_clock():
    # the per-class approximation's check: the mix also sits at the cap, its clock between the classes' alone
    fits = _load("power_clock").fits(_load("power_clock").LAYER, 500.0)
    layer, gemm, attn = (fits[c] for c in ("llama8b_layer_8k_fwd_bwd", "gemm_bf16_8192", "attn_flash_fwd_bwd_8k"))
    assert 660 <= layer["power_w"] <= 720
    assert gemm["clock_mhz"] < layer["clock_mhz"] < attn["clock_mhz"]
    assert layer["ratio"] < 0.9


def test_curve_ratios_cover_every_hopper_curve_and_interpolate_in_log_flops():
    pc = _load("power_clock")
    ratios = pc.curve_ratios(500.0)
    assert set(ratios) == {"gemm", "gemm_fp8", "attention_fwd", "attention_bwd", "attention_cudnn_fwd",
                           "attention_cudnn_bwd"}
    pts = [(1e10, 0.9), (1e12, 0.8)]
    assert pc.ratio_at(pts, 1e8) == 0.9 and pc.ratio_at(pts, 1e14) == 0.8
    assert pc.ratio_at(pts, 1e11) == pytest.approx(0.85)
    # a higher limit leaves more of the clock, and one above every case's power leaves all of it
    hi = pc.curve_ratios(600.0)
    assert all(r6 > r5 for c in ratios for (_x, r5), (_y, r6) in zip(ratios[c], hi[c]))
    full = pc.curve_ratios(720.0)
    assert all(r == 1.0 for c in full for _x, r in full[c])


def test_probe_power_dry_run_writes_one_row_per_case(tmp_path, monkeypatch):
    probe = _load("probe_power")
    monkeypatch.setattr(sys, "argv", ["probe_power.py", "--dry-run", "--out", str(tmp_path)])
    assert probe.main() == 0
    rows = [json.loads(line) for line in (tmp_path / "probe-power.jsonl").read_text().splitlines()]
    cases = [r["case"] for r in rows]
    assert cases[0] == "env" and "idle" in cases and "copy_d2d" in cases
    assert any(c.startswith("gemm_bf16_") for c in cases) and any(c.startswith("attn_") for c in cases)
    for r in rows[2:]:
        assert r["t0"] < r["t1"] and r["units"] > 0 and (r.get("tflops") or r.get("gbytes_per_s")) > 0


def test_probe_power_refuses_an_unknown_case_in_one_line_before_writing(tmp_path, monkeypatch, capsys):
    probe = _load("probe_power")
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["probe_power.py", "--dry-run", "--out", str(out), "--only", "nosuch"])
    with pytest.raises(SystemExit) as e:
        probe.main()
    assert e.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --only nosuch: no such case") and "\n" not in err


def test_power_clock_refuses_a_limit_outside_the_measured_range(monkeypatch, capsys):
    pc = _load("power_clock")
    monkeypatch.setattr(sys, "argv", ["power_clock.py", "--limit", "900"])
    with pytest.raises(SystemExit) as e:
        pc.main()
    assert e.value.code == 2 and "--limit 900" in capsys.readouterr().err
