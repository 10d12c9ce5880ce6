"""The longest sequence that trains: per policy, in steps of a chosen size, with what binds next.

Fit is monotone in the sequence length on paper (`tests/test_fit_monotone.py`), so the answer is found by
doubling the length until nothing fits and bisecting between the last fit and the first
failure: O(log(max / step)) what-if rankings per policy instead of one per step. A probe asks only whether
its length fits: a single-stage candidate that fits (priced without the micro-batch pipelines, most of a
ranking's time on many GPUs) answers it as the whole ranking would (`_single_stage_witness`), and where none
does the whole ranking is priced, so a failing length's candidates say what binds there. The caching
allocator's replay is not monotone (its segments fall differently at each length), so with
``allocator="caching"``, where the first failing length failed in that replay (`_replay_failed`), the grid
lengths past it are scanned as well (`_past_failure`: until `PAST_FAILURE_STEPS` lengths in a row fail above the
longest that fits, at most `PAST_FAILURE_MAX_STEPS` lengths) and the ones that fit are reported beside the answer
(``fits_past_failure``), not as it. At the
longest length the best plan is simulated for its MFU (the what-if's proved-bound tier); where the
event simulator runs no plan there (its own allocator and schedule can run out of memory where the
replay below fits), the answer steps down 1, 2, 4, ... lengths to one it runs and bisects back up,
and that simulated failure binds. Otherwise, at the next step the least-over candidate says what
binds: GPU memory (and its largest terms) or pinned host memory.

Reserved memory decides for the plans on PyTorch's caching allocator: the analytic tier counts a
layer's transients as the allocator reserves them (`memo_sim.memplan.baseline`), and a
single-stage candidate fits only when the allocator's replay of its iterations
(`memo_sim.memplan.iteration_replay`) never runs out of device memory, with the cache's
fragmentation and retries (on a static memory plan too: the plan's arena is one request, the rest
is the caching allocator's, as memo-exec places it); a length where every analytically fitting
candidate fails the replay binds on "reserved memory". One whose least-over candidate would fit
with its transients counted as allocated (live at once), as a static memory plan places them, binds
on "GPU memory on the caching allocator's terms": the analytic peak, which decides fit, lumps one
layer's transients as the allocator reserves them and, under a whole-layer recompute, the re-run
tensors as the one buffer the policy's executor holds (`_lumped_words`); it is not the replay's
reserved peak, which can be lower. Candidates are replayed in increasing analytic peak, stopping at
the first that fits (a replay costs 10-50 ms).
``allocator`` is the what-if's (`memo_sim.search.whatif.candidates_for`): ``caching`` (what the
framework runs), ``plan`` (every policy on a static memory plan), so that the two answers side by
side say how much longer a sequence the memory plan trains.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from memo_sim.layout.alloc_conf import EXPANDABLE_FLAG
from memo_sim.layout.parallel import seq_fix_names
from memo_sim.policy.base import uses_memory_plan
from memo_sim.errors import MemoError, NothingFits
from memo_sim.memplan.iteration_replay import engine_replay, fragmentation_words
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.candidate import binding_words, memory_term_words, need_of_capacity
from memo_sim.search.seq_sweep import in_order
from memo_sim.search.whatif import Candidate, candidates_for, rank
from memo_sim.search.request import tp_flavours_asked
from memo_sim.search.frameworks import get_framework
from memo_sim.layout.schedule import schedule_runs_policy
from memo_sim.policy import policy_class, prices_model
from memo_sim.units import fmt_bytes, fmt_count

MAX_STEPS = 1 << 12  # 4096 steps: 512M tokens at 128K


@dataclass
class MaxSeqAnswer:
    policy: str
    step: int
    max_seq: int | None  # None: not even one step fits
    best: Candidate | None  # the best plan at max_seq (simulated)
    next_seq: int  # the first length that does not fit
    binding: str  # what fails at next_seq, in words
    allocator: str = "caching"  # the what-if's --allocator this answer searched with
    states_alone: bool = False  # not one step fits, and every candidate's model states alone exceed its GPU
    # the grid lengths past the first failure that fit (analytic and the replay, not simulated: `_past_failure`),
    # the longest length looked at there (None: not looked), whether the scan stopped at its cap
    # (`PAST_FAILURE_MAX_STEPS`) rather than after `PAST_FAILURE_STEPS` failing lengths above the longest fit, and
    # the failing length it looked past (the bisection's; ``next_seq`` is lower where the event simulator binds)
    fits_past_failure: tuple[int, ...] = ()
    looked_past_failure_to: int | None = None
    past_failure_capped: bool = False
    looked_past: int | None = None

    def to_json(self) -> dict:
        b = self.best
        return {"policy": self.policy, "allocator": self.allocator, "step_tokens": self.step,
                "max_seq_tokens": self.max_seq,
                "best": b.to_json() if b else None, "mfu": (b.simulated or {}).get("mfu") if b else None,
                "next_seq_tokens": self.next_seq, "binding": self.binding,
                "fits_past_failure_tokens": list(self.fits_past_failure),
                "longest_fit_past_failure_tokens": max(self.fits_past_failure, default=None),
                "looked_past_failure_to_tokens": self.looked_past_failure_to,
                "past_failure_capped": self.past_failure_capped, "looked_past_tokens": self.looked_past}


def _ranked(model, seq, gpus, profile, policy, framework, allocator="caching", fixed=None, *,
            fits_only: bool = False) -> list[Candidate] | str:
    """The length's candidates; where every one that fits on paper runs out of reserved memory in the
    caching allocator's replay, the optimizer-on-the-host ones as well (the what-if adds them only
    where nothing fits on paper), unless ``fixed`` decides the optimizer's place. ``fits_only``: asked only
    whether some candidate fits (`_fits`), and for every candidate where none does: where a single-stage candidate
    fits (`_single_stage_witness`), that one alone, without pricing the micro-batch pipelines."""
    fixed = fixed or {}
    if fits_only and (witness := _single_stage_witness(model, seq, gpus, profile, policy, framework, allocator,
                                                       fixed)) is not None:
        return [witness]
    try:
        cands = candidates_for(model, seq, gpus, profile, policies=(policy,), framework=framework,
                               allocator=allocator, **fixed).candidates
    except NothingFits:  # no layout's model states fit: an answer (`max_seq`), not a refusal
        raise
    except MemoError as e:
        return str(e)
    if "optimizer_offload" in fixed or _fits(cands) or not any(c.status == "OK" for c in cands) \
            or any(c.layout.optimizer_offload for c in cands):
        return cands
    try:
        return cands + candidates_for(model, seq, gpus, profile, policies=(policy,), framework=framework,
                                      allocator=allocator, optimizer_offload=True, **fixed).candidates
    except MemoError:  # the framework keeps the optimizer on the GPU, or no such layout
        return cands


SINGLE_STAGE_FIRST = True  # `_single_stage_witness` on (the tests turn it off to compare with the whole ranking)


def _single_stage_witness(model, seq, gpus, profile, policy, framework, allocator, fixed: dict) -> Candidate | None:
    """A single-stage candidate that fits ``seq`` tokens (on paper and in the caching allocator's replay), priced
    without the micro-batch pipelines (``pp`` 1: 20-30% of the whole ranking's time at 64 GPUs), or None where none
    does (or ``fixed`` fixes ``pp``, or the pp-1 search is refused): then `_ranked` prices everything. Where one
    fits, ``_fits(_ranked(...))`` is true, so the witness decides a probe as the whole ranking would:
    `candidates_for` prices the single-stage layouts by the same code with ``pp`` None or 1, so a witness with the
    optimizer on the GPU is among the whole ranking's candidates, priced the same, and fits there; one with the
    optimizer on the host was added because no single-stage layout fits on paper with it on the GPU, and in the
    whole ranking either nothing fits on paper either (then the same host-optimizer layouts are added, the witness
    among them), or a pipeline (or SPPO) candidate fits on paper, which the replay does not decide (`_replayed`),
    so it fits. `tests/test_maxseq_speed.py` compares every probe with the whole ranking's answer."""
    if not SINGLE_STAGE_FIRST or "pp" in fixed:
        return None
    try:
        cands = candidates_for(model, seq, gpus, profile, policies=(policy,), framework=framework,
                               allocator=allocator, pp=1, **fixed).candidates
    except MemoError:  # NothingFits too: the whole ranking says why
        return None
    ok = sorted((c for c in cands if c.status == "OK" and c.schedule == "single_stage"),
                key=lambda c: c.memory.peak_gpu_bytes)
    return next((c for c in ok if _replay_oom(c) is None), None)


def _replayed(c: Candidate) -> bool:
    """Whether the caching allocator's replay decides the candidate's fit: the replay covers its schedule (one
    stage; pipelines and SPPO are priced on paper only). A static memory plan's too (`uses_memory_plan`): memo-exec
    allocates the plan's arena and puts everything else on the caching allocator, which the replay replays
    (`memo_sim.memplan.iteration_replay.engine_replay`; a review: MEMO tp1-cp8-z3 on gpt-7b answered 1344K, whose
    replay ran out of memory)."""
    return c.schedule == "single_stage"


def _replay_oom(c: Candidate):
    """The caching allocator's out-of-memory event for a candidate (None: it fits, or its schedule is one the replay
    does not cover: `_replayed`); the engine's own replay (`engine_replay`), memoised."""
    if not _replayed(c):
        return None
    r = engine_replay(c.model, c.layout, c.micro_batch or c.batch, c.seq, c.policy, c.profile)
    return r.oom_event if r is not None and r.oom else None


def _fits(cands) -> bool:
    """Some candidate fits: analytically, and under the caching allocator's replay where it runs on it."""
    if isinstance(cands, str):
        return False
    ok = sorted((c for c in cands if c.status == "OK"), key=lambda c: c.memory.peak_gpu_bytes)
    return any(_replay_oom(c) is None for c in ok)


def _allocated_peak(c: Candidate) -> float:
    """The candidate's analytic peak with a layer's transients counted as live at once (as a static
    memory plan places them) instead of as the caching allocator reserves them."""
    return c.memory.peak_with(c.memory.transient_planned_bytes)


def _lumped_words(m) -> str:
    """What the analytic peak that decides a caching-allocator candidate's fit (`MemoryBreakdown.peak_gpu_bytes`)
    lumps, and why it is not the whole-iteration replay's reserved peak: a layer's transients as the allocator
    reserves one layer's requests alone, and under a whole-layer recompute the re-run tensors as one buffer held
    through the backward, as the policy's executor allocates them (memo_exec/activations/base.py
    RECOMPUTE_BUFFER_DIFFERS), where the replay frees each after its last use as autograd does, and reserves less.
    A review: maxseq called this lumped sum "reserved memory", which explain then put above the replay's."""
    words = (f"the terms' peak, which decides fit: a layer's transients as the caching allocator reserves one "
             f"layer's requests alone ({fmt_bytes(m.transient_caching_allocator_bytes)})")
    if m.backward_buffer_bytes:
        words += (f" beside the recompute buffer ({fmt_bytes(m.backward_buffer_bytes)}: the policy's executor keeps "
                  f"a layer's re-run tensors in one buffer through its backward, where the replay of the whole "
                  f"iteration frees each after its last use and reserves less)")
    return words


def _expandable_words(c: Candidate) -> str:
    """Where the caching allocator's reserved memory binds and its cache is not mapped in place: PyTorch's own fix."""
    return ("" if c.layout.expandable_segments else f"; {EXPANDABLE_FLAG} maps the cache in place (the same "
            "command with it prices that)")


def binding_constraint(cands: list[Candidate] | str) -> str:
    """What stops the least-over candidate, in words."""
    if isinstance(cands, str):
        return cands
    ok = sorted((c for c in cands if c.status == "OK"), key=lambda c: c.memory.peak_gpu_bytes)
    if ok:  # every one fits on paper; the least-memory one's replay ran out of reserved memory
        c = ok[0]
        e = _replay_oom(c)
        if e is not None:
            who = (fragmentation_words(c.model, c.layout, c.policy) if uses_memory_plan(c.policy, c.layout)
                   else "caching allocator")
            return (f"reserved memory ({who}): a {fmt_bytes(e.requested_bytes)} request found "
                    f"{fmt_bytes(e.reserved_bytes)} reserved, {fmt_bytes(e.allocated_bytes)} allocated and "
                    f"{fmt_bytes(e.available_bytes)} left after freeing the cache "
                    f"({c.layout.label()} {c.policy.label()}; fits on paper at {fmt_bytes(c.memory.peak_gpu_bytes)})"
                    + _expandable_words(c))
    on_reserved = [c for c in cands if c.status == "OOM" and not uses_memory_plan(c.policy, c.layout)
                   and _allocated_peak(c) <= c.memory.gpu_capacity_bytes and not _host_over(c)]
    if on_reserved:  # fits as allocated bytes, not as the caching allocator reserves them
        c = min(on_reserved, key=_allocated_peak)
        m, allocated = c.memory, _allocated_peak(c)
        return (f"GPU memory on the caching allocator's terms: {fmt_bytes(m.peak_gpu_bytes)} of "
                f"{fmt_bytes(m.gpu_capacity_bytes)}, {_lumped_words(m)}; {fmt_bytes(m.transient_planned_bytes)} "
                f"of a layer's transients are live at once, and allocated so the step would take "
                f"{fmt_bytes(allocated)} and fit, as on a static memory plan ({c.layout.label()} "
                f"{c.policy.label()})" + _expandable_words(c))
    # the least over as the what-if ranks its closest (`Candidate.over_share`): the GPU's and the pinned host's
    # overflows, each a share of its capacity, added (a GPU-OOM candidate may be far over the host too)
    c = min(cands, key=lambda c: c.over_share)
    m = c.memory
    if c.status == "OOHM":
        host = need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, need_what="per node")
        return f"pinned host memory: {host} ({c.layout.label()} {c.policy.label()})"
    terms = memory_term_words(m)  # named as the what-if names them
    big = sorted(terms.items(), key=lambda kv: -kv[1])[:2]
    host_words = need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, need_what="per node")
    host = f"; pinned host memory too: {host_words}" if _host_over(c) else ""
    return (f"GPU memory: {need_of_capacity(m.peak_gpu_bytes, m.gpu_capacity_bytes)} "
            f"({c.layout.label()} {c.policy.label()}; largest: "
            + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in big) + ")" + host)


def _host_over(c: Candidate) -> bool:
    """Whether the candidate's pinned host memory exceeds its nodes' (a GPU-OOM candidate's status hides it)."""
    m = c.memory
    return m.host_bytes_per_node > m.host_capacity_bytes


def max_seq(model: ModelConfig, gpus: int, profile: HardwareProfile, policy: str, *, step: int = 128 * 1024,
            framework: str = "any", simulate: bool = True, allocator: str = "caching",
            fixed: dict | None = None) -> MaxSeqAnswer:
    """The longest multiple of ``step`` tokens ``policy`` trains on ``gpus`` GPUs (module docs), with what binds at the
    first length that fails; where that length limits the sequence split, the binding says so and what the search fits
    instead (`split_binding`). Where ``gpus`` has a factor ``step`` does not divide (72 GPUs at 128K: 9), the multiples
    of `memo_sim.search.split_lengths.split_step` are searched (the answer's ``step``): fit is monotone only along
    lengths the GPUs split over, and a length that keeps a factor out of every split fails short of longer lengths that
    fit (a review: 1.5M answered, 1.625M failed, 9216K fits on 72 GPUs)."""
    from memo_sim.search.split_lengths import split_step

    ans = _max_seq(model, gpus, profile, policy, step=split_step(step, gpus), framework=framework,
                   simulate=simulate, allocator=allocator, fixed=fixed)
    return split_binding(ans, model, gpus, profile, framework, dict(fixed or {}))


def split_binding(ans: MaxSeqAnswer, model, gpus: int, profile, framework: str, fixed: dict) -> MaxSeqAnswer:
    """``ans`` with its binding words extended where its first failing length limits the sequence split
    (`memo_sim.search.split_lengths.split_factor`: the GPU count has a factor the length does not divide, which every
    layout keeps in data parallelism): why, and the changes the search fits (`split_lengths.split_fixes`): the
    failing length on fewer GPUs it splits over, or the longest multiple of the GPU count x 1K past the answer that
    fits (--step of that unit finds it). A review: a full GB200 NVL72 rack answered 768K for full_recompute while
    1008K fits there and 64 GPUs fit 4.625M; the binding named GPU memory only."""
    from memo_sim.search.split_lengths import SPLIT_UNIT, split_factor, split_fixes, split_limit_words

    seq = ans.next_seq
    if ans.states_alone or split_factor(seq, gpus) <= 1:
        return ans

    def fits(n: int, g: int) -> str | None:
        return _fitting_label(model, n, g, profile, ans.policy, framework, ans.allocator, fixed)

    unit = gpus * SPLIT_UNIT
    longest, capped = _longest_multiple(unit, (ans.max_seq or 0) // unit + 1, lambda n: fits(n, gpus) is not None)
    fixes = split_fixes(seq, gpus, fits, lengths=[longest] if longest else [])
    more = " (or longer: the search stops there)" if capped else ""
    named = [f"--gpus {g} ({fmt_count(n)} fits there: {label})" if kind == "gpus" else
             f"--step {fmt_count(unit)} (lengths the {gpus} GPUs split over: {fmt_count(n)} fits{more}: {label})"
             for kind, n, g, label in fixes]
    words = f"; {split_limit_words(seq, gpus)}" + (f"; it fits with {' or '.join(named)}" if named else "")
    return replace(ans, binding=ans.binding + words)


SPLIT_MAX_STEPS = 64  # multiples of the split unit `split_binding` looks at, at most (the cap is tested itself)


def _longest_multiple(unit: int, k: int, fits) -> tuple[int | None, bool]:
    """(the longest multiple of ``unit`` from ``k`` units on that ``fits(tokens)``, whether the search stopped at
    its cap), by doubling then bisecting as `max_seq` does, between a length that fits and one that failed, both
    tested: doubling past `SPLIT_MAX_STEPS` units tests the cap instead, and where the cap (or ``k``, when above
    it) fits, that is the answer, capped (a review: 44 units fit, 88 > 64 was never tested and was bisected
    as failing, while 88 fits). Where ``k`` units do not fit: (None, False)."""
    if not fits(k * unit):
        return None, False
    lo = k
    while True:
        hi = min(2 * lo, max(SPLIT_MAX_STEPS, k))
        if hi <= lo:  # the cap fits: untested lengths above it are not called failing
            return lo * unit, True
        if not fits(hi * unit):
            break
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * unit) else (lo, mid)
    return lo * unit, False


def _fitting_label(model, seq, gpus, profile, policy, framework, allocator, fixed) -> str | None:
    """The best plan that fits ``seq`` tokens on ``gpus`` GPUs as `max_seq` checks a length (`_fits`: analytic,
    and the caching allocator's replay), in words; None where none fits or no layout is valid."""
    try:
        cands = _ranked(model, seq, gpus, profile, policy, framework, allocator, fixed)
    except MemoError:  # NothingFits too
        return None
    if isinstance(cands, str):
        return None
    ok = [c for c in cands if c.status == "OK" and _replay_oom(c) is None]
    if not ok:
        return None
    b = max(ok, key=lambda c: c.tgs)
    return f"{b.layout.label()} {b.policy.label()}, {b.tgs:,.0f} tokens/GPU/s analytic, checked by the search"


def _max_seq(model: ModelConfig, gpus: int, profile: HardwareProfile, policy: str, *, step: int = 128 * 1024,
             framework: str = "any", simulate: bool = True, allocator: str = "caching",
             fixed: dict | None = None) -> MaxSeqAnswer:
    """The longest multiple of ``step`` tokens ``policy`` trains on ``gpus`` GPUs (module docs).
    ``fixed``: what the search may not choose, as `memo_sim.search.whatif.candidates_for`'s keyword
    arguments (``tp``, ``cp``, ``ulysses``, ``dp``, ``zero``, ``sp``, ``tp_mode``, ``pp``,
    ``optimizer_offload``, ...): the longest sequence of one layout, as a published run fixes it."""
    fixed = dict(fixed or {})
    for k in ("policies", "framework", "allocator"):
        if k in fixed:
            raise MemoError(f"max_seq: {k} is an argument of its own, not a fixed degree")
    if step < 1:
        raise MemoError("--step must be at least 1 token")
    if allocator not in ("caching", "plan"):
        raise MemoError(f"--allocator must be caching or plan for one answer, got {allocator!r}")
    hi = 1
    try:
        cands = _ranked(model, step, gpus, profile, policy, framework, allocator, fixed, fits_only=True)
    except NothingFits as e:  # every layout's model states alone overflow: no length fits (exit 3, as the what-if)
        return MaxSeqAnswer(policy, step, None, None, step, str(e).split(": ", 1)[-1], allocator, True)
    if isinstance(cands, str):  # no candidate at all, not one out of memory: the request itself (a policy the
        # framework lacks, degrees that no layout of the GPUs matches) is refused; a length the split does not
        # take is maxseq's first step, its --step (a review: the what-if's '--seq N divides' named a flag it lacks)
        raise MemoError(seq_fix_names(cands, "--step"))
    if not _fits(cands):
        alone = all(c.memory.model_states_bytes > c.memory.gpu_capacity_bytes for c in cands)
        return MaxSeqAnswer(policy, step, None, None, step, binding_constraint(cands), allocator, alone)
    lo = 1
    while True:  # double until a length does not fit
        hi = lo * 2
        if hi > MAX_STEPS:
            raise MemoError(f"{policy} still fits at {MAX_STEPS} steps of {fmt_count(step)} tokens "
                            f"({fmt_count(MAX_STEPS * step)}); use a larger --step")
        cands = _ranked(model, hi * step, gpus, profile, policy, framework, allocator, fixed, fits_only=True)
        if not _fits(cands):  # every candidate: what binds there, where this is the first failing length
            break
        lo = hi
    fail = cands
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = _ranked(model, mid * step, gpus, profile, policy, framework, allocator, fixed, fits_only=True)
        if _fits(c):
            lo = mid
        else:
            hi, fail = mid, c
    def fits_at(k: int) -> bool:
        try:
            return _fits(_ranked(model, k * step, gpus, profile, policy, framework, allocator, fixed, fits_only=True))
        except MemoError:  # NothingFits: not at this length either
            return False

    # the replay decides on a memory plan's candidates too (`_replayed`), so --allocator plan scans as well
    past = _past_failure(hi, fits_at) if _replay_failed(fail) else None
    ans = _simulated_answer(model, gpus, profile, policy, step, framework, simulate, allocator, fixed, lo, hi, fail)
    if past is None:
        return ans
    return replace(ans, fits_past_failure=tuple(k * step for k in past[0]), looked_past_failure_to=past[1] * step,
                   past_failure_capped=past[2], looked_past=hi * step)


def _replay_failed(cands) -> bool:
    """Whether the first failing length failed in the caching allocator's replay: some candidate there fits on
    paper and the replay decides its fit (`_replayed`; `_fits` replays only those). Only then can a longer length
    fit: on paper fit is monotone in the length (`tests/test_fit_monotone.py`), so where every candidate failed on
    paper (or only pipelines and SPPO, which are not replayed, fit there), nothing past the failure is scanned, and
    the words about the replay are not printed (a review: a pipeline's full_recompute printed "the caching
    allocator's replay is not monotone"). A static memory plan's single-stage candidates are replayed too."""
    return not isinstance(cands, str) and any(isinstance(c, Candidate) and c.status == "OK" and _replayed(c)
                                              for c in cands)


PAST_FAILURE_STEPS = 4  # failing grid lengths in a row above the longest fit that end the scan (at most +25% of it)
PAST_FAILURE_MAX_STEPS = 64  # grid lengths looked at past the first failure, at most: one ranking (and replays) each


def _past_failure(hi: int, fits) -> tuple[list[int], int, bool]:
    """(the steps past the first failing one, ``hi`` steps, that ``fits(steps)``, the last step looked at, whether
    the scan stopped at its cap). Steps are tried one by one from ``hi + 1``; the scan ends after `_look_ahead`
    failing steps in a row above the longest fit so far (``hi`` before any fits): `PAST_FAILURE_STEPS`, or +25% of
    that length where fewer (at least one), so a fit found past the failure restarts the look-ahead from there. It
    stops at `PAST_FAILURE_MAX_STEPS` steps past ``hi`` (or `MAX_STEPS`) at most: the cost bound, said with the
    answer (`past_failure_words`). Fitting is monotone in the length on paper and on a static memory plan
    (`tests/test_fit_monotone.py`), not in the caching allocator's replay, whose segments fall differently at each
    length (reviews: full_recompute tp4 cp2 on 8 A800s fails the replay at 512K, fits at 544K and 640K, and the
    bisection answered 480K; checkpoint_offload cp8 z3 on 8 H100s fails at 1728K, fits at 1824K-2016K, and a scan
    that ended 4 steps past the failure, at 1856K, reported 1856K)."""
    found: list[int] = []
    top, k = hi, hi  # top: the longest fit so far (hi before one); k: the last step looked at
    cap = min(hi + PAST_FAILURE_MAX_STEPS, MAX_STEPS)
    while k < top + _look_ahead(top):
        if k >= cap:
            return found, k, True
        k += 1
        if fits(k):
            found.append(k)
            top = k
    return found, k, False


def _look_ahead(k: int) -> int:
    """How many failing steps in a row above ``k`` steps end `_past_failure`'s scan: `PAST_FAILURE_STEPS`, or a
    quarter of ``k`` where fewer, at least one."""
    return max(1, min(PAST_FAILURE_STEPS, k // 4))


def past_failure_words(ans: MaxSeqAnswer) -> str:
    """What `_past_failure` looked at past the first failing length and what fit there, in words ("" where it did
    not look): the grid lengths that fit, the range scanned and why the scan stopped (`PAST_FAILURE_STEPS`
    failing lengths in a row above the longest fit, or its cap, past which a longer length may still fit)."""
    to = ans.looked_past_failure_to
    if to is None:
        return ""
    after = ans.looked_past or ans.next_seq
    start = after + ans.step
    scanned = (f"looked at every {fmt_count(ans.step)} from {fmt_count(start)} up to {fmt_count(to)}"
               if to > start else f"looked at {fmt_count(to)}")
    if ans.past_failure_capped:
        why = (f"the scan stops at {PAST_FAILURE_MAX_STEPS} lengths past the failure, so a longer length may still "
               f"fit")
    else:
        top = max(ans.fits_past_failure, default=after)
        n = (to - top) // ans.step
        why = f"the scan stops after {n} failing length{'s' if n != 1 else ''} in a row above {fmt_count(top)}"
    monotone = ("the caching allocator's replay is not monotone in the length: its segments fall differently at "
                "each length")
    if ans.fits_past_failure:
        return (f"longer lengths fit past a failure: {', '.join(fmt_count(n) for n in ans.fits_past_failure)} "
                f"(analytic and the caching allocator's replay, not simulated; {monotone}; {scanned}; {why})")
    return f"no longer length fits past the failure ({monotone}; {scanned}; {why})"


def _simulated_answer(model, gpus, profile, policy, step, framework, simulate, allocator, fixed, lo: int, hi: int,
                      fail) -> MaxSeqAnswer:
    """`_max_seq`'s answer from its bisection (``lo`` steps fit, ``hi`` steps fail with the candidates ``fail``):
    ``lo`` where the event simulator runs its best plan (or ``simulate`` is off), else the longest length it runs."""
    if not simulate:
        return MaxSeqAnswer(policy, step, lo * step, None, hi * step, binding_constraint(fail), allocator)
    # the longest length whose best plan the event simulator also runs (its own allocator and schedule can run
    # out of memory where the replay fits): checked at lo; where it fails there, steps down 1, 2, 4, ... lengths
    # to one it runs and bisects back up, O(log) rankings as above
    check = lambda k: _simulated_best(model, k * step, gpus, profile, policy, framework, allocator, fixed)  # noqa: E731
    best, failed = check(lo)
    if best is not None:
        return MaxSeqAnswer(policy, step, lo * step, best, hi * step, binding_constraint(fail), allocator)
    top, top_failed, d, good = lo, failed, 1, None  # top: the shortest length known to fail in the simulator
    while good is None and top > 1:
        k = max(1, lo - d)
        b, f = check(k)
        if b is not None:
            good = (k, b)
        else:
            top, top_failed = k, f
        d *= 2
    if good is None:
        return MaxSeqAnswer(policy, step, None, None, step, _simulated_words(top_failed), allocator)
    while top - good[0] > 1:
        mid = (top + good[0]) // 2
        b, f = check(mid)
        if b is not None:
            good = (mid, b)
        else:
            top, top_failed = mid, f
    return MaxSeqAnswer(policy, step, good[0] * step, good[1], top * step, _simulated_words(top_failed), allocator)


def _simulated_words(failed) -> str:
    """What stopped a length in the event simulator (or the what-if's refusal of it), in words."""
    if isinstance(failed, str):
        return failed
    return f"{binding_words(failed)} ({failed.layout.label()} {failed.policy.label()})"


def _simulated_best(model, seq, gpus, profile, policy, framework, allocator, fixed) -> tuple:
    """(the best plan at ``seq`` that the event simulator runs, None), or (None, what stopped it: the first
    plan it simulated out of memory, or the what-if's one-line refusal of the length). The what-if's
    proved-bound tier decides which plans to simulate, so a simulated failure of the analytic best passes
    to the next; with the optimizer on the GPU first and, where none of those runs and ``fixed`` leaves its
    place open, on the host (`_ranked` adds those where nothing fits on paper)."""
    places = [{}] if "optimizer_offload" in fixed else [{"optimizer_offload": False}, {"optimizer_offload": True}]
    failed = None
    for offload in places:
        try:
            res = rank(model, seq, gpus, profile, simulate_top="bound", policies=(policy,), framework=framework,
                       allocator=allocator, **fixed, **offload)
        except MemoError as e:  # no such layout at this length (a split the sequence does not take), or none
            failed = failed or str(e)  # with the optimizer on the host in this framework
            continue
        best = res.best
        if best is not None and best.simulated:
            return best, None
        sim_failed = [c for c in res.candidates if c.simulated and c.status != "OK"]
        if sim_failed and (failed is None or isinstance(failed, str)):
            failed = sim_failed[0]
    return None, failed or f"no plan at {seq} tokens runs in the event simulator"


MAXSEQ_DEGREES = ("tp", "cp", "ulysses", "dp", "zero", "sp", "pp", "optimizer_offload", "ep", "etp")


def maxseq_fixed(tp_mode: str | None, moe_dispatcher: str = "alltoall", moe_balance: str = "dropless",
                 alloc_conf: str | None = None, kernel_fusion: str | None = None, attention: str | None = None,
                 grad_overlap: bool | None = None, **degrees) -> dict:
    """`candidates_for`'s fixed keywords of a maxseq question (the command's and `memo_sim.api.max_seq`'s): the
    `MAXSEQ_DEGREES` given (None: searched), the MoE dispatcher and balance where not the defaults, the tensor-parallel
    flavours asked for (`tp_flavours_asked`), the allocator configuration and the launch settings (kernel fusion,
    attention kernel, gradient overlap: `memo_sim.search.whatif.launch_overrides`) where given."""
    unknown = sorted(set(degrees) - set(MAXSEQ_DEGREES))
    if unknown:
        raise MemoError(f"maxseq_fixed: {', '.join(unknown)} not a maxseq option; give {', '.join(MAXSEQ_DEGREES)}")
    fixed = {k: v for k, v in degrees.items() if v is not None}
    if moe_dispatcher != "alltoall":
        fixed["moe_dispatcher"] = moe_dispatcher
    if moe_balance != "dropless":
        fixed["moe_balance"] = moe_balance
    fixed["tp_mode"] = tp_flavours_asked(tp_mode, degrees.get("tp"))
    if alloc_conf is not None:
        fixed["alloc_conf"] = alloc_conf
    for k, v in (("kernel_fusion", kernel_fusion), ("attention", attention), ("grad_overlap", grad_overlap)):
        if v is not None:
            fixed[k] = v
    return fixed


def maxseq_runs_asked(model: ModelConfig, framework: str, policies: tuple[str, ...], allocator: str) \
        -> list[tuple[str, str]]:
    """The (policy, allocator) runs of a maxseq question: ``policies``, or the framework's that price ``model``
    but SPPO (its pipeline search at every probed length: asked for by name); ``allocator`` ``both`` answers each
    on the caching allocator and on a static memory plan, MEMO once (its own plan)."""
    pols = tuple(policies) or tuple(p for p in get_framework(framework).policies
                                    if not schedule_runs_policy("sppo", p) and prices_model(p, model))
    return [(p, al) for p in pols for al in (("caching", "plan") if allocator == "both" else (allocator,))
            if al == "caching" or allocator != "both" or not policy_class(p).takes_alpha]


def max_seq_runs(model: ModelConfig, gpus: int, profile: HardwareProfile, runs: list[tuple[str, str]], *,
                 step: int, framework: str = "any", fixed: dict | None = None, jobs: int = 1,
                 done=lambda: None) -> list[MaxSeqAnswer]:
    """`max_seq` for every (policy, allocator) of ``runs``, in that order. ``jobs`` > 1 answers them in a
    pool of that many forked processes (one run each: the runs share nothing), where the platform forks;
    the answers are the serial ones, and the first refused run's error is raised, as serially
    (`memo_sim.search.seq_sweep.in_order`). ``done()`` is called as each run finishes (a progress bar's tick)."""
    return in_order([partial(max_seq, model, gpus, profile, p, step=step, framework=framework, allocator=al,
                             fixed=fixed) for p, al in runs], jobs, done)
