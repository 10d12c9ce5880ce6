"""Gradient synchronisation and ZeRO stages 0-3 over the ``data`` group (dp x cp x ulysses), and
FSDP (``dp_mode: fsdp``, ZeRO 3 as PyTorch's ``fully_shard`` / torchtitan run it).

The model states are split into units: unit 0 holds the embedding/classifier and the final
LayerNorm, unit i+1 layer i. Each unit's parameters are views of one flat buffer (padded to a
multiple of the shard-group size S); rank s of the shard group owns elements ``[s*n/S, (s+1)*n/S)``.
Under ZeRO the shard group is the whole data group (S = D).

- ZeRO 0: every rank keeps whole gradients and optimizer states; gradients are all-reduced.
- ZeRO 1: whole gradients until the step ends, then reduce-scattered into the rank's own slice of them
  (in place, as Megatron-LM's distributed optimizer does: no second buffer); each rank updates its own
  shard (its optimizer states are 1/D) and the shards are all-gathered back into the weights.
- ZeRO 2: also the gradients are sharded: the layers accumulate into a shared full-size gradient
  workspace (two, taken in turn, where the reductions overlap the backward: below), reduce-scattered
  after that layer's backward and added into the unit's shard, so several micro-batches accumulate
  there (as DeepSpeed's ZeRO 2 / 3 and FSDP do under gradient accumulation: a reduce-scatter per layer
  and micro-batch).
- ZeRO 3: also the weights: a layer's flat buffer is materialised (all-gather) before its
  forward and before its backward (the recompute runs inside the backward) and freed after each
  (``untyped_storage().resize_(0)``); the optimizer updates the owned shard only. Each gather is issued
  one layer ahead (``async_op``) and waited for where its layer starts, so it runs under the layer before
  (`GradSync.prefetching`), as the simulator prices ZeRO 3 and FSDP (`memo_sim.dp.base.DPFlavour.gathered_layers`:
  two layers' weights gathered at a time): the next layer's in a forward (layers 0 and 1 from the step's
  start), the one below in a backward, and the last two layers' at the forward's end. A unit is never freed
  while its gather runs (`_free` waits for it first).
- FSDP (ZeRO 3 with two differences, `memo_sim.dp.fsdp`): HSDP shards over a sub-group of the
  data group (``fsdp_shard`` = S < D; the ``shard`` / ``replicate`` groups of
  `memo_exec.distributed.context`): the all-gathers and reduce-scatters run over the shard group and
  each reduce-scattered gradient shard is then all-reduced over the replicate group (the D/S ranks
  that hold the same shard), every replica updating its copy of the shard alike; and with
  ``reshard_after_forward`` off, a layer's gathered flat buffer is kept from its forward to its
  backward (one all-gather per layer per step instead of two) and freed after its backward. Its
  memory is ZeRO 3's: a shard of the weights in the run's dtype beside the optimizer's master, where
  FSDP2 keeps the fp32 shard alone and casts it as it gathers (the simulator's
  `memo_sim.dp.base.DPFlavour.shards_working_weights`): a 16-bit run's states are 2 bytes a parameter
  over the shard group above what the simulator prices for FSDP (an fp32 run's, its master being the
  weights, are the same).

The routed experts of a MoE model whose ranks hold different experts (ep or etp > 1) have their own
`GradSync` (``over``: the expert data-parallel group, `memo_exec.moe.sync`): the same stages over the ranks
holding the same slice of the same experts, as Megatron-Core's distributed optimizer shards them and the
simulator prices them (`memo_sim.cost.param_split`), and under FSDP as torchtitan's ``efsdp`` does
(`memo_sim.dp.fsdp`: ZeRO 3 over those ranks, resharded after the forward or kept as the dense layers are; no
HSDP); a unit holding no parameter (a dense layer's) runs no collective.

Beside pipeline stages FSDP runs as torchtitan runs it with ``torch.distributed.pipelining`` (the simulator's
`memo_sim.dp.fsdp`, ``reduces_after_chunk``): a layer's weights are gathered before its first micro-batch's forward
and kept (``reshard_after_forward`` off, a layout rule there), its gradients accumulate whole over the micro-batches
(sync off), and after a model chunk's last micro-batch backward each of its layers' gradients is reduce-scattered
into the rank's slice and its gathered weights freed (`end_chunk`, FSDP's post-backward with the stage's last
backward); only the optimizer states and the fp32 master weights stay sharded through the step.

Overlap, as the simulator prices it (`memo_sim.cost.grad_sync`, `memo_sim.engine.schedules.single_stage`), where
the schedule calls the layer hooks once per micro-batch and layer (``backwards_per_step``: the one-stage and pipeline
schedules; SPPO's runs its layers itself and reduces after its backward):

- ``layout.grad_overlap`` (each layer's gradient bucket reduced beside the next layer's backward): a unit's reduction
  is issued (``async_op``) right after its backward completes its gradient -- under ZeRO 0 / 1 the last micro-batch's
  backward of the layer (the count of its backwards reaching ``backwards_per_step``), under ZeRO 2 / 3 every
  micro-batch's -- and waited for where its buffer is next needed: ZeRO 0 / 1 at the backward's end
  (`end_backward`), ZeRO 2 / 3 before a layer's backward writes into the gradient workspace the reduction reads. The
  layers' workspace is double-buffered there (unit k accumulates into workspace k % 2, as DeepSpeed's two
  ``ipg`` buffers under ``overlap_comm``): one layer's reduction runs under the next layer's backward. At most two
  reductions are in flight (a third waits for the oldest), so ZeRO 1 holds at most two reduced slices beside the
  gradients. The TP sync of a unit's replicated weights (below) runs before its reduction is issued, and HSDP's
  replica all-reduce where the reduce-scatter is waited for. A unit whose backward runs again after its reduction
  was issued (a schedule that does not call the hooks as it says) is refused at once: its gradient would be wrong.
- ``layout.param_gather`` ``overlap`` under ZeRO 1 / 2 (each layer's updated weights gathered beside the forward):
  the optimizer step leaves every unit's weights stale but for the rank's own slice; the next step gathers unit 0
  (the embedding's and the head's) at its start and each layer's two layers ahead, as ZeRO 3's prefetch does (layers
  0 and 1 at the step's start, layer i + 2 after layer i's forward), a layer's forward waiting for its own gather.
  Every gather in flight is waited for before the optimizer writes the shards it reads. With ``param_gather``
  ``after_step`` (DeepSpeed's) every unit is gathered right after the step, as before.

The guard (`memo_exec.happens_before.TransferGuard`) is told of every overlapped collective: a layer that reads
weights its gather has not written, or a backward that writes a workspace its reduction still reads (a wait removed),
is refused at once.

Before the data-group reduction, gradients of parameters that every TP rank holds whole
(LayerNorms, row-parallel biases, embedding) are all-reduced over the TP group when the tokens
are split over it (Megatron SP): each TP rank saw only its own tokens.

Why not ``torch.distributed.fsdp.fully_shard`` (tried again on torch 2.13 for issue #46): a
`memo_exec.layer.LayerWeights` can be wrapped, and ``unshard()`` / ``reshard()`` called by hand
at this module's hook points do give the hand-written layer plain, whole parameters to read. But
the gradient the layer's backward accumulates into an unsharded parameter's ``.grad`` is dropped
by ``reshard()`` (the sharded DTensor's ``.grad`` stays None): FSDP2 reduce-scatters only from the
post-backward hook that its pre-forward hook attaches, through autograd, to the inputs of the
module's own ``forward`` call, and ``FSDPModule`` offers no public call that reduces gradients
(only ``set_*`` knobs). The layer is never called as a module (one autograd Function, or a
pipeline schedule's direct calls, run a hand-written forward and backward that accumulate into
preallocated ``.grad`` tensors, and the activation policy re-runs parts of the forward inside
the backward), so using ``fully_shard`` would mean routing every schedule's layer calls through
``module.__call__`` and the optimizer over DTensor shards. The same collectives
(``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``) are therefore called
directly, at the points the hand-written layer defines.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from memo_exec.distributed.collectives import all_gather_single, reduce_scatter_single
from memo_exec.errors import ExecError
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.wait_switch import wait_primitive
from torch import nn

from memo_exec.layer import HEAD_SHARED
from memo_exec.model import LayerHooks
from memo_exec.optim_offload import make_adamw


def overlaps_reductions(layout, backwards_per_step: int | None, size: int) -> bool:
    """Whether a `GradSync` over ``size`` ranks issues each unit's gradient reduction beside the next backward (module
    docs): ``layout.grad_overlap``, a schedule that calls the layer hooks (``backwards_per_step``), and not FSDP beside
    pipeline stages (each chunk's reduced after its last backward). The memory estimate's rule too (two gradient
    workspaces under ZeRO 2 / 3: `memo_exec.distributed.runner.DistExecutor._estimate`)."""
    per_chunk = layout.dp_mode == "fsdp" and layout.zero >= 3 and layout.grads_reduced_per_chunk
    return backwards_per_step is not None and layout.grad_overlap and not per_chunk and size > 1


def workspace_count(overlapped: bool, holding_units: int) -> int:
    """The layer workspaces a ZeRO 2 / 3 `GradSync` allocates for ``holding_units`` layer units holding parameters:
    two where the reductions overlap the backward and two units take turns, else one (module docs; the memory
    estimate's rule too, `memo_exec.distributed.runner.DistExecutor._estimate`)."""
    return 2 if overlapped and holding_units > 1 else 1


class _Unit:
    def __init__(self, index: int, named: list[tuple[str, nn.Parameter]], D: int, d: int, device, dtype) -> None:
        self.index, self.named = index, named
        self.numel = sum(p.numel() for _, p in named)
        self.padded = -(-self.numel // D) * D
        self.shard_n = self.padded // D
        self.lo = d * self.shard_n
        self.flat = torch.zeros(self.padded, device=device, dtype=dtype)
        self.nbytes = self.flat.untyped_storage().nbytes()
        off = 0
        with torch.no_grad():
            for _, p in named:
                n = p.numel()
                self.flat[off:off + n].copy_(p.detach().reshape(-1))
                p.data = self.flat[off:off + n].view(p.shape)
                off += n

    def grad_views(self, flat_grad: torch.Tensor) -> None:
        off = 0
        for _, p in self.named:
            n = p.numel()
            p.grad = flat_grad[off:off + n].view(p.shape)
            off += n

    def shard(self, t: torch.Tensor) -> torch.Tensor:
        return t[self.lo:self.lo + self.shard_n]


class _Gathering:
    """A collective issued without waiting for it (a unit's all-gather ahead of its layer, `GradSync._prefetch`, or
    its gradient reduction beside the next backward, `GradSync._issue_reduce`): in flight until ``wait``, which the
    guard (`memo_exec.happens_before.TransferGuard`, None: the check is off) is told of."""

    def __init__(self, work, span, guard, token: int, part: torch.Tensor | None = None,
                 keep: torch.Tensor | None = None) -> None:
        """``span``: the collective's open span, closed at the wait (None: its work's completion closes it);
        ``part``: a reduction's output slice (None: in place); ``keep``: an input the collective reads, held until
        the wait."""
        self.work, self.span, self.guard, self.token = work, span, guard, token
        self.part, self.keep = part, keep

    @wait_primitive
    def wait(self) -> None:
        self.work.wait()
        if self.span is not None:
            self.span.__exit__(None, None, None)
        if self.guard is not None:
            self.guard.waited(self.token)


class GradSync(LayerHooks):
    """Owns the flat model states of one rank and the optimizer over its shard."""

    def __init__(self, ctx, units: list[list[tuple[str, nn.Parameter]]], replicated: list[list[bool]], zero: int,
                 device, dtype, lr: float, weight_decay: float, timer, over: tuple | None = None,
                 layers: list[int] | None = None, backwards_per_step: int | None = None) -> None:
        """``over``: (group, size, coordinate) the states are reduced and sharded over in place of the data group
        (the routed experts' expert data-parallel group; no TP sync, no HSDP: module docs). ``layers``: the model
        layer of each unit after the first, as its collectives' spans name it (default: its position, the held
        layers of one stage). ``backwards_per_step``: how many backwards each held unit runs in a step, the layer
        hooks called around each (the schedule's `layer_backwards_per_step`); None: the schedule does not call them
        so, and nothing overlaps (module docs)."""
        self.layer_of = list(layers) if layers is not None else list(range(len(units) - 1))
        group, size, coord = over if over is not None else (ctx.group("data"), ctx.size("data"), ctx.coord("data"))
        zero = zero if size > 1 else 0  # one rank per group: nothing to shard
        self.ctx, self.zero, self.timer = ctx, zero, timer
        self.data = group
        self.tp = ctx.group("tp")
        lay = ctx.layout
        self.fsdp = lay.dp_mode == "fsdp" and zero >= 3
        # FSDP's reshard_after_forward off: each layer's gathered weights kept from its forward to its backward
        self.keep_gathered = self.fsdp and not lay.reshard_after_forward
        # FSDP beside pipeline stages: whole gradients, each chunk's reduced after its last backward (module docs)
        self.per_chunk = self.fsdp and lay.grads_reduced_per_chunk
        self.pending: set[int] = set()  # units whose backward ran since their last reduction (per_chunk)
        # ZeRO 3 / FSDP on one stage: each unit's gather issued one layer ahead of its use (module docs); a pipeline
        # stage's FSDP gathers a layer once, at its first micro-batch's forward, and keeps it (nothing to prefetch)
        self.prefetching = zero >= 3 and not self.per_chunk
        self.inflight: dict[int, _Gathering] = {}  # unit -> its all-gather, issued and not waited for yet
        self.backwards_per_step = backwards_per_step
        # each layer's gradient reduction issued beside the next backward (module docs)
        self.overlap_grads = overlaps_reductions(lay, backwards_per_step, size) and group is not None
        self.reducing: dict[int, _Gathering] = {}  # unit -> its reduction, issued and not waited for yet
        self.backwards = [0] * len(units)  # each unit's backwards this step (ZeRO 0 / 1: reduced after the last)
        self.reduced: set[int] = set()  # ZeRO 0 / 1: units whose reduction was issued this step
        hsdp = self.fsdp and over is None and ctx.size("shard") < size
        self.shard_group = ctx.group("shard") if hsdp else self.data  # what the states are sharded over
        self.replicate = ctx.group("replicate") if hsdp else None  # HSDP: the shards' copies
        self.D = (ctx.size("shard") if hsdp else size) if zero >= 1 else 1  # shards per unit
        d = (ctx.coord("shard") if hsdp else coord) if zero >= 1 else 0
        self.units = [_Unit(i, named, self.D, d, device, dtype) for i, named in enumerate(units)]
        # ZeRO 1 / 2: each unit's updated weights gathered beside the next step's forward (module docs)
        self.overlap_gathers = (backwards_per_step is not None and zero in (1, 2) and self.D > 1
                                and lay.param_gather == "overlap")
        self.stale: set[int] = set()  # units whose weights are the rank's slice alone since the optimizer step
        # the collectives in flight and the accesses of their buffers: a layer that reads weights its gather has not
        # written, or writes a gradient workspace its reduction still reads (a wait removed), is refused at once
        # (`memo_exec.happens_before`)
        self.guard = (transfer_guard() if self.prefetching or self.overlap_grads or self.overlap_gathers else None)
        self.replicated = replicated
        # with SP every replicated weight's gradient is a partial sum over the rank's tokens; without it only the
        # QK norms' (each rank's own heads: `memo_exec.layer.HEAD_SHARED`) are
        self.tp_sync = ctx.size("tp") > 1 and over is None
        self.tp_sync_all = ctx.sp_tokens
        self.sharded_grads = zero >= 2 and not self.per_chunk  # reduced into a shard after every backward
        slot: dict[int, int] = {}  # layer unit -> its workspace
        if self.sharded_grads:  # layers accumulate into one shared workspace (two, overlapped); unit 0 keeps its own
            ws_n = max(u.padded for u in self.units[1:]) if len(self.units) > 1 else 0
            # the units that hold parameters take the workspaces in turn (a MoE model's expert units skip its dense
            # layers, which hold no experts: by unit index every expert unit would take the same one)
            holding = [u.index for u in self.units[1:] if u.numel]
            n_ws = workspace_count(self.overlap_grads, len(holding))
            slot = {index: k % n_ws for k, index in enumerate(holding)}
            self.workspaces = [torch.zeros(ws_n, device=device, dtype=dtype) for _ in range(n_ws)]
        self.grads = []  # the flat gradient each unit accumulates into
        self.grad_shards = []
        for u in self.units:
            if self.sharded_grads and u.index > 0:
                g = self.workspaces[slot.get(u.index, 0)][:u.padded]
            else:
                g = torch.zeros(u.padded, device=device, dtype=dtype)
            self.grads.append(g)
            u.grad_views(g)
            # ZeRO 0 and 1 (and FSDP beside stages): the owned slice of the whole gradient; ZeRO 2 / 3: the unit's own
            # shard (the workspace is shared by the layers)
            own = self.D == 1 or not self.sharded_grads
            self.grad_shards.append(u.shard(g) if own else torch.zeros(u.shard_n, device=device, dtype=dtype))
        # the parameters the optimizer updates: each unit's owned shard
        if zero >= 3:
            self.param_shards = [nn.Parameter(u.shard(u.flat).detach().clone()) for u in self.units]
        else:
            self.param_shards = [nn.Parameter(u.shard(u.flat).detach()) for u in self.units]
        for ps, gs in zip(self.param_shards, self.grad_shards):
            ps.grad = gs
        # the owned shards' optimizer, on the device or (optimizer offload) on the host
        self.optimizer = make_adamw(self.param_shards, lay.optimizer_offload, lr=lr, weight_decay=weight_decay,
                                    check_finite=False)
        if zero >= 3:
            for u in self.units[1:]:
                self._free(u)

    def _layer(self, u: _Unit) -> int | None:
        """The model layer a unit's spans name (None: the first unit, the embedding's and the head's)."""
        return self.layer_of[u.index - 1] if u.index else None

    # ------------------------------------------------------------------ sizes
    def state_bytes(self) -> dict[str, int]:
        es = self.units[0].flat.element_size()
        full = sum(u.padded for u in self.units) * es
        return {"weights": full if self.zero < 3 else sum(u.shard_n for u in self.units) * es,
                "gradients": full if not self.sharded_grads else (sum(w.numel() for w in self.workspaces) +
                                                          self.units[0].padded + sum(u.shard_n for u in self.units)) * es,
                "optimizer": self.optimizer.state_bytes()}

    # ------------------------------------------------------------------ ZeRO-3 materialisation
    def _free(self, u: _Unit) -> None:
        self._ready(u)  # never drop the storage an all-gather is still writing
        self._use(u, f"freeing unit {u.index}'s gathered weights", write=True)
        u.flat.untyped_storage().resize_(0)

    def _use(self, u: _Unit, what: str, write: bool = False) -> None:
        """Tell the guard the compute side reads (or drops) unit ``u``'s gathered weights now."""
        if self.guard is not None and u.numel and u.flat.untyped_storage().nbytes():
            region = [Region.of(u.flat, f"unit {u.index} weights")]
            self.guard.access(what, reads=() if write else region, writes=region if write else ())

    def _gather(self, u: _Unit) -> None:
        if u.flat.untyped_storage().nbytes() == 0:
            u.flat.untyped_storage().resize_(u.nbytes)
        if not u.numel:
            return
        with self.timer.span("param_all_gather", self._layer(u), "comm", stream="dp_comm",
                             nbytes=u.nbytes):
            all_gather_single(u.flat, self.param_shards[u.index].detach(), group=self.shard_group)

    def _gathered(self, u: _Unit) -> bool:
        return u.flat.untyped_storage().nbytes() > 0 or not u.numel

    def _prefetch(self, index: int) -> None:
        """Issue unit ``index``'s all-gather without waiting for it (a unit that is gathered, being gathered, holds
        nothing or does not exist: nothing). Its span runs from the issue to the gather's end on gloo (its future's
        callback closes it), and to the wait (`_ready`) under NCCL, whose stream the host cannot mark: there an upper
        bound of the transfer, whose part outside the compute spans is what the layer waited for it."""
        if not self.prefetching or not 0 < index < len(self.units) or index in self.inflight:
            return
        u = self.units[index]
        if self._gathered(u):
            return
        u.flat.untyped_storage().resize_(u.nbytes)
        shard = self.param_shards[u.index].detach()
        token = (self.guard.posted(f"param_all_gather of unit {index}", sends=[Region.of(shard, f"unit {index} shard")],
                                   recvs=[Region.of(u.flat, f"unit {index} weights")]) if self.guard is not None else 0)
        work, span = self._launch("param_all_gather", u, u.nbytes,
                                  lambda: all_gather_single(u.flat, shard, group=self.shard_group, async_op=True))
        self.inflight[index] = _Gathering(work, span, self.guard, token)

    def _launch(self, op: str, u: _Unit, nbytes: int, call) -> tuple:
        """Issue ``call`` (a collective with ``async_op``) in a dp_comm span named ``op``: (its work, the span to
        close at the wait, or None on gloo where the work has a future, whose completion closes it, `_prefetch`;
        NCCL's, whose stream the host cannot mark, and gloo's reduce-scatter, which has none, close at the wait: an
        upper bound of the transfer)."""
        span = self.timer.span(op, self._layer(u), "comm", stream="dp_comm", nbytes=nbytes)
        span.__enter__()
        work = call()
        if u.flat.device.type == "cpu":  # gloo: the span ends as the collective does, where its work has a future
            try:
                future = work.get_future()
            except RuntimeError:  # gloo's reduce-scatter (torch 2.13): "Work::getFuture not implemented"
                return work, span
            future.then(lambda _done, sp=span: sp.__exit__(None, None, None))
            return work, None
        return work, span

    # ------------------------------------------------------------------ ZeRO 1 / 2 gathers beside the forward
    def _gather_updated(self, index: int, ahead: bool) -> None:
        """ZeRO 1 / 2 with overlapped gathers: unit ``index``'s updated weights gathered from every rank's slice, if
        the step left them stale: issued without waiting (``ahead``; waited for where its layer starts) or now."""
        if index not in self.stale or index in self.inflight:
            return
        self.stale.discard(index)
        u = self.units[index]
        shard = self.param_shards[index].detach().clone()  # the input apart from the output it is a slice of
        if not ahead:
            with self.timer.span("param_all_gather", self._layer(u), "comm", stream="dp_comm", nbytes=u.nbytes):
                all_gather_single(u.flat, shard, group=self.shard_group)
            return
        token = (self.guard.posted(f"param_all_gather of unit {index}", sends=[Region.of(shard, f"unit {index} shard")],
                                   recvs=[Region.of(u.flat, f"unit {index} weights")]) if self.guard is not None else 0)
        work, span = self._launch("param_all_gather", u, u.nbytes,
                                  lambda: all_gather_single(u.flat, shard, group=self.shard_group, async_op=True))
        self.inflight[index] = _Gathering(work, span, self.guard, token, keep=shard)

    def _ready(self, u: _Unit) -> None:
        """Wait for unit ``u``'s prefetched all-gather, if one runs: its weights are whole after this."""
        issued = self.inflight.pop(u.index, None)
        if issued is not None:
            issued.wait()

    def _materialise(self, u: _Unit) -> None:
        """Unit ``u`` whole before its layer runs: its prefetch waited for, else gathered now."""
        if u.index in self.inflight:
            self._ready(u)
        else:
            self._gather(u)

    # ------------------------------------------------------------------ hooks (LayerRuntime)
    def begin_step(self) -> None:
        self.backwards = [0] * len(self.units)
        self.reduced.clear()
        if self.zero >= 3:
            self._gather(self.units[0])
            self._prefetch(1)  # layer 0's, beside the first unit's (the simulator's two layers from the start)
        elif self.stale:  # ZeRO 1 / 2 overlapped: the first unit now, layers 0 and 1 under the embedding
            self._gather_updated(0, ahead=False)
            self._gather_updated(1, ahead=True)
            self._gather_updated(2, ahead=True)

    def before_forward(self, i: int) -> None:
        # FSDP beside stages: gathered at the first micro-batch's forward, kept to the chunk's last backward
        if self.zero >= 3 and not (self.per_chunk and self._gathered(self.units[i + 1])):
            self._materialise(self.units[i + 1])
            self._use(self.units[i + 1], f"layer {i}'s forward")
            self._prefetch(i + 2)  # the next layer's, under this one
        elif self.overlap_gathers:  # ZeRO 1 / 2: its own gather waited for (or run now, if none was issued)
            u = self.units[i + 1]
            self._ready(u)
            self._gather_updated(u.index, ahead=False)
            self._use(u, f"layer {i}'s forward")

    def after_forward(self, i: int) -> None:
        if self.overlap_gathers:  # the layer two above this one's, under the next layer
            self._gather_updated(i + 3, ahead=True)
        if self.zero >= 3 and not self.keep_gathered:
            self._free(self.units[i + 1])
            if i + 2 == len(self.units):  # the forward's last layer: the backward's first two, under the head
                self._prefetch(i + 1)
                self._prefetch(i)

    def before_backward(self, i: int) -> None:
        if self.zero >= 3 and not (self.keep_gathered and self._gathered(self.units[i + 1])):
            self._materialise(self.units[i + 1])
            self._use(self.units[i + 1], f"layer {i}'s backward")
            self._prefetch(i)  # the layer below's, under this one's backward
        if self.overlap_grads and self.sharded_grads and self.units[i + 1].numel:  # the workspace this layer
            u = self.units[i + 1]  # accumulates into, once its last reduction has ended
            ws = self.grads[u.index].untyped_storage().data_ptr()
            for j in [j for j in self.reducing if self.grads[j].untyped_storage().data_ptr() == ws]:
                self._finish_reduce(j)
            if self.guard is not None and u.numel:
                self.guard.access(f"layer {i}'s backward", writes=[Region.of(self.grads[u.index],
                                                                             f"unit {u.index} gradients")])

    def after_backward(self, i: int) -> None:
        if self.per_chunk:  # accumulated whole, reduced with its chunk (`end_chunk`)
            self.pending.add(i + 1)
            return
        u = self.units[i + 1]
        self.backwards[u.index] += 1
        if u.index in self.reduced:
            raise ExecError(f"unit {u.index}'s backward ran {self.backwards[u.index]} times in a step whose schedule "
                            f"said {self.backwards_per_step}: its gradient's reduction was already issued, so this "
                            f"backward's part would be lost (a schedule's layer_backwards_per_step is wrong)")
        if self.zero >= 2:
            if self.overlap_grads:  # waited for where the workspace is next written (`before_backward`)
                self._issue_reduce(u)
            else:
                self._reduce(u)
                self.grads[u.index].zero_()  # the shared workspace, for the next layer
        elif self.overlap_grads and self.backwards[u.index] == self.backwards_per_step:  # its gradient is complete
            self._issue_reduce(u)
            self.reduced.add(u.index)
        if self.zero >= 3:
            self._free(u)

    def end_chunk(self, positions) -> None:
        """After a pipeline chunk's last micro-batch backward (its held layers at ``positions``): FSDP beside stages
        reduce-scatters each of its layers' gradients, the last layer first, and frees their gathered weights
        (module docs); otherwise nothing."""
        if not self.per_chunk:
            return
        for i in sorted(positions, reverse=True):
            if i + 1 in self.pending:
                self._settle(self.units[i + 1])

    def _settle(self, u: _Unit) -> None:
        """FSDP beside stages: a unit's whole gradient reduced into the rank's slice, its weights freed."""
        self._reduce(u)
        self.pending.discard(u.index)
        if u.index > 0:
            self._free(u)

    # ------------------------------------------------------------------ reductions
    def _tp_sync(self, u: _Unit) -> None:
        """Sum the gradients of the weights every TP rank holds whole (norms, replicated biases) over the
        TP group: one all-reduce per unit and dtype of their gradients flattened together, as Megatron-LM
        coalesces its layer-norm gradients (`_allreduce_layernorm_grads`), instead of one per parameter
        (on gloo each call costs a round trip: 27 calls took 43 ms of a 481 ms tp2 step on this CPU)."""
        if not self.tp_sync:
            return
        by_dtype: dict = {}
        for (name, p), rep in zip(u.named, self.replicated[u.index]):
            if rep and (self.tp_sync_all or name.rsplit(".", 1)[-1] in HEAD_SHARED):
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            with self.timer.span("tp_grad_all_reduce", self._layer(u), "comm", stream="comm",
                                 nbytes=flat.numel() * flat.element_size()):
                dist.all_reduce(flat, group=self.tp)
            at = 0
            for g in grads:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()

    def _reduce(self, u: _Unit) -> None:
        self._tp_sync(u)
        g = self.grads[u.index]
        if self.data is None or not u.numel:
            return
        # the reduced slice lands in a fresh buffer: under ZeRO 1 the owned slice is part of the input, under ZeRO 2 / 3
        # it is added to what earlier micro-batches left in the shard
        part = torch.empty_like(self.grad_shards[u.index]) if self.zero >= 1 else None
        with self.timer.span(self._reduce_op(), self._layer(u), "comm", stream="dp_comm",
                             nbytes=g.numel() * g.element_size()):
            if self.zero >= 1:
                reduce_scatter_single(part, g, group=self.shard_group)
            else:
                dist.all_reduce(g, group=self.data)
        self._land(u, part)

    def _reduce_op(self) -> str:
        return "grad_reduce_scatter" if self.zero >= 1 else "grad_all_reduce"

    def _land(self, u: _Unit, part: torch.Tensor | None) -> None:
        """A unit's reduced gradient into its shard: HSDP's replicas summed first; ZeRO 0 reduced in place."""
        if part is None:
            return
        if self.replicate is not None:  # HSDP: the shard's copies summed over the replicas
            with self.timer.span("grad_replica_all_reduce", self._layer(u), "comm", stream="dp_comm",
                                 nbytes=part.numel() * part.element_size()):
                dist.all_reduce(part, group=self.replicate)
        shard = self.grad_shards[u.index]
        if self.sharded_grads:
            shard.add_(part)
        else:
            shard.copy_(part)

    def _issue_reduce(self, u: _Unit) -> None:
        """Unit ``u``'s reduction issued without waiting for it (module docs): its TP sync first, the oldest of two
        reductions in flight waited for first."""
        self._tp_sync(u)
        if self.data is None or not u.numel:
            if self.sharded_grads:
                self.grads[u.index].zero_()
            return
        while len(self.reducing) >= 2:
            self._finish_reduce(next(iter(self.reducing)))
        g = self.grads[u.index]
        part = torch.empty_like(self.grad_shards[u.index]) if self.zero >= 1 else None
        name = f"{self._reduce_op()} of unit {u.index}"
        grads = Region.of(g, f"unit {u.index} gradients")
        token = 0
        if self.guard is not None:  # a reduce-scatter reads the gradients into its slice; an all-reduce owns them
            token = (self.guard.posted(name, sends=[grads], recvs=[Region.of(part, f"unit {u.index} reduced")])
                     if part is not None else self.guard.posted(name, recvs=[grads]))
        if part is not None:
            call = lambda: reduce_scatter_single(part, g, group=self.shard_group, async_op=True)  # noqa: E731
        else:
            call = lambda: dist.all_reduce(g, group=self.data, async_op=True)  # noqa: E731
        work, span = self._launch(self._reduce_op(), u, g.numel() * g.element_size(), call)
        self.reducing[u.index] = _Gathering(work, span, self.guard, token, part=part)

    def _finish_reduce(self, index: int) -> None:
        """Wait for unit ``index``'s reduction issued ahead and land it (`_land`); a layer's workspace cleared."""
        issued = self.reducing.pop(index)
        issued.wait()
        if self.guard is not None:  # the reduced gradient read now: refused while its collective may still write it
            out = issued.part if issued.part is not None else self.grads[index]
            self.guard.access(f"unit {index}'s reduced gradients landing", reads=[Region.of(out, f"unit {index} "
                                                                                             f"reduced")])
        u = self.units[index]
        self._land(u, issued.part)
        if self.sharded_grads and index > 0:
            self.grads[index].zero_()

    def _finish_reductions(self) -> None:
        for index in list(self.reducing):
            self._finish_reduce(index)

    def end_micro_batch(self) -> None:
        """After a micro-batch's backward that is not the step's last: under ZeRO 2 / 3 unit 0 (the embedding, final
        norm, head, the modules' norms and projections) is reduce-scattered into its shard as the layers are
        (DeepSpeed and FSDP2 reduce every micro-batch's gradients; the simulator prices it so) and its buffer
        cleared for the next; below ZeRO 2 nothing (one reduction a step)."""
        if self.sharded_grads:
            self._reduce(self.units[0])
            self.grads[0].zero_()

    def end_backward(self) -> None:
        """After the whole backward: reduce what is not reduced yet (unit 0; every unit below ZeRO 2; FSDP beside
        stages: the units no chunk's end settled, e.g. the multi-token-prediction modules' layers)."""
        if self.per_chunk:
            for i in sorted(self.pending, reverse=True):
                self._settle(self.units[i])
            self._reduce(self.units[0])
            return
        self._finish_reductions()  # the layers' reductions issued beside the backward
        for u in self.units if self.zero < 2 else self.units[:1]:
            if u.index not in self.reduced:
                self._reduce(u)
        self.reduced.clear()

    def step(self) -> None:
        self._finish_reductions()
        for index in list(self.inflight):  # none after a whole backward (a forward without one leaves its last two)
            if self.zero >= 3:  # waited for, then dropped: gathered again, updated, where a layer next runs
                self._free(self.units[index])
            else:  # ZeRO 1 / 2: waited for before the optimizer writes the slice it reads
                self._ready(self.units[index])
        self.optimizer.step()
        for u in self.units:
            if self.zero in (1, 2) and self.D > 1 and u.numel:
                if self.overlap_gathers:  # gathered beside the next forward (`begin_step`, `after_forward`)
                    self.stale.add(u.index)
                    continue
                with self.timer.span("param_all_gather", self._layer(u), "comm", stream="dp_comm",
                                     nbytes=u.nbytes):
                    all_gather_single(u.flat, self.param_shards[u.index].detach().clone(), group=self.shard_group)
        if self.zero >= 3:
            self._free(self.units[0])

    def zero_grads(self) -> None:
        self._finish_reductions()
        for g in self.grads:
            g.zero_()
        for gs in self.grad_shards:
            gs.zero_()

    # ------------------------------------------------------------------ checks (tests)
    def full_grads(self) -> list[dict[str, torch.Tensor]]:
        """Each unit's summed gradients by parameter name, whole over the data group (a collective).
        Call after `end_backward` and before `step`."""
        return self._whole([self.grad_shards[u.index] for u in self.units], self.grads)

    def full_params(self) -> list[dict[str, torch.Tensor]]:
        """Each unit's weights by parameter name, whole (a collective; after `step` too, when ZeRO 3
        has freed the gathered buffers)."""
        return self._whole([ps.detach() for ps in self.param_shards], [u.flat for u in self.units])

    def _whole(self, shards: list[torch.Tensor], fulls: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for u in self.units:
            if self.D > 1 and u.numel:
                flat = torch.empty(u.padded, dtype=u.flat.dtype, device=u.flat.device)
                all_gather_single(flat, shards[u.index].contiguous(), group=self.shard_group)
            else:
                flat = fulls[u.index]
            d, off = {}, 0
            for name, p in u.named:
                d[name] = flat[off:off + p.numel()].view(p.shape).clone()
                off += p.numel()
            out.append(d)
        return out
