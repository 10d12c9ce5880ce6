"""memo-sim whatif: rank layouts x policies x alpha x schedules, simulate the best, write plan.json.

Schedules (`memo_sim.layout.schedule`): the single stage (micro-batches one after the other),
the micro-batch pipelines 1F1B and interleaved 1F1B (``--pp``, ``--vpp``; searched by default, left
out by ``--schedule`` or ``--pp 1``) and SPPO. ``--batch`` (sequences per replica per
iteration) or ``--global-batch`` (over every replica), ``--micro-batch`` (sequences per
micro-batch) set the batch split; the output says what was searched.

With the ``sppo`` policy among those searched (the default) the SPPO planner
(`memo_sim.search.sppo`) adds pipeline candidates: ``--pp``, ``--subseqs``, ``--partition`` and
``--multiplex/--no-multiplex`` fix parts of its space; the table lists its candidates beside the
others and a summary says the heuristic's (SP, PP, N) against the best the exhaustive search
found. plan.json is the best plan overall; where that is not an SPPO plan and one fits, the best
SPPO plan goes to plan-sppo.json as well."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, fields

import click

from memo_sim.cli.common import (
    FiniteRange,
    alloc_conf_option,
    headroom_option,
    launch_options,
    moe_layout_options,
    BATCH,
    GPU_COUNT,
    build_model,
    count_option,
    layout_degree_options,
    model_options,
    profile_option,
    progress_bar,
    progress_option,
    refuse_unwritable_out,
    with_headroom,
)
from memo_sim.errors import MemoError, NothingFits
from memo_sim.fileio import output_folder
from memo_sim.layout.pipeline_layout import OPTION as LAYOUT_OPTION, parse_layout
from memo_sim.layout.rank_order import RANK_ORDER_NAMES
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.plan.schema import with_profile_reference, write_plan
from memo_sim.policy import policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.report.formats import resolve_format
from memo_sim.report.fit_advice import eager_kernels_cost, expandable_faster
from memo_sim.report.sensitivity import sensitivity_line
from memo_sim.report.whatif_answer import WhatIfView
from memo_sim.report.whatif_json import answer_fixes, metp_vs_megatron, training_time, whatif_json
from memo_sim.search.frameworks import FRAMEWORKS, get_framework, policy_frameworks_words
from memo_sim.search.plan_build import prebuild_plan
from memo_sim.search.request import WhatifRequest, answer_whatif, plain_recipe, split_words, sweep_candidates
from memo_sim.search.sppo import MAX_SUBSEQS
from memo_sim.search.whatif import default_jobs, fold_duplicates
from memo_sim.units import fmt_count, parse_token_budget


ASKED = {f.name: f.default for f in fields(WhatifRequest)}  # the request's defaults, the options' too


def _simulate_top_value(ctx, param, value):
    from memo_sim.search.prune import parse_simulate_top

    try:
        return parse_simulate_top(value)
    except MemoError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@model_options
@click.option("--seq", default="256K", callback=count_option, show_default=True,
              help="Sequence length in tokens (4K = 4096, 256K, 1M = 1,048,576: K and M are 1024 and 1024²).")
@click.option("--gpus", default=8, show_default=True, type=GPU_COUNT, help="Number of GPUs.")
@profile_option()
@click.option("--batch", type=BATCH,
              help="Sequences per data-parallel replica per iteration (default 1; pp micro-batches where a "
                   "micro-batch pipeline is searched).")
@click.option("--global-batch", type=BATCH,
              help="Sequences per iteration over every data-parallel replica (instead of --batch; each layout "
                   "trains global-batch / dp per replica).")
@click.option("--micro-batch", type=BATCH,
              help="Sequences per micro-batch (divides the batch; gradients accumulate over the micro-batches). "
                   "Default: the search tries the batch's smallest divisors.")
@layout_degree_options
@click.option("--optimizer-offload/--no-optimizer-offload", default=None,
              help="Keep the optimizer's master weights, moments and step on the host (Megatron-Core "
                   "--optimizer-cpu-offload, DeepSpeed ZeRO-Offload; single stage, ZeRO >= 1), or never. Default: "
                   "searched where nothing fits with the optimizer on the GPU (on the estimate, or in the event "
                   "simulator).")
@moe_layout_options
@click.option("--ep-overlap/--no-ep-overlap", default=False,
              help="Overlap the MoE layers' expert-parallel all-to-alls with the other micro-batch's compute "
                   "(Megatron-Core's --overlap-moe-expert-parallel-comm with --delay-wgrad-compute: each steady-state "
                   "forward merged with a backward, one warm-up forward more) on every candidate that can run it: "
                   "ep >= 2, the alltoall or deepep dispatcher, the interleaved schedule (pp >= 2, vpp >= 2), ZeRO 0 "
                   "or 1, a policy Megatron runs beside it (store_all, selective_recompute, recompute_norm_act); the "
                   "others run without it. Needs --framework megatron.")
@click.option("--allocator", default="caching", show_default=True, type=click.Choice(["caching", "plan", "both"]),
              help="Who places the transient tensors of the policies without MEMO's own plan: PyTorch's caching "
                   "allocator (with its fragmentation and retries, as the frameworks run), a static memory plan, or "
                   "both side by side.")
@alloc_conf_option
@headroom_option
@launch_options
@click.option("--dp-mode", default=None, type=click.Choice(["zero", "fsdp", "all"]),
              help="Data-parallel flavours to search: ZeRO stages, FSDP (with HSDP and resharding on/off; a layout "
                   "without a data-parallel, CP or Ulysses group has nothing to shard and is searched as it is), or "
                   "all the framework runs (default: the framework's first: zero for any, fsdp for torchtitan).")
@click.option("--rank-order", default=None, type=click.Choice([*RANK_ORDER_NAMES, "all"]),
              help="How a micro-batch pipeline's GPUs are numbered, innermost first: tp-cp-dp-pp (stages outermost, "
                   "every framework's default) or tp-cp-pp-dp (Megatron-LM's --use-tp-pp-dp-mapping), or all the "
                   "framework offers (default: its first; SPPO's pipelines keep the default).")
@click.option("--train-tokens", "train_tokens", default=None,
              help="Also say how long the best plan takes to train this many tokens, and the GPU-hours "
                   "(decimal multipliers: 300B, 15T, 2e12).")
@click.option("--metp-across-nodes", is_flag=True,
              help="Let a METP ring span whole nodes (its send/recv then rides the inter-node link).")
@click.option("--policy", "policies", multiple=True, type=click.Choice(policy_names()),
              help="Only these activation policies (repeatable); the default framework (any) offers all but "
                   + policy_frameworks_words() + ".")
@click.option("--alpha", type=FiniteRange(0, 1), help="Fix MEMO's offload fraction alpha.")
@click.option("--pp", type=click.IntRange(1, 4096),
              help="Fix the pipeline degree (stages): 1F1B and interleaved 1F1B for every policy, SPPO for sppo.")
@click.option("--decoder-first-pipeline-num-layers", "first_stage_layers", type=click.IntRange(1, 4096),
              help="Layers of the first pipeline stage (Megatron-LM's option; the stages between share the rest "
                   "evenly). Default: an even split, or where the layers do not divide, the middle stages "
                   "ceil(layers/pp) each and the first and last the rest.")
@click.option("--decoder-last-pipeline-num-layers", "last_stage_layers", type=click.IntRange(1, 4096),
              help="Layers of the last pipeline stage (Megatron-LM's option).")
@click.option("--pipeline-model-parallel-layout", "pipeline_layout", default=None, metavar="TEXT",
              help="Every model chunk's layers as Megatron-LM writes them, stages split by '|' (E embedding, t a "
                   "layer, L the loss, X*n and (...)*n repeat): e.g. 'Et*7|(t*8|)*14,t*7L' over --pp 8 is 2 chunks "
                   "per rank; the first stage may hold the embedding alone and the last the loss alone ('E|...|L'). "
                   "Needs --pp; the chunks per rank are the stages / pp.")
@click.option("--vpp", type=click.IntRange(1, 4096),
              help="Fix the virtual stages (model chunks) per pipeline rank (interleaved 1F1B; 1: plain 1F1B).")
@click.option("--schedule", "schedules", multiple=True, type=click.Choice(list(SCHEDULE_NAMES)),
              help="Only these schedules (repeatable; default: every one the framework runs).")
@click.option("--subseqs", type=click.IntRange(1, 1 << 16), help="SPPO: fix the subsequence count N.")
@click.option("--partition", type=click.Choice(["flops", "length"]),
              help="SPPO: fix how the sequence is partitioned (equal forward FLOPs or equal lengths).")
@click.option("--multiplex/--no-multiplex", default=None,
              help="SPPO: fix multiplexed sequence partitioning on or off (default: the search tries both).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1), help="Rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON (same as --format json).")
@click.option("--all-candidates", is_flag=True,
              help="JSON: list every candidate in full (default: beyond 2,000 rows every fitting one and the closest "
                   "others, the rest counted in candidates_left_out).")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Folder for plan.json.")
@click.option("--no-plan", is_flag=True, help="Do not write plan.json.")
@click.option("--simulate-top", default=ASKED["simulate_top"], show_default=True, callback=_simulate_top_value,
              help="Tier 2 (the event simulator): 'bound' simulates in order of a proved throughput bound until "
                   "no candidate left can beat the best simulated; 'all' every fitting candidate; a count N the "
                   "analytic tier's best N (0: none).")
@click.option("--allocator-lag", default=ASKED["allocator_lag"], show_default=True, type=click.IntRange(0, 64),
              help="Tier 2: layers the GPU lags behind the CPU, holding collective buffers from the caching "
                   "allocator (record_stream); 0: the framework's (held until a synchronisation where its PyTorch "
                   "records streams on collectives, mechanisms.nccl_record_stream; else the GPU keeps up).")
@click.option("--framework", default=ASKED["framework"], show_default=True, type=click.Choice(list(FRAMEWORKS)),
              help="Search only what this framework offers, and compare its best plan with memo's.")
@click.option("--sweep-alpha", is_flag=True,
              help="Simulate MEMO at alpha = 0, 0.125, ..., 1 on one layout: the fixed degrees', else the analytic "
                   "tier's best MEMO layout (fix the what-if's answer's degrees to sweep it); writes alpha_sweep.png.")
@click.option("--jobs", type=click.IntRange(1, 1024),
              help="Tier 2: simulate candidates in this many processes (default: every core); results are the "
                   "serial run's, in the same order.")
@progress_option
@click.option("--no-compare", is_flag=True,
              help="Answer with the ranked search alone: skip the searches the answer is compared with (memo's own "
                   "best beside --framework's, the same search in bf16 beside an FP8 --precision, the split searched "
                   "beside a fixed one), each a search as long as the first or longer on a large cluster.")
@click.option("--details", is_flag=True,
              help="Print every table: the two tiers apart, METP against Megatron TP+SP, the SPPO planner's.")
@click.option("--format", "out_format", default="table", show_default=True,
              type=click.Choice(["table", "json", "csv", "md"]),
              help="Output format: aligned text (table), JSON, CSV or Markdown (md).")
def whatif(**options):
    """Rank layouts x policies x alpha for a model, sequence length and cluster; write plan.json.

    One ranked table holds both tiers: the simulated rows (tier 2, the event simulator), then the
    analytic-only rows (tier 1), its tier column saying which; --details also lists the two tiers apart.
    Rows that do the same thing under two policy names on one allocator (memo at alpha=1 and full_offload on a
    static memory plan) are listed once.

    Exit status: 0 when a plan fits (plan.json written unless --no-plan), 3 when no candidate
    fits (no plan written, and the plan.json and plan-sppo.json an earlier what-if wrote into --out
    removed, as said; the advice names what was not searched), 2 on bad input.
    """
    t0 = time.perf_counter()
    show = Show.from_options(options)
    _refuse_out_without_plan(show)
    req = request_of(options)
    _warn_long_sppo_simulation(req)
    _refuse_zero0_fsdp(req)
    if show.sweep_alpha or not show.no_plan:  # an unwritable --out fails now, before the search
        refuse_unwritable_out(show.out_dir, "memo-sim whatif")
    if show.sweep_alpha:  # MEMO's alpha on one layout (no SPPO search)
        return _sweep_alpha(req, sweep_candidates(req), show, t0)
    try:
        with search_progress("what-if", show.quiet, force=show.progress) as on_progress:
            # the best plan's memory plan built while this process waits for SPPO's simulation, if it does
            ans = answer_whatif(req, progress=on_progress, while_waiting=None if show.no_plan else prebuild_plan,
                                comparisons=not show.no_compare)
    except NothingFits as e:  # no layout was built: every one's model states alone overflow (exit 3, answered)
        return _nothing_built(req, show, str(e))
    paths, removed = _write_plans(show, {name: with_profile_reference(plan, options["profile_name"])
                                         for name, plan in ans.plans().items()} if not show.no_plan else {})
    elapsed = time.perf_counter() - t0
    if show.as_json:
        # compact: the C encoder, 3x faster
        click.echo(json.dumps(dict(whatif_json(ans, elapsed_s=elapsed, plan_paths=paths, train_tokens=show.train_budget,
                                               all_candidates=show.all_candidates), removed_stale=removed)))
    else:
        _print_answer(ans, paths, elapsed, show)
    if ans.best is None:
        _say_removed(show, removed)
        click.get_current_context().exit(NOTHING_FITS)


def _warn_long_sppo_simulation(req: WhatifRequest) -> None:
    """Say on stderr, before the search, where a fixed --subseqs above the largest N SPPO's own search tries
    (`memo_sim.search.sppo.MAX_SUBSEQS`) makes tier 2 long: the event simulator's SPPO schedule
    (`memo_sim.engine.schedules.sppo`) emits every piece of every subsequence on every stage and layer, so its events
    grow with N (a review: --subseqs 32768 on gpt-7b, 64K tokens, tp 2 x pp 4 ran minutes without a word; measured
    here: N 1,024 about 15 s, N 4,096 over 3 minutes, its analytic tier alone 40 s at N 32,768)."""
    if req.subseqs is None or req.subseqs <= MAX_SUBSEQS or req.simulate_top == 0:
        return
    if req.subseqs > req.seq // (req.tp or 1):  # refused by SPPO's search (`memo_sim.search.sppo.sppo_candidates`)
        return
    click.echo(f"note: --subseqs {req.subseqs:,} is above the {MAX_SUBSEQS} subsequences SPPO's search tries itself: "
               f"the event simulator (tier 2) runs each subsequence's pieces on every stage and layer, so it takes "
               f"time in proportion to N (minutes past a few thousand); --simulate-top 0 answers from the analytic "
               f"tier alone", err=True)


def _refuse_zero0_fsdp(req: WhatifRequest) -> None:
    """Refuse --dp-mode fsdp with --zero 0 where the framework runs ZeRO 0 as plain DDP: FSDP shards the weights,
    gradients and optimizer states over its shard group (ZeRO stage 3's, `memo_sim.dp.fsdp`), and a ZeRO 0 plan
    is FSDP only as FSDP2 over a shard group of one, which a framework with the ``replicate_fsdp`` mechanism runs
    (torchtitan at b5bcd76c, models/llama3/parallelize.py: "with shard_degree=1 it is a no-op for the all-gather but
    still installs the MixedPrecisionPolicy"; `Layout.replicate_fsdp`); there it is accepted (a review: under
    --framework any the pair answered a ZeRO 0 DDP plan at 18 B/param)."""
    if req.dp_mode != "fsdp" or req.zero != 0 or get_framework(req.framework).mechanism("replicate_fsdp"):
        return
    runs = [n for n in FRAMEWORKS if get_framework(n).mechanism("replicate_fsdp")]
    raise MemoError(f"--zero 0 with --dp-mode fsdp: FSDP shards the model states (ZeRO stage 3), and {req.framework} "
                    f"runs ZeRO 0 as DDP; use --zero 3, or --dp-mode zero for DDP"
                    + (f", or --framework {runs[0]} for its ZeRO 0 as FSDP2 over a shard group of one "
                       f"(replicate_fsdp)" if runs else ""))


def _refuse_out_without_plan(show: Show) -> None:
    """Refuse --out given beside --no-plan (a review: the folder was ignored without a word): with --no-plan the
    what-if writes nothing into --out (`_write_plans`), only --sweep-alpha's alpha_sweep.png goes there. Given is
    the command line's or the environment's (click's ParameterSource), not the default '.'."""
    from click.core import ParameterSource  # noqa: PLC0415

    src = click.get_current_context().get_parameter_source("out_dir")
    if show.no_plan and not show.sweep_alpha and src in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        raise MemoError(f"--out {show.out_dir}: --no-plan writes no plan.json, so nothing goes into --out; drop "
                        f"--out, or drop --no-plan to write the plan there")


def _write_plans(show: Show, plans: dict) -> tuple[dict, list[str]]:
    """Write ``plans`` (file name -> plan) into --out as one set (`memo_sim.fileio.output_folder`: staged, the
    manifest last): their paths by name, and the earlier outputs of this command the set removed. No plans (nothing
    fits) is an empty set, which removes the earlier plan.json and plan-sppo.json too (a review: they stayed, and
    `simulate` of that plan.json answered the earlier question). --no-plan leaves --out as it is."""
    if show.no_plan:
        return {}, []
    with output_folder(show.out_dir, "memo-sim whatif") as outf:
        paths = {name: outf.path(write_plan(plan, outf.stage / name)) for name, plan in plans.items()}
    return paths, outf.removed


def _say_removed(show: Show, removed: list[str]) -> None:
    """The line of a what-if that found no plan and removed the earlier one (on stderr beside csv and md)."""
    if removed and not show.as_json:
        click.echo(f"removed the earlier {', '.join(removed)} from --out {show.out_dir}: an earlier what-if's plans, "
                   f"not this question's", err=show.out_format != "table")


def _nothing_built(req: WhatifRequest, show: Show, why: str) -> None:
    """The answer where no layout's model states fit, so nothing was built to rank: the reason (with the layout
    nearest to fitting) and what was not searched, as text or as --json's document; exit status 3."""
    from memo_sim.search.whatif import not_searched  # noqa: PLC0415

    advice = not_searched(req.gpus, req.searched_policies, req.framework, req.fixed())
    _, removed = _write_plans(show, {})
    if show.as_json:
        click.echo(json.dumps({"model": req.model.to_dict(), "seq_tokens": req.seq, "gpus": req.gpus,
                               "profile": req.profile.name, "framework": req.framework, "nothing_fits": True,
                               "why": why, "not_searched": advice, "candidates": [], "plan_file": None,
                               "removed_stale": removed}))
    else:
        click.echo(f"answer: nothing fits (exit status {NOTHING_FITS}, no plan.json): {why}")
        click.echo("not searched: " + "; ".join(advice))
        _say_removed(show, removed)
    click.get_current_context().exit(NOTHING_FITS)


def request_of(options: dict) -> WhatifRequest:
    """The what-if request of the command's options (the model and profile built from their flags)."""
    model = build_model(options["model_name"], options["layers"], options["hidden"], options["heads"],
                        options["ffn"], options["vocab"], options["dtype"], options["precision"],
                        options.get("kv_heads"), options.get("head_dim"), options.get("mtp_layers"))
    jobs = options.get("jobs") or default_jobs()
    text = options.get("pipeline_layout")
    chunks = None
    if text is not None:
        if not options.get("pp") or options["pp"] < 2:
            raise MemoError(f"{LAYOUT_OPTION} splits a pipeline over --pp ranks: give --pp 2 or more")
        # the multi-token-prediction layers the framework trains (`Framework.for_model`) are the layout's to place
        fw = get_framework(options.get("framework") or ASKED["framework"])
        mtp = fw.for_model(model).mtp_layers
        if mtp < model.mtp_layers and "m" in text:
            raise MemoError(f"{LAYOUT_OPTION} {text!r}: {fw.name} trains no multi-token-prediction module in memo's "
                            f"framework data (the model's {model.mtp_layers} left out); write the layout without m")
        chunks = parse_layout(text, model.layers, options["pp"], mtp)
    return WhatifRequest.from_options(model, with_headroom(load_profile(options["profile_name"]), options.get("headroom")),
                                      dict(options, jobs=jobs, chunk_layers=chunks))


@dataclass(frozen=True)
class Show:
    """What the command prints and writes (the request is `WhatifRequest`)."""

    top: int
    as_json: bool
    out_dir: str
    no_plan: bool
    train_budget: int | None  # --train-tokens, parsed
    sweep_alpha: bool
    progress: bool | None
    details: bool = False  # every table, not just the verdict and the ranking
    out_format: str = "table"  # table | json | csv | md (json is --json)
    all_candidates: bool = False  # JSON: every candidate in full (`memo_sim.report.candidate_rows`)
    no_compare: bool = False  # the ranked answer alone: none of the searches it is compared with (`answer_whatif`)

    @classmethod
    def from_options(cls, options: dict) -> Show:
        tokens = options.get("train_tokens")
        names = {f.name for f in fields(cls)}
        kept = {k: v for k, v in options.items() if k in names}
        kept["as_json"] = resolve_format(kept.get("out_format") or "table", bool(kept.get("as_json"))) == "json"
        return cls(train_budget=parse_token_budget(tokens) if tokens is not None else None, **kept)

    @property
    def quiet(self) -> bool:
        """No progress bar: a machine format (--json, --format csv or md) without --progress, or --no-progress (a
        bar only for runs over a second); the rule every command's progress follows."""
        machine = self.as_json or self.out_format != "table"
        return machine if self.progress is None else not self.progress


def _print_answer(ans, paths: dict, elapsed: float, show: Show) -> None:
    """The text answer (table, csv or md): a verdict line, then one ranked table (--details: all)."""
    from memo_sim.report.formats import emit
    from memo_sim.report.whatif_answer import whatif_answer

    req, result, best = ans.request, ans.result, ans.best
    batch_words = (f"{req.global_batch} sequences per iteration" if req.global_batch
                   else f"{req.batch} per replica" if req.batch
                   else "1 per replica" + (" (pipeline rows: pp micro-batches)"
                                           if (result.searched.get("pipeline") or {}).get("pp") else ""))
    shown = fold_duplicates(result.candidates)
    view = WhatIfView(
        model=req.model, seq=req.seq, gpus=req.gpus, profile=req.profile, result=result, shown=shown, best=best,
        batch_words=batch_words, elapsed_s=elapsed, top=show.top, details=show.details,
        plan_path=paths.get("plan.json"), sppo_plan_path=paths.get("plan-sppo.json"), no_plan=show.no_plan,
        metp_rows=metp_vs_megatron(shown, req.alpha), advice=ans.advice,
        fixes=answer_fixes(ans, shown),
        sensitivity=sensitivity_line(shown, req.profile, req.alpha), framework=req.framework,
        global_batch_fixed=bool(req.global_batch),
        memo_best=ans.memo_best, plain_recipe=plain_recipe(req.model),
        train_lines=_train_lines(best, show.train_budget), bf16_best=ans.bf16_best, bf16_searched=ans.bf16_searched,
        memo_on_framework=ans.memo_on_framework, split_line=split_words(best, ans.split_best), compared=ans.compared,
        expandable=expandable_faster(shown, best), eager=eager_kernels_cost(best))
    emit(whatif_answer(view), show.out_format)


NOTHING_FITS = 3  # exit status when no candidate fits (2 is bad input)
PROGRESS_AFTER_S = 1.0  # a bar appears only for work that has run this long


@contextlib.contextmanager
def delayed_progress(label: str, quiet: bool, force: bool | None = None):
    """A ``progress(done, total)`` callback that opens `memo_sim.cli.common.progress_bar` once the
    work has run `PROGRESS_AFTER_S` seconds (short runs print nothing) and closes it at the end."""
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        state: dict = {}

        def progress(done: int, total: int) -> None:
            if quiet:
                return
            if "step" not in state:
                if time.perf_counter() - t0 < PROGRESS_AFTER_S:
                    return
                state["step"] = stack.enter_context(progress_bar(label, total, force=force))
                state["shown"] = 0
            while state["shown"] < done:
                state["step"]()
                state["shown"] += 1

        yield progress


STATUS_EVERY_S = (0.1, 1.0)  # the least time between two updates of one stage: on a terminal, off one (--progress)


class SearchStatus:
    """The what-if's progress on stderr as a status line that names the stage under way
    (`memo_sim.search.whatif.rank` calls ``stage(words)``: pricing, the bound search with its count and bound gap,
    the verdict lines' sides) and counts ``progress(done, total)`` only where the total is what will run; the
    seconds elapsed, no ETA (a review: a click bar out of every fitting candidate sat silent for 14.7 s, then
    showed 0% and an ETA of 6 minutes for a search that ended 4 s later, in ~450 redraws). On a terminal the line
    is rewritten in place (``\r``, erase to the end of line) and erased at the end, so a short run leaves nothing;
    off a terminal (``--progress``) the label alone on the first line, then one line per update. Updates of one
    stage come at most every `STATUS_EVERY_S`; a new stage is shown at once."""

    def __init__(self, label: str, stream, tty: bool):
        self.label, self.stream, self.tty = label, stream, tty
        self.t0 = time.perf_counter()
        self._last = (None, -1e9)  # (stage words before the first ':', when shown)
        self._started = False
        self._shown = False

    def stage(self, words: str) -> None:
        now = time.perf_counter()
        key = words.split(":")[0]
        if key == self._last[0] and now - self._last[1] < STATUS_EVERY_S[0 if self.tty else 1]:
            return
        self._last = (key, now)
        line = f"{self.label} [{now - self.t0:.1f} s] {words}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line[:200])
            self._shown = True
        else:
            if not self._started:
                self.stream.write(f"{self.label}\n")
                self._started = True
            self.stream.write(line + "\n")
        self.stream.flush()

    def __call__(self, done: int, total: int) -> None:
        self.stage(f"simulating: {done} of {total}")

    def close(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _no_progress(done: int, total: int) -> None:
    """A quiet run's progress: nothing shown (and no ``stage``)."""


@contextlib.contextmanager
def search_progress(label: str, quiet: bool, force: bool | None = None):
    """A `SearchStatus` on stderr where progress is shown: ``force`` (``--progress/--no-progress``) decides, else
    only on a terminal and never when ``quiet`` (--json)."""
    on = force if force is not None else (not quiet and sys.stderr.isatty())
    if not on:
        yield _no_progress
        return
    status = SearchStatus(label, sys.stderr, sys.stderr.isatty())
    try:
        yield status
    finally:
        status.close()


def _sweep_alpha(req, result, show: Show, t0: float) -> None:
    from memo_sim.engine.simulate import DEFAULT_ALPHAS, sweep_alpha
    from memo_sim.report.figures import alpha_sweep_figure

    model, seq, profile = req.model, req.seq, req.profile
    memo = [c for c in result.candidates if c.policy.takes_alpha]
    if not memo:
        raise MemoError("--sweep-alpha needs the memo policy among --policy")
    layout = memo[0].layout
    layouts = {c.layout for c in result.candidates}
    solved = memo[0].policy.alpha
    with delayed_progress("alpha sweep", show.quiet) as on_progress:
        res = sweep_alpha(model, layout, memo[0].batch, seq, profile, DEFAULT_ALPHAS, progress=on_progress,
                          schedule=memo[0].schedule, micro_batch=memo[0].micro_batch)
    with output_folder(show.out_dir, "memo-sim whatif --sweep-alpha") as outf:
        png = outf.path(alpha_sweep_figure(res, outf.stage / "alpha_sweep.png", solver_alpha=solved))
    from memo_sim.report.sweep_text import run_json, runs_answer

    if show.as_json:
        click.echo(json.dumps({"model": model.to_dict(), "seq_tokens": seq, "profile": profile.name,
                               "layout": layout.label(), "layout_degrees": layout.to_dict(),
                               "layout_note": "fixed by flags" if len(layouts) == 1 else
                               f"best of {len(layouts)} valid layouts of the degrees not fixed (fix them too to "
                               f"choose one)",
                               "solver_alpha": solved, "figure": str(png),
                               "sweep": [run_json(r) for r in res], "elapsed_s": time.perf_counter() - t0}))
        # compact, as every --json of whatif (README: one line; a review found the sweep's 443 lines)
        return
    from memo_sim.report.formats import emit

    a = runs_answer(f"{model.name}, {fmt_count(seq)} tokens, {layout.label()} on {profile.name}: MEMO alpha sweep "
                    f"(solver's alpha {solved:.3f})", ["alpha"], [([f"{r.policy.alpha:.3f}"], r) for r in res])
    a.line(f"figure: {png}")
    emit(a, show.out_format)


def _train_lines(best, tokens: int | None) -> list[str]:
    if best is None or tokens is None:
        return []
    days, gpu_hours = training_time(best, tokens)
    n = best.layout.gpus
    return [f"training {fmt_tokens(tokens)} tokens at this plan's {best.tgs:,.0f} tokens/GPU/s on "
            f"{n} GPU{'s' if n != 1 else ''}: {fmt_duration(days * 86400)}, {fmt_gpu_hours(gpu_hours)} GPU-hours"]


def fmt_duration(seconds: float) -> str:
    """A wall time in the largest unit it reaches (days, hours, minutes, seconds): a small job reads "8.61 minutes",
    not "0.0 days" (a review: 1B tokens on one GPU at 1.94M tokens/s, 516 s, read "0.0 days, 0 GPU-hours")."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}" if unit == "days" else f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def fmt_gpu_hours(h: float) -> str:
    """GPU-hours to the unit from 100 on, else to three significant digits (0.143, not 0)."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def fmt_tokens(n: int) -> str:
    """A token budget the way it is quoted: 300B, 1.5T."""
    for unit, v in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= v:
            return f"{n / v:.4g}{unit}"
    return str(n)
