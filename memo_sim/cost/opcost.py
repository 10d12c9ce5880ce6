"""One op of a layer phase on one GPU (`OpCost`) and the dependency rule of a phase's op list.

A phase (one layer's forward, backward or recompute) is a list of `OpCost` in issue order. Ops
with ``overlaps == 0`` form a chain: each waits for the op before it. An op with
``overlaps = n > 0`` runs on a side stream beside the ``n`` chain ops that follow it (side ops in
between are not counted): it waits for what the next chain op waits for, and the chain op after
those ``n`` waits for it too. Ring-CP's K/V exchange overlaps the attention kernel (n = 1); each
step of METP's ring sends the next weight blocks beside the step's compute block
(`memo_sim.cost.metp`). `chain_dependencies` is the one statement of this rule: the event
schedule wires its op graph from it and `critical_time` walks it.
"""

from __future__ import annotations

from dataclasses import dataclass


# An op priced in parts keeps its name with one of these suffixes on its other parts (async TP's last GEMM chunk,
# its backward's weight gradient and the per-use cast of its weight before the chunks; the ring steps after an
# all-gather of K/V,
# `memo_sim.cost.layer_time`): `base_op_name` reads through them, for whatever picks ops by name
# (policies' recompute lists, the figures' parts).
PART_SUFFIXES = ("_last_chunk", "_wgrad", "_ring_steps", "_weight_cast")


def base_op_name(name: str) -> str:
    """The layer-graph op an `OpCost` of ``name`` prices (or part of it)."""
    for suffix in PART_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class OpCost:
    name: str
    kind: str  # gemm | attention | norm | elementwise | collective
    phase: str  # fwd | bwd | recompute
    stream: str  # compute | comm | cp_comm | ep_comm | tp_p2p | tp_bcast
    seconds: float
    flops: float = 0.0
    nbytes: float = 0.0
    overlaps: int = 0  # side op: runs beside this many following chain ops, the next one waits for it


def _walk(costs: list[OpCost]) -> tuple[list[list[int]], list[int], list[bool]]:
    """(dependencies of each op, what the op after the phase waits for, whether each op is a side op or a chain op
    a side op runs beside)."""
    deps: list[list[int]] = []
    beside: list[bool] = []
    prev: list[int] = []
    pending: list[list[int]] = []  # [side op index, chain ops still to run beside it]
    for k, c in enumerate(costs):
        deps.append(list(prev))
        beside.append(c.overlaps > 0 or bool(pending))
        if c.overlaps > 0:
            pending.append([k, c.overlaps])
            continue
        prev = [k]
        for p in pending:
            p[1] -= 1
        prev += [p[0] for p in pending if p[1] == 0]
        pending = [p for p in pending if p[1] > 0]
    return deps, (prev + [p[0] for p in pending]) if costs else [], beside


def chain_dependencies(costs: list[OpCost]) -> list[list[int]]:
    """Within one phase, the indices each op waits for (the module's rule)."""
    return _walk(costs)[0]


def chain_tail(costs: list[OpCost]) -> list[int]:
    """Indices the op after the phase waits for: the last chain op and every side op still running."""
    return _walk(costs)[1]


def beside_side_ops(costs: list[OpCost]) -> list[bool]:
    """For each op, whether it is a side op or a chain op a side op runs beside (the module's rule): what a
    coarser layout of the phase keeps op by op (`memo_sim.engine.schedules.stages.collapse_unit`)."""
    return _walk(costs)[2]


def critical_time(costs: list[OpCost]) -> float:
    """Seconds of a layer phase alone on the GPU: the longest path of `chain_dependencies`. One walk of the rule
    gives both the dependencies and the tail (`_walk`; a cluster-scale what-if walked every phase twice), and an op
    that waits for one op takes that op's finish (the same value the maximum over one element is)."""
    deps, tail, _ = _walk(costs)
    finish: list[float] = []
    for c, d in zip(costs, deps):
        start = finish[d[0]] if len(d) == 1 else max((finish[j] for j in d), default=0.0)
        finish.append(start + c.seconds)
    return max((finish[j] for j in tail), default=0.0)


def exposed_side_time(costs: list[OpCost]) -> float:
    """Seconds a phase alone on the GPU waits for its side ops: `critical_time` minus the chain
    ops' own time (0 when every side transfer hides under the ops it overlaps)."""
    return max(0.0, critical_time(costs) - sum(c.seconds for c in costs if c.overlaps == 0))
