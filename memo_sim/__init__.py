"""memo_sim: plan ultra-long-context LLM training in a simulator (no torch needed).

Data flow, one package per step:
profiles (hardware) -> models (configs) -> layouts -> cost (pure formulas) ->
memory / alpha -> whatif (analytic screen) -> engine (SimPy) -> memplan (static addresses)
-> plan (plan.json, read by memo_exec).
"""

__version__ = "0.1.0"
