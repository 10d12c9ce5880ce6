#!/usr/bin/env python
"""What a lower board power limit leaves of the SM clock under each kernel class, from the power and
clock `benchmarks/gpu/probe_power.py` sampled on a 700 W H100 SXM (reports/data/gpu-h100-2026-11-26-power*):

    python benchmarks/gpu/power_clock.py [--limit 500]

Measured (reports/gpu-h200-2026-11-26.md, "Power"): on the 700 W part every compute-bound kernel the
probe ran (bf16 GEMMs from 2048^3, the FP8 GEMM, FlashAttention-2 and cuDNN attention at 8K and 32K
tokens) holds the board at its 700 W software power cap, the driver lowering the SM clock to stay
there (1,260-1,965 MHz against the 1,980 MHz maximum); a 4 GiB copy draws 404 W at the full clock.
While the cap's controller settles it swings the clock by a few hundred MHz, and the board's
instantaneous power follows: over each case's samples (its warm-up second included, the first
100 ms left out) board power is fitted as a line in the SM clock, ``P = a + b f``.

A part of the same silicon limited to ``L`` watts runs a kernel that draws ``P`` at clock ``f``
on the 700 W part at ``f_L = f - max(0, P - L) / b`` (the line followed down to ``L``; for the
GEMMs and cuDNN's forward the swings themselves reach 500-530 W, so 500 W is at the edge of the
measured range, not far beyond it). A compute-bound kernel's time scales with the inverse of its
clock, so its efficiency at ``L`` is its efficiency at 700 W times ``f_L / f`` (`ratio`).
What this leaves out: the board's power averages over milliseconds, so in a training step the
clock follows the mix of kernels (per-class ratios price every kernel of a class as if it ran
alone). A check (reports/data/gpu-h100-2026-11-26-power-layer*): one Llama 3.1 8B layer's eager
forward and backward over 8K tokens also holds the board at the 700 W cap, at 1,710 MHz (the 8192^3
GEMM alone 1,365, FlashAttention-2 at 8K alone 1,965); the layer's own line (looser, r 0.49: the
power also follows which kernel runs) leaves it 0.80 of its clock at 500 W, where the per-class
ratios give its kernels 0.84-0.90, so if anything the per-class ratios leave a mixed step a little
too much clock; leakage is lower on a cooler 500 W part (its clock a little
higher); the line is a secant of a convex curve, so below the measured range it puts the clock a
little high (the ratio is an upper bound on speed there).

`curve_ratios` maps each efficiency curve of a profile to the ratio at each measured size (the mean
of the two runs where both measured it; x as
the curve's: GEMM FLOPs, attention forward FLOPs, backward 2.5x the forward's; the backward takes
the forward + backward case's ratio, whose time is mostly the backward's); `ratio_at` interpolates
in log FLOPs between them, flat beyond the ends. `benchmarks/gpu/hopper_curves.py --write` applies
it to the 500 W profile's curves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from bisect import bisect_left
from math import log10
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = "reports/data/gpu-h100-2026-11-26-power"  # .jsonl (the cases) and -samples.csv (nvidia-smi every 50 ms)
REPEAT = "reports/data/gpu-h100-2026-11-26-power-run1"  # the first run: 8 s cases, fewer sizes, no windows kept
LAYER = "reports/data/gpu-h100-2026-11-26-power-layer"  # a Llama 3.1 8B layer beside a GEMM and an attention case
# the first run's cases under the second's names (its GEMMs at 8192^3, its attention at 32K tokens)
REPEAT_NAMES = {"gemm_bf16": "gemm_bf16_8192", "attn_flash_fwd": "attn_flash_fwd_32k",
                "attn_flash_fwd_bwd": "attn_flash_fwd_bwd_32k", "attn_cudnn_fwd": "attn_cudnn_fwd_32k",
                "attn_cudnn_fwd_bwd": "attn_cudnn_fwd_bwd_32k"}
REFERENCE_W = 700.0  # the measured part's power limit (the probe's env row: enforced.power.limit)
WARMUP_S = 1.0  # probe_power runs each kernel this long before its window
# a curve of the profile -> (probe case, the share of the case's FLOPs that is the curve's x): the GEMMs' and
# the forward's x are their FLOPs; a forward + backward case's FLOPs are 3.5x the forward's (probe_power), the
# backward curve's x 2.5x the forward's (the simulator's convention, `memo_sim.cost.kernel_time`)
BWD = 2.5 / 3.5
CASES = {
    "gemm": [("gemm_bf16_2048", 1.0), ("gemm_bf16_4096", 1.0), ("gemm_bf16_8192", 1.0)],
    "gemm_fp8": [("gemm_fp8_tensorwise", 1.0)],
    "attention_fwd": [("attn_flash_fwd_8k", 1.0), ("attn_flash_fwd_32k", 1.0)],
    "attention_bwd": [("attn_flash_fwd_bwd_8k", BWD), ("attn_flash_fwd_bwd_32k", BWD)],
    "attention_cudnn_fwd": [("attn_cudnn_fwd_8k", 1.0), ("attn_cudnn_fwd_32k", 1.0)],
    "attention_cudnn_bwd": [("attn_cudnn_fwd_bwd_8k", BWD), ("attn_cudnn_fwd_bwd_32k", BWD)],
}


def unit_flops(stem: str = DATA) -> dict[str, float]:
    """FLOPs of one unit of each case, as the probe counted them (its rate over its units per second)."""
    rows, _samples = load(stem)
    return {r["case"]: r["tflops"] * 1e12 / r["units_per_s"] for r in rows if r.get("tflops")}


def load(stem: str = DATA) -> tuple[list[dict], list[tuple[float, float, float]]]:
    """(the probe's case rows, the samples as (host time, instantaneous board power W, SM clock MHz))."""
    rows = [json.loads(line) for line in (REPO / f"{stem}.jsonl").read_text().splitlines() if line.strip()]
    fields = rows[0]["fields"]
    ip, ic = fields.index("power.draw.instant"), fields.index("clocks.sm")
    samples = []
    for line in (REPO / f"{stem}-samples.csv").read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        stamp = parts[0]
        t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + stamp.split(".")[1])
        samples.append((t, float(parts[ip]), float(parts[ic])))
    return rows, samples


def _windows(rows: list[dict], samples: list) -> dict[str, tuple[float, float]]:
    """Each case's window: its own (t0, t1), or where the rows lack them (the first run) the runs of
    samples above 300 W, one per loaded case in order, their first `WARMUP_S` the warm-up."""
    cases = [r for r in rows[1:] if r["case"] != "idle"]
    if all("t0" in r for r in cases):
        return {r["case"]: (r["t0"], r["t1"]) for r in cases}
    runs, cur = [], []
    for s in samples:
        if s[1] > 300:
            cur.append(s)
        elif cur:
            runs.append(cur) if len(cur) > 20 else None
            cur = []
    if len(cur) > 20:
        runs.append(cur)
    return {r["case"]: (run[0][0] + WARMUP_S, run[-1][0]) for r, run in zip(cases, runs)}


def fits(stem: str = DATA, limit: float = 500.0) -> dict[str, dict]:
    """Per case: the median SM clock and power over its window (less its first half second), the line
    ``P = a + b f`` over its samples (warm-up included, the first 100 ms left out), its correlation, and
    the clock and ratio at ``limit`` watts (module docs). A case whose clock never moves (the copy:
    under the cap) keeps ratio 1."""
    rows, samples = load(stem)
    out = {}
    for case, (t0, t1) in _windows(rows, samples).items():
        steady = [s for s in samples if t0 + 0.5 <= s[0] <= t1]
        fitted = [s for s in samples if t0 - WARMUP_S + 0.1 <= s[0] <= t1]
        if not steady:
            continue
        f_med = statistics.median(s[2] for s in steady)
        p_med = statistics.median(s[1] for s in steady)
        fs, ps = [s[2] for s in fitted], [s[1] for s in fitted]
        row = {"clock_mhz": f_med, "power_w": p_med, "samples": len(fitted)}
        if max(fs) - min(fs) < 30 or p_med <= limit:
            row.update(slope_w_per_mhz=None, corr=None, clock_at_limit=f_med, ratio=1.0)
        else:
            mf, mp = statistics.fmean(fs), statistics.fmean(ps)
            b = sum((f - mf) * (p - mp) for f, p in zip(fs, ps)) / sum((f - mf) ** 2 for f in fs)
            f_l = f_med - max(0.0, p_med - limit) / b
            row.update(slope_w_per_mhz=b, corr=statistics.correlation(fs, ps), clock_range=(min(fs), max(fs)),
                       power_range=(min(ps), max(ps)), clock_at_limit=f_l, ratio=f_l / f_med)
        out[case] = row
    return out


def curve_ratios(limit: float = 500.0) -> dict[str, list[tuple[float, float]]]:
    """Per efficiency curve: (x, clock ratio at ``limit``) at each measured size, x ascending; a case
    both runs measured takes the mean of their ratios (they differ by up to 0.05)."""
    per: dict[str, list[float]] = {}
    for case, r in fits(DATA, limit).items():
        per.setdefault(case, []).append(r["ratio"])
    for case, r in fits(REPEAT, limit).items():
        per.setdefault(REPEAT_NAMES.get(case, case), []).append(r["ratio"])
    flops = unit_flops(DATA)
    return {curve: sorted((float(f"{flops[case] * share:.4g}"), round(statistics.fmean(per[case]), 3))
                          for case, share in cases) for curve, cases in CASES.items()}


def ratio_at(points: list[tuple[float, float]], x: float) -> float:
    """``points``' ratio at ``x``: linear in log10 x between the measured sizes, flat beyond the ends."""
    xs = [p[0] for p in points]
    i = bisect_left(xs, x)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, r0), (x1, r1) = points[i - 1], points[i]
    w = (log10(x) - log10(x0)) / (log10(x1) - log10(x0))
    return r0 + w * (r1 - r0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=float, default=500.0, help="the board power limit, watts (default 500)")
    a = ap.parse_args()
    if not 0 < a.limit <= REFERENCE_W:
        ap.exit(2, f"error: --limit {a.limit:g}: give the board power limit in watts, above 0 and at most the "
                   f"measured part's {REFERENCE_W:g}\n")
    for stem in (DATA, REPEAT, LAYER):
        print(f"# {stem} (700 W H100 SXM; limit {a.limit:g} W)")
        for case, r in fits(stem, a.limit).items():
            line = f"{case:24s} clock {r['clock_mhz']:6.0f} MHz at {r['power_w']:5.0f} W"
            if r["slope_w_per_mhz"] is not None:
                line += (f"; P = a + {r['slope_w_per_mhz']:.3f} W/MHz x f (r {r['corr']:.2f}, clock "
                         f"{r['clock_range'][0]:.0f}-{r['clock_range'][1]:.0f}, power {r['power_range'][0]:.0f}-"
                         f"{r['power_range'][1]:.0f} W)")
            line += f" -> {r['clock_at_limit']:6.0f} MHz at {a.limit:g} W, ratio {r['ratio']:.3f}"
            print(line)
    print("# per curve (x, ratio):")
    for curve, pts in curve_ratios(a.limit).items():
        print(f"{curve}: {[(float(f'{x:.3g}'), r) for x, r in pts]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
