"""How fast the what-if and the simulator run; writes reports/sim-speed.md (issue #16).

Measures, in one run:

1. The analytic tier (tier 1): candidates estimated per second over a sweep of models, sequence
   lengths and GPU counts, every layout x policy the what-if enumerates, from cold caches; with
   and without SPPO's (SP, PP, N) search. Target: at least 2,000 candidates/s.
2. The event-simulated tier (tier 2): 10,000 candidates (the same sweep's candidates, fitting or
   not, taken round-robin) all simulated with ``jobs`` processes (default: every core); a serial
   run of the first ``--serial`` of them beside the same ones in parallel, whose summaries must be
   identical (all but the wall seconds each took). Target: 10,000 in at most 60 s wall.
3. ``memo-sim simulate`` as a whole process (interpreter start, imports, simulation, timeline,
   trace and figures written) for the GPT-7B / 1M MEMO plan and a GPT-175B plan. Target: the
   7B plan at most 0.8 s (issue #48; #32's was 1.5 s).

The machine's load (``uptime``) is recorded before and after each part: the 2-core machine is
shared, so a number measured under load says so.

Usage: python benchmarks/sim_speed.py [--out reports/sim-speed.md] [--candidates 10000]
       [--serial 1000] [--jobs N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name, git_state, uptime  # benchmarks/machine.py (this folder is on sys.path when run as a script)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_sim.cost.memo import clear_caches  # noqa: E402
from memo_sim.fileio import atomic_write_text  # noqa: E402
from memo_sim.model.config import get_model  # noqa: E402
from memo_sim.profile import load_profile  # noqa: E402
from memo_sim.search.whatif import candidates_for, default_jobs, simulate_candidates  # noqa: E402

from sim_speed_queries import PART4, QUERY_TIMEOUT_S, report_lines, run_all  # noqa: E402

K = 1024
PLAIN = ("store_all", "full_recompute", "full_offload", "memo")
MODELS = ("gpt-7b", "gpt-13b", "gpt-30b")
SEQS = (128 * K, 256 * K, 512 * K, 1024 * K)
GPUS = (8, 16, 32)
TARGET_10K_S, TARGET_ANALYTIC, TARGET_SIM_7B_S = 60.0, 2000.0, 0.8



def cold() -> None:
    """Empty the analytic tier's caches (memoised costs, traces, allocator replays): `memoised`'s and every
    module-level `functools.lru_cache` of a loaded memo_sim module, found by walking them (a list of names rotted
    when a cached function was renamed)."""
    clear_caches()
    for name, module in list(sys.modules.items()):
        if name == "memo_sim" or name.startswith("memo_sim."):
            for obj in list(vars(module).values()):
                if callable(getattr(obj, "cache_clear", None)) and getattr(obj, "__module__", None) == name:
                    obj.cache_clear()


def sweep(policies: tuple[str, ...] | None) -> tuple[list, float, float]:
    """(candidate lists, wall seconds, CPU seconds of this process)."""
    profile = load_profile("a800-80gb")
    pools, t0, c0 = [], time.perf_counter(), time.process_time()
    for name in MODELS:
        for seq in SEQS:
            for gpus in GPUS:
                pools.append(candidates_for(get_model(name), seq, gpus, profile, policies=policies).candidates)
    return pools, time.perf_counter() - t0, time.process_time() - c0


def bench_analytic() -> dict:
    cold()
    pools, wall, cpu = sweep(PLAIN)
    n = sum(len(p) for p in pools)
    _warm_pools, warm, _ = sweep(PLAIN)
    cold()
    sppo_pools, sppo_wall, sppo_cpu = sweep(None)
    return {"n": n, "wall": wall, "cpu": cpu, "rate": n / wall, "warm_rate": n / warm, "configs": len(pools),
            "sppo_n": sum(len(p) for p in sppo_pools), "sppo_wall": sppo_wall, "sppo_cpu": sppo_cpu,
            "pools": sppo_pools}


def round_robin(pools: list[list], n: int) -> list:
    pools = [list(p) for p in pools]
    out, i = [], 0
    while len(out) < n and any(pools):
        p = pools[i % len(pools)]
        if p:
            out.append(p.pop(0))
        i += 1
    return out


def strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "sim_wall_s"}


def _cold_sim() -> None:
    """Also forget the caching-allocator replays remembered by content."""
    from memo_sim.memplan import iteration_replay

    cold()
    iteration_replay.clear_replay_cache()
    iteration_replay.iteration_stream.cache_clear()


def bench_simulated(pools: list[list], n: int, n_serial: int, jobs: int) -> dict:
    """The ``n`` candidates in ``jobs`` processes first, forked from cold caches (the sweep's
    costs, traces and replays forgotten); then the first ``n_serial`` serially and again in
    ``jobs`` processes (each from cold caches), whose summaries must be identical."""
    cands = round_robin(pools, n)
    head = cands[:n_serial]
    _cold_sim()
    load_mid = os.getloadavg()
    t0 = time.perf_counter()
    par = simulate_candidates(cands, jobs=jobs)
    par_wall = time.perf_counter() - t0
    _cold_sim()
    t0, c0 = time.perf_counter(), time.process_time()
    serial = [dict(s) for s in simulate_candidates(head, jobs=1)]
    serial_wall, serial_cpu = time.perf_counter() - t0, time.process_time() - c0
    _cold_sim()
    t0 = time.perf_counter()
    par_head = simulate_candidates(head, jobs=jobs)
    par_head_wall = time.perf_counter() - t0
    same = all(strip(a) == strip(b) for a, b in zip(serial, par_head)) and len(par_head) == len(serial)
    statuses: dict[str, int] = {}
    for s in par:
        statuses[s["status"]] = statuses.get(s["status"], 0) + 1
    walls = sorted(s["sim_wall_s"] for s in par)
    return {"n": len(cands), "serial_n": len(head), "serial_wall": serial_wall, "serial_cpu": serial_cpu,
            "par_wall": par_wall, "par_head_wall": par_head_wall, "jobs": jobs,
            "identical": same, "statuses": statuses, "median_ms": 1e3 * statistics.median(walls),
            "p95_ms": 1e3 * walls[int(0.95 * (len(walls) - 1))], "sppo": sum(c.sppo is not None for c in cands),
            "load_mid": load_mid}


def bench_breakdown(pools: list[list], n: int, step: int = 25) -> dict:
    """Where a simulated candidate's CPU goes: every ``step``-th of the first ``n`` candidates,
    serial in this process, each from cold caches: the caching-allocator replay (policies without
    a static memory plan), then `simulate` as tier 2 runs it (the replay now remembered; identical
    layers simulated once where the iteration is periodic); then, from cold caches again, the same
    `simulate` with ``fold=False`` (the whole schedule), for the ratio; by outcome."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.memplan.iteration_replay import replay_iteration

    sample = round_robin(pools, n)[::step]
    rows: dict[str, list[float]] = {}  # outcome -> [count, replay, folded simulate, whole simulate]
    folded_layers = 0
    checked, differ = 0, []
    for c in sample:
        replays = c.sppo is None and not c.policy.static_memory_plan
        _cold_sim()
        t0 = time.process_time()
        if replays:
            replay_iteration(c.model, c.layout, c.batch, c.seq, c.policy, c.profile)
        t1 = time.process_time()
        r = simulate(c.model, c.layout, c.batch, c.seq, c.policy, c.profile, keep_timeline=False)
        t2 = time.process_time()
        _cold_sim()
        if replays:
            replay_iteration(c.model, c.layout, c.batch, c.seq, c.policy, c.profile)
        t3 = time.process_time()
        w = simulate(c.model, c.layout, c.batch, c.seq, c.policy, c.profile, keep_timeline=False, fold=False)
        t4 = time.process_time()
        if r.folded:
            checked += 1
            if not _same_summary(strip(r.to_dict()), strip(w.to_dict())):
                differ.append(f"{c.model.name} {c.seq // K}K {c.layout.label()} {c.policy.label()}")
        kind = "SPPO" if c.sppo is not None else ("folded" if r.folded else "whole")
        key = f"{kind}, {r.status}"
        row = rows.setdefault(key, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += t1 - t0
        row[2] += t2 - t1
        row[3] += t4 - t3
        folded_layers += r.folded
    return {"rows": rows, "step": step, "n": len(sample), "folded_layers": folded_layers, "checked": checked,
            "differ": differ}


def _same_summary(a, b) -> bool:
    """Equal summaries, floats within 1e-9 (relative)."""
    import math

    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_same_summary(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_summary(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _cli(args: list[str], cwd: Path, timeout: float = 300) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "memo_sim.cli", *args], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"memo-sim {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall


PLANS = {
    "GPT-7B, 1M tokens, 8 GPUs, MEMO (tp8+sp)": ["--model", "gpt-7b", "--seq", "1M", "--gpus", "8", "--tp", "8",
                                                "--tp-mode", "megatron", "--policy", "memo"],
    "GPT-175B, 256K tokens, 64 GPUs, MEMO (tp8+sp-cp8-z3)": ["--model", "gpt-175b", "--seq", "256K", "--gpus", "64",
                                                            "--tp", "8", "--cp", "8", "--zero", "3", "--tp-mode",
                                                            "megatron", "--policy", "memo"],
}


def bench_simulate_cmd(repeat: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (label, flags) in enumerate(PLANS.items()):
            d = Path(tmp) / f"p{k}"
            _cli(["whatif", *flags, "--simulate-top", "1", "--out", str(d), "--jobs", "1", "--no-progress"], Path(tmp))
            walls = [_cli(["simulate", str(d / "plan.json"), "--out", str(d / f"sim{r}")], Path(tmp))
                     for r in range(repeat)]
            events = len(__import__("json").loads((d / "sim0" / "timeline.json").read_text())["events"])
            out.append({"label": label, "walls": walls, "events": events,
                        "command": f"memo-sim whatif {' '.join(flags)} --out DIR; memo-sim simulate DIR/plan.json "
                                   f"--out DIR/sim"})
    return out


def _breakdown_lines(brk: dict) -> list[str]:
    rows = brk["rows"]
    tot = sum(r[1] + r[2] for r in rows.values())
    tot_whole = sum(r[1] + r[3] for r in rows.values())
    out = [f"- Where the CPU goes (every {brk['step']}th candidate, {brk['n']} in all, serial, each call from cold "
           f"caches, so dearer than inside the pool, where candidates of one shape share them; CPU ms per candidate "
           f"of that kind; \"folded\": identical layers simulated once, \"whole\": the fold stepped aside -- a "
           f"run that does not repeat layer after layer, a per-layer allocator stall, a failure whose instant ties with another stream's event -- and "
           f"SPPO has no fold): {1e3 * tot / brk['n']:.1f} ms per candidate on average, against "
           f"{1e3 * tot_whole / brk['n']:.1f} ms with every schedule simulated whole (`fold=False`, same sample, same "
           f"run: {tot_whole / tot:.2f}x).",
           "",
           "  | candidates | count | allocator replay | simulate (as tier 2) | simulate whole | share of the CPU |",
           "  |---|---|---|---|---|---|"]
    for key in sorted(rows):
        k, rep, fold, whole = rows[key]
        out.append(f"  | {key} | {k} | {1e3 * rep / k:.1f} | {1e3 * fold / k:.1f} | {1e3 * whole / k:.1f} | "
                   f"{100 * (rep + fold) / tot:.0f}% |")
    out.append("")
    out.append(f"- Folded against whole, same candidates: {brk['checked']} folded summaries compared with the whole "
               f"schedule's (every field, floats within 1e-9): "
               + ("all equal." if not brk["differ"] else f"**{len(brk['differ'])} differ**: {', '.join(brk['differ'][:5])}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "sim-speed.md"))
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--serial", type=int, default=1000, help="candidates simulated serially for the comparison")
    ap.add_argument("--jobs", type=int, default=None, help="processes for tier 2 (default: every core)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each memo-sim simulate")
    ap.add_argument("--only", choices=("queries",), default=None,
                    help="run only part 4 (the real queries of issue #32) and replace it in the report")
    ap.add_argument("--query-timeout", type=float, default=QUERY_TIMEOUT_S,
                    help="seconds after which a part-4 query is stopped (its row says so)")
    args = ap.parse_args()
    if args.only == "queries":
        return _queries_only(Path(args.out), args.query_timeout)
    jobs = args.jobs or default_jobs()

    started = dt.datetime.now(dt.timezone.utc)
    load0 = uptime()
    t_all = time.perf_counter()
    ana = bench_analytic()
    load1 = uptime()
    pools = ana.pop("pools")
    sim = bench_simulated(pools, args.candidates, min(args.serial, args.candidates), jobs)
    load2 = uptime()
    brk = bench_breakdown(pools, args.candidates)
    cmds = bench_simulate_cmd(args.repeat)
    load3 = uptime()
    total = time.perf_counter() - t_all

    cmd = "python benchmarks/sim_speed.py" + "".join(
        f" --{k} {v}" for k, v in (("candidates", args.candidates if args.candidates != 10_000 else None),
                                   ("serial", args.serial if args.serial != 1000 else None),
                                   ("jobs", args.jobs), ("repeat", args.repeat if args.repeat != 3 else None)) if v)
    ser_rate = sim["serial_n"] / sim["serial_wall"]  # the first --serial candidates (smaller models come first)
    par_rate = sim["n"] / sim["par_wall"]
    met = lambda ok: "met" if ok else "**NOT met**"  # noqa: E731
    seven = cmds[0]
    lines = [
        "# Simulator and what-if speed (issue #16)",
        "",
        f"- Date: {started.isoformat(timespec='seconds')} (UTC); whole benchmark {total:.0f} s",
        f"- Machine: {cpu_name()}, {os.cpu_count()} CPU cores visible ({default_jobs()} usable by this process), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        f"- Code: commit {git_state(REPO)}",
        f"- Command: `{cmd}`",
        "- Load (`uptime`; the machine is shared with other engineers, so the load is part of the result):",
        f"  - before: `{load0}`",
        f"  - after the analytic tier: `{load1}`",
        f"  - after the simulated tier: `{load2}`",
        f"  - after `memo-sim simulate`: `{load3}`",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| {args.candidates:,} candidates all simulated in <= {TARGET_10K_S:.0f} s wall | {sim['par_wall']:.1f} s "
        f"({jobs} processes) | {met(sim['par_wall'] <= TARGET_10K_S and sim['n'] >= 10_000)} |",
        f"| analytic tier >= {TARGET_ANALYTIC:,.0f} candidates/s | {ana['rate']:,.0f} candidates/s (cold caches) "
        f"| {met(ana['rate'] >= TARGET_ANALYTIC)} |",
        f"| `memo-sim simulate` of the 7B/1M MEMO plan <= {TARGET_SIM_7B_S} s, whole process | "
        f"{min(seven['walls']):.2f} s best, {statistics.median(seven['walls']):.2f} s median of {len(seven['walls'])} "
        f"| {met(statistics.median(seven['walls']) <= TARGET_SIM_7B_S)} (median) |",
        "",
        "## 1. Analytic tier (tier 1)",
        "",
        f"- Sweep: {', '.join(MODELS)} x {', '.join(f'{s // K}K' for s in SEQS)} tokens x {', '.join(map(str, GPUS))} "
        f"GPUs on a800-80gb = {ana['configs']} what-ifs; every valid layout (TP/SP, METP, CP, Ulysses, DP, ZeRO) "
        f"x {', '.join(PLAIN)} (MEMO at its solved alpha).",
        f"- {ana['n']:,} candidates in {ana['wall']:.2f} s wall from cold caches: **{ana['rate']:,.0f} candidates/s** "
        f"({ana['cpu']:.2f} s of CPU, {ana['n'] / ana['cpu']:,.0f} candidates per CPU second); the same sweep again "
        f"with warm caches: {ana['warm_rate']:,.0f} candidates/s.",
        f"- With SPPO's (SP, PP, N, partition, multiplex) search added (the default what-if): {ana['sppo_n']:,} "
        f"candidates in {ana['sppo_wall']:.2f} s ({ana['sppo_cpu']:.2f} s CPU), "
        f"{ana['sppo_n'] / ana['sppo_wall']:,.0f} candidates/s: the SPPO search solves many (SP, PP, N) points per "
        f"candidate it reports, and its own speed was not part of this work.",
        "",
        "## 2. Event-simulated tier (tier 2)",
        "",
        f"- {sim['n']:,} candidates taken round-robin from that sweep (with SPPO; {sim['sppo']} SPPO candidates), "
        f"fitting or not: statuses {', '.join(f'{k} {v}' for k, v in sorted(sim['statuses'].items()))} "
        f"(an OOM / OOHM run stops at the failing allocation).",
        f"- Parallel, {jobs} processes: **{sim['par_wall']:.1f} s wall** for all {sim['n']:,}, "
        f"{par_rate:.0f} candidates/s; per candidate (host seconds inside a worker) median {sim['median_ms']:.1f} ms, "
        f"95th percentile {sim['p95_ms']:.1f} ms.",
        f"- Serial, 1 process, the first {sim['serial_n']:,}: {sim['serial_wall']:.1f} s wall "
        f"({sim['serial_cpu']:.1f} s CPU, {1e3 * sim['serial_cpu'] / sim['serial_n']:.1f} ms CPU per candidate), "
        f"{ser_rate:.0f} candidates/s; the same {sim['serial_n']:,} in {jobs} processes: "
        f"{sim['par_head_wall']:.1f} s wall, {sim['serial_n'] / sim['par_head_wall']:.0f} candidates/s "
        f"(parallel / serial {sim['serial_wall'] / sim['par_head_wall']:.2f}x); load average when the 10,000-candidate "
        f"run started: {', '.join(f'{x:.2f}' for x in sim['load_mid'])}. Each of the three runs starts from cold "
        f"caches (memoised costs, traces and allocator replays forgotten; the pool's workers fork from that).",
        f"- Parallel and serial summaries of those {sim['serial_n']:,} identical (all fields but the wall seconds each "
        f"took), in the same order: {'yes' if sim['identical'] else '**NO**'}.",
        *_breakdown_lines(brk),
        "",
        "## 3. `memo-sim simulate`, whole process",
        "",
        "Interpreter start, imports, the simulation, timeline.json, trace.json, gantt.png, memory.png and "
        "summary.json; plan made by `memo-sim whatif` beforehand (not timed).",
        "",
        "| plan | events | wall (s), each run | best | median |",
        "|---|---|---|---|---|",
    ]
    for c in cmds:
        lines.append(f"| {c['label']} | {c['events']:,} | {', '.join(f'{w:.2f}' for w in c['walls'])} | "
                     f"{min(c['walls']):.2f} | {statistics.median(c['walls']):.2f} |")
    lines += ["", "Commands: " + "; ".join(f"`{c['command']}`" for c in cmds), ""]
    lines += report_lines(run_all())
    text = "\n".join(lines)
    atomic_write_text(Path(args.out), text)
    print(text)


def _queries_only(out: Path, timeout: float = QUERY_TIMEOUT_S) -> None:
    """Part 4 alone: the report's earlier parts kept as they are, part 4 replaced (or added)."""
    head = f"- Part 4 run: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} (UTC), code {git_state(REPO)}, " \
           f"`python benchmarks/sim_speed.py --only queries --query-timeout {timeout:g}`; load before: `{uptime()}`"
    res = run_all(timeout)
    part = "\n".join(report_lines(res)[:2] + [head, "", *report_lines(res)[2:]]) + f"\n- Load after: `{uptime()}`\n"
    old = out.read_text() if out.exists() else ""
    keep = old.split(PART4)[0].rstrip() if PART4 in old else old.rstrip()
    # the part's earlier runs kept below the new one: the run it replaces as a section of its own, then the
    # ### sections that were there (what each change did, when)
    history = ""
    if PART4 in old:
        body = old.split(PART4, 1)[1]
        last, _, rest = body.partition("\n### ")
        history = "\n### The run this one replaced\n" + last.rstrip() + "\n" + ("\n### " + rest if rest else "")
    text = (keep + "\n\n" if keep else "") + part + history
    atomic_write_text(out, text)
    print(text)


if __name__ == "__main__":
    main()
