#!/usr/bin/env python
"""On a lent GPU: the executor's FP8 GEMMs and Qwen3 attention on CUDA, against the simulator.

    python benchmarks/gpu/probe_fp8_qwen3.py --out DIR [--seconds 150]

1. FP8 step time: a dense layer stack (Llama-3.1-8B's shapes, 4 layers, 8K tokens, store all, bf16) run by
   the executor with bf16 GEMMs and with ``fp8-tensorwise`` (`memo_exec.gemm_formats`), a few steps each,
   alternating; the steady step times and their ratio beside the simulator's iteration times for the same two
   plans on the named profile (``--profile``, default h200-141gb), and its ratio.
2. Qwen3 attention on CUDA: a Qwen3-shaped toy (heads of 128 over a 2048-wide model, QK norms) in bf16, store all
   and MEMO: loss and the QK norms' gradients against fp32 autograd (`tests.exec_reference.RefGPT`), and the two
   policies' gradients equal.

Writes ``probe_fp8_qwen3.json`` to ``--out`` (each part's numbers, or its error) and prints a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def fp8_speed(profile_name: str, seconds: float) -> dict:
    import torch

    from memo_exec.runner import Executor, RunOptions
    from memo_sim.api import simulate
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import PRESETS
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile
    from tests.exec_helpers import make_plan

    base = dataclasses.replace(PRESETS["llama-3.1-8b"], layers=4, vocab=32000, name="llama-4l")
    models = {"bf16": base, "fp8-tensorwise": dataclasses.replace(base, gemm_format="fp8-tensorwise")}
    seq, pol = 8192, get_policy("store_all")
    prof = load_profile(profile_name)
    out: dict = {"model": "llama-3.1-8b shapes, 4 layers, vocab 32000", "seq": seq, "policy": "store_all",
                 "profile": prof.name, "predicted_s": {}, "measured_s": {}, "steps": {}}
    for fmt, m in models.items():
        out["predicted_s"][fmt] = simulate(m, Layout(), 1, seq, pol, prof).iteration_s
    exes = {fmt: Executor(make_plan(m, seq, pol, backend="auto", chunk=4096), RunOptions(device="cuda", dtype="bf16",
                                                                                           steps=1))
            for fmt, m in models.items()}
    times: dict = {fmt: [] for fmt in exes}
    try:
        for ex in exes.values():
            ex.allocate()
            ex.forward_backward(0)  # warm-up (kernels, the FP8 weight copies)
        torch.cuda.synchronize()
        t_end = time.monotonic() + seconds
        k = 1
        while time.monotonic() < t_end and k <= 12:
            for fmt, ex in exes.items():  # alternating, so both see the same clocks
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                ex.forward_backward(k)
                torch.cuda.synchronize()
                times[fmt].append(time.perf_counter() - t0)
            k += 1
    finally:
        for ex in exes.values():
            ex.close()
    for fmt, ts in times.items():
        out["steps"][fmt] = ts
        out["measured_s"][fmt] = statistics.median(ts[1:] if len(ts) > 2 else ts)
    p, m = out["predicted_s"], out["measured_s"]
    out["predicted_speedup"] = p["bf16"] / p["fp8-tensorwise"]
    out["measured_speedup"] = m["bf16"] / m["fp8-tensorwise"]
    return out


def qwen3_cuda() -> dict:
    import torch

    from memo_sim.model.config import ModelConfig
    from memo_sim.policy import get_policy
    from tests.exec_helpers import executor_grads, make_plan, max_rel_error, per_param_errors, reference_grads

    m = ModelConfig("qwen3-toy", 4, 1024, 16, 2048, vocab=4096, kv_heads=4, head_dim=128, qk_norm=True,
                    norm="rmsnorm", ffn_type="swiglu", bias="none", tied_embeddings=False)
    out: dict = {"model": "4 layers, hidden 1024, 16 heads of 128 (4 K/V), QK norms, 4K tokens, bf16"}
    loss, grads, ex = executor_grads(make_plan(m, 4096, get_policy("store_all"), backend="auto"), device="cuda",
                                     dtype="bf16")
    ref_loss, ref = reference_grads(ex, dtype=torch.float32)
    _, ref16 = reference_grads(ex)
    ours, theirs = per_param_errors(grads, ref), per_param_errors(ref16, ref)
    out["loss"], out["ref_loss_fp32"] = loss, ref_loss
    out["qk_norm_grad_error"] = {k: ours[k] for k in ours if k.endswith(("lnq_w", "lnk_w"))}
    out["autograd_bf16_error"] = {k: theirs[k] for k in theirs if k.endswith(("lnq_w", "lnk_w"))}
    out["worst_vs_autograd"] = max((ours[k] - 2 * theirs[k] for k in ours), default=0.0)
    loss2, grads2, _ = executor_grads(make_plan(m, 4096, get_policy("memo", 0.3), backend="auto"), device="cuda",
                                      dtype="bf16")
    out["memo_vs_store_all"] = max_rel_error(grads2, grads)[0]
    out["memo_loss_equal"] = loss2 == loss
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="h200-141gb")
    ap.add_argument("--seconds", type=float, default=150.0, help="time for the FP8 step-time loop")
    ap.add_argument("--compile-casts", action="store_true",
                    help="also time the FP8 run with its casts compiled (torch.compile of the cast: one fused kernel, "
                         "as TransformerEngine's and compiled torchao's casts are), the FP8 part only")
    args = ap.parse_args()
    if args.compile_casts:
        import torch

        import memo_exec.gemm_formats as G

        res0 = {"eager": fp8_speed(args.profile, args.seconds / 2)}
        G.quantize = torch.compile(G.quantize, dynamic=True)
        res0["compiled_casts"] = fp8_speed(args.profile, args.seconds / 2)
        for k, v in res0.items():
            keys = ("measured_s", "predicted_s", "measured_speedup", "predicted_speedup")
            print(k, {q: v[q] for q in keys}, flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_fp8_casts.json").write_text(json.dumps(res0, indent=1, default=str))
        return 0
    res: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch

        res["device"] = torch.cuda.get_device_name(0)
        res["torch"] = torch.__version__
    except Exception as e:  # noqa: BLE001 - recorded
        res["device"] = f"error: {e}"
    for name, fn in (("qwen3_cuda", qwen3_cuda), ("fp8_speed", lambda: fp8_speed(args.profile, args.seconds))):
        t0 = time.monotonic()
        try:
            res[name] = fn()
        except Exception:  # noqa: BLE001 - one part's failure is recorded, the other still runs
            res[name] = {"error": traceback.format_exc()[-3000:]}
        res[name]["wall_s"] = time.monotonic() - t0
        print(name, json.dumps(res[name], default=str)[:1500], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_fp8_qwen3.json").write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
