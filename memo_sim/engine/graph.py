"""The op graph the engine runs: devices, streams, ops, dependencies, memory actions.

An `Op` is one kernel, collective or copy on one stream of one simulated device. Every stream
runs its ops one at a time in the order they were added (issue order, like a CUDA stream);
an op may also wait on ops of other streams or other devices (``deps``, like
``cudaStreamWaitEvent`` on an event recorded after those ops). Memory actions run when an op
starts (``mem_start``) and when it ends (``mem_end``); a positive delta past capacity ends the
run as OOM (GPU) or OOHM (pinned host memory).

Kinds of op and what their ``work`` means:

- ``compute``: seconds on the device's SMs at full speed (from `memo_sim.cost.layer_time`);
  slowed by ``gpu.copy_compute_slowdown`` while a host copy of the same device runs, and to the SMs
  left while communication kernels of the device run (`memo_sim.cost.comm_sms`).
- ``comm``: a collective; ``work`` is its alpha-beta time alone on its link (``link`` is
  ``nvlink`` or ``internode``); two collectives on one link share its bandwidth. While it runs its
  kernel holds ``sms`` of the device's SMs (None: an NCCL kernel's, the profile's ``gpu.comm_sms``),
  which the device's kernels beside it do without (`memo_sim.cost.comm_sms`).
- ``copy``: a host copy of ``nbytes`` in ``direction`` d2h or h2d, over the device's PCIe link,
  its PCIe switch's uplink and the node's host-memory bandwidth.

A `Device` stands for ``group`` identical GPUs of its node (itself included) that run the same
schedule at the same time; ``switch_group`` of them sit on its PCIe switch. The engine lets a
representative's copy count as that many identical flows on the shared links, and its pinned
host allocations count ``group`` times against the node's host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("compute", "comm", "copy")


@dataclass(frozen=True)
class Device:
    index: int
    node: int = 0
    switch: int = 0  # PCIe switch index inside the node
    group: int = 1  # identical GPUs of this node that this device represents (itself included)
    switch_group: int = 1  # of those, how many share its PCIe switch
    label: str = ""


def gpus_on_nodes(devices) -> dict[int, int]:
    """{node: the GPUs the devices stand for there}: every pipeline stage's GPUs on a node together (they share its
    hosts' memory and memory bandwidth)."""
    out: dict[int, int] = {}
    for dev in devices:
        out[dev.node] = out.get(dev.node, 0) + max(1, dev.group)
    return out


@dataclass(frozen=True)
class MemAction:
    space: str  # "gpu" | "host"
    tensor: str
    nbytes: float  # > 0 allocates, < 0 frees; host bytes are per GPU (the engine scales by group)


@dataclass(eq=False)
class Op:
    uid: int
    name: str
    device: int
    stream: str
    kind: str
    phase: str
    layer: int | None
    work: float  # compute/comm: seconds alone at full rate; copy: bytes
    nbytes: float = 0.0
    flops: float = 0.0
    direction: str | None = None  # copy: d2h | h2d
    link: str | None = None  # comm: nvlink | internode
    deps: list["Op"] = field(default_factory=list)
    mem_start: tuple[MemAction, ...] = ()
    mem_end: tuple[MemAction, ...] = ()
    sms: float | None = None  # comm: the SMs its kernel holds (None: an NCCL kernel's, the profile's gpu.comm_sms)
    # filled by the engine
    start: float | None = None
    end: float | None = None

    def __repr__(self) -> str:
        return f"Op({self.uid}:{self.name} L{self.layer} {self.phase} d{self.device}/{self.stream})"


class OpGraph:
    """Devices and, per (device, stream), the ops in issue order."""

    def __init__(self, devices: list[Device]):
        if not devices:
            raise ValueError("an op graph needs at least one device")
        self.devices = {d.index: d for d in devices}
        self.streams: dict[tuple[int, str], list[Op]] = {}
        self.ops: list[Op] = []
        self.static: list[tuple[int, MemAction]] = []  # (device, action) applied at t = 0

    def add(self, name: str, *, device: int, stream: str, kind: str, phase: str, layer: int | None,
            work: float, deps: list[Op] | tuple[Op, ...] = (), nbytes: float = 0.0, flops: float = 0.0,
            direction: str | None = None, link: str | None = None,
            mem_start: tuple[MemAction, ...] = (), mem_end: tuple[MemAction, ...] = (),
            sms: float | None = None) -> Op:
        if kind not in KINDS:
            raise ValueError(f"op kind {kind!r} unknown; one of {KINDS}")
        if device not in self.devices:
            raise ValueError(f"op {name!r} on unknown device {device}")
        if kind == "copy" and direction not in ("d2h", "h2d"):
            raise ValueError(f"copy op {name!r} needs direction d2h or h2d")
        op = Op(len(self.ops), name, device, stream, kind, phase, layer, max(0.0, float(work)), nbytes, flops,
                direction, link, [d for d in deps if d is not None], tuple(mem_start), tuple(mem_end), sms)
        self.ops.append(op)
        self.streams.setdefault((device, stream), []).append(op)
        return op

    def add_static(self, device: int, action: MemAction) -> None:
        """Memory allocated before the iteration starts (model states, rounding buffers)."""
        self.static.append((device, action))
