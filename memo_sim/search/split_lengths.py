"""Which sequence lengths a GPU count splits over: the factor of the GPUs a length keeps out of every sequence split
(its layouts' ulysses x cp x tp must divide it, `memo_sim.layout.parallel.check_layout`), the step maxseq searches
in so that every length it tries splits over all the GPUs, and the changes that make a length split (fewer GPUs, a
length the GPUs divide). Pure arithmetic over the counts: the search (`memo_sim.search.maxseq`) and the answers
(`memo_sim.report.fit_advice`, `memo_sim.report.whatif_answer`) read it."""

from __future__ import annotations


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
