"""Peak memory and step time against sequence length for several layouts (e.g. METP against
Megatron TP+SP and Ulysses), and where two of them cross.

Each point is the best plan of one layout at one length among the policies asked for (the
what-if's ranking restricted to that layout: plans that fit first, then throughput), estimated
(tier 1) and, where it fits, simulated (tier 2). With one policy it is that policy's plan.
`crossover_seq` finds the length from which one layout's step time is no longer above another's
(interpolated in log2 of the length), and the first length only one of them fits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from memo_sim.engine.simulate import Progress, simulate
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.whatif import Candidate, make_candidate


@dataclass
class SeqPoint:
    label: str  # the series (layout, or layout and policy)
    layout: str
    seq: int
    policy: str  # the chosen plan's policy label
    status: str  # OK | OOM | OOHM | invalid
    peak_gpu_bytes: float  # analytic (tier 1) peak: also where the plan does not fit
    iteration_s: float | None  # simulated where it fits, else None
    analytic_iteration_s: float | None
    mfu: float | None
    tgs: float | None
    exposed_p2p_s: float
    gpu_capacity_bytes: float
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _best(cands: list[Candidate]) -> Candidate:
    return sorted(cands, key=Candidate.sort_key)[0]


def sweep_layouts(model: ModelConfig, layouts: dict[str, Layout], seqs: list[int], profile: HardwareProfile,
                  policies: tuple[str, ...], *, batch: int = 1, simulate_fit: bool = True,
                  progress: Progress | None = None) -> list[SeqPoint]:
    """One `SeqPoint` per (series, length): the best of ``policies`` on that layout."""
    out: list[SeqPoint] = []
    total, done = len(layouts) * len(seqs), 0
    cap = profile.usable_gpu_memory
    for label, lay in layouts.items():
        for s in seqs:
            why = check_layout(lay, model, lay.gpus, profile.node_gpus, s, batch)
            if why:
                out.append(SeqPoint(label, lay.label(), s, "-", "invalid", math.nan, None, None, None, None, 0.0,
                                    cap, why))
            else:
                c = _best([make_candidate(model, lay, p, batch, s, profile, None) for p in policies])
                pt = SeqPoint(label, lay.label(), s, c.policy.label(), c.memory.status, c.memory.peak_gpu_bytes, None,
                              c.estimate.iteration_s, None, None, 0.0, cap)
                if simulate_fit and c.memory.status == "OK":
                    r = simulate(model, lay, batch, s, c.policy, profile, keep_timeline=False)
                    pt.status = r.status
                    if r.ok:
                        pt.iteration_s, pt.mfu, pt.tgs, pt.exposed_p2p_s = r.iteration_s, r.mfu, r.tgs, r.exposed_p2p_s
                elif c.memory.status == "OK":
                    pt.iteration_s, pt.mfu, pt.tgs = c.estimate.iteration_s, c.estimate.mfu, c.estimate.tgs
                out.append(pt)
            done += 1
            if progress is not None:
                progress(done, total)
    return out


@dataclass(frozen=True)
class Crossover:
    a: str
    b: str
    time_seq: float | None  # the first length at which a's step time comes down to b's (both fit)
    crossings: tuple[tuple[float, str], ...]  # every meeting: (length, "a<=b" or "a>b" from there on)
    only_a_fits_seq: int | None  # the first length a fits and b does not
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


def _meet(s0: int, s1: int, d0: float, d1: float) -> float:
    """Length between s0 and s1 where the step-time difference (d0 at s0, d1 at s1) is 0, linear
    in log2 of the length."""
    x = math.log2(s0) + (math.log2(s1) - math.log2(s0)) * d0 / (d0 - d1)
    return 2.0 ** x


def crossover_seq(points: list[SeqPoint], a: str, b: str) -> Crossover:
    """Where series ``a`` meets series ``b``: every length (log2-interpolated between two swept
    lengths where both fit) at which the sign of a's minus b's step time changes; the first at
    which a comes down to b (``time_seq``; the shortest length if a is never slower); and the
    first length at which a fits and b does not."""
    pa = {p.seq: p for p in points if p.label == a}
    pb = {p.seq: p for p in points if p.label == b}
    seqs = sorted(set(pa) & set(pb))
    only = next((s for s in seqs if pa[s].status == "OK" and pb[s].status != "OK"), None)
    both = [s for s in seqs if pa[s].iteration_s is not None and pb[s].iteration_s is not None]
    diff = {s: pa[s].iteration_s - pb[s].iteration_s for s in both}
    crossings: list[tuple[float, str]] = []
    for s0, s1 in zip(both, both[1:]):
        if (diff[s0] > 0) != (diff[s1] > 0):
            crossings.append((_meet(s0, s1, diff[s0], diff[s1]), "a<=b" if diff[s1] <= 0 else "a>b"))
    if both and diff[both[0]] <= 0:
        crossings.insert(0, (float(both[0]), "a<=b"))
    t = next((x for x, d in crossings if d == "a<=b"), None)
    if not both:
        note = "no length where both fit"
    elif t is None:
        note = f"{a} slower than {b} at every length where both fit"
    else:
        note = "; ".join(f"{'comes down to' if d == 'a<=b' else 'rises above'} {b}'s step time at "
                         f"{x / 1024:.0f}K tokens" for x, d in crossings)
    if only is not None:
        note += f"; only {a} fits from {only // 1024}K tokens"
    return Crossover(a, b, t, tuple(crossings), only, note)
