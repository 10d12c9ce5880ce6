"""This machine's single-core speed, alone and with both halves of a two-process run at once (CI prints it first,
`.ci/run`): seconds for a fixed pure-Python loop, so that test and benchmark times taken on different machines can be
read against each other. Two at once as fast as one alone: two whole cores; about twice as slow: one core's two
hardware threads (the two halves of CI would then share one core's throughput).

    python benchmarks/cpu_probe.py
"""

from __future__ import annotations

import multiprocessing
import time

LOOP = 10_000_000


def loop_seconds(_=None) -> float:
    """Seconds for `LOOP` iterations of an integer multiply-add in the interpreter."""
    t = time.perf_counter()
    s = 0
    for i in range(LOOP):
        s += i * i
    return time.perf_counter() - t


def main() -> None:
    alone = loop_seconds()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pair = pool.map(loop_seconds, range(2))
    print(f"ci: cpu probe ({LOOP:,} loop steps): {alone:.2f} s alone, {pair[0]:.2f} / {pair[1]:.2f} s two at once "
          f"({multiprocessing.cpu_count()} CPUs seen)")


if __name__ == "__main__":
    main()
