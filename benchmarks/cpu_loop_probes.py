"""The two CPU measurements behind reports/cpu-loop.md's "What moved" that are not the loop itself.

1. ``malloc``: the executor's math attention (s=1024, 8 heads of 32, fp32, one thread) timed in fresh
   processes, with and without `memo_exec.host_malloc.keep_freed_memory`, alternating: the first
   call of a fresh process and three later ones.
2. ``gloo``: a 512 KiB-per-rank all-gather between two gloo processes (file-store rendezvous), 200
   calls each way: back to back; after a stretch of GEMMs with no barrier; after the stretch with a
   barrier that lines the ranks up (median and p90 of rank 0's calls, ms).

Usage: python benchmarks/cpu_loop_probes.py [malloc|gloo|both] [--repeats N]
Prints one line per measurement; the machine, date and load head the output.
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


def _attention_child(keep: bool) -> None:
    import torch

    torch.set_num_threads(1)
    if keep:
        from memo_exec.host_malloc import keep_freed_memory
        keep_freed_memory()
    from memo_exec.calibrate.attention import AttnCase, _time_case, pick_backend
    from memo_exec.calibrate.microbench import Bench

    b = Bench(torch.device("cpu"), target_s=0.01, min_repeats=5, max_repeats=10)
    be = pick_backend("auto", b.device, torch.float32, 32)
    out = [_time_case(b, be, AttnCase(1024, 8, 32), torch.float32)[0].seconds * 1e3 for _ in range(4)]
    print(" ".join(f"{x:.2f}" for x in out))


def _gloo_child(rank: int, folder: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from memo_exec.distributed.collectives import all_gather_single
    from memo_exec.host_malloc import keep_freed_memory
    keep_freed_memory()
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    x = torch.randn(128 * 1024)
    out = torch.empty(2 * x.numel())
    a, b = torch.randn(1024, 256), torch.randn(256, 1024)
    res: dict[str, list[float]] = {"back to back": [], "after GEMMs": [], "after GEMMs and a barrier": []}
    for _ in range(5):
        all_gather_single(out, x)
    dist.barrier()
    for _ in range(200):
        t = time.perf_counter()
        all_gather_single(out, x)
        res["back to back"].append(time.perf_counter() - t)
    for i in range(400):
        for _ in range(4):
            a @ b
        mode = "after GEMMs and a barrier" if i % 2 else "after GEMMs"
        if i % 2:
            dist.barrier()
        t = time.perf_counter()
        all_gather_single(out, x)
        res[mode].append(time.perf_counter() - t)
    if rank == 0:
        for k, v in res.items():
            v = sorted(v)
            print(f"all-gather 512 KiB per rank, {k}: median {statistics.median(v) * 1e3:.2f} ms, "
                  f"p90 {v[int(0.9 * (len(v) - 1))] * 1e3:.2f} ms, mean {statistics.mean(v) * 1e3:.2f} ms")
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="both", choices=("malloc", "gloo", "both"))
    ap.add_argument("--repeats", type=int, default=4, help="fresh processes per malloc setting (alternating)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, arg = a.child.split(":", 1)
        if kind == "attention":
            _attention_child(arg == "keep")
        else:
            rank, folder = arg.split(":", 1)
            _gloo_child(int(rank), folder)
        return 0
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}, load {os.getloadavg()[0]:.2f}; "
          f"command: python benchmarks/cpu_loop_probes.py {a.what} --repeats {a.repeats}")
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    if a.what in ("malloc", "both"):
        for i in range(a.repeats):
            for keep in (True, False):
                r = subprocess.run(me + [f"attention:{'keep' if keep else 'default'}"], capture_output=True, text=True,
                                   check=True)
                print(f"math attention s=1024 8x32 fwd, fresh process {i + 1}, "
                      f"{'keep_freed_memory' if keep else 'glibc default'}: {r.stdout.strip()} ms (first call first)")
    if a.what in ("gloo", "both"):
        with tempfile.TemporaryDirectory(prefix="memo-probe-") as folder:
            procs = [subprocess.Popen(me + [f"gloo:{r}:{folder}"]) for r in (0, 1)]
            codes = [p.wait(600) for p in procs]
            if any(codes):
                print(f"gloo probe failed: exit codes {codes}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
