#!/usr/bin/env python
"""GPU batch for a session with an H100 or H200, in ONE command of at most 10 minutes:
measure the executor against the simulator.

An 8-layer GPT with h=4096 (32 heads, ffn 16384, vocab 50257, bf16) at 32K, 64K and 128K tokens:
  - store_all, where the simulator predicts it fits (any configuration predicted OOM is recorded
    as skipped, not run),
  - full_recompute,
  - memo at the simulator's alpha (`memo_sim.api.memo_alpha` on this GPU's profile), with the
    executor's own memory plan (its layer trace, recorded on the meta device for CUDA, placed by
    the greedy DSA heuristic).
Every configuration gets a plan.json whose ``predicted`` and ``layer_timings_s`` are the
simulator's (`memo_sim.api.simulate`), then ``memo-exec run --json`` in a fresh process, whose
measured-vs-predicted rows (totals, per stream, per layer and op, memory terms) are collected.
Nothing is measured here that the executor did not measure; a failed or timed-out run is recorded.

Time: everything runs under one budget (``--budget``, default 540 s, inside the 600 s command
limit). Runs go shortest first; each gets a timeout from what is left of the budget, shared in
proportion to the runs' predicted cost (start-up plus steps x predicted iteration), so the
timeouts always add up to the budget; runs that no longer fit are recorded as skipped.

Files: the work happens in a scratch folder (``--scratch``, default a new temporary folder,
removed afterwards). The output folder (``--out``, default $OUT) receives three files:
results.json, results.md and runs.tar.gz (plans, every run's report.md, measured.json, trace.json,
figures and logs).

Dependencies: the GPU machine has torch, click, pyyaml, numpy and matplotlib but not simpy, mip
or highspy. The simulator needs simpy (mip and highspy are not used here); carry it as a wheel:
``pip download simpy --only-binary :all: -d wheels/`` here, then on the GPU machine
``pip install --no-index wheels/*.whl`` before running. Without simpy the script stops at once
with a one-line message (exit 2). memo itself need not be installed: the repository is put on
PYTHONPATH.

    python benchmarks/exec_gpu_batch.py                  # on the GPU machine; results in $OUT
    python benchmarks/exec_gpu_batch.py --smoke --out D  # tiny sizes on CPU, same code path
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STARTUP_S = 30.0  # process start, allocation, backend probe, first-step warm-up (GPU, 128K tokens)
PACKAGING_S = 15.0  # kept back from the budget for results and the archive


def require_simpy() -> None:
    try:
        import simpy  # noqa: F401, PLC0415
    except ImportError:
        print("error: simpy is not installed; the simulator needs it: pip install --no-index wheels/simpy-*.whl "
              "(see this script's docstring)", file=sys.stderr)
        raise SystemExit(2) from None


def detect_profile(device: str) -> str:
    if device.startswith("cuda"):
        import torch  # noqa: PLC0415

        name = torch.cuda.get_device_name(0).upper()
        for key, prof in (("H200", "h200-141gb"), ("H100", "h100-sxm5-80gb"), ("A800", "a800-80gb"),
                          ("A100", "a100-sxm4-80gb")):
            if key in name:
                return prof
        raise SystemExit(f"error: no hardware profile for GPU {name!r}; pass --profile")
    return "h100-sxm5-80gb"


def build_plan(model, seq: int, policy, profile, backend: str, chunk: int):
    """A plan whose predictions are the simulator's, for one configuration."""
    from memo_sim.api import Layout, Plan, simulate  # noqa: PLC0415

    sim = simulate(model, Layout(), 1, seq, policy, profile, classifier_chunk_tokens=chunk, keep_timeline=False)
    d = sim.to_dict()
    predicted = {"source": "simulated", **{k: d[k] for k in ("status", "iteration_s", "mfu", "tgs_tokens_per_gpu_s",
                                                            "peak_gpu_bytes", "peak_host_bytes_per_node",
                                                            "exposed_copy_s")}}
    return Plan(model, 1, seq, 1, Layout(), policy, profile.name, predicted, d["layer_timings_s"],
                attention_backend=backend, classifier_chunk_tokens=chunk)


def configurations(model, seqs: list[int], policies: list[str], profile, smoke: bool) -> list[dict]:
    from memo_sim.api import Layout, get_policy, memo_alpha  # noqa: PLC0415
    from memo_sim.policy import policy_class  # noqa: PLC0415

    out = []
    for seq in seqs:
        for pol in policies:
            entry = {"name": f"{model.name}-{seq}-{pol}", "seq_tokens": seq, "policy": pol}
            if policy_class(pol).takes_alpha:  # MEMO, at the simulator's alpha
                res = memo_alpha(model, Layout(), 1, seq, profile)
                alpha, why = (res.alpha, res.reason()) if res.feasible else (None, res.reason())
                if alpha is None and smoke:  # tiny layers hide no offload; the smoke run still takes the MEMO path
                    alpha, why = 0.5, f"smoke: simulator infeasible ({why}); alpha fixed at 0.5"
                entry.update({"alpha": alpha, "alpha_reason": why})
                if alpha is None:
                    entry["skipped"] = f"the simulator finds no feasible alpha: {why}"
                    out.append(entry)
                    continue
                entry["choice"] = get_policy(pol, alpha)
            else:
                entry["choice"] = get_policy(pol)
            out.append(entry)
    return out


def run_one(plan_path: Path, run_dir: Path, args, timeout: float) -> dict:
    argv = [sys.executable, "-m", "memo_exec.cli", "run", str(plan_path), "--device", args.device, "--steps",
            str(args.steps), "--out", str(run_dir), "--json"]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"timed out after {timeout:.0f} s"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.txt").write_text(out)
    (run_dir / "stderr.txt").write_text(err)
    rec = {"rc": rc, "wall_s": time.time() - t0, "timeout_s": timeout, "stderr_tail": err[-1500:]}
    if rc == 0:
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as e:
            rec["rc"], rec["stderr_tail"] = 1, f"unreadable --json output ({e})"
            return rec
        rec.update({k: doc.get(k) for k in ("device", "losses", "steady_state", "totals", "streams", "ops",
                                            "memory", "streams_ops_predicted_from")})
    return rec


def cost(entry: dict, steps: int) -> float:
    it = (entry.get("predicted") or {}).get("iteration_s") or 1.0
    return STARTUP_S + (steps + 1) * it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "exec_gpu_batch_out"))
    ap.add_argument("--scratch", default=None, help="work folder (default: a new temporary folder, removed after)")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (tests this script)")
    ap.add_argument("--seqs", default=None, help="comma-separated token counts (default 32768,65536,131072)")
    ap.add_argument("--policies", default="store_all,full_recompute,memo")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--profile", default=None, help="hardware profile for the predictions (default: by GPU name)")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole batch")
    args = ap.parse_args()
    started = time.time()
    require_simpy()

    from memo_exec.trace import memory_plan_from_trace, record_layer_trace  # noqa: PLC0415
    from memo_sim.api import ModelConfig, load_profile, write_plan  # noqa: PLC0415

    if args.smoke:
        model = ModelConfig("smoke-4l-64", 4, 64, 4, 256, vocab=256)
        seqs, chunk = [128, 256], 100
        args.device = args.device or "cpu"
        args.steps = min(args.steps, 2)
    else:
        model = ModelConfig("gpt-8l-4096", 8, 4096, 32, 16384)
        seqs, chunk = [32768, 65536, 131072], 8192
        args.device = args.device or "cuda"
    if args.seqs:
        seqs = [int(s) for s in args.seqs.split(",")]
    profile = load_profile(args.profile or detect_profile(args.device))
    target = "cuda" if args.device.startswith("cuda") else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="exec_gpu_batch-"))
    (scratch / "plans").mkdir(parents=True, exist_ok=True)

    entries = configurations(model, sorted(seqs), [p.strip() for p in args.policies.split(",") if p.strip()],
                             profile, args.smoke)
    for e in entries:
        if "choice" not in e:
            continue
        plan = build_plan(model, e["seq_tokens"], e["choice"], profile, args.backend, chunk)
        e["predicted"], e["layer_timings_s"] = plan.predicted.to_dict(), plan.layer_timings_s
        if plan.predicted.status == "OOM":  # store all at the longer sequences
            e["skipped"] = "the simulator predicts OOM"
            continue
        if e["choice"].static_memory_plan:
            tr = record_layer_trace(plan, "meta", args.dtype or ("fp32" if target == "cpu" else None), None, target)
            plan.memory_plan = memory_plan_from_trace(tr)
            e["arena_bytes"] = plan.memory_plan.transient_arena_bytes
        e["plan"] = str(write_plan(plan, scratch / "plans" / f"{e['name']}.json"))

    todo = [e for e in entries if "plan" in e]
    for k, e in enumerate(todo):
        left = args.budget - (time.time() - started) - PACKAGING_S
        share = cost(e, args.steps) / sum(cost(x, args.steps) for x in todo[k:])
        timeout = left * share
        if timeout < min(30.0, STARTUP_S):
            e["skipped"] = f"out of the {args.budget:.0f} s budget"
            continue
        e["started_s"] = time.time() - started  # started_s + timeout_s never passes the budget
        print(f"[{time.strftime('%H:%M:%S')}] {e['name']} (timeout {timeout:.0f} s) ...", flush=True)
        e.update(run_one(Path(e["plan"]), scratch / "runs" / e["name"], args, timeout))
        it = (e.get("steady_state") or {}).get("iteration_s")
        print(f"    rc={e['rc']} iteration={it} {e['stderr_tail'].strip().splitlines()[-1:] if e['rc'] else ''}",
              flush=True)

    results = []
    for e in entries:
        r = {k: v for k, v in e.items() if k not in ("choice", "plan")}
        results.append(r)
    doc = {"model": model.to_dict(), "device": args.device, "profile": profile.name, "budget_s": args.budget,
           "wall_s": time.time() - started, "results": results}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=float))
    (out / "results.md").write_text(render(results, model, profile.name, args.device))
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(scratch, arcname="exec_gpu_batch")
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'} and {out / 'runs.tar.gz'} "
          f"in {time.time() - started:.0f} s")
    return 0


def _fmt(v, scale: float = 1.0, unit: str = "") -> str:
    return "—" if v is None else f"{v * scale:.4g}{unit}"


def render(results: list[dict], model, profile: str, device: str) -> str:
    lines = [f"# executor batch: {model.name} ({model.layers} layers, h={model.hidden}) on {device}, "
             f"predictions from profile {profile}\n",
             "| config | alpha | status | iteration measured | predicted | rel. error | d2h exposed / busy (measured) | "
             "peak memory measured | predicted | executor estimate |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        tot = {c["quantity"]: c for c in r.get("totals") or []}
        it = tot.get("iteration time", {})
        st = {(c["stream"], c["quantity"]): c for c in r.get("streams") or []}
        d2h = (st.get(("d2h", "exposed"), {}).get("measured_s"), st.get(("d2h", "busy"), {}).get("measured_s"))
        mem = tot.get("peak device memory (allocated)", {})
        est = tot.get("executor's memory estimate", {})
        if r.get("skipped"):
            status = f"skipped: {r['skipped']}"
        elif r.get("rc") == 0:
            status = "ran"
        else:
            status = f"rc {r.get('rc')}: {(r.get('stderr_tail') or '').strip().splitlines()[-1:] or ''}"
        rel = it.get("rel_error")
        lines.append(
            f"| {r['name']} | {_fmt(r.get('alpha'))} | {status} | {_fmt(it.get('measured'), 1, ' s')} | "
            f"{_fmt(it.get('predicted') or (r.get('predicted') or {}).get('iteration_s'), 1, ' s')} | "
            f"{'—' if rel is None else f'{rel * 100:+.1f}%'} | {_fmt(d2h[0], 1e3, ' ms')} / {_fmt(d2h[1], 1e3, ' ms')} | "
            f"{_fmt(mem.get('measured'), 2**-30, ' GiB')} | "
            f"{_fmt((r.get('predicted') or {}).get('peak_gpu_bytes'), 2**-30, ' GiB')} | "
            f"{_fmt(est.get('measured'), 2**-30, ' GiB')} |")
    lines.append("\nPer-stream and per-layer rows of every run: results.json (`streams`, `ops`, `memory`) and each "
                 "run's report.md in runs.tar.gz.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
