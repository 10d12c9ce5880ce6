"""Whether a micro-batch pipeline's steady state repeats window after window: the measurement behind
README's "uneven pipeline stages are simulated whole" (`memo_sim.engine.schedules.microbatch_fold`
folds only a steady state whose one-micro-batch or pp-micro-batch windows repeat to 1e-12).

Each case runs whole (``fold=False``) with its timeline; a window is the time between the starts of
rank 0's forwards of consecutive micro-batches (its first op of micro-batch k). Reported per case:
the last window, the largest departure of any steady-state window from it, the shortest period
(in windows) after which the windows repeat to 1e-12 s over the last ``CHECK`` windows of the
steady state, and, where a window recurs, how far it sits from its repeat cycle after cycle (a
steady state that approaches its repeat geometrically never repeats exactly in a short run).

Usage: python benchmarks/pipeline_periods.py [--micro-batches 64] [--out reports/pipeline-periods.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import time
from pathlib import Path

from machine import cpu_name, git_state, uptime  # benchmarks/machine.py (on sys.path when run as a script)

from memo_sim.engine.simulate import simulate
from memo_sim.fileio import atomic_write_text
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

REPO = Path(__file__).resolve().parent.parent
TOL = 1e-12  # seconds: the fold's tolerance is 1e-12 of the run's length, tighter than this at these lengths
CHECK = 28  # steady-state windows the period is looked for in (the last ones before the cool-down)
PROFILE = "h100-sxm5-80gb"
MODEL = "llama-3.1-405b"  # 126 layers: even at PP 14 (9 a stage), uneven at PP 16 (7, 8 x 14, 7)


def _no_sms(profile):
    """The profile with NCCL's kernels holding no SMs (`memo_sim.cost.comm_sms` not priced)."""
    return dataclasses.replace(profile, gpu=dataclasses.replace(profile.gpu, sm_count=None, comm_sms=None))


def cases(profile):
    even = Layout(tp=8, pp=14)
    uneven = Layout(tp=8, pp=16, first_stage_layers=7, last_stage_layers=7)
    return [
        ("even: TP 8 x PP 14 (9 layers a stage), SMs priced", even, profile, True),
        ("uneven: TP 8 x PP 16 (7, 8 x 14, 7), SMs priced", uneven, profile, True),
        ("uneven, NCCL's kernels holding no SMs (links still shared)", uneven, _no_sms(profile), True),
        ("uneven, no contention (no shared link, no SM held)", uneven, profile, False),
    ]


def windows(result, m: int) -> list[float]:
    """Rank 0's window lengths: the start of its first forward op of micro-batch k+1 minus micro-batch k's."""
    first: dict[int, float] = {}
    for e in sorted((e for e in result.timeline.events if e.device == 0 and e.phase == "fwd"), key=lambda e: e.start):
        _base, sep, k = e.op.rpartition("@m")
        if sep and k.isdigit() and int(k) not in first:
            first[int(k)] = e.start
    return [first[k + 1] - first[k] for k in range(m - 1)]


def period(w: list[float], lo: int, hi: int) -> int | None:
    """The shortest q with w[k] == w[k + q] (to `TOL`) for every k in lo .. hi - q, or None."""
    for q in range(1, (hi - lo) // 2 + 1):
        if all(abs(w[k] - w[k + q]) <= TOL for k in range(lo, hi - q)):
            return q
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-batches", type=int, default=64)
    ap.add_argument("--out", default=str(REPO / "reports" / "pipeline-periods.md"))
    a = ap.parse_args()
    m = a.micro_batches
    need = 2 * 16 + CHECK + 2  # the uneven case's warm-up and cool-down (PP 16) around CHECK steady-state windows
    if m < need:
        print(f"pipeline_periods: --micro-batches must be at least {need} (got {m}): the steady state between "
              f"PP 16's warm-up and cool-down must hold {CHECK} windows", file=sys.stderr)
        sys.exit(2)
    profile, model, policy = load_profile(PROFILE), get_model(MODEL), get_policy("full_recompute")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    load_before = uptime()
    rows, details = [], []
    for name, lay, prof, contention in cases(profile):
        t0 = time.process_time()
        r = simulate(model, lay, m, 8192, policy, prof, schedule="1f1b", micro_batch=1, fold=False,
                     keep_timeline=True, contention=contention)
        cpu = time.process_time() - t0
        w = windows(r, m)
        lo, hi = lay.pp + 1, m - lay.pp  # rank 0's steady state: past its warm-up, before its cool-down
        last = w[hi - 1]
        worst = max(abs(x - last) for x in w[lo:hi])
        q = period(w, hi - CHECK, hi)
        odd = [k for k in range(lo, hi) if abs(w[k] - last) > 1e-9 * last]
        rows.append(f"| {name} | {lay.label()} | {r.status} | {r.iteration_s:.6f} s | {last:.12f} s | {worst:.2e} s | "
                    f"{q if q is not None else 'none'} | {cpu:.1f} s |")
        if odd:
            details.append(f"- {name}: windows more than 1e-9 of a window from the last one, "
                           f"k: w_k - w_last: " + ", ".join(f"{k}: {w[k] - last:+.2e} s" for k in odd))
    out = [
        "# Does a pipeline's steady state repeat? (the micro-batch fold's precondition)",
        "",
        f"- date: {started}; machine: {cpu_name()}, python {sys.version.split()[0]}; load before: {load_before}",
        f"- code: {git_state(REPO)}",
        f"- command: `python benchmarks/pipeline_periods.py --micro-batches {m}`",
        f"- every case: {MODEL} (126 layers), 1F1B, full recompute, {m} micro-batches of one 8K sequence, profile "
        f"{PROFILE}, simulated whole (`fold=False`); a window is the time between rank 0's forwards of consecutive "
        "micro-batches; the steady state is windows pp + 1 .. m - pp - 1; the period is looked for over its last "
        f"{CHECK} windows, to {TOL:g} s",
        "",
        "| case | layout | status | iteration | last window | largest departure from it | period (windows) | "
        "CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Windows off the last one (micro-batch index k of the window's first forward):",
        "",
        *(details or ["- none"]),
        "",
        "Reading: the micro-batch fold (`memo_sim/engine/schedules/microbatch_fold.py`) checks windows of 1 "
        "micro-batch (1F1B) or pp (interleaved) a few windows past the warm-up and needs them to repeat to 1e-12 of "
        "the run; a case with no period, or a period that is neither, cannot be folded and is simulated whole.",
        "",
    ]
    atomic_write_text(a.out, "\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()
