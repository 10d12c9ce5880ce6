"""Expert-parallel process groups (Megatron-Core's parallel folding, `memo_sim.layout.parallel`).

The GPUs of one pipeline stage (dp x cp x ulysses x tp of them, TP innermost in either rank order,
`memo_exec.distributed.context`) are numbered 0.. in that order; the expert layers fold the
same GPUs as etp (innermost, 1 here) x ep x expert-dp: stage rank i has EP coordinate i mod ep and
expert-DP coordinate i // ep. The ``ep`` group (the all-to-all's) holds the stage ranks with the
same expert-DP coordinate, the ``expert_dp`` group (the routed experts' gradient all-reduce) those
with the same EP coordinate. Every rank creates every group, in one order (``dist.new_group`` is
collective).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from memo_exec.distributed.context import coords_of
from memo_sim.layout.parallel import Layout

STAGE_DIMS = ("dp", "cp", "ulysses", "tp")  # a stage's GPUs, outermost first (either rank order)


def stage_index(rank: int, layout: Layout) -> tuple[int, int]:
    """(pipeline stage, index of ``rank`` among its stage's GPUs, TP innermost)."""
    c = coords_of(rank, layout)
    i = 0
    for d in STAGE_DIMS:
        i = i * getattr(layout, d) + c[d]
    return c["pp"], i


def expert_coords(rank: int, layout: Layout) -> tuple[int, int]:
    """(EP coordinate, expert-DP coordinate) of ``rank``."""
    _, i = stage_index(rank, layout)
    return i % layout.ep, i // layout.ep


def expert_group_members(layout: Layout) -> dict[str, list[list[int]]]:
    """Every ``ep`` and ``expert_dp`` group as lists of global ranks (each in coordinate order)."""
    out = {"ep": {}, "expert_dp": {}}
    for r in range(layout.gpus):
        s, _ = stage_index(r, layout)
        e, d = expert_coords(r, layout)
        out["ep"].setdefault((s, d), []).append(r)
        out["expert_dp"].setdefault((s, e), []).append(r)
    return {k: [sorted(v, key=lambda q: expert_coords(q, layout)[0 if k == "ep" else 1]) for _, v in sorted(g.items())]
            for k, g in out.items()}


@dataclass
class ExpertGroups:
    ep: int
    ep_rank: int
    ep_group: object  # None when ep == 1
    edp: int
    edp_rank: int
    edp_group: object  # None when the expert-DP degree is 1


def build_expert_groups(layout: Layout, rank: int, world: int) -> ExpertGroups:
    e, d = expert_coords(rank, layout) if world > 1 else (0, 0)
    mine = {}
    if world > 1:
        for name, groups in expert_group_members(layout).items():
            for members in groups:
                g = dist.new_group(members) if len(members) > 1 else None
                if rank in members:
                    mine[name] = (g, len(members))
    ep_g, ep_n = mine.get("ep", (None, 1))
    edp_g, edp_n = mine.get("expert_dp", (None, 1))
    return ExpertGroups(ep_n, e, ep_g, edp_n, d, edp_g)
