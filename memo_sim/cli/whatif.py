"""memo-sim whatif: rank layouts x policies x alpha x schedules, simulate the best, write plan.json.

Schedules (`memo_sim.layout.schedule`): the single stage (micro-batches one after the other),
the micro-batch pipelines 1F1B and interleaved 1F1B (``--pp``, ``--vpp``; searched when asked
for, or when nothing fits without a pipeline) and SPPO. ``--batch`` (sequences per replica per
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
import time
from pathlib import Path

import click

from memo_sim.cli.common import (BATCH, DEGREE, GPU_COUNT, build_model, count_option, model_options, progress_bar,
                                 progress_option)
from memo_sim.errors import MemoError
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.layout.schedule import PIPELINE_SCHEDULES, executor_stage_limit
from memo_sim.plan.schema import write_plan
from memo_sim.policy import policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.report.table import render_table, status_text
from memo_sim.search.frameworks import FRAMEWORKS
from memo_sim.search.plan_build import build_plan
from memo_sim.units import fmt_bytes, fmt_count, fmt_time, parse_token_budget


def _simulate_top_value(ctx, param, value):
    from memo_sim.search.prune import parse_simulate_top

    try:
        return parse_simulate_top(value)
    except MemoError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@model_options
@click.option("--seq", default="256K", callback=count_option, show_default=True, help="Sequence length (4K, 256K, 1M).")
@click.option("--gpus", default=8, show_default=True, type=GPU_COUNT, help="Number of GPUs.")
@click.option("--profile", "profile_name", default="a800-80gb", show_default=True, help="Hardware profile.")
@click.option("--batch", type=BATCH,
              help="Sequences per data-parallel replica per iteration (default 1; pp micro-batches where a "
                   "micro-batch pipeline is searched).")
@click.option("--global-batch", type=BATCH,
              help="Sequences per iteration over every data-parallel replica (instead of --batch; each layout "
                   "trains global-batch / dp per replica).")
@click.option("--micro-batch", type=BATCH,
              help="Sequences per micro-batch (divides the batch; gradients accumulate over the micro-batches). "
                   "Default: the search tries the batch's smallest divisors.")
@click.option("--tp", type=DEGREE, help="Fix the tensor-parallel degree.")
@click.option("--cp", type=DEGREE, help="Fix the (ring) context-parallel degree.")
@click.option("--ulysses", type=DEGREE, help="Fix the Ulysses sequence-parallel degree.")
@click.option("--dp", type=DEGREE, help="Fix the data-parallel degree.")
@click.option("--zero", type=click.IntRange(0, 3), help="Fix the ZeRO stage.")
@click.option("--sp/--no-sp", default=None, help="Fix Megatron sequence parallelism on or off.")
@click.option("--tp-mode", default=None, type=click.Choice(["megatron", "metp_ffn", "metp", "all"]),
              help="Tensor-parallel flavour: Megatron TP, METP for the FFN (metp_ffn), METP for the FFN and the "
                   "two-level MHA (metp), or all of them ranked together (default: all; megatron when --tp is "
                   "given, so --tp 8 asks about Megatron TP8).")
@click.option("--train-tokens", "train_tokens", default=None,
              help="Also say how long the best plan takes to train this many tokens, and the GPU-hours "
                   "(decimal multipliers: 300B, 15T, 2e12).")
@click.option("--metp-across-nodes", is_flag=True,
              help="Let a METP ring span whole nodes (its send/recv then rides the inter-node link).")
@click.option("--policy", "policies", multiple=True, type=click.Choice(policy_names()),
              help="Only these activation policies (repeatable).")
@click.option("--alpha", type=click.FloatRange(0, 1), help="Fix MEMO's offload fraction alpha.")
@click.option("--pp", type=click.IntRange(1, 4096),
              help="Fix the pipeline degree (stages): 1F1B and interleaved 1F1B for every policy, SPPO for sppo.")
@click.option("--vpp", type=click.IntRange(1, 4096),
              help="Fix the virtual stages (model chunks) per pipeline rank (interleaved 1F1B; 1: plain 1F1B).")
@click.option("--schedule", "schedules", multiple=True, type=click.Choice(list(SCHEDULE_NAMES)),
              help="Only these schedules (repeatable; default: every one the framework runs).")
@click.option("--subseqs", type=click.IntRange(1, 1 << 16), help="SPPO: fix the subsequence count N.")
@click.option("--partition", type=click.Choice(["flops", "length"]),
              help="SPPO: fix how the sequence is partitioned (equal forward FLOPs or equal lengths).")
@click.option("--multiplex/--no-multiplex", default=None,
              help="SPPO: fix multiplexed sequence partitioning on or off (default: the search tries both).")
@click.option("--top", default=15, show_default=True, type=int, help="Rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranked candidates as JSON.")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Folder for plan.json.")
@click.option("--no-plan", is_flag=True, help="Do not write plan.json.")
@click.option("--simulate-top", default="bound", show_default=True, callback=_simulate_top_value,
              help="Tier 2 (the event simulator): 'bound' simulates in order of a proved throughput bound until "
                   "no candidate left can beat the best simulated; 'all' every fitting candidate; a count N the "
                   "analytic tier's best N (0: none).")
@click.option("--allocator-lag", default=0, show_default=True, type=click.IntRange(0, 64),
              help="Tier 2: layers the GPU lags behind the CPU, holding collective buffers from the caching "
                   "allocator (record_stream); 0: the GPU keeps up.")
@click.option("--framework", default="any", show_default=True, type=click.Choice(list(FRAMEWORKS)),
              help="Search only what this framework offers, and compare its best plan with memo's.")
@click.option("--sweep-alpha", is_flag=True,
              help="Simulate MEMO at alpha = 0, 0.125, ..., 1 for the (best) fixed layout; writes alpha_sweep.png.")
@click.option("--jobs", type=click.IntRange(1, 1024),
              help="Tier 2: simulate candidates in this many processes (default: every core); results are the "
                   "serial run's, in the same order.")
@progress_option
def whatif(model_name, layers, hidden, heads, ffn, vocab, dtype, precision, seq, gpus, profile_name, batch, global_batch,
           micro_batch, tp, cp, ulysses, dp, zero, sp, tp_mode, train_tokens, metp_across_nodes, policies, alpha, pp,
           vpp, schedules,
           subseqs, partition, multiplex, top, as_json, out_dir, no_plan, simulate_top, allocator_lag, framework,
           sweep_alpha, jobs, progress):
    """Rank layouts x policies x alpha for a model, sequence length and cluster; write plan.json.

    Simulated rows (tier 2, the event simulator) are listed apart from analytic-only rows (tier 1),
    rows that do the same thing under two policy names (memo at alpha=1 and full_offload) once.

    Exit status: 0 when a plan fits (plan.json written unless --no-plan), 3 when no candidate
    fits (nothing written; the advice names what was not searched), 2 on bad input.
    """
    from memo_sim.search.whatif import (binding_words, candidates_for, default_jobs, fold_duplicates, not_searched,
                                        rank)

    jobs = jobs or default_jobs()
    quiet = as_json if progress is None else not progress  # a bar only for runs longer than a second

    t0 = time.perf_counter()
    if tp_mode is None:  # a fixed flag is honoured as asked: --tp N means Megatron TP unless --tp-mode says more
        tp_mode = "megatron" if tp is not None else "all"
    train_budget = parse_token_budget(train_tokens) if train_tokens is not None else None
    model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype, precision)
    profile = load_profile(profile_name)
    profile.peak(model.dtype)  # a clear error if the profile has no peak for the model's dtype
    fixed = dict(batch=batch, global_batch=global_batch, micro_batch=micro_batch, tp=tp, cp=cp, ulysses=ulysses,
                 dp=dp, zero=zero, sp=sp, alpha=alpha, tp_mode=tp_mode, metp_across_nodes=metp_across_nodes, pp=pp,
                 vpp=vpp, schedules=tuple(schedules) or None, subseqs=subseqs, partition=partition,
                 multiplex=multiplex)
    if (subseqs or partition or multiplex is not None) and not policies:
        policies = ("sppo",)  # SPPO's own flags plan SPPO
    if sweep_alpha:  # MEMO's alpha on one layout (no SPPO search)
        from memo_sim.layout.schedule import schedule_runs_policy
        from memo_sim.search.frameworks import get_framework

        pols = tuple(policies) or tuple(p for p in get_framework(framework).policies
                                        if not schedule_runs_policy("sppo", p))
        result = candidates_for(model, seq, gpus, profile, policies=pols, framework=framework, **fixed)
        return _sweep_alpha(model, seq, profile, result, as_json, out_dir, t0, quiet)
    with delayed_progress("simulating", quiet, force=progress) as on_progress:
        result = rank(model, seq, gpus, profile, simulate_top=simulate_top, progress=on_progress,
                      allocator_lag=allocator_lag, policies=tuple(policies) or None, framework=framework, jobs=jobs,
                      **fixed)
    n_sim = result.simulated
    memo_best = None
    if framework != "any":  # what memo would do with the same cluster, beside the framework's best
        memo_best = rank(model, seq, gpus, profile, simulate_top=1, allocator_lag=allocator_lag, jobs=1, **fixed).best
    best = result.best
    plan_path = sppo_plan_path = None
    if best is not None and not no_plan:
        plan_path = write_plan(build_plan(best), Path(out_dir) / "plan.json")
        sppo_best = next((c for c in result.candidates if c.sppo is not None and c.status == "OK"), None)
        if sppo_best is not None and sppo_best is not best:
            sppo_plan_path = write_plan(build_plan(sppo_best), Path(out_dir) / "plan-sppo.json")
    metp_rows = _metp_vs_megatron(result.candidates, alpha)
    shown = fold_duplicates(result.candidates)
    advice = not_searched(gpus, tuple(policies) or None, framework, fixed) if best is None else []
    elapsed = time.perf_counter() - t0
    if as_json:
        obj = {"model": model.to_dict(), "seq_tokens": seq, "gpus": gpus,
               "batch": batch if batch or global_batch else 1, "global_batch": global_batch,
               "micro_batch": micro_batch, "profile": profile.name,
               "profile_provenance": {"calibrated": profile.calibrated, "line": profile.provenance_line()},
               "searched": result.searched,
               "elapsed_s": elapsed, "simulated_candidates": n_sim,
               "tier2": result.tier2.to_dict() if result.tier2 is not None else None, "plan_file": str(plan_path) if plan_path else None,
               "framework": framework, "tp_mode": tp_mode,
               "sppo_plan_file": str(sppo_plan_path) if sppo_plan_path else None,
               "sppo": result.sppo_summary,
               "metp_vs_megatron": metp_rows,
               "memo_best": memo_best.to_json() if memo_best is not None else None,
               "train_tokens": train_budget,
               **_training_json(best, train_budget),
               "candidates": [dict(rank=i + 1, **c.to_json()) for i, c in enumerate(shown)],
               "folded_duplicates": len(result.candidates) - len(shown),
               "nothing_fits": best is None, "not_searched": advice,
               "rejected_layouts": [{"layout": lay.label(), "reason": why} for lay, why in result.rejected_layouts]}
        click.echo(json.dumps(obj, indent=1))
        if best is None:
            click.get_current_context().exit(NOTHING_FITS)
        return
    batch_words = (f"{global_batch} sequences per iteration" if global_batch else f"{batch} per replica" if batch
                   else "1 per replica" + (" (a pipeline: pp micro-batches per replica)"
                                           if result.searched.get("pipeline") else ""))
    click.echo(f"{model.name} ({model.params() / 1e9:.2f}B params), {fmt_count(seq)} tokens x {batch_words}, "
               f"{gpus} x {profile.gpu.model} ({profile.name})")
    click.echo(f"profile {profile.name}: {profile.provenance_line()}")
    click.echo("searched: " + _searched_words(result.searched))
    sim_rows = [(i, c) for i, c in enumerate(shown) if c.simulated is not None]
    ana_rows = [(i, c) for i, c in enumerate(shown) if c.simulated is None]
    budget = max(0, top)
    if sim_rows:
        click.echo(f"Simulated (tier 2: the event simulator, with link contention and copy stalls), "
                   f"{len(sim_rows)} candidates:")
        click.echo(_table(sim_rows[:budget], simulated=True))
    rest = budget - min(budget, len(sim_rows))
    if ana_rows and rest:
        click.echo(f"Analytic only (tier 1: perfect overlap, no contention; not simulated, so their MFU is an "
                   f"upper estimate and not comparable with the rows above), {len(ana_rows)} candidates"
                   f"{f', first {rest}' if rest < len(ana_rows) else ''}:")
        click.echo(_table(ana_rows[:rest], simulated=False))
    folds: dict[tuple[str, str], list[str]] = {}
    for i, c in enumerate(shown[:top]):
        for label in c.folded:
            folds.setdefault((label, c.policy.label()), []).append(f"#{i + 1}")
    for (label, kept), where in folds.items():
        click.echo(f"  {label} moves and rebuilds the same bytes as {kept}: folded into {', '.join(where)}")
    if metp_rows:
        click.echo("METP against Megatron TP+SP with the same degrees and policy (analytic tier):")
        click.echo(render_table(
            ["METP plan", "status", "peak GPU", "iter", "TP+SP plan", "status", "peak GPU", "iter", "memory saved"],
            [[f"{r['layout']} {r['policy_label']}", r["status"], fmt_bytes(r["peak_gpu_bytes"]),
              fmt_time(r["analytic_iteration_s"]), f"{r['megatron_layout']} {r['megatron_policy_label']}",
              r["megatron_status"], fmt_bytes(r["megatron_peak_gpu_bytes"]), fmt_time(r["megatron_analytic_iteration_s"]),
              f"{100 * r['memory_saved_fraction']:.0f}%"] for r in metp_rows]))
    if result.sppo_summary:
        _print_sppo(result)
    n_ok = sum(c.status == "OK" for c in result.candidates)
    n_fold = len(result.candidates) - len(shown)
    click.echo(f"{len(result.candidates)} candidates ({n_ok} fit{f', {n_fold} duplicates folded' if n_fold else ''}), "
               f"{len(result.rejected_layouts)} layouts rejected; {elapsed:.2f} s")
    if result.tier2 is not None:
        click.echo(result.tier2.line())
    if best is None:
        first = shown[0] if shown else None
        click.echo("no candidate fits this cluster: no plan.json written (exit status 3).")
        if first is not None:
            click.echo(f"  closest: {first.layout.label()} {first.policy.label()}: {binding_words(first)}")
        click.echo("  not searched: " + "; ".join(advice))
    elif plan_path or no_plan:
        click.echo(f"best: {best.layout.label()} {best.policy.label()}" + (f" -> {plan_path}" if plan_path else ""))
        why = binding_words(best)
        if why:
            click.echo(f"  {why}")
        if best.schedule in PIPELINE_SCHEDULES:
            gap = executor_stage_limit(best.layout.tp, best.layout.tp_mode, best.layout.cp, best.layout.ulysses,
                                       best.layout.zero)
            if gap:
                click.echo(f"  note: memo-exec does not run this plan yet ({gap}); `memo-sim export` writes it for "
                           f"Megatron-LM, or fix --cp 1 --ulysses 1 for a plan it runs")
        if train_budget is not None:
            days, gpu_hours = _training_time(best, train_budget)
            click.echo(f"  training {fmt_tokens(train_budget)} tokens at this plan's {best.tgs:,.0f} tokens/GPU/s on "
                       f"{best.layout.gpus} GPUs: {days:,.1f} days, {gpu_hours:,.0f} GPU-hours")
    if sppo_plan_path:
        c = next(c for c in result.candidates if c.sppo is not None and c.status == "OK")
        click.echo(f"best SPPO plan: {c.layout.label()} {c.policy.label()} -> {sppo_plan_path}")
    if framework != "any":
        mine = f"{best.layout.label()} {best.policy.label()}, {best.tgs:.0f} tokens/GPU/s" if best else "nothing fits"
        theirs = (f"{memo_best.layout.label()} {memo_best.policy.label()}, {memo_best.tgs:.0f} tokens/GPU/s"
                  if memo_best else "nothing fits")
        ratio = f" ({memo_best.tgs / best.tgs:.2f}x)" if best and memo_best else ""
        click.echo(f"{framework}'s best: {mine}; memo's best: {theirs}{ratio}")
    if best is None:
        click.get_current_context().exit(NOTHING_FITS)


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


def _searched_words(searched: dict) -> str:
    """What the what-if searched, in one line."""
    words = ", ".join(searched.get("schedules", ())) or "nothing"
    pipe = searched.get("pipeline")
    if pipe:
        words += (f"; pipelines ({pipe['why']}): pp {', '.join(map(str, pipe['pp'])) or '-'}, "
                  f"vpp {', '.join(map(str, pipe['vpp'])) or '-'}, micro-batch "
                  f"{', '.join(map(str, pipe['micro_batch'])) or '-'}")
    elif "single_stage" in searched.get("schedules", ()):
        words += "; no micro-batch pipelines (--pp, --vpp or --schedule 1f1b ask for them)"
    return words


def _schedule_text(c) -> str:
    """A candidate's schedule and batch split: ``1f1b 8x1`` (8 micro-batches of 1 sequence)."""
    return f"{c.schedule} {c.micro_batches}x{c.micro_batch}"


def _table(rows, simulated: bool) -> str:
    """Rows (rank, candidate) of one tier; simulated ones show the simulator's numbers."""
    out = []
    split = any(c.schedule not in ("single_stage", "sppo") or c.micro_batches > 1 for _i, c in rows)
    for i, c in rows:
        e, m, sm = c.estimate, c.memory, c.simulated
        r = [str(i + 1), c.layout.label(), c.policy.label() if c.sppo is not None else c.policy.name,
             "-" if c.policy.alpha is None else f"{c.policy.alpha:.3f}", status_text(c.status, c.over_bytes),
             fmt_time(e.iteration_s)]
        if simulated:
            r.append(fmt_time(sm["iteration_s"]) if sm["iteration_s"] else "-")
        r += [f"{100 * (sm['mfu'] if sm else e.mfu):.1f}%" if (sm is None or sm["mfu"] is not None) else "-",
              f"{(sm['tgs_tokens_per_gpu_s'] if sm else e.tgs):.0f}" if (sm is None or sm["tgs_tokens_per_gpu_s"])
              else "-",
              fmt_bytes(sm["peak_gpu_bytes"] if sm else m.peak_gpu_bytes), fmt_bytes(m.host_bytes_per_node),
              fmt_time(sm["exposed_copy_s"] if sm else e.exposed_copy_s)]
        if split:
            r.insert(2, _schedule_text(c))
        out.append(r)
    head = ["#", "layout"] + (["schedule"] if split else []) + ["policy", "alpha", "status", "iter (analytic)"] \
        + (["iter (sim)"] if simulated else []) + ["MFU", "TGS", "peak GPU", "host/node", "copy stall"]
    return render_table(head, out)


def _print_sppo(result) -> None:
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
                     fmt_bytes(d["peak_gpu_bytes"]), f"stage {d.get('worst_stage')} {d.get('peak_at') or ''}"])
    click.echo(f"SPPO: {sm['solved_points']} of {sm['space_size']} (SP, PP, N, partition, multiplex) points solved "
               f"(branch and bound on the analytic tier); {sm.get('heuristic_note', '')}")
    click.echo(render_table(["SPPO", "plan", "(SP, PP, N)", "status", "iter (analytic)", "iter (sim)", "TGS",
                             "peak GPU", "peak at"], rows))
    frac = sm.get("heuristic_tgs_fraction_of_best")
    if frac is not None:
        click.echo(f"  the heuristic's plan reaches {100 * frac:.1f}% of the best SPPO throughput found "
                   f"({sm.get('compared_on')})")
    fails = [c for c in result.candidates if c.sppo is not None and c.status != "OK"][:3]
    for c in fails:
        click.echo(f"  {c.layout.label()} {c.policy.label()}: {c.alpha_note}")


METP_COMPARED = 5  # METP candidates compared with their Megatron TP+SP twins


def _metp_vs_megatron(candidates, alpha) -> list[dict]:
    """The best METP candidates (one per layout and policy) beside their Megatron TP+SP twins."""
    from memo_sim.layout.parallel import check_layout
    from memo_sim.search.whatif import megatron_twin

    out = []
    for c in [c for c in candidates if c.layout.metp][:METP_COMPARED]:
        t = megatron_twin(c, alpha)
        m, tm = c.memory, t.memory
        why = check_layout(t.layout, c.model, t.layout.gpus, c.profile.node_gpus, c.seq, c.batch)
        out.append({"layout": c.layout.label(), "policy": c.policy.name, "policy_label": c.policy.label(),
                    "status": c.status, "peak_gpu_bytes": m.peak_gpu_bytes,
                    "analytic_iteration_s": c.estimate.iteration_s,
                    "megatron_layout": t.layout.label(), "megatron_policy_label": t.policy.label(),
                    "megatron_status": "invalid" if why else t.status, "megatron_invalid_reason": why,
                    "megatron_peak_gpu_bytes": tm.peak_gpu_bytes,
                    "megatron_analytic_iteration_s": t.estimate.iteration_s,
                    "memory_saved_fraction": 1.0 - m.peak_gpu_bytes / tm.peak_gpu_bytes})
    return out


def _sweep_alpha(model, seq, profile, result, as_json, out_dir, t0, quiet):
    from memo_sim.engine.simulate import DEFAULT_ALPHAS, sweep_alpha
    from memo_sim.report.figures import alpha_sweep_figure

    memo = [c for c in result.candidates if c.policy.takes_alpha]
    if not memo:
        raise MemoError("--sweep-alpha needs the memo policy among --policy")
    layout = memo[0].layout
    layouts = {c.layout for c in result.candidates}
    solved = memo[0].policy.alpha
    with delayed_progress("alpha sweep", quiet) as on_progress:
        res = sweep_alpha(model, layout, memo[0].batch, seq, profile, DEFAULT_ALPHAS, progress=on_progress,
                          schedule=memo[0].schedule, micro_batch=memo[0].micro_batch)
    png = alpha_sweep_figure(res, Path(out_dir) / "alpha_sweep.png", solver_alpha=solved)
    if as_json:
        click.echo(json.dumps({"model": model.to_dict(), "seq_tokens": seq, "profile": profile.name,
                               "layout": layout.label(), "layout_degrees": layout.to_dict(),
                               "layout_note": "fixed by flags" if len(layouts) == 1 else
                               f"best of {len(layouts)} valid layouts (fix --tp/--cp/--dp/--zero to choose)",
                               "solver_alpha": solved, "figure": str(png),
                               "sweep": [r.to_dict() for r in res], "elapsed_s": time.perf_counter() - t0},
                              indent=1))
        return
    click.echo(f"{model.name}, {fmt_count(seq)} tokens, {layout.label()} on {profile.name}: MEMO alpha sweep "
               f"(solver's alpha {solved:.3f})")
    rows = [[f"{r.policy.alpha:.3f}", status_text(r.status, 0.0) if r.status == "OK" else r.status,
             fmt_time(r.iteration_s), f"{100 * r.mfu:.1f}%", fmt_bytes(r.peak_gpu_bytes),
             fmt_bytes(r.peak_host_bytes_per_node), fmt_time(r.exposed_copy_s)] for r in res]
    click.echo(render_table(["alpha", "status", "iter (sim)", "MFU", "peak GPU", "host/node", "copy stall"], rows))
    click.echo(f"figure: {png}")


def _training_json(best, tokens: int | None) -> dict:
    if tokens is None or best is None:
        return {"train_days": None, "train_gpu_hours": None}
    days, gpu_hours = _training_time(best, tokens)
    return {"train_days": days, "train_gpu_hours": gpu_hours}


def fmt_tokens(n: int) -> str:
    """A token budget the way it is quoted: 300B, 1.5T."""
    for unit, v in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= v:
            return f"{n / v:.4g}{unit}"
    return str(n)


def _training_time(c, tokens: int) -> tuple[float, float]:
    """(days, GPU-hours) to train ``tokens`` tokens at candidate ``c``'s throughput."""
    seconds = tokens / (c.tgs * c.layout.gpus)
    return seconds / 86400, seconds * c.layout.gpus / 3600
