"""What each device of a timeline stands for, in words, for trace process names and figure labels.

The simulator runs one representative GPU per group of identical GPUs (`memo_sim.engine`): a
single-stage plan's timeline holds one device that stands for every rank of the plan, a pipeline
plan's timeline one device per stage that stands for that stage's ``gpus / pp`` ranks (tensor,
context, Ulysses and data-parallel peers, which run the same schedule). A measured timeline
(``meta.source`` = measured) holds one device per real rank; its ``meta.rank_labels`` (rank ->
its coordinates in the parallel groups, e.g. ``cp1 tp0``) names them.
"""

from __future__ import annotations

from memo_sim.timeline import Timeline


def represented_gpus(timeline: Timeline) -> int | None:
    """How many GPUs of the plan each simulated device stands for; None for a measured timeline
    (each device is a rank) or one that does not say how many GPUs the plan has."""
    meta = timeline.meta or {}
    gpus = meta.get("gpus")
    if meta.get("source") != "simulated" or not gpus:
        return None
    return max(1, int(gpus) // pipeline_stages(timeline))


def pipeline_stages(timeline: Timeline) -> int:
    pipe = (timeline.meta or {}).get("pipeline") or {}
    return int(pipe.get("pp") or len(pipe.get("stages") or ()) or 1)


def device_role(timeline: Timeline, device: int) -> str:
    """``GPU 0 stands for all 8 GPUs of tp1-cp8-z2 ...``: the device's name and the ranks it stands for."""
    word = timeline.device_word
    n = represented_gpus(timeline)
    layout = (timeline.meta or {}).get("layout") or "the plan"
    if n is None:
        coords = ((timeline.meta or {}).get("rank_labels") or {}).get(str(device))
        return f"{word} {device}" + (f" (rank {device}: {coords})" if coords else "")
    if pipeline_stages(timeline) > 1:
        return (f"{word} {device}: pipeline stage {device}, simulated for its {n} identical GPU"
                f"{'s' if n > 1 else ''} ({layout})")
    if n == 1:
        return f"{word} {device}: the plan's only GPU"
    return f"{word} {device} stands for all {n} GPUs of {layout} (each runs this schedule; one is simulated)"
