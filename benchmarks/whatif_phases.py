"""Where one what-if's wall time goes, phase by phase: the CLI run in this process with timers wrapped
around the search's phases (SPPO's search where it runs here, each single-stage layout, the pipelines,
tier 2's bound search, the verdicts' extra simulations and the JSON answer), printed to stderr.

    python benchmarks/whatif_phases.py whatif --model gpt-175b --gpus 1024 --seq 256K \\
        --profile a100-sxm4-80gb --json --no-plan > /dev/null

Arguments are `memo-sim`'s. A phase run in a forked child (SPPO's search beside the rest) is not
timed here: the gap before the next phase says when this process waited for it.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memo_sim.cli.whatif as cli_whatif  # noqa: E402
import memo_sim.search.whatif as whatif  # noqa: E402

MARKS: list[tuple[str, float, float]] = []


def _wrap(module, name: str) -> None:
    fn = getattr(module, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            MARKS.append((name, start - T0, time.perf_counter() - start))

    setattr(module, name, timed)


def main() -> None:
    for name in ("candidates_for", "sppo_candidates", "_single_stage", "pipeline_candidates", "simulate_by_bound",
                 "_simulate_verdict_sides"):
        _wrap(whatif, name)
    _wrap(cli_whatif, "whatif_json")
    from memo_sim.cli import main as cli_main

    imported = time.perf_counter() - T0
    try:
        cli_main(sys.argv[1:])
    except SystemExit:
        pass
    phases: dict[str, list[float]] = {}
    for name, start, took in MARKS:
        p = phases.setdefault(name, [start, 0.0, 0])
        p[1] += took
        p[2] += 1
    print(f"imports {imported:.2f} s", file=sys.stderr)
    for name, (start, took, calls) in sorted(phases.items(), key=lambda kv: kv[1][0]):
        print(f"{name:26s} first at {start:6.2f} s, {took:6.2f} s in {calls} calls", file=sys.stderr)
    print(f"whole process {time.perf_counter() - T0:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
