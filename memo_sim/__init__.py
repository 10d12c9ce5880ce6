"""memo_sim: plan ultra-long-context LLM training in a simulator (no torch needed).

Data flow, one package per step (`tests/test_import_direction.py` holds the order and keeps
imports pointing down it): shared utilities and tp (the tensor-parallel flavours) -> profile
(hardware), model (configs) -> layout -> cost (pure formulas) -> policy (activation policies,
MEMO's alpha) -> memplan (request traces, static addresses, allocator model), plan (plan.json,
read by memo_exec), frameworks -> engine (SimPy) -> search (analytic screen, what-if) -> report,
export -> cli, api.
"""

__version__ = "0.1.0"
