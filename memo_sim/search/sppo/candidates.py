"""SPPO's rows of the what-if: each pipeline layout's best point, the heuristic's choice and
the exhaustive best as `memo_sim.search.candidate.Candidate`s; and the heuristic-vs-best summary."""

from __future__ import annotations

from memo_sim.cost.sppo import PARTITIONS
from memo_sim.errors import MemoError
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.candidate import Candidate
from memo_sim.search.sppo.exhaustive import SppoSearch, search_sppo
from memo_sim.search.sppo.points import SppoPoint, _rank_key
from memo_sim.tp import tp_flavour


# ------------------------------------------------------------------------------------------ what-if
def point_candidate(model: ModelConfig, pt: SppoPoint, batch: int, seq: int, profile: HardwareProfile,
                    *roles: str):
    """A what-if `memo_sim.search.candidate.Candidate` for one solved point."""
    info = pt.to_dict()
    info["roles"] = list(roles)
    note = pt.memory.reason() or f"alphas: {pt.alpha.note}"
    return Candidate(model, pt.layout, pt.policy, batch, seq, profile, pt.estimate, pt.memory.breakdown, note,
                     sppo=info, schedule="sppo")


def sppo_candidates(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int = 1,
                    tp: int | None = None, cp: int | None = None, ulysses: int | None = None, dp: int | None = None,
                    zero: int | None = None, sp: bool | None = None, tp_mode: str = "all", pp: int | None = None,
                    subseqs: int | None = None, partition: str | None = None, multiplex: bool | None = None,
                    bounds=None):
    """(search, candidates, rejected layouts, why none) for the what-if: each pipeline layout's
    best point, the heuristic's choice and the exhaustive best, tagged with their roles
    (``bounds``: `memo_sim.search.sppo.exhaustive.exhaustive_search`'s)."""
    if (cp or 1) > 1 or (ulysses or 1) > 1:
        return None, [], [], "sppo stages split the sequence by TP+SP only (no --cp / --ulysses)"
    if sp is False:
        return None, [], [], "sppo needs Megatron sequence parallelism inside a stage (no --no-sp)"
    if tp_mode != "all" and tp_flavour(tp_mode).runs_rings:
        return None, [], [], f"sppo stages run Megatron TP+SP, not {tp_mode}"
    if partition is not None and partition not in PARTITIONS:
        raise MemoError(f"--partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if subseqs is not None and subseqs < 1:
        raise MemoError(f"--subseqs must be at least 1, got {subseqs}")
    if subseqs is not None and subseqs > seq // (tp or 1):
        # a subsequence's length is a multiple of the stage's TP+SP degree (`memo_sim.policy.sppo.granule`; SPPO's
        # stages always run SP), so N subsequences need N x tp tokens (`memo_sim.cost.sppo.partition_bounds`): past
        # seq / tp every layout's points were dropped unpriced and the answer blamed the layout (a review)
        tp_words = f" over --tp {tp} (each subsequence at least one token per rank)" if tp else ""
        raise MemoError(f"--subseqs {subseqs}: {seq:,} tokens{tp_words} split into at most {seq // (tp or 1):,} "
                        f"subsequences; give --subseqs {seq // (tp or 1):,} or fewer")
    search = search_sppo(model, seq, gpus, profile, batch=batch, tp=tp, pp=pp, dp=dp, zero=zero, subseqs=subseqs,
                         partitions=(partition,) if partition else PARTITIONS,
                         multiplex=(multiplex,) if multiplex is not None else (False, True), bounds=bounds)
    groups: dict[tuple, SppoPoint] = {}
    for p in search.points:
        k = (p.layout.tp, p.layout.pp, p.layout.dp, p.layout.zero)
        if k not in groups or _rank_key(p) < _rank_key(groups[k]):
            groups[k] = p
    chosen: list[tuple[SppoPoint, list[str]]] = [(p, ["layout best"]) for p in groups.values()]

    def tag(pt: SppoPoint | None, role: str) -> None:
        if pt is None:
            return
        for q, roles in chosen:
            if q.key() == pt.key():
                roles.append(role)
                return
        chosen.append((pt, [role]))

    tag(search.best, "exhaustive best")
    tag(search.heuristic, "heuristic")
    cands = [point_candidate(model, p, batch, seq, profile, *roles) for p, roles in chosen]
    why = "" if cands else (search.rejected_layouts[0][1] if search.rejected_layouts else
                            "no pipeline layout of the GPUs fits the fixed degrees")
    return search, cands, search.rejected_layouts, why


def _summary_of(c) -> dict:
    sim = c.simulated or {}
    return {"label": f"{c.layout.label()} {c.policy.label()}", "sp": c.layout.tp, "pp": c.layout.pp,
            "dp": c.layout.dp, "subseqs": c.policy.subseqs, "partition": c.policy.partition,
            "multiplex": c.policy.multiplex, "status": c.status,
            "analytic_iteration_s": c.estimate.iteration_s, "analytic_tgs_tokens_per_gpu_s": c.estimate.tgs,
            "simulated_iteration_s": sim.get("iteration_s"), "simulated_tgs_tokens_per_gpu_s": sim.get(
                "tgs_tokens_per_gpu_s"), "simulated_mfu": sim.get("mfu"),
            "peak_gpu_bytes": sim.get("peak_gpu_bytes", c.memory.peak_gpu_bytes),
            "peak_host_bytes_per_node": sim.get("peak_host_bytes_per_node", c.memory.host_bytes_per_node),
            "worst_stage": (c.sppo or {}).get("worst_stage"), "peak_at": (c.sppo or {}).get("peak_at")}


def summarize(search: SppoSearch, candidates: list) -> dict:
    """The heuristic's choice against the best SPPO plan found (simulated where tier 2 ran)."""
    sppo = [c for c in candidates if c.sppo is not None]
    heur = next((c for c in sppo if "heuristic" in c.sppo.get("roles", ())), None)
    ok = [c for c in sppo if c.status == "OK"]
    best = min(ok, key=lambda c: (c.simulated is None, -c.tgs)) if ok else None
    out = {"space_size": search.space_size, "solved_points": search.solved, "heuristic_note": search.heuristic_note,
           "heuristic": _summary_of(heur) if heur else None, "best": _summary_of(best) if best else None,
           "analytic_best": search.best.to_dict() if search.best else None}
    if heur is not None and best is not None and heur.status == "OK":
        # Like with like: `Candidate.tgs` is simulated where tier 2 ran and analytic elsewhere, so a heuristic
        # left analytic beside a simulated best would be divided across tiers; both simulated, else both analytic.
        on_sim = heur.simulated is not None and best.simulated is not None
        h, b = (heur.tgs, best.tgs) if on_sim else (heur.estimate.tgs, best.estimate.tgs)
        out["heuristic_tgs_fraction_of_best"] = h / b if b else None
        out["compared_on"] = "simulated" if on_sim else "analytic"
    return out
