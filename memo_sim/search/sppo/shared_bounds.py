"""SPPO's bounding pass shared between the what-if's two processes.

Where SPPO's search runs in a forked child beside the rest of the analytic tier
(`memo_sim.search.sppo_beside`), the child's path is the search then the simulation of the SPPO
vs MEMO verdict's SPPO side, and the bounding pass (each point's lower bound:
`memo_sim.search.sppo.solve._lower_bound`, most of the search) is its longest part. So the parent
prices part of the points first, right after the fork, and hands them over (`memo_sim.forked.Handoff`);
the child prices the rest meanwhile, then takes the parent's and goes on with the branch and bound.

Which process prices what (`split`): the points that can exist and fit at all (`Pricing.alive`:
the others cost nothing) are grouped by TP degree and subsequence count N (the piece timings a
bound reads are memoised per TP shard and piece length, which another N rarely shares), each
group weighted by its points' pipeline stages x N (the size of the recurrence each prices), and
the groups dealt largest first to whichever process has less so far (ties to the child). Both
processes compute the same split from the same points.

The values are the same either way: the parent sends each point's bound seconds and overlap
threshold, and the child rebuilds the plan from them (`Pricing.rebuild`, no timing); where the
parent sends nothing (it failed), the child prices those points too. tests/test_sppo_beside.py
holds the what-if's answer with the shared pass to the one without.
"""

from __future__ import annotations

from memo_sim.forked import Handoff


class HandedOver(Exception):
    """Raised by `ParentShare` after it sent its share: the parent's run of the search stops there."""


def split(pricing) -> tuple[list[int], list[int]]:
    """(the child's point indices, the parent's), each in the points' order (module docs)."""
    groups: dict[tuple[int, int], list[int]] = {}
    weight: dict[tuple[int, int], int] = {}
    dead: list[int] = []
    for i, (lay, n, _part, _mux) in enumerate(pricing.points):
        if not pricing.alive(i):
            dead.append(i)
            continue
        key = (lay.tp, n)
        groups.setdefault(key, []).append(i)
        weight[key] = weight.get(key, 0) + lay.pp * n
    child, parent = list(dead), []
    loads = [0, 0]  # child, parent
    for key in sorted(groups, key=lambda k: (-weight[k], k)):
        side = 0 if loads[0] <= loads[1] else 1
        loads[side] += weight[key]
        (child if side == 0 else parent).extend(groups[key])
    return sorted(child), sorted(parent)


class ChildShare:
    """The child's `memo_sim.search.sppo.exhaustive.exhaustive_search` ``bounds``: its points priced
    here, the parent's received (or priced here where none came)."""

    def __init__(self, handoff: Handoff):
        self.handoff = handoff

    def __call__(self, pricing) -> list:
        mine, theirs = split(pricing)
        values: list = [None] * len(pricing.points)
        for i in mine:
            values[i] = pricing.price(i)
        got = self.handoff.receive()
        for i in theirs:
            sent = got.get(i, False) if isinstance(got, dict) else False
            if sent is False:  # nothing came for it: priced here
                values[i] = pricing.price(i)
            elif sent is not None:
                values[i] = pricing.rebuild(i, *sent)
        return values


class ParentShare:
    """The parent's ``bounds``: prices its share (`split`), sends each point's (bound seconds,
    overlap threshold) or None, and stops the parent's run of the search (`HandedOver`)."""

    def __init__(self, handoff: Handoff):
        self.handoff = handoff

    def __call__(self, pricing) -> list:
        _mine, theirs = split(pricing)
        out = {}
        for i in theirs:
            v = pricing.price(i)
            out[i] = None if v is None else (v[0], v[1].threshold_bytes)
        self.handoff.send(out)
        raise HandedOver()


def help_child(search, handoff: Handoff) -> None:
    """Here, right after forking the child that runs ``search(ChildShare(...))``: run the same
    search with `ParentShare` up to its bounding pass. Whatever happens here the child gets an
    answer: the share, or None (it then prices everything itself; a search that fails here fails
    the same way in the child, which reports it)."""
    try:
        search(ParentShare(handoff))
    except Exception:  # noqa: BLE001  (HandedOver: done; anything else the child raises again where it matters)
        pass
    finally:
        handoff.send(None)  # nothing if the share went already; else the child stops waiting


__all__ = ["ChildShare", "HandedOver", "ParentShare", "help_child", "split"]
