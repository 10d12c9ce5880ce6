"""Units: parse "256K" tokens, "80 GiB", "400 GB/s"; format bytes, seconds and FLOP/s.

Every dimension has one base unit: bytes, seconds, FLOP/s, bytes/s, tokens (a count).
Token counts use binary multipliers as the papers do (1M tokens = 1,048,576; 256K = 262,144).
"""

from __future__ import annotations

import re

from memo_sim.errors import MemoError

PAGE_BYTES = 4096  # a host memory page (pinned allocations are rounded to it)

_COUNT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
MAX_TOKENS = 1 << 30  # 1G tokens: a count past this (a sequence, a step, a chunk) is a typo, not a plan

BYTES = {
    "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
BANDWIDTH = {
    "B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "GiB/s": 1024**3, "Gb/s": 1e9 / 8, "Gbit/s": 1e9 / 8,
}
FLOPS = {"FLOP/s": 1, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15}
TIME = {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
RATIO = {"": 1, "1": 1, "ratio": 1}

DIMENSIONS = {"bytes": BYTES, "bandwidth": BANDWIDTH, "flops": FLOPS, "time": TIME, "ratio": RATIO}


def parse_count(text: str | int, field: str = "value", limit: int = MAX_TOKENS) -> int:
    """Parse a token/element count: 4096, "4K", "256K", "1M", "1.5M" (binary multipliers), at most
    ``limit`` (a physical cap: a larger count is refused, not searched)."""
    if isinstance(text, bool):
        raise MemoError(f"{field}: expected a count like 4096, 256K or 1M, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]{0,12}\.?[0-9]{1,12})\s*([kKmMgG]?)\s*", str(text))
        if not m:
            raise MemoError(f"{field}: expected a count like 4096, 256K or 1M, got {str(text)[:40]!r}")
        f = float(m.group(1)) * _COUNT[m.group(2).upper()]
        if f != int(f):
            raise MemoError(f"{field}: must be a positive whole number, got {text!r}")
        value = int(f)
    if value <= 0:
        raise MemoError(f"{field}: must be positive, got {text!r}")
    if value > limit:
        raise MemoError(f"{field}: {text!r} is more than {fmt_count(limit)} tokens; use a smaller count")
    return value


def convert(value: float, unit: str, dimension: str, field: str) -> float:
    """Convert ``value`` in ``unit`` to the base unit of ``dimension`` or raise naming ``field``."""
    table = DIMENSIONS[dimension]
    if unit not in table:
        raise MemoError(
            f"{field}: unit {unit!r} is not a {dimension} unit; use one of {', '.join(u for u in table if u)}"
        )
    return float(value) * table[unit]


def parse_headroom(text: str, usable: float, field: str = "--headroom") -> float:
    """Bytes of ``text``: a size with a byte unit ("8GiB", "6 GB") or a share of ``usable`` bytes ("10%", "2.5%"),
    at least 0; one line naming ``field`` and the fix otherwise."""
    t = str(text).strip()
    m = re.fullmatch(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*(%|[KMGT]i?B|B)", t)
    if not m:
        raise MemoError(f"{field}: expected a size like 8GiB or a share like 10%, got {t[:40]!r}")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "%":
        if value >= 100:
            raise MemoError(f"{field} {t}: a share of the usable memory below 100% leaves room for tensors; "
                            f"give less (e.g. 10%)")
        return usable * value / 100
    return value * BYTES[unit]


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: int) -> str:
    """Tokens as they are asked for: 128K, 1.25M, 48.5K; a count no K-multiple spells in a few digits as itself
    (100001, not 97.6572K)."""
    for unit, size in (("M", 1024**2), ("K", 1024)):
        if n >= size and n % 64 == 0 and float(f"{n / size:g}") * size == n:  # the text reads back as n
            return f"{n / size:g}{unit}"
    return str(n)


def fmt_params(n: float) -> str:
    """A parameter count in the unit that reads: 8.03B, 110.5M, 12.3K (a toy model is not 0.00B)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}" if unit in ("T", "B") else f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_token_budget(text: str, field: str = "--train-tokens") -> int:
    """A training budget in tokens with decimal multipliers, as budgets are quoted: 300B, 15T, 2.5e12."""
    m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,12})?(?:[eE][0-9]{1,2})?)\s*([kKmMbBgGtT]?)\s*", str(text))
    if not m:
        raise MemoError(f"{field}: expected a token count like 300B, 15T or 2e12, got {str(text)[:40]!r}")
    value = float(m.group(1)) * _DECIMAL[m.group(2).upper()]
    if not (1 <= value <= 1e18):
        raise MemoError(f"{field}: must lie between 1 and 1e18 tokens, got {text!r}")
    return int(value)


def tokens_cap_fix() -> str:
    """The fix a count of tokens past `MAX_TOKENS` is refused with, in the library's words (`memo_sim.api`'s
    entries and `WhatifRequest`)."""
    return f"give at most {fmt_count(MAX_TOKENS)} tokens (the command's limit: more is a typo, not a sequence)"
