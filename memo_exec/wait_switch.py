"""The executor's wait primitives, and a test-only switch that removes one call of them.

Issue 47 (item 3) asks that removing any one wait of the executor be caught by the race detector
(`memo_exec.happens_before`) at issue time. The waits are the calls of the functions decorated
with `wait_primitive`: a stream's ``wait_event`` (`memo_exec.streams`), a P2P ``Transfer.wait``
(`memo_exec.distributed.p2p`), the METP lane's ``wait`` and its collectives' (`memo_exec.metp.lane`),
and the one-place waits built on them (ring CP's, the pipeline's and SPPO's stages' ``_wait``, the
offload's ``_stall``). `tests/wait_sites.py` lists every call of them from the code; the test
(`tests/test_wait_removal.py`) disables each call site in turn.

A disabled site is a ``path:line`` (``memo_exec/metp/ffn.py:121``: the line of the call, the path
from the folder that holds the package): a primitive called from that line returns at once,
without waiting and without telling the detector -- as if the line were deleted. Calls from any
other line, the same primitive's included, run as usual. The switch also counts the calls per
calling line (``counts``), which is how the test knows the sites a scenario reaches.

Not a user-facing option: ``MEMO_EXEC_SKIP_WAIT=path:line`` is read once, at import, for a run
whose ranks inherit the environment (the real launcher); tests switch per run with `switched`
(the gloo harness's forkserver ranks take their inputs as arguments, not from the environment).
With neither, a primitive pays one test of a module global (``_ACTIVE is None``) per call.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections import Counter

ENV = "MEMO_EXEC_SKIP_WAIT"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder that holds memo_exec/


class Switch:
    """One disabled call site (or none) and the calls counted per calling line."""

    def __init__(self, skip: str | None = None) -> None:
        self.skip = skip
        self.file, self.line = None, 0
        if skip:
            path, _, line = skip.rpartition(":")
            self.file, self.line = os.path.join(ROOT, path), int(line)
        self.counts: Counter = Counter()  # "path:line" -> calls of a primitive from there
        self.skipped = 0  # calls the switch removed
        self._paths: dict[str, str] = {}

    def removes(self, frame) -> bool:
        """Count the call from ``frame`` (its caller); True when it comes from the disabled site."""
        file = frame.f_code.co_filename
        path = self._paths.get(file)
        if path is None:
            path = self._paths[file] = os.path.relpath(file, ROOT)
        self.counts[f"{path}:{frame.f_lineno}"] += 1
        if frame.f_lineno == self.line and file == self.file:
            self.skipped += 1
            return True
        return False


_ACTIVE: Switch | None = Switch(os.environ[ENV]) if os.environ.get(ENV) else None


def wait_primitive(fn):
    """Mark ``fn`` as one of the executor's waits (module docs): a call of it from the disabled
    site returns None at once."""
    @functools.wraps(fn)
    def wait(*args, **kwargs):
        if _ACTIVE is not None and _ACTIVE.removes(sys._getframe(1)):
            return None
        return fn(*args, **kwargs)
    return wait


@contextlib.contextmanager
def switched(skip: str | None = None):
    """Tests: inside the block, the calls from site ``skip`` (``path:line``, or None: none) are
    removed and every call of a primitive is counted; yields the `Switch`."""
    global _ACTIVE
    old, _ACTIVE = _ACTIVE, Switch(skip)
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = old
