"""The machine-speed probe (`memo_exec.speed_probe`) and what the CPU loop does with it: the drift
of each run from the calibration, the idle-and-steady verdict, a drifted run done again."""

import dataclasses

import pytest

pytest.importorskip("torch")

from memo_exec import validate as V  # noqa: E402
from memo_exec.host_share import busy_reason  # noqa: E402
from memo_exec.speed_probe import (  # noqa: E402
    SPEED_DRIFT_LIMIT, SpeedProbe, drift, persistent_drift, run_speeds, speed_reason)


def _probe(median, spread=2.0):
    return {"median_gflops": median, "min_gflops": median * (1 - spread / 200), "max_gflops": median * (1 + spread / 200),
            "spread_pct": spread}


def test_probe_samples_the_reference_gemm():
    p = SpeedProbe()
    assert p.summary() is None
    rates = [p.sample(), p.sample()]
    s = p.summary()
    assert all(r > 0.05 for r in rates)  # GFLOP/s: any CPU does more than 50 MFLOP/s
    assert len(s["samples"]) == 2 and s["min_gflops"] <= s["median_gflops"] <= s["max_gflops"]
    assert s["samples"][0][0] <= s["samples"][1][0] and "cold caches" in s["reference"]
    p.samples[-1] = (p.samples[-1][0], p.samples[-2][1] * 1.5)
    assert p.moved(2) == pytest.approx(0.5)
    p.discard(1)
    s = p.summary()
    assert len(s["samples"]) == 1 and len(s["discarded"]) == 1


def test_drift_and_run_speeds():
    cal = _probe(80.0)
    assert drift(_probe(60.0), cal) == pytest.approx(-0.25)
    assert drift(None, cal) is None and drift(_probe(60.0), None) is None
    sp = run_speeds([("a", _probe(79.0), []), ("b", _probe(60.0), [-30.0]), ("c", None, [])], cal)
    assert [r["drift_pct"] for r in sp["runs"]] == [-1.2, -25.0, None]
    assert sp["unsteady"] == ["b"] and sp["max_abs_drift_pct"] == 25.0
    assert sp["runs"][1]["discarded_drifts_pct"] == [-30.0]


def test_speed_reason_and_busy_reason():
    idle = {"other_cores": 0.0, "cores": 2, "steal_cores": 0.0}
    cal = _probe(80.0)
    steady = {"cpu_share": idle, "speed": run_speeds([("a", _probe(78.0), [])], cal)}
    assert speed_reason({"speed_probe": cal}, steady) is None
    assert busy_reason({"cpu_share": idle, "speed_probe": cal}, steady) is None
    moved = {"cpu_share": idle, "speed": run_speeds([("a", _probe(55.0), [])], cal)}
    why = busy_reason({"cpu_share": idle, "speed_probe": cal}, moved)
    assert why and "speed changed after calibrating" in why and "-31.2%" in why
    why = busy_reason({"cpu_share": idle, "speed_probe": _probe(80.0, spread=40.0)}, steady)
    assert why and "while calibrating" in why
    # a profile without a probe (calibrated before memo had one): the share alone decides
    assert busy_reason({"cpu_share": idle}, {"cpu_share": idle}) is None


def test_a_drifted_run_is_run_again(tmp_path):
    """A CPU run during which the reference GEMM ran 30% slower than at calibration is run once more
    (``speed_retries``); the kept run is the second and the first's drift stays in the row."""
    from memo_sim.model.config import ModelConfig
    from memo_sim.profile.loader import load_profile

    base = load_profile("h100-sxm5-80gb")
    prof = dataclasses.replace(base, provenance={**base.provenance, "speed_probe": _probe(80.0)})
    model = ModelConfig("toy", 2, 64, 4, 256, vocab=128, dtype="fp32")
    specs = V.plan_set([256], ["store_all"], [])
    medians = iter([56.0, 79.0, 79.0])
    calls = []

    def runner(plan_file, run_dir, device, steps, timeout, threads):
        calls.append(run_dir)
        return "ran", {"totals": [{"quantity": "iteration time", "measured": 0.01}],
                       "speed_probe": _probe(next(medians))}

    rows = V.run_validation(model, prof, specs, device="cpu", steps=1, out_dir=tmp_path, runner=runner)
    assert len(calls) == 2 and rows[0].discarded_drifts_pct == [-30.0]
    assert rows[0].speed_probe["median_gflops"] == 79.0 and rows[0].status == "ran"
    assert rows[0].to_dict()["discarded_drifts_pct"] == [-30.0]
    medians = iter([56.0, 79.0])
    calls.clear()
    rows = V.run_validation(model, prof, specs, device="cpu", steps=1, out_dir=tmp_path, runner=runner,
                            speed_retries=0)
    assert len(calls) == 1 and rows[0].discarded_drifts_pct == []
    assert abs(drift(rows[0].speed_probe, prof.provenance["speed_probe"])) > SPEED_DRIFT_LIMIT


def test_a_speed_moved_since_the_calibration_stops_the_retries(tmp_path):
    """A plan whose runs both drifted 30% slow measured a machine slower than at calibration, not a moment's load:
    the plans after it run once (a profile calibrated days before ran every plan twice in the GPU batch's dry run,
    52 s for 3 tiny plans), and the report says to calibrate again. A drift that passes is still run again."""
    from memo_exec.validate import _speed_lines
    from memo_sim.model.config import ModelConfig
    from memo_sim.profile.loader import load_profile

    base = load_profile("h100-sxm5-80gb")
    prof = dataclasses.replace(base, provenance={**base.provenance, "speed_probe": _probe(80.0)})
    model = ModelConfig("toy", 2, 64, 4, 256, vocab=128, dtype="fp32")
    specs = V.plan_set([256], ["store_all", "full_recompute", "memo"], [0.5])
    calls = []

    def runs(medians):
        it = iter(medians)
        calls.clear()

        def runner(plan_file, run_dir, device, steps, timeout, threads):
            calls.append(run_dir.name)
            return "ran", {"totals": [{"quantity": "iteration time", "measured": 0.01}],
                           "speed_probe": _probe(next(it))}
        return V.run_validation(model, prof, specs, device="cpu", steps=1, out_dir=tmp_path, runner=runner)

    rows = runs([56.0, 57.0, 55.0, 58.0])  # -30%, -28.75%: the first plan's two runs; the others once
    assert calls == ["plan-00", "plan-00", "plan-01", "plan-02"], calls
    assert rows[0].discarded_drifts_pct == [-30.0]
    assert rows[1].discarded_drifts_pct == rows[2].discarded_drifts_pct == []
    speed = run_speeds([(r.label, r.speed_probe, r.discarded_drifts_pct) for r in rows], prof.provenance["speed_probe"])
    assert speed["persistent"] == [rows[0].label] and len(speed["unsteady"]) == 3
    assert "calibrate again" in _speed_lines(speed)[0]
    rows = runs([56.0, 79.0, 56.0, 80.0, 81.0])  # a moment's load: each drifted plan is run again
    assert calls == ["plan-00", "plan-00", "plan-01", "plan-01", "plan-02"], calls
    speed = run_speeds([(r.label, r.speed_probe, r.discarded_drifts_pct) for r in rows], prof.provenance["speed_probe"])
    assert speed["persistent"] == [] and "calibrate again" not in _speed_lines(speed)[0]
    assert not persistent_drift([-30.0], 25.0) and not persistent_drift([], -30.0) and persistent_drift([40.0], 20.0)


def test_validation_claims_no_run_speed_it_did_not_measure():
    """validation.md read 'after each run's steps: not measured; every run within ±15%' (a user's review): where no
    run's speed was probed, no run is said to be within the limit."""
    from memo_exec.validate import _speed_lines

    base = {"reference": "fp32 GEMM", "calibration_median_gflops": 93.5, "calibration_spread_pct": 5.8,
            "limit_pct": 15.0, "unsteady": []}
    none = _speed_lines({**base, "runs": []})[0]
    assert "not measured" in none and "within" not in none
    one = _speed_lines({**base, "runs": [{"plan": "a", "median_gflops": 90.0, "drift_pct": -3.7,
                                          "discarded_drifts_pct": []}]})[0]
    assert "a 90.0 (-3.7%)" in one and "every run within ±15%" in one
