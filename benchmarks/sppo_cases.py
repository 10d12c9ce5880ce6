"""SPPO in the simulator: the what-if's answers at paper scale, the pipeline pictures, N swept.

Cases (all simulator only, A100-SXM4-80GB nodes, GPT-7B, batch 1):

1. ``whatif`` 1M tokens on 32 GPUs: every policy ranked (SPPO beside MEMO and the others), the
   heuristic's (SP, PP, N) against the exhaustive search's best, both simulated; the SPPO plan's
   pipeline Gantt chart and per-stage memory.
2. ``whatif`` 4M tokens on 128 GPUs: the same.
3. The paper's Figure 8 at a scale where the bubbles show: SP = 8, PP = 4, N = 8 at 1M, without
   and with multiplexed sequence partitioning.
4. N swept for SP = 8, PP = 4 at 1M: iteration time (analytic, simulated, and the closed form
   (p-1+N)/N·F(N)) and peak memory.

    python benchmarks/sppo_cases.py                 # writes reports/sppo-*.png and prints the numbers
    python benchmarks/sppo_cases.py --json out.json # also every number as JSON
    python benchmarks/sppo_cases.py --quick         # cases 3 and 4 only
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from memo_sim.api import get_model, load_profile, simulate
from memo_sim.cost.sppo import bubble_ratio, pipeline_time
from memo_sim.layout.parallel import Layout
from memo_sim.report.figures import pipeline_gantt_figure, stage_memory_figure, subseq_sweep_figure
from memo_sim.search.sppo import solve_point
from memo_sim.search.whatif import rank
from memo_sim.units import fmt_bytes, fmt_count, fmt_time

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
PROFILE = "a100-sxm4-80gb"


def _cand(c) -> dict:
    sim = c.simulated or {}
    return {"plan": f"{c.layout.label()} {c.policy.label()}", "status": c.status,
            "analytic_iteration_s": c.estimate.iteration_s, "simulated_iteration_s": sim.get("iteration_s"),
            "tgs": c.tgs, "mfu": sim.get("mfu", c.estimate.mfu),
            "peak_gpu_bytes": sim.get("peak_gpu_bytes", c.memory.peak_gpu_bytes),
            "host_bytes_per_node": sim.get("peak_host_bytes_per_node", c.memory.host_bytes_per_node)}


def whatif_case(name: str, gpus: int, seq: int) -> dict:
    model, profile = get_model("gpt-7b"), load_profile(PROFILE)
    t0 = time.perf_counter()
    res = rank(model, seq, gpus, profile)
    elapsed = time.perf_counter() - t0
    best = res.best
    sppo = [c for c in res.candidates if c.sppo is not None]
    sppo_ok = next((c for c in sppo if c.status == "OK"), None)
    out = {"case": name, "gpus": gpus, "seq_tokens": seq, "rank_elapsed_s": elapsed,
           "overall_best": _cand(best) if best else None, "sppo_summary": res.sppo_summary,
           "sppo_candidates": [_cand(c) | {"roles": c.sppo.get("roles"), "reason": c.alpha_note} for c in sppo],
           "candidates": len(res.candidates)}
    print(f"\n== {name}: gpt-7b, {fmt_count(seq)} tokens, {gpus} x A100-80GB (rank {elapsed:.1f} s, "
          f"{len(res.candidates)} candidates)")
    if best:
        b = out["overall_best"]
        print(f"overall best: {b['plan']} {fmt_time(b['simulated_iteration_s'] or b['analytic_iteration_s'])}, "
              f"TGS {b['tgs']:.1f}, peak GPU {fmt_bytes(b['peak_gpu_bytes'])}")
    sm = res.sppo_summary or {}
    for role in ("heuristic", "best"):
        d = sm.get(role)
        if d:
            print(f"SPPO {role}: {d['label']} (SP={d['sp']}, PP={d['pp']}, N={d['subseqs']}) {d['status']} "
                  f"analytic {fmt_time(d['analytic_iteration_s'])}, simulated "
                  f"{fmt_time(d['simulated_iteration_s']) if d['simulated_iteration_s'] else '-'}, "
                  f"TGS {d['simulated_tgs_tokens_per_gpu_s'] or d['analytic_tgs_tokens_per_gpu_s']:.1f}, "
                  f"peak GPU {fmt_bytes(d['peak_gpu_bytes'])} (stage {d['worst_stage']}, {d['peak_at']})")
    if sm.get("heuristic_tgs_fraction_of_best") is not None:
        print(f"heuristic / best SPPO throughput: {sm['heuristic_tgs_fraction_of_best']:.4f} ({sm['compared_on']}); "
              f"{sm['solved_points']} of {sm['space_size']} points solved")
    if sppo_ok is not None:
        r = simulate(model, sppo_ok.layout, 1, seq, sppo_ok.policy, profile)
        tag = f"sppo-7b-{fmt_count(seq).lower()}-{gpus}gpu"
        out["figures"] = [str(pipeline_gantt_figure(r.timeline, REPORTS / f"{tag}-gantt.png").relative_to(ROOT)),
                          str(stage_memory_figure(r.timeline, REPORTS / f"{tag}-memory.png").relative_to(ROOT))]
        out["sppo_best_simulated"] = {"iteration_s": r.iteration_s, "bubble_fraction": r.pipeline["bubble_fraction"],
                                      "n_ops": r.n_ops, "sim_wall_s": r.sim_wall_s,
                                      "detail": r.pipeline.get("detail")}
        print(f"figures: {', '.join(out['figures'])}")
    return out


def figure8_case() -> dict:
    model, profile = get_model("gpt-7b"), load_profile(PROFILE)
    lay, seq, n = Layout(tp=8, pp=4), 1 << 20, 8
    out = {"case": "figure 8", "layout": lay.label(), "seq_tokens": seq, "subseqs": n, "runs": []}
    print(f"\n== Figure 8: gpt-7b, 1M tokens, {lay.label()}, N = {n}")
    for mux in (False, True):
        pt = solve_point(model, lay, 1, seq, profile, n, "flops", mux)
        r = simulate(model, lay, 1, seq, pt.policy, profile)
        png = pipeline_gantt_figure(r.timeline, REPORTS / f"sppo-figure8{'-multiplexed' if mux else ''}.png")
        mem = stage_memory_figure(r.timeline, REPORTS / f"sppo-figure8{'-multiplexed' if mux else ''}-memory.png")
        out["runs"].append({"multiplex": mux, "iteration_s": r.iteration_s, "analytic_iteration_s":
                            pt.estimate.iteration_s, "bubble_fraction": r.pipeline["bubble_fraction"],
                            "peak_gpu_bytes": r.peak_gpu_bytes, "alphas": list(pt.policy.alphas),
                            "bounds": list(pt.policy.bounds),
                            "figures": [str(png.relative_to(ROOT)), str(mem.relative_to(ROOT))]})
        print(f"multiplex={mux}: simulated {fmt_time(r.iteration_s)} (analytic {fmt_time(pt.estimate.iteration_s)}), "
              f"idle {100 * r.pipeline['bubble_fraction']:.1f}% of stage time, peak GPU {fmt_bytes(r.peak_gpu_bytes)}; "
              f"{png.relative_to(ROOT)}")
    return out


def sweep_case() -> dict:
    model, profile = get_model("gpt-7b"), load_profile(PROFILE)
    lay, seq = Layout(tp=8, pp=4), 1 << 20
    pts = []
    print(f"\n== N swept: gpt-7b, 1M tokens, {lay.label()}")
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        pt = solve_point(model, lay, 1, seq, profile, n, "flops", False)
        d = {"subseqs": n, "status": pt.status, "analytic_iteration_s": pt.estimate.iteration_s,
             "peak_gpu_bytes": pt.memory.breakdown.peak_gpu_bytes,
             "gpu_capacity_bytes": pt.memory.breakdown.gpu_capacity_bytes,
             "bubble_ratio": bubble_ratio(lay.pp, n), "iteration_s": None,
             "closed_form_iteration_s": pipeline_time(lay.pp, n, max(pt.grid["stage_busy_s"]))}
        if pt.status == "OK":
            r = simulate(model, lay, 1, seq, pt.policy, profile, keep_timeline=False)
            d.update(status=r.status, iteration_s=r.iteration_s, peak_gpu_bytes=r.peak_gpu_bytes)
        pts.append(d)
        it = fmt_time(d["iteration_s"]) if d["iteration_s"] else "-"
        print(f"N={n:<4} {d['status']:<4} simulated {it}, analytic {fmt_time(d['analytic_iteration_s'])}, "
              f"(p-1+N)/N·F(N) {fmt_time(d['closed_form_iteration_s'])}, peak GPU {fmt_bytes(d['peak_gpu_bytes'])}")
    png = subseq_sweep_figure(pts, REPORTS / "sppo-subseqs.png",
                              "gpt-7b, 1M tokens, tp8+sp-pp4 on A100-80GB: SPPO against N")
    print(f"figure: {png.relative_to(ROOT)}")
    return {"case": "N sweep", "layout": lay.label(), "points": pts, "figure": str(png.relative_to(ROOT))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="Also write every number to this file.")
    ap.add_argument("--quick", action="store_true", help="Cases 3 and 4 only.")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}, {platform.node()} "
          f"({platform.machine()}, Python {platform.python_version()})")
    cases = []
    if not args.quick:
        cases.append(whatif_case("whatif 1M / 32 GPUs", 32, 1 << 20))
        cases.append(whatif_case("whatif 4M / 128 GPUs", 128, 4 << 20))
    cases.append(figure8_case())
    cases.append(sweep_case())
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
