"""Maximum-length runs (issue #45 item 3): where a source states the longest sequence a layout
trains, or that a length does not train, `memo-sim maxseq` with the run's framework and layout
predicts it (`memo_sim.search.maxseq.max_seq` with the layout fixed, as
``memo-sim maxseq --tp/--ulysses/--zero ...`` does).

A stated maximum comes from a grid of lengths the authors tried (FPDT's table: 32K, 64K, 128K, 512K,
4M: powers of two), so memo answers on the same grid: the longest power-of-two length its
`max_seq` (in steps of `STEP` tokens) still trains. The row's error is that length over the stated
one, less 1 (0: the same answer; -50%: one grid step short). Where the source also states the
memory the run took at its maximum, memo's analytic peak at that length is compared with it. A
stated failure ("OOM") is a check: memo's longest must fall short of that length.

`python benchmarks/published_runs.py` prints these rows in its report (one command for the whole
table); ``python benchmarks/published_maxlen.py`` prints them alone.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memo_sim.errors import MemoError  # noqa: E402
from memo_sim.model.config import ModelConfig, get_model  # noqa: E402
from memo_sim.profile.loader import load_profile  # noqa: E402
from memo_sim.search.frameworks import get_framework  # noqa: E402
from memo_sim.search.maxseq import max_seq  # noqa: E402
from memo_sim.search.whatif import candidates_for  # noqa: E402

STEP = 2048  # tokens: memo's own answer, before it is put on the source's grid
GiB = float(1 << 30)

FPDT = ("deepspeedai/DeepSpeed blogs/ulysses-offload/README.md at edaa722126, Figure 5 (media/image5.png, values "
        "printed as text in the image; the paper is arXiv 2408.16978): '8B Llama 3, 8 GPUs', the longest sequence each "
        "technique trains ('Max len.'), the GPU memory it took there ('HBM.') and its MFU")
XTUNER_SP = ("InternLM/xtuner docs/zh_cn/acceleration/train_extreme_long_sequence.rst at 48df4c8bd, Table 1: training "
             "a 128K-context Yi-34B with ZeRO-3, 'OOM' for SP 1 on 16, 32 and 64 GPUs (the SP 8 row on 16 GPUs, "
             "227 TGS, is the step-time row xtuner-yi-34b-128k-sp8-16gpu)")

_FPDT_CHOICES = ("GPU not stated in the table: A100-SXM4-80GB (the DeepSpeed tutorial's 'A100-SXM4'; HBM values up to "
                 "78.7G rule out the 40 GB part); Llama 3 8B as memo's llama-3.1-8b preset (the same architecture); "
                 "bf16, micro-batch 1, data parallelism 1 (TP or Ulysses over all 8 GPUs); 'HBM.' read as GiB "
                 "(DeepSpeed's see_memory_usage divides by 1024^3 and prints 'GB') and compared with memo's peak; the "
                 "Ulysses rows on the deepspeed framework data (its vocabulary-parallel loss over every token, ZeRO as "
                 "DeepSpeed holds it, 'OC' as the checkpoint_offload policy), the TP rows on memo's own (framework any: "
                 "the deepspeed data has no TP), whose loss runs in 8K-token chunks")


@dataclass(frozen=True)
class MaxLenRun:
    id: str
    source: str
    config: str  # the configuration in the source's words
    model: str  # a memo preset, or "yi-34b-200k" (the step-time table's model)
    gpus: int
    profile: str
    framework: str
    policy: str
    fixed: tuple[tuple[str, object], ...] = ()
    max_tokens: int | None = None  # the longest length the source states trains
    fails_tokens: int | None = None  # a length the source states does not train
    hbm_gib: float | None = None  # the memory the source states at its maximum
    why_not: str | None = None  # why memo cannot express the run


def _fpdt(rid, what, max_k, hbm, policy=None, fixed=(), why_not=None, framework="deepspeed"):
    return MaxLenRun(rid, FPDT, f"Llama 3 8B, 8 GPUs, {what}: 'Max len.' {max_k}K, 'HBM.' {hbm}G", "llama-3.1-8b", 8,
                     "a100-sxm4-80gb", framework, policy or "store_all", tuple(fixed) + (("optimizer_offload", False),),
                     max_k * 1024, None, hbm, why_not)


_OC_TP = ("TP 8 with checkpoints on the host: memo prices cpu_checkpointing as the deepspeed framework's "
          "checkpoint_offload policy, and that framework data has no tensor parallelism (Megatron-DeepSpeed's TP is "
          "not a framework of its own in memo)")
RUNS = (
    _fpdt("fpdt-t1-tp", "Megatron TP (TP 8, no checkpointing; sequence parallelism not stated: off, Megatron-DeepSpeed's "
          "default)", 32, 64.3, fixed=(("tp", 8), ("sp", False)), framework="any"),
    _fpdt("fpdt-t2-tp-ac", "Megatron TP 8 with activation checkpointing", 128, 61.2, policy="full_recompute",
          fixed=(("tp", 8), ("sp", False)), framework="any"),
    _fpdt("fpdt-t3-tp-ac-oc", "TP 8, checkpointing with CPU offload", 512, 78.7, why_not=_OC_TP),
    _fpdt("fpdt-t4-ul-z1", "DeepSpeed-Ulysses 8, ZeRO-1, no checkpointing", 64, 58.9,
          fixed=(("ulysses", 8), ("zero", 1))),
    _fpdt("fpdt-t5-ul-z2", "DeepSpeed-Ulysses 8, ZeRO-2, no checkpointing", 64, 54.5,
          fixed=(("ulysses", 8), ("zero", 2))),
    _fpdt("fpdt-t6-ul-z3", "DeepSpeed-Ulysses 8, ZeRO-3, no checkpointing", 64, 52.3,
          fixed=(("ulysses", 8), ("zero", 3))),
    _fpdt("fpdt-t7-ul-z1-ac-oc", "DeepSpeed-Ulysses 8, ZeRO-1, checkpointing with CPU offload", 512, 65.5,
          policy="checkpoint_offload", fixed=(("ulysses", 8), ("zero", 1))),
    _fpdt("fpdt-t8-ul-z2-ac-oc", "DeepSpeed-Ulysses 8, ZeRO-2, checkpointing with CPU offload", 512, 65.5,
          policy="checkpoint_offload", fixed=(("ulysses", 8), ("zero", 2))),
    _fpdt("fpdt-t9-ul-z3-ac-oc", "DeepSpeed-Ulysses 8, ZeRO-3, checkpointing with CPU offload", 512, 60.1,
          policy="checkpoint_offload", fixed=(("ulysses", 8), ("zero", 3))),
    _fpdt("fpdt-t10-fpdt", "FPDT (chunked attention with host offload), ZeRO-3, checkpointing with CPU offload",
          4096, 68.0, why_not="FPDT's sequence chunks offloaded to the host inside attention are not modelled"),
    *(MaxLenRun(f"xtuner-yi-34b-128k-sp1-{g}gpu-oom", XTUNER_SP,
                f"Yi-34B, {g} GPUs, 128K, SP 1 (DP {g}), ZeRO-3, activation checkpointing (XTuner's default): 'OOM'",
                "yi-34b-200k", g, "a100-sxm4-80gb", "xtuner", "full_recompute",
                (("ulysses", 1), ("zero", 3), ("optimizer_offload", False)), None, 128 * 1024)
      for g in (16, 32, 64)),
)
LEFT_OUT = (
    ("EasyContext '700K with 8 A100 (Llama2-7B)' and '1M with 16 A100 (Llama2-13B)'",
     "ZeRO-3 with the parameters offloaded to the host (zero3_offload.json: offload_param) is not modelled"),
    ("360-LLaMA-Factory's SFT and DPO max lengths", "'zero3-offload' (parameters on the host) is not modelled"),
    ("ALST recipes' max_length values", "a recipe's configured length, not a stated maximum; most use tiled MLP and "
     "checkpoint offload, which memo does not model"),
    ("FPDT blog text: '2 million tokens using only 4 GPUs', 'GPT-30B and Llama-70B up to 3 and 4 million tokens'",
     "FPDT's chunked offload is not modelled"),
)


@dataclass
class MaxLenResult:
    run: MaxLenRun
    longest: int | None = None  # memo's longest length (a multiple of STEP), None: not even STEP
    binding: str = ""
    peak_gib: float | None = None  # memo's analytic peak at the stated maximum
    states_gib: float | None = None  # its model states there
    status_at_max: str = ""
    wall_s: float = 0.0

    @property
    def on_grid(self) -> int | None:
        """memo's answer on the source's doubling grid: the longest power of two it trains."""
        if not self.longest:
            return None
        return 1 << int(math.log2(self.longest))

    @property
    def error(self) -> float | None:
        r = self.run
        if r.why_not or r.max_tokens is None or self.longest is None:
            return None
        return (self.on_grid or 0) / r.max_tokens - 1

    @property
    def memory_error(self) -> float | None:
        if self.run.hbm_gib is None or self.peak_gib is None:
            return None
        return self.peak_gib / self.run.hbm_gib - 1

    @property
    def agrees(self) -> bool | None:
        """A stated failure: memo's longest falls short of it."""
        if self.run.fails_tokens is None or self.run.why_not:
            return None
        return self.longest is not None and self.longest < self.run.fails_tokens


def model_of(run: MaxLenRun) -> ModelConfig:
    if run.model == "yi-34b-200k":
        from published_runs import YI_34B_200K  # noqa: E402  (the step-time table's model)

        base = YI_34B_200K
    else:
        base = get_model(run.model)
    return get_framework(run.framework).for_model(base)


def predict(run: MaxLenRun) -> MaxLenResult:
    res = MaxLenResult(run)
    if run.why_not:
        return res
    t0 = time.perf_counter()
    model, profile, fixed = model_of(run), load_profile(run.profile), dict(run.fixed)
    ans = max_seq(model, run.gpus, profile, run.policy, step=STEP, framework=run.framework, simulate=False,
                  fixed=fixed)
    res.longest, res.binding = ans.max_seq, ans.binding
    if run.max_tokens is not None:
        try:
            cands = candidates_for(model, run.max_tokens, run.gpus, profile, policies=(run.policy,),
                                   framework=run.framework, **fixed).candidates
            c = min(cands, key=lambda c: (c.status != "OK", c.memory.peak_gpu_bytes))
            res.peak_gib, res.status_at_max = c.memory.peak_gpu_bytes / GiB, c.status
            res.states_gib = c.memory.model_states_bytes / GiB
        except MemoError as e:
            res.status_at_max = str(e)
    res.wall_s = time.perf_counter() - t0
    return res


def _k(tokens: int | None) -> str:
    return "-" if tokens is None else f"{tokens // 1024}K" if tokens % 1024 == 0 else f"{tokens:,}"


def report_lines(results: list[MaxLenResult]) -> list[str]:
    pred = [r for r in results if r.error is not None]
    errs = [abs(r.error) for r in pred]
    mem = [abs(r.memory_error) for r in pred if r.memory_error is not None]
    checks = [r for r in results if r.agrees is not None]
    srcs = {r.run.source for r in pred + checks}
    lines = ["", "### Maximum-length rows (issue #45 item 3)", "",
             f"- stated maxima: {len([r for r in results if r.run.max_tokens])} rows, memo predicts {len(pred)} "
             f"(`memo-sim maxseq` with the layout fixed, steps of {STEP:,} tokens, then on the source's doubling grid): "
             f"{sum(1 for e in errs if e == 0)} of {len(pred)} the same length"
             + (f", mean |error| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}%" if errs else "")
             + (f"; memo's peak at the stated length against the stated memory: mean |error| "
                f"{100 * sum(mem) / len(mem):.1f}%, max {100 * max(mem):.1f}%" if mem else ""),
             f"- stated failures: {len(checks)} rows, memo's longest falls short of the failing length in "
             f"{sum(1 for r in checks if r.agrees)} of them",
             f"- {len(srcs)} sources; these rows answer a different question from the step-time rows (how long, not "
             "how fast), so they are counted here and not in the long-context subgroup's step-time errors",
             "- error = memo's length on the grid / the stated length - 1 (a grid step is a factor of 2: one step "
             "short is -50%)", "",
             "| run | configuration | memo (framework, policy, fixed) | stated | memo's longest (binds next) | on the "
             "grid | error | memory at the stated length: stated / memo |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        run = r.run
        fixed = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in run.fixed)
        stated = f"trains {_k(run.max_tokens)}" if run.max_tokens else f"OOM at {_k(run.fails_tokens)}"
        if run.why_not:
            lines.append(f"| {run.id} | {run.config} | - | {stated} | not expressible: {run.why_not} | | | |")
            continue
        longest = f"{_k(r.longest)} ({r.binding})" if r.longest else f"none ({r.binding})"
        err = (f"{100 * r.error:+.0f}%" if r.error is not None
               else ("consistent" if r.agrees else "NOT consistent") if r.agrees is not None else "")
        memory = (f"{run.hbm_gib:.1f} / {r.peak_gib:.1f} GiB ({100 * r.memory_error:+.0f}%"
                  + (f", {r.status_at_max} in memo" if r.status_at_max != "OK" else "") + ")"
                  if r.memory_error is not None else "")
        lines.append(f"| {run.id} | {run.config} | {run.framework}, {run.policy}, {fixed} on {run.profile} | "
                     f"{stated} | {longest} | {_k(r.on_grid) if run.max_tokens else ''} | {err} | {memory} |")
    lines += ["", f"- FPDT rows, what the table does not state and memo's choice: {_FPDT_CHOICES}."]
    lines += ["", "Where memo and a stated maximum part (the mechanism, or what is not pinned down):", ""]
    lines += [f"- {rid}: {why}" for rid, why in maxlen_outliers(results) if any(r.run.id == rid and r.error
                                                                                   for r in results)]
    lines += ["", "Maximum-length statements left out:", ""]
    lines += [f"- {what}: {why}." for what, why in LEFT_OUT]
    lines += ["", "Sources:", ""] + [f"- {s}." for s in dict.fromkeys(r.run.source for r in results)]
    return lines


_ZERO_FLAT = ("the table's memory barely moves with the ZeRO stage (58.9, 54.5 and 52.3G at ZeRO-1, 2 and 3 without "
              "checkpointing at 64K; 65.5, 65.5 and 60.1G with offloaded checkpoints at 512K), while in memo sharding the "
              "gradients (ZeRO-2) and then the weights (ZeRO-3) over the 8 ranks takes the model states from {z1:.1f} "
              "GiB (ZeRO-1: bf16 weights and gradients whole, the fp32 Adam states over 8 ranks, as DeepSpeed's "
              "stage-1 optimizer holds them) to {z2:.1f} and {z3:.1f} GiB (each with the whole gradients of a layer "
              "and of the head before their reduce-scatter; ZeRO-3 with its gathered layers and head); memo's peak at "
              "the stated length exceeds the table's by {mem} here, {z3rows} at ZeRO-3. Not pinned down: the table "
              "states neither how it measured 'HBM.' (allocated or reserved, at which moment) nor the run's "
              "micro-batch, precision or gradient settings")
# the rows whose peak memo puts 30% or more over the table's
ZERO_FLAT_ROWS = ("fpdt-t4-ul-z1", "fpdt-t7-ul-z1-ac-oc", "fpdt-t8-ul-z2-ac-oc")
ZERO_STATES = ("fpdt-t7-ul-z1-ac-oc", "fpdt-t8-ul-z2-ac-oc", "fpdt-t9-ul-z3-ac-oc")  # ZeRO 1, 2, 3 at the same length
ZERO3_ROWS = ("fpdt-t6-ul-z3", "fpdt-t9-ul-z3-ac-oc")


def _mem_words(r: MaxLenResult) -> str:
    """memo's peak at the stated length against the table's, in words (from this run's numbers)."""
    over = (f": out of memory at {_k(r.run.max_tokens)}" if r.status_at_max != "OK" else "")
    return f"{100 * r.memory_error:+.0f}% ({r.peak_gib:.0f} GiB{over})"


def maxlen_outliers(results: list[MaxLenResult]) -> list[tuple[str, str]]:
    """(row, why) for the rows whose memory memo puts far over the table's, their numbers from ``results``."""
    by = {r.run.id: r for r in results}
    states = [by[rid].states_gib for rid in ZERO_STATES if rid in by]
    if len(states) < 3 or None in states:
        return []
    z3rows = ", ".join(f"{rid.split('-ul')[0]} {_mem_words(by[rid])}" for rid in ZERO3_ROWS
                       if rid in by and by[rid].memory_error is not None)
    return [(rid, _ZERO_FLAT.format(z1=states[0], z2=states[1], z3=states[2], mem=_mem_words(by[rid]), z3rows=z3rows))
            for rid in ZERO_FLAT_ROWS if rid in by and by[rid].memory_error is not None]


def main() -> None:
    t0 = time.perf_counter()
    results = [predict(r) for r in RUNS]
    print("\n".join(report_lines(results)))
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
