"""``memo-exec``: run a plan.json on a device and report measured vs predicted; record a layer trace.

    memo-exec run plan.json [--device auto|cpu|cuda|cuda:N] [--steps N] [--out DIR] [--layers N] [--nproc N]
                            [--attention-backend auto|flash_attn|sdpa_flash|sdpa_efficient|sdpa_cudnn|math]
                            [--tokens FILE] [--dtype fp32|fp64|bf16] [--seed S] [--lr LR] [--no-memory-plan]
                            [--json] [--pg-timeout S] [--progress/--no-progress]
    torchrun --nproc-per-node N -m memo_exec run plan.json [same options]
    memo-exec trace plan.json [--device meta|auto|cpu|cuda|cuda:N] [--target cuda|cpu] [--out trace.json]
                              [--cuda-history FILE] [--write-plan PLAN_WITH_MEMORY_PLAN.json]

User errors (unknown plan schema, a layout this executor does not run, a missing backend, a run
that does not fit by the executor's own estimate, a bad memory plan) print one ``error:`` line
on stderr and exit with code 2, before anything large is allocated.
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

from memo_exec.errors import ExecError, user_errors
from memo_exec.device_forms import AUTO_WORDS, DEVICE_FORMS, TRACE_FORMS, device_forms_text
from memo_exec.speed_probe import SPEED_DRIFT_LIMIT
from memo_sim.errors import guarded, parsed_or_one_line, usage_line
from memo_sim.plan.schema import ATTENTION_BACKENDS as BACKENDS  # the names only: memo_exec.attention imports torch

# the --device spellings each command takes (`memo_exec.device.check_device_name`; N: a GPU index, 0, 1, ...)
RUN_DEVICES, TRACE_DEVICES = DEVICE_FORMS, TRACE_FORMS  # run, validate and calibrate; trace (`device_forms`)


class _ExecGroup(click.Group):
    """A bad flag is one line on stderr and exit code 2, as in memo-sim; an operating-system error
    one line and exit code 1; Ctrl-C exit code 130."""

    def make_context(self, info_name, args, parent=None, **extra):
        return parsed_or_one_line(
            lambda: super(_ExecGroup, self).make_context(info_name, args, parent=parent, **extra),
            lambda line: click.echo(line, err=True))

    def invoke(self, ctx):
        try:
            return guarded(lambda: super(_ExecGroup, self).invoke(ctx), lambda line: click.echo(line, err=True),
                           ctx.exit)
        except click.UsageError as e:
            click.echo(usage_line(e), err=True)
            ctx.exit(2)


def multi_device_words(plan, plan_file: str, device_kind: str = "cuda") -> str:
    """How to run a plan of several devices: one process each on this machine (--nproc) on a CPU (its ranks are
    processes, any count) or where they fit on one node of the plan's profile, else torchrun on the plan's nodes,
    which the simulator fills in order (the last one partly), or a smaller plan to try here."""
    n, lab = plan.layout.gpus, plan.layout.label()
    here = (f"plan layout {lab} uses {n} devices: run it with --nproc {n} on this machine or torchrun "
            f"--nproc-per-node {n} -m memo_exec run {plan_file}")
    if device_kind == "cpu":
        return here
    try:
        from memo_sim.profile.loader import load_profile  # noqa: PLC0415

        per_node = load_profile(plan.profile).node_gpus
    except Exception:  # noqa: BLE001 - a profile not found here: the node size is only advice
        per_node = None
    if per_node is None or n <= per_node:
        return here
    nodes, last = -(-n // per_node), n % per_node
    counts = (f"--nproc-per-node {per_node}" if not last else
              f"--nproc-per-node {per_node} on the first {'node' if nodes == 2 else f'{nodes - 1} nodes'} and {last} "
              f"on the last, as the plan places them")
    return (f"plan layout {lab} uses {n} devices on {nodes} nodes of {per_node}: run it on those nodes with torchrun "
            f"--nnodes {nodes} {counts} (--node-rank R --master-addr HOST -m memo_exec run {plan_file}), or try a "
            f"plan for one node here (memo-sim whatif --gpus {per_node} ...)")


@click.group(cls=_ExecGroup, help="Run a memo plan on real hardware and compare with the simulator's prediction.",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memo")  # as memo-sim's
def cli() -> None:
    pass


@cli.command("run", help="Train the plan for --steps steps and write measured.json, trace.json and report.md "
             "into --out. "
             "A multi-GPU plan runs one process per device: --nproc N on this machine, or under "
             "torchrun --nproc-per-node N -m memo_exec run plan.json (--device cpu: gloo).")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--device", default=None,
              help=f"{device_forms_text(DEVICE_FORMS)}; {AUTO_WORDS}")
@click.option("--steps", default=3, show_default=True, type=int, help="training steps (step 0 is a warm-up)")
@click.option("--out", "out_dir", default="exec_out", show_default=True, type=click.Path(file_okay=False),
              help="folder for measured.json, trace.json and report.md (written there when the run is done)")
@click.option("--layers", default=None, type=int,
              help="run the plan's model cut to N of its layers (at most its own count; not memo-sim's --layers, "
                   "which sets the layer count of the model it plans); default all its layers")
@click.option("--attention-backend", default=None, type=click.Choice(BACKENDS),
              help="override the plan's attention_backend")
@click.option("--tokens", "tokens_file", default=None, type=click.Path(dir_okay=False),
              help=".npy or .bin (uint16) token ids; default synthetic")
@click.option("--dtype", default=None, type=click.Choice(["bf16", "fp32", "fp64"]),
              help="compute dtype (default: the plan's model dtype on CUDA, fp32 on CPU; fp64 on CPU only)")
@click.option("--seed", default=0, show_default=True, type=int,
              help="random seed of the initial weights and the synthetic tokens")
@click.option("--lr", default=3e-4, show_default=True, type=float, help="learning rate of the optimizer")
@click.option("--no-memory-plan", is_flag=True, help="ignore plan.memory_plan (caching allocator only)")
@click.option("--profile", "profile", default=None,
              help="predict with this hardware profile, a name or a .yaml/.json file (e.g. one memo-exec calibrate "
                   "wrote), instead of the plan's")
@click.option("--json", "as_json", is_flag=True,
              help="print the measured-vs-predicted rows (totals, streams, ops per layer, memory) as JSON")
@click.option("--nproc", default=None, type=click.IntRange(1, 4096),
              help="launch N processes on this machine (torchrun) for a multi-device plan")
@click.option("--pg-timeout", default=600.0, show_default=True, type=click.FloatRange(min=1.0),
              help="seconds a rank waits on a collective before it gives up (distributed runs)")
@click.option("--progress/--no-progress", default=None,
              help="per-step progress on stderr (default: on when stderr is a terminal and not --json)")
@user_errors("while running the plan")
def run_cmd(plan_file, device, steps, out_dir, layers, attention_backend, tokens_file, dtype, seed, lr,
            no_memory_plan, profile, as_json, nproc, pg_timeout, progress) -> None:
    from memo_exec.distributed.launch import in_torchrun  # noqa: PLC0415
    from memo_exec.plan_check import check_plan_contract  # noqa: PLC0415
    from memo_exec.runner import RunOptions, distributed_only, run_model, use_profile  # noqa: PLC0415
    from memo_sim.plan.executor_scope import memory_plan_missing  # noqa: PLC0415
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415

    if device is not None:  # a misspelled --device, one line before the plan is read (no CUDA needed)
        from memo_exec.device import check_device_name  # noqa: PLC0415

        check_device_name(device, RUN_DEVICES)
    if progress is None:
        progress = sys.stderr.isatty() and not as_json
    opts = RunOptions(device=device, steps=steps, layers=layers, attention_backend=attention_backend, dtype=dtype,
                      tokens_file=tokens_file, seed=seed, lr=lr, use_memory_plan=not no_memory_plan, profile=profile)
    # what check-plan refuses, refused here too, before anything runs (every rank alike under torchrun)
    plan = read_plan(plan_file)
    _layers_fit(plan, layers)
    from memo_exec.alloc_settings import set_env  # noqa: PLC0415

    set_env(plan.layout, device)  # before anything touches CUDA (the ranks --nproc launches inherit it)
    check_plan_contract(plan, plan_file, not no_memory_plan, device, attention_backend, profile)
    _backend_runs_on(plan, plan_file, attention_backend, device, "run")  # the plan's field or the flag, named
    if in_torchrun():
        from memo_exec.distributed import launch  # noqa: PLC0415

        # A rank of several leaves without interpreter finalization, whether its work is done or it refused (one
        # line, exit 2, `user_errors`'s: after it joined the process group, the memory check) or a collective failed
        # (exit 1): there gloo's C++ threads can still drop tensors that need the GIL and abort the process (SIGABRT,
        # "terminate called without an active exception"; a review: 4 refusals in 10 ended so, and the launcher then
        # said the rank died). Its process group is destroyed by then (`run_rank`). A world of one (no peer, no
        # pair threads) refuses as any command does.
        several = launch.env_world() > 1
        try:
            user_errors("while running the plan")(launch.run_rank)(plan_file, opts, out_dir, as_json, pg_timeout,
                                                                    progress, click.echo)
        except launch.CommFailure as e:
            click.echo(str(e), err=True)
            if not several:
                sys.exit(1)
            _leave(1)
        except SystemExit as e:  # a user error's one line was said
            if not several:
                raise
            _leave(e.code if isinstance(e.code, int) else 1)
        except Exception:  # noqa: BLE001 - a bug: its traceback (in launcher.log), exit 1, not a SIGABRT over it
            if not several:
                raise
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            _leave(1)
        _leave(0)  # the work done (a world of one too, as before)
    missing = None if no_memory_plan else memory_plan_missing(plan)  # check-plan's words, said once the run has run
    warn = f"warning: {plan_file}: {missing}" if missing else None  # (an error stays the one line a refusal prints)
    use_profile(plan, profile)  # a profile that does not load stops here, before anything runs
    if profile is None:  # the plan's own, as check-plan loads it (a review: a plan check-plan refused ran here)
        _plan_profile_loads(plan, plan_file)
    if tokens_file is not None:  # the ranks' own check (`TokenSource`), here before --out is staged or a rank starts
        from memo_exec.data import check_tokens  # noqa: PLC0415

        check_tokens(tokens_file, plan.model.vocab, plan.seq_tokens)
    if nproc is None and plan.layout.gpus == 1 and distributed_only(plan):  # e.g. SPPO with pp = 1
        _run_one_process(plan_file, opts, out_dir, as_json, pg_timeout, progress)
        _warn(warn)
        return
    if nproc is not None:
        from memo_exec.distributed.launch import (  # noqa: PLC0415
            backend_for, launch_nproc, rank_device, say_memory_plan_not_followed)
        from memo_exec.distributed.runner import check_plan_for_world  # noqa: PLC0415

        check_plan_for_world(plan, nproc, opts)
        backend_for(rank_device(device, 0))
        _ranks_fit_host(plan, opts, nproc, rank_device(device, 0))  # the ranks together, before torchrun
        say_memory_plan_not_followed(plan, opts, click.echo)  # once the plan is not refused, before the ranks start
        from memo_sim.fileio import OutputFolder  # noqa: PLC0415

        # rank 0 writes into a staging folder in --out (beside it where it is created), moved in when every rank
        # succeeded; a failed or interrupted run leaves --out untouched and keeps the stage (its launcher.log,
        # which the error line names) as the incomplete folder; a refusal of the ranks (exit 2: their one line
        # says it all, and names no folder) removes it
        outf = OutputFolder(out_dir, "memo-exec run", RUN_OUTPUT_FLOOR_BYTES)
        argv = [plan_file, "--steps", str(steps), "--out", str(outf.stage), "--seed", str(seed), "--lr", repr(lr),
                "--pg-timeout", repr(pg_timeout)]
        for flag, v in (("--device", device), ("--layers", layers), ("--attention-backend", attention_backend),
                        ("--tokens", tokens_file), ("--dtype", dtype), ("--profile", profile)):
            if v is not None:
                argv += [flag, str(v)]
        argv += ["--no-memory-plan"] * bool(no_memory_plan) + ["--json"] * bool(as_json)
        # rank 0 writes "The machine during the run" from the ranks' own meters (`memo_exec.host_share.ranks_share`,
        # the oversubscription line's figure), not from a meter of this launcher over its start-up and outputs too
        rc, said = launch_nproc(nproc, argv, str(outf.stage), progress, shown_out=out_dir)
        from memo_exec.distributed.launch import run_began  # noqa: PLC0415

        began = run_began(outf.stage, clear=True)
        if rc:
            if rc == 2 and not began:  # the ranks refused before their run: their one line, no stage left
                outf.discard()
            _say(said)
            sys.exit(rc)
        outf.commit()
        _say(said)  # rank 0's summary (or --json document), once every output is in place
        _warn(warn)
        return
    if plan.layout.gpus > 1:
        run_model(plan, opts)  # what no process count runs (FP8 GEMMs, a compiled plan, ...): said, not --nproc
        from memo_exec.distributed.launch import rank_device  # noqa: PLC0415

        raise ExecError(multi_device_words(plan, plan_file, rank_device(device, 0).kind))
    _run_single(plan, plan_file, opts, out_dir, as_json, progress)
    _warn(warn)


def _leave(code: int) -> None:
    """A torchrun rank's exit: its output flushed, then ``os._exit`` (no interpreter finalization: `run_cmd`)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, or a stream closed: nothing more to say
            pass
    os._exit(code)


def _ranks_fit_host(plan, opts, nproc: int, device_spec) -> None:
    """--nproc's launcher on a CPU: refuse, before torchrun starts a rank or --out is staged, ranks that do not fit
    this host's free memory together (`memo_exec.distributed.runner.launcher_fit_error`: every rank sized here from
    the layout). A GPU run's ranks check in their processes (this one does not touch CUDA); a rank this process
    cannot size (an error other than the fit) is left to the ranks, which check again in any case."""
    if device_spec.is_cuda:
        return
    from memo_exec.distributed.runner import launcher_fit_error  # noqa: PLC0415
    from memo_exec.errors import FitError  # noqa: PLC0415

    try:
        err = launcher_fit_error(plan, opts, nproc)
    except FitError as e:
        err = e
    except Exception:  # noqa: BLE001 - the ranks set up as they will and say it in their own line
        return
    if err is not None:
        raise err


def _layers_fit(plan, layers: int | None) -> None:
    """Refuse, naming --layers, a --layers N the plan's model cannot be cut to (every path, before any rank starts):
    a MoE model whose first ``dense_layers`` layers are dense needs more than that many (a review: ``--layers 1`` of a
    model with one dense layer said "model glm-4.5-air-custom: (top): dense_layers (1) leaves no MoE layer of the 1;
    give fewer dense layers or no experts", naming neither --layers nor its fix); any other refusal of the cut model
    (`memo_sim.model.config.ModelConfig`'s checks, as `memo_exec.runner.run_model` builds it) is its line, naming
    --layers. More layers than the plan's model has is `run_model`'s refusal."""
    import dataclasses  # noqa: PLC0415

    from memo_sim.errors import MemoError  # noqa: PLC0415

    m = plan.model
    if layers is None or layers >= m.layers:
        return
    if m.moe and m.dense_layers >= layers:
        s = "s" if m.dense_layers > 1 else ""
        raise ExecError(f"--layers {layers}: the plan's model {m.name} has {m.dense_layers} dense layer{s} before its "
                        f"MoE layers, so {layers} would leave no MoE layer; give --layers {m.dense_layers + 1} or "
                        f"more (more than its dense layers), up to its {m.layers}")
    try:
        dataclasses.replace(m, layers=layers)
    except (MemoError, ValueError) as e:
        why = str(e).splitlines()[0].replace("(top): ", "")
        raise ExecError(f"--layers {layers}: the plan's model cut to {layers} layers is refused ({why}); give another "
                        f"--layers, up to its {m.layers}") from None


def _backend_runs_on(plan, plan_file, attention_backend, device, what: str) -> None:
    """Refuse a CUDA-only attention backend on a device that is not CUDA in one line naming --attention-backend where
    it was given, else the plan's ``attention_backend`` field (`memo_exec.attention.check_backend_device`), before
    anything runs (the refusal inside the executor named neither)."""
    from memo_exec.attention import CUDA_ONLY, check_backend_device  # noqa: PLC0415 - imports torch

    if (attention_backend or plan.attention_backend) not in CUDA_ONLY:
        return
    from memo_exec.device import resolve_device  # noqa: PLC0415

    check_backend_device(attention_backend, plan.attention_backend, plan_file, resolve_device(device).kind, what)


def _warn(line: str | None) -> None:
    if line:
        click.echo(line, err=True)


def _plan_profile_loads(plan, plan_file) -> None:
    """Refuse, with `memo-sim check-plan`'s line, a plan whose profile does not load here: the run's prediction and
    comparison need it (`--profile` names another)."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        load_profile(plan.profile)
    except MemoError as e:
        raise ExecError(f"{plan_file}: profile: {str(e).splitlines()[0]}; or give --profile NAME|FILE") from None


def _say(text: str) -> None:
    """Print ``text`` on stdout (as is: it holds its own line ends), quietly stopping if the reader went away
    (``| head -1``): called once the run's outputs are complete."""
    if not text:
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        from memo_exec.distributed.launch import stdout_gone  # noqa: PLC0415

        stdout_gone()


def _echo_after(lines: list[str]):
    """An ``echo`` for a run that writes its outputs into a staging folder: stdout lines kept in ``lines`` for
    `_say` once the folder is in place, stderr lines (progress, warnings) written at once."""
    def echo(message=None, err: bool = False, **kw):
        if err:
            click.echo(message, err=True, **kw)
        else:
            lines.append(f"{'' if message is None else message}\n")

    return echo


# What any run writes at least (`memo_exec.distributed.launch.RUN_OUTPUT_FLOOR_BYTES`: one value for every run path,
# the torchrun ranks' too, which may not import this module)
from memo_exec.distributed.launch import RUN_OUTPUT_FLOOR_BYTES  # noqa: E402


def _run_one_process(plan_file, opts, out_dir, as_json, pg_timeout, progress) -> None:
    """A one-device plan whose schedule lives in the distributed executor (`distributed_only`):
    the distributed executor in this process, a process group of one (no torchrun), its outputs
    staged in --out (beside it where it is created) and moved in at the end."""
    from memo_exec.distributed.launch import run_rank  # noqa: PLC0415
    from memo_sim.fileio import output_folder  # noqa: PLC0415

    lines: list[str] = []
    with output_folder(out_dir, "memo-exec run", RUN_OUTPUT_FLOOR_BYTES) as outf, _threads_as_launched(opts):
        run_rank(plan_file, opts, str(outf.stage), as_json, pg_timeout, progress, _echo_after(lines), in_process=True,
                 shown_out=out_dir)
    _say("".join(lines))  # once the outputs are in place


def _run_single(plan, plan_file, opts, out_dir, as_json, progress) -> None:
    from memo_exec.report import write_outputs  # noqa: PLC0415
    from memo_exec.runner import Executor  # noqa: PLC0415

    from memo_sim.fileio import output_folder  # noqa: PLC0415

    def report(done, total, rec):
        if progress:
            click.echo(f"[memo-exec] step {done}/{total}: {rec.iteration_s:.3f} s, loss {rec.loss:.4f}", err=True)

    # the outputs are staged in --out (beside it where it is created) from the start (an unwritable --out fails
    # before any step) and moved in together at the end; a failure or interrupt leaves --out as it was
    with output_folder(out_dir, "memo-exec run", RUN_OUTPUT_FLOOR_BYTES) as outf, _threads_as_launched(opts):
        from memo_exec.host_share import CpuShareMeter, append_run_share  # noqa: PLC0415

        ex = Executor(plan, opts)
        try:
            with CpuShareMeter() as meter:
                res = ex.run(progress=report)
        finally:
            ex.close()
        _cores_of_one_process(res, meter.result)
        staged, comparison = write_outputs(res, outf.stage, plan_file)
        append_run_share(str(staged["report"]), meter.result, res.meta.get("device_kind"))
    paths = {k: outf.path(p) for k, p in staged.items()}
    st = res.steady
    from memo_exec.attention import priced_kernel_note  # noqa: PLC0415 - imports torch

    note = priced_kernel_note(res.meta.get("attention_kernel_priced"), res.meta.get("attention_backend"),
                              res.meta.get("device_kind"))
    if comparison.stale:
        from memo_exec.report import stale_line  # noqa: PLC0415

        click.echo(stale_line(comparison.stale), err=True)
    if res.meta.get("oversubscribed"):  # the --nproc ranks' warning (`memo_exec.distributed.launch.run_rank`)
        click.echo(f"warning: {res.meta['oversubscribed']}", err=True)
    if as_json:
        import json  # noqa: PLC0415

        doc = {"model": res.meta["model"], "policy": res.meta["policy"], "device": res.meta["device"],
               "layers": res.meta["layers"], "tokens": res.meta["tokens"], "steady_state": st,
               "losses": [s["loss"] for s in res.summaries], "speed_probe": res.meta.get("speed_probe"),
               "cores": res.meta.get("cores"), "oversubscribed": res.meta.get("oversubscribed"),
               **comparison.to_dict(),
               "notes": [n for n in (note, res.meta.get("allocator_settings_note")) if n],
               "files": {k: str(v) for k, v in paths.items()}}
        _say(json.dumps(doc, indent=1, default=float) + "\n")
        return
    _say(f"{res.meta['model']} {res.meta['policy']} on {res.meta['device']}: "
         f"{st['iteration_s']:.4f} s/iteration, {res.meta['tokens'] / st['iteration_s']:,.0f} tokens/s, "
         f"loss {res.summaries[-1]['loss']:.4f}\n"
         f"wrote {', '.join(str(v) for v in [paths['report']] + [v for k, v in paths.items() if k != 'report'])}\n"
         + (f"{res.meta['allocator_settings_note']}\n" if res.meta.get("allocator_settings_note") else ""))
    if note:
        click.echo(note, err=True)


def _threads_as_launched(opts):
    """The CPU threads of a run in this process chosen as ``--nproc``'s launcher chooses its ranks' (one rule,
    `memo_exec.host_share.default_threads`: the user's OMP_NUM_THREADS, else the plan's profile's calibration count,
    else one a process), where without it torch's default of every core ran (a review: 2.88 s an iteration at 2
    threads on a loaded 2-core machine, 0.038 s under --nproc 1)."""
    from memo_exec.device import resolve_device  # noqa: PLC0415
    from memo_exec.host_share import default_threads  # noqa: PLC0415

    return default_threads(not resolve_device(opts.device).is_cuda)


def _cores_of_one_process(res, share) -> None:
    """A CPU run's ``meta["cores"]`` and, where its threads and other processes wanted more cores than the machine
    has, ``meta["oversubscribed"]``: the rule and line of an --nproc run's ranks
    (`memo_exec.distributed.launch.oversubscription`), for one process measured by
    `memo_exec.host_share.CpuShareMeter` (a review: the single-process path printed no "cores oversubscribed"
    warning where the --nproc path did)."""
    if res.meta.get("device_kind") == "cuda" or share is None:
        return
    from memo_exec.distributed.launch import oversubscription  # noqa: PLC0415

    threads = int((res.meta.get("cpu_threads") or {}).get("threads") or 1)
    cores = oversubscription(1, threads, [share.to_dict()])
    res.meta["cores"] = cores
    if cores["line"]:
        res.meta["oversubscribed"] = cores["line"]


@cli.command("trace", help="Record one layer's malloc/free sequence (memo-trace JSON).")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--device", default="meta", show_default=True,
              help="meta (no memory: the layer's requests only), auto (cuda if available, else cpu), cpu, cuda or "
                   "cuda:N (N: a GPU index, 0, 1, ...)")
@click.option("--out", "out_file", default="layer_trace.json", show_default=True, type=click.Path(dir_okay=False),
              help="the memo-trace JSON file to write (checked before anything is recorded)")
@click.option("--dtype", default=None, type=click.Choice(["bf16", "fp32", "fp64"]),
              help="default: the plan's dtype on meta and CUDA, fp32 on CPU")
@click.option("--attention-backend", default=None, type=click.Choice(BACKENDS),
              help="override the plan's attention_backend")
@click.option("--target", default="cuda", show_default=True, type=click.Choice(["cuda", "cpu"]),
              help="with --device meta: the device the plan will run on (what --attention-backend auto resolves "
                   "to); refused with another --device, which records on that device")
@click.option("--cuda-history", default=None, type=click.Path(dir_okay=False),
              help="also write what the CUDA caching allocator saw (torch.cuda.memory._record_memory_history)")
@click.option("--write-plan", default=None, type=click.Path(dir_okay=False),
              help="write a copy of the plan whose memory_plan is the greedy placement of this trace")
@user_errors("while running the plan")
def trace_cmd(plan_file, device, out_file, dtype, attention_backend, target, cuda_history, write_plan) -> None:
    from memo_exec.trace import memory_plan_from_trace, record_cuda_history, record_layer_trace  # noqa: PLC0415
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415
    from memo_sim.plan.schema import write_plan as _write_plan  # noqa: PLC0415

    if device != "meta":  # a misspelled --device, one line before the plan is read (no CUDA needed)
        from memo_exec.device import check_device_name  # noqa: PLC0415

        check_device_name(device, TRACE_DEVICES)
    for flag, path in (("--out", out_file), ("--cuda-history", cuda_history), ("--write-plan", write_plan)):
        if path is not None and not path.strip():  # '' was written as '.' (--out) or skipped (--write-plan)
            raise ExecError(f"{flag} is empty; give a file path (e.g. {flag} {_TRACE_EXAMPLES[flag]})")
    if device != "meta" and click.get_current_context().get_parameter_source("target").name != "DEFAULT":
        raise ExecError(f"--target {target} applies only with --device meta (the device the plan will run on); with "
                        f"--device {device} the layer is recorded on that device: drop --target, or give --device "
                        f"meta")
    plan = read_plan(plan_file)
    if plan.layout.kernel_fusion != "fused":  # the executor's layer runs uncompiled
        raise ExecError(f"plan layout {plan.layout.label()}: kernel_fusion {plan.layout.kernel_fusion}: the executor's "
                        "layer runs uncompiled, so its trace would not be the plan's; plan with fused kernels to trace it")
    from memo_sim.plan.executor_scope import plan_why_not  # noqa: PLC0415

    # the refusals of `memo-exec run` the plan alone decides (`memo_exec.runner.run_model`): a layer the executor
    # does not build as priced (GEMM format, latent attention, MoE, ...) has no trace of the plan's (a review: an MLA
    # plan run refuses in one line crashed here in the attention's reshape)
    why = plan_why_not(plan.model, plan.layout, plan.policy, plan.schedule, plan.batch,
                       plan.micro_batch or plan.batch, plan.seq_tokens)
    if why:
        raise ExecError(why)
    from memo_sim.api import runnable_problems  # noqa: PLC0415

    # the layout and the policy against the model, as check-plan and run refuse them (a review: a dense plan edited to
    # recompute_moe was traced and --write-plan wrote a plan every other command refuses); its memory plan is what
    # --write-plan replaces, so it is not checked here
    problems = runnable_problems(plan, memory_plan=False)
    if problems:
        raise ExecError(f"{plan_file}: {problems[0]}")
    _trace_outputs_writable(plan, device, out_file, cuda_history, write_plan)
    if device != "meta":  # the plan's CUDA-only attention_backend (or the flag's) on a CPU, named as run names it
        _backend_runs_on(plan, plan_file, attention_backend, device, "trace")
    tr = record_layer_trace(plan, device, dtype, attention_backend, target)
    tr.write_json(out_file)
    click.echo(f"wrote {out_file}: {len(tr)} buffers, max live {tr.max_live_bytes() / 2**20:.1f} MiB")
    if cuda_history:
        ct = record_cuda_history(plan, "cuda" if device in ("meta", "auto") else device, dtype, attention_backend)
        ct.write_json(cuda_history)
        click.echo(f"wrote {cuda_history}: {len(ct)} caching-allocator blocks")
    if write_plan:
        plan.memory_plan = memory_plan_from_trace(tr)
        _write_plan(plan, write_plan)
        click.echo(f"wrote {write_plan}: arena {plan.memory_plan.transient_arena_bytes / 2**20:.1f} MiB")


_TRACE_EXAMPLES = {"--out": "layer_trace.json", "--cuda-history": "cuda_history.json",
                   "--write-plan": "plan_with_memory_plan.json"}


def _trace_outputs_writable(plan, device, out_file, cuda_history, write_plan) -> None:
    """Refuse, before anything is recorded or written, what would fail after the trace was written (a review: with
    --cuda-history on a machine without CUDA, --out was written and the error then named a --device cuda the user
    never gave; an unwritable --write-plan failed after --out was written): --cuda-history's CUDA device
    (`memo_exec.trace.record_cuda_history` records on --device, cuda for meta) and every output path
    (`memo_sim.fileio.check_output_file`: a device node or a folder that cannot be written is one line)."""
    from memo_sim.fileio import check_output_file  # noqa: PLC0415

    if cuda_history:
        import torch  # noqa: PLC0415

        on = "cuda" if device == "meta" else ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else device  # auto: cuda where there is one (a review: auto was refused on a GPU machine too)
        if not on.startswith("cuda"):
            raise ExecError(f"--cuda-history records the CUDA caching allocator: it needs --device cuda (or meta, "
                            f"then recorded on cuda), not {device}; give --device cuda or drop --cuda-history")
        if not torch.cuda.is_available():
            raise ExecError("--cuda-history records the CUDA caching allocator, which needs a CUDA device, and torch "
                            "sees none here; drop --cuda-history, or trace on a machine with a GPU")
        if plan.layout.gpus > 1:
            raise ExecError(f"plan layout {plan.layout.label()}: --cuda-history records single-device plans only; "
                            f"drop --cuda-history")
    for field, path in (("--out", out_file), ("--cuda-history", cuda_history), ("--write-plan", write_plan)):
        if path:
            check_output_file(path, field)


@cli.command("validate", help="Predict a set of plans with a (calibrated) profile, run each in its own process, "
             "and tabulate predicted vs measured (validation.md, validation.json).")
@click.option("--profile", "profile_name", required=True, help="hardware profile to predict with: a name or a "
              ".yaml/.json file (e.g. one memo-exec calibrate wrote)")
@click.option("--model", "model_name", default=None,
              help="preset or model .yaml/.json; default a 4-layer toy (the last 2 layers of every policy stay on the "
                   "device, so the first 2 are offloaded or recomputed)")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="the model's layer count, as memo-sim's --layers (default: --model's, 4 for the toy)")
@click.option("--hidden", type=click.IntRange(min=1), default=None,  # 0 refused, not read as "the toy's"
              help="the model's hidden size (default: --model's, 256 for the toy)")
@click.option("--heads", type=click.IntRange(min=1), default=None,
              help="the model's attention heads (default: --model's, 8 for the toy)")
@click.option("--ffn", type=click.IntRange(min=1), default=None,
              help="the model's feed-forward size (default: --model's, 1024 for the toy)")
@click.option("--vocab", type=click.IntRange(min=1), default=None,
              help="the model's vocabulary size (default: --model's, 1000 for the toy)")
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default=None,
              help="model dtype (default bf16 on CUDA, fp32 on CPU; no fp16: memo-exec has no loss scaling)")
@click.option("--dp", type=click.IntRange(min=1), default=1, show_default=True,
              help="data-parallel degree of every plan (dp > 1: each plan runs on that many processes)")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="expert-parallel degree (a MoE --model; folded into the dp ranks): the report adds the "
                   "dispatcher's all-to-all time per layer, predicted vs measured")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="tensor-parallel degree of every plan (with sequence parallelism)")
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True,
              help="ring context-parallel degree of every plan")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True,
              help="pipeline stages of every plan (1F1B over --micro-batches micro-batches of one sequence)")
@click.option("--micro-batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="micro-batches of one sequence per iteration (gradient accumulation; a pipeline's micro-batches)")
@click.option("--seqs", default="1K,2K", show_default=True, help="comma-separated sequence lengths")
@click.option("--policies", default="store_all,full_recompute,full_offload,memo", show_default=True,
              help="comma-separated activation policies to validate (an unknown name is refused with the list of "
                   "names); one that takes alpha (memo) once per --alphas value")
@click.option("--alphas", default="0.25,0.5,0.75", show_default=True,
              help="MEMO alphas, each in [0, 1] or 'sim' (the simulator's alpha at each length)")
@click.option("--budget", "budget_s", default=None, type=click.FloatRange(min=1.0),
              help="seconds for all the runs; each gets a timeout from what is left (default: no limit)")
@click.option("--device", default=None,
              help=f"{device_forms_text(DEVICE_FORMS)}; {AUTO_WORDS}")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(1, 100),
              help="training steps per plan; step 0 is a warm-up, the others give the median")
@click.option("--out", "out_dir", default="validation_out", show_default=True, type=click.Path(file_okay=False),
              help="folder for validation.json, validation.md, the plans (plans/) and each run's outputs (runs/)")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False),
              help="markdown report path (default OUT/validation.md), e.g. reports/validation-h100.md")
@click.option("--progress/--no-progress", default=None,
              help="a progress bar on stderr (default: on when stderr is a terminal)")
@click.option("--record/--no-record", default=True, show_default=True,
              help="write the measured step-time errors into the profile's file (its validation block, which "
                   "answers on the profile print)")
@click.option("--speed-retries", default=1, show_default=True, type=click.IntRange(0, 5),
              help="CPU: run a plan again when the machine's speed (a reference GEMM after each step) moved more "
                   f"than {SPEED_DRIFT_LIMIT:.0%} from the calibration's during its run (no more, once a plan's "
                   "runs all drifted one way: the speed moved since the calibration)")
@user_errors("while validating")
def validate_cmd(profile_name, model_name, layers, hidden, heads, ffn, vocab, dtype, dp, ep, tp, cp, pp, micro_batches,
                 seqs, policies, alphas, budget_s, device, steps, out_dir, report_path, progress, record,
                 speed_retries):
    import shlex

    from memo_exec.validate import check_outputs, comma_items, plan_set, summary_line, validate
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import get_model, with_overrides
    from memo_sim.profile.loader import load_profile
    from memo_sim.units import parse_count

    from memo_exec.device import check_device_name, resolve_device  # noqa: PLC0415

    if device is not None:  # a bad --device, or cuda without one: one line before any plan is made or run
        check_device_name(device, RUN_DEVICES)
    spec = resolve_device(device)
    dev = spec.kind if device in (None, "auto") else device
    profile = load_profile(profile_name)
    from memo_exec.validate import TOY_MODEL  # noqa: PLC0415

    base = get_model(model_name) if model_name else TOY_MODEL
    model = with_overrides(base, rename=False, layers=layers or None, hidden=hidden or None, heads=heads or None,
                           ffn=ffn or None, vocab=vocab or None, dtype=dtype or ("bf16" if dev.startswith("cuda") else "fp32"))
    seq_list = [parse_count(s, "--seqs") for s in comma_items(seqs, "--seqs", "length", "1K,2K")]
    try:
        alpha_list = [a if a == "sim" else float(a) for a in comma_items(alphas, "--alphas", "alpha", "0.25,0.5,sim")]
    except ValueError:
        raise click.BadParameter("expected comma-separated numbers or 'sim'", param_hint="--alphas") from None
    bad = next((a for a in alpha_list if a != "sim" and not 0.0 <= a <= 1.0), None)  # nan too
    if bad is not None:
        raise click.BadParameter(f"{bad:g} is not in [0, 1]; give alphas in [0, 1] such as 0.25,0.5,0.75, or 'sim'",
                                 param_hint="--alphas")
    pols = comma_items(policies, "--policies", "policy", "store_all,memo")
    from memo_sim.policy import policy_names  # noqa: PLC0415

    unknown = [p for p in pols if p not in policy_names()]
    if unknown:
        raise click.BadParameter(f"unknown policy {unknown[0]!r}; choose from {', '.join(policy_names())}",
                                 param_hint="--policies")
    layout = Layout(dp=dp, ep=ep, tp=tp, sp=tp > 1, cp=cp, pp=pp)
    from memo_sim.layout.parallel import expert_why_not  # noqa: PLC0415

    why = expert_why_not(layout, model)
    if why:  # a layout that does not fit the model: one line before anything runs
        raise click.BadParameter(why + _expert_ranks_fix(layout, model), param_hint="--ep")
    if model.layers % pp:  # validate splits the layers evenly (no first / last stage counts of its own)
        fit = [k for k in range(1, model.layers + 1) if model.layers % k == 0]
        raise click.BadParameter(f"{model.layers} layers do not split evenly into {pp} pipeline stages (validate "
                                 f"splits them evenly): give --layers a multiple of {pp}, or --pp "
                                 f"{', '.join(map(str, fit))}", param_hint="--pp")
    from memo_exec.validate import batch_split  # noqa: PLC0415
    from memo_sim.layout.parallel import check_layout, seq_fix_names  # noqa: PLC0415
    from memo_sim.layout.schedule import check_schedule  # noqa: PLC0415

    batch, micro, schedule = batch_split(layout, micro_batches)
    for s in seq_list:  # the same refusals the what-if gives, before anything runs
        why = check_layout(layout, model, layout.gpus, max(profile.node_gpus, layout.gpus), s, batch)
        if why:  # the length that divides named by validate's own option, not the what-if's --seq
            raise click.BadParameter(seq_fix_names(why, "--seqs"), param_hint="--tp/--cp/--pp/--dp")
    for p in pols:
        why = check_schedule(schedule, pp=layout.pp, vpp=layout.vpp, layers=model.layers, batch=batch,
                             micro_batch=micro, policy_name=p)
        if why:
            raise click.BadParameter(why, param_hint="--pp/--micro-batches")

    def alpha_for(seq):  # MEMO at the simulator's alpha
        from memo_sim.api import memo_alpha  # noqa: PLC0415

        res = memo_alpha(model, layout, 1, seq, profile)
        return (res.alpha if res.feasible else None), res.reason()

    check_outputs(out_dir, report_path, profile, dev, record)  # every output path, before any plan is predicted
    plans = plan_set(seq_list, pols, alpha_list, alpha_for)
    command = "memo-exec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if progress is None:
        progress = sys.stderr.isatty()
    with (click.progressbar(length=len(plans), label="validating", file=sys.stderr) if progress
          else contextlib.nullcontext()) as bar:
        path, summary = validate(model, profile, plans, device=dev, steps=steps, out_dir=out_dir,
                                 report_path=report_path, command=command, budget_s=budget_s, record=record,
                                 speed_retries=speed_retries, layout=layout, micro_batches=micro_batches,
                                 progress=(lambda done, total: bar.update(done - bar.pos)) if progress else None,
                                 say=lambda line: click.echo(line, err=True))
    click.echo(f"wrote {path}: {summary_line(summary)}; {summary['recorded']}")
    if "fitted curves" in summary.get("attention_pricing", ""):  # the report's line, where a timed shape would do better
        click.echo(f"note: attention priced {summary['attention_pricing']}", err=True)


def _expert_ranks_fix(layout, model) -> str:
    """What to give validate when its expert ranks do not fold into a stage's ranks (etp x ep must divide
    tp x cp x dp): the smallest --dp that holds them, or '' where that is not what failed; on a dense model, a
    MoE --model (no --dp makes a dense model's experts)."""
    import math  # noqa: PLC0415

    if not model.moe:
        return "; --ep needs a MoE model: give --model with experts (e.g. --model qwen2-moe-a2.7b), or drop --ep"
    need, stage = layout.ep * layout.etp, layout.stage_stride
    if (stage * layout.dp) % need == 0:
        return ""
    step = need // math.gcd(need, stage)  # stage x dp is a multiple of etp x ep for the multiples of this dp
    dp = step * -(-layout.dp // step)  # the first at or above the --dp given
    return f"; give --dp {dp} (the expert-parallel ranks are folded into a stage's tp x cp x dp ranks)"


def _register_calibrate() -> None:
    from memo_exec.calibrate import calibrate_cmd

    cli.add_command(calibrate_cmd, "calibrate")


_register_calibrate()


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="memo-exec")


if __name__ == "__main__":
    main()
