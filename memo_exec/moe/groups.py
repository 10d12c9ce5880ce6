"""Expert-parallel process groups (Megatron-Core's parallel folding, `memo_sim.layout.parallel`).

The GPUs of one pipeline stage (dp x cp x ulysses x tp of them, TP innermost in either rank order,
`memo_exec.distributed.context`) are numbered 0.. in that order; the expert layers fold the
same GPUs as etp (innermost) x ep x expert-dp: stage rank i has ETP coordinate i mod etp, EP
coordinate (i // etp) mod ep and expert-DP coordinate i // (etp x ep) (`memo_sim.cost.moe.group_size_stride`:
an EP group's ranks are etp apart, an ETP group's adjacent). The groups:

- ``ep`` (the dispatcher's all-to-all): the stage ranks with the same ETP and expert-DP coordinates;
- ``etp`` (the experts' tensor-parallel all-gather and reduce-scatter, `memo_exec.moe.etp`): the same EP and
  expert-DP coordinates;
- ``etp_ep`` (the allgather dispatcher's group under etp > 1): the same expert-DP coordinate;
- ``expert_dp`` (the routed experts' gradient all-reduce): the same ETP and EP coordinates (the ranks
  holding the same slice of the same experts).

Every rank creates every group, in one order (``dist.new_group`` is collective).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from memo_exec.distributed.context import coords_of
from memo_sim.layout.parallel import Layout

STAGE_DIMS = ("dp", "cp", "ulysses", "tp")  # a stage's GPUs, outermost first (either rank order)
GROUP_NAMES = ("ep", "etp", "etp_ep", "expert_dp")


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
    return i // layout.etp % layout.ep, i // (layout.etp * layout.ep)


def etp_coord(rank: int, layout: Layout) -> int:
    """The ETP coordinate of ``rank`` (which slice of its experts' FFN it holds)."""
    return stage_index(rank, layout)[1] % layout.etp


def experts_apart(layout: Layout) -> bool:
    """Whether a rank's routed experts differ from its data-parallel peers' (ep or etp > 1): they then keep out of
    the dense units and have their own gradient group and optimizer (`memo_exec.moe.sync`)."""
    return layout.ep * layout.etp > 1


def _keys(rank: int, layout: Layout) -> dict[str, tuple]:
    s, i = stage_index(rank, layout)
    t, (e, d) = i % layout.etp, expert_coords(rank, layout)
    return {"ep": ((s, t, d), e), "etp": ((s, e, d), t), "etp_ep": ((s, d), e * layout.etp + t),
            "expert_dp": ((s, t, e), d)}


def expert_group_members(layout: Layout) -> dict[str, list[list[int]]]:
    """Every group of `GROUP_NAMES` as lists of global ranks (each in its coordinate's order)."""
    out: dict[str, dict] = {k: {} for k in GROUP_NAMES}
    for r in range(layout.gpus):
        for name, (key, pos) in _keys(r, layout).items():
            out[name].setdefault(key, []).append((pos, r))
    return {k: [[r for _, r in sorted(v)] for _, v in sorted(g.items())] for k, g in out.items()}


@dataclass
class ExpertGroups:
    ep: int
    ep_rank: int
    ep_group: object  # None when ep == 1
    edp: int
    edp_rank: int
    edp_group: object  # None when the expert-DP degree is 1
    etp: int = 1
    etp_rank: int = 0
    etp_group: object = None  # None when etp == 1
    etp_ep_group: object = None  # None when etp x ep == 1


def build_expert_groups(layout: Layout, rank: int, world: int) -> ExpertGroups:
    if world == 1:
        return ExpertGroups(1, 0, None, 1, 0, None)
    mine = {}
    for name, groups in expert_group_members(layout).items():
        for members in groups:
            g = dist.new_group(members) if len(members) > 1 else None
            if rank in members:
                mine[name] = g
    e, d = expert_coords(rank, layout)
    return ExpertGroups(layout.ep, e, mine["ep"], layout.expert_dp, d, mine["expert_dp"], layout.etp,
                        etp_coord(rank, layout), mine["etp"], mine["etp_ep"])
