"""Discrete-event simulator of one training iteration (SimPy), no torch.

- `graph`: devices, streams, ops with dependencies and memory actions (the op graph).
- `fluid`: links shared at max-min fair rates (processor sharing), kernels slowed by host copies.
- `core`: the `Engine` (one SimPy process per stream, links, GPU / pinned host memory, OOM/OOHM).
- `schedules`: one iteration's op graph per policy (store all, full recompute, full offload,
  MEMO) with TP/SP, CP, Ulysses and DP collectives; the module docs say how a pipeline over
  stages and subsequences (SPPO) maps onto the same graph.
- `periodic`: identical layers simulated once -- a short schedule run with the event log, checked
  to repeat layer after layer, unfolded into the whole run's results (or refused).
- `simulate`: `simulate`, `sweep_alpha` and `SimResult`.

Scale: one representative GPU per group of identical GPUs is simulated; a copy on a link shared
by k of them counts as k identical flows, and its pinned host memory k times (see `core`).
"""

from memo_sim.engine.core import Engine, Failure
from memo_sim.engine.graph import Device, MemAction, Op, OpGraph
from memo_sim.engine.schedules import build_iteration
from memo_sim.engine.simulate import DEFAULT_ALPHAS, SimResult, simulate, sweep_alpha

__all__ = ["DEFAULT_ALPHAS", "Device", "Engine", "Failure", "MemAction", "Op", "OpGraph", "SimResult",
           "build_iteration", "simulate", "sweep_alpha"]
