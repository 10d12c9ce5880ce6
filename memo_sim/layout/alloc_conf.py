"""The caching allocator's settings as ``PYTORCH_CUDA_ALLOC_CONF`` writes them, parsed and checked.

A run's allocator settings are part of its layout (`memo_sim.layout.parallel.Layout`:
``expandable_segments`` and ``alloc_conf``, the rest of the setting string) and come from the
framework's data (`memo_sim.frameworks`) or the user (``--alloc-conf``). This module reads the
text the way PyTorch's ``AcceleratorAllocatorConfig`` does (c10/core/AllocatorConfig.cpp,
pytorch/pytorch at 001074d25084fdb87a799823e395a50f5ec044d3):

* ``key:value`` pairs separated by commas;
* ``expandable_segments:True|False``;
* ``max_split_size_mb:N`` with N >= 20 (``kLargeBuffer`` / 1 MiB; PyTorch refuses less);
* ``roundup_power2_divisions:N`` (one power of two for every size), or the list form
  ``roundup_power2_divisions:[256:1,512:2,1024:4,>:8]``: a request's size class is its power of
  two from 1 MiB to 32 GiB (16 intervals; smaller sizes use the first, larger the last); a list
  key N (MiB, a power of two) sets interval log2(N); the first key also sets every interval
  below it, ``>`` every interval after the last key (after interval 0 when it comes first):
  ``AcceleratorAllocatorConfig::parseRoundUpPower2Divisions`` fills from ``last_index + 1``
  (checked at pytorch/pytorch 0ac716637f3258efcaf7fdfb851bdd520c9c1441). PyTorch before the
  settings moved to ``AcceleratorAllocatorConfig`` (c10/cuda/CUDAAllocatorConfig.cpp, and
  c10/core/AllocatorConfig.cpp at 065861fba7598880aa3216822742a1172d0a197c) filled from
  ``last_index`` itself, so ``>`` there also overwrote the last key's own interval
  (``[256:1,512:2,1024:4,>:8]`` gave 1024 MiB 8 divisions, not 4); memo follows the newer parser;
* ``garbage_collection_threshold:T`` with 0 < T < 1 (PyTorch runs the collection only when the
  process has a memory fraction, so memo accepts it only beside ``per_process_memory_fraction``);
* ``per_process_memory_fraction:F`` (0 < F <= 1): not a ``PYTORCH_CUDA_ALLOC_CONF`` key but the
  value of ``torch.cuda.set_per_process_memory_fraction(F)``, written here because it changes
  what the allocator may reserve and turns the garbage collection on;
* keys that do not change device memory (``release_lock_on_cudamalloc``, the ``pinned_*`` host
  settings) are accepted and kept once their values pass PyTorch's own checks
  (c10/cuda/CUDAAllocatorConfig.cpp ``parseArgs`` at 01f9ef32eae5ef513002dd44902c23cbe6be3aae,
  ``pinned_use_background_threads`` in c10/core/AllocatorConfig.cpp): ``True``/``False`` for
  ``release_lock_on_cudamalloc``, ``pinned_use_cuda_host_register`` and
  ``pinned_use_background_threads`` (``ConfigTokenizer::toBool``); a power of two at most 128
  (``pinned_max_register_threads``) for ``pinned_num_register_threads``; an integer > 0 for
  ``pinned_reserve_segment_size_mb``; ``backend:cudaMallocAsync`` is refused (a different allocator,
  not modelled).

Bad text is one `MemoError` line naming the key and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memo_sim.errors import MemoError

ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: the power-of-two classes 1 MiB, 2 MiB, .., 32 GiB (and above)
_NOT_MODELLED = ("max_non_split_rounding_mb",)  # PyTorch keys that change device memory, which memo refuses
_NO_EFFECT = ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "pinned_num_register_threads",
              "pinned_use_background_threads", "pinned_reserve_segment_size_mb")
KEYS = ("expandable_segments", "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold",
        "per_process_memory_fraction") + _NO_EFFECT


@dataclass(frozen=True)
class AllocConf:
    """The parsed settings (PyTorch's defaults where a key is absent)."""

    expandable_segments: bool | None = None  # None: not said (the layout's own field decides)
    max_split_size_mb: int | None = None
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0
    per_process_memory_fraction: float | None = None
    other: tuple[tuple[str, str], ...] = ()  # accepted keys with no effect on device memory

    def text(self, with_expandable: bool = True) -> str:
        """The canonical setting string (keys in a fixed order; PyTorch's defaults left out)."""
        parts = []
        if with_expandable and self.expandable_segments is not None:
            parts.append(f"expandable_segments:{'True' if self.expandable_segments else 'False'}")
        if self.max_split_size_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_mb}")
        divs = self.roundup_power2_divisions
        if any(divs):
            if len(set(divs)) == 1:
                parts.append(f"roundup_power2_divisions:{divs[0]}")
            else:
                parts.append("roundup_power2_divisions:[" + ",".join(f"{1 << i}:{d}" for i, d in enumerate(divs))
                             + "]")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold!r}")
        if self.per_process_memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction!r}")
        parts += [f"{k}:{v}" for k, v in self.other]
        return ",".join(parts)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def _int(key: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise MemoError(f"alloc_conf: {key} must be an integer, got {v!r}") from None


def _divisions(v: str) -> tuple[int, ...]:
    where = "alloc_conf: roundup_power2_divisions"
    if not v.startswith("["):
        n = _int("roundup_power2_divisions", v)
        if not _power_of_two(n):  # PyTorch refuses 0 here too (only the list form takes 0 for a size)
            raise MemoError(f"{where} must be a power of two, got {n}; drop the key for plain rounding")
        return (n,) * ROUNDUP_INTERVALS
    if not v.endswith("]"):
        raise MemoError(f"{where}: a list is written [size_mb:divisions,...,>:divisions], got {v!r}")
    divs = [0] * ROUNDUP_INTERVALS
    last = 0
    first = True
    for item in _split_top(v[1:-1]):
        key, sep, val = item.partition(":")
        if not sep:
            raise MemoError(f"{where}: list items are size_mb:divisions, got {item!r}")
        d = _int("roundup_power2_divisions", val.strip())
        if d and not _power_of_two(d):
            raise MemoError(f"{where}: divisions must be powers of two, got {d}")
        key = key.strip()
        if key == ">":  # from the interval after the last key (PyTorch's last_index starts at 0; fill from +1)
            for i in range(last + 1, ROUNDUP_INTERVALS):
                divs[i] = d
            continue
        mb = _int("roundup_power2_divisions", key)
        if not _power_of_two(mb):
            raise MemoError(f"{where}: list sizes are powers of two in MiB, got {mb}")
        idx = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            for i in range(idx):
                divs[i] = d
        divs[idx] = d
        last, first = idx, False
    return tuple(divs)


PINNED_MAX_REGISTER_THREADS = 128  # CUDAAllocatorConfig::pinned_max_register_threads() (c10/cuda/CUDAAllocatorConfig.h)
_BOOL_KEYS = ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "pinned_use_background_threads")


def _no_effect_value(key: str, v: str) -> str:
    """Check a no-effect key's value the way PyTorch's parser does (module docstring), so that a
    string PyTorch refuses at start-up is not written into a plan."""
    if key in _BOOL_KEYS:
        if v not in ("True", "False"):
            raise MemoError(f"alloc_conf: {key} must be True or False (PyTorch refuses anything else), got {v!r}")
    elif key == "pinned_num_register_threads":
        n = _int(key, v)
        if not _power_of_two(n) or n > PINNED_MAX_REGISTER_THREADS:
            raise MemoError(f"alloc_conf: {key} must be a power of two from 1 to {PINNED_MAX_REGISTER_THREADS} "
                            f"(PyTorch's check), got {v}")
    elif key == "pinned_reserve_segment_size_mb":
        if _int(key, v) <= 0:
            raise MemoError(f"alloc_conf: {key} must be an integer > 0 (MiB; PyTorch's check), got {v}; "
                            f"drop the key for no reserve segment")
    return v


def _fraction(key: str, v: str, upper_open: bool) -> float:
    try:
        x = float(v)
    except ValueError:
        raise MemoError(f"alloc_conf: {key} must be a number, got {v!r}") from None
    if not (0.0 < x < 1.0 if upper_open else 0.0 < x <= 1.0):
        raise MemoError(f"alloc_conf: {key} must be in (0, {'1)' if upper_open else '1]'}, got {v}")
    return x


def parse_alloc_conf(text: str) -> AllocConf:
    """Read a ``PYTORCH_CUDA_ALLOC_CONF``-style string (empty: PyTorch's defaults)."""
    fields: dict = {}
    other: list[tuple[str, str]] = []
    for item in _split_top(text or ""):
        key, sep, val = item.partition(":")
        key, val = key.strip(), val.strip()
        if not sep or not val:
            raise MemoError(f"alloc_conf: {item!r} is not key:value (e.g. expandable_segments:True)")
        if key in fields or any(k == key for k, _ in other):
            raise MemoError(f"alloc_conf: {key} is given twice")
        if key == "expandable_segments":
            if val not in ("True", "False"):
                raise MemoError(f"alloc_conf: expandable_segments must be True or False, got {val!r}")
            fields[key] = val == "True"
        elif key == "max_split_size_mb":
            n = _int(key, val)
            if n < 20:
                raise MemoError(f"alloc_conf: max_split_size_mb must be >= 20 (PyTorch's kLargeBuffer), got {n}")
            fields[key] = n
        elif key == "roundup_power2_divisions":
            fields[key] = _divisions(val)
        elif key == "garbage_collection_threshold":
            fields[key] = _fraction(key, val, upper_open=True)
        elif key == "per_process_memory_fraction":
            fields[key] = _fraction(key, val, upper_open=False)
        elif key == "backend":
            if val != "native":
                raise MemoError(f"alloc_conf: backend:{val} is another allocator (cudaMallocAsync), not modelled; "
                                f"drop the key to plan on PyTorch's native caching allocator")
            other.append((key, val))
        elif key in _NO_EFFECT:
            other.append((key, _no_effect_value(key, val)))
        elif key in _NOT_MODELLED:
            raise MemoError(f"alloc_conf: {key} changes device memory but is not modelled; drop the key")
        else:
            raise MemoError(f"alloc_conf: unknown key {key!r}; known: {', '.join(KEYS)}")
    if fields.get("garbage_collection_threshold") and "per_process_memory_fraction" not in fields:
        raise MemoError("alloc_conf: garbage_collection_threshold runs only under a memory fraction "
                        "(torch.cuda.set_per_process_memory_fraction); add per_process_memory_fraction:F")
    return AllocConf(other=tuple(other), **fields)


# PyTorch's one-setting fix where the caching allocator's cache binds: segments mapped in place and grown, so freed
# blocks return to the one segment (every piece of advice that names it names it so)
EXPANDABLE_FLAG = "--alloc-conf expandable_segments:True"


def merged_alloc_conf(expandable_segments: bool, alloc_conf: str) -> AllocConf:
    """The settings of a layout: its ``alloc_conf`` string with its ``expandable_segments`` field."""
    conf = parse_alloc_conf(alloc_conf)
    if conf.expandable_segments is not None and conf.expandable_segments != expandable_segments:
        raise MemoError("alloc_conf: expandable_segments is the layout's own field; leave it out of alloc_conf")
    return AllocConf(expandable_segments=expandable_segments, max_split_size_mb=conf.max_split_size_mb,
                     roundup_power2_divisions=conf.roundup_power2_divisions,
                     garbage_collection_threshold=conf.garbage_collection_threshold,
                     per_process_memory_fraction=conf.per_process_memory_fraction, other=conf.other)


@lru_cache(maxsize=256)
def memory_fraction(alloc_conf: str) -> float | None:
    """A layout's ``per_process_memory_fraction`` (None: none set)."""
    return parse_alloc_conf(alloc_conf).per_process_memory_fraction if alloc_conf else None


def gpu_limit_bytes(profile, alloc_conf: str) -> float:
    """The GPU bytes a rank's process may hold, the one capacity every memory check of its layout is
    against: the profile's usable memory, or less under ``per_process_memory_fraction``, which caps
    all the process allocates through PyTorch (its model states, its memory plan's arena, every
    tensor): ``allowed_memory_maximum`` is the fraction of the device's total memory
    (`memo_sim.memplan.allocator_config.AllocatorConfig.limit_bytes`, the replay's own limit)."""
    usable = profile.usable_gpu_memory
    f = memory_fraction(alloc_conf)
    return usable if f is None else min(usable, f * profile.gpu_memory)
