"""Starting a distributed run: under torchrun (one process per device) or, for ``--nproc N``,
as a torchrun of the same command on this machine.

Under torchrun every rank reads RANK / WORLD_SIZE / LOCAL_RANK (and torchrun's MASTER_ADDR /
MASTER_PORT rendezvous) from the environment, runs every check that needs no communication
(world size vs the plan, group divisibility, registered TP flavour and schedule, NCCL present on
CUDA) before it joins the process group, so a refusal is the same one line (exit 2) on every
rank and no rank waits for another. The process group has a timeout (``--pg-timeout``); a rank
whose collective fails (a peer died, or the timeout passed) prints one line naming the failure
and exits 1, so no rank is left hanging.

``--nproc N`` runs the cheap checks in the launching process, then ``python -m
torch.distributed.run --standalone --nproc-per-node N -m memo_exec run ...`` (the same entry
point), keeping the ranks' stdout (rank 0's summary or --json document) until the outputs are in
place, then printing it, and reducing their stderr to the distinct ``error:`` and ``warning:``
lines and progress (torchrun's own log goes to ``OUT/launcher.log``).

Rank 0 reports what the ranks measured of the machine (`merge_rank_meta`): on a CPU, the slowest
rank's machine-speed probe (`slowest_probe`) and whether the ranks and other processes
oversubscribed the cores (`oversubscription`).

Test hook: ``MEMO_EXEC_TEST_KILL=RANK:STEP`` makes that rank SIGKILL itself in the middle of
that step (after its first layer's forward).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from memo_exec.errors import ExecError

KILL_ENV = "MEMO_EXEC_TEST_KILL"
DEFAULT_PG_TIMEOUT_S = 600
RUN_OUTPUT_FLOOR_BYTES = 160 * 1024
"""What any run writes at least (a 1-layer, 1-step toy run wrote 170,457 bytes), the floor every run path checks
--out's free space against (`memo_sim.fileio.OutputFolder`): `staged_out` here, and `memo_exec.cli`, which imports it
(this module may not import the CLI: a cycle)."""


def in_torchrun() -> bool:
    from memo_sim.errors import RANK_ENV  # noqa: PLC0415 - the variables torchrun sets on its ranks

    return all(k in os.environ for k in RANK_ENV)


def env_rank() -> tuple[int, int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError) as e:
        raise ExecError(f"RANK / WORLD_SIZE / LOCAL_RANK: not set to integers by the launcher ({e})") from None


def env_world() -> int:
    """The world size torchrun set (WORLD_SIZE), 1 where it is not a whole number."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def rank_device(device: str | None, local_rank: int):
    """This rank's device: cuda:LOCAL_RANK when CUDA is asked for (or auto and present), else CPU."""
    import torch  # noqa: PLC0415

    from memo_exec.device import DeviceSpec, resolve_device  # noqa: PLC0415

    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        resolve_device("cuda")  # the one-line error when there is no CUDA device
        if local_rank >= torch.cuda.device_count():
            raise ExecError(f"LOCAL_RANK {local_rank}: only {torch.cuda.device_count()} CUDA device(s) on this node; "
                            f"use --nproc-per-node {torch.cuda.device_count()}")
        return DeviceSpec("cuda", local_rank)
    return resolve_device(device)


def backend_for(device_spec) -> str:
    import torch.distributed as dist  # noqa: PLC0415

    if device_spec.is_cuda:
        if not dist.is_nccl_available():
            raise ExecError("torch.distributed has no NCCL in this PyTorch build; a CUDA run needs it "
                            "(install a CUDA build of torch, or run with --device cpu for gloo)")
        return "nccl"
    if not dist.is_gloo_available():
        raise ExecError("torch.distributed has no gloo in this PyTorch build; a CPU run needs it")
    return "gloo"


def kill_point() -> tuple[int, int] | None:
    v = os.environ.get(KILL_ENV)
    if not v:
        return None
    try:
        r, s = v.split(":")
        return int(r), int(s)
    except ValueError:
        raise ExecError(f"{KILL_ENV}={v!r}: expected RANK:STEP") from None


def init_group(device_spec, timeout_s: float, in_process: bool = False) -> None:
    """Join torchrun's process group, or (``in_process``) make this process a group of one."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    backend = backend_for(device_spec)
    if device_spec.is_cuda:
        torch.cuda.set_device(device_spec.index)
    kw = {"device_id": device_spec.torch_device} if device_spec.is_cuda else {}
    if in_process:
        kw.update(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)


class CommFailure(Exception):
    """A collective failed (a peer died or the process-group timeout passed), or the run failed on a rank mid-step:
    its line said, exit 1, the stage kept (`_launch_status`)."""


COMM_FAILED = "a collective failed"
RUN_FAILED = "the run failed"
# words of a process group's own errors: torch.distributed's DistError family, or a backend's RuntimeError naming its
# transport or its wait (gloo's "Connection closed by peer [.../gloo/transport/tcp/pair.cc]", a c10d timeout)
_GROUP_WORDS = ("gloo", "nccl", "c10d", "processgroup", "process group", "connection", "timed out", "timeout", "socket",
                "peer")


def comm_failure_line(rank: int, err: BaseException, timeout_s: float, collective: bool = True) -> str:
    """The one line of a rank's failure: a collective's (``collective``, or an error from the process group itself),
    blaming a peer or the timeout, or the rank's own computation's otherwise (a review: a shape error 4 s into a run
    was said to be a collective's, timed out after 600 s)."""
    import torch.distributed as dist  # noqa: PLC0415

    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if len(first) > 240:
        first = first[:240] + "..."
    what = f"{type(err).__name__}: {first}{raised_at(err)}"
    if collective or isinstance(err, dist.DistError) or any(w in str(err).lower() for w in _GROUP_WORDS):
        return (f"error: rank {rank}: {COMM_FAILED} ({what}); another rank exited or did not answer within the "
                f"process-group timeout ({timeout_s:.0f} s); stopping")
    return f"error: rank {rank}: {RUN_FAILED} ({what}); torchrun stops the other ranks"


def raised_at(err: BaseException) -> str:
    """' at FILE:LINE in FUNC' of the innermost memo frame of ``err``'s traceback ('' if none): where
    the run was when the collective (or whatever raised) failed."""
    import traceback  # noqa: PLC0415

    frames = [f for f in traceback.extract_tb(err.__traceback__) if "memo_exec" in f.filename or "memo_sim" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    parts = f.filename.replace("\\", "/").split("/")
    where = "/".join(parts[-2:]) if len(parts) > 1 else f.filename
    return f" at {where}:{f.lineno} in {f.name}"


def killed_rank(torchrun_log: str) -> tuple[int, int] | None:
    """(rank, negative exit code) of a rank killed by a signal, from torchrun's failure summary: its "Root Cause
    (first observed failure)" when that rank was, else the first of its other failures killed by a signal other than
    SIGTERM (which torchrun stops the remaining ranks with): a peer that saw its collective fail left at once
    (`memo_exec.cli`: ``os._exit``, no interpreter shutdown) and may be observed first, in the same poll. None
    otherwise (the ranks exited by themselves, each with its own error line)."""
    head, sep, tail = torchrun_log.partition("Root Cause (first observed failure):")
    if not sep:
        return None
    root = _failures(tail)[:1]
    if root and root[0][1] < 0:
        return root[0]
    others = _failures(head.rpartition("Failures:")[2])
    return next(((r, c) for r, c in others if c < 0 and c != -signal.SIGTERM), None)


def _failures(summary: str) -> list[tuple[int, int]]:
    """(rank, exit code) of each failure of a section of torchrun's failure summary, in its order."""
    out, rank = [], None
    for line in summary.splitlines():
        m = re.match(r"\s*rank\s*:\s*(\d+)", line)
        if m:
            rank = int(m.group(1))
            continue
        m = re.match(r"\s*exitcode\s*:\s*(-?\d+)", line)
        if m and rank is not None:
            out.append((rank, int(m.group(1))))
            rank = None
    return out


OUT_ENV = "MEMO_EXEC_OUT"  # the --out the user named, when the ranks write into a staging folder (in it or beside)
# rank 0's mark in --nproc's staging folder once the ranks passed their checks and the run began: a failure after
# it (out of memory mid-run, a loss not finite: exit 2 too) keeps the stage, a refusal before it leaves nothing
# (`run_began`; a review: any exit-2 line deleted the stage, a mid-run out-of-memory's launcher.log with it)
STARTED_MARK = ".memo-exec-run-began"


def run_began(stage, clear: bool = False) -> bool:
    """Whether the ranks writing into ``stage`` began their run (`STARTED_MARK`); ``clear``: the mark removed (it is
    never one of the run's files)."""
    mark = Path(stage) / STARTED_MARK
    began = mark.exists()
    if clear:
        mark.unlink(missing_ok=True)
    return began
LOAD_ENV = "MEMO_EXEC_LOAD_1MIN"  # the machine's 1-minute load average when the launcher started the ranks
OVERSUBSCRIBED_SLACK_CORES = 0.5  # ranks' threads + other processes' cores beyond the cores by more: oversubscribed


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def oversubscription(ranks: int, threads: int, cpu: list[dict | None], cores: int | None = None,
                     load: float | None = None) -> dict:
    """Whether a CPU run's ranks and the machine's other processes wanted more cores than it has: ``ranks`` x
    ``threads`` torch threads plus what other processes took -- measured over the run where every rank's ``cpu``
    (`memo_exec.host_share.CpuShare.to_dict`) is known: rank 0's whole-machine busy time less every rank's own
    (`memo_exec.host_share.ranks_share`), else the 1-minute ``load`` average before the ranks started -- against
    ``cores`` (`os.cpu_count`), with `OVERSUBSCRIBED_SLACK_CORES` of slack (2 ranks on 2 cores: others above 0.5
    cores). ``line``: the report's one line, None where the cores sufficed."""
    from memo_exec.host_share import RUN_SHARE_WINDOW, ranks_share  # noqa: PLC0415

    cores = cores or os.cpu_count() or 1
    others, how = None, "not measured"
    share = ranks_share(cpu)  # the figure "The machine during the run" gives too: one measurement, one window
    if share is not None:
        others, how = share.other_cores, f"other processes took on average over {RUN_SHARE_WINDOW}"
    elif load is not None:
        others, how = load, "the 1-minute load average before the ranks started"
    demand = ranks * threads + (others or 0.0)
    over = demand > cores + OVERSUBSCRIBED_SLACK_CORES
    line = None
    if over:
        line = (f"cores oversubscribed: {ranks} rank{'s' if ranks > 1 else ''} x {threads} torch thread{'s' if threads > 1 else ''}"
                + (f" + {others:.2f} cores ({how})" if others is not None else "")
                + f" = {demand:.1f} on {cores} cores: the ranks waited for cores, so their step times and the errors "
                  f"against the prediction mean little; run fewer ranks or on an idle machine")
    return {"ranks": ranks, "threads": threads, "other_cores": None if others is None else round(others, 3),
            "other_cores_from": how, "cores": cores, "demand_cores": round(demand, 2), "oversubscribed": over,
            "line": line}


def slowest_probe(probes: list[dict | None]) -> dict | None:
    """The machine-speed probe (`memo_exec.speed_probe.SpeedProbe.summary`) of the rank whose reference GEMM ran
    slowest (the lowest median), with ``rank`` and every rank's median (``ranks_median_gflops``); None where no rank
    probed (a GPU run)."""
    have = [(r, p) for r, p in enumerate(probes) if p and p.get("median_gflops") is not None]
    if not have:
        return None
    rank, probe = min(have, key=lambda rp: rp[1]["median_gflops"])
    return {**probe, "rank": rank, "ranks_median_gflops": {str(r): p["median_gflops"] for r, p in have}}


def stdout_gone() -> None:
    """The reader of stdout went away (``| head -1``): point stdout at /dev/null, so that nothing written later, nor
    the interpreter's flush at exit, raises again; the run's outputs are complete by then."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout: nothing to redirect
        pass


def say_memory_plan_not_followed(plan, opts, echo) -> None:
    """At the start of a multi-device run, once (by the --nproc launcher, or by rank 0 where torchrun started the
    ranks itself), after the refusals that need no communication: the one line saying that the plan's static memory
    plan is not followed (`memo_exec.distributed.runner.memory_plan_not_followed`), on stderr."""
    from memo_exec.distributed.runner import memory_plan_not_followed  # noqa: PLC0415

    line = memory_plan_not_followed(plan, opts.use_memory_plan, opts.layers, opts.attention_backend, opts.device)
    if line:
        echo(line, err=True)


def quiet_echo(echo):
    """``echo`` that stops writing to stdout, quietly, once its reader has gone (`stdout_gone`)."""
    gone = [False]

    def out(message=None, err: bool = False, **kw):
        if gone[0] and not err:
            return
        try:
            echo(message, err=err, **kw)
        except BrokenPipeError:
            if err:
                raise
            gone[0] = True
            stdout_gone()

    return out


def shown_path(p, final: str | None = None, stage: str | None = None) -> Path:
    """Where a file the ranks wrote will be once the launcher moves the staged outputs into
    ``final`` (default: the folder `OUT_ENV` names): its path under ``stage`` (the folder they were written to) kept,
    so that a schedule's figures in subfolders keep theirs."""
    final = final or os.environ.get(OUT_ENV)
    if not final:
        return Path(p)
    return Path(final) / (_under(p, stage) if stage is not None else Path(p).name)


def launch_nproc(nproc: int, argv: list[str], out_dir: str, progress: bool, shown_out: str | None = None
                 ) -> tuple[int, str]:
    """Run ``memo-exec run`` with ``argv`` (no --nproc) under torchrun with ``nproc`` processes;
    ``shown_out``: the folder the outputs written to ``out_dir`` will be moved to (for messages). Returns the exit
    status and what the ranks wrote to stdout (rank 0's summary or --json document), which the caller prints once
    the outputs are in place: a reader that goes away early (``| head -1``) then loses nothing of the folder.
    The ranks' ``warning:`` lines pass through to stderr (each once), as their ``error:`` lines and progress do."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "memo_exec", "run", *argv] + (["--progress"] if progress else [])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(out_dir) / "launcher.log"
    env = dict(os.environ)
    from memo_exec.host_share import default_threads_env  # noqa: PLC0415

    default_threads_env(env)  # one thread a rank unless the plan's profile was calibrated with more: every path's rule
    # the ranks run this very package (also when it is not the installed copy)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if shown_out is not None:
        env[OUT_ENV] = str(shown_out)
    load = load_average()
    if load is not None:  # what else ran before the ranks started (`oversubscription`'s fallback)
        env[LOAD_ENV] = f"{load:.2f}"
    seen: set[str] = set()
    warned: set[str] = set()
    first_error = None
    import tempfile  # noqa: PLC0415

    with open(log_path, "w") as log, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            for line in proc.stderr:
                log.write(line)
                s = line.rstrip("\n")
                if s.startswith("error:"):
                    if s not in seen:
                        seen.add(s)
                        if first_error is None:
                            first_error = s
                elif s.startswith("[memo-exec]"):
                    print(s, file=sys.stderr, flush=True)
                elif s.startswith("warning:") and s not in warned:
                    warned.add(s)
                    print(s, file=sys.stderr, flush=True)
            rc = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP (`memo_sim.errors.Terminated`): stop the ranks too
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            print(f"memo-exec: the {nproc} ranks were stopped; the incomplete outputs and launcher.log stay in "
                  f"{out_dir}", file=sys.stderr, flush=True)
            raise
        out.seek(0)
        said = out.read()
    return _launch_status(rc, nproc, log_path, first_error, seen, run_began(out_dir)), said


def _launch_status(rc: int, nproc: int, log_path: Path, first_error: str | None, seen: set[str],
                   began: bool = False) -> int:
    """The launcher's exit status for torchrun's ``rc``, with the one error line of a failed run on stderr; ``began``:
    the ranks passed their checks and began the run (`run_began`), so an exit-2 line is a failure of the run (out
    of memory mid-run, a loss not finite), whose kept stage the line names, not a refusal."""
    if rc == 0:
        return 0
    died = killed_rank(log_path.read_text(errors="replace"))
    if died is not None:  # a rank killed by a signal: say so, whichever survivor's error won the race
        rank, code = died
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        print(f"error: rank {rank} died ({name}); torchrun stopped the other ranks; see {log_path}", file=sys.stderr)
        return 1
    if first_error is not None:
        # a refusal (exit 2): its line alone, the caller removes the stage; a collective failure (exit 1): the stage
        # is kept, and named, as every crash's line names it
        failed = any(COMM_FAILED in e or RUN_FAILED in e for e in seen)
        print(first_error if not (failed or began) else f"{first_error}; see {log_path}", file=sys.stderr)
        return 1 if failed else 2
    print(f"error: the {nproc} ranks exited with status {rc} without an error line; see {log_path}", file=sys.stderr)
    return 1


def schedule_outputs(schedule, out_dir: str, plan_file: str, report) -> dict:
    """Rank 0, after the merged outputs: the schedule's own files (its optional ``write_outputs``
    hook, `memo_exec.distributed.schedule`), every Markdown one appended to ``report.md``."""
    from pathlib import Path  # noqa: PLC0415

    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.fileio import atomic_write_text  # noqa: PLC0415

    hook = getattr(schedule, "write_outputs", None)
    if hook is None:
        return {}
    try:
        written = [Path(p) for p in hook(out_dir, plan_file)]
    except MemoError as e:
        raise ExecError(f"the {schedule.name} schedule's outputs: {str(e).splitlines()[0]}") from None
    extra = [p.read_text() for p in written if p.suffix == ".md"]
    if extra:
        report = Path(report)
        atomic_write_text(report, report.read_text().rstrip("\n") + "\n\n" + "\n".join(extra))
    # keyed by the path under the output folder: SPPO's measured and simulated Gantt charts share a file name (a
    # review: one key for both, the simulated one listed at the measured one's path, neither at its own)
    return {f"{schedule.name}:{_under(p, out_dir)}": p for p in written}


def _under(p: Path, folder: str) -> str:
    """``p``'s path under ``folder`` (its name where it is not under it)."""
    try:
        return Path(p).relative_to(folder).as_posix()
    except ValueError:
        return Path(p).name


def merge_rank_meta(res, payloads: list[dict], world: int, device) -> None:
    """Rank 0, before it writes the outputs: the ranks' machine-speed probes as the slowest rank's
    (`slowest_probe`: what `memo-exec validate`'s speed guard compares with the calibration's, and the report
    names), and on a CPU run of several ranks whether they and other processes oversubscribed the cores
    (`oversubscription`: ``meta["cores"]``, and its line as ``meta["oversubscribed"]``)."""
    probe = slowest_probe([p.get("speed_probe") for p in payloads])
    if probe is not None:
        res.meta["speed_probe"] = probe
    from memo_exec.report import slowest_rank  # noqa: PLC0415

    slow = slowest_rank(payloads)  # the headline is rank 0's: how far the slowest rank is, said beside it
    if slow is not None:
        res.meta["slowest_rank"] = slow
    if not device.is_cuda:  # one rank too (--nproc 1, a one-rank in-process run): the same words
        threads = int((res.meta.get("cpu_threads") or {}).get("threads") or 1)
        try:
            load = float(os.environ[LOAD_ENV])
        except (KeyError, ValueError):
            load = None
        cores = oversubscription(world, threads, [p.get("cpu") for p in payloads], load=load)
        res.meta["cores"] = cores
        if cores["line"]:
            res.meta["oversubscribed"] = cores["line"]


def run_rank(plan_file: str, opts, out_dir: str, as_json: bool, timeout_s: float, progress: bool,
             echo, in_process: bool = False, shown_out: str | None = None) -> None:
    """One torchrun rank: checks, process group, mesh, the run; rank 0 writes the outputs.

    ``in_process``: a one-process plan whose schedule lives in the distributed executor (SPPO
    with pp = 1, gradient accumulation) runs here as a group of one, no torchrun; ``shown_out``:
    the folder the outputs written to ``out_dir`` will be moved to (for messages). Rank 0 writes every output
    before it prints, and stops printing quietly if stdout's reader goes away (`quiet_echo`).

    Started by torchrun itself (not in process, not by ``--nproc``'s launcher, which hands the ranks its own
    staging folder and names --out in `OUT_ENV`), rank 0 stages the outputs as every other ``memo-exec run`` does
    (`staged_out`): an unwritable --out is refused before any work, on every rank alike."""
    import torch.distributed as dist  # noqa: PLC0415

    from memo_exec.distributed.context import build_context  # noqa: PLC0415
    from memo_exec.host_share import CpuShareMeter  # noqa: PLC0415
    from memo_exec.rank_payload import gather_payloads, rank_payload  # noqa: PLC0415
    from memo_exec.distributed.runner import DistExecutor, check_plan_for_world  # noqa: PLC0415
    from memo_exec.runner import use_profile  # noqa: PLC0415
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415

    rank, world, local_rank = (0, 1, 0) if in_process else env_rank()
    echo = quiet_echo(echo)
    plan = read_plan(plan_file)
    use_profile(plan, opts.profile)
    check_plan_for_world(plan, world, opts)  # before joining: every rank refuses alike
    if rank == 0 and not in_process and OUT_ENV not in os.environ:  # torchrun started the ranks, not --nproc's launcher
        say_memory_plan_not_followed(plan, opts, echo)
    device = rank_device(opts.device, local_rank)
    backend_for(device)
    if timeout_s <= 0:
        raise ExecError(f"--pg-timeout must be positive seconds, got {timeout_s}")
    kill = kill_point()
    by_torchrun = not in_process and OUT_ENV not in os.environ  # torchrun started this rank, not --nproc's launcher
    outf, refused = staged_out(out_dir) if by_torchrun and rank == 0 else (None, None)
    try:
        init_group(device, timeout_s, in_process)
    except BaseException:
        if outf is not None:
            outf.discard()
        raise
    try:
        if by_torchrun:
            refused = rank0_word(refused, world, rank, timeout_s)
        if refused:
            raise ExecError(refused)
        if outf is not None:  # rank 0 writes into the stage; the messages name --out
            out_dir, shown_out = str(outf.stage), out_dir
        try:
            ctx = build_context(plan.layout, device.torch_device, timeout_s)
            ex = DistExecutor(plan, opts, ctx, device)  # its checks (the memory fit among them) passed
            if rank == 0 and OUT_ENV in os.environ:  # --nproc's launcher keeps the stage of a run that began
                (Path(out_dir) / STARTED_MARK).touch()
            if kill is not None and kill[0] == rank:
                ex.kill_at_step = kill[1]

            def report(done, total, rec):
                if progress and rank == 0:
                    echo(f"[memo-exec] step {done}/{total}: {rec.iteration_s:.3f} s, loss {rec.loss:.4f}", err=True)

            try:
                with CpuShareMeter() as meter:  # the machine's busy time and this rank's own over its run
                    res = ex.run(progress=report)
            finally:
                ex.close()
            cpu = meter.result.to_dict() if meter.result is not None else None
            payloads = gather_payloads(rank_payload(ex, res, cpu))
        except ExecError:
            raise
        except (RuntimeError, dist.DistError) as e:  # a peer died or timed out, or the step itself failed
            if in_process or world == 1:  # no peer to blame: the error and its traceback as they are
                raise
            raise CommFailure(comm_failure_line(rank, e, timeout_s, collective=False)) from None
        if rank == 0:
            from memo_exec.report import write_outputs, write_rank_outputs  # noqa: PLC0415 (rank 0's alone)

            merge_rank_meta(res, payloads, world, device)
            # a run of several ranks draws its figures once, with every rank (`write_rank_outputs`)
            paths, comparison = write_outputs(res, out_dir, plan_file, figures=len(payloads) == 1)
            rows = write_rank_outputs(payloads, res, out_dir, plan_file, paths, comparison)
            paths.update(schedule_outputs(ex.schedule, out_dir, plan_file, paths["report"]))
            from memo_exec.host_share import append_run_share, ranks_share  # noqa: PLC0415

            # the cores others took, the figure the oversubscription line gives (`merge_rank_meta`): one measurement
            append_run_share(paths["report"], ranks_share([p.get("cpu") for p in payloads]), device.kind, world)
            if outf is not None:  # every output written: moved into --out, manifest.json last, before any line
                outf.commit()
                outf = None
            st = res.steady
            if comparison.stale:
                from memo_exec.report import stale_line  # noqa: PLC0415

                echo(stale_line(comparison.stale), err=True)
            if res.meta.get("oversubscribed"):
                echo(f"warning: {res.meta['oversubscribed']}", err=True)
            if as_json:
                import json  # noqa: PLC0415

                doc = {"model": res.meta["model"], "policy": res.meta["policy"], "layout": res.meta["layout"],
                       "device": res.meta["device"], "world": world, "layers": res.meta["layers"],
                       "tokens": res.meta["tokens"], "steady_state": st,
                       "losses": [s["loss"] for s in res.summaries], "per_rank": rows,
                       "speed_probe": res.meta.get("speed_probe"), "cores": res.meta.get("cores"),
                       "oversubscribed": res.meta.get("oversubscribed"), "slowest_rank": res.meta.get("slowest_rank"),
                       **comparison.to_dict(),
                       "notes": [n for n in (res.meta.get("allocator_settings_note"),) if n],
                       "files": {k: str(shown_path(v, shown_out, out_dir)) for k, v in paths.items()}}
                echo(json.dumps(doc, indent=1, default=float))
            else:
                where = f"in this process ({ex.schedule.name} schedule)" if in_process else f"on {world} ranks"
                slow = res.meta.get("slowest_rank") or {}
                slowest = (f"; slowest rank {slow['rank']}: {slow['iteration_s']:.4f} s" if slow.get("rank")
                           else "; the slowest" if slow else "")
                echo(f"{res.meta['model']} {res.meta['policy']} {res.meta['layout']} {where} "
                     f"({res.meta['device']}): {st['iteration_s']:.4f} s/iteration (rank 0{slowest}), "
                     f"{res.meta['tokens'] / st['iteration_s']:,.0f} tokens/s, loss {res.summaries[-1]['loss']:.4f}")
                shown = {k: shown_path(v, shown_out, out_dir) for k, v in paths.items()}
                merged = "" if in_process else f" (merged over {world} ranks)"
                echo(f"wrote {shown['report']}, {shown['measured']}, {shown['trace']}{merged}")
                extra = [str(v) for k, v in shown.items() if ":" in k]
                if extra:
                    echo(f"wrote {', '.join(extra)} ({ex.schedule.name} schedule)")
                if res.meta.get("allocator_settings_note"):  # the plan's allocator settings on a CPU
                    echo(res.meta["allocator_settings_note"])
        try:  # no rank tears its group down while rank 0 still writes the outputs
            dist.barrier()
        except (RuntimeError, dist.DistError) as e:
            raise CommFailure(comm_failure_line(rank, e, timeout_s)) from None
    finally:
        if outf is not None:  # a failed or interrupted run: --out as it was, the stage gone
            outf.discard()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a failed group may not tear down cleanly
            pass


def staged_out(out_dir: str):
    """(`memo_sim.fileio.OutputFolder`, None) for rank 0 of a run torchrun started: the outputs staged in --out as
    `memo-exec run`'s other paths stage them (`memo_exec.cli._run_single`, the ``--nproc`` launcher), or (None, the
    refusal's line) where --out cannot be written or lacks the room, for `rank0_word` to tell every rank."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.fileio import OutputFolder  # noqa: PLC0415

    try:
        return OutputFolder(out_dir, "memo-exec run", RUN_OUTPUT_FLOOR_BYTES), None
    except MemoError as e:
        return None, str(e).splitlines()[0]


def rank0_word(line: str | None, world: int, rank: int, timeout_s: float) -> str | None:
    """Rank 0's ``line`` (a refusal, or None) on every rank, broadcast once the group is joined, so that every rank
    refuses alike (one line, exit 2) and none waits on a rank that left; a failed broadcast is a `CommFailure`."""
    if world == 1:
        return line
    import torch.distributed as dist  # noqa: PLC0415

    box = [line]
    try:
        dist.broadcast_object_list(box, src=0)
    except (RuntimeError, dist.DistError) as e:
        raise CommFailure(comm_failure_line(rank, e, timeout_s)) from None
    return box[0]
