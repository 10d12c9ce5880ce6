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


def fit_fixes(c, gpus: int, alpha: float | None = None, policies: tuple[str, ...] | None = None,
              allows=None) -> list[str]:
    """Up to `MAX_FIXES` one-change variants of candidate ``c`` that fit (analytic tier), in words;
    ``policies``: the ones a --policy variant may name (the framework's; None: every one); ``allows``: whether
    the framework runs a layout (None: every one). A variant the what-if would refuse is never named (a review:
    --policy recompute_mlp was advised on a METP layout, --cp 2 under DeepSpeed, which has no ring CP)."""
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.policy import policy_class, policy_names

    if c.status == "OK" or c.schedule != "single_stage":
        return []
    fixes = []
    for p in policy_names():
        if p == c.policy.name or schedule_runs_policy("sppo", p) or (policies is not None and p not in policies):
            continue
        cls = policy_class(p)
        if (cls.needs_experts and not c.model.moe) or cls.model_why_not(c.model) or cls.layout_why_not(c.layout):
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
        if allows is not None and not allows(lay):
            continue
        e = _estimate(c, lay, c.policy.name, alpha)
        if e is not None and e.status == "OK":
            fixes.append((-e.tgs, f"{flags} ({lay.label()} {e.policy.label()}, {e.tgs:,.0f} tokens/GPU/s analytic)"))
    return [words for _k, words in sorted(fixes)[:MAX_FIXES]]


EXPANDABLE_TRIES = 4  # faster layouts priced with expandable segments, at most, per fitting answer


def expandable_faster(shown, best) -> dict | None:
    """A fitting answer whose faster configurations ran out of memory on the caching allocator's fragmentation
    alone (an OOM with no byte over capacity, the ranking's 'OOM frag': a request found no cached block big enough
    though the peak fits): the fastest of them (analytic tier, up to `EXPANDABLE_TRIES` priced) that fits with
    PyTorch's expandable segments and beats the best's analytic throughput, or None (`fit_fixes` names the same flag
    when nothing fits)."""
    from memo_sim.policy.base import uses_memory_plan  # noqa: PLC0415

    if best is None or best.layout.expandable_segments:
        return None
    base = best.estimate.tgs
    tried = 0
    for c in shown:
        if (c is best or c.status != "OOM" or c.over_bytes > 0 or c.schedule != "single_stage"
                or c.layout.expandable_segments or uses_memory_plan(c.policy, c.layout) or c.estimate.tgs <= base):
            continue
        tried += 1
        lay = replace(c.layout, expandable_segments=True)
        e = _estimate(c, lay, c.policy.name, c.policy.alpha)
        if e is not None and e.status == "OK" and e.tgs > base:
            label = f"{c.layout.label()} {c.policy.label()}"
            words = (f"faster with {EXPANDABLE_FLAG}: {label} runs out of memory only on the caching allocator's "
                     f"fragmentation; with expandable segments it fits at {e.tgs:,.0f} tokens/GPU/s (analytic), "
                     f"{e.tgs / base:.2f}x the best's analytic {base:,.0f}")
            return {"flag": EXPANDABLE_FLAG, "label": f"{lay.label()} {e.policy.label()}", "tier": "analytic",
                    "tgs_tokens_per_gpu_s": float(e.tgs), "best_analytic_tgs_tokens_per_gpu_s": float(base),
                    "peak_gpu_bytes": float(e.peak_gpu_bytes), "words": words}
        if tried >= EXPANDABLE_TRIES:
            break
    return None


SPLIT_UNIT = 1024  # lengths named as split-friendly: multiples of the GPU count times this (72 GPUs: 72K, 1008K)
SPLIT_TRIES = 3  # lengths checked at most, per answer


def split_factor(seq: int, gpus: int) -> int:
    """The factor of ``gpus`` that no sequence split of ``seq`` tokens can take: `memo_sim.layout.parallel.check_layout`
    asks the sequence to divide into ulysses x cp (x 2 with ring CP: Megatron-LM's load-balanced chunks, 2 per CP
    rank, megatron/training/utils.py ``get_batch_on_this_cp_rank``) x tp (with sequence parallelism) equal
    chunks, so that product divides ``seq`` and the rest of the GPU count (this factor at least) stays in data or
    pipeline parallelism. 1: the length does not limit the split."""
    from math import gcd

    return gpus // gcd(gpus, seq) if seq > 0 and gpus > 0 else 1


def split_step(step: int, gpus: int) -> int:
    """The step maxseq searches in for ``step`` on ``gpus`` GPUs: ``step`` times the odd part of the GPUs' factor it
    does not split over (`split_odd_factor`), so that the lengths searched split over all the GPUs that the step's
    powers of 2 already do. Fit is monotone only along such lengths: 72 GPUs = 8 x 9 at --step 128K fit 1.5M,
    failed 1.625M (13 x 2^17: the factor 9 stays out of every split) and fit 9216K again (a review: maxseq answered
    1.5M as the longest multiple of the step). A step short of powers of 2 (--step 1001 with --cp 2) is kept, and
    refused with the length that divides (`memo_sim.layout.parallel.check_layout`)."""
    return step * split_odd_factor(step, gpus) if step > 0 else step


def split_odd_factor(step: int, gpus: int) -> int:
    """The odd part of `split_factor` (``step``, ``gpus``): 9 for 128K on 72 GPUs; 1 where only powers of 2 are
    missing."""
    m = split_factor(step, gpus)
    while m % 2 == 0:
        m //= 2
    return m


def split_step_words(step: int, gpus: int) -> str:
    """Why maxseq searches a step other than ``step`` (`split_step`), in words; "" where it searches ``step``."""
    from memo_sim.units import fmt_count

    m = split_odd_factor(step, gpus)
    if m <= 1:
        return ""
    return (f"step {fmt_count(step * m)} searched (--step {fmt_count(step)} x {m}): the {gpus} GPUs' factor {m} "
            f"does not divide {fmt_count(step)}, and a length it does not divide keeps that factor out of every "
            f"sequence split, so only multiples of {fmt_count(step * m)} (lengths the {gpus} GPUs split over) "
            f"are searched; --step {fmt_count(gpus * SPLIT_UNIT)} (the GPU count x 1K) searches finer, in more "
            "rankings")


def split_limit_words(seq: int, gpus: int) -> str:
    """Where the length limits the sequence-splitting degrees (`split_factor` > 1): why, in words; else ""."""
    from memo_sim.units import fmt_count

    m = split_factor(seq, gpus)
    if m <= 1:
        return ""
    return (f"the length limits the sequence split: ulysses x cp (2 x cp chunks with ring CP) x tp (with sequence "
            f"parallelism) must divide the {fmt_count(seq)} tokens; the {gpus} GPUs' factor {m} does not divide them, "
            f"so every layout keeps a factor {m} of its GPUs out of the split (in data or pipeline parallelism), "
            f"whatever its memory")


def fewer_gpus(seq: int, gpus: int) -> int | None:
    """The largest GPU count below ``gpus`` that ``seq`` splits over whole (`split_factor` 1), above the split the
    length allows on ``gpus`` (fewer would split it no further), or None."""
    from math import gcd

    low = gcd(gpus, seq)
    return next((g for g in range(gpus - 1, low, -1) if seq % g == 0), None)


def split_lengths(seq: int, gpus: int, above: int = 0, below: int | None = None) -> list[int]:
    """Lengths the ``gpus`` GPUs split over whole (multiples of ``gpus`` x `SPLIT_UNIT`), longest first: those
    after ``above`` and up to ``below`` (default ``seq``), `SPLIT_TRIES` at most (none equal to ``seq``)."""
    unit = gpus * SPLIT_UNIT
    top = (below if below is not None else seq) // unit
    return [k * unit for k in range(top, 0, -1) if k * unit > above and k * unit != seq][:SPLIT_TRIES]


def split_fixes(seq: int, gpus: int, fits, lengths: list[int] | None = None) -> list[tuple[str, int, int, str]]:
    """Where the length limits the sequence split (`split_factor`): the changes that fit, each checked by the
    search (``fits(seq, gpus)``: the best fitting plan's label there, or None): the largest GPU count the length
    splits over (`fewer_gpus`), then the first of ``lengths`` (default `split_lengths`) that fits on ``gpus``.
    Each as (kind ``gpus`` or ``seq``, the length, the GPU count, the plan's label); a change that does not fit
    is not named."""
    if split_factor(seq, gpus) <= 1:
        return []
    out = []
    g = fewer_gpus(seq, gpus)
    label = fits(seq, g) if g else None
    if label:
        out.append(("gpus", seq, g, label))
    for n in (split_lengths(seq, gpus) if lengths is None else lengths):
        label = fits(n, gpus)
        if label:
            out.append(("seq", n, gpus, label))
            break
    return out
