"""The 20 candidates of the refactor golden test (7B-65B and LLaMA, every policy, several layouts).

`python -m tests.golden_cases` (from the repository root) rewrites ``tests/data/golden_candidates.json``;
do that only when a change of simulated numbers is intended, and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile

GOLDEN = Path(__file__).parent / "data" / "golden_candidates.json"

# (model, gpus' layout, seq, policy, alpha, profile)
CASES = [
    ("gpt-7b", dict(tp=8), 65536, "store_all", None, "a800-80gb"),
    ("gpt-7b", dict(tp=4, cp=2), 262144, "full_recompute", None, "a800-80gb"),
    ("gpt-7b", dict(tp=4, cp=2), 262144, "full_offload", None, "a800-80gb"),
    ("gpt-7b", dict(tp=2, cp=4, zero=3), 1048576, "memo", 0.059, "a800-80gb"),
    ("gpt-7b", dict(tp=8, sp=False), 131072, "memo", 0.5, "a800-80gb"),
    ("gpt-7b", dict(tp=2, ulysses=4, zero=3), 262144, "full_recompute", None, "a100-sxm4-80gb"),
    ("gpt-13b", dict(tp=8), 131072, "store_all", None, "a800-80gb"),
    ("gpt-13b", dict(tp=8, cp=2, zero=1), 524288, "full_recompute", None, "a800-80gb"),
    ("gpt-13b", dict(tp=8, cp=2, zero=2), 524288, "memo", 0.25, "a800-80gb"),
    ("gpt-13b", dict(tp=4, dp=2, zero=1), 65536, "full_offload", None, "h100-sxm5-80gb"),
    ("gpt-30b", dict(tp=8, cp=2), 262144, "memo", 0.3, "a800-80gb"),
    ("gpt-30b", dict(tp=8, cp=4, zero=3), 1048576, "full_recompute", None, "a800-80gb"),
    ("gpt-30b", dict(tp=8), 65536, "store_all", None, "h200-141gb"),
    ("gpt-30b", dict(tp=8, cp=2, dp=2, zero=2), 262144, "full_offload", None, "a800-80gb"),
    ("gpt-65b", dict(tp=8, cp=4), 524288, "memo", 0.1, "a800-80gb"),
    ("gpt-65b", dict(tp=8, cp=2, zero=3), 262144, "full_recompute", None, "a800-80gb"),
    ("gpt-65b", dict(tp=8, cp=8, zero=1), 1048576, "full_offload", None, "a800-80gb"),
    ("gpt-65b", dict(tp=8), 32768, "store_all", None, "a800-80gb"),
    ("llama-7b", dict(tp=4, cp=2), 131072, "memo", 0.75, "a100-sxm4-80gb"),
    ("llama-70b", dict(tp=8, cp=4, zero=3), 262144, "memo", 0.2, "a800-80gb"),
]


def case_id(case) -> str:
    m, lay, seq, pol, a, prof = case
    return f"{m}-{Layout(**lay).label()}-{seq}-{pol}{'' if a is None else a}-{prof}"


def evaluate(case) -> dict:
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.engine.simulate import simulate
    from memo_sim.search.estimate import estimate_iteration

    m, lay, seq, pol, a, prof = case
    model, layout, profile = get_model(m), Layout(**lay), load_profile(prof)
    choice = get_policy(pol, a)
    est = estimate_iteration(model, layout, 1, seq, choice, profile)
    mem = memory_breakdown(model, layout, 1, seq, choice, profile)
    sim = simulate(model, layout, 1, seq, choice, profile, keep_timeline=False)
    return {
        "analytic_iteration_s": est.iteration_s,
        "analytic_peak_gpu_bytes": mem.peak_gpu_bytes,
        "analytic_host_bytes_per_node": mem.host_bytes_per_node,
        "analytic_status": mem.status,
        "sim_iteration_s": sim.iteration_s,
        "sim_peak_gpu_bytes": sim.peak_gpu_bytes,
        "sim_peak_host_bytes_per_node": sim.peak_host_bytes_per_node,
        "sim_status": sim.status,
    }


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({case_id(c): evaluate(c) for c in CASES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
