"""Memoisation of pure cost functions whose arguments include a `HardwareProfile`.

A profile is a frozen dataclass holding dicts, so it cannot be hashed; these caches key it by
identity instead. Each entry keeps its arguments alive, so an id cannot be reused by another
profile while the entry exists. Every other argument must be hashable (models, layouts and
policies are frozen dataclasses). A cache that reaches ``maxsize`` entries is emptied (the what-if
asks for the same few shards again and again; an LRU order would cost more than it saves).

The what-if prices thousands of candidates that share a model, a per-GPU shard and a policy:
what depends only on those is computed once (`memo_sim.cost.layer_time`, `memo_sim.search.estimate`,
`memo_sim.memplan.footprint`).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Hashable, Iterator, TypeVar

from memo_sim.profile.schema import HardwareProfile

F = TypeVar("F", bound=Callable)

_CACHES: list[dict] = []
_OFF = [False]  # `unmemoised` sets it: every memoised function computes afresh


def _key(a):
    return ("<profile>", id(a)) if isinstance(a, HardwareProfile) else a


def profile_key(profile: HardwareProfile) -> tuple:
    """A profile in a `memoised_by` key (by identity, as `memoised` keys it)."""
    return _key(profile)


def memoised(maxsize: int = 4096) -> Callable[[F], F]:
    """Cache a pure function of hashable arguments and profiles (by identity). The wrapped
    function's results are shared between callers: return immutable values (tuples)."""
    def deco(fn: F) -> F:
        cache: dict = {}
        _CACHES.append(cache)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _OFF[0]:
                return fn(*args, **kwargs)
            key = tuple([_key(a) for a in args])
            if kwargs:
                key += tuple((k, _key(v)) for k, v in sorted(kwargs.items()))
            hit = cache.get(key)
            if hit is not None:
                return hit[1]
            value = fn(*args, **kwargs)
            if len(cache) >= maxsize:
                cache.clear()
            cache[key] = ((args, kwargs), value)  # keeps the profile alive: its id stays unique
            return value

        wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
    return deco


def memoised_by(key: Callable[..., Hashable], maxsize: int = 4096) -> Callable[[F], F]:
    """Cache a pure function under ``key(*args)``: the part of its arguments it reads, so that
    callers whose arguments differ only in what it does not read (a layout's virtual stages, its
    ZeRO stage...) share one entry. The key must hold every input the result depends on (a
    profile by `profile_key`)."""
    def deco(fn: F) -> F:
        cache: dict = {}
        _CACHES.append(cache)

        @functools.wraps(fn)
        def wrapper(*args):
            if _OFF[0]:
                return fn(*args)
            k = key(*args)
            hit = cache.get(k)
            if hit is not None:
                return hit[1]
            value = fn(*args)
            if len(cache) >= maxsize:
                cache.clear()
            cache[k] = (args, value)  # keeps a profile keyed by id alive: its id stays unique
            return value

        wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
    return deco


def clear_caches() -> None:
    """Empty every cache made by `memoised` (tests that time cold paths)."""
    for c in _CACHES:
        c.clear()


def memoising() -> bool:
    """False inside `unmemoised` (for memos kept outside `memoised`, e.g. SPPO's piece timer)."""
    return not _OFF[0]


@contextmanager
def unmemoised() -> Iterator[None]:
    """Inside: every `memoised` function computes afresh (caches emptied before and after), so a
    test can compare the memoised path with the plain one."""
    clear_caches()
    _OFF[0] = True
    try:
        yield
    finally:
        _OFF[0] = False
        clear_caches()
