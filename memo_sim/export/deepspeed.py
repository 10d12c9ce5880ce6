"""DeepSpeed: ``ds_config.json`` plus the Megatron-DeepSpeed launch line that reads it.

The JSON keys are DeepSpeed's own (`SOURCE`: ``deepspeed/runtime/constants.py``,
``runtime/zero/config.py``, ``runtime/activation_checkpointing/config.py``); the launcher is
Megatron-DeepSpeed's ``pretrain_gpt.py`` (`LAUNCHER_SOURCE`), whose ``--ds-sequence-parallel-size``
is DeepSpeed-Ulysses and whose ``--deepspeed-activation-checkpointing`` / ``--checkpoint-in-cpu``
select DeepSpeed's activation checkpointing and its CPU copy of the checkpoints, and whose
``--use-flash-attn-v2`` turns on the FlashAttention-2 kernel memo prices (`FLASH_FLAG`). A Ulysses degree the
model's heads do not split over is capped, the rest data parallelism, or the export refused (`_heads_gap`). DeepSpeed
expresses Ulysses, ZeRO 0-3 and full recompute, with the checkpointed layer inputs kept on the GPU or on the host.
Megatron-DeepSpeed has Megatron's TP and DeepSpeed's pipeline engine, but memo's deepspeed framework data (the
DeepSpeed-Ulysses setup the what-if searches and prices) offers neither (its schedules: single stage; the pipeline
engine is not modelled): a plan's TP is written as Ulysses over as many GPUs and its pipeline as one stage
(`_pipeline_gap`), so that what is written is what `--framework deepspeed` would run.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

from memo_sim.export.base import alloc_env, alloc_gap, ep_overlap_gap, kept_launch
from memo_sim.export.base import (Export, Gap, NoNearest, PlanChange, async_tp_gap, balance_gap, dp_flavour_gap,
                                  gemm_format_gap, interleave_gap, metp_gap, mtp_gap, nearest_batch, nearest_plan,
                                  rank_order_gap, rotary_gaps, not_modelled_gap, optimizer_offload_gap, policy_gaps,
                                  uneven_stages_gap, price_nearest, shape_arguments, torchrun_line)
from memo_sim.cost.memory import reduce_bucket_elements
from memo_sim.layout.parallel import check_layout
from memo_sim.plan.schema import Plan
from memo_sim.profile.attention_kernels import attention_kernel
from memo_sim.frameworks import deepspeed_moe_why_not
from memo_sim.search.frameworks import get_framework

FRAMEWORK = "deepspeed"  # its version in memo_sim/frameworks/data (the plans exported instead)
SOURCE = "deepspeedai/DeepSpeed@edaa7221 (2026-08-22)"
LAUNCHER_SOURCE = "deepspeedai/Megatron-DeepSpeed (megatron/arguments.py)"
CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "deepspeed.sh"

_RUNS = {"store_all": "no activation checkpointing",
         "full_recompute": "activation_checkpointing (each layer's input kept, the layer recomputed)",
         "checkpoint_offload": "activation_checkpointing with cpu_checkpointing (each layer's input on the host, "
                               "the layer recomputed)"}


def gaps(plan: Plan) -> list[Gap]:
    out = []
    lay = plan.layout
    if lay.cp > 1:
        out.append(Gap(f"ring context parallelism over {lay.cp} GPUs",
                       f"DeepSpeed-Ulysses over {lay.cp} GPUs (--ds-sequence-parallel-size)",
                       PlanChange(layout={"cp": 1, "ulysses": lay.ulysses * lay.cp})))
    if lay.tp > 1 and not get_framework(FRAMEWORK).tensor_parallel:  # the framework data's word (the what-if's)
        u = lay.ulysses * lay.cp * lay.tp
        out.append(Gap(f"Megatron tensor parallelism over {lay.tp} GPUs",
                       f"DeepSpeed-Ulysses over {u} GPUs (--ds-sequence-parallel-size; memo's {FRAMEWORK} data, the "
                       f"DeepSpeed-Ulysses setup `memo-sim whatif --framework {FRAMEWORK}` searches, has no TP)",
                       PlanChange(layout={"tp": 1, "cp": 1, "ulysses": u, **_one_rank_settings(lay)})))
    out += _heads_gap(plan, out)  # the Ulysses degree those make, where the heads do not split over it
    out += metp_gap(plan) + async_tp_gap(plan, "Megatron-DeepSpeed's TP, its collectives on the critical path")
    # after the TP and CP gaps: Ulysses over their GPUs, the replica's sequences `_heads_gap`'s where it split them
    pipe = _pipeline_gap(dataclasses.replace(plan, batch=nearest_batch(plan, out)), nearest_plan(plan, out)[0])
    out += pipe or interleave_gap(plan)
    # an offloading policy's nearest is cpu_checkpointing (the layer inputs on the host), any other's full recompute
    out += policy_gaps(plan, _RUNS, fallback="checkpoint_offload" if plan.policy.offloads else "full_recompute")
    out += gemm_format_gap(plan, "deepspeed") + optimizer_offload_gap(plan, "deepspeed")
    # the data-parallel flavour as it runs on the one stage written (ZeRO 3 no longer beside stages)
    one = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, pp=1, vpp=1)) if pipe else plan
    out += dp_flavour_gap(one, "deepspeed") + mtp_gap(plan, "deepspeed", "Megatron-DeepSpeed has no multi-token "
                                                                          "prediction")
    if not pipe:
        out += uneven_stages_gap(plan, "Megatron-DeepSpeed") + rank_order_gap(plan, FRAMEWORK)
    if plan.model.bias == "qkv":  # Megatron-DeepSpeed's --disable-bias-linear drops every bias, it has no qkv-only one
        out.append(Gap(f"{plan.model.name}'s biases on the q, k and v projections only",
                       "biases on every linear layer (no flag): edit the model or drop them by hand"))
    out += _gqa_ulysses_gap(plan, nearest_plan(plan, out)[0])
    return (out + _moe_layout_gaps(plan) + _model_gaps(plan) + _attention_gap(plan) + not_modelled_gap(plan)
            + alloc_gap(plan))


def _one_rank_settings(lay) -> dict:
    """The layout fields the TP -> Ulysses change (TP 1) resets, as the script written runs them: the TP flavour
    (METP, async TP: TP's own, meaningless at TP 1; Megatron's, as `metp_gap` / `async_tp_gap` write it) and, with the
    optimizer on the host, ZeRO stage 1 at least (`config` writes ``max(zero, 1)``: DeepSpeed's offload_optimizer is a
    ZeRO optimizer's, deepspeed/runtime/engine.py at edaa7221, and the Ulysses ranks are data-parallel ones to ZeRO
    where the TP ranks were not). A review: the export's check of the Ulysses layout refused with "metp needs a
    tensor-parallel degree of at least 2" and "optimizer offload runs with the distributed optimizer", settings the
    script does not write, while `whatif --framework deepspeed` found plans."""
    out: dict = {"tp_mode": "megatron"} if lay.tp_mode != "megatron" else {}
    if lay.optimizer_offload and lay.zero == 0:
        out["zero"] = 1
    return out


def _gqa_ulysses_gap(plan: Plan, lay) -> list[Gap]:
    """Megatron-DeepSpeed's Ulysses splits q, k and v of equal widths: with --ds-sequence-parallel-size above 1 its
    attention asserts ``self.projection_size == self.kv_projection_size`` before its own repeat_kv, so a model with
    fewer K/V heads than query heads stops at its first forward unless they are repeated to the query heads in the
    model (a review: Llama-3.1-70B over Ulysses 8 was written as expressed). That runnable form, every K/V head
    through the all-to-all repeated to the query heads, is what memo's deepspeed data prices (its ``ulysses_kv``
    and the source cited beside it, the one place for the fact; a review: the what-if priced K/V heads unrepeated
    while this gap said they must be). ``lay``: the layout written."""
    m = plan.model
    if lay.ulysses == 1 or m.mla or not m.kv_heads or m.kv_heads == m.heads:
        return []
    rule = get_framework(FRAMEWORK).mechanism("ulysses_kv")
    return [Gap(f"DeepSpeed-Ulysses over {lay.ulysses} GPUs with {m.kv_heads} K/V heads for {m.heads} query heads "
                f"(grouped-query)",
                "written as planned, but Megatron-DeepSpeed's attention asserts projection_size == kv_projection_size "
                "under --ds-sequence-parallel-size: the script stops at its first forward unless the K/V heads are "
                f"repeated to the query heads in the model by hand, the all-to-all memo prices for {FRAMEWORK} "
                f"(ulysses_kv {rule}; the source: memo-sim frameworks {FRAMEWORK})",
                before_running=f"repeat the {m.kv_heads} K/V heads to the {m.heads} query heads in Megatron-DeepSpeed's "
                               "attention (megatron/model/transformer.py): as written it asserts projection_size == "
                               "kv_projection_size at its first forward under --ds-sequence-parallel-size")]


def _heads_gap(plan: Plan, earlier: list[Gap]) -> list[Gap]:
    """The Ulysses degree the TP and CP gaps make (``earlier``) where the model's heads do not split over it:
    Megatron-DeepSpeed asserts ``num_attention_heads % sequence_parallel_world_size == 0`` (megatron/model/
    transformer.py:618 at 4efb479d), and memo's what-if refuses such a layout (`check_layout`). The nearest: the
    largest Ulysses degree dividing it that the heads split over, the rest of its GPUs data-parallel replicas, the
    replica's sequences split over them (the global batch kept); where the sequences do not split so, no DeepSpeed
    layout of the plan's GPUs runs it, and the export is refused in one line (a review: a 32-head model written with
    Ulysses over 64 GPUs, priced as a layout memo refuses)."""
    lay, _, _ = nearest_plan(plan, earlier)
    if lay.ulysses == 1 or not _layout_why_not(plan, lay, plan.batch):
        return []
    u, why = lay.ulysses, _layout_why_not(plan, lay, plan.batch)
    for d in sorted((d for d in range(1, u) if u % d == 0), reverse=True):
        r = u // d
        batch = plan.batch // r
        if plan.batch % r or batch % plan.micro_batch:
            continue
        cap = dataclasses.replace(lay, ulysses=d, dp=lay.dp * r)
        if _layout_why_not(plan, cap, batch) is None:
            return [Gap(f"DeepSpeed-Ulysses over {u} GPUs (the plan's TP x CP x Ulysses), which cannot run: {why}",
                        f"DeepSpeed-Ulysses over {d} GPUs (--ds-sequence-parallel-size {d}), the other GPUs data-"
                        f"parallel replicas (dp {cap.dp}, {batch} sequence{'s' if batch != 1 else ''} per replica: "
                        f"the global batch of {plan.batch * lay.dp} kept)",
                        PlanChange(layout={"ulysses": d, "dp": cap.dp}, batch=batch))]
    heads = ("; Megatron-DeepSpeed asserts num_attention_heads % the sequence-parallel size == 0"
             if plan.model.heads % u else "")
    raise NoNearest(f"--to deepspeed: no DeepSpeed layout runs this plan on its {plan.gpus} GPUs: its TP x CP x "
                    f"Ulysses is DeepSpeed-Ulysses over {u} GPUs there, which cannot run ({why}{heads}), and a "
                    f"smaller Ulysses degree "
                    f"needs the {plan.batch} sequence{'s' if plan.batch != 1 else ''} per replica split over more "
                    f"replicas (micro-batch {plan.micro_batch}); export a plan with a larger global batch, or to "
                    f"another framework")


def _layout_why_not(plan: Plan, lay, batch: int) -> str | None:
    """Why ``lay`` (tp 1: the TP and CP gaps' Ulysses) cannot run the plan's model as DeepSpeed runs it (its
    mechanisms: `Framework.adapt`, the K/V heads' rule among them), else None; stages are `_pipeline_gap`'s."""
    one = dataclasses.replace(get_framework(FRAMEWORK).adapt(lay), pp=1, vpp=1, first_stage_layers=0,
                              last_stage_layers=0, chunk_layers=(), ep_overlap=False)  # its own gap (`ep_overlap_gap`)
    return check_layout(one, plan.model, one.gpus, max(one.gpus, 1), plan.seq_tokens, batch)


# the FlashAttention kernel memo's deepspeed data prices (mechanisms.attention: flash, FlashAttention-2's curves), as
# Megatron-DeepSpeed's flag (megatron/arguments.py:930 at 4efb479d): all its attention flags are off by default, and
# without one ParallelAttention runs CoreAttention (megatron/model/transformer.py:607-612), the whole s x s scores
# in memory (a review: a 64K-token plan written so ran out of memory). --use-flash-attn-v2 is FlashAttention-2's
# flash_attn_varlen_func (transformer.py:409), which DeepSpeed-Ulysses' DistributedAttention gathers for in the
# [b, s, h, d] layout (gather_idx 1, transformer.py:623); the Ulysses examples at that commit write it
# (examples_deepspeed/sequence_parallel/ds_pretrain_gpt_6.7B_fpdt_32k.sh) or --use-flash-attn-triton (the others:
# FlashAttention's Triton kernel, `memo_sim.profile.attention_kernels` flash_triton, which memo's deepspeed data does
# not run)
FLASH_FLAG = "--use-flash-attn-v2"


def _attention_gap(plan: Plan) -> list[Gap]:
    """The plan's attention kernel where it is not the FlashAttention-2 the launch line writes (`FLASH_FLAG`): cuDNN's
    fused attention (TransformerEngine's, which Megatron-DeepSpeed does not run), the materialised s x s scores or
    FlashAttention's Triton kernel (--use-flash-attn-triton: the data prices FlashAttention-2).
    The nearest plan is priced with the framework's kernel already (`price_nearest`: its mechanisms), so the gap
    changes nothing more."""
    kernel = plan.priced_attention_kernel()
    if kernel == "flash":
        return []
    return [Gap(f"the attention kernel, {attention_kernel(kernel).words}",
                f"FlashAttention-2 ({FLASH_FLAG}: memo's {FRAMEWORK} data's attention kernel)")]


_SCHEDULE_WORDS = {"1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B", "sppo": "SPPO"}


def _pipeline_gap(plan: Plan, lay) -> list[Gap]:
    """Pipeline stages, which memo's deepspeed data does not run (its schedules: single stage; DeepSpeed's pipeline
    engine is not modelled, and `memo-sim whatif --framework deepspeed --pp N` is refused): one stage instead, as the
    exporter writes TP as Ulysses, so that what is written is what that framework data prices. The stages' GPUs
    become data-parallel replicas where the replica's sequences split over them (the global batch kept), else
    Ulysses ranks (the replica's batch kept). ``lay``: the plan's layout after the earlier gaps (TP and CP as
    Ulysses). It was written with --pipeline-model-parallel-size and priced as Megatron's 1F1B (a review)."""
    if lay.pp == 1 or any(s != "single_stage" for s in get_framework(FRAMEWORK).schedules):
        return []
    pp, sched = lay.pp, _SCHEDULE_WORDS.get(plan.schedule, plan.schedule)
    what = (f"{pp} pipeline stages" + (f" of {lay.vpp} model chunks each" if lay.vpp > 1 else "")
            + f" ({sched}, {plan.micro_batches} micro-batches per replica)")
    why = f"memo's {FRAMEWORK} data runs no pipeline (DeepSpeed's pipeline engine is not modelled)"
    one = {"pp": 1, "vpp": 1}
    if plan.batch % pp == 0 and (plan.batch // pp) % plan.micro_batch == 0:
        dp, batch = lay.dp * pp, plan.batch // pp
        return [Gap(what, f"one stage, the stages' GPUs data-parallel replicas (dp {dp}, {batch} "
                          f"sequence{'s' if batch != 1 else ''} per replica: the global batch of {plan.batch * lay.dp} "
                          f"kept; --no-pipeline-parallel): {why}",
                    PlanChange(layout={**one, "dp": dp}, schedule="single_stage", batch=batch))]
    u = lay.ulysses * pp
    ulysses = dataclasses.replace(lay, pp=1, vpp=1, ulysses=u, first_stage_layers=0, last_stage_layers=0,
                                  chunk_layers=())
    bad = check_layout(ulysses, plan.model, ulysses.gpus, max(ulysses.gpus, 1), plan.seq_tokens, plan.batch)
    if bad:  # (a review: a 96-head model's 16 stages of TP 8 as Ulysses over 128 GPUs, which cannot start)
        why += f"; and no one-stage DeepSpeed layout of these GPUs keeps the {plan.batch} sequences per replica: {bad}"
        return [Gap(what, f"not expressible in DeepSpeed: {why} (the Ulysses degree written below cannot run; "
                          f"`memo-sim export` without --nearest writes the best plan DeepSpeed runs)",
                    PlanChange(layout={**one, "ulysses": u}, schedule="single_stage"))]
    return [Gap(what, f"one stage, the stages' GPUs DeepSpeed-Ulysses ranks (Ulysses over {u} GPUs, the {plan.batch} "
                      f"sequences per replica not splitting into {pp} replicas; --ds-sequence-parallel-size, "
                      f"--no-pipeline-parallel): {why}",
                PlanChange(layout={**one, "ulysses": u}, schedule="single_stage"))]


def _model_gaps(plan: Plan) -> list[Gap]:
    """What of the model the launch line does not write (a script that ran without them would train
    another model): the routed experts, latent attention, QK norms, sliding windows and sinks."""
    m, out = plan.model, []
    if m.swiglu_limit:
        out.append(Gap(f"GPT-OSS's clamped SwiGLU (swiglu_limit {m.swiglu_limit:g}, the up half + 1)",
                       "plain SwiGLU (--swiglu; Megatron-DeepSpeed has no clamp or offset)"))
    if m.moe and (why := moe_why_not(m)):
        out.append(Gap(f"{m.moe_layers} MoE layers of {m.experts} routed experts (top-{m.top_k}, width {m.expert_width}"
                       + (f", {m.shared_experts} shared" if m.shared_experts else "") + f") over EP {plan.layout.ep}",
                       "not written: Megatron-DeepSpeed's --num-experts / --moe-expert-parallel-size run "
                       f"DeepSpeed-MoE, which has no {'; no '.join(why)}; the script as written trains the dense "
                       "model"))
    for on, what in ((m.mla, "multi-head latent attention (low-rank q / kv projections)"), (m.qk_norm, "QK norms"),
                     (m.sliding_layers, f"a {m.sliding_window}-token sliding window on {m.sliding_layers} layers"),
                     (m.chunked_layers, f"{m.attention_chunk}-token chunked attention on {m.chunked_layers} layers"),
                     (m.attention_sinks, "attention sinks")):
        if on:
            out.append(Gap(what, "not written (Megatron-DeepSpeed has no flag for it): add it to the model by hand"))
    # the model's numerics (`memo_sim.model.config`): the rotary base and the norm epsilon are written
    # (`_architecture`); the rotary scaling and a base the model does not state are not
    if m.rope_scaling:  # every model memo prices is rotary (`_architecture`)
        out.append(Gap(f"the rotary embedding's scaling ({m.rope_scaling})",
                       "unscaled rotary embeddings (Megatron-DeepSpeed has no flag for it): add it by hand"))
    # --rotary-percent is written (`_architecture`); NoPE layers have no flag
    out += rotary_gaps(m, "Megatron-DeepSpeed has no flag for it", partial=False)
    if m.norm == "rmsnorm" and not m.rope_theta:
        out.append(Gap("the rotary base (the model does not state it)",
                       "Megatron-DeepSpeed's default --rotary-position-embeddings-theta 10000: set the model's own"))
    elif m.rope_theta != int(m.rope_theta):
        out.append(Gap(f"the rotary base {m.rope_theta:g}", "its integer part: Megatron-DeepSpeed's "
                       "--rotary-position-embeddings-theta takes an integer"))
    return out


def moe_why_not(m) -> list[str]:
    """What of the model's MoE block DeepSpeed-MoE cannot build, in words; empty where it builds it as the model has
    it: the framework data's rule (`memo_sim.frameworks.deepspeed_moe_why_not`, the deepspeed file's
    ``experts.moe_block``), one place for the what-if, `best_runnable` and this writer (a review: the what-if priced
    MoE layouts the script then did not write)."""
    return deepspeed_moe_why_not(m)


def _moe_arguments(plan: Plan, lay) -> list[tuple[str, str | None]]:
    """Megatron-DeepSpeed's DeepSpeed-MoE flags for a model `moe_why_not` passes (megatron/arguments.py at 4efb479d):
    the experts, top-k and EP, every layer or every second one MoE, the router's top-2 choice by argmax (its default
    samples the second expert), the loads (dropless, or dropped and padded to the capacity factor), and the MoE
    parameter groups ZeRO's optimizer needs (deepspeed/runtime/zero/stage_1_and_2.py asserts them)."""
    m = plan.model
    args = [("--num-experts", str(m.experts)), ("--moe-expert-parallel-size", str(lay.ep)), ("--topk", str(m.top_k)),
            ("--expert-interval", "2" if m.mixes_dense_layers else "1"), ("--create-moe-param-group", None)]
    if m.top_k == 2:
        args.append(("--disable-moe-top2-2nd-expert-sampling", None))
    bal = lay.balance
    if bal.kind == "capacity":
        args.append(("--moe-train-capacity-factor", f"{bal.capacity:g}"))
    else:  # dropless, or measured loads (a router's own, none dropped)
        args.append(("--disable-moe-token-dropping", None))
    if m.aux_loss_coef:  # DeepSpeed-MoE's default coefficient is 0.1
        args.append(("--moe-loss-coeff", f"{m.aux_loss_coef:g}"))
    return args


def _moe_layout_gaps(plan: Plan) -> list[Gap]:
    """What of an expressible MoE plan's layout DeepSpeed-MoE runs otherwise: expert TP (memo's deepspeed data has
    none), another dispatcher than its all-to-all, and ZeRO 3 (its engine refuses native MoE there)."""
    m, lay = plan.model, plan.layout
    if not m.moe:
        return []
    # forced or random loads: none of its settings; Megatron-Core's merged steps: none either
    out = balance_gap(plan, FRAMEWORK) + ep_overlap_gap(plan, FRAMEWORK)
    if moe_why_not(m):
        return out
    if lay.etp > 1:
        out.append(Gap(f"expert tensor parallelism over {lay.etp} GPUs", "each expert whole on its EP rank (memo's "
                       f"{FRAMEWORK} data runs no expert TP)", PlanChange(layout={"etp": 1})))
    if lay.moe_dispatcher != "alltoall":
        out.append(Gap(f"the {lay.moe_dispatcher} token dispatcher", "DeepSpeed-MoE's all-to-all",
                       PlanChange(layout={"moe_dispatcher": "alltoall"})))
    stages = get_framework(FRAMEWORK).experts.zero  # the stages its MoE layers run beside (framework data)
    if stages is not None and lay.zero not in stages:
        nearest = max((z for z in stages if z < lay.zero), default=min(stages))
        out.append(Gap(f"ZeRO stage {lay.zero} beside MoE layers", f"ZeRO stage {nearest} (DeepSpeed's engine refuses "
                       f"native MoE layers under stage {lay.zero}; memo's {FRAMEWORK} data)",
                       PlanChange(layout={"zero": nearest})))
    return out


def _architecture(plan: Plan) -> list[tuple[str, str | None]]:
    """The model's FFN, norm, position embedding, biases and embeddings as Megatron-DeepSpeed's
    megatron/arguments.py spells them (--swiglu, --normalization rmsnorm, --use-rotary-position-embeddings
    with --no-position-embedding and --rotary-position-embeddings-theta, an integer there, --layernorm-epsilon,
    which its RMSNorm layers take too, --disable-bias-linear, --untie-embeddings-and-output-weights).

    The rotary embedding is written for every model with rotary positions (``ModelConfig.positions``), LayerNorm
    ones too (GPT-NeoX is rotary, memo's GPT presets are priced so); learned ones keep the default table. A review
    found them left on learned absolute positions, the default (arguments.py at 4efb479d lines 633-642; --use-
    rotary-position-embeddings turns the table off, lines 314-317; --rotary-percent,
    megatron/model/language_model.py line 431, GPT-NeoX's rotary_pct)."""
    m, args = plan.model, []
    if m.ffn_type == "swiglu":
        args.append(("--swiglu", None))
    if m.norm == "rmsnorm":
        args.append(("--normalization", "rmsnorm"))
    if m.positions == "rotary":  # learned positions: the default table (the model's positions)
        args += [("--use-rotary-position-embeddings", None), ("--no-position-embedding", None)]
    if m.rope_theta and m.positions == "rotary":  # the rotary base (default 10000; Llama-3.1 500000, Qwen3 1e6)
        args.append(("--rotary-position-embeddings-theta", str(int(m.rope_theta))))
    if m.rotary_fraction:  # GLM-4.5's and GPT-NeoX's partial rotary
        args.append(("--rotary-percent", f"{m.rotary_fraction:g}"))
    if m.norm_eps:
        args.append(("--layernorm-epsilon", f"{m.norm_eps:g}"))
    if m.head_dim and not m.mla:  # heads of their own size (Qwen3's 128 at hidden / heads = 64)
        args.append(("--kv-channels", str(m.head_dim)))
    if m.bias == "none":
        args.append(("--disable-bias-linear", None))
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    return args


def _stage3_prefetch(m, lay) -> dict:
    """ZeRO-3's prefetch as memo prices it (`memo_sim.dp.base.DPFlavour.gathered_layers`: the layer running and the
    next one, gathered ahead whole): ``stage3_prefetch_bucket_size`` (the parameter elements DeepSpeed fetches ahead
    of use, default 5e7: deepspeed/runtime/zero/config.py ``prefetch_bucket_size``, a quarter of a Llama-3.1-8B layer's
    218M, so the next layer would not be gathered ahead whole) at one layer's parameters on a GPU, and
    ``stage3_max_live_parameters`` (the elements resident before DeepSpeed releases, default 1e9) at the layers memo
    holds gathered; {} below stage 3."""
    if lay.zero < 3:
        return {}
    layer = _layer_on_gpu(m, lay)
    return {"stage3_prefetch_bucket_size": layer,
            "stage3_max_live_parameters": int(lay.dp_flavour.gathered_layers(lay, m.layers) * layer)}


def _reduce_bucket(m, lay) -> dict:
    """The gradient bucket as memo prices it (`memo_sim.cost.memory.unsharded_grad_units`: two buckets of whole
    gradients under overlap_comm, each one layer's parameters on a GPU, or the layout's ``reduce_bucket``):
    ``reduce_bucket_size`` (DeepSpeed's default 5e8 elements, deepspeed/runtime/zero/config.py, would be 1 GB a bucket
    in bf16, two of them under overlap_comm: deepspeed/runtime/zero/stage_1_and_2.py ``backward``); {} at ZeRO 0,
    where DeepSpeed runs no ZeRO optimizer."""
    if lay.zero < 1:
        return {}
    return {"reduce_bucket_size": int(reduce_bucket_elements(lay, _layer_on_gpu(m, lay)))}


def _layer_on_gpu(m, lay) -> int:
    """One layer's parameters on a GPU (its TP shard), the unit memo's ZeRO buckets and prefetches are priced in."""
    return -(-m.layer_params() // lay.tp)


# the launch settings the config writes as the plan has them where it was searched for DeepSpeed (`kept_launch`):
# overlap_comm, the gradient reduction beside the backward (true, as the framework data prices it, for plans of other
# frameworks); without it ZeRO reduces each bucket on the compute stream as the backward fills it, the backward and
# the reductions in series, as memo prices a plan without the overlap (`memo_sim.cost.grad_sync`)
KEPT_LAUNCH = ("grad_overlap",)


def _kept(plan: Plan, applied: list[Gap]) -> dict:
    return kept_launch(plan, applied, FRAMEWORK, KEPT_LAUNCH)


def config(plan: Plan, applied: list[Gap]) -> dict:
    lay, pol, _ = nearest_plan(plan, applied)
    m, batch = plan.model, nearest_batch(plan, applied)  # a pipeline's replicas' sequences (`_pipeline_gap`)
    cfg = {
        "train_batch_size": batch * lay.dp,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": batch // plan.micro_batch,
        # stage 0 with offload_optimizer asserts at DeepSpeed's first step (DeepSpeedCPUAdam over GPU parameters):
        # a single-replica offload plan (ZeRO 0 in memo, one rank shards nothing) is written as stage 1
        "zero_optimization": {"stage": max(lay.zero, 1) if lay.optimizer_offload else lay.zero,
                              "overlap_comm": _kept(plan, applied).get("grad_overlap", True),
                              "contiguous_gradients": True,
                              **({"offload_optimizer": {"device": "cpu", "pin_memory": True}}
                                 if lay.optimizer_offload else {})},
        "gradient_clipping": 1.0,
    }
    cfg["zero_optimization"].update(_stage3_prefetch(m, lay))
    cfg["zero_optimization"].update(_reduce_bucket(m, lay))
    if m.dtype in ("bf16", "fp16"):
        cfg[m.dtype] = {"enabled": True}
    if pol.recomputes_attention:  # full recompute, its inputs on the GPU or (checkpoint_offload) on the host
        cfg["activation_checkpointing"] = {
            "partition_activations": lay.tp > 1,
            "cpu_checkpointing": pol.offloads,
            "contiguous_memory_optimization": False,
            "number_checkpoints": m.layers,
        }
    return cfg


def arguments(plan: Plan, applied: list[Gap]) -> list[tuple[str, str | None]]:
    lay, pol, _ = nearest_plan(plan, applied)
    m = plan.model
    args = shape_arguments(plan) + [
        ("--micro-batch-size", str(plan.micro_batch)),
        ("--global-batch-size", str(nearest_batch(plan, applied) * lay.dp)),
        ("--tensor-model-parallel-size", str(lay.tp)), ("--pipeline-model-parallel-size", str(lay.pp)),
    ]
    if m.n_kv_heads != m.heads:
        args.append(("--num-key-value-heads", str(m.n_kv_heads)))
    args += _architecture(plan) + [(FLASH_FLAG, None)]
    if lay.pp == 1:
        args.append(("--no-pipeline-parallel", None))
    if lay.ulysses > 1:
        args.append(("--ds-sequence-parallel-size", str(lay.ulysses)))
    if m.dtype in ("bf16", "fp16"):
        args.append((f"--{m.dtype}", None))
    if pol.recomputes_attention:  # --checkpoint-activations turns the recompute on (megatron/model/transformer.py
        # checkpoints a layer where it or --recompute-granularity full is set); the other flag picks DeepSpeed's
        # implementation, which --partition-activations and --checkpoint-in-cpu configure
        args += [("--checkpoint-activations", None), ("--deepspeed-activation-checkpointing", None)]
        if lay.tp > 1:
            args.append(("--partition-activations", None))
        if pol.offloads:
            args.append(("--checkpoint-in-cpu", None))
    if m.moe and not moe_why_not(m):
        args += _moe_arguments(plan, lay)
        if not m.mixes_dense_layers:  # every FFN is the experts': theirs is the width --ffn-hidden-size gives
            args = [(k, str(m.expert_width) if k == "--ffn-hidden-size" else v) for k, v in args]
    # ZeRO 3 on the launch line too: pretrain_gpt.py builds the model under deepspeed.zero.Init(enabled=args.zero_stage
    # == 3), and every other use of the flag (default 1) asks for 3 alone (a review: a ZeRO-3 plan's every rank built
    # the whole model before partitioning it)
    args += [("--zero-stage", "3")] * (lay.zero == 3)
    if lay.optimizer_offload:  # ds_config's offload_optimizer takes DeepSpeed's CPU Adam: without --cpu-optimizer
        # Megatron-DeepSpeed builds its GPU Adam (get_megatron_optimizer, megatron/optimizer/__init__.py:83 at
        # 4efb479d; the flag megatron/arguments.py:948) and hands it to deepspeed.initialize, whose
        # _configure_optimizer raises ZeRORuntimeException for a client optimizer under ZeRO-Offload that is not
        # DeepSpeedCPUAdam (zero_force_ds_cpu_optimizer, default true: deepspeed/runtime/engine.py at edaa7221);
        # with it, DeepSpeedCPUAdam (--cpu_torch_adam, torch's AdamW, would stop there too). A review: the script
        # stopped at start-up
        args.append(("--cpu-optimizer", None))
    return args + [("--deepspeed", None), ("--deepspeed_config", CONFIG_FILE)]


def export(plan: Plan, price: bool = True, instead: dict | None = None) -> Export:
    g = gaps(plan)
    ex = Export("DeepSpeed", f"{SOURCE}; launcher {LAUNCHER_SOURCE}", {}, g, "")
    ex.instead = instead
    ex.nearest = price_nearest(plan, g, FRAMEWORK, kept=_kept(plan, g)) if price else None
    ex.files[CONFIG_FILE] = json.dumps(config(plan, g), indent=2) + "\n"
    body = [f"    {opt}" + (f" {shlex.quote(val)}" if val is not None else "") for opt, val in arguments(plan, g)]
    lines = ["#!/usr/bin/env bash", ex.comment_block(), "#",
             "# Run from a Megatron-DeepSpeed checkout; add data, tokenizer and optimizer arguments.",
             "set -euo pipefail", alloc_env(nearest_plan(plan, g)[0]) + (tr := torchrun_line(plan, "pretrain_gpt.py"))
             + " \\"]
    lines += [b + " \\" for b in body[:-1]] + [body[-1], ""]
    ex.files[LAUNCH_FILE] = "\n".join(lines)
    ex.launch = f"bash {LAUNCH_FILE}  # reads {CONFIG_FILE}" + (
        ", on each node with NODE_RANK and MASTER_ADDR set (torchrun's static rendezvous)" if "--node-rank" in tr
        else "")
    return ex
