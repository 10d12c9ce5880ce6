"""SimPy's own cost per event, with nothing else in the loop: the floor under any exact event
simulation in this project (issue #32's SPPO target is read against it in reports/sim-speed.md).

Eight processes, each yielding ``events / 8`` timeouts; CPU seconds of ``env.run()`` per event,
``repeat`` times. Prints one line per run and the machine, date, load and command.

Usage: python benchmarks/simpy_floor.py [--events 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time

import simpy

from machine import cpu_name, uptime  # benchmarks/machine.py (this folder is on sys.path when run as a script)

PROCESSES = 8


def _ticker(env: simpy.Environment, n: int, step: float):
    for _ in range(n):
        yield env.timeout(step)


def one_run(events: int) -> float:
    """CPU seconds per event of one run of ``events`` bare timeouts."""
    env = simpy.Environment()
    for p in range(PROCESSES):
        env.process(_ticker(env, events // PROCESSES, 1.0 + 0.01 * p))
    c0 = time.process_time()
    env.run()
    return (time.process_time() - c0) / (PROCESSES * (events // PROCESSES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}; {cpu_name()}; "
          f"simpy {simpy.__version__}; python {sys.version.split()[0]}; {uptime()}")
    print(f"command: python benchmarks/simpy_floor.py --events {a.events} --repeat {a.repeat}")
    for _ in range(a.repeat):
        per = one_run(a.events)
        print(f"{a.events:,} bare SimPy timeouts in {PROCESSES} processes: {per * a.events * 1e3:.0f} ms CPU, "
              f"{per * 1e6:.2f} us/event")


if __name__ == "__main__":
    main()
