"""The paper's section 6.1 heuristic (`memo_sim.search.sppo`'s "Heuristic solver")."""

from __future__ import annotations

from memo_sim.cost.sppo import bubble_ratio
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.sppo.grid import efficient_subseqs
from memo_sim.search.sppo.points import (
    MULTIPLEX_BUBBLE,
    MULTIPLEX_MAX_PP,
    SppoPoint,
    _rank_key,
)
from memo_sim.search.sppo.solve import memory_floor, solve_point


def heuristic_choice(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                     ) -> tuple[SppoPoint | None, str]:
    """The paper's section 6.1 heuristic (module docs): (the point, how it was chosen)."""
    gpn = profile.node_gpus
    inside, across = [], []
    for sp in sorted({d for d in range(1, gpn + 1) if gpn % d == 0}, reverse=True):
        for p in range(1, model.layers + 1):
            if model.layers % p or gpus % (sp * p):
                continue
            lay = Layout(tp=sp, sp=True, pp=p, dp=gpus // (sp * p))
            if check_layout(lay, model, gpus, gpn, seq, batch):
                continue
            (inside if sp * p <= gpn else across).append(lay)
    cap = profile.usable_gpu_memory

    def best_of(layouts: list[Layout]) -> SppoPoint | None:
        found = []
        for lay in layouts:
            for n in efficient_subseqs(seq, lay.tp):
                mux = 1 < lay.pp <= MULTIPLEX_MAX_PP and bubble_ratio(lay.pp, n) > MULTIPLEX_BUBBLE
                try:
                    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(model, lay, batch, seq)
                except MemoError:
                    continue
                if memory_floor(model, lay, batch, pol) > cap:
                    continue
                found.append(solve_point(model, lay, batch, seq, profile, n, "flops", mux, pol.bounds))
        found.sort(key=_rank_key)
        return found[0] if found else None

    pt = best_of(inside)
    if pt is not None and pt.status == "OK":
        return pt, "SP and PP inside a node, N in the efficient range (2K-16K tokens per device)"
    full = [lay for lay in across if lay.tp == max(d for d in range(1, gpn + 1) if gpn % d == 0
                                                   and model.heads % d == 0)]
    full.sort(key=lambda lay: lay.pp)
    for lay in full:
        q = best_of([lay])
        if q is not None and q.status == "OK":
            return q, (f"nothing fits inside a node; SP = {lay.tp} (a node) and PP = {lay.pp} across nodes, "
                       "N in the efficient range")
    return pt, "nothing fits: the heuristic's least-over point inside a node"
