"""Dependency edges between host copies and layer compute, from the executor's issue order and
from the simulator's op graph, in one form so the two can be compared.

An edge ``(waiter, waited)`` says that ``waiter`` cannot start before ``waited`` ends, where one
side is a copy ``("offload" | "prefetch", layer)`` and the other a compute op
``(phase, layer, position)``: ``position`` is ``"first"`` or ``"last"`` for the first or last op
of that layer phase (fwd, recompute, bwd) and the op name otherwise. Positions rather than names
make the two sides comparable where their op lists differ in detail (the simulator lists the
residual add as the first op of a layer's backward; the executor folds it into the op after it).

Executor: from a step's `memo_exec.streams.Issued` log. A wait on a stream orders the next op of
that stream after the op that preceded the waited event's record on its own stream.
Simulator: from `memo_sim.engine.schedules.Schedule` (``phases`` and ``copies``, each op's ``deps``).
"""

from __future__ import annotations

from memo_exec.streams import Issued

COPY_OPS = ("offload", "prefetch")
PHASES = ("fwd", "recompute", "bwd")

Edge = tuple[tuple, tuple]


def _positions(ops: list[tuple[str, int | None, str]]) -> dict[int, str]:
    """Index in ``ops`` -> "first" / "last" / op name, for ops grouped in runs of one (phase, layer)."""
    pos: dict[int, str] = {}
    k = 0
    while k < len(ops):
        op, layer, phase = ops[k]
        j = k
        while j + 1 < len(ops) and ops[j + 1][1:] == (layer, phase):
            j += 1
        for m in range(k, j + 1):
            pos[m] = "first" if m == k else "last" if m == j else ops[m][0]
        k = j + 1
    return pos


def issued_edges(issued: list[Issued]) -> set[Edge]:
    """Copy <-> layer-compute edges of one step's issue order."""
    compute = [(e.op, e.layer, e.phase) for e in issued if e.stream == "compute" and e.kind == "op"]
    cpos = _positions(compute)
    node: dict[int, tuple] = {}  # index in issued -> edge endpoint
    k = 0
    for idx, e in enumerate(issued):
        if e.stream == "compute" and e.kind == "op":
            if e.layer is not None and e.phase in PHASES:
                node[idx] = (e.phase, e.layer, cpos[k])
            k += 1
        elif e.kind == "copy" and e.op in COPY_OPS:
            node[idx] = (e.op, e.layer)
    last_op: dict[str, int] = {}  # stream -> index of its latest op/copy
    recorded_after: dict[int, int | None] = {}  # event id -> index of the op before its latest record
    pending: dict[str, list[int | None]] = {}  # stream -> ops its waits since its last op wait for
    edges: set[Edge] = set()
    for idx, e in enumerate(issued):
        if e.kind == "record":
            recorded_after[e.event] = last_op.get(e.stream)
        elif e.kind == "wait":
            if e.event in recorded_after:
                pending.setdefault(e.stream, []).append(recorded_after[e.event])
        else:
            for w in pending.pop(e.stream, []):
                a, b = node.get(idx), node.get(w) if w is not None else None
                if a is not None and b is not None and (a[0] in COPY_OPS) != (b[0] in COPY_OPS):
                    edges.add((a, b))
            last_op[e.stream] = idx
    return edges


def schedule_edges(sched) -> set[Edge]:
    """Copy <-> layer-compute edges of a simulator `Schedule`."""
    pos: dict[int, tuple] = {}
    for (layer, phase), ops in sched.phases.items():
        compute = [o for o in ops if o.stream == "compute"]
        for k, o in enumerate(compute):
            pos[o.uid] = (phase, layer, "first" if k == 0 else "last" if k == len(compute) - 1 else o.name)
    for (layer, kind), op in sched.copies.items():
        pos[op.uid] = (kind, layer)
    edges: set[Edge] = set()
    for uid, a in pos.items():
        op = sched.graph.ops[uid]
        for d in op.deps:
            b = pos.get(d.uid)
            if b is not None and (a[0] in COPY_OPS) != (b[0] in COPY_OPS):
                edges.add((a, b))
    return edges


def describe(edges: set[Edge]) -> list[str]:
    def name(n):
        return f"{n[0]}({n[1]})" if n[0] in COPY_OPS else f"{n[0]}({n[1]}).{n[2]}"
    return sorted(f"{name(a)} waits for {name(b)}" for a, b in edges)
