#!/usr/bin/env python
"""Which memory layouts of the scale tensors `torch._scaled_mm` takes, and reads as meant, for the FP8 block recipes
memo-exec runs (`memo_exec.gemm_scaled`): each combination of an operand pair's recipes (1 x 128 tiles on both, as
the weight gradient's GEMM; 1 x 128 by 128 x 128, as the forward's and the data gradient's) and of each scale
tensor's layout (as built, row-major; or the other way, its transpose made contiguous and transposed back), one JSON
line: refused (the error's first line) or the relative error of the product against the fp32 product of the
dequantised operands (a layout the kernel takes but reads otherwise shows as an error of order 1); at k = 512 (4
blocks along the reduction) and k = 384 (3: a grid whose column-major stride is not 16-byte aligned unpadded).

    python3 benchmarks/gpu/probe_scale_layouts.py [--out DIR]     # on a Hopper GPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_log import emit, write_results  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from memo_exec.gemm_scaled import column_major, expand_scales, quantize_blocks  # noqa: E402

# as built; column-major unpadded (what 2026-12-04's first try passed); column-major with 16-byte aligned strides
LAYOUTS = {"row_major": lambda s: s.contiguous(), "col_major": lambda s: s.t().contiguous().t(),
           "col_major_padded": column_major}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        emit(section="scale_layouts", error="skipped: needs a CUDA GPU")
        return 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for (m, k, n), pair, (bx, bw) in (((m, k, n), pair, blocks) for m, k, n in ((384, 512, 256), (256, 384, 384))
                                      for pair, blocks in {"1x128_by_1x128": ((1, 128), (1, 128)),
                                                           "1x128_by_128x128": ((1, 128), (128, 128))}.items()):
        x = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g)  # b = w^T: [k, n], column-major
        xq, xs = quantize_blocks(x, *bx)
        wq, ws = quantize_blocks(w, *bw)
        sa, sb = xs, ws.t()  # [m, k/128]; [k/128, n] or [k/128, n/128]
        ref = (xq.float() * expand_scales(sa, (m, k))) @ (wq.float() * expand_scales(ws, (n, k))).t()
        for la, fa in LAYOUTS.items():
            for lb, fb in LAYOUTS.items():
                sa_, sb_ = fa(sa), fb(sb)
                rec = dict(section="scale_layouts", m=m, k=k, n=n, pair=pair, scale_a=la, scale_a_stride=list(sa_.stride()),
                           scale_b=lb, scale_b_shape=list(sb_.shape), scale_b_stride=list(sb_.stride()))
                try:
                    out = torch._scaled_mm(xq, wq.t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.float32)
                    emit(**rec, rel_error=float((out - ref).norm() / ref.norm()))
                except Exception as e:  # noqa: BLE001
                    emit(**rec, error=f"{type(e).__name__}: {str(e).splitlines()[0]}"[:200])
    if a.out:
        write_results(a.out, "scale_layouts.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
