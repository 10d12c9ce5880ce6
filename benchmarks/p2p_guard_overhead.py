"""What the P2P transfer guard costs: one METP layer (ring FFN under MEMO's recompute, two-level
MHA with its inner K/V ring, forward and backward) and one SPPO stage step on two gloo ranks on
this CPU, the guard on and off (``MEMO_EXEC_RACE_CHECK=0``) in alternating repetitions of the same
processes, so that both see the same load.

    nice -n 19 python -m benchmarks.p2p_guard_overhead [--reps 9]

Prints the median seconds per repetition of each case and mode, the median time spent inside the
guard (its methods, the lane's declarations, the regions p2p builds for it), the machine's load
(`uptime`) and the git state. Run against an older tree (one without the switch) the "off" rows measure the same
code as the "on" rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

METP = {"h": 64, "heads": 4, "kv_heads": 4, "f": 256, "layers": 2, "B": 1, "s": 128, "swiglu": False, "seed": 11}


def _metp(rank: int, world: int) -> None:
    import torch

    from memo_exec.metp.lane import RingOptions
    from tests.test_metp_exec import _distributed, _params, _positions  # noqa: F401

    cfg = METP
    P = _params(cfg["h"], cfg["heads"], cfg["kv_heads"], cfg["f"], cfg["layers"], cfg["swiglu"], cfg["seed"])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg["B"], cfg["s"], cfg["h"], generator=g, dtype=torch.float64)
    target = torch.randn(cfg["B"], cfg["s"], cfg["h"], generator=g, dtype=torch.float64)
    _distributed(P, x, target, cfg, rank, world, "memo", True, "interleaved", RingOptions())


def _sppo(rank: int, world: int) -> None:
    import tests.test_sppo_exec as T

    T.run_case(rank, world, T._case(4, model=T.MODEL))


def _count_guard_time(spent: list) -> None:
    """Accumulate the seconds spent inside the P2P guard: its methods, the lane's declarations and
    the regions p2p builds for it (outermost calls only: they nest)."""
    from memo_exec import happens_before as hb
    from memo_exec.distributed import p2p
    from memo_exec.metp.lane import Lane

    depth = [0]

    def timed(f):
        def g(*a, **kw):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - t0
        return g

    for name in ("access", "posted", "waited", "finish"):
        setattr(hb.TransferGuard, name, timed(getattr(hb.TransferGuard, name)))
    Lane.use = timed(Lane.use)
    p2p._guarded = timed(p2p._guarded)


def _ranks(rank: int, world: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_default_dtype(torch.float64)
    spent = [0.0]
    _count_guard_time(spent)
    out: dict = {}
    for case, fn in (("metp layer", _metp), ("sppo stage step", _sppo)):
        fn(rank, world)  # warm-up
        for _ in range(reps):
            for mode in ("on", "off"):
                os.environ["MEMO_EXEC_RACE_CHECK"] = "1" if mode == "on" else "0"
                dist.barrier()
                spent[0] = 0.0
                t0 = time.perf_counter()
                fn(rank, world)
                out.setdefault((case, mode), []).append(time.perf_counter() - t0)
                out.setdefault((case, mode, "guard"), []).append(spent[0])
    os.environ.pop("MEMO_EXEC_RACE_CHECK", None)
    return out


def main() -> None:
    repo = str(Path(__file__).resolve().parents[1])
    if repo not in sys.path:  # run by path (`python benchmarks/p2p_guard_overhead.py`) as well as with -m
        sys.path.insert(0, repo)
    from benchmarks.machine import git_state, uptime
    from tests.dist_harness import spawn

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    before = uptime()
    res = spawn(_ranks, 2, args.reps, timeout=1800)
    print(f"load before: {before}\nload after:  {uptime()}\ngit: {git_state(Path(__file__).resolve().parents[1])}")
    for key, ts in res[0].items():
        if len(key) == 2:
            inside = statistics.median(res[0][key + ("guard",)])
            print(f"{key[0]:16s} guard {key[1]:3s}: median {statistics.median(ts):.4f} s  (min {min(ts):.4f}, "
                  f"max {max(ts):.4f}, {len(ts)} reps, rank 0); inside the guard {inside * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
