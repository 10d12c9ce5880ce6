"""Pipeline schedules by name: the vocabulary the plan, the simulator and the executor share.

A *schedule* says how one training iteration runs over the pipeline stages of a layout and over
the iteration's micro-batches. The names are the contract (`plan.json`'s ``schedule`` field);
the simulator (`memo_sim.engine`) and the executor (`memo_exec`) each register an implementation
under the same name.

- ``single_stage``: no pipeline (``pp = 1``); the iteration's micro-batches run one after the
  other on every rank (gradient accumulation), the data-parallel gradient reduction once per
  iteration.
- ``1f1b``: PipeDream-flush / Megatron-LM's one-forward-one-backward schedule over ``pp`` stages
  and ``m`` micro-batches: stage s runs ``min(pp - s - 1, m)`` warm-up forwards, then alternates
  one forward and one backward, then drains the remaining backwards. Bubble share (p - 1) / m
  for equal stage times.
- ``interleaved_1f1b``: Megatron-LM's interleaved schedule: each rank holds ``vpp`` non-adjacent
  model chunks (virtual stages), the bubble shrinks to (p - 1) / (v m); Megatron requires the
  micro-batch count to be a multiple of ``pp``.
- ``sppo``: SPPO's subsequence pipeline (the ``sppo`` activation policy; papers/sppo.txt).

Plans written before schedules were named carry no ``schedule`` field; they read as
`default_schedule` says (``sppo`` for an SPPO policy, else ``single_stage``).
"""

from __future__ import annotations


SCHEDULE_NAMES = ("single_stage", "1f1b", "interleaved_1f1b", "sppo")
PIPELINE_SCHEDULES = ("1f1b", "interleaved_1f1b")  # the micro-batch pipelines (any activation policy)


def default_schedule(pp: int, policy_name: str, vpp: int = 1) -> str:
    """The schedule a plan without a ``schedule`` field runs (plans of earlier releases): virtual stages (``vpp`` > 1)
    are the interleaved schedule's (a review: a plan with vpp 2 and its schedule deleted was refused as "1f1b")."""
    if policy_name == "sppo":
        return "sppo"
    if pp == 1:
        return "single_stage"
    return "interleaved_1f1b" if vpp > 1 else "1f1b"


def schedule_runs_policy(schedule: str, policy_name: str) -> bool:
    """Whether ``schedule`` runs the activation policy ``policy_name`` (sppo runs the sppo policy
    and only it; the others run every other policy)."""
    return (schedule == "sppo") == (policy_name == "sppo")


def check_schedule(schedule: str, *, pp: int, vpp: int, layers: int, batch: int, micro_batch: int,
                   policy_name: str, uneven: bool = False) -> str | None:
    """None if ``schedule`` can run this layout and batch split, else the reason (one line). ``uneven``:
    the layout splits its layers itself (`memo_sim.layout.parallel.virtual_stage_layers` checks it)."""
    if schedule not in SCHEDULE_NAMES:
        return f"schedule must be one of {', '.join(SCHEDULE_NAMES)}, got {schedule!r}"
    if micro_batch < 1 or batch % micro_batch:
        return (f"micro_batch ({micro_batch}) must divide the batch ({batch} sequences per replica per "
                f"iteration)")
    m = batch // micro_batch
    if not schedule_runs_policy(schedule, policy_name):
        return ("the sppo schedule runs the sppo policy and only it" if schedule == "sppo"
                else f"policy sppo runs the sppo schedule, not {schedule}")
    if schedule == "single_stage" and pp != 1:
        return f"single_stage runs one pipeline stage, but pp is {pp}; use 1f1b or interleaved_1f1b"
    if schedule in PIPELINE_SCHEDULES and pp < 2:
        return f"{schedule} needs at least 2 pipeline stages (pp >= 2), got pp {pp}; use single_stage"
    if schedule == "interleaved_1f1b":
        if vpp < 2:
            return f"interleaved_1f1b needs at least 2 virtual stages per rank (vpp >= 2), got {vpp}"
        if layers % (pp * vpp) and not uneven:
            return f"{layers} layers do not split evenly into pp x vpp = {pp * vpp} model chunks"
        if m % pp:
            return (f"interleaved_1f1b needs the micro-batch count ({m}: {batch} sequences per replica in micro-batches "
                    f"of {micro_batch}) to be a multiple of pp ({pp})")
    elif vpp != 1:
        return f"virtual stages (vpp = {vpp}) belong to interleaved_1f1b, not {schedule}"
    return None


def executor_stage_limit(layout) -> str | None:
    """What memo's executor does not run inside a stage of a micro-batch pipeline (1F1B,
    interleaved), or None: every sequence layout (TP with or without SP, ring CP, Ulysses, METP's
    rings) and data parallelism run in its stages, each rank talking to the rank with its own
    coordinates in the next stage, under the data-parallel flavour's rules beside stages, the
    simulator's (`memo_sim.dp.base.DPFlavour.pipeline_why_not`: ZeRO 0 or 1, or FSDP as torchtitan runs
    it, `memo_sim.dp.fsdp`)."""
    return layout.dp_flavour.pipeline_why_not(layout) if layout.pp > 1 else None


def ideal_bubble_fraction(pp: int, vpp: int, micro_batches: int) -> float:
    """The share of the iteration a stage idles with equal stage times: fill and drain add (p - 1)·W/v of idle
    time to its v·m chunk steps of W/v each (W: a stage's work per micro-batch), so (p - 1)/(v·m + p - 1): 60 %
    for p 4, v 1, m 2. Megatron-LM's paper (Narayanan et al. 2021, sec. 2.2) states the idle time over the work,
    (p - 1)/(v·m) (`memo_sim.search.estimate.pipeline_bubble`), 150 % there, which is no share of anything.
    memo-exec's pipeline report (memo_exec/pipeline/report.py) and the simulator's pipeline result
    (`memo_sim.engine.schedules.microbatch`) give this share."""
    return (pp - 1) / (vpp * micro_batches + pp - 1)
