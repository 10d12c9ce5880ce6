"""Peak memory and step time against sequence length for several layouts (e.g. METP against
Megatron TP+SP and Ulysses), and where two of them cross.

Each point is the best plan of one layout at one length among the policies asked for (the
what-if's ranking restricted to that layout: plans that fit first, then throughput), estimated
(tier 1) and, where it fits, simulated (tier 2). With one policy it is that policy's plan.
`crossover_seq` finds the length from which one layout's step time is no longer above another's
(interpolated in log2 of the length), and the first length only one of them fits.

`policy_run` is one run of ``memo-sim sweep-seq`` (a policy at a length, simulated). `in_order` runs
independent calls (these sweeps' points and runs, maxseq's policies) in a pool of forked processes
with the serial run's results, in the same order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial
from typing import Callable, TypeVar

from memo_sim.engine.result import SimResult
from memo_sim.engine.simulate import Progress, simulate
from memo_sim.errors import MemoError
from memo_sim.forked import FORKS
from memo_sim.layout.alloc_conf import gpu_limit_bytes
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.layout.schedule import schedule_runs_policy
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy, policy_class
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.estimate import memo_alpha
from memo_sim.search.pipeline import pipeline_memo_alpha
from memo_sim.search.whatif import Candidate, make_candidate

T = TypeVar("T")


def in_order(calls: list[Callable[[], T]], jobs: int = 1, done: Callable[[], None] = lambda: None) -> list[T]:
    """The results of ``calls`` (argument-free callables: `functools.partial` of module-level functions, which a
    pool can send), in the calls' order. ``jobs`` > 1 runs them in a pool of that many forked processes, where the
    platform forks (the calls share nothing, so the results are the serial ones); ``done()`` is called as each
    call finishes (a progress bar's tick). A call that raises stops the serial run there; pooled, the calls after
    the first one in order that raised are cancelled, and its error is raised once the calls before it finished."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if jobs < 1:
        raise MemoError(f"--jobs must be at least 1, got {jobs}")
    jobs = min(jobs, len(calls))
    if jobs <= 1 or not FORKS:
        out = []
        for call in calls:
            out.append(call())
            done()
        return out
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(call) for call in calls]
        index = {f: i for i, f in enumerate(futures)}
        first_refused = len(futures)
        for f in as_completed(futures):
            if f.cancelled():
                continue
            i = index[f]
            if f.exception() is not None:  # the serial run stops at its first refusal: the calls after it are moot
                if i < first_refused:
                    first_refused = i
                    for later in futures[i + 1:]:
                        later.cancel()
                continue
            done()
        # in the calls' order: the first refused call's error is raised (the calls before it finished), as serially
        return [f.result() for f in futures]


def policy_run(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: str, profile: HardwareProfile,
               schedule: str | None = None, micro_batch: int | None = None) -> SimResult:
    """``policy`` (a name) on ``layout`` at ``seq`` tokens, simulated (one run of ``memo-sim sweep-seq``): SPPO
    as the what-if's SPPO search finds it for this layout and length (`memo_sim.search.sppo.resolve_for_layout`:
    the same N, partition and multiplexing, so a plan-sppo.json comes back as written at its own length), a policy
    that takes an alpha (MEMO) at its solved alpha (0 where the solver finds none), the others under ``schedule``
    (None: the policy's own) in micro-batches of ``micro_batch`` sequences."""
    from memo_sim.engine.simulate import simulate  # noqa: PLC0415 - looked up at the call, as the command did
    # (tests/test_output_sets.py replaces the engine's simulate to see that no run starts before --out is checked)

    if schedule_runs_policy("sppo", policy):
        from memo_sim.search.sppo import resolve_for_layout  # noqa: PLC0415

        pol = resolve_for_layout(model, layout, batch, seq, profile).policy
        return simulate(model, layout, batch, seq, pol, profile, keep_timeline=False)
    alpha = None
    if policy_class(policy).takes_alpha:
        if layout.pp > 1 and schedule is not None:  # the search's pipeline solve (`memo_sim.search.pipeline`)
            a = pipeline_memo_alpha(model, layout, batch, micro_batch or batch, seq, profile, schedule)
        else:
            a = memo_alpha(model, layout, micro_batch, seq, profile)
        alpha = a.alpha if a.feasible else 0.0
    return simulate(model, layout, batch, seq, get_policy(policy, alpha), profile, schedule=schedule,
                    micro_batch=micro_batch, keep_timeline=False)


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
    # the tier of status, iteration_s, mfu and tgs: "simulated" (the event simulator ran the plan) or "analytic"
    # (the estimate; also where the plan does not fit on paper); None for an invalid layout (no tier priced it).
    # The peak (peak_gpu_bytes) is the analytic one either way.
    tier: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _best(cands: list[Candidate]) -> Candidate:
    return sorted(cands, key=Candidate.sort_key)[0]


def sweep_layouts(model: ModelConfig, layouts: dict[str, Layout], seqs: list[int], profile: HardwareProfile,
                  policies: tuple[str, ...], *, batch: int = 1, simulate_fit: bool = True,
                  progress: Progress | None = None, jobs: int = 1) -> list[SeqPoint]:
    """One `SeqPoint` per (series, length): the best of ``policies`` on that layout (`sweep_series`)."""
    return sweep_series(model, [(label, lay, policies) for label, lay in layouts.items()], seqs, profile,
                        batch=batch, simulate_fit=simulate_fit, progress=progress, jobs=jobs)


def sweep_series(model: ModelConfig, series: list[tuple[str, Layout, tuple[str, ...]]], seqs: list[int],
                 profile: HardwareProfile, *, batch: int = 1, simulate_fit: bool = True,
                 progress: Progress | None = None, jobs: int = 1) -> list[SeqPoint]:
    """One `SeqPoint` per (label, layout, policies) of ``series`` and length, in that order: the best of its
    policies on its layout. ``jobs`` > 1: the points in that many processes (`in_order`), the same points;
    ``progress(done, total)`` as each comes in."""
    calls = [partial(_point, model, label, lay, s, profile, pols, batch, simulate_fit)
             for label, lay, pols in series for s in seqs]
    count = [0]

    def tick() -> None:
        count[0] += 1
        if progress is not None:
            progress(count[0], len(calls))
    return in_order(calls, jobs, tick)


def _point(model: ModelConfig, label: str, lay: Layout, s: int, profile: HardwareProfile, policies: tuple[str, ...],
           batch: int, simulate_fit: bool) -> SeqPoint:
    """Series ``label``'s point at ``s`` tokens: the best of ``policies`` on ``lay``, simulated where it fits."""
    cap = gpu_limit_bytes(profile, lay.alloc_conf)
    why = check_layout(lay, model, lay.gpus, profile.node_gpus, s, batch)
    if why:
        return SeqPoint(label, lay.label(), s, "-", "invalid", math.nan, None, None, None, None, 0.0, cap, why)
    c = _best([make_candidate(model, lay, p, batch, s, profile, None) for p in policies])
    pt = SeqPoint(label, lay.label(), s, c.policy.label(), c.memory.status, c.memory.peak_gpu_bytes, None,
                  c.estimate.iteration_s, None, None, 0.0, cap, tier="analytic")
    if simulate_fit and c.memory.status == "OK":
        r = simulate(model, lay, batch, s, c.policy, profile, keep_timeline=False)
        pt.status, pt.tier = r.status, "simulated"
        if r.ok:
            pt.iteration_s, pt.mfu, pt.tgs, pt.exposed_p2p_s = r.iteration_s, r.mfu, r.tgs, r.exposed_p2p_s
    elif c.memory.status == "OK":
        pt.iteration_s, pt.mfu, pt.tgs = c.estimate.iteration_s, c.estimate.mfu, c.estimate.tgs
    return pt


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
