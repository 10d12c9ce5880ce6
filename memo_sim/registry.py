"""Parts registered by name: the one registry the simulator's and the executor's plug-ins use.

Activation policies (`memo_sim.policy.registry`), tensor-parallel flavours (`memo_sim.tp`, and
the executor's `memo_exec.distributed.tp`), the simulator's schedules
(`memo_sim.engine.schedules.registry`), the executor's activation policies
(`memo_exec.activations.registry`) and schedules (`memo_exec.distributed.schedule`) each hold
one `Registry`. A part registers itself when its module is imported; the package that owns the
registry imports its part modules explicitly (no discovery, no swallowed import errors). A name
registered twice for two different objects is a programming error (ValueError); an unknown name
is the caller's (the registry's error class, one line listing the known names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from memo_sim.errors import MemoError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> registered object, in registration order.

    ``what`` names the kind of part in messages ("policy", "TP flavour"); ``error`` is the
    exception an unknown name raises; ``unknown`` formats its message from ``name``, ``what``
    and ``known`` (the registered names, comma-separated); ``allowed`` limits the names that may
    be registered (a name outside it is a programming error); ``sort`` lists the known names
    sorted rather than in registration order."""

    def __init__(self, what: str, *, error: type[Exception] = MemoError,
                 unknown: str = "{what} {name!r} unknown; choose one of {known}",
                 allowed: tuple[str, ...] | None = None, sort: bool = False) -> None:
        self.what, self.error, self.unknown, self.allowed, self.sort = what, error, unknown, allowed, sort
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name`` (the same object again is a no-op)."""
        if self.allowed is not None and name not in self.allowed:
            raise ValueError(f"{self.what} {name!r} is not one of {', '.join(self.allowed)}")
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.what} {name!r} registered twice")
        self._items[name] = obj
        return obj

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` (default: its ``name``
        attribute; a class registered under an explicit name gets it as ``name``)."""
        def deco(obj: T) -> T:
            key = name if name is not None else obj.name
            if name is not None and isinstance(obj, type):
                obj.name = name
            return self.add(key, obj)
        return deco

    def get(self, name: str) -> T:
        """The object registered under ``name`` (``error`` naming the known ones otherwise)."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise self.error(self.unknown.format(what=self.what, name=name, known=", ".join(self.names()))) from None

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order (sorted with ``sort``)."""
        return tuple(sorted(self._items)) if self.sort else tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def items(self):
        return self._items.items()
