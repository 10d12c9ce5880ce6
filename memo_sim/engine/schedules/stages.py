"""One representative GPU per pipeline stage: the devices every pipeline schedule (SPPO, 1F1B,
interleaved 1F1B) simulates.

Stage s is represented by its first GPU (`memo_sim.layout.parallel.stage_first_rank`), standing for
the GPUs of its node that run stage s (every replica's), of which those on its PCIe switch share
the switch (`memo_sim.engine.graph.Device`); stages whose representatives share a node share its
host memory and host-memory bandwidth. With pp = 1 the device is exactly
`memo_sim.engine.schedules.single_stage.representative_device`.
"""

from __future__ import annotations

from memo_sim.cost.grad_sync import GradSync
from memo_sim.cost.opcost import OpCost, beside_side_ops
from memo_sim.engine.graph import Device, Op
from memo_sim.engine.schedules.single_stage import collective_link, representative_device
from memo_sim.layout.parallel import Layout, node_stage_gpus, stage_first_rank
from memo_sim.layout.rank_order import stage_of_rank
from memo_sim.profile.schema import HardwareProfile


def stage_devices(layout: Layout, profile: HardwareProfile) -> list[Device]:
    """One representative GPU per stage (see the module docs)."""
    if layout.pp == 1:
        return [representative_device(layout, profile)]
    gpn = profile.node_gpus
    per_switch = int(profile.host_link.gpus_per_pcie_switch.value)
    groups = node_stage_gpus(layout, gpn)
    out = []
    for s in range(layout.pp):
        r = stage_first_rank(layout, s)
        node, local = divmod(r, gpn)
        switch = local // per_switch
        mates = [q for q in range(node * gpn, min((node + 1) * gpn, layout.gpus))
                 if stage_of_rank(layout, q) == s and (q % gpn) // per_switch == switch]
        group = groups[node][s]
        out.append(Device(index=s, node=node, switch=switch, group=group, switch_group=max(1, len(mates)),
                          label=f"stage {s}: GPU {r} (x{group} on node {node})"))
    return out


def shared_embedding_sums(g, sync: GradSync, devices: list[Device], ends: list[list[Op]]) -> dict[int, Op]:
    """The first and last stages' sum of the gradient of the embedding they both hold
    (`memo_sim.cost.grad_sync.shared_embedding_seconds`): one op on each, after both stages' backward and
    data-parallel reduction (``ends``: per stage, the ops its optimizer step would wait for); {} where the
    stages share no weight. Their optimizer steps wait for it."""
    p = len(devices)
    if p == 1 or sync.shared_embedding <= 0:
        return {}
    deps = ends[0] + ends[p - 1]
    return {s: g.add("sum_shared_embedding_grad", device=devices[s].index, stream="dp_comm", kind="comm",
                     phase="grad_sync", layer=None, work=sync.shared_embedding, deps=deps,
                     link=sync.shared_embedding_link) for s in (0, p - 1)}


FINE_OPS_LIMIT = 40_000  # "auto": the op-by-op graph up to this many ops, one compute + one comm op per unit beyond


def collapse_unit(costs: list[OpCost], phase: str, layout: Layout, profile: HardwareProfile) -> list[OpCost]:
    """One unit's chain as a few ops: its kernels but the last as one compute op, its collectives as one op per
    stream and link they ride (`collective_link`: TP's, a MoE dispatcher's expert group, CP's, Ulysses', in the order
    each first appears; one op keeps its name, several take the first's with ``@+N``, so they keep its link and
    `memo-sim explain` its label), and its last op as it is (the op the rounding-buffer rule makes wait for the
    previous unit's offload). Alone on the GPU that is the chain's timing exactly; under contention each group's
    collectives still share their own link's port (merged into one op named for TP, as they were, a MoE layer's
    token dispatch rode TP's NVLink and explain called its wait tensor-parallel: a review found it) and the kernels
    still slow down beside host copies.

    A chain with side ops (`memo_sim.cost.opcost`: ring CP's K/V exchange beside attention, the backward's TP
    collectives beside the weight-gradient GEMMs, METP's weight ring)
    keeps its side ops and the chain ops they run beside as they are, and collapses each run of chain ops between
    them the same way (its compute as one op, named ``layer_<phase>`` and then ``layer_<phase>.<run>``, then its
    collectives; the phase's last op as it is): a side op waits for what the op after it waits for and the op after
    its cover for it, both still ops of their own, so the chain's timing alone on the GPU is unchanged (Llama-3.1-405B
    at TP 8 x CP 2: 33 ops a layer's forward and backward before, 15 now)."""
    if len(costs) < 3:
        return costs
    if not any(c.overlaps for c in costs):
        return _collapse_run(costs, phase, layout, profile, f"layer_{phase}", keep_last=True, empty_compute=True)
    kept = beside_side_ops(costs)
    out: list[OpCost] = []
    run: list[OpCost] = []
    runs = 0
    for k, c in enumerate(costs):
        if not kept[k]:
            run.append(c)
            if k < len(costs) - 1:
                continue
        if run:
            name = f"layer_{phase}" if runs == 0 else f"layer_{phase}.{runs}"
            out += _collapse_run(run, phase, layout, profile, name, keep_last=k == len(costs) - 1 and not kept[k])
            runs += 1
            run = []
        if kept[k]:
            out.append(c)
    return out


def _collapse_run(costs: list[OpCost], phase: str, layout: Layout, profile: HardwareProfile, name: str, *,
                  keep_last: bool, empty_compute: bool = False) -> list[OpCost]:
    """`collapse_unit` of a run of chain ops: its compute as one op (``empty_compute``: also where the run has
    none), then one op per group of its collectives, then (``keep_last``) its last op as it is; the run itself
    where that is not fewer ops."""
    head, last = (costs[:-1], [costs[-1]]) if keep_last else (costs, [])
    comp = [c for c in head if c.stream == "compute"]
    out = [OpCost(name, "gemm", phase, "compute", sum(c.seconds for c in comp), flops=sum(c.flops for c in comp),
                  nbytes=sum(c.nbytes for c in comp))] if comp or empty_compute else []
    groups: dict[tuple[str, str, bool], list[OpCost]] = {}
    for c in head:  # Ulysses' all-to-alls apart from TP's on their shared stream (explain tells them by name)
        if c.stream != "compute":
            groups.setdefault((c.stream, collective_link(c, layout, profile), c.name.startswith("alltoall")),
                              []).append(c)
    for (stream, *_), comm in groups.items():
        gname = comm[0].name if len(comm) == 1 else f"{comm[0].name}@+{len(comm) - 1}"
        out.append(OpCost(gname, "collective", phase, stream, sum(c.seconds for c in comm),
                          nbytes=sum(c.nbytes for c in comm)))
    out += last
    return out if len(out) < len(costs) or empty_compute else costs
