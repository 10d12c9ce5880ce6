"""One number per quantity: a configuration's peak GPU memory and where it comes from.

Two tiers predict a peak: the analytic tier (`memo_sim.memplan.footprint.memory_breakdown`, the
sum of its terms) and the event simulator (the high-water mark of its allocation trace). Two
allocators place the transients: MEMO's static memory plan, or PyTorch's caching allocator.
Every command that prints a peak takes it from here and prints its source beside it, so that a
configuration shows the same number, with the same words, in every table of one run: the
simulated peak wherever the simulator ran the configuration, the analytic one elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.policy.base import uses_memory_plan
from memo_sim.units import fmt_bytes

SIMULATED, ANALYTIC = "simulated", "analytic"


def tier_cell(tier: str | None) -> str:
    """A tier in a table cell, as the what-if's ranked table writes it: ``sim``, ``analytic`` (``-``: none)."""
    return {SIMULATED: "sim", ANALYTIC: "analytic"}.get(tier, "-")


# how far the caching allocator's reserved peak measured above the replay's on a GPU: memo-exec on an H100, four
# caching-allocator plans of 8 layers of GPT-7B at 32K-128K (the report names them); the answer's margin line cites it
# the caching allocator's reserved peak above the replay's, lowest and highest of memo-exec's H100 runs
MEASURED_RESERVED_RANGE = (0.013, 0.177)
MEASURED_RESERVED_ERROR = (f"{100 * MEASURED_RESERVED_RANGE[0]:.1f}-{100 * MEASURED_RESERVED_RANGE[1]:.1f}%",
                           "reports/gpu-h100-2026-11-25.md")
MEMORY_PLAN, CACHING_ALLOCATOR = "memory plan", "caching allocator"


@dataclass(frozen=True)
class Peak:
    bytes: float
    tier: str  # SIMULATED | ANALYTIC
    allocator: str  # MEMORY_PLAN | CACHING_ALLOCATOR
    # False: a simulated caching-allocator peak no allocator replay reserved (the micro-batch pipelines and SPPO sum
    # their allocations: ``"replayed": False``), the allocated peak with no reserved cache above it (a review saw
    # 'sim/allocator' on a pipeline row whose explain had no allocator memory stats)
    replayed: bool = True

    @property
    def not_replayed(self) -> bool:
        return not self.replayed and self.tier == SIMULATED and self.allocator == CACHING_ALLOCATOR

    @property
    def allocator_words(self) -> str:
        """The allocator beside the number: ``caching allocator``, or ``allocated: no caching-allocator replay``."""
        return "allocated: no caching-allocator replay" if self.not_replayed else self.allocator

    @property
    def source(self) -> str:
        """``simulated, caching allocator``: the words printed beside the number."""
        return f"{self.tier}, {self.allocator_words}"

    @property
    def short_source(self) -> str:
        """The source in a table cell: ``sim/allocator``, ``analytic/mem plan``, ``sim/allocated`` (not replayed)."""
        kind = "allocated" if self.not_replayed else "mem plan" if self.allocator == MEMORY_PLAN else "allocator"
        return f"{tier_cell(self.tier)}/{kind}"

    def text(self) -> str:
        """``24.81 GiB (simulated, caching allocator)``."""
        return f"{fmt_bytes(self.bytes)} ({self.source})"

    def to_json(self) -> dict:
        out = {"bytes": self.bytes, "tier": self.tier, "allocator": self.allocator}
        return out if not self.not_replayed else {**out, "replayed": False}


def _replayed(allocator: dict | None) -> bool:
    """Whether a simulation's allocator summary says the caching allocator replayed its requests."""
    return (allocator or {}).get("replayed") is not False


def allocator_of(policy, layout) -> str:
    """Who places a plan's transients (`memo_sim.policy.base.uses_memory_plan`)."""
    return MEMORY_PLAN if uses_memory_plan(policy, layout) else CACHING_ALLOCATOR


def candidate_peak(c) -> Peak:
    """A what-if candidate's peak: simulated where tier 2 ran it, else analytic."""
    if c.simulated is not None and c.simulated.get("peak_gpu_bytes") is not None:
        return Peak(float(c.simulated["peak_gpu_bytes"]), SIMULATED, allocator_of(c.policy, c.layout),
                    _replayed(c.simulated.get("allocator")))
    return analytic_peak(c.memory, c.policy, c.layout)


def analytic_peak(breakdown, policy, layout) -> Peak:
    """The analytic tier's peak of a `MemoryBreakdown`."""
    return Peak(float(breakdown.peak_gpu_bytes), ANALYTIC, allocator_of(policy, layout))


def result_peak(r) -> Peak:
    """An event-simulator result's peak (`memo_sim.engine.simulate.SimResult`)."""
    return Peak(float(r.peak_gpu_bytes), SIMULATED, allocator_of(r.policy, r.layout),
                _replayed(getattr(r, "allocator", None)))


def planned_peak(plan) -> Peak | None:
    """The peak a plan file predicts (its ``predicted`` block), with the tier that predicted it."""
    pred = plan.predicted
    if not isinstance(pred.peak_gpu_bytes, (int, float)):
        return None
    tier = SIMULATED if str(pred.source).startswith("sim") else ANALYTIC
    return Peak(float(pred.peak_gpu_bytes), tier, allocator_of(plan.policy, plan.layout), _replayed(pred.allocator))
