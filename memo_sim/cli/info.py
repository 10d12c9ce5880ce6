"""memo-sim profiles, models, frameworks, check-plan: what is there and whether a plan is valid."""

from __future__ import annotations

import click

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS
from memo_sim.plan.schema import read_plan
from memo_sim.profile.loader import list_profiles, load_profile
from memo_sim.report.formats import fmt_params, plural
from memo_sim.report.peaks import planned_peak
from memo_sim.report.table import render_table
from memo_sim.units import fmt_bytes, fmt_count, fmt_time


@click.command()
def profiles():
    """List the hardware profiles memo can find."""
    rows = []
    for name, path in sorted(list_profiles().items()):
        try:
            p = load_profile(path)
            rows.append([name, p.gpu.model, fmt_bytes(p.gpu_memory), f"{p.peak() / 1e12:.0f}",
                         str(p.node_gpus), fmt_bytes(float(p.host.memory_bytes)), str(path)])
        except MemoError as e:
            rows.append([name, f"INVALID: {e}", "", "", "", "", str(path)])
    click.echo(render_table(["name", "gpu", "memory", "bf16 TFLOP/s", "gpus/node", "host/node", "file"], rows))


@click.command()
def models():
    """List the model presets (any Hugging Face config.json of a dense decoder works too: --model PATH)."""
    rows = [[m.name, str(m.layers), str(m.hidden), str(m.heads), str(m.n_kv_heads), str(m.ffn), m.ffn_type,
             m.norm, m.bias, "yes" if m.tied_embeddings else "no", str(m.vocab), fmt_params(m.params())]
            for m in PRESETS.values()]
    click.echo(render_table(["name", "layers", "hidden", "heads", "kv_heads", "ffn", "ffn_type", "norm", "bias",
                             "tied", "vocab", "params"], rows))
    click.echo("tied: the classifier reuses the token embedding (counted once). llama-7b and llama-70b are the "
               "papers' shapes with GPT's norms, biases and tied embeddings; llama-2-7b and llama-2-70b are the "
               "released models.")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Every field of every framework file, with its sources.")
def frameworks(as_json):
    """List the framework versions (--framework NAME): policies, mechanisms, what memo does not model."""
    import json

    from memo_sim.frameworks import load_frameworks

    fws = load_frameworks()
    if as_json:
        click.echo(json.dumps({n: {"summary": f.summary, "policies": list(f.policies), "mechanisms": dict(f.mechanisms),
                                   "not_modelled": list(f.not_modelled), "sources": list(f.sources), "file": f.path}
                               for n, f in fws.items()}, indent=1))
        return
    rows = [[n, ", ".join(f.policies), ", ".join(f"{k}={v}" for k, v in f.mechanisms),
             "; ".join(f.not_modelled) or "-"] for n, f in fws.items()]
    click.echo(render_table(["name", "policies", "mechanisms", "not modelled"], rows))


@click.command("check-plan")
@click.argument("plan_file", type=click.Path(dir_okay=False))
def check_plan(plan_file):
    """Validate a plan.json and summarise it."""
    from memo_sim.errors import PlanError
    from memo_sim.search.plan_check import plan_problems

    plan = read_plan(plan_file)
    p = plan.predicted
    problems = plan_problems(plan)
    if problems:
        raise PlanError(f"{plan_file}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

    def num(v, fmt) -> str:
        return "n/a" if v is None else fmt(v)

    click.echo(f"{plan_file}: valid {plan.model.name}, {fmt_count(plan.seq_tokens)} tokens, {plural(plan.gpus, 'GPU')}, "
               f"{plan.layout.label()}, {plan.policy.label()}, predicted {p.status} "
               f"{num(p.iteration_s, fmt_time)}/iter, MFU {num(p.mfu, lambda m: f'{100 * m:.1f}%')}")
    click.echo(f"  schedule {plan.schedule}: {plural(plan.micro_batches, 'micro-batch', 'micro-batches')} of "
               f"{plural(plan.micro_batch, 'sequence')}"
               + (f", {plan.layout.pp} stages x {plan.layout.vpp} chunks" if plan.schedule != "sppo" and
                  plan.layout.pp > 1 else ""))
    peak = planned_peak(plan)
    if peak is not None:
        click.echo(f"  predicted peak GPU {peak.text()}")
    if plan.memory_plan is not None:
        click.echo(f"  memory plan: transient arena {fmt_bytes(plan.memory_plan.transient_arena_bytes)}, "
                   f"{sum(len(ph.offsets) for ph in plan.memory_plan.phases.values())} tensors placed "
                   f"(checked against this layer's forward and backward)")
    if plan.schedule == "sppo":
        b, a = plan.policy.bounds, plan.policy.alphas
        click.echo(f"  SPPO: PP={plan.layout.pp}, N={plan.policy.subseqs} ({plan.policy.partition} partition"
                   f"{', multiplexed' if plan.policy.multiplex else ''}); subsequence lengths "
                   f"{b[1] - b[0]}..{b[-1] - b[-2]} tokens; alpha_i {min(a):.3f}..{max(a):.3f}")
    _binding_and_memory(plan)


def _binding_and_memory(plan) -> None:
    """What binds and the memory at the peak, from one simulated iteration: the lines and table of
    `memo-sim explain` (`memo_sim.cli.explain`), so the words are written once."""
    from memo_sim.cli.explain import add_memory_part, binding_words, plan_breakdown, simulate_plan
    from memo_sim.profile.loader import load_profile
    from memo_sim.report.formats import Answer, render

    profile = load_profile(plan.profile)
    res = simulate_plan(plan, profile)
    a = Answer()
    a.line(f"  binding: {binding_words(plan, profile, res)}")
    add_memory_part(a, plan, res, plan_breakdown(plan, profile))
    a.line("(memo-sim explain PLAN: the time breakdown as well)")
    click.echo(render(a, "table"))


COMMANDS = (profiles, models, frameworks, check_plan)
