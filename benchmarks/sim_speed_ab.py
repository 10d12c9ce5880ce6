"""A/B of the what-if's speed: the issue #48 queries run as whole processes from two checkouts,
alternating A and B run by run on the same machine, so that both see the same load.

    python benchmarks/sim_speed_ab.py --base /path/to/checkout-A [--runs 3] [--out FILE]

B is this checkout. Each run is ``python -m memo_sim.cli whatif FLAGS --json --no-plan``, the
13B query also as issue #48 writes it (the table printed, plan.json and plan-sppo.json written to a
scratch folder; the same best plan read from its ``best:`` line), or ``memo-sim simulate`` of the
7B/1M plan (made beforehand by each side's own what-if and not timed)
with PYTHONPATH set to the side's checkout; bytecode is compiled for both first. Printed (and
written to ``--out`` as Markdown): wall seconds of every run, the median, the child's user + sys CPU
seconds, the load average around the runs, and whether both sides answered the same best plan
(layout, policy, schedule and simulated iteration time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from sim_speed_queries import Q13, Q175  # noqa: E402

QUERIES = [
    ("GPT-13B, 64 A800s, 1M, default (bound pruning), as the issue writes it: table, plans written", Q13, 2.5),
    ("GPT-13B, 64 A800s, 1M, default (bound pruning)", Q13, 2.5),
    ("GPT-13B, 64 A800s, 1M, --simulate-top all", Q13 + ["--simulate-top", "all"], 4.0),
    ("GPT-175B, 1,024 A100s, 256K, default (bound pruning)", Q175, 4.0),
]
SIMULATE = ("`memo-sim simulate` of the 7B/1M plan", 0.8)
PLAN_7B = ["--model", "gpt-7b", "--gpus", "8", "--seq", "1M", "--profile", "a800-80gb"]


def _run(cmd: list[str], root: Path) -> tuple[float, float, str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, cwd=root, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{root}: {' '.join(cmd)} failed: {p.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout


def _best(stdout: str) -> str:
    if not stdout.lstrip().startswith("{"):  # the table: its "best: <layout> <policy> -> plan.json" line
        return next(line for line in stdout.splitlines() if line.startswith("best:"))
    d = json.loads(stdout)
    c = d["candidates"][0]
    return f"{c['layout']} {c['policy']} ({c['schedule']}) {c.get('simulated_iteration_s')}"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, type=Path, help="checkout A (B is this one)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sides = {"A": args.base.resolve(), "B": REPO}
    for root in sides.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "memo_sim")], check=True,
                       capture_output=True)
    lines = [f"- A: {sides['A']} ({_rev(sides['A'])}); B: {sides['B']} ({_rev(sides['B'])})",
             f"- {args.runs} runs per side, alternating A, B; load before: {_load()}", "",
             "| query | A wall (s) | A median | B wall (s) | B median | A CPU | B CPU | target | same best |",
             "|---|---|---|---|---|---|---|---|---|"]
    tmp = Path(tempfile.mkdtemp())
    plans = {}
    for side, root in sides.items():
        out = tmp / side
        _run(["-m", "memo_sim.cli", "whatif", *PLAN_7B, "--out", str(out)], root)
        plans[side] = out / "plan.json"
    def whatif(label: str, flags: list[str]) -> list[str]:
        tail = ["--out", str(tmp / "written")] if "issue writes" in label else ["--json", "--no-plan"]
        return ["-m", "memo_sim.cli", "whatif", *flags, *tail]

    jobs = [(label, whatif(label, flags), target, True) for label, flags, target in QUERIES]
    jobs.append((SIMULATE[0], None, SIMULATE[1], False))
    for label, cmd, target, is_query in jobs:
        got = {"A": [], "B": []}
        cpu = {"A": [], "B": []}
        best = {}
        for _ in range(args.runs):
            for side, root in sides.items():
                c = cmd if cmd else ["-m", "memo_sim.cli", "simulate", str(plans[side]), "--out", str(tmp / f"sim{side}")]
                wall, used, stdout = _run(c, root)
                got[side].append(wall)
                cpu[side].append(used)
                if is_query:
                    best[side] = _best(stdout)
        same = "yes" if not is_query else ("yes" if best["A"] == best["B"] else f"NO: {best['A']} / {best['B']}")
        row = (f"| {label} | {', '.join(f'{x:.2f}' for x in got['A'])} | **{statistics.median(got['A']):.2f}** | "
               f"{', '.join(f'{x:.2f}' for x in got['B'])} | **{statistics.median(got['B']):.2f}** | "
               f"{statistics.median(cpu['A']):.2f} | {statistics.median(cpu['B']):.2f} | <= {target} s | {same} |")
        lines.append(row)
        print(row, flush=True)
    lines.append(f"\n- load after: {_load()}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def _rev(root: Path) -> str:
    p = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return p.stdout.strip() + (" + uncommitted changes" if dirty else "")


if __name__ == "__main__":
    main()
