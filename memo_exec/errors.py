"""Errors the executor raises for problems a user can fix (bad plan, missing backend, too big).

All derive from `memo_sim.errors.MemoError`: the CLI prints them as one line and exits with 2.
"""

from __future__ import annotations

from memo_sim.errors import MemoError


class ExecError(MemoError):
    """The plan cannot be executed as asked on this machine."""


class BackendError(ExecError):
    """The attention backend asked for is not importable or does not run on this device."""


class FitError(ExecError):
    """By the executor's own size estimate the run does not fit device or host memory."""


class MemoryPlanError(ExecError):
    """plan.memory_plan names an unknown phase or tensor, or its offsets overlap live tensors."""
