#!/usr/bin/env python
"""Host-side costs of a MoE layer on one GPU: how long the host takes to issue a kernel, what a
host synchronisation costs, and the routed experts run as a loop of per-expert GEMMs (memo-exec's
`memo_exec.moe.experts.run_experts`) against one grouped GEMM (``F.grouped_mm``) - each case
printed as one JSON line and all of them written to ``--out``/moe_host.json:

    python3 benchmarks/gpu/probe_moe_host.py --out "$OUT" [--budget 120]
    python3 benchmarks/gpu/probe_moe_host.py --dry-run --out DIR      # tiny shapes on the CPU (tests the script)

- launch: the host's interval per issued kernel, eager PyTorch: 4,000 ``add_`` on a 1 KiB tensor
  with no synchronisation inside the loop (the GPU finishes each long before the next arrives, so
  wall / count is the host's), without and with autograd recording (a chain of 1,000 multiplies
  of a leaf that requires grad, then its backward).
- sync: the round trip of ``tensor.tolist()`` on an idle device (what a dropless dispatcher pays
  per layer to learn its split sizes).
- experts: the routed experts' forward + backward (SwiGLU: FC1 to 2w, FC2 back to h), bf16, per
  shape, with uneven per-expert counts (one expert empty), memo-exec's two implementations
  (`memo_exec.moe.experts.run_experts`: ``loop``, per-expert GEMMs over one ``unbind`` of the
  stacked weights, and ``grouped``, ``F.grouped_mm``) and ``loop_select``, the loop as memo-exec ran
  it before 2026-11-26 (each expert's weights indexed from the stacked parameter, so autograd builds
  a full-size gradient per expert): each one's max relative difference from ``loop`` (output and
  every gradient), the eager wall time per forward + backward (host included: median of ``--reps``
  timed loops of 5 after warm-up), and the GPU's kernel time per forward + backward and the
  kernel count (torch.profiler's device time, one profiled forward + backward).

Nothing here feeds a profile by itself; reports/ says what each number was used for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from memo_exec.moe.experts import ffn  # noqa: E402
from probe_log import T0, emit, write_results  # noqa: E402 (this folder: the probes' record)
# (name, experts on the rank, mean rows per expert, hidden, expert width)
SHAPES = [
    ("qwen2-moe-a2.7b-8k", 60, 546, 2048, 1408),
    ("qwen3-30b-a3b-8k", 128, 512, 2048, 768),
    ("qwen3-235b-tp4-ep8", 16, 512, 4096, 1536),
    ("qwen3-235b-tp2-ep32", 4, 4096, 4096, 1536),
    ("mixtral-8x7b-8k", 8, 2048, 4096, 14336),
]
DRY_SHAPES = [("tiny", 4, 24, 64, 32)]


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def launch(dev) -> None:
    a = torch.zeros(256, device=dev)
    for _ in range(200):
        a.add_(1.0)
    sync(dev)
    n = 4000
    t = time.perf_counter()
    for _ in range(n):
        a.add_(1.0)
    host = time.perf_counter() - t
    sync(dev)
    wall = time.perf_counter() - t
    emit(case="launch", kind="add_ no grad", kernels=n, host_us_per_kernel=host / n * 1e6,
         wall_us_per_kernel=wall / n * 1e6)
    x = torch.ones(256, device=dev, requires_grad=True)
    for _ in range(2):
        y = x
        t = time.perf_counter()
        for _ in range(1000):
            y = y * 1.0001
        fwd = time.perf_counter() - t
        t = time.perf_counter()
        y.sum().backward()
        sync(dev)
        bwd = time.perf_counter() - t
        x.grad = None
    emit(case="launch", kind="mul chain with autograd", kernels=1000, fwd_host_us_per_op=fwd / 1000 * 1e6,
         bwd_wall_us_per_op=bwd / 1000 * 1e6)


def sync_cost(dev) -> None:
    c = torch.arange(64, device=dev)
    times = []
    for _ in range(50):
        sync(dev)
        t = time.perf_counter()
        c.tolist()
        times.append(time.perf_counter() - t)
    emit(case="sync", kind="tolist on an idle device", median_us=statistics.median(times[5:]) * 1e6)


def counts_for(E: int, m: int, seed: int = 0) -> list[int]:
    """Uneven counts around m per expert, one expert empty, the total E * m."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(E, generator=g) + 0.5
    w[E // 2] = 0.0
    c = (w / w.sum() * E * m).floor().long()
    c[0] += E * m - int(c.sum())
    return c.tolist()


class W:
    def __init__(self, E, h, w, dev, dtype):
        g = torch.Generator(device=dev).manual_seed(1)
        self.expert_w1 = (torch.randn(E, 2 * w, h, device=dev, generator=g) * 0.02).to(dtype).requires_grad_()
        self.expert_w2 = (torch.randn(E, h, w, device=dev, generator=g) * 0.02).to(dtype).requires_grad_()
        self.expert_b1 = self.expert_b2 = None

    def grads_none(self):
        self.expert_w1.grad = self.expert_w2.grad = None


def loop_select(xe, counts, wts):
    outs, off = [], 0
    for j, n in enumerate(counts):
        if n:
            outs.append(ffn(xe[off:off + n], wts.expert_w1[j], wts.expert_w2[j], None, None, True))
            off += n
    return torch.cat(outs, 0)


def experts(dev, dtype, shapes, reps: int, budget: float) -> None:
    from memo_exec.moe.experts import _GROUPED_MM, run_experts
    for name, E, m, h, w in shapes:
        if time.monotonic() - T0 > budget:
            emit(case="experts", shape=name, skipped="out of the budget")
            continue
        try:
            counts = counts_for(E, m)
            wts = W(E, h, w, dev, dtype)
            x = (torch.randn(sum(counts), h, device=dev) * 0.5).to(dtype).requires_grad_()
            gy = torch.randn(sum(counts), h, device=dev).to(dtype)
            impls = {"loop": lambda: run_experts(x, counts, wts, True, "loop"),
                     "loop_select": lambda: loop_select(x, counts, wts)}
            if _GROUPED_MM is not None:
                impls["grouped"] = lambda: run_experts(x, counts, wts, True, "grouped")
            out = {}
            for label, fn in impls.items():
                x.grad = None
                wts.grads_none()
                y = fn()
                y.backward(gy)
                out[label] = [y.detach().float(), x.grad.float(), wts.expert_w1.grad.float(), wts.expert_w2.grad.float()]
            rec = dict(case="experts", shape=name, experts=E, rows=sum(counts), hidden=h, width=w,
                       grouped_impl=getattr(_GROUPED_MM, "__name__", None))
            for label in out:
                if label != "loop":
                    rec[f"{label}_max_rel_diff"] = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                                                       for a, b in zip(out[label], out["loop"]))
            for label, fn in impls.items():
                def step():
                    x.grad = None
                    wts.grads_none()
                    fn().backward(gy)
                for _ in range(2):
                    step()
                sync(dev)
                walls = []
                for _ in range(reps):
                    t = time.perf_counter()
                    for _ in range(5):
                        step()
                    sync(dev)
                    walls.append((time.perf_counter() - t) / 5)
                rec[f"{label}_wall_ms"] = statistics.median(walls) * 1e3
                if dev.type == "cuda":
                    from torch.profiler import ProfilerActivity, profile
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        step()
                        sync(dev)
                    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                    rec[f"{label}_gpu_ms"] = sum(e.device_time for e in kern) / 1e3
                    rec[f"{label}_kernels"] = len(kern)
            emit(**rec)
            del wts, x, gy, out
        except Exception as e:  # a shape that fails is recorded, the probe goes on
            emit(case="experts", shape=name, error=f"{type(e).__name__}: {e}"[:500])
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; shapes past it are skipped")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.reps < 1 or a.budget <= 0:
        print(f"error: --reps ({a.reps}) must be at least 1 and --budget ({a.budget}) positive", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda")
    emit(case="env", torch=torch.__version__, device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
         cpus=os.cpu_count(), date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for fn in (launch, sync_cost):
        try:
            fn(dev)
        except Exception as e:
            emit(case=fn.__name__, error=f"{type(e).__name__}: {e}"[:500])
    experts(dev, torch.float32 if dev.type == "cpu" else torch.bfloat16, DRY_SHAPES if a.dry_run else SHAPES,
            a.reps, a.budget)
    write_results(a.out, "moe_host.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
