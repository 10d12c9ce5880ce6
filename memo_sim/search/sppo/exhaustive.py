"""The exhaustive branch and bound over SPPO's space, and the search that pairs it with the
heuristic (`memo_sim.search.sppo`'s "Exhaustive search")."""

from __future__ import annotations

from dataclasses import dataclass, field

from memo_sim.cost.sppo import PARTITIONS
from memo_sim.layout.parallel import Layout, enumerate_pipeline_layouts
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.sppo.grid import subseq_grid
from memo_sim.search.sppo.heuristic import heuristic_choice
from memo_sim.search.sppo.points import MULTIPLEX_MAX_PP, SppoPoint, _rank_key
from memo_sim.search.sppo.solve import _lower_bound, solve_point


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

def exhaustive_search(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                      tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                      subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                      multiplex: tuple[bool, ...] = (False, True), keep: int = 4, max_solves: int = 400,
                      ) -> tuple[list[SppoPoint], int, int, list[tuple[Layout, str]]]:
    """Branch and bound over the space (module docs): (solved points best first, space size,
    points solved, rejected layouts)."""
    layouts, rejected = enumerate_pipeline_layouts(model, gpus, profile.node_gpus, seq, tp=tp, pp=pp, dp=dp,
                                                   zero=zero)
    space: list[tuple[float, Layout, Sppo]] = []
    size = 0
    for lay in layouts:
        ns = [subseqs] if subseqs else subseq_grid(seq, lay.tp)
        for n in ns:
            for part in partitions:
                for mux in multiplex:
                    if mux and not 1 < lay.pp <= MULTIPLEX_MAX_PP:
                        continue
                    size += 1
                    lb = _lower_bound(model, lay, batch, seq, profile, n, part, mux)
                    if lb is not None:
                        space.append((lb[0], lay, lb[1]))
    # rank by the throughput bound: tokens per GPU per second at the lower-bound time
    space.sort(key=lambda t: t[0] / t[1].dp)
    solved: list[SppoPoint] = []
    fits: list[SppoPoint] = []
    for lb, lay, pol in space:
        if len(solved) >= max_solves:
            break
        if len(fits) >= keep and fits[0].estimate.iteration_s / fits[0].layout.dp <= lb / lay.dp:
            break
        pt = solve_point(model, lay, batch, seq, profile, pol.subseqs, pol.partition, pol.multiplex, pol.bounds, lb)
        solved.append(pt)
        if pt.status == "OK":
            fits.append(pt)
            fits.sort(key=lambda p: p.estimate.iteration_s / p.layout.dp)
    solved.sort(key=_rank_key)
    return solved, size, len(solved), rejected

def search_sppo(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
                subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                multiplex: tuple[bool, ...] = (False, True), keep: int = 4) -> SppoSearch:
    """The heuristic's choice and the exhaustive search (with any degree fixed by the caller)."""
    points, size, solved, rejected = exhaustive_search(
        model, seq, gpus, profile, batch=batch, tp=tp, pp=pp, dp=dp, zero=zero, subseqs=subseqs,
        partitions=partitions, multiplex=multiplex, keep=keep)
    fixed = any(v is not None for v in (tp, pp, dp, zero, subseqs))
    if fixed:
        heur, note = None, "degrees fixed by flags: no heuristic choice"
    else:
        heur, note = heuristic_choice(model, seq, gpus, profile, batch=batch)
    ok = [p for p in points if p.status == "OK"]
    best = ok[0] if ok else (points[0] if points else None)
    return SppoSearch(heur, note, best, points, size, solved, rejected)
