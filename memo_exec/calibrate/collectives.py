"""Point-to-point and all-reduce timings over torch.distributed: NCCL across the visible GPUs, gloo
between processes on CPU.

One process per rank is started (``python -m memo_exec.calibrate.collectives``, so nothing
depends on how the parent was started; file-store rendezvous in a temporary folder, no network
port). For each size, ranks 0 and 1 ping-pong a buffer (one-way time =
round trip / 2) and then every rank all-reduces it. Rank 0 writes the timings as JSON. The
parent waits at most ``timeout_s`` and stops the processes it started if they overrun.

The link's bandwidth and latency come from the one-way times (`fit.fit_copy_model`): that is
the simulator's per-direction ``bandwidth`` and per-step ``latency`` of `memo_sim.cost.collectives`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

from memo_exec.calibrate.fit import fit_copy_model
from memo_exec.calibrate.microbench import Progress


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

            def allreduce(iters):
                for _ in range(iters):
                    dist.all_reduce(buf)
                sync()

            row = {"bytes": nbytes}
            for name, fn, per in (("sendrecv_s", pingpong, 2), ("allreduce_s", allreduce, 1)):
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
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                fn(iters)
                row[name] = (time.perf_counter() - t0) / (iters * per)
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
        progress.step(f"{r['bytes'] / 2**20:.3f} MiB: send/recv {r['sendrecv_bytes_per_s'] / 1e9:.2f} GB/s "
                      f"({r['sendrecv_s'] * 1e6:.1f} us), all-reduce bus {busbw / 1e9:.2f} GB/s")
    bw, lat = fit_copy_model([r["bytes"] for r in rows], [r["sendrecv_s"] for r in rows])
    return {"measured": True, "backend": backend, "world": world, "rows": rows, "bandwidth": bw, "latency": lat}


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
