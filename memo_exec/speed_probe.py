"""The machine's speed at an instant: one fixed GEMM on the CPU, timed as a calibration times it.

A CPU profile holds the rates the machine had while it was calibrated; a validation compares a
run with a prediction made from them, so the comparison says something about the simulator only
while the machine runs at the speed it was calibrated at. On a shared virtual machine it does
not always: on the 2-core VM this project is built on, a cold-cache fp32 GEMM of 1024x512 @
512x2048 timed every 0.7 s ran at 50 to 87 GFLOP/s within one minute (2026-11-23, 18:34 UTC)
with no other process on the machine (`memo_exec.host_share`: other processes took 0.00 cores,
steal 0.00): the hypervisor's other tenants share the physical cores and their caches, and
nothing inside the machine sees them. A whole run took 178 ms a step in one process and 94 to
107 ms in the five processes after it, the same plan and code.

`SpeedProbe` times the reference GEMM (`REFERENCE`, the executor's forward form, with the
caches written over before each repeat, `memo_exec.calibrate.microbench.Bench`), median of
`REPEATS`, and keeps every sample. The calibration samples it between its parts
(``provenance.speed_probe``), a CPU run after every step, outside the step's timing
(``speed_probe`` of the run's --json document; the ranks of a multi-rank run then wait for each other,
`memo_exec.runner.run_steps`, so no rank's next step times a peer's probe, and the cold-cache buffer
has its pages given back after each sample, so no step's RSS peak holds them), and `drift` compares the two:
`memo_exec.host_share.busy_reason` treats a run whose median sample is more than
`SPEED_DRIFT_LIMIT` away from the calibration's as a run on another machine. The calibration
measures its GEMMs (the rates most of a step's time is priced at) once more when the samples
before and after them are that far apart, and `memo_exec.validate` runs such a run again
(``--speed-retries``), unless an earlier plan's runs all drifted past the limit on one side
(`persistent_drift`): then the machine runs at another speed than when it was calibrated, not for a
moment, and running again would measure the same; the later plans run once and the report says to
calibrate again.
"""

from __future__ import annotations

import statistics
import time

REFERENCE = (512, 512, 1536)  # tokens, input width, output width: an FC-sized fp32 GEMM (0.8 GFLOP)
REPEATS = 3  # timed repeats per sample (each with cold caches)
SPEED_DRIFT_LIMIT = 0.15  # |run / calibration - 1| of the median samples beyond which a run is unsteady


def reference_text() -> str:
    t, i, o = REFERENCE
    return f"fp32 GEMM {t}x{i} @ {i}x{o} (addmm), cold caches, median of {REPEATS} repeats"


class SpeedProbe:
    """``probe.sample()`` -> GFLOP/s of the reference GEMM now; ``probe.summary()`` -> every sample."""

    def __init__(self, flush_bytes: int | None = None) -> None:
        """``flush_bytes``: the cold-cache write before each repeat, the calibration's (`probe_for_profile`)."""
        import torch  # noqa: PLC0415

        from memo_exec.calibrate.microbench import Bench  # noqa: PLC0415

        t, i, o = REFERENCE
        gen = torch.Generator().manual_seed(0)
        self._x = torch.randn(t, i, generator=gen)
        self._w = torch.randn(o, i, generator=gen)
        self._b = torch.randn(o, generator=gen)
        self._out = torch.empty(t, o)
        self._flops = 2.0 * t * i * o
        self._addmm, self._threads = torch.addmm, torch.get_num_threads()
        self._bench = Bench(torch.device("cpu"), warmup=1, cold=True, flush_bytes=flush_bytes)
        self.flush_bytes = self._bench.flush_bytes
        self._t0 = time.monotonic()
        self.samples: list[tuple[float, float]] = []  # (seconds since the probe was made, GFLOP/s)
        self.discarded: list[tuple[float, float]] = []  # samples around a measurement that was done again

    def _gemm(self) -> None:
        self._addmm(self._b, self._x, self._w.t(), out=self._out)

    def sample(self) -> float:
        """GFLOP/s of the reference GEMM now; the cold-cache buffer's pages go back after it (`Bench.release`): between
        two samples the probe holds its operands alone (7 MiB), not the write's pages, which a run's RSS peak
        would otherwise count in every step after the first sample. The calibration's samples do the same, so
        the two compare (each sample's first write faults the pages in, untimed)."""
        tm = self._bench.time(self._gemm, repeats=REPEATS)
        self._bench.release()
        rate = self._flops / tm.median_s / 1e9
        self.samples.append((round(time.monotonic() - self._t0, 3), round(rate, 2)))
        return rate

    def moved(self, last: int) -> float:
        """(max - min) / min of the last ``last`` samples: how far the speed moved across them."""
        rates = [r for _, r in self.samples[-last:]]
        return (max(rates) - min(rates)) / min(rates) if rates and min(rates) > 0 else 0.0

    def discard(self, last: int) -> None:
        """Set the last ``last`` samples aside (the measurement between them is being done again)."""
        self.discarded += self.samples[-last:]
        del self.samples[-last:]

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        rates = [r for _, r in self.samples]
        med = statistics.median(rates)
        return {"reference": reference_text(), "threads": self._threads, "cold_write_bytes": self.flush_bytes,
                "median_gflops": round(med, 2), "min_gflops": min(rates), "max_gflops": max(rates),
                "spread_pct": round(100.0 * (max(rates) - min(rates)) / med, 1) if med > 0 else None,
                "samples": [list(s) for s in self.samples], "discarded": [list(s) for s in self.discarded]}


def probe_for_profile(provenance: dict | None) -> "SpeedProbe | None":
    """The probe a CPU run samples after each step, or None: only where the plan's profile is a CPU calibration
    that sampled the machine's speed (``provenance.speed_probe``), the one thing a run's samples are compared
    with (`drift`), and with the cold-cache write that calibration timed with (``provenance.cold_write``; a
    calibration from before it was measured wrote the full `full_cold_write_bytes`). A sample writes that many
    bytes four times (0.1 to 0.4 s a step a rank at 600 MiB on the 2-core Xeon VM, 2026-12-01), for nothing
    where no calibration's speed is there to compare."""
    prov = provenance or {}
    if not prov.get("speed_probe"):
        return None
    return SpeedProbe(flush_bytes=(prov.get("cold_write") or {}).get("bytes"))


def persistent_drift(discarded: list[float], kept: float | None) -> bool:
    """Whether a plan's runs all drifted past `SPEED_DRIFT_LIMIT` on one side of the calibration: the runs set
    aside (``discarded``, percent, at least one) and the kept one (``kept``, percent): the machine's speed moved
    since the calibration, where a moment's load would have passed by the next run."""
    if not discarded or kept is None:
        return False
    runs = [*discarded, kept]
    return all(abs(d) > 100.0 * SPEED_DRIFT_LIMIT for d in runs) and (all(d > 0 for d in runs)
                                                                      or all(d < 0 for d in runs))


def drift(run: dict | None, calibration: dict | None) -> float | None:
    """run / calibration - 1 of the two probes' median samples, or None where either is missing."""
    if not run or not calibration:
        return None
    a, b = run.get("median_gflops"), calibration.get("median_gflops")
    return a / b - 1.0 if a and b else None


def run_speeds(runs: list[tuple[str, dict | None, list[float]]], calibration: dict | None) -> dict:
    """The machine's speed while a validation measured: the calibration's probe and each run's
    (``runs``: plan label, the kept run's probe summary, the drifts of runs set aside), the drift
    of each kept run, the runs beyond `SPEED_DRIFT_LIMIT` (``unsteady``) and the plans whose runs all drifted past it
    on one side (``persistent``, `persistent_drift`)."""
    rows = []
    for label, probe, discarded in runs:
        d = drift(probe, calibration)
        rows.append({"plan": label, "median_gflops": (probe or {}).get("median_gflops"),
                     "drift_pct": None if d is None else round(100.0 * d, 1), "discarded_drifts_pct": list(discarded)})
    drifts = [abs(r["drift_pct"]) for r in rows if r["drift_pct"] is not None]
    return {"reference": reference_text(), "limit_pct": 100.0 * SPEED_DRIFT_LIMIT,
            "calibration_median_gflops": (calibration or {}).get("median_gflops"),
            "calibration_spread_pct": (calibration or {}).get("spread_pct"), "runs": rows,
            "max_abs_drift_pct": max(drifts) if drifts else None,
            "unsteady": [r["plan"] for r in rows if r["drift_pct"] is not None
                         and abs(r["drift_pct"]) > 100.0 * SPEED_DRIFT_LIMIT],
            "persistent": [r["plan"] for r in rows if persistent_drift(r["discarded_drifts_pct"], r["drift_pct"])]}


def speed_reason(provenance: dict, summary: dict) -> str | None:
    """Why the machine did not run at one speed while a CPU calibration (its profile's
    ``provenance``) and a validation (its ``summary``) measured, or None when it did (or where no
    probe was taken): the calibration's own samples spread over more than `SPEED_DRIFT_LIMIT`, or
    a run's median sample was more than that away from the calibration's."""
    cal = provenance.get("speed_probe") or {}
    limit = 100.0 * SPEED_DRIFT_LIMIT
    if cal.get("spread_pct") is not None and cal["spread_pct"] > limit:
        return (f"the machine's speed changed while calibrating: the reference GEMM ran at {cal['min_gflops']} to "
                f"{cal['max_gflops']} GFLOP/s (spread {cal['spread_pct']}%, above {limit:.0f}%)")
    sp = summary.get("speed") or {}
    if sp.get("unsteady"):
        worst = max((r for r in sp["runs"] if r["drift_pct"] is not None), key=lambda r: abs(r["drift_pct"]))
        return (f"the machine's speed changed after calibrating: {len(sp['unsteady'])} of {len(sp['runs'])} runs "
                f"measured the reference GEMM more than {limit:.0f}% away from the calibration's "
                f"{sp['calibration_median_gflops']} GFLOP/s (worst {worst['plan']}: {worst['median_gflops']} GFLOP/s, "
                f"{worst['drift_pct']:+.1f}%)")
    return None
