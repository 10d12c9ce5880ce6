"""memo-sim maxseq: the longest sequence each policy trains on a cluster, and what binds next."""

from __future__ import annotations

import json
import time

import click

from memo_sim.cli.common import GPU_COUNT, build_model, count_option, model_options, profile_option, progress_bar
from memo_sim.layout.schedule import schedule_runs_policy
from memo_sim.policy import policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.report.table import render_table
from memo_sim.search.frameworks import FRAMEWORKS, get_framework
from memo_sim.units import fmt_count


@click.command()
@model_options
@click.option("--gpus", default=8, show_default=True, type=GPU_COUNT, help="Number of GPUs.")
@profile_option()
@click.option("--policy", "policies", multiple=True, type=click.Choice(policy_names()),
              help="Only these activation policies (repeatable; default: all the framework offers but sppo, "
                   "whose pipeline search runs at every probed length: ask for it with --policy sppo).")
@click.option("--framework", default="any", show_default=True, type=click.Choice(list(FRAMEWORKS)),
              help="Only layouts and policies this framework offers.")
@click.option("--step", default="128K", callback=count_option, show_default=True,
              help="Granularity of the answer, in tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the answers as JSON.")
def maxseq(model_name, layers, hidden, heads, ffn, vocab, dtype, precision, gpus, profile_name, policies, framework,
           step, as_json):
    """The longest sequence (a multiple of --step) each policy trains, its MFU there, and the
    constraint that binds at the next step."""
    from memo_sim.search.maxseq import max_seq

    t0 = time.perf_counter()
    model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype, precision)
    profile = load_profile(profile_name)
    profile.peak(model.dtype)
    pols = tuple(policies) or tuple(p for p in get_framework(framework).policies
                                    if not schedule_runs_policy("sppo", p))
    answers = []
    with progress_bar("searching", len(pols), quiet=as_json) as tick:
        for p in pols:
            answers.append(max_seq(model, gpus, profile, p, step=step, framework=framework))
            tick()
    if as_json:
        click.echo(json.dumps({"model": model.to_dict(), "gpus": gpus, "profile": profile.name, "framework": framework,
                               "answers": [a.to_json() for a in answers], "elapsed_s": time.perf_counter() - t0},
                              indent=1))
        return
    click.echo(f"{model.name}, {gpus} x {profile.gpu.model} ({profile.name}), framework {framework}, "
               f"step {fmt_count(step)}")
    rows = []
    for a in answers:
        b = a.best
        mfu = (b.simulated or {}).get("mfu") if b else None
        rows.append([a.policy, fmt_count(a.max_seq) if a.max_seq else "none",
                     f"{b.layout.label()} {b.policy.label()}" if b else "-",
                     f"{100 * mfu:.1f}%" if mfu is not None else "-", f"{fmt_count(a.next_seq)}: {a.binding}"])
    click.echo(render_table(["policy", "longest", "best plan there", "MFU (sim)", "first failure: what binds"], rows))
    click.echo(f"{time.perf_counter() - t0:.1f} s")


COMMANDS = (maxseq,)
