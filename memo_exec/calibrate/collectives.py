"""Point-to-point and collective timings over torch.distributed: NCCL across the visible GPUs,
gloo between processes on CPU.

One process per rank is started (``python -m memo_exec.calibrate.collectives``, so nothing
depends on how the parent was started; file-store rendezvous in a temporary folder, no network
port). For each size ``n`` (bytes of one rank's buffer), ranks 0 and 1 ping-pong a buffer
(one-way time = round trip / 2), then every rank runs each collective the executor issues, on the
flat tensors it uses (`memo_exec.distributed.collectives`): an all-gather of ``n`` bytes per rank
(``world·n`` out), a reduce-scatter of ``world·n`` bytes in, an all-reduce and an all-to-all of
``n`` bytes. Rank 0 writes the timings as JSON. The parent waits at most ``timeout_s`` and stops
the processes it started if they overrun.

The link's bandwidth and latency come from the one-way times (`fit.fit_copy_model`): that is
the simulator's per-direction ``bandwidth`` and per-step ``latency`` of `memo_sim.cost.collectives`.
Each collective gets its own fit too (``fits``: a line over its times at the large sizes against
the formula's size, turned into that formula's parameters by `memo_sim.api.collective_fit_params`),
which the profile keeps as the link's ``collectives``: a library's all-gather or reduce-scatter
is not a chain of ping-pongs (gloo's reduce-scatter takes several times its all-gather).

**gloo: collectives as a CPU run issues them.** Back to back, a gloo collective finds its transport
threads hot and its ranks in step; in a CPU run it comes between two kernels, each rank arriving when
its own kernels end. The all-gather, reduce-scatter, all-reduce and all-to-all times the fits use are
therefore `_between_kernels`: one call at a time after a stretch of GEMMs on every rank, no barrier
before it, the mean of `BETWEEN_KERNELS_CALLS` calls (the back-to-back blocks stay in the raw rows as
``*_back_to_back``). On the 2-core AMD EPYC VM (2026-11-26, 512 KiB per rank, two ranks, 200 calls,
`python benchmarks/cpu_loop_probes.py gloo`) an all-gather took a median 0.58 ms back to back, 3.41 ms
after a stretch of GEMMs (p90 6.78 ms) and 0.94 ms when a barrier lined the ranks up first; a tp 2 run's 40 TP collectives of that size took 114 ms a
step (2.9 ms each on average). The send/recv ping-pong (the link's bandwidth and latency, P2P
transfers that overlap compute in rings and pipelines) stays back to back; NCCL keeps every
collective back to back (its kernels queue on the GPU, no host core is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

from memo_exec.calibrate.fit import fit_copy_model, fit_latency_bandwidth
from memo_exec.calibrate.microbench import Progress
from memo_exec.distributed.collectives import all_gather_single, reduce_scatter_single

# each collective's time column and the formula's size (`memo_sim.cost.collectives`) for a buffer of n
# bytes per rank over ``world`` ranks: what an all-gather ends with, a reduce-scatter starts with
COLUMNS = {"all_gather": ("allgather_s", lambda n, world: world * n),
           "reduce_scatter": ("reducescatter_s", lambda n, world: world * n),
           "all_reduce": ("allreduce_s", lambda n, world: n),
           "all_to_all": ("alltoall_s", lambda n, world: n)}


def _worker(rank: int, world: int, backend: str, folder: str, sizes: list[int], target_s: float) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    err_path = Path(folder) / f"rank{rank}.err"
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            dev = torch.device("cuda", rank)
        else:
            torch.set_num_threads(1)
            dev = torch.device("cpu")

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        store = dist.FileStore(str(Path(folder) / "store"), world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
        rows = []
        for n in sizes:
            buf = torch.ones(max(1, n // 4), dtype=torch.float32, device=dev)
            nbytes = buf.numel() * 4

            def pingpong(iters):
                for _ in range(iters):
                    if rank == 0:
                        dist.send(buf, 1)
                        dist.recv(buf, 1)
                    elif rank == 1:
                        dist.recv(buf, 0)
                        dist.send(buf, 0)
                sync()

            whole = torch.empty(world * buf.numel(), dtype=buf.dtype, device=dev)
            other = torch.empty_like(buf)

            def looped(call):
                def run(iters):
                    for _ in range(iters):
                        call()
                    sync()
                return run

            row = {"bytes": nbytes}
            for name, fn, per in (
                    ("sendrecv_s", pingpong, 2),
                    ("allreduce_s", looped(lambda: dist.all_reduce(buf)), 1),
                    ("allgather_s", looped(lambda: all_gather_single(whole, buf)), 1),
                    ("reducescatter_s", looped(lambda: reduce_scatter_single(other, whole)), 1),
                    ("alltoall_s", looped(lambda: dist.all_to_all_single(other, buf)), 1)):
                fn(2)  # warm-up: communicators, buffers
                dist.barrier()
                t0 = time.perf_counter()
                fn(1)
                probe = time.perf_counter() - t0
                # all ranks must agree on the count: rank 0 decides
                it = torch.tensor([max(3, min(50, int(target_s / max(probe, 1e-6))))], dtype=torch.int64,
                                  device=dev)
                dist.broadcast(it, 0)
                iters = int(it.item())
                blocks = []  # the median of BLOCKS timed blocks: one block is at the mercy of a scheduler hiccup
                for _ in range(BLOCKS):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    fn(iters)
                    blocks.append((time.perf_counter() - t0) / (iters * per))
                row[name] = statistics.median(blocks)
                if backend == "gloo" and name != "sendrecv_s":  # as a CPU run issues it (module docs)
                    row[name + "_back_to_back"] = row[name]
                    row[name] = _between_kernels(fn, sync)
            rows.append(row)
        if rank == 0:
            out = {"backend": backend, "world": world, "rows": rows}
            tmp = Path(folder) / "result.json.tmp"
            tmp.write_text(json.dumps(out))
            os.replace(tmp, Path(folder) / "result.json")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent through a file
        err_path.write_text(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}\n"
                            + traceback.format_exc())
        raise


def run_collectives(backend: str, world: int, sizes: list[int], progress: Progress, timeout_s: float = 240.0,
                    target_s: float = 0.05) -> dict:
    """Start ``world`` ranks; return ``{"measured": True, rows, bandwidth, latency, ...}`` or
    ``{"measured": False, "reason": ...}``."""
    progress.stage(f"collectives: {backend} over {world} processes", len(sizes))
    with tempfile.TemporaryDirectory(prefix="memo-calib-coll-") as folder:
        procs = []
        for r in range(world):
            cmd = [sys.executable, "-m", "memo_exec.calibrate.collectives", "--rank", str(r), "--world", str(world),
                   "--backend", backend, "--folder", folder, "--target-s", str(target_s),
                   "--sizes", ",".join(str(n) for n in sizes)]
            with open(Path(folder) / f"rank{r}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        overran = []
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                overran.append(p)
        for p in overran:  # only the processes started here
            p.kill()
            p.wait(10)
        if overran:
            return {"measured": False, "reason": f"{backend} benchmark did not finish within {timeout_s:.0f} s"}
        result = Path(folder) / "result.json"
        errs = sorted(Path(folder).glob("rank*.err"))
        if errs or not result.exists():
            if errs:
                first = errs[0].read_text().splitlines()[0]
            else:
                logs = [(Path(folder) / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
                        for r in range(world)]
                last = next((lg[-1] for lg in logs if lg), "")
                first = f"exit codes {[p.returncode for p in procs]}, no result ({last[:200]})"
            return {"measured": False, "reason": f"{backend} benchmark failed: {first}"}
        data = json.loads(result.read_text())
    rows = data["rows"]
    for r in rows:
        g = world
        busbw = 2 * (g - 1) / g * r["bytes"] / r["allreduce_s"] if g > 1 else 0.0
        r["sendrecv_bytes_per_s"] = r["bytes"] / r["sendrecv_s"]
        r["allreduce_busbw_bytes_per_s"] = busbw
        progress.step(f"{r['bytes'] / 2**20:.3f} MiB per rank: send/recv {r['sendrecv_bytes_per_s'] / 1e9:.2f} GB/s "
                      f"({r['sendrecv_s'] * 1e6:.1f} us), all-reduce bus {busbw / 1e9:.2f} GB/s, all-gather "
                      f"{r['allgather_s'] * 1e6:.1f} us, reduce-scatter {r['reducescatter_s'] * 1e6:.1f} us, "
                      f"all-to-all {r['alltoall_s'] * 1e6:.1f} us")
    bw, lat = fit_copy_model([r["bytes"] for r in rows], [r["sendrecv_s"] for r in rows])
    return {"measured": True, "backend": backend, "world": world, "rows": rows, "bandwidth": bw, "latency": lat,
            "fits": collective_fits(rows, world)}


BLOCKS = 5  # timed blocks per size and collective (rank 0's median)
BETWEEN_KERNELS_CALLS = 40  # gloo: collectives timed one at a time between stretches of compute (rank 0's mean)
STRETCH_GEMMS = 8  # a stretch: fp32 GEMMs of 256 x 256 x 1024 (about 1.5 ms on one core of the 2-core VM)


def _between_kernels(fn, sync) -> float:
    """Mean seconds of one call of ``fn`` issued as a CPU run issues a collective: after a stretch of
    compute on every rank, no barrier before it (a rank that finishes its stretch first waits for the
    other inside the call, as in a run), `BETWEEN_KERNELS_CALLS` calls. The mean, not the median: a step
    pays the sum of its collectives, and their times have a long tail on a shared CPU."""
    import torch  # noqa: PLC0415

    a, b = torch.randn(256, 256), torch.randn(256, 1024)
    total = 0.0
    for _ in range(BETWEEN_KERNELS_CALLS):
        for _ in range(STRETCH_GEMMS):
            a @ b
        sync()
        t0 = time.perf_counter()
        fn(1)
        total += time.perf_counter() - t0
    return total / BETWEEN_KERNELS_CALLS
FIT_FROM = 256 * 2**10  # bytes per rank: the sizes a collective's line is fitted over (the two largest if fewer)


def collective_fits(rows: list[dict], world: int) -> dict[str, dict[str, float]]:
    """Each collective's (bandwidth, latency) for `memo_sim.cost.collectives`'s formula: a line
    ``t = intercept + size / bandwidth`` through its times at the sizes from `FIT_FROM` per rank on
    (`fit.fit_latency_bandwidth`; slope and intercept both from them: a library's small-message path
    differs from its large one, and the large ones are what a layer's collectives move), then
    `memo_sim.api.collective_fit_params`."""
    from memo_sim.api import collective_fit_params  # noqa: PLC0415  (the ranks' processes need none of the simulator)

    out = {}
    for kind, (col, size) in COLUMNS.items():
        pts = sorted((r["bytes"], size(r["bytes"], world), r[col]) for r in rows if r.get(col))
        if len(pts) < 2 or world < 2:
            continue
        large = [p for p in pts if p[0] >= FIT_FROM]
        if len(large) < 2:
            large = pts[-2:]
        bw_line, intercept = fit_latency_bandwidth([p[1] for p in large], [p[2] for p in large])
        bw, lat = collective_fit_params(kind, world, intercept, 1.0 / bw_line)
        out[kind] = {"bandwidth": bw, "latency": lat}
    return out


def _main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of memo-exec calibrate's collective benchmark")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--target-s", type=float, default=0.05)
    a = ap.parse_args(argv)
    _worker(a.rank, a.world, a.backend, a.folder, [int(x) for x in a.sizes.split(",")], a.target_s)


if __name__ == "__main__":
    _main()
