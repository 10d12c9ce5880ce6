"""Every wait call site of the executor, read from the code (an AST scan of ``memo_exec/**/*.py``).

The executor's waits are the calls of its wait primitives: the functions decorated with
``@wait_primitive`` (`memo_exec.wait_switch`), found here by that decorator, not from a list. A
*site* is a call of one of them by name (``x.wait_event(...)``, ``tr.wait()``, ``lane.wait(p)``,
``self._wait(tr)``, ``self._stall(...)``) anywhere in the package, except inside a primitive's own
body: that call is the primitive's implementation (``Transfer.wait`` waiting on its requests,
``RingAttention._wait`` on its transfer), removed with the primitive's call site, not separately.

So that a wait cannot hide from the list by not being a primitive, every other call of a wait-like
method -- ``wait``, ``wait_event``, ``wait_stream``, ``waited`` and the primitives' names -- must be
in `NOT_SITES`, with why it is not a wait of the executor's data (the scan reports it otherwise,
and the test fails on it). Left out on purpose:

- ``synchronize``: a whole-device drain at a step's end or at teardown (and CUDA-only timing
  syncs), not an edge between one producer and one consumer; the detector models the engine's as
  a barrier that forgets the step's history (`HappensBefore.barrier`).
- ``memo_exec/calibrate``: the device microbenchmarks, which time raw streams and launch
  processes; no training step runs there.
- the MoE dispatch (`memo_exec.moe.comm`), Ulysses and ZeRO's other collectives: blocking
  (``async_op=False``), they return with the data in place -- no buffer in flight, no wait (ZeRO's all-gathers
  issued a layer ahead and its gradient reductions issued beside the backward are in flight: their wait is a
  primitive, `zero._Gathering.wait`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "memo_exec"
SKIPPED_DIRS = ("memo_exec/calibrate",)
WAIT_NAMES = frozenset({"wait", "wait_event", "wait_stream", "waited"})
DECORATOR = "wait_primitive"

# (path, enclosing function) -> why a wait-like call there is not a site. Each entry must still match
# a call (`scan` reports stale ones).
NOT_SITES = {
    ("memo_exec/distributed/launch.py", "launch_nproc"):
        "the launcher waits for its rank processes to exit: no data of the step",
    ("memo_exec/distributed/p2p.py", "Transfer.settle"):
        "the error path after the guard refused a step: completes what the rank posted so no peer hangs",
    ("memo_exec/distributed/p2p.py", "_DelayedSender._run"):
        "the test delay's sender thread waits for its own send requests (Transfer.wait waits for it)",
    ("memo_exec/streams.py", "HostEvent._block"):
        "the condition variable a CPU event is waited on with: wait_event's implementation",
    ("memo_exec/metp/lane.py", "_CudaSide.issue"):
        "CUDA only: the METP side stream waits for the compute stream; the detector has no side stream",
    ("memo_exec/metp/lane.py", "_CudaSide.join"):
        "CUDA only: the compute stream waits for the METP side stream; the detector has no side stream",
}


@dataclass(frozen=True)
class Site:
    path: str  # from the repository root, e.g. memo_exec/metp/ffn.py
    line: int  # the line Python reports for the call (the callee's name)
    function: str  # the enclosing function, e.g. FFNRing.forward
    callee: str  # the primitive's name

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Scan:
    sites: tuple[Site, ...]
    primitives: tuple[str, ...]  # path:Class.name of every decorated function
    unclassified: tuple[str, ...]  # wait-like calls that are neither sites nor in NOT_SITES
    stale: tuple[tuple[str, str], ...]  # NOT_SITES entries that match no call any more


def _decorated(fn) -> bool:
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)) == DECORATOR
               for d in fn.decorator_list)


def _callee(call: ast.Call) -> tuple[str | None, int]:
    """The called name and the line Python reports for the call: a method's is the line of its name
    (the end of the attribute), a function's the line it starts on."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr, f.end_lineno
    if isinstance(f, ast.Name):
        return f.id, f.lineno
    return None, call.lineno


class _Calls(ast.NodeVisitor):
    """Every call with its enclosing function's qualified name and whether a primitive encloses it."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.inside_primitive = 0
        self.primitives: list[str] = []
        self.calls: list[tuple[str, int, str, bool]] = []  # (callee, line, function, in a primitive)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node) -> None:
        prim = _decorated(node)
        self.scope.append(node.name)
        if prim:
            self.primitives.append(".".join(self.scope))
        self.inside_primitive += prim
        self.generic_visit(node)
        self.inside_primitive -= prim
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name, line = _callee(node)
        if name is not None:
            self.calls.append((name, line, ".".join(self.scope) or "<module>", self.inside_primitive > 0))
        self.generic_visit(node)


def _modules(root: Path):
    for f in sorted((root / PACKAGE).rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if not rel.startswith(SKIPPED_DIRS):
            yield rel, ast.parse(f.read_text(), rel)


def scan(root: Path = ROOT) -> Scan:
    parsed = []
    primitives: list[str] = []
    for rel, tree in _modules(root):
        v = _Calls()
        v.visit(tree)
        parsed.append((rel, v.calls))
        primitives += [f"{rel}:{q}" for q in v.primitives]
    names = {p.rsplit(".", 1)[-1].rsplit(":", 1)[-1] for p in primitives}
    sites, unclassified, used = [], [], set()
    for rel, calls in parsed:
        for callee, line, fn, in_primitive in calls:
            if callee not in names and callee not in WAIT_NAMES or in_primitive:
                continue
            if (rel, fn) in NOT_SITES:
                used.add((rel, fn))
            elif callee in names:
                sites.append(Site(rel, line, fn, callee))
            else:
                unclassified.append(f"{rel}:{line} {fn}: .{callee}()")
    return Scan(tuple(sites), tuple(primitives), tuple(unclassified), tuple(sorted(set(NOT_SITES) - used)))
