"""The calibrate -> plan -> run -> compare loop on this machine's CPU; writes reports/cpu-loop.md.

Runs the README's two commands as a user would, each as its own process:

1. ``memo-exec calibrate --device cpu --quick --name cpu-loop --out-dir WORK --attention-shapes 8x32,4x32``
   (attention also timed at the shapes validate's model runs per rank: `ATTENTION_SHAPES`)
2. ``memo-exec validate --profile WORK/cpu-loop.yaml --device cpu --out WORK/validation`` (the
   default plan set: a 2-layer toy at 1K and 2K tokens, store all, full recompute, full offload and
   MEMO at three alphas; ``--validate-args`` replaces it)

3. with ``--layouts`` (default ``one,tp2,cp2,dp2,pp2``) the same validation of 2-rank plans, one
   ``memo-exec validate`` per layout (``--tp 2``, ring ``--cp 2``, ``--dp 2``, and a pipeline of 2
   stages over 4 micro-batches, 1F1B: ``--pp 2 --micro-batches 4``), each rank a process with the
   calibration's threads; the P2P transfers are priced with the link the calibration measured
   between two processes and each gloo collective with its own measured fit (the link's
   ``collectives`` section, `memo_exec.calibrate.collectives`)

and records the median, mean and max |step-time error| over the plans that ran (all layouts
together, and per layout), each plan's predicted and measured step, the CPU threads the
calibration chose and the runs used, and the machine's load (``uptime``) before and after each
step. The targets: a median |error| under 30% on an idle machine (issue #30, single-process); issue
#47 asks at most 10% median and 20% max over the single-process, 2-rank and pipelined plans. The
2-core machine is shared, so the load is part of the result and a number measured under load says so.

Usage: python benchmarks/cpu_loop.py [--out reports/cpu-loop.md] [--work DIR] [--validate-args "..."]
                                     [--layouts one,tp2,cp2,dp2,pp2] [--dist-args "..."]
       python benchmarks/cpu_loop.py --render WORK   (the report again from a finished run)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name, git_state, uptime  # benchmarks/machine.py (this folder is on sys.path when run as a script)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_exec.host_share import IDLE_OTHER_CORES, busy_reason  # noqa: E402
from memo_exec.validate import LOOP_TARGET_MEDIAN_PCT as TARGET_MEDIAN_PCT  # noqa: E402
from memo_exec.validate import this_python  # noqa: E402
from memo_sim.fileio import atomic_write_text  # noqa: E402



# layout name -> the memo-exec validate options that run it (``one``: the single-process plan set)
LAYOUTS = {"one": [], "tp2": ["--tp", "2"], "cp2": ["--cp", "2"], "dp2": ["--dp", "2"],
           "pp2": ["--pp", "2", "--micro-batches", "4"]}
# the plan set of a 2-rank layout (``--dist-args`` replaces it): a quarter of the single-process runs
DIST_ARGS = "--layers 4 --seqs 1K,2K --policies store_all,full_recompute,memo --alphas 0.5"
TARGET_47 = (10.0, 20.0)  # issue #47: median and max |step-time error| over every layout


def step(argv: list[str], log: list[dict]) -> subprocess.CompletedProcess:
    """Run one memo-exec command in its own process; log its command, time, exit and the load."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    before, t0 = uptime(), time.monotonic()
    r = subprocess.run([*this_python(), "-m", "memo_exec.cli", *argv], capture_output=True, text=True,
                       env=env)
    log.append({"command": "memo-exec " + " ".join(shlex.quote(a) for a in argv), "exit": r.returncode,
                "seconds": time.monotonic() - t0, "before": before, "after": uptime(),
                "last_line": (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or [""])[-1]})
    return r


def _speed_line(speed: dict | None) -> str:
    """The machine's speed (`memo_exec.speed_probe`) while calibrating and during the runs."""
    if not speed or speed.get("calibration_median_gflops") is None:
        return "- Machine speed: not measured (a profile without a speed probe)"
    return (f"- Machine speed ({speed['reference']}): {speed['calibration_median_gflops']} GFLOP/s while calibrating "
            f"(spread {speed['calibration_spread_pct']}%); the runs' largest drift from it "
            f"{'—' if speed['max_abs_drift_pct'] is None else str(speed['max_abs_drift_pct']) + '%'} "
            f"(limit {speed['limit_pct']:.0f}%)")


def _pct(v) -> str:
    return "—" if v is None else f"{v:.1f}%"


def _stats(errors: list[float]) -> tuple[float | None, float | None, float | None]:
    """(median, mean, max) of |errors| in percent."""
    a = sorted(abs(e) for e in errors)
    if not a:
        return None, None, None
    mid = len(a) // 2
    med = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return med, sum(a) / len(a), a[-1]


def report(log: list[dict], prof: dict | None, vals: dict[str, dict | None], started: str, code: str,
           command: str) -> str:
    """The report of one loop: ``vals`` maps each layout (`LAYOUTS`) to its validation.json (None: it did not
    run)."""
    L = ["# The CPU loop: calibrate --quick, then validate --device cpu", "",
         f"- Date: {started} (UTC)", f"- Machine: {cpu_name()}, {os.cpu_count()} CPU cores, Python "
         f"{platform.python_version()}, {platform.platform()}", f"- Code: commit {code}",
         f"- Command: `{command}`",
         "- Load (`uptime`; the machine is shared with other engineers, so the load is part of the result):"]
    for s in log:
        L += [f"  - before `{s['command']}`: `{s['before']}`", f"  - after ({s['seconds']:.0f} s, exit {s['exit']}): "
              f"`{s['after']}`"]
    if prof:
        p = prof.get("provenance", {})
        L += [f"- Calibration: {p.get('duration_s')} s, {p.get('torch_threads')} torch threads "
              f"({p.get('torch_threads_reason', 'reason not recorded')}), load at start and end "
              f"{p.get('load_average_1min')}"]
    L.append("")
    ran = {k: v for k, v in vals.items() if v}
    if not ran:
        L += ["No validation result: " + (log[-1]["last_line"] if log else "nothing ran"), ""]
        return "\n".join(L)
    every = [r["quantities"]["step_s"]["error_pct"] for v in ran.values() for r in v["rows"]
             if r["quantities"]["step_s"]["error_pct"] is not None]
    med, mean, worst = _stats(every)
    busy = {k: busy_reason((prof or {}).get("provenance", {}), v["summary"]) for k, v in ran.items()}
    idle = all(b is None for b in busy.values())
    L += ["## Result", "",
          f"- Every layout together: {len(every)} plans ran; step-time |error| median **{_pct(med)}**, mean "
          f"{_pct(mean)}, max **{_pct(worst)}** (issue #47's targets: median at most {TARGET_47[0]:.0f}%, max at "
          f"most {TARGET_47[1]:.0f}%: "
          + ("met" if med is not None and med <= TARGET_47[0] and worst <= TARGET_47[1] else "not met")
          + (" on an idle machine)" if idle else "; not all on an idle machine: "
             + "; ".join(f"{k}: {b}" for k, b in busy.items() if b) + ")")]
    drift_all: dict[tuple[str, str], float] = {}
    for name, v in ran.items():
        s = v["summary"]
        e = s["errors"]["step_s"]
        m = e.get("median_abs_error_pct")
        share = [((prof or {}).get("provenance", {}).get("cpu_share") or {}).get("other_cores"),
                 (s.get("cpu_share") or {}).get("other_cores")]
        L += [f"- {name} ({v.get('layout', name)}): {s['ran']} of {s['plans']} plans ran; median {_pct(m)}, mean "
              f"{_pct(e['mean_abs_error_pct'])}, max {_pct(e['max_abs_error_pct'])}; Kendall tau "
              f"{'—' if s['kendall_tau_step_time'] is None else round(s['kendall_tau_step_time'], 2)}; "
              f"{s.get('cpu_threads') or 'torch default'} torch threads per process; cores other processes took "
              f"(calibration, runs): {share} of {os.cpu_count()}; " + _speed_line(s.get("speed")).removeprefix("- ")]
        for d in (s.get("speed") or {}).get("runs", []):
            drift_all[(name, d["plan"])] = d["drift_pct"]
    # the single-process layout's own rows (not whichever layout ran first), and only where it ran on an idle machine
    one = ran.get("one")
    one_med = one["summary"]["errors"]["step_s"].get("median_abs_error_pct") if one else None
    if one is None:
        verdict30 = "not judged: the single-process layout (`one`) did not run"
    elif busy.get("one"):
        verdict30 = f"not judged: not on an idle machine ({busy['one']}); median {_pct(one_med)}"
    else:
        verdict30 = "met" if one_med is not None and one_med < TARGET_MEDIAN_PCT else "not met"
    L += [f"- Issue #30's target (single process): median |error| < {TARGET_MEDIAN_PCT:.0f}% on an idle machine "
          f"(other processes took at most {IDLE_OTHER_CORES} cores while it measured, and the machine ran at one "
          "speed: `memo_exec.host_share.busy_reason`): " + verdict30 + ".", "",
          "| layout | plan | status | predicted step | measured step | error | machine speed vs calibration |",
          "|---|---|---|---:|---:|---:|---:|"]
    for name, v in ran.items():
        for r in v["rows"]:
            q = r["quantities"]["step_s"]
            pr = "—" if q["predicted"] is None else f"{q['predicted'] * 1e3:.1f} ms"
            me = "—" if q["measured"] is None else f"{q['measured'] * 1e3:.1f} ms"
            er = "—" if q["error_pct"] is None else f"{q['error_pct']:+.1f}%"
            d = drift_all.get((name, r["plan"]))
            dr = "—" if d is None else f"{d:+.1f}%"
            L.append(f"| {v.get('layout', name)} | {r['plan']} | {r['status']} | {pr} | {me} | {er} | {dr} |")
    L += ["", "Error = (measured - predicted) / predicted; a 2-rank plan's measured step is rank 0's. The full "
          "tables (per stream, per plan) are in each validation's own validation.md."]
    return "\n".join(L) + "\n"


def _validation(work: Path, name: str) -> dict | None:
    vj = work / ("validation" if name == "one" else f"validation-{name}") / "validation.json"
    return json.loads(vj.read_text()) if vj.exists() else None


def render(work: Path, out: str) -> int:
    import yaml  # noqa: PLC0415

    steps = json.loads((work / "steps.json").read_text())
    prof = yaml.safe_load((work / "cpu-loop.yaml").read_text())
    vals = {name: _validation(work, name) for name in steps.get("layouts", ["one"])}
    atomic_write_text(out, report(steps["steps"], prof, vals, steps["started"], steps["code"], steps["command"]))
    print(f"wrote {out} from {work}")
    return 0


# the (query heads, head size) validate's default model runs per rank (memo_exec.validate.TOY_MODEL: h=256 and 8
# heads): 8x32 on one rank, under CP, DP and PP, 4x32 under TP 2; the calibration times attention at them too
# (`memo_sim.cost.attention_measured`)
ATTENTION_SHAPES = "8x32,4x32"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "cpu-loop.md"))
    ap.add_argument("--work", default=None, help="folder for the profile and the validation (default: a temp dir)")
    ap.add_argument("--validate-args", default="", help="extra memo-exec validate options (e.g. '--seqs 512')")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help=f"comma-separated layouts to validate, of {', '.join(LAYOUTS)} (one: the single-process set)")
    ap.add_argument("--dist-args", default=DIST_ARGS, help="memo-exec validate options of the 2-rank layouts' plans")
    ap.add_argument("--render", default=None, metavar="WORK",
                    help="write the report again from a finished run's work folder (its steps.json), running nothing")
    a = ap.parse_args()
    if a.render:
        return render(Path(a.render), a.out)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    code = git_state(REPO)  # at the start: the code the run measures
    work = Path(a.work or tempfile.mkdtemp(prefix="cpu-loop-"))
    log: list[dict] = []
    r = step(["calibrate", "--device", "cpu", "--quick", "--name", "cpu-loop", "--out-dir", str(work), "--force",
              "--attention-shapes", ATTENTION_SHAPES], log)
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        ap.error(f"--layouts: unknown {', '.join(unknown)}; choose from {', '.join(LAYOUTS)}")
    prof = None
    vals: dict[str, dict | None] = {name: None for name in layouts}
    if r.returncode == 0:
        import yaml  # noqa: PLC0415

        prof = yaml.safe_load((work / "cpu-loop.yaml").read_text())
        for name in layouts:
            extra = a.validate_args if name == "one" else a.dist_args
            folder = work / ("validation" if name == "one" else f"validation-{name}")
            step(["validate", "--profile", str(work / "cpu-loop.yaml"), "--device", "cpu", "--out", str(folder),
                  "--no-record", *LAYOUTS[name], *shlex.split(extra)], log)
            vals[name] = _validation(work, name)
    command = "python benchmarks/cpu_loop.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    atomic_write_text(work / "steps.json", json.dumps({"started": started, "code": code, "command": command,
                                                       "steps": log, "layouts": layouts}, indent=1))
    text = report(log, prof, vals, started, code, command)
    atomic_write_text(a.out, text)
    print(text)
    print(f"wrote {a.out} (work folder {work})")
    return 0 if any(vals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
