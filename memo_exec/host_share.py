"""How much of the host's CPU other processes took while this process and its children measured.

A CPU timing (a calibration, a validation's runs) is only as good as the cores it had. The
1-minute load average lags by a minute and counts this process's own threads, so it cannot say
whether a measurement shared its cores. This meter can: over the measured interval it reads the
cores' busy time from ``/proc/stat`` and this process tree's own CPU time from ``getrusage``
(``RUSAGE_SELF`` for its threads, ``RUSAGE_CHILDREN`` for the child processes it waited for: the
validation's runs, the calibration's gloo peers); what is left is what other processes used.
``steal`` is the time the hypervisor gave this machine's virtual cores to other machines.

On a host without ``/proc/stat`` (not Linux) the meter reports ``None`` for everything.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import asdict, dataclass

PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class CpuShare:
    wall_s: float
    cores: int
    busy_core_s: float  # every process, this tree included (user, nice, system, irq, softirq)
    own_core_s: float  # this process's threads and its waited-for children
    steal_core_s: float

    @property
    def other_cores(self) -> float:
        """Cores other processes kept busy on average over the interval."""
        return max(0.0, self.busy_core_s - self.own_core_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steal_cores(self) -> float:
        return self.steal_core_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {**{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()},
                "other_cores": round(self.other_cores, 3), "steal_cores": round(self.steal_cores, 3)}

    def line(self, window: str = "") -> str:
        """The share in words; ``window``: what the meter covered, named before its seconds."""
        span = (f"{window} ({self.wall_s:.0f} s; steal {self.steal_cores:.2f})" if window
                else f"{self.wall_s:.0f} s (steal {self.steal_cores:.2f})")
        return f"other processes used {self.other_cores:.2f} of {self.cores} cores on average over {span}"


def _stat() -> tuple[float, float] | None:
    """(busy, steal) seconds of all cores since boot, or None where /proc/stat is not readable."""
    try:
        with open(PROC_STAT) as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    v = [int(x) for x in fields[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _own() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class CpuShareMeter:
    """``with CpuShareMeter() as m: ...`` then ``m.result`` (a `CpuShare`, or None off Linux)."""

    def __enter__(self) -> CpuShareMeter:
        self.result: CpuShare | None = None
        self._t0, self._stat0, self._own0 = time.monotonic(), _stat(), _own()
        return self

    def __exit__(self, *exc) -> None:
        stat1, own1, t1 = _stat(), _own(), time.monotonic()
        if self._stat0 is None or stat1 is None:
            return
        self.result = CpuShare(wall_s=t1 - self._t0, cores=os.cpu_count() or 1,
                               busy_core_s=stat1[0] - self._stat0[0], own_core_s=own1 - self._own0,
                               steal_core_s=stat1[1] - self._stat0[1])


def ranks_share(cpu: list[dict | None]) -> CpuShare | None:
    """What other processes took while the ranks of one run stepped, from each rank's `CpuShareMeter` around its run
    (``cpu``: `CpuShare.to_dict` by rank, rank 0 first): rank 0's whole-machine busy and steal time over its window,
    less every rank's own CPU time; None where a rank measured nothing (off Linux). The one figure a run's report
    gives for the cores others took (the oversubscription line, `memo_exec.distributed.launch.oversubscription`, and
    "The machine during the run", `run_share_section`): a review read 0.94 cores in one and 0.86 in the other, the
    latter the --nproc launcher's own meter over the whole launch (start-up and output writing included)."""
    if not cpu or not all(c and c.get("wall_s") for c in cpu):
        return None
    c0 = cpu[0]
    return CpuShare(wall_s=c0["wall_s"], cores=int(c0.get("cores") or os.cpu_count() or 1),
                    busy_core_s=c0["busy_core_s"], own_core_s=sum(c["own_core_s"] for c in cpu),
                    steal_core_s=c0.get("steal_core_s", 0.0))


RUN_SHARE_WINDOW = "the run's allocation and steps"  # what a run's meters cover: each rank's `Executor.run`


# ------------------------------------------------------------------------------------ threads
def default_threads_env(env) -> bool:
    """The CPU thread rule of every `memo-exec run` path where the user's ``OMP_NUM_THREADS`` chooses none: one torch
    thread a process, marked as that default (``OMP_NUM_THREADS=1`` and `memo_exec.device.LAUNCHER_THREADS_ENV` set in
    ``env``), so that `memo_exec.device.use_calibrated_threads` replaces it with the plan's profile's calibration
    count where there is one. One thread a process, not torch's default of every core: a run's OpenMP threads that
    lose a core to another process wait for each other (a review: a store_all plan took 2.88 s an iteration at
    torch's 2 threads on a loaded 2-core machine, 0.038 s under ``--nproc 1``, which already set one). True where it
    set them."""
    from memo_exec.device import LAUNCHER_THREADS_ENV  # noqa: PLC0415 - imports torch

    if env.get("OMP_NUM_THREADS"):
        return False
    env["OMP_NUM_THREADS"] = "1"
    env[LAUNCHER_THREADS_ENV] = "1"
    return True


@contextlib.contextmanager
def default_threads(cpu: bool):
    """`default_threads_env` in this process, for a run in it (`memo-exec run` without ``--nproc``): the environment
    and torch's thread count (read from ``OMP_NUM_THREADS`` only at torch's start, so set here too) as
    ``--nproc``'s launcher gives its ranks, both restored after. Nothing on a GPU run."""
    if not cpu or os.environ.get("OMP_NUM_THREADS"):
        yield
        return
    import torch  # noqa: PLC0415

    from memo_exec.device import LAUNCHER_THREADS_ENV  # noqa: PLC0415

    before = torch.get_num_threads()
    default_threads_env(os.environ)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        for k in ("OMP_NUM_THREADS", LAUNCHER_THREADS_ENV):
            os.environ.pop(k, None)
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------ idle or not
IDLE_OTHER_CORES = 0.25  # cores other processes may take on average while a CPU loop measures


def run_share_section(share: CpuShare | None, device_kind: str | None, ranks: int = 1) -> str:
    """report.md's section on the machine during a run (`memo-exec run`): what other processes took of its cores
    over `RUN_SHARE_WINDOW` (``ranks`` > 1: `ranks_share` of the run's ranks), and, on a CPU run where they took more
    than `IDLE_OTHER_CORES`, that the measured times are the shared machine's (slower than the prediction for
    reasons no part of the plan explains); '' off Linux."""
    if share is None:
        return ""
    how = f"; {ranks} ranks: rank 0's machine time less every rank's own" if ranks > 1 else ""
    text = f"\n## The machine during the run\n\n- {share.line(RUN_SHARE_WINDOW)} (`memo_exec.host_share`{how})"
    if device_kind == "cpu" and share.other_cores > IDLE_OTHER_CORES:
        text += (f"\n- **the measured times are the shared machine's**: other processes took "
                 f"{share.other_cores:.2f} cores on average (more than {IDLE_OTHER_CORES}), so a CPU run's steps "
                 f"are slower than its prediction by more than the plan explains; run it on an idle machine to "
                 f"compare")
    return text + "\n"


def append_run_share(report: str, share: CpuShare | None, device_kind: str | None, ranks: int = 1) -> None:
    """Append `run_share_section` to a run's report.md (written atomically)."""
    from pathlib import Path  # noqa: PLC0415

    from memo_sim.fileio import atomic_write_text  # noqa: PLC0415

    section = run_share_section(share, device_kind, ranks)
    if section and Path(report).exists():
        atomic_write_text(Path(report), Path(report).read_text() + section)
IDLE_LOAD_PER_CORE = 0.5  # the fallback where the share is not measured: 1-minute load per core


def busy_reason(provenance: dict, summary: dict) -> str | None:
    """Why the machine was not idle while a CPU calibration (its profile's ``provenance``) and a
    validation (its ``summary``) measured, or None when it was: other processes took at most
    `IDLE_OTHER_CORES` cores on average during each (where that was not measured, the 1-minute
    load per core at calibration and around the runs was at most `IDLE_LOAD_PER_CORE`), and the
    machine ran at one speed throughout (`memo_exec.speed_probe.speed_reason`: the load other
    virtual machines put on shared physical cores is seen only there)."""
    from memo_exec.speed_probe import speed_reason  # noqa: PLC0415

    return _share_reason(provenance, summary) or speed_reason(provenance, summary)


def _share_reason(provenance: dict, summary: dict) -> str | None:
    shares = [provenance.get("cpu_share"), summary.get("cpu_share")]
    if all(shares):
        other = [round(x["other_cores"], 2) for x in shares]
        if max(other) > IDLE_OTHER_CORES:
            return f"other processes took {other} cores (calibration, runs), above {IDLE_OTHER_CORES}"
        return None
    cores = os.cpu_count() or 1
    per_core = [None if x is None else round(x / cores, 3) for x in
                list(provenance.get("load_average_1min") or [None]) + list(summary.get("load_average_1min") or [None])]
    if any(x is None or x > IDLE_LOAD_PER_CORE for x in per_core):
        return (f"1-minute load per core {per_core} (calibration start/end, runs before/after) above "
                f"{IDLE_LOAD_PER_CORE}")
    return None
