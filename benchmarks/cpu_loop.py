"""The calibrate -> plan -> run -> compare loop on this machine's CPU; writes reports/cpu-loop.md.

Runs the README's two commands as a user would, each as its own process:

1. ``memo-exec calibrate --device cpu --quick --name cpu-loop --out-dir WORK``
2. ``memo-exec validate --profile WORK/cpu-loop.yaml --device cpu --out WORK/validation`` (the
   default plan set: a 2-layer toy at 1K and 2K tokens, store all, full recompute, full offload and
   MEMO at three alphas; ``--validate-args`` replaces it)

and records the median, mean and max |step-time error| over the plans that ran, each plan's
predicted and measured step, the CPU threads the calibration chose and the runs used, and the
machine's load (``uptime``) before and after each step. The target is a median |error| under 30%
on an idle machine; the 2-core machine is shared, so the load is part of the result and a number
measured under load says so.

Usage: python benchmarks/cpu_loop.py [--out reports/cpu-loop.md] [--work DIR] [--validate-args "..."]
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


def report(log: list[dict], prof: dict | None, val: dict | None, started: str, code: str, command: str) -> str:
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
    if not val:
        L += ["No validation result: " + (log[-1]["last_line"] if log else "nothing ran"), ""]
        return "\n".join(L)
    s = val["summary"]
    e = s["errors"]["step_s"]
    med = e.get("median_abs_error_pct")
    met = med is not None and med < TARGET_MEDIAN_PCT
    why_busy = busy_reason((prof or {}).get("provenance", {}), s)
    share = [((prof or {}).get("provenance", {}).get("cpu_share") or {}).get("other_cores"),
             (s.get("cpu_share") or {}).get("other_cores")]
    L += ["## Result", "",
          f"- {s['ran']} of {s['plans']} plans ran; step-time |error| median **{_pct(med)}**, mean "
          f"{_pct(e['mean_abs_error_pct'])}, max {_pct(e['max_abs_error_pct'])}; Kendall tau "
          f"{'—' if s['kendall_tau_step_time'] is None else round(s['kendall_tau_step_time'], 2)}; each run used "
          f"{s.get('cpu_threads') or 'torch default'} torch threads (the calibration's)",
          f"- Cores other processes took on average (calibration, runs): {share} of {os.cpu_count()}",
          _speed_line(s.get("speed")),
          f"- Target: median |error| < {TARGET_MEDIAN_PCT:.0f}% on an idle machine (other processes took at most "
          f"{IDLE_OTHER_CORES} cores while it measured, and the machine ran at one speed: "
          "`memo_exec.host_share.busy_reason`). "
          + ((("Met" if met else "Not met") + " on an idle machine.") if why_busy is None else
             (f"This run was not on an idle machine ({why_busy}): the number says how well the loop closes "
              f"under this load ({'under' if met else 'over'} the target), not what it gives on an idle "
              f"machine.")), "",
          "| plan | status | predicted step | measured step | error | machine speed vs calibration |",
          "|---|---|---:|---:|---:|---:|"]
    drift = {d["plan"]: d["drift_pct"] for d in (s.get("speed") or {}).get("runs", [])}
    for r in val["rows"]:
        q = r["quantities"]["step_s"]
        pr = "—" if q["predicted"] is None else f"{q['predicted'] * 1e3:.1f} ms"
        me = "—" if q["measured"] is None else f"{q['measured'] * 1e3:.1f} ms"
        er = "—" if q["error_pct"] is None else f"{q['error_pct']:+.1f}%"
        dr = "—" if drift.get(r["plan"]) is None else f"{drift[r['plan']]:+.1f}%"
        L.append(f"| {r['plan']} | {r['status']} | {pr} | {me} | {er} | {dr} |")
    L += ["", "Error = (measured - predicted) / predicted. The full tables (per stream, per plan) are in the "
          "validation's own validation.md."]
    return "\n".join(L) + "\n"


def render(work: Path, out: str) -> int:
    import yaml  # noqa: PLC0415

    steps = json.loads((work / "steps.json").read_text())
    prof = yaml.safe_load((work / "cpu-loop.yaml").read_text())
    val = json.loads((work / "validation" / "validation.json").read_text())
    atomic_write_text(out, report(steps["steps"], prof, val, steps["started"], steps["code"],
                                  steps["command"]))
    print(f"wrote {out} from {work}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "cpu-loop.md"))
    ap.add_argument("--work", default=None, help="folder for the profile and the validation (default: a temp dir)")
    ap.add_argument("--validate-args", default="", help="extra memo-exec validate options (e.g. '--seqs 512')")
    ap.add_argument("--render", default=None, metavar="WORK",
                    help="write the report again from a finished run's work folder (its steps.json), running nothing")
    a = ap.parse_args()
    if a.render:
        return render(Path(a.render), a.out)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    code = git_state(REPO)  # at the start: the code the run measures
    work = Path(a.work or tempfile.mkdtemp(prefix="cpu-loop-"))
    log: list[dict] = []
    r = step(["calibrate", "--device", "cpu", "--quick", "--name", "cpu-loop", "--out-dir", str(work), "--force"], log)
    prof = val = None
    if r.returncode == 0:
        import yaml  # noqa: PLC0415

        prof = yaml.safe_load((work / "cpu-loop.yaml").read_text())
        step(["validate", "--profile", str(work / "cpu-loop.yaml"), "--device", "cpu", "--out",
              str(work / "validation"), *shlex.split(a.validate_args)], log)
        vj = work / "validation" / "validation.json"
        val = json.loads(vj.read_text()) if vj.exists() else None
    command = "python benchmarks/cpu_loop.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    atomic_write_text(work / "steps.json", json.dumps({"started": started, "code": code, "command": command,
                                                       "steps": log}, indent=1))
    text = report(log, prof, val, started, code, command)
    atomic_write_text(a.out, text)
    print(text)
    print(f"wrote {a.out} (work folder {work})")
    return 0 if val else 1


if __name__ == "__main__":
    sys.exit(main())
