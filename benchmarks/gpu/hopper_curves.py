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
# the Hopper profiles' assumed points before these measurements (identical in the three, at 423c115)
EARLIER = {
    "gemm": [[1e9, 0.20], [1e10, 0.45], [1e11, 0.65], [1e12, 0.75], [1e14, 0.78]],
    "attention_fwd": [[1e9, 0.073], [1e10, 0.18], [1e11, 0.29], [1e12, 0.33], [1e14, 0.35]],
    "attention_bwd": [[1e9, 0.058], [1e10, 0.15], [1e11, 0.23], [1e12, 0.28], [1e14, 0.29]],
    "attention_cudnn_fwd": [[1e9, 0.10], [1e10, 0.25], [1e11, 0.40], [1e12, 0.45], [1e14, 0.48]],
    "attention_cudnn_bwd": [[1e9, 0.08], [1e10, 0.20], [1e11, 0.32], [1e12, 0.38], [1e14, 0.40]],
}
EARLIER["gemm_fp8"] = EARLIER["gemm"]  # FP8 GEMMs ran at the bf16 curve's fractions of the FP8 peak
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
    ratios = pc.curve_ratios(limit)[name]
    scaled = [(x, round(y * pc.ratio_at(ratios, x), 4)) for x, y in pts]
    words = ", ".join(f"{r:.3f} at {x:.3g} FLOPs" for x, r in ratios)
    return scaled, note.replace("{ratios}", f"{limit:g} W leaves {words}, flat beyond the ends")


def write(curves: dict) -> None:
    for path, (kind, _note, _limit) in PROFILES.items():
        f = REPO / path
        text = f.read_text()
        fields = dict(curves)
        fields["gemm"] = profile_gemm(kind)
        for name, measured in fields.items():
            if name not in EARLIER:
                continue
            pts, note = profile_points(path, name, measured)
            src = (GEMM_SOURCE[kind] if name == "gemm" else SOURCES[name]).replace(
                "{first:.3g}", f"{measured[0][0]:.3g}") + note
            src_yaml = json.dumps(src)  # a double-quoted YAML scalar
            if name == "gemm_fp8":
                block = f"  gemm_formats:\n    fp8-tensorwise:\n      x: FLOP\n      points: {_flow(pts)}\n      source: {src_yaml}\n"
                pat = re.compile(r"  gemm_formats:\n    fp8-tensorwise:\n      x: FLOP\n      points: .*\n      source: .*\n")
                if pat.search(text):
                    text = pat.sub(lambda m: block, text)
                else:  # after the cuDNN backward curve
                    m = re.search(r"  attention_cudnn_bwd:\n    x: FLOP\n    points: .*\n    source: .*\n", text)
                    text = text[:m.end()] + block + text[m.end():]
                continue
            pat = re.compile(rf"  {name}:\n    x: FLOP\n    points: .*\n    source: .*\n")
            new = f"  {name}:\n    x: FLOP\n    points: {_flow(pts)}\n    source: {src_yaml}\n"
            text, n = pat.subn(lambda m: new, text)
            if n != 1:
                raise SystemExit(f"{path}: efficiency.{name} not found once")
        tmp = f.with_suffix(".yaml.tmp")
        tmp.write_text(text)
        tmp.replace(f)
        print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / DATA))
    ap.add_argument("--write", action="store_true", help="write the curves into the Hopper profiles")
    a = ap.parse_args()
    rows = json.loads(Path(a.data).read_text())["rows"]
    curves = {**attention(rows), **gemm(rows)}
    if a.write:
        write({k: v for k, v in curves.items() if k in EARLIER})
        return 0
    for name, pts in curves.items():
        print(f"{name}: [{', '.join(f'[{x:.4g}, {y}]' for x, y in pts)}]")
    ring = [r for r in rows if r.get("section") == "ring" and "block" in r and "fwd_s" in r]
    for r in ring:
        print(f"# ring block {r['backend']} {r['block']} {r['s_q']}x{r['s_kv']} causal={r['causal']}: "
              f"fwd {r['fwd_tflops']:.0f} TFLOP/s, bwd {r['bwd_tflops']:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
