"""Tier 2's summaries of a few candidates known before the analytic tier ends, simulated in one
forked process while this one goes on pricing.

A what-if with SPPO always simulates SPPO's heuristic choice and its best few points
(`memo_sim.search.whatif.rank`: ``always`` of the bound search, the extras of ``--simulate-top``);
they are known once SPPO's search is done, before the micro-batch pipelines are priced, and each
takes seconds to simulate. `SimulatedAhead` simulates them in a child forked then (`os.fork`, a
pipe back, no thread), and `memo_sim.search.whatif.simulate_candidates` takes a summary from it
where tier 2 asks for that candidate, instead of simulating it again: the same deterministic
simulation of the same objects, so the same summary (all but its host seconds), in the same
batch and order as without it. Where the platform cannot fork, nothing is simulated ahead.
"""

from __future__ import annotations

import gc
import os
import pickle
from typing import Callable


class SimulatedAhead:
    """``fn(args)`` of each of ``work`` (one per candidate of ``candidates``), in a forked child."""

    def __init__(self, candidates: list, work: list[tuple], fn: Callable[[tuple], dict]):
        self._ids = {id(c): i for i, c in enumerate(candidates)}
        self._keep = list(candidates)  # their ids stay theirs while this lives
        self._results: list | None = None
        self._pid = None
        self._read = None
        if not candidates or not hasattr(os, "fork"):
            self._ids = {}
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: simulate, write the summaries, leave without the parent's exit handlers
            os.close(r)
            code = 0
            try:
                gc.freeze()
                try:
                    out = ("ok", [fn(x) for x in work])
                except BaseException as e:  # noqa: BLE001  (handed to the parent, which raises it)
                    out = ("error", e)
                with os.fdopen(w, "wb") as f:
                    pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(w)
        self._pid, self._read = pid, r

    def has(self, candidate) -> bool:
        return id(candidate) in self._ids

    def take(self, candidate) -> dict | None:
        """The summary of ``candidate`` (one that `has`), waiting for the child where it is not
        done; None where the child died without one (the caller simulates it)."""
        if self._results is None:
            try:
                with os.fdopen(self._read, "rb") as f:
                    self._read = None
                    status, value = pickle.load(f)
            except (EOFError, pickle.UnpicklingError):
                status, value = "ok", [None] * len(self._keep)
            self._reap()
            if status != "ok":
                raise value
            self._results = value
        return self._results[self._ids[id(candidate)]]

    def _reap(self) -> None:
        if self._pid is not None:
            os.waitpid(self._pid, 0)
            self._pid = None

    def close(self) -> None:
        """End the child where its summaries were never read."""
        if self._read is not None:
            os.close(self._read)
            self._read = None
        if self._pid is not None:
            import signal

            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap()
