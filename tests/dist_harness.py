"""Run a function on N gloo processes on this CPU and collect what each rank returns.

``spawn(fn, world, *args)`` starts ``world`` fresh processes, joins them into a gloo process group
through a file rendezvous in a fresh temporary folder, calls ``fn(rank, world, *args)`` in each and
returns the list of results by rank (tensors are moved to the CPU; results must be picklable). A
rank that raises fails the call with that rank's traceback; a run past ``timeout`` s kills every
process and fails. ``fn`` must be importable (a module-level function of a test module or of this
package).

The processes come from multiprocessing's ``forkserver`` (where the platform has it, else
``spawn``): one server process per test session imports torch and the executor once
(``PRELOAD``) and forks every rank from that state. A spawned rank would import them again, about
2.4 s of CPU per rank (7-14 s of start-up for 4 ranks on the shared 2-core machine); a forked one
starts in about 0.1 s. The server runs no test code, so a rank starts as clean as a spawned one: it never
inherits the test process's state, only the modules' import-time state. (Its environment is the
one of the first spawn: the ranks' inputs go through the arguments, not the environment.)
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import traceback

import torch.multiprocessing as mp


def _to_bytes(obj) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _from_bytes(data: bytes):
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _entry(rank: int, world: int, init_file: str, timeout: float, q, fn, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        out = fn(rank, world, *args)
        q.put((rank, "ok", _to_bytes(out)))  # bytes: no shared-memory handle outlives this process
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# imported once by the fork server: torch, gloo and the executor with its TP flavours and schedules,
# and torch._dynamo, which the executor's first meta-device dry run (`memo_exec.runner.size_plan`,
# through torch._refs) would otherwise import in every rank (about 1 s of CPU each; it starts no thread)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "memo_exec.distributed.runner", "memo_exec.metp.flavour",
           "memo_exec.sppo.plugin", "tests.dist_cases"]


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (the first spawn)
        return ctx
    return mp.get_context("spawn")


def spawn(fn, world: int, *args, timeout: float = 120.0) -> list:
    ctx = _context()
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(r, world, init_file, timeout, q, fn, args), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        try:
            import time

            deadline = time.monotonic() + timeout + 30
            while len(results) + len(errors) < world:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{world} gloo ranks did not finish in {timeout + 30:.0f} s "
                                       f"(finished: {sorted(results)}, failed: {sorted(errors)})")
                try:
                    rank, status, payload = q.get(timeout=min(left, 1.0))
                except queue.Empty:
                    if errors or any(p.exitcode not in (None, 0) for p in procs):
                        if all(p.exitcode is not None for p in procs) or errors:
                            break
                    continue
                (results if status == "ok" else errors)[rank] = payload
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        rank = min(errors)
        raise AssertionError(f"rank {rank} of {world} failed:\n{errors[rank]}")
    if len(results) < world:
        missing = sorted(set(range(world)) - set(results))
        raise AssertionError(f"ranks {missing} of {world} died without a result "
                             f"(exit codes {[p.exitcode for p in procs]})")
    return [_from_bytes(results[r]) for r in range(world)]
