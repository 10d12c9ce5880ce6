"""Process groups from a plan's layout, and which tokens each rank holds.

`DistContext` is one rank's view of the job: a `DeviceMesh` (``init_device_mesh``) whose
dimensions are the layout's degrees in the plan's rank order, outermost first (`mesh_dims`, from
`memo_sim.layout.rank_order`): pp x dp x cp x ulysses x tp by default, as Megatron-LM, torchtitan and DeepSpeed
number ranks, or dp x pp x cp x ulysses x tp (Megatron-LM's ``--use-tp-pp-dp-mapping``); TP innermost, so a TP
group is consecutive ranks. One process group per dimension, plus two flattened groups built from the same rank
numbering:

- ``data``: the ranks that hold the same weights (dp x cp x ulysses, same tp and pp
  coordinate): gradients are summed over it and ZeRO shards model states over it;
- ``tokens``: the ranks whose tokens are disjoint parts of one global batch: ``data`` times
  ``tp`` when Megatron sequence parallelism splits the tokens over TP, else ``data``;
- ``shard`` / ``replicate`` (``dp_mode: fsdp`` with ``fsdp_shard`` smaller than the data group,
  HSDP): the data group laid out as torchtitan's 2D mesh (replicate, shard), row-major: data rank
  d has replicate index ``d // S`` and shard index ``d % S`` (S = ``fsdp_shard``), so a shard
  group is S consecutive ranks of the data group and a replicate group the ranks S apart. The model
  states are sharded over ``shard`` (the whole ``data`` group otherwise) and the shards' gradients
  all-reduced over ``replicate``.

A single-process run gets `DistContext.single` (every size 1, no groups, no collectives).

Tokens (`local_token_index`): the replica's batch is ``[batch, seq]``; DP replica d takes the
batch rows of step ``step * dp + d`` (`memo_exec.data.TokenSource`); ring CP splits every
sequence into 2*cp chunks and gives rank c chunks c and 2cp-1-c (zig-zag: causal work
balanced); Ulysses takes a contiguous 1/u of that; Megatron SP interleaves: TP rank t holds
the shard's rows t, t+tp, t+2tp, ... so that the first n local rows of every TP rank are the
first n*tp rows of the gathered tensors (what token-wise recompute needs).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from memo_sim.layout.parallel import Layout
from memo_sim.layout.rank_order import DEFAULT_RANK_ORDER, mesh_dims as order_dims

MESH_DIMS = order_dims(DEFAULT_RANK_ORDER)  # the dimensions' names (outermost first in the default order)


def mesh_dims(layout: Layout) -> tuple[str, ...]:
    """The mesh's dimensions in the plan's rank order, outermost first."""
    return order_dims(layout.rank_order)


@dataclass
class DistContext:
    layout: Layout
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    mesh: object = None
    coords: dict = field(default_factory=dict)
    groups: dict = field(default_factory=dict)

    @classmethod
    def single(cls, layout: Layout | None = None, device=None) -> "DistContext":
        return cls(layout or Layout(), device=torch.device(device or "cpu"),
                   coords={d: 0 for d in MESH_DIMS + ("data", "tokens", "shard", "replicate")})

    @property
    def distributed(self) -> bool:
        return self.world > 1 or dist.is_initialized()

    def size(self, dim: str) -> int:
        if dim == "data":
            return self.layout.dp * self.layout.cp * self.layout.ulysses
        if dim == "tokens":
            return self.size("data") * (self.layout.tp if self.sp_tokens else 1)
        if dim == "shard":
            return shard_size(self.layout)
        if dim == "replicate":
            return self.size("data") // self.size("shard")
        return getattr(self.layout, dim)

    def coord(self, dim: str) -> int:
        return self.coords[dim]

    def group(self, dim: str):
        """The process group of ``dim`` (None when the dimension has size 1 or the run is single)."""
        return self.groups.get(dim)

    @property
    def sp_tokens(self) -> bool:
        """Whether the tokens are split over the TP group (Megatron SP, or a METP flavour)."""
        lay = self.layout
        return lay.flavour.shards_tokens(lay)

    def describe(self) -> dict:
        dims = mesh_dims(self.layout)
        return {"rank": self.rank, "world": self.world, **{f"{d}_rank": self.coords.get(d, 0) for d in dims},
                "mesh": [self.size(d) for d in dims], "mesh_dims": list(dims)}


def shard_size(layout: Layout) -> int:
    """Ranks the model states are sharded over: FSDP's shard group (``fsdp_shard``; 0 = the whole
    data group), the whole data group under ZeRO."""
    data = layout.dp * layout.cp * layout.ulysses
    return (layout.fsdp_shard or data) if layout.dp_mode == "fsdp" else data


def mesh_shape(layout: Layout) -> tuple[int, ...]:
    return tuple(getattr(layout, d) for d in mesh_dims(layout))


def coords_of(rank: int, layout: Layout) -> dict[str, int]:
    """Mesh coordinates of a global rank (row-major over `mesh_dims`)."""
    out, r = {}, rank
    for d in reversed(mesh_dims(layout)):
        n = getattr(layout, d)
        out[d] = r % n
        r //= n
    return out


def rank_of(coords: dict[str, int], layout: Layout) -> int:
    r = 0
    for d in mesh_dims(layout):
        r = r * getattr(layout, d) + coords[d]
    return r


def _flat_groups(layout: Layout, vary: tuple[str, ...]) -> list[list[int]]:
    """All groups of ranks that differ only in the ``vary`` dimensions (every rank, same order)."""
    fixed = [d for d in mesh_dims(layout) if d not in vary]
    seen, groups = set(), []
    for r in range(layout.gpus):
        c = coords_of(r, layout)
        key = tuple(c[d] for d in fixed)
        if key in seen:
            continue
        seen.add(key)
        members = [q for q in range(layout.gpus) if all(coords_of(q, layout)[d] == c[d] for d in fixed)]
        groups.append(members)
    return groups


def build_context(layout: Layout, device: torch.device, timeout_s: float | None = None) -> DistContext:
    """The mesh and groups of an initialised process group whose world size is ``layout.gpus``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    mesh = init_device_mesh(device.type, mesh_shape(layout), mesh_dim_names=mesh_dims(layout))
    ctx = DistContext(layout, rank, world, device, mesh, coords_of(rank, layout))
    for d in mesh_dims(layout):
        if getattr(layout, d) > 1:
            ctx.groups[d] = mesh.get_group(d)
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    for name, vary in (("data", ("dp", "cp", "ulysses")), ("tokens", ("dp", "cp", "ulysses", "tp"))):
        if name == "tokens" and not ctx.sp_tokens:
            vary = ("dp", "cp", "ulysses")
        mine = None
        for members in _flat_groups(layout, vary):  # every rank creates every group, in one order
            g = dist.new_group(members, **kw) if len(members) > 1 else None
            if rank in members:
                mine, ctx.coords[name] = g, members.index(rank)
        if mine is not None:
            ctx.groups[name] = mine
    _hsdp_groups(ctx, kw)
    return ctx


def layout_context(layout: Layout, rank: int, device: torch.device | None = None) -> DistContext:
    """Rank ``rank``'s view of the job from the layout alone: its coordinates in the mesh and in the flattened
    ``data`` / ``tokens`` / ``shard`` / ``replicate`` groups, as `build_context` numbers them, and no process group
    (nothing to communicate over). What --nproc's launcher sizes every rank with before torchrun starts them
    (`memo_exec.distributed.runner.sized_ranks`)."""
    ctx = DistContext(layout, rank, layout.gpus, device or torch.device("cpu"), None, coords_of(rank, layout))
    for name, vary in (("data", ("dp", "cp", "ulysses")), ("tokens", ("dp", "cp", "ulysses", "tp"))):
        if name == "tokens" and not ctx.sp_tokens:
            vary = ("dp", "cp", "ulysses")
        for members in _flat_groups(layout, vary):
            if rank in members:
                ctx.coords[name] = members.index(rank)
    S, d = ctx.size("shard"), ctx.coord("data")
    ctx.coords["shard"], ctx.coords["replicate"] = d % S, d // S
    return ctx


def _hsdp_groups(ctx: DistContext, kw: dict) -> None:
    """The ``shard`` and ``replicate`` groups (module docs); the shard group is the data group
    itself unless HSDP splits it."""
    S, D = ctx.size("shard"), ctx.size("data")
    d = ctx.coord("data")
    ctx.coords["shard"], ctx.coords["replicate"] = d % S, d // S
    if S == D:
        if ctx.group("data") is not None:
            ctx.groups["shard"] = ctx.group("data")
        return
    for members in _flat_groups(ctx.layout, ("dp", "cp", "ulysses")):  # every rank creates every group, in one order
        subgroups = [members[r * S:(r + 1) * S] for r in range(D // S)] + [members[s::S] for s in range(S)]
        names = ["shard"] * (D // S) + ["replicate"] * S
        for name, sub in zip(names, subgroups):
            g = dist.new_group(sub, **kw) if len(sub) > 1 else None
            if ctx.rank in sub and g is not None:
                ctx.groups[name] = g


# ------------------------------------------------------------------------------------------ tokens
def zigzag_positions(seq: int, cp: int, c: int) -> torch.Tensor:
    """Positions of one sequence that CP rank ``c`` holds: chunks c and 2cp-1-c of 2cp."""
    if cp == 1:
        return torch.arange(seq)
    k = seq // (2 * cp)
    return torch.cat([torch.arange(c * k, (c + 1) * k), torch.arange((2 * cp - 1 - c) * k, (2 * cp - c) * k)])


def shard_positions(layout: Layout, seq: int, cp_rank: int, uly_rank: int) -> torch.Tensor:
    """Positions of one sequence in this rank's CP/Ulysses shard, in the order attention sees them."""
    pos = zigzag_positions(seq, layout.cp, cp_rank)
    n = pos.numel() // layout.ulysses
    return pos[uly_rank * n:(uly_rank + 1) * n]


def local_token_index(ctx: DistContext, batch: int, seq: int) -> torch.Tensor:
    """Indices into the replica's flattened ``[batch * seq]`` tokens of this rank's layer-input rows."""
    lay = ctx.layout
    pos = shard_positions(lay, seq, ctx.coord("cp"), ctx.coord("ulysses"))
    flat = (torch.arange(batch).unsqueeze(1) * seq + pos.unsqueeze(0)).reshape(-1)
    if ctx.sp_tokens:
        flat = flat[ctx.coord("tp")::lay.tp]
    return flat


