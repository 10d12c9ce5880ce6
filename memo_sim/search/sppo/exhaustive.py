"""The exhaustive branch and bound over SPPO's space, and the search that pairs it with the
heuristic (`memo_sim.search.sppo`'s "Exhaustive search")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from memo_sim.cost.sppo import PARTITIONS
from memo_sim.layout.parallel import Layout, enumerate_pipeline_layouts
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.sppo.grid import edge_subseqs, search_points
from memo_sim.search.sppo.heuristic import heuristic_choice
from memo_sim.search.sppo.points import SppoPoint, _rank_key
from memo_sim.search.sppo.solve import _lower_bound, bound_plan, point_alive, solve_point


@dataclass
class SppoSearch:
    """What the SPPO planner found: the heuristic's choice, the exhaustive search's best, every
    solved point (best first) and the layouts rejected."""

    heuristic: SppoPoint | None
    heuristic_note: str
    best: SppoPoint | None  # exhaustive, analytic tier
    points: list[SppoPoint]
    space_size: int
    solved: int
    rejected_layouts: list[tuple[Layout, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"heuristic": self.heuristic.to_dict() if self.heuristic else None,
                "heuristic_note": self.heuristic_note, "exhaustive_best": self.best.to_dict() if self.best else None,
                "space_size": self.space_size, "solved_points": self.solved,
                "points": [p.to_dict() for p in self.points]}

@dataclass(frozen=True)
class Pricing:
    """The bounding pass's points (``(layout, N, partition, multiplex)`` in the search's order) and
    how to price one: `price` its lower bound (`_lower_bound`, the expensive part: the overlap
    threshold's piece timings and the bounding estimate), `alive` whether `price` gives one at all
    (cheap: the partition and the memory floor), `rebuild` it from the seconds and the overlap
    threshold another process priced (cheap, and the same values: `bound_plan`)."""

    model: ModelConfig
    batch: int
    seq: int
    profile: HardwareProfile
    points: list

    def price(self, i: int) -> tuple[float, Sppo] | None:
        lay, n, part, mux = self.points[i]
        return _lower_bound(self.model, lay, self.batch, self.seq, self.profile, n, part, mux)

    def alive(self, i: int) -> bool:
        lay, n, part, _mux = self.points[i]
        return point_alive(self.model, lay, self.batch, self.seq, self.profile, n, part)

    def rebuild(self, i: int, seconds: float, threshold: float) -> tuple[float, Sppo] | None:
        lay, n, part, mux = self.points[i]
        pol = bound_plan(self.model, lay, self.batch, self.seq, self.profile, n, part, mux, threshold)
        return None if pol is None else (seconds, pol)


def exhaustive_search(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                      tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                      subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                      multiplex: tuple[bool, ...] = (False, True), keep: int = 4, max_solves: int = 400,
                      bounds: Callable[[Pricing], list] | None = None,
                      ) -> tuple[list[SppoPoint], int, int, list[tuple[Layout, str]]]:
    """Branch and bound over the space (module docs): (solved points best first, space size,
    points solved, rejected layouts). ``bounds(pricing)``: each point's lower bound, in the
    points' order, priced some other way than one after the other here (SPPO's search beside the
    rest shares the bounding pass with the parent process: `memo_sim.search.sppo.shared_bounds`)."""
    layouts, rejected = enumerate_pipeline_layouts(model, gpus, profile.node_gpus, seq, tp=tp, pp=pp, dp=dp,
                                                   zero=zero)
    # each layout's points as one fixed layout's search tries them (`search_points`, `solve.resolve_for_layout`)
    points: list[tuple[Layout, int, str, bool]] = [(lay, *p) for lay in layouts
                                                   for p in search_points(lay, seq, subseqs, partitions, multiplex)]
    size = len(points)
    pricing = Pricing(model, batch, seq, profile, points)
    values = bounds(pricing) if bounds is not None else [pricing.price(i) for i in range(size)]
    space: list[tuple[float, Layout, Sppo]] = [(lb[0], pt[0], lb[1]) for pt, lb in zip(points, values)
                                               if lb is not None]
    # rank by the throughput bound: tokens per GPU per second at the lower-bound time
    space.sort(key=lambda t: t[0] / t[1].dp)
    solved: list[SppoPoint] = []
    fits: list[SppoPoint] = []

    def solve(lb: float, lay: Layout, pol: Sppo) -> None:
        pt = solve_point(model, lay, batch, seq, profile, pol.subseqs, pol.partition, pol.multiplex, pol.bounds, lb,
                         pol.threshold_bytes)
        solved.append(pt)
        if pt.status == "OK":
            fits.append(pt)
            fits.sort(key=lambda p: p.estimate.iteration_s / p.layout.dp)

    for lb, lay, pol in space:
        if len(solved) >= max_solves:
            break
        if len(fits) >= keep and fits[0].estimate.iteration_s / fits[0].layout.dp <= lb / lay.dp:
            break
        solve(lb, lay, pol)
    # past the grid's edge while the best sits on it (`edge_subseqs`): the next N's points of the best's layout,
    # priced and solved the same way
    top: dict[Layout, int] = {}
    for lay, n, _part, _mux in points:
        top[lay] = max(top.get(lay, 0), n)
    while fits and len(solved) < max_solves:
        lay = fits[0].layout
        n = edge_subseqs(fits[0].policy.subseqs, top.get(lay), subseqs)
        if n is None:
            break
        top[lay] = n
        extra = [(lay, *p) for p in search_points(lay, seq, n, partitions, multiplex)]
        size += len(extra)
        edge = [(v[0], v[1]) for v in (Pricing(model, batch, seq, profile, extra).price(i)
                                        for i in range(len(extra))) if v is not None]
        for lb, pol in sorted(edge, key=lambda t: t[0]):
            if len(solved) >= max_solves:
                break
            if lb / lay.dp < fits[0].estimate.iteration_s / fits[0].layout.dp:
                solve(lb, lay, pol)
    solved.sort(key=_rank_key)
    return solved, size, len(solved), rejected

def search_sppo(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                multiplex: tuple[bool, ...] = (False, True), keep: int = 4,
                bounds: Callable[[Pricing], list] | None = None) -> SppoSearch:
    """The heuristic's choice and the exhaustive search (with any degree fixed by the caller;
    ``bounds``: `exhaustive_search`'s)."""
    points, size, solved, rejected = exhaustive_search(
        model, seq, gpus, profile, batch=batch, tp=tp, pp=pp, dp=dp, zero=zero, subseqs=subseqs,
        partitions=partitions, multiplex=multiplex, keep=keep, bounds=bounds)
    fixed = any(v is not None for v in (tp, pp, dp, zero, subseqs))
    if fixed:
        heur, note = None, "degrees fixed by flags: no heuristic choice"
    else:
        heur, note = heuristic_choice(model, seq, gpus, profile, batch=batch)
    ok = [p for p in points if p.status == "OK"]
    best = ok[0] if ok else (points[0] if points else None)
    return SppoSearch(heur, note, best, points, size, solved, rejected)
