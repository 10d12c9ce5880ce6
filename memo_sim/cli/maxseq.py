"""memo-sim maxseq: the longest sequence each policy trains on a cluster, and what binds next."""

from __future__ import annotations

import textwrap
import time

import click

from memo_sim.cli.common import (GPU_COUNT, alloc_conf_option, build_model, count_option, headroom_option,
                               launch_options, layout_degree_options, model_options, moe_layout_options,
                               profile_option, progress_bar, progress_option, with_headroom)
from memo_sim.cost.gemm_format import check_gemm_format
from memo_sim.policy import policy_class, policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.report.formats import Answer, emit, format_options, plural, resolve_format
from memo_sim.search.frameworks import FRAMEWORKS, policy_frameworks_words
from memo_sim.units import fmt_count


@click.command()
@model_options
@click.option("--gpus", default=8, show_default=True, type=GPU_COUNT, help="Number of GPUs.")
@profile_option()
@click.option("--policy", "policies", multiple=True, type=click.Choice(policy_names()),
              help="Only these activation policies (repeatable; default: all the framework offers but sppo, "
                   "whose pipeline search runs at every probed length: ask for it with --policy sppo); the default "
                   "framework (any) offers all but " + policy_frameworks_words() + ".")
@click.option("--framework", default="any", show_default=True, type=click.Choice(list(FRAMEWORKS)),
              help="Only layouts and policies this framework offers.")
@click.option("--step", default="128K", callback=count_option, show_default=True,
              help="Granularity of the answer, in tokens (32768, 32K, 1M).")
@click.option("--allocator", default="caching", show_default=True, type=click.Choice(["caching", "plan", "both"]),
              help="Who places the transients of the policies without MEMO's plan: PyTorch's caching allocator "
                   "(as the frameworks run; reserved memory decides), a static memory plan, or both side by side.")
@alloc_conf_option
@headroom_option
@launch_options
@layout_degree_options
@click.option("--pp", type=click.IntRange(1, 4096),
              help="Fix the pipeline degree (1: single stage; default: searched, micro-batch pipelines included).")
@click.option("--optimizer-offload/--no-optimizer-offload", default=None,
              help="Keep the optimizer on the host (single stage, ZeRO >= 1), or never (default: searched where "
                   "nothing fits with it on the GPU).")
@moe_layout_options
@click.option("--jobs", type=click.IntRange(1, 1024),
              help="Answer the policies in this many processes (default: every core, one policy each); the "
                   "answers are the serial run's.")
@progress_option
@format_options
def maxseq(model_name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, dtype, mtp_layers, precision,
           gpus, profile_name, policies, framework,
           step, allocator, alloc_conf, headroom, kernel_fusion, attention, grad_overlap, tp, cp, ulysses, dp, zero, sp, tp_mode, pp, optimizer_offload,
           ep, etp, moe_dispatcher, moe_balance, jobs, progress, out_format, as_json):
    """The longest sequence (a multiple of --step) each policy trains, its MFU there, and the
    constraint that binds at the next step. --tp, --cp, --ulysses, --dp, --zero, --sp, --pp (and a mixture of
    experts' --ep, --etp) fix the layout (the longest sequence of one layout, as a published run fixes it);
    unset, they are searched. --moe-dispatcher and --moe-balance are the MoE layers' as in the what-if.

    Exit status: 0 when a policy trains --step tokens or more, 3 when none does (as the what-if's nothing
    fits), 2 on bad input."""
    from memo_sim.search.maxseq import max_seq_runs, maxseq_fixed, maxseq_runs_asked
    from memo_sim.search.whatif import default_jobs

    fixed = maxseq_fixed(tp_mode, moe_dispatcher, moe_balance, alloc_conf, kernel_fusion, attention, grad_overlap,
                         tp=tp, cp=cp,
                         ulysses=ulysses, dp=dp, zero=zero, sp=sp, pp=pp, optimizer_offload=optimizer_offload,
                         ep=ep, etp=etp)

    fmt = resolve_format(out_format, as_json)
    t0 = time.perf_counter()
    model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype, precision, kv_heads, head_dim,
                        mtp_layers)
    profile = with_headroom(load_profile(profile_name), headroom)
    profile.peak(model.dtype)
    check_gemm_format(model, profile)
    runs = maxseq_runs_asked(model, framework, policies, allocator)
    with progress_bar("searching", len(runs), quiet=fmt != "table", force=progress) as tick:
        answers = max_seq_runs(model, gpus, profile, runs, step=step, framework=framework, fixed=fixed,
                               jobs=jobs or default_jobs(), done=tick)
    obj = {"model": model.to_dict(), "gpus": gpus, "partial_node": profile.partial_node_words(gpus),
           "profile": profile.name,
           "profile_provenance": {"calibrated": profile.calibrated, "line": profile.provenance_line()},
           "framework": framework, "fixed": fixed,
           "answers": [_answer_json(a) for a in answers], "elapsed_s": time.perf_counter() - t0}
    emit(maxseq_answer(model, gpus, profile, framework, step, answers, time.perf_counter() - t0, fixed), fmt, obj)
    if not any(a.max_seq for a in answers):  # no policy trains even --step tokens: as the what-if's nothing fits
        from memo_sim.cli.whatif import NOTHING_FITS  # noqa: PLC0415

        click.get_current_context().exit(NOTHING_FITS)


def _answer_json(a) -> dict:
    """One policy's maxseq answer as JSON: its best plan as a what-if row reads (with its ``tier`` and ``peak``)."""
    from memo_sim.report.candidate_rows import candidate_row  # noqa: PLC0415

    d = a.to_json()
    if a.best is not None:
        d["best"] = candidate_row(1, a.best)
    return d


WIDTH = 100  # the text answer fits a terminal this wide


def maxseq_answer(model, gpus, profile, framework, step, answers, elapsed_s, fixed: dict | None = None) -> Answer:
    """A verdict, one narrow table (policy, longest, plan, MFU, the first failing length), and the
    binding constraint at that length per policy as wrapped notes below it."""
    from memo_sim.search.split_lengths import split_step, split_step_words  # noqa: PLC0415

    asked, step = step, split_step(step, gpus)  # the step searched (`memo_sim.search.maxseq.max_seq`)
    best = max((a for a in answers if a.max_seq), key=lambda a: a.max_seq, default=None)
    if best is None:
        verdict = f"answer: no policy trains {fmt_count(step)} tokens on {gpus} x {profile.gpu.model}"
    else:
        verdict = (f"answer: {best.policy} trains the longest sequence, {fmt_count(best.max_seq)} tokens"
                   + (f" ({best.best.layout.label()} {best.best.policy.label()})" if best.best else "")
                   + (f"; {fmt_count(max(best.fits_past_failure))} also fits past a failure (below)"
                      if best.fits_past_failure else ""))
    a = Answer(verdict)
    from memo_sim.report.whatif_answer import executor_words, mfu_peak_words  # noqa: PLC0415

    if best is not None and (refused := executor_words(best.best, framework)):  # as the what-if's answer says it
        a.line(textwrap.fill(refused, WIDTH, subsequent_indent="  "))
    if best is None and answers and all(x.states_alone for x in answers):  # no length at all: say so
        a.line(f"the model states alone exceed the GPU memory on every layout searched over {plural(gpus, 'GPU')}: "
               f"no length fits; give more GPUs")
    elif best is None and step >= 2048:  # the lengths are multiples of the step: none shorter was tried
        a.line(f"no length under {fmt_count(step)} was tried: a smaller --step "
               f"(e.g. {fmt_count(step // 16)}) looks there")
    a.line(f"{model.name}{model.gemm_words}, {gpus} x {profile.gpu.model} ({profile.name}), framework {framework}, "
           f"step {fmt_count(step)}")
    if (why := split_step_words(asked, gpus)):  # the lengths searched are not the multiples of --step: say so
        a.line(textwrap.fill(why, WIDTH, subsequent_indent="  "))
    if (nodes := profile.partial_node_words(gpus)) is not None:
        a.line(f"nodes: {nodes}")
    a.line(textwrap.fill(f"profile {profile.name}: {profile.provenance_line()}", WIDTH, subsequent_indent="  "))
    held = {k: v for k, v in (fixed or {}).items() if not (k == "tp_mode" and v == "all")}
    if held:
        a.line("fixed: " + ", ".join(f"{k.replace('_', '-')} {v if len(str(v)) <= 40 else str(v)[:37] + '...'}"
                                     for k, v in held.items()))
    rows = []
    for ans in answers:
        b = ans.best
        mfu = (b.simulated or {}).get("mfu") if b else None
        rows.append([_row_name(ans, answers), fmt_count(ans.max_seq) if ans.max_seq else "none",
                     f"{b.layout.label()} {b.policy.label()}" if b else "-",
                     f"{100 * mfu:.1f}%" if mfu is not None else "-", fmt_count(ans.next_seq)])
    # an FP8 model's MFU is of the dtype's peak: said in the column's head, as the what-if says it beside the number
    mfu_head = "MFU (sim" + (f", of the {model.dtype} peak)" if mfu_peak_words(model) else ")")
    a.table(["policy", "longest", "best plan there", mfu_head, "fails at"], rows)
    a.line("what binds at the first failing length (analytic; 'simulated': the event simulator):")
    for ans in answers:
        a.line(textwrap.fill(f"{_row_name(ans, answers)} at {fmt_count(ans.next_seq)}: {ans.binding}", WIDTH,
                             initial_indent="  ", subsequent_indent="    "))
        if (past := _past_failure_words(ans)):
            a.line(textwrap.fill(f"{_row_name(ans, answers)}: {past}", WIDTH, initial_indent="  ",
                                 subsequent_indent="    "))
    a.line(f"{elapsed_s:.1f} s")
    return a


def _past_failure_words(ans) -> str:
    """The grid lengths past the first failure that fit after all, the lengths looked at and why the scan stopped
    (`memo_sim.search.maxseq.past_failure_words`; reviews: 480K answered, 544K and 640K fit; 1.8125M reported past
    a failure where every 32K up to 1.96875M fits)."""
    from memo_sim.search.maxseq import past_failure_words  # noqa: PLC0415  (the command imports the search lazily)

    return past_failure_words(ans)


def _row_name(ans, answers) -> str:
    """The policy, and where answers on both allocators stand side by side, which one."""
    if len({a.allocator for a in answers}) == 1 or policy_class(ans.policy).takes_alpha:  # MEMO: its own plan
        return ans.policy
    return f"{ans.policy} ({'memory plan' if ans.allocator == 'plan' else 'caching allocator'})"


COMMANDS = (maxseq,)
