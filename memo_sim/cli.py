"""memo-sim: what-if planning for long-context LLM training (no GPU, no torch).

Every user error is one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json
from memo_sim.model.config import PRESETS, ModelConfig, get_model
from memo_sim.plan.schema import read_plan, write_plan
from memo_sim.policy.policies import POLICIES
from memo_sim.profile.loader import list_profiles, load_profile
from memo_sim.report.table import render_table, status_text
from memo_sim.units import fmt_bytes, fmt_count, fmt_time, parse_count


def _count(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_count(value, f"--{param.name.replace('_', '-')}")
    except MemoError as e:
        raise click.BadParameter(str(e).split(": ", 1)[-1]) from None


def model_options(f):
    f = click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]),
                     help="Override the model dtype (fp32 for plans run on a CPU profile).")(f)
    f = click.option("--vocab", type=int, help="Override the vocabulary size.")(f)
    f = click.option("--ffn", type=int, help="Override the FFN width.")(f)
    f = click.option("--heads", type=int, help="Override the attention heads.")(f)
    f = click.option("--hidden", type=int, help="Override the hidden size.")(f)
    f = click.option("--layers", type=int, help="Override the number of layers (e.g. a 4-layer toy model).")(f)
    f = click.option("--model", "model_name", default="gpt-7b", show_default=True,
                     help="Preset name (memo-sim models) or a model .yaml/.json file.")(f)
    return f


def build_model(model_name: str, layers, hidden, heads, ffn, vocab, dtype=None) -> ModelConfig:
    base = get_model(model_name)
    over = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab,
                                  dtype=dtype).items() if v is not None}
    if not over:
        return base
    d = base.to_dict()
    d.update(over)
    d["name"] = f"{base.name}-custom"
    return ModelConfig.from_dict(d, source="model flags")


class MemoGroup(click.Group):
    """Turns MemoError into a one-line message and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MemoError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=MemoGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memo")
def cli():
    """Plan ultra-long-context LLM training: what-if, simulate, memory plans."""


@cli.command()
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


@cli.command()
def models():
    """List the model presets."""
    rows = [[m.name, str(m.layers), str(m.hidden), str(m.heads), str(m.n_kv_heads), str(m.ffn), m.ffn_type,
             str(m.vocab), f"{m.params() / 1e9:.2f}B"] for m in PRESETS.values()]
    click.echo(render_table(["name", "layers", "hidden", "heads", "kv_heads", "ffn", "ffn_type", "vocab", "params"],
                            rows))


@cli.command("check-plan")
@click.argument("plan_file", type=click.Path(dir_okay=False))
def check_plan(plan_file):
    """Validate a plan.json and summarise it."""
    plan = read_plan(plan_file)
    p = plan.predicted
    click.echo(f"{plan_file}: valid {plan.model.name}, {fmt_count(plan.seq_tokens)} tokens, {plan.gpus} GPUs, "
               f"{plan.layout.label()}, {plan.policy.label()}, predicted {p.get('status')} "
               f"{fmt_time(p.get('iteration_s', 0.0))}/iter, MFU {100 * p.get('mfu', 0.0):.1f}%")


@cli.command()
@model_options
@click.option("--seq", default="256K", callback=_count, show_default=True, help="Sequence length (4K, 256K, 1M).")
@click.option("--gpus", default=8, show_default=True, type=int, help="Number of GPUs.")
@click.option("--profile", "profile_name", default="a800-80gb", show_default=True, help="Hardware profile.")
@click.option("--batch", default=1, show_default=True, type=int, help="Sequences per data-parallel replica per iteration.")
@click.option("--tp", type=int, help="Fix the tensor-parallel degree.")
@click.option("--cp", type=int, help="Fix the (ring) context-parallel degree.")
@click.option("--ulysses", type=int, help="Fix the Ulysses sequence-parallel degree.")
@click.option("--dp", type=int, help="Fix the data-parallel degree.")
@click.option("--zero", type=click.IntRange(0, 3), help="Fix the ZeRO stage.")
@click.option("--sp/--no-sp", default=None, help="Fix Megatron sequence parallelism on or off.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES),
              help="Only these activation policies (repeatable).")
@click.option("--alpha", type=click.FloatRange(0, 1), help="Fix MEMO's offload fraction alpha.")
@click.option("--top", default=15, show_default=True, type=int, help="Rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranked candidates as JSON.")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Folder for plan.json.")
@click.option("--no-plan", is_flag=True, help="Do not write plan.json.")
@click.option("--simulate-top", default=8, show_default=True, type=click.IntRange(0, 10000),
              help="Tier 2: simulate this many of the best analytic candidates in the event simulator (0: none).")
@click.option("--sweep-alpha", is_flag=True,
              help="Simulate MEMO at alpha = 0, 0.125, ..., 1 for the (best) fixed layout; writes alpha_sweep.png.")
def whatif(model_name, layers, hidden, heads, ffn, vocab, dtype, seq, gpus, profile_name, batch, tp, cp, ulysses, dp,
           zero, sp, policies, alpha, top, as_json, out_dir, no_plan, simulate_top, sweep_alpha):
    """Rank layouts x policies x alpha for a model, sequence length and cluster; write plan.json."""
    from memo_sim.search.whatif import candidates_for

    t0 = time.perf_counter()
    model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype)
    profile = load_profile(profile_name)
    profile.peak(model.dtype)  # a clear error if the profile has no peak for the model's dtype
    if batch < 1:
        raise MemoError("--batch must be at least 1")
    result = candidates_for(model, seq, gpus, profile, batch=batch, tp=tp, cp=cp, ulysses=ulysses, dp=dp,
                            zero=zero, sp=sp, policies=tuple(policies) or POLICIES, alpha=alpha)
    if sweep_alpha:
        return _sweep_alpha(model, seq, batch, profile, result, as_json, out_dir, t0)
    n_sim = 0
    if simulate_top:
        from memo_sim.engine.simulate import simulate_candidates

        head = [c for c in result.candidates if c.memory.status == "OK"][:simulate_top]
        with _progress("simulating", len(head), quiet=as_json) as step:
            simulate_candidates(head, progress=lambda done, total: step())
        n_sim = len(head)
        sim = sorted(head, key=lambda c: c.sort_key())
        rest = [c for c in result.candidates if c not in head]
        result.candidates = sim + rest
    best = result.best
    plan_path = None
    if best is not None and not no_plan:
        plan = best.to_plan()
        if best.policy.policy == "memo":  # MEMO places its transient tensors by the bi-level static plan
            from memo_sim.memplan.planner import plan_memory

            plan.memory_plan = plan_memory(model, best.layout, best.batch, seq, best.policy,
                                           time_limit_s=10.0).to_plan_json()
        plan_path = write_plan(plan, Path(out_dir) / "plan.json")
    elapsed = time.perf_counter() - t0
    if as_json:
        obj = {"model": model.to_dict(), "seq_tokens": seq, "gpus": gpus, "batch": batch, "profile": profile.name,
               "elapsed_s": elapsed, "simulated_candidates": n_sim, "plan_file": str(plan_path) if plan_path else None,
               "candidates": [dict(rank=i + 1, **c.to_json()) for i, c in enumerate(result.candidates)],
               "rejected_layouts": [{"layout": lay.label(), "reason": why} for lay, why in result.rejected_layouts]}
        click.echo(json.dumps(obj, indent=1))
        return
    click.echo(f"{model.name} ({model.params() / 1e9:.2f}B params), {fmt_count(seq)} tokens x {batch}, "
               f"{gpus} x {profile.gpu.model} ({profile.name})")
    rows = []
    for i, c in enumerate(result.candidates[:top]):
        e, m, sm = c.estimate, c.memory, c.simulated
        rows.append([str(i + 1), c.layout.label(), c.policy.policy,
                     "-" if c.policy.alpha is None else f"{c.policy.alpha:.3f}",
                     status_text(c.status, c.over_bytes), fmt_time(e.iteration_s),
                     fmt_time(sm["iteration_s"]) if sm else "-",
                     f"{100 * (sm['mfu'] if sm else e.mfu):.1f}%",
                     f"{(sm['tgs_tokens_per_gpu_s'] if sm else e.tgs):.0f}",
                     fmt_bytes(sm["peak_gpu_bytes"] if sm else m.peak_gpu_bytes), fmt_bytes(m.host_bytes_per_node),
                     fmt_time(sm["exposed_copy_s"] if sm else e.exposed_copy_s)])
    click.echo(render_table(["#", "layout", "policy", "alpha", "status", "iter (analytic)", "iter (sim)", "MFU",
                             "TGS", "peak GPU", "host/node", "copy stall"], rows))
    n_ok = sum(c.status == "OK" for c in result.candidates)
    click.echo(f"{len(result.candidates)} candidates ({n_ok} fit), {len(result.rejected_layouts)} layouts rejected; "
               f"tier 1 analytic (perfect overlap, no contention), tier 2 simulated: top {n_sim} "
               f"(MFU, TGS, peak GPU and copy stall from the simulation where present); {elapsed:.2f} s")
    if best is None:
        click.echo("no candidate fits this cluster: no plan.json written. Try more GPUs, a shorter sequence, "
                   "or --policy memo.")
    elif plan_path:
        click.echo(f"best: {best.layout.label()} {best.policy.label()} -> {plan_path}")
        if best.alpha_note:
            click.echo(f"  alpha: {best.alpha_note}")


@cli.command()
@model_options
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False), help="Plan an id,lower,upper,size CSV instead.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False), help="Plan a memo-trace JSON instead.")
@click.option("--seq", default="256K", callback=_count, show_default=True, help="Sequence length.")
@click.option("--batch", default=1, show_default=True, type=int)
@click.option("--tp", default=8, show_default=True, type=int)
@click.option("--cp", default=1, show_default=True, type=int)
@click.option("--ulysses", default=1, show_default=True, type=int)
@click.option("--sp/--no-sp", default=True, show_default=True)
@click.option("--policy", default="memo", show_default=True, type=click.Choice(POLICIES))
@click.option("--alpha", default=0.5, show_default=True, type=click.FloatRange(0, 1))
@click.option("--profile", "profile_name", default="a800-80gb", show_default=True,
              help="Profile whose GPU capacity the caching-allocator baseline uses.")
@click.option("--time-limit", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds per DSA solve.")
@click.option("--solver", default="auto", show_default=True,
              type=click.Choice(["auto", "search", "mip-highs", "mip-cbc", "greedy"]))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Also draw the layout (address over time) as PNG here.")
def memplan(model_name, layers, hidden, heads, ffn, vocab, dtype, csv_file, trace_file, seq, batch, tp, cp, ulysses, sp,
            policy, alpha, profile_name, time_limit, solver, as_json, out_dir):
    """Static memory plan (MEMO's bi-level MIP) for a model/layout/policy, or for a trace/CSV file."""
    from memo_sim.layout.parallel import Layout, check_layout
    from memo_sim.memplan.caching_allocator import AllocatorConfig, replay
    from memo_sim.memplan.solve import solve_dsa
    from memo_sim.memplan.trace import RequestTrace
    from memo_sim.policy.policies import PolicyChoice
    from memo_sim.report.memplan_figure import draw_placement

    profile = load_profile(profile_name)
    cap = int(profile.usable_gpu_memory)
    figures = []
    if csv_file or trace_file:
        if csv_file and trace_file:
            raise MemoError("give either --csv or --trace, not both")
        trace = RequestTrace.read_csv(csv_file) if csv_file else RequestTrace.read_json(trace_file)
        sol = solve_dsa(trace, time_limit_s=time_limit, solver=solver)
        base = replay(trace, AllocatorConfig(capacity_bytes=max(cap, 4 * trace.max_live_bytes())))
        result = {"source": csv_file or trace_file, "buffers": len(trace), **sol.to_json_obj(),
                  "caching_allocator": _allocator_summary(base)}
        if out_dir:
            figures.append(str(draw_placement(trace, sol.offsets, int(sol.peak_bytes),
                                              Path(out_dir) / "memplan.png")))
    else:
        from memo_sim.memplan.planner import plan_memory
        from memo_sim.memplan.baseline import caching_allocator_layer_report

        model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype)
        lay = Layout(tp=tp, cp=cp, ulysses=ulysses, sp=sp)
        why = check_layout(lay, model, lay.gpus, profile.node_gpus, seq, batch)
        if why:
            raise MemoError(f"layout {lay.label()}: {why}")
        pol = PolicyChoice("memo", alpha) if policy == "memo" else PolicyChoice(policy)
        plan = plan_memory(model, lay, batch, seq, pol, time_limit_s=time_limit, solver=solver)
        # baseline: the caching allocator on one layer's forward + backward requests
        base = caching_allocator_layer_report(model, lay, batch, seq, pol, cap)
        result = {"model": model.name, "layout": lay.label(), "policy": pol.label(), "seq_tokens": seq,
                  **plan.summary(), "arena_bytes": plan.arena_bytes,
                  "caching_allocator_layer": _allocator_summary(base)}
        if out_dir:
            for name, sol, tr in (("fwd", plan.fwd, plan.fwd_trace), ("bwd", plan.bwd, plan.bwd_trace),
                                  ("model", plan.model, plan.model_trace)):
                figures.append(str(draw_placement(tr, sol.offsets, int(sol.peak_bytes),
                                                  Path(out_dir) / f"memplan-{name}.png")))
    result["figures"] = figures
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    for k, v in result.items():
        if isinstance(v, dict) and "offsets" in v:
            v = {kk: vv for kk, vv in v.items() if kk != "offsets"}
        if k == "offsets":
            continue
        click.echo(f"{k}: {v}")


def _allocator_summary(rep) -> dict:
    return {"peak_allocated_bytes": rep.peak_allocated_bytes, "peak_reserved_bytes": rep.peak_reserved_bytes,
            "fragmentation_at_peak": rep.fragmentation_at_peak, "num_reorganizations": rep.num_reorganizations,
            "num_cuda_malloc": rep.num_cuda_malloc, "oom": rep.oom}


def _progress(label: str, total: int, quiet: bool = False):
    """A click progress bar on stderr; returns a context manager yielding a step() callable."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        if quiet or total == 0:
            yield lambda: None
            return
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            yield lambda: bar.update(1)
    return cm()


def _sweep_alpha(model, seq, batch, profile, result, as_json, out_dir, t0):
    from memo_sim.engine.simulate import DEFAULT_ALPHAS, sweep_alpha
    from memo_sim.report.figures import alpha_sweep_figure

    memo = [c for c in result.candidates if c.policy.policy == "memo"]
    if not memo:
        raise MemoError("--sweep-alpha needs the memo policy among --policy")
    layout = memo[0].layout
    layouts = {c.layout for c in result.candidates}
    with _progress("alpha sweep", len(DEFAULT_ALPHAS), quiet=as_json) as step:
        res = sweep_alpha(model, layout, batch, seq, profile, DEFAULT_ALPHAS, progress=lambda d, t: step())
    png = alpha_sweep_figure(res, Path(out_dir) / "alpha_sweep.png")
    solved = memo[0].policy.alpha
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


def _register_engine_commands() -> None:
    from memo_sim.engine.commands import register

    register(cli)


_register_engine_commands()


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="memo-sim", standalone_mode=True)
    except MemoError as e:  # raised outside a command (e.g. while parsing)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
