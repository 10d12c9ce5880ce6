"""GEMM throughput over the shapes a transformer layer runs, in the executor's own call forms.

A layer's GEMMs (see `memo_sim.model.layer_graph`) are QKV (h -> h + 2kv), the output
projection (h -> h), FC1 (h -> f or 2f) and FC2 (f -> h), on T tokens, with the weight's output
width split by tensor parallelism. `memo_exec.layer` runs each of them in three forms:

- ``fwd``:   ``out[T, o] = addmm(b, x[T, i], W[o, i].t())``
- ``dgrad``: ``dx[T, i] = mm(dy[T, o], W[o, i])``
- ``wgrad``: ``dW[o, i].addmm_(dy[T, o].t(), x[T, i])``

Every form does 2·T·i·o FLOPs. The efficiency curve is fitted over all of them against the
kernel's FLOPs, as `memo_sim.cost.kernel_time.gemm_time` looks it up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memo_exec.calibrate.microbench import Bench, Progress, randn

FORMS = ("fwd", "dgrad", "wgrad")


@dataclass(frozen=True)
class GemmShape:
    tokens: int  # T
    in_width: int  # i
    out_width: int  # o
    form: str
    label: str

    @property
    def flops(self) -> float:
        return 2.0 * self.tokens * self.in_width * self.out_width


def model_gemm_shapes(hiddens: list[int], tps: list[int], tokens: list[int], forms: tuple[str, ...] = FORMS,
                      ffn_mult: int = 4) -> list[GemmShape]:
    """The GPT layer's four GEMMs for each hidden size, TP degree and token count (deduplicated)."""
    seen: set[tuple[int, int, int, str]] = set()
    out: list[GemmShape] = []
    for h in hiddens:
        f = ffn_mult * h
        for tp in tps:
            if h % tp:
                continue
            layer = (("qkv", h, 3 * h // tp), ("out_proj", h // tp, h), ("fc1", h, f // tp), ("fc2", f // tp, h))
            for t in tokens:
                for name, i, o in layer:
                    for form in forms:
                        key = (t, i, o, form)
                        if key in seen:
                            continue
                        seen.add(key)
                        out.append(GemmShape(t, i, o, form, f"{name} h={h} tp={tp}"))
    return sorted(out, key=lambda s: s.flops)


def _runner(shape: GemmShape, device: torch.device, dtype: torch.dtype):
    def mk(*size):
        return randn(*size, device=device, dtype=dtype, scale=0.1)

    t, i, o = shape.tokens, shape.in_width, shape.out_width
    w = mk(o, i)
    if shape.form == "fwd":
        x, b, out = mk(t, i), mk(o), torch.empty(t, o, device=device, dtype=dtype)
        return lambda: torch.addmm(b, x, w.t(), out=out)
    if shape.form == "dgrad":
        dy, dx = mk(t, o), torch.empty(t, i, device=device, dtype=dtype)
        return lambda: torch.mm(dy, w, out=dx)
    if shape.form == "wgrad":
        dy, x, dw = mk(t, o), mk(t, i), torch.zeros(o, i, device=device, dtype=dtype)
        return lambda: dw.addmm_(dy.t(), x)
    raise ValueError(f"unknown GEMM form {shape.form!r}")


def run_gemms(bench: Bench, shapes: list[GemmShape], dtype: torch.dtype, progress: Progress) -> list[dict]:
    """Time every shape; one record per shape with its FLOPs, median seconds and FLOP/s."""
    progress.stage(f"GEMM throughput ({str(dtype).replace('torch.', '')})", len(shapes))
    rows = []
    for s in shapes:
        fn = _runner(s, bench.device, dtype)
        tm = bench.time_kernel(fn)
        rows.append({"tokens": s.tokens, "in": s.in_width, "out": s.out_width, "form": s.form, "label": s.label,
                     "flops": s.flops, "seconds": tm.seconds, "flops_per_s": tm.rate(s.flops),
                     "repeats": tm.repeats, "timing": tm.method, "calls_per_sample": tm.calls})
        progress.step(f"{s.form:5s} T={s.tokens} {s.in_width}x{s.out_width}: "
                      f"{tm.rate(s.flops) / 1e12:.3f} TFLOP/s ({tm.seconds * 1e3:.3f} ms)")
    if bench.cuda:
        torch.cuda.empty_cache()
    return rows
