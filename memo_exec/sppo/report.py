"""The measured SPPO pipeline against the simulator's: Gantt charts, bubbles, offload exposure and
memory per stage.

Input: the merged per-rank timeline a distributed run writes (``measured.json``: every rank's
last step, each from its own step start) and the plan. The prediction is the plan simulated
in-process through `memo_sim.api` for the layers the run used, with its schedule and micro-batch
(``summary.json``, ``timeline.json`` and ``pipeline_gantt.png`` in ``simulated_pipeline/``, as
``memo-sim simulate`` writes them). The run's timeline is rewritten as a pipeline timeline (device
= stage, ``meta.pipeline``; ``pipeline_measured.json``) and drawn into
``measured_pipeline/pipeline_gantt.png``: both charts come from the simulator's
`memo_sim.report.figures.pipeline_gantt_figure`, so they read alike.

Per stage (rank ``stage`` of data-parallel replica 0):

- **bubble**: the share of the iteration the stage's compute stream is idle: 1 - busy /
  iteration, busy being the union of its compute spans less the prefetch stalls inside them, the
  iteration the latest end over all stages (the simulator's ``idle_s`` / iteration, its bubble);
- **receive wait**: time blocked on the neighbour's activations or gradients (the ``p2p`` spans);
- **offload exposure**: the prefetch stalls (compute waiting for a unit's prefetch) against the
  simulated exposed copy time; per subsequence (`subsequence_rows`), the offloaded bytes and the
  copy time outside the stage's compute, measured and simulated (its ``timeline.json``), and the
  measured prefetch stalls inside each subsequence's backward;
- **peak memory**: the measured peak against the simulated peak of the stage's GPU; on CUDA both
  are device memory; a CPU run measures the process RSS (model, activations and host pool in one
  address space), a different quantity, labelled so and not compared (`measured_peak_kind`).

Absolute times differ where the run's device is not the plan's profile (a CPU run of a GPU plan);
the bubble shares are the comparable numbers.

Command line: ``python -m memo_exec.sppo.report RUN_DIR PLAN.json [--layers N]``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from memo_exec.compare import busy_spans, spans_intersection, spans_length
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json, atomic_write_text
from memo_sim.layout.parallel import Layout
from memo_sim.timeline import Timeline

STAGE_STREAMS = ("compute", "comm", "p2p", "d2h", "h2d")


def stage_of_rank(layout: Layout) -> dict[int, int]:
    """Rank -> stage for the ranks of data-parallel replica 0 (one rank per stage)."""
    from memo_exec.distributed.context import coords_of  # noqa: PLC0415

    out = {}
    for r in range(layout.gpus):
        c = coords_of(r, layout)
        if c["dp"] == 0 and c["tp"] == 0 and c["cp"] == 0 and c["ulysses"] == 0:
            out[r] = c["pp"]
    return out


def measured_pipeline(measured: Timeline, plan) -> Timeline:
    """The run's timeline as the simulator's pipeline timeline: device = stage, the stalls left
    out of the bars (they are counted in `stage_rows`)."""
    ranks = stage_of_rank(plan.layout)
    ev = [dataclasses.replace(e, device=ranks[e.device]) for e in measured.events
          if e.device in ranks and e.stream in STAGE_STREAMS and e.phase != "stall"]
    ev.sort(key=lambda e: (e.device, e.start, e.stream))
    mem = [dataclasses.replace(m, device=ranks[m.device]) for m in measured.memory if m.device in ranks]
    pol = plan.policy
    meta = {"source": "measured", "model": plan.model.name, "layout": plan.layout.label(), "policy": pol.label(),
            "seq_tokens": plan.seq_tokens, "device": measured.meta.get("device"),
            "pipeline": {"pp": plan.layout.pp, "subseqs": pol.subseqs, "multiplex": pol.multiplex,
                         "stages": [{"stage": s} for s in range(plan.layout.pp)]}}
    return Timeline(ev, mem, meta)


def stage_rows(tl: Timeline, stalls: Timeline | None = None) -> list[dict]:
    """Per stage of a pipeline timeline: busy compute, bubble share, receive wait, stalls, copies, peak."""
    pp = len(tl.meta["pipeline"]["stages"])
    end = max((e.end for e in tl.events), default=0.0)
    rows = []
    for s in range(pp):
        mine = Timeline([e for e in tl.events if e.device == s], [], {})
        comp = busy_spans(mine, ("compute",))
        st = [] if stalls is None else busy_spans(
            Timeline([dataclasses.replace(e, phase="x") for e in stalls.events
                      if e.device == s and e.phase == "stall"], [], {}), ("compute",))
        stalled = spans_intersection(comp, st)
        busy = spans_length(comp) - stalled
        peak = max((m.nbytes for m in tl.memory if m.device == s), default=None)
        rows.append({"stage": s, "iteration_s": end, "compute_busy_s": busy,
                     "bubble_fraction": 1 - busy / end if end else None,
                     "receive_wait_s": spans_length(busy_spans(mine, ("p2p",))), "prefetch_stall_s": stalled,
                     "offload_bytes": sum(e.nbytes for e in mine.events if e.stream == "d2h"),
                     "copy_busy_s": {k: spans_length(busy_spans(mine, (k,))) for k in ("d2h", "h2d")},
                     "peak_bytes": peak})
    return rows


def subsequence_of(op: str) -> int | None:
    """The subsequence an op belongs to from its piece tag (``...@s<k>`` or ``...@s<k>.<m>``, the
    executor's and the simulator's names alike), or None."""
    tag = op.rpartition("@")[2] if "@" in op else ""
    if not tag.startswith("s"):
        return None
    head = tag[1:].split(".")[0]
    return int(head) if head.isdigit() else None


def subsequence_rows(tl: Timeline, stages: int, stalls: Timeline | None = None) -> list[dict]:
    """Per stage and subsequence: offloaded bytes, copy time (d2h + h2d) not under the stage's
    compute (the same measure on both sides) and, on the measured side, the compute stream's
    prefetch stalls inside that subsequence's backward."""
    rows = []
    for st in range(stages):
        mine = [e for e in tl.events if e.device == st]
        comp = busy_spans(Timeline(mine, [], {}), ("compute",))
        subs = sorted({k for e in mine if (k := subsequence_of(e.op)) is not None})
        stall_ev = [] if stalls is None else [e for e in stalls.events if e.device == st and e.phase == "stall"]
        bwd = [e for e in mine if e.stream == "compute" and e.op.startswith("stage_bwd@")]
        for k in subs:
            copies = [e for e in mine if e.stream in ("d2h", "h2d") and subsequence_of(e.op) == k]
            cs = busy_spans(Timeline(copies, [], {}), ("d2h", "h2d"))
            spans = [(b.start, b.end) for b in bwd if subsequence_of(b.op) == k]
            stall = sum(spans_intersection([(e.start, e.end)], spans) for e in stall_ev) if spans else None
            rows.append({"stage": st, "subsequence": k, "offload_bytes": sum(e.nbytes for e in copies
                                                                            if e.stream == "d2h"),
                         "copy_busy_s": spans_length(cs), "copy_exposed_s": spans_length(cs) - spans_intersection(cs, comp),
                         "prefetch_stall_s": stall})
    return rows


def _with_stage_devices(measured: Timeline, plan) -> Timeline:
    ranks = stage_of_rank(plan.layout)
    return Timeline([dataclasses.replace(e, device=ranks[e.device]) for e in measured.events if e.device in ranks],
                    [], {})


def _bubble(rows: list[dict]) -> float | None:
    """The whole pipeline's idle share: 1 - sum of busy / (stages x iteration)."""
    if not rows or not rows[0]["iteration_s"]:
        return None
    return 1 - sum(r["compute_busy_s"] for r in rows) / (len(rows) * rows[0]["iteration_s"])


def measured_peak_kind(measured: Timeline) -> str:
    """What the measured peak is: a CPU run's memory samples are the process RSS (the model, the
    activations and the host pool together, plus the Python process), which is not the quantity
    the simulator predicts (the GPU's allocated bytes); a CUDA run's are the device's."""
    dev = str(measured.meta.get("device") or "")
    return "process RSS" if dev.startswith("cpu") else "device memory (allocated)"


def compare(measured: Timeline, plan, sim: dict | None, sim_tl: Timeline | None = None) -> dict:
    """Measured per-stage and per-subsequence rows beside the simulator's (``sim``: ``memo-sim
    simulate``'s summary.json, ``sim_tl`` its timeline.json; either may be None)."""
    tl = measured_pipeline(measured, plan)
    rows = stage_rows(tl, _with_stage_devices(measured, plan))
    stalls = _with_stage_devices(measured, plan)
    subs = subsequence_rows(tl, plan.layout.pp, stalls)
    from memo_exec.report import dtype_not_comparable  # noqa: PLC0415 - report.md's rule, in its words

    out = {"dtype_not_comparable": dtype_not_comparable(plan.model.dtype, measured.meta.get("dtype")),
           "plan": {"layout": plan.layout.label(), "policy": plan.policy.label(), "seq_tokens": plan.seq_tokens,
                    "bounds": list(plan.policy.bounds), "alphas": [float(a) for a in plan.policy.alphas]},
           "measured_device": measured.meta.get("device"), "measured_peak": measured_peak_kind(measured),
           "stages": rows,
           "measured_bubble_fraction": _bubble(rows), "subsequences": subs}
    if sim_tl is not None:
        pred = {(r["stage"], r["subsequence"]): r for r in subsequence_rows(sim_tl, plan.layout.pp)}
        for r in subs:
            q = pred.get((r["stage"], r["subsequence"]))
            r["simulated"] = None if q is None else {"offload_bytes": q["offload_bytes"],
                                                      "copy_busy_s": q["copy_busy_s"],
                                                      "copy_exposed_s": q["copy_exposed_s"]}
    pipe = (sim or {}).get("pipeline")
    if pipe:
        it = sim["iteration_s"]
        for r, st in zip(rows, pipe["stages"]):
            r["simulated"] = {"iteration_s": it, "compute_busy_s": st["compute_busy_s"],
                              "bubble_fraction": (st["idle_s"] / it) if it and st["idle_s"] is not None else None,
                              "peak_gpu_bytes": st["peak_gpu_bytes"]}
        out["simulated_bubble_fraction"] = pipe.get("bubble_fraction")
        out["simulated_exposed_copy_s"] = sim.get("exposed_copy_s")
        out["simulated_exposed_p2p_s"] = pipe.get("exposed_p2p_s")
        out["simulated_profile"] = plan.profile
    return out


def _f(v, fmt="{:.4f}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown(cmp: dict) -> str:
    kind = cmp.get("measured_peak") or "device memory (allocated)"
    L = ["# SPPO pipeline: measured against simulated", "",
         f"Plan: {cmp['plan']['layout']} {cmp['plan']['policy']}, {cmp['plan']['seq_tokens']} tokens, bounds "
         f"{cmp['plan']['bounds']}, alphas {[round(a, 4) for a in cmp['plan']['alphas']]}. Measured on "
         f"{cmp.get('measured_device') or 'this run'}, simulated on profile {cmp.get('simulated_profile', '—')}: "
         "absolute times differ where the devices differ; the bubble shares compare.", "",
         "| stage | measured iteration s | busy s | bubble | simulated bubble | receive wait s | prefetch stall s "
         f"| offload MiB | measured peak MiB ({kind}) | simulated GPU peak MiB |", "|" + "---|" * 10]
    from memo_exec.report import dtype_cell, dtype_line  # noqa: PLC0415 - report.md's words

    why = cmp.get("dtype_not_comparable")  # the run's element width is not the plan's: bytes differ by the ratio
    for r in cmp["stages"]:
        sim = r.get("simulated") or {}
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        speak = None if sim.get("peak_gpu_bytes") is None else sim["peak_gpu_bytes"] / 2**20
        L.append(f"| {r['stage']} | {_f(r['iteration_s'])} | {_f(r['compute_busy_s'])} | "
                 f"{_f(r['bubble_fraction'], '{:.1%}')} | {_f(sim.get('bubble_fraction'), '{:.1%}')} | "
                 f"{_f(r['receive_wait_s'])} | {_f(r['prefetch_stall_s'])} | "
                 f"{_f(r['offload_bytes'] / 2**20, '{:.2f}')} | {_f(peak, '{:.1f}')} | "
                 f"{dtype_cell(_f(speak, '{:.1f}'), why)} |")
    L += ["", f"Whole pipeline bubble: measured {_f(cmp.get('measured_bubble_fraction'), '{:.1%}')}, simulated "
          f"{_f(cmp.get('simulated_bubble_fraction'), '{:.1%}')}; simulated exposed copy time "
          f"{_f(cmp.get('simulated_exposed_copy_s'))} s. Gantt charts: measured_pipeline/pipeline_gantt.png, "
          "simulated_pipeline/pipeline_gantt.png.", ""]
    if why:
        L += [dtype_line(why), ""]
    if kind == "process RSS":
        L += ["The measured peak of a CPU run is the process RSS (the model, the activations and the host pool of "
              "the offloaded rows in one address space, plus PyTorch itself); the simulated peak is the GPU's "
              "allocated bytes. They are different quantities and are not compared.", ""]
    subs = cmp.get("subsequences") or []
    if subs:
        L += ["## Offload per subsequence", "",
              "Copy exposed: the offload and prefetch copies of the subsequence (d2h + h2d) outside the stage's "
              "compute, measured and simulated alike; prefetch stall: the measured time the stage's compute waited "
              "for that subsequence's prefetch inside its backward.", "",
              "| stage | subsequence | offload MiB | simulated MiB | copy s | simulated copy s | copy exposed s "
              "| simulated exposed s | prefetch stall s |", "|" + "---|" * 9]
        for r in subs:
            sim = r.get("simulated") or {}
            smib = None if sim.get("offload_bytes") is None else sim["offload_bytes"] / 2**20
            t = "{:.6f}"
            L.append(f"| {r['stage']} | {r['subsequence']} | {_f(r['offload_bytes'] / 2**20, '{:.3f}')} | "
                     f"{dtype_cell(_f(smib, '{:.3f}'), why)} | {_f(r['copy_busy_s'], t)} | "
                     f"{_f(sim.get('copy_busy_s'), t)} | "
                     f"{_f(r['copy_exposed_s'], t)} | {_f(sim.get('copy_exposed_s'), t)} | "
                     f"{_f(r['prefetch_stall_s'], t)} |")
        L.append("")
    return "\n".join(L)


def simulated_pipeline(plan, layers: int, out: Path) -> tuple[dict, Timeline]:
    """The plan simulated for ``layers`` layers in-process through `memo_sim.api` (its schedule and
    micro-batch as planned): ``out/summary.json``, ``out/timeline.json`` and ``out/pipeline_gantt.png``
    written as ``memo-sim simulate`` writes them; returns (summary, timeline)."""
    from memo_sim.api import load_profile, simulate  # noqa: PLC0415
    from memo_sim.report.figures import pipeline_gantt_figure  # noqa: PLC0415

    model = dataclasses.replace(plan.model, layers=layers)
    res = simulate(model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, load_profile(plan.profile),
                   schedule=plan.schedule, micro_batch=plan.micro_batch,
                   classifier_chunk_tokens=plan.classifier_chunk_tokens)
    summary = res.to_dict()
    summary.pop("sim_wall_s", None)
    res.timeline.write_json(out / "timeline.json")
    atomic_write_json(out / "summary.json", summary)
    if res.timeline.events:
        pipeline_gantt_figure(res.timeline, out / "pipeline_gantt.png")
    return summary, res.timeline


def write_pipeline_outputs(run_dir: str | Path, plan_file: str | Path, layers: int | None = None) -> list[Path]:
    """Read ``run_dir/measured.json`` and the plan; write the measured pipeline timeline, both Gantt
    charts (the simulator's own figure) and the comparison."""
    from memo_sim.api import read_plan  # noqa: PLC0415
    from memo_sim.report.figures import pipeline_gantt_figure  # noqa: PLC0415

    out = Path(run_dir)
    plan = read_plan(plan_file)
    if plan.schedule != "sppo":  # one stage (pp = 1) is a pipeline of one
        raise MemoError(f"{plan_file}: not an SPPO pipeline plan (policy {plan.policy.label()}, "
                        f"layout {plan.layout.label()}); plan with --policy sppo")
    if not (out / "measured.json").exists():
        raise MemoError(f"{out}: no measured.json; run `memo-exec run {plan_file} --nproc {plan.layout.gpus} "
                        f"--out {out}` first")
    measured = Timeline.read_json(out / "measured.json")
    n_layers = int(layers or measured.meta.get("layers") or plan.model.layers)
    mp = measured_pipeline(measured, plan)
    written = [mp.write_json(out / "pipeline_measured.json")]
    if mp.events:
        written.append(pipeline_gantt_figure(mp, out / "measured_pipeline" / "pipeline_gantt.png"))
    sim, sim_tl = simulated_pipeline(plan, n_layers, out / "simulated_pipeline")
    written.append(out / "simulated_pipeline" / "pipeline_gantt.png")
    cmp = compare(measured, plan, sim, sim_tl)
    written.append(atomic_write_json(out / "sppo_pipeline.json", cmp, indent=1))
    written.append(atomic_write_text(out / "sppo_pipeline.md", markdown(cmp)))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m memo_exec.sppo.report",
                                 description="SPPO pipeline Gantt charts and bubbles, measured against simulated")
    ap.add_argument("run_dir", help="the --out folder of `memo-exec run PLAN --nproc N`")
    ap.add_argument("plan", help="the plan.json the run executed")
    ap.add_argument("--layers", type=int, default=None, help="layers the run used (default: the run's)")
    a = ap.parse_args(argv)
    try:
        for p in write_pipeline_outputs(a.run_dir, a.plan, a.layers):
            print(f"wrote {p}")
    except MemoError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
