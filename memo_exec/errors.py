"""Errors the executor raises for problems a user can fix (bad plan, missing backend, too big).

All derive from `memo_sim.errors.MemoError`: the CLI prints them as one line and exits with 2.
"""

from __future__ import annotations

import functools
import sys

from memo_sim.errors import MemoError


class ExecError(MemoError):
    """The plan cannot be executed as asked on this machine."""


class BackendError(ExecError):
    """The attention backend asked for is not importable or does not run on this device."""


class FitError(ExecError):
    """By the executor's own size estimate the run does not fit device or host memory."""


class MemoryPlanError(ExecError):
    """plan.memory_plan names an unknown phase or tensor, or its offsets overlap live tensors."""


def user_errors(what: str = ""):
    """Decorator for click commands: a user error is one ``error:`` line on stderr and exit code 2.

    ``what`` names the activity in the out-of-memory messages ("during calibration", ...).
    """
    during = f" {what}" if what else ""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            import click  # noqa: PLC0415

            try:
                return fn(*a, **kw)
            except MemoError as e:
                click.echo(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", err=True)
                sys.exit(2)
            except MemoryError as e:
                click.echo(f"error: out of host memory{during} ({e})", err=True)
                sys.exit(2)
            except RuntimeError as e:
                import torch  # noqa: PLC0415

                if isinstance(e, torch.OutOfMemoryError):
                    first = str(e).strip().splitlines()[0]
                    click.echo(f"error: the device ran out of memory{during} ({first})", err=True)
                    sys.exit(2)
                raise

        return wrapper

    return deco
