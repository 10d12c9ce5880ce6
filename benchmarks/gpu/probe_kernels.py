#!/usr/bin/env python
"""Kernel probes on a Hopper GPU for the mechanisms the long-context and MoE rows rest on, each
case printed as one JSON line (and all of them written to ``--out``/kernels.json):

    python3 benchmarks/gpu/probe_kernels.py --out "$OUT" [--only attention,ring,gemm,grouped] [--budget 200]
    python3 benchmarks/gpu/probe_kernels.py --dry-run --out DIR     # tiny shapes on the CPU (tests the script)

- attention: SDPA forward and backward, causal and not, bf16, batch 1, 32 heads x 128 (Llama 3
  8B's heads with K/V repeated, as torchtitan 2024-12 calls SDPA), s in 8K..128K, on the flash and
  the cuDNN backends (`torch.nn.attention.sdpa_kernel`); FLOPs counted as the simulator counts them
  (4*s_q*s_kv*H*d forward, halved when causal on a square block; backward 2.5x).
- ring: the per-rank attention of load-balanced ring context parallelism at 32K tokens per rank (as
  PyTorch's experimental context parallelism of 2024-12 runs it: step 0 the causal local block,
  then cp-1 steps of a non-causal block of half the queries or half the keys), each block's kernel
  timed alone, plus the fp32 merge of a step's output and log-sum-exp and the fp32 accumulation of
  a step's dq/dk/dv, as elementwise passes of the sizes that implementation moves.
- gemm: the layer GEMMs of Llama 3 8B (32K tokens) and 70B at TP 8 (8K tokens), bf16 `torch.mm`
  and FP8 e4m3 `torch._scaled_mm` with tensor-wise scales (bf16 output).
- attention_short: causal attention at 1K-8K tokens, 32 and 8 (TP-split) heads of 128, batch 1 and 4.
- gemm_shapes: a sweep of layer-GEMM shapes (tokens in {2K, 8K, 32K} x in x out), bf16 and FP8.
- grouped_sweep: 8 local experts' GEMMs at 64..4096 tokens per expert, a torch.mm loop and torch._grouped_mm.
- attention_long: causal flash attention at 128K-1M tokens over the 32-1 heads a Ulysses rank keeps (not in the
  default run: ``--only attention_long``).
- gemm_scaled: FP8 e4m3 GEMMs over the ``gemm_shapes`` sweep with tensor-wise, row-wise (torchao's rowwise recipe)
  and block-wise scales (1 x 128 activation tiles, 128 x 128 weight blocks: DeepSeek-V3's recipe, TransformerEngine's
  Float8BlockScaling), `torch._scaled_mm`, bf16 beside them; each recipe's output checked against the dequantised
  product first, the recipes timed in turn on each shape, every other shape in the reverse order (not in the default
  run: ``--only gemm_scaled``; GPU only).
- grouped: routed-expert GEMMs (FC1 to 2f for SwiGLU, FC2 back to h) of Mixtral-8x7B,
  Qwen3-30B-A3B, DeepSeek-V3 (8 local experts of 256 at EP 32), GPT-OSS-120B; one loop of
  `torch.mm` per expert and `torch._grouped_mm` where torch has it.

Times: CUDA events around each call, median of ``--reps`` (default 3) after one warm-up, so a call
shorter than the host's launch interval (tens of us) times the host, not the kernel
(`benchmarks/gpu/hopper_curves.py` leaves such cases out; `memo-exec calibrate` times its short GEMMs
by CUDA-graph replay). Each section is guarded: a
failure is printed as a JSON line with its error and the probe goes on. Nothing here feeds a
profile by itself; reports/ says what each number was used for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PEAK_BF16 = 989e12  # Hopper SXM dense bf16 datasheet, for the efficiency column only
PEAK_FP8 = 1979e12
from probe_log import RESULTS, T0, emit, write_results  # noqa: E402 (this folder: the probes' record)


class Timer:
    """Median seconds of ``reps`` calls of a function after ``warm`` warm-ups (CUDA events around each
    call on a GPU, perf_counter on a CPU)."""

    def __init__(self, device: str, reps: int, warm: int = 1):
        self.device, self.reps, self.warm = device, reps, warm

    def __call__(self, fn) -> float:
        for _ in range(self.warm):
            fn()
        out = []
        for _ in range(self.reps):
            if self.device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        return statistics.median(out)


def backends(device: str):
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    if device != "cuda":
        return [("math", SDPBackend.MATH)]
    return [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def attn_flops(sq: int, skv: int, H: int, d: int, causal: bool) -> float:
    f = 4.0 * sq * skv * H * d
    return f / 2 if causal else f


def time_attention(timer, backend, q, k, v, causal: bool) -> tuple[float, float]:
    from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

    go = torch.randn_like(q)

    def fwd():
        with torch.no_grad(), sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(go)

    tf = timer(fwd)
    tfb = timer(fwd_bwd)
    return tf, max(tfb - tf, 0.0)


def leaf(shape, dev, dt):
    return torch.randn(shape, device=dev, dtype=dt).requires_grad_()


def attention(a, dev, dt, timer, H=32, d=128):
    for name, be in backends(dev):
        for s in a.seqs:
            for causal in (True, False):
                if not causal and s > 32768:
                    continue
                try:
                    q, k, v = (leaf((1, H, s, d), dev, dt) for _ in range(3))
                    tf, tb = time_attention(timer, be, q, k, v, causal)
                    fl = attn_flops(s, s, H, d, causal)
                    emit(section="attention", backend=name, s=s, heads=H, head_dim=d, causal=causal,
                         fwd_s=tf, bwd_s=tb, fwd_flops=fl, fwd_tflops=fl / tf / 1e12, bwd_tflops=2.5 * fl / tb / 1e12 if tb else None,
                         fwd_eff=fl / tf / PEAK_BF16, bwd_eff=2.5 * fl / tb / PEAK_BF16 if tb else None)
                    del q, k, v
                except Exception as e:  # noqa: BLE001
                    emit(section="attention", backend=name, s=s, causal=causal, error=f"{type(e).__name__}: {e}"[:300])
                if dev == "cuda":
                    torch.cuda.empty_cache()


def ring(a, dev, dt, timer, H=32, d=128):
    S = a.ring_local
    half = S // 2
    for name, be in backends(dev):
        for label, sq, skv, causal in (("diag", S, S, True), ("kv_half", S, half, False), ("q_half", half, S, False)):
            try:
                q, k, v = leaf((1, H, sq, d), dev, dt), leaf((1, H, skv, d), dev, dt), leaf((1, H, skv, d), dev, dt)
                tf, tb = time_attention(timer, be, q, k, v, causal)
                fl = attn_flops(sq, skv, H, d, causal)
                emit(section="ring", backend=name, block=label, s_q=sq, s_kv=skv, causal=causal, fwd_s=tf, bwd_s=tb,
                     fwd_tflops=fl / tf / 1e12, bwd_tflops=2.5 * fl / tb / 1e12 if tb else None)
                del q, k, v
            except Exception as e:  # noqa: BLE001
                emit(section="ring", backend=name, block=label, error=f"{type(e).__name__}: {e}"[:300])
    # one step's fp32 merge of (out, lse) into the running (out, lse), over all S queries
    try:
        out_acc = torch.randn(1, H, S, d, device=dev, dtype=torch.float32)
        lse_acc = torch.randn(1, H, S, 1, device=dev, dtype=torch.float32)
        out = torch.randn(1, H, S, d, device=dev, dtype=dt)
        lse = torch.randn(1, H, S, 1, device=dev, dtype=torch.float32)

        def merge():
            o = out.float()
            new = out_acc - torch.sigmoid(lse - lse_acc) * (out_acc - o)
            nl = lse_acc - F.logsigmoid(lse_acc - lse)
            out_acc.copy_(new)
            lse_acc.copy_(nl)

        t = timer(merge)
        emit(section="ring", block="merge_fp32", s_q=S, heads=H, head_dim=d, s=t,
             hbm_bytes_min=S * H * d * (4 * 2 + 2))

        acc = [torch.zeros(1, H, S, d, device=dev, dtype=torch.float32) for _ in range(3)]
        g = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(3)]

        def accumulate():
            for x, y in zip(acc, g):
                x.add_(y)

        t = timer(accumulate)
        emit(section="ring", block="grad_accumulate_fp32", s_q=S, heads=H, head_dim=d, s=t,
             hbm_bytes_min=3 * S * H * d * (4 * 2 + 2))
    except Exception as e:  # noqa: BLE001
        emit(section="ring", block="merge", error=f"{type(e).__name__}: {e}"[:300])


GEMMS = {  # name: (tokens, K, N)
    "8b_qkv": (32768, 4096, 6144), "8b_out": (32768, 4096, 4096), "8b_fc1": (32768, 4096, 28672),
    "8b_fc2": (32768, 14336, 4096), "70b_tp8_qkv": (8192, 8192, 1280), "70b_tp8_out": (8192, 1024, 8192),
    "70b_tp8_fc1": (8192, 8192, 7168), "70b_tp8_fc2": (8192, 3584, 8192),
}


def gemm(a, dev, dt, timer):
    shrink = 64 if a.dry_run else 1
    for name, (m, k, n) in GEMMS.items():
        m, k, n = max(16, m // shrink), max(16, k // shrink), max(16, n // shrink)
        try:
            x = torch.randn(m, k, device=dev, dtype=dt)
            w = torch.randn(n, k, device=dev, dtype=dt)
            t = timer(lambda: torch.mm(x, w.t()))
            fl = 2.0 * m * k * n
            emit(section="gemm", name=name, m=m, k=k, n=n, dtype="bf16", s=t, tflops=fl / t / 1e12, eff=fl / t / PEAK_BF16)
            if dev == "cuda":
                xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                t = timer(lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                emit(section="gemm", name=name, m=m, k=k, n=n, dtype="fp8_e4m3_tensorwise", s=t, tflops=fl / t / 1e12,
                     eff=fl / t / PEAK_FP8)
        except Exception as e:  # noqa: BLE001
            emit(section="gemm", name=name, error=f"{type(e).__name__}: {e}"[:300])


EXPERTS = {  # name: (local experts, tokens per expert, h, expert ffn)
    "mixtral_8x7b": (8, 4096, 4096, 14336), "qwen3_30b_a3b": (128, 512, 2048, 768),
    "deepseek_v3_ep32": (8, 2048, 7168, 2048), "gpt_oss_120b": (32, 1024, 2880, 2880),
}


def expert_gemm_times(dev, dt, timer, E: int, m: int, k: int, n: int) -> tuple[float, float, float | None]:
    """(FLOPs, seconds of one torch.mm per expert, seconds of torch._grouped_mm or None) for E experts of
    m tokens each, [m, k] x [k, n]."""
    x = torch.randn(E * m, k, device=dev, dtype=dt)
    w = torch.randn(E, k, n, device=dev, dtype=dt)
    xs = list(x.split(m))

    def loop():
        for i in range(E):
            torch.mm(xs[i], w[i])

    t_loop = timer(loop)
    gm = getattr(torch, "_grouped_mm", None)
    t_grouped = None
    if gm is not None and dev == "cuda":
        offs = torch.arange(m, E * m + 1, m, device=dev, dtype=torch.int32)
        t_grouped = timer(lambda: gm(x, w, offs=offs))
    return 2.0 * E * m * k * n, t_loop, t_grouped


def grouped(a, dev, dt, timer):
    shrink = 32 if a.dry_run else 1
    for name, (E, m, h, f) in EXPERTS.items():
        m, h, f = max(16, m // shrink), max(16, h // shrink), max(16, f // shrink)
        for part, (k, n) in (("fc1", (h, 2 * f)), ("fc2", (f, h))):
            try:
                fl, t, tg = expert_gemm_times(dev, dt, timer, E, m, k, n)
                emit(section="grouped", name=name, part=part, experts=E, tokens_per_expert=m, k=k, n=n,
                     kind="mm_loop", s=t, tflops=fl / t / 1e12, eff=fl / t / PEAK_BF16)
                if tg is not None:
                    emit(section="grouped", name=name, part=part, experts=E, tokens_per_expert=m, k=k, n=n,
                         kind="grouped_mm", s=tg, tflops=fl / tg / 1e12, eff=fl / tg / PEAK_BF16)
            except Exception as e:  # noqa: BLE001
                emit(section="grouped", name=name, part=part, error=f"{type(e).__name__}: {e}"[:300])


def attention_short(a, dev, dt, timer):
    """Causal attention at training lengths of 1K-8K tokens, whole heads and TP-split heads, batch 1 and 4."""
    for name, be in backends(dev):
        for s in a.short_seqs:
            for H in (32, 8):
                for b in (1, 4):
                    try:
                        q, k, v = (leaf((b, H, s, 128), dev, dt) for _ in range(3))
                        tf, tb = time_attention(timer, be, q, k, v, True)
                        fl = b * attn_flops(s, s, H, 128, True)
                        emit(section="attention_short", backend=name, s=s, heads=H, head_dim=128, batch=b, causal=True,
                             fwd_s=tf, bwd_s=tb, fwd_flops=fl, fwd_eff=fl / tf / PEAK_BF16,
                             bwd_eff=2.5 * fl / tb / PEAK_BF16 if tb else None)
                    except Exception as e:  # noqa: BLE001
                        emit(section="attention_short", backend=name, s=s, heads=H, batch=b, error=f"{type(e).__name__}: {e}"[:300])


def attention_long(a, dev, dt, timer):
    """Causal attention on the flash backend (FlashAttention-2, as XTuner's Ulysses rows call it) at the lengths and
    head counts of a Ulysses rank at 256K-1M tokens: the few heads a rank keeps over the whole sequence (Llama-2-7B's
    32 heads over SP 16: 2 heads at 1M; Llama-2-70B's 64 over SP 64: 1), beside 128K x 32 heads of about the same
    FLOPs a call as 256K x 8. Tests whether a call's efficiency holds past 1e14 FLOPs, the largest size any profile's
    attention curve was measured at."""
    cases = ((128, 32), (256, 8), (512, 4), (1024, 2), (1024, 1)) if a.dry_run else \
        ((131072, 32), (262144, 8), (524288, 4), (1048576, 2), (1048576, 1))
    for name, be in backends(dev)[:1]:
        for s, H in cases:
            try:
                q, k, v = (leaf((1, H, s, 128), dev, dt) for _ in range(3))
                tf, tb = time_attention(timer, be, q, k, v, True)
                fl = attn_flops(s, s, H, 128, True)
                emit(section="attention_long", backend=name, s=s, heads=H, head_dim=128, causal=True, fwd_s=tf,
                     bwd_s=tb, fwd_flops=fl, fwd_eff=fl / tf / PEAK_BF16,
                     bwd_eff=2.5 * fl / tb / PEAK_BF16 if tb else None)
                del q, k, v
            except Exception as e:  # noqa: BLE001
                emit(section="attention_long", backend=name, s=s, heads=H, error=f"{type(e).__name__}: {e}"[:300])
            if dev == "cuda":
                torch.cuda.empty_cache()


def layer_gemm_shapes(shrink: int = 1):
    """The swept layer-GEMM shapes (tokens, in, out): tokens in {2K, 8K, 32K} x the in and out widths of the Llama
    and GPT layers memo prices, up to 8K x 8K x 28K's FLOPs; each divided by ``shrink`` (a dry run), 16 at least."""
    ks = (1024, 2048, 3584, 4096, 7168, 8192, 14336)
    ns = (1024, 1280, 1536, 2048, 3072, 4096, 6144, 7168, 8192, 14336, 28672)
    for m in (2048, 8192, 32768):
        for k in ks:
            for n in ns:
                if m * k * n <= 8192 * 8192 * 28672:
                    yield max(16, m // shrink), max(16, k // shrink), max(16, n // shrink)


def _bf16_case(section: str, m: int, k: int, n: int, dev, dt, timer):
    """One swept shape's operands (x [m, k], w [n, k]), its FLOPs and its record with bf16 ``x @ w.t()`` timed."""
    x = torch.randn(m, k, device=dev, dtype=dt)
    w = torch.randn(n, k, device=dev, dtype=dt)
    fl = 2.0 * m * k * n
    t = timer(lambda: torch.mm(x, w.t()))
    return x, w, fl, dict(section=section, m=m, k=k, n=n, flops=fl, bf16_s=t, bf16_eff=fl / t / PEAK_BF16)


def gemm_shapes(a, dev, dt, timer):
    """A sweep of layer-GEMM shapes (tokens x in -> out), bf16 and FP8 tensor-wise, as nn.Linear's forward
    (x @ w.t()): data for a shape-aware GEMM model (tile and wave quantization), not used by one yet."""
    for mm, kk, nn_ in layer_gemm_shapes(64 if a.dry_run else 1):
        try:
            x, w, fl, rec = _bf16_case("gemm_shapes", mm, kk, nn_, dev, dt, timer)
            if dev == "cuda":
                xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                t8 = timer(lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                rec.update(fp8_s=t8, fp8_eff=fl / t8 / PEAK_FP8)
            emit(**rec)
        except Exception as e:  # noqa: BLE001
            emit(section="gemm_shapes", m=mm, k=kk, n=nn_, error=f"{type(e).__name__}: {e}"[:300])


def _quantise(t, rows: int, cols: int):
    """``t`` (2-D, high precision) cast to FP8 e4m3 with one fp32 scale per ``rows`` x ``cols`` block (the amax of
    the block over 448, e4m3's largest normal): (fp8 tensor, scales of shape [ceil(m/rows), ceil(k/cols)])."""
    m, k = t.shape
    pad_m, pad_k = -m % rows, -k % cols
    tp = F.pad(t.float(), (0, pad_k, 0, pad_m))
    blocks = tp.view(tp.shape[0] // rows, rows, tp.shape[1] // cols, cols)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).view_as(tp)[:m, :k].to(torch.float8_e4m3fn)
    return q, scale


SCALED_LAYOUTS = {  # how a scale tensor is laid out in memory: as built (row-major) or outer-dim-major
    "contiguous": lambda s: s.contiguous(), "outer_major": lambda s: s.t().contiguous().t()}


SCALE_BLOCKS = {  # recipe -> ((rows, cols) of x's blocks, (rows, cols) of w's), for shapes x [m, k], w [n, k]
    "tensorwise": lambda xs, ws: (xs, ws), "rowwise": lambda xs, ws: ((1, xs[1]), (1, ws[1])),
    "blockwise": lambda xs, ws: ((1, 128), (128, 128))}


def _scaled_recipes(x, w):
    """The FP8 recipes of one GEMM x @ w.t() ([m, k] x [n, k]): name -> (xq, wq, scale_a, scale_b), the scales in
    the shapes torch._scaled_mm takes them: tensor-wise (scalars), row-wise (x per row [m, 1], w per output column
    [1, n]; torchao's float8 rowwise recipe) and block-wise (x per 1 x 128 tile [m, k/128], w per 128 x 128 block
    [k/128, n/128]; DeepSeek-V3's recipe, TransformerEngine's Float8BlockScaling)."""
    q = {name: (_quantise(x, *bx), _quantise(w, *bw)) for name, blocks in SCALE_BLOCKS.items()
         for bx, bw in [blocks(tuple(x.shape), tuple(w.shape))]}
    (xt, st_x), (wt, st_w) = q["tensorwise"]
    (xr, sr_x), (wr, sr_w) = q["rowwise"]
    (xb, sb_x), (wb, sb_w) = q["blockwise"]
    return {"tensorwise": (xt, wt, st_x.reshape(()), st_w.reshape(())),
            "rowwise": (xr, wr, sr_x.reshape(-1, 1), sr_w.reshape(1, -1)),
            "blockwise": (xb, wb, sb_x, sb_w.t())}


def gemm_scaled(a, dev, dt, timer):
    """FP8 e4m3 GEMMs with tensor-wise, row-wise and block-wise (1x128 x 128x128) scales, torch._scaled_mm with bf16
    output, over the layer-GEMM shapes of ``gemm_shapes`` (bf16 beside them, the same run): each recipe's time and
    efficiency against the FP8 peak, and its output's relative error against the fp32 product of the dequantised
    operands (a recipe whose scales the kernel ignored would show it). The scales' memory layout the kernel takes
    (as built or outer-dim-major) is found on the first shape and recorded."""
    if dev != "cuda":
        emit(section="gemm_scaled", error="skipped: FP8 GEMMs need a CUDA GPU")
        return
    layouts: dict[str, tuple[str, str]] = {}
    probe = torch.randn(256, 512, device=dev, dtype=dt), torch.randn(384, 512, device=dev, dtype=dt)
    for name, (xq, wq, sa, sb) in _scaled_recipes(*probe).items():
        ref = None
        for la, lb in ((x, y) for x in SCALED_LAYOUTS for y in SCALED_LAYOUTS):
            try:
                out = torch._scaled_mm(xq, wq.t(), scale_a=SCALED_LAYOUTS[la](sa), scale_b=SCALED_LAYOUTS[lb](sb),
                                       out_dtype=torch.bfloat16).float()
            except Exception as e:  # noqa: BLE001
                emit(section="gemm_scaled", recipe=name, layout_a=la, layout_b=lb, error=f"{type(e).__name__}: {e}"[:300])
                continue
            if ref is None:
                (ra, ca), (rb, cb) = SCALE_BLOCKS[name](xq.shape, wq.shape)
                xd = _dequantise(xq, sa.reshape(-(-xq.shape[0] // ra), -1), ra, ca)
                wd = _dequantise(wq, sb.t().reshape(-(-wq.shape[0] // rb), -1), rb, cb)
                ref = xd @ wd.t()
            rel = float((out - ref).norm() / ref.norm())
            emit(section="gemm_scaled", recipe=name, layout_a=la, layout_b=lb, check="numerics", rel_error=rel)
            if rel < 2e-2:
                layouts[name] = (la, lb)
                break
    order = []
    for mm, kk, nn_ in layer_gemm_shapes():
        try:
            x, w, fl, rec = _bf16_case("gemm_scaled", mm, kk, nn_, dev, dt, timer)
            recipes = list(_scaled_recipes(x, w).items())
            if len(order) % 2:  # every other shape in the reverse order: no recipe always runs first
                recipes.reverse()
            order.append(1)
            rec["order"] = ",".join(n for n, _ in recipes)
            for name, (xq, wq, sa, sb) in recipes:
                if name not in layouts:
                    continue
                la, lb = layouts[name]
                sa_, sb_ = SCALED_LAYOUTS[la](sa), SCALED_LAYOUTS[lb](sb)
                t8 = timer(lambda: torch._scaled_mm(xq, wq.t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16))
                rec.update({f"{name}_s": t8, f"{name}_eff": fl / t8 / PEAK_FP8})
            emit(**rec)
        except Exception as e:  # noqa: BLE001
            emit(section="gemm_scaled", m=mm, k=kk, n=nn_, error=f"{type(e).__name__}: {e}"[:300])


def _dequantise(q, scale, rows: int, cols: int):
    """The fp32 values of an FP8 tensor with one scale per ``rows`` x ``cols`` block (scales as `_quantise` builds
    them)."""
    m, k = q.shape
    full = scale.repeat_interleave(rows, 0)[:m].repeat_interleave(cols, 1)[:, :k]
    return q.float() * full


MOE_SWEEP = {"qwen3_30b_a3b": (2048, 768), "qwen3_235b_a22b": (4096, 1536), "deepseek_v3": (7168, 2048),
             "mixtral_8x7b": (4096, 14336)}


def grouped_sweep(a, dev, dt, timer):
    """Routed-expert GEMMs over tokens per expert 64..4096 for 8 local experts (h, expert ffn of the models in
    MOE_SWEEP): one torch.mm per expert against torch._grouped_mm."""
    shrink = 32 if a.dry_run else 1
    E = 8
    for name, (h, f) in MOE_SWEEP.items():
        for m in (64, 128, 256, 512, 1024, 2048, 4096):
            mm, hh, ff = max(16, m // shrink), max(16, h // shrink), max(16, f // shrink)
            for part, (k, n) in (("fc1", (hh, 2 * ff)), ("fc2", (ff, hh))):
                try:
                    fl, t, tg = expert_gemm_times(dev, dt, timer, E, mm, k, n)
                    rec = dict(section="grouped_sweep", name=name, part=part, experts=E, tokens_per_expert=mm, k=k, n=n,
                               flops=fl, loop_s=t, loop_eff=fl / t / PEAK_BF16)
                    if tg is not None:
                        rec.update(grouped_s=tg, grouped_eff=fl / tg / PEAK_BF16)
                    emit(**rec)
                except Exception as e:  # noqa: BLE001
                    emit(section="grouped_sweep", name=name, part=part, tokens_per_expert=m, error=f"{type(e).__name__}: {e}"[:300])


SECTIONS = {"attention": attention, "ring": ring, "gemm": gemm, "grouped": grouped, "attention_short": attention_short,
            "gemm_shapes": gemm_shapes, "grouped_sweep": grouped_sweep, "attention_long": attention_long,
            "gemm_scaled": gemm_scaled}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--only", default=",".join(k for k in SECTIONS if k not in ("attention_long", "gemm_scaled")),
                    help=f"sections, of {', '.join(SECTIONS)}")
    ap.add_argument("--name", default="kernels.json", help="file name under --out")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; sections not started past it are skipped")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, fp32")
    a = ap.parse_args()
    dev = "cpu" if a.dry_run else "cuda"
    dt = torch.float32 if a.dry_run else torch.bfloat16
    a.seqs = [128, 256] if a.dry_run else [8192, 16384, 32768, 65536, 131072]
    a.ring_local = 256 if a.dry_run else 32768
    a.short_seqs = [64, 128] if a.dry_run else [1024, 2048, 4096, 8192]
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "cudnn": torch.backends.cudnn.version() if dev == "cuda" else None, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    emit(section="env", **env)
    timer = Timer(dev, a.reps)
    for name in a.only.split(","):
        if time.monotonic() - T0 > a.budget:
            emit(section=name, error="skipped: out of the budget")
            continue
        SECTIONS[name](a, dev, dt, timer)
    if a.out:
        write_results(a.out, a.name)
    return 0 if all("error" not in r or r["error"].startswith("skipped") for r in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
