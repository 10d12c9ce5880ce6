#!/usr/bin/env python
"""PyTorch's own context-parallel merge and accumulation passes timed on one GPU, beside the bytes
`memo_sim.layout.ring_merge` counts for them (``torch_cp``), each case one JSON line:

    python3 benchmarks/gpu/probe_ring_merge.py [--out DIR]      # on a GPU
    python3 benchmarks/gpu/probe_ring_merge.py --dry-run        # tiny shapes on the CPU (tests the script)

Cases over one rank's output of 32K tokens x 32 heads x 128 (bf16, its log-sum-exp fp32), with
torch's `_SDPAMerger` and `_partial_update` (torch.distributed.tensor.experimental._context_parallel
._attention, or ._attention in older torch): a whole-output merge step (memo counts 38 B per output
element), a half-output (partial) step (27: 38 on half, and the torch.cat that rebuilds the whole),
a gradient ``+=`` of a bf16 step gradient into fp32 (10), a ``_partial_update`` add into the first
half (13), and the fp32 dK/dV torch.cat for a send (8 per element of each). Each line gives the time
and the bytes memo counts over it per second; a rate above the GPU's HBM bandwidth would mean the
count is too high. CUDA events, median of 5 after one warm-up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_kernels import Timer  # noqa: E402  (beside this script)

COUNTED = {"merge_full": 38, "merge_partial": 27, "grad_add": 10, "grad_partial_add": 13, "dkv_cat": 8}


def torch_cp():
    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "_SDPAMerger") and hasattr(mod, "_partial_update"):
            return name, mod
    raise SystemExit("error: this torch has no _SDPAMerger / _partial_update (torch.distributed.tensor.experimental)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    dev = "cpu" if a.dry_run else "cuda"
    H, S, d = (4, 256, 16) if a.dry_run else (32, 32768, 128)
    where, cp = torch_cp()
    bf = torch.bfloat16
    rows = [{"case": "env", "torch": torch.__version__, "module": where,
             "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"}]
    merger = cp._SDPAMerger(True, seq_dim=2)
    merger.step(torch.randn(1, H, S, d, device=dev, dtype=bf), torch.randn(1, H, S, device=dev), False)
    full_o, full_l = torch.randn(1, H, S, d, device=dev, dtype=bf), torch.randn(1, H, S, device=dev)
    half_o, half_l = torch.randn(1, H, S // 2, d, device=dev, dtype=bf), torch.randn(1, H, S // 2, device=dev)
    acc = torch.zeros(1, H, S, d, device=dev)
    step_full = torch.randn(1, H, S, d, device=dev, dtype=bf)
    step_half = torch.randn(1, H, S // 2, d, device=dev, dtype=bf)
    dk, dv = torch.zeros(1, H, S, d, device=dev), torch.zeros(1, H, S, d, device=dev)

    def grad_add():
        acc.add_(step_full)

    cases = {
        "merge_full": lambda: merger.step(full_o, full_l, False),
        "merge_partial": lambda: merger.step(half_o, half_l, True),
        "grad_add": grad_add,
        "grad_partial_add": lambda: cp._partial_update(acc, step_half, dim=2, n_chunks=2, idx=0, add=True),
        "dkv_cat": lambda: torch.cat([dk.flatten(), dv.flatten()]),
    }
    elems = H * S * d
    for name, fn in cases.items():
        t = Timer(dev, 5)(fn)
        n = 2 * elems if name == "dkv_cat" else elems
        rows.append({"case": name, "s": t, "elements": n, "counted_bytes_per_element": COUNTED[name],
                     "counted_gb_per_s": COUNTED[name] * n / t / 1e9})
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        tmp = Path(a.out) / "ring_merge.json.tmp"
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(Path(a.out) / "ring_merge.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
