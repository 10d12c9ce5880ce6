"""Validate the simulator against measured runs: many plans, predicted vs measured, one table.

For each plan (sequence lengths x policies x alphas of one model on one device) the simulator
predicts with the given (calibrated) profile and writes ``plans/plan-NN.json``: a MEMO plan
carries its bi-level memory plan, attached by the same code as ``memo-sim whatif``
(`memo_sim.api.attach_memory_plan`), and every plan names the profile by its file
path, so the run re-predicts with that profile and never with a built-in one of the same name.

Each plan runs in its own process (``python -m memo_exec run PLAN --json``, output under
``runs/plan-NN/``): whatever one run leaves reserved on the device is gone before the next
starts, and a run that fails -- an out-of-memory error, a plan the executor refuses, a crash,
a time-out -- becomes that plan's row while the others go on. A run past its time-out, or running when validate is
interrupted, is stopped with SIGTERM (then SIGKILL after `STOP_GRACE_S`) and its staging folder removed (`run_plan`);
everything validate writes into ``--out`` is staged and moved in as one set at the end (`memo_sim.fileio.OutputFolder`,
as ``memo-exec run`` writes its --out), so a failure or an interrupt leaves ``--out`` as it was.

Per plan the rows hold step time, per-stream busy and exposed time (compute, d2h, h2d) and peak
memory, each predicted, measured and its error in percent; a mixture-of-experts plan with expert
parallelism (``layout``: e.g. dp 2 x ep 2, run on that many processes with ``--nproc``) also the
dispatcher's all-to-all time per MoE layer (``alltoall_layer_s``: the mean over the layers both
sides time of the dispatch + combine all-to-alls, forward, recompute and backward; measured on rank
0, `memo_exec.compare.alltoall_rows`), and its per-layer rows (predicted, measured, measured /
predicted) in a table of their own; the summary holds the mean and max
|error| of each quantity over the plans that ran and the Kendall tau between the predicted and the
measured ordering of the step times. Both go to ``validation.md`` and ``validation.json``. An
expert-parallel validation whose runs give no all-to-all to compare says why in one line of the
summary (``alltoall_not_compared``). The report also names, per policy, where the executor runs
the MoE block (`moe_block_notes`) otherwise than the simulator prices it, and the multi-rank runs
whose ranks and other processes oversubscribed the machine's cores (each run's ``oversubscribed``
line).

On a CPU, peak memory is the process RSS, which the simulator's GPU memory model does not
predict; the memory columns then read "—" and the report says so.

Caching allocator: for a plan whose policy runs on PyTorch's caching allocator, the simulator's
replay of the iteration (`memo_sim.api.engine_replay`, as the engine charges it; the result's
``allocator.memory_stats`` where it carries them) beside what the run measured with
``torch.cuda.memory_stats()`` over its last step (`memo_exec.allocator_counters`, the
``allocator`` block of its measured.json): reserved and allocated peaks, cudaMalloc retries,
device allocations and frees per iteration, segments at the iteration's end (`ALLOCATOR_QUANTITIES`).
A plan with a static memory plan (MEMO) has no replay; a CPU run measures none of it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from memo_exec.allocator_counters import not_measured
from memo_exec.errors import ExecError
from memo_exec.host_share import CpuShareMeter
from memo_exec.speed_probe import SPEED_DRIFT_LIMIT, drift, persistent_drift, run_speeds
from memo_sim.fileio import atomic_write_json, atomic_write_text
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan, write_plan
from memo_sim.policy import Policy, get_policy, policy_class
from memo_sim.profile.schema import HardwareProfile
from memo_sim.units import fmt_bytes, fmt_count, fmt_time

REPO = Path(__file__).resolve().parents[1]
# (key, unit, what) of each per-plan quantity, in table order
QUANTITIES = (
    ("step_s", "s", "step time"),
    ("compute_busy_s", "s", "compute busy"),
    ("compute_exposed_s", "s", "compute exposed"),
    ("d2h_busy_s", "s", "d2h busy"),
    ("d2h_exposed_s", "s", "d2h exposed"),
    ("h2d_busy_s", "s", "h2d busy"),
    ("h2d_exposed_s", "s", "h2d exposed"),
    ("peak_memory_bytes", "bytes", "peak memory"),
    ("alltoall_layer_s", "s", "MoE all-to-all per layer"),
)
OPTIONAL = ("alltoall_layer_s",)  # shown only where some plan has it (MoE plans with ep > 1)
LOOP_TARGET_MEDIAN_PCT = 30.0  # issue #30: the CPU loop's median |step-time error| on an idle machine
RUN_STARTUP_S = 20.0  # a run's process start, allocation and warm-up step, before its steps
# (torch.cuda.memory_stats() key, unit, what) of each caching-allocator row, in table order
ALLOCATOR_QUANTITIES = (
    ("reserved_bytes.all.peak", "bytes", "reserved peak"),
    ("allocated_bytes.all.peak", "bytes", "allocated peak"),
    ("num_alloc_retries", "count", "cudaMalloc retries per iteration"),
    ("num_device_alloc", "count", "device allocations per iteration"),
    ("num_device_free", "count", "device frees per iteration"),
    ("segment.all.current", "count", "segments at the iteration's end"),
)
STATIC_PLAN = "static memory plan (no caching-allocator replay)"
ALLOCATOR_SECTION = "## Caching allocator: predicted replay vs measured (torch.cuda.memory_stats)"


@dataclass
class PlanSpec:
    seq: int
    policy: Policy | None  # None: skipped before any plan was written
    skipped: str | None = None

    @property
    def label(self) -> str:
        return f"{fmt_count(self.seq)} {self.policy.label() if self.policy else 'memo(a=sim)'}"


@dataclass
class ValidationRow:
    label: str
    status: str  # ran | predicted OOM | OOM: ... | failed: ... | timed out ... | skipped: ...
    quantities: dict[str, dict]  # QUANTITIES key -> {"predicted", "measured", "error_pct"}
    plan_file: str | None = None
    run_dir: str | None = None
    predicted_timeline: object | None = field(default=None, repr=False)
    speed_probe: dict | None = None  # the machine's speed after each of the run's steps (CPU runs)
    discarded_drifts_pct: list[float] = field(default_factory=list)  # runs done again: the machine's speed moved
    alltoall: list[dict] = field(default_factory=list)  # MoE: per layer, `memo_exec.compare.alltoall_rows`
    allocator: dict | None = None  # `allocator_comparison`: the replay beside torch.cuda.memory_stats()
    # a multi-rank CPU run whose ranks and other processes wanted more cores than the machine has (the run's line,
    # `memo_exec.distributed.launch.oversubscription`)
    oversubscribed: str | None = None
    ran_dtype: str | None = None  # the dtype the run trained in, memo's name (its measured.json), e.g. fp32 on a CPU
    # a multi-device plan whose static memory plan the ranks do not follow: the console's line, beside the memory row
    # (`memo_exec.distributed.runner.memory_plan_not_followed`)
    memory_plan_note: str | None = None

    def to_dict(self) -> dict:
        return {"plan": self.label, "status": self.status, "plan_file": self.plan_file, "run_dir": self.run_dir,
                "quantities": self.quantities, "speed_probe": self.speed_probe,
                "discarded_drifts_pct": self.discarded_drifts_pct, "moe_alltoall": self.alltoall,
                "allocator": self.allocator, "oversubscribed": self.oversubscribed, "ran_dtype": self.ran_dtype,
                "memory_plan_note": self.memory_plan_note}


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a between two rankings (ties count as neither concordant nor discordant)."""
    n = len(xs)
    if n < 2:
        return None
    c = d = 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (xs[i] - xs[j]) * (ys[i] - ys[j])
            c += s > 0
            d += s < 0
    return (c - d) / (n * (n - 1) / 2)


def error_pct(predicted, measured) -> float | None:
    """(measured - predicted) / predicted in percent; None where either is missing or predicted is 0."""
    if predicted is None or measured is None or not predicted:
        return None
    return 100.0 * (measured - predicted) / predicted


def plan_set(seqs: list[int], policies: list[str], alphas: list, alpha_for=None) -> list[PlanSpec]:
    """Every (sequence length, policy) to validate; a policy that takes alpha once per alpha. An
    alpha of ``"sim"`` is the simulator's alpha at that length, ``alpha_for(seq) -> (alpha | None,
    why)``; where it finds none the plan is skipped with the reason."""
    out = []
    for s in seqs:
        for p in policies:
            if not policy_class(p).takes_alpha:
                out.append(PlanSpec(s, get_policy(p)))
                continue
            for a in alphas:
                if a == "sim":
                    alpha, why = alpha_for(s)
                    out.append(PlanSpec(s, get_policy(p, alpha)) if alpha is not None else
                               PlanSpec(s, None, f"skipped: the simulator finds no feasible alpha ({why})"))
                else:
                    out.append(PlanSpec(s, get_policy(p, a)))
    return out


def comma_items(text: str, flag: str, what: str, example: str) -> list[str]:
    """The stripped items of a comma-separated option; an empty item (``1K,,2K``, a trailing comma, nothing at all)
    is refused in one line naming ``flag``, as memo-sim refuses it (`memo_sim.cli.simulate.sweep_seq_cmd`'s
    "an empty length between commas"), instead of being dropped silently."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ExecError(f"{flag} {text!r}: an empty {what} between commas; give a list like {example}")
    return items


REPORT_NAME, JSON_NAME, FIGURE_NAME = "validation.md", "validation.json", "worst-gantt.png"  # written into --out


def check_outputs(out_dir: str | Path, report_path: str | Path | None, profile: HardwareProfile, device: str,
                  record: bool) -> None:
    """Refuse, before any plan is predicted or run, an output that could not be written (a review: ``--report`` in
    a folder that could not be written failed after every run, leaving plans/, runs/ and a figure behind; ``--out
    afile/sub`` was exit status 1 naming no option): ``--report``, the profile's file where the validation is
    recorded in it, each file `validate` writes into ``--out``, its plans/ and runs/ folders, and ``--out`` itself
    (`memo_sim.fileio.OutputFolder`'s check, the one ``memo-exec run --out`` makes: a folder created and written,
    nothing else left). One line naming the option, exit status 2."""
    from memo_sim.fileio import OutputFolder, check_output_file, check_output_folder  # noqa: PLC0415

    out = Path(out_dir)
    check_output_folder(out, "--out")
    if report_path:
        check_output_file(report_path, "--report")
    if record and not_recorded_why(profile, str(device)) is None:  # the file its validation block goes into
        check_output_file(profile.path, "--profile", "; or pass --no-record")
    for name in (JSON_NAME, FIGURE_NAME) + (() if report_path else (REPORT_NAME,)):
        check_output_file(out / name, "--out")
    for sub in ("plans", "runs"):
        if (out / sub).exists() and not (out / sub).is_dir():
            raise ExecError(f"--out {out}: {out / sub} is a file where validate writes a folder; move it away or "
                            f"choose another --out")
    OutputFolder(out, "memo-exec validate").discard()


def batch_split(layout: Layout | None, micro_batches: int = 1) -> tuple[int, int, str]:
    """(sequences per replica, per micro-batch, schedule) of a validation plan: one sequence, or under a
    pipeline ``micro_batches`` micro-batches of one sequence through 1F1B (interleaved with vpp > 1)."""
    lay = layout or Layout()
    if lay.pp == 1:
        return micro_batches, 1, "single_stage"
    return micro_batches, 1, "interleaved_1f1b" if lay.vpp > 1 else "1f1b"


def predict(model: ModelConfig, seq: int, policy: Policy, profile: HardwareProfile, layout: Layout | None = None,
            micro_batches: int = 1):
    from memo_sim.api import simulate

    batch, micro, schedule = batch_split(layout, micro_batches)
    return simulate(model, layout or Layout(), batch, seq, policy, profile, schedule=schedule, micro_batch=micro)


def plan_for(model, seq, policy, profile: HardwareProfile, sim, layout: Layout | None = None,
             micro_batches: int = 1) -> Plan:
    """The plan of one validation point: the simulator's predictions, the profile by its path, and
    (MEMO) the bi-level memory plan; ``layout`` (default one device) gives its GPUs, ``micro_batches``
    the iteration's micro-batches of one sequence (`batch_split`)."""
    layout = layout or Layout()
    batch, micro, schedule = batch_split(layout, micro_batches)
    from memo_sim.api import attach_memory_plan

    d = sim.to_dict()
    predicted = {"source": "simulated", "status": d["status"], "iteration_s": d["iteration_s"], "mfu": d["mfu"],
                 "tgs_tokens_per_gpu_s": d["tgs_tokens_per_gpu_s"], "peak_gpu_bytes": d["peak_gpu_bytes"],
                 "peak_host_bytes_per_node": d["peak_host_bytes_per_node"], "exposed_copy_s": d["exposed_copy_s"]}
    lt = {k: v for k, v in d["layer_timings_s"].items() if k in ("forward", "backward", "recompute", "offload",
                                                                 "prefetch")}
    prof = str(Path(profile.path).resolve()) if profile.path else profile.name
    plan = Plan(model=model, batch=batch, seq_tokens=seq, gpus=layout.gpus, layout=layout, policy=policy, profile=prof,
                predicted=predicted, layer_timings_s=lt, attention_backend="auto", schedule=schedule,
                micro_batch=micro)
    if sim.status == "OK":
        attach_memory_plan(plan)
    return plan


def predicted_quantities(sim) -> dict[str, float | None]:
    """The simulator's side of every quantity, from its own result (used when a run gives none)."""
    from memo_exec.compare import stream_stats

    q: dict[str, float | None] = {k: None for k, _, _ in QUANTITIES}
    if sim.status != "OK":
        return q
    q["step_s"], q["peak_memory_bytes"] = sim.iteration_s, sim.peak_gpu_bytes
    if sim.timeline is not None:
        from memo_exec.compare import alltoall_times

        tl = sim.timeline.of_device(0)  # rank 0's side (a pipeline: stage 0, not the union of the stages)
        for s, st in stream_stats(tl).items():
            if f"{s}_busy_s" in q:
                q[f"{s}_busy_s"], q[f"{s}_exposed_s"] = st["busy_s"], st["exposed_s"]
        per = [t for t, _ in alltoall_times(tl).values()]
        q["alltoall_layer_s"] = sum(per) / len(per) if per else None
    return q


def alltoall_layer_means(rows: list[dict]) -> tuple[float | None, float | None]:
    """(predicted, measured) mean all-to-all seconds per MoE layer over the layers both sides time
    (`memo_exec.compare.alltoall_rows`; a layer only one side has is in the per-layer rows, not here)."""
    both = [r for r in rows if r.get("predicted_count") and r.get("measured_count")
            and r.get("predicted_s") is not None and r.get("measured_s") is not None]
    if not both:
        return None, None
    return (sum(r["predicted_s"] for r in both) / len(both), sum(r["measured_s"] for r in both) / len(both))


def times_apart(doc: dict) -> bool:
    """Whether the run said its predicted times are not predictions of its device (``times_comparable`` false in
    its --json: `memo_exec.report.times_comparable`, a GPU profile's plan run on a CPU), so that its time errors are
    "not comparable" here as in its report.md (one rule: the run's)."""
    return doc.get("times_comparable") is False


def quantities_from_run(doc: dict, fallback: dict[str, float | None]) -> dict[str, dict]:
    """Per-plan rows from ``memo-exec run --json`` output: its totals (iteration time, peak device
    memory) and stream rows (busy, exposed), predicted beside measured; ``fallback`` (the
    simulator's numbers) fills a predicted value the run's comparison lacks. Where the run's times are not
    comparable with the prediction (`times_apart`), each time's error is None and ``not_comparable`` true (a
    review: a GPU profile validated on a CPU read "step-time |error| median 587004.7%")."""
    meas: dict[str, float | None] = {k: None for k, _, _ in QUANTITIES}
    pred = dict(fallback)
    tot = {r["quantity"]: r for r in doc.get("totals") or []}
    for key, name in (("step_s", "iteration time"), ("peak_memory_bytes", "peak device memory (allocated)")):
        r = tot.get(name) or {}
        meas[key] = r.get("measured")
        if r.get("predicted") is not None:
            pred[key] = r["predicted"]
    for r in doc.get("streams") or []:
        key = f"{r['stream']}_{r['quantity']}_s"
        if key in meas:
            meas[key] = r.get("measured_s")
            if r.get("predicted_s") is not None:
                pred[key] = r["predicted_s"]
    p, m = alltoall_layer_means(doc.get("moe_alltoall") or [])
    if m is not None:
        pred["alltoall_layer_s"], meas["alltoall_layer_s"] = p, m
    apart = times_apart(doc)
    out = {}
    for k, unit, _ in QUANTITIES:
        err = error_pct(pred[k], meas[k])
        # as report.md's cells (`memo_exec.report._not_comparable`): "not comparable" where there is an error to hide,
        # a miss's too (`miss_seconds`: another device's prediction of no exposure)
        out[k] = ({"predicted": pred[k], "measured": meas[k], "error_pct": None, "not_comparable": True}
                  if apart and unit == "s" and (err is not None or is_miss(k, pred[k], meas[k])) else
                  {"predicted": pred[k], "measured": meas[k], "error_pct": err})
    return out


MISS_QUANTITIES = ("compute_exposed_s", "d2h_exposed_s", "h2d_exposed_s")  # exposed time: 0 predicted is a claim


def is_miss(key: str, predicted, measured) -> bool:
    """Whether a row is a miss: an exposed time (`MISS_QUANTITIES`) the simulator predicted none of (0) and the run
    measured some of. Its relative error x / 0 is undefined (``error_pct`` None), so the row is counted by its
    absolute difference (`miss_seconds`) where it was left out of every count."""
    return key in MISS_QUANTITIES and predicted is not None and measured is not None and predicted == 0 \
        and measured > 0


def miss_seconds(key: str, q: dict) -> float | None:
    """A row's miss (`is_miss`), its measured exposure (the absolute difference from the prediction's none), or None:
    not a miss, or a run whose times are not comparable with the prediction (``not_comparable``)."""
    if q.get("not_comparable") or not is_miss(key, q.get("predicted"), q.get("measured")):
        return None
    return q["measured"] - q["predicted"]


def predicted_allocator(sim, model: ModelConfig, seq: int, policy: Policy, profile: HardwareProfile,
                        layout: Layout | None = None) -> dict:
    """The simulator's caching-allocator replay of the plan: ``{"static_memory_plan": True}``, or
    ``{"static_memory_plan": False, "memory_stats": ...}`` (`IterationReplay.memory_stats`'s keys):
    the result's own where it carries them, else the replay the engine would charge (`engine_replay`)."""
    a = getattr(sim, "allocator", None) or {}
    if a.get("static_memory_plan"):
        return {"static_memory_plan": True}
    if a.get("memory_stats") is not None:
        return {"static_memory_plan": False, "memory_stats": dict(a["memory_stats"])}
    from memo_sim.api import engine_replay  # noqa: PLC0415

    r = engine_replay(model, layout or Layout(), getattr(sim, "micro_batch", None) or 1, seq, policy, profile)
    return {"static_memory_plan": True} if r is None else {"static_memory_plan": False,
                                                           "memory_stats": r.memory_stats()}


def measured_allocator(run_dir: Path | None) -> dict:
    """The ``allocator`` block of a run's measured.json (`memo_exec.allocator_counters.run_block`),
    or why there is none."""
    path = Path(run_dir or "") / "measured.json"
    try:
        meta = json.loads(path.read_text()).get("meta") or {}
    except (OSError, json.JSONDecodeError) as e:
        return not_measured(f"no readable measured.json ({type(e).__name__})")
    return meta.get("allocator") or not_measured("the run's measured.json has no allocator block")


def measured_dtype(run_dir: Path | None) -> str | None:
    """The dtype a run trained in, memo's name (its measured.json's ``meta.dtype``, torch's name: "float32" -> "fp32"),
    or None where it cannot be read."""
    try:
        name = (json.loads((Path(run_dir or "") / "measured.json").read_text()).get("meta") or {}).get("dtype")
    except (OSError, json.JSONDecodeError):
        return None
    from memo_exec.device import memo_dtype_name  # noqa: PLC0415 - imports torch

    return memo_dtype_name(name) if name else None


def dtype_words(model: ModelConfig, rows: list[ValidationRow]) -> str:
    """The model line's dtype: the plans', and the one the runs trained in where it differs (a CPU run trains fp32
    unless told otherwise, `memo_exec.device.compute_dtype`; a review: the report read "dtype fp16" of fp32 runs)."""
    ran = sorted({r.ran_dtype for r in rows if r.ran_dtype and r.ran_dtype != model.dtype})
    return f"dtype {model.dtype}" + (f" (the plans'; the runs trained in {', '.join(ran)})" if ran else "")


def allocator_comparison(predicted: dict, measured: dict) -> dict:
    """Per `ALLOCATOR_QUANTITIES` key: predicted (the replay), measured (torch.cuda.memory_stats()),
    their difference and error in percent; ``status`` says what was compared (`STATIC_PLAN`,
    ``not measured: <why>`` or ``compared``)."""
    if predicted.get("static_memory_plan"):
        return {"status": STATIC_PLAN, "measured": bool(measured.get("measured")), "quantities": {}}
    pm = predicted.get("memory_stats") or {}
    mm = measured.get("memory_stats") if measured.get("measured") else None
    rows = {}
    for key, _, _ in ALLOCATOR_QUANTITIES:
        p, m = pm.get(key), (mm or {}).get(key)
        rows[key] = {"predicted": p, "measured": m, "difference": m - p if p is not None and m is not None else None,
                     "error_pct": error_pct(p, m)}
    status = "compared" if mm is not None else f"not measured: {measured.get('reason', 'unknown')}"
    return {"status": status, "measured": mm is not None, "quantities": rows,
            "alloc_conf": measured.get("alloc_conf"), "snapshot_segments": measured.get("snapshot_segments")}


def failure_status(rc: int, stderr: str, timeout: float | None = None) -> str:
    """One line for a run that did not finish: ``OOM: ...`` for an out-of-memory error,
    ``timed out ...``, else ``failed: <the last error line>``."""
    if timeout is not None:
        return f"timed out after {timeout:.0f} s"
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    err = next((ln for ln in reversed(lines) if ln.startswith("error:") or "Error" in ln), lines[-1] if lines else "")
    low = stderr.lower()
    if "out of memory" in low or "outofmemoryerror" in low:
        return f"OOM: {err[:300]}"
    return f"failed (exit {rc}): {err[:300] or 'no error output'}"


# the default model of `memo-exec validate`: 4 layers, since every policy keeps its last 2 on the device
# (`memo_sim.policy.rounding_buffers.KEPT_LAYERS`) and a 2-layer toy made every policy one plan (MEMO offloaded
# nothing, full recompute recomputed nothing: four plans predicted alike, a Kendall tau of nothing)
TOY_MODEL = ModelConfig("toy", 4, 256, 8, 1024, vocab=1000)


def cpu_threads(profile: HardwareProfile) -> int | None:
    """The torch CPU threads the profile was calibrated with (`memo_exec.device.calibrated_threads`)."""
    from memo_exec.device import calibrated_threads  # noqa: PLC0415

    return calibrated_threads(profile.provenance)


def run_env(device: str, threads: int | None) -> dict[str, str]:
    """The environment of one run's process: this repository on the path and, on a CPU, the
    calibration's thread count (``OMP_NUM_THREADS``, which torch reads at start)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if device == "cpu" and threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def this_python() -> list[str]:
    """The interpreter to start a child with that imports this checkout's packages: ``-P`` keeps the
    working directory, which may hold another checkout, off the front of the path (Python 3.11+)."""
    return [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else [])]


def run_argv(plan_file: Path, run_dir: Path, device: str, steps: int) -> list[str]:
    """The command that runs one plan in its own process: this checkout's executor (``-P``: the
    working directory, which may hold another checkout, is not put first on the path); a plan on
    several devices on that many processes of this machine (``--nproc``, rank 0 prints the JSON)."""
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415

    gpus = read_plan(plan_file).layout.gpus
    return [*this_python(), "-m", "memo_exec", "run", str(plan_file), "--device", device, "--steps", str(steps),
            "--out", str(run_dir), "--json", "--no-progress", *(["--nproc", str(gpus)] if gpus > 1 else [])]


STOP_GRACE_S = 10.0  # a run told to stop (SIGTERM) gets this long to stop its ranks and remove its stage; then SIGKILL


def stop_run(proc: subprocess.Popen, grace_s: float | None = None) -> tuple[str, str]:
    """Stop a run's process and collect what it wrote: SIGTERM to its process group first, which `memo_exec.cli`
    turns into `memo_sim.errors.Terminated` (its staging folder discarded, an --nproc launcher's ranks stopped,
    `memo_exec.distributed.launch.launch_nproc`), then SIGKILL after ``grace_s`` (default `STOP_GRACE_S`). A review:
    ``subprocess.run``'s time-out sent SIGKILL at once, so the run never removed its ``.plan-NN.*.partial`` stage."""
    import signal  # noqa: PLC0415

    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):  # already gone
            pass
        try:
            out, err = proc.communicate(timeout=grace_s if sig == signal.SIGTERM else None)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            continue
    return "", ""  # not reached: communicate() without a timeout returns once SIGKILL ends it


def remove_stages(run_dir: Path) -> None:
    """Remove the staging folders a stopped run left in ``run_dir`` (`memo_sim.fileio.OutputFolder`'s
    ``.NAME.XXXX.partial``: a run killed before its clean-up, or an --nproc launcher, which keeps its stage)."""
    import shutil  # noqa: PLC0415

    for p in run_dir.glob(f".{run_dir.name}.*.partial"):
        shutil.rmtree(p, ignore_errors=True)


def run_completed(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a whole run: its manifest written last by `memo_sim.fileio.OutputFolder.commit`,
    ``complete: true`` (``run_plan`` empties ``run_dir`` before each run, so it is this run's)."""
    from memo_sim.fileio import MANIFEST  # noqa: PLC0415

    try:
        return json.loads((run_dir / MANIFEST).read_text()).get("complete") is True
    except (OSError, ValueError, AttributeError):
        return False


def run_plan(plan_file: Path, run_dir: Path, device: str, steps: int, timeout: float | None,
             threads: int | None = None) -> tuple[str, dict]:
    """(status, the run's --json document) of one plan run in a fresh process (on a CPU with
    ``threads`` torch threads). A run past ``timeout``, or one this process is interrupted during (Ctrl-C, SIGTERM),
    is stopped with `stop_run` and its stage removed (`remove_stages`); a timed-out run that had completed (its
    manifest complete and its --json printed: the time-out came while it exited) is a run, not a time-out."""
    import shutil  # noqa: PLC0415

    env = run_env(device, threads)
    if run_dir.exists():  # an earlier run of this plan (one set aside for the machine's speed): not this one's
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen(run_argv(plan_file, run_dir, device, steps), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = stop_run(proc)
    except BaseException:  # Ctrl-C, `memo_sim.errors.Terminated`: the run stops too (its own group: it saw nothing)
        stop_run(proc)
        remove_stages(run_dir)
        raise
    rc = proc.returncode
    remove_stages(run_dir)
    atomic_write_text(run_dir / "stdout.txt", out)
    atomic_write_text(run_dir / "stderr.txt", err)
    if timed_out:
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            doc = None
        if not (isinstance(doc, dict) and run_completed(run_dir)):
            return failure_status(124, err, timeout), {}
        return "ran", doc  # it finished within the time and was stopped while it exited
    if rc != 0:
        return failure_status(rc, err), {}
    try:
        return "ran", json.loads(out)
    except json.JSONDecodeError as e:
        return f"failed: unreadable --json output ({e})", {}


def run_validation(model: ModelConfig, profile: HardwareProfile, plans: list[PlanSpec], *, device: str,
                   steps: int, out_dir: Path, progress=None, budget_s: float | None = None,
                   runner=run_plan, speed_retries: int = 1, layout: Layout | None = None,
                   micro_batches: int = 1, say=None) -> list[ValidationRow]:
    """Predict, write and run every plan (each in its own process); ``say`` (a line) tells the console, before the
    runs, of each multi-device plan whose static memory plan the ranks will not follow (`ValidationRow
    .memory_plan_note`). ``budget_s`` bounds the runs'
    wall time: each gets a timeout from what is left, shared in proportion to the plans' predicted
    cost; a plan that no longer fits is a ``skipped`` row. A CPU run during which the machine's
    speed moved more than `SPEED_DRIFT_LIMIT` from the calibration's (`memo_exec.speed_probe`) is
    run again, up to ``speed_retries`` times; the drifts of the runs set aside stay in the row. Once a plan's runs
    all drifted past the limit on one side (`memo_exec.speed_probe.persistent_drift`: the machine's speed moved
    since the calibration), the later plans run once: running again would measure the same speed (on the 2-core
    VM with a profile calibrated days before, every plan ran twice)."""
    t0 = time.monotonic()
    rows: list[ValidationRow] = []
    todo = []  # (index, spec, plan file, predicted quantities, sim)
    replays: dict[int, dict] = {}  # plan index -> `predicted_allocator`
    for k, spec in enumerate(plans):
        if spec.policy is None:
            rows.append(ValidationRow(spec.label, spec.skipped or "skipped", _empty()))
            continue
        sim = predict(model, spec.seq, spec.policy, profile, layout, micro_batches)
        pq = predicted_quantities(sim)
        plan = plan_for(model, spec.seq, spec.policy, profile, sim, layout, micro_batches)
        plan_file = write_plan(plan, out_dir / "plans" / f"plan-{k:02d}.json")
        row = ValidationRow(spec.label, "ran", _pred_only(pq), plan_file=str(plan_file),
                            predicted_timeline=sim.timeline, memory_plan_note=_memory_plan_note(plan, device))
        replays[k] = predicted_allocator(sim, model, spec.seq, spec.policy, profile, layout)
        row.allocator = allocator_comparison(replays[k], not_measured("the plan did not run"))
        rows.append(row)
        if sim.status != "OK":
            row.status = f"predicted {sim.status}"
            continue
        todo.append((k, row, pq, steps * (sim.iteration_s or 0.0) + RUN_STARTUP_S))
    for _k, row, _pq, _c in todo:
        if say is not None and row.memory_plan_note:
            say(row.memory_plan_note.replace("note: ", f"note: {row.label}: ", 1))
    done = len(plans) - len(todo)
    if progress and done:
        progress(done, len(plans))
    for n, (k, row, pq, cost) in enumerate(todo):
        timeout = None
        if budget_s is not None:
            left = budget_s - (time.monotonic() - t0)
            timeout = left * cost / sum(c for *_, c in todo[n:])
            if timeout < min(RUN_STARTUP_S, left):
                row.status = f"skipped: out of the {budget_s:.0f} s budget"
                continue
        run_dir = out_dir / "runs" / f"plan-{k:02d}"
        status, doc = runner(Path(row.plan_file), run_dir, device, steps, timeout, cpu_threads(profile))
        cal_probe = (profile.provenance or {}).get("speed_probe")
        while (status == "ran" and len(row.discarded_drifts_pct) < speed_retries
               and abs(d := drift(doc.get("speed_probe"), cal_probe) or 0.0) > SPEED_DRIFT_LIMIT):
            row.discarded_drifts_pct.append(round(100.0 * d, 1))
            status, doc = runner(Path(row.plan_file), run_dir, device, steps, timeout, cpu_threads(profile))
        kept = drift(doc.get("speed_probe"), cal_probe) if status == "ran" else None
        if persistent_drift(row.discarded_drifts_pct, None if kept is None else 100.0 * kept):
            speed_retries = 0  # the machine's speed moved since the calibration: the later plans run once
        row.status, row.run_dir = status, str(run_dir)
        row.allocator = allocator_comparison(replays[k], measured_allocator(run_dir) if status == "ran" else
                                             not_measured(f"the plan did not run ({status})"))
        if status == "ran":
            row.quantities = quantities_from_run(doc, pq)
            row.speed_probe = doc.get("speed_probe")
            row.alltoall = doc.get("moe_alltoall") or []
            row.oversubscribed = doc.get("oversubscribed")
            row.ran_dtype = measured_dtype(run_dir)
        if progress:
            progress(done + n + 1, len(plans))
    return rows


def _memory_plan_note(plan: Plan, device: str | None = None) -> str | None:
    """`memo_exec.distributed.runner.memory_plan_not_followed` of a multi-device plan run on ``device`` (None for one
    device)."""
    if plan.layout.gpus == 1:
        return None
    from memo_exec.distributed.runner import memory_plan_not_followed  # noqa: PLC0415 - imports torch

    return memory_plan_not_followed(plan, device=device)


def _moved(path: str | None, stage: Path, out: Path) -> str | None:
    """``path`` under the staging folder ``stage`` as it will be once the set is moved into ``out``."""
    if path is None:
        return None
    try:
        return str(out / Path(path).relative_to(stage))
    except ValueError:  # not in the stage (a runner that wrote elsewhere): as it is
        return path


def _empty() -> dict[str, dict]:
    return {k: {"predicted": None, "measured": None, "error_pct": None} for k, _, _ in QUANTITIES}


def _pred_only(pq: dict) -> dict[str, dict]:
    return {k: {"predicted": pq[k], "measured": None, "error_pct": None} for k, _, _ in QUANTITIES}


def abs_error_stats(errors: list[float | None]) -> dict:
    """Median, mean and max |error| (percent) of the errors given (None: not compared), and how many."""
    errs = [abs(e) for e in errors if e is not None]
    return {"median_abs_error_pct": statistics.median(errs) if errs else None,
            "mean_abs_error_pct": sum(errs) / len(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None, "plans": len(errs)}


def summarize(rows: list[ValidationRow]) -> dict:
    """Median, mean and max |error| (percent) of each quantity over the plans that ran, and the Kendall tau
    between the predicted and the measured ordering of their step times."""
    ran = [r for r in rows if r.status == "ran"]
    out: dict = {"plans": len(rows), "ran": len(ran),
                 "failed": sum(r.status.startswith(("OOM", "failed", "timed out")) for r in rows),
                 "oom": sum(r.status.startswith("OOM") for r in rows)}
    out["errors"] = {key: abs_error_stats([r.quantities[key]["error_pct"] for r in ran]) for key, _, _ in QUANTITIES}
    for key, e in out["errors"].items():  # the misses (`is_miss`): counted among the plans compared, apart in size
        misses = [x for x in (miss_seconds(key, r.quantities[key]) for r in ran) if x is not None]
        if misses:
            e.update({"misses": len(misses), "max_abs_miss": max(misses), "compared": e["plans"] + len(misses)})
    # the plans whose run said its times are not comparable with the prediction (`times_apart`)
    out["times_not_comparable"] = [r.label for r in ran if r.quantities["step_s"].get("not_comparable")]
    out["allocator_errors"] = {key: abs_error_stats([(r.allocator or {}).get("quantities", {}).get(key, {}).get(
        "error_pct") for r in ran]) for key, _, _ in ALLOCATOR_QUANTITIES}
    # the ordering of times that are not comparable is not compared either (a review: a GPU profile on a CPU read
    # "Kendall tau ...: -1.0" beside "step time | 0 plans compared | not comparable")
    pairs = [(r.quantities["step_s"]["predicted"], r.quantities["step_s"]["measured"]) for r in ran
             if not r.quantities["step_s"].get("not_comparable")]
    pairs = [(p, m) for p, m in pairs if p is not None and m is not None]
    out["kendall_tau_step_time"] = kendall_tau([p for p, _ in pairs], [m for _, m in pairs])
    return out


def _fmt(v, unit: str) -> str:
    if v is None:
        return "—"
    return fmt_bytes(v) if unit == "bytes" else fmt_time(v)


def _pct(v) -> str:
    return "—" if v is None else f"{v:+.1f}%"


def _abs_pct(v) -> str:
    return "—" if v is None else f"{v:.1f}%"


NOT_COMPARABLE = "not comparable"  # `memo_exec.report.NOT_COMPARABLE`'s words (that module imports torch)


def _err_cell(q: dict, key: str = "") -> str:
    """A row's error cell: "not comparable" where the run said so (`times_apart`); a miss (`miss_seconds`: quantity
    ``key``) by its absolute difference."""
    miss = miss_seconds(key, q)
    if miss is not None:
        return f"miss: {fmt_time(miss)} measured, none predicted"
    return NOT_COMPARABLE if q.get("not_comparable") else _pct(q["error_pct"])


def not_comparable_words(summary: dict) -> str:
    """Why the step times were not compared, where no run's were and some run said they are not comparable ('')."""
    apart = summary.get("times_not_comparable") or []
    if not apart or summary["errors"]["step_s"]["plans"]:
        return ""
    return summary.get("times_not_comparable_why") or "the profile describes another kind of device than the runs'"


def _tau_text(summary: dict) -> str:
    """The report's Kendall tau: "not comparable" where the step times are (`not_comparable_words`), as the step-time
    row beside it says; "—" where fewer than two plans were compared."""
    tau = summary["kendall_tau_step_time"]
    if tau is None and not_comparable_words(summary):
        return NOT_COMPARABLE
    return "—" if tau is None else str(round(tau, 3))


def summary_line(summary: dict) -> str:
    """The step-time errors in one line, in percent (error = (measured - predicted) / predicted)."""
    e = summary["errors"]["step_s"]
    tau = summary["kendall_tau_step_time"]
    a = summary["errors"].get("alltoall_layer_s") or {}
    a2a = (f"; MoE all-to-all per layer |error| median {_abs_pct(a['median_abs_error_pct'])} over {a['plans']} "
           f"plans" if a.get("plans") else
           f"; MoE all-to-all per layer not compared ({summary['alltoall_not_compared']})"
           if summary.get("alltoall_not_compared") else "")
    head = (f"{summary['ran']} of {summary['plans']} plans ran ({summary['oom']} out of memory, {summary['failed']} "
            f"failed)")
    if not_comparable_words(summary):
        return f"{head}; step times {NOT_COMPARABLE}: {not_comparable_words(summary)}{a2a}"
    return (f"{head}; step-time |error| median {_abs_pct(e['median_abs_error_pct'])}, mean "
            f"{_abs_pct(e['mean_abs_error_pct'])}, max {_abs_pct(e['max_abs_error_pct'])}; Kendall tau "
            f"{'—' if tau is None else f'{tau:.2f}'}{a2a}")


def shown_quantities(rows: list[ValidationRow]) -> tuple:
    """QUANTITIES less the `OPTIONAL` ones no plan has a number for (a dense validation shows no
    all-to-all columns)."""
    return tuple(q for q in QUANTITIES if q[0] not in OPTIONAL or any(
        r.quantities[q[0]]["predicted"] is not None or r.quantities[q[0]]["measured"] is not None for r in rows))


def alltoall_section(rows: list[ValidationRow]) -> list[str]:
    """Markdown: every MoE plan's all-to-all per layer, predicted vs measured (empty without one)."""
    from memo_exec.compare import alltoall_names  # noqa: PLC0415

    moe = [r for r in rows if r.alltoall]
    if not moe:
        return []
    out = ["", "## MoE all-to-all per layer", "",
           "The expert-parallel dispatch + combine all-to-alls of each MoE layer (stream ep_comm: "
           f"{alltoall_names()}, forward, recompute and backward summed; n = "
           "how many each side counted). Measured: rank 0's spans, median over the steady steps (on a CPU the wall "
           "time around each blocking gloo collective); predicted: the simulator's ops of the same names.", "",
           "| plan | layer | predicted | n | measured | n | measured / predicted | error |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in moe:
        for a in r.alltoall:
            ratio = "—" if a.get("ratio") is None else f"{a['ratio']:.2f}"
            err = None if a.get("rel_error") is None else 100.0 * a["rel_error"]
            apart = r.quantities["alltoall_layer_s"].get("not_comparable")  # `times_apart`
            out.append(f"| {r.label} | {a['layer']} | {_fmt(a['predicted_s'], 's')} | {a['predicted_count']} | "
                       f"{_fmt(a['measured_s'], 's')} | {a['measured_count']} | {ratio} | "
                       f"{NOT_COMPARABLE if apart else _pct(err)} |")
    return out


def _fmt_any(v, unit: str) -> str:
    return "—" if v is None else (f"{v:,}" if unit == "count" else _fmt(v, unit))


def allocator_section(rows: list[ValidationRow], summary: dict) -> list[str]:
    """Markdown: every plan's caching-allocator replay beside torch.cuda.memory_stats(); one line
    saying why where no plan measured them (a CPU run, or none ran)."""
    out = ["", ALLOCATOR_SECTION, ""]
    comps = [(r, r.allocator or {}) for r in rows]
    if not any(a.get("measured") for _, a in comps):
        why = next((a["status"] for _, a in comps if a.get("status", "").startswith("not measured")), None)
        return out + [f"Not compared: {why or 'no plan ran'}."]
    out += ["Predicted: the simulator's replay of PyTorch's caching allocator over the plan's steady iteration; "
            "measured: torch.cuda.memory_stats() over the run's last step (counters as differences across the step, "
            "peaks after torch.cuda.reset_peak_memory_stats at its start, segments at its end). Error = (measured - "
            "predicted) / predicted.", "",
            "| plan | quantity | predicted | measured | difference | error |", "|---|---|---:|---:|---:|---:|"]
    for r, a in comps:
        if a.get("status") == STATIC_PLAN or not a.get("measured"):
            out.append(f"| {r.label} | {a.get('status', 'not compared')} | | | | |")
            continue
        for key, unit, what in ALLOCATOR_QUANTITIES:
            q = a["quantities"][key]
            out.append(f"| {r.label} | {what} (`{key}`) | {_fmt_any(q['predicted'], unit)} | "
                       f"{_fmt_any(q['measured'], unit)} | {_fmt_any(q['difference'], unit)} | {_pct(q['error_pct'])} |")
    e = summary["allocator_errors"]["reserved_bytes.all.peak"]
    out += ["", f"- reserved peak |error| over {e['plans']} plans: median {_abs_pct(e['median_abs_error_pct'])}, "
                f"mean {_abs_pct(e['mean_abs_error_pct'])}, max {_abs_pct(e['max_abs_error_pct'])}"]
    return out + [f"- under {n}" for n in summary.get("allocator_notes") or []]


def render_report(rows: list[ValidationRow], summary: dict, model: ModelConfig, profile: HardwareProfile,
                  device_desc: str, command: str, figure: str | None, layout: Layout | None = None) -> str:
    shown = shown_quantities(rows)
    lines = [f"# Simulator validation: {model.name} on {device_desc}", "",
             f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
             f"- machine: {platform.machine()} {platform.node()}; device: {device_desc}",
             f"- profile: {profile.name} ({profile.path}); calibration provenance: "
             f"{profile.provenance.get('date', 'n/a')} {profile.provenance.get('command', '')}"
             + (f" (1-minute load at its start and end: {profile.provenance['load_average_1min']})"
                if profile.provenance.get("load_average_1min") else ""),
             f"- command: `{command}`",
             f"- load average (1 min) of the machine before and after the runs: "
             f"{' -> '.join(str(x) for x in summary.get('load_average_1min') or ['n/a'])}"
             + (f"; each CPU run used {summary['cpu_threads']} torch threads (the calibration's)"
                if summary.get("cpu_threads") else ""),
             f"- cores other processes took: {_share_text(profile.provenance.get('cpu_share'))} while calibrating, "
             f"{_share_text(summary.get('cpu_share'))} during the runs (`memo_exec.host_share`)",
             *_speed_lines(summary.get("speed")),
             f"- model: {model.layers} layers, h={model.hidden}, {model.heads} heads, ffn={model.ffn}, "
             f"vocab={model.vocab}, {dtype_words(model, rows)}"
             + (f", {model.experts} experts (top {model.top_k})" if model.moe else ""),
             *([f"- layout: {layout.label()} on {layout.gpus} processes (rank 0's measurements)"]
               if layout is not None and layout.gpus > 1 else []),
             *([f"- attention priced: {summary['attention_pricing']}"] if summary.get("attention_pricing") else []),
             *[f"- MoE block under {n}" for n in summary.get("moe_block_notes") or []],
             *([f"- **cores oversubscribed** in the runs of {', '.join(summary['oversubscribed'])}: their ranks "
                "and other processes wanted more cores than the machine has (each run's report.md says how many), "
                "so their step-time errors mean little"] if summary.get("oversubscribed") else []),
             "- each plan ran in its own process; its files are under runs/plan-NN/ (plans/plan-NN.json the plan)",
             "", "| plan | status | " + " | ".join(f"{w} predicted | measured | error" for _, _, w in shown) + " |",
             "|---|---|" + "---:|---:|---:|" * len(shown)]
    for r in rows:
        cells = []
        for key, unit, _ in shown:
            q = r.quantities[key]
            cells += [_fmt(q["predicted"], unit), _fmt(q["measured"], unit), _err_cell(q, key)]
        lines.append(f"| {r.label} | {r.status} | " + " | ".join(cells) + " |")
    # beside the memory row: the plans whose memory plan the ranks did not follow (`ValidationRow.memory_plan_note`)
    notes = [f"- peak memory of {r.label}: {r.memory_plan_note.removeprefix('note: ')}" for r in rows
             if r.memory_plan_note]
    lines += [""] + notes if notes else []
    lines += ["", "## Summary", "", f"- plans: {summary['plans']}, ran: {summary['ran']}, failed: {summary['failed']} "
              f"(out of memory: {summary['oom']})",
              f"- Kendall tau, predicted vs measured ordering of step times: {_tau_text(summary)}",
              "", "| quantity | plans compared | median abs error | mean abs error | max abs error |",
              "|---|---:|---:|---:|---:|"]
    not_compared = summary.get("alltoall_not_compared")  # an expert-parallel validation says why, never drops it
    for key, unit, what in shown:
        e = summary["errors"][key]
        if key == "alltoall_layer_s" and not_compared:
            continue
        apart = not e["plans"] and any(r.quantities[key].get("not_comparable") for r in rows)
        cells = " | ".join(NOT_COMPARABLE if apart else _abs_pct(e[k])
                           for k in ("median_abs_error_pct", "mean_abs_error_pct", "max_abs_error_pct"))
        misses = e.get("misses") or 0
        if misses:  # relative errors of the others; the misses said in the max cell, by their absolute size
            cells += (f"; {misses} miss{'es' if misses > 1 else ''} (measured exposure where none was predicted, up "
                      f"to {fmt_time(e['max_abs_miss'])})")
        lines.append(f"| {what} | {e.get('compared', e['plans'])} | {cells} |")
    if not_compared:
        lines.append(f"| MoE all-to-all per layer | 0 | not compared: {not_compared} | | |")
    if not_comparable_words(summary):
        lines.append(f"\nTimes {NOT_COMPARABLE}: {not_comparable_words(summary)} (each run's report.md says so too).")
    if not summary["errors"]["peak_memory_bytes"]["plans"]:
        lines.append("\nPeak memory not compared: the device reports no allocator peak (a CPU run measures process "
                     "RSS, which the simulator's GPU memory model does not predict), or no plan ran.")
    lines += alltoall_section(rows)
    lines += allocator_section(rows, summary)
    if figure:
        lines += ["", f"Worst step-time case, predicted vs measured streams: ![]({figure})"]
    return "\n".join(lines) + "\n"


def alltoall_not_compared_why(rows: list[ValidationRow]) -> str:
    """Why an expert-parallel validation compares no MoE all-to-all time per layer (one line)."""
    ran = [r for r in rows if r.status == "ran"]
    if not ran:
        return "no plan ran"
    if any(r.quantities["alltoall_layer_s"].get("not_comparable") for r in ran):  # `times_apart`
        return f"{NOT_COMPARABLE}: the profile describes another kind of device than the runs'"
    a2a = [a for r in ran for a in r.alltoall]
    if not a2a:
        return "no run reported an all-to-all (no ep_comm spans named as the simulator's dispatch / combine)"
    if not any(a.get("predicted_count") for a in a2a):
        return "the simulator priced no dispatch / combine all-to-all on the layers the runs timed"
    if not any(a.get("measured_count") for a in a2a):
        return "the runs timed no dispatch / combine all-to-all on the layers the simulator priced"
    return "no layer was timed by both the runs and the simulator"


def allocator_notes(plans: list[PlanSpec]) -> list[str]:
    """One note per policy of the plans whose memory the executor holds otherwise than the simulator's caching-
    allocator replay frees it (`memo_exec.activations.registry.allocator_note`)."""
    from memo_exec.activations.registry import allocator_note  # noqa: PLC0415

    return _policy_notes(plans, allocator_note)


def _policy_notes(plans: list[PlanSpec], note) -> list[str]:
    """``note(policy name)`` of each policy of the plans, once, where it has one."""
    names = dict.fromkeys(p.policy.name for p in plans if p.policy is not None)
    return [n for n in (note(p) for p in names) if n]


def moe_block_notes(model: ModelConfig, plans: list[PlanSpec]) -> list[str]:
    """One note per policy of the plans whose MoE block the executor runs otherwise than the simulator
    prices it (`memo_exec.activations.registry.moe_block_note`)."""
    from memo_exec.activations.registry import moe_block_note  # noqa: PLC0415

    return _policy_notes(plans, lambda name: moe_block_note(model, name))


def _speed_lines(speed: dict | None) -> list[str]:
    """The machine's speed while calibrating and during each run (`memo_exec.speed_probe`)."""
    if not speed or speed.get("calibration_median_gflops") is None:
        return [] if not speed else ["- machine speed: not compared (the profile has no speed probe: calibrate again)"]
    runs = ", ".join(f"{r['plan']} {r['median_gflops']} ({r['drift_pct']:+.1f}%"
                     + "".join(f"; run again after {x:+.1f}%" for x in r["discarded_drifts_pct"]) + ")"
                     for r in speed["runs"] if r["drift_pct"] is not None)
    unsteady = (f"; beyond ±{speed['limit_pct']:.0f}%: {', '.join(speed['unsteady'])} (those runs measured another "
                "machine than the one calibrated)" if speed["unsteady"]
                else f"; every run within ±{speed['limit_pct']:.0f}%" if runs else "")  # nothing measured: no claim
    if speed.get("persistent"):
        unsteady += (f"; {speed['persistent'][0]}'s runs all drifted past ±{speed['limit_pct']:.0f}% on one side: the "
                     "machine's speed moved since the calibration, so the plans after it ran once; calibrate again")
    return [f"- machine speed ({speed['reference']}, GFLOP/s): {speed['calibration_median_gflops']} while calibrating "
            f"(spread {speed['calibration_spread_pct']}%), after each run's steps: {runs or 'not measured'}{unsteady}"]


def _share_text(share: dict | None) -> str:
    if not share:
        return "not measured"
    return f"{share['other_cores']:.2f} of {share['cores']} (steal {share['steal_cores']:.2f})"


def _load_1min() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def not_recorded_why(profile: HardwareProfile, device: str) -> str | None:
    """Why the validation of ``profile`` on ``device`` must not go into the profile (None: it may):
    a profile's validation error is the one measured on the kind of device it describes (a
    calibrated profile says which, ``provenance.device_kind``; any other describes a GPU)."""
    kind = "cpu" if str(device).startswith("cpu") else "cuda"
    described = profile.device_kind
    if kind != described:
        return (f"not recorded in the profile: it describes a {described} device and this ran on {device} "
                f"(calibrate this machine to validate a profile of it)")
    if not profile.path:
        return "not recorded in the profile: it was loaded from no file"
    return None


def record_in_profile(profile: HardwareProfile, summary: dict, device: str, json_path: Path) -> str:
    """Write the step-time errors of ``summary`` as ``profile``'s validation block (its file, atomically);
    one line saying where it went, or why it did not."""
    from memo_sim.profile.record import record_validation, validation_block  # noqa: PLC0415

    e = summary["errors"]["step_s"]
    if e["median_abs_error_pct"] is None:
        return "not recorded in the profile: no step time was compared"
    why = not_recorded_why(profile, device)
    if why:
        return why
    pct = lambda v: None if v is None else v / 100.0  # noqa: E731 - percent -> fraction
    block = validation_block(median=pct(e["median_abs_error_pct"]), mean=pct(e["mean_abs_error_pct"]),
                             worst=pct(e["max_abs_error_pct"]), plans=e["plans"], device=str(device),
                             date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             kendall_tau=summary["kendall_tau_step_time"], report=str(json_path.resolve()))
    return f"recorded in {record_validation(profile, block)} (its validation block)"


def validate(model: ModelConfig, profile: HardwareProfile, plans: list[PlanSpec], *, device: str,
             steps: int, out_dir: str | Path, report_path: str | Path | None, command: str,
             progress=None, budget_s: float | None = None, runner=run_plan,
             record: bool = True, speed_retries: int = 1, layout: Layout | None = None,
             micro_batches: int = 1, say=None) -> tuple[Path, dict]:
    """Run the validation (``say``: `run_validation`'s) and write the report (markdown and ``validation.json``);
    with ``record`` write the measured step-time errors into the profile's file (`record_in_profile`; the line
    saying where is ``summary["recorded"]``); raise `ExecError` (one line) when no plan ran, after
    writing the report."""
    if not plans:
        raise ExecError("no plans to validate: give at least one sequence length and policy")
    from memo_sim.plan.executor_scope import dtype_why_not  # noqa: PLC0415

    if dtype_why_not(model):  # memo-exec refuses every such plan (a review: the runs ran fp32, the report said fp16)
        raise ExecError(f"--dtype {model.dtype}: memo-exec does not train {model.dtype} (it needs loss scaling, which "
                        f"memo-exec does not implement), so no run would be of the plans; give --dtype bf16 or fp32")
    check_outputs(out_dir, report_path, profile, device, record)  # before any plan is predicted, written or run
    out = Path(out_dir)
    from memo_sim.fileio import output_folder  # noqa: PLC0415

    # everything validate writes into --out (plans/, runs/, the report, validation.json, the figure) is staged and
    # moved in as one set at the end (`memo_sim.fileio.OutputFolder`, what `memo-exec run --out` uses): a failure or
    # an interrupt (Ctrl-C, SIGTERM) leaves --out as it was (a review: an interrupted validation left a new plans/
    # and runs/ beside the old validation.md)
    with output_folder(out, "memo-exec validate") as outf:
        stage = outf.stage
        load0 = _load_1min()
        with CpuShareMeter() as share:
            rows = run_validation(model, profile, plans, device=device, steps=steps, out_dir=stage,
                                  progress=progress, budget_s=budget_s, runner=runner, speed_retries=speed_retries,
                                  layout=layout, micro_batches=micro_batches, say=say)
        summary = summarize(rows)
        summary["load_average_1min"] = [load0, _load_1min()]
        summary["cpu_share"] = share.result.to_dict() if share.result is not None else None
        summary["cpu_threads"] = cpu_threads(profile) if device == "cpu" else None
        from memo_sim.api import attention_pricing_words  # noqa: PLC0415

        summary["attention_pricing"] = attention_pricing_words(model, layout or Layout(), [p.seq for p in plans],
                                                               profile)
        summary["moe_block_notes"] = moe_block_notes(model, plans)
        # under the policies whose replay a run was compared with (not a static plan's, nor a plan that did not run)
        summary["allocator_notes"] = allocator_notes([p for p, r in zip(plans, rows)
                                                      if (r.allocator or {}).get("status") == "compared"])
        summary["oversubscribed"] = [r.label for r in rows if r.oversubscribed]
        if summary["times_not_comparable"]:  # the runs' own rule said it (`times_apart`); the words name both devices
            summary["times_not_comparable_why"] = (
                f"the profile {profile.name} describes a {profile.device_kind} device and the runs ran on {device}, so "
                f"its times are predictions of another machine (calibrate this machine to validate a profile of it)")
        if model.moe and (layout or Layout()).ep > 1 and not summary["errors"]["alltoall_layer_s"]["plans"]:
            summary["alltoall_not_compared"] = alltoall_not_compared_why(rows)
        if device == "cpu":
            summary["speed"] = run_speeds([(r.label, r.speed_probe, r.discarded_drifts_pct) for r in rows
                                           if r.status == "ran"], (profile.provenance or {}).get("speed_probe"))
        ran = [r for r in rows if r.status == "ran"]
        figure, dev = None, device
        if ran:
            from memo_exec.figures import overlay_gantt
            from memo_sim.timeline import Timeline

            worst = max(ran, key=lambda r: abs(r.quantities["step_s"]["error_pct"] or 0.0))
            measured = Path(worst.run_dir or "") / "measured.json"
            if worst.predicted_timeline is not None and measured.exists():
                mt = Timeline.read_json(measured)
                dev = mt.meta.get("device") or device
                overlay_gantt(worst.predicted_timeline, mt, stage / FIGURE_NAME,
                              f"{worst.label}: predicted vs measured")
                figure = str(out / FIGURE_NAME)  # where it will be
        for r in rows:  # the paths the rows name: where the set will be, not the stage
            r.plan_file, r.run_dir = _moved(r.plan_file, stage, out), _moved(r.run_dir, stage, out)
        target = Path(report_path) if report_path else out / REPORT_NAME
        if figure is not None:  # a link relative to the report, which may lie elsewhere (--report)
            figure = os.path.relpath(os.path.abspath(figure), os.path.dirname(os.path.abspath(target)))
        text = render_report(rows, summary, model, profile, str(dev), command, figure, layout)
        if not report_path:
            atomic_write_text(stage / REPORT_NAME, text)
        atomic_write_json(stage / JSON_NAME, {
            "model": model.to_dict(), "layout": (layout or Layout()).label(), "profile": profile.name,
            "profile_path": profile.path, "device": str(dev),
            "command": command, "summary": summary, "rows": [r.to_dict() for r in rows]})
    json_path = out / JSON_NAME
    if report_path:  # a file outside the set, written (atomically) once the set is in place
        atomic_write_text(target, text)
    if not ran:
        first = next((r.status for r in rows), "")
        raise ExecError(f"no plan ran ({summary['plans']} planned; first: {first}); see {target}")
    summary["recorded"] = (record_in_profile(profile, summary, str(dev), json_path) if record
                           else "not recorded in the profile (--no-record)")
    return target, summary
