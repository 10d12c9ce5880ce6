"""Fluid bandwidth sharing: transfers on shared links progress at max-min fair rates.

A `Flow` has an amount of ``work`` (bytes for a host copy, bytes-equivalent for a collective,
seconds for a kernel) and a route: the `Link` resources it crosses, each with a weight. A
weight k means the flow stands for k identical flows (the representative GPU's copy and those of
the k-1 identical GPUs beside it on that link). When a flow starts or ends the network

1. takes the flows that share a link with it, directly or through other flows (its connected
   component: max-min fair rates decompose over components, so no other flow's rate changes),
2. advances each of them by ``rate x elapsed time`` and recomputes their rates by progressive
   filling (max-min fairness): raise all unfrozen flows' rates together until a link is full
   (sum of weight x rate = capacity), freeze the flows on it, repeat,
3. gives each flow whose rate changed a SimPy timeout at its own completion; a timeout made
   stale by a later change is ignored (a generation counter per flow). There is no scan over
   all flows per event.

Kernels ride the same clock but never enter the link computation: a compute flow runs at rate 1
(seconds of work per second), or at 1 / (1 + copy_compute_slowdown) while a host copy of its
device is in flight (HBM contention), times the share of the SMs the device's communication
kernels leave it (`set_share`, `memo_sim.cost.comm_sms`); only a copy starting or ending on its
device (the count going from 0 to 1 or back) or a change of that share re-times it. The engine
runs a kernel as a plain timeout where no copy or communication kernel can slow it
(`memo_sim.engine.core`).

Nothing is serialised: two copies on one link each get half of it, and each speeds up again
when the other ends.
"""

from __future__ import annotations

import simpy


class Link:
    __slots__ = ("name", "capacity", "carried", "flows", "active")

    def __init__(self, name: str, capacity: float):
        if capacity <= 0:
            raise ValueError(f"link {name}: capacity must be positive")
        self.name = name
        self.capacity = float(capacity)
        self.carried = 0.0  # weighted work carried so far (bytes over all represented flows)
        self.flows = 0
        self.active: list[Flow] = []  # flows on the link now, in start order


class Flow:
    __slots__ = ("name", "work", "remaining", "rate", "route", "device", "is_copy", "is_compute", "event",
                 "last", "gen")

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
        self.last = 0.0  # time up to which ``remaining`` is current
        self.gen = 0  # bumped at every re-timing; a timeout of an older generation is stale


class FluidNetwork:
    """Active flows of every device and link, with their current rates."""

    # a flow alone in its component gets its rate without the progressive-filling loop (the same
    # number; tests/test_engine_speedups.py turns this off to hold the two equal)
    single_flow_shortcut = True

    def __init__(self, env: simpy.Environment, copy_compute_slowdown: float = 0.0, record: bool = False):
        self.env = env
        self.slow_rate = 1.0 / (1.0 + max(0.0, copy_compute_slowdown))
        self.link_flows: dict[Flow, None] = {}  # active flows on links, in start order
        self.compute_flows: dict[int, list[Flow]] = {}  # device -> its active kernels
        self.copies_per_device: dict[int, int] = {}
        self.share: dict[int, float] = {}  # device -> the share of its SMs its kernels get (communication holds the rest)
        self.record = record
        self.load_log: list[tuple[float, dict[str, float]]] = []  # (time, link -> weighted rate) when record
        self.links: dict[str, Link] = {}
        self.on_copies_changed = None  # callback(device, copies_active: bool) when a device's copy count leaves or hits 0
        # id(route) -> (route, the rate of a flow alone on it, or None where the route crosses a
        # link twice): a flow alone in its component gets the same number every time
        self._solo: dict[int, tuple[tuple, float | None]] = {}

    @property
    def active(self) -> list[Flow]:
        return list(self.link_flows) + [f for fs in self.compute_flows.values() for f in fs]

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
        flow.last = self.env.now
        if flow.is_compute:
            self.compute_flows.setdefault(flow.device, []).append(flow)
            flow.rate = self.compute_rate(flow.device)
            self._time(flow)
            return flow.event
        self.link_flows[flow] = None
        for lk, _w in flow.route:
            lk.flows += 1
            lk.active.append(flow)
        if flow.is_copy:
            self._copies_changed(flow.device, 1)
        if flow.route:
            self._refill(flow.route)
        else:  # not limited by any link
            flow.rate = float("inf")
            self._time(flow)
        return flow.event

    # -- internals -----------------------------------------------------------------------
    def _time(self, f: Flow) -> None:
        """(Re)schedule ``f``'s completion at its current rate."""
        f.gen += 1
        gen = f.gen
        ev = self.env.timeout(max(f.remaining / f.rate, 0.0))
        ev.callbacks.append(lambda _e: self._finish(f, gen))

    def _advance(self, f: Flow, now: float) -> None:
        dt = now - f.last
        if dt > 0:
            done = f.rate * dt
            f.remaining -= done
            for lk, w in f.route:
                lk.carried += w * done
        f.last = now

    def _finish(self, f: Flow, gen: int) -> None:
        if gen != f.gen:
            return  # re-timed since: a later timeout ends it
        self._advance(f, self.env.now)
        f.remaining = 0.0
        if f.is_compute:
            self.compute_flows[f.device].remove(f)
        else:
            del self.link_flows[f]
            for lk, _w in f.route:
                lk.flows -= 1
                lk.active.remove(f)
            if f.is_copy:
                self._copies_changed(f.device, -1)
            if f.route:
                self._refill(f.route)
        f.event.succeed()

    def _copies_changed(self, device: int, delta: int) -> None:
        before = self.copies_per_device.get(device, 0)
        after = before + delta
        self.copies_per_device[device] = after
        if (before == 0) == (after == 0):
            return
        if self.on_copies_changed is not None:
            self.on_copies_changed(device, after > 0)
        self._retime_compute(device, self.compute_rate(device))

    def compute_rate(self, device: int) -> float:
        """The rate a kernel of ``device`` runs at now: slowed while a host copy of it is in flight, times the share
        of its SMs the communication kernels running there leave it."""
        return (self.slow_rate if self.copies_per_device.get(device) else 1.0) * self.share.get(device, 1.0)

    def set_share(self, device: int, share: float) -> bool:
        """The share of ``device``'s SMs its kernels get from now (communication kernels hold the rest); whether it
        changed."""
        if share == self.share.get(device, 1.0):
            return False
        self.share[device] = share
        self._retime_compute(device, self.compute_rate(device))
        return True

    def _retime_compute(self, device: int, rate: float) -> None:
        now = self.env.now
        for f in self.compute_flows.get(device, ()):
            if f.rate != rate:
                self._advance(f, now)
                f.rate = rate
                self._time(f)

    def _component(self, route) -> list[Flow]:
        """The active link flows connected to ``route``'s links through shared links."""
        if len(route) == 1:
            # one link whose flows all cross only it (a collective's NVLink port): the component
            # is the link's flows, in the order the walk below finds them
            active = route[0][0].active
            for f in active:
                if len(f.route) != 1:
                    break
            else:
                return list(active)
        flows: dict[Flow, None] = {}
        seen = {lk for lk, _w in route}
        stack = list(seen)
        while stack:
            for f in stack.pop().active:
                if f not in flows:
                    flows[f] = None
                    for lk, _w in f.route:
                        if lk not in seen:
                            seen.add(lk)
                            stack.append(lk)
        return list(flows)

    def _refill(self, route) -> None:
        """Max-min fair rates of the flows connected to ``route`` (progressive filling)."""
        if len(route) == 1 and not self.record:
            # one link (a collective's NVLink port): no flow left on it, or one flow that crosses
            # only it, is the component `_component` would find, without the walk
            active = route[0][0].active
            if not active:
                return
            if len(active) == 1 and len(active[0].route) == 1:
                self._refill_component([active[0]])
                return
        self._refill_component(self._component(route))

    def _refill_component(self, comp: list[Flow]) -> None:
        now = self.env.now
        if not comp:  # the last flow on these links ended: no rate to change
            if self.record:
                self._log(now)
            return
        if self.single_flow_shortcut and len(comp) == 1:
            f = comp[0]
            r = f.route
            hit = self._solo.get(id(r))
            if hit is None or hit[0] is not r:
                hit = self._solo[id(r)] = (r, _solo_rate(r))
            share = hit[1]
            if share is not None:
                # a flow alone on its links (each crossed once): progressive filling gives it
                # the smallest capacity / weight of its route (`_solo_rate`)
                self._advance(f, now)
                if share != f.rate or f.gen == 0:
                    f.rate = share
                    self._time(f)
                if self.record:
                    self._log(now)
                return
        old = []  # the rates before, in ``comp``'s order
        for f in comp:
            self._advance(f, now)
            old.append(f.rate)
        cap: dict[Link, float] = {}
        wsum: dict[Link, float] = {}
        for f in comp:
            for lk, w in f.route:
                cap[lk] = lk.capacity
                wsum[lk] = wsum.get(lk, 0.0) + w
        unfrozen = comp
        while unfrozen:
            bottleneck, share = None, float("inf")
            for lk, ws in wsum.items():
                if ws > 1e-15:
                    s = max(cap[lk], 0.0) / ws
                    if s < share:
                        bottleneck, share = lk, s
            if bottleneck is None:  # cannot happen: every flow here crosses a link
                for f in unfrozen:
                    f.rate = float("inf")
                break
            rest = []
            for f in unfrozen:
                for lk, _w in f.route:
                    if lk is bottleneck:
                        f.rate = share
                        for lk2, w in f.route:
                            cap[lk2] -= w * share
                            wsum[lk2] -= w
                        break
                else:
                    rest.append(f)
            unfrozen = rest
        for f, rate in zip(comp, old):
            if f.rate != rate or f.gen == 0:
                self._time(f)
        if self.record:
            self._log(now)

    def _log(self, now: float) -> None:
        load: dict[str, float] = {}
        for f in self.link_flows:
            for lk, w in f.route:
                load[lk.name] = load.get(lk.name, 0.0) + w * f.rate
        self.load_log.append((now, load))


def _solo_rate(route) -> float | None:
    """The rate of a flow alone on ``route``: the smallest capacity / weight, the first such
    link's (what progressive filling gives it); None where the route crosses a link twice."""
    if len({id(lk) for lk, _w in route}) != len(route):
        return None
    share = float("inf")
    for lk, w in route:
        if w > 1e-15:
            x = max(lk.capacity, 0.0) / w
            if x < share:
                share = x
    return share
