#!/usr/bin/env python
"""Power draw and SM clock of one GPU while it runs, for seconds on end, the kernels that take the
steps of memo's GEMM-bound and long-context rows: each case one JSON line (its sustained rate, and
the board's power, SM clock, temperature and clock-event reasons sampled beside it):

    python3 benchmarks/gpu/probe_power.py [--out DIR] [--seconds 8]   # on a GPU (needs nvidia-smi)
    python3 benchmarks/gpu/probe_power.py --dry-run                   # tiny shapes on the CPU, no sampling

What it answers (reports/published-runs.md, the torchtitan rows): whether these kernels draw more
than 500 W on a 700 W part at its full clock, so whether a 500 W part's power limit can bind under
them at all, and whether the 700 W part itself holds its clock over seconds. It reads the GPU's
settings and never changes them (no power limit, no clock lock).

Cases (bf16 unless named): idle; 2048^3, 4096^3 and 8192^3 GEMMs; the 8192^3 GEMM in FP8 (``torch._scaled_mm``,
tensor-wise scales) where the GPU has it; causal attention over 8K and 32K tokens x 32 heads x 128
(Llama 3.1 8B's heads; a 32K block is one block of a context-parallel ring), forward alone and
forward + backward, with PyTorch's FlashAttention-2 and cuDNN backends; a 4 GiB device-to-device copy
(memory-bound); and one Llama 3.1 8B layer's forward and backward over 8K tokens in eager PyTorch
(`llama_layer`: the mix a step runs). ``--only a,b`` runs those cases alone. Each case runs its kernel back to back for ``--seconds`` after a second of warm-up,
the host synchronising about every quarter second (the GPU's queue never drains in between);
nvidia-smi samples every 50 ms in a child process the whole time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

FIELDS = ("timestamp", "power.draw.instant", "power.draw", "clocks.sm", "clocks.max.sm", "clocks.mem",
          "enforced.power.limit", "temperature.gpu", "clocks_event_reasons.active")
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
           0x100: "display_clocks"}


def _fields() -> list[str]:
    """The sampled fields this nvidia-smi knows (older drivers lack some: each is tried alone)."""
    ok = []
    for f in FIELDS:
        p = subprocess.run(["nvidia-smi", f"--query-gpu={f}", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True)
        if p.returncode == 0 and "Field" not in p.stdout and "not a valid" not in p.stdout:
            ok.append(f)
    return ok


class Sampler:
    """nvidia-smi in a child process, one CSV line per 50 ms, each stamped with this host's clock."""

    def __init__(self, path: Path, fields: list[str]):
        self.fields = fields
        self.path = path
        self.out = open(path, "w")
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                      "-i", "0", "-lms", "50"], stdout=self.out, stderr=subprocess.DEVNULL)
        self.t0 = time.time()

    def stop(self) -> list[dict]:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.out.close()
        rows = []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(self.fields):
                continue
            row = dict(zip(self.fields, parts))
            try:  # nvidia-smi's own stamp: 2026/11/26 09:30:01.123
                row["t"] = time.mktime(time.strptime(row["timestamp"].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
                    "0." + row["timestamp"].split(".")[1])
            except (ValueError, IndexError):
                continue
            rows.append(row)
        return rows


def _num(v: str | None) -> float | None:
    try:
        return float(v) if v not in (None, "", "[N/A]", "N/A") else None
    except ValueError:
        return None


def window(samples: list[dict], t0: float, t1: float) -> dict:
    """The samples of [t0, t1]: median and 90th percentile power, median and lowest SM clock,
    the largest temperature, and the share of samples with each clock-event reason."""
    rows = [r for r in samples if t0 <= r["t"] <= t1]
    out: dict = {"samples": len(rows)}
    if not rows:
        return out
    for key, name in (("power.draw.instant", "power_w"), ("power.draw", "power_avg_w"), ("clocks.sm", "sm_mhz"),
                      ("clocks.mem", "mem_mhz"), ("temperature.gpu", "temp_c")):
        vals = sorted(v for v in (_num(r.get(key)) for r in rows) if v is not None)
        if vals:
            out[name] = {"median": statistics.median(vals), "p10": vals[int(0.1 * (len(vals) - 1))],
                         "p90": vals[int(0.9 * (len(vals) - 1))], "max": vals[-1], "min": vals[0]}
    counts: dict[str, int] = {}
    for r in rows:
        raw = r.get("clocks_event_reasons.active")
        try:
            bits = int(raw, 16) if raw and raw.startswith("0x") else int(raw or 0)
        except ValueError:
            continue
        for bit, name in REASONS.items():
            if bits & bit:
                counts[name] = counts.get(name, 0) + 1
    out["reasons_share"] = {k: v / len(rows) for k, v in sorted(counts.items())}
    return out


def cases(dev: str, dry: bool) -> dict:
    """name -> (function that launches one unit of work, FLOPs of a unit or None, bytes of a unit or None)."""
    bf = torch.bfloat16
    out = {}
    for n in ((64, 128) if dry else (2048, 4096, 8192)):  # does a smaller GEMM reach the power limit too?
        a, b = torch.randn(n, n, device=dev, dtype=bf), torch.randn(n, n, device=dev, dtype=bf)
        out[f"gemm_bf16_{n}"] = (lambda a=a, b=b: a @ b, 2 * n ** 3, None)
    if not dry and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(0) >= (8, 9):
        a8, w8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev, dtype=torch.float32)
        out["gemm_fp8_tensorwise"] = (lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=bf),
                                      2 * n ** 3, None)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("flash", SDPBackend.FLASH_ATTENTION)] if not dry else [("math", SDPBackend.MATH)]
    if not dry and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    for name, be in backends:
        for s in ((128,) if dry else (8192, 32768)):
            h, d = (2, 16) if dry else (32, 128)
            q, k, v = (torch.randn(1, h, s, d, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
            go = torch.randn(1, h, s, d, device=dev, dtype=bf)
            fl = 2 * 2 * h * s * s * d / 2  # causal forward: QK^T and PV over half the square

            def fwd(be=be, q=q, k=k, v=v):
                with sdpa_kernel(be), torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd(be=be, q=q, k=k, v=v, go=go):
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(go)
                q.grad = k.grad = v.grad = None

            out[f"attn_{name}_fwd_{s // 1024}k"] = (fwd, fl, None)
            out[f"attn_{name}_fwd_bwd_{s // 1024}k"] = (fwd_bwd, 3.5 * fl, None)  # backward 2.5x the forward's FLOPs
    m = (1 << 12) if dry else (1 << 31)  # 4 GiB of bf16
    src, dst = torch.empty(m, device=dev, dtype=bf), torch.empty(m, device=dev, dtype=bf)
    out["copy_d2d"] = (lambda: dst.copy_(src), None, 4 * m)  # read + write
    out["llama8b_layer_8k_fwd_bwd"] = llama_layer(dev, dry)
    return out


def llama_layer(dev: str, dry: bool):
    """One Llama 3.1 8B decoder layer, forward and backward, over 8K tokens in eager PyTorch (RMSNorm, the
    QKV, output and SwiGLU projections, K/V repeated to the query heads, FlashAttention-2 through SDPA,
    residual adds): the mix of GEMMs, attention and memory-bound ops a training step runs, under which the
    board's power and clock are compared with each kernel class's alone. (function, FLOPs of a unit)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bf = torch.bfloat16
    t, h, nh, nkv, ffn = (128, 64, 4, 2, 128) if dry else (8192, 4096, 32, 8, 14336)
    hd = h // nh
    backend = SDPBackend.MATH if dry else SDPBackend.FLASH_ATTENTION

    def w(i, o):
        return (torch.randn(i, o, device=dev, dtype=bf) * i ** -0.5).requires_grad_()

    wq, wk, wv, wo = w(h, h), w(h, nkv * hd), w(h, nkv * hd), w(h, h)
    w1, w3, w2 = w(h, ffn), w(h, ffn), w(ffn, h)
    n1, n2 = torch.ones(h, device=dev, dtype=bf, requires_grad=True), torch.ones(h, device=dev, dtype=bf,
                                                                                 requires_grad=True)
    x = torch.randn(t, h, device=dev, dtype=bf, requires_grad=True)
    g = torch.randn(t, h, device=dev, dtype=bf)
    params = [wq, wk, wv, wo, w1, w3, w2, n1, n2, x]

    def rms(z, weight):
        zf = z.float()
        return (zf * torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf) * weight

    def step():
        a = rms(x, n1)
        q = (a @ wq).view(1, t, nh, hd).transpose(1, 2)
        k = (a @ wk).view(1, t, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, dim=1)
        v = (a @ wv).view(1, t, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, dim=1)
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = x + o.transpose(1, 2).reshape(t, h) @ wo
        b = rms(y, n2)
        z = y + (F.silu(b @ w1) * (b @ w3)) @ w2
        z.backward(g)
        for p_ in params:
            p_.grad = None

    gemm = 2 * t * h * (2 * h + 2 * nkv * hd) + 3 * 2 * t * h * ffn  # forward GEMM FLOPs
    attn = 2 * nh * t * t * hd  # causal forward
    return step, 3 * gemm + 3.5 * attn


def run_case(fn, seconds: float, dev: str, warmup: float = 1.0) -> dict:
    """``fn`` back to back for ``seconds`` after one second of warm-up: units done, wall seconds and
    the rate over each quarter-second batch (first and last batch: does the rate hold?)."""
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    fn()
    sync()
    t = time.perf_counter()
    reps = 0
    while time.perf_counter() - t < 0.2:
        fn()
        reps += 1
    sync()
    per = max((time.perf_counter() - t) / reps, 1e-6)
    batch = max(1, int(0.25 / per))
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:  # warm-up
        for _ in range(batch):
            fn()
        sync()
    t0w = time.time()
    t0 = time.perf_counter()
    units, rates = 0, []
    while time.perf_counter() - t0 < seconds:
        tb = time.perf_counter()
        for _ in range(batch):
            fn()
        sync()
        units += batch
        rates.append(batch / (time.perf_counter() - tb))
    wall = time.perf_counter() - t0
    return {"units": units, "wall_s": wall, "t0": t0w, "t1": t0w + wall, "batch": batch,
            "units_per_s": units / wall, "first_batch_units_per_s": rates[0], "last_batch_units_per_s": rates[-1],
            "min_batch_units_per_s": min(rates), "max_batch_units_per_s": max(rates)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names to run (default: every case)")
    a = ap.parse_args()
    dev = "cpu" if a.dry_run else "cuda"
    only = {c for c in a.only.split(",") if c}
    known = cases(dev, a.dry_run)
    if only - set(known):  # refused before anything is sampled or written
        ap.exit(2, f"error: --only {','.join(sorted(only - set(known)))}: no such case; the cases are "
                   f"{', '.join(known)}\n")
    out_dir = Path(a.out or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    sampling = not a.dry_run and shutil.which("nvidia-smi") is not None
    env = {"case": "env", "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "seconds": a.seconds, "sampling": sampling}
    if sampling:
        q = subprocess.run(["nvidia-smi", "-q", "-d", "POWER,CLOCK,PERFORMANCE,TEMPERATURE", "-i", "0"],
                           capture_output=True, text=True)
        env["nvidia_smi_q"] = q.stdout[-6000:]
        fields = _fields()
        env["fields"] = fields
        sampler = Sampler(out_dir / "power-samples.csv", fields)
    print(json.dumps(env), flush=True)
    rows = [env]
    marks = []
    time.sleep(0.0 if a.dry_run else 0.5)
    ti = time.time()
    time.sleep(0.05 if a.dry_run else 3.0)
    te = time.time()
    marks.append(("idle", ti, te, None, None, {"t0": ti, "t1": te}))
    for name, spec in known.items():
        if only and name not in only:
            continue
        fn, flops, nbytes = spec if len(spec) == 3 else (*spec, None)
        r = run_case(fn, 0.05 if a.dry_run else a.seconds, dev, warmup=0.05 if a.dry_run else 1.0)
        marks.append((name, r["t0"], r["t1"], flops, nbytes, r))
        torch.cuda.empty_cache() if dev == "cuda" else None
        time.sleep(0.0 if a.dry_run else 1.0)
    samples = sampler.stop() if sampling else []
    for name, t0, t1, flops, nbytes, r in marks:
        row = {"case": name, **r}  # t0, t1: the case's window on this host's clock (time.time)
        if flops:
            row["tflops"] = r["units_per_s"] * flops / 1e12
            row["first_batch_tflops"] = r["first_batch_units_per_s"] * flops / 1e12
            row["last_batch_tflops"] = r["last_batch_units_per_s"] * flops / 1e12
        if nbytes:
            row["gbytes_per_s"] = r["units_per_s"] * nbytes / 1e9
        # the window less its first half second (the clock and power settle as the load starts)
        row["board"] = window(samples, t0 + 0.5, t1) if samples else {}
        rows.append(row)
        print(json.dumps(row), flush=True)
    tmp = out_dir / "probe-power.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out_dir / "probe-power.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
