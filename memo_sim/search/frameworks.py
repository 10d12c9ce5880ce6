"""What a training framework offers, so the what-if can answer "what would my framework do".

The frameworks are data (`memo_sim.frameworks`: one YAML file per framework version under
``memo_sim/frameworks/data/``, with sources): the layouts and policies each offers and the
mechanisms it runs them with (attention kernel, gradient-reduction overlap). ``any`` (memo's own
executor and everything it plans) offers them all. This module only reads them.
"""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.frameworks import Framework, load_frameworks

FRAMEWORKS: dict[str, Framework] = load_frameworks()


def get_framework(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise MemoError(f"--framework {name!r} unknown; choose one of {', '.join(FRAMEWORKS)}") from None


def policy_frameworks_words() -> str:
    """The policies memo's own search (``any``) leaves out and the frameworks that offer them, for the ``--policy``
    help: "selective_recompute (--framework megatron, ...), ..." ("" when ``any`` offers every one)."""
    from memo_sim.policy import policy_names  # noqa: PLC0415

    own = set(FRAMEWORKS["any"].policies)
    words = [f"{p} (--framework {', '.join(n for n, f in FRAMEWORKS.items() if p in f.policies and '@' not in n)})"
             for p in policy_names() if p not in own and any(p in f.policies for f in FRAMEWORKS.values())]
    return "; ".join(words)


__all__ = ["FRAMEWORKS", "Framework", "get_framework", "policy_frameworks_words"]
