"""METP against Megatron TP+SP and Ulysses: peak GPU memory and step time against sequence length.

One model on one node (default: an 8-layer slice of GPT-175B on 8 x A100-SXM4-80GB, the METP
paper's machine), four layouts of the 8 GPUs:

- Megatron TP+SP (tp8+sp), METP for the FFN (tp8+metp_ffn), METP for the FFN and the two-level
  MHA (tp8+metp), DeepSpeed-Ulysses with ZeRO-3 (uly8-z3).

At each length every layout gets its best plan among a set of activation policies (the what-if's
ranking on that layout: plans that fit first, then throughput), estimated and, where it fits,
simulated. Three policy sets: store all (every activation kept: the paper's comparison), what
Megatron-LM ships (store all, full recompute) and the same with MEMO (token-wise offload, its
alpha solved per layout). For each set the script writes a figure
(peak memory and step time per layout) and reports where METP's step time meets TP+SP's
(`memo_sim.search.seq_sweep.crossover_seq`) and from which length only METP fits.

    python benchmarks/metp_sweep.py                      # writes reports/metp-sweep.png
    python benchmarks/metp_sweep.py --json sweep.json    # also every point and crossover as JSON
    python benchmarks/metp_sweep.py --layers 4 --model llama-70b --seqs 8K,64K,512K
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from memo_sim.api import get_model, load_profile
from memo_sim.layout.parallel import Layout
from memo_sim.report.figures import seq_sweep_figure
from memo_sim.search.seq_sweep import crossover_seq, sweep_layouts
from memo_sim.units import fmt_bytes, fmt_count, fmt_time, parse_count

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SEQS = "4K,8K,16K,32K,64K,96K,128K,192K,256K,384K,512K,768K,1M"
MAIN_SET = "megatron-policies"  # the set drawn in reports/metp-sweep.png
REFINE_GRAIN = 4096  # tokens: the refined grid around a crossover (divisible as every layout needs)
POLICY_SETS = {
    "store-all": ("store_all",),
    "megatron-policies": ("store_all", "full_recompute"),
    "with-memo": ("store_all", "full_recompute", "memo"),
}


def layouts(gpus: int) -> dict[str, Layout]:
    return {
        f"TP+SP (tp{gpus}+sp)": Layout(tp=gpus),
        f"METP FFN (tp{gpus}+metp_ffn)": Layout(tp=gpus, tp_mode="metp_ffn"),
        f"METP FFN+MHA (tp{gpus}+metp)": Layout(tp=gpus, tp_mode="metp"),
        f"Ulysses (uly{gpus}-z3)": Layout(tp=1, ulysses=gpus, zero=3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-175b")
    ap.add_argument("--layers", type=int, default=8, help="layer slice of the model (0: all layers)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--profile", default="a100-sxm4-80gb")
    ap.add_argument("--seqs", default=DEFAULT_SEQS)
    ap.add_argument("--out", default=str(ROOT / "reports"))
    ap.add_argument("--json", dest="json_path", default=None, help="also write every point and crossover here")
    ap.add_argument("--all-figures", action="store_true",
                    help="a figure per policy set (default: only metp-sweep.png, the Megatron-LM policies)")
    args = ap.parse_args(argv)

    base = get_model(args.model)
    model = replace(base, layers=args.layers, name=f"{base.name}-{args.layers}-layers") if args.layers else base
    profile = load_profile(args.profile)
    seqs = [parse_count(s.strip(), "--seqs") for s in args.seqs.split(",") if s.strip()]
    lays = layouts(args.gpus)
    tpsp, metp_ffn, metp_full = list(lays)[:3]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = {"model": model.to_dict(), "profile": profile.name, "gpus": args.gpus, "seqs": seqs,
              "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} ({platform.machine()}, {platform.python_implementation()} "
                         f"{platform.python_version()})", "sets": {}}
    for name, policies in POLICY_SETS.items():
        points = sweep_layouts(model, lays, seqs, profile, policies)
        crossings = [crossover_seq(points, metp_full, tpsp), crossover_seq(points, metp_ffn, tpsp)]
        # refine each first meeting on a finer grid between the two swept lengths around it
        extra = set()
        for c in crossings:
            if c.time_seq is not None:
                lo = max([x for x in seqs if x <= c.time_seq], default=seqs[0])
                hi = min([x for x in seqs if x > c.time_seq], default=seqs[-1])
                step = max(REFINE_GRAIN, (hi - lo) // 8 // REFINE_GRAIN * REFINE_GRAIN)
                extra |= set(range(lo + step, hi, step)) - set(seqs)
        if extra:
            fine = sweep_layouts(model, {k: lays[k] for k in (tpsp, metp_ffn, metp_full)}, sorted(extra), profile,
                                 policies)
            points = sorted(points + fine, key=lambda p: (p.label, p.seq))
            crossings = [crossover_seq(points, metp_full, tpsp), crossover_seq(points, metp_ffn, tpsp)]
        title = (f"{model.name} on {args.gpus} x {profile.gpu.model}: best of {', '.join(policies)} per layout")
        png = None
        if name == MAIN_SET or args.all_figures:
            fname = "metp-sweep.png" if name == MAIN_SET else f"metp-sweep-{name}.png"
            png = seq_sweep_figure(points, out / fname, title, crossings[:1], reference=tpsp)
        result["sets"][name] = {"policies": list(policies), "figure": png.name if png else None,
                                "points": [p.to_dict() for p in points],
                                "crossovers": [c.to_dict() for c in crossings]}
        print(f"== {name}: {', '.join(policies)}")
        for p in points:
            it = fmt_time(p.iteration_s) if p.iteration_s is not None else "-"
            print(f"{fmt_count(p.seq):>5} {p.label:<28} {p.policy:<18} {p.status:<5} peak {fmt_bytes(p.peak_gpu_bytes):>11} "
                  f"step {it:>10} exposed P2P {fmt_time(p.exposed_p2p_s)}")
        for c in crossings:
            at = fmt_count(int(round(c.time_seq))) if c.time_seq is not None else "none"
            only = fmt_count(c.only_a_fits_seq) if c.only_a_fits_seq else "never"
            print(f"crossover {c.a} vs {c.b}: step times meet at {at}; only {c.a} fits from {only} ({c.note})")
        if png:
            print(f"figure: {png}")
    result["elapsed_s"] = time.perf_counter() - t0
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json_path}")
    print(f"done in {result['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
