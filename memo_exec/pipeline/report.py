"""The measured micro-batch pipeline of a ``1f1b`` / ``interleaved_1f1b`` run: per-stage rows and
the pipeline Gantt chart, beside the simulator's per-stage values where the plan carries them.

Input: the run's merged ``measured.json`` (every rank's last step, each from its own step start;
`memo_exec.report.write_rank_outputs`) and the plan. Stage s is rank ``pp = s`` of data-parallel
replica 0 with tp = cp = ulysses coordinate 0 (`memo_exec.sppo.report.stage_of_rank`).

Per stage:

- **iteration**: from the first action's start to the last action's end over all stages (the
  actions are the ``pipeline`` stream's ``fwd@c<chunk>.mb<k>`` / ``bwd@...`` spans);
- **busy**: the union of the stage's action spans less the compute stream's stalls inside them
  (MEMO's waits for a prefetch or an offload); **bubble** = 1 - busy / iteration;
- forward, backward and recompute time (the layers' compute spans, recompute inside the
  backward actions), **receive wait** (the ``p2p`` stream's waits for an activation or a
  gradient), offloaded bytes and the copy streams' busy time;
- **peak memory**: the largest memory sample of the stage's rank (device memory on CUDA, the
  process RSS on CPU);
- **ideal bubble**: (p - 1) / (v m + p - 1), the share of the iteration a stage idles when every
  chunk's forward and backward take the same time and transfers are free (Megatron-LM's bubble
  (p - 1) / (v m) of the ideal time, as a share of the whole);
- **simulated**: busy, bubble and peak of the stage from one simulation of the plan made for the
  report (its schedule, micro-batches and profile, or the run's ``--profile``; a plan's prediction
  carries no per-stage entry); "n/a" when the run used fewer layers than the plan.

The Gantt chart (``pipeline_gantt.png``): one band per stage with its actions (colour = micro-batch,
forward solid, backward hatched, recompute inside a backward outlined in black), its receive
waits and its offload / prefetch copies (colour = the micro-batch they belong to), the idle
compute time shaded.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from memo_exec.compare import busy_spans, spans_intersection, spans_length, union_spans
from memo_exec.sppo.report import stage_of_rank
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json, atomic_write_text, save_png
from memo_sim.timeline import Timeline

_TAG = re.compile(r"@c(\d+)\.mb(\d+)")


def tag_of(op: str) -> tuple[int, int] | None:
    """(chunk, micro-batch) of an op named ``...@c<chunk>.mb<k>``, else None."""
    m = _TAG.search(op)
    return (int(m.group(1)), int(m.group(2))) if m else None


def stage_timeline(measured: Timeline, plan) -> Timeline:
    """The run's events and memory with device = stage (replica 0, first TP/CP/Ulysses rank)."""
    ranks = stage_of_rank(plan.layout)
    ev = [dataclasses.replace(e, device=ranks[e.device]) for e in measured.events if e.device in ranks]
    mem = [dataclasses.replace(m, device=ranks[m.device]) for m in measured.memory
           if m.device in ranks and m.kind == "gpu"]
    return Timeline(ev, mem, dict(measured.meta))


def ideal_bubble(pp: int, vpp: int, m: int) -> float:
    """The equal-stage bubble as a share of the iteration: the simulator's one definition
    (`memo_sim.layout.schedule.ideal_bubble_fraction`, which `memo-sim simulate` prints)."""
    from memo_sim.layout.schedule import ideal_bubble_fraction  # noqa: PLC0415

    return ideal_bubble_fraction(pp, vpp, m)


def stage_rows(tl: Timeline, pp: int) -> list[dict]:
    actions = [e for e in tl.events if e.stream == "pipeline"]
    if not actions:
        raise MemoError("the run's timeline has no pipeline actions (fwd@c<chunk>.mb<k> spans): not a 1f1b / "
                        "interleaved_1f1b run")
    t0, t1 = min(e.start for e in actions), max(e.end for e in actions)
    it = t1 - t0
    rows = []
    for s in range(pp):
        mine = [e for e in tl.events if e.device == s]
        act = union_spans([(e.start, e.end) for e in mine if e.stream == "pipeline"])
        stalls = union_spans([(e.start, e.end) for e in mine if e.stream == "compute" and e.phase == "stall"])
        busy = spans_length(act) - spans_intersection(act, stalls)

        def total(pred) -> float:
            return spans_length(union_spans([(e.start, e.end) for e in mine if pred(e)]))

        peak = max((m.nbytes for m in tl.memory if m.device == s), default=None)
        rows.append({
            "stage": s, "iteration_s": it, "busy_s": busy, "bubble_fraction": 1 - busy / it if it > 0 else None,
            "forward_s": total(lambda e: e.stream == "pipeline" and e.phase == "pipe_fwd"),
            "backward_s": total(lambda e: e.stream == "pipeline" and e.phase == "pipe_bwd"),
            "recompute_s": total(lambda e: e.stream == "compute" and e.phase == "recompute"),
            "receive_wait_s": total(lambda e: e.stream == "p2p" and e.phase in ("p2p_fwd", "p2p_bwd")),
            "stall_s": spans_length(stalls),
            "offload_bytes": sum(e.nbytes for e in mine if e.stream == "d2h"),
            "copy_busy_s": {k: spans_length(busy_spans(Timeline(mine, [], {}), (k,))) for k in ("d2h", "h2d")},
            "micro_batches": len({tag_of(e.op) for e in mine if e.stream == "pipeline"}),
            "peak_bytes": peak})
    return rows


def simulated_stages(plan, layers_run: int):
    """The simulator's per-stage prediction for the plan: (stages or None, where they come from or
    why there are none, the simulated result or None): one simulation of the plan (schedule,
    micro-batches, ``plan.profile``) now; a plan's `memo_sim.plan.contract.Prediction` has no stages."""
    if layers_run != plan.model.layers:
        return None, f"the plan is for {plan.model.layers} layers, {layers_run} ran", None
    from memo_sim.api import load_profile, simulate  # noqa: PLC0415 - the simulator, to close the loop

    try:
        res = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy,
                       load_profile(plan.profile), schedule=plan.schedule, micro_batch=plan.micro_batch,
                       classifier_chunk_tokens=plan.classifier_chunk_tokens)
    except MemoError as e:
        return None, f"the plan could not be simulated ({e})", None
    source = f"memo-sim simulate of the plan on {plan.profile}"
    it = res.iteration_s
    out = []
    for s, st in enumerate(res.pipeline["stages"]):
        idle = st.get("idle_s")
        out.append({"busy_s": st.get("compute_busy_s"), "peak_bytes": st.get("peak_gpu_bytes"),
                    "bubble_fraction": idle / it if it and idle is not None else None,
                    # the activations the stage sends to host (MEMO's rule over its units: every one but its last two)
                    "offload_bytes": sum(e.nbytes for e in res.timeline.events if e.device == s and e.stream == "d2h")})
    return out, source, res


def compare(measured: Timeline, plan) -> tuple[dict, object]:
    """The per-stage comparison, and the simulated result it used (None where it could not simulate)."""
    lay = plan.layout
    m = plan.micro_batches
    tl = stage_timeline(measured, plan)
    rows = stage_rows(tl, lay.pp)
    sim, source, res = simulated_stages(plan, int(measured.meta.get("layers") or plan.model.layers))
    for r in rows:
        r["ideal_bubble_fraction"] = ideal_bubble(lay.pp, lay.vpp, m)
        r["simulated"] = sim[r["stage"]] if sim and r["stage"] < len(sim) else None
    busy = sum(r["busy_s"] for r in rows)
    it = rows[0]["iteration_s"] if rows else 0.0
    from memo_exec.report import dtype_not_comparable  # noqa: PLC0415 - report.md's rule, in its words

    return {"dtype_not_comparable": dtype_not_comparable(plan.model.dtype, measured.meta.get("dtype")),
            "plan": {"schedule": plan.schedule, "layout": lay.label(), "policy": plan.policy.label(),
                     "pp": lay.pp, "vpp": lay.vpp, "micro_batches": m, "micro_batch": plan.micro_batch,
                     "seq_tokens": plan.seq_tokens},
            "measured_device": measured.meta.get("device"), "stages": rows,
            "measured_bubble_fraction": 1 - busy / (len(rows) * it) if rows and it > 0 else None,
            "ideal_bubble_fraction": ideal_bubble(lay.pp, lay.vpp, m),
            "simulated_from": source,
            "simulated_bubble_fraction": (res.pipeline or {}).get("bubble_fraction") if sim else None}, res


def _f(v, fmt="{:.4f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def markdown(cmp: dict, memory_label: str) -> str:
    p = cmp["plan"]
    L = [f"# Pipeline ({p['schedule']}): per stage", "",
         f"Plan: {p['layout']} {p['policy']}, {p['micro_batches']} micro-batches of {p['micro_batch']} sequence(s) "
         f"of {p['seq_tokens']} tokens, {p['vpp']} chunk(s) per rank. Measured on "
         f"{cmp.get('measured_device') or 'this run'} (last step); simulated values from {cmp['simulated_from']}. "
         "Bubble: the share of the iteration (first action's start to the last one's end over all stages) the "
         "stage's compute is idle; ideal: (p - 1) / (v m + p - 1) for equal chunk times and free transfers.", "",
         "| stage | iteration s | busy s | bubble | ideal bubble | simulated busy s | simulated bubble | forward s "
         f"| backward s | recompute s | receive wait s | stall s | offload MiB | simulated offload MiB "
         f"| {memory_label} peak MiB | simulated peak MiB |", "|" + "---|" * 16]
    from memo_exec.report import dtype_cell, dtype_line  # noqa: PLC0415 - report.md's words

    why = cmp.get("dtype_not_comparable")  # the run's element width is not the plan's: bytes differ by the ratio
    for r in cmp["stages"]:
        sim = r.get("simulated") or {}
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        speak = None if sim.get("peak_bytes") is None else sim["peak_bytes"] / 2**20
        soff = None if sim.get("offload_bytes") is None else sim["offload_bytes"] / 2**20
        L.append(f"| {r['stage']} | {_f(r['iteration_s'])} | {_f(r['busy_s'])} | "
                 f"{_f(r['bubble_fraction'], '{:.1%}')} | {_f(r['ideal_bubble_fraction'], '{:.1%}')} | "
                 f"{_f(sim.get('busy_s'), '{:.4g}')} | {_f(sim.get('bubble_fraction'), '{:.1%}')} | {_f(r['forward_s'])} | "
                 f"{_f(r['backward_s'])} | {_f(r['recompute_s'])} | {_f(r['receive_wait_s'])} | {_f(r['stall_s'])} | "
                 f"{_f(r['offload_bytes'] / 2**20, '{:.2f}')} | {dtype_cell(_f(soff, '{:.2f}'), why, 'n/a')} | "
                 f"{_f(peak, '{:.1f}')} | {dtype_cell(_f(speak, '{:.1f}'), why, 'n/a')} |")
    if why and any((r.get("simulated") or {}).get("offload_bytes") is not None for r in cmp["stages"]):
        L += ["", dtype_line(why)]
    L += ["", f"Whole pipeline bubble: measured {_f(cmp['measured_bubble_fraction'], '{:.1%}')}, ideal "
          f"{_f(cmp['ideal_bubble_fraction'], '{:.1%}')}, simulated {_f(cmp['simulated_bubble_fraction'], '{:.1%}')}. "
          "Gantt chart: pipeline_gantt.png.", ""]
    return "\n".join(L)


def gantt_figure(tl: Timeline, pp: int, micro_batches: int, path: Path, title: str) -> Path:
    """Stages x time: actions by micro-batch (forward solid, backward hatched), recompute outlined,
    receive waits and copies (module docs)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    actions = [e for e in tl.events if e.stream == "pipeline"]
    t0 = min(e.start for e in actions)
    end = max(e.end for e in actions) - t0
    cmap = colormaps["tab10"]
    colour = lambda mb: cmap(mb % 10)  # noqa: E731
    rows = []
    for s in range(pp):
        rows += [(s, "compute"), (s, "p2p wait"), (s, "offload/prefetch")]
    fig = Figure(figsize=(14, 0.34 * len(rows) + 2.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for r, (s, label) in enumerate(rows):
        mine = [e for e in tl.events if e.device == s]
        if label == "compute":
            ax.broken_barh([(0, end)], (r - 0.45, 0.9), facecolors="#F4D6D6", edgecolors="none")  # idle = bubble
            for e in mine:
                if e.stream != "pipeline":
                    continue
                tag = tag_of(e.op)
                mb = tag[1] if tag else 0
                ax.broken_barh([(e.start - t0, e.duration)], (r - 0.4, 0.8), facecolors=colour(mb),
                               edgecolors="white", linewidth=0.3, hatch="////" if e.phase == "pipe_bwd" else None)
                if tag is not None and e.duration > end * 0.02:
                    ax.text(e.start - t0 + e.duration / 2, r, f"{tag[0]}.{tag[1]}", ha="center", va="center",
                            fontsize=6)
            rec = [(e.start - t0, e.duration) for e in mine if e.stream == "compute" and e.phase == "recompute"]
            if rec:
                ax.broken_barh(rec, (r - 0.25, 0.5), facecolors="none", edgecolors="black", linewidth=0.6)
        elif label == "p2p wait":
            ax.broken_barh([(e.start - t0, e.duration) for e in mine
                            if e.stream == "p2p" and e.phase in ("p2p_fwd", "p2p_bwd")], (r - 0.3, 0.6),
                           facecolors="#9E9E9E", edgecolors="none")
        else:
            for e in mine:
                if e.stream in ("d2h", "h2d"):
                    tag = tag_of(e.op)
                    ax.broken_barh([(e.start - t0, e.duration)], (r - 0.3, 0.6),
                                   facecolors=colour(tag[1]) if tag else "#9E9E9E", alpha=0.55, edgecolors="none",
                                   hatch="////" if e.stream == "h2d" else None)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {s} {label}" for s, label in rows], fontsize=7)
    ax.set_xlim(0, end * 1.02 if end > 0 else 1)
    ax.set_xlabel("time in the iteration (s)")
    ax.set_title(title, fontsize=9)
    # legend entries only for what is drawn: the micro-batches of the actions (colours repeat after 10)
    mbs = sorted({tag[1] % 10 for e in actions if (tag := tag_of(e.op)) is not None})
    handles = [Patch(facecolor=colour(k), label=f"micro-batch {k}" + (" (+10n)" if micro_batches > 10 else ""))
               for k in mbs]
    if any(e.phase == "pipe_bwd" for e in actions):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="backward (bars: chunk.mb)"))
    if any(e.stream == "compute" and e.phase == "recompute" for e in tl.events):
        handles.append(Patch(facecolor="none", edgecolor="black", label="recompute"))
    handles.append(Patch(facecolor="#F4D6D6", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(len(handles), 7),
              fontsize=7, frameon=False)
    fig.tight_layout()
    return save_png(fig, path, dpi=100)


def write_pipeline_outputs(run_dir: str | Path, plan_file: str | Path, profile: str | None = None) -> list[Path]:
    """Read ``run_dir/measured.json`` and the plan; write ``pipeline.json``, ``pipeline.md``,
    ``pipeline_gantt.png`` (measured) and ``pipeline_gantt_simulated.png`` (the simulator's, when it
    simulated the plan for the comparison). ``profile`` (the run's ``--profile``): the stages are
    predicted with it rather than with the plan's profile."""
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415

    out = Path(run_dir)
    plan = read_plan(plan_file)
    if profile is not None:
        plan.profile = profile
    if plan.schedule not in ("1f1b", "interleaved_1f1b"):
        raise MemoError(f"{plan_file}: schedule {plan.schedule}, not a micro-batch pipeline (1f1b, interleaved_1f1b)")
    measured = Timeline.read_json(out / "measured.json")
    cmp, sim = compare(measured, plan)
    label = "GPU memory" if measured.meta.get("device_kind") == "cuda" else "CPU memory (process RSS)"
    tl = stage_timeline(measured, plan)
    title = (f"{plan.model.name} {plan.policy.label()} {plan.layout.label()} {plan.schedule}, "
             f"{plan.micro_batches} micro-batches: measured (last step)")
    paths = [atomic_write_json(out / "pipeline.json", cmp, indent=1),
             atomic_write_text(out / "pipeline.md", markdown(cmp, label)),
             gantt_figure(tl, plan.layout.pp, plan.micro_batches, out / "pipeline_gantt.png", title)]
    if sim is not None and sim.timeline is not None:  # the simulator's Gantt of the same plan, beside it
        from memo_sim.report.figures import pipeline_gantt_figure  # noqa: PLC0415

        paths.append(pipeline_gantt_figure(sim.timeline, out / "pipeline_gantt_simulated.png"))
    return paths
