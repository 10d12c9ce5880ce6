"""What each rank of a distributed run sends rank 0 at its end (`rank_payload`, gathered by `gather_payloads`),
which rank 0 reports (`memo_exec.report.write_rank_outputs`). Apart from the report, so that the other ranks import
none of its figures (matplotlib: 0.6-1.0 s of a rank's start on the 2-core VM with four ranks, 2026-12-05)."""

from __future__ import annotations

from memo_exec.compare import is_unpriced_ep
from memo_exec.measure import steady_steps, steady_value


def rank_coordinates(ex) -> dict[str, int]:
    """The rank's coordinates in the layout's groups: dp, pp, cp, ulysses, tp, and ep / etp where experts are split."""
    out = {d: ex.ctx.coord(d) for d in ("dp", "pp", "cp", "ulysses", "tp")}
    g = getattr(ex, "expert_groups", None)
    if g is not None and getattr(g, "ep", 1) > 1:
        out["ep"] = g.ep_rank
    if g is not None and getattr(g, "etp", 1) > 1:
        out["etp"] = g.etp_rank
    return out


def rank_payload(ex, res, cpu: dict | None = None) -> dict:
    """What a rank sends rank 0: its steady state and summaries, its last step's events and memory, its machine-speed
    probe (`memo_exec.speed_probe`, CPU runs) and ``cpu`` (`memo_exec.host_share.CpuShare.to_dict` of its run)."""
    last = res.steps[-1]
    steady = steady_steps(res.steps)
    unpriced = [sum(e.duration for e in r.events if is_unpriced_ep(e) and e.phase != "stall") for r in steady]
    return {"rank": ex.ctx.rank, "coords": rank_coordinates(ex),
            "steady": res.steady, "summaries": res.summaries, "events": last.events, "memory": last.memory,
            "losses": [s["loss"] for s in res.summaries], "local_tokens": ex.local_T,
            "speed_probe": res.meta.get("speed_probe"), "cpu": cpu,
            "ep_unpriced_s": steady_value(unpriced) if any(unpriced) else None}


def gather_payloads(payload: dict) -> list[dict] | None:
    """Every rank's payload on rank 0 (None elsewhere); a collective."""
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [payload]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(payload, out, dst=0)
    return out
