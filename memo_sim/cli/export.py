"""memo-sim export: a plan as the files Megatron-LM, torchtitan or DeepSpeed read."""

from __future__ import annotations

import click

from memo_sim.errors import MemoError
from memo_sim.export import EXPORTERS, export_plan
from memo_sim.export.base import instead_lines, price_line
from memo_sim.fileio import atomic_write_text, output_folder
from memo_sim.plan.schema import read_plan


@click.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "framework", required=True, type=click.Choice(list(EXPORTERS)),
              help="The framework to write the plan for.")
@click.option("--out", "out_dir", default="export", show_default=True, type=click.Path(file_okay=False),
              help="Folder the framework's files are written to.")
@click.option("--price/--no-price", default=True, show_default=True,
              help="Simulate the nearest plan the framework can run where it cannot express the plan.")
@click.option("--nearest", is_flag=True,
              help="Where the framework cannot express the plan, write the plan with its nearest settings "
                   "(default: the best plan memo predicts the framework runs, beside what it gives up).")
def export(plan_file, framework, out_dir, price, nearest):
    """Write PLAN_FILE for Megatron-LM, torchtitan or DeepSpeed; list what it cannot express. Where it
    cannot express the plan, the best plan the framework runs is written instead (--nearest: the plan's
    nearest settings)."""
    plan = read_plan(plan_file)
    ex = export_plan(plan, framework, price=price, nearest=nearest)
    try:  # the framework's files as one set: all of them, or --out as it was
        with output_folder(out_dir, f"memo-sim export --to {framework}") as outf:
            staged = [atomic_write_text(outf.stage / name, text) for name, text in ex.files.items()]
    except OSError as e:
        raise MemoError(f"--out {out_dir}: cannot write there ({e.strerror}); choose a writable folder") from None
    written = [outf.path(p) for p in staged]
    click.echo(f"{plan_file} -> {ex.framework} ({ex.source}): {', '.join(str(p) for p in written)}")
    click.echo(f"  run: {ex.launch}")
    if ex.instead is not None:
        for line in instead_lines(ex.instead, ex.framework):
            click.echo(f"  {line}")
    if ex.gaps:
        click.echo(f"  not expressible in {ex.framework} ({len(ex.gaps)}):")
        for g in ex.gaps:
            click.echo(f"    - {g.what} -> {g.nearest}")
        if ex.nearest is not None:
            click.echo("  " + price_line(ex.nearest))
    else:
        click.echo(f"  every part of the {'plan written' if ex.instead is not None else 'plan'} is expressed in "
                   f"{ex.framework}")
