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
- ZeRO 2: also the gradients are sharded: the layers accumulate into one shared full-size
  gradient workspace, reduce-scattered right after that layer's backward and added into the unit's
  shard, so several micro-batches accumulate there (as DeepSpeed's ZeRO 2 / 3 and FSDP do under
  gradient accumulation: a reduce-scatter per layer and micro-batch).
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
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.wait_switch import wait_primitive
from torch import nn

from memo_exec.layer import HEAD_SHARED
from memo_exec.model import LayerHooks
from memo_exec.optim_offload import make_adamw


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
    """A unit's all-gather issued ahead of its layer (`GradSync._prefetch`): in flight until ``wait``, which the
    guard (`memo_exec.happens_before.TransferGuard`, None: the check is off) is told of."""

    def __init__(self, work, span, guard, token: int) -> None:
        """``span``: the gather's open span, closed at the wait (None: its work's completion closes it)."""
        self.work, self.span, self.guard, self.token = work, span, guard, token

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
                 layers: list[int] | None = None) -> None:
        """``over``: (group, size, coordinate) the states are reduced and sharded over in place of the data group
        (the routed experts' expert data-parallel group; no TP sync, no HSDP: module docs). ``layers``: the model
        layer of each unit after the first, as its collectives' spans name it (default: its position, the held
        layers of one stage)."""
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
        # the gathers in flight and the reads of their buffers: a layer that reads weights its gather has not written
        # (a wait removed) is refused at once (`memo_exec.happens_before`)
        self.guard = transfer_guard() if self.prefetching else None
        hsdp = self.fsdp and over is None and ctx.size("shard") < size
        self.shard_group = ctx.group("shard") if hsdp else self.data  # what the states are sharded over
        self.replicate = ctx.group("replicate") if hsdp else None  # HSDP: the shards' copies
        self.D = (ctx.size("shard") if hsdp else size) if zero >= 1 else 1  # shards per unit
        d = (ctx.coord("shard") if hsdp else coord) if zero >= 1 else 0
        self.units = [_Unit(i, named, self.D, d, device, dtype) for i, named in enumerate(units)]
        self.replicated = replicated
        # with SP every replicated weight's gradient is a partial sum over the rank's tokens; without it only the
        # QK norms' (each rank's own heads: `memo_exec.layer.HEAD_SHARED`) are
        self.tp_sync = ctx.size("tp") > 1 and over is None
        self.tp_sync_all = ctx.sp_tokens
        self.sharded_grads = zero >= 2 and not self.per_chunk  # reduced into a shard after every backward
        if self.sharded_grads:  # layers accumulate into one shared workspace; unit 0 keeps its own
            ws_n = max(u.padded for u in self.units[1:]) if len(self.units) > 1 else 0
            self.workspace = torch.zeros(ws_n, device=device, dtype=dtype)
        self.grads = []  # the flat gradient each unit accumulates into
        self.grad_shards = []
        for u in self.units:
            if self.sharded_grads and u.index > 0:
                g = self.workspace[:u.padded]
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
                "gradients": full if not self.sharded_grads else (self.workspace.numel() + self.units[0].padded +
                                                          sum(u.shard_n for u in self.units)) * es,
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
        span = self.timer.span("param_all_gather", self._layer(u), "comm", stream="dp_comm", nbytes=u.nbytes)
        span.__enter__()
        work = all_gather_single(u.flat, shard, group=self.shard_group, async_op=True)
        at_end = u.flat.device.type == "cpu"  # gloo: the span ends as the gather does
        if at_end:
            work.get_future().then(lambda _done, sp=span: sp.__exit__(None, None, None))
        self.inflight[index] = _Gathering(work, None if at_end else span, self.guard, token)

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
        if self.zero >= 3:
            self._gather(self.units[0])
            self._prefetch(1)  # layer 0's, beside the first unit's (the simulator's two layers from the start)

    def before_forward(self, i: int) -> None:
        # FSDP beside stages: gathered at the first micro-batch's forward, kept to the chunk's last backward
        if self.zero >= 3 and not (self.per_chunk and self._gathered(self.units[i + 1])):
            self._materialise(self.units[i + 1])
            self._use(self.units[i + 1], f"layer {i}'s forward")
            self._prefetch(i + 2)  # the next layer's, under this one

    def after_forward(self, i: int) -> None:
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

    def after_backward(self, i: int) -> None:
        if self.per_chunk:  # accumulated whole, reduced with its chunk (`end_chunk`)
            self.pending.add(i + 1)
            return
        if self.zero >= 2:
            self._reduce(self.units[i + 1])
            self.grads[i + 1].zero_()  # the shared workspace, for the next layer
        if self.zero >= 3:
            self._free(self.units[i + 1])

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
        layer = self._layer(u)
        shard = self.grad_shards[u.index]
        # the reduced slice lands in a fresh buffer: under ZeRO 1 the owned slice is part of the input, under ZeRO 2 / 3
        # it is added to what earlier micro-batches left in the shard
        part = torch.empty_like(shard) if self.zero >= 1 else None
        with self.timer.span("grad_reduce_scatter" if self.zero >= 1 else "grad_all_reduce", layer, "comm",
                             stream="dp_comm", nbytes=g.numel() * g.element_size()):
            if self.zero >= 1:
                reduce_scatter_single(part, g, group=self.shard_group)
            else:
                dist.all_reduce(g, group=self.data)
        if self.replicate is not None:  # HSDP: the shard's copies summed over the replicas
            with self.timer.span("grad_replica_all_reduce", layer, "comm", stream="dp_comm",
                                 nbytes=part.numel() * part.element_size()):
                dist.all_reduce(part, group=self.replicate)
        if part is not None:
            if self.sharded_grads:
                shard.add_(part)
            else:
                shard.copy_(part)

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
        for u in self.units if self.zero < 2 else self.units[:1]:
            self._reduce(u)

    def step(self) -> None:
        for index in list(self.inflight):  # none after a whole backward (a forward without one leaves its last two)
            self._free(self.units[index])  # waited for, then dropped: gathered again, updated, where a layer next runs
        self.optimizer.step()
        for u in self.units:
            if self.zero in (1, 2) and self.D > 1 and u.numel:
                with self.timer.span("param_all_gather", self._layer(u), "comm", stream="dp_comm",
                                     nbytes=u.nbytes):
                    all_gather_single(u.flat, self.param_shards[u.index].detach().clone(), group=self.shard_group)
        if self.zero >= 3:
            self._free(self.units[0])

    def zero_grads(self) -> None:
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
