#!/usr/bin/env python
"""GPU batch for a session that has an H100 or H200: measure the executor against the simulator.

An 8-layer GPT with h=4096 (32 heads, ffn 16384, vocab 50257) at 32K, 64K and 128K tokens runs
  - store_all (the executor refuses it with exit code 2 where it does not fit, which is recorded),
  - full_recompute,
  - memo at the simulator's alpha (memo_sim.search.estimate.memo_alpha for this GPU's profile),
  - memo at that alpha with a memory plan: the greedy placement of the executor's own layer trace.
For every configuration the script writes a plan.json whose ``predicted`` and ``layer_timings_s``
come from the simulator's analytic estimate (memo_sim.search.estimate, memo_sim.cost.memory), runs
``memo-exec run`` on it in a fresh process, and collects the measured-vs-predicted comparison.
Nothing is measured here that the executor did not measure; a failed run is recorded as failed.

    python benchmarks/exec_gpu_batch.py                  # on the GPU machine; results in $OUT
    python benchmarks/exec_gpu_batch.py --smoke --out D  # tiny sizes on CPU, same code path

Outputs under --out (default $OUT, else ./exec_gpu_batch_out): plans/*.json, runs/<name>/ (the
executor's measured.json, trace.json, report.md, figures), results.json and results.md.

Time: each run is a fresh process (about a minute at 128K tokens with 3 steps). Where one command
may run only 10 minutes, split the batch, e.g. ``--seqs 32768,65536`` then ``--seqs 131072``, each
with its own --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_sim.fileio import atomic_write_json, atomic_write_text  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.plan.schema import Plan, write_plan  # noqa: E402
from memo_sim.policy.policies import PolicyChoice  # noqa: E402


def detect_profile(device: str) -> str:
    if device.startswith("cuda"):
        import torch  # noqa: PLC0415

        name = torch.cuda.get_device_name(0).upper()
        if "H200" in name:
            return "h200-141gb"
        if "H100" in name:
            return "h100-sxm5-80gb"
        if "A800" in name:
            return "a800-80gb"
        if "A100" in name:
            return "a100-sxm4-80gb"
        raise SystemExit(f"no hardware profile for GPU {name!r}; pass --profile")
    return "h100-sxm5-80gb"


def build_plan(model: ModelConfig, seq: int, policy: PolicyChoice, profile_name: str, backend: str,
               chunk: int) -> Plan:
    from memo_sim.cost.memory import memory_breakdown  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415
    from memo_sim.search.estimate import estimate_iteration  # noqa: PLC0415

    prof = load_profile(profile_name)
    lay = Layout()
    est = estimate_iteration(model, lay, 1, seq, policy, prof, chunk)
    mem = memory_breakdown(model, lay, 1, seq, policy, prof, chunk)
    predicted = {"source": "analytic", "status": mem.status, "iteration_s": est.iteration_s, "mfu": est.mfu,
                 "tgs_tokens_per_gpu_s": est.tgs, "peak_gpu_bytes": mem.peak_gpu_bytes,
                 "peak_host_bytes_per_node": mem.host_bytes_per_node, "exposed_copy_s": est.exposed_copy_s}
    return Plan(model, 1, seq, 1, lay, policy, prof.name, predicted, est.layer.to_dict(),
                attention_backend=backend, classifier_chunk_tokens=chunk)


def simulator_alpha(model: ModelConfig, seq: int, profile_name: str) -> tuple[float | None, str]:
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415
    from memo_sim.search.estimate import memo_alpha  # noqa: PLC0415

    res = memo_alpha(model, Layout(), 1, seq, load_profile(profile_name))
    return (res.alpha if res.feasible else None), res.reason()


def run_one(plan_path: Path, out_dir: Path, args, isolate: bool) -> dict:
    argv = ["run", str(plan_path), "--device", args.device, "--steps", str(args.steps), "--out", str(out_dir)]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    t0 = time.time()
    if isolate:
        try:
            p = subprocess.run([sys.executable, "-m", "memo_exec.cli", *argv], capture_output=True, text=True,
                               timeout=args.timeout, cwd=REPO)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
                f"timed out after {args.timeout} s"
    else:
        import contextlib  # noqa: PLC0415
        import io  # noqa: PLC0415

        from memo_exec.cli import main  # noqa: PLC0415

        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            try:
                main(argv)
                rc = 0
            except SystemExit as e:
                rc = int(e.code or 0)
        out, err = so.getvalue(), se.getvalue()
    rec = {"rc": rc, "wall_s": time.time() - t0, "stdout_tail": out[-2000:], "stderr_tail": err[-2000:]}
    mj = out_dir / "measured.json"
    if rc == 0 and mj.exists():
        meta = json.loads(mj.read_text())["meta"]
        rec["steady_state"] = meta["steady_state"]
        rec["comparison"] = meta["comparison"]
        rec["device"] = meta["device"]
        rec["attention_backend"] = meta["attention_backend"]
        rec["pinned_host_bytes"] = meta.get("pinned_host_bytes")
        rec["losses"] = [s["loss"] for s in meta["steps"]]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "exec_gpu_batch_out"))
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (tests this script)")
    ap.add_argument("--seqs", default=None, help="comma-separated token counts (default 32768,65536,131072)")
    ap.add_argument("--policies", default="store_all,full_recompute,memo,memo+plan")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--profile", default=None, help="hardware profile for the predictions (default: by GPU name)")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--timeout", type=int, default=540, help="seconds per run")
    ap.add_argument("--isolate", choices=("yes", "no"), default=None,
                    help="one process per run (default yes; no with --smoke)")
    args = ap.parse_args()

    if args.smoke:
        model = ModelConfig("smoke-4l-64", 4, 64, 4, 256, vocab=256)
        seqs = [128, 256]
        args.device = args.device or "cpu"
        args.steps = min(args.steps, 2)
        chunk = 100
    else:
        model = ModelConfig("gpt-8l-4096", 8, 4096, 32, 16384)
        seqs = [32768, 65536, 131072]
        args.device = args.device or "cuda"
        chunk = 8192
    if args.seqs:
        seqs = [int(s) for s in args.seqs.split(",")]
    isolate = (args.isolate or ("no" if args.smoke else "yes")) == "yes"
    profile = args.profile or detect_profile(args.device)
    out = Path(args.out)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    results = []
    wanted = [p.strip() for p in args.policies.split(",") if p.strip()]
    for seq in seqs:
        alpha, why = simulator_alpha(model, seq, profile)
        if alpha is None and args.smoke:
            # tiny layers cannot hide any offload; the smoke run still exercises the MEMO path
            alpha, why = 0.5, f"smoke: simulator infeasible ({why}); alpha fixed at 0.5"
        for pol in wanted:
            name = f"{model.name}-{seq}-{pol.replace('+', '-')}"
            entry = {"name": name, "seq_tokens": seq, "policy": pol, "profile": profile}
            if pol.startswith("memo"):
                if alpha is None:
                    entry.update({"rc": None, "skipped": f"simulator finds no feasible alpha: {why}"})
                    results.append(entry)
                    continue
                choice = PolicyChoice("memo", alpha)
                entry["alpha"] = alpha
                entry["alpha_reason"] = why
            else:
                choice = PolicyChoice(pol)
            plan = build_plan(model, seq, choice, profile, args.backend, chunk)
            if pol == "memo+plan":
                from memo_exec.trace import memory_plan_from_trace, record_layer_trace  # noqa: PLC0415

                tr = record_layer_trace(plan, "meta", args.dtype if args.dtype else
                                        ("fp32" if args.device == "cpu" else None), None)
                plan.memory_plan = memory_plan_from_trace(tr)
                entry["arena_bytes"] = plan.memory_plan["arena_bytes"]
            entry["predicted"] = plan.predicted
            entry["layer_timings_s"] = plan.layer_timings_s
            pp = write_plan(plan, out / "plans" / f"{name}.json")
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            entry.update(run_one(pp, out / "runs" / name, args, isolate))
            st = entry.get("steady_state") or {}
            print(f"    rc={entry['rc']} iteration={st.get('iteration_s')} "
                  f"{(entry.get('stderr_tail') or '').strip().splitlines()[-1:] if entry['rc'] else ''}", flush=True)
            results.append(entry)
            atomic_write_json(out / "results.json", {"model": model.to_dict(), "device": args.device,
                                                      "profile": profile, "results": results})
    atomic_write_json(out / "results.json", {"model": model.to_dict(), "device": args.device, "profile": profile,
                                              "results": results})
    atomic_write_text(out / "results.md", render(results, model, profile, args.device))
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    return 0


def render(results: list[dict], model: ModelConfig, profile: str, device: str) -> str:
    lines = [f"# executor batch: {model.name} ({model.layers} layers, h={model.hidden}) on {device}, "
             f"predictions from profile {profile}\n",
             "| config | alpha | rc | measured iteration | predicted iteration | rel. error | measured fwd/layer | "
             "predicted fwd/layer | exposed copy | peak allocated (CPU: process RSS) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        st = r.get("steady_state") or {}
        cmp_ = {c["quantity"]: c for c in r.get("comparison") or []}
        it = cmp_.get("iteration time", {})
        fw = cmp_.get("layer forward", {})
        fmt = lambda v: "—" if v is None else f"{v:.4g}"  # noqa: E731
        rel = it.get("rel_error")
        note = r.get("skipped") or ((r.get("stderr_tail") or "").strip().splitlines() or [""])[-1][:80] \
            if r.get("rc") not in (0,) else ""
        rel_s = "—" if rel is None else f"{rel * 100:+.1f}%"
        peak = st.get("peak_allocated_bytes")
        peak_s = "—" if not peak else f"{peak / 2**30:.2f} GiB"
        lines.append(f"| {r['name']} | {fmt(r.get('alpha'))} | {r.get('rc')} {note} | {fmt(st.get('iteration_s'))} | "
                     f"{fmt(it.get('predicted'))} | {rel_s} | {fmt(fw.get('measured'))} | {fmt(fw.get('predicted'))} | "
                     f"{fmt(st.get('exposed_copy_s'))} | {peak_s} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
