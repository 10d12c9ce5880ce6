"""memo-sim export: a plan as the files Megatron-LM, torchtitan or DeepSpeed read."""

from __future__ import annotations

import click

from memo_sim.cli.common import progress_option, refuse_unwritable_out
from memo_sim.errors import MemoError
from memo_sim.export import EXPORTERS, export_plan
from memo_sim.export.base import instead_lines, price_line
from memo_sim.fileio import atomic_write_text, output_folder
from memo_sim.plan.schema import read_plan


def _announce(framework: str) -> None:
    click.echo(f"the plan is not expressible in {framework}: searching the best plan it runs (the what-if "
               f"constrained to --framework {framework}; minutes for a large model's pipelines; --nearest skips it)",
               err=True)


def _no_format(value) -> None:
    """``--format`` is the what-if's output format: given to export (a user's review typed ``--format megatron``) it
    says which option names the framework."""
    if value is not None:
        raise MemoError(f"--format {value}: export names its framework with --to ({', '.join(EXPORTERS)}), e.g. "
                        f"`memo-sim export plan.json --to megatron`")


def _warn_if_stale(plan_file, plan) -> None:
    """A plan whose stored prediction is not what memo predicts for it now (edited, or of another profile or memo
    version: `memo_sim.plan.stale`, check-plan's and memo-exec's rule) is exported as written, with a warning on
    stderr: a review exported a plan edited onto a smaller GPU, which no longer fits, with no word of it, and the
    comparison below priced against its stale step time."""
    from memo_sim.engine.simulate import simulate  # noqa: PLC0415
    from memo_sim.plan.stale import stale_plan  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    res = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, load_profile(plan.profile),
                   keep_timeline=False, schedule=plan.schedule, micro_batch=plan.micro_batch,
                   classifier_chunk_tokens=plan.classifier_chunk_tokens)
    words = stale_plan(plan, res)  # every number a report compares, the plan's layer_timings_s too
    if words is None:
        return
    why = f" ({res.failure.message()})" if res.status != "OK" and res.failure is not None else ""
    fits = (f"memo predicts it does not fit on {plan.profile}{why}; " if res.status != "OK" else "")
    click.echo(f"warning: {plan_file}: {words}{why if not fits else ''}: {fits}exported as written, the comparisons "
               f"below against its stored prediction (`memo-sim check-plan {plan_file}` re-simulates it; `memo-sim "
               f"whatif` plans afresh)", err=True)


def _refuse_a_layout_the_whatif_refuses(plan_file, plan) -> None:
    """A plan whose layout the what-if refuses for its model and length (an edited plan: `memo-sim check-plan`'s
    `layout_problem`) is refused in one line: the script would not run (a review: 131,073 tokens exported beside
    --context-parallel-size 4 --sequence-parallel); so is one check-plan refuses for its own fields (a framework
    memo does not know: `memo_sim.cli.explain.refuse_runnable_problems`)."""
    from memo_sim.search.plan_check import refuse_layout_problem  # noqa: PLC0415

    from memo_sim.cli.common import plan_profile, refuse_plan_gemm_format  # noqa: PLC0415

    profile = plan_profile(plan_file, plan, has_flag=False)
    refuse_plan_gemm_format(plan_file, plan, profile, profile_flag=False)  # as simulate, explain, check-plan
    refuse_layout_problem(plan_file, plan, profile)
    from memo_sim.cli.explain import refuse_runnable_problems  # noqa: PLC0415

    refuse_runnable_problems(plan_file, plan, profile)  # its framework and policy fields, as check-plan and explain


@click.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "framework", required=True, type=click.Choice(list(EXPORTERS)),
              help="The framework to write the plan for.")
@click.option("--format", "format_given", hidden=True, is_eager=True, expose_value=False,
              callback=lambda ctx, param, value: _no_format(value))
@click.option("--out", "out_dir", default="export", show_default=True, type=click.Path(file_okay=False),
              help="Folder the framework's files are written to.")
@click.option("--price/--no-price", default=True, show_default=True,
              help="Simulate the nearest plan the framework runs (with --nearest, or where every part is expressed "
                   "but the framework's mechanisms differ); the default's search for the framework's best plan, "
                   "where one is written instead, simulates its plans either way.")
@click.option("--nearest", is_flag=True,
              help="Where the framework cannot express the plan, write the plan with its nearest settings "
                   "(default: the best plan memo predicts the framework runs, beside what it gives up).")
@click.option("--jobs", type=click.IntRange(1, 1024),
              help="Processes for the search of the framework's best plan, where one is written instead (default: "
                   "every core).")
@progress_option
def export(plan_file, framework, out_dir, price, nearest, jobs, progress):
    """Write PLAN_FILE for Megatron-LM, torchtitan or DeepSpeed; list what it cannot express. Where it
    cannot express the plan, the best plan the framework runs is written instead (--nearest: the plan's
    nearest settings)."""
    from memo_sim.cli.whatif import delayed_progress  # noqa: PLC0415
    from memo_sim.search.whatif import default_jobs  # noqa: PLC0415

    plan = read_plan(plan_file)
    _refuse_a_layout_the_whatif_refuses(plan_file, plan)
    # an unwritable --out fails now, before the stale check's simulation and the framework's search (a review: a
    # DeepSeek-V3 plan searched 69 s, then refused /dev/null/x)
    refuse_unwritable_out(out_dir, f"memo-sim export --to {framework}")
    if price:
        _warn_if_stale(plan_file, plan)
    with delayed_progress(f"searching {framework}'s plans", quiet=progress is False, force=progress) as on_progress:
        ex = export_plan(plan, framework, price=price, nearest=nearest, jobs=jobs or default_jobs(),
                         progress=on_progress, on_search=None if progress is False else _announce)
    try:  # the framework's files as one set: all of them, or --out as it was
        with output_folder(out_dir, f"memo-sim export --to {framework}") as outf:
            staged = [atomic_write_text(outf.stage / name, text) for name, text in ex.files.items()]
    except OSError as e:
        raise MemoError(f"--out {out_dir}: cannot write there ({e.strerror}); choose a writable folder") from None
    written = [outf.path(p) for p in staged]
    click.echo(f"{plan_file} -> {ex.framework} ({ex.source}): {', '.join(str(p) for p in written)}")
    click.echo(f"  run: {ex.launch}")
    for g in ex.gaps:
        if g.before_running:
            click.echo(f"  BEFORE RUNNING: {g.before_running}")
    if ex.instead is not None:
        for line in instead_lines(ex.instead, ex.framework):
            click.echo(f"  {line}")
    if ex.gaps:
        click.echo(f"  written otherwise than the plan or model has it ({len(ex.gaps)}; each says why: what "
                   f"{ex.framework} lacks, or what memo does not model or write):")
        for g in ex.gaps:
            click.echo(f"    - {g.what} -> {g.nearest}")
        if ex.nearest is not None:
            click.echo("  " + price_line(ex.nearest))
    else:
        click.echo(f"  every part of the {'plan written' if ex.instead is not None else 'plan'} is expressed in "
                   f"{ex.framework}" + (", which runs it with its own mechanisms:" if ex.nearest is not None else ""))
        if ex.nearest is not None:
            click.echo("  " + price_line(ex.nearest))
