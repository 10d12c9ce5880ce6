"""One solved point of SPPO's (SP, PP, N, partition, multiplex) space, its offload-ratio
choice, the ranking of points, and the search's constants."""

from __future__ import annotations

from dataclasses import dataclass, field

from memo_sim.cost.sppo import bubble_ratio
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import PipelineMemory
from memo_sim.policy.sppo import Sppo
from memo_sim.search.estimate import IterationEstimate

MIN_TOKENS_PER_DEVICE = 1024  # exhaustive grid: no subsequence share below this
MAX_SUBSEQS = 512
MULTIPLEX_BUBBLE = 1 / 8  # the heuristic multiplexes above this bubble ratio
MULTIPLEX_MAX_PP = 8  # the search multiplexes pipelines of at most this many stages (the generator any)
BOUND_QUANTUM = 0.01  # the bounding pass prices pieces on a 1 % length grid ...
BOUND_SLACK = 0.01  # ... and takes 1 % off, so its value stays below the point's estimate


@dataclass(frozen=True)
class AlphaChoice:
    alphas: tuple[float, ...]
    threshold_bytes: float
    binding: str  # overlap | gpu_memory | host_memory | none
    note: str


@dataclass
class SppoPoint:
    """One solved point of the (SP, PP, N, partition, multiplex) space."""

    layout: Layout
    policy: Sppo
    estimate: IterationEstimate
    memory: PipelineMemory
    alpha: AlphaChoice
    lower_bound_s: float  # the estimate with the overlap-threshold alphas
    grid: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.memory.status

    @property
    def tgs(self) -> float:
        return self.estimate.tgs

    @property
    def over_bytes(self) -> float:
        b = self.memory.breakdown
        return b.oom_by if b.status == "OOM" else b.oohm_by

    def key(self) -> tuple:
        return (self.layout.tp, self.layout.pp, self.layout.dp, self.layout.zero, self.policy.subseqs,
                self.policy.partition, self.policy.multiplex)

    def label(self) -> str:
        return f"{self.layout.label()} {self.policy.label()}"

    def to_dict(self) -> dict:
        return {"layout": self.layout.label(), "sp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp,
                "zero": self.layout.zero, "subseqs": self.policy.subseqs, "partition": self.policy.partition,
                "multiplex": self.policy.multiplex, "status": self.status, "reason": self.memory.reason(),
                "analytic_iteration_s": self.estimate.iteration_s, "analytic_tgs_tokens_per_gpu_s": self.tgs,
                "analytic_mfu": self.estimate.mfu, "peak_gpu_bytes": self.memory.breakdown.peak_gpu_bytes,
                "worst_stage": self.memory.worst.stage, "peak_at": self.memory.worst.peak_at,
                "host_bytes_per_node": self.memory.host_bytes_per_node, "alpha_binding": self.alpha.binding,
                "threshold_bytes": round(self.alpha.threshold_bytes), "alphas": list(self.alpha.alphas),
                "bounds": list(self.policy.bounds), "bubble_ratio": bubble_ratio(self.layout.pp, self.policy.subseqs)}

def _rank_key(p: SppoPoint) -> tuple:  # both overflows, as `Candidate.sort_key` (`MemoryBreakdown.over_share`)
    return (p.status != "OK", p.memory.breakdown.over_share if p.status != "OK" else 0.0, -p.tgs)
