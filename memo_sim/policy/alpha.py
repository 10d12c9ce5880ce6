"""MEMO's choice of alpha (paper sec. 4.1), as a closed form and as a python-mip LP.

    max alpha
    s.t. (S_input + S_attn + alpha·S_others) / B <= T_layer          (offload hides under compute)
         (n - 2)·(S_input + S_attn + alpha·S_others) <= M_CPU         (host memory)
         0 <= alpha <= 1

Sizes are one layer's per-GPU bytes, B the per-GPU GPU-to-host bandwidth, M_CPU the host bytes
available to one GPU. This is the continuous problem; `memo_sim.search.estimate.memo_alpha` then
floors alpha to whole token rows and re-checks host memory with the bytes exactly as the host
layout (`memo_sim.policy.host_layout`) allocates them, so alpha is never rounded up past a
constraint. If even alpha = 0 violates a constraint the problem is infeasible: MEMO cannot hide
the whole-tensor offload (or host memory cannot hold it), and we say which constraint binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memo_sim.mip_util import quiet_stdout
from memo_sim.policy.rounding_buffers import offloaded_layer_count


@dataclass(frozen=True)
class AlphaProblem:
    s_input: float
    s_attn: float
    s_others: float
    bandwidth: float  # bytes/s
    t_layer: float  # seconds
    layers: int
    m_cpu: float  # host bytes for one GPU
    offloaded: int | None = None  # layer blocks one GPU holds on host at once (default: every offloaded layer)

    def per_layer_host_cap(self) -> float:
        """Bytes one layer's host block may have under the host-memory constraint."""
        k = offloaded_layer_count(self.layers) if self.offloaded is None else self.offloaded
        return math.inf if k == 0 else self.m_cpu / k


@dataclass(frozen=True)
class AlphaResult:
    alpha: float | None  # None when infeasible
    binding: str  # "overlap", "host_memory", "none" (alpha = 1 fits both), or the infeasible one
    feasible: bool
    solver: str

    def reason(self) -> str:
        if not self.feasible:
            return {"overlap": "layer input + attention output alone take longer to offload than the layer computes",
                    "host_memory": "layer input + attention output of n-2 layers alone exceed host memory"}[self.binding]
        return {"overlap": "offload time = layer forward time", "host_memory": "host memory full",
                "none": "all tokens offloaded within both limits"}[self.binding]

    @property
    def alpha_or_zero(self) -> float:
        """The alpha a plan runs at: the solved one, or 0 where none is feasible (`note`)."""
        return self.alpha if self.feasible else 0.0

    def note(self) -> str:
        """The candidate's alpha note: the binding limit, or where no alpha is feasible what alpha 0 still does
        (each layer's input and attention output offloaded, the rest recomputed) and what that costs."""
        if self.feasible:
            return self.reason()
        cost = {"overlap": "their copies are not hidden under the forward: the stall is priced",
                "host_memory": "the plan does not fit the host"}[self.binding]
        return (f"alpha 0: no token beyond each layer's input and attention output offloaded, and {self.reason()}: "
                f"{cost}")


def solve_alpha_closed_form(p: AlphaProblem) -> AlphaResult:
    base = p.s_input + p.s_attn
    caps = {"overlap": p.bandwidth * p.t_layer, "host_memory": p.per_layer_host_cap()}
    for name, cap in caps.items():
        if base > cap * (1 + 1e-12):
            return AlphaResult(None, name, False, "closed-form")
    if p.s_others <= 0:
        return AlphaResult(1.0, "none", True, "closed-form")
    best, binding = 1.0, "none"
    for name, cap in caps.items():
        a = (cap - base) / p.s_others
        if a < best:
            best, binding = a, name
    return AlphaResult(max(0.0, min(1.0, best)), binding, True, "closed-form")


def solve_alpha_lp(p: AlphaProblem) -> AlphaResult:
    """The same problem as a python-mip LP (CBC); constraints scaled to GiB and seconds."""
    import mip

    scale = 1.0 / 2**30
    m = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
    m.verbose = 0
    m.emphasis = 0
    a = m.add_var("alpha", lb=0.0, ub=1.0)
    m.objective = mip.maximize(a)
    base, oth = (p.s_input + p.s_attn) * scale, p.s_others * scale
    m.add_constr(base + a * oth <= p.bandwidth * scale * p.t_layer, "overlap")
    cap = p.per_layer_host_cap()
    if math.isfinite(cap):
        m.add_constr(base + a * oth <= cap * scale, "host_memory")
    with quiet_stdout():
        status = m.optimize()
    if status not in (mip.OptimizationStatus.OPTIMAL,):
        # infeasible: name the constraint that fails at alpha = 0
        if base > p.bandwidth * scale * p.t_layer * (1 + 1e-12):
            return AlphaResult(None, "overlap", False, "lp")
        return AlphaResult(None, "host_memory", False, "lp")
    alpha = float(a.x)
    slack_o = p.bandwidth * scale * p.t_layer - (base + alpha * oth)
    slack_h = (cap * scale - (base + alpha * oth)) if math.isfinite(cap) else math.inf
    if alpha >= 1 - 1e-9 and min(slack_o, slack_h) > 1e-9:
        binding = "none"
    else:
        binding = "overlap" if slack_o <= slack_h else "host_memory"
    return AlphaResult(min(1.0, max(0.0, alpha)), binding, True, "lp")
