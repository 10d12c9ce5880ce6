"""The proved-bound check the search tests share (`memo_sim.search.bound`): simulate a sample of fitting
candidates and hold each one's lower bound at or below its simulated iteration time."""

from __future__ import annotations

from memo_sim.search.bound import lower_bound
from memo_sim.search.whatif import simulate_candidates


def sample(cands, limit: int = 5) -> list:
    """Up to ``limit`` of ``cands`` spread over the list (fitting ones first if the caller filtered them)."""
    return cands[:: max(1, len(cands) // limit)][:limit]


def bounds_hold(cands) -> list:
    """Simulate ``cands`` and assert 0 < bound <= simulated for each that ran; return those."""
    simulate_candidates(cands, jobs=1)
    ran = []
    for c in cands:
        if c.simulated["status"] != "OK":
            continue
        lb, sim = lower_bound(c), c.simulated["iteration_s"]
        assert 0 < lb <= sim * (1 + 1e-9), (c.schedule, c.layout.label(), c.policy.label(), lb, sim)
        ran.append(c)
    return ran
