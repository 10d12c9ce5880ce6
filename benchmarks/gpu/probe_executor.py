#!/usr/bin/env python
"""Probes of the executor's non-layer work and fused attention on a CUDA GPU, each printed as one
JSON line (run where `memo-exec validate` disagreed with the simulator):

    python3 benchmarks/gpu/probe_executor.py [--only classifier,optimizer,efficient]

- classifier: `memo_exec.model.ChunkedHead` forward+backward over 32K tokens, h=4096, chunks of
  8192 rows, for a vocabulary of V=50257 (GPT-2's) and V padded to a multiple of 128 (50304, as
  Megatron-LM's --make-vocab-size-divisible-by pads it), and each of its GEMMs alone.
- optimizer: `memo_exec.optim.AdamW.step` (one parameter at a time) against
  torch.optim.AdamW(fused=True) over the same fp32 master weights and main gradients (+ the bf16
  weight copy-back), on the parameters of 8 layers of GPT-7B with its embedding.
- efficient: aten's memory-efficient attention backward on one causal block in bf16 and fp32,
  against fp64 autograd, with the output as the kernel returned it and made contiguous.
Times: CUDA events, median of 5 after 2 warm-ups.
"""

from __future__ import annotations

import argparse
import json

import torch
from probe_kernels import Timer  # noqa: E402  (beside this script)


def timed(fn, reps: int = 5, warm: int = 2) -> float:
    """Median seconds of ``reps`` calls after ``warm`` warm-ups, CUDA events around each
    (`probe_kernels.Timer`)."""
    return Timer("cuda", reps, warm)(fn)


def classifier() -> None:
    from memo_exec.model import ChunkedHead  # noqa: PLC0415

    T, h, chunk = 32768, 4096, 8192
    for V in (50257, 50304):
        hf = torch.randn(T, h, device="cuda", dtype=torch.bfloat16) * 0.02
        w = torch.randn(V, h, device="cuda", dtype=torch.bfloat16) * 0.02
        tg = torch.randint(0, 50257, (T,), device="cuda")
        whole = timed(lambda: ChunkedHead.apply(hf, w, tg, chunk, None))
        hc = hf[:chunk]
        g = torch.randn(chunk, V, device="cuda", dtype=torch.bfloat16)
        d_hf = torch.empty_like(hc)
        d_w = torch.zeros_like(w)
        mm1 = timed(lambda: torch.mm(hc, w.t()))
        mm2 = timed(lambda: torch.mm(g, w, out=d_hf))
        mm3 = timed(lambda: d_w.addmm_(g.t(), hc))
        flops = 2 * chunk * V * h
        print(json.dumps({"probe": "classifier", "vocab": V, "tokens": T, "chunk": chunk, "whole_s": whole,
                          "logits_mm_s": mm1, "dhidden_mm_s": mm2, "dweight_addmm_s": mm3,
                          "tflops": {k: flops / t / 1e12 for k, t in (("logits", mm1), ("dhidden", mm2),
                                                                    ("dweight", mm3))}}), flush=True)
        del hf, w, g, d_hf, d_w


def optimizer() -> None:
    from memo_exec.optim import AdamW  # noqa: PLC0415

    h, f, V, L = 4096, 16384, 50257, 8
    shapes = [(V, h)] + [s for _ in range(L) for s in ((3 * h, h), (3 * h,), (h, h), (h,), (f, h), (f,), (h, f),
                                                       (h,), (h,), (h,), (h,), (h,))] + [(h,), (h,)]
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.02) for s in shapes]
    grads = {p: torch.randn(p.shape, device="cuda", dtype=torch.float32) * 1e-3 for p in params}
    n = sum(p.numel() for p in params)
    ours = AdamW(params, main_grads=grads)
    t_ours = timed(ours.step)
    masters = [torch.nn.Parameter(p.detach().float()) for p in params]
    for mp, p in zip(masters, params):
        mp.grad = grads[p]
    fused = torch.optim.AdamW(masters, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    def fused_step():
        fused.step()
        torch._foreach_copy_([p.data for p in params], [m.data for m in masters])

    t_fused = timed(fused_step)
    print(json.dumps({"probe": "optimizer", "params": n, "memo_adamw_s": t_ours, "torch_fused_adamw_plus_copy_s":
                      t_fused}), flush=True)


def efficient() -> None:
    import torch.nn.functional as F  # noqa: PLC0415

    from memo_exec import block_attention as BA  # noqa: PLC0415

    torch.manual_seed(0)
    for n in (64, 256):
        q, k, v, do = (torch.randn(2, 4, n, 64, device="cuda", dtype=torch.float64) for _ in range(4))
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        ref_o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        ref = torch.autograd.grad(ref_o, (qr, kr, vr), do)
        for dt in (torch.float32, torch.bfloat16):
            qq, kk, vv, dd = (t.to(dt) for t in (q, k, v, do))
            o, lse, seed, off = torch.ops.aten._scaled_dot_product_efficient_attention(qq, kk, vv, None, True, 0.0,
                                                                                       True)
            row = {"probe": "efficient", "n": n, "dtype": str(dt), "o_strides": list(o.stride()),
                   "lse_shape": list(lse.shape)}
            for name, oo in (("kernel_o", o), ("contiguous_o", o.contiguous())):
                g = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                    dd, qq, kk, vv, None, oo, lse, seed, off, 0.0, [True, True, True, False], True)
                row[name] = {x: float(((a.double() - b).norm() / b.norm()).item()) for x, a, b in
                             zip(("dq", "dk", "dv"), g[:3], ref)}
            try:
                with BA.use_kernel("efficient"):
                    o2, l2 = BA.block_forward(qq, kk, vv, True)
                    g2 = BA.block_backward(dd, qq, kk, vv, o2, l2, True)
                row["memo_block"] = {x: float(((a.double() - b).norm() / b.norm()).item()) for x, a, b in
                                     zip(("dq", "dk", "dv"), g2, ref)}
            except Exception as e:  # noqa: BLE001 - a probe reports
                row["memo_block"] = f"{type(e).__name__}: {e}"
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="classifier,optimizer,efficient")
    for name in ap.parse_args().only.split(","):
        try:
            {"classifier": classifier, "optimizer": optimizer, "efficient": efficient}[name]()
        except Exception as e:  # noqa: BLE001 - a probe reports
            print(json.dumps({"probe": name, "error": f"{type(e).__name__}: {e}"}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
