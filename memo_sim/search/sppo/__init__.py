"""SPPO's planner: the offload ratios, the analytic pipeline estimate, the heuristic (SP, PP, N)
solver of the paper's section 6.1 and an exhaustive search over the same space.

**Offload ratios** (`solve_alphas`, paper sec. 5.2): alpha_i·A_i = M_threshold with A_i subsequence
i's offloadable bytes per layer and GPU (its skeletal bytes less the cached K/V; the last
subsequence's K/V, which no later piece reads, go to host with its other rows and count in its
A_i: `Sppo.subsequence_offloadable`). The threshold
is first the overlap one, M_threshold = B·(T_min − latency) with B one GPU's share of the host
links while every GPU of the node copies and T_min the shortest per-layer forward of a
subsequence (so every unit's copy hides under the next unit's compute). Where the stage then
does not fit the GPU, M_threshold rises (bisection) until it does (copies then show); where the
node's pinned host memory overflows it falls. ``binding`` says which limit set it.

**Analytic estimate** (`estimate_sppo`, tier 1): per stage and piece the forward time is the sum
over the stage's layers of max(forward, offload) (the rounding-buffer rule hides a unit's copy
under the next unit) plus the embedding (stage 0) or the classifier (last stage); backward
likewise with the prefetch. The pipeline is the recurrence over the (stage, piece) grid: a
piece starts after the previous piece of its stage and after the P2P send of every overlapping
piece of the stage before it (forward) or after it (backward, pieces in reverse). The stage
then adds its last gradient bucket (after its last layer unit; the embedding's after everything)
and its optimizer step (`recurrence`). No link contention; tier 2 replays the op graph in the
event simulator (`memo_sim.engine.schedules.sppo`). The same recurrence with every copy and
weight-gather wait left out is SPPO's proved lower bound (`memo_sim.search.bound.sppo_bound`); the
estimate itself is not one (a unit's copy can end later in the simulation than max(forward,
offload) says).

**Heuristic solver** (`heuristic_choice`, sec. 6.1): SP (the TP+SP degree) and PP inside one
node (SP x PP <= GPUs per node), N such that each device's share of a subsequence, l/SP, lies in
the efficient range of 2K-16K tokens (powers of two; the nearest one where none does), the
FLOPs-balanced partition, multiplexed partitioning where the bubble ratio (p − 1)/N exceeds 1/8
(the paper's workflow step 3; pipelines of at most 8 stages); of these the fastest by the analytic
estimate that fits. Where
nothing inside a node fits, PP grows across nodes with SP = a whole node.

**Exhaustive search** (`exhaustive_search`): every pipeline layout (TP+SP x PP x DP, ZeRO 0/1) x
N in powers of two (each device's share of a subsequence at least 1K tokens; where the best
fitting point has its layout's largest N, the next N's points too, for as long as the best moves
to that edge) x partition (flops, length) x multiplexing (off, on; on only up to 8 stages, where a
split subsequence's pieces stay few): each point's estimate with the overlap-threshold
alphas is a lower bound on its final estimate (larger alphas only add copy time), so points are
solved in order of that bound until the best fitting one is proven and ``keep`` fitting points
are known (branch and bound; the what-if's tier 2 then simulates its candidates in order of
their proved bound, like every other candidate).

Modules, one job each: `points` (a solved point, the ranking, the search's constants), `estimate`
(the (stage, piece) recurrence), `alphas` (the offload ratios), `solve` (one point, its bound for
the branch and bound, the memory floor, one fixed layout's best), `grid` (the N tried),
`heuristic`, `exhaustive` (the branch and bound and `search_sppo`), `shared_bounds` (the bounding
pass shared with the parent process where the what-if runs the search in a forked child),
`candidates` (the what-if's SPPO rows and the heuristic-vs-best summary). This package re-exports
their public names.
"""

from memo_sim.search.sppo.alphas import overlap_threshold, solve_alphas
from memo_sim.search.sppo.candidates import point_candidate, sppo_candidates, summarize
from memo_sim.search.sppo.estimate import estimate_sppo
from memo_sim.search.sppo.exhaustive import SppoSearch, exhaustive_search, search_sppo
from memo_sim.search.sppo.grid import efficient_subseqs, subseq_grid
from memo_sim.search.sppo.heuristic import heuristic_choice
from memo_sim.search.sppo.points import (
    BOUND_QUANTUM, BOUND_SLACK, MAX_SUBSEQS, MIN_TOKENS_PER_DEVICE, MULTIPLEX_BUBBLE, MULTIPLEX_MAX_PP, AlphaChoice,
    SppoPoint,
)
from memo_sim.search.sppo.solve import memory_floor, resolve_for_layout, solve_point

__all__ = ["AlphaChoice", "BOUND_QUANTUM", "BOUND_SLACK", "MAX_SUBSEQS", "MIN_TOKENS_PER_DEVICE", "MULTIPLEX_BUBBLE",
           "MULTIPLEX_MAX_PP", "SppoPoint", "SppoSearch", "efficient_subseqs", "estimate_sppo", "exhaustive_search",
           "heuristic_choice", "memory_floor", "overlap_threshold", "point_candidate", "resolve_for_layout",
           "search_sppo", "solve_alphas", "solve_point", "sppo_candidates", "subseq_grid", "summarize"]
