"""Why a plan runs as fast as it does and needs the memory it needs: `memo-sim explain`.

Time: one simulated iteration of the plan's representative GPU (every stage's, for a pipeline)
is cut into what its compute stream did and what it waited for. The compute stream's busy time
is summed by phase (forward, backward, recompute, classifier, optimizer, allocator stalls);
every gap before one of its ops is charged to the stream of the dependency that ended last (the
one it waited for: host copies, a collective, METP's ring, a pipeline transfer), a gap with no
later dependency to issue order, the time after its last op to the stream that finished last, and
a pipeline stage's time after its own work until the step's slowest stage ends to that idle.
The parts add up to the plan's iteration time exactly, on every stage.

Memory: the per-GPU terms of `memo_sim.memplan.footprint.memory_breakdown` (model states, kept
activations, buffers, lse, transients, the boundary activation, the classifier), the simulated
peak with its instant, the op whose allocation made it and the tensors live then, and pinned host
memory per node against the node's.
The limit that binds is said in words: which memory is nearest its capacity, and for MEMO which
of its two constraints fixed alpha.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memo_sim.engine.simulate import SimResult

STREAM_WORDS = {"d2h": "host copies (offload)", "h2d": "host copies (prefetch)", "comm": "tensor-parallel collectives",
                "cp_comm": "context-parallel ring",
                "ep_comm": "MoE token dispatch (expert parallelism)", "uly_comm": "Ulysses all-to-all", "dp_comm": "data-parallel "
                "gradients and weights", "tp_p2p": "METP ring (send/recv)", "tp_bcast": "METP ring (broadcast)",
                "pp_p2p": "pipeline transfers", "p2p": "pipeline transfers"}


def stream_code(op) -> str:
    """The stream an op the compute stream waited on is on, as a stable code: its stream's name, except on the
    "comm" stream, which carries the tensor-parallel collectives and Ulysses' all-to-alls (`memo_sim.cost.layer_time`):
    ``uly_comm`` for the latter."""
    return "uly_comm" if op.stream == "comm" and "alltoall" in op.name else op.stream


def stream_words(op) -> str:
    """What an op the compute stream waited on is, in words (`stream_code`'s)."""
    code = stream_code(op)
    return STREAM_WORDS.get(code, code)


IDLE_WORDS = "idle until the step's slowest stage ends"
# a stage's wait for an activation or gradient that another stage had not yet computed (the pipeline's fill and
# drain, stages of unequal work): the part of a wait on a pipeline transfer before that transfer started
PEER_WORDS = "waiting on another pipeline stage's compute (fill, drain, unequal stages)"
PIPELINE_STREAMS = ("pp_p2p", "p2p")
# the end stages' sum of a shared embedding's gradients (`memo_sim.cost.grad_sync.shared_embedding_seconds`): the sum
# itself, and before it, where the other end stage was still busy, a wait on that stage
SHARED_SUM_OP = "sum_shared_embedding_grad"
SHARED_SUM_WORDS = "waiting on the first and last stages' sum of the shared embedding's gradient"
PHASE_WORDS = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "classifier": "classifier",
               "optimizer": "optimizer step", "allocator": "allocator stalls (cache reorganisations)"}


@dataclass
class TimeBreakdown:
    device: int
    iteration_s: float
    busy_s: dict[str, float] = field(default_factory=dict)  # compute-stream work by phase, in words
    waits_s: dict[str, float] = field(default_factory=dict)  # compute-stream idle by what it waited on
    # the same by stable codes, for programs (--json): busy by the ops' phase; waits "stream:NAME" (a wait on
    # that stream), "peer_stage", "issue_order", "after_last:NAME", "idle_after_slowest_stage"
    busy_by_phase_s: dict[str, float] = field(default_factory=dict)
    waits_by_cause_s: dict[str, float] = field(default_factory=dict)
    # of the busy time, how much longer the kernels ran than alone on the GPU: beside communication kernels that
    # hold some of its SMs (`memo_sim.cost.comm_sms`) and host copies that share its HBM
    slowed_s: float = 0.0

    def add(self, kind: str, words: str, code: str, s: float) -> None:
        """``s`` seconds of ``kind`` ("busy" or "waits") under ``words`` and ``code``."""
        by_words, by_code = (self.busy_s, self.busy_by_phase_s) if kind == "busy" else (self.waits_s,
                                                                                         self.waits_by_cause_s)
        by_words[words] = by_words.get(words, 0.0) + s
        by_code[code] = by_code.get(code, 0.0) + s

    @property
    def accounted_s(self) -> float:
        return sum(self.busy_s.values()) + sum(self.waits_s.values())


def time_breakdown(res: SimResult, device: int) -> TimeBreakdown:
    """The compute stream of ``device`` over one iteration (``res`` simulated with ``record``)."""
    ops = sorted((o for o in res.ops if o.device == device and o.start is not None and o.end is not None),
                 key=lambda o: (o.start, o.uid))
    compute = [o for o in ops if o.stream == "compute"]
    end_s = max((o.end for o in ops), default=0.0)
    tb = TimeBreakdown(device, end_s)
    prev_end = 0.0
    for o in compute:
        tb.add("busy", PHASE_WORDS.get(o.phase, o.phase), o.phase, o.end - o.start)
        tb.slowed_s += max(0.0, (o.end - o.start) - o.work)
        gap = o.start - prev_end
        if gap > 0:
            waited = [d for d in o.deps if d.end is not None and d.end > prev_end and d.stream != "compute"]
            if waited:
                last = max(waited, key=lambda d: d.end)
                why, code = f"waiting on {stream_words(last)}", f"stream:{stream_code(last)}"
                if last.stream in PIPELINE_STREAMS:  # the transfer itself, and before it the other stage's work
                    moving = min(gap, max(0.0, last.end - max(last.start, prev_end)))
                    if gap - moving > 0:
                        tb.add("waits", PEER_WORDS, "peer_stage", gap - moving)
                    gap = moving
                elif last.name == SHARED_SUM_OP:  # the sum, and before it what it waited for: the other end stage
                    why, code = SHARED_SUM_WORDS, "shared_embedding_sum"  # or this stage's own buckets
                    moving = min(gap, max(0.0, last.end - max(last.start, prev_end)))
                    before = [d for d in last.deps if d.end is not None]
                    blocker = max(before, key=lambda d: d.end) if before else None
                    if gap - moving > 0 and blocker is not None:
                        if blocker.device != device:
                            tb.add("waits", PEER_WORDS, "peer_stage", gap - moving)
                        else:
                            tb.add("waits", f"waiting on {stream_words(blocker)}", f"stream:{stream_code(blocker)}",
                                   gap - moving)
                        gap = moving
            else:
                why, code = "waiting on issue order (no later dependency)", "issue_order"
            if gap > 0:
                tb.add("waits", why, code, gap)
        prev_end = max(prev_end, o.end)
    tail = end_s - prev_end
    if tail > 0:
        last = max((o for o in ops if o.stream != "compute"), key=lambda o: o.end)
        tb.add("waits", f"after the last compute op: {stream_words(last)}", f"after_last:{stream_code(last)}", tail)
    idle = (res.iteration_s or 0.0) - end_s
    if idle > 1e-9 * max(end_s, 1e-9):  # a pipeline stage done before the step's last one: the step is the slowest rank's
        tb.add("waits", IDLE_WORDS, "idle_after_slowest_stage", idle)
        tb.iteration_s = res.iteration_s
    return tb


def gpu_devices(res: SimResult) -> list[int]:
    """The GPUs (representative devices) a recorded run has ops on, in order."""
    return sorted({o.device for o in res.ops if o.device >= 0})


def peak_moments(res: SimResult) -> dict[int, dict | None]:
    """`peak_moment` of every GPU of a recorded run."""
    return {d: peak_moment(res, d) for d in gpu_devices(res)}


def peak_moment(res: SimResult, device: int) -> dict | None:
    """When ``device``'s simulated GPU memory peaks, the op that made it peak and, where the run kept
    its op graph (``record``), the tensors live then in words (`live_at_peak`, `live_words`).

    The engine allocates an op's memory when it starts and frees it when it ends, so at the instant
    one compute op ends and the next starts the peak belongs to the one starting: it is the op whose
    allocation reached the peak where the live tensors are known, else the compute op running
    then, one that ended at that instant last. ``starts``: the op started at that instant."""
    if res.timeline is None:
        return None
    samples = [s for s in res.timeline.memory if s.device == device and s.kind == "gpu"]
    if not samples:
        return None
    k = max(range(len(samples)), key=lambda i: samples[i].nbytes)
    top = samples[k]
    live, cause = live_at_peak(res, device, samples, k)
    if cause is None:
        running = [e for e in res.timeline.events if e.device == device and e.stream == "compute"
                   and e.start <= top.time <= e.end]
        # one that ended at this instant freed its memory before the next one started
        running.sort(key=lambda e: (e.end <= top.time and e.start < top.time, -e.start))
        cause = running[0] if running else None
    name = None if cause is None else getattr(cause, "op", None) or cause.name  # a timeline event's, an op's
    return {"time_s": top.time, "bytes": top.nbytes, "op": name, "stream": cause.stream if cause else None,
            "layer": cause.layer if cause else None, "phase": cause.phase if cause else None,
            "starts": bool(cause is not None and cause.start == top.time),
            "live_bytes": live_words(live) if live is not None else None}


def live_at_peak(res: SimResult, device: int, samples: list, k: int) -> tuple[dict[str, float] | None, object]:
    """The GPU tensors live at memory sample ``k`` of ``device`` (``samples``: its GPU samples in
    the engine's order) and the op whose allocation made that sample, from the recorded op graph:
    the static allocations and every op's start and end actions before the sample's instant, and of
    those at that instant the ones whose bytes match the samples up to ``k`` (the engine applies
    them one sample each). (None, None) where the run kept no op graph or they do not add up."""
    if not res.ops or not res.static_memory:
        return None, None
    t = samples[k].time
    live: dict[str, float] = {}
    now: list[tuple[float, str, object]] = []  # actions at t: bytes, tensor, op
    actions = [(0.0, tensor, nbytes, None) for d, tensor, nbytes in res.static_memory if d == device]
    for op in (o for o in res.ops if o.device == device):
        for when, acts in ((op.start, op.mem_start), (op.end, op.mem_end)):
            if when is not None and when <= t:
                actions += [(when, a.tensor, a.nbytes, op) for a in acts if a.space == "gpu"]
    for when, tensor, nbytes, op in actions:
        if when < t:
            live[tensor] = live.get(tensor, 0.0) + nbytes
        else:
            now.append((nbytes, tensor, op))
    first = k
    while first > 0 and samples[first - 1].time == t:
        first -= 1
    tol = 1e-9 * max(abs(samples[k].nbytes), 1.0) + 1.0
    level = sum(live.values())
    if first > 0 and abs(level - samples[first - 1].nbytes) > tol:
        return None, None
    cause = None
    for s in samples[first:k + 1]:
        delta = s.nbytes - level
        j = next((j for j, (nb, _t, _o) in enumerate(now) if abs(nb - delta) <= tol), None)
        if j is None:
            return None, None
        nbytes, tensor, cause = now.pop(j)
        live[tensor] = live.get(tensor, 0.0) + nbytes
        level = s.nbytes
    if abs(sum(live.values()) - samples[k].nbytes) > tol:
        return None, None
    return {n: b for n, b in live.items() if abs(b) > tol}, cause


# a tag may hold a dot: a multiplexed SPPO piece split again is ``s0.1`` (`memo_sim.cost.sppo.Piece.tag`; a review:
# "1.skeletal" read as the role "1", the split pieces' rows left out of the kept activations)
_LAYER_TENSOR = re.compile(r"^(?:mb(?P<mb>\d+)\.)?L(?P<layer>\d+)(?:@(?P<tag>s\d+(?:\.\d+)?|[^.]+))?\.(?P<rest>.+)$")
_WORKING = ("fwd.working", "bwd.working", "recompute.working")
ROLE_WORDS = {"input": "kept input", "skeletal": "kept activations", "lse": "attention lse",
              "recomputed": "recomputed tensors", "scores": "kept attention scores",
              "slot": "rounding-buffer slot", "dkv_accumulators": "dK/dV accumulators"}
OTHER_WORDS = {"classifier.working": "classifier", "classifier.dgrad": "classifier's input gradients"}


def live_words(live: dict[str, float]) -> dict[str, float]:
    """Live tensors (`live_at_peak`) in words, largest first: a phase's working set (its transients
    and the boundary activation), the classifier's, the tensors layers keep by role and how many
    layers keep them (in how many micro-batches, `memo_sim.engine.schedules.microbatch_fold.mb_tensor`,
    or SPPO subsequences), and the static allocations (model states, the policy's buffers)."""
    out: dict[str, float] = {}
    kept: dict[str, tuple[set, set, float]] = {}  # role -> the (layer, copy) units keeping it, their bytes
    for tensor, nbytes in live.items():
        m = _LAYER_TENSOR.match(tensor)
        if m is None:
            base = tensor.split("@")[0]
            key = OTHER_WORDS.get(base, base.replace("_", " ").replace(".", " "))
        elif m["rest"] in _WORKING:
            phase = m["rest"].split(".")[0]
            copy = (f" (micro-batch {m['mb']})" if m["mb"] is not None else
                    f" (subsequence {m['tag'].lstrip('s')})" if m["tag"] is not None else "")
            key = f"layer {m['layer']}'s {PHASE_WORDS.get(phase, phase)} transients + boundary activation{copy}"
        else:  # a kept tensor, with what an offload or prefetch moved of it (``skeletal.offloaded``)
            head = m["rest"].split(".")[0]
            role = ROLE_WORDS.get(head, head.replace("_", " "))
            units, total = kept.get(role, (set(), 0.0))
            units.add((int(m["layer"]), m["mb"], m["tag"]))
            kept[role] = (units, total + nbytes)
            continue
        out[key] = out.get(key, 0.0) + nbytes
    for role, (units, nbytes) in kept.items():
        out[_kept_words(role, units)] = nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _kept_words(role: str, units: set) -> str:
    """``role`` kept by ``units`` ((layer, micro-batch, subsequence) each) in words. Where every layer keeps it in
    every micro-batch (subsequence) named, 'of L layers in M micro-batches' counts the units; where not (a pipeline
    rank's units in flight: 1F1B's chunks at different depths, the interleaved schedule's chunks, MEMO's rank-wide
    forward and prefetch slots), the unit count is said with its span (a review: '2 layers in 7 micro-batches' were
    11 units under interleaving, not 14)."""
    layers = {u[0] for u in units}
    mbs, tags = {u[1] for u in units if u[1] is not None}, {u[2] for u in units if u[2] is not None}
    if len(units) == len(layers) * max(len(mbs), 1) * max(len(tags), 1):
        words = f"layer {min(layers)}'s {role}" if len(layers) == 1 else f"{role} of {len(layers)} layers"
        return words + (f" in {len(mbs)} micro-batches" if len(mbs) > 1 else "") + (
            f" of {len(tags)} subsequences" if len(tags) > 1 else "")
    unit = "layer-" + "-".join(w for w, xs in (("micro-batch", mbs), ("subsequence", tags)) if xs)
    span = [f"{len(layers)} layer{'s' if len(layers) > 1 else ''}"] + [
        f"up to {len(xs)} {w}" for w, xs in (("micro-batches", mbs), ("subsequences", tags)) if len(xs) > 1]
    return f"{role} of {len(units)} {unit} units ({', '.join(span)})"
