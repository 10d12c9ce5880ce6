"""Causal attention forward and backward throughput vs sequence length, heads and head size.

The kernels are the executor's own backends (`memo_exec.attention`): the one ``auto`` picks
(flash-attn when installed, else torch's SDPA flash kernel on CUDA; the query-chunked math
backend on CPU) or the one named. FLOPs follow `memo_sim.model.flops`: forward
2·b·s²·(heads·head_dim) (causal half), backward 2.5x that; the efficiency curves are fitted
against those FLOPs, as `memo_sim.cost.kernel_time` looks them up.

Ring context parallelism runs its attention as c x c blocks on its own kernel
(`memo_exec.block_attention.kernel_for`; `memo_sim.cost.ring_attention` prices them). Where that
kernel is not the whole-sequence backend's (on a CPU: aten's flash kernel against the math
backend), `measure_ring_blocks` times one ring step's block as the executor runs it (its
`block_forward` on the strided chunk views, then `merge_` into the running output; backward
`block_backward` and the adds into dQ and the travelling dK/dV), full and causal, at the grid's
sequence lengths as c and its (heads, head size) pairs (the bench's fewest repeats: twelve blocks in
a quick CPU run), and fits the block kernel's own time per score element (from the full blocks at
two head sizes) and curves for each shape.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from memo_exec import block_attention
from memo_exec.arena import CachingScratch
from memo_exec.attention import AttnDims, select_backend
from memo_exec.calibrate.fit import SCORE_TIME_HEADROOM, fit_efficiency_curve, fit_score_time
from memo_exec.calibrate.microbench import Bench, Progress, randn
from memo_exec.device import acc_dtype
from memo_sim.model.flops import ATTN_BWD_FACTOR, attention_score_elements, causal_attention_flops

# whole-sequence backends (`memo_exec.attention`) that run the kernel a ring block runs
# (`memo_exec.block_attention.KERNELS`): aten's flash kernel (CUDA and CPU; flash-attn 2 is the same
# FlashAttention-2 kernel), its memory-efficient one
SAME_KERNEL = {"sdpa_flash": ("flash", "flash_cpu"), "flash_attn": ("flash",), "sdpa_efficient": ("efficient",)}


@dataclass(frozen=True)
class AttnCase:
    seq: int
    heads: int
    head_dim: int
    batch: int = 1

    @property
    def fwd_flops(self) -> float:
        return causal_attention_flops(self.batch, self.seq, self.heads * self.head_dim)

    @property
    def bwd_flops(self) -> float:
        return ATTN_BWD_FACTOR * self.fwd_flops

    def __str__(self) -> str:
        return f"s={self.seq} heads={self.heads} d={self.head_dim}"


def attention_cases(seqs: list[int], heads_dims: list[tuple[int, int]]) -> list[AttnCase]:
    cases = [AttnCase(s, h, d) for s in seqs for h, d in heads_dims]
    return sorted(cases, key=lambda c: c.fwd_flops)


def pick_backend(name: str, device: torch.device, dtype: torch.dtype, head_dim: int):
    """The backend the executor would use (probed on a tiny problem), as `select_backend` does."""
    return select_backend(name, device, dtype, AttnDims(1, 64, 1, 1, head_dim))


def _time_case(bench: Bench, be, c: AttnCase, dtype: torch.dtype) -> tuple:
    """(forward, backward) `Timing` of one case; its tensors are freed on return."""
    device = bench.device
    dims = AttnDims(c.batch, c.seq, c.heads, c.heads, c.head_dim)
    w = c.heads * c.head_dim
    q, k, v = (randn(dims.tokens, w, device=device, dtype=dtype, scale=0.5) for _ in range(3))
    out = torch.empty_like(q)
    dout = randn(dims.tokens, w, device=device, dtype=dtype, scale=0.1)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scratch = CachingScratch(device)
    state = {}

    def fwd():
        state["aux"] = be.forward(q, k, v, out, dims, scratch)

    def bwd():
        be.backward(dout, q, k, v, out, state["aux"], dq, dk, dv, dims, scratch)

    return bench.time(fwd), bench.time(bwd)


ROUNDS_CPU = 3  # CPU: each case timed once per round over all the cases (`rounds`)


def rounds(bench: Bench) -> int:
    """How many rounds over the cases the attention benchmarks make: on a CPU `ROUNDS_CPU`, each case's
    time the median of its rounds' medians. A shared machine runs slower for a second now and then
    (the other tenants of its cores); one pass times all the repeats of a case within one such phase
    and all of that case's repeats come out slow, so the calibration's attention rows moved 20-25%
    from one quick calibration to the next (s = 1024-2048, 8x32, 2-core AMD EPYC VM, 2026-11-26).
    Rounds spread a case's repeats over the whole stage. CUDA: one round (the GPU is not shared)."""
    return 1 if bench.cuda else ROUNDS_CPU


def timed_in_rounds(bench: Bench, cases: list, time_one, progress: Progress, what: str) -> list[tuple[float, float]]:
    """(forward, backward) seconds of each case: ``time_one(case)`` -> (forward `Timing`, backward `Timing`),
    called once per case per round (`rounds`), each case's time the median of its rounds."""
    n = rounds(bench)
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in cases]
    progress.stage(what + (f" ({n} rounds)" if n > 1 else ""), len(cases) * n)
    for _round in range(n):
        for c, (fs, bs) in zip(cases, times):
            tf, tb = time_one(c)
            fs.append(tf.seconds)
            bs.append(tb.seconds)
            progress.step(f"{c}: fwd {tf.seconds * 1e3:.2f} ms, bwd {tb.seconds * 1e3:.2f} ms")
    return [(statistics.median(fs), statistics.median(bs)) for fs, bs in times]


def run_attention(bench: Bench, cases: list[AttnCase], dtype: torch.dtype, backend_name: str,
                  progress: Progress) -> tuple[str, list[dict]]:
    """Time forward and backward of each case (`rounds`); return the backend's name and one record per case."""
    device = bench.device
    backends = {}

    def time_one(c: AttnCase):
        if c.head_dim not in backends:
            backends[c.head_dim] = pick_backend(backend_name, device, dtype, c.head_dim)
        return _time_case(bench, backends[c.head_dim], c, dtype)

    times = timed_in_rounds(bench, cases, time_one, progress, "causal attention forward + backward")
    rows = []
    for c, (f, b) in zip(cases, times):
        rows.append({"seq": c.seq, "heads": c.heads, "head_dim": c.head_dim, "batch": c.batch,
                     "fwd_flops": c.fwd_flops, "fwd_s": f, "fwd_flops_per_s": c.fwd_flops / f,
                     "bwd_flops": c.bwd_flops, "bwd_s": b, "bwd_flops_per_s": c.bwd_flops / b})
    if bench.cuda:
        torch.cuda.empty_cache()
    name = next(iter(backends.values())).name if backends else backend_name
    return name, rows


# ------------------------------------------------------------------------------ ring CP's blocks
@dataclass(frozen=True)
class BlockCase:
    """One c x c block of ring CP: full, or the causal diagonal one."""
    c: int
    heads: int
    head_dim: int
    causal: bool
    batch: int = 1

    @property
    def fwd_flops(self) -> float:
        full = 2.0 * causal_attention_flops(self.batch, self.c, self.heads * self.head_dim)
        return full / 2 if self.causal else full

    @property
    def bwd_flops(self) -> float:
        return ATTN_BWD_FACTOR * self.fwd_flops

    def __str__(self) -> str:
        return f"{'causal' if self.causal else 'full'} c={self.c} heads={self.heads} d={self.head_dim}"


def block_cases(sizes: list[int], heads_dims: list[tuple[int, int]]) -> list[BlockCase]:
    cases = [BlockCase(c, h, d, causal) for c in sizes for h, d in heads_dims for causal in (False, True)]
    return sorted(cases, key=lambda b: (b.fwd_flops, b.causal))


def ring_block_kernel(whole_backend: str, device: torch.device, dtype: torch.dtype,
                      head_dims: list[int]) -> tuple[str, str]:
    """(the ring's block kernel here, why it is or is not measured apart): ``""`` as the second
    where it is the whole-sequence backend's own kernel at every head size."""
    kernels = sorted({block_attention.kernel_for(device.type, dtype, d) for d in head_dims})
    name = "/".join(kernels)
    if all(k in SAME_KERNEL.get(whole_backend, ()) for k in kernels):
        return name, ""
    return name, f"the ring's blocks run {name}, the whole-sequence backend is {whole_backend}"


def _heads_view(t: torch.Tensor, b: int, s: int, heads: int, d: int) -> torch.Tensor:
    """A token-major ``[b*s, heads*d]`` tensor as ``[b, heads, s, d]`` (the ring's own view)."""
    return t.view(b, s, heads, d).permute(0, 2, 1, 3)


def _time_block(bench: Bench, c: BlockCase, dtype: torch.dtype, repeats: int) -> tuple:
    """(forward, backward) `Timing` of one ring step's block on a rank holding 2c tokens: queries of
    its second chunk against the first chunk's keys (full), or its first chunk against itself (causal),
    ``repeats`` times each."""
    device, b, h, d, s = bench.device, c.batch, c.heads, c.head_dim, 2 * c.c
    acc = acc_dtype(dtype)
    q, dout = (randn(b * s, h * d, device=device, dtype=dtype, scale=sc) for sc in (0.5, 0.1))
    kv = randn(b * s, 2 * h * d, device=device, dtype=dtype, scale=0.5)  # K and V as they travel the ring
    qb, dob = _heads_view(q, b, s, h, d), _heads_view(dout, b, s, h, d)
    kb, vb = _heads_view(kv[:, :h * d], b, s, h, d), _heads_view(kv[:, h * d:], b, s, h, d)
    qs, ks = (slice(0, c.c), slice(0, c.c)) if c.causal else (slice(c.c, s), slice(0, c.c))
    o = torch.zeros(b, h, s, d, dtype=acc, device=device)
    lse = torch.full((b, h, s), float("-inf"), dtype=acc, device=device)
    dq = torch.zeros(b, h, s, d, dtype=acc, device=device)
    part = torch.zeros(2, b, h, s, d, dtype=acc, device=device)

    def fwd():
        ob, lb = block_attention.block_forward(qb[:, :, qs], kb[:, :, ks], vb[:, :, ks], c.causal)
        block_attention.merge_(o[:, :, qs], lse[:, :, qs], ob, lb)

    fwd()
    out = o.to(dtype)

    def bwd():
        gq, gk, gv = block_attention.block_backward(dob[:, :, qs], qb[:, :, qs], kb[:, :, ks], vb[:, :, ks],
                                                    out[:, :, qs], lse[:, :, qs], c.causal)
        dq[:, :, qs] += gq
        part[0][:, :, ks] += gk
        part[1][:, :, ks] += gv

    # the call above, which made ``out``, is the forward's warm-up (a second one ran the block once more for nothing)
    return bench.time(fwd, repeats, warmup=0), bench.time(bwd, repeats)


def measure_ring_blocks(bench: Bench, sizes: list[int], heads_dims: list[tuple[int, int]], dtype: torch.dtype,
                        whole_backend: str, peak_value: float, progress: Progress,
                        extra_heads_dims: list[tuple[int, int]] = ()) -> dict:
    """Ring CP's blocks timed and fitted (`fit_ring_blocks`) where their kernel is not the whole-sequence
    backend's; else ``{"measured": False, ...}`` (the simulator prices them on the attention curves).
    ``extra_heads_dims`` (``--attention-shapes``) are timed too and kept apart (``extra_rows``): they go to
    the profile's measured times, not into the fits, which stay those of the grid."""
    kernel, why = ring_block_kernel(whole_backend, bench.device, dtype,
                                    sorted({d for _h, d in list(heads_dims) + list(extra_heads_dims)}))
    if not why:
        return {"measured": False, "kernel": kernel,
                "reason": f"the ring's blocks run {kernel}, the kernel of the whole-sequence backend {whole_backend}"}
    cases = block_cases(sizes, heads_dims)
    extra = block_cases(sizes, [hd for hd in extra_heads_dims if hd not in heads_dims])
    times = timed_in_rounds(bench, cases + extra, lambda c: _time_block(bench, c, dtype, bench.min_repeats), progress,
                            f"ring CP attention blocks ({kernel}) forward + backward")
    rows, extra_rows = [], []
    for c, (f, b) in zip(cases + extra, times):
        (rows if c in cases else extra_rows).append(
            {"c": c.c, "heads": c.heads, "head_dim": c.head_dim, "batch": c.batch, "causal": c.causal,
             "fwd_flops": c.fwd_flops, "fwd_s": f, "bwd_flops": c.bwd_flops, "bwd_s": b})
    fell = sorted({k[0] for k in block_attention.FALLBACKS if k[1] == bench.device.type and k[2] == dtype})
    if fell:  # a refused block ran on the math kernel: that is what was measured
        kernel = f"{kernel} (math where {'/'.join(fell)} refused)"
    if bench.cuda:
        torch.cuda.empty_cache()
    out = fit_ring_blocks({"measured": True, "kernel": kernel, "whole_backend": whole_backend, "reason": why,
                           "rows": rows, "extra_rows": extra_rows}, peak_value)
    progress.note(f"  ring blocks per score element beyond their FLOPs: forward {out['fwd_score_time'] * 1e9:.3f} ns, "
                  f"backward {out['bwd_score_time'] * 1e9:.3f} ns")
    return out


def fit_ring_blocks(blocks: dict, peak_value: float) -> dict:
    """``blocks`` with its fits (relative to ``peak_value``): the block kernel's time per score element
    (`fit_score_time` over the full blocks, grouped by (c, heads, batch); at most what leaves every
    block's FLOPs at or below the peak) and, beside it, the efficiency curves of the full blocks
    (``{fwd,bwd}_curve``) and of the causal ones (``causal_{fwd,bwd}_curve``); unchanged where
    nothing was measured."""
    if not blocks.get("measured"):
        return blocks
    out = dict(blocks, score_fit={}, clipped=0)
    rows = blocks["rows"]
    for ph in ("fwd", "bwd"):
        def case(r):
            return ((r["c"], r["heads"], r["batch"]), r[f"{ph}_flops"],
                    attention_score_elements(r["fwd_flops"], r["head_dim"]), r[f"{ph}_s"])
        cases = [case(r) for r in rows]
        st, per_group = fit_score_time([x for x, r in zip(cases, rows) if not r["causal"]])
        # as `fit_score_time` caps it over the full blocks, so over the causal ones; and no block's FLOPs
        # may run faster than the peak (a small block's per-call cost, the same at both head sizes, reads
        # as a per-element one in `fit_score_time`'s solve and would push a large block's FLOPs past it)
        st = min([st] + [SCORE_TIME_HEADROOM * t / e for _k, _f, e, t in cases if e > 0 and t > 0]
                 + [max(0.0, t - f / peak_value) / e for _k, f, e, t in cases if e > 0])
        out[f"{ph}_score_time"], out["score_fit"][ph] = st, per_group
        for causal, key in ((False, f"{ph}_curve"), (True, f"causal_{ph}_curve")):
            eff = [(f, f / (t - e * st) / peak_value) for (_k, f, e, t), r in zip(cases, rows) if r["causal"] == causal]
            out[key] = fit_efficiency_curve(eff)
            out["clipped"] += sum(1 for _f, x in eff if x > 1)
    return out
