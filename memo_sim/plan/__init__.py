"""plan.json: the versioned contract between the simulator and the executor."""

from memo_sim.plan.contract import MemoryPlan, PhasePlan, Prediction
from memo_sim.plan.schema import PLAN_SCHEMA, Plan, read_plan, write_plan

__all__ = ["PLAN_SCHEMA", "MemoryPlan", "PhasePlan", "Plan", "Prediction", "read_plan", "write_plan"]
