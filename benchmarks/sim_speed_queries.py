"""The real what-if queries of issue #32, each run as a whole process (`python -m memo_sim.cli
whatif ... --json`), with the machine's load before and after, wall and CPU (user + sys of the
child) seconds; and one SPPO candidate at 1M tokens / 64 GPUs simulated in this process.

`benchmarks/sim_speed.py` runs these as its part 4 (``--only queries`` runs just them and
replaces that part of the report). Targets (issue #48, "Done when"; #32's in brackets): GPT-13B /
64 A800s / 1M tokens pruned (the default) in at most 2.5 s, with every fitting candidate
simulated in at most 4 s [3 s]; one SPPO candidate at 1M / 64 GPUs in at most 50 ms; GPT-175B /
1,024 A100s / 256K with pipelines, pruned, in at most 4 s [10 s] and the same best plan as the
exhaustive search (whose time is also reported).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

Q13 = ["--model", "gpt-13b", "--seq", "1M", "--gpus", "64", "--profile", "a800-80gb"]
Q175 = ["--model", "gpt-175b", "--seq", "256K", "--gpus", "1024", "--profile", "a100-sxm4-80gb"]
PIPELINES = ["--schedule", "single_stage", "--schedule", "1f1b", "--schedule", "interleaved_1f1b",
             "--schedule", "sppo"]
NO_PIPELINES = ["--schedule", "single_stage", "--schedule", "sppo"]
QUERIES = [
    # (label, flags, target seconds or None): issue #48's targets (#32's were 3 s exhaustive and 10 s with pipelines)
    ("GPT-13B, 64 A800s, 1M tokens, exhaustive (--simulate-top all)", Q13 + ["--simulate-top", "all"], 4.0),
    ("GPT-13B, 64 A800s, 1M tokens, exhaustive, single stage only (SPPO left out)",
     Q13 + ["--simulate-top", "all", "--schedule", "single_stage"], None),
    ("GPT-13B, 64 A800s, 1M tokens, pruned (default)", Q13, 2.5),
    # the default searches every schedule the framework runs, micro-batch pipelines included (#48 item 4), and
    # builds only the pipeline families whose proved bound reaches the best simulated plan; naming the schedules
    # (PIPELINES, as a run of a commit before that default asked for them) builds every family, as --pp does
    ("GPT-175B, 1,024 A100s, 256K tokens, without micro-batch pipelines, pruned", Q175 + NO_PIPELINES, None),
    ("GPT-175B, 1,024 A100s, 256K tokens, with pipelines, pruned (default: no --schedule)", Q175, 4.0),
    ("GPT-175B, 1,024 A100s, 256K tokens, every schedule named (--schedule x 4: every pipeline family built), "
     "pruned", Q175 + PIPELINES, None),
    ("GPT-175B, 1,024 A100s, 256K tokens, with pipelines, exhaustive", Q175 + PIPELINES + ["--simulate-top", "all"],
     None),
]
SPPO_TARGET_S = 0.050
PART4 = "## 4. Real queries, whole process (issue #32)"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_query(flags: list[str], timeout: float = 1800) -> dict:
    """One what-if as a whole process: wall, the child's user + sys seconds, the load around it,
    and from its JSON the best plan and tier 2's counts."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = _load()
    t0 = time.perf_counter()
    # its own process group, so that a timeout stops tier 2's pool workers too (not only the child)
    child = subprocess.Popen([sys.executable, "-m", "memo_sim.cli", "whatif", *flags, "--json", "--no-plan"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
        p = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    except subprocess.TimeoutExpired:  # a row that says so, not a lost report
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"wall": time.perf_counter() - t0, "cpu": float("nan"), "load_before": load0, "load_after": _load(),
                "tier2": None, "candidates": None, "best": f"timed out after {timeout:g} s", "best_iteration_s": None}
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 3):
        raise SystemExit(f"memo-sim whatif {' '.join(flags)} failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    best = next((c for c in out["candidates"] if c["status"] == "OK"), None)
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load_before": load0, "load_after": _load(), "tier2": out.get("tier2"),
            "candidates": len(out["candidates"]) + out.get("folded_duplicates", 0)
            + (out.get("candidates_left_out") or {}).get("count", 0),
            "best": None if best is None else f"{best['layout']} {best['policy']} ({best.get('schedule', '')})",
            "best_iteration_s": None if best is None else best.get("simulated_iteration_s")}


def one_sppo_candidate(repeat: int = 3) -> dict:
    """The best SPPO candidate of GPT-13B / 64 A800s / 1M tokens simulated in this process (after
    one warm-up run: its costs memoised), seconds of each run."""
    sys.path.insert(0, str(REPO))
    from memo_sim.model.config import get_model
    from memo_sim.profile import load_profile
    from memo_sim.engine.simulate import simulate
    from memo_sim.search.whatif import candidates_for

    model, profile = get_model("gpt-13b"), load_profile("a800-80gb")
    r = candidates_for(model, 1 << 20, 64, profile, policies=("sppo",))
    c = next(c for c in r.candidates if c.memory.status == "OK")
    walls, cpus, sim = _timed_runs(lambda: simulate(model, c.layout, c.batch, c.seq, c.policy, profile,
                                                    schedule=c.schedule, micro_batch=c.micro_batch,
                                                    keep_timeline=False), repeat)
    events = _engine_events(lambda: simulate(model, c.layout, c.batch, c.seq, c.policy, profile,
                                             schedule=c.schedule, micro_batch=c.micro_batch, keep_timeline=False))
    from simpy_floor import one_run  # benchmarks/simpy_floor.py: SimPy alone, in this process, this minute

    per_event = min(one_run(100_000) for _ in range(3))
    # the coarsest graph that still simulates SPPO's pipeline piece by piece: the same candidate with
    # the model cut to one layer per stage, so one unit per (stage, piece)
    coarse = dataclasses.replace(model, layers=c.layout.pp)
    coarse_walls, _, coarse_sim = _timed_runs(lambda: simulate(coarse, c.layout, c.batch, c.seq, c.policy, profile,
                                                               schedule=c.schedule, micro_batch=c.micro_batch,
                                                               keep_timeline=False), repeat)
    return {"label": f"{c.layout.label()} {c.policy.label()}", "walls": walls, "cpus": cpus,
            "ops": sim.n_ops, "events": events, "simpy_s_per_event": per_event, "load": _load(),
            "coarse_ops": coarse_sim.n_ops, "coarse_walls": coarse_walls}


def _timed_runs(run, repeat: int) -> tuple[list[float], list[float], object]:
    """Wall and CPU seconds of ``repeat`` runs of ``run()`` (and ``to_dict`` of what it returns, as
    tier 2 does: `memo_sim.search.whatif._simulate_summary`) after one warm-up run (its costs
    memoised), and the last result."""
    walls, cpus = [], []
    for _ in range(repeat + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        sim = run()
        sim.to_dict()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return walls[1:], cpus[1:], sim


def _engine_events(run) -> int:
    """SimPy events processed by ``run()`` (an untimed run: `simpy.Environment.step` counted)."""
    import simpy

    step, count = simpy.Environment.step, [0]

    def counted(env):
        count[0] += 1
        return step(env)

    simpy.Environment.step = counted
    try:
        run()
    finally:
        simpy.Environment.step = step
    return count[0]


QUERY_TIMEOUT_S = 1800.0


def run_all(timeout: float = QUERY_TIMEOUT_S) -> dict:
    """Every query of `QUERIES` (each stopped after ``timeout`` seconds, a row that says so) and the
    one SPPO candidate."""
    res = {"queries": [], "sppo": one_sppo_candidate()}
    for label, flags, target in QUERIES:
        r = run_query(flags, timeout)
        r.update(label=label, command="memo-sim whatif " + " ".join(flags), target=target)
        res["queries"].append(r)
        print(f"{label}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU, load {r['load_before']} -> {r['load_after']}",
              flush=True)
    return res


def _same_best(res: dict, a: str, b: str) -> str:
    q = {r["label"]: r for r in res["queries"]}
    if a not in q or b not in q:
        return "n/a"
    if q[a]["best_iteration_s"] is None and q[b]["best_iteration_s"] is None:
        return "n/a (" + "; ".join(str(q[x]["best"]) for x in (a, b)) + ")"
    timed_out = [x for x in (a, b) if str(q[x]["best"]).startswith("timed out")]
    if timed_out:
        return f"n/a ({timed_out[0]}: {q[timed_out[0]]['best']})"
    return "yes" if q[a]["best"] == q[b]["best"] and q[a]["best_iteration_s"] == q[b]["best_iteration_s"] else "**NO**"


def report_lines(res: dict) -> list[str]:
    """Part 4 of reports/sim-speed.md."""
    sp = res["sppo"]
    met = lambda ok: "met" if ok else "**NOT met**"  # noqa: E731
    lines = [PART4, "",
             "Each row: `python -m memo_sim.cli whatif FLAGS --json --no-plan` as a child process; wall seconds, "
             "the child's CPU seconds (user + sys: what the query costs whatever the load) and the load average "
             f"(1, 5, 15 min) before and after. Tier 2 runs in every core's process ({os.cpu_count()} here).", "",
             "| query | wall (s) | CPU (s) | target | tier 2: simulated / skipped by bound / fitting | best | load before "
             "-> after |", "|---|---|---|---|---|---|---|"]
    for r in res["queries"]:
        t = r["tier2"] or {}
        tgt = "" if r["target"] is None else f"<= {r['target']:g} s wall: {met(r['wall'] <= r['target'])}"
        lines.append(f"| {r['label']} | {r['wall']:.2f} | {r['cpu']:.2f} | {tgt} | {t.get('simulated')} / "
                     f"{t.get('skipped_by_bound')} / {t.get('fitting')} | {r['best']} | {r['load_before']} -> "
                     f"{r['load_after']} |")
    lines += ["",
              "- Pruned and exhaustive return the same best plan (same layout, policy, schedule and simulated "
              "iteration time): GPT-13B " + _same_best(res, QUERIES[2][0], QUERIES[0][0]) + "; GPT-175B (the default, "
              "with pipelines) " + _same_best(res, QUERIES[4][0], QUERIES[6][0]) + ", every schedule named "
              + _same_best(res, QUERIES[5][0], QUERIES[6][0]) + ".",
              f"- One SPPO candidate at 1M tokens / 64 GPUs ({sp['label']}, {sp['ops']:,} ops), simulated in this "
              f"process after a warm-up run: {', '.join(f'{w * 1e3:.0f}' for w in sp['walls'])} ms wall "
              f"({', '.join(f'{c * 1e3:.0f}' for c in sp['cpus'])} ms CPU) at load {sp['load']}; target "
              f"<= {SPPO_TARGET_S * 1e3:.0f} ms: {met(min(sp['walls']) <= SPPO_TARGET_S)}. The engine processed "
              f"{sp['events']:,} SimPy events ({sp['events'] / sp['ops']:.1f} per op); SimPy alone in this process "
              f"(`benchmarks/simpy_floor.py`'s loop, best of 3) costs {sp['simpy_s_per_event'] * 1e6:.2f} us per event, "
              f"so these events cost at least {sp['events'] * sp['simpy_s_per_event'] * 1e3:.0f} ms with no work "
              f"done, and one event per op {sp['ops'] * sp['simpy_s_per_event'] * 1e3:.0f} ms: the floor under any "
              f"event simulation of this graph in SimPy. The same candidate with the model cut to one layer per "
              f"stage (one unit per stage and piece, {sp['coarse_ops']:,} ops): "
              f"{', '.join(f'{w * 1e3:.0f}' for w in sp['coarse_walls'])} ms wall.",
              "", "Commands: " + "; ".join(f"`{r['command']}`" for r in res["queries"]), ""]
    return lines
