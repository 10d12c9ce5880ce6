"""Physical plausibility of a calibration, checked before the profile is written.

A fit can be wrong without being malformed: a noisy or shared machine times a small kernel
slowly and a big one quickly, or an attention backward faster than its forward. The profile
would load, and every plan made with it would be wrong. These checks name such fits:

* **monotone in size**: on each efficiency curve (GEMM, attention forward, attention
  backward) the kernel time ``flops / (peak x efficiency(flops))`` must not fall as the
  kernel grows (a larger problem never takes less time). Checked at the curve's points.
* **backward slower than forward**: for every measured attention problem, the backward (2.5x the
  forward's FLOPs, `memo_sim.model.flops.ATTN_BWD_FACTOR`) must take at least the forward's
  time, measured and as the fitted curves predict it.
* **copy rates below the link's**: a fitted host-copy bandwidth (d2h, h2d) must not exceed the
  device-memory bandwidth nor, on CUDA, the PCIe switch uplink it shares; the duplex total must
  not exceed the sum of the two directions.

``TOLERANCE`` (10%) absorbs timing noise. The caller (`memo_exec.calibrate.command.calibrate`)
re-measures the parts with findings once (`memo_exec.calibrate.suite.remeasure`); what is still
implausible then is flagged, not hidden and not silently "fixed": a ``warning:`` line on stderr
per finding, and the profile records them under ``provenance.sanity`` (the ``checks`` run, the
parts ``remeasured``, the ``warnings`` left), so a plan made with the profile can be traced to
them; re-run the calibration on an idle machine to replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.model.flops import ATTN_BWD_FACTOR
from memo_sim.profile.schema import HardwareProfile

TOLERANCE = 0.10  # relative slack for timing noise
CHECKS = ("kernel time monotone in size (gemm, attention_fwd, attention_bwd)",
          "attention backward not faster than forward (measured and fitted)",
          "host copy rates not above the device memory or PCIe switch bandwidth")


@dataclass(frozen=True)
class Finding:
    check: str  # "monotone" | "backward_vs_forward" | "copy_rate"
    field: str  # the profile field it concerns
    message: str

    @property
    def part(self) -> str:
        """The part of the suite that measured it (`memo_exec.calibrate.suite.REMEASURABLE`)."""
        if self.check == "copy_rate":
            return "copies"
        return "gemm" if self.field == "efficiency.gemm" else "attention"

    def line(self) -> str:
        return f"{self.field}: {self.message}"


def _curve_times(name: str, points, peak: float) -> list[Finding]:
    out = []
    times = [(f, f / (peak * e)) for f, e in points]
    for (f0, t0), (f1, t1) in zip(times, times[1:]):
        if t1 < t0 * (1 - TOLERANCE):
            out.append(Finding("monotone", f"efficiency.{name}",
                               f"a {f1:.3g}-FLOP kernel is fitted {t0 / t1:.2f}x faster than a {f0:.3g}-FLOP one "
                               f"({t1 * 1e3:.3g} ms < {t0 * 1e3:.3g} ms): time must not fall as the size grows"))
            break
    return out


def check(profile: HardwareProfile, raw: dict, dtype: str) -> list[Finding]:
    """The implausible fits of a calibration: ``profile`` as it would be written, ``raw`` the
    suite's results (`memo_exec.calibrate.suite.run_suite`), ``dtype`` the peak's dtype."""
    peak = profile.peak(dtype)
    eff = profile.efficiency
    found: list[Finding] = []
    for name in ("gemm", "attention_fwd", "attention_bwd"):
        found += _curve_times(name, getattr(eff, name).points, peak)

    worst = None
    for r in raw.get("attention", {}).get("rows", []):
        if r["bwd_s"] < r["fwd_s"] * (1 - TOLERANCE):
            ratio = r["fwd_s"] / r["bwd_s"]
            if worst is None or ratio > worst[0]:
                worst = (ratio, r)
    if worst is not None:
        ratio, r = worst
        found.append(Finding("backward_vs_forward", "efficiency.attention_bwd",
                             f"measured backward {ratio:.1f}x faster than forward at s={r['seq']} heads={r['heads']} "
                             f"d={r['head_dim']} ({r['bwd_s'] * 1e3:.3g} ms < {r['fwd_s'] * 1e3:.3g} ms)"))
    for f, _e in eff.attention_fwd.points:
        t_fwd = f / (peak * eff.attention_fwd(f))
        t_bwd = ATTN_BWD_FACTOR * f / (peak * eff.attention_bwd(ATTN_BWD_FACTOR * f))
        if t_bwd < t_fwd * (1 - TOLERANCE):
            found.append(Finding("backward_vs_forward", "efficiency.attention_bwd",
                                 f"fitted backward {t_fwd / t_bwd:.1f}x faster than forward at {f:.3g} forward FLOPs"))
            break

    hl = profile.host_link
    caps = {"gpu.hbm_bandwidth": float(profile.gpu.hbm_bandwidth)}
    if raw.get("env", {}).get("device_kind") == "cuda":
        caps["host_link.pcie_switch_bandwidth"] = float(hl.pcie_switch_bandwidth)
    for d in ("d2h", "h2d"):
        bw = float(getattr(hl, f"{d}_bandwidth"))
        for cap_name, cap in caps.items():
            if bw > cap * (1 + TOLERANCE):
                found.append(Finding("copy_rate", f"host_link.{d}_bandwidth",
                                     f"{bw / 1e9:.2f} GB/s is above {cap_name} ({cap / 1e9:.2f} GB/s): a copy cannot "
                                     f"outrun the link or memory it goes through"))
    dup = raw.get("copies", {}).get("duplex")
    if dup and dup.get("total", 0) > (dup.get("d2h", 0) + dup.get("h2d", 0)) * (1 + TOLERANCE):
        found.append(Finding("copy_rate", "host.memory_bandwidth",
                             f"duplex total {dup['total'] / 1e9:.2f} GB/s exceeds d2h + h2d "
                             f"({(dup['d2h'] + dup['h2d']) / 1e9:.2f} GB/s)"))
    return found
