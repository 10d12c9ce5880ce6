"""memo-sim memplan: MEMO's bi-level static memory plan, or any DSA problem from a CSV or trace."""

from __future__ import annotations

import click

from memo_sim.cli.common import (BATCH, DEGREE, FiniteRange, asked_policy, build_model, count_option, model_options,
                                 profile_option, progress_option, status_line)
from memo_sim.errors import MemoError
from memo_sim.policy import policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.report.formats import emit, format_options, resolve_format
from memo_sim.report.memplan_text import memplan_answer

MEMO_ALPHA = 0.5  # the memo policy's alpha where --alpha is not given


@click.command()
@model_options
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False), help="Plan an id,lower,upper,size CSV instead.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False), help="Plan a memo-trace JSON instead.")
@click.option("--seq", default="256K", callback=count_option, show_default=True,
              help="Sequence length in tokens (32768, 32K, 1M, 1.5M).")
@click.option("--batch", default=1, show_default=True, type=BATCH, help="Sequences per replica.")
@click.option("--tp", type=DEGREE, default=8, show_default=True, help="Tensor-parallel degree of the layout planned.")
@click.option("--cp", type=DEGREE, default=1, show_default=True, help="Ring context-parallel degree.")
@click.option("--ulysses", type=DEGREE, default=1, show_default=True, help="Ulysses sequence-parallel degree.")
@click.option("--sp/--no-sp", default=True, show_default=True, help="Megatron sequence parallelism on or off.")
@click.option("--tp-mode", default="megatron", show_default=True, type=click.Choice(["megatron", "metp_ffn", "metp"]),
              help="Tensor-parallel flavour (METP's level-1 traces hold its ring's blocks and double buffers).")
@click.option("--policy", default="memo", show_default=True, type=click.Choice(policy_names()),
              help="Activation policy whose tensors are planned.")
@click.option("--alpha", type=FiniteRange(0, 1),
              help=f"MEMO's offloaded fraction (--policy memo; default {MEMO_ALPHA}); other policies take none.")
@profile_option("Hardware profile (a name or a .yaml file) whose usable GPU memory the plan and the caching "
                "allocator's replay are held against. A --csv/--trace plan uses it only where --profile is given; "
                "without it the replay runs on a device large enough for the plan (no capacity, no out-of-memory).")
@click.option("--time-limit", default=10.0, show_default=True, type=FiniteRange(0.1, 3600),
              help="Seconds per DSA solve.")
@click.option("--solver", default="auto", show_default=True,
              type=click.Choice(["auto", "search", "mip-highs", "mip-cbc", "greedy"]),
              help="DSA solver: greedy (best of several orderings), search (greedy, then branch and bound toward the "
                   "lower bound), mip-highs / mip-cbc (greedy, then MEMO's MIP on HiGHS or CBC), auto (greedy; the "
                   "search where greedy misses the lower bound, the MIP on small problems).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Also draw the layout (address over time) as PNG here.")
@progress_option
@format_options
def memplan(model_name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, dtype, mtp_layers, precision, csv_file,
            trace_file, seq, batch, tp, cp, ulysses, sp,
            tp_mode, policy, alpha, profile_name, time_limit, solver, out_dir, progress, out_format, as_json):
    """Static memory plan (MEMO's bi-level MIP) for a model/layout/policy, or for a trace/CSV file."""
    import contextlib

    from memo_sim.fileio import output_folder
    from memo_sim.report.memplan_figure import draw_placement

    fmt = resolve_format(out_format, as_json)
    quiet = fmt != "table"  # quiet progress for machine formats
    profile = load_profile(profile_name)
    if csv_file and trace_file:
        raise MemoError("give either --csv or --trace, not both")
    if csv_file or trace_file:  # the file holds its own tensors: the model's, layout's and policy's options plan none
        given = _given_model_options()
        if given:
            raise MemoError(f"{', '.join(given)}: --{'csv' if csv_file else 'trace'} plans the file's own tensors, "
                            f"which these options do not change; drop them (or the file, to plan a model)")
    # staged in --out (or where it is created) before any work: an unwritable --out fails at once
    folder = output_folder(out_dir, "memo-sim memplan") if out_dir else contextlib.nullcontext(None)
    with folder as outf, status_line("memplan", quiet=quiet, force=progress) as say:
        if csv_file or trace_file:
            result, drawings = _plan_file(csv_file, trace_file, profile, _profile_given(), time_limit, solver, say)
            placement = [(b.id, int(result["offsets"][b.id]), b.size) for b in drawings[0][1].buffers]
            result["sizes"] = {bid: size for bid, _off, size in placement}  # --json: each size beside its offset
        else:
            placement = None
            model = build_model(model_name, layers, hidden, heads, ffn, vocab, dtype, precision, kv_heads, head_dim,
                                mtp_layers)
            result, drawings = _plan_model(model,
                                           profile, seq, batch, tp, cp, ulysses, sp, tp_mode, policy, alpha,
                                           time_limit, solver, say)
        figures = []
        for name, tr, offsets, peak in drawings if outf is not None else ():
            say(f"drawing {name}")
            draw_placement(tr, offsets, peak, outf.stage / name)
            figures.append(str(outf.path(name)))
    result["figures"] = figures
    answer = memplan_answer(result, placement)
    if "arena_bytes" in result:  # a model's plan: its arena against the GPU (a file's: memplan_answer says it)
        answer.line(_arena_fit_words(result, profile))
    emit(answer, fmt, result)


def _profile_given() -> bool:
    """Whether --profile was given (a file's plan then replays on that GPU's usable memory)."""
    from click.core import ParameterSource  # noqa: PLC0415

    src = click.get_current_context().get_parameter_source("profile_name")
    return src in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _arena_fit_words(result: dict, profile) -> str:
    """Whether a model plan's static arena (level 2: the whole iteration's planned bytes, `memo_sim.memplan.planner`)
    fits ``profile``'s usable GPU memory (a review: a 533.50 GiB arena was answered without a word on the GPU)."""
    from memo_sim.units import fmt_bytes  # noqa: PLC0415

    cap = result["capacity_bytes"]
    if result["fits_capacity"]:  # level 2 holds the activations alone (`memo_sim.memplan.trace_gen.model_trace`)
        return (f"the arena fits {profile.name}'s usable GPU memory ({fmt_bytes(cap)}); the model states and what "
                f"the plan leaves to the caching allocator come on top (memo-sim whatif prices the whole GPU)")
    return (f"does not fit {profile.name}'s usable GPU memory: the arena alone needs "
            f"{fmt_bytes(result['arena_bytes'])} of {fmt_bytes(cap)}")


def _plan_file(csv_file, trace_file, profile, given, time_limit, solver, say):
    """A DSA plan of an id,lower,upper,size CSV or a memo-trace, with the caching allocator's replay: on
    ``profile``'s usable GPU memory where ``given`` (--profile given; the answer then says whether the plan fits
    it, and the replay frees its cache and retries or runs out where PyTorch would), else on one large enough for
    the file (a review: --profile h100-sxm5-80gb was answered with 79.00 GiB reserved on its 78 GiB and no
    reorganisation)."""
    from memo_sim.memplan.caching_allocator import AllocatorConfig, replay
    from memo_sim.memplan.solve import solve_dsa
    from memo_sim.request_trace import RequestTrace

    say(f"reading {csv_file or trace_file}")
    trace = RequestTrace.read_csv(csv_file) if csv_file else RequestTrace.read_json(trace_file)
    say(f"{len(trace)} buffers; solving (time limit {time_limit:g} s)")
    sol = solve_dsa(trace, time_limit_s=time_limit, solver=solver, progress=say)
    say("replaying the caching allocator")
    cap = int(profile.usable_gpu_memory) if given else None
    base = replay(trace, AllocatorConfig(capacity_bytes=cap if given else
                                         max(int(profile.usable_gpu_memory), 4 * sol.peak_bytes)))
    result = {"source": csv_file or trace_file, "buffers": len(trace), **sol.to_json_obj(),
              "caching_allocator": _allocator_summary(base)}
    if given:
        result.update(capacity_bytes=cap, fits_capacity=sol.peak_bytes <= cap, profile=profile.name)
    return result, [("memplan.png", trace, sol.offsets, int(sol.peak_bytes))]


_FILE_IGNORES = ("model_name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype",
                 "mtp_layers", "precision", "seq", "batch", "tp", "cp", "ulysses", "sp", "tp_mode", "policy", "alpha")


def _given_model_options() -> list[str]:
    """The options of a model's plan given on the command line (a review: --alpha beside --csv was ignored)."""
    from click.core import ParameterSource  # noqa: PLC0415

    ctx = click.get_current_context()
    by_name = {p.name: p for p in ctx.command.params}
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return [by_name[n].opts[0] for n in _FILE_IGNORES if n in by_name and ctx.get_parameter_source(n) in given]


def _plan_model(model, profile, seq, batch, tp, cp, ulysses, sp, tp_mode, policy, alpha, time_limit, solver, say):
    """MEMO's bi-level plan of one layer's forward and backward and the model-level buffers, with the
    caching allocator's replay of one layer. The model's GEMM format (``--precision``) is checked against the
    profile's GPU as the what-if checks it (`memo_sim.cost.gemm_format.check_gemm_format`; a review: FP8 and NVFP4
    were accepted on an A100) and enters the layer's requests: a quantised format's cast copies
    (`memo_sim.memplan.trace_gen`, ``gemm_cast_buffers``) go through the caching allocator beside the arena (they
    are `memo_sim.model.layer_graph.UNPLACED`), so they change the caching allocator's replay of the layer, not the
    arena's placement; the answer names the format (``gemm_format``)."""
    from memo_sim.cost.gemm_format import check_gemm_format
    from memo_sim.layout.parallel import Layout, check_layout
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.memplan.baseline import caching_allocator_layer_report
    from memo_sim.memplan.planner import plan_memory

    check_gemm_format(model, profile)
    if schedule_runs_policy("sppo", policy):  # SPPO's schedule runs it, and only it (`memo_sim.layout.schedule`)
        # its subsequences go through PyTorch's caching allocator, never a static plan (the what-if refuses
        # --policy sppo with --allocator plan, `memo_sim.search.whatif._sppo_flags_why_not`); this command plans one
        # layer's forward and backward of a whole sequence, which SPPO never runs (a review: 'sppo(N=1) ... static
        # plan arena 5.38 GiB')
        raise MemoError("--policy sppo: SPPO runs its subsequences on PyTorch's caching allocator, never on a static "
                        "memory plan; choose another --policy, or price SPPO with memo-sim whatif --policy sppo")
    lay = Layout(tp=tp, cp=cp, ulysses=ulysses, sp=sp, tp_mode=tp_mode)
    pol = asked_policy(policy, model, lay, alpha, MEMO_ALPHA)  # what the what-if and the simulator refuse, refused
    why = check_layout(lay, model, lay.gpus, profile.node_gpus, seq, batch)
    if why:
        raise MemoError(f"layout {lay.label()}: {why}; choose --tp / --cp / --ulysses that fit the model")
    say(f"bi-level plan of {model.name} {lay.label()} {pol.label()} (time limit {time_limit:g} s per solve)")
    plan = plan_memory(model, lay, batch, seq, pol, time_limit_s=time_limit, solver=solver)
    say("replaying the caching allocator on one layer")  # the baseline: one layer's forward + backward requests
    base = caching_allocator_layer_report(model, lay, batch, seq, pol, int(profile.usable_gpu_memory))
    cap = int(profile.usable_gpu_memory)
    result = {"model": model.name, "layout": lay.label(), "policy": pol.label(), "seq_tokens": seq,
              "gemm_format": model.gemm_format, **plan.summary(), "arena_bytes": plan.arena_bytes,
              "capacity_bytes": cap, "fits_capacity": plan.arena_bytes <= cap, "profile": profile.name,
              "caching_allocator_layer": _allocator_summary(base)}
    return result, [(f"memplan-{name}.png", tr, sol.offsets, int(sol.peak_bytes))
                    for name, sol, tr in (("fwd", plan.fwd, plan.fwd_trace), ("bwd", plan.bwd, plan.bwd_trace),
                                          ("model", plan.model, plan.model_trace))]


def _allocator_summary(rep) -> dict:
    """A caching-allocator replay (`memo_sim.memplan.caching_allocator.AllocatorReport`) in the words whatif and
    explain use: ``fragmentation_at_peak`` is 1 - allocated / reserved when the allocated bytes peak, as
    `memo_sim.memplan.replay_result.IterationReplay` measures it (a review: memplan printed 50.0% measured at the
    reserved peak, `AllocatorReport.fragmentation_at_peak`, beside whatif's measure at the allocation peak; that
    one stays as ``fragmentation_at_reserved_peak``). The replay's series are taken after each step's frees and
    then mallocs, so within a step the allocated bytes peak at its end: the first step whose allocated bytes are
    the peak is the moment, and its reserved bytes the ones at it."""
    from memo_sim.memplan.caching_allocator import fragmentation  # noqa: PLC0415

    alloc = rep.series_allocated_bytes
    at = max(range(len(alloc)), key=alloc.__getitem__) if alloc else None  # the first step at the peak
    reserved_at = rep.series_reserved_bytes[at] if at is not None else rep.peak_reserved_bytes
    peak = alloc[at] if at is not None else rep.peak_allocated_bytes
    return {"peak_allocated_bytes": rep.peak_allocated_bytes, "peak_reserved_bytes": rep.peak_reserved_bytes,
            "reserved_at_peak_allocated_bytes": reserved_at, "fragmentation_at_peak": fragmentation(peak, reserved_at),
            "fragmentation_at_reserved_peak": rep.fragmentation_at_peak,
            "num_reorganizations": rep.num_reorganizations, "num_cuda_malloc": rep.num_cuda_malloc, "oom": rep.oom}
