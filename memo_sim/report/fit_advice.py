"""What would make a configuration that does not fit fit: "why does X not fit" answered for X.

The what-if's binding words say why X does not fit (the term that fills memory, with the terms
beside it); `fit_fixes` says what would make it fit, by estimating (analytic tier, cheap) X with
one thing changed: another activation policy on X's layout, or X's sequence split twice as far
(ring context parallelism, over half the data-parallel replicas or twice the GPUs), or its
tensor parallelism doubled within a node. Only changes that fit are named, as the flags that ask
for them.
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import EXPANDABLE_FLAG

MAX_FIXES = 3


def _estimate(c, layout, policy: str, alpha):
    from memo_sim.policy import policy_class
    from memo_sim.search.whatif import make_candidate

    try:
        return make_candidate(c.model, layout, policy, c.batch, c.seq, c.profile,
                              alpha if policy_class(policy).takes_alpha else None, micro_batch=c.micro_batch)
    except MemoError:
        return None


def _layout_variants(c, gpus: int):
    """(flags, layout) of X's layout with its sequence or tensors split twice as far."""
    from memo_sim.layout.parallel import check_layout

    lay = c.layout
    out = []
    for field_, flag in (("cp", "--cp"), ("tp", "--tp")):
        v = replace(lay, **{field_: getattr(lay, field_) * 2})
        extra = ""
        if lay.dp % 2 == 0:
            v = replace(v, dp=lay.dp // 2)
        else:
            extra = f" --gpus {2 * gpus}"
        if check_layout(v, c.model, v.gpus, c.profile.node_gpus, c.seq, c.batch) is None:
            out.append((f"{flag} {getattr(v, field_)}{extra}", v))
    return out


def fit_fixes(c, gpus: int, alpha: float | None = None, policies: tuple[str, ...] | None = None) -> list[str]:
    """Up to `MAX_FIXES` one-change variants of candidate ``c`` that fit (analytic tier), in words;
    ``policies``: the ones a --policy variant may name (the framework's; None: every one)."""
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.policy import policy_names

    if c.status == "OK" or c.schedule != "single_stage":
        return []
    fixes = []
    for p in policy_names():
        if p == c.policy.name or schedule_runs_policy("sppo", p) or (policies is not None and p not in policies):
            continue
        e = _estimate(c, c.layout, p, alpha)
        if e is not None and e.status == "OK":
            fixes.append((-e.tgs, f"--policy {p} ({e.layout.label()} {e.policy.label()}, {e.tgs:,.0f} tokens/GPU/s "
                                  "analytic)"))
    variants = _layout_variants(c, gpus)
    from memo_sim.policy.base import uses_memory_plan  # noqa: PLC0415

    if not c.layout.expandable_segments and not uses_memory_plan(c.policy, c.layout):  # PyTorch's one-flag fix
        variants.append((EXPANDABLE_FLAG, replace(c.layout, expandable_segments=True)))
    for flags, lay in variants:
        e = _estimate(c, lay, c.policy.name, alpha)
        if e is not None and e.status == "OK":
            fixes.append((-e.tgs, f"{flags} ({lay.label()} {e.policy.label()}, {e.tgs:,.0f} tokens/GPU/s analytic)"))
    return [words for _k, words in sorted(fixes)[:MAX_FIXES]]
