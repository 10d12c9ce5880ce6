"""memo-sim simulate, plot, sweep-alpha, sweep-seq: the event simulator from the command line.

- ``memo-sim simulate plan.json --out DIR``: simulate the plan's iteration under its schedule;
  write timeline.json, trace.json (Perfetto / chrome://tracing), gantt.png, memory.png and
  summary.json (and moe_split.png for a mixture of experts: one layer's time and the GPU's memory by part); a pipeline plan (1F1B, interleaved 1F1B, SPPO) writes pipeline_gantt.png (stages
  x time) and stage_memory.png (GPU memory per stage) instead of gantt.png, and prints per-stage rows.
- ``memo-sim plot timeline.json --out DIR [--layers A:B]``: figures and trace.json from a saved
  timeline (simulated or measured).
- ``memo-sim sweep-alpha plan.json --out DIR``: the plan's model and layout under MEMO at each
  alpha; alpha_sweep.png and alpha_sweep.json.
- ``memo-sim sweep-seq plan.json --out DIR --seqs 64K,256K,1M``: every policy the plan's framework offers at
  each sequence length (MEMO at its solved alpha); mfu_vs_seq.png and mfu_vs_seq.json. ``--tp-mode
  megatron,metp`` adds a tensor-parallel-flavour axis (the plan's degrees in each mode):
  also seq_by_tp_mode.png / .json (peak GPU memory and step time against the length per mode and
  policy, ``--best-policy``: per mode the best of the policies) and where each METP mode's step
  time catches up with Megatron's. ``--jobs N`` simulates the runs (and the modes' points) in N processes, with
  the serial run's results in the same order. Each run's JSON row names its ``tier`` (``simulated``: the event
  simulator; a mode's point ``analytic`` where it does not fit on paper), as the what-if's rows do.

Bad input raises `MemoError`, which the ``memo-sim`` group prints as one line (exit code 2).
Sweeps show a progress bar on stderr (sweep-seq: on a terminal unless --json; --progress/--no-progress).
"""

from __future__ import annotations

from pathlib import Path

import click

from memo_sim.cli.common import (asked_policy, comma_items, plan_profile, progress_bar, progress_option,
                                 refuse_plan_gemm_format, refuse_unwritable_out)
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json, output_folder
from memo_sim.forked import beside
from memo_sim.policy import policy_class, policy_names, prices_model
from memo_sim.report.formats import format_options, resolve_format
from memo_sim.report.peaks import allocator_of, result_peak, tier_cell
from memo_sim.report.sweep_text import run_json, runs_answer
from memo_sim.units import fmt_bytes, fmt_count, fmt_time, parse_count

LAYERS_HELP = ("Layer range for the Gantt chart, both ends included (e.g. 14:16); default: the middle three "
               "(SPPO plans: gantt.png only with --layers; pipeline_gantt.png shows the whole pipeline).")


def _load_plan_and_profile(plan_file: str, profile_override: str | None):
    from memo_sim.plan.schema import read_plan

    from memo_sim.cost.gemm_format import plan_for_profile

    plan = read_plan(plan_file)
    profile = plan_profile(plan_file, plan, profile_override)
    refuse_plan_gemm_format(plan_file, plan, profile)
    from memo_sim.search.plan_check import refuse_layout_problem

    refuse_layout_problem(plan_file, plan, profile)  # as check-plan and export refuse it
    plan_for_profile(plan, profile)  # another --profile: its FP8 library's copies on that GPU (as explain, check-plan)
    return plan, profile


def _write_outputs(timeline, out: Path, layers_text: str | None, device: int = 0, also: tuple = ()) -> list[Path]:
    """trace.json and the figures of ``timeline`` in ``out`` (and the ``(function, arguments)``
    of ``also``, e.g. timeline.json): the Gantt chart and trace.json here while a forked child
    draws the memory figure and writes the rest (`memo_sim.forked.beside`); the paths written,
    those of ``also`` last."""
    from memo_sim.report.chrome_trace import write_chrome_trace
    from memo_sim.report.figures import gantt_figure, has_gantt_panels, memory_figure, parse_layer_range

    n_layers = timeline.meta.get("layers")
    layers = parse_layer_range(layers_text, n_layers)
    piped = bool((timeline.meta or {}).get("pipeline"))
    mine = [(write_chrome_trace, (timeline, out / "trace.json"))]
    theirs = []
    stopped = (timeline.meta or {}).get("status", "OK") != "OK"  # a failed run's default layers may have no events
    if timeline.events and (layers is not None or not piped) and not (
            stopped and layers is None and not has_gantt_panels(timeline, device)):  # a pipeline: its chart below
        mine.append((gantt_figure, (timeline, out / "gantt.png", layers, device)))
    if timeline.memory:
        theirs.insert(0, (memory_figure, (timeline, out / "memory.png")))
    if piped:
        from memo_sim.report.figures import pipeline_gantt_figure, stage_memory_figure

        if timeline.events:
            mine.append((pipeline_gantt_figure, (timeline, out / "pipeline_gantt.png")))
        if timeline.memory:
            theirs.append((stage_memory_figure, (timeline, out / "stage_memory.png")))
    return beside(mine, theirs + list(also))  # what ``also`` wrote comes last


def _chunk_words(chunk: list[int]) -> str:
    """A model chunk's layers as first-last, or what a one-slot chunk without a layer runs."""
    return f"{chunk[0]}-{chunk[1]}" if chunk else "none (the embedding or the loss alone)"


def _shared_embedding_words(plan, stage: int) -> str:
    """The embedding's gradient sum among a pipeline stage's own collectives, in words ("and " alone where the stage
    has none): only the first and the last stage sum the gradient of the embedding they both hold, and only where
    they both hold it (`memo_sim.cost.grad_sync.shares_embedding`: tied, or read by the multi-token-prediction
    modules; memo_sim/engine/schedules/stages.py ``shared_embedding_sums`` puts the op on stages 0 and p - 1).
    A review: every stage of untied llama-3.1-8b at pp 4 named "a tied embedding's gradient sum"."""
    from memo_sim.cost.grad_sync import shares_embedding  # noqa: PLC0415

    m, lay = plan.model, plan.layout
    if stage not in (0, lay.pp - 1) or not shares_embedding(m, lay):
        return "and "
    what = "a tied embedding's" if m.tied_embeddings else "the embedding's (read by the prediction modules)"
    return f"{what} gradient sum, and "


def _summary_line(r, profile=None) -> str:
    if r.ok:
        a = r.allocator
        # a memory plan's replay: what memo-exec leaves to the caching allocator (`allocator_summary`)
        alloc = ((f"static memory plan, caching allocator beside it: {a['reorganizations']} reorganisations, stall "
                  f"{fmt_time(a['stall_s'])}" if "cuda_mallocs" in a else "static memory plan")
                 if a.get("static_memory_plan") else
                 "caching allocator (pipeline iteration not replayed)" if a.get("replayed") is False else
                 f"caching allocator: {a['reorganizations']} reorganisations, stall {fmt_time(a['stall_s'])}")
        from memo_sim.report.whatif_answer import mfu_words  # noqa: PLC0415 - the what-if's words for an FP8 MFU

        return (f"{r.status}: {fmt_time(r.iteration_s)}/iteration, {mfu_words(r.mfu, r.model, profile)}, "
                f"TGS {r.tgs:.0f}, "
                f"peak GPU {result_peak(r).text()}, peak host/node {fmt_bytes(r.peak_host_bytes_per_node)}, "
                f"copy stall {fmt_time(r.exposed_copy_s)}, {alloc}")
    return f"{r.failure.message()} (simulated, {allocator_of(r.policy, r.layout)})"


# What `simulate` writes at least, measured on the what-if's toy plans (2 and 32 layers) and gpt-7b
# (32 layers): 22-28.5 timeline events per layer, 205-216 bytes per event in each of timeline.json
# and trace.json, 61 KB or more of figures. --out with clearly less free space is refused first.
SIM_EVENTS_PER_LAYER_FLOOR = 20
SIM_BYTES_PER_EVENT_FLOOR = 2 * 200
SIM_FIGURES_FLOOR_BYTES = 60 * 1024


def simulate_output_floor(layers: int) -> int:
    return SIM_FIGURES_FLOOR_BYTES + layers * SIM_EVENTS_PER_LAYER_FLOOR * SIM_BYTES_PER_EVENT_FLOOR


def _time_the_replay_oom(r, profile, classifier_chunk_tokens: int) -> None:
    """Give a caching-allocator replay's OOM (whose failure the engine leaves without a time, op and layer:
    `memo_sim.engine.core.Failure`) the start of the phase whose request failed, on the simulator's clock
    (`memo_sim.report.memory_snapshot.replay_oom_site`), in ``r.failure`` and the timeline's meta, so the summary
    and the console name the tensor and the time as README promises (a review: time_s/op/layer null)."""
    from dataclasses import replace

    from memo_sim.report.memory_snapshot import replay_oom_site

    if r.failure is None or r.failure.time_s is not None:
        return
    site = replay_oom_site(r, profile, classifier_chunk_tokens)
    if site is None:
        return
    r.failure = replace(r.failure, time_s=site.time_s, op=site.op, layer=site.layer)
    r.timeline.meta["failure"] = r.failure.to_dict()


@click.command("simulate")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--layers", "layers_text", default=None, help=LAYERS_HELP)
@click.option("--profile", "profile_override", default=None,
              help="Hardware profile name or file (default: the plan's profile).")
@click.option("--no-contention", is_flag=True, help="Give every op its stand-alone time: no link shared, no kernel slowed by copies or by "
                   "communication kernels holding SMs (the analytic "
                   "model's assumptions); the iteration is the op graph's critical path, schedule included, which "
                   "for a pipeline can differ from the what-if's analytic estimate (stage sums and a bubble).")
@click.option("--allocator-lag", default=0, show_default=True, type=click.IntRange(0, 64),
              help="Layers the GPU lags behind the CPU, holding collective buffers (record_stream); 0: the "
                   "plan's layout's (until a synchronisation with nccl_record_stream, else none).")
@click.option("--detail", default="auto", show_default=True, type=click.Choice(["auto", "ops", "units"]),
              help="Pipeline plans: every kernel and collective (ops), one compute and one collective op per "
                   "subsequence (or micro-batch) and layer (units), or ops while the graph stays small (auto).")
@click.option("--memory-snapshot", "memory_snapshot", is_flag=True,
              help="Also write the predicted allocations of the iteration in PyTorch's memory snapshot format "
                   "(memory_snapshot.pickle, one per stage for a pipeline; open it in PyTorch's memory_viz).")
def simulate_cmd(plan_file, out_dir, layers_text, profile_override, no_contention, allocator_lag, detail,
                 memory_snapshot):
    """Simulate a plan's training iteration; write timeline.json, trace.json and figures."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.report.figures import parse_layer_range

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    parse_layer_range(layers_text, plan.model.layers)  # a bad --layers is refused before anything is written
    warnings: list[str] = []
    with output_folder(out_dir, "memo-sim simulate", simulate_output_floor(plan.model.layers)) as outf:  # staged first
        r = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, profile,
                     schedule=plan.schedule, micro_batch=plan.micro_batch, allocator_lag=allocator_lag,
                     contention=not no_contention, classifier_chunk_tokens=plan.classifier_chunk_tokens,
                     detail=detail, record=memory_snapshot)
        stage = outf.stage
        r.timeline.meta["plan_file"] = str(plan_file)
        _time_the_replay_oom(r, profile, plan.classifier_chunk_tokens)
        *written, timeline_json = _write_outputs(r.timeline, stage, layers_text,
                                                 also=((r.timeline.write_json, (stage / "timeline.json",)),))
        written.insert(0, timeline_json)
        if plan.model.moe:  # where a MoE layer's time and the GPU's memory go (`memo_sim.report.moe_split`)
            from memo_sim.report.moe_split import moe_split, moe_split_figure

            written.append(moe_split_figure(moe_split(plan.model, plan.layout, plan.micro_batch or plan.batch,
                                                      plan.seq_tokens, profile), stage / "moe_split.png"))
        summary = r.to_dict()
        summary.pop("sim_wall_s", None)  # identical runs write identical summaries (the wall time is printed)
        summary["plan_predicted"] = plan.predicted.to_dict()
        written.append(atomic_write_json(stage / "summary.json", summary))
        if memory_snapshot:
            from memo_sim.report.explain import gpu_devices
            from memo_sim.report.memory_snapshot import predicted_snapshot, write_snapshot

            devices = gpu_devices(r)
            for d in devices:
                name = "memory_snapshot.pickle" if len(devices) == 1 else f"memory_snapshot-stage{d}.pickle"
                snap = predicted_snapshot(r, profile, d, plan.classifier_chunk_tokens)
                written.append(write_snapshot(snap, stage / name))
                if snap.get("memo_note"):  # a review: said only inside the pickle
                    warnings.append(f"warning: {name}: {snap['memo_note']}")
    out = Path(out_dir)
    from memo_sim.cli.explain import binding_words  # noqa: PLC0415 - the same words as memo-sim explain
    from memo_sim.report.formats import plural  # noqa: PLC0415

    click.echo(f"{plan.model.name}{plan.model.gemm_words}, {fmt_count(plan.seq_tokens)} tokens x {plan.batch}, {plan.layout.label()}, "
               f"{plan.policy.label()}, {plan.schedule} ({plural(plan.micro_batches, 'micro-batch', 'micro-batches')} "
               f"of {plan.micro_batch}), {profile.name}")
    click.echo(_summary_line(r, profile))
    click.echo(f"binding: {binding_words(plan, profile, r)} (memo-sim explain PLAN: the time and memory breakdown)")
    if r.pipeline.get("micro_batches") is not None:  # a micro-batch pipeline: its stages
        for st in r.pipeline["stages"]:
            bub = st["bubble_ratio"]
            click.echo(f"  stage {st['stage']}: layers {', '.join(_chunk_words(c) for c in st['chunks'])}, "
                       f"{st['in_flight']} chunk forwards in flight, peak GPU {fmt_bytes(st['peak_gpu_bytes'])} "
                       f"({result_peak(r).source}), "  # the header's words: no replay runs a pipeline's stages
                       f"busy {fmt_time(st['compute_busy_s'])}"
                       + (f", idle {100 * bub:.1f}% of its work (waiting for other stages' "
                          f"activations and gradients {100 * st['stage_wait_s'] / st['compute_busy_s']:.1f}%, the "
                          f"transfers themselves {100 * st['transfer_wait_s'] / st['compute_busy_s']:.1f}%; the "
                          f"rest on its own collectives and copies, {_shared_embedding_words(plan, st['stage'])}"
                          f"after its last op)" if bub is not None else ""))
        ideal, it = r.pipeline["ideal_bubble_fraction"], r.iteration_s  # a share of the iteration, as memo-exec's
        rows = r.pipeline["stages"]
        waits = sum(st["stage_wait_s"] for st in rows) / (len(rows) * it) if it else None
        click.echo(f"  bubble (p - 1)/(v m + p - 1) = {100 * ideal:.1f}% of the iteration for equal stages; idle "
                   f"share of the iteration "
                   + (f"{100 * r.pipeline['bubble_fraction']:.1f}%, of it waiting for other stages' "
                      f"activations and gradients {100 * waits:.1f}%"
                      if r.pipeline["bubble_fraction"] is not None and waits is not None else "-")
                   + " (memo-sim explain PLAN: what each stage waits on)")
    pred = plan.predicted.iteration_s
    if r.ok and isinstance(pred, (int, float)) and pred > 0:
        click.echo(f"plan predicted {fmt_time(pred)} ({plan.predicted.source}); "
                   f"simulated/predicted = {r.iteration_s / pred:.3f}")
    if r.pipeline.get("micro_batches"):  # a micro-batch pipeline folds micro-batches
        n, what = r.pipeline["micro_batches"], "micro-batches"
    else:
        n, what = plan.model.layers, "identical layers"
    folded = f" ({r.folded} of {n} {what} unfolded from a periodic run of {n - r.folded})" if r.folded else ""
    click.echo(f"simulated {r.n_ops} ops{folded} in {r.sim_wall_s:.2f} s; wrote " + ", ".join(p.name for p in written)
               + f" to {out}")
    for line in warnings:
        click.echo(line, err=True)
    if not r.ok:  # as check-plan: the plan does not run as it stands (its outputs show where it stopped)
        from memo_sim.cli.whatif import NOTHING_FITS  # noqa: PLC0415

        click.get_current_context().exit(NOTHING_FITS)


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
    with output_folder(out_dir, "memo-sim plot") as outf:  # a refused --device leaves no trace.json behind
        written = [outf.path(p) for p in _write_outputs(tl, outf.stage, layers_text, device)]
    click.echo("wrote " + ", ".join(str(p) for p in written))


def _parse_alphas(text: str) -> list[float]:
    items = comma_items(text, "--alphas", "0,0.25,0.5")
    try:
        vals = [float(x) for x in items]
    except ValueError:
        raise MemoError(f"--alphas: expected comma-separated numbers in [0, 1], got {text!r}") from None
    if any(not (0.0 <= v <= 1.0) for v in vals):
        raise MemoError(f"--alphas: every alpha must lie in [0, 1], got {text!r}")
    return vals


def _write_sweep(outf, name: str, results, figure, answer, fmt: str | None = "table") -> None:
    """Write a sweep's results as NAME.json and NAME.png into ``outf`` (`memo_sim.fileio.OutputFolder`)
    and print the answer (a table per run)."""
    from memo_sim.report.formats import emit

    objs = [run_json(r) for r in results]
    atomic_write_json(outf.stage / f"{name}.json", objs)
    png = figure(results, outf.stage / f"{name}.png")
    if fmt is None:  # the caller prints one answer for this sweep and what follows it
        return
    a = answer(results)
    a.line(f"wrote {outf.path(name + '.json')}, {outf.path(png)}")
    emit(a, fmt, objs)


@click.command("sweep-alpha")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--alphas", default="0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1", show_default=True,
              help="Comma-separated alphas.")
@click.option("--profile", "profile_override", default=None, help="Hardware profile (default: the plan's).")
@format_options
def sweep_alpha_cmd(plan_file, out_dir, alphas, profile_override, out_format, as_json):
    """Simulate the plan's model and layout under MEMO at each alpha; plot MFU and memory."""
    from memo_sim.engine.simulate import sweep_alpha
    from memo_sim.report.figures import alpha_sweep_figure

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    vals = _parse_alphas(alphas)
    refuse_unwritable_out(out_dir, "memo-sim sweep-alpha")
    with progress_bar("alpha sweep", len(vals)) as step:
        results = sweep_alpha(plan.model, plan.layout, plan.batch, plan.seq_tokens, profile, vals,
                              progress=lambda done, total: step(),
                              schedule=None if plan.schedule == "sppo" else plan.schedule,
                              micro_batch=plan.micro_batch)
    from memo_sim.search.estimate import memo_alpha
    from memo_sim.search.pipeline import pipeline_memo_alpha

    if plan.layout.pp > 1:  # the search's solve: every stage's blocks in flight, the node's GPUs sharing its host
        solved = pipeline_memo_alpha(plan.model, plan.layout, plan.batch, plan.micro_batch, plan.seq_tokens, profile,
                                     "1f1b" if plan.schedule == "sppo" else plan.schedule)  # as the sweep runs it
    else:
        solved = memo_alpha(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, profile)
    solver_alpha = solved.alpha if solved.feasible else None
    solver_words = (f"solver's alpha: {solver_alpha:.3f} ({solved.reason()})" if solver_alpha is not None
                    else f"solver's alpha: infeasible ({solved.reason()})")
    with output_folder(out_dir, "memo-sim sweep-alpha") as outf:
        _write_sweep(outf, "alpha_sweep", results,
                     lambda rs, path: alpha_sweep_figure(rs, path, solver_alpha=solver_alpha),
                     lambda rs: runs_answer(f"{plan.model.name}{plan.model.gemm_words}, {fmt_count(plan.seq_tokens)} tokens, "
                                            f"{plan.layout.label()}: MEMO at {len(rs)} alphas; {solver_words}",
                                            ["alpha"], [([f"{r.policy.alpha:.3f}"], r) for r in rs]),
                     resolve_format(out_format, as_json))


def _framework_policies(plan) -> tuple[str, ...]:
    """The policies the framework the plan was searched for offers (`Plan.framework`; every policy for
    memo's own search, ``any``); a framework this memo does not know is one line naming the field."""
    from memo_sim.search.frameworks import FRAMEWORKS, get_framework

    if plan.framework not in FRAMEWORKS:
        raise MemoError(f"plan.framework: {plan.framework!r} is not a framework this memo knows "
                        f"({', '.join(FRAMEWORKS)}); re-create the plan with memo-sim whatif --framework NAME")
    return tuple(get_framework(plan.framework).policies)


@click.command("sweep-seq")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--seqs", default="64K,128K,256K,512K,1M", show_default=True,
              help="Comma-separated sequence lengths in tokens (32768, 32K, 1M).")
@click.option("--profile", "profile_override", default=None, help="Hardware profile (default: the plan's).")
@click.option("--tp-mode", "tp_modes", default=None,
              help="Comma-separated tensor-parallel flavours the plan's framework runs (memo's own: megatron, "
                   "metp_ffn, metp; `memo-sim frameworks` lists each framework's) to sweep with the plan's degrees; "
                   "adds seq_by_tp_mode.png (peak memory and step time per mode).")
@click.option("--policy", "policies", multiple=True, type=click.Choice(policy_names()),
              help="Only these policies (repeatable; default: every policy the plan's schedule runs and its "
                   "framework offers).")
@click.option("--best-policy", is_flag=True, help="With --tp-mode: one line per mode, its best policy at each length.")
@click.option("--jobs", type=click.IntRange(1, 1024),
              help="Simulate the runs (and --tp-mode's points) in this many processes (default: every core); "
                   "results are the serial run's, in the same order.")
@progress_option
@format_options
def sweep_seq_cmd(plan_file, out_dir, seqs, profile_override, tp_modes, policies, best_policy, jobs, progress,
                  out_format, as_json):
    """Every policy at each sequence length for the plan's model and layout; plot MFU."""
    from functools import partial

    from memo_sim.layout.parallel import check_layout
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.report.figures import mfu_vs_seq_figure
    from memo_sim.search.seq_sweep import in_order, policy_run
    from memo_sim.search.whatif import default_jobs

    fmt = resolve_format(out_format, as_json)
    jobs = jobs or default_jobs()
    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    lens = [parse_count(s, "--seqs") for s in comma_items(seqs, "--seqs", "64K,128K,1M")]
    dup = next((n for i, n in enumerate(lens) if n in lens[:i]), None)
    if dup is not None:
        raise MemoError(f"--seqs: {fmt_count(dup)} is given twice; give each length once")
    offered = _framework_policies(plan)
    if plan.schedule == "sppo" and plan.layout.pp > 1:
        pols = tuple(policies) or (plan.policy.name,)  # an SPPO pipeline: only SPPO schedules it
    else:  # the policies the plan's schedule runs (SPPO's search too where the plan is SPPO's), its framework's
        pols = tuple(policies) or tuple(p for p in policy_names() if (schedule_runs_policy(plan.schedule, p)
                                                                      or plan.schedule == "sppo")
                                        and prices_model(p, plan.model) and p in offered)
    if best_policy and not tp_modes:  # it picks a policy per --tp-mode series; without one it would do nothing
        raise MemoError("--best-policy picks each --tp-mode series' best policy; add --tp-mode (e.g. megatron,metp) "
                        "or drop --best-policy (the table lists every policy at each length)")
    layouts = (_tp_mode_layouts(plan.layout, tp_modes, plan.framework) if tp_modes
               else {plan.layout.label(): plan.layout})
    for s in lens:
        for lay in layouts.values():
            why = check_layout(lay, plan.model, lay.gpus, profile.node_gpus, s, plan.batch)
            if why:
                raise MemoError(f"--seqs: {fmt_count(s)} does not fit layout {lay.label()}: {why}")
    # a policy that cannot run on a flavour's layout (Megatron's recompute modules on METP: `Policy.layout_why_not`)
    # is left out of that flavour's runs, or refused in one line where asked for by name
    for p in policies:  # a policy asked for by name that cannot price the model: one line (a review found a dense
        # plan swept under recompute_moe), as the what-if, memplan and maxseq refuse it (only the refusals are used:
        # each length's alpha is solved below)
        asked_policy(p, plan.model, default_alpha=0.0)
    for lay in layouts.values():
        for p in pols:
            if policies and (why := policy_class(p).layout_why_not(lay)):
                raise MemoError(f"--policy {p} on layout {lay.label()}: {why}")
    runs = [(s, lay, p) for lay in layouts.values() for s in lens for p in pols
            if policy_class(p).layout_why_not(lay) is None]
    # the header counts what runs, and each policy left out of a layout is named with its reason (a review: a METP
    # plan's header counted recompute_mlp, which `layout_why_not` leaves out, above rows of the other policies)
    left_out = [f"  left out: {p} on {label}: {why}" for label, lay in layouts.items() for p in pols
                if (why := policy_class(p).layout_why_not(lay))]
    swept = [p for p in pols if any(p == q for _s, _lay, q in runs)]
    shape = f"{len(swept)} policies x {len(lens)} lengths x {len(layouts)} layouts"
    if len(runs) != len(swept) * len(lens) * len(layouts):  # a policy left out of some layouts only
        shape = f"{len(runs)} runs ({shape}, less the ones left out below)"
    refuse_unwritable_out(out_dir, "memo-sim sweep-seq")
    schedule = None if plan.schedule == "sppo" else plan.schedule
    with progress_bar("sequence sweep", len(runs), quiet=fmt != "table", force=progress) as step:
        results = in_order([partial(policy_run, plan.model, lay, plan.batch, s, p, profile, schedule, plan.micro_batch)
                            for s, lay, p in runs], jobs, step)
    with output_folder(out_dir, "memo-sim sweep-seq") as outf:
        _write_sweep(outf, "mfu_vs_seq", results, mfu_vs_seq_figure,
                     lambda rs: _with_lines(runs_answer(f"{plan.model.name}{plan.model.gemm_words} on "
                                                        f"{profile.name}: {shape} "
                                                        f"(simulated{mfu_note(plan.model)})",
                                                        ["seq", "layout", "policy"],
                                                        [([fmt_count(r.seq), r.layout.label(), r.policy.label()], r)
                                                         for r in rs]), left_out),
                     None if tp_modes and fmt == "json" else fmt)
        if tp_modes:
            _sweep_tp_modes(plan, profile, layouts, lens, pols, best_policy, outf, results, fmt, jobs, progress)


def _with_lines(a, lines: list[str]):
    """``a`` (a `memo_sim.report.formats.Answer`) with ``lines`` added below its table."""
    for line in lines:
        a.line(line)
    return a


def mfu_note(model) -> str:
    """``; MFU of the bf16 peak`` for a table's MFU column where the layer GEMMs run in another format (FP8, FP4):
    the what-if's words (`memo_sim.report.whatif_answer.mfu_peak_words`) said once above the column."""
    from memo_sim.report.whatif_answer import mfu_peak_words  # noqa: PLC0415

    return f"; MFU of the {model.dtype} peak" if mfu_peak_words(model) else ""


def _tp_mode_layouts(layout, text: str, framework: str = "any") -> dict:
    """The plan's degrees in each tensor-parallel flavour of ``text`` (METP turns SP on) that the plan's framework runs
    (`Framework.tp_modes`, as the what-if refuses the others: a review found async_tp swept under ``any``)."""
    from dataclasses import replace

    from memo_sim.search.frameworks import get_framework
    from memo_sim.tp import tp_flavour

    offered = get_framework(framework).tp_modes
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in offered for m in modes):
        raise MemoError(f"--tp-mode: expected a comma-separated list of the TP flavours the plan's framework "
                        f"{framework} runs ({', '.join(offered)}), got {text!r}")
    if layout.tp < 2:
        raise MemoError(f"--tp-mode: the plan's layout {layout.label()} has no tensor parallelism (tp = 1)")
    out = {}
    for m in dict.fromkeys(modes):
        lay = replace(layout, tp_mode=m, sp=layout.sp or tp_flavour(m).requires_sp)
        out[lay.label()] = lay
    return out


def _point_peak_text(pt, simulated: dict) -> str:
    """A sweep point's peak: the simulated one of the same configuration where the sweep ran it
    (so one configuration reads one number in both tables), else the analytic one; with its source."""
    from memo_sim.report.peaks import ANALYTIC, CACHING_ALLOCATOR, MEMORY_PLAN, Peak

    r = simulated.get((pt.seq, pt.layout, pt.policy))
    if r is not None:
        return result_peak(r).text() if r.ok else f"- ({r.status} when simulated; analytic {fmt_bytes(pt.peak_gpu_bytes)})"
    alloc = MEMORY_PLAN if pt.policy.startswith("memo") else CACHING_ALLOCATOR
    return Peak(pt.peak_gpu_bytes, ANALYTIC, alloc).text()


def _point_json(pt, simulated: dict) -> dict:
    """A sweep point as JSON: its analytic peak (``peak_gpu_bytes``) and, where the sweep simulated
    the same configuration, the simulated one that the printed table shows."""
    r = simulated.get((pt.seq, pt.layout, pt.policy))
    return {**pt.to_dict(), "peak_gpu_source": "analytic",
            "simulated_peak_gpu_bytes": r.peak_gpu_bytes if r is not None and r.ok else None}


def _sweep_tp_modes(plan, profile, layouts, lens, pols, best_policy, outf, results=(), fmt="table", jobs=1,
                    progress=None) -> None:
    from memo_sim.report.figures import seq_sweep_figure
    from memo_sim.search.seq_sweep import crossover_seq, sweep_series

    def runs_on(lay) -> tuple:
        return tuple(p for p in pols if policy_class(p).layout_why_not(lay) is None)

    if best_policy:
        series = [(label, lay, runs_on(lay)) for label, lay in layouts.items()]
    else:
        series = [(f"{label} {p}", lay, (p,)) for p in pols for label, lay in layouts.items() if p in runs_on(lay)]
    with progress_bar("tensor-parallel modes", len(series) * len(lens), quiet=fmt != "table", force=progress) as step:
        points = sweep_series(plan.model, series, lens, profile, batch=plan.batch, jobs=jobs,
                              progress=lambda done, total: step())
    labels = list(dict.fromkeys(pt.label for pt in points))
    megatron = [lb for lb in labels if "metp" not in lb.split(" ")[0]]
    crossings = []
    for lb in labels:
        if lb in megatron:
            continue
        rest = lb.split(" ", 1)[1] if " " in lb else ""
        twin = next((m for m in megatron if (m.split(" ", 1)[1] if " " in m else "") == rest), None)
        if twin is not None:
            crossings.append(crossover_seq(points, lb, twin))
    simulated = {(r.seq, r.layout.label(), r.policy.label()): r for r in results}
    atomic_write_json(outf.stage / "seq_by_tp_mode.json", {"points": [_point_json(pt, simulated) for pt in points],
                                                           "crossovers": [c.to_dict() for c in crossings]})
    title = f"{plan.model.name}, {profile.name}: peak memory and step time by tensor-parallel mode"
    png = seq_sweep_figure(points, outf.stage / "seq_by_tp_mode.png", title, crossings,
                           reference=megatron[0] if len(megatron) == 1 else None)
    from memo_sim.report.formats import Answer, emit

    a = Answer()
    a.table(["seq", "series", "policy", "status", "tier", "peak GPU", "step", "exposed P2P"],
            [[fmt_count(pt.seq), pt.label, pt.policy, pt.status, tier_cell(pt.tier), _point_peak_text(pt, simulated),
              fmt_time(pt.iteration_s) if pt.iteration_s is not None else "-", fmt_time(pt.exposed_p2p_s)]
             for pt in points], title="by tensor-parallel mode (the best policy of each series where --best-policy; "
                                      "tier of the status and step: sim = the event simulator, analytic = "
                                      "perfect overlap):")
    for c in crossings:
        at = f"{fmt_count(int(round(c.time_seq)))} tokens" if c.time_seq is not None else "none in range"
        a.line(f"crossover {c.a} vs {c.b}: {at} ({c.note})")
    a.line(f"wrote {outf.path('seq_by_tp_mode.json')}, {outf.path(png)}")
    emit(a, fmt, {"runs": [run_json(r) for r in results], "points": [_point_json(pt, simulated) for pt in points],
                  "crossovers": [c.to_dict() for c in crossings]})


DEFAULT_SUBSEQS = "1,2,4,8,16,32,64,128"


@click.command("sweep-subseqs")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--subseqs", "subseqs_text", default=None,
              help=f"Comma-separated subsequence counts N (default: {DEFAULT_SUBSEQS} and the plan's N, "
                   "those the sequence splits into).")
@click.option("--profile", "profile_override", default=None, help="Hardware profile (default: the plan's).")
@click.option("--no-simulate", is_flag=True, help="Analytic tier only (no event simulation).")
@format_options
def sweep_subseqs_cmd(plan_file, out_dir, subseqs_text, profile_override, no_simulate, out_format, as_json):
    """Iteration time and peak memory against the subsequence count N for an SPPO plan's layout."""
    from memo_sim.cost.sppo import pipeline_time
    from memo_sim.engine.simulate import simulate
    from memo_sim.report.figures import subseq_sweep_figure
    from memo_sim.search.sppo import solve_point

    plan, profile = _load_plan_and_profile(plan_file, profile_override)
    pol0 = plan.policy
    if plan.schedule != "sppo":
        raise MemoError(f"{plan_file}: sweep-subseqs needs an SPPO plan (policy sppo), not {pol0.name}")
    try:
        given = subseqs_text is not None
        ns = sorted({int(x) for x in comma_items(subseqs_text if given else DEFAULT_SUBSEQS, "--subseqs", "4,8,16")}
                    | (set() if given else {pol0.subseqs}))
    except ValueError:
        raise MemoError(f"--subseqs: expected comma-separated whole numbers, got {subseqs_text!r}") from None
    if not ns or min(ns) < 1:
        raise MemoError("--subseqs: every N must be at least 1")
    lay = plan.layout
    refuse_unwritable_out(out_dir, "memo-sim sweep-subseqs")
    points, skipped = [], []
    partition = pol0.partition if pol0.partition in ("flops", "length") else "flops"
    with progress_bar("subsequence sweep", len(ns)) as step:
        for n in ns:
            try:
                pt = solve_point(plan.model, lay, plan.batch, plan.seq_tokens, profile, n, partition, pol0.multiplex)
            except MemoError as e:
                skipped.append(f"N={n}: {e}")
                step()
                continue
            d = {"subseqs": n, "status": pt.status, "reason": pt.memory.reason(),
                 "analytic_iteration_s": pt.estimate.iteration_s,
                 "peak_gpu_bytes": pt.memory.breakdown.peak_gpu_bytes,
                 "gpu_capacity_bytes": pt.memory.breakdown.gpu_capacity_bytes,
                 "host_bytes_per_node": pt.memory.host_bytes_per_node, "alpha_binding": pt.alpha.binding,
                 "bubble_ratio": (lay.pp - 1) / n, "iteration_s": None, "mfu": None}
            busy = max(pt.grid.get("stage_busy_s") or [0.0])
            d["closed_form_iteration_s"] = pipeline_time(lay.pp, n, busy) if busy else None
            if not no_simulate:
                r = simulate(plan.model, lay, plan.batch, plan.seq_tokens, pt.policy, profile, keep_timeline=False)
                d.update(status=r.status, iteration_s=r.iteration_s, mfu=r.mfu,
                         peak_gpu_bytes=r.peak_gpu_bytes if r.ok else d["peak_gpu_bytes"],
                         reason=r.failure.message() if r.failure else d["reason"])
            points.append(d)
            step()
    if not points:
        raise MemoError("no subsequence count of --subseqs splits the sequence: " + "; ".join(skipped))
    title = (f"{plan.model.name}{plan.model.gemm_words}, {fmt_count(plan.seq_tokens)} tokens, {lay.label()} on {profile.name}: "
             f"SPPO against N")
    from memo_sim.report.formats import Answer, emit

    with output_folder(out_dir, "memo-sim sweep-subseqs") as outf:
        atomic_write_json(outf.stage / "subseq_sweep.json", {"plan": str(plan_file), "layout": lay.label(),
                                                             "seq_tokens": plan.seq_tokens, "points": points,
                                                             "skipped": skipped})
        subseq_sweep_figure(points, outf.stage / "subseq_sweep.png", title)
    out = Path(out_dir)
    png = out / "subseq_sweep.png"
    a = Answer(title)
    src = "analytic" if no_simulate else "sim where OK, else analytic"
    a.table(["N", "status", "iter (sim)", "iter (analytic)", f"peak GPU ({src}, worst stage)", "bubble ratio"],
            [[str(d["subseqs"]), d["status"], fmt_time(d["iteration_s"]) if d["iteration_s"] else "-",
              fmt_time(d["analytic_iteration_s"]), fmt_bytes(d["peak_gpu_bytes"]), f"{d['bubble_ratio']:.3f}"]
             for d in points])
    for d in points:
        if d["status"] != "OK":
            a.line(f"  N={d['subseqs']}: {d['reason']}")
    for msg in skipped:
        a.line(f"skipped {msg}")
    a.line(f"wrote {out / 'subseq_sweep.json'}, {png}")
    emit(a, resolve_format(out_format, as_json), {"plan": str(plan_file), "layout": lay.label(),
                                                   "seq_tokens": plan.seq_tokens, "points": points,
                                                   "skipped": skipped})


COMMANDS = (simulate_cmd, plot_cmd, sweep_alpha_cmd, sweep_seq_cmd, sweep_subseqs_cmd)
