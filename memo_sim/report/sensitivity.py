"""Which assumed inputs of an uncalibrated profile could change the what-if's ranking.

An uncalibrated profile's kernel efficiency curves (all of them: GEMM, FP8 and other formats' GEMMs,
FlashAttention-2, cuDNN and ring-block attention), host-link (PCIe) bandwidths and network
bandwidths are datasheet numbers or assumptions. `sensitivity_line` scales each group by its
plausible error, down and up (`PERTURBATIONS`), re-estimates the best fitting plans of the
ranking on the analytic tier (cheap: no simulation), scales each plan's ranked throughput (simulated where tier 2
ran it) by its analytic change, and says whether the answer stays the best of them.
A calibrated profile measured these inputs, so it gets no line.

Where the bound search left plans unsimulated (`memo_sim.search.prune`), the best of them by analytic estimate are
re-estimated too: a plan whose reach (its proved bound, or its analytic throughput times the largest simulated over
analytic ratio among the plans simulated, whichever is lower), scaled by its change, beats the answer's scaled
throughput under a perturbation could overtake it there. Up to `CHALLENGERS` of them are simulated
(copies: the ranking keeps its rows) and compared like the others; past that the line says "may change" for that
perturbation rather than "stays best" (a review: the default search said the answer stays best with network
bandwidth +25% where `--simulate-top all` showed it change).

The plausible errors are assumptions, printed with the line: kernel efficiency 20% (the largest
gap the fitted A800 profile shows against published runs is 17%, `tests/test_published_runs.py`),
host-link bandwidth 25% (pinned copies reach roughly three quarters of a PCIe link's datasheet
rate on common servers) and network bandwidth 25% (NCCL's bus bandwidth against the link's rate).
"""

from __future__ import annotations

from dataclasses import fields, replace

from memo_sim.errors import MemoError
from memo_sim.profile.schema import Curve, Efficiency, HardwareProfile, Quantity

PERTURBATIONS = {"kernel efficiency": 0.20, "host-link bandwidth": 0.25, "network bandwidth": 0.25}
CHECKED = 8  # fitting candidates re-estimated per perturbation
CHALLENGERS = 4  # unsimulated plans simulated at most, where their proved bound could overtake under a perturbation
TIE = 1e-9  # relative throughput difference below which two plans tie (a float residue, not a faster plan)


def _q(q: Quantity, f: float) -> Quantity:
    return Quantity(float(q) * f, q.source + f" (scaled x{f:g} for the sensitivity check)")


def _curve(c: Curve, f: float) -> Curve:
    return Curve(tuple((x, min(1.0, y * f)) for x, y in c.points), c.source)


def _efficiency_scaled(e: Efficiency, f: float) -> Efficiency:
    """``e`` with every efficiency curve it has scaled by ``f``: each `Curve` field of `Efficiency` (gemm, the
    FlashAttention-2 ``attention_*``, cuDNN's ``attention_cudnn_*``, ring CP's ``attention_block_*``) and each
    quantised GEMM format's own curve (``gemm_formats``), found by type so that a curve added to the schema is
    scaled too. Scaling only gemm and attention_fwd/bwd left a cuDNN or FP8 plan, priced on the other curves, almost
    where it was (a review: a B200 256K plan +2.6% where ~+24% was claimed). The per-call and per-score-element
    times and the elementwise share are not curves and stay as they are."""
    curves = {k.name: _curve(v, f) for k in fields(e) if isinstance(v := getattr(e, k.name), Curve)}
    return replace(e, **curves, gemm_formats=tuple((name, _curve(c, f)) for name, c in e.gemm_formats))


def perturbed(profile: HardwareProfile, what: str, f: float) -> HardwareProfile:
    """``profile`` with one group of assumed inputs scaled by ``f``."""
    if what == "kernel efficiency":
        return replace(profile, efficiency=_efficiency_scaled(profile.efficiency, f))
    if what == "host-link bandwidth":
        h = profile.host_link
        return replace(profile, host_link=replace(h, d2h_bandwidth=_q(h.d2h_bandwidth, f),
                                                  h2d_bandwidth=_q(h.h2d_bandwidth, f),
                                                  pcie_switch_bandwidth=_q(h.pcie_switch_bandwidth, f)))
    if what == "network bandwidth":  # the link's own and every collective's measured fit on it
        def link(lk):
            return replace(lk, bandwidth=_q(lk.bandwidth, f),
                           collectives={k: replace(c, bandwidth=_q(c.bandwidth, f)) for k, c in lk.collectives.items()})
        return replace(profile, nvlink=link(profile.nvlink), internode=link(profile.internode))
    raise ValueError(what)


def _label(c) -> str:
    return f"{c.layout.label()} {c.policy.label()}"


def _scores(cands, profile, alpha) -> list[float | None]:
    """Each candidate's analytic throughput on ``profile`` (None where it no longer fits)."""
    from memo_sim.search.whatif import make_candidate

    out = []
    for c in cands:
        try:
            e = make_candidate(c.model, c.layout, c.policy.name, c.batch, c.seq, profile,
                               alpha if c.policy.takes_alpha else None, micro_batch=c.micro_batch,
                               schedule=c.schedule)
        except MemoError:
            out.append(None)
            continue
        out.append(e.tgs if e.status == "OK" else None)
    return out


def _best(cands, base_scores, scores) -> str | None:
    """The best of ``cands`` under a perturbation: each one's ranked throughput (simulated where tier 2 ran it) scaled
    by its analytic throughput's change, so the plan compared is the answer, not the analytic tier's own best."""
    scored = [(c.tgs * s / b, _label(c)) for c, b, s in zip(cands, base_scores, scores) if b and s is not None]
    if not scored:
        return None
    top = max(t for t, _ in scored)
    # a tie (two plans of the same throughput, ZeRO 2 and 3 where nothing is gathered on the critical path) keeps the
    # ranked order's first, the answer where it is one of them: a label's alphabetical order is no change of plan
    return next(label for t, label in scored if t >= top * (1 - TIE))


def sensitivity(shown, profile: HardwareProfile, alpha: float | None = None) -> dict | None:
    """{group: {"-25%": best label, "+25%": best label}, "base": label, "answer": bool} over the answer and the best
    fitting single-stage and micro-batch-pipeline candidates of its tier (the simulated ones where the answer was
    simulated: an analytic row is an upper estimate, above a simulated one by design); "base" is the answer, or
    where the answer is an SPPO plan (whose own search is not re-run) the best other plan ("answer" False)."""
    ok = [c for c in shown if c.status == "OK"]
    if not ok:
        return None
    head = next((c for c in ok if c.sppo is None), None)
    if head is None:
        return None
    tier = head.simulated is not None
    cands = [c for c in ok if c.sppo is None and (c.simulated is not None) == tier][:CHECKED]
    if len(cands) < 2:
        return None
    base_scores = _scores(cands, profile, alpha)
    # the plans the bound search did not simulate (a simulated answer's tier), the best of them by analytic estimate,
    # each at most its proved bound and its analytic throughput times the largest simulated / analytic ratio of the
    # plans simulated here (the analytic tier's optimism, as this query measured it)
    from memo_sim.search.prune import tgs_upper_bound  # noqa: PLC0415

    others = [c for c in ok if c.sppo is None and tier and c.simulated is None][:CHECKED]
    k = max((c.tgs / c.estimate.tgs for c in cands if c.simulated and c.estimate.tgs), default=1.0)

    def reach_of(c) -> float:
        return min(tgs_upper_bound(c), c.estimate.tgs * max(1.0, k))
    other_base = _scores(others, profile, alpha)
    out = {"base": _label(head), "answer": head is ok[0], "checked": len(cands), "groups": {}, "unproved": {}}
    flagged = []  # (perturbation group, key, the checked plans' best scaled throughput, [(challenger, ratio)])
    for what, err in PERTURBATIONS.items():
        runs = {}
        for sign, s in (("-", -1), ("+", 1)):
            p = perturbed(profile, what, 1 + s * err)
            key = f"{sign}{100 * err:.0f}%"
            scores = _scores(cands, p, alpha)
            runs[key] = _best(cands, base_scores, scores)
            top = max((c.tgs * x / b for c, b, x in zip(cands, base_scores, scores) if b and x is not None),
                      default=None)
            over = [(c, x / b) for c, b, x in zip(others, other_base, _scores(others, p, alpha))
                    if top is not None and b and x is not None and reach_of(c) * x / b > top * (1 + TIE)]
            if over:
                flagged.append((what, key, top, over))
        out["groups"][what] = runs
    # the challengers, simulated in order of how far their scaled estimates reach, at most CHALLENGERS of them
    reach: dict[int, tuple[float, object]] = {}
    for _what, _key, top, over in flagged:
        for c, ratio in over:
            r = reach_of(c) * ratio / top
            if r > reach.get(id(c), (0.0, None))[0]:
                reach[id(c)] = (r, c)
    sims = {i: _simulated(c) for i, (_r, c) in sorted(reach.items(), key=lambda kv: -kv[1][0])[:CHALLENGERS]}
    for what, key, top, over in flagged:
        for c, ratio in over:
            sim = sims.get(id(c), "unsimulated")
            if sim == "unsimulated":
                out["unproved"].setdefault((what, key), _label(c))
            elif sim is not None and sim.tgs * ratio > top * (1 + TIE):
                top = sim.tgs * ratio
                out["groups"][what][key] = _label(c)
    return out


def _simulated(c):
    """A copy of candidate ``c`` simulated (tier 2, as the what-if simulates; the ranking keeps its row), None where
    it does not fit there."""
    import copy  # noqa: PLC0415

    from memo_sim.search.whatif import simulate_candidates  # noqa: PLC0415

    twin = copy.copy(c)
    simulate_candidates([twin])
    return twin if twin.simulated and twin.simulated.get("status") == "OK" else None


def sensitivity_line(shown, profile: HardwareProfile, alpha: float | None = None) -> str:
    """One line for an uncalibrated profile's answer; empty for a calibrated one."""
    if profile.calibrated:
        return ""
    s = sensitivity(shown, profile, alpha)
    if s is None:
        return ""
    stays, changes, unproved = [], [], []
    for what, runs in s["groups"].items():
        moved = {k: v for k, v in runs.items() if v != s["base"]}
        open_ = {k: s["unproved"][(what, k)] for k in runs if (what, k) in s.get("unproved", {}) and k not in moved}
        if moved:
            # None: none of the re-estimated plans fits under that perturbation
            changes.append(f"{what} " + ", ".join(f"{k} -> {v or 'none of them fits'}" for k, v in moved.items()))
        if open_:
            unproved.append(f"{what} " + ", ".join(f"{k} (to {v}, not simulated: its reach so scaled is above "
                                                   f"the answer's)" for k, v in open_.items()))
        if not moved and not open_:
            stays.append(f"{what} ±{next(iter(runs))[1:]}")
    who = "the answer" if s.get("answer", True) else "the best plan but SPPO's (whose search is not re-run)"
    head = (f"sensitivity (uncalibrated profile; the best {s['checked']} fitting plans of the answer's tier "
            f"re-estimated on the analytic tier, each from its ranked throughput): {who} {s['base']}")
    maybe = f"; may change with {'; '.join(unproved)}" if unproved else ""
    if not changes:
        return head + (" stays best with " + ", ".join(stays) if stays else "") + maybe
    return (head + " changes with " + "; ".join(changes) + (f" (stays with {', '.join(stays)})" if stays else "")
            + maybe)
