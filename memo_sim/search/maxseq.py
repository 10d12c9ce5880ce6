"""The longest sequence that trains: per policy, in steps of a chosen size, with what binds next.

Fit is monotone in the sequence length (`tests/test_fit_monotone.py`), so the answer is found by
doubling the length until nothing fits and bisecting between the last fit and the first
failure: O(log(max / step)) what-if rankings per policy instead of one per step. At the
longest length the best plan is simulated for its MFU; at the next step the least-over
candidate says what binds: GPU memory (and its largest terms) or pinned host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.errors import MemoError
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.whatif import Candidate, candidates_for, rank
from memo_sim.units import fmt_bytes

MAX_STEPS = 1 << 12  # 4096 steps: 512M tokens at 128K


@dataclass
class MaxSeqAnswer:
    policy: str
    step: int
    max_seq: int | None  # None: not even one step fits
    best: Candidate | None  # the best plan at max_seq (simulated)
    next_seq: int  # the first length that does not fit
    binding: str  # what fails at next_seq, in words

    def to_json(self) -> dict:
        b = self.best
        return {"policy": self.policy, "step_tokens": self.step, "max_seq_tokens": self.max_seq,
                "best": b.to_json() if b else None, "mfu": (b.simulated or {}).get("mfu") if b else None,
                "next_seq_tokens": self.next_seq, "binding": self.binding}


def _ranked(model, seq, gpus, profile, policy, framework) -> list[Candidate] | str:
    try:
        return candidates_for(model, seq, gpus, profile, policies=(policy,), framework=framework).candidates
    except MemoError as e:
        return str(e)


def _fits(cands) -> bool:
    return not isinstance(cands, str) and any(c.status == "OK" for c in cands)


def binding_constraint(cands: list[Candidate] | str) -> str:
    """What stops the least-over candidate, in words."""
    if isinstance(cands, str):
        return cands
    c = min(cands, key=lambda c: c.over_bytes)
    m = c.memory
    if c.status == "OOHM":
        return (f"pinned host memory: {fmt_bytes(m.host_bytes_per_node)} per node of {fmt_bytes(m.host_capacity_bytes)} "
                f"({c.layout.label()} {c.policy.label()})")
    terms = {"model states": m.model_states_bytes, "skeletal activations kept": m.skeletal_resident_bytes,
             "rounding/recompute buffers": m.rounding_buffer_bytes, "lse": m.lse_bytes,
             "layer transients": m.transient_peak_bytes, "classifier": m.classifier_peak_bytes}
    big = sorted(terms.items(), key=lambda kv: -kv[1])[:2]
    return (f"GPU memory: {fmt_bytes(m.peak_gpu_bytes)} of {fmt_bytes(m.gpu_capacity_bytes)} "
            f"({c.layout.label()} {c.policy.label()}; largest: "
            + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in big) + ")")


def max_seq(model: ModelConfig, gpus: int, profile: HardwareProfile, policy: str, *, step: int = 128 * 1024,
            framework: str = "any", simulate: bool = True) -> MaxSeqAnswer:
    if step < 1:
        raise MemoError("--step must be at least 1 token")
    hi = 1
    cands = _ranked(model, step, gpus, profile, policy, framework)
    if not _fits(cands):
        return MaxSeqAnswer(policy, step, None, None, step, binding_constraint(cands))
    lo = 1
    while True:  # double until a length does not fit
        hi = lo * 2
        if hi > MAX_STEPS:
            raise MemoError(f"{policy} still fits at {MAX_STEPS} steps of {step} tokens; use a larger --step")
        cands = _ranked(model, hi * step, gpus, profile, policy, framework)
        if not _fits(cands):
            break
        lo = hi
    fail = cands
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = _ranked(model, mid * step, gpus, profile, policy, framework)
        if _fits(c):
            lo = mid
        else:
            hi, fail = mid, c
    best = None
    if simulate:
        best = rank(model, lo * step, gpus, profile, simulate_top=1, policies=(policy,), framework=framework).best
    return MaxSeqAnswer(policy, step, lo * step, best, hi * step, binding_constraint(fail))
