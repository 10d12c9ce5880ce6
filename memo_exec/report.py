"""Outputs of ``memo-exec run``: measured.json (a Timeline), trace.json (Chrome trace) and
report.md with PNG figures, setting the measurement beside plan.predicted and plan.layer_timings_s.

Relative error = (measured - predicted) / predicted. With ``--layers N`` smaller than the plan's
model the whole-iteration predictions are not comparable; the report then re-runs the
simulator's analytic estimate (`memo_sim.search.estimate`, `memo_sim.cost.memory`) for N layers
and says so, while per-layer numbers are compared with the plan's own.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from memo_exec.measure import timeline_from_step
from memo_exec.runner import RunResult
from memo_sim.cost.flops import mfu
from memo_sim.fileio import atomic_write_bytes, atomic_write_text
from memo_sim.report.chrome_trace import write_chrome_trace
from memo_sim.report.figures import gantt_figure, memory_figure
from memo_sim.timeline import Timeline

GiB = 2**30


def _rel(meas, pred):
    if meas is None or pred is None or not isinstance(pred, (int, float)) or pred == 0:
        return None
    return (meas - pred) / pred


def _peak_flops(profile: str, dtype: str) -> tuple[float | None, str]:
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        return load_profile(profile).peak(dtype), f"profile {profile}"
    except MemoError as e:
        return None, f"no peak FLOP/s ({e})"


def predictions_for_run(res: RunResult) -> tuple[dict, str]:
    """plan.predicted, or (with --layers) the simulator's analytic estimate for the layers run."""
    plan, n = res.plan, res.meta["layers"]
    if n == plan.model.layers:
        return dict(plan.predicted), "plan.predicted"
    try:
        from memo_sim.cost.memory import memory_breakdown  # noqa: PLC0415
        from memo_sim.profile.loader import load_profile  # noqa: PLC0415
        from memo_sim.search.estimate import estimate_iteration  # noqa: PLC0415

        prof = load_profile(plan.profile)
        m = dataclasses.replace(plan.model, layers=n)
        est = estimate_iteration(m, plan.layout, plan.batch, plan.seq_tokens, plan.policy, prof,
                                 plan.classifier_chunk_tokens)
        mem = memory_breakdown(m, plan.layout, plan.batch, plan.seq_tokens, plan.policy, prof,
                               plan.classifier_chunk_tokens)
        return ({"iteration_s": est.iteration_s, "mfu": est.mfu, "tgs_tokens_per_gpu_s": est.tgs,
                 "exposed_copy_s": est.exposed_copy_s, "peak_gpu_bytes": mem.peak_gpu_bytes,
                 "peak_host_bytes_per_node": mem.host_bytes_per_node},
                f"memo_sim analytic estimate re-run for {n} of the plan's {plan.model.layers} layers")
    except Exception as e:  # noqa: BLE001 - the comparison is optional; the report says why it is missing
        return {}, (f"not comparable: the plan is for {plan.model.layers} layers, {n} were run, and the "
                    f"simulator estimate could not be re-run ({type(e).__name__}: {e})")


def comparison_rows(res: RunResult) -> tuple[list[dict], str]:
    st = res.steady
    pred, source = predictions_for_run(res)
    lt = res.plan.layer_timings_s or {}
    tokens = res.meta["tokens"]
    it = st.get("iteration_s")
    meas_mfu = None
    if res.meta["device_kind"] == "cuda" and it:
        peak, _ = _peak_flops(res.plan.profile, res.plan.model.dtype)
        if peak:
            m = dataclasses.replace(res.plan.model, layers=res.meta["layers"])
            meas_mfu = mfu(m, res.plan.batch, res.plan.seq_tokens, it, 1, peak)
    peak_mem = st.get("peak_allocated_bytes") if res.meta["device_kind"] == "cuda" else None
    rows = [
        ("iteration time", "s", pred.get("iteration_s"), it, source),
        ("MFU", "", pred.get("mfu"), meas_mfu, source),
        ("tokens per GPU per second", "tok/s", pred.get("tgs_tokens_per_gpu_s"), tokens / it if it else None, source),
        ("layer forward", "s", lt.get("forward"), st.get("layer_forward_s"), "plan.layer_timings_s"),
        ("layer backward", "s", lt.get("backward"), st.get("layer_backward_s"), "plan.layer_timings_s"),
        ("layer recompute", "s", lt.get("recompute"), st.get("layer_recompute_s"), "plan.layer_timings_s"),
        ("layer offload (d2h)", "s", lt.get("offload"), st.get("layer_offload_s"), "plan.layer_timings_s"),
        ("layer prefetch (h2d)", "s", lt.get("prefetch"), st.get("layer_prefetch_s"), "plan.layer_timings_s"),
        ("exposed copy time", "s", pred.get("exposed_copy_s"), st.get("exposed_copy_s"), source),
        ("peak GPU memory (allocated)", "bytes", pred.get("peak_gpu_bytes"), peak_mem, source),
        ("pinned host memory", "bytes", pred.get("peak_host_bytes_per_node"), res.meta.get("pinned_host_bytes"),
         source),
    ]
    out = [{"quantity": q, "unit": u, "predicted": p, "measured": m, "rel_error": _rel(m, p), "predicted_from": s}
           for q, u, p, m, s in rows]
    return out, source


def _fmt(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if unit == "bytes":
        return f"{v / GiB:.3f} GiB"
    if unit == "s":
        return f"{v * 1e3:.3f} ms" if abs(v) < 1 else f"{v:.3f} s"
    if unit == "tok/s":
        return f"{v:,.0f}"
    if unit == "":
        return f"{v:.3f}"
    return f"{v}"


def _atomic_png(draw, path: Path) -> Path:
    """Let ``draw(tmp_path)`` write a PNG next to ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        draw(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def layer_figure(res: RunResult, rows: list[dict], path: Path) -> Path:
    fig = Figure(figsize=(11, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    sel = [r for r in rows if r["quantity"].startswith("layer ")]
    labels = [r["quantity"].replace("layer ", "") for r in sel]
    xs = range(len(sel))
    pv = [(r["predicted"] or 0) * 1e3 for r in sel]
    mv = [(r["measured"] or 0) * 1e3 for r in sel]
    ax1.bar([x - 0.2 for x in xs], pv, 0.4, label="predicted", color="#8C8C8C")
    ax1.bar([x + 0.2 for x in xs], mv, 0.4, label="measured", color="#4C72B0")
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(labels, fontsize=8)
    ax1.set_ylabel("ms per layer")
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)
    ax1.set_title("one layer: predicted vs measured", fontsize=10)
    last = res.summaries[-1]["per_layer"]
    for phase, color in (("fwd", "#4C72B0"), ("bwd", "#DD8452"), ("recompute", "#C44E52"), ("offload", "#55A868"),
                         ("prefetch", "#8172B3")):
        d = last.get(phase) or {}
        if d:
            ax2.plot([int(k) for k in d], [v * 1e3 for v in d.values()], marker="o", ms=3, label=phase, color=color)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("ms")
    ax2.set_title(f"measured per layer (step {res.summaries[-1]['step']})", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def write_outputs(res: RunResult, out_dir: str | Path, plan_path: str | Path | None = None) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, source = comparison_rows(res)
    meta = dict(res.meta)
    meta.update({"plan_file": str(plan_path) if plan_path else None, "steady_state": res.steady,
                 "steps": res.summaries, "comparison": rows, "predicted": res.plan.predicted,
                 "layer_timings_s": res.plan.layer_timings_s, "middle_layer": meta["layers"] // 2})
    tl: Timeline = timeline_from_step(res.steps[-1], meta)
    paths = {"measured": tl.write_json(out / "measured.json"), "trace": write_chrome_trace(tl, out / "trace.json")}
    figs = {}
    try:
        figs["timeline"] = _atomic_png(lambda p: gantt_figure(tl, p), out / "timeline.png")
    except Exception as e:  # noqa: BLE001 - a figure problem must not lose the measurements
        figs["timeline_error"] = f"{type(e).__name__}: {e}"
    try:
        figs["memory"] = _atomic_png(lambda p: memory_figure(tl, p), out / "memory.png")
    except Exception as e:  # noqa: BLE001
        figs["memory_error"] = f"{type(e).__name__}: {e}"
    figs["layers"] = layer_figure(res, rows, out / "layers.png")
    paths.update({k: v for k, v in figs.items() if isinstance(v, Path)})
    paths["report"] = atomic_write_text(out / "report.md", render_markdown(res, rows, source, figs, meta))
    return paths


def render_markdown(res: RunResult, rows: list[dict], source: str, figs: dict, meta: dict | None = None) -> str:
    m, p = (meta or res.meta), res.plan
    st = res.steady
    L = []
    L.append(f"# memo-exec run: {m['model']} — {m['policy']} — {m['seq_tokens']:,} tokens\n")
    L.append(f"- device: {m['device']}, dtype {m['dtype']}, attention backend {m['attention_backend']} "
             f"(asked: {m['attention_backend_requested']})")
    L.append(f"- plan: {m.get('plan_file') or '(in memory)'}; profile {p.profile}; layout {m['layout']}; "
             f"batch {p.batch}; classifier chunk {m['classifier_chunk_tokens']} tokens; data {m['data']}")
    if m["layers"] != m["plan_layers"]:
        L.append(f"- **ran {m['layers']} of the plan's {m['plan_layers']} layers (`--layers {m['layers']}`)**: "
                 f"per-layer numbers compare with the plan's; whole-iteration numbers use {source}.")
    else:
        L.append(f"- all {m['layers']} layers run")
    L.append(f"- steps: {len(res.summaries)}; steady state averages steps {st['steps_averaged']} "
             f"(step 0 includes warm-up when more than one step ran)")
    if m["device_kind"] != "cuda":
        L.append("- **CPU run**: times are host times of CPU kernels and thread copies, memory is the process RSS; "
                 "they test the executor, not the GPU predictions. MFU is not computed on a CPU.")
    L.append("")
    L.append("## Measured vs predicted\n")
    L.append("| quantity | predicted | measured | rel. error | predicted from |")
    L.append("|---|---:|---:|---:|---|")
    for r in rows:
        re_ = "—" if r["rel_error"] is None else f"{r['rel_error'] * 100:+.1f}%"
        L.append(f"| {r['quantity']} | {_fmt(r['predicted'], r['unit'])} | {_fmt(r['measured'], r['unit'])} | "
                 f"{re_} | {r['predicted_from']} |")
    L.append("")
    L.append("Relative error = (measured − predicted) / predicted. Layer times are sums of the compute-stream ops "
             "of one layer (stalls excluded), averaged over layers; offload/prefetch are the copy-stream spans of "
             "one layer; exposed copy time is the time the compute stream waited on copy events in the whole "
             "iteration.")
    if m["device_kind"] == "cuda":
        L.append(f"Peak reserved by the caching allocator: {_fmt(st['peak_reserved_bytes'], 'bytes')}.")
    else:
        L.append(f"Peak process RSS on the CPU (not comparable with GPU memory): "
                 f"{_fmt(st['peak_allocated_bytes'], 'bytes')}.")
    L.append("")
    L.append("## Steps\n")
    L.append("| step | loss | iteration | exposed copy | peak memory |")
    L.append("|---:|---:|---:|---:|---:|")
    for s in res.summaries:
        L.append(f"| {s['step']} | {s['loss']:.5f} | {_fmt(s['iteration_s'], 's')} | {_fmt(s['exposed_copy_s'], 's')} | "
                 f"{_fmt(s['peak_allocated_bytes'], 'bytes')} |")
    L.append("")
    last = res.summaries[-1]
    L.append("## Streams (last step)\n")
    L.append("| stream | busy |")
    L.append("|---|---:|")
    for k, v in sorted(last["stream_busy_s"].items()):
        L.append(f"| {k} | {_fmt(v, 's')} |")
    if last["non_layer_s"]:
        L.append("")
        L.append("Outside the layers (compute): " + ", ".join(f"{k} {_fmt(v, 's')}" for k, v in
                                                             sorted(last["non_layer_s"].items())))
    L.append("")
    L.append("## Memory\n")
    pd = m.get("policy_detail", {})
    if "offload_tokens" in pd:
        L.append(f"- offload: {pd['offloaded_layers']} layers; per layer {pd['layer_offload_bytes'] / GiB:.4f} GiB "
                 f"({', '.join(pd['whole'])} whole; {', '.join(pd['split'])}: first {pd['offload_tokens']} of "
                 f"{pd['tokens']} tokens); pinned pool {m.get('pinned_host_bytes', 0) / GiB:.4f} GiB")
    L.append(f"- executor's own estimate before allocating: {m['memory_estimate_total_bytes'] / GiB:.3f} GiB "
             f"(" + ", ".join(f"{k} {v / GiB:.3f}" for k, v in m["memory_estimate_bytes"].items()) + ")")
    mp = m.get("memory_plan")
    if mp:
        L.append(f"- memory plan: arena {mp['arena_bytes'] / GiB:.4f} GiB (offsets x{mp['offset_scale']} for the "
                 f"executor's dtype); placed: " + "; ".join(f"{ph}: {', '.join(n)}" for ph, n in mp["placed"].items()))
        if mp["plan_names_not_placed"]:
            L.append("- plan names this executor accepts but does not place: " +
                     "; ".join(f"{k} ({v})" for k, v in mp["plan_names_not_placed"].items()))
    else:
        L.append("- memory plan: none (every scratch tensor from the caching allocator)")
    L.append("- through the caching allocator:")
    for line in m.get("caching_allocator", []):
        L.append(f"  - {line}")
    L.append("")
    L.append("## Figures\n")
    for key, title in (("timeline", "Streams over the middle layers (last step)"), ("memory", "Memory over the step"),
                       ("layers", "Per-layer times")):
        if key in figs and isinstance(figs[key], Path):
            L.append(f"![{title}]({figs[key].name})\n")
        elif f"{key}_error" in figs:
            L.append(f"- {title}: not drawn ({figs[key + '_error']})")
    L.append("")
    L.append("Files: `measured.json` (memo-timeline, source=measured, last step), `trace.json` (open in "
             "https://ui.perfetto.dev).")
    return "\n".join(L) + "\n"
