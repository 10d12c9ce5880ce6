#!/usr/bin/env python
"""The Hopper profiles' attention and FP8 GEMM curves, from the kernels measured on an H200
(`benchmarks/gpu/probe_kernels.py`, rows in reports/data/gpu-h200-2026-11-26-kernels.json):

    python benchmarks/gpu/hopper_curves.py [--data reports/data/gpu-h200-2026-11-26-kernels.json] [--write]

prints, as YAML points [FLOPs, efficiency] (``--write``: writes them, with their sources, into the
Hopper profiles, `PROFILES`, as the profiles' curves: the measured points, below the first of them
the profiles' earlier assumed points, `EARLIER`, that stay under it):

- attention_fwd / attention_bwd (FlashAttention-2: SDPA's flash backend) and attention_cudnn_fwd /
  attention_cudnn_bwd (SDPA's cuDNN backend, cuDNN 9.19): causal cases only (training's kernel;
  ring CP's non-causal blocks are listed apart), 1K-128K tokens, 32 or 8 heads of 128, batch 1 or 4;
  efficiency = FLOPs / time / 989 TFLOP/s (the H100/H200 SXM dense bf16 datasheet peak; the two
  share the GH100 die, its 132 SMs and clocks, so a compute-bound kernel's fraction of the peak
  carries over from the H200 to the H100 SXM); the forward's x its FLOPs (causal: 2*b*s^2*H*d),
  the backward's 2.5x that (the simulator's convention, `memo_sim.cost.kernel_time`); cases with
  the same FLOPs merged by their median.
- gemm (``--write`` only): the bf16 GEMM curve `memo-exec calibrate --quick` fitted on an H100 and on
  an H200 on 2026-11-26, their short GEMMs timed by CUDA-graph replay
  (`memo_exec.calibrate.microbench.Bench.time_kernel`).

The attention rows are the H200's for all three profiles: the same probe on an H100 (700 W, the same
day, reports/data/gpu-h100-2026-11-26-kernels.json) ran each of the 27 cases that took 1 ms or more on
the H200 within 6% of the H200's time, forward and backward, but one (cuDNN's forward at 8K tokens x
8 heads x batch 4: 0.88x): `h100_check`.
- gemm_fp8: FP8 e4m3 tensor-wise `torch._scaled_mm` (bf16 output) over the swept layer-GEMM shapes,
  efficiency against the 1979 TFLOP/s dense FP8 peak, binned per half decade of FLOPs, median per
  bin, then made non-decreasing (as `memo-exec calibrate` fits its bf16 curve); beside it the same
  for bf16 `torch.mm` over the same shapes.
- gemm_fp8_rowwise / gemm_fp8_blockwise: FP8 e4m3 `torch._scaled_mm` with row-wise scales (one per row of each
  operand: torchao's rowwise recipe) and with block-wise ones (1 x 128 activation tiles, 128 x 128 weight blocks:
  DeepSeek-V3's recipe, TransformerEngine's Float8BlockScaling), timed in one run with tensor-wise and bf16 beside
  them on every shape of the sweep on 2026-12-04 (`probe_kernels.py --only gemm_scaled`, rows in
  reports/data/gpu-h200-2026-12-04-kernels-scaled.json, ``--scaled-data``; in torch 2.11 the block-wise call runs
  cuBLASLt's VEC128_32F / BLK128x128_32F scale modes). Each is the tensor-wise curve (the 2026-11-26 one, kept)
  divided by the format's time over tensor-wise's on the same shapes in that run (`scaled_time_ratios`: median per
  half decade of FLOPs over the shapes where both took 100 us or more, linear in log10 FLOPs between bins and flat
  beyond them; a bin under 1 is kept at 1: the format's kernel does tensor-wise's MMAs and more,
  `GemmFormat.no_faster_than`), so a curve rests on a ratio measured in one run, not on two runs' absolute speeds
  (two runs that day on two fresh machines put tensor-wise at 0.681 and 0.643 of the FP8 peak at the top, 2026-11-26's
  at 0.665; their ratios differ by less: printed beside the curves). The ratios are from the second run, every other
  shape in the reverse order: the first, every shape in one order (tensor-wise first), ran block-wise 0.98-1.16x
  and row-wise 1.00-1.02x (reports/data/gpu-h200-2026-12-04-kernels-scaled-call1.json); whichever recipe ran first
  after the bf16 GEMM ran 1-3% slower in the second.

Cases that ran under MIN_KERNEL_S are left out: the probe (and `memo-exec calibrate`'s GEMM suite)
times one launch between two CUDA events, so a short kernel's time is the host's launch interval
(about 22-35 us per event-wrapped call on the lent machines: the bf16 GEMMs of 5e8-2e9 FLOPs all took
22 us in the H200 calibration, and the probe's backward, (forward + backward) - forward, carries
autograd's CPU work), not the kernel's; and a case that ran longer than a larger case of the same
kernel is left out too (time cannot fall as the work grows: the probe's smallest backward, 5e9 FLOPs
at 1K tokens x 8 heads, took 0.51 ms where 4x the FLOPs took 0.23 ms). Below the first point kept, the profile keeps its earlier
(assumed) points, so a curve's small end is an assumption, named in its source.

Nothing here is compared with a published run: the curves are kernel measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PEAK_BF16, PEAK_FP8 = 989e12, 1979e12
MIN_KERNEL_S = 100e-6  # about 3x the event-wrapped launch interval (module docs)


def monotone_in_time(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (FLOPs, efficiency) cases whose time (FLOPs / efficiency) is not above that of any larger case."""
    return [(x, y) for x, y in points if all(x / y <= x2 / y2 for x2, y2 in points if x2 > x)]


def merged(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    by = defaultdict(list)
    for x, y in monotone_in_time(points):
        by[float(f"{x:.4g}")].append(y)
    return [(x, round(statistics.median(ys), 4)) for x, ys in sorted(by.items())]


def attention(rows: list[dict]) -> dict[str, list]:
    out = {}
    for backend, key in (("flash", "attention"), ("cudnn", "attention_cudnn")):
        fwd, bwd = [], []
        for r in rows:
            if r.get("section") not in ("attention", "attention_short") or r.get("backend") != backend:
                continue
            if "error" in r or not r.get("causal"):
                continue
            flops = r["fwd_flops"]  # batch included
            if r["fwd_s"] >= MIN_KERNEL_S:
                fwd.append((flops, flops / r["fwd_s"] / PEAK_BF16))
            if r.get("bwd_s") and r["bwd_s"] >= MIN_KERNEL_S:
                bwd.append((2.5 * flops, 2.5 * flops / r["bwd_s"] / PEAK_BF16))
        out[f"{key}_fwd"], out[f"{key}_bwd"] = merged(fwd), merged(bwd)
    return out


def binned(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    bins = defaultdict(list)
    for x, y in points:
        bins[math.floor(2 * math.log10(x))].append((x, y))
    pts = []
    for k in sorted(bins):
        xs, ys = zip(*bins[k])
        pts.append((float(f"{statistics.median(xs):.4g}"), statistics.median(ys)))
    best, out = 0.0, []
    for x, y in pts:  # non-decreasing, as the calibrated bf16 curve
        best = max(best, y)
        out.append((x, round(best, 4)))
    return out


def checked_recipes(rows: list[dict]) -> set[str]:
    """The recipes whose output matched the product of their dequantised operands (relative error under 2e-2) on
    some scale layout: a recipe whose scales the kernel ignored gives no curve."""
    return {r["recipe"] for r in rows if r.get("section") == "gemm_scaled" and r.get("check") == "numerics"
            and r["rel_error"] < 2e-2}


def scaled_time_ratios(rows: list[dict], recipe: str = "blockwise") -> list[tuple[float, float, int]]:
    """Per half decade of FLOPs: (median FLOPs, median of ``recipe``'s time over tensor-wise's on the same shape in
    the same run, shapes), over the shapes where both took MIN_KERNEL_S or more."""
    bins = defaultdict(list)
    for r in rows:
        if (r.get("section") == "gemm_scaled" and f"{recipe}_s" in r and "tensorwise_s" in r
                and min(r[f"{recipe}_s"], r["tensorwise_s"]) >= MIN_KERNEL_S):
            bins[math.floor(2 * math.log10(r["flops"]))].append((r["flops"], r[f"{recipe}_s"] / r["tensorwise_s"]))
    return [(float(f"{statistics.median(x for x, _ in v):.4g}"), round(statistics.median(y for _, y in v), 3), len(v))
            for _, v in sorted(bins.items())]


def _ratio_at(ratios: list[tuple[float, float, int]], x: float) -> float:
    """The time ratio at ``x``: linear in log10 FLOPs between the bins, flat beyond them, at least 1 (module docs)."""
    xs = [math.log10(r[0]) for r in ratios]
    lx = math.log10(x)
    if lx <= xs[0]:
        r = ratios[0][1]
    elif lx >= xs[-1]:
        r = ratios[-1][1]
    else:
        i = next(j for j in range(1, len(xs)) if xs[j] >= lx)
        w = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
        r = ratios[i - 1][1] + w * (ratios[i][1] - ratios[i - 1][1])
    return max(1.0, r)


def gemm_scaled(rows: list[dict], tensorwise: list[tuple[float, float]]) -> dict[str, list]:
    """The row-wise and block-wise FP8 curves: the tensor-wise curve's measured points (``tensorwise``, FLOPs and
    efficiency) over each format's same-run time ratio (module docs)."""
    out = {}
    for recipe, name in (("rowwise", "gemm_fp8_rowwise"), ("blockwise", "gemm_fp8_blockwise")):
        ratios = scaled_time_ratios(rows, recipe)
        if recipe in checked_recipes(rows) and "tensorwise" in checked_recipes(rows) and ratios:
            out[name] = [(x, round(y / _ratio_at(ratios, x), 4)) for x, y in tensorwise]
    return out


def same_run_curves(rows: list[dict]) -> dict[str, list]:
    """Each recipe's own absolute curve from the 2026-12-04 run (printed beside the profile curves, not written)."""
    return {f"same_run_{recipe}": binned([(r["flops"], r[f"{recipe}_eff"]) for r in rows
                                          if r.get("section") == "gemm_scaled" and r.get(f"{recipe}_s", 0) >= MIN_KERNEL_S])
            for recipe in ("tensorwise", "rowwise", "blockwise")}


def gemm(rows: list[dict]) -> dict[str, list]:
    fp8, bf16 = [], []
    for r in rows:
        if r.get("section") != "gemm_shapes" or "error" in r:
            continue
        if r["bf16_s"] >= MIN_KERNEL_S:
            bf16.append((r["flops"], r["bf16_eff"]))
        if "fp8_eff" in r and r["fp8_s"] >= MIN_KERNEL_S:
            fp8.append((r["flops"], r["fp8_eff"]))
    return {"gemm_fp8": binned(fp8), "gemm_bf16_same_shapes": binned(bf16)}


DATA = "reports/data/gpu-h200-2026-11-26-kernels.json"
SCALED_DATA = "reports/data/gpu-h200-2026-12-04-kernels-scaled.json"
# the Hopper profiles' assumed points before these measurements (identical in the three, at 423c115)
EARLIER = {
    "gemm": [[1e9, 0.20], [1e10, 0.45], [1e11, 0.65], [1e12, 0.75], [1e14, 0.78]],
    "attention_fwd": [[1e9, 0.073], [1e10, 0.18], [1e11, 0.29], [1e12, 0.33], [1e14, 0.35]],
    "attention_bwd": [[1e9, 0.058], [1e10, 0.15], [1e11, 0.23], [1e12, 0.28], [1e14, 0.29]],
    "attention_cudnn_fwd": [[1e9, 0.10], [1e10, 0.25], [1e11, 0.40], [1e12, 0.45], [1e14, 0.48]],
    "attention_cudnn_bwd": [[1e9, 0.08], [1e10, 0.20], [1e11, 0.32], [1e12, 0.38], [1e14, 0.40]],
}
EARLIER["gemm_fp8"] = EARLIER["gemm"]  # FP8 GEMMs ran at the bf16 curve's fractions of the FP8 peak
EARLIER["gemm_fp8_rowwise"] = EARLIER["gemm_fp8_blockwise"] = EARLIER["gemm"]  # the same, no faster than tensorwise
# the curves a profile keeps under efficiency.gemm_formats, by the GEMM format they price
FORMAT_CURVES = {"gemm_fp8": "fp8-tensorwise", "gemm_fp8_rowwise": "fp8-rowwise", "gemm_fp8_blockwise": "fp8-blockwise"}
# a curve's kernel class for the 500 W part's clock ratios (power_clock.CASES): the FP8 GEMM measured there was
# tensor-wise; row-wise and block-wise run the same tensor-core MMAs (assumed to draw as it does)
RATIO_CLASS = {"gemm_fp8_rowwise": "gemm_fp8", "gemm_fp8_blockwise": "gemm_fp8"}
CALIBRATED = {"h100": "benchmarks/gpu/plans/h100-calibrated-graph-2026-11-26.yaml",  # short GEMMs by graph replay
              "h200": "benchmarks/gpu/plans/h200-calibrated-graph-2026-11-26.yaml"}
H100_CHECK = "reports/data/gpu-h100-2026-11-26-kernels.json"
# profile: (the calibration whose GEMM curve it takes, a note on the part, its board power limit where it is
# below the 700 W at which every curve here was measured: None, or watts)
PROFILES = {"hardware_profiles/h100-sxm5-80gb.yaml": ("h100", "", None),
            "hardware_profiles/h100-sxm5-96gb-500w.yaml": (
                "h100", "; measured at 700 W on the SXM parts, then each point times the SM clock a 500 W limit "
                        "leaves under that kernel class on the same silicon, from the board power and clock sampled "
                        "on a 700 W H100 (benchmarks/gpu/power_clock.py over reports/data/gpu-h100-2026-11-26-power*: "
                        "{ratios})", 500.0),
            "hardware_profiles/h200-141gb.yaml": ("h200", "", None)}
_H200 = ("measured on one NVIDIA H200 (GH100: the H100 SXM's 132 SMs and clocks at 700 W, so a compute-bound kernel's "
         "fraction of the 989 TFLOP/s dense bf16 peak carries over), torch 2.11.0+cu130, cuDNN 9.19.0, 2026-11-26: ")
_RULES = ("cases under 100 us (the event-wrapped launch interval's range) or slower than a larger case left out "
          "(benchmarks/gpu/hopper_curves.py over " + DATA + "); below {first:.3g} FLOPs the earlier assumed points")
_SCALED = ("the fp8-tensorwise curve's measured points divided by this format's time over tensor-wise's, measured on "
           "one NVIDIA H200 (700 W), torch 2.11.0+cu130 (CUDA 13.0), 2026-12-04: FP8 e4m3 torch._scaled_mm with bf16 "
           "output, the two recipes timed one after the other on each of 218 layer-GEMM shapes (tokens 2K-32K x in "
           "1K-14K x out 1K-28K), each recipe's output checked against the product of its dequantised operands "
           "(relative error 1.7e-3), the time ratio's median per half decade of FLOPs over the shapes where both "
           "took 100 us or more ({ratios}), linear in log10 FLOPs between them, flat beyond, at least 1 "
           "(benchmarks/gpu/hopper_curves.py over " + SCALED_DATA + "); below the first measured point the "
           "earlier assumed points; ")
SOURCES = {
    "attention_fwd": _H200 + "(an H100 ran 26 of the 27 cases of 1 ms or more within 6% of these times, "
                             + H100_CHECK + ") SDPA's flash backend (FlashAttention-2) forward, causal, 1K-128K tokens, 32 or 8 heads of "
                             "128, batch 1 or 4, CUDA events, median of 3; x = forward FLOPs (2*b*s^2*H*d); " + _RULES,
    "attention_bwd": _H200 + "SDPA's flash backend (FlashAttention-2) backward (the same cases); x = 2.5x the forward "
                             "FLOPs; " + _RULES,
    "attention_cudnn_fwd": _H200 + "SDPA's cuDNN backend (cuDNN's fused attention, TransformerEngine's FusedAttention "
                                   "on Hopper) forward, the same cases; cuDNN 9.19's kernel (the 2024 frameworks ran "
                                   "older cuDNN releases, not measured here); " + _RULES,
    "attention_cudnn_bwd": _H200 + "SDPA's cuDNN backend backward, the same cases; x = 2.5x the forward FLOPs; cuDNN "
                                   "9.19's kernel; " + _RULES,
    "gemm_fp8": _H200 + "FP8 e4m3 torch._scaled_mm with tensor-wise scales and bf16 output over 218 layer-GEMM shapes "
                        "(tokens 2K-32K x in 1K-14K x out 1K-28K), efficiency against the 1979 TFLOP/s dense fp8 "
                        "peak, binned per half decade of FLOPs, median per bin, non-decreasing (the same shapes in "
                        "bf16 reach 0.70 of the bf16 peak at the top, FP8 0.67 of its own); " + _RULES,
    "gemm_fp8_rowwise": _SCALED + "row-wise: one fp32 scale per row of each operand along the reduction (torchao's "
                                  "rowwise recipe), applied in the kernel's epilogue",
    "gemm_fp8_blockwise": _SCALED + "block-wise: one fp32 scale per 1 x 128 tile of the activation and per 128 x 128 "
                                    "block of the weight (DeepSeek-V3's recipe; cuBLASLt's VEC128_32F and "
                                    "BLK128x128_32F scale modes, which TransformerEngine's block-scaling grouped "
                                    "GEMM sets too), applied per 128 of the reduction in the main loop",
}
GEMM_SOURCE = {
    kind: (f"measured by memo-exec calibrate --quick on one NVIDIA {gpu}, torch 2.11.0+cu130, 2026-11-26: 144 bf16 "
           "GEMMs (the GPT layer's QKV, out-proj, FC1, FC2 in fwd/dgrad/wgrad forms, h in (1024, 4096, 8192), TP in "
           "(1, 8), T in (2048, 8192)), those under 1 ms timed by CUDA-graph replay, per call (an event pair around "
           "one launch times the host's launch interval: 22-44 us for every GEMM under about 2e10 FLOPs), binned per "
           "half decade of FLOPs, median per bin, non-decreasing (" + CALIBRATED[kind] + ")")
    for kind, gpu in (("h100", "H100 80GB HBM3 (SXM, 700 W)"), ("h200", "H200"))
}


def h100_check() -> list[tuple]:
    """(case, H100 / H200 forward time, backward time) for the attention cases both GPUs ran that took 1 ms or
    more on the H200 (module docs)."""
    def key(r):
        return (r["section"], r.get("backend"), r.get("s"), r.get("heads"), r.get("batch", 1), r.get("causal"),
                r.get("block"))
    h200 = {key(r): r for r in json.loads((REPO / DATA).read_text())["rows"] if "fwd_s" in r}
    out = []
    for r in json.loads((REPO / H100_CHECK).read_text())["rows"]:
        b = h200.get(key(r))
        if b is None or "fwd_s" not in r or b["fwd_s"] < 1e-3:
            continue
        out.append((key(r), r["fwd_s"] / b["fwd_s"], r["bwd_s"] / b["bwd_s"]))
    return out


def calibrated_gemm(kind: str) -> list:
    """The calibration's GEMM points (all of them: its short GEMMs were graph-timed)."""
    return [tuple(p) for p in yaml.safe_load((REPO / CALIBRATED[kind]).read_text())["efficiency"]["gemm"]["points"]]


def with_earlier(name: str, measured: list, below: list | None = None) -> list:
    """The measured points, and below the first of them the ``below`` points (default: the earlier assumed
    ones) that stay under it."""
    x0, y0 = measured[0]
    return [(x, y) for x, y in (EARLIER[name] if below is None else below) if x < x0 and y <= y0] + list(measured)


def profile_gemm(kind: str) -> list:
    """A Hopper profile's bf16 GEMM curve (module docs)."""
    return calibrated_gemm(kind)


def _num(x: float) -> str:
    """A YAML float (YAML 1.1 reads '1e+09' as a string: the mantissa keeps its point)."""
    m, e = f"{x:.3e}".split("e")
    m = m.rstrip("0")
    return f"{m}0e{e}" if m.endswith(".") else f"{m}e{e}"


def _flow(pts) -> str:
    return "[" + ", ".join(f"[{_num(x)}, {y}]" for x, y in pts) + "]"


def _power_clock():
    import importlib.util  # beside this script

    spec = importlib.util.spec_from_file_location("power_clock", Path(__file__).resolve().parent / "power_clock.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def profile_points(path: str, name: str, measured: list) -> tuple[list, str]:
    """A Hopper profile's curve ``name`` (``gemm``, an attention curve or ``gemm_fp8``) from the measured
    points, and the note its source ends with: the measured points (the GEMM's as calibrated, the others
    above the earlier assumed ones, `with_earlier`), on a part limited below 700 W each point times the
    clock ratio `power_clock.ratio_at` gives at its x (module docs of power_clock.py)."""
    kind, note, limit = PROFILES[path]
    pts = measured if name == "gemm" else with_earlier(name, measured)
    if limit is None:
        return pts, note
    pc = _power_clock()
    ratios = pc.curve_ratios(limit)[RATIO_CLASS.get(name, name)]
    scaled = [(x, round(y * pc.ratio_at(ratios, x), 4)) for x, y in pts]
    words = ", ".join(f"{r:.3f} at {x:.3g} FLOPs" for x, r in ratios)
    return scaled, note.replace("{ratios}", f"{limit:g} W leaves {words}, flat beyond the ends")


def ratio_words(rows: list[dict]) -> dict[str, str]:
    """Each ratio-derived curve's measured ratios, as its source names them."""
    return {f"gemm_fp8_{recipe}": ", ".join(f"{r} at {x:.3g} FLOPs ({n} shapes)" for x, r, n in
                                            scaled_time_ratios(rows, recipe)) for recipe in ("rowwise", "blockwise")}


def write(curves: dict, ratios: dict[str, str] | None = None) -> None:
    for path, (kind, _note, _limit) in PROFILES.items():
        f = REPO / path
        text = f.read_text()
        fields = dict(curves)
        fields["gemm"] = profile_gemm(kind)
        formats: dict[str, str] = {}
        for name, measured in fields.items():
            if name not in EARLIER:
                continue
            pts, note = profile_points(path, name, measured)
            src = (GEMM_SOURCE[kind] if name == "gemm" else SOURCES[name]).replace(
                "{first:.3g}", f"{measured[0][0]:.3g}").replace("{ratios}", (ratios or {}).get(name, "")) + note
            src_yaml = json.dumps(src)  # a double-quoted YAML scalar
            if name in FORMAT_CURVES:
                formats[FORMAT_CURVES[name]] = (
                    f"    {FORMAT_CURVES[name]}:\n      x: FLOP\n      points: {_flow(pts)}\n      source: {src_yaml}\n")
                continue
            pat = re.compile(rf"  {name}:\n    x: FLOP\n    points: .*\n    source: .*\n")
            new = f"  {name}:\n    x: FLOP\n    points: {_flow(pts)}\n    source: {src_yaml}\n"
            text, n = pat.subn(lambda m: new, text)
            if n != 1:
                raise SystemExit(f"{path}: efficiency.{name} not found once")
        if formats:  # efficiency.gemm_formats, in FORMAT_CURVES' order, after the cuDNN backward curve
            block = "  gemm_formats:\n" + "".join(formats[n] for n in FORMAT_CURVES.values() if n in formats)
            pat = re.compile(r"  gemm_formats:\n(?:    .*\n)+")
            if pat.search(text):
                text = pat.sub(lambda m: block, text)
            else:
                m = re.search(r"  attention_cudnn_bwd:\n    x: FLOP\n    points: .*\n    source: .*\n", text)
                text = text[:m.end()] + block + text[m.end():]
        tmp = f.with_suffix(".yaml.tmp")
        tmp.write_text(text)
        tmp.replace(f)
        print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / DATA))
    ap.add_argument("--scaled-data", default=str(REPO / SCALED_DATA))
    ap.add_argument("--write", action="store_true", help="write the curves into the Hopper profiles")
    a = ap.parse_args()
    rows = json.loads(Path(a.data).read_text())["rows"]
    scaled = json.loads(Path(a.scaled_data).read_text())["rows"]
    curves = {**attention(rows), **gemm(rows)}
    curves.update(gemm_scaled(scaled, curves["gemm_fp8"]))
    if a.write:
        write({k: v for k, v in curves.items() if k in EARLIER}, ratio_words(scaled))
        return 0
    for name, pts in curves.items():
        print(f"{name}: [{', '.join(f'[{x:.4g}, {y}]' for x, y in pts)}]")
    for recipe in ("blockwise", "rowwise"):
        print(f"# {recipe} / tensorwise time, same shapes, same run: "
              + ", ".join(f"{r} at {x:.3g} FLOPs ({n})" for x, r, n in scaled_time_ratios(scaled, recipe)))
    for name, pts in same_run_curves(scaled).items():
        print(f"# {name} (2026-12-04, not written): [{', '.join(f'[{x:.4g}, {y}]' for x, y in pts)}]")
    ring = [r for r in rows if r.get("section") == "ring" and "block" in r and "fwd_s" in r]
    for r in ring:
        print(f"# ring block {r['backend']} {r['block']} {r['s_q']}x{r['s_kv']} causal={r['causal']}: "
              f"fwd {r['fwd_tflops']:.0f} TFLOP/s, bwd {r['bwd_tflops']:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
