"""Fluid bandwidth sharing: transfers on shared links progress at max-min fair rates.

A `Flow` has an amount of ``work`` (bytes for a host copy, bytes-equivalent for a collective,
seconds for a kernel) and a route: the `Link` resources it crosses, each with a weight. A
weight k means the flow stands for k identical flows (the representative GPU's copy and those of
the k-1 identical GPUs beside it on that link). When a flow starts or ends the network

1. advances every active flow by ``rate x elapsed time``,
2. recomputes every rate by progressive filling (max-min fairness): raise all unfrozen flows'
   rates together until a link is full (sum of weight x rate = capacity), freeze the flows on
   it, repeat,
3. schedules one SimPy timeout at the earliest completion; a timeout made stale by a later
   change is ignored (generation counter).

Kernels ride the same clock: a compute flow runs at rate 1 (seconds of work per second), or at
1 / (1 + copy_compute_slowdown) while a host copy of its device is in flight (HBM contention).

Nothing is serialised: two copies on one link each get half of it, and each speeds up again
when the other ends.
"""

from __future__ import annotations

import simpy

# A flow ends when less than this many seconds of work at its current rate remain (float noise).
FINISH_TOL_S = 1e-12


class Link:
    __slots__ = ("name", "capacity", "carried", "flows")

    def __init__(self, name: str, capacity: float):
        if capacity <= 0:
            raise ValueError(f"link {name}: capacity must be positive")
        self.name = name
        self.capacity = float(capacity)
        self.carried = 0.0  # weighted work carried so far (bytes over all represented flows)
        self.flows = 0


class Flow:
    __slots__ = ("name", "work", "remaining", "rate", "route", "device", "is_copy", "is_compute", "event")

    def __init__(self, name: str, work: float, route: tuple[tuple[Link, float], ...], device: int,
                 is_copy: bool = False, is_compute: bool = False):
        self.name = name
        self.work = float(work)
        self.remaining = float(work)
        self.rate = 0.0
        self.route = route
        self.device = device
        self.is_copy = is_copy
        self.is_compute = is_compute
        self.event: simpy.Event | None = None


class FluidNetwork:
    """Active flows of every device and link, with their current rates."""

    def __init__(self, env: simpy.Environment, copy_compute_slowdown: float = 0.0, record: bool = False):
        self.env = env
        self.slow_rate = 1.0 / (1.0 + max(0.0, copy_compute_slowdown))
        self.active: list[Flow] = []
        self.copies_per_device: dict[int, int] = {}
        self.last = env.now
        self.gen = 0
        self.record = record
        self.load_log: list[tuple[float, dict[str, float]]] = []  # (time, link -> weighted rate) when record
        self.links: dict[str, Link] = {}

    def link(self, name: str, capacity: float) -> Link:
        lk = self.links.get(name)
        if lk is None:
            lk = self.links[name] = Link(name, capacity)
        return lk

    # -- public ------------------------------------------------------------------------
    def start(self, flow: Flow) -> simpy.Event:
        """Start ``flow`` now; the returned event fires when its work is done."""
        flow.event = self.env.event()
        if flow.work <= 0:
            flow.event.succeed()
            return flow.event
        self._advance()
        self.active.append(flow)
        if flow.is_copy:
            self.copies_per_device[flow.device] = self.copies_per_device.get(flow.device, 0) + 1
        for lk, _w in flow.route:
            lk.flows += 1
        self._reschedule()
        return flow.event

    # -- internals -----------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.last
        if dt > 0:
            for f in self.active:
                done = f.rate * dt
                f.remaining -= done
                for lk, w in f.route:
                    lk.carried += w * done
        self.last = now

    def _rates(self) -> None:
        link_flows: list[Flow] = []
        for f in self.active:
            if f.is_compute:
                f.rate = self.slow_rate if self.copies_per_device.get(f.device) else 1.0
            else:
                link_flows.append(f)
        if not link_flows:
            if self.record:
                self.load_log.append((self.env.now, {}))
            return
        # progressive filling with weights
        cap: dict[Link, float] = {}
        wsum: dict[Link, float] = {}
        for f in link_flows:
            for lk, w in f.route:
                cap[lk] = lk.capacity
                wsum[lk] = wsum.get(lk, 0.0) + w
        unfrozen = link_flows
        while unfrozen:
            bottleneck, share = None, float("inf")
            for lk, ws in wsum.items():
                if ws > 1e-15:
                    s = max(cap[lk], 0.0) / ws
                    if s < share:
                        bottleneck, share = lk, s
            if bottleneck is None:  # flows with an empty route: not limited by any link
                for f in unfrozen:
                    f.rate = float("inf")
                break
            rest = []
            for f in unfrozen:
                if any(lk is bottleneck for lk, _ in f.route):
                    f.rate = share
                    for lk, w in f.route:
                        cap[lk] -= w * share
                        wsum[lk] -= w
                else:
                    rest.append(f)
            unfrozen = rest
        if self.record:
            load: dict[str, float] = {}
            for f in link_flows:
                for lk, w in f.route:
                    load[lk.name] = load.get(lk.name, 0.0) + w * f.rate
            self.load_log.append((self.env.now, load))

    def _reschedule(self) -> None:
        self._rates()
        if not self.active:
            return
        tmin = min(f.remaining / f.rate for f in self.active)
        self.gen += 1
        gen = self.gen
        ev = self.env.timeout(max(tmin, 0.0))
        ev.callbacks.append(lambda _e: self._fire(gen))

    def _fire(self, gen: int) -> None:
        if gen != self.gen:
            return  # a later start or finish rescheduled the network
        self._advance()
        # the earliest flow is done by construction; others within float noise end with it
        first = min(self.active, key=lambda f: f.remaining / f.rate)
        done = [f for f in self.active if f is first or f.remaining <= f.rate * FINISH_TOL_S]
        for f in done:
            self.active.remove(f)
            f.remaining = 0.0
            if f.is_copy:
                self.copies_per_device[f.device] -= 1
            for lk, _w in f.route:
                lk.flows -= 1
        self._reschedule()
        for f in done:
            f.event.succeed()
