"""memo_sim: plan ultra-long-context LLM training in a simulator (no torch needed).

Data flow, one package per step, lowest first (a package imports only those before it):
shared utilities (errors; registry, units, fileio, mip_util; tp, the tensor-parallel flavours;
timeline, request_trace) -> profile (hardware), model (configs) -> layout (parallel degrees) ->
cost (pure formulas) -> policy (activation policies) -> memplan (request traces, DSA solvers,
allocator model, footprint), plan (plan.json, read by memo_exec), frameworks -> engine (SimPy
simulator) -> search (analytic estimate, what-if ranking, the plan built) -> report, export ->
cli, api.

The authority is ``LEVELS`` in ``tests/test_import_direction.py``, which enforces this order;
where this text and the test disagree, the test is right.
"""

__version__ = "0.1.0"
