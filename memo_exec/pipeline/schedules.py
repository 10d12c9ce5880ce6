"""The ``1f1b`` and ``interleaved_1f1b`` schedules of the distributed executor: one pipeline rank
(``ctx.coord("pp")``) of a plan with ``pp`` stages, ``vpp`` model chunks per rank and
``plan.micro_batches`` micro-batches, composed with the mesh's other dimensions (each TP / CP /
Ulysses rank of stage s talks to the rank with the same coordinates in stage s +- 1 over the
``pp`` group; data-parallel replicas run their own pipelines and reduce gradients once per
iteration, or under FSDP beside stages each chunk's after its last micro-batch backward,
`memo_exec.distributed.zero.GradSync.end_chunk`).

What a rank holds: model chunk ``c * pp + s`` (virtual stage) for c < vpp, each an even block of
layers (`memo_sim.layout.parallel.stage_layers` over pp x vpp chunks, the split the simulator
prices); virtual stage 0 also embeds, the last one applies the final norm and the classifier
(a tied embedding's two gradients, rank 0's and rank pp-1's, are summed after the last
backward; an untied classifier's is rank pp-1's alone).

Multi-token prediction (`memo_exec.mtp`), as Megatron-LM places it (and the simulator prices it,
`memo_sim.cost.sppo.stage_params`): the modules live on the rank of the last virtual stage (rank
pp-1; interleaved: with its last chunk) and run after the final norm of every micro-batch's
forward there, on the last layer's output and the micro-batch's token ids (shifted embedding
lookup, shifted targets), their rows joining the classifier's; their backward runs inside that
micro-batch's backward. They embed the shifted tokens with that rank's copy of the embedding (every
rank draws the same initial weights: the copy starts as rank 0's, untied classifier or not), so
rank 0's and rank pp-1's embedding gradients are summed after the last backward whenever the
embedding is tied or there are modules (Megatron-LM's finalize_model_grads,
``_allreduce_word_embedding_grads``) and both copies take the same optimizer step. The modules keep
their activations per activation slot of the last chunk (one `memo_exec.mtp.MTPRun` a slot, beside
that slot's policy, in whose recompute buffer they re-run under full recompute), so every
micro-batch in flight there has its own.

The order of forwards and backwards is Megatron-LM's (`memo_exec.pipeline.order`): warm-up
forwards, one forward / one backward in the steady phase, cool-down backwards. A forward of
(chunk, micro-batch) receives its input from the previous virtual stage (or embeds), runs the
chunk's layers (`memo_exec.model.LayerFn`, the hand-written layer: the activation policy decides
what is saved, offloaded and recomputed), and sends its output on; its backward receives the
output gradient, runs autograd from the chunk's output (or loss) and sends the input gradient
back. Every transfer goes through `memo_exec.distributed.p2p.post`: the receives from each
neighbour are posted in the order that neighbour sends (`order.messages_from`, so that one
directed pair's activations and gradients, which share a channel when pp = 2 with interleaving,
are matched one to one), each waited on right before its buffer is read, every send waited on
at the step's end. Every transfer is posted under its name (``recv_fwd@c0.mb1 from pp rank 0``,
``send_bwd@c1.mb0 to pp rank 1``, the tied embedding's gradient exchange) to the step's
`memo_exec.happens_before.TransferGuard`, with what the received buffer will hold, and every read
of a received buffer is declared to it: a receive read before its wait (``_wait``, the one place a
transfer is waited on) is a `RaceError` naming the transfer at once, a step that ends with a send
not waited on is refused naming it.

Saved activations per (layer, micro-batch): a rank keeps one instance of the plan's activation
policy per micro-batch in flight (`order.slots`: a forward takes the lowest free slot, its
backward frees it; 1F1B needs ``min(pp - s, m)`` on stage s), each with its own storage for one
chunk's layers: store-all's blocks, full recompute's inputs, the layers' lse and norm statistics,
MEMO's host slots (its `memo_exec.activations.host_pool.HostPool`). The device buffers that one
action at a time uses are the rank's, carved by every slot's instance from one set
(`memo_exec.activations.base.SharedBlocks`), as the simulator counts them per stage: a recompute
buffer (full recompute's, the recompute modules' norms or MLP), and MEMO's (and checkpoint
offload's) two forward and two prefetch buffers, over which its dependency rule
(`memo_sim.policy.rounding_buffers`) runs across the rank's units in the order the rank runs them
(`memo_exec.activations.pipeline_rounding`; the schedule calls its ``launch`` before each action),
the race detector naming which micro-batch's layer each region must hold.

Trace (`memo_exec.measure.Recorder`, merged over ranks): per action a span on the ``pipeline``
stream (``fwd@c<chunk>.mb<k>`` / ``bwd@...``), the layers' forward/backward/recompute spans on
``compute`` inside it (numbered by model layer), the receive waits on ``p2p`` (``recv_fwd@...`` / ``recv_bwd@...``), and the
offload/prefetch copies on ``d2h``/``h2d`` named ``offload@c<chunk>.mb<k>``.

Why not ``torch.distributed.pipelining`` (``PipelineStage``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``; checked against torch 2.13). The layer itself would fit: the
schedules run the backward through ``torch.autograd.backward`` from the stage's output, which
reaches `memo_exec.model.LayerFn`'s hand-written backward, and the activation slot a forward bound
into the layer's autograd context would follow it into that backward. What does not fit:

1. Measurement. The schedules post and wait their P2P receives inside ``_step_microbatches``
   (``_wait_batch_p2p``; the interleaved one in ``_PipelineScheduleRuntime``), with no public hook
   before or after a wait or an action. The trace could not hold the per-micro-batch receive
   waits (issue 27 asks for them; they are what separates a stage's bubble from its transfer
   time), and a per-action span could only be approximated from inside the module.
2. The order. Megatron-LM before 4295be1a6c (2024-11-01) ran every forward first where the
   micro-batch count equals pp, which torch's ``ScheduleInterleaved1F1B`` never did (it caps the warm-up
   at ``(v - 1) pp + 2 (pp - 1 - r)``, ``_get_warmup_ops``); today both warm up so, as the simulator
   and `memo_exec.pipeline.order` do; what remains is below.
3. The micro-batch index reaches the stage module only if smuggled in as a tensor kwarg split by
   ``TensorChunkSpec`` (the module is called as ``submod(*args, **kwargs)``), the activation slot
   would have to be derived from the schedule's ``pipeline_order`` (entries of the private
   ``_Action`` type), and the stage must be
   given ``input_args``/``output_args`` so that shape inference does not run the layer (which
   writes into the policy's real buffers) on meta tensors; each is possible but works around the
   API rather than with it.

So the schedule is written here, with the executor's P2P primitive, in Megatron-LM's order
(`memo_exec.pipeline.order`; for the orders where torch and Megatron agree, the two are the same
list of actions).
"""

from __future__ import annotations

import torch

from memo_exec.distributed.p2p import Transfer, finish_or_settle, post
from memo_exec.activations.base import SharedBlocks, SlotBlocks
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.wait_switch import wait_primitive
from memo_exec.distributed.schedule import Schedule, register_schedule
from memo_exec.model import LayerFn, LayerHooks, LayerRuntime
from memo_exec.mtp import modules_recomputed
from memo_exec.pipeline.order import Action, messages_from, slots, stage_order, virtual_stage
from memo_sim.layout.schedule import executor_stage_limit
from memo_sim.layout.parallel import stage_layers
from memo_sim.policy.rounding_buffers import is_offloaded, offloaded_layer_count


class _OffsetHooks(LayerHooks):
    """The executor's layer hooks (ZeRO units by held-layer position) for a chunk's runtimes,
    which number their layers from 0 within the chunk."""

    def __init__(self, inner: LayerHooks, offset: int) -> None:
        self.inner, self.offset = inner, offset

    def before_forward(self, i: int) -> None:
        self.inner.before_forward(self.offset + i)

    def after_forward(self, i: int) -> None:
        self.inner.after_forward(self.offset + i)

    def before_backward(self, i: int) -> None:
        self.inner.before_backward(self.offset + i)

    def after_backward(self, i: int) -> None:
        self.inner.after_backward(self.offset + i)


class _ChunkTimer:
    """The recorder as a chunk's layers see it: layer k of the chunk is recorded as model layer
    ``base + k`` (the layer compute, the policy and the runtimes number a chunk's layers from 0)."""

    def __init__(self, recorder, base: int) -> None:
        self.recorder, self.base = recorder, base

    def span(self, op: str, layer: int | None, phase: str, *args, **kw):
        return self.recorder.span(op, None if layer is None else self.base + layer, phase, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.recorder, name)


class PolicySet:
    """A pipeline rank's activation policy: one instance per micro-batch in flight (module docs)."""

    def __init__(self, policies: list) -> None:
        self.policies = policies

    def begin_step(self) -> None:
        for p in self.policies:
            p.begin_step()

    def end_step(self) -> None:
        for p in self.policies:
            p.end_step()

    def close(self) -> None:
        for p in self.policies:
            p.close()

    @property
    def pinned_bytes(self) -> int:
        return sum(int(getattr(p, "pinned_bytes", 0)) for p in self.policies)

    def describe(self) -> dict:
        # a rank whose chunks hold no layer (the embedding or the loss alone, vpp 1) keeps no activations
        first = self.policies[0].describe() if self.policies else {"policy": "none (no layer on this rank)"}
        out = {**first, "instances": len(self.policies), "instances_are": "one per micro-batch in flight on this rank"}
        rounding = getattr(self.policies[0], "rounding", None) if self.policies else None
        if rounding is not None:  # an offloading policy's rule runs over the rank's (layer, micro-batch) units: what
            # it offloads is counted in those (pipeline.md's offloaded bytes), not in one instance's layers
            out.update(units=rounding.n_f, offloaded_units=offloaded_layer_count(rounding.n_f))
        return out


class PipelineSchedule(Schedule):
    """One rank of a micro-batch pipeline (module docs); `vpp` chunks per rank."""

    pipelined = True

    # test hook (never set by a run): order -> (slot of each (chunk, mb), slots), replacing `order.slots`
    slot_map = None
    guard = None  # the step's transfer guard (`forward_backward`)

    @property
    def vpp(self) -> int:
        return 1

    def __init__(self, ex) -> None:
        super().__init__(ex)
        lay = ex.layout
        self.pp, self.s, self.m = lay.pp, ex.ctx.coord("pp"), ex.plan.micro_batches
        self.order = stage_order(self.name, self.pp, lay.vpp, self.m, self.s)
        self.slot_of, self.n_slots = (self.slot_map or slots)(self.order)
        self.last_vs = self.pp * self.vpp - 1

    def check(self) -> str | None:
        lay, n = self.ex.layout, self.ex.model.layers
        if lay.uneven:  # stages or chunks of their own layer counts (the simulator's `Layout.virtual_stage_ranges`)
            why = lay.split_why_not(n)
            if why:
                return why
        elif n % (self.pp * self.vpp):
            return f"{n} layers do not split evenly into pp x vpp = {self.pp * self.vpp} model chunks"
        return executor_stage_limit(lay)

    def chunk_layers(self, c: int) -> list[int]:
        lay = self.ex.layout
        if lay.uneven:
            return list(lay.virtual_stage_ranges(self.ex.model.layers)[virtual_stage(c, self.s, self.pp)])
        return list(stage_layers(self.ex.model.layers, self.pp * self.vpp)[virtual_stage(c, self.s, self.pp)])

    def layer_indices(self) -> list[int]:
        return [li for c in range(self.vpp) for li in self.chunk_layers(c)]

    def holds_mtp(self) -> bool:
        """Whether this rank holds the multi-token-prediction modules: the last virtual stage's rank (module docs)."""
        return self._rank(self.last_vs) == self.s

    def _chunk_size(self) -> int:
        """Layers of this rank's largest chunk (its chunks are equal unless the split is uneven)."""
        return max(len(self.chunk_layers(c)) for c in range(self.vpp))

    def activation_sets(self) -> tuple[int, int]:
        return self._chunk_size(), self.n_slots

    def activation_sizes(self) -> list[int]:
        """One instance per slot and chunk size (`build_runtimes`)."""
        return sorted({len(self.chunk_layers(c)) for c in range(self.vpp)} - {0}, reverse=True)

    def host_layers(self) -> dict[int, int]:
        """Per activation slot, the host slots an offloading policy's instance takes there: the most layers of one
        (chunk, micro-batch) the slot serves whose units the rank's order offloads. The units are numbered as
        `memo_exec.activations.pipeline_rounding.PipelineRounding.plan` numbers them (the rank's forward layers in
        the order it runs them) and the rule is `memo_sim.policy.rounding_buffers`' (every unit but the rank's last
        `KEPT_LAYERS` of the step), so a chunk's offloaded layers are a prefix of it. This is the simulator's count
        of a stage's host blocks (`memo_sim.search.pipeline._host_units_of`: its layers in flight, less the last two
        where the rank holds every forward at once): on stage 0 of pp 2 with 2 micro-batches the second slot serves
        micro-batch 1 alone, whose units are the rank's last two, and takes none."""
        sizes = [len(self.chunk_layers(c)) for c in range(self.vpp)]
        n_f = sum(sizes[a.chunk] for a in self.order if a.kind == "fwd")
        need = dict.fromkeys(range(self.n_slots), 0)
        u = 0
        for a in self.order:
            if a.kind == "fwd":
                k = self.slot_of[(a.chunk, a.mb)]
                need[k] = max(need[k], sum(is_offloaded(u + i, n_f) for i in range(sizes[a.chunk])))
                u += sizes[a.chunk]
        return need

    def build_runtimes(self) -> None:
        """One activation policy per slot and chunk size: a policy runs over one chunk's layers (its storages and
        host slots), so an uneven split's chunks of different sizes each get their own instance per slot, over the
        slot's blocks (`SlotBlocks`: one chunk at a time uses a slot, so the smaller take the largest's); the
        rank's shared buffers (`SharedBlocks`) and MEMO's numbering of the rank's units (`PipelineRounding.plan`)
        are made here too."""
        ex = self.ex
        sizes = [len(self.chunk_layers(c)) for c in range(self.vpp)]  # equal unless the split is uneven
        pols: dict[tuple[int, int], object] = {}
        self.shared = SharedBlocks()  # the rank's buffers, one set for its slots (`ActivationPolicy.shared`)
        host = self.host_layers()
        for k in range(self.n_slots):
            slot_blocks = SlotBlocks()  # the slot's instances of different sizes share its blocks, largest first
            for n in self.activation_sizes():  # a chunk of one slot may hold no layer
                pol = ex.make_activation_policy(n)
                pol.slot, pol.shared, pol.pipelined, pol.slot_blocks = k, self.shared, True, slot_blocks
                if hasattr(pol, "host_layers"):  # an offloading policy: host slots for what the slot offloads
                    pol.host_layers = host[k]
                pol.allocate()
                pols[(k, n)] = pol
        ex.policy = PolicySet(list(pols.values()))
        self.timers = [_ChunkTimer(ex.recorder, (self.chunk_layers(c) or [0])[0]) for c in range(self.vpp)]
        starts = [sum(sizes[:c]) for c in range(self.vpp)]  # each chunk's first local layer
        self.positions = [range(starts[c], starts[c] + sizes[c]) for c in range(self.vpp)]  # held-layer positions
        self.runtimes = {(k, c): [LayerRuntime(j, ex.gpt.layers[starts[c] + j], pols[(k, sizes[c])], ex.compute,
                                               self.timers[c], _OffsetHooks(ex.layer_hooks, starts[c]))
                                  for j in range(sizes[c])]
                         for k in range(self.n_slots) for c in range(self.vpp)}
        ex.runtimes = [rt for k in range(self.n_slots) for c in range(self.vpp) for rt in self.runtimes[(k, c)]]
        # MEMO's rounding buffers are the rank's: its rule runs over the units of this order (`pipeline_rounding`)
        self.rounding = self.shared.states.get("rounding")
        if self.rounding is not None:
            self.rounding.plan(self.order, dict(enumerate(sizes)),
                               lambda c, mb: self.runtimes[(self.slot_of[(c, mb)], c)][0].policy)
            for bu in self.rounding.backward_units:  # `host_layers` and the rounding's numbering agree
                if self.rounding.offloaded(bu.unit) and bu.layer >= bu.policy.n_offloaded:
                    raise RuntimeError(f"pp rank {self.s}: unit {bu.unit} is offloaded from layer {bu.layer} of an "
                                       f"instance with {bu.policy.n_offloaded} host slots")

    def build_mtp(self) -> None:
        """The last rank's multi-token-prediction runtimes, one per activation slot its last chunk's micro-batches
        take (``self.mtp_runs``; module docs), each beside that slot's policy over the chunk (a chunk without a
        layer: a policy of its own, allocated where the modules re-run in its recompute buffer). ``ex.mtp`` stays
        None: `_forward` picks the slot's."""
        ex, c = self.ex, self.vpp - 1
        self.mtp_runs: dict = {}
        # the model layer numbers of the modules' layers (runtime index len(held) + k) for a MoE block's all-to-alls
        self.mtp_timer = _ChunkTimer(ex.recorder, ex.model.layers - len(ex.held))
        if not ex.gpt.mtp:
            return None
        for slot in sorted({k for (ch, _), k in self.slot_of.items() if ch == c}):
            rts = self.runtimes[(slot, c)]
            pol = rts[0].policy if rts else ex.make_activation_policy(1)
            if not rts and modules_recomputed(pol.choice):
                # the rank's blocks where its layers made them (checkpoint offload: its input and work buffers), else
                # the policy's own (a rank of the loss and the modules alone: `DistExecutor._modules_policy_alone`)
                pol.slot, pol.shared, pol.pipelined = slot, self.shared, self.rounding is not None
                pol.allocate()
                ex.policy.policies.append(pol)
            self.mtp_runs[slot] = ex.make_mtp_run(pol)
        return None

    # ------------------------------------------------------------------ transfers
    def _rank(self, vs: int) -> int:
        return vs % self.pp

    def _expect(self) -> None:
        """The messages of this step from each neighbour, in the order it sends them."""
        lay = self.ex.layout
        self.expected = {src: list(msgs) for src, msgs in
                         messages_from(self.name, self.pp, lay.vpp, self.m, self.s).items()}
        self.posted: dict[tuple, tuple[torch.Tensor, Transfer]] = {}

    @staticmethod
    def _message(key: tuple, src: int) -> str:
        """What the message ``key`` = (kind, chunk, micro-batch) from rank ``src`` holds (for the guard)."""
        kind, c, mb = key
        return f"{'activation' if kind == 'fwd' else 'gradient'} of c{c}.mb{mb} from pp rank {src}"

    @wait_primitive
    def _wait(self, tr: Transfer) -> None:
        """Wait for one transfer (the one place: tests skip it)."""
        tr.wait()

    def _receive(self, src: int, key: tuple) -> torch.Tensor:
        ex = self.ex
        queue = self.expected[src]
        while key not in self.posted:
            nxt = queue.pop(0)
            buf = torch.empty(ex.local_T, ex.model.hidden, dtype=ex.dtype, device=ex.device)
            self.posted[nxt] = (buf, post([], [(src, buf)], ex.ctx.group("pp"), guard=self.guard,
                                          name=f"recv_{nxt[0]}@c{nxt[1]}.mb{nxt[2]} from pp rank {src}",
                                          received=[self._message(nxt, src)]))
        buf, tr = self.posted.pop(key)
        kind, c, mb = key
        with ex.recorder.span(f"recv_{kind}@c{c}.mb{mb}", None, f"p2p_{kind}", stream="p2p"):
            self._wait(tr)
        if self.guard is not None:
            self.guard.access(f"{kind}@c{c}.mb{mb}", [Region.of(buf, "a receive buffer", self._message(key, src))])
        return buf

    def _send(self, dst: int, t: torch.Tensor, what: str) -> None:
        self.sends.append((t, post([(dst, t)], [], self.ex.ctx.group("pp"), guard=self.guard,
                                   name=f"send_{what} to pp rank {dst}")))

    # ------------------------------------------------------------------ one action
    def _bind(self, a: Action) -> int:
        """Point the action's slot policy and the layer compute at chunk ``a.chunk`` and micro-batch
        ``a.mb`` (names and model-layer numbers in the trace); return the slot."""
        slot = self.slot_of[(a.chunk, a.mb)]
        rts, timer = self.runtimes[(slot, a.chunk)], self.timers[a.chunk]
        if rts:  # a chunk of the embedding or the loss alone runs no layer and no policy
            pol = rts[0].policy
            pol.tag, pol.layer_base, pol.timer = f"@{a.tag()}", timer.base, timer
            pol.bind(a.kind, a.chunk, a.mb)
        self.ex.compute.timer = timer
        self._bind_moe(timer)
        return slot

    def _bind_moe(self, timer) -> None:
        """A MoE layer's block sees the layer number the compute passes it, the chunk's own (from 0): its dispatcher
        times its all-to-alls through the chunk's timer, so they carry the model layer (``moe L2`` and its
        ``moe_dispatch_alltoall_ep L2``), as the simulator's ops do (its backward's transposes keep the timer their
        forward was tagged with), and a routing keyed by the layer (`memo_exec.moe.balance`) draws from the model
        layer, the timer's base plus the chunk's number, as the one-process run's same layer does. The same for the
        expert tensor-parallel gather and reduce-scatter (`memo_exec.moe.etp`)."""
        moe = getattr(self.ex.compute, "moe", None)
        if moe is None:
            return
        moe.layer_base = getattr(timer, "base", 0)
        for part in (moe.dispatcher, moe.etp):
            if getattr(part, "timer", None) is not None:
                part.timer = timer

    def _forward(self, a: Action, step: int) -> None:
        ex, c, mb = self.ex, a.chunk, a.mb
        vs = virtual_stage(c, self.s, self.pp)
        slot = self._bind(a)
        if vs > 0:
            x = self._receive(self._rank(vs - 1), ("fwd", c, mb)).requires_grad_(True)
            self.inputs[(c, mb)] = x
        with ex.recorder.span(f"fwd@{a.tag()}", None, "pipe_fwd", stream="pipeline"):
            if vs == 0:
                inputs, _ = ex.micro_batch_rows(step, mb)
                with ex.recorder.span("embedding", None, "fwd"):
                    x = ex.gpt.embed(inputs)
            for rt in self.runtimes[(slot, c)]:
                x = LayerFn.apply(x, rt)
            if vs == self.last_vs:
                _, targets = ex.micro_batch_rows(step, mb)
                g, weights = ex.gpt, None
                x = x.reshape(-1, ex.model.hidden)
                with ex.recorder.span("final_norm", None, "fwd"):
                    hf = g.final_norm(x)
                if slot in self.mtp_runs:  # the modules' rows join the classifier's (module docs)
                    self._bind_moe(self.mtp_timer)
                    mtp = ex.micro_batch_mtp(step, mb, self.mtp_runs[slot])
                    hf, targets, weights = mtp.forward(g, x, hf, targets, ex.global_tokens)
                with ex.recorder.span("classifier", None, "fwd"):
                    y = g.classify(hf, targets, ex.plan.classifier_chunk_tokens, ex.global_tokens, None, weights)
                self.loss += y.detach().to(torch.float64)
            else:
                y = x
        self.outputs[(c, mb)] = y
        if vs < self.last_vs:
            self._send(self._rank(vs + 1), y.detach(), f"fwd@{a.tag()}")

    def _backward(self, a: Action) -> None:
        ex, c, mb = self.ex, a.chunk, a.mb
        vs = virtual_stage(c, self.s, self.pp)
        self._bind(a)  # this micro-batch's activation slot, before its backward reads it
        dy = None if vs == self.last_vs else self._receive(self._rank(vs + 1), ("bwd", c, mb))
        y = self.outputs.pop((c, mb))
        with ex.recorder.span(f"bwd@{a.tag()}", None, "pipe_bwd", stream="pipeline"):
            torch.autograd.backward(y, dy)
        if mb == self.m - 1:  # the chunk's last backward (FSDP beside stages reduces its gradients now)
            ex.end_chunk(self.positions[c])
        if vs > 0:
            self._send(self._rank(vs - 1), self.inputs.pop((c, mb)).grad, f"bwd@{a.tag()}")

    def _tied_embedding(self) -> None:
        """Rank 0 (embedding) and rank pp-1 (classifier, multi-token-prediction modules) hold the embedding: sum
        their gradients where the last rank's has one, a tied classifier or modules (module docs; an untied
        classifier's gradient is the last rank's alone)."""
        if self.s not in (0, self.pp - 1) or (self.ex.gpt.lm_head is not None and not self.ex.model.mtp_layers):
            return
        w = self.ex.gpt.wte
        peer = self.pp - 1 if self.s == 0 else 0
        mine = w.grad.detach().clone()
        theirs = torch.empty_like(mine)
        what = f"tied embedding gradient of pp rank {peer}"  # (the name kept: tied or multi-token prediction)
        # the simulator's op of the same sum (`memo_sim.cost.grad_sync.shared_embedding_seconds`)
        with self.ex.recorder.span("sum_shared_embedding_grad", None, "comm", stream="dp_comm"):
            self._wait(post([(peer, mine)], [(peer, theirs)], self.ex.ctx.group("pp"), guard=self.guard,
                            name=f"tied_embedding_grad from pp rank {peer}", received=[what]))
        if self.guard is not None:
            self.guard.access("tied embedding gradient sum", [Region.of(theirs, "the received tied gradient", what)])
        w.grad.add_(theirs)

    def forward_backward(self, step: int) -> torch.Tensor:
        self.guard = transfer_guard()  # this step's transfers in flight (None: the check is off)
        self._expect()
        self.sends: list = []
        self.inputs: dict = {}
        self.outputs: dict = {}
        self.loss = torch.zeros((), dtype=torch.float64, device=self.ex.device)
        if self.rounding is not None:
            self.rounding.begin_step()
        for t, a in enumerate(self.order):
            if self.rounding is not None:  # the next step's first prefetches may start beside this one
                self.rounding.launch(t)
            if a.kind == "fwd":
                self._forward(a, step)
            else:
                self._backward(a)
        self.ex.compute.timer = self.ex.recorder
        self._bind_moe(self.ex.recorder)
        assert not self.posted and not any(self.expected.values()), "unconsumed pipeline messages"
        for _, tr in self.sends:
            self._wait(tr)
        finish_or_settle(self.guard, f"pp rank {self.s}'s step", [tr for _, tr in self.sends])
        self.sends.clear()
        self._tied_embedding()
        return self.loss

    def write_outputs(self, out_dir, plan_file) -> list:
        """Rank 0, after the merged ``measured.json``: per-stage rows and the pipeline Gantt chart
        (`memo_exec.pipeline.report`); ``pipeline.md`` is appended to ``report.md``."""
        from memo_exec.pipeline.report import write_pipeline_outputs  # noqa: PLC0415

        if self.ex.ctx.rank != 0:
            return []
        # `--profile` (the plan then names that profile, `memo_exec.runner.use_profile`): predicted again with it
        profile = self.ex.plan.profile if getattr(self.ex.opts, "profile", None) is not None else None
        return write_pipeline_outputs(out_dir, plan_file, profile)


@register_schedule("1f1b")
class OneFOneB(PipelineSchedule):
    """PipeDream-flush / Megatron-LM 1F1B: one chunk per rank."""


@register_schedule("interleaved_1f1b")
class Interleaved1F1B(PipelineSchedule):
    """Megatron-LM's interleaved 1F1B: ``layout.vpp`` chunks per rank."""

    @property
    def vpp(self) -> int:
        return self.ex.layout.vpp
