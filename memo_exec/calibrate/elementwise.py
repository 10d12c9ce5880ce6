"""Memory bandwidth of the device and the fraction of it that norms and activations reach.

- ``hbm_bandwidth``: the faster of a large device-to-device copy (read + write bytes) and a large
  add ``c = a + b`` (two reads and one write), bytes moved per second.
- ``elementwise``: one layer's memory-bound ops run the way `memo_exec.layer` runs them (layer
  norm with its statistics, residual add, GELU, and their backward), with bytes counted the way
  the simulator counts them (`memo_sim.cost.layer_time`: the op's input and output tensors,
  backward twice the forward), so that ``bytes / (hbm_bandwidth * elementwise)`` reproduces the
  measured time of the layer's memory-bound ops. Capped at 1.
"""

from __future__ import annotations

import torch

from memo_exec.calibrate.microbench import Bench, Progress, randn
from memo_exec.device import element_size

LN_EPS = 1e-5
# per layer: ln1, ln2 (norm); add1, add2 (add); act (gelu) -- see memo_sim.model.layer_graph
OPS_PER_LAYER = {"norm": 2, "add": 2, "act": 1}


def measure_copy_bandwidth(bench: Bench, nbytes: int, dtype: torch.dtype, progress: Progress) -> dict:
    e = element_size(dtype)
    n = max(1, nbytes // e)
    dev = bench.device
    a = torch.ones(n, device=dev, dtype=dtype)
    b = torch.ones(n, device=dev, dtype=dtype)
    c = torch.empty(n, device=dev, dtype=dtype)
    t_copy = bench.time(lambda: c.copy_(a))
    t_add = bench.time(lambda: torch.add(a, b, out=c))
    copy_bw = t_copy.rate(2 * n * e)
    add_bw = t_add.rate(3 * n * e)
    progress.step(f"{n * e / 2**20:.0f} MiB: copy {copy_bw / 1e9:.1f} GB/s, add {add_bw / 1e9:.1f} GB/s "
                  "(bytes read + written)")
    return {"bytes": n * e, "copy_bytes_per_s": copy_bw, "add_bytes_per_s": add_bw, "copy_s": t_copy.seconds,
            "add_s": t_add.seconds}


def measure_elementwise(bench: Bench, tokens: int, hidden: int, ffn: int, dtype: torch.dtype,
                        progress: Progress) -> dict:
    dev, e = bench.device, element_size(dtype)
    T, h, f = tokens, hidden, ffn
    def mk(*size):
        return randn(*size, device=dev, dtype=dtype)

    x, proj, y = mk(T, h), mk(T, h), torch.empty(T, h, device=dev, dtype=dtype)
    w, b = torch.ones(h, device=dev, dtype=dtype), torch.zeros(h, device=dev, dtype=dtype)
    ln = torch.empty(T, h, device=dev, dtype=dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    mean, rstd = torch.empty(T, device=dev, dtype=acc), torch.empty(T, device=dev, dtype=acc)
    fc1, act, d_act, d_fc1 = mk(T, f), torch.empty(T, f, device=dev, dtype=dtype), mk(T, f), \
        torch.empty(T, f, device=dev, dtype=dtype)
    dy = mk(T, h)
    st = {}

    def norm_fwd():
        o, m, r = torch.native_layer_norm(x, [h], w, b, LN_EPS)
        ln.copy_(o)
        mean.copy_(m.view(-1))
        rstd.copy_(r.view(-1))

    norm_fwd()

    def norm_bwd():
        st["n"] = torch.ops.aten.native_layer_norm_backward(dy, x, [h], mean.view(T, 1), rstd.view(T, 1), w, b,
                                                            [True, True, True])

    cases = {
        # name: (fn, simulator bytes, kind, phase)
        "norm_fwd": (norm_fwd, 2 * T * h * e, "norm", "fwd"),
        "add_fwd": (lambda: torch.add(x, proj, out=y), 3 * T * h * e, "add", "fwd"),
        "gelu_fwd": (lambda: torch.ops.aten.gelu.out(fc1, approximate="none", out=act), 2 * T * f * e, "act", "fwd"),
        "norm_bwd": (norm_bwd, 2 * 2 * T * h * e, "norm", "bwd"),
        "add_bwd": (lambda: y.add_(proj), 2 * 3 * T * h * e, "add", "bwd"),
        "gelu_bwd": (lambda: torch.ops.aten.gelu_backward.grad_input(d_act, fc1, approximate="none",
                                                                       grad_input=d_fc1), 2 * 2 * T * f * e,
                     "act", "bwd"),
    }
    rows = {}
    for name, (fn, nbytes, kind, _phase) in cases.items():
        tm = bench.time(fn)
        rows[name] = {"sim_bytes": nbytes, "seconds": tm.seconds, "bytes_per_s": tm.rate(nbytes), "kind": kind}
        progress.step(f"{name} T={T} h={h} f={f}: {tm.rate(nbytes) / 1e9:.1f} GB/s ({tm.seconds * 1e3:.3f} ms)")
    total_bytes = sum(r["sim_bytes"] * OPS_PER_LAYER[r["kind"]] for r in rows.values())
    total_s = sum(r["seconds"] * OPS_PER_LAYER[r["kind"]] for r in rows.values())
    if bench.cuda:
        torch.cuda.empty_cache()
    return {"tokens": T, "hidden": h, "ffn": f, "ops": rows, "layer_bytes": total_bytes, "layer_s": total_s,
            "layer_bytes_per_s": total_bytes / total_s}
