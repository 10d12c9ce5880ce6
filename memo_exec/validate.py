"""Validate the simulator against measured runs: many plans, predicted vs measured, one table.

For each plan (sequence lengths x policies x alphas of one model on one device) the simulator
predicts with the given (calibrated) profile and the executor runs it; the table sets
predicted beside measured: iteration time, peak memory, exposed copy time, each with its
error, plus the Kendall tau between the predicted and the measured ranking of the plans, and
predicted/measured Gantt charts of the worst case overlaid. The calibration data (memo-exec
calibrate) and these runs are separate runs.

On a CPU, peak memory is the process RSS, which the simulator's GPU memory model does not
predict; the memory columns are then left out and the report says so.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from memo_exec.errors import ExecError
from memo_exec.figures import overlay_gantt
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json, atomic_write_text
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan, write_plan
from memo_sim.policy import Policy, get_policy, policy_class
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import Timeline
from memo_sim.units import fmt_bytes, fmt_count, fmt_time


@dataclass
class ValidationRow:
    label: str
    seq: int
    policy: Policy
    predicted: dict
    measured: dict
    status: str = "ran"  # ran | predicted OOM | failed: ...
    predicted_timeline: Timeline | None = field(default=None, repr=False)
    measured_timeline: Timeline | None = field(default=None, repr=False)

    def err(self, pred_key: str, meas_key: str) -> float | None:
        p, m = self.predicted.get(pred_key), self.measured.get(meas_key)
        if p is None or m is None or not p:
            return None
        return (m - p) / p


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


def plan_set(seqs: list[int], policies: list[str], alphas: list[float]) -> list[tuple[int, Policy]]:
    """Every (sequence length, policy) to validate; a policy that takes alpha once per alpha."""
    out = []
    for s in seqs:
        for p in policies:
            if policy_class(p).takes_alpha:
                out += [(s, get_policy(p, a)) for a in alphas]
            else:
                out.append((s, get_policy(p)))
    return out


def predict(model: ModelConfig, seq: int, policy: Policy, profile: HardwareProfile):
    from memo_sim.api import simulate

    return simulate(model, Layout(), 1, seq, policy, profile)


def _plan_for(model, seq, policy, profile, sim) -> Plan:
    d = sim.to_dict()
    predicted = {"source": "simulated", "status": d["status"], "iteration_s": d["iteration_s"], "mfu": d["mfu"],
                 "tgs_tokens_per_gpu_s": d["tgs_tokens_per_gpu_s"], "peak_gpu_bytes": d["peak_gpu_bytes"],
                 "peak_host_bytes_per_node": d["peak_host_bytes_per_node"], "exposed_copy_s": d["exposed_copy_s"]}
    lt = {k: v for k, v in d["layer_timings_s"].items() if k in ("forward", "backward", "recompute", "offload",
                                                                 "prefetch")}
    return Plan(model=model, batch=1, seq_tokens=seq, gpus=1, layout=Layout(), policy=policy, profile=profile.name,
                predicted=predicted, layer_timings_s=lt, attention_backend="auto")


def run_validation(model: ModelConfig, profile: HardwareProfile, plans: list[tuple[int, Policy]], *,
                   device: str, steps: int, out_dir: Path, progress=None) -> list[ValidationRow]:
    from memo_exec.measure import timeline_from_step
    from memo_exec.runner import Executor, RunOptions

    rows: list[ValidationRow] = []
    for k, (seq, pol) in enumerate(plans):
        if progress and k:
            progress(k, len(plans))  # every plan counts, whether it ran, was predicted OOM or failed
        label = f"{fmt_count(seq)} {pol.label()}"
        sim = predict(model, seq, pol, profile)
        plan = _plan_for(model, seq, pol, profile, sim)
        write_plan(plan, out_dir / "plans" / f"plan-{k:02d}.json")
        pred = {"iteration_s": sim.iteration_s, "peak_gpu_bytes": sim.peak_gpu_bytes,
                "exposed_copy_s": sim.exposed_copy_s, **{f"layer_{k2}_s": v for k2, v in sim.layer_timings.items()}}
        if sim.status != "OK":
            rows.append(ValidationRow(label, seq, pol, pred, {}, status=f"predicted {sim.status}"))
            continue
        try:
            ex = Executor(plan, RunOptions(device=device, steps=steps))
            try:
                res = ex.run()
            finally:
                ex.close()
        except (MemoError, MemoryError) as e:
            rows.append(ValidationRow(label, seq, pol, pred, {}, status=f"failed: {str(e).splitlines()[0]}"))
            continue
        st = res.steady
        meas = {"iteration_s": st["iteration_s"], "exposed_copy_s": st.get("exposed_copy_s"),
                "peak_gpu_bytes": st["peak_allocated_bytes"] if res.meta["device_kind"] == "cuda" else None,
                "layer_forward_s": st.get("layer_forward_s"), "layer_backward_s": st.get("layer_backward_s")}
        mt = timeline_from_step(res.steps[-1], {"source": "measured", "plan": label})
        rows.append(ValidationRow(label, seq, pol, pred, meas, predicted_timeline=sim.timeline, measured_timeline=mt))
    if progress and plans:
        progress(len(plans), len(plans))
    return rows


def render_report(rows: list[ValidationRow], model: ModelConfig, profile: HardwareProfile, device_desc: str,
                  command: str, figure: str | None) -> tuple[str, dict]:
    ran = [r for r in rows if r.status == "ran"]
    it_err = [abs(e) for r in ran if (e := r.err("iteration_s", "iteration_s")) is not None]
    mem_err = [abs(e) for r in ran if (e := r.err("peak_gpu_bytes", "peak_gpu_bytes")) is not None]
    tau = kendall_tau([r.predicted["iteration_s"] for r in ran], [r.measured["iteration_s"] for r in ran])
    summary = {"plans": len(rows), "ran": len(ran),
               "median_abs_iteration_error": statistics.median(it_err) if it_err else None,
               "max_abs_iteration_error": max(it_err) if it_err else None,
               "median_abs_peak_memory_error": statistics.median(mem_err) if mem_err else None,
               "max_abs_peak_memory_error": max(mem_err) if mem_err else None,
               "kendall_tau_iteration": tau}

    def pct(v):
        return "—" if v is None else f"{100 * v:+.1f}%"

    def t(v):  # a plan predicted OOM has no predicted times
        return "—" if v is None else fmt_time(v)

    def b(v):
        return "—" if v is None else fmt_bytes(v)

    lines = [f"# Simulator validation: {model.name} on {device_desc}", "",
             f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
             f"- machine: {platform.machine()} {platform.node()}; device: {device_desc}",
             f"- profile: {profile.name} ({profile.path}); calibration provenance: "
             f"{profile.provenance.get('date', 'n/a')} {profile.provenance.get('command', '')}",
             f"- command: `{command}`",
             f"- model: {model.layers} layers, h={model.hidden}, {model.heads} heads, ffn={model.ffn}, "
             f"vocab={model.vocab}, dtype {model.dtype}", "",
             "| plan | status | iteration predicted | measured | error | exposed copy predicted | measured | "
             "peak memory predicted | measured | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, m = r.predicted, r.measured
        lines.append(
            f"| {r.label} | {r.status} | {t(p['iteration_s'])} | "
            f"{fmt_time(m['iteration_s']) if m.get('iteration_s') else '—'} | {pct(r.err('iteration_s', 'iteration_s'))} | "
            f"{t(p['exposed_copy_s'])} | "
            f"{fmt_time(m['exposed_copy_s']) if m.get('exposed_copy_s') is not None else '—'} | "
            f"{b(p['peak_gpu_bytes'])} | "
            f"{fmt_bytes(m['peak_gpu_bytes']) if m.get('peak_gpu_bytes') else '—'} | "
            f"{pct(r.err('peak_gpu_bytes', 'peak_gpu_bytes'))} |")
    lines += ["", "## Summary", ""]
    for k, v in summary.items():
        lines.append(f"- {k}: {v if not isinstance(v, float) else round(v, 4)}")
    if not mem_err:
        lines.append("- peak memory: not compared (the device reports no allocator peak: a CPU run measures "
                     "process RSS, which the simulator's GPU memory model does not predict)")
    if figure:
        lines += ["", f"Worst case, predicted vs measured streams: ![]({figure})"]
    return "\n".join(lines) + "\n", summary


def validate(model: ModelConfig, profile: HardwareProfile, plans: list[tuple[int, Policy]], *, device: str,
             steps: int, out_dir: str | Path, report_path: str | Path | None, command: str,
             progress=None) -> tuple[Path, dict]:
    if not plans:
        raise ExecError("no plans to validate: give at least one sequence length and policy")
    out = Path(out_dir)
    rows = run_validation(model, profile, plans, device=device, steps=steps, out_dir=out, progress=progress)
    ran = [r for r in rows if r.status == "ran"]
    figure = None
    if ran:
        worst = max(ran, key=lambda r: abs(r.err("iteration_s", "iteration_s") or 0.0))
        fig = overlay_gantt(worst.predicted_timeline, worst.measured_timeline, out / "worst-gantt.png",
                            f"{worst.label}: predicted vs measured")
        figure = str(fig)
    dev = rows and ran and ran[0].measured_timeline.meta.get("device")
    text, summary = render_report(rows, model, profile, str(dev or device), command, figure)
    target = Path(report_path) if report_path else out / "validation.md"
    atomic_write_text(target, text)
    atomic_write_json(out / "validation.json", {"summary": summary, "rows": [
        {"plan": r.label, "status": r.status, "predicted": r.predicted, "measured": r.measured} for r in rows]})
    return target, summary
