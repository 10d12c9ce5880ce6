"""Run the DSA planner on every ``*.csv`` problem of a folder and write a Markdown report.

Default problems: the eleven public "challenging" MiniMalloc problems, read from
``../shared/benchmarks/dsa/minimalloc-challenging`` relative to the repository root. The number
in a file name (``A.1048576.csv``) is the capacity the problem is known to fit in; it is given
to the planner as its capacity (a search target, as MiniMalloc is given it), and the report
says whether the plan reached it. Each problem gets at most ``--time-limit`` seconds.

    python benchmarks/dsa_suite.py [--dir DIR] [--time-limit 60] [--solver auto] [--only A,B]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from memo_sim.errors import MemoError  # noqa: E402
from memo_sim.fileio import atomic_write_text  # noqa: E402
from memo_sim.memplan.bounds import conflict_graph  # noqa: E402
from memo_sim.memplan.solve import SOLVERS, solve_dsa  # noqa: E402
from memo_sim.request_trace import RequestTrace  # noqa: E402
from memo_sim.memplan.placement_check import validate_placement  # noqa: E402

DEFAULT_DIR = "../shared/benchmarks/dsa/minimalloc-challenging"
DEFAULT_OUT = "reports/dsa-suite.md"


@dataclass(frozen=True)
class Row:
    problem: str
    buffers: int
    pairs: int
    capacity: int | None
    lower_bound: int
    greedy_peak: int
    peak: int
    proven_lower_bound: int
    reached: bool | None
    time_to_capacity_s: float | None
    time_s: float
    method: str
    proven_optimal: bool


def capacity_from_name(path: Path) -> int | None:
    """The capacity in a file name like ``A.1048576.csv`` (None when there is none)."""
    m = re.search(r"\.(\d+)\.csv$", path.name)
    return int(m.group(1)) if m else None


def pct(value: int, base: int) -> str:
    return f"{100.0 * (value / base - 1.0):.2f}%" if base else "n/a"


def run_one(path: Path, time_limit: float, solver: str) -> Row:
    trace = RequestTrace.read_csv(path)
    cap = capacity_from_name(path)
    pairs = conflict_graph(trace).num_pairs
    lb = trace.max_live_bytes()
    t0 = time.perf_counter()
    sol = solve_dsa(trace, time_limit_s=time_limit, solver=solver, capacity=cap,
                    progress=lambda m: print(f"  [{path.stem} {time.perf_counter() - t0:6.2f}s] {m}",
                                             file=sys.stderr, flush=True))
    elapsed = time.perf_counter() - t0
    problems = validate_placement(trace, sol.offsets, sol.peak_bytes)
    if problems:
        raise AssertionError(f"{path.name}: planner returned an invalid plan: {problems[0]}")
    return Row(path.stem.split(".")[0], len(trace), pairs, cap, lb, sol.greedy_peak_bytes,
               sol.peak_bytes, sol.lower_bound_bytes, sol.fits_capacity, sol.time_to_capacity_s,
               elapsed, sol.method, sol.proven_optimal)


def render(rows: list[Row], *, command: str, time_limit: float, solver: str, folder: str,
           load: str) -> str:
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    cores = os.cpu_count()
    lines = [
        "# DSA suite: offline static allocation on the MiniMalloc challenging problems",
        "",
        f"- date: {now}",
        f"- machine: `{platform.machine()}` (uname -m), {cores} cores, Python {platform.python_version()}",
        f"- command: `{command}`",
        f"- load average when the run started (the cores are shared): {load}",
        f"- problems: `{folder}`; solver `{solver}`; at most {time_limit:g} s per problem; "
        "the capacity in the file name is passed to the planner as its capacity",
        "",
        "Lower bound = max-live bytes (the largest sum of sizes live at one step). "
        "\"Reached\" = final peak <= capacity. \"To cap.\" = seconds until the first plan within "
        "the capacity; \"Time\" = total planner time (it keeps lowering the peak after reaching "
        "the capacity until it proves optimality or runs out of time). Every plan was "
        "re-validated (no two live-together buffers share an address).",
        "",
        "| Problem | Buffers | Overlapping pairs | Capacity | Lower bound | Greedy peak | Greedy over LB "
        "| Final peak | Final over LB | Reached capacity | To cap. (s) | Time (s) | Optimal | Method |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---:|:-:|---|",
    ]
    for r in rows:
        reached = "n/a" if r.reached is None else ("yes" if r.reached else "no")
        tcap = f"{r.time_to_capacity_s:.2f}" if r.time_to_capacity_s is not None else "-"
        lines.append(
            f"| {r.problem} | {r.buffers} | {r.pairs} | {r.capacity if r.capacity is not None else '-'} "
            f"| {r.lower_bound} | {r.greedy_peak} | {pct(r.greedy_peak, r.lower_bound)} "
            f"| {r.peak} | {pct(r.peak, r.lower_bound)} | {reached} | {tcap} | {r.time_s:.2f} "
            f"| {'yes' if r.proven_optimal else 'no'} | {r.method} |")
    reached = sum(1 for r in rows if r.reached)
    with_cap = sum(1 for r in rows if r.capacity is not None)
    lines += [
        "",
        f"Reached the capacity on {reached} of {with_cap} problems; "
        f"proven optimal on {sum(r.proven_optimal for r in rows)} of {len(rows)}; "
        f"total time {sum(r.time_s for r in rows):.1f} s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR,
                    help=f"folder of id,lower,upper,size CSV problems, relative to the repository "
                         f"root unless absolute (default {DEFAULT_DIR})")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per problem (default 60)")
    ap.add_argument("--solver", default="auto", choices=SOLVERS)
    ap.add_argument("--only", default="", help="comma-separated problem names (e.g. A,B)")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"report path, relative to the repository root (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    folder = folder if folder.is_absolute() else REPO / folder
    files = sorted(folder.glob("*.csv"))
    if args.only:
        want = {w.strip() for w in args.only.split(",") if w.strip()}
        files = [f for f in files if f.stem.split(".")[0] in want]
    if not files:
        print(f"dsa_suite: --dir: no *.csv problems in {folder}; point --dir at a folder of "
              "id,lower,upper,size files", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print("dsa_suite: --time-limit must be positive", file=sys.stderr)
        return 2
    load = " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    rows: list[Row] = []
    try:
        for f in files:
            print(f"{f.name} ...", file=sys.stderr, flush=True)
            row = run_one(f, args.time_limit, args.solver)
            rows.append(row)
            print(f"{row.problem}: peak {row.peak} ({pct(row.peak, row.lower_bound)} over the bound), "
                  f"reached capacity: {row.reached}, {row.time_s:.2f}s, {row.method}", flush=True)
    except MemoError as e:
        print(f"dsa_suite: {e}", file=sys.stderr)
        return 2
    command = "python " + " ".join(shlex.quote(a) for a in
                                    ([str(Path(sys.argv[0]))] + (sys.argv[1:] if argv is None else argv)))
    out = Path(args.out)
    out = out if out.is_absolute() else REPO / out
    atomic_write_text(out, render(rows, command=command, time_limit=args.time_limit,
                                  solver=args.solver, folder=args.dir, load=load))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
