"""Validation against published runs: memo's simulated step time beside the step time real
clusters measured, for configurations from public papers and framework documentation.

Every row names its source (paper and table, or repository file and commit), the configuration,
the framework version whose mechanisms it runs with (`memo_sim.frameworks`), memo's prediction
(tier 2, the event simulator) and the published number; rows memo cannot express yet are listed
with the reason, never dropped. The published numbers are never used to set a constant: a row
moves only when a mechanism changes, and then every row is re-run.

    python benchmarks/published_runs.py [--out reports/published-runs.md] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

from memo_sim.engine.simulate import simulate
from memo_sim.frameworks import MECHANISMS
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

NARAYANAN = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM (SC21), Table 1; the same table is images/cases_april2021.png of NVIDIA/Megatron-LM "
             "README at commit 841f789f48")
KORTHIKANTI = ("Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models "
               "(arXiv 2205.05198), end-to-end iteration times; numbers and configurations as transcribed by "
               "calculon-ai/calculon, calculon/megatron/validation.py and validation/*.json")
MEGATRON_2024 = ("NVIDIA/Megatron-LM README at commit f2e5db402c (2024-07-15), images/model_table.png: weak "
                 "scaling on H100 GPUs, vocabulary 131,072, sequence 4096, --overlap-grad-reduce "
                 "--overlap-param-gather --tp-comm-overlap")
TORCHTITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, 2024-12-26), "
              "Grand Teton H100 96 GB HBM2e at 500 W")

# Narayanan et al. 2021, sec. 5 and eq. (3): all runs use a vocabulary of 51,200, s = 2048, fp16
# mixed precision and activation recomputation; the achieved FLOP/s count
# 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, so the measured step time is that over
# (achieved FLOP/s per GPU x GPUs).
VOCAB_2021, SEQ_2021 = 51200, 2048


def megatron_flops(batch: int, layers: int, hidden: int, seq: int = SEQ_2021, vocab: int = VOCAB_2021) -> float:
    return 96.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


@dataclass(frozen=True)
class Run:
    id: str
    source: str
    config: str  # the configuration in the source's words
    published_s: float  # measured step time (s)
    published_note: str  # how the step time follows from what the source states
    framework: str = "megatron@2021"
    profile: str = "dgx-a100-selene"
    # the configuration as memo runs it (None: not expressible, see ``why_not``)
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = VOCAB_2021
    seq: int = SEQ_2021
    tp: int = 1
    pp: int = 1
    dp: int = 1
    sp: bool = False
    zero: int = 0
    global_batch: int = 1
    micro_batch: int | None = None  # the pipeline's micro-batch (None: the replica's batch as one pass)
    vpp: int = 1  # model chunks per pipeline rank (> 1: the interleaved 1F1B schedule)
    schedule_source: str = ""  # where the micro-batch and the schedule come from
    policy: str = "full_recompute"
    dtype: str = "fp16"
    why_not: str | None = None  # why memo cannot express the run yet

    def model(self) -> ModelConfig:
        """The run's model as its framework version trains it: the model-state recipe is the
        framework's for the dtype (`Framework.for_model`; Megatron-LM keeps fp16 gradients under
        fp16, fp32 ones under bf16), as `memo-sim whatif --framework` applies it."""
        return get_framework(self.framework).for_model(
            ModelConfig(self.id, self.layers, self.hidden, self.heads, 4 * self.hidden, vocab=self.vocab,
                        dtype=self.dtype))

    def layout(self) -> Layout:
        return get_framework(self.framework).adapt(Layout(tp=self.tp, sp=self.sp, dp=self.dp, pp=self.pp,
                                                          vpp=self.vpp, zero=self.zero))

    def schedule(self) -> str | None:
        """The pipeline schedule (None: a single stage): 1F1B, interleaved when ``vpp`` > 1."""
        if self.pp == 1:
            return None
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"


def _narayanan(size, hidden, layers, heads, mp, gpus, batch, tflops):
    tp, pp = min(mp, 8), max(1, mp // 8)
    pub = megatron_flops(batch, layers, hidden) / (tflops * 1e12 * gpus)
    why = (f"PP = {pp}: Table 1 states neither the micro-batch size nor which runs used the interleaved "
           "schedule (or its chunks per GPU), and memo does not guess them") if pp > 1 else None
    return Run(f"megatron2021-{size}", NARAYANAN,
               f"GPT {size}: h={hidden}, {layers} layers, {heads} heads, TP {tp} x PP {pp} x DP {gpus // mp} "
               f"= {gpus} A100s, batch {batch}, s=2048, full recompute",
               pub, f"{tflops} TFLOP/s per GPU achieved (Table 1) x {gpus} GPUs over eq. (3)'s FLOPs",
               layers=layers, hidden=hidden, heads=heads, tp=tp, pp=pp, dp=gpus // mp, global_batch=batch,
               why_not=why)


def _korthikanti(size, hidden, layers, heads, tp, pp, gpus, batch, mode, seconds, vpp=1):
    full = mode == "full"
    sched = (f"micro-batch 1, " + (f"interleaved 1F1B with {vpp} chunks per GPU" if vpp > 1 else "1F1B")
             + f": calculon-ai/calculon validation/{size}_{'full' if full else 'seqsel'}.json (microbatch_size, "
             "pipeline_interleaving)") if pp > 1 else ""
    return Run(f"korthikanti-{size}-{mode}", KORTHIKANTI,
               f"GPT {size}: h={hidden}, {layers} layers, {heads} heads, TP {tp} x PP {pp} = {gpus} A100s, "
               f"batch {batch}, micro-batch {4 if pp == 1 else 1}, s=2048, "
               + ("full recompute, TP without SP" if full else "sequence parallelism + selective recompute")
               + (f"; {sched}" if sched else ""),
               seconds, "measured iteration time (s) as stated", framework="megatron@2022", layers=layers,
               hidden=hidden, heads=heads, tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=batch, sp=not full,
               micro_batch=1 if pp > 1 else None, vpp=vpp, schedule_source=sched,
               policy="full_recompute" if full else "selective_recompute")


def megatron2024_flops(batch: int, layers: int, hidden: int, seq: int = 4096, vocab: int = 131072) -> float:
    """megatron/training/training.py `num_floating_point_operations` at f2e5db402c for a GPT layer
    (no GQA, FFN 4h, no SwiGLU): 12·B·s·l·h²·((2 + s/h) + 4 + V/(2·l·h))."""
    return 12.0 * batch * seq * layers * hidden ** 2 * ((2 + seq / hidden) + 4 + vocab / (2 * layers * hidden))


def _megatron2024(size, heads, hidden, layers, tp, pp, dp, gpus, batch, tflops):
    pub = megatron2024_flops(batch, layers, hidden) / (tflops * 1e12 * gpus)
    why = (f"PP = {pp}: the README states neither the micro-batch size nor the pipeline schedule (interleaved "
           "or not), and memo does not guess them") if pp > 1 else None
    return Run(f"megatron2024-{size}", MEGATRON_2024,
               f"GPT {size}: h={hidden}, {layers} layers, {heads} heads, TP {tp} x PP {pp} x DP {dp} = {gpus} H100s, "
               f"batch {batch}, s=4096, V=131072 (untied in Megatron; memo ties the embedding), no recompute stated",
               pub, f"{tflops} TFLOP/s per GPU (the table) x {gpus} GPUs over training.py's FLOPs",
               framework="megatron", profile="h100-sxm5-80gb", layers=layers, hidden=hidden, heads=heads,
               vocab=131072, seq=4096, tp=tp, pp=pp, dp=dp, sp=True, global_batch=batch, policy="store_all",
               dtype="bf16", zero=1, why_not=why)


def _titan(config, tps, why, gpus=8, seq=8192, batch=2):
    # TPS/GPU -> step time: tokens per GPU per step (local batch x sequence) / TPS
    return Run(f"torchtitan-{config.split(':')[0]}", TORCHTITAN, config, batch * seq / tps,
               f"{tps} tokens/GPU/s at local batch {batch} x {seq} tokens", framework="torchtitan",
               profile="h100-sxm5-80gb", why_not=why)


_NO_H100_96 = "the H100 96 GB HBM2e at 500 W has no profile (h100-sxm5-80gb is the 700 W SXM5 part)"
RUNS: tuple[Run, ...] = (
    _narayanan("1.7B", 2304, 24, 24, 1, 32, 512, 137),
    _narayanan("3.6B", 3072, 30, 32, 2, 64, 512, 138),
    _narayanan("7.5B", 4096, 36, 32, 4, 128, 512, 142),
    _narayanan("18B", 6144, 40, 48, 8, 256, 1024, 135),
    _narayanan("39B", 8192, 48, 64, 16, 512, 1536, 138),
    _narayanan("76B", 10240, 60, 80, 32, 1024, 1792, 140),
    _narayanan("145B", 12288, 80, 96, 64, 1536, 2304, 148),
    _narayanan("310B", 16384, 96, 128, 128, 1920, 2160, 155),
    _narayanan("530B", 20480, 105, 128, 280, 2520, 2520, 163),
    _narayanan("1T", 25600, 128, 160, 512, 3072, 3072, 163),
    _korthikanti("22B", 6144, 48, 64, 8, 1, 8, 4, "full", 1.42),
    _korthikanti("22B", 6144, 48, 64, 8, 1, 8, 4, "selective", 1.10),
    _korthikanti("175B", 12288, 96, 96, 8, 8, 64, 64, "full", 18.13, vpp=3),
    _korthikanti("175B", 12288, 96, 96, 8, 8, 64, 64, "selective", 13.75, vpp=3),
    _korthikanti("530B", 20480, 105, 128, 8, 35, 280, 280, "full", 49.05, vpp=3),
    _korthikanti("530B", 20480, 105, 128, 8, 35, 280, 280, "selective", 37.83, vpp=3),
    _korthikanti("1T", 25600, 128, 160, 8, 64, 512, 512, "full", 94.42),
    _korthikanti("1T", 25600, 128, 160, 8, 64, 512, 512, "selective", 71.49),
    _megatron2024("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8),
    _megatron2024("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
    _megatron2024("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1),
    _megatron2024("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
    _megatron2024("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7),
    _megatron2024("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
    _megatron2024("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8),
    _megatron2024("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
    _megatron2024("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
    _titan("t1-fsdp: Llama 3.1 8B, FSDP over 8 GPUs, local batch 2 x 8192, selective AC (Table 1)", 5762,
           "torchtitan's selective (per-op) activation checkpointing is not a policy yet; " + _NO_H100_96),
    _titan("t1-fsdp-compile: the same with torch.compile (Table 1)", 6667,
           "torch.compile's kernel fusion and selective AC are not modelled; " + _NO_H100_96),
    _titan("t3-fsdp128: Llama 3.1 8B, FSDP over 128 GPUs, local batch 2 x 8192, selective AC (Table 3)", 5605,
           "selective AC is not a policy yet; " + _NO_H100_96, gpus=128),
    _titan("t2-cp1: Llama 3.1 8B, FSDP 8, CP 1, 32K, full AC, compile + Float8 (Table 2)", 3890,
           "torch.compile's kernel fusion is not modelled (Float8 GEMMs are: --precision fp8-tensorwise); " + _NO_H100_96, seq=32768, batch=1),
    _titan("t2-cp2: Llama 3.1 8B, FSDP 4, CP 2, 64K, full AC, compile + Float8 (Table 2)", 2540,
           "torch.compile's kernel fusion is not modelled (Float8 GEMMs are: --precision fp8-tensorwise); " + _NO_H100_96, seq=65536, batch=1),
    _titan("t2-cp4: Llama 3.1 8B, FSDP 2, CP 4, 128K, full AC, compile + Float8 (Table 2)", 1071,
           "torch.compile's kernel fusion is not modelled (Float8 GEMMs are: --precision fp8-tensorwise); " + _NO_H100_96, seq=131072, batch=1),
    _titan("t2-cp8: Llama 3.1 8B, FSDP 1, CP 8, 256K, full AC, compile + Float8 (Table 2)", 548,
           "torch.compile's kernel fusion is not modelled (Float8 GEMMs are: --precision fp8-tensorwise); " + _NO_H100_96, seq=262144, batch=1),
    _titan("t4-2d: Llama 3.1 70B, FSDP 32 x TP 8, local batch 16, full AC, compile + Float8 (Table 4)", 829,
           "torch.compile's kernel fusion is not modelled (Float8 GEMMs are: --precision fp8-tensorwise); " + _NO_H100_96, gpus=256, batch=16),
)


# Rows whose |error| exceeds 10%, with the mechanism memo is missing or the input it lacks (analysis
# of the row, not a correction: nothing here changes a prediction).
_H100 = ("the h100-sxm5-80gb profile's efficiency curves are assumptions, never calibrated: they put these "
         "GEMMs at 700-735 TFLOP/s (71-74% of the dense peak) and FlashAttention at 42% (forward) and 34% "
         "(backward) of it; `memo-exec calibrate` on an H100 replaces them. The error shrinks as the GEMMs "
         "grow (1.7B to 32B), as a too-optimistic small-GEMM efficiency would. --tp-comm-overlap is not "
         "modelled (it would make memo faster still).")
OUTLIERS = {"megatron2024-1.7B": _H100, "megatron2024-7.1B": _H100, "megatron2024-16B": _H100}

# Earlier runs of the same expressible rows, for the record (same profile, precision and layouts):
# (commit, date, what the simulator modelled, per-row error).
HISTORY = (
    ("119a926", "2026-11-23", "before the kernel and framework mechanisms: FlashAttention and overlapped gradient "
     "buckets for every framework (megatron@2021 did not exist)",
     {"megatron2021-1.7B": -0.369, "megatron2021-3.6B": -0.317, "megatron2021-7.5B": -0.226,
      "megatron2021-18B": -0.205, "korthikanti-22B-full": -0.135}),
)


STEPS = (
    ("119a926", "FlashAttention and overlapped gradients for every run: the 5 A100 rows at mean |error| 25.0%, "
     "max 36.9% (all too fast)"),
    ("c33b61a + ec3c7c9", "materialised softmax attention and gradients reduced after the backward "
     "(megatron@2021), the GEMM roofline and two-kernel backward GEMMs: 4 predicted at 0.7% / 1.3% (18B OOM: "
     "one pass)"),
    ("354ac84", "+ Megatron-LM's 2024 H100 table (no mechanism change): 8 predicted at 8.6% / 25.0%"),
    ("787d388", "optimizer step from Adam's and the mixed-precision wrapper's bytes: 8.2% / 24.4%"),
    ("701c26d", "selective_recompute policy (Korthikanti 22B selective row predicted): 9 at 8.0% / 24.4%"),
    ("8ab76be", "cross-entropy bytes per logit from each framework's loss kernels: 9 at 6.7% / 17.0%"),
    ("6c907c1", "the micro-batch pipelines price materialised attention and the serial gradient reduction; "
     "Korthikanti's six pipelined rows run at their stated micro-batch 1 and schedule (interleaved, 3 chunks "
     "per GPU, for 175B and 530B; 1F1B for 1T): 15 at 5.3% / 17.0% (the 9 earlier rows unchanged)"),
)


@dataclass(frozen=True)
class Result:
    run: Run
    predicted_s: float | None
    error: float | None  # predicted / published - 1
    status: str
    layout: str
    ablation: tuple[tuple[str, float | None], ...] = ()  # (mechanism switched to memo's default, error)


def _simulate(run: Run, lay: Layout):
    return simulate(run.model(), lay, run.global_batch // run.dp, run.seq, get_policy(run.policy),
                    load_profile(run.profile), keep_timeline=False, schedule=run.schedule(),
                    micro_batch=run.micro_batch)


def predict(run: Run, ablate: bool = True) -> Result:
    """memo's tier-2 step time for an expressible run (``batch`` = global batch / DP, one pass).
    ``ablate``: also the error with each of the framework's mechanisms switched to ``any``'s value."""
    if run.why_not:
        return Result(run, None, None, "not expressible yet", "")
    fw, model, lay = get_framework(run.framework), run.model(), run.layout()
    why = fw.why_not(lay) or check_layout(lay, model, lay.gpus, load_profile(run.profile).node_gpus, run.seq,
                                          run.global_batch // run.dp)
    if why:
        return Result(run, None, None, f"not expressible: {why}", lay.label())
    sim = _simulate(run, lay)
    if sim.status != "OK":
        if run.micro_batch is not None:
            return Result(run, None, None, f"{sim.status} in memo ({run.schedule()}, micro-batch {run.micro_batch})",
                          lay.label())
        return Result(run, None, None, f"{sim.status} in memo: the replica's {run.global_batch // run.dp} sequences "
                      "run as one pass (the source states no micro-batch size)", lay.label())
    ablation = []
    if ablate:
        default = get_framework("any").adapt(lay)
        for k, field in MECHANISMS.items():
            if getattr(lay, field) != getattr(default, field):
                alt = _simulate(run, replace(lay, **{field: getattr(default, field)}))
                ablation.append((k, alt.iteration_s / run.published_s - 1 if alt.status == "OK" else None))
    return Result(run, sim.iteration_s, sim.iteration_s / run.published_s - 1, "OK", lay.label(), tuple(ablation))


def summary(results: list[Result]) -> dict:
    errs = [abs(r.error) for r in results if r.error is not None]
    return {"rows": len(results), "predicted": len(errs), "sources": len({r.run.source for r in results}),
            "mean_abs_error": sum(errs) / len(errs) if errs else None, "max_abs_error": max(errs, default=None)}


def report(results: list[Result], wall_s: float) -> str:
    s = summary(results)
    lines = [
        "# Published runs: memo's predicted step time against measured ones", "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; machine: {platform.node()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {wall_s:.1f} s for all rows",
        "- command: `python benchmarks/published_runs.py` (tier 2: the event simulator; batch = global batch / DP; "
        "a pipelined run (PP > 1) in the 1F1B or interleaved 1F1B schedule at the micro-batch its source states, "
        "a single-stage run as one pass)",
        f"- {s['rows']} runs from {s['sources']} sources; memo predicts {s['predicted']}: mean |error| "
        + (f"{100 * s['mean_abs_error']:.1f}%, max |error| {100 * s['max_abs_error']:.1f}%"
           if s["predicted"] else "n/a"),
        "- error = predicted / published - 1 (negative: memo too fast). No constant was set from these numbers: "
        "a row moves only when a mechanism changes, and then all rows are re-run.", "",
        "| run | configuration | framework (mechanisms) | memo layout | published step | memo step | error | "
        "error with one mechanism switched to memo's default |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        fw = get_framework(r.run.framework)
        mech = ", ".join(f"{k}={v}" for k, v in fw.mechanisms)
        pred = f"{r.predicted_s:.3f} s" if r.predicted_s is not None else r.status
        err = f"{100 * r.error:+.1f}%" if r.error is not None else (r.run.why_not or "")
        abl = "; ".join(f"{k}: " + (f"{100 * e:+.1f}%" if e is not None else "OOM") for k, e in r.ablation)
        lines.append(f"| {r.run.id} | {r.run.config} | {fw.name} ({mech}) | {r.layout or '-'} | "
                     f"{r.run.published_s:.3f} s | {pred} | {err} | {abl} |")
    far = [r for r in results if r.error is not None and abs(r.error) > 0.10]
    if far:
        lines += ["", "Rows off by more than 10%, and the mechanism named:", ""]
        lines += [f"- {r.run.id} ({100 * r.error:+.1f}%): {OUTLIERS.get(r.run.id, 'not analysed yet')}" for r in far]
    lines += ["", "How the table moved, mechanism by mechanism (every row re-run each time):", ""]
    lines += [f"- {commit}: {what}" for commit, what in STEPS]
    lines += ["", "Earlier runs (the A100 rows before the kernel and framework mechanisms):", ""]
    for commit, date, what, errs in HISTORY:
        e = [abs(v) for v in errs.values()]
        lines.append(f"- {commit} ({date}), {what}: " + ", ".join(f"{k} {100 * v:+.1f}%" for k, v in errs.items())
                     + f"; mean |error| {100 * sum(e) / len(e):.1f}%, max {100 * max(e):.1f}%.")
    lines += ["", "Sources and how each published step time is read:", ""]
    for src in dict.fromkeys(r.run.source for r in results):
        notes = dict.fromkeys(r.run.published_note.split(" (")[0] for r in results if r.run.source == src)
        lines.append(f"- {src}. Step time: {'; '.join(notes)}.")
    lines += ["- Profile `dgx-a100-selene` (the Megatron-LM runs): A100 80 GB numbers of `a100-sxm4-80gb` with "
              "Selene's eight HDR HCAs per node. The model-state recipe is each framework version's for the run's "
              "dtype (its `precision.recipes`, as `memo-sim whatif --framework` applies it): fp16 with 16-bit "
              "gradients reduced in fp16 (recipe `zero`: `--accumulate-allreduce-grads-in-fp32` stays off under "
              "fp16), bf16 with fp32 main gradients (recipe `megatron`).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/published-runs.md")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = [predict(r) for r in RUNS]
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"summary": summary(results), "rows": [
            {"id": r.run.id, "published_s": r.run.published_s, "predicted_s": r.predicted_s, "error": r.error,
             "status": r.status, "why_not": r.run.why_not} for r in results]}, indent=1))
    Path(args.out).write_text(report(results, wall))
    for r in results:
        print(f"{r.run.id:32s} {r.run.published_s:9.3f} s  "
              + (f"{r.predicted_s:9.3f} s  {100 * r.error:+6.1f}%" if r.error is not None else r.status))
    print(summary(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
