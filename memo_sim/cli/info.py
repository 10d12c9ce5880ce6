"""memo-sim profiles, models, frameworks, check-plan: what is there and whether a plan is valid."""

from __future__ import annotations

import click

from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS
from memo_sim.plan.schema import read_plan
from memo_sim.profile.loader import list_profiles, load_profile
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
    """List the model presets."""
    rows = [[m.name, str(m.layers), str(m.hidden), str(m.heads), str(m.n_kv_heads), str(m.ffn), m.ffn_type,
             str(m.vocab), f"{m.params() / 1e9:.2f}B"] for m in PRESETS.values()]
    click.echo(render_table(["name", "layers", "hidden", "heads", "kv_heads", "ffn", "ffn_type", "vocab", "params"],
                            rows))


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
    plan = read_plan(plan_file)
    p = plan.predicted
    check = getattr(plan.policy, "check", None)  # SPPO: the subsequence plan must fit the layout and length
    why = check(plan.model, plan.layout, plan.batch, plan.seq_tokens) if check else None
    if why:
        from memo_sim.errors import PlanError

        raise PlanError(f"{plan_file}: policy: {why}")
    click.echo(f"{plan_file}: valid {plan.model.name}, {fmt_count(plan.seq_tokens)} tokens, {plan.gpus} GPUs, "
               f"{plan.layout.label()}, {plan.policy.label()}, predicted {p.status} "
               f"{fmt_time(p.iteration_s or 0.0)}/iter, MFU {100 * (p.mfu or 0.0):.1f}%")
    if getattr(plan.policy, "pipelined", False):
        b, a = plan.policy.bounds, plan.policy.alphas
        click.echo(f"  SPPO: PP={plan.layout.pp}, N={plan.policy.subseqs} ({plan.policy.partition} partition"
                   f"{', multiplexed' if plan.policy.multiplex else ''}); subsequence lengths "
                   f"{b[1] - b[0]}..{b[-1] - b[-2]} tokens; alpha_i {min(a):.3f}..{max(a):.3f}")


COMMANDS = (profiles, models, frameworks, check_plan)
