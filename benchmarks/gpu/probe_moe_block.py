#!/usr/bin/env python
"""Where memo-exec's MoE block spends the GPU's time: one layer's block (router, dispatcher,
experts, combine, shared experts) forward + backward in bf16, under torch.profiler; prints the
kernels by device time and writes ``--out``/moe_block-MODEL.json (kernel name, calls, device ms).

It also counts what the block keeps for its backward (``saved_rows_per_token``: the distinct
storages autograd saves in one forward, parameters and the block's input left out, in h-wide rows
of the run's dtype per token) beside the simulator's count of the block's saved tensors
(``sim_saved_rows_per_token``: `memo_sim.cost.activations.RECOMPUTE_GROUPS` ``moe_block``, its
bytes per token over h x the model dtype's bytes).

    python3 benchmarks/gpu/probe_moe_block.py --out "$OUT" [--model qwen2-moe-a2.7b] [--tokens 8192]
    python3 benchmarks/gpu/probe_moe_block.py --dry-run --out DIR     # a tiny block on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from memo_exec.moe.block import MoEBlock  # noqa: E402
from memo_exec.moe.weights import MoEWeights  # noqa: E402
from memo_sim.model.config import PRESETS  # noqa: E402


def saved_rows_per_token(block, w, x, model) -> tuple[float, float]:
    """(what memo-exec's block keeps, what the simulator counts), h-wide rows per token (module docs)."""
    from memo_sim.cost.activations import RECOMPUTE_GROUPS
    from memo_sim.model.layer_graph import DTYPE_BYTES, layer_tensors

    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen.setdefault(s.data_ptr(), s.nbytes())
        return t

    leaf = x.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block.math(w, leaf, None, 1, "fwd")
    skip = {p.untyped_storage().data_ptr() for p in w.parameters()} | {leaf.untyped_storage().data_ptr()}
    kept = sum(n for ptr, n in seen.items() if ptr not in skip)
    row = x.shape[1] * x.element_size()
    tensors = layer_tensors(model, "megatron")
    sim = sum(tensors[n].bytes_per_token() for n in RECOMPUTE_GROUPS["moe_block"] if n in tensors and tensors[n].saved)
    return kept / x.shape[0] / row, sim / (model.hidden * DTYPE_BYTES[model.dtype])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen2-moe-a2.7b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    moe = sorted(n for n, m in PRESETS.items() if m.moe)
    if a.model not in moe:
        print(f"error: --model {a.model!r}: not a mixture-of-experts preset; one of {', '.join(moe)}", file=sys.stderr)
        return 2
    model = PRESETS[a.model]
    dev = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if a.dry_run:
        model = dataclasses.replace(model, hidden=64, heads=4, experts=8, top_k=2, expert_ffn=32,
                                    shared_ffn=64 if model.shared_ffn else 0, **({"kv_heads": 2} if model.kv_heads else {}))
        a.tokens = 64
    w = MoEWeights(model, dev, dtype)
    with torch.no_grad():
        for p in w.parameters():
            p.normal_(0, 0.02)
    block = MoEBlock(model)
    x = torch.randn(a.tokens, model.hidden, device=dev, dtype=dtype)
    dy = torch.randn_like(x)

    def step():
        leaf = x.detach().requires_grad_(True)
        y, _, _ = block.math(w, leaf, None, 1, "fwd")
        torch.autograd.backward(y, dy)
        for p in w.parameters():
            p.grad = None

    for _ in range(3):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / 5
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    saved_rows, sim_rows = saved_rows_per_token(block, w, x, model)
    rows = []
    for e in prof.key_averages():
        dt = getattr(e, "self_device_time_total", 0.0) if dev.type == "cuda" else e.self_cpu_time_total
        if dt > 0:
            rows.append({"name": e.key[:160], "calls": e.count, "ms": dt / 1e3})
    rows.sort(key=lambda r: -r["ms"])
    doc = {"model": a.model, "tokens": a.tokens, "device": str(dev), "torch": torch.__version__,
           "wall_ms_per_fwd_bwd": wall * 1e3, "kernel_ms_total": sum(r["ms"] for r in rows),
           "saved_rows_per_token": saved_rows, "sim_saved_rows_per_token": sim_rows, "rows": rows[:60],
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))
    for r in rows[:30]:
        print(f"{r['ms']:9.3f} ms  {r['calls']:5d}  {r['name']}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "moe_block.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / f"moe_block-{a.model}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
