"""Work done in a forked child while this process goes on: `ForkedStream` runs a generator in a
child made with ``os.fork`` (it shares this process's memory as it was at the fork, so nothing is
pickled on the way in) and hands its values back on a pipe, pickled, one at a time as each is made;
no thread. Objects this process already holds (``shared``: a model, a hardware profile) go over the
pipe as references and come back as this process's own objects, not copies (so that the caches
keyed by their identity serve both). `beside` runs two lists of calls at the same time: one here,
the other in one child. `Handoff` sends one value the other way, from this process to a child.

Where the platform cannot fork (``os.fork`` missing), callers run the work here instead
(`FORKS` says which); a child that dies without an answer gives None, and an exception raised in
the child is raised again here when its result is asked for.
"""

from __future__ import annotations

import io
import os
import pickle
import select
from typing import Any, Callable, Sequence

from memo_sim.heap_freeze import freeze_heap

FORKS = hasattr(os, "fork")
# A `ForkedStream`'s and a `Handoff`'s pipe buffer, asked for where the platform lets a program size it (Linux:
# F_SETPIPE_SZ, up to /proc/sys/fs/pipe-max-size, 1 MiB by default): a child's value up to this size is
# written at once while this process is still busy, instead of the child waiting, unable to start its
# next piece of work (SPPO's search result for GPT-13B on 64 GPUs at 1M tokens is 65 KB, past Linux's
# default 64 KiB).
PIPE_BYTES = 1 << 20


def _pipe() -> tuple[int, int]:
    """``os.pipe()`` with a buffer of `PIPE_BYTES` where the platform allows it (else its default)."""
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass
    return r, w


def _end(pid: int) -> None:
    """Kill a child whatever it was doing (it may have exited already) and reap it: no zombie."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


class _SharedPickler(pickle.Pickler):
    """Pickles the objects of ``shared`` as their index in it (`_SharedUnpickler` maps it back)."""

    def __init__(self, f, shared: Sequence):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(o): i for i, o in enumerate(shared)}

    def persistent_id(self, obj):
        return self._ids.get(id(obj))


class _SharedUnpickler(pickle.Unpickler):
    def __init__(self, f, shared: Sequence):
        super().__init__(f)
        self._shared = shared

    def persistent_load(self, pid):
        return self._shared[pid]


class ForkedStream:
    """A generator ``make()`` run in a forked child: each value it yields is pickled and sent as
    soon as it is made, and `next` here returns them in order (waiting for the child where the
    next one is not made yet). The objects of ``shared`` (held by this process at the fork, so by
    the child too) travel as references: a value's reference to one of them comes back as this
    process's object itself. An exception in the child is raised here by the `next` that would
    have returned the value it stopped; a child that dies makes `next` return None (the caller
    does the work itself), as does asking past the last value.

    Each value goes as its length (8 bytes) and its pickle, and this side reads exactly that
    much, never ahead: so `would_wait` knows from the pipe alone whether the next value has begun
    to arrive (one larger than the pipe's buffer may still take a moment to come in whole)."""

    def __init__(self, make: Callable[[], Any], shared: Sequence = ()):
        self._shared = list(shared)
        self._fd: int | None = None
        self.pid = None
        r, w = _pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            code = 0
            try:
                freeze_heap()
                with os.fdopen(w, "wb") as f:
                    try:
                        for value in make():
                            self._send(f, ("ok", value))
                    except BaseException as e:  # noqa: BLE001  (handed to the parent, which raises it)
                        self._send(f, ("error", e))
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(w)
        self.pid = pid
        self._fd = r

    def _send(self, f, item) -> None:
        buf = io.BytesIO()
        _SharedPickler(buf, self._shared).dump(item)
        data = buf.getvalue()
        f.write(len(data).to_bytes(8, "little"))
        f.write(data)
        f.flush()

    def _read(self, n: int) -> bytes | None:
        """Exactly ``n`` bytes from the pipe, waiting for them; None where it ends first."""
        parts, left = [], n
        while left:
            chunk = os.read(self._fd, min(left, 1 << 20))
            if not chunk:
                return None
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def would_wait(self) -> bool:
        """Whether `next` would wait for the child now: nothing of the next value on the pipe yet
        (False once the stream is closed: `next` then answers at once)."""
        if self._fd is None:
            return False
        return not select.select([self._fd], [], [], 0)[0]

    def next(self):
        """The child's next value (module docs)."""
        if self._fd is None:
            return None
        head = self._read(8)
        data = self._read(int.from_bytes(head, "little")) if head is not None else None
        if data is None:
            self.close()
            return None
        try:
            status, value = _SharedUnpickler(io.BytesIO(data), self._shared).load()
        except Exception:  # noqa: BLE001
            # a value this side cannot rebuild (an exception whose constructor wants other arguments):
            # the caller does the work itself, and meets the error there
            self.close()
            return None
        if status != "ok":
            self.close()
            raise value
        return value

    def close(self) -> None:
        """End the child (whatever it had left to send) and reap it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.pid is not None:
            _end(self.pid)
            self.pid = None


class Handoff:
    """One value from this process to a child forked after the handoff was made (the other way
    from `ForkedStream`): make it, fork, then `child_side` in the child and `parent_side` here;
    `send` here once (pickled), `receive` in the child waits for it. The child gets None where
    this process closed its end without sending (it died, or gave up: the child then does the
    work itself). A value larger than the pipe's buffer (`PIPE_BYTES` where the platform lets it be
    sized) makes `send` wait until the child reads it."""

    def __init__(self):
        self._r, self._w = _pipe()

    def child_side(self) -> None:
        """In the child, first: close its copy of the sending end (else it never sees the end)."""
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def parent_side(self) -> None:
        """Here, after the fork: close this process's copy of the receiving end."""
        if self._r is not None:
            os.close(self._r)
            self._r = None

    def send(self, value) -> None:
        """Here: hand ``value`` over and close the sending end (a second send does nothing)."""
        if self._w is None:
            return
        try:
            with os.fdopen(self._w, "wb") as f:
                self._w = None
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        except BrokenPipeError:  # the child has gone: nobody to hand it to
            pass

    def close(self) -> None:
        """Close whichever ends this process still holds (the child then receives None)."""
        for name in ("_r", "_w"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def receive(self):
        """In the child: the value sent, waiting for it; None where none was sent."""
        if self._r is None:
            return None
        with os.fdopen(self._r, "rb") as f:
            self._r = None
            try:
                return pickle.load(f)
            except (EOFError, pickle.UnpicklingError):
                return None


def _call(call: tuple[Callable, tuple]):
    fn, args = call
    return fn(*args)


def beside(mine: Sequence[tuple[Callable, tuple]], theirs: Sequence[tuple[Callable, tuple]]) -> list:
    """``fn(*args)`` of every ``(fn, args)``: those of ``theirs`` in one forked child while this
    process runs those of ``mine``; the results of ``mine`` then ``theirs``, in order. Without
    fork, or with nothing for one side, all run here. A call that raises raises here; a child
    that died without an answer has its calls run here again."""
    mine, theirs = list(mine), list(theirs)
    if not FORKS or not mine or not theirs:
        return [_call(c) for c in mine + theirs]
    child = ForkedStream(lambda: iter([[_call(c) for c in theirs]]))
    try:
        here = [_call(c) for c in mine]
        there = child.next()
    finally:
        child.close()
    return here + (there if there is not None else [_call(c) for c in theirs])


__all__ = ["FORKS", "ForkedStream", "Handoff", "beside"]
