"""A/B of the cold-cache write's cost (`memo_exec.calibrate.microbench.measure_cold_write`): the CPU speed probe's
sample (`memo_exec.speed_probe.SpeedProbe.sample`, four cold repeats) and one quick calibration GEMM measurement, with
the full write (twice the last-level cache sysfs reports) and with the measured one, alternating A and B.

    python benchmarks/cold_write_cost.py [--rounds 5]

Prints the medians and their ratio; the report goes to reports/cold-write-cost.md by hand (machine, date, load)."""

import argparse
import os
import statistics
import time

import torch

from memo_exec.calibrate.microbench import Bench, full_cold_write_bytes, measure_cold_write
from memo_exec.speed_probe import SpeedProbe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cold = measure_cold_write()
    took = time.perf_counter() - t0
    full, measured = full_cold_write_bytes(), cold["bytes"]
    print(f"load {os.getloadavg()[0]:.2f}; full write {full / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB "
          f"(measuring took {took:.1f} s): {cold['probe_ms']}")
    probes = {"full": SpeedProbe(flush_bytes=full), "measured": SpeedProbe(flush_bytes=measured)}
    benches = {"full": Bench(torch.device("cpu"), target_s=0.01, min_repeats=5, max_repeats=10, flush_bytes=full),
               "measured": Bench(torch.device("cpu"), target_s=0.01, min_repeats=5, max_repeats=10,
                                 flush_bytes=measured)}
    a, b = torch.randn(256, 64), torch.randn(64, 64)
    sample_s = {k: [] for k in probes}
    gemm_wall = {k: [] for k in probes}
    gemm_time = {k: [] for k in probes}
    for _ in range(args.rounds):
        for k in ("full", "measured"):
            t = time.perf_counter()
            probes[k].sample()
            sample_s[k].append(time.perf_counter() - t)
            t = time.perf_counter()
            tm = benches[k].time(lambda: a @ b)
            gemm_wall[k].append(time.perf_counter() - t)
            gemm_time[k].append(tm.median_s)
    for k in ("full", "measured"):
        print(f"{k:>8}: speed-probe sample {statistics.median(sample_s[k]):.3f} s, reference GEMM "
              f"{probes[k].summary()['median_gflops']} GFLOP/s; a 256x64 @ 64x64 GEMM measurement "
              f"{statistics.median(gemm_wall[k]):.3f} s wall, timed {statistics.median(gemm_time[k]) * 1e3:.3f} ms")
    print(f"ratio full / measured: speed-probe sample "
          f"{statistics.median(sample_s['full']) / statistics.median(sample_s['measured']):.2f}x, GEMM measurement "
          f"{statistics.median(gemm_wall['full']) / statistics.median(gemm_wall['measured']):.2f}x")


if __name__ == "__main__":
    main()
