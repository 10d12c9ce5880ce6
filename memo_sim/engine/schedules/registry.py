"""The simulator's schedules by name: each schedule module registers the function that simulates
one iteration under it (`register_schedule`); `memo_sim.engine.simulate.simulate` looks it up by
the plan's (or the candidate's) schedule name (`memo_sim.layout.schedule.SCHEDULE_NAMES`).

A runner is called as ``run(model, layout, batch, seq, policy, profile, *, micro_batch,
contention, classifier_chunk_tokens, keep_timeline, record, allocator_lag, detail, fold)`` and
returns a `memo_sim.engine.result.SimResult`; ``batch`` is sequences per data-parallel replica
per iteration, ``micro_batch`` divides it."""

from __future__ import annotations

from typing import Callable

from memo_sim.errors import MemoError
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.registry import Registry

RUNNERS: Registry[Callable] = Registry("schedule", error=MemoError, allowed=SCHEDULE_NAMES,
                                      unknown="{what} must be one of {known}, got {name!r}")


def register_schedule(name: str):
    """Decorator: ``fn`` simulates schedule ``name`` (one of `SCHEDULE_NAMES`)."""
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"schedule {name!r} is not one of {SCHEDULE_NAMES} (memo_sim.layout.schedule names them)")
    return lambda fn: RUNNERS.add(name, fn)


def schedule_runner(name: str) -> Callable:
    """The runner registered for ``name`` (a one-line `MemoError` for an unknown name)."""
    return RUNNERS.get(name)


def registered_schedules() -> tuple[str, ...]:
    return tuple(n for n in SCHEDULE_NAMES if n in RUNNERS)
