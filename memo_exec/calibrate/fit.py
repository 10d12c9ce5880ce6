"""Turn raw measurements into profile numbers: efficiency curves, latency + bandwidth, peaks.

- `fit_efficiency_curve`: measured ``(flops, achieved / peak)`` points -> a monotone
  (non-decreasing) piecewise-linear curve in log10(FLOPs), the form `memo_sim` reads
  (`memo_sim.profile.schema.Curve`). Points are grouped into bins of ``1 / bins_per_decade``
  decades, each bin gives its median efficiency at its median log10(FLOPs), and a weighted
  pool-adjacent-violators pass (isotonic regression) makes the sequence non-decreasing.
  Efficiencies are clipped into (0, 1].
- `fit_latency_bandwidth`: ``t = latency + bytes / bandwidth`` by least squares on the relative
  error, so that small transfers (latency-bound) and large ones (bandwidth-bound) count alike.

Pure Python (no torch): unit-tested on synthetic points.
"""

from __future__ import annotations

import math
import statistics

from memo_sim.errors import MemoError

MIN_EFF = 1e-4


def _pav(ys: list[float], ws: list[float]) -> list[float]:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, w in zip(ys, ws):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, n2 = blocks.pop()
            y1, w1, n1 = blocks.pop()
            blocks.append([(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for y, _w, n in blocks:
        out.extend([y] * int(n))
    return out


def _round_sig(x: float, sig: int = 4) -> float:
    if x == 0:
        return 0.0
    return float(f"{x:.{sig - 1}e}")


def fit_efficiency_curve(points: list[tuple[float, float]], bins_per_decade: int = 2) -> list[list[float]]:
    """Measured ``(flops, efficiency)`` -> sorted, monotone ``[[flops, eff], ...]`` with eff in (0, 1].

    Raises `MemoError` when there is no usable point (flops <= 0 or efficiency not finite).
    """
    if bins_per_decade < 1:
        raise MemoError("bins_per_decade must be >= 1")
    good = [(math.log10(f), min(1.0, max(MIN_EFF, e))) for f, e in points
            if f > 0 and math.isfinite(f) and math.isfinite(e) and e > 0]
    if not good:
        raise MemoError("cannot fit an efficiency curve: no measured point with positive FLOPs and efficiency")
    good.sort()
    bins: dict[int, list[tuple[float, float]]] = {}
    for lx, e in good:
        bins.setdefault(math.floor(lx * bins_per_decade), []).append((lx, e))
    xs, ys, ws = [], [], []
    for key in sorted(bins):
        members = bins[key]
        xs.append(statistics.median(m[0] for m in members))
        ys.append(statistics.median(m[1] for m in members))
        ws.append(float(len(members)))
    ys = _pav(ys, ws)
    out: list[list[float]] = []
    for lx, y in zip(xs, ys):
        f = _round_sig(10 ** lx)
        e = min(1.0, max(MIN_EFF, round(y, 4)))
        if out and f <= out[-1][0]:
            out[-1][1] = max(out[-1][1], e)
            continue
        if out and e < out[-1][1]:  # rounding must not break monotonicity
            e = out[-1][1]
        out.append([f, e])
    return out


def relative_least_squares(pts: list[tuple[float, float]]) -> tuple[float, float] | None:
    """``(latency, seconds per byte)`` minimising the relative error of ``t = latency + size x
    per_byte`` over ``(size, time)`` points (rows ``[1/t, size/t] . [latency, per_byte] = 1``), or
    None when fewer than two points or the system is (nearly) singular."""
    if len(pts) < 2:
        return None
    a11 = sum(1 / t ** 2 for s, t in pts)
    a12 = sum(s / t ** 2 for s, t in pts)
    a22 = sum(s * s / t ** 2 for s, t in pts)
    b1 = sum(1 / t for s, t in pts)
    b2 = sum(s / t for s, t in pts)
    det = a11 * a22 - a12 * a12
    if det <= 1e-9 * a11 * a22:
        return None
    return (a22 * b1 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det


def fit_latency_bandwidth(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """Fit ``t = latency + size / bandwidth``; return ``(bandwidth bytes/s, latency s)``.

    Least squares on the relative error (rows ``[1/t, size/t] . [lat, 1/bw] = 1``); a negative
    latency is clamped to 0 and the bandwidth refitted through the origin.
    """
    pts = [(float(s), float(t)) for s, t in zip(sizes, times) if s > 0 and t > 0]
    if len(pts) < 1:
        raise MemoError("cannot fit latency and bandwidth: no positive (size, time) point")
    sol = relative_least_squares(pts)
    if sol is not None and sol[0] >= 0 and sol[1] > 0:
        return 1.0 / sol[1], sol[0]
    # latency 0: minimise sum((s*x/t - 1)^2) -> x = sum(s/t) / sum(s^2/t^2)
    inv_bw = sum(s / t for s, t in pts) / sum((s / t) ** 2 for s, t in pts)
    return 1.0 / inv_bw, 0.0


def curve_is_monotone(points: list[list[float]]) -> bool:
    return (all(0 < p[1] <= 1 for p in points)
            and all(b[0] > a[0] and b[1] >= a[1] for a, b in zip(points, points[1:])))


def fit_copy_model(sizes: list[float], times: list[float], large_from: float = 8 * 2**20,
                   small_upto: float = 64 * 2**10) -> tuple[float, float]:
    """Copy bandwidth from the large transfers, latency from the small ones: ``(bandwidth, latency)``.

    Bandwidth: `fit_latency_bandwidth` over the sizes >= ``large_from`` (the two largest sizes if
    fewer than two are that large), so that cache-resident middle sizes do not inflate it. Latency: the
    median over the sizes <= ``small_upto`` of ``t - size / bandwidth`` (clamped at 0); without
    small sizes, the fit's own intercept.
    """
    pts = [(float(s), float(t)) for s, t in zip(sizes, times) if s > 0 and t > 0]
    if not pts:
        raise MemoError("cannot fit a copy model: no positive (size, time) point")
    large = [p for p in pts if p[0] >= large_from]
    if len(large) < 2:
        large = sorted(pts)[-2:]
    bw, lat = fit_latency_bandwidth([p[0] for p in large], [p[1] for p in large])
    small = [max(0.0, t - s / bw) for s, t in pts if s <= small_upto]
    if small:
        lat = statistics.median(small)
    return bw, lat


SCORE_TIME_HEADROOM = 0.8  # the score term may take at most this share of any measured case's time


def fit_score_time(cases: list[tuple[tuple, float, float, float]]) -> tuple[float, list[float]]:
    """Attention's time per score element beyond its FLOPs, from cases measured at two or more head
    sizes with the same (sequence, heads, batch).

    ``cases``: (group key, FLOPs, score elements, seconds). Within a group the score elements are
    equal and the FLOPs grow with the head size, so ``t = FLOPs / rate + elements * c`` has one
    rate and one ``c`` per group, solved from its smallest and largest head size (the rate is the
    one the FLOP curve then describes). Returns (the median ``c`` over the groups, clamped to 0 and
    to `SCORE_TIME_HEADROOM` of the smallest seconds per element of any case; the per-group
    values); (0.0, []) where no group has two head sizes."""
    groups: dict[tuple, list[tuple[float, float, float]]] = {}
    for key, f, e, t in cases:
        if f > 0 and e > 0 and t > 0:
            groups.setdefault(key, []).append((f, e, t))
    per_group = []
    for pts in groups.values():
        lo, hi = min(pts), max(pts)
        if hi[0] <= lo[0]:
            continue
        slope = (hi[2] - lo[2]) / (hi[0] - lo[0])  # seconds per FLOP
        per_group.append((lo[2] - slope * lo[0]) / lo[1])
    if not per_group:
        return 0.0, []
    cap = SCORE_TIME_HEADROOM * min(t / e for _k, _f, e, t in cases if e > 0 and t > 0)
    return min(cap, max(0.0, statistics.median(per_group))), per_group


def fit_call_latency(small: dict[str, tuple[float, float]], large: dict[str, tuple[float, float]],
                     weights: dict[str, float]) -> float:
    """Per-call latency of memory-bound ops from each op timed at two sizes: ``{op: (bytes, seconds)}``.
    For an op, latency = t_small - bytes_small * (t_large / bytes_large) (its own rate, taken at the
    large size where the latency is negligible); the mean over the ops weighted by ``weights``
    (their calls per layer, so that a layer's ops at the small size add up), at least 0."""
    lat = [(weights.get(op, 1.0), ts - bs * tl / bl) for op, (bs, ts) in small.items() if op in large
           for bl, tl in [large[op]] if bl > 0 and tl > 0]
    total = sum(w for w, _ in lat)
    return max(0.0, sum(w * x for w, x in lat) / total) if total > 0 else 0.0
