"""Run one stage of an SPPO pipeline: its pieces' forwards in order, then their backwards in
reverse order (`memo_exec.sppo.schedule`), with the activations and their gradients moving between
stages over point-to-point transfers (`memo_exec.distributed.p2p.post`; every request waited on:
a receive before its buffer is read, a send before the step ends).

One process per stage (``ranks[s]`` is stage s's rank in ``group``'s numbering). A step:

- forward, piece k: stage 0 embeds the piece's tokens; a later stage posts the receives of the
  previous stage's overlapping pieces (once each, in the sender's order), waits for them and
  takes the piece's rows as a leaf that requires grad; the stage's layers run through the K/V
  cache (`memo_exec.sppo.stage`), each layer inside its offload unit (`memo_exec.sppo.offload`);
  the output is sent on, or, on the last stage, goes through the final norm and the classifier
  (the piece's share of the mean loss);
- backward, piece k (reverse order): the prefetch of the piece's offloaded units starts, then
  autograd runs from the piece's loss (last stage) or output with the gradient received from the
  next stage's overlapping pieces; the input gradient is sent back (stage 0: it has gone into
  the embedding's gradient);
- the end: every send waited on, the copy streams synchronised, and with PP > 1 the tied
  embedding's two gradients (stage 0's and the last stage's) are exchanged and summed.

Each rank records a span per piece forward and backward and per receive wait, from a barrier at
the step's start: the pipeline Gantt with its bubbles. The spans are marks of the step clock
(`memo_exec.sppo.clock`: CUDA timing events on the compute stream, ``time.perf_counter`` on
CPU), read once after the step's one device synchronisation: no piece synchronises the device
(nor reads its loss back), so the copy streams and the next piece's kernels keep overlapping,
and a receive or prefetch wait is the time the compute stream sat blocked, not the host's.

Every transfer is posted under its name (``recv_fwd piece 2 from stage 0``, ``send_bwd piece 1 to
stage 0``, ..., the tied embedding's gradient exchange) to the step's
`memo_exec.happens_before.TransferGuard` with what the received buffer will hold, and every read
of a received buffer is declared to it: a receive read before its wait (``_wait``, the one place a
transfer is waited on) is a `RaceError` naming the transfer at once, and a step that ends with a
transfer not waited on is refused naming it (``MEMO_EXEC_RACE_CHECK=0``: no guard).

Test hook (never set by a run): ``delay_s`` makes every send start that late (the receive must
still see the right data).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from memo_exec.distributed.p2p import Transfer, finish_or_settle, post
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.sppo.clock import StepClock
from memo_exec.sppo.offload import SequenceOffload, UnitStats
from memo_exec.sppo.schedule import check_pieces, stage_actions
from memo_exec.sppo.stage import Stage
from memo_exec.streams import make_engine
from memo_exec.wait_switch import wait_primitive
from memo_sim.policy.sppo import Piece  # the simulator's piece (memo_sim.cost.sppo)


@dataclass
class PipelineOptions:
    offload: bool = True
    delay_s: float = 0.0  # tests


@dataclass
class Span:
    stage: int
    kind: str  # fwd | bwd | wait_fwd | wait_bwd
    piece: str  # the piece's tag (s<sub>[.<part>])
    start_s: float
    end_s: float

    def to_dict(self) -> dict:
        return {"stage": self.stage, "kind": self.kind, "piece": self.piece, "start_s": self.start_s,
                "end_s": self.end_s}


@dataclass
class CopySpan:
    stream: str  # d2h | h2d
    op: str  # offload | prefetch
    layer: int  # the model's layer index
    piece: str
    nbytes: int
    start_s: float
    end_s: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class CopyLog:
    """The copy streams' sink (`memo_exec.streams.CopySink`): start and end of every copy group,
    as ``time.perf_counter`` floats on CPU or CUDA events on a GPU (resolved at the step's end)."""

    def __init__(self) -> None:
        self.raw: list = []

    def add_copy(self, stream, label, start, end) -> None:
        self.raw.append((stream, label, start, end))

    def issued(self, entry) -> None:
        pass

    def resolve(self, t0: float, ref_event=None, layer_ids: list[int] | None = None) -> list[CopySpan]:
        out = []
        for stream, label, a, b in self.raw:
            if ref_event is not None:  # CUDA: seconds after the step's reference event, on the host clock
                a, b = t0 + ref_event.elapsed_time(a) / 1e3, t0 + ref_event.elapsed_time(b) / 1e3
            op, _, piece = label.op.partition("@")
            out.append(CopySpan(stream, op, label.layer, piece, label.nbytes, a - t0, b - t0))
        self.raw.clear()
        return out


@dataclass
class StepResult:
    loss: float | None  # the mean loss (last stage only)
    spans: list[Span]
    units: list[UnitStats]
    copies: list[CopySpan]
    kv_peak_bytes: int
    step_s: float
    peak_device_bytes: int | None = None
    extra: dict = field(default_factory=dict)


class StageRunner:
    """Stage ``stage`` of the pipeline described by ``pieces`` (every stage's pieces)."""

    def __init__(self, gpt, stage: int, pieces: list[list[Piece]], batch: int, seq: int, alphas: list[float],
                 ranks: list[int], device: torch.device, group=None, classifier_chunk: int = 8192,
                 options: PipelineOptions | None = None, streams=None, timer=None, layer_weights=None,
                 norm_tokens: int | None = None) -> None:
        """``streams``: a `memo_exec.streams` engine to share (default: a new one, whose copies this
        runner logs); ``timer``: a `memo_exec.measure.Recorder` that also gets every span (the
        distributed executor's per-rank trace); ``layer_weights``/``norm_tokens``: `Stage`'s."""
        check_pieces(pieces, seq)
        self.pp = len(pieces)
        self.pieces = pieces
        self.s = stage
        self.ranks, self.group = ranks, group
        self.device = device
        self.opt = options or PipelineOptions()
        self.timer = timer
        self.stage = Stage(gpt, stage, self.pp, pieces[stage], batch, seq, classifier_chunk, layer_weights,
                           norm_tokens)
        self.actions = stage_actions(pieces, stage)
        self.own_streams = streams is None
        self.streams = streams or make_engine(device)
        self.copy_log = CopyLog()
        if self.own_streams:
            self.streams.sink = self.copy_log
        own = pieces[stage]
        params = {p.data_ptr() for _, p in self.stage.parameters()}
        self.clock = StepClock(device)
        self.offload = SequenceOffload(self.streams, device, [alphas[p.sub] for p in own], len(self.stage.layers),
                                       batch, [p.tokens for p in own], params, enabled=self.opt.offload,
                                       layer_ids=self.stage.layer_ids, tags=[p.tag() for p in own], timer=timer,
                                       clock=self.clock)
        self.batch, self.seq, self.hidden, self.dtype = batch, seq, gpt.cfg.hidden, gpt.wte.dtype
        self.guard = None  # the step's transfer guard (`step`)

    def parameters(self):
        return self.stage.parameters()

    def close(self) -> None:
        self.offload.close()  # its host blocks unregistered (after the device's work: `HostPool.close`)
        if self.own_streams:
            self.streams.close()

    def _span(self, op: str, phase: str, stream: str = "compute"):
        return self.timer.span(op, None, phase, stream=stream) if self.timer is not None else \
            contextlib.nullcontext()

    # ---------------------------------------------------------------------------------------------
    def _buffer(self, tokens: int) -> torch.Tensor:
        return torch.empty(self.batch, tokens, self.hidden, dtype=self.dtype, device=self.device)

    @staticmethod
    def _content(kind: str, peer_stage: int, q: int) -> str:
        """What the receive of piece ``q`` from ``peer_stage`` brings (for the transfer guard)."""
        return f"{'output' if kind == 'fwd' else 'input gradient'} of piece {q} of stage {peer_stage}"

    @wait_primitive
    def _wait(self, tr: Transfer) -> None:
        """Wait for one transfer (the one place: tests skip it)."""
        tr.wait()

    def _receive(self, peer_stage: int, q: int, bufs: dict[int, torch.Tensor], trs: dict[int, Transfer],
                 kind: str) -> None:
        if q in trs:
            return
        p = self.pieces[peer_stage][q]
        bufs[q] = self._buffer(p.tokens)
        trs[q] = post([], [(self.ranks[peer_stage], bufs[q])], self.group, guard=self.guard,
                      name=f"recv_{kind} piece {q} from stage {peer_stage}",
                      received=[self._content(kind, peer_stage, q)])

    def _assemble(self, peer_stage: int, qs: tuple[int, ...], pc: Piece, bufs, trs, kind: str,
                  marks: list) -> torch.Tensor:
        """The rows [pc.start, pc.end) out of the neighbour's overlapping pieces (after their waits)."""
        for q in sorted(qs, reverse=kind == "bwd"):  # the order the neighbour sends them in
            self._receive(peer_stage, q, bufs, trs, kind)
        w0 = self.clock.mark()
        with self._span(f"recv_{kind}@{pc.tag()}", f"p2p_{kind}", "p2p"):
            for q in qs:
                self._wait(trs[q])
        marks.append((f"wait_{kind}", pc.tag(), w0, self.clock.mark()))
        if self.guard is not None:
            self.guard.access(f"stage_{kind}@{pc.tag()}", [Region.of(bufs[q], f"the receive buffer of piece {q}",
                                                                     self._content(kind, peer_stage, q)) for q in qs])
        parts = []
        for q in qs:
            p = self.pieces[peer_stage][q]
            lo, hi = max(pc.start, p.start) - p.start, min(pc.end, p.end) - p.start
            parts.append(bufs[q][:, lo:hi])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _send(self, peer_stage: int, t: torch.Tensor, earlier: list[Transfer], what: str) -> Transfer:
        """Post one send (``what``: e.g. ``send_fwd piece 0``). With a test delay, each send starts on
        its own thread after the delay, so two outstanding delayed sends to one peer could be issued
        out of order: the earlier ones are waited on first (a delayed run is serialised per stage,
        never reordered)."""
        if self.opt.delay_s > 0:
            for tr in earlier:
                self._wait(tr)
        return post([(self.ranks[peer_stage], t)], [], self.group, self.opt.delay_s, self.guard,
                    f"{what} to stage {peer_stage}")

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> StepResult:
        """One forward and backward of the whole sequence; the stage's parameter gradients are
        accumulated into ``.grad`` (zero them before). ``inputs`` is needed on stage 0,
        ``targets`` on the last stage."""
        st, s, pp = self.stage, self.s, self.pp
        own = self.pieces[s]
        st.cache.reset()
        st.cache.peak_bytes = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        dist.barrier(group=self.group)
        self.guard = transfer_guard()
        clock = self.clock
        clock.start()
        marks: list = []  # (kind, piece tag, start mark, end mark), read after the step's synchronisation
        sends: list[Transfer] = []
        keep: list[torch.Tensor] = []  # sent tensors stay alive until their sends are waited on
        fbufs: dict[int, torch.Tensor] = {}
        ftrs: dict[int, Transfer] = {}
        bbufs: dict[int, torch.Tensor] = {}
        btrs: dict[int, Transfer] = {}
        x_in: dict[int, torch.Tensor] = {}
        out: dict[int, torch.Tensor] = {}
        loss = None  # the pieces' losses summed on the device, read once at the end
        for act in self.actions:
            k, pc = act.piece, own[act.piece]
            if act.kind == "fwd":
                if s > 0:
                    x = self._assemble(s - 1, act.waits_for, pc, fbufs, ftrs, "fwd", marks)
                a0 = clock.mark()
                with self._span(f"stage_fwd@{pc.tag()}", "fwd"):
                    if s == 0:
                        x = st.embed(inputs, k)
                    else:
                        x = x.detach().requires_grad_(True)
                        x_in[k] = x
                    for j in range(len(st.layers)):
                        with self.offload.unit(k, j):
                            x = st.layer(x, j, k)
                    if s == pp - 1:
                        y = st.loss(x, targets, k)
                        loss = y.detach() if loss is None else loss + y.detach()
                    else:
                        y = x
                out[k] = y
                marks.append(("fwd", pc.tag(), a0, clock.mark()))
                if s < pp - 1:
                    keep.append(y.detach())
                    sends.append(self._send(s + 1, keep[-1], sends, f"send_fwd piece {k}"))
            else:
                dy = None
                if s < pp - 1:
                    dy = self._assemble(s + 1, act.waits_for, pc, bbufs, btrs, "bwd", marks)
                a0 = clock.mark()
                with self._span(f"stage_bwd@{pc.tag()}", "bwd"):
                    self.offload.prefetch_piece(k)
                    torch.autograd.backward(out.pop(k), dy)
                    self.offload.release_piece(k)
                marks.append(("bwd", pc.tag(), a0, clock.mark()))
                if s > 0:
                    g = x_in.pop(k).grad
                    keep.append(g)
                    sends.append(self._send(s - 1, g, sends, f"send_bwd piece {k}"))
        posted = list(ftrs.values()) + list(btrs.values()) + sends
        for tr in posted:
            self._wait(tr)
        finish_or_settle(self.guard, f"stage {s}'s step", posted)
        self._tied_embedding_grad()
        units = self.offload.end_step()  # synchronises the copy streams and the compute stream once
        step_s = time.perf_counter() - clock.t0
        spans = [Span(s, kind, tag, clock.seconds(a), clock.seconds(b)) for kind, tag, a, b in marks]
        copies = self.copy_log.resolve(clock.t0, clock.ref)
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        loss_v = float(loss) if s == pp - 1 and loss is not None else None
        return StepResult(loss_v, spans, units, copies, st.cache.peak_bytes, step_s, peak)

    def _tied_embedding_grad(self) -> None:
        """Stage 0 and the last stage hold a tied embedding: sum their two gradients (an untied
        classifier's is the last stage's alone)."""
        if self.pp == 1 or self.s not in (0, self.pp - 1) or self.stage.gpt.lm_head is not None:
            return
        w = self.stage.gpt.wte
        other = self.pp - 1 if self.s == 0 else 0  # the other stage that holds the embedding
        peer = self.ranks[other]
        mine = w.grad.detach().clone()
        theirs = torch.empty_like(mine)
        what = f"tied embedding gradient of stage {other}"
        # one span on dp_comm, as the 1F1B executor's (`memo_exec.pipeline.schedules`): the simulator's op of the
        # same sum (`memo_sim.cost.grad_sync.shared_embedding_seconds`)
        with self._span("sum_shared_embedding_grad", "comm", stream="dp_comm"):
            self._wait(post([(peer, mine)], [(peer, theirs)], self.group, guard=self.guard,
                            name=f"tied_embedding_grad from stage {other}", received=[what]))
        if self.guard is not None:
            self.guard.access("tied embedding gradient sum", [Region.of(theirs, "the received tied gradient", what)])
        w.grad.add_(theirs)

