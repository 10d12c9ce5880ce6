"""The what-if's answer as text: a one-line verdict, then one ranked table; with ``--details`` the
tier tables, METP against Megatron TP+SP and the SPPO planner's table as well.

Every peak comes from `memo_sim.report.peaks.candidate_peak` (simulated where tier 2 ran the
candidate, else analytic) and names its source, so a configuration reads the same number in
every table of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memo_sim.report.formats import Answer, fmt_params, plural
from memo_sim.model.config import modules_words
from memo_sim.report.peaks import CACHING_ALLOCATOR, MEASURED_RESERVED_ERROR, MEASURED_RESERVED_RANGE, candidate_peak
from memo_sim.report.table import status_text
from memo_sim.search.candidate import deciding_gpu_peak
from memo_sim.units import fmt_bytes, fmt_count, fmt_time


@dataclass
class WhatIfView:
    """What the what-if found, as the answer needs it."""

    model: object
    seq: int
    gpus: int
    profile: object
    result: object  # memo_sim.search.whatif.WhatIfResult
    shown: list  # candidates after folding duplicates, best first
    best: object | None
    batch_words: str
    elapsed_s: float
    top: int = 15
    details: bool = False
    plan_path: object = None
    sppo_plan_path: object = None
    no_plan: bool = False
    metp_rows: list = field(default_factory=list)
    advice: list = field(default_factory=list)
    fixes: list = field(default_factory=list)  # what would make the asked configuration fit
    sensitivity: str = ""
    framework: str = "any"
    memo_best: object = None
    plain_recipe: str = ""  # the model-state recipe a what-if without --framework prices (its name)
    train_lines: list = field(default_factory=list)
    bf16_best: object = None  # an FP8 what-if: the same search's best without FP8 GEMMs (`WhatifAnswer.bf16_best`)
    bf16_searched: bool = False
    memo_on_framework: dict | None = None  # `WhatifAnswer.memo_on_framework`
    global_batch_fixed: bool = False  # --global-batch given: every row trains the same sequences a step
    split_line: str = ""  # a fixed pipeline split against the search's own (`memo_sim.search.request.split_words`)
    expandable: dict | None = None  # a faster plan that fits with expandable segments (`fit_advice.expandable_faster`)
    eager: dict | None = None  # what eager kernels cost the best plan (`fit_advice.eager_kernels_cost`)
    split_advice: str | None = None  # nothing fits and the length limits the split: why, and what fits (`split_line`)
    compared: bool = True  # False: --no-compare, the searches the answer is compared with not run


def mfu_words(mfu: float, model, profile=None) -> str:
    """``MFU 77.6%``, and where the layer GEMMs run in another format than bf16 (FP8, FP4), whose peak MFU is not
    counted against, ``MFU 77.6% (of the bf16 peak)``: the model FLOPs over the model dtype's peak
    (`memo_sim.engine.result.rates`); with ``profile``, an MFU above 100% says why. The one place the what-if,
    explain, simulate, sweep-seq, check-plan and maxseq say an MFU (a review: check-plan, simulate and sweep-seq
    printed an FP8 plan's "MFU 77.6%" bare)."""
    over = ""  # above 100%: the GEMMs' format runs faster than the dtype's peak MFU is counted against
    if mfu_peak_words(model) and profile is not None and model.gemm.peak in profile.gpu.peak_flops:
        gemm_peak, dtype_peak = profile.peak(model.gemm.peak), profile.peak(model.dtype)
        if mfu > 1.0:
            over = (f": above 100% because the layer GEMMs run in {model.gemm_format}, whose peak is "
                    f"{gemm_peak / dtype_peak:.0f}x the {model.dtype} one")
        elif gemm_peak != dtype_peak:  # the same FLOPs against the GEMMs' own peak (an audit: "72.5%" read as a
            over = f"; {100 * mfu * dtype_peak / gemm_peak:.1f}% of the {model.gemm.peak} peak"  # bf16 MFU alone)
    return f"MFU {100 * mfu:.1f}%" + mfu_peak_words(model, over)


def mfu_peak_words(model, over: str = "") -> str:
    """`` (of the bf16 peak)`` where the layer GEMMs run in another format than bf16, else "" (`mfu_words`; a
    table's MFU column says it once above it)."""
    return f" (of the {model.dtype} peak{over})" if model.gemm_format != "bf16" else ""


def mfu_head(rows) -> str:
    """A ranked table's MFU column head: ``MFU (bf16 peak)`` where its rows' layer GEMMs run in another format
    (`mfu_peak_words`; a review read an NVFP4 table's 91% bare, its answer line alone saying which peak)."""
    return f"MFU ({rows[0][1].model.dtype} peak)" if rows and mfu_peak_words(rows[0][1].model) else "MFU"


def verdict(v: WhatIfView) -> str:
    """The answer in one line: the best plan and why it is where it is, or why nothing fits."""
    from memo_sim.search.whatif import binding_words

    b = v.best
    if b is None:
        first = v.shown[0] if v.shown else None
        if first is None:
            return f"answer: nothing to rank for {fmt_count(v.seq)} tokens on {v.gpus} GPUs (exit status 3)"
        asked = f"{first.layout.label()} {first.policy.label()}"
        words = (f"answer: nothing fits (exit status 3, no plan.json); the closest, {asked}, does not fit: "
                 f"{binding_words(first)}")
        if v.fixes:
            words += "; it would fit with " + " or ".join(v.fixes)
        split = split_line(v)
        return words + (f"; {split}" if split else "")
    p = candidate_peak(b)
    tier = "simulated" if b.simulated is not None else "analytic"
    it = b.simulated["iteration_s"] if b.simulated else b.estimate.iteration_s
    mfu = b.simulated["mfu"] if b.simulated else b.estimate.mfu
    it_words = f"{fmt_time(it)}/iteration ({tier}), " if it else ""
    mfu_part = mfu_words(mfu, v.model, v.profile) + ", " if mfu is not None else ""
    m = b.memory
    pinned = b.host_bytes_per_node
    used, hosts = v.profile.hosts_taken(min(b.layout.gpus, v.profile.node_gpus))
    per = f"per node ({used} hosts)" if used > 1 else "per node"  # GB200 NVL72: a node of 18 hosts of 4 GPUs
    host = (f", pinned host {fmt_bytes(pinned)} ({tier}) of {fmt_bytes(m.host_capacity_bytes)} {per}"
            if pinned > 0 else "")
    reserved = ((b.simulated or {}).get("allocator") or {}).get("peak_reserved_bytes") or 0
    if reserved > 1.005 * p.bytes:  # the caching allocator's replay: what torch.cuda.max_memory_reserved() shows
        host = (f" (PyTorch's reserved peak {fmt_bytes(reserved)} (simulated, caching allocator replay), "
                f"{100 * reserved / m.gpu_capacity_bytes:.0f}% of it, cache included: memo-sim explain)" + host)
    return (f"answer: {b.layout.label()} {b.policy.label()} fits: {it_words}{mfu_part}"
            f"{b.tgs:,.0f} tokens/GPU/s, peak GPU {p.text()} of {fmt_bytes(m.gpu_capacity_bytes)}{host}, "
            f"{plural(b.global_batch, 'sequence')} a step" + (f" -> {v.plan_path}" if v.plan_path else ""))


SEARCHED_DEGREES = ("tp", "cp", "ulysses", "dp", "zero", "pp")  # degrees a check keeps where every layout shared one


def _kept_degrees(v: WhatIfView) -> dict:
    """The degrees every layout the what-if looked at (ranked and rejected) shares: the ones the request fixed
    (`memo_sim.layout.parallel.enumerate_layouts` tries every divisor of the GPUs for a degree left open), kept
    when the search checks a change (`split_line`), so it checks the asked configuration, not another."""
    lays = [c.layout for c in v.result.candidates if c.sppo is None] + [lay for lay, _w in v.result.rejected_layouts]
    if len(lays) < 2:
        return {}
    return {k: getattr(lays[0], k) for k in SEARCHED_DEGREES if len({getattr(x, k) for x in lays}) == 1}


def _fits_with(v: WhatIfView, seq: int, gpus: int) -> str | None:
    """The best plan the what-if's search (analytic tier) fits at ``seq`` tokens on ``gpus`` GPUs, with the policies
    ranked and the degrees kept (`_kept_degrees`), in words; None where nothing fits or no layout is valid."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.search.whatif import rank  # noqa: PLC0415

    pols = tuple(sorted({c.policy.name for c in v.result.candidates}))
    kw = dict(_kept_degrees(v), policies=pols or None, framework=v.framework)
    if v.global_batch_fixed and v.shown:
        kw["global_batch"] = v.shown[0].global_batch
    try:
        b = rank(v.model, seq, gpus, v.profile, simulate_top=0, **kw).best
    except MemoError:
        return None
    return None if b is None else (f"{b.layout.label()} {b.policy.label()}, {b.tgs:,.0f} tokens/GPU/s analytic, "
                                   "checked by the search")


def split_line(v: WhatIfView) -> str:
    """Where nothing fits and the length limits the sequence-splitting degrees
    (`memo_sim.search.split_lengths.split_factor`): why, and the changes the search fits (`split_lengths.split_fixes`:
    fewer GPUs the length splits over, or a length the GPUs split over), as flags; "" otherwise (a review: a full GB200
    NVL72 rack at 1M tokens blamed GPU memory and advised --gpus 144, while 64 GPUs or 1008K tokens fit)."""
    from memo_sim.search.split_lengths import split_fixes, split_limit_words  # noqa: PLC0415

    if v.best is not None or not v.shown:
        return ""
    if v.split_advice is None:
        why = split_limit_words(v.seq, v.gpus)
        fixes = split_fixes(v.seq, v.gpus, lambda n, g: _fits_with(v, n, g)) if why else []
        named = [f"--gpus {g} ({label})" if kind == "gpus" else f"--seq {fmt_count(n)} ({label})"
                 for kind, n, g, label in fixes]
        v.split_advice = why + (f"; it fits with {' or '.join(named)}" if named else "")
    return v.split_advice


def pipeline_label_words(cands) -> str:
    """The pipeline part of the layout labels shown, in words ("" where no row has pipeline stages)."""
    lays = [c.layout for c in cands if c.layout.pp > 1]
    if not lays:
        return ""
    words = ["ppN: N stages"]
    for on, w in ((any(x.vpp > 1 for x in lays), "vM: M model chunks per GPU (interleaved 1F1B)"),
                  (any(x.first_stage_layers or x.last_stage_layers for x in lays),
                   "fA / lB: A layers in the first stage, B in the last"),
                  (any(x.account_embedding_loss for x in lays),
                   "el: the embedding and the loss each counted as a layer in the split"),
                  (any(x.chunk_layers for x in lays), "c...: each chunk's layer count")):
        if on:
            words.append(w)
    return "; pipeline labels: " + ", ".join(words)


HEADROOM = 0.05  # a best plan whose GPU peak is within this share of the usable memory is named as on its edge


def global_batch_line(v: WhatIfView) -> str:
    """Where the ranked rows train different global batches (no --global-batch: a batch per data-parallel replica),
    that the ranking compares them so and may change at the user's global batch: a pipeline's bubble shrinks with
    the micro-batches a step, which a fixed global batch gives it."""
    b = v.best
    if b is None or v.global_batch_fixed:
        return ""
    if not _gbs_varies(list(enumerate(v.shown[:v.top]))):  # one batch a replica, the same over every row shown: the
        if b.global_batch <= 1:  # step's size the user never chose is still named (a review: 405B on 16,384 GPUs
            return ""  # answered 1,024 sequences of 128K, 134M tokens a step, without a word)
        return (f"global batch not fixed: every row shown trains {b.global_batch:,} sequences "
                f"({fmt_count(b.global_batch * b.seq)} tokens) a step, a batch per data-parallel replica; give "
                f"--global-batch N (the sequences your run trains a step) to rank the layouts at yours")
    sizes = sorted({c.global_batch for c in v.shown[:v.top]})
    return (f"global batch not fixed: the rows train {sizes[0]} to {sizes[-1]} sequences a step (GBS column; a batch "
            f"per data-parallel replica, a pipeline's as many micro-batches as stages), the answer {b.global_batch}; "
            f"give --global-batch N (the sequences your run trains a step) to rank every layout at it: pipelines "
            f"amortise their bubble over more micro-batches and can win there")


def rank_order_line(v: WhatIfView) -> str:
    """Where the answer is a micro-batch pipeline whose GPUs another rank order the framework offers would place
    apart (`memo_sim.layout.rank_order.places_apart`) and the what-if tried one order: that the other was not tried
    (SPPO's pipelines are searched in the default order only)."""
    from memo_sim.layout.rank_order import MEGATRON_OPTION, places_apart  # noqa: PLC0415
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    b = v.best
    tried = (v.result.searched.get("pipeline") or {}).get("rank_orders", ())
    if b is None or b.sppo is not None or len(tried) != 1 or not places_apart(b.layout, v.profile.node_gpus):
        return ""
    others = [o for o in get_framework(v.framework).rank_orders if o not in tried]
    if not others:
        return ""
    named = ", ".join(o + (f" ({MEGATRON_OPTION[o]})" if o in MEGATRON_OPTION else "") for o in others)
    return (f"rank order: ranks numbered {tried[0]} only; this pipeline's stages and replicas sit on other nodes in "
            f"{named}: --rank-order all tries it")


def margin_line(v: WhatIfView) -> str:
    """Where the answer's predicted GPU peak is within `HEADROOM` of the usable memory: how small an error of the
    prediction turns the fit over, so a thin margin is not taken for a safe one (pinned host memory is not named:
    MEMO's alpha fills it by design, and a smaller host gives a smaller alpha, not a failure)."""
    b = v.best
    if b is None:
        return ""
    p, cap = candidate_peak(b), b.memory.gpu_capacity_bytes
    # the deciding peak: the replay's reserved one where it is the higher
    # (`memo_sim.search.candidate.deciding_gpu_peak`; a review: "96.0% ..., 4.0% higher would not fit" beside a
    # reserved peak at 98.1%)
    alloc = (b.simulated or {}).get("allocator") if p.tier == "simulated" else None
    peak, reserved = deciding_gpu_peak(p.bytes, alloc)
    if cap <= 0 or peak / cap <= 1 - HEADROOM:
        return ""
    short = 100 * (1 - peak / cap)
    err, where = MEASURED_RESERVED_ERROR
    band = (f"; memo-exec's H100 runs measured the caching allocator's reserved peak {err} above the replay's "
            f"({where}), a larger error than this margin" if p.allocator == CACHING_ALLOCATOR else "")
    what = ("PyTorch's reserved peak (the caching allocator replay's, above the simulator's own peak "
            f"{fmt_bytes(p.bytes)}: the one that decides fit)" if reserved else "the predicted GPU peak")
    return (f"on the edge: {what} is {100 * peak / cap:.1f}% of the usable memory; a peak "
            f"{short:.1f}% higher than predicted would not fit (`memo-exec run` of the plan measures it){band}"
            + (_roomier(v, cap) if band else ""))


def _roomier(v: WhatIfView, cap: float) -> str:
    """The fastest simulated plan of the ranking whose deciding peak would still fit at the measured allocator error's
    top (`MEASURED_RESERVED_RANGE`), beside an answer on the edge, or what searches for one (a review: the default
    answer at 99.9% of the GPU while the runner-up that leaves 11 GiB gave up 18.8%, said nowhere as the safer pick)."""
    top = MEASURED_RESERVED_RANGE[1]
    for rank, c in enumerate(v.shown):
        if c is v.best or c.status != "OK" or c.simulated is None:
            continue
        p = candidate_peak(c)
        peak, _ = deciding_gpu_peak(p.bytes, (c.simulated or {}).get("allocator"))
        if peak * (1 + top) <= cap:
            loss = 100 * (1 - c.tgs / v.best.tgs) if v.best.tgs else 0.0
            return (f"; the fastest simulated plan that fits a peak {100 * top:.1f}% higher: #{rank + 1} "
                    f"{c.layout.label()} {c.policy.label()}, {c.tgs:,.0f} tokens/GPU/s ({loss:.1f}% below the answer), "
                    f"peak {100 * peak / cap:.1f}% of the usable memory (--headroom {100 * top / (1 + top):.0f}% "
                    f"searches with that room)")
    return (f"; no simulated plan of the ranking fits a peak {100 * top:.1f}% higher: --headroom "
            f"{100 * top / (1 + top):.0f}% searches with that room")


def mfu_line(v: WhatIfView) -> str:
    """An MFU above 100%: MISSION's model FLOPs count 6·s·P over every parameter, the input embedding's lookup too,
    which a model whose vocabulary dominates its parameters turns into more FLOPs than its kernels run."""
    b = v.best
    mfu = None if b is None else (b.simulated["mfu"] if b.simulated else b.estimate.mfu)
    if mfu is None or mfu <= 1:
        return ""
    share = v.model.vocab * v.model.hidden / v.model.active_params()
    return (f"MFU above 100%: the model FLOPs (6·s·P + 6·n·h·s², the MISSION's formula) count every parameter's 6·s, "
            f"the input embedding's too ({100 * share:.0f}% of the parameters a token uses here), whose lookup runs no "
            f"GEMM; compare plans by tokens/GPU/s")


def kernel_line(v: WhatIfView) -> str:
    """The attention kernel memo's own plan was priced on, the one memo-exec runs such attention on: cuDNN's fused
    attention where the profile prices it on its own curves (Hopper), FlashAttention-2 elsewhere, and FlashAttention-2
    for the attention it runs as blocks (ring CP, full METP; framework ``any``'s data)."""
    b = v.best
    if v.framework != "any" or b is None or b.sppo is not None or v.model.dtype not in ("bf16", "fp16"):
        return ""  # fp32 attention runs on other kernels (memory-efficient on CUDA, math on a CPU)
    blocks = b.layout.runs_blocks()
    kernel = v.profile.efficiency.priced_attention_kernel(b.layout.attention_kernel())
    words = {"cudnn": "cuDNN's fused attention", "flash": "FlashAttention-2"}.get(kernel)
    if words is None:
        return ""
    runs = ("aten's flash kernel per block" if blocks else "torch SDPA's cuDNN op" if kernel == "cudnn"
            else "flash-attn, or torch SDPA's flash kernel")
    ring = ""
    if kernel == "cudnn" and any(c.layout.runs_blocks() and c.layout.cp > 1 for c in v.shown):
        block = {"cudnn": "cuDNN's", "flash": "FlashAttention-2"}.get(
            v.profile.efficiency.priced_attention_kernel(b.layout.block_kernel), "another kernel")
        if block != "cuDNN's":  # ring rows lose to the kernel, not to the layout (a review)
            ring = (f"; ring CP's blocks are priced on {block}, the kernel memo-exec runs them on, so ring layouts "
                    "rank below what cuDNN's kernel would give them (--framework megatron prices TransformerEngine's "
                    "ring on cuDNN)")
    return (f"attention priced on {words} ({v.profile.name}'s curves{', as ring blocks' if blocks else ''}), the "
            f"kernel memo-exec runs such attention on ({runs}){ring}")


def executor_refuses(c) -> str | None:
    """Why memo-exec refuses candidate ``c`` before it runs (`memo_sim.plan.executor_scope.plan_why_not`), or None."""
    from memo_sim.plan.executor_scope import plan_why_not  # noqa: PLC0415

    return plan_why_not(c.model, c.layout, c.policy, c.schedule, c.batch, c.micro_batch or c.batch, c.seq)


def executor_line(v: WhatIfView) -> str:
    """Where memo's own answer is a plan its executor refuses (a model part it does not build, a GEMM format it
    does not run): the refusal, so the answer is not taken for a runnable plan, and where to go instead."""
    return executor_words(v.best, v.framework)


def executor_words(b, framework: str) -> str:
    """`executor_line`'s words for candidate ``b`` searched for ``framework`` ("" where memo-exec runs it or there is
    none): the what-if's and maxseq's answers say it the same way (a review: maxseq named a full_recompute plan
    memo-exec refuses without a word of it)."""
    if b is None:
        return ""
    why = executor_refuses(b)
    if not why:
        return ""
    if framework != "any":  # a framework's plan is for that framework (a review: nothing said memo-exec refuses it)
        base = framework.split("@")[0]
        to = (f"; `memo-sim export --to {base}` of its plan file writes it for {base} (the version its exporter "
              f"names)" if base in ("megatron", "torchtitan", "deepspeed") else "")
        return f"memo-exec refuses this plan ({why}){to}"
    return (f"memo-exec refuses this plan ({why}); `memo-sim export` of its plan file (--to megatron or torchtitan) "
            f"writes the nearest plan a framework runs, priced beside it")


def precision_line(v: WhatIfView) -> str:
    """An FP8 (quantised GEMM format) what-if: what the same search gives with the layer GEMMs in the model's
    dtype, so the answer says what FP8 buys (throughput, or the fit itself)."""
    if not v.bf16_searched:
        return ""
    fmt, dt, b, o = v.model.gemm_format, v.model.dtype, v.best, v.bf16_best
    if o is None:
        return (f"without {fmt} GEMMs (all in {dt}) nothing fits the same search"
                + (f": {fmt} is what makes {b.layout.label()} {b.policy.label()} fit" if b is not None else ""))
    it = (o.simulated or {}).get("iteration_s") or o.estimate.iteration_s
    tier = "simulated" if o.simulated else "analytic"
    words = (f"without {fmt} GEMMs (all in {dt}) the same search's best is {o.layout.label()} {o.policy.label()}: "
             f"{fmt_time(it)}/iteration ({tier}), {o.tgs:,.0f} tokens/GPU/s, peak GPU {candidate_peak(o).text()}")
    if b is None:
        return words + f"; with {fmt} nothing fits"
    ratio = b.tgs / o.tgs
    if slower_as_printed(ratio):  # the bf16 plan is the one to train
        return (words + f"; {fmt} is SLOWER here: {ratio:.2f}x that plan's throughput; drop {fmt} from --precision "
                f"to train it")
    return words + f"; {fmt} gives {ratio:.2f}x its throughput"


def slower_as_printed(ratio: float) -> bool:
    """A throughput ratio below 1 by at least its last printed digit (``{ratio:.2f}``): a tie as printed is no
    "slower"."""
    return round(ratio, 2) < 1.0


def trained_model(model, framework: str):
    """``model`` as ``framework`` trains it (`memo_sim.frameworks.Framework.for_model`: what it leaves out named)."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    return get_framework(framework).for_model(model)


def whatif_answer(v: WhatIfView) -> Answer:
    from memo_sim.search.whatif import binding_words

    a = Answer(verdict(v))
    m, prof = v.model, v.profile
    moe = f", {fmt_params(m.active_params())} active, {m.experts} experts top-{m.top_k}" if m.moe else ""
    # a model in another dtype than bf16 (a config.json saved in float32) says so: its answer is another training's
    dt = f", {m.dtype} training (--dtype bf16 plans bf16)" if m.dtype != "bf16" else ""
    trained = v.best.model if v.best is not None else trained_model(m, v.framework)
    mtp = f" + {fmt_params(trained.mtp_params())} of multi-token prediction" if trained.mtp_layers else ""
    a.line(f"{m.name} ({fmt_params(m.params())} params{mtp}{moe}{m.gemm_words}{dt}), {fmt_count(v.seq)} tokens x "
           f"{v.batch_words}, {v.gpus} x {prof.gpu.model} ({prof.name})")
    for note in trained.model_notes():
        a.line(f"model: {note}")
    if m.moe and v.best is not None:  # say what the loads are priced as
        bal = v.best.layout.balance
        skew = ("; a trained router's skew is not priced: --moe-balance loads:FILE takes measured per-expert counts"
                if bal.kind == "dropless" else "")
        if bal.kind == "capacity" and bal.capacity < 1:  # (a review: MFU rose as the factor fell, unexplained)
            skew = (f"; at least {1 - bal.capacity:.0%} of the routed copies are dropped and not computed, while MFU "
                    f"counts the model FLOPs of every routed copy: it rises as the factor falls")
        a.line(f"expert loads: {bal.words}{skew}")
    if (nodes := prof.partial_node_words(v.gpus)) is not None:
        a.line(f"nodes: {nodes}")
    a.line(f"profile {prof.name}: {prof.provenance_line()}")
    if v.sensitivity:
        a.line(v.sensitivity)
    a.line("searched: " + searched_words(v.result.searched))
    budget = max(0, v.top)
    rows = list(enumerate(v.shown))
    if v.details:
        _tier_tables(a, rows, budget)
    else:
        a.table(*ranked_table(rows[:budget]),
                title=f"{plural(len(rows), 'candidate')} ranked (the simulated, then the analytic; "
                      "each fitting first, by throughput)"
                      + (f", first {budget}" if budget < len(rows) else "")
                      + "; tier: sim = the event simulator (contention, copy stalls), analytic = perfect overlap "
                        "(an estimate, not a bound either way: an analytic row can show more than the best "
                        "simulated, and an offload-bound plan can simulate faster than its estimate; the proved "
                        "bound tier 2 skips a plan by is a separate figure); peak GPU by the tier and allocator "
                        "named; frag/retries: the caching allocator's reserved-but-unallocated share at the peak "
                        "(an OOM-frag row's at its failure) and its retries per iteration"
                      + plan_frag_words(c for _i, c in rows[:budget])
                      + ("; sim/allocated: the simulated allocated peak, not replayed through the caching allocator "
                         "(no reserved cache counted)" if any(candidate_peak(c).not_replayed
                                                              for _i, c in rows[:budget]) else "")
                      + ("; schedule: its name, then micro-batches x sequences per micro-batch"
                         if _split(rows[:budget]) else "")
                      + pipeline_label_words(c for _i, c in rows[:budget]))
    for label, kept, where in fold_notes(v.shown[:v.top]):
        a.line(f"  {label} moves and rebuilds the same bytes as {kept}: folded into {', '.join(where)}")
    line = metp_verdict(v.shown)
    if line:
        a.line(line + unbuilt_side_words(v.shown, v.result.searched))
    line = sppo_verdict(v.shown)
    if line:
        a.line(line)
    if v.details and v.metp_rows:
        a.table(*metp_table(v.metp_rows, v.shown),
                title="METP against Megatron TP+SP with the same degrees and policy (peaks as in the ranking; "
                      "iter analytic):")
    if v.details and v.result.sppo_summary:
        _sppo_parts(a, v.result)
    n = len(v.result.candidates)
    n_ok = sum(c.status == "OK" for c in v.result.candidates)
    n_fold = n - len(v.shown)
    folded = f", {plural(n_fold, 'duplicate')} folded" if n_fold else ""
    tier2 = v.result.tier2
    a.line(f"{plural(n, 'candidate')} ({n_ok} fit{folded}), "
           f"{plural(len(v.result.rejected_layouts), 'layout')} rejected; {v.elapsed_s:.2f} s")
    a.line(tier2.line() if tier2 is not None else f"tier 2 simulated the best {v.result.simulated}")
    if v.best is None:
        if v.shown:
            a.line(f"  closest: {v.shown[0].layout.label()} {v.shown[0].policy.label()}: {binding_words(v.shown[0])}")
        if v.fixes:
            a.line("  would fit with: " + "; ".join(v.fixes))
        if split_line(v):
            a.line(f"  {split_line(v)}")
        a.line("  not searched: " + "; ".join(v.advice))
    elif v.plan_path or v.no_plan:
        b = v.best
        a.line(f"best: {b.layout.label()} {b.policy.label()}" + (f" -> {v.plan_path}" if v.plan_path else ""))
        why = binding_words(b)
        if why:
            a.line(f"  {why}")
        up = runner_up_line(v.shown, b, tier2.mode if tier2 is not None else None)
        if up:
            a.line(f"  {up}")
        if v.expandable:
            a.line(f"  {v.expandable['words']}")
        if v.eager:
            a.line(f"  {v.eager['words']}")
        for t in v.train_lines:
            a.line(f"  {t}")
        for k in (kernel_line(v), executor_line(v), margin_line(v), mfu_line(v), global_batch_line(v),
                  rank_order_line(v)):
            if k:
                a.line(f"  {k}")
    for line in (precision_line(v), v.split_line):
        if line:
            a.line(line)
    if v.sppo_plan_path:
        c = next(c for c in v.result.candidates if c.sppo is not None and c.status == "OK")
        a.line(f"best SPPO plan: {c.layout.label()} {c.policy.label()} -> {v.sppo_plan_path}")
    if v.framework != "any" and not v.compared:
        a.line(f"memo's own best beside {v.framework}'s: not searched (--no-compare)")
    elif v.framework != "any":
        a.line(framework_line(v.framework, v.best, v.memo_best, v.plain_recipe))
        split = gap_line(v.framework, v.best, v.memo_best, v.memo_on_framework)  # tier 2 throughout
        if split:
            a.line(f"  {split}")
    return a


def gap_line(framework: str, best, memo_best, on_framework: dict | None) -> str:
    """The gap between the framework's best and memo's split in two: memo's plan run with the framework's mechanisms
    (its attention kernel, loss, collectives, allocator settings) against the framework's best is what memo's layout
    and policy give; memo's plan against itself on those mechanisms, what memo's own mechanisms give."""
    if best is None or memo_best is None or not best.tgs or not memo_best.tgs:
        return ""
    if not on_framework:
        return ""
    if on_framework.get("not_runnable"):  # the framework's mechanisms do not run memo's layout at all
        which = on_framework.get("mechanisms") or []
        return (f"the gap split: memo's best layout with {framework}'s mechanisms ({on_framework['layout_label']}) "
                f"is not one {framework} runs ({on_framework['not_runnable']}), so the "
                f"{memo_best.tgs / best.tgs:.2f}x is memo's layout and mechanisms together"
                + (f" (memo's -> {framework}'s mechanisms: {', '.join(which)})" if which else ""))
    if on_framework.get("same_mechanisms"):  # memo's best runs the framework's mechanisms: its layout and policy are
        if memo_best.tgs <= best.tgs:  # the whole gap
            return ""
        extra = mtp_extra(framework, best, memo_best)
        return (f"the gap split: memo's best runs {framework}'s mechanisms as it is, so the whole "
                f"{memo_best.tgs / best.tgs:.2f}x is its layout and policy ({memo_best.layout.label()} "
                f"{memo_best.policy.label()}: a layout or policy {framework}'s search did not rank first or does not "
                f"offer)" + (f" and the {extra}" if extra else ""))
    which = on_framework.get("mechanisms") or []
    named = f" (memo's -> {framework}'s: {', '.join(which)})" if which else ""
    if on_framework.get("status") != "OK":  # the framework's mechanisms do not hold memo's plan
        f = on_framework.get("failure") or {}
        where = f" at {f['op']}" + (f" ({f['tensor']})" if f.get("tensor") else "") if f.get("op") else ""
        return (f"the gap split: memo's best with {framework}'s mechanisms ({on_framework['layout_label']}) does not "
                f"fit ({on_framework.get('status')}{where}): memo's mechanisms{named} are what makes its plan fit")
    tgs = on_framework.get("tgs_tokens_per_gpu_s")
    if not tgs:
        return ""
    extra = mtp_extra(framework, best, memo_best)
    return (f"the gap split: memo's best with {framework}'s mechanisms ({on_framework['layout_label']}) runs "
            f"{tgs:,.0f} tokens/GPU/s (simulated): {tgs / best.tgs:.2f}x {framework}'s best from memo's layout and "
            f"policy"
            + (f" and the {extra}" if extra else "") + f", {memo_best.tgs / tgs:.2f}x from memo's own mechanisms"
            + named)


def mtp_extra(framework: str, best, memo_best) -> str:
    """Where memo's side trains multi-token-prediction modules the framework's leaves out (`Framework.for_model`):
    what the two throughputs differ by beside the plans, in words; "" where both train the same."""
    if best is None or memo_best is None:
        return ""
    n = memo_best.model.mtp_layers - best.model.mtp_layers
    if n <= 0:
        return ""
    return (f"{modules_words(n)} of multi-token prediction memo's side trains and {framework}'s leaves out "
            f"(--mtp-layers 0 compares the two without)")


def framework_line(framework: str, best, memo_best, plain_recipe: str = "") -> str:
    mine = f"{best.layout.label()} {best.policy.label()}, {best.tgs:.0f} tokens/GPU/s" if best else "nothing fits"
    theirs = (f"{memo_best.layout.label()} {memo_best.policy.label()}, {memo_best.tgs:.0f} tokens/GPU/s"
              if memo_best else "nothing fits")
    ratio = f" ({memo_best.tgs / best.tgs:.2f}x)" if best and memo_best else ""
    # memo's side keeps the framework's model-state recipe (`answer_whatif`): said where the what-if without
    # --framework prices another (``plain_recipe``, its recipe's name), so the two numbers are not read as one plan's
    recipe = memo_best.model.recipe if memo_best else None
    kept = (f" (with {framework}'s model states, {recipe.summary}; without --framework memo prices {plain_recipe}'s)"
            if recipe is not None and plain_recipe and recipe.name != plain_recipe else "")
    extra = mtp_extra(framework, best, memo_best)
    # memo's side runs its own executor's kernels and mechanisms (`any`): below 1x they are the slower stack here
    slower = (f"; memo's own stack (its executor's kernels and mechanisms) is the slower one here: train "
              f"{framework}'s plan" if best and memo_best and slower_as_printed(memo_best.tgs / best.tgs) else "")
    return f"{framework}'s best: {mine}; memo's best{kept}: {theirs}{ratio}" + (
        f"; the ratio includes the {extra}" if extra else "") + slower


def fold_notes(cands) -> list[tuple[str, str, list[str]]]:
    folds: dict[tuple[str, str], list[str]] = {}
    for i, c in enumerate(cands):
        for label in c.folded:
            folds.setdefault((label, c.policy.label()), []).append(f"#{i + 1}")
    return [(label, kept, where) for (label, kept), where in folds.items()]


def searched_words(searched: dict) -> str:
    """What the what-if searched, in one line."""
    words = ", ".join(searched.get("schedules", ())) or "nothing"
    pipe = searched.get("pipeline")
    if pipe and not pipe["pp"]:
        words += f"; pipelines ({pipe['why']}): none valid with the degrees given"
    elif pipe:
        words += (f"; pipelines ({pipe['why']}): pp {', '.join(map(str, pipe['pp'])) or '-'}, "
                  f"vpp {', '.join(map(str, pipe['vpp'])) or '-'}, micro-batch "
                  f"{', '.join(map(str, pipe['micro_batch'])) or '-'}")
        if len(pipe.get("rank_orders", ())) > 1:  # --rank-order all: each where it places the GPUs apart
            words += f", rank orders {', '.join(pipe['rank_orders'])}"
    elif "single_stage" in searched.get("schedules", ()):
        words += "; no micro-batch pipelines (left out by --schedule, --pp 1 or the framework)"
    if searched.get("optimizer_offload"):
        words += f"; the optimizer on the host ({searched['optimizer_offload']})"
    if searched.get("ep_overlap"):
        on, of = searched["ep_overlap"]
        words += (f"; EP all-to-all overlap (--ep-overlap) on {on:,} of the {of:,} pipeline candidates (the others, "
                  f"1F1B without virtual stages, ZeRO 2 / 3 or a policy Megatron-Core refuses beside it, without)")
    if isinstance(searched.get("sppo"), str):
        words += f"; sppo {searched['sppo']}"
    return words


def status_cell(c) -> str:
    """A row's status: `memo_sim.report.table.status_text` of its own overflow, and where the status is OOM and the
    pinned host memory overflows too, the host's beside it ("OOM +75.42 GiB, host +1.11 TiB"): the plan-file status
    names the GPU only, and a row reading "OOM +7.88 GiB" with 2.74 TiB pinned per node of 1.64 TiB said more GPU
    memory would fix it (a review)."""
    words = status_text(c.status, c.over_bytes)
    if c.status == "OOM" and c.host_over_bytes > 0:
        words += f", host +{fmt_bytes(c.host_over_bytes)}"
    return words


def _policy_cell(c) -> str:
    return c.policy.label() if c.sppo is not None else c.policy.name


def _split(rows) -> bool:
    return any(c.schedule not in ("single_stage", "sppo") or c.micro_batches > 1 for _i, c in rows)


def _gbs_varies(rows) -> bool:
    """Whether the rows train different global batches (a batch per replica, the what-if's default, gives a
    layout with more replicas more sequences per step): then a column says each row's."""
    return len({c.global_batch for _i, c in rows}) > 1


def ranked_table(rows) -> tuple[list[str], list[list[str]]]:
    """One table of both tiers: each row's numbers from its own tier, named in the tier column; where the rows
    train different global batches, a GBS column (sequences per iteration) after the iteration time."""
    split, gbs = _split(rows), _gbs_varies(rows)
    out = []
    for i, c in rows:
        e, sm = c.estimate, c.simulated
        p = candidate_peak(c)
        it = (sm["iteration_s"] if sm else e.iteration_s) or None
        mfu = sm["mfu"] if sm else e.mfu
        tgs = sm["tgs_tokens_per_gpu_s"] if sm else e.tgs
        r = [str(i + 1), c.layout.label(), _policy_cell(c),
             "-" if c.policy.alpha is None else f"{c.policy.alpha:.3f}", status_cell(c),
             # a simulated row that failed has no peak of its own: its tier is the simulator's, its peak analytic
             p.short_source if sm is None or p.tier == "simulated" else f"sim (failed; peak {p.short_source})",
             fmt_time(it) if it else "-", f"{100 * mfu:.1f}%" if mfu is not None else "-",
             f"{tgs:.0f}" if tgs else "-", fmt_bytes(p.bytes), allocator_cell(sm), fmt_bytes(c.host_bytes_per_node),
             fmt_time(sm["exposed_copy_s"] if sm else e.exposed_copy_s)]
        if gbs:
            r.insert(7, str(c.global_batch))
        if split:
            r.insert(2, f"{c.schedule} {c.micro_batches}x{c.micro_batch}")
        out.append(r)
    head = ["#", "layout"] + (["schedule"] if split else []) + ["policy", "alpha", "status", "tier/allocator",
                                                                "iter"] + (["GBS"] if gbs else []) \
        + [mfu_head(rows), "TGS", "peak GPU", "frag/retries", "host/node", "copy stall"]
    return head, out


def tier_table(rows, simulated: bool) -> tuple[list[str], list[list[str]]]:
    """Rows (rank, candidate) of one tier; simulated ones show the simulator's numbers."""
    split = _split(rows)
    out = []
    for i, c in rows:
        e, sm = c.estimate, c.simulated
        p = candidate_peak(c)
        r = [str(i + 1), c.layout.label(), _policy_cell(c),
             "-" if c.policy.alpha is None else f"{c.policy.alpha:.3f}", status_cell(c),
             fmt_time(e.iteration_s)]
        if simulated:
            r.append(fmt_time(sm["iteration_s"]) if sm["iteration_s"] else "-")
        r += [f"{100 * (sm['mfu'] if sm else e.mfu):.1f}%" if (sm is None or sm["mfu"] is not None) else "-",
              f"{(sm['tgs_tokens_per_gpu_s'] if sm else e.tgs):.0f}" if (sm is None or sm["tgs_tokens_per_gpu_s"])
              else "-", fmt_bytes(p.bytes), p.allocator_words, allocator_cell(sm),
              fmt_bytes(c.host_bytes_per_node),
              fmt_time(sm["exposed_copy_s"] if sm else e.exposed_copy_s)]
        if split:
            r.insert(2, f"{c.schedule} {c.micro_batches}x{c.micro_batch}")
        out.append(r)
    head = ["#", "layout"] + (["schedule"] if split else []) + ["policy", "alpha", "status", "iter (analytic)"] \
        + (["iter (sim)"] if simulated else []) \
        + [mfu_head(rows), "TGS", f"peak GPU ({'sim' if simulated else 'analytic'})", "allocator", "frag/retries",
           "host/node", "copy stall"]
    return head, out


def allocator_cell(sm: dict | None) -> str:
    """The caching allocator at the simulated peak: the share of reserved memory not allocated
    (fragmentation) and the allocation retries (cache flushes, ``num_alloc_retries``) per
    iteration; ``-`` where nothing was replayed (a micro-batch pipeline's or SPPO's run, ``"replayed": False``, has
    no replay counts: `memo_sim.engine.schedules.microbatch` / ``sppo``). A static memory plan's row shows its
    replay's too: `memo_sim.memplan.iteration_replay.engine_replay` replays a single-stage memory plan's iteration
    with the plan's arena as one request and the rest on the caching allocator (summary.json's ``allocator`` block,
    ``static_memory_plan`` true, `memo_sim.engine.result.allocator_summary`); the arena is reserved and allocated
    whole, so the unallocated share is all outside it (the table's title says so)."""
    a = (sm or {}).get("allocator") or {}
    if a.get("replayed") is False or a.get("fragmentation_at_peak") is None:
        return "-"
    retries = a.get("reorganizations", 0)
    if a.get("oom"):  # an OOM-frag row: the share when the replay failed, not at an allocation peak before it (a
        # review: "0.0% / 10" beside "77.95 GiB reserved, 27.35 GiB of it free in pieces"); the failure's counts are
        # the replay's `OomEvent` (memo_sim/memplan/allocator_report.py), in the summary as ``oom_reserved_bytes``
        # and ``oom_cached_free_bytes`` (`memo_sim.engine.result.allocator_summary`); none recorded: no share
        reserved, free = a.get("oom_reserved_bytes"), a.get("oom_cached_free_bytes")
        if not reserved or free is None:
            return f"- / {retries}"
        return f"{100 * free / reserved:.1f}% at OOM / {retries}"
    return f"{100 * a['fragmentation_at_peak']:.1f}% / {retries}"


def _plan_replayed(c) -> bool:
    """Whether ``c``'s frag/retries cell is a static memory plan's replay (`allocator_cell`)."""
    sm = c.simulated
    return bool(sm and (sm.get("allocator") or {}).get("static_memory_plan") and allocator_cell(sm) != "-")


def plan_frag_words(candidates) -> str:
    """The ranked table title's words for the memory plans' frag/retries cells, where one is shown: what their
    replay covers (`memo_sim.memplan.iteration_replay.engine_replay`: the arena one request, reserved and allocated
    whole, memo_exec/arena.py; everything else through the caching allocator)."""
    if not any(_plan_replayed(c) for c in candidates):
        return ""
    return ("; a memory plan's frag/retries: the replay of the tensors outside its arena (the arena, one allocation "
            "held whole, does not fragment; the share is of all the memory reserved, the arena's included)")


def _tier_tables(a: Answer, rows, budget: int) -> None:
    """--details: each tier's table, each with its first ``budget`` (--top) rows (a review: the analytic table got
    what the simulated one left of one shared budget, so 54 simulated rows over --top 15 hid it)."""
    sim_rows = [(i, c) for i, c in rows if c.simulated is not None]
    ana_rows = [(i, c) for i, c in rows if c.simulated is None]
    if sim_rows:
        a.table(*tier_table(sim_rows[:budget], simulated=True),
                title=f"Simulated (tier 2: the event simulator, with link contention and copy stalls), "
                      f"{plural(len(sim_rows), 'candidate')}{f', first {budget}' if budget < len(sim_rows) else ''}"
                      f"{plan_frag_words(c for _i, c in sim_rows[:budget])}:")
    if ana_rows and budget:
        a.table(*tier_table(ana_rows[:budget], simulated=False),
                title=f"Analytic only (tier 1: perfect overlap, no contention; not simulated: an estimate, not a "
                      f"bound either way, an offload-bound plan can simulate faster or slower, so not comparable "
                      f"with the rows above; the proved throughput bound tier 2 skips a plan by is a separate "
                      f"figure, --json's proved_bound_tgs_tokens_per_gpu_s), "
                      f"{plural(len(ana_rows), 'candidate')}{f', first {budget}' if budget < len(ana_rows) else ''}:")


def _same(c, layout_label: str, policy_label: str):
    return c.layout.label() == layout_label and c.policy.label() == policy_label


def metp_table(metp_rows: list[dict], shown) -> tuple[list[str], list[list[str]]]:
    """METP rows beside their Megatron twins; a configuration that is also in the ranking reads the
    ranking's peak (and source), a twin the ranking lacks its analytic peak."""
    def peak_of(layout_label, policy_label, analytic_bytes) -> tuple[float, str]:
        c = next((c for c in shown if _same(c, layout_label, policy_label)), None)
        if c is not None:
            p = candidate_peak(c)
            return p.bytes, "sim" if p.tier == "simulated" else "analytic"
        return analytic_bytes, "analytic"
    rows = []
    for r in metp_rows:
        mine, mine_src = peak_of(r["layout"], r["policy_label"], r["peak_gpu_bytes"])
        twin, twin_src = peak_of(r["megatron_layout"], r["megatron_policy_label"], r["megatron_peak_gpu_bytes"])
        saved = f"{100 * (1.0 - mine / twin):.0f}%" + ("" if mine_src == twin_src else " (mixed tiers)")
        rows.append([f"{r['layout']} {r['policy_label']}", r["status"], f"{fmt_bytes(mine)} ({mine_src})",
                     fmt_time(r["analytic_iteration_s"]), f"{r['megatron_layout']} {r['megatron_policy_label']}",
                     r["megatron_status"], f"{fmt_bytes(twin)} ({twin_src})",
                     fmt_time(r["megatron_analytic_iteration_s"]), saved])
    return (["METP plan", "status", "peak GPU", "iter", "TP+SP plan", "status", "peak GPU", "iter",
             "memory saved"], rows)


def _plan_words(c) -> str:
    tier = "sim" if c.simulated is not None else "analytic"
    return f"{c.layout.label()} {c.policy.label()} ({c.tgs:,.0f} tokens/GPU/s {tier}, peak {candidate_peak(c).text()})"


def compare_line(what: str, a, b, a_name: str, b_name: str) -> str:
    """``what``: A's best against B's best, throughput and peak, in one line."""
    ratio = a.tgs / b.tgs if b.tgs else float("inf")
    mem = 1.0 - candidate_peak(a).bytes / candidate_peak(b).bytes
    faster = "faster" if ratio >= 1 else "slower"
    less = f"{100 * abs(mem):.0f}% {'less' if mem >= 0 else 'more'} GPU memory"
    same_tier = (a.simulated is None) == (b.simulated is None)
    return (f"{what}: {a_name} {ratio:.2f}x the throughput ({abs(ratio - 1) * 100:.1f}% {faster}) with {less}: "
            f"{_plan_words(a)} against {_plan_words(b)}"
            + ("" if same_tier else "; different tiers, so read the ratio as rough"))


def runner_up(shown, best, mode: str | None = None) -> dict | None:
    """What the runner-up (the next fitting plan of the ranking) gives up against ``best``:
    throughput, and the GPU memory it saves or costs (peaks with their source): the --json
    answer's ``runner_up``; ``words`` is the table answer's line. ``mode``: tier 2's
    (`memo_sim.search.prune.PruneReport.mode`: bound, all or top; None: bound)."""
    rank = next((i for i, c in enumerate(shown) if c is not best and c.status == "OK"), None)
    if best is None or rank is None:
        return None
    c = shown[rank]
    loss = 1.0 - c.tgs / best.tgs if best.tgs else 0.0
    mine, theirs = candidate_peak(c), candidate_peak(best)
    diff = theirs.bytes - mine.bytes
    mem = (f"{fmt_bytes(abs(diff))} {'less' if diff >= 0 else 'more'} GPU memory (peak {mine.text()})"
           if diff else f"the same peak GPU ({mine.text()})")
    tier = "simulated" if c.simulated is not None else "analytic"
    label = f"{c.layout.label()} {c.policy.label()}"
    it = (c.simulated["iteration_s"] if c.simulated else c.estimate.iteration_s) or None
    if round(100 * loss, 1) > 0:
        given = f"gives up {100 * loss:.1f}% of the throughput"
    elif round(100 * loss, 1) == 0:
        given = "gives up none of the throughput (to 0.1%)"
    else:  # only an analytic row ranked below a simulated answer can show more (perfect overlap: an estimate)
        given = (f"shows {-100 * loss:.1f}% more throughput on the analytic tier (perfect overlap, an estimate, "
                 f"not a bound; not simulated)")
    words = (f"runner-up #{rank + 1} {label}: {given} "
             f"({c.tgs:,.0f} tokens/GPU/s {'sim' if c.simulated is not None else 'analytic'}) for {mem}")
    # the bound search proves the answer only: plans it skipped whose proved bound is above the runner-up's
    # throughput may lie between the two (a review: #2 at 18,977 sim while a skipped plan simulated at 19,009)
    from memo_sim.search.prune import tgs_upper_bound  # noqa: PLC0415

    between = 0 if c.simulated is None else sum(
        1 for u in shown if u.simulated is None and u.status == "OK" and u.sppo is None and tgs_upper_bound(u) > c.tgs)
    plans = f"{between} plan{'s' if between != 1 else ''}"
    if between and mode == "top":  # no bound search ran: tier 2 simulated the analytic tier's best N (a review)
        words += (f"; second place not proved: {plans} not simulated (--simulate-top N simulates the analytic "
                  f"tier's best N only) could run faster (--simulate-top bound or all ranks them)")
    elif between:
        words += (f"; second place not proved: {plans} the bound search did not simulate could run faster "
                  f"(--simulate-top all ranks them)")
    return {"rank": rank + 1, "label": label, "tier": tier, "iteration_s": it,
            "tgs_tokens_per_gpu_s": float(c.tgs) if c.tgs is not None else None,
            "throughput_given_up_fraction": float(loss), "peak_gpu_bytes": mine.bytes, "peak_source": mine.source,
            "unsimulated_possibly_faster": between, "words": words}


def runner_up_line(shown, best, mode: str | None = None) -> str:
    """`runner_up` in words ("" when there is none)."""
    up = runner_up(shown, best, mode)
    return up["words"] if up else ""


def _verdict_line(cands, what: str) -> str:
    """The verdict ``what`` (`memo_sim.search.verdicts.VERDICTS`) in one line, where the ranking
    holds a fitting plan of each side ("" otherwise)."""
    from memo_sim.search.verdicts import VERDICTS, sides

    v = next(v for v in VERDICTS if v.what == what)
    pair = sides(cands, v)
    return compare_line(v.what, pair[0], pair[1], v.a_name, v.b_name) if pair else ""


def unbuilt_side_words(cands, searched: dict) -> str:
    """Where the bound search did not build a micro-batch pipeline family whose proved bound is above the throughput
    of the plan the METP verdict compares for its side (METP or Megatron TP), that the side's best may lie there
    (a review: METP's best, tp2+metp_ffn-pp2v4-dp4-z1 at 2,841 tokens/GPU/s, was in such a family, and the verdict
    compared a METP plan at 2,720); "" otherwise."""
    from memo_sim.search.verdicts import METP_VS_MEGATRON, sides  # noqa: PLC0415

    by_tp = ((searched.get("pipeline") or {}).get("not_built") or {}).get("best_bound_by_tp") or {}
    pair = sides(cands, METP_VS_MEGATRON)
    if not by_tp or pair is None:
        return ""
    out = [f"{name}'s best may lie in a pipeline family the bound search did not build (its proved bound "
           f"{by_tp[kind]:,.0f} tokens/GPU/s, above the {c.tgs:,.0f} compared)"
           for name, kind, c in (("METP", "metp", pair[0]), ("Megatron TP", "megatron_tp", pair[1]))
           if by_tp.get(kind, 0.0) > c.tgs]
    return f"; {'; '.join(out)}: --simulate-top all builds it" if out else ""


def metp_verdict(cands) -> str:
    """METP against Megatron TP in one line, where the ranking holds a fitting plan of each."""
    return _verdict_line(cands, "METP vs Megatron TP")


def sppo_verdict(cands) -> str:
    """SPPO against MEMO in one line, where the ranking holds a fitting plan of each."""
    return _verdict_line(cands, "SPPO vs MEMO")


def _sppo_parts(a: Answer, result) -> None:
    """The SPPO planner's answer: the heuristic's (SP, PP, N), the best found, and failures."""
    sm = result.sppo_summary
    rows = []
    for role, d in (("heuristic (sec. 6.1)", sm.get("heuristic")), ("exhaustive best", sm.get("best"))):
        if not d:
            rows.append([role, "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        sim = d.get("simulated_iteration_s")
        rows.append([role, d["label"], f"SP={d['sp']} PP={d['pp']} N={d['subseqs']}", d["status"],
                     fmt_time(d["analytic_iteration_s"]), fmt_time(sim) if sim else "-",
                     f"{d.get('simulated_tgs_tokens_per_gpu_s') or d['analytic_tgs_tokens_per_gpu_s']:.0f}",
                     f"{fmt_bytes(d['peak_gpu_bytes'])} ({'sim' if sim else 'analytic'})", f"stage {d.get('worst_stage')} {d.get('peak_at') or ''}"])
    a.line(f"SPPO: {sm['solved_points']} of {sm['space_size']} (SP, PP, N, partition, multiplex) points solved "
           f"(branch and bound on the analytic tier); {sm.get('heuristic_note', '')}")
    a.table(["SPPO", "plan", "(SP, PP, N)", "status", "iter (analytic)", "iter (sim)", "TGS",
             "peak GPU", "peak at"], rows)
    frac = sm.get("heuristic_tgs_fraction_of_best")
    if frac is not None:
        a.line(f"  the heuristic's plan reaches {100 * frac:.1f}% of the best SPPO throughput found "
               f"({sm.get('compared_on')})")
    for c in [c for c in result.candidates if c.sppo is not None and c.status != "OK"][:3]:
        a.line(f"  {c.layout.label()} {c.policy.label()}: {c.alpha_note}")
