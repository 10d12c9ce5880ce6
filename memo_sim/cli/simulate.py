"""memo-sim simulate, plot, sweep-alpha, sweep-seq: the event simulator from the command line.

- ``memo-sim simulate plan.json --out DIR``: simulate the plan's iteration; write timeline.json,
  trace.json (Perfetto / chrome://tracing), gantt.png, memory.png and summary.json.
- ``memo-sim plot timeline.json --out DIR [--layers A:B]``: figures and trace.json from a saved
  timeline (simulated or measured).
- ``memo-sim sweep-alpha plan.json --out DIR``: the plan's model and layout under MEMO at each
  alpha; alpha_sweep.png and alpha_sweep.json.
- ``memo-sim sweep-seq plan.json --out DIR --seqs 64K,256K,1M``: every policy at each sequence
  length (MEMO at its solved alpha); mfu_vs_seq.png and mfu_vs_seq.json.

Bad input raises `MemoError`, which the ``memo-sim`` group prints as one line (exit code 2).
Sweeps show a progress bar on stderr.
"""

from __future__ import annotations

from pathlib import Path

import click

from memo_sim.cli.common import progress_bar
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json
from memo_sim.units import fmt_bytes, fmt_count, fmt_time, parse_count

LAYERS_HELP = "Layer range for the Gantt chart, both ends included (e.g. 14:16); default: the middle three."


def _load_plan_and_profile(plan_file: str, profile_override: str | None):
    from memo_sim.plan.schema import read_plan
    from memo_sim.profile.loader import load_profile

    plan = read_plan(plan_file)
    profile = load_profile(profile_override or plan.profile)
    return plan, profile


def _write_outputs(timeline, out: Path, layers_text: str | None, device: int = 0) -> list[Path]:
    from memo_sim.report.chrome_trace import write_chrome_trace
    from memo_sim.report.figures import gantt_figure, memory_figure, parse_layer_range

    n_layers = timeline.meta.get("layers")
    layers = parse_layer_range(layers_text, n_layers)
    written = [write_chrome_trace(timeline, out / "trace.json")]
    if timeline.events:
        written.append(gantt_figure(timeline, out / "gantt.png", layers, device))
    if timeline.memory:
        written.append(memory_figure(timeline, out / "memory.png"))
    return written


def _summary_line(r) -> str:
    if r.ok:
        a = r.allocator
        alloc = ("static memory plan" if a.get("static_memory_plan") else
                 f"caching allocator: {a['reorganizations']} reorganisations, stall {fmt_time(a['stall_s'])}")
        return (f"{r.status}: {fmt_time(r.iteration_s)}/iteration, MFU {100 * r.mfu:.1f}%, TGS {r.tgs:.0f}, "
                f"peak GPU {fmt_bytes(r.peak_gpu_bytes)}, peak host/node {fmt_bytes(r.peak_host_bytes_per_node)}, "
                f"copy stall {fmt_time(r.exposed_copy_s)}, {alloc}")
    return f"{r.failure.message()}"


@click.command("simulate")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--layers", "layers_text", default=None, help=LAYERS_HELP)
@click.option("--profile", "profile_override", default=None,
              help="Hardware profile name or file (default: the plan's profile).")
@click.option("--no-contention", is_flag=True, help="Give every op its stand-alone time (the analytic model).")
@click.option("--allocator-lag", default=0, show_default=True, type=click.IntRange(0, 64),
              help="Layers the GPU lags behind the CPU, holding collective buffers (record_stream); 0: it keeps up.")
def simulate_cmd(plan_file, out_dir, layers_text, profile_override, no_contention, allocator_lag):
    """Simulate a plan's training iteration; write timeline.json, trace.json and figures."""
    from memo_sim.engine.simulate import simulate

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    r = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, profile, allocator_lag=allocator_lag,
                 contention=not no_contention, classifier_chunk_tokens=plan.classifier_chunk_tokens)
    out = Path(out_dir)
    r.timeline.meta["plan_file"] = str(plan_file)
    written = [r.timeline.write_json(out / "timeline.json")]
    written += _write_outputs(r.timeline, out, layers_text)
    summary = r.to_dict()
    summary["plan_predicted"] = plan.predicted
    written.append(atomic_write_json(out / "summary.json", summary))
    click.echo(f"{plan.model.name}, {fmt_count(plan.seq_tokens)} tokens x {plan.batch}, {plan.layout.label()}, "
               f"{plan.policy.label()}, {profile.name}")
    click.echo(_summary_line(r))
    pred = plan.predicted.get("iteration_s")
    if r.ok and isinstance(pred, (int, float)) and pred > 0:
        click.echo(f"plan predicted {fmt_time(pred)} ({plan.predicted.get('source', '?')}); "
                   f"simulated/predicted = {r.iteration_s / pred:.3f}")
    click.echo(f"simulated {r.n_ops} ops in {r.sim_wall_s:.2f} s; wrote " + ", ".join(p.name for p in written)
               + f" to {out}")


@click.command("plot")
@click.argument("timeline_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--layers", "layers_text", default=None, help=LAYERS_HELP)
@click.option("--device", default=0, show_default=True, type=int, help="GPU whose streams the Gantt chart shows.")
def plot_cmd(timeline_file, out_dir, layers_text, device):
    """Gantt chart, memory curves and trace.json from a saved timeline."""
    from memo_sim.timeline import Timeline

    tl = Timeline.read_json(timeline_file)
    if not tl.events and not tl.memory:
        raise MemoError(f"{timeline_file}: the timeline has no events and no memory samples")
    written = _write_outputs(tl, Path(out_dir), layers_text, device)
    click.echo("wrote " + ", ".join(str(p) for p in written))


def _parse_alphas(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MemoError(f"--alphas: expected comma-separated numbers in [0, 1], got {text!r}") from None
    if not vals or any(not (0.0 <= v <= 1.0) for v in vals):
        raise MemoError(f"--alphas: every alpha must lie in [0, 1], got {text!r}")
    return vals


def _write_sweep(out: Path, name: str, results, figure, line) -> None:
    """Write a sweep's results as NAME.json and NAME.png and print one line per run."""
    atomic_write_json(out / f"{name}.json", [r.to_dict() for r in results])
    png = figure(results, out / f"{name}.png")
    for r in results:
        click.echo(line(r))
    click.echo(f"wrote {out / (name + '.json')}, {png}")


@click.command("sweep-alpha")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--alphas", default="0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1", show_default=True,
              help="Comma-separated alphas.")
@click.option("--profile", "profile_override", default=None, help="Hardware profile (default: the plan's).")
def sweep_alpha_cmd(plan_file, out_dir, alphas, profile_override):
    """Simulate the plan's model and layout under MEMO at each alpha; plot MFU and memory."""
    from memo_sim.engine.simulate import sweep_alpha
    from memo_sim.report.figures import alpha_sweep_figure

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    vals = _parse_alphas(alphas)
    with progress_bar("alpha sweep", len(vals)) as step:
        results = sweep_alpha(plan.model, plan.layout, plan.batch, plan.seq_tokens, profile, vals,
                              progress=lambda done, total: step())
    _write_sweep(Path(out_dir), "alpha_sweep", results, alpha_sweep_figure,
                 lambda r: f"alpha {r.policy.alpha:.3f}: {_summary_line(r)}")


@click.command("sweep-seq")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--seqs", default="64K,128K,256K,512K,1M", show_default=True, help="Comma-separated sequence lengths.")
@click.option("--profile", "profile_override", default=None, help="Hardware profile (default: the plan's).")
def sweep_seq_cmd(plan_file, out_dir, seqs, profile_override):
    """Every policy at each sequence length for the plan's model and layout; plot MFU."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.layout.parallel import check_layout
    from memo_sim.policy import get_policy, policy_class, policy_names
    from memo_sim.report.figures import mfu_vs_seq_figure
    from memo_sim.search.estimate import memo_alpha

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    lens = [parse_count(s.strip(), "--seqs") for s in seqs.split(",") if s.strip()]
    if not lens:
        raise MemoError("--seqs: give at least one sequence length")
    for s in lens:
        why = check_layout(plan.layout, plan.model, plan.layout.gpus, profile.node_gpus, s, plan.batch)
        if why:
            raise MemoError(f"--seqs: {fmt_count(s)} does not fit layout {plan.layout.label()}: {why}")
    runs = [(s, p) for s in lens for p in policy_names()]
    results = []
    with progress_bar("sequence sweep", len(runs)) as step:
        for s, p in runs:
            alpha = None
            if policy_class(p).takes_alpha:  # at its solved alpha
                a = memo_alpha(plan.model, plan.layout, plan.batch, s, profile)
                alpha = a.alpha if a.feasible else 0.0
            results.append(simulate(plan.model, plan.layout, plan.batch, s, get_policy(p, alpha), profile,
                                    keep_timeline=False))
            step()
    _write_sweep(Path(out_dir), "mfu_vs_seq", results, mfu_vs_seq_figure,
                 lambda r: f"{fmt_count(r.seq):>5} {r.policy.label():<18} {_summary_line(r)}")


COMMANDS = (simulate_cmd, plot_cmd, sweep_alpha_cmd, sweep_seq_cmd)
