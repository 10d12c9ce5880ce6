"""How fast the SimPy engine simulates; writes reports/sim-speed.md.

1. One GPT-7B (32 layers) MEMO iteration at 1M tokens on 8 x A800 (tp=8, alpha from MEMO's
   solver), timeline kept: target under 2 s.
2. 200 what-if candidates (GPT-7B / GPT-13B, 128K-1M tokens, 8 and 16 GPUs, every layout and
   policy the what-if enumerates), no timelines: target under 2 minutes.

Usage: python benchmarks/sim_speed.py [--out reports/sim-speed.md] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_sim.engine import simulate  # noqa: E402
from memo_sim.search.whatif import simulate_candidates  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import get_model  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from memo_sim.profile import load_profile  # noqa: E402
from memo_sim.search.estimate import memo_alpha  # noqa: E402
from memo_sim.search.whatif import candidates_for  # noqa: E402
from memo_sim.units import fmt_count  # noqa: E402

K = 1024


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench_single(repeat: int) -> dict:
    profile = load_profile("a800-80gb")
    model, layout, seq = get_model("gpt-7b"), Layout(tp=8), 1024 * K
    alpha = memo_alpha(model, layout, 1, seq, profile).alpha
    times, r = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = simulate(model, layout, 1, seq, get_policy("memo", alpha), profile)
        times.append(time.perf_counter() - t0)
    return {"alpha": alpha, "times": times, "result": r}


def candidate_pool(n: int) -> list:
    profile = load_profile("a800-80gb")
    pools = []
    for name in ("gpt-7b", "gpt-13b"):
        for seq in (128 * K, 256 * K, 512 * K, 1024 * K):
            for gpus in (8, 16):
                pools.append(candidates_for(get_model(name), seq, gpus, profile).candidates)
    out, i = [], 0
    while len(out) < n and any(pools):
        p = pools[i % len(pools)]
        if p:
            out.append(p.pop(0))
        i += 1
    return out


def bench_candidates(n: int) -> dict:
    cands = candidate_pool(n)
    t0 = time.perf_counter()
    sims = simulate_candidates(cands)
    total = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for s in sims:
        statuses[s["status"]] = statuses.get(s["status"], 0) + 1
    walls = [s["sim_wall_s"] for s in sims]
    return {"n": len(cands), "total": total, "statuses": statuses, "walls": walls,
            "layouts": len({c.layout.label() for c in cands}), "seqs": sorted({c.seq for c in cands}),
            "models": sorted({c.model.name for c in cands})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "sim-speed.md"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=200)
    args = ap.parse_args()

    single = bench_single(args.repeat)
    cands = bench_candidates(args.candidates)
    r = single["result"]
    best, med = min(single["times"]), statistics.median(single["times"])
    cmd = "python benchmarks/sim_speed.py" + (f" --repeat {args.repeat}" if args.repeat != 5 else "")
    lines = [
        "# Simulator speed (memo_sim.engine)",
        "",
        f"- Date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- Machine: {cpu_name()}, {os.cpu_count()} CPU cores visible, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        f"- Command: `{cmd}`",
        "",
        "## 1. GPT-7B, 32 layers, 1M tokens, MEMO, 8 x A800 (tp=8), one representative GPU",
        "",
        f"- alpha = {single['alpha']:.4f} (MEMO's solver), status {r.status}, simulated iteration "
        f"{r.iteration_s:.2f} s, MFU {100 * r.mfu:.1f}%",
        f"- {r.n_ops} ops, {len(r.timeline.events)} timeline events, {len(r.timeline.memory)} memory samples",
        f"- wall time per simulation (timeline kept), {args.repeat} runs: best {best:.3f} s, median {med:.3f} s "
        f"(target < 2 s: {'met' if med < 2 else 'NOT met'})",
        "",
        f"## 2. {cands['n']} what-if candidates",
        "",
        f"- models {', '.join(cands['models'])}; sequences "
        f"{', '.join(fmt_count(s) for s in cands['seqs'])}; 8 and 16 GPUs; {cands['layouts']} distinct layouts; "
        f"all four policies",
        f"- statuses: {', '.join(f'{k} {v}' for k, v in sorted(cands['statuses'].items()))} "
        f"(OOM / OOHM runs stop at the failing allocation)",
        f"- total wall time {cands['total']:.2f} s (target < 120 s: {'met' if cands['total'] < 120 else 'NOT met'}); "
        f"per candidate median {statistics.median(cands['walls']) * 1e3:.1f} ms, "
        f"max {max(cands['walls']) * 1e3:.1f} ms",
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
