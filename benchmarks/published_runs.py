"""Validation against published runs: memo's simulated step time beside the step time real
clusters measured, for configurations from public papers and framework documentation.

Every row names its source (paper and table, or repository file and commit), the configuration,
the framework version whose mechanisms it runs with (`memo_sim.frameworks`), memo's prediction
(tier 2, the event simulator) and the published number; rows memo cannot express yet are listed
with the reason, never dropped. Rows form groups, each with its own mean and max |error|: ``dense`` (the
dense decoders) and ``moe`` (mixtures of experts, issue #49 item 7: `MOE_RUNS`, their section of the report). A row
whose published number is an expected value a launch script states, not a measurement (`Run.expected`), is predicted
and listed apart, never counted in a group's errors; rows at LONG_CONTEXT_TOKENS or more (`Run.long_context`) form
each group's long-context subgroup (issue #45 reuses them; its item 1 adds the long-context dense runs of XTuner's
speed benchmark and Megatron-DeepSpeed's DeepSpeed4Science README, `LONG_RUNS`, each unstated input with the one
choice from the source's own files that memo runs it with, `LONG_CHOICES`). The published numbers are never used to
set a constant: a row moves only when a mechanism changes, and then every row is re-run.

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
from typing import Callable

from memo_sim.engine.simulate import simulate
from memo_sim.fileio import atomic_write_text
from memo_sim.frameworks import MECHANISMS
from memo_sim.layout.parallel import Layout, check_layout, expert_group_ranks, ranks_per_node, stage_shard
from memo_sim.layout.pipeline_layout import torchtitan_split
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.report.moe_split import moe_split
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
# sequences of this many tokens or more make a row long-context (`Run.long_context`; issue #45 reuses those rows)
LONG_CONTEXT_TOKENS = 16384


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
    # mixture-of-experts rows (group "moe"): the model as the source's launch files describe it (its own
    # architecture fields; None: the GPT of layers / hidden / heads above), the expert layout and what
    # the run used that memo does not model (named in the report beside the error)
    group: str = "dense"
    arch: ModelConfig | None = None
    cp: int = 1
    # DeepSpeed-Ulysses sequence parallelism (all-to-all over heads; the long-context dense rows of issue #45)
    ulysses: int = 1
    ep: int = 1
    etp: int = 1
    moe_dispatcher: str = "alltoall"
    moe_balance: str = "dropless"
    ep_overlap: bool = False  # Megatron-Core's EP all-to-all overlap (`Layout.ep_overlap`; the Model Zoo's A2A_OVERLAP=1)
    gemm_format: str = "bf16"
    dp_mode: str = "zero"  # the data-parallel flavour (`memo_sim.dp`: torchtitan's rows run FSDP)
    precision: str | None = None  # a model-state recipe the run sets (None: its framework's for the dtype)
    reshard_after_forward: bool = True  # FSDP (torchtitan keeps the gathered weights beside pipeline stages)
    # how the run builds its memory-bound kernels where it differs from its framework's (`Layout.kernel_fusion`:
    # torchtitan@2024-12's eager rows, run without --training.compile; None: the framework's)
    kernel_fusion: str | None = None
    # layout settings the run's launch line sets otherwise than its framework's data does, (Layout field, value) pairs:
    # Megatron-DeepSpeed's --use-flash-attn-triton (attention flash_triton), a Megatron-LM run without
    # --overlap-grad-reduce (grad_overlap False)
    launch: tuple[tuple[str, object], ...] = ()
    tp_mode: str = "megatron"  # the TP flavour (`memo_sim.tp`: torchtitan's AsyncTP rows run async_tp)
    first_stage_layers: int = 0  # uneven pipeline stages: the first and last ranks' layers (0: even)
    last_stage_layers: int = 0
    chunk_layers: tuple[int, ...] = ()  # each model chunk's layers (`Layout.chunk_layers`; (): from the fields above)
    not_modelled: str = ""
    # the embedding and the loss each take a layer's slot in the pipeline split (Megatron-LM's
    # --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)
    account_embedding_loss: bool = False
    # the published number is an expected value a launch script states ("performance should be around ..."), not a
    # measurement: the row is predicted and listed, never counted in a group's errors
    expected: bool = False
    # other inputs memo also runs the row with, shown beside its prediction (never counted): (label, ((field, value), ...))
    variants: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()

    @property
    def long_context(self) -> bool:
        """A run at LONG_CONTEXT_TOKENS or more per sequence (the long-context subgroup, reused by issue #45)."""
        return self.seq >= LONG_CONTEXT_TOKENS

    def base_model(self) -> ModelConfig:
        """The run's model before its framework's recipe (what a user hands `memo-sim whatif`)."""
        if self.arch is not None:
            return replace(self.arch, name=self.id, dtype=self.dtype, gemm_format=self.gemm_format,
                           precision=self.precision)
        # a GPT of Megatron-LM's scripts: its default --position-embedding-type learned_absolute (arguments.py; the
        # only positions before 2023; examples/gpt3/train_gpt3_175b_distributed.sh at f2e5db402c, 2024-07, keeps it)
        return ModelConfig(self.id, self.layers, self.hidden, self.heads, 4 * self.hidden, vocab=self.vocab,
                           dtype=self.dtype, precision=self.precision, positions="learned")

    def model(self) -> ModelConfig:
        """The run's model as its framework version trains it: the model-state recipe is the
        framework's for the dtype (`Framework.for_model`; Megatron-LM keeps fp16 gradients under
        fp16, fp32 ones under bf16), as `memo-sim whatif --framework` applies it."""
        return get_framework(self.framework).for_model(self.base_model())

    def layout(self) -> Layout:
        lay = get_framework(self.framework).adapt(Layout(
            tp=self.tp, sp=self.sp, cp=self.cp, ulysses=self.ulysses, dp=self.dp, pp=self.pp, vpp=self.vpp,
            zero=self.zero, ep=self.ep,
            etp=self.etp, moe_dispatcher=self.moe_dispatcher, moe_balance=self.moe_balance, ep_overlap=self.ep_overlap,
            account_embedding_loss=self.account_embedding_loss, dp_mode=self.dp_mode,
            reshard_after_forward=self.reshard_after_forward, tp_mode=self.tp_mode,
            first_stage_layers=self.first_stage_layers, last_stage_layers=self.last_stage_layers,
            chunk_layers=self.chunk_layers))
        lay = replace(lay, **dict(self.launch)) if self.launch else lay
        return replace(lay, kernel_fusion=self.kernel_fusion) if self.kernel_fusion else lay

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
    sched = ("micro-batch 1, " + (f"interleaved 1F1B with {vpp} chunks per GPU" if vpp > 1 else "1F1B")
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
    # the table's sizes count the embedding and the output layer apart (--untie-embeddings-and-output-weights):
    # 1.7B is 1.745B so, 1.476B tied; 7.1B 7.115B (6.58B tied); 16B 16.11B; 32B 31.48B; 70B 69.8B
    arch = ModelConfig(f"megatron2024-{size}", layers, hidden, heads, 4 * hidden, vocab=131072, dtype="bf16",
                       positions="learned", tied_embeddings=False)
    return Run(f"megatron2024-{size}", MEGATRON_2024,
               f"GPT {size}: h={hidden}, {layers} layers, {heads} heads, TP {tp} x PP {pp} x DP {dp} = {gpus} H100s, "
               f"batch {batch}, s=4096, V=131072, embedding and output layer untied (the table's sizes count both: "
               f"{arch.params() / 1e9:.3g}B), no recompute stated",
               pub, f"{tflops} TFLOP/s per GPU (the table) x {gpus} GPUs over training.py's FLOPs",
               framework="megatron", profile="h100-sxm5-80gb", layers=layers, hidden=hidden, heads=heads,
               vocab=131072, seq=4096, tp=tp, pp=pp, dp=dp, sp=True, global_batch=batch, policy="store_all",
               dtype="bf16", zero=1, why_not=why, arch=arch)


def _titan(config, tps, why=None, gpus=8, seq=8192, batch=2, model="llama-3.1-8b", cp=1, tp=1, pp=1,
           policy="full_recompute", async_tp=False, vpp=1, kernel_fusion=None):
    # TPS/GPU -> step time: torchtitan@9dec370 train.py counts the local batch's tokens (labels.numel(), before
    # context parallelism shards them) and divides by the step time x cp x tp x pp (non_data_parallel_size), so a
    # step takes local batch x sequence / (TPS x cp x tp x pp). Every row here uses torch.compile but the first of
    # Tables 1 and 3 and Float8 (torchao, tensorwise dynamic scaling) from Table 2 on, as the page's table titles say;
    # "selective activation checkpointing" is per-op (op_sac): train_configs/llama3_8b.toml at 9dec370 sets
    # mode = 'selective', selective_ac_option = 'op'
    # Pipelined rows (Tables 5 and 6): 9dec370's defaults, as the page states neither: micro-batches = the
    # pipeline degree (pipeline_parallel_microbatches unset), the generated split (`torchtitan_split`), FSDP
    # without resharding after the forward (apply_fsdp with pipelining on); interleaved: 2 stages per rank
    # (pipeline_parallel_stages_per_rank's default), the generated split over the virtual stages
    arch = PRESETS[model]
    dp = gpus // (cp * tp * pp)
    fp8 = "Float8" in config
    split = torchtitan_split(arch.layers, pp * vpp) if pp > 1 else (arch.layers,)
    first, last = split[0], split[-1]
    even = len(set(split)) == 1
    chunks = () if even or vpp == 1 else split
    return Run(f"torchtitan-{config.split(':')[0]}", TORCHTITAN, config, batch * seq / (tps * cp * tp * pp),
               f"{tps} tokens/GPU/s at local batch {batch} x {seq} tokens on {gpus} GPUs"
               + (f" (TPS divides by cp x tp x pp = {cp * tp * pp})" if cp * tp * pp > 1 else ""),
               framework="torchtitan@2024-12", profile="h100-sxm5-96gb-500w", seq=seq, why_not=why, arch=arch,
               layers=arch.layers, hidden=arch.hidden, heads=arch.heads, vocab=arch.vocab, dtype="bf16",
               gemm_format="fp8-tensorwise" if fp8 else "bf16", tp=tp, sp=tp > 1, cp=cp, pp=pp, dp=dp, zero=3,
               dp_mode="fsdp", global_batch=dp * batch, policy=policy, tp_mode="async_tp" if async_tp else "megatron",
               reshard_after_forward=pp == 1, micro_batch=batch // pp if pp > 1 else None,
               first_stage_layers=0 if even or chunks else first, last_stage_layers=0 if even or chunks else last,
               chunk_layers=chunks, vpp=vpp, kernel_fusion=kernel_fusion,
               schedule_source=(f"micro-batch {batch // pp} ({pp} micro-batches: torchtitan@9dec370's default, the "
                                f"pipeline degree), " + ("1F1B, stages" if vpp == 1 else
                                                         f"interleaved 1F1B, {vpp} stages per rank, virtual stages")
                                + f" of {first}, {split[1]} ... {last} layers (generate_split_points)"
                                if pp > 1 else ""),
               variants=(("h100-sxm5-80gb (the 700 W SXM5 part: its clocks at 700 W, HBM3)",
                          (("profile", "h100-sxm5-80gb"),)),)
               + (((SYNC_TP, (("tp_mode", "megatron"),)),) if async_tp else ()))


SYNC_TP = "TP collectives on the critical path (tp_mode megatron)"


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
           policy="op_sac", kernel_fusion="eager"),
    _titan("t1-fsdp-compile: the same with torch.compile (Table 1)", 6667, policy="op_sac"),
    _titan("t1-fsdp-compile-float8: the same with torch.compile + Float8 (Table 1)", 8532, policy="op_sac"),
    _titan("t3-fsdp128: Llama 3.1 8B, FSDP over 128 GPUs, local batch 2 x 8192, selective AC (Table 3)", 5605,
           gpus=128, policy="op_sac", kernel_fusion="eager"),
    _titan("t3-fsdp128-compile: the same with torch.compile (Table 3)", 6514, gpus=128, policy="op_sac"),
    _titan("t3-fsdp128-compile-float8: the same with torch.compile + Float8 (Table 3)", 8380, gpus=128,
           policy="op_sac"),
    _titan("t2-cp1: Llama 3.1 8B, FSDP 8, CP 1, 32K, full AC, compile + Float8 (Table 2)", 3890, seq=32768, batch=1),
    _titan("t2-cp2: Llama 3.1 8B, FSDP 4, CP 2, 64K, full AC, compile + Float8 (Table 2)", 2540, seq=65536, batch=1,
           cp=2),
    _titan("t2-cp4: Llama 3.1 8B, FSDP 2, CP 4, 128K, full AC, compile + Float8 (Table 2)", 1071, seq=131072,
           batch=1, cp=4),
    _titan("t2-cp8: Llama 3.1 8B, FSDP 1, CP 8, 256K, full AC, compile + Float8 (Table 2)", 548, seq=262144, batch=1,
           cp=8),
    _titan("t4-2d: Llama 3.1 70B, FSDP 32 x TP 8, local batch 16, full AC, compile + Float8 (Table 4)", 829,
           gpus=256, batch=16, model="llama-3.1-70b", tp=8),
    _titan("t4-2d-asynctp: the same (compile + Float8) with AsyncTP (Table 4)", 876, gpus=256, batch=16,
           model="llama-3.1-70b", tp=8, async_tp=True),
    *(_titan(f"t5-{name}: Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, local batch 32, full AC, compile + Float8 + AsyncTP, "
             f"{label} (Table 5)", tps, why, gpus=512, batch=32, model="llama-3.1-405b",
             tp=8, pp=8, async_tp=True, vpp=vpp)
      for name, label, tps, why, vpp in (("1f1b", "1F1B", 100, None, 1),
                                         ("interleaved", "interleaved 1F1B", 128, None, 2))),
    *(_titan(f"t6-cp{cp}: Llama 3.1 405B, FSDP {8 // cp} x CP {cp} x TP 8 x PP 8, {seq // 1024}K, local batch 8, full AC, "
             f"compile + Float8 + AsyncTP, 1F1B (Table 6)", tps, None, gpus=512, batch=8,
             seq=seq, model="llama-3.1-405b", tp=8, pp=8, cp=cp, async_tp=True)
      for cp, seq, tps in ((1, 32768, 76), (2, 65536, 47), (4, 131072, 31), (8, 262144, 16))),
)


# --- Long-context dense runs (issue #45 item 1) ---------------------------------------------------------------
# Sources A and B of the research notes (benchmarks/long_context_sources.md); every number below was re-read from
# the source at the commit named (mirrors of InternLM/xtuner and deepspeedai/Megatron-DeepSpeed, `git show`). NVIDIA
# NeMo's long-sequence pages, the Llama 3 405B table and the Megatron-Bridge performance summaries are not used.
XTUNER = ("InternLM/xtuner docs/zh_cn/acceleration/benchmark.rst at 7575f2c91 (2024-07-09; byte-identical at "
          "b934f46209 as docs/zh_cn/legacy/acceleration/benchmark.rst): the speed table on 'NVIDIA A100-SXM4-80GB "
          "GPUs', PyTorch 1.13, CUDA 11.7, NCCL 2.14.3, each row's config "
          "xtuner/configs/llama_speed_benchmark/<model>/<name>.py and the TGS of "
          "xtuner/engine/hooks/throughput_hook.py at the same commit")
XTUNER_SP = ("InternLM/xtuner docs/zh_cn/acceleration/train_extreme_long_sequence.rst at 48df4c8bd (2024-07-10, which "
             "changed the row from 'OOM' to 227; the same at b934f46209 under docs/zh_cn/legacy/), Table 1: training a "
             "128K-context Yi-34B with ZeRO-3")
MDS_4SCI = ("deepspeedai/Megatron-DeepSpeed examples_deepspeed/deepspeed4science/megatron_long_seq_support/"
            "README.md at cc3a94c6 (2023-09-18; unchanged at 4efb479d53 but for the org rename): the 'New "
            "Megatron-DeepSpeed (TFLOPS)' column, '4 NVIDIA DGX A100-40GB nodes, connected through 8 HDR InfiniBand "
            "(200Gb/s per HDR)'")

LLAMA2_7B, LLAMA2_70B = PRESETS["llama-2-7b"], PRESETS["llama-2-70b"]
# 01-ai/Yi-34B-200K: the Llama architecture of 01-ai/Yi-34B's config.json (60 layers, h=7168, 56 heads, 8 K/V heads,
# FFN 20480, vocabulary 64000, untied embeddings, no biases; the 200K model changes only rope_theta and
# max_position_embeddings) as public copies of that config give it (the Hugging Face hub is not reachable here). The
# XTuner table's own TFLOP/s agree with throughput_hook.py's formula over these layers, h, FFN and vocabulary to 0.1%
# in every Yi row (`xtuner_flops`); the heads it does not read.
YI_34B_200K = ModelConfig("yi-34b-200k", 60, 7168, 56, 20480, vocab=64000, kv_heads=8, ffn_type="swiglu",
                          norm="rmsnorm", bias="none", tied_embeddings=False)


def xtuner_flops(m: ModelConfig, seq: int, sp: int) -> float:
    """One iteration's FLOPs per GPU at batch 1 as xtuner/engine/hooks/throughput_hook.py at 7575f2c91 counts them
    (its logged TFLOP/s divide this by the iteration time): s' = s / SP tokens per GPU, (3 + 1 for activation
    checkpointing) x l x (8·s'·h² + 4·s'²·h·SP / 2 (causal) + 4·(1.5·f/h)·s'·h²) + 6·s'·h·V. It counts Q, K, V and
    O as four h x h projections whatever the K/V heads (an over-count for GQA models)."""
    s, h = seq / sp, m.hidden
    return (4 * (8 * s * h * h + 4 * s * s * h * sp / 2 + 4 * (1.5 * m.ffn / h) * s * h * h) * m.layers
            + 6 * s * h * m.vocab)


_XT_CHOICES = "ZeRO-3, bf16, profile a100-sxm4-80gb (what the page does not state: see the choices below the table)"
_XT_ZERO2 = ("ZeRO-2 (the SP page's example launch command)", (("zero", 2),))
_XT_SELENE = ("8 HDR per node (dgx-a100-selene)", (("profile", "dgx-a100-selene"),))


_XT_FP32 = "fp32 gradients (grad_accum_dtype fp32: megatron recipe)"


def _xtuner_variants(gpus: int):
    """Inputs memo also runs an XTuner row with, beside its prediction (never counted): the other ZeRO stage of
    XTuner's docs, fp32 gradients (DeepSpeed with data_types.grad_accum_dtype fp32; the `megatron` recipe), and, where the run spans nodes, Selene's
    eight HDR cards per node (the page states no interconnect)."""
    out = [_XT_ZERO2, (_XT_FP32, (("precision", "megatron"),))]
    if gpus > 8:
        out.append(_XT_SELENE)
    return tuple(out)


def _xtuner(rid, m, name, gpus, seq, sp, gas, tgs, tflops, cfg_file, gas_src=None, source=XTUNER, what=None,
            extra=""):
    dp, it = gpus // sp, seq / sp / tgs
    check = (f"; the table's {tflops} TFLOP/s is throughput_hook.py's FLOPs at this iteration time to "
             f"{100 * abs(xtuner_flops(m, seq, sp) / it / 1e12 / tflops - 1):.1f}%" if tflops else "")
    cfg = (f"{name}, {gpus} A100-SXM4-80GB, XTuner sequence parallel (Ulysses all-to-all) SP {sp} x DP {dp} over "
           f"DeepSpeed, s={seq} (Alpaca packed to max_length, use_varlen_attn False: full causal attention), "
           f"micro-batch 1, GAS {gas} ({gas_src or 'accumulative_counts'}), global batch {dp * gas} sequences, "
           f"activation checkpointing (SupervisedFinetune's default), FlashAttention-2; {cfg_file}" + extra
           + f"; memo runs {_XT_CHOICES}")
    note = (what or f"TGS {tgs} (stated) = s/SP tokens per GPU per iteration (throughput_hook.py), one iteration one "
            f"micro-batch: iteration {it:.2f} s, step = GAS {gas} x {it:.2f} s") + check
    return Run(f"xtuner-{rid}", source, cfg, gas * it, note, framework="xtuner", profile="a100-sxm4-80gb",
               arch=m, seq=seq, ulysses=sp, dp=dp, zero=3, global_batch=dp * gas, micro_batch=1,
               schedule_source=f"micro-batch 1 (batch_size = 1 # per_device), GAS {gas}: {cfg_file}",
               policy="full_recompute", dtype="bf16", variants=_xtuner_variants(gpus))


_XT_CFG = "xtuner/configs/llama_speed_benchmark/{}/{}.py"
_XT_KV = ("; XTuner repeats the 8 K/V heads to the 64 query heads before the all-to-all (repeat_kv, then "
          "flash_attn_wo_mask/flash_attn_w_mask's sequence_parallel_wrapper: xtuner/model/modules/dispatch/llama.py "
          "and xtuner/parallel/sequence/attention.py at 7575f2c91), as memo's xtuner framework data does "
          "(ulysses_kv: query_heads, `memo_sim.layout.kv_heads`)")


def _mds_4sci(k: int, tflops: float) -> Run:
    """Source B: one 'New Megatron-DeepSpeed' cell. The table states neither the model nor the batch; the folder's only
    TP-32 script, pretrain_gpt_30B_seq_parallel.sh (the README's 'GPT30B'), gives them."""
    seq, layers, hidden, heads, vocab, gbs = 1024 * k, 64, 6144, 64, 53248, 2
    return Run(
        f"mds4sci-tp32-{k}k", MDS_4SCI,
        f"{k}k ('k' = 1024: the script's seq_len=$(( 1024 * $n_k ))), 4 DGX A100-40GB nodes (32 GPUs), 8 x 200 Gb/s "
        f"HDR per node, 'TP size=32' with Megatron sequence parallelism, PP 1, DP 1, Megatron-DeepSpeed (2023 rebase, "
        f"FlashAttention); model and batch not in the table: the folder's only TP-32 script pretrain_gpt_30B_seq_"
        f"parallel.sh gives GPT-30B (64 layers, h=6144, 64 heads, GPT-2 BPE padded to {vocab} = 128 x TP multiples), "
        f"micro-batch 1, global batch 2, ZeRO 0, --fp16, --use-flash-attn-triton, --checkpoint-activations (full)",
        megatron_flops(gbs, layers, hidden, seq, vocab) / (tflops * 1e12 * 32),
        f"{tflops} TFLOPS per GPU (stated) x 32 GPUs over megatron/utils.py throughput_calculator's FLOPs at cc3a94c6 "
        f"(96·B·s·l·h²·(1 + s/6h + V/16lh), checkpoint factor 4) at the script's GPT-30B and global batch 2 (a "
        "derived step: the model and batch are the script's, not the table's)",
        framework="megatron@2023", profile="a100-sxm4-40gb", layers=layers, hidden=hidden, heads=heads, vocab=vocab,
        seq=seq, tp=32, sp=True, dp=1, global_batch=gbs, micro_batch=1, policy="full_recompute", dtype="fp16",
        launch=(("attention", "flash_triton"),),
        schedule_source="micro-batch 1, global batch 2, one stage: pretrain_gpt_30B_seq_parallel.sh at cc3a94c6 "
                        "(batch_size=1 as --micro-batch-size, global_batch_size=2, pp_size=1)",
        not_modelled="FlashAttention's Triton kernel at the run's own calls (priced on the profile's flash_triton "
                     "curves: FlashAttention-2's times the Triton kernel's relative speed on the FlashAttention-2 "
                     "README's A100 chart, 16 heads at 16K tokens a call at most); TP 32's collectives over 4 nodes on "
                     "NCCL's ring through the nodes' NICs (memo's ring model, not measured on this cluster)")


LONG_RUNS: tuple[Run, ...] = (
    _xtuner("llama2-7b-32k-sp1", LLAMA2_7B, "Llama-2-7B", 8, 32768, 1, 1, 2234.2, 193.0,
            _XT_CFG.format("llama2_7b", "llama2_7b_full_alpaca_enzh_32k_sp1")),
    _xtuner("llama2-7b-128k-sp8", LLAMA2_7B, "Llama-2-7B", 8, 131072, 8, 8, 948.6, 180.3,
            _XT_CFG.format("llama2_7b", "llama2_7b_full_alpaca_enzh_128k_sp8")),
    _xtuner("llama2-7b-256k-sp8", LLAMA2_7B, "Llama-2-7B", 8, 262144, 8, 8, 540.1, 176.9,
            _XT_CFG.format("llama2_7b", "llama2_7b_full_alpaca_enzh_256k_sp8")),
    _xtuner("llama2-7b-1m-sp16", LLAMA2_7B, "Llama-2-7B", 32, 1048576, 16, 16, 133.6, 153.9,
            _XT_CFG.format("llama2_7b", "llama2_7b_full_alpaca_enzh_1M_sp16")),
    _xtuner("yi-34b-32k-sp2", YI_34B_200K, "Yi-34B-200K", 32, 32768, 2, 2, 491.5, 209.1,
            _XT_CFG.format("yi_34b", "yi_34b_200k_full_alpaca_enzh_32k_sp2")),
    _xtuner("yi-34b-128k-sp8", YI_34B_200K, "Yi-34B-200K", 32, 131072, 8, 8, 251.1, 191.8,
            _XT_CFG.format("yi_34b", "yi_34b_200k_full_alpaca_enzh_128k_sp8")),
    _xtuner("yi-34b-256k-sp8", YI_34B_200K, "Yi-34B-200K", 32, 262144, 8, 8, 119.7, 145.3,
            _XT_CFG.format("yi_34b", "yi_34b_200k_full_alpaca_enzh_256k_sp8")),
    _xtuner("llama2-70b-32k-sp4", LLAMA2_70B, "Llama-2-70B", 32, 32768, 4, 4, 300.9, 239.6,
            _XT_CFG.format("llama2_70b", "llama2_70b_full_alpaca_enzh_32k_sp4")),
    _xtuner("llama2-70b-128k-sp8", LLAMA2_70B, "Llama-2-70B", 32, 131072, 8, 8, 144.7, 189.7,
            _XT_CFG.format("llama2_70b", "llama2_70b_full_alpaca_enzh_128k_sp8")),
    # SP 16 and SP 64 over 8 K/V heads: each K/V head repeated 8 times before the all-to-all (XTuner at 7575f2c91
    # and memo's xtuner data, see _XT_KV; the GQA rows at SP 2-8 are repeated so as well)
    _xtuner("llama2-70b-256k-sp16", LLAMA2_70B, "Llama-2-70B", 32, 262144, 16, 16, 63.8, 127.6,
            _XT_CFG.format("llama2_70b", "llama2_70b_full_alpaca_enzh_256k_sp16"), extra=_XT_KV),
    _xtuner("llama2-70b-1m-sp64", LLAMA2_70B, "Llama-2-70B", 64, 1048576, 64, 64, 21.8, 133.5,
            "config llama2_70b_full_alpaca_enzh_1M_sp64.py (linked by the table, absent from the repository)",
            gas_src="not stated: the config is absent; memo takes accumulative_counts = sequence_parallel_size, the "
                    "rule every speed-benchmark config follows and states ('the accumulative counts have to be "
                    "adjusted to SP times the original value')", extra=_XT_KV),
    # the SP page's Table 1: ZeRO-3 stated; GPU type, micro-batch, GAS and the exact length are not
    _xtuner("yi-34b-128k-sp8-16gpu", YI_34B_200K, "Yi-34B", 16, 131072, 8, 8, 227, None,
            "not stated by the table: s, micro-batch and GAS taken from the speed benchmark's Yi-34B-200K 128K SP 8 "
            "config (" + _XT_CFG.format("yi_34b", "yi_34b_200k_full_alpaca_enzh_128k_sp8") + ": max_length = 131072 "
            "# 128k), the GPU from the speed benchmark page (A100-SXM4-80GB); ZeRO-3 is stated",
            gas_src="the config's accumulative_counts", source=XTUNER_SP,
            what="TGS 227 (stated) = s/SP tokens per GPU per iteration (the speed benchmark's hook): iteration "
                 f"{131072 / 8 / 227:.2f} s, step = GAS 8 x {131072 / 8 / 227:.2f} s"),
    *(_mds_4sci(k, tf) for k, tf in ((16, 92), (32, 100), (64, 106), (128, 119), (256, 94))),
)
RUNS = RUNS + LONG_RUNS

# What the long-context sources do not state and the one choice memo runs each row with (from the source's own
# scripts, configs and defaults; never chosen by the error), shown below the dense table.
LONG_CHOICES = (
    ("XTuner: ZeRO stage (not stated by the benchmark page)",
     "ZeRO-3. The SP page of the same docs (docs/zh_cn/acceleration/train_extreme_long_sequence.rst at 7575f2c91) "
     "says (translated) that XTuner's SP 'supports training 100B-scale models' and 'can also be combined with the "
     "ZeRO3 memory optimisation to train large models', and its only measured configuration "
     "(Table 1) is ZeRO-3; its example launch command passes --deepspeed deepspeed_zero2, which cannot hold the 34B "
     "and 70B models' 16-bit weights on an 80 GB GPU (memo: no fit, the ZeRO-2 variant beside each row)"),
    ("XTuner: precision",
     "bf16. With --deepspeed, xtuner/tools/train.py at 7575f2c91 replaces the config's AmpOptimWrapper(dtype="
     "'float16') by DeepSpeedOptimWrapper and resolves the DeepSpeed json's 'fp16': auto and 'bf16': auto (both "
     "so in deepspeed_zero2.json and deepspeed_zero3.json) with auto_dtype_of_deepspeed_config "
     "(xtuner/tools/utils.py): both true on an A100, so fp16 off and bf16 on. memo's xtuner framework data runs "
     "bf16 with DeepSpeed's zero recipe (16-bit gradients, reduced in bf16: DeepSpeed's engine accumulates gradients in the "
     "model dtype unless data_types.grad_accum_dtype is set, and communicates in it); fp32 gradients are the "
     "'megatron recipe' variant beside each row"),
    ("XTuner: recompute, kernel, loss",
     "full recompute: SupervisedFinetune(use_activation_checkpointing=True) by default (xtuner/model/sft.py, line "
     "77; the configs do not override it) checkpoints every HF decoder layer, and the hook counts it (3 + 1); "
     "FlashAttention-2 (the SP page: flash-attn is required); HF's loss (fp32 logits, torch cross-entropy over every "
     "token of the rank's shard) as the xtuner framework data prices it (`memo_sim/frameworks/data/xtuner.yaml`: the "
     "torch_fused kernel; before it, 2026-11-26, the deepspeed framework's vocab_parallel one)"),
    ("XTuner: interconnect",
     "not stated (8 GPUs per node implied by the 8-GPU rows): profile a100-sxm4-80gb (4 x 200 Gb/s HDR per node, "
     "12.5 GB/s per GPU); the multi-node rows also run on dgx-a100-selene (8 HDR per node, 25 GB/s per GPU) beside"),
    ("XTuner: step time",
     "TGS = batch 1 x s/SP / iteration time (throughput_hook.py), an mmengine iteration being one micro-batch and "
     "the optimizer stepping once every accumulative_counts iterations; memo's step is GAS micro-batches and one "
     "optimizer step, against GAS x s / (SP x TGS): the table's TGS read as an average over whole accumulation "
     "cycles (its averaging window is not stated)"),
    ("Megatron-DeepSpeed DS4Science: model, batch, profile",
     "the table names neither model nor batch: GPT-30B, micro-batch 1, global batch 2 of the folder's only TP-32 "
     "script (pretrain_gpt_30B_seq_parallel.sh), only to derive a step time from the stated TFLOPS; profile "
     "a100-sxm4-40gb (a DGX A100 320GB node: the table's '4 NVIDIA DGX A100-40GB nodes, connected through 8 HDR "
     "InfiniBand'); framework megatron@2023 (the README's '2023 rebase' of Megatron-LM) with the script's "
     "--use-flash-attn-triton as the run's attention kernel (flash_triton)"),
)
LONG_LEFT_OUT = (
    ("XTuner 8K rows (Llama-2-7B, Yi-34B-200K, Llama-2-70B) and DS4Science's 2k-8k rows",
     f"below LONG_CONTEXT_TOKENS ({LONG_CONTEXT_TOKENS}); issue #45 item 1 adds the long-context runs"),
    ("XTuner SP page Table 1, SP 1 on 16 / 32 / 64 GPUs ('OOM')", "memory outcomes with no time: a memory check, "
     "not a step time"),
    ("DS4Science 'Old Megatron-DeepSpeed' column at 16k-256k ('OoM')", "memory outcomes with no time"),
)


# --- Mixture-of-experts group (issue #49 item 7) -------------------------------------------------------------
# Sources (research notes: benchmarks/moe_published_sources.md). The Megatron-Bridge performance summaries,
# NeMo's performance pages and the Llama 3 405B table are kept apart as an independent check and not used.
MOE_ZOO = ("NVIDIA/Megatron-LM examples/moe-modelzoo at commit f13818d695 (2026-07-16; the Megatron MoE Model Zoo, "
           "also yanring/Megatron-MoE-ModelZoo): best_practice/qwen3/readme.md (H100 table, 'InfiniBand 8x50 GB/s'), "
           "best_practice/mixtral/run_mixtral_8x22B.sh with runtime_configs/benchmarking/runtime.conf, "
           "model_configs/benchmarking/*.yaml and sbatch_benchmarking.sh")
MOE_FOLDING = ("Liu, Yan et al. 2025, MoE Parallel Folding (arXiv 2504.14960), Tables 1-3 and 5 (Eos, DGX H100, "
               "IB 400 Gb/s, PyTorch 2.5.0, CUDA 12.6, BF16, token drop at capacity factor 1, MFU over 989.5 TFLOP/s); "
               "micro-batch and schedule from the same authors' yanring/Megatron-MoE-ModelZoo at its first commit "
               "78fd4d6 (2025-04-03), runtime_configs/benchmarking/runtime.conf")
MOE_FLAGPERF = ("FlagOpen/FlagPerf training/nvidia/mixtral_8x7B-megatron (README and config at 68d2944f88, launcher "
                "training/benchmarks/mixtral_8x7B/megatron at a31c50820e) and training/nvidia/qwen1.5_MoE-megatron "
                "(README, config and megatron_pai_main.sh at 6faf9c1f67); token/p/s = global batch x seq / step "
                "time / GPUs "
                "(run_pretraining.py reads Megatron's 'elapsed time per iteration')")
MOE_ISSUE = ("NVIDIA/Megatron-LM issue #756 (2024-04), the reporter's log at commit ba773259db: 16 H100, TP 2, EP 8, "
             "DP 8, global batch 128, alltoall dispatcher, 'elapsed time per iteration (ms): 5523.5'")


def megatron_moe_flops(m: ModelConfig, batch: int, seq: int, commit: str) -> float:
    """Megatron-LM's ``num_floating_point_operations(args, batch)`` (megatron/training/training.py), the
    FLOPs its logged 'throughput per GPU (TFLOP/s/GPU)' divides by step time x GPUs, for a GQA/MHA MoE
    model without MTP. Two forms, each transcribed from its commit:

    - ``"c230e0d7c2"`` (2024-11-21; the form until 8873b55d6a, 2025-03-06): 12·B·s·l·h²·((1 + g/a + s/h)·r
      + f/h·k·γ + f_sh/h·γ + V/(2·l·h)), attention counted whole (non-causal), f = --ffn-hidden-size
      (= the expert width for the models here, which give no --moe-ffn-hidden-size);
    - ``"1e057005"`` (2025-05-24; the same terms at e8692183, 2025-12-15): B·s·(12·l·h·(f_e·k·γ + f_sh·γ)
      + 12·l·h²·(1 + g/a + s/(2h))·r + 6·h·V), causal attention counted at half;

    r = kv_channels·a/h, γ = 3/2 for SwiGLU, k = top-k, V the padded vocabulary (every layer a MoE layer)."""
    h, l, a, g = m.hidden, m.layers, m.heads, m.n_kv_heads
    r = (m.head_dim or h // a) * a / h
    gam = 1.5 if m.ffn_type == "swiglu" else 1.0
    f_e, f_sh = m.expert_ffn or m.ffn, m.shared_experts * (m.shared_ffn or m.expert_ffn or m.ffn)
    if commit == "c230e0d7c2":
        return 12.0 * batch * seq * l * h * h * ((1 + g / a + seq / h) * r + f_e / h * m.top_k * gam + f_sh / h * gam
                                                 + m.vocab / (2 * l * h))
    if commit == "1e057005":
        return batch * seq * (12.0 * l * h * (f_e * m.top_k * gam + f_sh * gam)
                              + 12.0 * l * h * h * (1 + g / a + seq / h / 2) * r + 6.0 * h * m.vocab)
    raise ValueError(commit)


def _moe(name, layers, hidden, heads, kv, ffn, vocab, experts, top_k, expert_ffn=0, shared_ffn=0, bias="none",
         head_dim=0, qk_norm=False):
    return ModelConfig(name, layers, hidden, heads, ffn, vocab=vocab, kv_heads=kv, ffn_type="swiglu", norm="rmsnorm",
                       bias=bias, tied_embeddings=False, head_dim=head_dim, qk_norm=qk_norm, experts=experts,
                       top_k=top_k, expert_ffn=expert_ffn, shared_experts=1 if shared_ffn else 0, shared_ffn=shared_ffn)


# the models as the sources' launch files give them (vocabularies padded as Megatron pads them:
# --make-vocab-size-divisible-by x TP)
# ModelZoo Mixtral-8x22B.yaml (its tokenizer: 32768 tokens)
MIXTRAL_8X22B = _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 8, 2)
QWEN2_57B = _moe("qwen2-57b-a14b", 28, 3584, 28, 4, 2560, 151936, 64, 8, shared_ffn=20480,
                 bias="qkv")  # ModelZoo 78fd4d6 Qwen2-57B-A14B.yaml (--add-qkv-bias, no shared-expert gate flag)
QWEN3_235B = _moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 128, 8, expert_ffn=1536, head_dim=128,
                  qk_norm=True)  # ModelZoo Qwen3-235B-A22B.yaml
G8T8 = _moe("mixtral-8x22b-g8t8", 56, 6144, 48, 8, 2048, 32768, 64, 8)  # Folding paper sec. 4.1: 64 experts of 16384/8
MIXTRAL_8X7B = replace(PRESETS["mixtral-8x7b"], vocab=32768)  # 32000 padded to a multiple of 128 x TP 8
FLAGPERF_MOE = _moe("flagperf-qwen1.5-moe", 24, 2048, 16, 16, 5504, 151936, 8, 2, bias="qkv")  # megatron_pai_main.sh

_ZOO_OVERLAPS = "--tp-comm-overlap, --overlap-param-gather"



# beside a row: every expert the same tokens (memo's forced balance, load factor 1), which Megatron's
# --moe-router-force-load-balancing does not give (its random logits load the EP ranks as a uniform router does)
EQUAL_LOADS = "equal loads (forced)"
_EQUAL = ((EQUAL_LOADS, (("moe_balance", "forced"),)),)


def _zoo_mixtral(rid, what, tflops, balance, gemm="bf16", extra=""):
    f = megatron_moe_flops(MIXTRAL_8X22B, 256, 4096, "1e057005")
    return Run(
        f"moe-zoo-mixtral-8x22b-{rid}", MOE_ZOO,
        f"Mixtral-8x22B, 128 H100 (16 nodes), TP 2 x PP 8 (VPP 7, 1 layer per chunk) x DP 8, EP 8, ETP 1, CP 1, "
        f"micro-batch 1, global batch 256, s=4096, {'BF16' if gemm == 'bf16' else 'FP8 block-wise (PR=fp8)'}, alltoall "
        f"dispatcher, grouped GEMM, no recompute, distributed optimizer; {what}",
        f / (tflops * 1e12 * 128),
        f"'performance should be around {tflops} TFLOPS' (script comment: an expected value, not a logged "
        f"measurement) x 128 GPUs over training.py's FLOPs at 1e057005 (the script dates from 2025-12)",
        framework="megatron", profile="h100-sxm5-80gb", group="moe", arch=MIXTRAL_8X22B, tp=2, sp=True, pp=8, vpp=7,
        dp=8, zero=1, ep=8, etp=1, seq=4096, global_batch=256, micro_batch=1,
        schedule_source="micro-batch 1, interleaved 1F1B with 7 chunks per GPU: runtime.conf at f13818d695 "
                        "(Mixtral-8x22B: TP 2, PP 8, EP 8, VPP 7, MBS 1, GBS 256, 16 nodes)",
        policy="store_all", dtype="bf16", moe_balance=balance, gemm_format=gemm, expected=True,
        not_modelled=(_ZOO_OVERLAPS if gemm == "bf16" else "--fp8-param-gather, bf16 Adam moments "
                      "(--use-precision-aware-optimizer), --overlap-param-gather") + extra,
        variants=((("VPP 1 (1F1B)", (("vpp", 1),)),) + (_EQUAL if balance == "dropless" else ())
                  if gemm == "bf16" else (("bf16 GEMMs", (("gemm_format", "bf16"),)),)))


def _folding(rid, model_, name, gpus, tp, ep, pp, etp, mfu, why=None, seq=4096, gbs=256, cp=1, zoo=None, stated=None):
    tflops = stated or round(mfu * 989.5, 1)
    f = megatron_moe_flops(model_, gbs, seq, "c230e0d7c2")
    folded = "MCore w/ Folding" if etp == 1 else "MCore"
    cfg = (f"{name}, {folded}: {gpus} H100, TP {tp} x CP {cp} x PP {pp} x DP {gpus // (tp * cp * pp)}, EP {ep}, "
           f"ETP {etp}{' (= TP: not folded)' if etp == tp and etp > 1 else ''}, global batch {gbs}, s={seq}, BF16, "
           f"token drop at capacity factor 1, All-to-All-V dispatcher; MFU {100 * mfu:.1f}%")
    note = (f"MFU {100 * mfu:.1f}% x 989.5 = {tflops} TFLOP/s per GPU" + (" (also stated in Table 2)" if stated else "")
            + f" x {gpus} GPUs over training.py's FLOPs in the form before 8873b55d6a (c230e0d7c2): the paper names "
            "no formula; its PyTorch 2.5.0 + CUDA 12.6 (NGC 24.09/24.10 containers) dates the runs to late 2024")
    kw = dict(framework="megatron", profile="h100-sxm5-80gb", group="moe", arch=model_, tp=tp, sp=True, cp=cp, pp=pp,
              dp=gpus // (tp * cp * pp), zero=1, ep=ep, etp=etp, seq=seq, global_batch=gbs, policy="store_all",
              dtype="bf16", moe_balance="capacity:1", why_not=why)
    if zoo:
        kw.update(micro_batch=1, vpp=zoo[0], schedule_source=zoo[1], not_modelled=zoo[2])
    return Run(f"moe-folding-{rid}", MOE_FOLDING, cfg, f / (tflops * 1e12 * gpus), note, **kw)


_FOLD_NO_SCHED = ("the paper states neither the micro-batch size nor the schedule (interleaved or not) and the "
                  "Model Zoo recipe of its time gives them for the folded {m} layout only; memo does not guess them")
# Qwen3-235B-A22B rows of the Model Zoo's H100 tables (best_practice/qwen3/readme.md at f13818d695). What each
# row runs with, from the launch files of the same commit: the yaml sets --account-for-embedding-in-pipeline-split
# --account-for-loss-in-pipeline-split and --num-layers-per-virtual-pipeline-stage ${LAYERS_PER_VP}, runtime.conf
# gives Qwen3-235B-A22B LAYERS 96 ("Account loss and embedding for number of layers") so LAYERS_PER_VP =
# 96 / PP / VPP: the slot split of memo's `account_embedding_loss` (no --pipeline-model-parallel-layout string);
# sbatch_benchmarking.sh: DISPATCHER defaults to deepep (flex), PR=bf16 adds --tp-comm-overlap, A2A_OVERLAP=1 adds
# --delay-wgrad-compute --overlap-moe-expert-parallel-comm; runtime.conf's MBS is 1; yaml: ETP 1,
# --overlap-grad-reduce, --overlap-param-gather, sequence parallel, fp32 router with aux loss 1e-3, permute and
# router fusion, expandable_segments.
_QWEN3_FLOPS = "x 256 GPUs over training.py's FLOPs at 1e057005 (the table's 'Code' column); GBS {gbs}, s={s}"
_QWEN3_SPLIT = ("94 layers + the embedding's and the loss's slots = 96 over pp x vpp = {c} chunks of {k} (yaml "
                "--account-for-embedding/loss-in-pipeline-split, --num-layers-per-virtual-pipeline-stage "
                "${{LAYERS_PER_VP}} = 96 / PP / VPP, runtime.conf LAYERS 96)")
_QWEN3_NET = ("stated hardware 'NVLink 4th Generation, InfiniBand 8x50 GB/s' = the profile's NVLink (450 GB/s line "
              "rate, the 370 GB/s NCCL reaches of it, all-reduce 480 GB/s over NVLink SHARP) and 50 GB/s per GPU (8 x "
              "400 Gb/s per node)")
_QWEN3_OVERLAPS = "--tp-comm-overlap (PR=bf16), --overlap-param-gather, --manual-gc"
_FORCED_ASSUMED = ("balance not stated by the table: memo runs Megatron's forced balance, as every 4K-sequence H100 "
                   "command of run_235b.sh / run_h100_235b.sh passes --moe-router-force-load-balancing: random router "
                   "logits (memo's random balance, a uniform router's loads; equal loads are given beside the row)")
_A3_UNSTATED = ("Megatron-FSDP's settings beside 'FSDP On' are not stated (no script or yaml of the row): memo runs "
                "optim_grads_params (ZeRO 3: the 235B model's expert weights, 57 GB a GPU at EP 8 in bf16, fit "
                "only sharded) with the gradients reduce-scattered in fp32, Megatron's default under bf16 "
                "(accumulate_allreduce_grads_in_fp32; --grad-reduce-in-bf16 halves them, given beside the row)")


def _zoo_qwen3(rid, cfg, tflops, why=None, gbs=2048, seq=4096, stated_step=None, tp=2, cp=1, pp=8, vpp=4, ep=32,
               dispatcher="deepep", balance="random", policy="recompute_norm_act", not_modelled="", variants=(),
               zero=1, micro_batch=1, schedule_source=None, ep_overlap=False):
    f = megatron_moe_flops(QWEN3_235B, gbs, seq, "1e057005")
    pub = stated_step if stated_step else f / (tflops * 1e12 * 256)
    note = (f"stated step time {stated_step} s ({tflops} TFLOP/s per GPU, consistent with training.py at 1e057005 "
            f"to {100 * abs(f / (tflops * 1e12 * 256) / stated_step - 1):.1f}%)" if stated_step
            else f"{tflops} TFLOP/s per GPU " + _QWEN3_FLOPS.format(gbs=gbs, s=seq))
    split = _QWEN3_SPLIT.format(c=pp * vpp, k=96 // (pp * vpp))
    return Run(f"moe-zoo-qwen3-235b-{rid}", MOE_ZOO, cfg, pub, note, framework="megatron", profile="h100-sxm5-80gb",
               group="moe", arch=QWEN3_235B, seq=seq, global_batch=gbs, dtype="bf16", why_not=why, tp=tp, sp=True,
               cp=cp, pp=pp, vpp=vpp, dp=256 // (tp * cp * pp), zero=zero, ep=ep, etp=1, micro_batch=micro_batch,
               account_embedding_loss=pp > 1, moe_dispatcher=dispatcher, moe_balance=balance, policy=policy,
               ep_overlap=ep_overlap, schedule_source="" if why else schedule_source if schedule_source is not None else (
                   f"micro-batch 1 (runtime.conf), interleaved 1F1B with {vpp} chunks per GPU; {split}"),
               not_modelled="; ".join(x for x in (not_modelled, _QWEN3_OVERLAPS, _QWEN3_NET) if x), variants=variants)


_A1 = ("Qwen3-235B-A22B, 256 H100 (32 nodes), TP 2 x PP 8 (VPP 4) x DP 16, EP 32 (across 4 nodes), ETP 1, MBS 1, "
       "GBS 2048 (GA 128), s=4096, BF16, DeepEP (flex), --recompute-modules layernorm moe_act; code moe_dev(f3e6c5)")
# the readme's TFLOP/s per GPU of the long-context rows: (s, CP, forced balance, dropless)
_QWEN3_LONG_TF = ((16384, 1, 295, 237), (32768, 2, 335, 277), (65536, 4, 368, 320), (131072, 8, 389, 357))
_QWEN3_LONG = ("Qwen3-235B-A22B long context, 256 H100 (32 nodes), TP 4 x CP {cp} x PP 8 (VPP 4) x DP {dp}, EP 8 "
               "(in the node), ETP 1, MBS 1, GBS 256, s={seq}, BF16, DeepEP (flex), --recompute-modules layernorm moe, "
               "A2A_OVERLAP=0, {bal} (the readme's {tf} TFLOP/s; code not stated)")



# FlagPerf's Megatron launch lines (megatron_main.sh, megatron_pai_main.sh) pass no --overlap-grad-reduce: the
# gradients are reduced after the whole backward, as megatron@2021 does (`Layout.grad_overlap`)
_NO_GRAD_OVERLAP = (("grad_overlap", False),)

MOE_RUNS: tuple[Run, ...] = (
    _zoo_mixtral("dropless", "dropless (aux-loss router)", 445, "dropless"),
    _zoo_mixtral("forced", "--moe-router-force-load-balancing", 465, "random"),
    _zoo_mixtral("fp8-forced", "forced balance, PR=fp8 (--fp8-recipe blockwise)", 560, "random", gemm="fp8-blockwise"),
    _zoo_mixtral("capacity1", "token drop: --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity", 470,
                 "capacity:1"),
    _folding("mixtral-8x22b", MIXTRAL_8X22B, "Mixtral-8x22B", 128, 2, 8, 8, 1, 0.493, stated=487.7,
             zoo=(1, "micro-batch 1, 1F1B (VPP 1): yanring/Megatron-MoE-ModelZoo runtime.conf at 78fd4d6 "
                     "(Mixtral-8x22B: TP 2, PP 8, EP 8, VPP 1, MBS 1, GBS 256, 16 nodes; yaml: ETP 1), the same "
                     "layout, GPUs and batch as the paper's folded row",
                  _ZOO_OVERLAPS + " (the recipe's yaml)")),
    _folding("qwen2-57b", QWEN2_57B, "Qwen2-57B-A14B", 64, 2, 4, 4, 1, 0.390,
             zoo=(7, "micro-batch 1, interleaved 1F1B with 7 chunks per GPU: yanring/Megatron-MoE-ModelZoo "
                     "runtime.conf at 78fd4d6 (Qwen2-57B-A14B: TP 2, PP 4, EP 4, VPP 7, MBS 1, GBS 256, 8 nodes; "
                     "yaml: ETP 1), the same layout, GPUs and batch as the paper's folded row",
                  "--moe-shared-expert-overlap (the shared expert beside the dispatch), --overlap-param-gather")),
    Run("moe-flagperf-mixtral-8x7b", MOE_FLAGPERF,
        "Mixtral-8x7B, 32 H100 (4 DGX nodes, IB 400 Gb/s), PP 2 x DP 2 x TP 8 with SP, EP 1 (README 'PP2DP2EP1TP8'; "
        "the launcher's --expert-model-parallel-size 8 cannot run at DP 2 in core_v0.6.0), experts split over TP "
        "(ETP 8), micro-batch 3, global batch 1200, s=4096, BF16, --recompute-activations (selective), distributed "
        "optimizer, grouped GEMM, default (allgather) dispatcher, dropless; megatron-core core_v0.6.0",
        1200 * 4096 / (2844.0 * 32), "2844.0 tokens/GPU/s (README) at global batch 1200 x 4096 tokens over 32 GPUs",
        framework="megatron", profile="h100-sxm5-80gb", group="moe", arch=MIXTRAL_8X7B, tp=8, sp=True, pp=2, dp=2,
        zero=1, ep=1, etp=8, seq=4096, global_batch=1200, micro_batch=3,
        schedule_source="micro-batch 3 (config_H100x4x8.py localbs), 1F1B (no virtual stages in megatron_main.sh)",
        policy="selective_recompute", dtype="bf16", moe_dispatcher="allgather", launch=_NO_GRAD_OVERLAP,
        not_modelled="the updated weights all-gathered after the optimizer step (no --overlap-param-gather: memo "
                     "prices that on one stage only and overlaps them here); core_v0.6.0's allgather dispatcher's own "
                     "permutation kernels"),
    *(Run(f"moe-flagperf-qwen1.5-moe-{pr}", MOE_FLAGPERF,
          f"FlagPerf 'qwen1.5_14B_MoE' (24 layers, h=2048, 16 heads, FFN 5504, 8 experts top-2, QKV bias), 8 A800 "
          f"(one DGX node), TP 1 x PP 2 x DP 4, EP 1, micro-batch 1, global batch 512, s=8192, {pr.upper()}, "
          f"--recompute-activations (selective), distributed optimizer, no grouped GEMM; Pai-Megatron-Patch on "
          f"Megatron-LM-240405", 512 * 8192 / (tps * 8), f"{tps} tokens/GPU/s (README) at global batch 512 x 8192 "
          "tokens over 8 GPUs", framework="megatron", profile="a800-80gb", group="moe", arch=FLAGPERF_MOE, tp=1,
          pp=2, dp=4, zero=1, seq=8192, global_batch=512, micro_batch=1,
          schedule_source="micro-batch 1 (config_A800x1x8.py batchsize), 1F1B (no virtual stages in the script)",
          policy="selective_recompute", dtype=pr, moe_dispatcher="allgather", launch=_NO_GRAD_OVERLAP,
          not_modelled="the updated weights all-gathered after the optimizer step (no --overlap-param-gather: memo "
                       "prices that on one stage only and overlaps them here); experts run one GEMM each "
                       "(SequentialMLP, no --moe-grouped-gemm: memo prices each expert's GEMM alone either way, with "
                       "no host time between them)")
      for pr, tps in (("bf16", 7450.7), ("fp16", 7537.7))),
    # the Model Zoo's Qwen3-235B-A22B H100 rows (A1-A5 of the research notes: stated step times; A7-A10: TFLOP/s,
    # forced balance and dropless each measured)
    _zoo_qwen3("a1-ep32", _A1 + "; A2A_OVERLAP=0 (the table's row without '+1f1b overlap'); CUDA graphs not stated",
               245, stated_step=19.7, not_modelled=_FORCED_ASSUMED, variants=_EQUAL),
    _zoo_qwen3("a2-ep32-a2a-overlap", _A1 + "; '+1f1b overlap': A2A_OVERLAP=1 (--overlap-moe-expert-parallel-comm "
               "--delay-wgrad-compute, CUDA_DEVICE_MAX_CONNECTIONS=32, 24 SMs kept from the norms); CUDA graphs not "
               "stated (run_235b.sh's H100 baseline line is this layout with A2A_OVERLAP=1 and forced balance)", 276,
               stated_step=17.6, ep_overlap=True,
               variants=_EQUAL + (("the all-to-all exposed (a1's run, no EP overlap)", (("ep_overlap", False),)),),
               not_modelled="the wave quantisation and HBM traffic of the all-to-all kernels beside the compute under "
               "the EP overlap (the 20 SMs Megatron-LM gives DeepEP are taken from the kernels beside them since "
               "2026-12-03: memo_sim/cost/comm_sms.py); " + _FORCED_ASSUMED),
    _zoo_qwen3("a3-fsdp", "Qwen3-235B-A22B, 256 H100, TP 2 x DP 128 (Megatron FSDP), EP 8, EDP 32, MBS 4, GBS 2048, "
               "s=4096, BF16, DeepEP, full recompute; code 1e057005", 276,
               stated_step=17.6, tp=2, pp=1, vpp=1, ep=8, policy="full_recompute", zero=3, micro_batch=4,
               schedule_source="micro-batch 4, GA 4 (the table's MBS and GA columns), one stage",
               not_modelled=_A3_UNSTATED + "; " + _FORCED_ASSUMED,
               variants=_EQUAL + (("gradients reduced in bf16 (--grad-reduce-in-bf16)", (("precision", "zero"),)),)),
    _zoo_qwen3("a4-pp32-alltoall", "Qwen3-235B-A22B, 256 H100, TP 2 x PP 32 (VPP 3) x DP 4, EP 8, ETP 1, MBS 1, "
               "GBS 2048 (GA 512), s=4096, BF16, alltoall (DISPATCHER=A2A), --recompute-modules layernorm moe_act; "
               "code 1e057005", 200, stated_step=24.2, pp=32, vpp=3, ep=8, dispatcher="alltoall",
               schedule_source="micro-batch 1 (runtime.conf), interleaved 1F1B with 3 chunks per GPU: PP 32 x VPP 3 = "
                               "96 model chunks of one slot each (LAYERS_PER_VP = 96 / 32 / 3 = 1 with the yaml's "
                               "--account-for-embedding/loss-in-pipeline-split; no --pipeline-model-parallel-layout "
                               "string): the first chunk runs the embedding alone, the last the loss alone",
               not_modelled=_FORCED_ASSUMED, variants=_EQUAL + (("VPP 1 (1F1B)", (("vpp", 1),)),)),
    _zoo_qwen3("a5-tp4", "Qwen3-235B-A22B, 256 H100 (32 nodes), TP 4 x PP 8 (VPP 4) x DP 8, EP 8 (in the node), ETP 1, "
               "EDP 4, MBS 1, GBS 2048 (GA 256), s=4096, BF16, DeepEP (flex), no recompute (the table's column is "
               "blank), A2A_OVERLAP=0; CUDA graphs not stated; code 1e057005", 167, stated_step=29.0, tp=4, ep=8,
               policy="store_all", not_modelled=_FORCED_ASSUMED,
               variants=_EQUAL + (("recompute_norm_act", (("policy", "recompute_norm_act"),)),)),
    *(_zoo_qwen3(f"long-{seq // 1024}k-{bal}", _QWEN3_LONG.format(cp=cp, dp=8 // cp, seq=seq, tf=tf, bal=(
                 "--moe-router-force-load-balancing" if bal == "forced" else "dropless (aux-loss router, no forced "
                 "balance)")), tf, gbs=256, seq=seq, tp=4, cp=cp, ep=8, balance="random" if bal == "forced" else bal,
                 policy="recompute_moe",
                 not_modelled="" if bal == "forced" else "the aux-loss router's real expert loads (memo's dropless "
                 "takes a uniform router's)")
      for seq, cp, forced, dropless in _QWEN3_LONG_TF
      for bal, tf in (("forced", forced), ("dropless", dropless))),
    # not expressible yet (listed with the reason, never dropped)
    _folding("mixtral-8x22b-mcore", MIXTRAL_8X22B, "Mixtral-8x22B", 128, 2, 4, 8, 2, 0.463, stated=458.3,
             why=_FOLD_NO_SCHED.format(m="Mixtral-8x22B")),
    _folding("qwen2-57b-mcore", QWEN2_57B, "Qwen2-57B-A14B", 64, 2, 4, 4, 2, 0.353,
             why=_FOLD_NO_SCHED.format(m="Qwen2-57B-A14B")),
    _folding("g8t8-mcore", G8T8, "Mixtral-8x22B-G8T8", 128, 2, 8, 8, 2, 0.171,
             why="no recipe states its micro-batch or schedule; the upcycled model is not public"),
    _folding("g8t8", G8T8, "Mixtral-8x22B-G8T8", 128, 4, 8, 8, 1, 0.288,
             why="no recipe states its micro-batch or schedule; the upcycled model is not public"),
    *(_folding(f"mixtral-8x22b-{seq // 1024}k{'' if etp == 1 else '-mcore'}", MIXTRAL_8X22B, "Mixtral-8x22B", gpus,
               tp, ep, 8, etp, mfu, seq=seq, gbs=gbs, cp=cp,
               why="Table 5 states neither the micro-batch size nor the schedule, and no recipe gives them at this "
                   "context; memo does not guess them")
      for gpus, seq, cp, tp, ep, etp, gbs, mfu in (
          (128, 16384, 4, 2, 4, 2, 1024, 0.453), (256, 32768, 8, 2, 4, 2, 512, 0.432),
          (512, 65536, 16, 2, 4, 2, 256, 0.426), (1024, 131072, 16, 4, 8, 4, 128, 0.382),
          (128, 16384, 4, 2, 8, 1, 1024, 0.476), (256, 32768, 8, 2, 8, 1, 512, 0.451),
          (512, 65536, 8, 4, 8, 1, 256, 0.445), (1024, 131072, 8, 8, 8, 1, 128, 0.429))),
    Run("moe-issue756-mixtral-8x7b", MOE_ISSUE,
        "Mixtral-8x7B, 16 H100, TP 2 x DP 8, EP 8, global batch 128, BF16, alltoall; sequence length, micro-batch, "
        "sequence parallelism and recompute not in the stored excerpts of the thread", 5.5235,
        "stated: 'elapsed time per iteration (ms): 5523.5' (iteration 99, 236.4 TFLOP/s/GPU)", framework="megatron",
        profile="h100-sxm5-80gb", group="moe", arch=MIXTRAL_8X7B, dtype="bf16",
        why_not="the thread's argument dump with seq_length, micro_batch_size, sequence_parallel and the recompute "
                "settings of this run could not be read (s=2048 is the only length that makes the logged 236.4 "
                "TFLOP/s agree with training.py, but memo does not infer inputs from the published number)"),
)
# Rows of the sources left out altogether: (what, why).
MOE_LEFT_OUT = (
    ("Folding paper Table 3, Llama3-8x70B (MCore 38.8%, w/ Folding 41.6%)",
     "the upcycled model's top-k is not stated, so neither its FLOPs nor the step time follow; the folded row's "
     "ETP is blank in the transcription"),
    ("Folding paper Table 2, Mixtral-8x22B FP8 (575.1 / 631.7 TFLOP/s)",
     "layouts not restated for FP8; FP8 delayed scaling (amax history) is not modelled"),
    ("Folding paper Table 4 (strong scaling, GBS 1024)", "read from a transcription with merged cells"),
    ("Model Zoo Qwen3-Next-80B-A3B (2.2 s)", "gated DeltaNet linear attention is not modelled"),
    ("Model Zoo GB200/GB300 Qwen3-235B and the Megatron DeepSeek-V3 GB200 study",
     "HybridEP dispatcher, MXFP8 with activation offloading, CUDA graphs and the custom pipeline layout "
     "('Et|(tt|)*30L') are not modelled; no GB300 profile"),
    ("DeepSeek-V3 / V2 reports", "whole-run GPU-hour averages, not step times"),
)

# Rows of the MoE group off by more than 10%, the mechanism memo is missing (analysis of the row after it was
# run, not a correction: nothing here changes a prediction).
def _beside(r: Result, label: str, text: Callable[[float], str]) -> str:
    """``text`` of the row's variant ``label`` (memo's step beside the row), or '' where it was not run."""
    v = dict(r.variants).get(label)
    return text(v) if v else ""


def _moe_run(rid: str) -> Run:
    return next(r for r in MOE_RUNS if r.id == rid)


def _share(run: Run, *parts: str) -> str:
    """The share of ``parts`` in one MoE layer's forward + backward as memo prices it (`memo_sim.report.moe_split`,
    the busiest expert rank's ops alone on the GPU), in percent."""
    split = moe_split(run.model(), run.layout(), run.micro_batch or 1, run.seq, load_profile(run.profile))
    total = sum(v for phase in split.time_s.values() for v in phase.values())
    return f"{100 * sum(phase.get(p, 0.0) for phase in split.time_s.values() for p in parts) / total:.0f}%"


def _ep_nodes(run: Run) -> str:
    """The nodes memo places the run's first EP group on (`memo_sim.layout.parallel.expert_group_ranks`), on the
    layout it prices a layer on (a pipeline's: the stage's shard, `memo_sim.layout.parallel.stage_shard`)."""
    lay, gpn = run.layout(), load_profile(run.profile).node_gpus
    lay = stage_shard(lay) if lay.pp > 1 else lay
    ranks = expert_group_ranks(lay, lay.ep, lay.etp)
    nodes = len({q // gpn for q in ranks})
    return f"{nodes} node{'s' if nodes > 1 else ''}, {ranks_per_node(ranks, gpn)} ranks on a node"


def _stream_words(run: Run) -> str:
    """Where memo's step of ``run`` goes (the event simulator's ops, recorded): the data-parallel stream's busy
    seconds (its gathers and reduce-scatters apart) against the compute's and the expert dispatcher's."""
    sim = simulate(run.model(), run.layout(), run.global_batch // run.dp, run.seq, get_policy(run.policy),
                   load_profile(run.profile), keep_timeline=False, schedule=run.schedule(),
                   micro_batch=run.micro_batch, record=True)
    busy: dict[str, float] = {}
    for o in sim.ops:
        if o.end is not None:
            key = o.stream if o.stream != "dp_comm" else ("gather" if "gather" in o.name else "reduce")
            busy[key] = busy.get(key, 0.0) + o.end - o.start
    dp = busy.get("gather", 0.0) + busy.get("reduce", 0.0)
    return (f"memo's data-parallel stream is busy {dp:.1f} s of its {sim.iteration_s:.2f} s step (the fp32 "
            f"reduce-scatters {busy.get('reduce', 0.0):.1f} s, the gathers {busy.get('gather', 0.0):.1f} s) against "
            f"{busy.get('compute', 0.0):.1f} s of compute and {busy.get('ep_comm', 0.0):.1f} s of DeepEP dispatch "
            "and combine")


_VPP7 = lambda r: (  # noqa: E731
    "the interleaved schedule with one-layer chunks (VPP 7). memo gives it the whole bubble reduction of 7 chunks "
    "per GPU" + _beside(r, "VPP 1 (1F1B)", lambda v: f": this row at VPP 1 (plain 1F1B, beside the row) predicts "
                                                    f"{v:.3f} s instead of {r.predicted_s:.3f} s")
    + ", and the Folding paper's row of this layout at VPP 1 is published at 4.210 s, "
    "within 1% of the capacity-1 row's expected 4.221 s, so on the cluster VPP 7 bought little. The mechanism to "
    "model is what each chunk boundary costs in Megatron: 7x the stage-to-stage sends (the last stage's send back "
    "to the first crosses nodes), each a synchronised batch_isend_irecv between chunks, with one layer of compute "
    "per chunk to hide them. --tp-comm-overlap and --overlap-param-gather are not modelled; modelling them would make "
    "memo faster still")
# Megatron-Core's MoE layer measured on an H200 (reports/gpu-h200-2026-11-27-megatron-moe-host.md): the mechanism
# the host-bound rows point to, not priced (its size for the stacks the rows ran is not measured)
_HOST_BOUND = (
    "Measured since (reports/gpu-h200-2026-11-27-megatron-moe-host.md; Megatron-Core at 1e057005 on one H200, its "
    "spec without TransformerEngine): the layer at a rank's share of a5 (16 heads, 16 experts of 512 tokens) "
    "took 59-60 ms a forward + backward for 15 ms of kernels, the host needing 42-47 ms to issue them and the "
    "dispatcher's synchronisation each forward draining the GPU's queue; a1's share 31-39 ms for 26 ms, FlagPerf "
    "Mixtral's (TP 8, micro-batch 3) 37-42 ms for 21 ms, a5's at 16K 193-195 ms for 147 ms: the ratios' order is "
    "the order of memo's errors on these rows. memo prices each kernel alone on the GPU, with no host issuing "
    "interval; the runs' own stacks (TransformerEngine's grouped GEMM and fused kernels, the router and permute "
    "fusions, DeepEP) issue far less than this spec (its 16 experts' Python loop alone is 10 ms of a5's forward) "
    "and are not in the device image, so their host time is not measured and memo sets none from these rows")
MOE_OUTLIERS: dict[str, str | Callable[[Result], str]] = {
    # the Model Zoo's Qwen3-235B-A22B rows (memo's per-layer split from `memo_sim.report.moe_split`, computed)
    "moe-zoo-qwen3-235b-a1-ep32": lambda r: (
        "memo too fast; not pinned down to one mechanism. memo prices the cross-node DeepEP dispatch and combine (EP "
        f"32 over {_ep_nodes(r.run)} as memo places the ranks, 50 GB/s per GPU) at "
        f"{_share(r.run, 'dispatch', 'combine')} of a layer, the experts' grouped GEMMs (4096 tokens per expert per "
        f"micro-batch, at the H100's measured 0.72 of the peak) at {_share(r.run, 'experts')}, attention (cuDNN 9.19 "
        f"as measured on an H200) at {_share(r.run, 'attention')}; the measured curves moved the row from -12.0%. "
        "What the row ran that memo does not model: the fp32 router with its aux-loss and the router/permute fusions, "
        "--manual-gc, and --tp-comm-overlap and --overlap-param-gather (those two would make memo faster still). The "
        "a2 row (the same layout with the all-to-all beside the other micro-batch's compute) ran 11% faster on the "
        "cluster; memo, which leaves the all-to-all exposed here, lands near a2's time (and prices a2's overlap since "
        "2026-12-03: that row). " + _HOST_BOUND),
    "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": lambda r: (
        "memo too fast: the EP overlap priced near its best, on top of a1's gap. memo merges each steady-state forward "
        "with the backward after it as Megatron-Core's combined 1F1B does (one more warm-up forward, each layer pair's "
        "dispatch and combine on the communication stream beside the other micro-batch's attention and experts, the "
        "experts' weight gradients after the dispatch's backward: memo_sim/engine/schedules/ep_overlap.py, read in "
        "Megatron-LM at d98e8a64), and so hides most of the cross-node DeepEP dispatch and combine, "
        f"{_share(r.run, 'dispatch', 'combine')} of a layer alone"
        + _beside(r, "the all-to-all exposed (a1's run, no EP overlap)",
                  lambda v: f": {r.predicted_s:.3f} s against {v:.3f} s with it exposed ({v / r.predicted_s:.2f}x)")
        + "; the cluster measured 1.12x between a1 (19.7 s) and this row (17.6 s). The 20 SMs the DeepEP kernels "
        "hold while the other micro-batch computes beside them are priced (the kernels beside them run on the "
        "other 112 of 132: memo_sim/cost/comm_sms.py; -30.0% before). What memo's overlap still gets that the "
        "cluster's does not: the wave quantisation those SMs cause mid-kernel and their HBM traffic, and a GPU kept "
        "busy by its host: where the host cannot issue the kernels as fast as they run (a1's gap, measured below), "
        "hiding a collective saves less than its time. These are named and not priced; no constant is set from "
        "this row. " + _HOST_BOUND),
    "moe-zoo-qwen3-235b-a3-fsdp": lambda r: (
        "memo too slow: the data-parallel collectives it prices exposed. Megatron-FSDP (memo's ZeRO 3, as "
        "custom_fsdp at 1e05700595 runs it) all-gathers each layer's weights before its forward and again before "
        "its recompute and backward and reduce-scatters its gradients after every micro-batch's backward (4 "
        "micro-batches of 4 sequences); the expert weights (16 experts a GPU at EP 8, 0.3B parameters a layer) "
        "shard over their 32 expert-data-parallel ranks, one per node, so every gather and reduce-scatter of theirs "
        "crosses InfiniBand on one GPU's 50 GB/s (the dense weights' group of 128 has 4 ranks a node, whose shares "
        "its ring's node hop rides since 2026-12-04: memo_sim/cost/collectives.py ring_params). "
        "{streams}, so the step is the collectives' time. The row states 'FSDP On' and nothing else".format(
            streams=_stream_words(r.run))
        + _beside(r, "gradients reduced in bf16 (--grad-reduce-in-bf16)",
                  lambda v: f": with the gradients reduce-scattered in bf16 (--grad-reduce-in-bf16, Megatron-FSDP's "
                            f"other setting) memo predicts {v:.2f} s ({100 * (v / r.run.published_s - 1):+.1f}%), "
                            "given beside the row and not counted")
        + ". Not modelled either: the table's 'disable log para norm' and --manual-gc."),
    "moe-zoo-qwen3-235b-a4-pp32-alltoall": lambda r: (
        "memo too fast; not pinned down. The pipeline is not where memo loses it: 32 stages over 512 micro-batches "
        "leave a small bubble, and memo's three chunks a GPU gain little over one"
        + _beside(r, "VPP 1 (1F1B)", lambda v: f" ({v:.3f} s at VPP 1 against {r.predicted_s:.3f} s)")
        + ". memo's layer, at a rank's share (2,048 tokens of TP 2, 16 local experts of about 1,024 routed tokens "
        f"each), is the alltoall dispatcher's dispatch and combine (eight routed copies of every token, EP 8 on "
        f"{_ep_nodes(r.run)} as memo places the ranks: {_share(r.run, 'dispatch')} each), the experts' grouped GEMMs "
        f"{_share(r.run, 'experts')}, attention {_share(r.run, 'attention')}. What the row ran that memo does not "
        "price: 96 "
        "one-layer chunks, each boundary a synchronised send between stages with one layer of compute to hide it, "
        "and the host's issuing of a layer of small kernels. " + _HOST_BOUND),
    "moe-zoo-qwen3-235b-a5-tp4": lambda r: (
        "memo too fast by far; not pinned down. memo predicts this layout faster than a1 (its EP 8 on "
        f"{_ep_nodes(r.run)} as memo places the ranks: dispatch and combine {_share(r.run, 'dispatch', 'combine')} of "
        f"memo's layer against a1's {_share(_moe_run('moe-zoo-qwen3-235b-a1-ep32'), 'dispatch', 'combine')}), the "
        "cluster measured it 47% slower (167 against 245 TFLOP/s). Neither the balance ("
        + _beside(r, EQUAL_LOADS, lambda v: f"equal loads {v:.3f} s, {100 * abs(v / r.predicted_s - 1):.1f}% from the "
                                            "row; ")
        + "a trained router's skew is not priced) nor the recompute reading (the "
        "table's blank column read as none; `recompute_norm_act` is beside the row) moves memo much, and the kernels "
        f"are measured now (experts {_share(r.run, 'experts')} of memo's layer: 512 tokens per expert per "
        "micro-batch at even loads, priced at 0.5-0.6 of the peak where the H200 ran these grouped GEMMs at "
        f"0.46-0.62; cuDNN attention {_share(r.run, 'attention')}); they moved the row from -42.4% to -45.7%. What "
        "changes from a1 that memo does not price: more and shorter "
        "kernels per layer (TP 4 splits the attention projections of h=4096 four ways; each expert a quarter of a1's "
        "tokens) with the host's launch time between them (memo prices each kernel alone on the GPU, with no CPU "
        "launch interval), the TP-4 sequence-parallel collectives with --tp-comm-overlap's userbuffer kernels taking "
        "SMs from the GEMMs, and a store-all run with 39 micro-batches in flight on the first rank (memo: "
        f"{r.peak_gib:.0f} GiB at peak; memo's micro-batch pipelines run no caching-allocator replay, so the yaml's "
        "expandable segments, which memo's megatron data runs without, move nothing here). " + _HOST_BOUND),
    "moe-zoo-qwen3-235b-long-16k-forced": lambda r: (
        f"memo too fast at 16K ({100 * r.error:+.1f}%) and by less at 32K-128K (their rows): the gap shrinks as "
        f"attention's share of memo's layer grows ({_share(r.run, 'attention')} at 16K, "
        f"{_share(_moe_run('moe-zoo-qwen3-235b-long-128k-forced'), 'attention')} at 128K), and attention is priced "
        "on cuDNN 9.19's kernel as measured on an H200 (56-65% of the peak forward; before that measurement these "
        "rows were +1% to +21% on an assumed 45-48%), so what is left lies in the rest of the layer: this is a5's "
        "layout (TP 4, EP 8), whose 4K row memo predicts far too fast (see it). " + _HOST_BOUND),
    **{f"moe-zoo-qwen3-235b-long-{k}-forced": (lambda r: (
        f"memo too fast ({100 * r.error:+.1f}%), by less than at 16K (moe-zoo-qwen3-235b-long-16k-forced: the rest "
        f"of the layer at a5's layout, where the host's issuing is measured); attention takes "
        f"{_share(r.run, 'attention')} of memo's layer here, priced as TransformerEngine's p2p ring runs it, one "
        "cuDNN kernel per ring step over the rank's two chunks (ring_merge te_p2p, read in its source) on the curve "
        "measured on an H200 at each kernel's size, with the passes its source makes beside them (the step outputs' "
        "corrections after the ring, the per-step dQ/dK/dV additions, in the model dtype: 1febe9a, which made these "
        "rows 0.8-1.5 points slower); what memo does not price of that ring: its per-step softmax-lse corrections "
        "(about 1.5% of the output corrections' bytes) and the two streams its steps' kernels alternate on (the "
        "megatron framework data's not_modelled)")) for k in ("32k", "64k", "128k")},
    **{f"moe-zoo-qwen3-235b-long-{k}-dropless": (
        "the router's real expert loads, on top of the forced row's gap at the same length. memo's dropless takes a "
        "uniform router's loads (the busiest of 8 EP ranks under multinomial routing), the loads the forced row's "
        "random logits give too (Megatron's --moe-router-force-load-balancing: memo's random balance), so memo "
        "predicts the two rows alike; the cluster measured dropless "
        + ", ".join(f"{f / d:.2f}x ({s // 1024}K)" for s, _cp, f, d in _QWEN3_LONG_TF) + " slower than "
        "forced balance, the slowdown shrinking as attention takes over the layer, as an imbalance of the MoE part "
        "alone would. The aux-loss router (coefficient 1e-3) leaves the busiest EP rank well above the mean; "
        "pricing it needs the run's measured expert loads, which memo takes as an input (`--moe-balance "
        "loads:FILE`, per-expert token counts per layer) but the Model Zoo does not publish; no constant is set "
        "from these rows") for k in ("16k", "32k", "64k", "128k")},
    "moe-zoo-mixtral-8x22b-dropless": lambda r: _VPP7(r) + (
        ". The dropless load (memo: the busiest of 8 EP ranks under a uniform router, as the forced row's random "
        "logits load them too) costs "
        + _beside(r, EQUAL_LOADS, lambda v: f"{100 * (r.predicted_s / v - 1):.1f}% over equal loads in memo; ")
        + "the script's values put it 4.5% below the forced row's throughput"),
    "moe-zoo-mixtral-8x22b-forced": _VPP7,
    "moe-zoo-mixtral-8x22b-capacity1": _VPP7,
    "moe-zoo-mixtral-8x22b-fp8-forced": lambda r: (
        "FP8 block-wise GEMMs. memo prices them on the FP8 peak (2x bf16's) on the profile's block-wise curve: the "
        "tensorwise curve torch._scaled_mm measured on an H200 (0.38-0.67 of that peak) over the block-wise kernel's "
        "time per tensorwise time on the same shapes in one run (1.10x at 1e11-2e11 FLOPs to 1.16x at 4e12: cuBLASLt's "
        "1x128 / 128x128 scale modes, measured 2026-12-04), with "
        "TransformerEngine's quantise/transpose casts of every GEMM input"
        + _beside(r, "bf16 GEMMs", lambda v: f"; that makes this run {v / r.predicted_s:.2f}x faster than the same run "
                                             f"with bf16 GEMMs ({v:.3f} s to {r.predicted_s:.3f} s, beside the row)")
        + ". The script's expected values give 1.20x (465 to 560 TFLOP/s). Not modelled: TransformerEngine's own "
        "block-scaling GEMM path of the run's release (the kernel measured is torch's call of cuBLASLt; TE on Hopper "
        "sets the same scale modes in its grouped GEMM, not checked for the run's version), "
        "--fp8-param-gather. This row also has the VPP-7 gap of the BF16 rows"),
    "moe-flagperf-mixtral-8x7b": (
        "not pinned down. memo puts the run at 36% MFU; FlagPerf measured 20.7%. What the run uses that memo does not "
        "model: core_v0.6.0's MoE layer at TP 8 without EP (its allgather dispatcher gathers all tokens of the TP "
        "group and permutes them with the index/scatter kernels of 2024, before permute fusion; memo prices the "
        "all-gather and one elementwise permute), and 75 of 80 GiB in use (allocator pressure); its gradients are "
        "reduced after the backward as the launch line has it (no --overlap-grad-reduce: 0.2% on memo's step). The "
        "source is "
        "weak as well: FlagPerf marks the number 'for performance reference only', its MFU (20.7%) disagrees with "
        "its own formula (21.9%), and its launcher's EP 8 contradicts the README's EP 1. Switching memo to the "
        "alltoall dispatcher (34.3 s) or to full recompute (42.5 s) did not close the gap (on the profile's assumed "
        "curves, before the Hopper kernels were measured). " + _HOST_BOUND),
    **{f"moe-flagperf-qwen1.5-moe-{pr}": (
        "the a800-80gb profile's kernel curves were fitted to the MEMO paper's statements (its provenance), not "
        "measured with FlashAttention-2 at s=8192 or with these small GEMMs. Not modelled from the run: "
        "Megatron-LM-240405's MoE path through Pai-Megatron-Patch (SequentialMLP: each of the 8 experts as its own "
        "GEMMs, with per-expert index_select permutation; fp32 router with aux loss); the gradients are reduced after "
        "the backward as the launch line has it (no --overlap-grad-reduce: under 0.1% on memo's step). The BF16 and "
        "FP16 rows move together (within a point of each other), so the "
        "precision recipe is not the cause. These rows ran SequentialMLP, the experts' loop that the measurement "
        "that follows found host-bound (on a later Megatron, an H200's host, not this A800 cluster's). " + _HOST_BOUND)
        for pr in ("bf16", "fp16")},
}
RUNS = RUNS + MOE_RUNS


# Rows whose |error| exceeds 10%, with the mechanism memo is missing or the input it lacks (analysis
# of the row, not a correction: nothing here changes a prediction).
_H100 = ("memo too fast, by more as the model shrinks (1.7B {e17}, 7.1B {e71}, 16B {e16}, 32B {e32}). Since "
         "2026-12-04 the distributed optimizer's gradient reduce-scatters and weight gathers over the 48 replicas "
         "(6 nodes) run their ring's node hop on the NIC shares of the group's ranks on the node (8 at TP 1, 4 at TP "
         "2, 2 at TP 4: memo_sim/cost/collectives.py ring_params), no longer on one GPU's 50 GB/s; what they left "
         "exposed (the last buckets, the 131K-vocabulary embedding's gather before the first layer and its bucket "
         "after the last) went with it: 1.7B from -8.8%, 7.1B from -7.0%, 16B from -0.4%. The "
         "h100-sxm5-80gb profile's curves are measured now (bf16 GEMMs by memo-exec calibrate on an H100, 0.72 of "
         "the peak at the top; cuDNN 9.19's fused attention on an H200 and an H100, 56-65% of the peak forward, "
         "50-57% backward: reports/gpu-h200-2026-11-26.md), and they moved these rows by under 2 points (1.7B from "
         "-15.9%, 16B from -11.6%), so the kernels as measured today are not the gap. Candidates, none pinned down: the "
         "2024 software (TransformerEngine on the cuDNN of mid-2024, not the 9.19 kernel measured; attention is a "
         "third of memo's 1.7B layer), the host's launch interval, which a step of short kernels at 4K tokens can "
         "feel (memo prices each kernel alone on the GPU, with no CPU launch time; the 1.7B layer's forward is 0.9 "
         "ms), and the GEMM curve's FLOP-only form (the H200's shape sweep runs the same FLOPs at 0.47-0.76 of the "
         "peak by shape). --tp-comm-overlap is not modelled (it would make memo faster still).")
_H100_ROWS = {f"e{k}": f"megatron2024-{k}B" for k in ("1.7", "7.1", "16", "32")}
OUTLIERS = dict.fromkeys(_H100_ROWS.values(), lambda r: _H100.format(
    **{k.replace(".", ""): _other_error(rid) for k, rid in _H100_ROWS.items()}))
# the long-context XTuner rows (issue #45 item 1; memo's per-layer split from `memo_sim.cost.layer_time` and the peak
# from the simulation at this commit, a100-sxm4-80gb)
# FlashAttention-2 at the calls of a Ulysses rank at 1M tokens, measured (benchmarks/gpu/probe_kernels.py)
_LONG_CALL_MEASURED = (
    ". Measured since (reports/gpu-h200-2026-11-30.md, benchmarks/gpu/probe_kernels.py --only attention_long): on an "
    "H200, FlashAttention-2 (SDPA's flash kernel, causal, head dim 128) kept its efficiency from 1.4e14 to 5.6e14 "
    "FLOPs a call over the few heads a Ulysses rank keeps (128K x 32 heads, 256K x 8, 512K x 4, 1M x 2, 1M x 1: "
    "forward 0.326 to 0.312 of the bf16 peak, backward 0.325 to 0.327), so the call's size alone does not lose "
    "13-25% on Hopper; the A100's kernel at these sizes is still not measured")


# a repeating allocation pattern under a capped caching allocator, measured (benchmarks/gpu/probe_allocator_pressure.py)
_PRESSURE_MEASURED = (
    ". Measured since (reports/gpu-h200-2026-11-27-allocator-pressure.md): on one H200 a store-all plan whose "
    "allocations repeat every step (GPT-7B, 8 layers, 32K) ran at the same speed (1.397-1.399 s a step against "
    "1.401 s uncapped) with the caching allocator capped at 1.2 down to 1.005 times its own peak reserved bytes, "
    "and ran out of memory capped at 1.0003-1.002 times its peak allocated bytes (below its peak reserved, 1.0026 "
    "times): no cap tried gave a slower step, and memo's replay agreed where the run fitted (no reorganisation; "
    "its reserved peak 0.02% above its allocated one where the run's was 0.26%, so at the three tightest caps memo "
    "predicted a fit where the run failed). A gradual fall like the table's would need an allocation pattern that "
    "changes from step to step (DeepSpeed ZeRO-3's parameter gathers and frees), which this did not measure")
_PREDICTED: dict[str, Result] = {}  # this report's results by row, for texts that cite another row's numbers


def _peak_words(r: Result) -> str:
    """memo's peak of the row and its caching-allocator replay, from this run (``peak`` GiB, reserved GB)."""
    a = dict(r.allocator)
    reserved = (f", {a['peak_reserved_bytes'] / 1e9:.1f} GB reserved at the replay's peak"
                if "peak_reserved_bytes" in a else "")
    return f"{r.peak_gib:.0f} GiB{reserved}"


def _replay_words(r: Result) -> str:
    """Whether the row's caching-allocator replay reached the GPU's capacity, from this run."""
    n = int(dict(r.allocator).get("reorganizations", 0))
    if not n:
        return "does not reach its capacity (no reorganisation: nothing of memory pressure is priced)"
    return (f"reaches its capacity {n} time{'s' if n > 1 else ''} (each reorganisation's synchronisation and "
            "cudaMallocs priced)")


def _other_peak(rid: str) -> str:
    r = _PREDICTED.get(rid)
    return f"{r.peak_gib:.0f} GiB" if r is not None and r.peak_gib is not None else "(not predicted)"


def _other_error(rid: str) -> str:
    r = _PREDICTED.get(rid)
    return f"{100 * r.error:+.1f}%" if r is not None and r.error is not None else "not predicted"


def _variant_error(r: Result, label: str) -> str:
    """The row's error with its variant ``label`` (memo's step beside the row), or 'not run'."""
    return _beside(r, label, lambda v: f"{100 * (v / r.run.published_s - 1):+.1f}%") or "not run"


def _xt_layer_costs(run: Run, layout: Layout | None = None) -> dict[str, list]:
    """An XTuner row's layer ops of one micro-batch (one sequence on the rank) by phase, ``fwd`` and ``bwd``, on the
    row's layout or ``layout``: what `_xt_shares` and `_xt_compute` read."""
    from memo_sim.cost.layer_time import backward_costs, forward_costs

    model, prof = run.model(), load_profile(run.profile)
    lay = layout or run.layout()
    return {"fwd": forward_costs(model, lay, 1, run.seq, prof), "bwd": backward_costs(model, lay, 1, run.seq, prof)}


def _xt_shares(run: Run) -> dict[str, float]:
    """Percent of memo's layer forward and backward (every op of the rank's micro-batch, compute and collectives)
    that attention and the Ulysses all-to-alls take, and of the two together attention's: an XTuner row's words."""
    out = {}
    for phase, costs in _xt_layer_costs(run).items():
        total = sum(c.seconds for c in costs)
        out[f"attn_{phase}"] = 100 * sum(c.seconds for c in costs if c.kind == "attention") / total
        out[f"a2a_{phase}"] = 100 * sum(c.seconds for c in costs if c.name.startswith("alltoall")) / total
        out[f"total_{phase}"] = total
    out["attn"] = (out["attn_fwd"] * out["total_fwd"] + out["attn_bwd"] * out["total_bwd"]) / (
        out["total_fwd"] + out["total_bwd"])
    return out


_XT_MEMORY_TEXT = (
    "what changes from the rows memo predicts within 10% is memory. memo puts this run's peak at {peak} of the 78 "
    "usable GiB, HF's fp32 logits and their loss included (the xtuner framework data's torch_fused loss over every "
    "token of the rank) and the K/V heads {extra}; memo's replay of the iteration through the caching allocator "
    "{replay}. The table's own TFLOP/s fall from 128K to 256K where memory is tight (Yi-34B 191.8 to 145.3; "
    "Llama-2-70B 189.7 at 128K SP 8 to 127.6 at 256K SP 16) and hold where it is not (Llama-2-7B, {small} in memo: "
    "180.3 to 176.9), the pattern of memory pressure rather than of the attention kernel, whose share of memo's "
    "layer is {attn}. Not pinned down: the run's memory is not stated, how often the cluster's allocator flushed its "
    "cache is not either; the interconnect (the 'dgx-a100-selene' variant beside the row: {selene}) and fp32 "
    "gradients (the 'megatron recipe' variant: {fp32}) move memo little" + _PRESSURE_MEASURED)


def _xt_compute(r: Result) -> dict[str, float]:
    """An XTuner row's compute of one micro-batch on memo's terms (its layers' forward and backward compute-stream
    ops, the full recompute a forward again; ``eager``: how much of it the eager kernels add over fused ones) against
    the measured iteration (one micro-batch), and memo's step per micro-batch above it: the words of the ZeRO-3 row's
    text."""
    run = r.run
    layers = run.model().layers

    def compute(layout: Layout | None = None) -> tuple[float, float]:
        costs = _xt_layer_costs(run, layout)
        return tuple(layers * sum(c.seconds for c in costs[p] if c.stream == "compute") for p in ("fwd", "bwd"))

    fwd, bwd = compute()
    fused = compute(replace(run.layout(), kernel_fusion="fused"))
    costs = _xt_layer_costs(run, None)
    rope = layers * sum(c.seconds * (2 if p == "fwd" else 1) for p in ("fwd", "bwd") for c in costs[p]
                        if c.name == "rope")  # the forward's and the recompute's, and the backward's
    total = 2 * fwd + bwd
    micro_batches = run.global_batch // run.dp
    it = run.published_s / micro_batches
    return {"fwd": fwd, "bwd": bwd, "all": total, "it": it, "over": 100 * (total / it - 1),
            "eager": total - 2 * fused[0] - fused[1], "rope": rope, "above": r.predicted_s / micro_batches - total}


def _xt_memory(extra: str, attn: Callable[[Result], str]) -> Callable[[Result], str]:
    """An XTuner memory row's text, its peak and replay from the row's own result, ``attn`` its words on attention's
    share of memo's layer."""
    return lambda r: _XT_MEMORY_TEXT.format(peak=_peak_words(r), replay=_replay_words(r), extra=extra, attn=attn(r),
                                            small=_other_peak("xtuner-llama2-7b-256k-sp8"),
                                            selene=_variant_error(r, _XT_SELENE[0]), fp32=_variant_error(r, _XT_FP32))
OUTLIERS.update({
    "xtuner-llama2-70b-32k-sp4": lambda r: (
        "memo too slow, most of it in the compute: memo's layers' compute of a micro-batch "
        "({fwd:.1f} s forward, as much again recomputed, {bwd:.1f} s backward: {all:.1f} s, the eager RMSNorms and "
        "SwiGLU of HF's layers included, {eager:.1f} s more than as fused kernels, and transformers' eager rotary "
        "embedding, {rope:.1f} s, priced since 2026-12-04) is already {over:+.1f}% against the "
        "measured {it:.1f} s iteration, and the ZeRO-3 collectives add {above:.1f} s a micro-batch above it (the 70B "
        "weights gathered for the forward, the recompute and the backward and the bf16 gradients reduce-scattered, "
        "every micro-batch as DeepSpeed ZeRO-3 does at GAS 4, over 4 nodes: the exposed part, and the kernels beside "
        "the hidden rest on the 84 of 108 SMs NCCL's 24 channels leave them, memo_sim/cost/comm_sms.py). Since "
        "2026-12-04 each ring's node hop runs on the NIC shares of the group's 8 ranks on the node (the node's 4 HDR "
        "cards, 100 GB/s: memo_sim/cost/collectives.py ring_params), no longer on one GPU's 12.5 GB/s: +39.3% "
        "before, when the collectives took about as long as the compute and the row was comm-bound in memo alone "
        "(the cluster hid them). The interconnect is not stated".format(**_xt_compute(r))
        + _beside(r, "8 HDR per node (dgx-a100-selene)",
                  lambda v: f": with Selene's 8 HDR cards per node memo is at {100 * (v / r.run.published_s - 1):+.1f}%")
        + ". Before the deepspeed framework data ran bf16 with DeepSpeed's 16-bit gradients (its engine's default) "
        "memo reduced fp32 gradients here and was +57.7%"
        + _beside(r, _XT_FP32,
                  lambda v: f"; with fp32 gradients now (the 'megatron recipe' variant beside the row) "
                            f"{100 * (v / r.run.published_s - 1):+.1f}%")),
    "xtuner-llama2-7b-1m-sp16": lambda r, _t=(
        "memo too fast; not pinned down. Attention is {attn:.0f}% of memo's layer (2 heads per GPU over the whole "
        "1M-token sequence; the Ulysses all-to-alls across the 2 nodes of SP 16 are {a2a_fwd:.0f}% of the forward and "
        "{a2a_bwd:.0f}% of the backward, and Selene's wider network makes memo faster still, {selene}). The Llama-2-7B "
        "rows up to 256K (attention {attn256:.0f}% of the layer at 256K) are within 6%, "
        "so the gap opens with the attention calls' size: 5.6e14 FLOPs per forward call here (256K: 7e13), beyond the "
        "last point of the a100 profile's FlashAttention-2 curves (assumed, flat at 76% forward / 60% backward of the "
        "peak from 1e14 FLOPs; never calibrated at these lengths). memo's peak is {peak} (HF's fp32 logits of 65,536 "
        "tokens per GPU included), so memory pressure is "
        "unlikely. What the run does that memo does not model: XTuner's all-to-all of non-contiguous head "
        "slices" + _LONG_CALL_MEASURED): _t.format(
        peak=_peak_words(r), selene=_variant_error(r, "8 HDR per node (dgx-a100-selene)"), **_xt_shares(r.run),
        attn256=_xt_shares(next(x for x in LONG_RUNS if x.id == "xtuner-llama2-7b-256k-sp8"))["attn"]),
    "xtuner-yi-34b-256k-sp8": _xt_memory(
        attn=lambda r: (f"{_xt_shares(r.run)['attn']:.0f}% here against "
                        f"{_xt_shares(next(x for x in LONG_RUNS if x.id == 'xtuner-yi-34b-128k-sp8'))['attn']:.0f}% at "
                        f"128K, where memo is {_other_error('xtuner-yi-34b-128k-sp8')}"),
        extra="repeated 7-fold before the all-to-all as XTuner does"),
    "xtuner-llama2-70b-128k-sp8": _xt_memory(
        attn=lambda r: f"{_xt_shares(r.run)['attn']:.0f}%", extra="repeated 8-fold before the all-to-all as XTuner does (2.4x the all-to-all bytes of one "
                          "head per rank; on NVLink a few ms a layer)"),
    "xtuner-llama2-70b-256k-sp16": lambda r, _t=(
        "memo too fast; not pinned down, memory pressure the likeliest. memo runs SP 16 over the 8 K/V heads as "
        "XTuner's 7575f2c91 does, each repeated to the 64 query heads before the all-to-all (4 K/V heads per rank "
        "after it; before memo's xtuner data did so, one repeated head per rank: -30.3%), and puts the peak at {peak} "
        "(HF's fp32 logits included) of the 78 usable GiB; its caching-allocator replay {replay}. The table's own "
        "TFLOP/s fall from 189.7 at 128K SP 8 to 127.6 here, the pattern of memory pressure (see "
        "xtuner-llama2-70b-128k-sp8). The repeat doubles the q, k, v all-to-all (402 "
        "to 805 MB a layer; across the 2 nodes of SP 16 the half bound for the other node rides the profile's 12.5 "
        "GB/s per GPU while the other half rides NVLink): {mine:.1f} s a micro-batch where one repeated head per "
        "rank gives {one} (the ulysses_kv column). Attention is {attn_fwd:.0f}% of memo's forward and {attn_bwd:.0f}% "
        "of its backward, in calls of 7e13 FLOPs, the size of the Llama-2-7B 256K row's (within 6%); the all-to-alls "
        "are {a2a_fwd:.0f}% and {a2a_bwd:.0f}%. The interconnect is not stated: Selene's 8 HDR per node makes memo "
        "faster still ({selene}); fp32 gradients give {fp32}" + _PRESSURE_MEASURED): _t.format(
        peak=_peak_words(r), replay=_replay_words(r), mine=r.predicted_s / (r.run.global_batch // r.run.dp),
        one=(lambda e: f"{(1 + e) * r.run.published_s / (r.run.global_batch // r.run.dp):.1f} s" if e is not None
             else "no fit")(dict(r.ablation).get("ulysses_kv")),
        selene=_variant_error(r, "8 HDR per node (dgx-a100-selene)"), fp32=_variant_error(r, _XT_FP32),
        **_xt_shares(r.run)),
    "xtuner-llama2-70b-1m-sp64": lambda r, _t=(
        "memo too fast; not pinned down. Here memo's repeat is XTuner's (SP 64 over 8 K/V heads: each repeated 8 times, "
        "one K and one V head per rank, the bytes of 7575f2c91's repeat to the 64 query heads), and memory is not "
        "tight (peak {peak}). Attention is {attn_fwd:.0f}% of memo's forward and {attn_bwd:.0f}% of its backward: one head "
        "per GPU over the whole 1M-token sequence, FlashAttention calls of 2.8e14 FLOPs, beyond the last point of the "
        "a100 profile's FlashAttention-2 curves (assumed, flat at 76% forward / 60% backward of the peak from 1e14 "
        "FLOPs; never calibrated at these lengths), as in xtuner-llama2-7b-1m-sp16 ({other}, 5.6e14 FLOPs a call). "
        "The all-to-alls across the 8 nodes of SP 64 are {a2a_fwd:.0f}% and {a2a_bwd:.0f}% of memo's forward and "
        "backward (Selene's 8 HDR per node: {selene}). The "
        "GAS is memo's reading of the absent config (accumulative_counts = SP). What the run does that memo does not "
        "model: XTuner's all-to-all of non-contiguous head slices" + _LONG_CALL_MEASURED):
    _t.format(peak=_peak_words(r), other=_other_error("xtuner-llama2-7b-1m-sp16"),
              selene=_variant_error(r, "8 HDR per node (dgx-a100-selene)"), **_xt_shares(r.run)),
    "xtuner-yi-34b-128k-sp8-16gpu": lambda r, _t=(
        "memo too fast; not pinned down. The table states no GPU (memo runs the speed page's A100-SXM4-80GB), and the "
        "same model, length, SP and config on 32 GPUs (xtuner-yi-34b-128k-sp8) ran at 251.1 TGS, this 16-GPU run at "
        "227 (10% slower), while memo predicts both at 60.5 s an iteration: the ZeRO-3 collectives are hidden under "
        "the compute in both, and halving the ZeRO-3 group only raises memo's peak ({other} to {mine}, HF's fp32 "
        "logits included). Candidates: memory pressure (see xtuner-yi-34b-256k-sp8), DeepSpeed "
        "ZeRO-3's per-module gathers with half the ranks (twice the shard each rank gathers from, per layer hidden in "
        "memo), and different hardware or software than the speed page's" + _PRESSURE_MEASURED): _t.format(
        other=_other_peak("xtuner-yi-34b-128k-sp8"), mine=f"{r.peak_gib:.0f} GiB"),
})

# torchtitan's 2024-12 H100 rows (torchtitan@2024-12 on h100-sxm5-96gb-500w): their texts take memo's step and its
# attention and GEMM seconds from this run (`_titan_split`: the layer's attention and GEMM ops, forward, backward and
# recompute, over the layers and micro-batches), so they follow every mechanism change
_POWER = ("the 500 W limit priced as the clock it leaves under each kernel class (0.80-0.90 of the 700 W part's "
          "clock, from the board power's line in the SM clock sampled on a 700 W H100, where every one of these "
          "kernels already runs at the 700 W cap: benchmarks/gpu/power_clock.py, reports/gpu-h200-2026-11-26.md "
          "'Power')")
_POWER_LEFT = ("(1) the 500 W limit beyond what memo prices of it: the clock ratio follows each kernel's measured "
               "power line up to 200 W below the range it was measured over (a secant of a convex curve: the clock it "
               "gives is an upper bound), prices each kernel class as if it ran alone (the board averages its power "
               "over milliseconds), and leaves out the HBM2e's own power and the cooler part's lower leakage")
_TITAN_CP = (
    "memo too fast, most where attention takes the step: memo's step is {memo} ({attn} of it attention, "
    "FlashAttention-2 on the curve measured on an H200 and an H100 at 700 W, with " + _POWER + "; FP8 GEMMs {gemm}); "
    "the measured step leaves {left} for attention if the rest is as memo prices it, so the attention ran at {ratio} "
    "of the speed memo prices. Candidates, none pinned down: " + _POWER_LEFT + "{cp}")
_TITAN_CP_RING = ("; (2) PyTorch's experimental context parallelism of 2024-12 beyond what memo prices of it: "
                  "its fp32 merges, accumulations and packing are priced (ring_merge torch_cp, counted from its "
                  "code; one merge step measured at 1.84 ms on an H200 and 2.33 ms on an H100 "
                  "for 32K tokens x 32 heads), and so is its K/V exchange, one all-gather issued at ring step 0 and "
                  "waited for at step 1 (rotate method allgather), which on this row's NVLink hides under step 0's "
                  "kernel, and its one SDPA call per ring step (step_kernels: a causal call over the rank's two "
                  "chunks, then 2c x c or c x 2c calls), each priced on the kernel curve at its own size; what is "
                  "left is the calls' speed at these shapes beyond the curve (the non-causal half-chunk calls were "
                  "measured as fast as the causal one)")
_TITAN_FSDP = (
    "memo too fast on a GEMM-bound 8K step (Llama 3.1 8B, FSDP, per-op selective checkpointing, <fusion>): memo's step "
    "is {memo}, {gemm} of it the layers' GEMMs (forward, backward and the re-run ones: the curve memo-exec calibrate "
    "measured on a 700 W H100, with " + _POWER + ") and {attn} attention (FlashAttention-2 as measured on an H200). "
    "Candidates, none pinned down: " + _POWER_LEFT + "; and FSDP's per-layer all-gathers and reduce-scatters, which "
    "memo hides under the compute (FSDP2's copies out of and into them, on the compute stream, priced since "
    "2026-12-04: fsdp_copies)")

_TITAN_TP = (
    "memo too fast on Llama 3.1 70B with TP 8 and no AsyncTP (FSDP 32 x TP 8 with sequence parallelism, full AC, "
    "compiled, Float8): memo's step is {memo}, {gemm} of it the layers' FP8 GEMMs (forward, backward and the re-run "
    "ones), {attn} attention and {comm} the TP collectives on the critical path (the forward's, the recompute's and "
    "the backward's all-gathers and reduce-scatters; torch's ColwiseParallel keeps the gathered inputs for the weight "
    "gradients, so none is gathered again: sp_input_kept). Candidates, none pinned down: " + _POWER_LEFT
    + "; (2) the TP collectives, priced at the 370 GB/s NCCL reaches of NVLink 4's 450 GB/s line rate (since "
    "2026-12-04: the NCCL maintainer's figure, NVIDIA/nccl-tests issue 212; not measured on this cluster), and the "
    "tensor-parallel amax all-reduces of torchao's casts (a scalar all-reduce per cast, about 29 a layer and "
    "micro-batch; not priced)")
_TITAN_PP = (
    "memo too fast on Llama 3.1 405B in torchtitan's {d}D layout (FSDP beside {stages}, "
    "TP 8 with async TP, 8 micro-batches in {sched}{cp}): memo's step is {memo}, {sync} with the TP collectives on the "
    "critical path instead (the variant beside the row), so async TP as memo prices it takes {hidden} off the step. "
    "Candidates, none pinned down: {candidates}")
_TITAN_PP_ASYNC = (
    "async TP beyond what memo prices of it: memo hides, but for the last GEMM chunk, the pairs PyTorch's "
    "micro-pipeline pass fuses (the forward's and the recompute's all-gathers and reduce-scatters, the backward's "
    "output-gradient all-gathers into the data-gradient matmul) and its chunks' copies share no HBM with the GEMMs "
    "in memo; on the 70B rows of Table 4 AsyncTP shortened the measured step by {t4_measured}, memo's by "
    "{t4_memo}, so memo's async TP is the more optimistic")
_TITAN_PP_RING = ("PyTorch's experimental context parallelism of 2024-12 beyond what memo prices of it, the gap that "
                  "grows with CP in the 8B rows of Table 2 too (torchtitan-t2-cp{k})")
_TITAN_ASYNC = (
    "memo too fast with AsyncTP on Llama 3.1 70B (FSDP 32 x TP 8, full AC, compiled, Float8): memo's step is {memo}, "
    "{sync} with the TP collectives on the critical path instead (the variant beside the row), so async TP as memo "
    "prices it takes {hidden} off the step. Candidates, none pinned down: {candidates}")


def _async_tp_effect() -> tuple[float, float]:
    """(measured, memo's) fraction AsyncTP takes off Table 4's 70B step (torchtitan-t4-2d vs -asynctp; memo's from
    the AsyncTP row and its SYNC_TP variant)."""
    rows = {r.id: r for r in RUNS}
    sync, asyn = rows["torchtitan-t4-2d"], rows["torchtitan-t4-2d-asynctp"]
    res = predict(asyn, ablate=False)
    return 1 - asyn.published_s / sync.published_s, 1 - res.predicted_s / dict(res.variants)[SYNC_TP]


def _titan_pp_text(r: Result) -> str:
    sync = dict(r.variants).get(SYNC_TP)
    k = r.run.cp
    t4_measured, t4_memo = _async_tp_effect()
    parts = [_TITAN_PP_ASYNC.format(t4_measured=f"{100 * t4_measured:.1f}%", t4_memo=f"{100 * t4_memo:.1f}%"),
             _POWER_LEFT[4:]]
    if k > 1:  # the CP rows: the ring's gap first
        parts.insert(0, _TITAN_PP_RING.format(k=k))
    split = r.run.layout().virtual_stage_ranges(r.run.arch.layers)
    sizes = f"{min(map(len, split))}-{max(map(len, split))} layers"
    stages = (f"{len(split)} virtual stages of {sizes}, {r.run.vpp} per pipeline rank" if r.run.vpp > 1
              else f"{len(split)} pipeline stages of {sizes}")
    return _TITAN_PP.format(
        d=4 if k > 1 else 3, cp=f", CP {k} at {r.run.seq // 1024}K" if k > 1 else "", stages=stages,
        sched="interleaved 1F1B" if r.run.vpp > 1 else "1F1B",
        memo=f"{r.predicted_s:.2f} s", sync=f"{sync:.2f} s" if sync else "no fit",
        hidden=f"{100 * (1 - r.predicted_s / sync):.0f}%" if sync else "-",
        candidates="; ".join(f"({i + 1}) {p}" for i, p in enumerate(parts)))


def _titan_asynctp_text(r: Result) -> str:
    """Table 4's AsyncTP row: memo's AsyncTP against the same layout's measured step without it."""
    sync = dict(r.variants).get(SYNC_TP)
    t4_measured, t4_memo = _async_tp_effect()
    parts = [_TITAN_PP_ASYNC.format(t4_measured=f"{100 * t4_measured:.1f}%", t4_memo=f"{100 * t4_memo:.1f}%"),
             _POWER_LEFT[4:]]
    return _TITAN_ASYNC.format(memo=f"{r.predicted_s:.2f} s", sync=f"{sync:.2f} s" if sync else "no fit",
                               hidden=f"{100 * (1 - r.predicted_s / sync):.0f}%" if sync else "-",
                               candidates="; ".join(f"({i + 1}) {p}" for i, p in enumerate(parts)))


def _titan_split(run: Run) -> tuple[float, float, float]:
    """(attention seconds, GEMM seconds, collective seconds on the critical path) of memo's step for ``run``: the
    layer's attention, GEMM and unhidden collective ops (TP's, CP's) of the forward, the backward and the policy's
    recompute, over the layers and the micro-batches."""
    from memo_sim.cost.layer_time import backward_costs, forward_costs
    from memo_sim.memplan.trace_gen import per_gpu_shard

    model, prof, pol = run.model(), load_profile(run.profile), get_policy(run.policy)
    b = run.global_batch // run.dp
    mb = run.micro_batch or b
    shard = per_gpu_shard(run.layout())
    costs = (forward_costs(model, shard, mb, run.seq, prof) + backward_costs(model, shard, mb, run.seq, prof)
             + list(pol.recompute_costs(model, shard, mb, run.seq, prof) or ()))
    n = model.layers * (b // mb)
    return (n * sum(c.seconds for c in costs if c.kind == "attention"),
            n * sum(c.seconds for c in costs if c.kind == "gemm"),
            n * sum(c.seconds for c in costs if c.kind == "collective" and not c.overlaps))


def _titan_text(template: str, cp: str = "") -> Callable[[Result], str]:
    def text(r: Result) -> str:
        attn, gemm, comm = _titan_split(r.run)
        left = r.run.published_s - (r.predicted_s - attn)
        return template.format(memo=f"{r.predicted_s:.2f} s", attn=f"{attn:.2f} s", gemm=f"{gemm:.2f} s",
                               comm=f"{comm:.2f} s", left=f"about {left:.1f} s", ratio=f"{attn / left:.2f}x", cp=cp)
    return text


def _history_error(commit: str, rid: str) -> float | None:
    """The row's error recorded in `HISTORY` at ``commit`` (the state before that change), None where not recorded."""
    return next((errs.get(rid) for c, _, _, errs in HISTORY if c == commit), None)


def _titan_fsdp_text(rid: str) -> Callable[[Result], str]:
    """Tables 1 and 3's FSDP rows (8 GPUs on one node, 128 on 16 nodes, the same local batch): the GEMM-bound
    step's text, and on a Table 3 row its step against the Table 1 row's, measured and in memo, now and before the
    ring collectives' node hops ran on the node ranks' NIC shares (`HISTORY` 9fa06cc)."""
    base = _titan_text(_TITAN_FSDP.replace("<fusion>", "compiled" if rid.endswith("-compile") else "eager"))
    one = rid.replace("t3-fsdp128", "t1-fsdp")

    def text(r: Result) -> str:
        words = base(r)
        t1, old = _PREDICTED.get(one), _history_error("9fa06cc", rid)
        if one == rid or t1 is None or t1.predicted_s is None:
            return words
        measured = r.run.published_s / t1.run.published_s
        before = (f", {(1 + old) * r.run.published_s / t1.predicted_s:.3f}x before, when each rank's bytes rode its "
                  "own 50 GB/s share" if old is not None else "")
        return (f"{words}. Against Table 1's run on one node ({one}, the same local batch): measured "
                f"{measured:.3f}x its step on 16 nodes, memo {r.predicted_s / t1.predicted_s:.3f}x, since 2026-12-04 "
                "with FSDP's all-gathers and reduce-scatters across nodes on the NIC shares of the group's 8 ranks on "
                f"each node (memo_sim/cost/collectives.py ring_params){before}")
    return text


def _mds_text(r: Result) -> str:
    """The DeepSpeed4Science TP-32 rows: what memo's step holds, against what the measured step leaves for the
    attention (FlashAttention's Triton kernel, priced since 2026-12-05 on the profile's flash_triton curves)."""
    attn, gemm, comm = _titan_split(r.run)
    left = r.run.published_s - (r.predicted_s - attn)
    slow = r.predicted_s > r.run.published_s
    return (f"memo too {'slow' if slow else 'fast'}; not pinned down. The run's attention is FlashAttention's Triton "
            "kernel (--use-flash-attn-triton: Megatron-DeepSpeed's megatron/model/transformer.py at cc3a94c6 imports "
            "flash_attn.flash_attn_triton's flash_attn_func), priced on the profile's flash_triton curves: "
            "FlashAttention-2's times the Triton kernel's speed over FlashAttention-2's on the FlashAttention-2 "
            "README's A100 chart (causal, head dim 128, forward + backward: 0.51 at 512-token calls to 0.42 at 16K; "
            "benchmarks/triton_fa_curves.py), at head dim 128, to which the kernel pads this model's 96 "
            "(flash_attn_triton.py BLOCK_HEADDIM): about 3.1x FlashAttention-2's time, which had left memo 14-64% too "
            f"fast on 32K-256K (the report's history). memo's step {r.predicted_s:.1f} s holds {attn:.1f} s of "
            f"attention ({100 * attn / r.predicted_s:.0f}%), {gemm:.1f} s of GEMMs and {comm:.1f} s of TP collectives "
            f"({100 * comm / r.predicted_s:.0f}%) on the critical path; "
            + (f"the measured step is {r.run.published_s:.1f} s, {r.predicted_s - r.run.published_s:.1f} s shorter. "
               if slow else f"the measured step leaves about {left:.1f} s for the attention, {left / attn:.2f}x memo's. ")
            + "Where memo is too slow (16K-128K), the TP collectives' share "
            "is largest at the shortest length: TP 32's all-gathers and reduce-scatters over 4 nodes, priced as NCCL's "
            "ring through the nodes' eight HDR NICs (memo_sim/cost/collectives.py tp_params), were not measured on "
            "that cluster; the Triton kernel's ratio was measured at 16 heads a call and is held flat beyond the "
            "chart's 16K-token calls, and its split between forward and backward is FlashAttention-2's (the chart "
            "gives the two together), where the run's calls hold 2 heads a GPU over the whole sequence. The table's "
            "TFLOP/s rise from 92 (16K) to 119 (128K) and fall to 94 at 256K, where memo's attention share only grows; "
            f"memo's peak on this row is {r.peak_gib:.1f} GiB of the profile's "
            f"{load_profile(r.run.profile).usable_gpu_memory / 2 ** 30:.1f} usable (no memory pressure in memo)")


OUTLIERS.update({
    **dict.fromkeys((f"mds4sci-tp32-{k}k" for k in (16, 32, 64, 128, 256)), _mds_text),
    "torchtitan-t2-cp1": _titan_text(_TITAN_CP, " (no CP in this row)"),
    **{f"torchtitan-t2-cp{k}": _titan_text(_TITAN_CP, _TITAN_CP_RING) for k in (2, 4, 8)},
    **{rid: _titan_fsdp_text(rid) for rid in ("torchtitan-t1-fsdp", "torchtitan-t1-fsdp-compile",
                                              "torchtitan-t3-fsdp128", "torchtitan-t3-fsdp128-compile")},
    **dict.fromkeys(("torchtitan-t5-1f1b", "torchtitan-t5-interleaved", *(f"torchtitan-t6-cp{k}" for k in (1, 2, 4, 8))),
                    _titan_pp_text),
    "torchtitan-t4-2d": _titan_text(_TITAN_TP),
    "torchtitan-t4-2d-asynctp": _titan_asynctp_text,
})


# (commit, date, what the simulator modelled, per-row error).
HISTORY = (
    ("119a926", "2026-11-23", "before the kernel and framework mechanisms: FlashAttention and overlapped gradient "
     "buckets for every framework (megatron@2021 did not exist)",
     {"megatron2021-1.7B": -0.369, "megatron2021-3.6B": -0.317, "megatron2021-7.5B": -0.226,
      "megatron2021-18B": -0.205, "korthikanti-22B-full": -0.135}),
    ("35384d9", "2026-11-25", "before the deepspeed framework data ran bf16 with DeepSpeed's 16-bit gradients (memo's "
     "default then: fp32 main gradients, reduced in fp32)",
     {"xtuner-llama2-7b-32k-sp1": -0.045, "xtuner-llama2-7b-128k-sp8": -0.046, "xtuner-llama2-7b-256k-sp8": -0.058,
      "xtuner-llama2-7b-1m-sp16": -0.132, "xtuner-yi-34b-32k-sp2": -0.090, "xtuner-yi-34b-128k-sp8": -0.070,
      "xtuner-yi-34b-256k-sp8": -0.267, "xtuner-llama2-70b-32k-sp4": 0.577, "xtuner-llama2-70b-128k-sp8": -0.104,
      "xtuner-yi-34b-128k-sp8-16gpu": -0.159}),
    ("b9a871e", "2026-11-25", "before ProcessGroupNCCL's recordStream held freed collective buffers until the next "
     "synchronisation in the PyTorch of megatron@2021-2023 and memo-paper (`Layout.nccl_record_stream`)",
     {"megatron2021-3.6B": 0.003, "megatron2021-7.5B": -0.008, "korthikanti-22B-full": -0.003,
      "korthikanti-22B-selective": -0.065}),
    ("d69a665", "2026-11-25", "before attention kernels were framework data (FlashAttention-2 at the FlashAttention-3 "
     "paper's published 35% of an H100's peak; cuDNN's fused attention, TransformerEngine's choice on Hopper, at the "
     "earlier 45-48% assumption)",
     {"torchtitan-t2-cp1": -0.327, "torchtitan-t2-cp2": -0.309, "torchtitan-t2-cp4": -0.499,
      "torchtitan-t2-cp8": -0.529, "torchtitan-t4-2d": -0.174}),
    ("423c115", "2026-11-26", "before the Hopper profiles' kernel curves were measured (FlashAttention-2 at the "
     "published 35% top and an assumed backward, cuDNN's fused attention at an assumed 45-48% / 40%, bf16 GEMMs at an "
     "assumed 75-78% top, FP8 GEMMs at the bf16 curve's fractions of the FP8 peak)",
     {"megatron2024-1.7B": -0.159, "megatron2024-7.1B": -0.170, "megatron2024-16B": -0.116, "megatron2024-32B": -0.063,
      "torchtitan-t1-fsdp-compile": -0.210, "torchtitan-t3-fsdp128-compile": -0.196, "torchtitan-t2-cp1": -0.182,
      "torchtitan-t2-cp2": -0.110, "torchtitan-t2-cp4": -0.328, "torchtitan-t2-cp8": -0.352, "torchtitan-t4-2d": -0.101,
      "moe-folding-mixtral-8x22b": 0.030, "moe-folding-qwen2-57b": -0.040, "moe-flagperf-mixtral-8x7b": -0.411,
      "moe-zoo-qwen3-235b-a1-ep32": -0.120, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.015,
      "moe-zoo-qwen3-235b-a5-tp4": -0.424, "moe-zoo-qwen3-235b-long-16k-forced": 0.012,
      "moe-zoo-qwen3-235b-long-16k-dropless": -0.184, "moe-zoo-qwen3-235b-long-32k-forced": 0.086,
      "moe-zoo-qwen3-235b-long-32k-dropless": -0.099, "moe-zoo-qwen3-235b-long-64k-forced": 0.164,
      "moe-zoo-qwen3-235b-long-64k-dropless": 0.014, "moe-zoo-qwen3-235b-long-128k-forced": 0.209,
      "moe-zoo-qwen3-235b-long-128k-dropless": 0.111, "moe-zoo-mixtral-8x22b-dropless": -0.172,
      "moe-zoo-mixtral-8x22b-forced": -0.152, "moe-zoo-mixtral-8x22b-capacity1": -0.143}),
    ("643c729", "2026-11-26", "before PyTorch's context parallelism's fp32 merges, accumulations and packing were "
     "priced (`Layout.ring_merge`, torchtitan@2024-12: torch_cp)",
     {"torchtitan-t2-cp2": -0.128, "torchtitan-t2-cp4": -0.351, "torchtitan-t2-cp8": -0.380}),
    ("7b1d4a9", "2026-11-26", "before the 500 W part's power limit was priced (h100-sxm5-96gb-500w at an assumed 912 "
     "TF midpoint peak with the 700 W part's curve fractions)",
     {"torchtitan-t1-fsdp-compile": -0.190, "torchtitan-t3-fsdp128-compile": -0.177, "torchtitan-t2-cp1": -0.193,
      "torchtitan-t2-cp2": -0.073, "torchtitan-t2-cp4": -0.302, "torchtitan-t2-cp8": -0.329,
      "torchtitan-t4-2d": -0.057}),
    ("442b64e", "2026-11-26", "before XTuner's K/V repeat was its framework data's (`Layout.ulysses_kv`: one repeated "
     "K/V head per rank where the Ulysses ranks outnumbered the K/V heads, none where they did not)",
     {"xtuner-yi-34b-32k-sp2": -0.097, "xtuner-yi-34b-128k-sp8": -0.074, "xtuner-yi-34b-256k-sp8": -0.268,
      "xtuner-llama2-70b-32k-sp4": 0.185, "xtuner-llama2-70b-128k-sp8": -0.106, "xtuner-llama2-70b-256k-sp16": -0.303,
      "xtuner-yi-34b-128k-sp8-16gpu": -0.163}),
    ("9092b38", "2026-11-28", "before Megatron-Core's --moe-router-force-load-balancing was priced as the random "
     "router logits it draws (RandomSTE: memo's random balance, a uniform router's loads) rather than as equal "
     "loads (memo's forced, torchtitan's round-robin)",
     {"moe-zoo-qwen3-235b-a1-ep32": -0.145, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.043,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.286, "moe-zoo-qwen3-235b-a5-tp4": -0.458,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.110, "moe-zoo-qwen3-235b-long-32k-forced": -0.066,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.045, "moe-zoo-qwen3-235b-long-128k-forced": -0.037,
      "moe-zoo-mixtral-8x22b-forced": -0.135, "moe-zoo-mixtral-8x22b-fp8-forced": -0.280}),
    ("117d013", "2026-11-29", "before DeepEP's NVLink traffic was one send per EP rank a token reaches (DeepEP's "
     "is_token_in_rank); it was priced as one per routed copy, the all-to-all's",
     {"moe-zoo-qwen3-235b-a3-fsdp": 0.269, "moe-zoo-qwen3-235b-a5-tp4": -0.454,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.106, "moe-zoo-qwen3-235b-long-16k-dropless": -0.282,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.063, "moe-zoo-qwen3-235b-long-32k-dropless": -0.225,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.042, "moe-zoo-qwen3-235b-long-64k-dropless": -0.167,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.036, "moe-zoo-qwen3-235b-long-128k-dropless": -0.115}),
    ("aee63ce", "2026-11-29", "before the rank order put pipeline stages outermost, as Megatron-LM, torchtitan and "
     "DeepSpeed number ranks (memo had numbered them TP, CP, PP, DP: Megatron-LM's --use-tp-pp-dp-mapping)",
     {"moe-folding-mixtral-8x22b": 0.050, "moe-folding-qwen2-57b": -0.085, "moe-zoo-qwen3-235b-a1-ep32": -0.135,
      "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.032, "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.283,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.141, "moe-zoo-qwen3-235b-long-16k-dropless": -0.310,
      "moe-zoo-mixtral-8x22b-dropless": -0.155, "moe-zoo-mixtral-8x22b-forced": -0.117,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.267, "moe-zoo-mixtral-8x22b-capacity1": -0.126}),
    ("45f388c", "2026-11-29", "before the embedding's and the head's weights were all-gathered from ZeRO 1 on (only "
     "the layers' were)",
     {"megatron2024-1.7B": -0.178, "megatron2024-7.1B": -0.168, "megatron2024-16B": -0.105, "megatron2024-32B": -0.053,
      "torchtitan-t1-fsdp-compile": -0.135, "torchtitan-t3-fsdp128-compile": -0.137, "torchtitan-t4-2d-asynctp": -0.087,
      "xtuner-yi-34b-32k-sp2": -0.095, "xtuner-yi-34b-128k-sp8": -0.071, "xtuner-llama2-70b-32k-sp4": 0.183,
      "xtuner-yi-34b-128k-sp8-16gpu": -0.161, "moe-folding-mixtral-8x22b": 0.052, "moe-folding-qwen2-57b": -0.081,
      "moe-zoo-qwen3-235b-a1-ep32": -0.134, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.030,
      "moe-zoo-qwen3-235b-a3-fsdp": 0.268, "moe-zoo-qwen3-235b-long-16k-dropless": -0.308,
      "moe-zoo-mixtral-8x22b-dropless": -0.139, "moe-zoo-mixtral-8x22b-forced": -0.100,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.250, "moe-zoo-mixtral-8x22b-capacity1": -0.109}),
    ("a547347", "2026-11-29", "before a pipeline's collapsed units (past FINE_OPS_LIMIT ops, one compute op and their "
     "collectives each) kept each stream's and link's collectives apart: a MoE layer's token dispatch was merged into "
     "TP's op and shared TP's NVLink port under contention (EP 32 crosses nodes)",
     {"moe-zoo-qwen3-235b-a1-ep32": -0.133}),
    ("8c39622", "2026-11-29", "before a quantised format's casts around the routed experts' grouped GEMMs were priced "
     "(the dense layers' were; an expected-value row, in no mean)",
     {"moe-zoo-mixtral-8x22b-fp8-forced": -0.249}),
    ("1e0c26e", "2026-11-30", "before PyTorch's experimental CP exchanged K/V as one all-gather beside ring step 0 "
     "alone (memo priced ring shifts, each beside a step's blocks)",
     {"torchtitan-t6-cp4": -0.176, "torchtitan-t6-cp8": -0.283}),
    ("ed6470f", "2026-11-30", "before the norms' and the activation's kernels moved the model dtype where Megatron "
     "keeps quantised copies of their outputs (priced at the copies' size; an expected-value row, in no mean)",
     {"moe-zoo-mixtral-8x22b-fp8-forced": -0.209}),
    ("f1ca22c", "2026-12-01", "before Megatron's --recompute-modules layernorm re-ran only the norms that are "
     "modules of their own (memo re-ran the input norm too, which its TransformerEngine layer fuses into QKV and "
     "keeps: `memo_sim.model.layer_graph.separate_norms`)",
     {"moe-zoo-qwen3-235b-a1-ep32": -0.132, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.029,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.282, "moe-zoo-qwen3-235b-long-16k-dropless": -0.307,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.091, "moe-zoo-qwen3-235b-long-32k-dropless": -0.248,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.064, "moe-zoo-qwen3-235b-long-64k-dropless": -0.186,
      "moe-zoo-qwen3-235b-long-128k-dropless": -0.127}),
    ("5682aa3", "2026-12-01", "before interleaved 1F1B at as many micro-batches as stages warmed up every chunk "
     "forward (Megatron-LM's rule before 4295be1a6c, 2024-11-01; PyTorch's ScheduleInterleaved1F1B, which torchtitan "
     "runs, warms up (v - 1) x p + 2 (p - 1 - s) in every version, `_get_warmup_ops`)",
     {"torchtitan-t5-interleaved": -0.114}),
    ("16920a2", "2026-12-01", "before torchtitan@2024-12's torchao (eab345c) kept the FP8 copies of the GEMM inputs "
     "for the backward (`fp8_saved_inputs`: memo re-cast them there, as the later torchao does), before FP8 cast "
     "copies were layer memory and before one rule decided both the casts' time and their buffers "
     "(`memo_sim.model.layer_graph.fp8_input_kept`)",
     {"torchtitan-t2-cp1": -0.128, "torchtitan-t2-cp2": -0.012, "torchtitan-t2-cp4": -0.258, "torchtitan-t2-cp8": -0.288,
      "torchtitan-t4-2d": -0.027, "torchtitan-t4-2d-asynctp": -0.086, "torchtitan-t5-1f1b": -0.110,
      "torchtitan-t5-interleaved": -0.139, "torchtitan-t6-cp1": -0.091, "torchtitan-t6-cp2": -0.178,
      "torchtitan-t6-cp4": -0.163, "torchtitan-t6-cp8": -0.237, "moe-zoo-mixtral-8x22b-fp8-forced": -0.206}),
    ("0919f28", "2026-12-01", "before a Ulysses all-to-all across nodes sent only its off-node peers' shares over "
     "the inter-node link (every byte but a rank's own rode it) and before selective recompute kept one rebuilt "
     "attention lse rather than every layer's",
     {"xtuner-llama2-7b-1m-sp16": -0.134, "xtuner-llama2-70b-256k-sp16": -0.256, "xtuner-llama2-70b-1m-sp64": -0.254,
      "korthikanti-22B-selective": -0.035}),
    ("40f0614", "2026-12-01", "before the 80 GB profiles held the device memory PyTorch reports (80 GiB: 0.67-0.82 "
     "GiB more than an A100's, A800's or H100's) and before a static memory plan's replay decided its fit",
     {"korthikanti-22B-full": 0.019, "korthikanti-22B-selective": -0.032}),
    ("553a650", "2026-12-03", "before Megatron-LM's output projection kept its original input under FP8 "
     "(set_save_original_input for every recipe but delayed: memo counted its quantised copy of the attention output "
     "and cast nothing again for the weight gradient; an expected-value row, in no mean)",
     {"moe-zoo-mixtral-8x22b-fp8-forced": -0.207}),
    ("5032982", "2026-12-03", "before torchtitan@2024-12's torchao (eab345c) cast each layer's FP8 weight in every "
     "forward and recompute (memo priced one cast a layer a step, after the optimizer step; the same commit's one "
     "cast per GEMM under async TP, not one per token chunk, moves no row here)",
     {"torchtitan-t2-cp1": -0.140, "torchtitan-t2-cp2": -0.020, "torchtitan-t2-cp4": -0.262, "torchtitan-t2-cp8": -0.290,
      "torchtitan-t4-2d": -0.066, "torchtitan-t4-2d-asynctp": -0.127, "torchtitan-t5-1f1b": -0.138,
      "torchtitan-t5-interleaved": -0.166, "torchtitan-t6-cp1": -0.112, "torchtitan-t6-cp2": -0.191,
      "torchtitan-t6-cp4": -0.172, "torchtitan-t6-cp8": -0.241}),
    ("d2d8b20", "2026-12-03", "before torchao eab345c's Float8 TP styles cast the gathered operands on the rank's "
     "sequence shard (memo cast the column-parallel inputs and the row-parallel output gradients on the gathered "
     "tokens) and before the backward's all-gather of a row-parallel GEMM's output gradient carried its e5m2 copy "
     "(memo gathered it in bf16)",
     {"torchtitan-t4-2d": -0.063, "torchtitan-t4-2d-asynctp": -0.124, "torchtitan-t5-1f1b": -0.122,
      "torchtitan-t5-interleaved": -0.151, "torchtitan-t6-cp1": -0.100, "torchtitan-t6-cp2": -0.183,
      "torchtitan-t6-cp4": -0.167, "torchtitan-t6-cp8": -0.239}),
    ("821ca1a", "2026-12-03", "before torch's TP (torchtitan's ColwiseParallel) kept the all-gathered inputs of the "
     "column-parallel GEMMs for their weight gradients (`Layout.sp_input_kept`: memo priced Megatron-LM's re-gather "
     "of each in the backward and kept the rank's shard)",
     {"torchtitan-t4-2d": -0.135, "torchtitan-t4-2d-asynctp": -0.186, "torchtitan-t5-1f1b": -0.160,
      "torchtitan-t5-interleaved": -0.187, "torchtitan-t6-cp1": -0.129, "torchtitan-t6-cp2": -0.202,
      "torchtitan-t6-cp4": -0.178, "torchtitan-t6-cp8": -0.244}),
    ("b3b5c27", "2026-12-03", "before TransformerEngine's p2p ring (Megatron-LM's) and PyTorch's CP ran one attention "
     "kernel per ring step over the rank's two chunks (`RingMerge.step_kernels`: memo priced the zigzag blocks of its "
     "executor, one kernel per pair of chunks)",
     {"torchtitan-t2-cp2": -0.016, "torchtitan-t2-cp4": -0.260, "torchtitan-t2-cp8": -0.289,
      "torchtitan-t6-cp2": -0.213, "torchtitan-t6-cp4": -0.185, "torchtitan-t6-cp8": -0.248,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.092, "moe-zoo-qwen3-235b-long-32k-dropless": -0.249,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.065, "moe-zoo-qwen3-235b-long-64k-dropless": -0.187,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.049, "moe-zoo-qwen3-235b-long-128k-dropless": -0.128}),
    ("1febe9a", "2026-12-03", "before TransformerEngine's p2p ring (Megatron-LM's) made its passes beside the kernels "
     "as its source does (the step outputs corrected into the model-dtype output after the ring, dQ/dK/dV added "
     "step by step, every K/V chunk and step output held through the forward, no dK/dV shift home after its last, "
     "diagonal step: `ring_merge` te_p2p) and before ZeRO 2 / 3 held two buckets of whole gradients beside the "
     "overlapped reductions (9eee8dc: no step moved, the maxima's memory error 22.3% to 22.6%)",
     {"moe-zoo-qwen3-235b-long-32k-forced": -0.125, "moe-zoo-qwen3-235b-long-32k-dropless": -0.276,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.106, "moe-zoo-qwen3-235b-long-64k-dropless": -0.222,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.093, "moe-zoo-qwen3-235b-long-128k-dropless": -0.168}),
    ("58d67fb", "2026-12-03", "before Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm, "
     "`Layout.ep_overlap`) was priced: the a2 row ran as a1, its all-to-all exposed",
     {"moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.030}),
    ("6be77b7", "2026-12-03", "before the SMs a communication kernel holds were taken from the kernels beside it "
     "(`memo_sim.cost.comm_sms`: NCCL's channels, gpu.comm_sms 24 of 108 A100 / 132 Hopper SMs, 16 on the A800; "
     "DeepEP's 20; memo's kernels kept their whole speed beside a collective)",
     {"korthikanti-22B-selective": -0.036, "korthikanti-175B-full": -0.022, "korthikanti-175B-selective": -0.066,
      "korthikanti-530B-full": -0.012, "korthikanti-530B-selective": -0.066, "korthikanti-1T-full": 0.010,
      "korthikanti-1T-selective": -0.014, "megatron2024-1.7B": -0.154, "megatron2024-7.1B": -0.154,
      "megatron2024-16B": -0.095, "megatron2024-32B": -0.048, "torchtitan-t1-fsdp-compile": -0.134,
      "torchtitan-t3-fsdp128-compile": -0.126, "torchtitan-t2-cp1": -0.134, "torchtitan-t2-cp2": -0.028,
      "torchtitan-t2-cp4": -0.269, "torchtitan-t2-cp8": -0.297, "torchtitan-t4-2d": -0.169,
      "torchtitan-t4-2d-asynctp": -0.222, "torchtitan-t5-1f1b": -0.185, "torchtitan-t5-interleaved": -0.211,
      "torchtitan-t6-cp1": -0.148, "torchtitan-t6-cp2": -0.222, "torchtitan-t6-cp4": -0.193,
      "torchtitan-t6-cp8": -0.256, "xtuner-llama2-7b-32k-sp1": -0.046, "xtuner-llama2-7b-128k-sp8": -0.046,
      "xtuner-yi-34b-32k-sp2": -0.092, "xtuner-yi-34b-128k-sp8": -0.070, "xtuner-yi-34b-256k-sp8": -0.267,
      "xtuner-llama2-70b-32k-sp4": 0.186, "xtuner-llama2-70b-128k-sp8": -0.103,
      "xtuner-llama2-70b-256k-sp16": -0.309, "xtuner-llama2-70b-1m-sp64": -0.258,
      "xtuner-yi-34b-128k-sp8-16gpu": -0.160, "moe-folding-mixtral-8x22b": 0.053, "moe-folding-qwen2-57b": -0.077,
      "moe-flagperf-mixtral-8x7b": -0.425, "moe-zoo-qwen3-235b-a1-ep32": -0.133,
      "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.300, "moe-zoo-qwen3-235b-a3-fsdp": 0.279,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.283, "moe-zoo-qwen3-235b-a5-tp4": -0.471,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.138, "moe-zoo-qwen3-235b-long-16k-dropless": -0.308,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.117, "moe-zoo-qwen3-235b-long-32k-dropless": -0.270,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.096, "moe-zoo-qwen3-235b-long-64k-dropless": -0.214,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.078, "moe-zoo-qwen3-235b-long-128k-dropless": -0.154,
      "moe-zoo-mixtral-8x22b-dropless": -0.138, "moe-zoo-mixtral-8x22b-forced": -0.099,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.206, "moe-zoo-mixtral-8x22b-capacity1": -0.108}),
    ("9c0fdb5", "2026-12-04", "before eager PyTorch's composite kernels were priced (`memo_sim.model.eager_kernels`, "
     "kernel_fusion eager: XTuner's Hugging Face RMSNorms and SwiGLU as the fused kernels of memo's default, one "
     "each; torchtitan@2024-12's uncompiled rows not expressible)",
     {"xtuner-llama2-7b-32k-sp1": -0.044, "xtuner-llama2-7b-128k-sp8": -0.044, "xtuner-llama2-7b-256k-sp8": -0.058,
      "xtuner-llama2-7b-1m-sp16": -0.149, "xtuner-yi-34b-32k-sp2": 0.011, "xtuner-yi-34b-128k-sp8": -0.017,
      "xtuner-yi-34b-256k-sp8": -0.254, "xtuner-llama2-70b-32k-sp4": 0.356, "xtuner-llama2-70b-128k-sp8": -0.042,
      "xtuner-llama2-70b-256k-sp16": -0.286, "xtuner-llama2-70b-1m-sp64": -0.252,
      "xtuner-yi-34b-128k-sp8-16gpu": -0.114}),
    ("9fa06cc", "2026-12-04", "before a ring collective across nodes ran its node hop on the NIC shares of the "
     "group's ranks on the node (`memo_sim.cost.collectives.ring_params`: every rank's bytes rode its own share of "
     "the node's NICs, as an all-to-all's do)",
     {"megatron2021-1.7B": 0.017, "megatron2024-1.7B": -0.088, "megatron2024-7.1B": -0.070, "megatron2024-16B": -0.004,
      "torchtitan-t3-fsdp128": -0.013, "torchtitan-t3-fsdp128-compile": -0.032, "xtuner-llama2-7b-1m-sp16": -0.145,
      "xtuner-yi-34b-32k-sp2": 0.061, "xtuner-yi-34b-128k-sp8": 0.008, "xtuner-yi-34b-256k-sp8": -0.242,
      "xtuner-llama2-70b-32k-sp4": 0.393, "xtuner-llama2-70b-128k-sp8": -0.019, "xtuner-llama2-70b-256k-sp16": -0.276,
      "xtuner-llama2-70b-1m-sp64": -0.248, "xtuner-yi-34b-128k-sp8-16gpu": -0.091, "moe-folding-mixtral-8x22b": 0.076,
      "moe-folding-qwen2-57b": -0.064, "moe-zoo-qwen3-235b-a1-ep32": -0.130,
      "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.255, "moe-zoo-qwen3-235b-a3-fsdp": 0.281,
      "moe-zoo-qwen3-235b-a5-tp4": -0.466, "moe-zoo-qwen3-235b-long-16k-forced": -0.118,
      "moe-zoo-qwen3-235b-long-16k-dropless": -0.291, "moe-zoo-qwen3-235b-long-32k-dropless": -0.261,
      "moe-zoo-mixtral-8x22b-dropless": -0.126, "moe-zoo-mixtral-8x22b-forced": -0.087,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.191, "moe-zoo-mixtral-8x22b-capacity1": -0.096}),
    ("50772e1", "2026-12-04", "before NVLink ran at the 80% of its line rate NCCL reaches (the profiles' nvlink "
     "bandwidth: A100 300, Hopper 450 GB/s a direction; the Hopper nodes' all-reduce over NVLink SHARP not priced)",
     {"korthikanti-22B-full": 0.016, "korthikanti-22B-selective": -0.029, "korthikanti-175B-full": -0.015,
      "korthikanti-175B-selective": -0.060, "korthikanti-530B-full": 0.008, "korthikanti-530B-selective": -0.060,
      "korthikanti-1T-full": 0.015, "korthikanti-1T-selective": -0.010, "megatron2024-1.7B": -0.208,
      "megatron2024-7.1B": -0.166, "megatron2024-16B": -0.065, "megatron2024-32B": 0.040,
      "torchtitan-t1-fsdp": -0.085, "torchtitan-t1-fsdp-compile": -0.125, "torchtitan-t3-fsdp128": -0.103,
      "torchtitan-t3-fsdp128-compile": -0.137, "torchtitan-t2-cp2": -0.023, "torchtitan-t2-cp4": -0.265,
      "torchtitan-t2-cp8": -0.293, "torchtitan-t4-2d": -0.159, "torchtitan-t4-2d-asynctp": -0.192,
      "torchtitan-t5-1f1b": -0.162, "torchtitan-t5-interleaved": -0.184, "torchtitan-t6-cp1": -0.131,
      "torchtitan-t6-cp2": -0.195, "torchtitan-t6-cp4": -0.169, "torchtitan-t6-cp8": -0.235,
      "xtuner-llama2-7b-128k-sp8": -0.015, "xtuner-llama2-7b-256k-sp8": -0.041, "xtuner-yi-34b-32k-sp2": -0.038,
      "xtuner-yi-34b-128k-sp8": -0.043, "xtuner-yi-34b-256k-sp8": -0.254, "xtuner-llama2-70b-32k-sp4": 0.100,
      "xtuner-llama2-70b-128k-sp8": -0.075, "xtuner-yi-34b-128k-sp8-16gpu": -0.135,
      "moe-folding-mixtral-8x22b": 0.058, "moe-folding-qwen2-57b": -0.098, "moe-flagperf-mixtral-8x7b": -0.423,
      "moe-zoo-qwen3-235b-a1-ep32": -0.134, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.260,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.276, "moe-zoo-qwen3-235b-a5-tp4": -0.467,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.120, "moe-zoo-qwen3-235b-long-16k-dropless": -0.293,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.107, "moe-zoo-qwen3-235b-long-32k-dropless": -0.262,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.084, "moe-zoo-qwen3-235b-long-64k-dropless": -0.204,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.067, "moe-zoo-qwen3-235b-long-128k-dropless": -0.144}),
    ("9e64d4c", "2026-12-04", "before the rotary embedding was priced (the layer graph's rope op, each framework's "
     "kernels: Megatron-LM's fused one, transformers' and torchtitan's eager formulas, one fused kernel in a "
     "compiled block; memo priced no rotary op in any mode)",
     {"torchtitan-t1-fsdp": -0.083, "torchtitan-t1-fsdp-compile": -0.123, "torchtitan-t3-fsdp128": -0.102,
      "torchtitan-t3-fsdp128-compile": -0.136, "torchtitan-t2-cp1": -0.131, "torchtitan-t2-cp2": -0.021,
      "torchtitan-t2-cp4": -0.263, "torchtitan-t4-2d": -0.127, "torchtitan-t4-2d-asynctp": -0.173,
      "torchtitan-t5-1f1b": -0.154, "torchtitan-t5-interleaved": -0.176, "torchtitan-t6-cp1": -0.124,
      "torchtitan-t6-cp2": -0.191, "xtuner-llama2-7b-32k-sp1": 0.025, "xtuner-llama2-7b-128k-sp8": -0.013,
      "xtuner-llama2-7b-256k-sp8": -0.040, "xtuner-llama2-7b-1m-sp16": -0.147, "xtuner-yi-34b-32k-sp2": -0.036,
      "xtuner-yi-34b-128k-sp8": -0.041, "xtuner-yi-34b-256k-sp8": -0.253, "xtuner-llama2-70b-32k-sp4": 0.103,
      "xtuner-llama2-70b-128k-sp8": -0.074, "xtuner-llama2-70b-256k-sp16": -0.313,
      "xtuner-llama2-70b-1m-sp64": -0.265, "xtuner-yi-34b-128k-sp8-16gpu": -0.133,
      "moe-zoo-mixtral-8x22b-dropless": -0.124, "moe-zoo-mixtral-8x22b-forced": -0.085,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.189, "moe-zoo-mixtral-8x22b-capacity1": -0.094,
      "moe-folding-mixtral-8x22b": 0.066, "moe-folding-qwen2-57b": -0.084, "moe-flagperf-mixtral-8x7b": -0.402,
      "moe-flagperf-qwen1.5-moe-bf16": -0.188, "moe-flagperf-qwen1.5-moe-fp16": -0.179,
      "moe-zoo-qwen3-235b-a1-ep32": -0.132, "moe-zoo-qwen3-235b-a2-ep32-a2a-overlap": -0.258,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.265, "moe-zoo-qwen3-235b-a5-tp4": -0.455,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.100, "moe-zoo-qwen3-235b-long-16k-dropless": -0.277,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.090, "moe-zoo-qwen3-235b-long-32k-dropless": -0.248,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.071, "moe-zoo-qwen3-235b-long-64k-dropless": -0.193,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.059, "moe-zoo-qwen3-235b-long-128k-dropless": -0.137}),
    ("7f9bbac", "2026-12-04", "before the Hopper profiles measured row-wise and block-wise FP8 GEMMs (both ran on "
     "the tensorwise curve, no faster: `GemmFormat.no_faster_than`)",
     {"moe-zoo-mixtral-8x22b-fp8-forced": -0.186}),
    ("672822e", "2026-12-04", "before the Megatron-LM 2024 rows untied their embedding and output layer (memo tied "
     "them; the table's sizes count both)",
     {"megatron2024-1.7B": -0.207, "megatron2024-7.1B": -0.156, "megatron2024-16B": -0.043,
      "megatron2024-32B": 0.083}),
    ("d33b4c2", "2026-12-04", "before FSDP2's copies out of each layer's all-gather and into its reduce-scatter ran "
     "on the compute stream (torchtitan's fsdp_copies) and torchtitan 9dec370's AdamW as torch.optim's foreach kernels "
     "(optimizer_impl)",
     {"torchtitan-t1-fsdp": -0.048, "torchtitan-t1-fsdp-compile": -0.115, "torchtitan-t1-fsdp-compile-float8": -0.059,
      "torchtitan-t3-fsdp128": -0.068, "torchtitan-t3-fsdp128-compile": -0.129,
      "torchtitan-t3-fsdp128-compile-float8": -0.067, "torchtitan-t2-cp1": -0.127, "torchtitan-t2-cp2": -0.019,
      "torchtitan-t2-cp4": -0.262, "torchtitan-t2-cp8": -0.291, "torchtitan-t4-2d": -0.123,
      "torchtitan-t4-2d-asynctp": -0.169, "torchtitan-t5-interleaved": -0.174, "torchtitan-t6-cp4": -0.166}),
    ("64d49dc", "2026-12-04", "before Megatron-LM's column-parallel backward under sequence parallelism ran the input "
     "gradient's reduce-scatter beside the weight-gradient GEMM (it ran after the whole backward GEMM, and the "
     "re-gather hid under both of its kernels, not the data gradient's alone: `layer_time._split_column_backward`)",
     {"korthikanti-22B-selective": -0.002, "korthikanti-175B-selective": -0.042, "korthikanti-530B-selective": -0.048,
      "korthikanti-1T-selective": 0.0, "megatron2024-7.1B": -0.154, "megatron2024-16B": -0.04,
      "megatron2024-32B": 0.085, "moe-zoo-mixtral-8x22b-dropless": -0.122, "moe-zoo-mixtral-8x22b-forced": -0.082,
      "moe-zoo-mixtral-8x22b-fp8-forced": -0.127, "moe-zoo-mixtral-8x22b-capacity1": -0.091,
      "moe-folding-mixtral-8x22b": 0.069, "moe-folding-qwen2-57b": -0.082, "moe-zoo-qwen3-235b-a1-ep32": -0.127,
      "moe-zoo-qwen3-235b-a4-pp32-alltoall": -0.262, "moe-zoo-qwen3-235b-a5-tp4": -0.452,
      "moe-zoo-qwen3-235b-long-16k-forced": -0.096, "moe-zoo-qwen3-235b-long-16k-dropless": -0.274,
      "moe-zoo-qwen3-235b-long-32k-forced": -0.087, "moe-zoo-qwen3-235b-long-32k-dropless": -0.245,
      "moe-zoo-qwen3-235b-long-64k-forced": -0.069, "moe-zoo-qwen3-235b-long-64k-dropless": -0.19,
      "moe-zoo-qwen3-235b-long-128k-forced": -0.058, "moe-zoo-qwen3-235b-long-128k-dropless": -0.135}),
    ("d86a720", "2026-12-05", "before Megatron-LM's column-parallel backward with TP alone ran the input gradient's "
     "all-reduce beside the weight-gradient GEMM (megatron@2022's async_grad_allreduce; it ran after the whole "
     "backward GEMM)",
     {"korthikanti-22B-full": 0.046, "korthikanti-175B-full": 0.007, "korthikanti-530B-full": 0.021,
      "korthikanti-1T-full": 0.026}),
    ("143d0bf", "2026-12-05", "before FlashAttention's Triton kernel was priced (flash_triton: the DS4Science rows' "
     "--use-flash-attn-triton ran on FlashAttention-2's A100 curves, at the model's head dim 96)",
     {"mds4sci-tp32-16k": 0.088, "mds4sci-tp32-32k": -0.139, "mds4sci-tp32-64k": -0.322, "mds4sci-tp32-128k": -0.422,
      "mds4sci-tp32-256k": -0.635}),
    ("143d0bf", "2026-12-05", "before the FlagPerf MoE rows reduced their gradients after the backward as their launch "
     "lines do (no --overlap-grad-reduce: grad_overlap off; the megatron data's overlap before)",
     {"moe-flagperf-mixtral-8x7b": -0.400, "moe-flagperf-qwen1.5-moe-bf16": -0.184,
      "moe-flagperf-qwen1.5-moe-fp16": -0.174}),
    ("b4f75ef", "2026-12-05", "before a ring's latency across nodes paid the inter-node link's only on the hops that "
     "leave a node (nodes - 1 of its g - 1 steps, NCCL's tuning model; every step paid it before)",
     {"megatron2024-1.7B": -0.204, "megatron2024-7.1B": -0.165, "megatron2024-16B": -0.067,
      "torchtitan-t3-fsdp128": -0.048, "torchtitan-t3-fsdp128-compile": -0.105,
      "torchtitan-t3-fsdp128-compile-float8": -0.036, "xtuner-yi-34b-128k-sp8": -0.034, "mds4sci-tp32-16k": 0.271,
      "mds4sci-tp32-32k": 0.153, "mds4sci-tp32-64k": 0.094, "mds4sci-tp32-128k": 0.133, "mds4sci-tp32-256k": -0.151,
      "moe-zoo-qwen3-235b-a3-fsdp": 0.177}),
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
    ("MoE group", "+ 31 mixture-of-experts runs from 4 sources, reported as their own group (no mechanism change; the "
     "dense rows unchanged): 9 predicted at 18.4% / 41.1%"),
    ("c773b21 + fa07187 + 9019dd6", "the Model Zoo's Qwen3-235B-A22B rows run: the embedding and the loss each taking a "
     "layer's slot in the interleaved split, DeepEP, --recompute-modules layernorm moe_act / layernorm moe (a1, a2, a5 "
     "and the long-context a7-a10, forced and dropless each: 11 rows, a3 (Megatron-FSDP) and a4 (one-slot chunks) "
     "still not expressible); the Mixtral-8x22B script comments moved out of the statistics as expected values (no "
     "mechanism change for the other rows; the dense rows unchanged): measured MoE rows 16 predicted at 13.6% / "
     "42.4%, the long-context subgroup 8 at 9.6% / 18.4%"),
    ("35384d9", "+ issue #45's long-context dense runs (XTuner's speed benchmark and SP page, Megatron-DeepSpeed's "
     "DeepSpeed4Science table; no mechanism change): dense 25 predicted at 9.4% / 57.7%, its long-context subgroup "
     "10 at 15.5% / 57.7%"),
    ("b9d09df", "the deepspeed framework data runs bf16 with DeepSpeed's 16-bit gradients (its "
     "engine's default): the XTuner rows move (70B at 32K +57.7% to +18.5%, the others by under 1%), every other row "
     "unchanged: dense 25 at 7.9% / 26.8%, long-context 10 at 11.8% / 26.8%"),
    ("issue #45 item 1", "+ 17 long-context dense runs (`LONG_RUNS`): XTuner's speed benchmark (11) and SP page (1), "
     "Ulysses SP with DeepSpeed ZeRO-3 on A100s, and Megatron-DeepSpeed's DeepSpeed4Science table (5); no mechanism "
     "change, every earlier row unchanged (the 15 earlier dense rows still 5.3% / 17.0%): 10 XTuner rows predicted at "
     "15.5% / 57.7%, 2 refused by memo (Ulysses SP 16 and 64 over 8 K/V heads), the 5 DS4Science rows not predicted "
     "(no A100-40GB profile; TP 32 across nodes refused); the dense group 25 predicted at 9.4% / 57.7%"),
    ("Ulysses K/V repeat", "Ulysses over more ranks than K/V heads: each K/V head repeated tp x ulysses / n_kv times "
     "before the all-to-all (XTuner's mha.py, DeepSpeed's ulysses_sp.py; `memo_sim.layout.kv_heads`): the two "
     "Llama-2-70B rows memo refused run (256K SP 16 -30.3%, 1M SP 64 -25.4%), every other row unchanged (r = 1): "
     "dense 27 predicted at 9.4% / 30.3%, long-context 12 at 14.4% / 30.3%"),
    ("record stream", "ProcessGroupNCCL calls recordStream on collective tensors in the PyTorch of megatron@2021-2023 "
     "and memo-paper (`Layout.nccl_record_stream`; stashing is the default since 2025): a freed collective buffer "
     "returns to the caching allocator at the next synchronisation, the CPU being ahead of the GPU. Megatron-LM "
     "2021's 3.6B and 7.5B rows, run as one pass of 16 sequences (their micro-batch is not stated), run out of memory "
     "on fragmentation and are no longer predicted; Korthikanti's 22B rows move (-0.3% to +1.9%, -6.5% to -3.7%); "
     "every other row unchanged: dense 25 predicted at 10.0% / 30.3%, long-context 12 at 14.4% / 30.3%"),
    ("torchtitan@2024-12", "torch.compile as a framework mechanism (`Layout.kernel_fusion`: the residual add fused with "
     "the next norm, FP8 amax reductions in the kernels that write the tensors; `memo_sim.model.kernel_fusion`), the "
     "framework version torchtitan@2024-12 and the h100-sxm5-96gb-500w profile (the source's GPU), and torchtitan's "
     "tokens per GPU read as train.py computes them (divided by cp x tp x pp: the CP and 2D rows' published steps "
     "were cp or tp times too long): torchtitan's Table 2 (FSDP + CP, 32K-256K, Float8) and Table 4 (70B, FSDP 32 x "
     "TP 8, Float8) rows predicted (all too fast: -17% to -53%), every other row unchanged: dense 30 predicted at "
     "14.5% / 52.9%, its long-context subgroup 16 at 21.2% / 52.9%, the FP8 rows 5 at 36.8% / 52.9%"),
    ("attention kernels", "attention kernels as framework data: `flash` is FlashAttention-2, whose forward tops out at "
     "35% of an H100's peak (the FlashAttention-3 paper's published figure) on the Hopper profiles, and `cudnn`, "
     "cuDNN's fused attention that TransformerEngine prefers on Hopper (Megatron-LM today), keeps the earlier "
     "45-48% assumption; only the torchtitan rows move (-32.7% to -18.2%, -30.9% to -12.1%, -49.9% to -34.0%, "
     "-52.9% to -36.7%, the 70B 2D row -17.4% to -13.5%), every other row unchanged: dense 30 predicted at "
     "12.2% / 36.7%, long-context 16 at 17.1% / 36.7%, the FP8 rows 5 at 22.9% / 36.7%"),
    ("op_sac", "torchtitan's per-op selective activation checkpointing as a policy (`memo_sim.policy.op_sac`: every "
     "second GEMM's output and the attention's kept, the rest of the layer re-run), and torchtitan's Table 1 and 3 "
     "compiled bf16 rows run with it (-21.0%, -19.6%); the eager and the Float8 rows with it stay not expressible "
     "(eager composite kernels; what the save list keeps under Float8); every other row unchanged: dense 32 "
     "predicted at 12.7% / 36.7%, long-context 16 at 17.1% / 36.7%, the FP8 rows 5 at 22.9% / 36.7%"),
    ("c556bc0", "the loss's memory follows its kernel (`memo_sim.cost.memory.loss_tokens`, `loss_bytes_per_logit`: "
     "memo's chunked loss one 8K-token chunk at 10 bytes per bf16 logit as before, Megatron-LM's vocab-parallel loss "
     "every token of the micro-batch at 6, torchtitan's F.cross_entropy on fp32 logits every token at 12), and the "
     "checkpoint_offload policy (DeepSpeed's cpu_checkpointing); a memory mechanism, so the step-time rows move only "
     "where the caching allocator's replay moves: korthikanti-22B-selective -3.7% to -3.5%, xtuner-llama2-70b-256k-sp16 "
     "unchanged (its fp32-gradient variant now fits: 2892.2 s, -29.6%), every other row unchanged (dense 32 predicted "
     "at 12.4% / 35.2%, long-context 16 at 16.9% / 35.2%); the maximum-length rows (issue #45 item 3, first run the "
     "same day without it): fpdt-t5-ul-z2 from 32K (-50%) to 64K (0%), the three offloaded-checkpoint Ulysses rows "
     "predicted (256K, 256K, 512K against 512K each)"),
    ("xtuner framework", "the XTuner rows run on their own framework data (`memo_sim/frameworks/data/xtuner.yaml`: "
     "HF transformers' loss, logits cast to fp32 and torch's cross-entropy over every token of the rank, the "
     "torch_fused kernel, where the deepspeed data's vocab_parallel one stood in for it): their peaks rise by the "
     "logits (xtuner-yi-34b-256k-sp8 57 to 69 GiB, 81.8 GB reserved) but no replay reaches the device's capacity "
     "(0 reorganisations), so the step times move by the loss kernel's HBM bytes only: xtuner-llama2-7b-32k-sp1 "
     "-4.5% to -4.6%, xtuner-yi-34b-128k-sp8 -7.3% to -7.4%, xtuner-yi-34b-128k-sp8-16gpu -16.2% to -16.3%, the "
     "others unchanged; XTuner's three OOM statements checked on it too"),
    ("Hopper kernels", "the Hopper profiles' kernel curves measured (reports/gpu-h200-2026-11-26.md; "
     "benchmarks/gpu/hopper_curves.py --write): FlashAttention-2 and cuDNN 9.19's fused attention timed on an H200 "
     "(31-35% / 56-65% of the peak forward; an H100 within 6%), the bf16 GEMMs by memo-exec calibrate on an H100 "
     "and an H200 (short kernels by CUDA-graph replay), and FP8 tensor-wise GEMMs on the H200 as a format's own "
     "curve (`efficiency.gemm_formats`): every H100/H200 row moves, none on the A100s; cuDNN's measured speed takes "
     "the Model Zoo's long-context forced rows from +1%..+21% to -11%..-4%, the small expert GEMMs' graph-timed "
     "speed takes qwen3-235b-a5-tp4 from -42.4% to -45.7%, the FP8 curve takes torchtitan-t4-2d from -10.1% to "
     "-5.7%, FlashAttention-2's measured backward torchtitan-t2-cp8 from -35.2% to -38.0%: dense 32 predicted at "
     "12.4% / 38.0%, long-context 16 at 17.4% / 38.0%, the FP8 rows 5 at 22.2% / 38.0%, the MoE group 16 at "
     "16.3% / 45.7% (its long-context subgroup 8 at 13.1% / 28.1%)"),
    ("ring_merge", "PyTorch's experimental context parallelism's passes beside its kernels as a framework mechanism "
     "(`Layout.ring_merge`, `memo_sim.layout.ring_merge`; torchtitan@2024-12: torch_cp): each ring step's output "
     "cast to fp32 and merged by log-sum-exp, the gradients accumulated in fp32, K/V and dK/dV packed for the sends, "
     "bytes counted from torch/distributed/tensor/experimental/_attention.py (12 + 38 per later step per output "
     "element forward, on K/V repeated to the query heads as torchtitan's repeat_kv hands them to SDPA), and its "
     "dK/dV sent in fp32: torchtitan-t2-cp2 -12.8% to -7.3%, cp4 -35.1% to -30.2%, cp8 -38.0% to -32.9%, every other "
     "row unchanged: dense 32 predicted at 11.9% / 32.9%, long-context 16 at 16.4% / 32.9%, the FP8 rows 5 at "
     "19.1% / 32.9%"),
    ("power limit", "the 500 W part's power limit priced (reports/gpu-h200-2026-11-26.md section 5): on a 700 W H100 "
     "every compute-bound kernel runs at the 700 W cap, and the board power's measured line in the SM clock, followed "
     "down to 500 W, leaves 0.84-0.86 of the clock under bf16 GEMMs, 0.80 under FP8, 0.85-0.90 under "
     "FlashAttention-2 and 0.81-0.83 under cuDNN's attention (benchmarks/gpu/power_clock.py); h100-sxm5-96gb-500w "
     "takes the H100 SXM's datasheet peaks (989 / 1,979 TF, where it assumed the 912 / 1,825 midpoint) and the 700 W "
     "curves times those ratios. Only the torchtitan rows move (t1 -19.0% to -13.2%, t3 -17.7% to -12.0%, t2-cp1 "
     "-19.3% to -12.7%, cp2 -7.3% to -1.2%, cp4 -30.2% to -25.8%, cp8 -32.9% to -28.8%, t4-2d -5.7% to +0.7%): "
     "dense 32 predicted at 10.8% / 30.3%, long-context 16 at 15.1% / 30.3%, the FP8 rows 5 at 13.8% / 28.8%, the "
     "MoE group unchanged (16.3% / 45.7%)"),
    ("FSDP beside stages, async TP", "three of torchtitan@9dec370's mechanisms, each from its source: FSDP beside "
     "pipeline stages as it runs them (`memo_sim.dp.fsdp`: no resharding after the forward, every weight gathered "
     "once, a stage's whole gradients kept in the fp32 reduce dtype and reduce-scattered after each chunk's last "
     "micro-batch backward, as torch.distributed.pipelining calls FSDP's post-backward), async TP as a TP flavour "
     "(`memo_sim.tp.async_tp`: the pairs PyTorch's micro-pipeline pass fuses, the forward's and recompute's "
     "all-gathers and reduce-scatters and the backward's output-gradient all-gathers into the data-gradient "
     "matmul, run beside their GEMMs split into tp chunks), and torchao's Float8 TP styles all-gathering the float8 copy of a column-parallel GEMM's "
     "input (`precision.fp8_sp_gathers`); with the version's generated uneven split (15, 16 x 6, 15 layers) and "
     "micro-batches (the pipeline degree): torchtitan's Table 5 1F1B row and Table 6's four CP rows predicted "
     "(t5-1f1b -11.0%, t6-cp1 -9.1%, cp2 -17.8%, cp4 -17.5%, cp8 -28.3%), Table 4's AsyncTP row (-8.6%; its config "
     "now says Float8, which it ran), t4-2d +0.7% to -2.6% (the float8 gathers), every other row unchanged: dense "
     "38 predicted at 11.5% / 30.3%, long-context 20 at 15.7% / 30.3%, the FP8 rows 11 at 14.9% / 28.8%, the MoE "
     "group unchanged (16.3% / 45.7%)"),
    ("MoE saved tensors", "what a MoE block keeps for its backward, checked against Megatron-Core's experts (the "
     "router weights applied inside the fused activation, weighted_bias_swiglu_impl, so the experts' outputs are not "
     "kept) and a shared gate's product (Qwen2-MoE: sigmoid(ln2 @ w) times the shared output keeps that output, "
     "`memo_sim.model.layer_graph`: sfc2 saved, MEMO re-runs shared_fc2 for its dropped rows); memo-exec's block "
     "now applies the weights the same way (`memo_exec.moe.experts`). A memory mechanism: no row's step moved (no "
     "replay reaches a device's capacity on it), every row re-run"),
    ("pipeline layout", "each model chunk's own layer count (`Layout.chunk_layers`, `memo_sim.layout.pipeline_layout`: "
     "Megatron-LM's --pipeline-model-parallel-layout, or a framework's own rule): torchtitan@9dec370's generated split "
     "over the interleaved run's 16 virtual stages (7, 8 x 14, 7 layers: the first and last ranks hold chunks of 7 "
     "and 8) is expressible, and torchtitan's Table 5 interleaved row is predicted (t5-interleaved -11.4%: memo "
     "gives interleaving 1.29x over the 1F1B row, the table 1.28x); no mechanism changed, every other row unchanged: "
     "dense 39 predicted at 11.5% / 30.3%, the FP8 rows 12 at 14.6% / 28.8%"),
    ("XTuner's K/V repeat", "how a framework's Ulysses repeats a GQA model's K/V heads before its all-to-all, as "
     "framework data (`Layout.ulysses_kv`, `memo_sim.layout.kv_heads`): XTuner at 7575f2c91 repeats every K/V head to "
     "the query heads (repeat_kv before its sequence-parallel wrapper's all-to-all: ulysses_kv query_heads), so its "
     "GQA rows send and hold K and V at the query heads' width; memo-exec repeats the same way under that rule. The "
     "Yi-34B and Llama-2-70B rows move (70B 256K SP 16 -30.3% to -25.6%, its all-to-all across 2 nodes doubled; the "
     "others by 0.3-0.4 points; the 1M SP 64 row already repeated 8-fold), Llama-2-7B (no GQA) and every other row "
     "unchanged: dense 39 predicted at 11.4% / 28.8%, long-context 20 at 15.4% / 28.8%, the FP8 rows 12 at 14.6% / "
     "28.8%, the MoE group unchanged (16.3% / 45.7%)"),
    ("forced balance as each framework routes it", "Megatron-Core's --moe-router-force-load-balancing replaces the "
     "gate's logits by normal noise per token (RandomSTE in moe_utils.py, from its first commit 022bcb5afe to "
     "d98e8a64), so its loads are a uniform router's, not equal ones: a balance of its own (`random`, priced as "
     "dropless's busiest rank), equal loads (`forced`) being torchtitan's round-robin debug.moe_force_load_balance; "
     "each framework's data lists the balances it routes (Megatron-LM random, dropless, capacity; torchtitan forced, "
     "dropless; DeepSpeed dropless, capacity). The Model Zoo rows that ran the flag move by 0.1-1.8 points (a1 "
     "-14.5% to -13.5%, a5 -45.8% to -45.4%, the 16K forced row -11.0% to -10.6%, the Mixtral-8x22B forced "
     "script value -13.5% to -11.7%), every other row unchanged: the MoE group 18 predicted at 17.4% / 45.4% (was "
     "17.6% / 45.8%), its long-context subgroup 8 at 12.9% / 28.2%, the dense group unchanged (11.4% / 28.8%)"),
    ("DeepEP per rank", "DeepEP sends a token once to each EP rank holding one of its experts (get_dispatch_layout's "
     "is_token_in_rank; the rank expands it to its experts' copies itself), over NVLink as across nodes, where memo "
     "priced one NVLink send per routed copy as the all-to-all does: Qwen3-235B's 8 of 128 experts reach 5.3 of 8 "
     "ranks on average (`memo_sim.cost.moe.nodes_hit` over ranks), so the Model Zoo rows whose EP group memo places "
     "on NVLink move faster (a5 -45.4% to -47.1%, the long-context rows by 1.2-3.5 points: 16K forced -10.6% to "
     "-14.1%, dropless -28.2% to -31.0%; a3 +26.9% to +26.8%), a1 and a2 unchanged (their inter-node sends decide "
     "the all-to-all), every other row unchanged: the MoE group 18 predicted at 18.5% / 47.1%, its long-context "
     "subgroup 8 at 15.2% / 31.0%, the dense group unchanged (11.4% / 28.8%)"),
    ("rank order", "the rank order as layout data (`memo_sim.layout.rank_order`): pipeline stages outermost by "
     "default, as Megatron-LM (order tp-cp-ep-dp-pp), torchtitan (mesh pp, dp, cp, tp) and DeepSpeed's pipeline "
     "topology number ranks, where memo had numbered them TP, CP, PP, DP (Megatron-LM's --use-tp-pp-dp-mapping, now "
     "an option of the megatron data): a stage is a block of consecutive ranks, so where tp x cp is below a node its "
     "data-parallel and expert-parallel groups sit in fewer nodes and its stage hops cross nodes. The pipelined MoE "
     "rows with TP 2 or 4 move 0.1-1.7 points slower (Mixtral-8x22B's Model Zoo script values -15.5% to -13.9%, -11.7% "
     "to -10.0%, -26.7% to -25.0%, -12.6% to -10.9%; the Folding rows +5.0% to +5.2%, -8.5% to -8.1%; a1 -13.5% to "
     "-13.4%, a4 -28.3% to -28.2%, the 16K rows -14.1% to -13.8%, -31.0% to -30.8%), every dense row and every row "
     "whose tp x cp fills a node unchanged: the MoE group 18 predicted at 18.5% / 47.1%, its long-context subgroup 8 "
     "at 15.2% / 30.8%, the dense group unchanged (11.4% / 28.8%)"),
    ("embedding and head gathers", "the embedding's and the head's weights all-gathered as a layer's are from ZeRO 1 "
     "on (`memo_sim.cost.grad_sync`: torchtitan's fully_shard units for tok_embeddings and [norm, output], "
     "Megatron-LM's distributed optimizer gathering every bucket; the embedding's before the step's first op, wholly "
     "exposed, and under ZeRO 3 with resharding again for its backward; the head's once, twice where DeepSpeed's ZeRO "
     "3 releases it after its forward), where memo gathered the layers' alone: with 128K-token vocabularies the two "
     "are 1-2.5 layers' worth of weights each. The ZeRO and FSDP rows move slower by 0.1-2.4 points (Megatron-LM's "
     "2024 H100 table, vocabulary 131,072, distributed optimizer across nodes: 1.7B -17.8% to -15.4%, 7.1B -16.8% to "
     "-15.4%, 16B -10.5% to -9.5%, 32B -5.3% to -4.8%; torchtitan's FSDP rows by 0.1-1.1; XTuner's ZeRO-3 rows by "
     "0.1-0.3; the Model Zoo's and Folding's distributed-optimizer rows by 0.1-1.1, a3 +26.8% to +27.9%), every row "
     "without ZeRO unchanged: dense 39 predicted at 11.3% / 28.8%, long-context 20 at 15.4% / 28.8%, the FP8 rows 12 "
     "at 14.6% / 28.8%, the MoE group 18 at 18.5% / 47.1%, its long-context subgroup 8 at 15.1% / 30.7%"),
    ("K/V all-gather", "PyTorch's experimental context parallelism exchanges K/V as its allgather rotate method does "
     "(torchtitan@2024-12's default; `memo_sim.layout.ring_merge` kv_allgather, `_AllGatherRotater` of "
     "torch/distributed/tensor/experimental/_attention.py): one all-gather of the packed K/V issued at ring step 0 "
     "and waited for at step 1, so beside step 0's blocks alone, in the forward and the backward (whose dK/dV still "
     "shift one step at a time), the gathered chunks held through the pass; memo priced cp - 1 shifts each beside a "
     "step. Only where the gather outlasts step 0 does a row move: torchtitan's 405B CP rows, whose CP group spans "
     "nodes (TP 8 fills each), CP 4 -17.6% to -16.3% and CP 8 -28.3% to -23.7%; the 8B CP rows' gathers on NVLink "
     "hide under step 0, every other row unchanged: dense 39 predicted at 11.1% / 28.8%, long-context 20 at 15.1% / "
     "28.8%, the FP8 rows 12 at 14.1% / 28.8%, the MoE group unchanged (18 at 18.5% / 47.1%)"),
    ("ed6470f + the next commit", "NVFP4 GEMMs (TransformerEngine's NVFP4BlockScaling) and a GB300 NVL72 profile, which "
     "no published row runs; under Megatron's kept quantised GEMM inputs (TransformerEngine's fp8_saved_inputs) the "
     "copies now carry their block scales, the backward's d_ln1 / d_ln2 / d_act are in the model dtype (they were "
     "sized as the copies) and the norms and the activation write the model dtype: no counted row runs Megatron's "
     "FP8, so every group is unchanged; the expected-value Mixtral-8x22B FP8 row -20.9% to -20.6%"),
    ("separate norms", "Megatron-LM's --recompute-modules layernorm re-runs only the norms that are modules of their "
     "own (its TransformerEngine layer fuses a non-MLA model's input norm into QKV, which keeps its output; "
     "`memo_sim.model.layer_graph.separate_norms`): the Model Zoo's Qwen3-235B rows that recompute layernorm move "
     "faster by 0.1 point (a1 -13.2% to -13.3%, the long-context dropless 16K -30.7% to -30.8%); in the same run "
     "QK norms kept under a framework's autograd, FP8 one copy on Blackwell, DeepEP's receive side, a stage's place "
     "in its layout and the bound search's fixed batch moved no row: dense 39 predicted at 11.1% / 28.8%, "
     "long-context 20 at 15.1% / 28.8%, the FP8 rows 12 at 14.1% / 28.8%, the MoE group 18 at 18.5% / 47.1%, its "
     "long-context subgroup 8 at 15.2% / 30.8%"),
    ("interleaved warm-up", "interleaved 1F1B at m = pp warms up (v - 1) x p + 2 (p - 1 - s) chunk forwards as "
     "Megatron-LM has since 4295be1a6c and PyTorch's ScheduleInterleaved1F1B always has, where every chunk forward "
     "warmed up: torchtitan's Table 5 interleaved row (8 micro-batches over 8 stages) -11.4% to -13.9%, a shorter "
     "bubble; in the same run a pipeline's layers at their own attention kind, framework any's Ulysses backward and "
     "ring dK/dV, a MoE layer's experts whole where their expert data-parallel group is one rank and the optimizer "
     "host copy moved no row: dense 39 predicted at 11.2% / 28.8%, long-context 20 at 15.1% / 28.8%, the FP8 rows 12 "
     "at 14.3% / 28.8%, the MoE group 18 at 18.5% / 47.1%, its long-context subgroup 8 at 15.2% / 30.8%"),
    ("torchao's saved FP8 inputs", "torchtitan@2024-12's torchao (eab345c) keeps the FP8 copies of the GEMM inputs "
     "for the backward (`fp8_saved_inputs`; its per-forward weight casts stay under not_modelled), FP8 cast copies "
     "are layer memory, and one rule decides the casts' time and buffers: every torchtitan Float8 row is faster, by "
     "0.2 to 4.1 points (t4-2d -2.7% to -6.6%, t4-2d-asynctp -8.6% to -12.7%, t5-1f1b -11.0% to -13.8%, "
     "t5-interleaved -13.9% to -16.6%, t2-cp8 -28.8% to -29.0%); in the same run DeepSpeed's ZeRO-1/2 gather after "
     "the step, torchtitan's ZeRO 0 as FSDP2, the tied embedding's one gather and pipelines' own offload slots moved "
     "no row: dense 39 predicted at 11.7% / 29.0%, long-context 20 at 15.5% / 29.0%, the FP8 rows 12 at 16.0% / "
     "29.0%, the MoE group 18 at 18.5% / 47.1%"),
    ("Ulysses across nodes", "a Ulysses all-to-all whose group spans nodes sends its off-node peers' shares over "
     "the inter-node link and its on-node peers' over NVLink at the same time (`collectives.group_alltoall_time`, "
     "expert parallelism's rule; every byte but a rank's own rode the inter-node link before): XTuner's rows across "
     "nodes are faster, 0.4 to 5.3 points (llama2-7b-1m-sp16 -13.4% to -14.9%, llama2-70b-256k-sp16 -25.6% to "
     "-30.9%, llama2-70b-1m-sp64 -25.4% to -25.8%); in the same run selective recompute's one rebuilt lse moved "
     "korthikanti-22B-selective -3.5% to -3.2%, and the recomputing policies' lse and the loss's separate requests "
     "moved three FPDT maxima up a grid step or so (362K to 384K, 492K to 506K, 606K to 624K; their errors on the "
     "source's grid unchanged): dense 39 predicted at 11.9% / 30.9%, long-context 20 at 15.9% / 30.9%, the FP8 rows "
     "12 at 16.0% / 29.0%, the MoE group 18 at 18.5% / 47.1%"),
    ("device memory as PyTorch reports it", "the 80 GB profiles hold what PyTorch reports (A100 79.25 GiB, A800 "
     "79.33 GiB, H100 79.18 GiB, measured; 80 GiB before), and a MEMO plan's caching-allocator replay beside its arena "
     "decides its fit: Korthikanti's 22B rows on A100s move by 0.3-0.4 points (full +1.9% to +1.6%, selective -3.2% "
     "to -3.6%: the caching allocator's replay reorganises differently on the smaller device), the FPDT maxima fall a few K (384K to 376K, 506K to "
     "498K, 624K to 618K; their errors on the source's grid unchanged), torchtitan's Table 5/6 rows no longer fit "
     "the 80 GB H100 beside their 96 GB part; every other row unchanged: dense 39 predicted at 11.9% / 30.9%, "
     "long-context 20 at 15.9% / 30.9%, the FP8 rows 12 at 16.0% / 29.0%, the MoE group 18 at 18.5% / 47.1%"),
    ("torchao's saved FP8 weights", "torchtitan@2024-12's torchao (eab345c) saves each layer's FP8 weight copy "
     "(one byte an element) for that layer's backward, held as its saved tensors are (`fp8_weights_saved`: every "
     "layer's under store-all, the recomputed layer's alone under full AC), where memo counted two copies of the "
     "FSDP-gathered layers' (every layer of a stage beside pipelines) as a per-step cache: no counted row moved (the "
     "Float8 rows run full AC, their memory only falls), and the 80 GB H100 variants of Table 5's interleaved row and "
     "Table 6's CP 8 row fit now (21.929 s and 169.031 s; no fit before); in the same run FSDP2's cast of a one-rank "
     "expert group's experts and the analytic tier's gathers hidden under the whole layer unit moved no row: dense "
     "39 predicted at 11.9% / 30.9%, long-context 20 at 15.9% / 30.9%, the FP8 rows 12 at 16.0% / 29.0%, the MoE "
     "group 18 at 18.5% / 47.1%"),
    ("torch's TP keeps its gathered inputs", "torchtitan's ColwiseParallel (9dec370's apply_tp, b5bcd76c's "
     "decoder_sharding) reads the attention's and the feed-forward's input all-gathered once at the module boundary, "
     "and autograd saves that gathered tensor for the weight gradients (`Layout.sp_input_kept`): no backward "
     "re-gather, the full-length norm outputs kept, where memo priced Megatron-LM's re-gather before each "
     "column-parallel GEMM's backward: the eight torchtitan rows with TP 0.4-3.6 points faster, further from the "
     "measured steps (torchtitan-t4-2d -13.5% to -16.9%, its AsyncTP row -18.6% to -22.2%, torchtitan-t6-cp8 -24.4% "
     "to -24.8%), every other row unchanged: dense 39 predicted at 12.8% / 30.9%, long-context 20 at 16.2% / 30.9%, "
     "the FP8 rows 12 at 19.0% / 28.9%, the MoE group 18 at 18.5% / 47.1%"),
    ("Megatron-Core's EP all-to-all overlap", "--overlap-moe-expert-parallel-comm with --delay-wgrad-compute "
     "(`Layout.ep_overlap`, memo_sim/engine/schedules/ep_overlap.py, read in Megatron-LM at d98e8a64): one more "
     "warm-up forward, each steady-state forward merged with the backward after it, each layer pair's dispatch and "
     "combine beside the other micro-batch's compute: the Model Zoo's a2 row, which ran it and which memo had run as "
     "a1 with its all-to-all exposed, -3.0% to -30.0% (memo's overlap hides the cross-node DeepEP dispatch and "
     "combine, 38% of a layer, where the cluster's gained 1.12x over a1: the all-to-all kernels' SMs and a1's host "
     "issuing, named in the row, are not priced), every other row unchanged: dense 39 predicted at 12.9% / 30.9%, "
     "long-context 20 at 16.5% / 30.9%, the FP8 rows 12 at 19.5% / 29.7%, the MoE group 18 at 20.9% / 47.1%"),
    ("SMs held by communication", "a kernel beside a communication kernel runs on the SMs it leaves "
     "(`memo_sim.cost.comm_sms`; the profiles' gpu.sm_count and gpu.comm_sms: NCCL's 24 channels of 108 A100 and "
     "132 Hopper SMs from public NCCL logs, 16 on the A800; DeepEP's 20 as Megatron-LM sets them): every row whose "
     "collectives run beside its layers slower, 57 rows by 0.2-17 points, most too fast before (Megatron-LM's 2024 "
     "H100 rows -15.4% to -8.8% at 1.7B and -4.8% to +4.0% at 32B with their overlapped distributed optimizer over "
     "48 DP ranks; torchtitan-t3-fsdp128-compile -12.6% to -3.2%; the a2 row -30.0% to -25.5%), one too slow further "
     "(xtuner-llama2-70b-32k-sp4 +18.6% to +35.6%, its ZeRO-3 traffic as long as its compute on the profile's 4 HDR "
     "cards per node): dense 39 predicted at 11.2% / 35.6%, long-context 20 at 15.3% / 35.6%, the FP8 rows 12 at "
     "17.8% / 29.3%, the MoE group 18 at 20.1% / 46.6%"),
    ("eager PyTorch's composite kernels", "an uncompiled layer's RMSNorm (over an fp32 upcast: 8 kernels forward, "
     "16 backward, 36 and 92 bytes an element where the fused kernel moves 4 and 8) and SwiGLU (2 and 3 kernels), "
     "with what their autograd keeps for the backward (6 and 2 bytes an element), counted under a TorchDispatchMode (`memo_sim.model.eager_kernels`, benchmarks/eager_kernels.py) and priced "
     "where a framework runs them (kernel_fusion eager: XTuner's Hugging Face layers): the 12 XTuner rows 0.4-7.0 "
     "points slower (10 of them too fast before: xtuner-llama2-7b-32k-sp1 -4.4% to +2.5%, "
     "xtuner-yi-34b-128k-sp8-16gpu -11.4% to -9.1%; xtuner-llama2-70b-32k-sp4 +35.6% to +39.3%), and torchtitan's "
     "two uncompiled rows of Tables 1 and 3 predicted (t1-fsdp -8.5%, t3-fsdp128 -1.3%): dense 41 predicted at "
     "10.7% / 39.3%, long-context 20 at 15.0% / 39.3%, the FP8 and MoE rows unchanged"),
    ("a ring's node hop on the node's NICs", "a ring collective (all-gather, reduce-scatter, all-reduce) across "
     "nodes crosses each node boundary once with one rank's bytes, on channels spread over the NICs of the group's "
     "ranks on the node (`memo_sim.cost.collectives.ring_params`: their per-GPU shares together, capped by NVLink; "
     "nccl-tests measured 85-96 GB/s of all-reduce bus bandwidth over 3 nodes of 8 A100s with 4 HDR NICs, "
     "NVIDIA/nccl-tests issue 119): the data-parallel, FSDP and ZeRO-3 collectives of groups with several ranks a "
     "node faster, 28 rows by 0.1-29 points (xtuner-llama2-70b-32k-sp4 +39.3% to +10.0%, its ZeRO-3 traffic no "
     "longer as long as its compute; moe-zoo-qwen3-235b-a3-fsdp +28.1% to +17.7%; torchtitan's 128-GPU FSDP rows "
     "-1.3% to -10.3% and -3.2% to -13.7%, memo's step on 16 nodes now 0.8-0.9% above the same local batch's on "
     "one node, measured 2.4-2.8% above (10.9-13.2% in memo before); "
     "Megatron-LM's 2024 H100 rows with several DP ranks a node -8.8% to -20.8% at 1.7B, -7.0% to -16.6% at 7.1B, "
     "their distributed optimizer's exposed tails gone): dense 41 predicted at 11.7% / 31.3%, long-context 20 at "
     "14.5% / 31.3%, the FP8 rows 12 at 17.8% / 29.3%, the MoE group 18 at 19.7% / 46.7%"),
    ("NVLink at the rate NCCL reaches", "the profiles' NVLink at 80% of its line rate, the protocol overhead the NCCL "
     "maintainer gives ('450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink "
     "bandwidth of 370GB/s', NVIDIA/nccl-tests issue 212; 8 A100s measured 232.5 GB/s of all-reduce bus bandwidth of "
     "their 300, NVIDIA/nccl issue 1048), and the Hopper nodes' all-reduce at NVLink SHARP's ~480 GB/s: 50 rows "
     "slower by 0.1-4.3 points, most of them too fast before (torchtitan-t4-2d -15.9% to -12.7%, its TP 8 "
     "collectives on the critical path; Korthikanti's selective rows -6.0% to -4.2% and -4.8%; the Model Zoo's "
     "long-context Qwen3 rows 0.7-2.0 points), some too slow further (megatron2024-32B +4.0% to +8.3%, "
     "korthikanti-22B-full +1.6% to +4.6%): dense 41 predicted at 11.4% / 31.3%, long-context 20 at 14.3% / 31.3%, "
     "the FP8 rows 12 at 17.1% / 29.1%, the MoE group 18 at 18.8% / 45.5%"),
    ("the rotary embedding", "the rotary embedding as an op of the layer (`memo_sim.model.rope_kernels`, "
     "`memo_sim.cost.rope`), run with each framework's kernels: Megatron-LM's rope fusion (one kernel per tensor), "
     "transformers' eager apply_rotary_pos_emb (XTuner: 5 kernels and 20.5 bytes an element forward, 8 and 32.5 "
     "backward, counted under a TorchDispatchMode), torchtitan's eager complex multiply (3 and 20.5, 4 and 21.5), one "
     "fused kernel in a compiled block; Megatron-LM's GPT rows keep its default learned positions (no op): 46 rows "
     "slower by 0.1-3.5 points, most too fast before (torchtitan-t1-fsdp -8.3% to -4.8% and t3-fsdp128 -10.2% to "
     "-6.8%, uncompiled; the MoE rows on Megatron-LM 0.1-0.5), some too slow further (xtuner-llama2-7b-32k-sp1 +2.5% "
     "to +5.5%, xtuner-llama2-70b-32k-sp4 +10.3% to +11.4%): dense 41 predicted at 11.1% / 31.1%, long-context 20 "
     "at 14.2% / 31.1%, the FP8 rows 12 at 16.9% / 29.1%, the MoE group 18 at 18.5% / 45.2%"),
    ("FP8 GEMMs with row-wise and block-wise scales measured", "the Hopper profiles' fp8-rowwise and fp8-blockwise "
     "curves: their measured tensorwise curve over each "
     "format's time per tensorwise time on the same 218 layer-GEMM shapes in one run on an H200 (torch._scaled_mm, "
     "every other shape in the reverse order; block-wise 1.10x at 1e11-2e11 FLOPs to 1.16x at 4e12, row-wise "
     "1.01-1.03x; both had run on the tensorwise curve, no faster): moe-zoo-mixtral-8x22b-fp8-forced -18.6% to "
     "-12.7% (its FP8 speed-up over bf16 GEMMs 1.36x to 1.27x, the script's expected values 1.20x; an "
     "expected-value row, in no mean), no other row moves: dense 41 predicted at 11.1% / 31.1%, long-context 20 at "
     "14.2% / 31.1%, the FP8 rows 12 at 16.9% / 29.1%, the MoE group 18 at 18.5% / 45.2%"),
    ("per-op checkpointing under Float8; the Megatron-LM 2024 rows untied", "torchtitan's per-op selective "
     "checkpointing priced under torchao's FP8 and MXFP8 linears, whose GEMM reaches the checkpoint as aten.mm on "
     "tensor subclasses and is kept or re-run as a bf16 one (torchao eab345c's saved casts made again in the "
     "recompute for the kept GEMMs; 9dec370's aten.abs on the save list kept by eager PyTorch, not by a compiled "
     "block's partitioner, which keeps neither it nor w2's output): torchtitan-t1-fsdp-compile-float8 and "
     "t3-fsdp128-compile-float8 predicted (-5.9%, -6.7%); the Megatron-LM 2024 rows' embedding and output layer "
     "untied (the table's sizes count both): 1.7B -20.7% to -20.4%, 7.1B -15.6% to -15.4%, 16B -4.3% to -4.0%, 32B "
     "+8.3% to +8.5%: dense 43 predicted at 10.8% / 31.1%, long-context 20 at 14.2% / 31.1%, the FP8 rows 14 at "
     "15.4% / 29.1%, the MoE group 18 at 18.5% / 45.2%"),
    ("FSDP2's copies; torchtitan 9dec370's foreach AdamW", "FSDP2's copy of each layer's gathered weights out of its "
     "all-gather before every forward and backward, and of its gradients into its reduce-scatter (read in bf16, "
     "written in fp32) after its backward, on the compute stream (torch/distributed/fsdp/_fully_shard: "
     "wait_for_unshard's foreach_all_gather_copy_out, foreach_reduce's copy-in; the torchtitan data's fsdp_copies), "
     "and torchtitan 9dec370's AdamW as torch.optim's foreach kernels (optimizer_impl foreach: --optimizer.fused off "
     "by default): the torchtitan rows 0.1-4.6 points slower, all too fast before (t1-fsdp -4.8% to -1.7%, "
     "t1-fsdp-compile -11.5% to -7.9%, t1-fsdp-compile-float8 -5.9% to -1.3%, t3-fsdp128-compile -12.9% to -10.5%, "
     "t2-cp1 -12.7% to -11.7%, t4-2d -12.3% to -11.9%): dense 43 predicted at 10.3% / 31.1%, long-context 20 at "
     "14.1% / 31.1%, the FP8 rows 14 at 14.6% / 28.9%, the MoE group 18 at 18.5% / 45.2%"),
    ("FlashAttention's Triton kernel; FlagPerf's gradients after the backward", "the DS4Science rows' attention "
     "(--use-flash-attn-triton) priced as FlashAttention's Triton kernel on the A100 profiles' flash_triton curves "
     "(FlashAttention-2's times the Triton kernel's speed over FlashAttention-2's on the FlashAttention-2 README's A100 "
     "chart, 0.51 to 0.42; at head dim 128, to which the kernel pads the model's 96): mds4sci-tp32-16k / 32k / 64k / "
     "128k / 256k +8.8% / -13.9% / -32.2% / -42.2% / -63.5% to +27.1% / +15.3% / +9.4% / +13.3% / -15.1%; the "
     "FlagPerf MoE rows' gradients reduced after the backward as their launch lines have it (no "
     "--overlap-grad-reduce): -40.0% / -18.4% / -17.4% to -39.9% / -18.3% / -17.4%: dense 48 predicted at 10.9% / "
     "31.1%, long-context 25 at 14.5% / 31.1%, the FP8 rows 14 at 14.6% / 28.9%, the MoE group 18 at 18.8% / 45.9%"),
    ("a ring's latency across nodes", "a ring collective over nodes pays the inter-node link's latency only on the hops "
     "that leave a node, nodes - 1 of its g - 1 steps (all-reduce twice over), NVLink's on the rest (NCCL's tuning "
     "model, src/graph/tuning.cc; every step paid the inter-node latency before): mds4sci-tp32-16k / 32k / 64k / 128k / "
     "256k +27.1% / +15.3% / +9.4% / +13.3% / -15.1% to +17.7% / +11.4% / +8.0% / +12.8% / -15.3%, "
     "moe-zoo-qwen3-235b-a3-fsdp +17.7% to +15.2%, the multi-node data-parallel rows 0.1-0.5 points faster "
     "(megatron2024-1.7B -20.4% to -20.9%, torchtitan-t3-fsdp128-compile -10.5% to -10.9%): dense 48 predicted at "
     "10.6% / 31.1%, long-context 25 at 13.9% / 31.1%, the FP8 rows 14 at 14.6% / 28.9%, the MoE group 18 at 18.7% / "
     "45.9%"),
)


@dataclass(frozen=True)
class Result:
    run: Run
    predicted_s: float | None
    error: float | None  # predicted / published - 1
    status: str
    layout: str
    ablation: tuple[tuple[str, float | None], ...] = ()  # (mechanism switched to memo's default, error)
    sim_s: float = 0.0  # wall seconds memo took for the row (its prediction, ablations and variants)
    variants: tuple[tuple[str, float | None], ...] = ()  # (`Run.variants` label, memo's step time; None: no fit)
    peak_gib: float | None = None  # the event simulator's peak GPU memory (GiB) of the prediction
    allocator: tuple[tuple[str, float], ...] = ()  # its caching-allocator replay: peak reserved bytes, reorganizations


def _simulate(run: Run, lay: Layout):
    return simulate(run.model(), lay, run.global_batch // run.dp, run.seq, get_policy(run.policy),
                    load_profile(run.profile), keep_timeline=False, schedule=run.schedule(),
                    micro_batch=run.micro_batch)


def predict(run: Run, ablate: bool = True, variants: bool = True) -> Result:
    """memo's tier-2 step time for an expressible run (``batch`` = global batch / DP, one pass).
    ``ablate``: also the error with each of the framework's mechanisms switched to ``any``'s value;
    ``variants``: also the row's variants (the report's "; dropless: ..." beside the prediction)."""
    t0 = time.perf_counter()
    res = _predict(run, ablate, variants)
    return replace(res, sim_s=time.perf_counter() - t0)


def _predict(run: Run, ablate: bool, with_variants: bool = True) -> Result:
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
            if field == "ulysses_kv" and lay.ulysses == 1:  # no all-to-all: how it would repeat K/V heads is moot
                continue
            if getattr(lay, field) != getattr(default, field):
                alt = _simulate(run, replace(lay, **{field: getattr(default, field)}))
                ablation.append((k, alt.iteration_s / run.published_s - 1 if alt.status == "OK" else None))
    variants = []
    for label, fields in (run.variants if with_variants else ()):
        alt = replace(run, **dict(fields))
        v = _simulate(alt, alt.layout())
        variants.append((label, v.iteration_s if v.status == "OK" else None))
    a = sim.allocator or {}
    return Result(run, sim.iteration_s, sim.iteration_s / run.published_s - 1, "OK", lay.label(), tuple(ablation),
                  variants=tuple(variants), peak_gib=sim.peak_gpu_bytes / 2**30,
                  allocator=tuple((k, float(a[k])) for k in ("peak_reserved_bytes", "reorganizations") if k in a))


def summary(results: list[Result]) -> dict:
    """Rows, predicted rows, sources and the mean / max |error| over the measured rows (a row whose published number
    is an expected value, `Run.expected`, is left out of all of them)."""
    results = [r for r in results if not r.run.expected]
    errs = [abs(r.error) for r in results if r.error is not None]
    return {"rows": len(results), "predicted": len(errs), "sources": len({r.run.source for r in results}),
            "mean_abs_error": sum(errs) / len(errs) if errs else None, "max_abs_error": max(errs, default=None)}


def group_summaries(results: list[Result]) -> dict[str, dict]:
    """`summary` of each group of rows (``dense``: the dense decoders; ``moe``: the mixtures of experts; measured rows
    only), of each group's long-context rows (``<group>-long-context``: `Run.long_context`) where it has any, and of
    the FP8 rows of both (``fp8``)."""
    out = {g: summary([r for r in results if r.run.group == g]) for g in dict.fromkeys(r.run.group for r in results)}
    for g in list(out):
        lc = [r for r in results if r.run.group == g and r.run.long_context]
        if lc:
            out[f"{g}-long-context"] = summary(lc)
    fp8 = [r for r in results if r.run.gemm_format != "bf16"]
    if fp8:  # the rows whose layer GEMMs run in an FP8 format, over both groups (issue #46)
        out["fp8"] = summary(fp8)
    return out


def _errors_line(s: dict) -> str:
    return (f"{s['rows']} runs from {s['sources']} sources; memo predicts {s['predicted']}: mean |error| "
            + (f"{100 * s['mean_abs_error']:.1f}%, max |error| {100 * s['max_abs_error']:.1f}%" if s["predicted"]
               else "n/a"))


def _moe_row(r: Result) -> str:
    pred = f"{r.predicted_s:.3f} s" if r.predicted_s is not None else r.status
    pred += "".join(f"; {label}: " + (f"{t:.3f} s ({100 * (t / r.run.published_s - 1):+.1f}%)" if t is not None
                                      else "no fit") for label, t in r.variants)
    err = f"{100 * r.error:+.1f}%" if r.error is not None else (r.run.why_not or "")
    cfg = r.run.config + (f"; schedule: {r.run.schedule_source}" if r.run.schedule_source else "")
    lay = f"{r.layout} ({r.run.policy})" if r.layout else "-"
    lc = "yes" if r.run.long_context else "-"
    return (f"| {r.run.id} | {lc} | {cfg} | {lay} | {r.run.published_s:.3f} s | {r.run.published_note} | {pred} | "
            f"{err} | {r.run.not_modelled or '-'} | {r.sim_s:.1f} s |")


_MOE_HEAD = ("| run | long context | configuration | memo layout (policy) | {pub} | how the step follows | memo step "
             "(variants beside) | error | used by the run, not modelled | memo wall |")


def moe_report(results: list[Result]) -> list[str]:
    """The MoE group's section: its measured rows (with the long-context subgroup), its misses with their
    mechanisms, the expected values kept apart, what was left out."""
    rows = [r for r in results if r.run.group == "moe"]
    if not rows:
        return []
    measured = [r for r in rows if not r.run.expected]
    expected = [r for r in rows if r.run.expected]
    s, lc = summary(measured), summary([r for r in measured if r.run.long_context])
    lines = ["", "## Mixture-of-experts group (issue #49 item 7)", "",
             f"- measured rows: {_errors_line(s)} (target: 15% mean, 25% max).",
             f"- long-context subgroup (s >= {LONG_CONTEXT_TOKENS}, the 'long context' column; issue #45 reuses these "
             f"rows): {_errors_line(lc)}.",
             f"- {len(expected)} more rows are expected values a launch script states, not measurements: predicted "
             "and listed apart below, never counted.",
             "- Every row: framework `megatron` (memo_sim/frameworks/data/megatron.yaml), H100 rows on profile "
             "`h100-sxm5-80gb` (Eos / DGX H100: 8 GPUs per node, 8 x 400 Gb/s IB; the Model Zoo's stated 'InfiniBand "
             "8x50 GB/s' is the same 50 GB/s per GPU), A800 rows on `a800-80gb`; "
             "global batch / DP sequences per replica in micro-batches as the source states, the schedule as "
             "written beside each row; the expert layout as Megatron-Core folds it (`memo_sim.layout.parallel`).",
             "- Megatron's `--recompute-activations` is memo's `selective_recompute` (the attention core); "
             "`--recompute-modules layernorm moe_act` is `recompute_norm_act`, `--recompute-modules layernorm moe` is "
             "`recompute_moe`; `--account-for-embedding/loss-in-pipeline-split` is the layout's "
             "`account_embedding_loss` (the 'el' of the layout label); `--moe-token-dispatcher-type flex "
             "--moe-flex-dispatcher-backend deepep` is `moe_dispatcher: deepep`.",
             "- memo wall: seconds memo took for the row on this machine (its prediction, the mechanism ablations "
             "of the dense table and the variants beside the row).",
             "", _MOE_HEAD.format(pub="published step"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_moe_row(r) for r in measured]
    far = [r for r in measured if r.error is not None and abs(r.error) > 0.10]
    if far:
        lines += ["", "Measured MoE rows off by more than 10%, and the mechanism named:", ""]
        lines += [f"- {r.run.id} ({100 * r.error:+.1f}%): {_outlier(r, MOE_OUTLIERS)}" for r in far]
    if expected:
        lines += ["", "### Expected values (not measurements)", "",
                  "Numbers a launch script states as what a run should reach ('performance should be around X "
                  "TFLOPS'), not logged measurements. Issue #49 asks for measured throughput, so these rows are "
                  "predicted and kept here but counted in no mean or max; 'error' is memo against the expected "
                  "value.", "", _MOE_HEAD.format(pub="expected step"),
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [_moe_row(r) for r in expected]
        lines += ["", "Where memo and the expected values part by more than 10%:", ""]
        lines += [f"- {r.run.id} ({100 * r.error:+.1f}%): {_outlier(r, MOE_OUTLIERS)}"
                  for r in expected if r.error is not None and abs(r.error) > 0.10]
    lines += ["", "Left out of the MoE group altogether:", ""]
    lines += [f"- {what}: {why}." for what, why in MOE_LEFT_OUT]
    return lines


def _outlier(r: Result, notes: dict | None = None) -> str:
    """The row's mechanism text (``notes``, `OUTLIERS` by default: a string, or a function of the row's result)."""
    text = (OUTLIERS if notes is None else notes).get(r.run.id, "not analysed yet")
    return text(r) if callable(text) else text


def report(results: list[Result], wall_s: float, maxlen: list | None = None) -> str:
    _PREDICTED.update({r.run.id: r for r in results})
    moe = [r for r in results if r.run.group == "moe"]
    fp8 = [r for r in results if r.run.gemm_format != "bf16"]
    results = [r for r in results if r.run.group != "moe"]
    s = summary(results)
    lines = [
        "# Published runs: memo's predicted step time against measured ones", "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; machine: {platform.node()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {wall_s:.1f} s for all rows",
        "- command: `python benchmarks/published_runs.py` (tier 2: the event simulator; batch = global batch / DP; "
        "a pipelined run (PP > 1) in the 1F1B or interleaved 1F1B schedule at the micro-batch its source states, "
        "a single-stage run as one pass, or in the micro-batches its source states (the XTuner rows: GAS "
        "micro-batches of one sequence))",
        f"- dense group: {_errors_line(s)}",
        *([f"- dense long-context subgroup (s >= {LONG_CONTEXT_TOKENS}, `Run.long_context`; issue #45): "
           f"{_errors_line(summary([r for r in results if r.run.long_context]))}"]
          if any(r.run.long_context for r in results) else []),
        *([f"- FP8 rows (layer GEMMs in an FP8 format, dense and MoE; issue #46), measured rows: "
           f"{_errors_line(summary(fp8))}"] if fp8 else []),
        *([f"- mixture-of-experts group (its own section below), measured rows: {_errors_line(summary(moe))}"
           + (f"; {sum(r.run.expected for r in moe)} rows of expected values (not measurements) listed apart"
              if any(r.run.expected for r in moe) else "")] if moe else []),
        "- error = predicted / published - 1 (negative: memo too fast). No constant was set from these numbers: "
        "a row moves only when a mechanism changes, and then all rows are re-run.", "",
        "| run | configuration | framework (mechanisms) | memo layout | published step | memo step (variants "
        "beside, never counted) | error | error with one mechanism switched to memo's default |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        fw = get_framework(r.run.framework)
        mech = ", ".join(f"{k}={v}" for k, v in fw.mechanisms)
        pred = f"{r.predicted_s:.3f} s" if r.predicted_s is not None else r.status
        pred += "".join(f"; {label}: " + (f"{t:.3f} s ({100 * (t / r.run.published_s - 1):+.1f}%)" if t is not None
                                          else "no fit") for label, t in r.variants)
        err = f"{100 * r.error:+.1f}%" if r.error is not None else (r.run.why_not or "")
        abl = "; ".join(f"{k}: " + (f"{100 * e:+.1f}%" if e is not None else "OOM") for k, e in r.ablation)
        lines.append(f"| {r.run.id} | {r.run.config} | {fw.name} ({mech}) | {r.layout or '-'} | "
                     f"{r.run.published_s:.3f} s | {pred} | {err} | {abl} |")
    far = [r for r in results if r.error is not None and abs(r.error) > 0.10]
    if far:
        lines += ["", "Rows off by more than 10%, and the mechanism named:", ""]
        lines += [f"- {r.run.id} ({100 * r.error:+.1f}%): {_outlier(r)}" for r in far]
    if any(r.run in LONG_RUNS for r in results):
        lines += ["", "Long-context dense rows (issue #45 item 1): what their sources do not state, and the one choice "
                  "memo runs each with (from the source's own scripts, configs and defaults, never from the error):",
                  ""]
        lines += [f"- {what}: {choice}." for what, choice in LONG_CHOICES]
        lines += ["", "Left out of the long-context dense rows altogether:", ""]
        lines += [f"- {what}: {why}." for what, why in LONG_LEFT_OUT]
    if maxlen:
        from published_maxlen import report_lines as maxlen_lines

        lines += maxlen_lines(maxlen)
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
    lines += [f"- {src}. Step time: as each MoE row's 'how the step follows' says."
              for src in dict.fromkeys(r.run.source for r in moe)]
    lines += ["- Profile `dgx-a100-selene` (the Megatron-LM runs): A100 80 GB numbers of `a100-sxm4-80gb` with "
              "Selene's eight HDR HCAs per node. The model-state recipe is each framework version's for the run's "
              "dtype (its `precision.recipes`, as `memo-sim whatif --framework` applies it): fp16 with 16-bit "
              "gradients reduced in fp16 (recipe `zero`: `--accumulate-allreduce-grads-in-fp32` stays off under "
              "fp16), bf16 with fp32 main gradients (recipe `megatron`) for Megatron-LM and bf16 gradients reduced "
              "in bf16 (recipe `zero`, DeepSpeed's engine default) for DeepSpeed."]
    lines += moe_report(moe) + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/published-runs.md")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = [predict(r) for r in RUNS]
    from published_maxlen import RUNS as MAXLEN_RUNS, predict as predict_maxlen

    maxlen = [predict_maxlen(r) for r in MAXLEN_RUNS]
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"summary": summary(results), "groups": group_summaries(results), "rows": [
            {"id": r.run.id, "group": r.run.group, "published_s": r.run.published_s, "predicted_s": r.predicted_s,
             "error": r.error, "status": r.status, "why_not": r.run.why_not, "expected": r.run.expected,
             "long_context": r.run.long_context, "seq": r.run.seq, "sim_s": r.sim_s,
             "variants": dict(r.variants)} for r in results]}, indent=1))
    atomic_write_text(args.out, report(results, wall, maxlen))
    for r in results:
        print(f"{r.run.id:40s} {r.run.published_s:9.3f} s  "
              + (f"{r.predicted_s:9.3f} s  {100 * r.error:+6.1f}%" if r.error is not None else r.status)
              + (" (expected value)" if r.run.expected else "") + f"  [{r.sim_s:.1f} s]")
    print(group_summaries(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
