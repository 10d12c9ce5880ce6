#!/usr/bin/env python
"""Memory pressure on one GPU: the same store-all plan run by memo-exec with the caching allocator
capped (``torch.cuda.set_per_process_memory_fraction``) ever closer to the plan's peak, against
memo-sim's caching-allocator replay at the same capacity - step time, ``num_alloc_retries`` and
cudaMalloc / cudaFree counts, printed as JSON lines and written to ``--out``/allocator_pressure.json:

    python3 benchmarks/gpu/probe_allocator_pressure.py --out "$OUT" --profile PROFILE.yaml
    python3 benchmarks/gpu/probe_allocator_pressure.py --out DIR --profile P --device cpu   # tests the script

1. memo-sim whatif writes the plan (``--model``, ``--layers``, ``--seq``, one GPU, store all).
2. memo-exec runs it uncapped (``--steps``), in a fresh process: its peak reserved bytes ``R``.
3. For each factor f of ``--caps``, a fresh process caps the allocator at f x R (the fraction of the
   device's total memory that makes it so) and runs the plan again; memo-sim's replay is given the same
   capacity (the profile's GPU memory set to the cap plus its reserved bytes) and predicts the step
   and the allocator's counters (`memo_exec.validate.predict`, `predicted_allocator`).

What it answers: how much a step slows when the allocator must flush its cache and retry
(PyTorch's ``num_alloc_retries``) at a capacity this tight, and whether memo's replay, which prices
each reorganisation as a synchronisation, the cudaFrees and the cudaMallocs (`gpu.allocator`),
predicts the count and the cost. On the CPU (``--device cpu``) no cap applies: the runs are the
script's own test. Nothing here feeds a profile by itself; reports/ says what each number was used for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from probe_log import emit, write_results  # noqa: E402 (this folder: the probes' record)


def child(plan: str, fraction: float, out: str, steps: int, device: str, profile: str) -> None:
    """One memo-exec run in this process, the allocator capped first (CUDA only)."""
    import torch

    if device.startswith("cuda") and fraction < 1.0:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    from memo_exec.cli import main

    try:
        main(["run", plan, "--device", device, "--steps", str(steps), "--out", out, "--no-progress",
              "--profile", profile])
    except SystemExit as e:
        if e.code not in (0, None):
            raise


def run_capped(plan: Path, fraction: float, out: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", str(plan), "--fraction", repr(fraction), "--out", str(out),
           "--steps", str(args.steps), "--device", args.device, "--profile", args.profile]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout,
                       env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    try:
        meta = json.loads((out / "measured.json").read_text())["meta"]
    except (OSError, ValueError, KeyError):
        return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"}
    st = meta["steady_state"]
    alloc = meta.get("allocator") or {}
    return {"iteration_s": st["iteration_s"], "steps_averaged": st["steps_averaged"],
            "step_times_s": [round(s["iteration_s"], 4) for s in meta["steps"]],
            "peak_allocated_bytes": st.get("peak_allocated_bytes"),
            "peak_reserved_bytes": st.get("peak_reserved_bytes"),
            "allocator": alloc}


def capped_profile(profile, usable_bytes: float):
    from memo_sim.profile.schema import Quantity

    gpu = profile.gpu
    total = usable_bytes + float(gpu.reserved_bytes)
    return dataclasses.replace(profile, gpu=dataclasses.replace(
        gpu, memory_bytes=Quantity(total, f"probe_allocator_pressure: capped at {usable_bytes:.0f} usable bytes")))


def predicted(plan_path: Path, profile) -> dict:
    from memo_exec.validate import predicted_allocator
    from memo_sim.api import simulate
    from memo_sim.plan import read_plan

    plan = read_plan(plan_path)
    sim = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, profile,
                   schedule=plan.schedule, micro_batch=plan.micro_batch)
    alloc = predicted_allocator(sim, plan.model, plan.seq_tokens, plan.policy, profile, plan.layout)
    return {"status": getattr(sim, "status", None), "iteration_s": getattr(sim, "iteration_s", None),
            "peak_gpu_bytes": getattr(sim, "peak_gpu_bytes", None), "allocator": alloc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", required=True, help="a hardware profile name or file (memo-sim's and memo-exec's)")
    ap.add_argument("--model", default="gpt-7b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", default="32K")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--caps", default="1.2,1.05,1.02,1.005",
                    help="caps as factors of the uncapped run's peak reserved bytes (--of reserved) or peak "
                         "allocated bytes (--of allocated)")
    ap.add_argument("--of", choices=("reserved", "allocated"), default="reserved",
                    help="what --caps multiplies; with 'allocated' memo-sim's replay is capped at the same factor "
                         "of its own predicted peak allocated bytes (the same headroom), not at the same bytes")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--run-timeout", type=float, default=240)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.fraction, args.out, args.steps, args.device, args.profile)
        return 0
    out = Path(args.out)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"alloc-pressure-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    from memo_sim.profile.loader import load_profile

    profile = load_profile(args.profile)
    wf = [sys.executable, "-m", "memo_sim.cli", "whatif", "--model", args.model, "--layers", str(args.layers),
          "--seq", args.seq, "--gpus", "1", "--policy", "store_all", "--profile", args.profile, "--out",
          str(work / "plan"), "--jobs", "1"]
    if args.device == "cpu":  # the script's own test: a toy shape
        wf = [sys.executable, "-m", "memo_sim.cli", "whatif", "--layers", "2", "--hidden", "256", "--heads", "8",
              "--ffn", "1024", "--vocab", "1024", "--seq", "2K", "--gpus", "1", "--policy", "store_all",
              "--profile", args.profile, "--out", str(work / "plan"), "--jobs", "1"]
    p = subprocess.run(wf, capture_output=True, text=True, timeout=300, cwd=REPO)
    plan = work / "plan" / "plan.json"
    if not plan.exists():
        emit(case="plan", error=(p.stderr or p.stdout).strip()[-400:])
        return 1
    import torch

    total = torch.cuda.get_device_properties(0).total_memory if args.device.startswith("cuda") else None
    emit(case="env", torch=torch.__version__, device=torch.cuda.get_device_name(0) if total else "cpu",
         total_bytes=total, profile=profile.name, model=args.model, layers=args.layers, seq=args.seq,
         date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    base = run_capped(plan, 1.0, work / "run-uncapped", args)
    emit(case="run", cap="none", measured=base, predicted=predicted(plan, profile))
    ref = base.get("peak_reserved_bytes" if args.of == "reserved" else "peak_allocated_bytes")
    pred_ref = ((predicted(plan, profile)["allocator"].get("memory_stats") or {}).get("allocated_bytes.all.peak")
                if args.of == "allocated" else None)
    for f in [float(x) for x in args.caps.split(",") if x.strip()]:
        if not ref:
            break
        cap = f * ref
        fraction = min(1.0, cap / total) if total else 1.0
        meas = run_capped(plan, fraction, work / f"run-{f:g}", args)
        pred_cap = f * pred_ref if pred_ref else cap
        emit(case="run", cap=f, of=args.of, cap_bytes=cap, predicted_cap_bytes=pred_cap, fraction=fraction,
             measured=meas, predicted=predicted(plan, capped_profile(profile, pred_cap)))
    write_results(out, "allocator_pressure.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
