"""Where the what-if's SPPO child spends its time, part by part, in one process (issue #48): the
GPT-13B / 64 A800s / 1M-token query's SPPO search, its bounding pass split between the two
processes, and the SPPO vs MEMO verdict's SPPO simulation (build, engine, interrupts).

    python benchmarks/sppo_child_path.py            # this checkout
    PYTHONPATH=<other checkout> python benchmarks/sppo_child_path.py   # the same parts of another

Each measurement in a fresh interpreter (cold caches, as in a what-if), median of ``--runs``; tier 2's
garbage-collector thresholds. Parts a checkout does not have (the shared pass before it existed)
are reported as absent. Also the YAML data files' parse time with PyYAML's pure-Python safe loader
and with the loader memo reads them with.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import simpy
import yaml

from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.search.sppo import search_sppo, sppo_candidates
from memo_sim.search.whatif import GC_THRESHOLDS

MODEL, SEQ, GPUS, PROFILE = "gpt-13b", 1 << 20, 64, "a800-80gb"


PARTS = ("yaml", "search", "whole", "split", "child", "parent", "build", "engine")


def _part(name: str) -> str:
    """One measurement, in this (fresh) process: seconds, or ``absent``, and an optional note."""
    gc.set_threshold(*GC_THRESHOLDS)
    model, profile = get_model(MODEL), load_profile(PROFILE)
    if name == "yaml":
        root = Path(__file__).resolve().parents[1]
        texts = [p.read_text(encoding="utf-8") for p in sorted([*root.glob("memo_sim/frameworks/data/*.yaml"),
                                                                 *root.glob("hardware_profiles/*.yaml")])]
        pure = _timed(lambda: [yaml.load(x, Loader=yaml.SafeLoader) for x in texts])
        try:
            from memo_sim.fileio import load_yaml
        except ImportError:
            return f"{pure} absent {len(texts)}"
        return f"{pure} {_timed(lambda: [load_yaml(x) for x in texts])} {len(texts)}"
    if name == "search":
        return str(_timed(lambda: search_sppo(model, SEQ, GPUS, profile)))
    if name in ("whole", "split", "child", "parent"):
        try:
            from memo_sim.search.sppo.shared_bounds import split
        except ImportError:
            return "absent"
        seen = {}

        def grab(pricing):
            seen["p"] = pricing
            raise _Got()

        try:
            search_sppo(model, SEQ, GPUS, profile, bounds=grab)
        except _Got:
            pass
        pricing = seen["p"]
        if name == "split":
            return str(_timed(lambda: split(pricing)))
        child, parent = split(pricing)
        ix = {"whole": range(len(pricing.points)), "child": child, "parent": parent}[name]
        return f"{_timed(lambda: [pricing.price(i) for i in ix])} {len(ix)}"
    _s, cands, _r, _w = sppo_candidates(model, SEQ, GPUS, profile)
    best = next(c for c in cands if "exhaustive best" in c.sppo["roles"])
    from memo_sim.engine.core import Engine
    from memo_sim.engine.schedules.sppo import build_pipeline_iteration

    t = time.perf_counter()
    sched = build_pipeline_iteration(best.model, best.layout, best.batch, best.seq, best.policy, best.profile)
    built = time.perf_counter() - t
    if name == "build":
        return f"{built} {len(sched.graph.ops)} {best.layout.label()}_{best.policy.label().replace(' ', '')}"
    count = [0]
    orig = simpy.events.Process.interrupt

    def counted(self, cause=None):
        count[0] += 1
        return orig(self, cause)

    simpy.events.Process.interrupt = counted
    t = time.perf_counter()
    run = Engine(sched.graph, profile, keep_memory=False).run()
    return f"{time.perf_counter() - t} {count[0]} {run.end_time!r}"


class _Got(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        print(_part(args.part))
        return
    import memo_sim

    root = Path(memo_sim.__file__).resolve().parents[1]
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, {os.cpu_count()} cores, "
          f"load {', '.join(f'{x:.2f}' for x in os.getloadavg())}; code {root} ({rev}); command: "
          f"`python benchmarks/sppo_child_path.py --runs {args.runs}` (PYTHONPATH set to the checkout)")
    got = {}
    for name in PARTS:
        outs = [subprocess.run([sys.executable, __file__, "--part", name], capture_output=True, text=True,
                               check=True).stdout.split() for _ in range(args.runs)]
        got[name] = outs
    med = {k: (None if v[0][0] == "absent" else statistics.median(float(o[0]) for o in v)) for k, v in got.items()}
    y = got["yaml"][0]
    fast = "absent" if y[1] == "absent" else f"{1e3 * statistics.median(float(o[1]) for o in got['yaml']):.0f} ms"
    print(f"- YAML data files ({y[2]}): {1e3 * med['yaml']:.0f} ms with PyYAML's SafeLoader, with memo's loader {fast}")
    print(f"- SPPO's search in one process: {med['search']:.3f} s")
    if med["whole"] is None:
        print("- its bounding pass: not shared in this checkout")
    else:
        print(f"- its bounding pass: {med['whole']:.3f} s for all {got['whole'][0][1]} points; the split "
              f"{1e3 * med['split']:.0f} ms; the child's share {med['child']:.3f} s ({got['child'][0][1]} points), "
              f"the parent's {med['parent']:.3f} s ({got['parent'][0][1]} points), each alone")
    b, e = got["build"][0], got["engine"][0]
    print(f"- the verdict's SPPO candidate {b[2].replace('_', ' ')} ({int(b[1]):,} ops): build {med['build']:.3f} s, "
          f"engine {med['engine']:.3f} s, {int(e[1]):,} interrupts, iteration {e[2]} s")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
