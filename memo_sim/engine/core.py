"""The SimPy engine: one process per (device, stream), links as a fluid network, memory over time.

Resources, named for what they model (per simulated device ``d`` on node ``n``):

- ``compute``, ``comm``, ``cp_comm``, ``tp_p2p``, ``tp_bcast``, ``dp_comm``, ``d2h``, ``h2d`` (any
  stream name the graph uses): a SimPy process that runs the stream's ops one at a time in issue order; an op first
  waits for its ``deps`` (events recorded on other streams), then allocates, runs, frees.
- ``pcie.d2h.d<d>`` / ``pcie.h2d.d<d>``: the GPU's own PCIe link (``host_link.d2h_bandwidth``
  / ``h2d_bandwidth``), weight 1.
- ``switch.d2h.n<n>s<s>`` / ``switch.h2d.n<n>s<s>``: the PCIe switch uplink shared by
  ``gpus_per_pcie_switch`` GPUs (``host_link.pcie_switch_bandwidth``, per direction); the
  representative's copy weighs ``switch_group`` (its identical switch mates copy with it).
- ``hostmem.n<n>``: the node's host-memory bandwidth, shared by both directions and all GPUs of
  the node; the representative weighs ``group``.
- ``nvlink.d<d>`` / ``internode.d<d>``: the GPU's NVLink port and its share of the node's NICs
  (per direction); collectives on one of them share it. A collective's alpha-beta time becomes
  bytes-equivalent work at the link's bandwidth, so alone it takes exactly its OpCost time and
  under sharing its latency term stretches with the bandwidth term (a slight overestimate).

- SMs (`memo_sim.cost.comm_sms`): while communication kernels of a device run (a collective's or a
  send's ``Op.sms``, an NCCL kernel's channels by default: the profile's ``gpu.comm_sms``), its
  kernels run on the SMs left, at ``(sm_count - held) / sm_count`` of their speed (times the host
  copies' slowdown where a copy is in flight too).

With ``contention=False`` every op takes its stand-alone time: kernels their `OpCost` seconds,
collectives their alpha-beta time, host copies `memo_sim.cost.transfer.host_copy_time` at the
per-GPU rate while all ``group`` GPUs copy (the analytic model's assumption), and compute is
never slowed by copies or by communication kernels. Then the iteration time is the critical path
of the op graph, which `memo_sim.engine.analytic.analytic_iteration_time` computes layer by layer
without SimPy.

Fast paths (``fast_paths=True``, the default; tests/test_engine_fastpaths.py holds them to the
reference engine, where every kernel and collective is a flow, within 1e-9): a kernel on a device
that has no host copy and no communication kernel in the graph is a plain timeout; a kernel on
another device is a timeout at its current rate, which a copy or a communication kernel ending on
the device (the kernel speeds up) interrupts and re-times, and past which a kernel slowed meanwhile
waits for the work it has left;
a collective whose links no other stream of the graph uses is a plain timeout of its stand-alone
time (its bytes still count as carried); dependency events exist only where an op really waits.

Memory: GPU bytes per device and pinned host bytes per node, sampled at every change (not kept
with ``keep_memory=False``, what a run without a timeline asks for; peaks, end bytes and failures
are the same either way). With ``log=True`` the run also keeps the order in which ops started and
ended and memory changed (`EngineRun.events`, `EngineRun.sample_src`), what
`memo_sim.engine.periodic` reads to fold identical layers. An
allocation past capacity stops the run with a `Failure` (status OOM or OOHM, when, which tensor,
how much), returned, not raised.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field

import simpy

from memo_sim.cost import comm_sms
from memo_sim.cost.transfer import host_bandwidth_per_gpu
from memo_sim.engine.events import MEMORY_SAMPLE, OP_END, OP_START, EventKind
from memo_sim.engine.fluid import Flow, FluidNetwork, Link
from memo_sim.engine.graph import MemAction, Op, OpGraph, gpus_on_nodes
from memo_sim.heap_freeze import heap_frozen
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import MemorySample

HOST_DEVICE_BASE = -1  # node n's host memory is sampled as device -1 - n


@dataclass(frozen=True)
class Failure:
    status: str  # OOM | OOHM
    time_s: float | None  # None: found by the caching-allocator replay of the iteration, which keeps no clock
    tensor: str
    requested_bytes: float
    in_use_bytes: float
    capacity_bytes: float
    device: int  # GPU index, or -1 - node for host memory
    op: str | None
    layer: int | None

    def message(self) -> str:
        from memo_sim.units import fmt_bytes, fmt_time

        where = "GPU memory" if self.status == "OOM" else "pinned host memory"
        when = f"at {fmt_time(self.time_s)}" if self.time_s is not None else "in the caching-allocator replay"
        return (f"{self.status} {when}: {self.tensor} needs {fmt_bytes(self.requested_bytes)} "
                f"with {fmt_bytes(self.in_use_bytes)} of {fmt_bytes(self.capacity_bytes)} {where} in use"
                + (f" (op {self.op}" + (f", layer {self.layer})" if self.layer is not None else ")") if self.op else ""))

    def to_dict(self) -> dict:
        return {"status": self.status, "time_s": self.time_s, "tensor": self.tensor,
                "requested_bytes": self.requested_bytes, "in_use_bytes": self.in_use_bytes,
                "capacity_bytes": self.capacity_bytes, "device": self.device, "op": self.op, "layer": self.layer}


@contextmanager
def gc_paused():
    """The cyclic garbage collector off for a block that makes a few hundred thousand
    long-lived objects and no cycles worth collecting (an SPPO op graph,
    `memo_sim.engine.schedules.sppo.build_pipeline_iteration`): its passes over the young objects
    would traverse the whole graph, during the block and again at each promotion, for nothing.
    At the end the block's objects are moved to the oldest generation unscanned (`gc.freeze`
    then `gc.unfreeze`), where refcounting frees them when their last user lets go (`Engine.run`
    leaves no cycle through a graph); garbage cycles made meanwhile wait for the next full
    collection. Left as it was found where the caller has the collector off or has frozen
    objects itself."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not heap_frozen():  # constant time where memo froze the heap itself (a what-if's pool worker)
            gc.freeze()
            gc.unfreeze()
        gc.enable()


class _Kernel:
    """A kernel running on a device whose copies or communication kernels slow it (`Engine._stream`): its
    work ``left`` as of time ``t`` at ``rate``, when it ends at that rate (``end``, set at each change: the time a timeout
    scheduled then would fire at), the rate its timeout was set at (``planned``), whether the rate
    changed since (``changed``), and whether an interrupt is on its way to it (``pending``)."""

    __slots__ = ("left", "t", "rate", "end", "planned", "changed", "pending")

    def __init__(self, work: float, t: float, rate: float):
        self.left = work
        self.t = t
        self.rate = rate
        self.end = t
        self.planned = rate
        self.changed = False
        self.pending = False


class _Abort(Exception):
    """Internal: ends env.run when an allocation fails."""


@dataclass
class EngineRun:
    ops: list[Op]
    memory: list[MemorySample]
    peak_gpu_bytes: dict[int, float]
    peak_host_bytes: dict[int, float]  # per node
    start_gpu_bytes: dict[int, float]
    end_gpu_bytes: dict[int, float]
    end_host_bytes: dict[int, float]
    failure: Failure | None
    end_time: float
    link_log: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    link_capacity: dict[str, float] = field(default_factory=dict)
    link_carried: dict[str, float] = field(default_factory=dict)
    # with ``log=True``: every op start (OP_START, op), op end (OP_END, op) and memory sample
    # (MEMORY_SAMPLE, index into ``memory``; `memo_sim.engine.events`) in the order the engine
    # ran them, and per sample (op or None, action, applied
    # delta: host bytes already multiplied by the device's group)
    events: list[tuple[EventKind, object]] = field(default_factory=list)
    sample_src: list[tuple[Op | None, MemAction, float]] = field(default_factory=list)


class Engine:
    """Runs an `OpGraph` on a hardware profile; see the module docs for the resources."""

    def __init__(self, graph: OpGraph, profile: HardwareProfile, *, contention: bool = True,
                 gpu_capacity: float | None = None, host_capacity: float | None = None,
                 record_links: bool = False, fast_paths: bool = True, keep_memory: bool = True,
                 log: bool = False):
        self.graph = graph
        self.profile = profile
        self.contention = contention
        self.fast_paths = fast_paths  # False: every kernel and collective through the fluid network (reference)
        self.gpu_capacity = profile.usable_gpu_memory if gpu_capacity is None else gpu_capacity
        self.host_capacity = profile.usable_host_memory if host_capacity is None else host_capacity
        self.env = simpy.Environment()
        self.net = FluidNetwork(self.env, float(profile.gpu.copy_compute_slowdown) if contention else 0.0,
                                record=record_links)
        # SM contention (`memo_sim.cost.comm_sms`): the SMs the communication kernels running on each device hold,
        # and the share of its speed a kernel there gets meanwhile
        self._sm_on = contention and comm_sms.priced(profile)
        self._nccl_sms = comm_sms.nccl_sms(profile)
        self._held: dict[int, float] = {}
        self._shares: dict[float, float] = {}  # SMs held -> the share left to kernels (`comm_sms.compute_share`)
        self.gpu_mem: dict[int, float] = {d: 0.0 for d in graph.devices}
        self.host_mem: dict[int, float] = {dev.node: 0.0 for dev in graph.devices.values()}
        self.peak_gpu = dict(self.gpu_mem)
        self.peak_host = dict(self.host_mem)
        self.samples: list[MemorySample] = []
        self.keep_memory = keep_memory or log  # False: no memory samples kept (peaks, failures and end bytes still are)
        # log: the order of op starts, op ends and memory samples (`EngineRun.events`), what
        # `memo_sim.engine.periodic` reads to check a folded run and unfold it
        self.events: list[tuple[EventKind, object]] = []
        self.sample_src: list[tuple[Op | None, MemAction, float]] = []
        self._log = self.events.append if log else None
        self.failure: Failure | None = None
        hl = profile.host_link
        self._copy_lat = float(hl.latency)
        self._solo_rate = {}
        self._routes = {}
        self.routes = self._routes  # (device, d2h | h2d | nvlink | internode) -> ((link, weight), ...)
        on_node = gpus_on_nodes(graph.devices.values())  # a node's hosts serve every stage's GPUs there
        for dev in graph.devices.values():
            for direction in ("d2h", "h2d"):
                self._solo_rate[(dev.index, direction)] = host_bandwidth_per_gpu(profile, direction, dev.group)
                own = float(hl.d2h_bandwidth if direction == "d2h" else hl.h2d_bandwidth)
                self._routes[(dev.index, direction)] = (
                    (self.net.link(f"pcie.{direction}.d{dev.index}", own), 1.0),
                    (self.net.link(f"switch.{direction}.n{dev.node}s{dev.switch}", float(hl.pcie_switch_bandwidth)),
                     float(max(1, dev.switch_group))),
                    (self.net.link(f"hostmem.n{dev.node}", profile.host_memory_bandwidth(on_node[dev.node])),
                     float(max(1, dev.group))),
                )
            for name, lk in (("nvlink", profile.nvlink), ("internode", profile.internode)):
                self._routes[(dev.index, name)] = ((self.net.link(f"{name}.d{dev.index}", float(lk.bandwidth)), 1.0),)

    # -- memory --------------------------------------------------------------------------
    def _apply(self, device: int, actions: tuple[MemAction, ...], op: Op | None) -> None:
        now = self.env.now
        for a in actions:
            if a.space == "gpu":
                cur = self.gpu_mem[device]
                new = cur + a.nbytes
                if a.nbytes > 0 and new > self.gpu_capacity:
                    self._fail("OOM", a, cur, self.gpu_capacity, device, op)
                self.gpu_mem[device] = new
                if new > self.peak_gpu[device]:
                    self.peak_gpu[device] = new
                if self.keep_memory:
                    if self._log is not None:
                        self._log((MEMORY_SAMPLE, len(self.samples)))
                        self.sample_src.append((op, a, a.nbytes))
                    self.samples.append(MemorySample(now, device, "gpu", new))
            else:
                dev = self.graph.devices[device]
                node = dev.node
                delta = a.nbytes * max(1, dev.group)
                cur = self.host_mem[node]
                new = cur + delta
                if delta > 0 and new > self.host_capacity:
                    self._fail("OOHM", MemAction(a.space, a.tensor, delta), cur, self.host_capacity,
                               HOST_DEVICE_BASE - node, op)
                self.host_mem[node] = new
                if new > self.peak_host[node]:
                    self.peak_host[node] = new
                if self.keep_memory:
                    if self._log is not None:
                        self._log((MEMORY_SAMPLE, len(self.samples)))
                        self.sample_src.append((op, a, delta))
                    self.samples.append(MemorySample(now, HOST_DEVICE_BASE - node, "host", new))

    def _fail(self, status: str, a: MemAction, cur: float, cap: float, device: int, op: Op | None) -> None:
        self.failure = Failure(status, self.env.now, a.tensor, a.nbytes, cur, cap, device,
                               op.name if op else None, op.layer if op else None)
        raise _Abort()

    # -- streams -------------------------------------------------------------------------
    def _stream(self, ops: list[Op]):
        env = self.env
        net = self.net
        contention = self.contention
        slowed = self._slowed_devices
        alone = self._alone_routes
        waiters = self._waiters
        kernels = self._kernels
        rate_of = net.compute_rate
        sm_on = self._sm_on
        nccl_sms = self._nccl_sms
        hold = self._hold
        log = self._log
        # per op, looked up once per stream: the bound methods and constants, and per link or
        # direction the route and whether it is one of the exclusive ones
        timeout = env.timeout
        start_flow = net.start
        apply = self._apply
        fast_paths = self.fast_paths
        interrupt = simpy.Interrupt
        routes = self._routes
        comm_routes: dict[tuple[int, str], tuple[tuple, bool]] = {}
        for op in ops:
            for d in op.deps:
                if d.end is None:  # only cross-stream waits make an event (most deps have ended)
                    ev = waiters.get(d.uid)
                    if ev is None:
                        ev = waiters[d.uid] = env.event()
                    yield ev
            op.start = env.now
            if log is not None:
                log((OP_START, op))
            if op.mem_start:
                apply(op.device, op.mem_start, op)
            if op.work > 0:
                kind = op.kind
                if kind == "compute":
                    if op.device in slowed:
                        if fast_paths:
                            # a kernel on a device whose host copies or communication kernels slow
                            # it: a timeout at the current rate (1, or the slow rate while a copy of
                            # the device is in flight, times the SMs' share the communication kernels
                            # running there leave). A copy or a communication kernel starting or
                            # ending on the device brings the kernel's work up to date (`_retime`);
                            # where that speeds it up past
                            # the rate its timeout was set at, it interrupts it and the rest is
                            # re-timed; where it slows it down, the kernel wakes at its timeout,
                            # finds work left and waits for the rest at the rate it has then
                            k = _Kernel(op.work, env.now, rate_of(op.device))
                            running = kernels.get(op.device)
                            if running is None:
                                running = kernels[op.device] = {}
                            running[k] = env.active_process
                            delay = k.left / k.rate
                            while True:
                                k.planned = k.rate
                                k.changed = False
                                try:
                                    yield timeout(max(delay, 0.0))
                                except interrupt:  # sped up: the rest at the new rate, from now
                                    k.pending = False
                                    delay = k.left / k.rate
                                    continue
                                if not k.changed:
                                    break
                                # slowed meanwhile: on to the end the last change set (the very time
                                # an interrupt at that change would have scheduled)
                                delay = k.end - env.now
                            del running[k]
                        else:
                            yield start_flow(Flow(op.name, op.work, (), op.device, is_compute=True))
                    else:  # no host copy on this device can slow it: a plain timeout
                        yield timeout(op.work)
                elif kind == "comm":
                    held = (nccl_sms if op.sms is None else op.sms) if sm_on else 0.0
                    if held > 0.0:  # its kernel takes SMs from the device's kernels while it runs
                        hold(op.device, held)
                    if contention and op.link:
                        key = (op.device, op.link)
                        hit = comm_routes.get(key)
                        if hit is None:
                            route = routes[key]
                            hit = comm_routes[key] = (route, route in alone)
                        route = hit[0]
                        if hit[1]:  # no other stream ever uses these links: the rate is the link's
                            yield timeout(op.work)
                            route[0][0].carried += op.work * route[0][0].capacity
                        else:
                            yield start_flow(Flow(op.name, op.work * route[0][0].capacity, route, op.device))
                    else:
                        yield timeout(op.work)
                    if held > 0.0:
                        hold(op.device, -held)
                else:  # copy
                    yield timeout(self._copy_lat)
                    if contention:
                        route = routes[(op.device, op.direction)]
                        yield start_flow(Flow(op.name, op.work, route, op.device, is_copy=True))
                    else:
                        yield timeout(op.work / self._solo_rate[(op.device, op.direction)])
            op.end = env.now
            if log is not None:
                log((OP_END, op))
            if op.mem_end:
                apply(op.device, op.mem_end, op)
            ev = waiters.pop(op.uid, None)
            if ev is not None:
                ev.succeed()
        self._last_end = env.now  # this stream's last op just ended (time only moves forward)

    def _copies_changed(self, device: int, active: bool) -> None:
        """A copy started on ``device`` where none ran (``active``) or its last one ended: the kernels there
        take the new rate (`_retime`)."""
        self._retime(device, self.net.compute_rate(device))

    def _hold(self, device: int, sms: float) -> None:
        """A communication kernel holding ``sms`` SMs started on ``device`` (negative: one ended): the kernels
        there take the share of the SMs left (`memo_sim.cost.comm_sms.compute_share`)."""
        held = self._held.get(device, 0.0) + sms
        if held < 1e-9:
            held = 0.0
        self._held[device] = held
        share = self._shares.get(held)  # a few distinct values a run (how many kernels of which kind run at once)
        if share is None:
            if len(self._shares) > 4096:  # sums of fractional SM counts can drift; keep the memo small
                self._shares.clear()
            share = self._shares[held] = comm_sms.compute_share(held, self.profile)
        # the network re-times its kernel flows (the reference path); the fast paths' kernels are re-timed here
        if self.net.set_share(device, share) and self.fast_paths:
            self._retime(device, self.net.compute_rate(device))

    def _retime(self, device: int, rate: float) -> None:
        """Every kernel running on ``device`` is brought up to now at its old rate and takes ``rate``; those
        now faster than their timeout assumed are interrupted (see `_stream`)."""
        running = self._kernels.get(device)
        if not running:
            return
        now = self.env.now
        for k, proc in running.items():
            k.left -= k.rate * (now - k.t)
            k.t = now
            k.rate = rate
            k.end = now + k.left / rate
            k.changed = True
            if rate > k.planned and not k.pending:
                k.pending = True
                proc.interrupt()

    def run(self) -> EngineRun:
        g = self.graph
        # kernels slow down only on a device whose host copies or communication kernels can overlap them
        slowing = self.contention and self.net.slow_rate < 1.0
        if not self.fast_paths:
            self._slowed_devices = set(g.devices) if slowing or self._sm_on else set()
        else:
            self._slowed_devices = {op.device for op in g.ops if op.kind == "copy"} if slowing else set()
            if self._sm_on:
                nccl = self._nccl_sms
                self._slowed_devices |= {op.device for op in g.ops if op.kind == "comm" and op.work > 0
                                         and (nccl if op.sms is None else op.sms) > 0}
        self._alone_routes = self._exclusive_routes()
        self._kernels: dict[int, dict] = {}  # device -> {its running `_Kernel`: process} (see _stream)
        self.net.on_copies_changed = self._copies_changed
        self._waiters: dict[int, simpy.Event] = {}
        self._last_end = 0.0  # when the last stream ran its last op
        start_gpu: dict[int, float] = {}
        gens = []
        try:
            for dev_index, action in g.static:
                self._apply(dev_index, (action,), None)
            start_gpu = dict(self.gpu_mem)
            for ops in g.streams.values():
                gens.append(self._stream(ops))
                self.env.process(gens[-1])
            self.env.run()
        except _Abort as abort:
            # the tracebacks of the abort (simpy chains copies of it through the failed
            # process) hold the frames of this run: dropped, they leave no cycle through it
            ex: BaseException | None = abort
            seen: set[int] = set()
            while ex is not None and id(ex) not in seen:
                seen.add(id(ex))
                ex.__traceback__ = None
                ex = ex.__cause__ or ex.__context__
        finally:
            # the references from the network and from the streams still suspended (a failed
            # or deadlocked run) back to this engine are cycles: broken, the run's graph (up to a
            # few hundred thousand ops) is freed when its last user lets go, not at the cyclic
            # collector's next full pass
            self.net.on_copies_changed = None
            for gen in gens:
                gen.close()
        if not start_gpu:
            start_gpu = dict(self.gpu_mem)
        return EngineRun(
            ops=g.ops, memory=self.samples, peak_gpu_bytes=dict(self.peak_gpu), peak_host_bytes=dict(self.peak_host),
            start_gpu_bytes=start_gpu, end_gpu_bytes=dict(self.gpu_mem), end_host_bytes=dict(self.host_mem),
            # the iteration ends when its last op does (or where it failed): timeouts a re-timing left
            # behind (a kernel's or a flow's, ignored when they fire) may run the clock on past that
            failure=self.failure, end_time=self.env.now if self.failure else self._last_end,
            link_log=self.net.load_log,
            link_capacity={k: v.capacity for k, v in self.net.links.items()},
            link_carried={k: v.carried for k, v in self.net.links.items()},
            events=self.events, sample_src=self.sample_src)

    def _exclusive_routes(self) -> set:
        """Collective routes whose links no other stream of the graph ever uses: one stream runs
        one op at a time, so such a collective always has its link to itself and takes exactly
        its stand-alone time (a plain timeout, no fluid network). Not with ``record_links``
        (the link log then shows every flow)."""
        if not self.contention or self.net.record or not self.fast_paths:
            return set()
        used: dict[tuple, None] = {}  # (device, stream, link or direction) of every collective and copy
        for op in self.graph.ops:
            kind = op.kind
            if kind == "comm":
                if op.link:
                    used[(op.device, op.stream, op.link)] = None
            elif kind == "copy":
                used[(op.device, op.stream, op.direction)] = None
        users: dict[Link, set] = {}
        routes: dict[tuple, tuple] = {}
        for device, stream, name in used:
            key = (device, name)
            route = self._routes[key]
            routes.setdefault((device, stream, key), route)
            for lk, _w in route:
                users.setdefault(lk, set()).add((device, stream))
        return {route for (_d, _s, key), route in routes.items()
                if key[1] not in ("d2h", "h2d") and all(len(users[lk]) == 1 for lk, _w in route)}

    def unfinished(self) -> list[Op]:
        """Ops that never ran (a dependency cycle or a failed run)."""
        return [op for op in self.graph.ops if op.end is None]
