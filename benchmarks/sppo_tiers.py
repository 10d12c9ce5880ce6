"""SPPO's two tiers against each other: the analytic (stage, piece) recurrence that prices a point in
milliseconds (`memo_sim.search.sppo.estimate`, tier 1) and the event simulation of its op graph
(`memo_sim.engine.schedules.sppo`, tier 2), point by point, with what each simulation cost.

Issue #32 asks for one SPPO candidate at 1M tokens / 64 GPUs in at most 50 ms, which no event
simulation of that graph in SimPy reaches (reports/sim-speed.md); pricing SPPO in tier 2 with tier 1's
recurrence would. This measures what that would give up. Per what-if of a sweep, it takes the best
``--per-query`` fitting points of SPPO's search and as many of its failing points closest to fitting,
and gives, tier 1 against tier 2: the status (OK, OOM, OOHM), the iteration time, the peak GPU memory
of the fullest stage and the pinned host memory of the fullest node; with the simulation's wall
seconds and op count.

    python benchmarks/sppo_tiers.py                      # writes reports/sppo-tiers.md
    python benchmarks/sppo_tiers.py --per-query 4 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from machine import cpu_name, git_state, uptime  # benchmarks/machine.py (this folder is on sys.path when run as a script)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_sim.engine.simulate import simulate  # noqa: E402
from memo_sim.fileio import atomic_write_text  # noqa: E402
from memo_sim.model.config import get_model  # noqa: E402
from memo_sim.profile import load_profile  # noqa: E402
from memo_sim.search.sppo.exhaustive import search_sppo  # noqa: E402

K = 1024
QUERIES = [  # (model, tokens, GPUs, profile)
    ("gpt-7b", 256 * K, 16, "a800-80gb"),
    ("gpt-7b", 1024 * K, 32, "a100-sxm4-80gb"),
    ("gpt-13b", 512 * K, 32, "a100-sxm4-80gb"),
    ("gpt-13b", 1024 * K, 64, "a800-80gb"),
    ("gpt-30b", 1024 * K, 64, "a800-80gb"),
    ("gpt-7b", 2048 * K, 64, "a100-sxm4-80gb"),
]


def _pct(a: float, b: float) -> float:
    return (a - b) / b * 100.0


def measure(per_query: int) -> list[dict]:
    rows = []
    for name, seq, gpus, prof in QUERIES:
        model, profile = get_model(name), load_profile(prof)
        t0 = time.perf_counter()
        search = search_sppo(model, seq, gpus, profile)
        search_s = time.perf_counter() - t0
        # the best fitting points, and the failing ones closest to fitting (where the tiers' OOM calls matter)
        ok = [p for p in search.points if p.status == "OK"][:per_query]
        failing = [p for p in search.points if p.status != "OK"][:per_query]
        for pt in ok + failing:
            t0, c0 = time.perf_counter(), time.process_time()
            sim = simulate(model, pt.layout, 1, seq, pt.policy, profile, schedule="sppo", keep_timeline=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            mem = pt.memory
            rows.append({
                "query": f"{name} / {gpus} GPUs / {seq // K}K ({prof})", "search_s": search_s,
                "point": pt.label(), "pp": pt.layout.pp, "subseqs": pt.policy.subseqs,
                "status_t1": pt.status, "status_t2": sim.status,
                "it_t1": pt.estimate.iteration_s, "it_t2": sim.iteration_s,
                "peak_t1": mem.breakdown.peak_gpu_bytes, "peak_t2": sim.peak_gpu_bytes,
                "host_t1": mem.host_bytes_per_node, "host_t2": sim.peak_host_bytes_per_node,
                "both_over_t1": mem.breakdown.oom_by > 0 and mem.breakdown.oohm_by > 0,
                "ops": sim.n_ops, "detail": (sim.pipeline or {}).get("detail"), "wall_s": wall, "cpu_s": cpu})
            print(f"{rows[-1]['query']}: {rows[-1]['point']}: {pt.status}/{sim.status} {wall:.2f} s", flush=True)
    return rows


def _stats(xs: list[float]) -> str:
    if not xs:
        return "none"
    a = [abs(x) for x in xs]
    return f"median |error| {statistics.median(a):.2f} %, max {max(a):.2f} % (signed {min(xs):+.2f} to {max(xs):+.2f} %)"


def report(rows: list[dict], head: list[str]) -> str:
    both_ok = [r for r in rows if r["status_t1"] == "OK" and r["status_t2"] == "OK"]
    # a fit the tiers disagree on (one OK, the other not) changes an answer; two failures named
    # differently (the simulation stops at the first allocation past capacity in time, so where GPU and
    # host memory both overflow it names whichever comes first) do not
    fit_differs = [r for r in rows if (r["status_t1"] == "OK") != (r["status_t2"] == "OK")]
    named_differently = [r for r in rows if r["status_t1"] != r["status_t2"] and r not in fit_differs]
    lines = head + [
        "",
        "Tier 1: the analytic (stage, piece) recurrence of SPPO's search (`search/sppo/estimate.py`) and its per-stage "
        "memory walk (`memplan/footprint.py sppo_memory`). Tier 2: the event simulation of the op graph "
        "(`engine/schedules/sppo.py`, contention on, detail `auto`). Errors are tier 1 against tier 2, in % of tier 2; "
        "peaks are the fullest stage's GPU bytes and the fullest node's pinned host bytes. The simulation's memory actions "
        "are the walk's allocations and frees placed on its ops, so equal peaks say that the simulated timing never "
        "moves a stage's peak on these points, not that two independent memory models agree. A simulation that fails "
        "stops at the failing allocation, so its peak is where it stopped; the peak errors are over the points both "
        "tiers fit.",
        "",
        "## Summary",
        "",
        f"- Points: {len(rows)} over {len({r['query'] for r in rows})} what-ifs; both tiers OK: {len(both_ok)}, "
        f"both failing: {sum(r['status_t1'] != 'OK' and r['status_t2'] != 'OK' for r in rows)}.",
        f"- Fits that the tiers disagree on (one OK, the other not): {len(fit_differs)}"
        + ("" if not fit_differs else " (" + "; ".join(f"{r['point']} ({r['query']}): tier 1 {r['status_t1']}, "
                                                       f"tier 2 {r['status_t2']}" for r in fit_differs) + ")") + ".",
        f"- Failures the tiers name differently: {len(named_differently)} ("
        + ", ".join(f"{n} tier 1 {a} / tier 2 {b}" for (a, b), n in sorted(
            Counter((r['status_t1'], r['status_t2']) for r in named_differently).items()))
        + f"; in {sum(r['both_over_t1'] for r in named_differently)} of them tier 1 has GPU and host memory both over "
        "capacity and names the GPU, while the simulation stops at whichever allocation fails first in time)."
        if named_differently else "- Failures the tiers name differently: none.",
        f"- Iteration time, both OK: {_stats([_pct(r['it_t1'], r['it_t2']) for r in both_ok])}.",
        f"- Peak GPU memory, both OK: {_stats([_pct(r['peak_t1'], r['peak_t2']) for r in both_ok])}.",
        f"- Pinned host memory per node, both OK: "
        f"{_stats([_pct(r['host_t1'], r['host_t2']) for r in both_ok if r['host_t2']])}.",
        f"- Tier 2's cost: {sum(r['wall_s'] for r in rows):.1f} s wall for the {len(rows)} simulations "
        f"({min(r['wall_s'] for r in rows) * 1e3:.0f} ms to {max(r['wall_s'] for r in rows):.2f} s each, "
        f"{min(r['ops'] for r in rows):,} to {max(r['ops'] for r in rows):,} ops, "
        f"{statistics.median(r['wall_s'] / r['ops'] * 1e6 for r in rows):.1f} us per op median).",
        "",
        "## Points",
        "",
        "| what-if | point | tier 1 / tier 2 status | iteration t1 / t2 (s) | error | peak GPU t1 / t2 (GiB) | error "
        "| host/node t1 / t2 (GiB) | ops | detail | sim wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    g = float(1 << 30)
    for r in rows:
        ok = r["status_t1"] == "OK" and r["status_t2"] == "OK"
        it = f"{r['it_t1']:.2f} / {r['it_t2']:.2f}" if ok else "-"
        it_e = f"{_pct(r['it_t1'], r['it_t2']):+.2f} %" if ok else "-"
        pk_e = f"{_pct(r['peak_t1'], r['peak_t2']):+.2f} %" if ok else "-"
        lines.append(f"| {r['query']} | {r['point']} | {r['status_t1']} / {r['status_t2']} | {it} | {it_e} | "
                     f"{r['peak_t1'] / g:.2f} / {r['peak_t2'] / g:.2f} | {pk_e} | {r['host_t1'] / g:.0f} / "
                     f"{r['host_t2'] / g:.0f} | {r['ops']:,} | {r['detail']} | {r['wall_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-query", type=int, default=6, help="fitting points (best first) and failing points (closest to fitting first) simulated per what-if")
    ap.add_argument("--out", default=str(REPO / "reports" / "sppo-tiers.md"))
    a = ap.parse_args()
    if a.per_query < 1:
        ap.error(f"--per-query must be at least 1, got {a.per_query}")
    out = Path(a.out)
    if not out.parent.is_dir():
        ap.error(f"--out {a.out}: folder {out.parent} does not exist")
    start = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    load0 = uptime()
    t0 = time.perf_counter()
    rows = measure(a.per_query)
    head = ["# SPPO: tier 1 (analytic recurrence) against tier 2 (event simulation)", "",
            f"- Date: {start} (UTC); whole run {time.perf_counter() - t0:.0f} s",
            f"- Machine: {cpu_name()}, Python {sys.version.split()[0]}; code {git_state(REPO)}",
            f"- Command: `python benchmarks/sppo_tiers.py --per-query {a.per_query}`",
            f"- Load before: `{load0}`; after: `{uptime()}`"]
    head += [f"- Profile {name}: {load_profile(name).provenance_line()}"
             for name in sorted({prof for _m, _s, _g, prof in QUERIES})]
    text = report(rows, head)
    atomic_write_text(out, text)
    print(text)


if __name__ == "__main__":
    main()
