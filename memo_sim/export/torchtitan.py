"""torchtitan: a Python configuration module (torchtitan's ``--module`` / ``--config``) that
derives the plan's run from the nearest shipped model configuration.

torchtitan describes a run by a function returning ``Trainer.Config`` (its command line is
frozen; ``torchtitan/config/README.md`` at `SOURCE`). The exported function starts from a
shipped configuration (``torchtitan.models.llama3.config_registry.llama3_8b`` / ``_70b`` /
``_405b``: the Llama-3.1 shapes; other models start from the one nearest in size and say so) and
sets ``config.parallelism.*`` (``ParallelismConfig``), ``config.training.*`` (``TrainingConfig``)
and ``config.activation_checkpoint`` (``FullAC.Config()``, ``SelectiveAC.Config()`` for per-op selective
checkpointing, or ``None``), and ``config.compile.enable`` for a plan whose blocks are compiled
(``Layout.kernel_fusion``). torchtitan expresses TP
with SP (async TP: ``enable_async_tensor_parallel``), CP, PP with ``1F1B`` / ``Interleaved1F1B``, DP by replication (ZeRO 0) or FSDP2
sharding (``data_parallel_shard_degree``; ZeRO 3, or ZeRO 2 with
``fsdp_reshard_after_forward = "never"``) and full or per-op selective activation checkpointing.
"""

from __future__ import annotations

from memo_sim.export.base import (Export, Gap, PlanChange, gemm_format_gap, metp_gap, nearest_model, nearest_plan,
                                  optimizer_offload_gap, policy_gaps, uneven_stages_gap, price_nearest, torchrun_line, ulysses_gap)
from memo_sim.plan.schema import Plan

FRAMEWORK = "torchtitan"  # its version in memo_sim/frameworks/data (the plans exported instead)
SOURCE = "pytorch/torchtitan@b5bcd76c (2026-08-21)"
FILE = "memo_torchtitan.py"
FUNCTION = "memo_plan"
BASES = {"llama-3.1-8b": "llama3_8b", "llama-3.1-70b": "llama3_70b", "llama-3.1-405b": "llama3_405b"}
# the llama3 model_registry flavour of each shipped Llama configuration (torchtitan/models/llama3/__init__.py at SOURCE)
FLAVOURS = {"llama3_8b": "8B", "llama3_70b": "70B", "llama3_405b": "405B"}
# mixtures of experts: the shipped MoE configurations (torchtitan/models/<module>/config_registry.py at SOURCE)
MOE_BASES = {"deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
             "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b")}
SCHEDULES = {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
_RUNS = {"store_all": "config.activation_checkpoint = None", "full_recompute": "config.activation_checkpoint = "
         "FullAC.Config()", "op_sac": "config.activation_checkpoint = SelectiveAC.Config()"}
# the activation-checkpointing class each policy runs with (None: no checkpointing)
_AC = {"full_recompute": "FullAC", "op_sac": "SelectiveAC"}


def _module(plan: Plan) -> str:
    """The torchtitan model package whose config_registry the exported function imports from."""
    return MOE_BASES.get(plan.model.name, ("deepseek_v3" if plan.model.moe else "llama3",))[0]


def _base(plan: Plan) -> tuple[str, str | None]:
    """The shipped configuration to start from, and a note when its model is not the plan's."""
    if plan.model.name in BASES:
        return BASES[plan.model.name], None
    if plan.model.name in MOE_BASES:
        return MOE_BASES[plan.model.name][1], None
    if plan.model.moe:  # the nearest shipped MoE configuration
        return "deepseek_v3_671b", (f"{plan.model.name} is not a torchtitan model: the run starts from "
                                    f"deepseek_v3_671b (set config.model_spec to a MoE of the plan's shapes)")
    p = plan.model.params()
    name = "llama3_8b" if p < 30e9 else ("llama3_70b" if p < 200e9 else "llama3_405b")
    return name, (f"{plan.model.name} is not a torchtitan model: the run starts from {name}'s model "
                  f"(set config.model_spec to a model of the plan's shapes to train this one)")


def gaps(plan: Plan) -> list[Gap]:
    out = ulysses_gap(plan) + metp_gap(plan)
    if plan.layout.zero == 1:
        out.append(Gap("ZeRO stage 1 (optimizer states sharded, weights and gradients whole)",
                       'FSDP2 with fsdp_reshard_after_forward = "never" (ZeRO 2: gradients sharded too)',
                       PlanChange(layout={"zero": 2})))
    out += policy_gaps(plan, _RUNS, notes={"memo": "torchtitan offloads no activations",
                                           "full_offload": "torchtitan offloads no activations"})
    out += gemm_format_gap(plan, "torchtitan") + optimizer_offload_gap(plan, "torchtitan")
    out += uneven_stages_gap(plan, "torchtitan (module lists per stage)")
    if plan.layout.etp > 1:
        out.append(Gap(f"expert tensor parallelism over {plan.layout.etp} ranks", "experts whole on each EP rank "
                       "(torchtitan at this version has no expert tensor parallelism)", PlanChange(layout={"etp": 1})))
    if plan.model.gemm_format == "fp8-tensorwise" and _base(plan)[0] not in FLAVOURS:
        out.append(Gap("fp8-tensorwise GEMMs", "not written: pass Float8LinearConverter.Config() in the converters of "
                       "the model's model_registry (torchtitan/models/<model>/__init__.py) for config.model_spec"))
    if plan.model.gemm_format == "mxfp8":
        out.append(Gap("mxfp8 GEMMs", "not written: add torchtitan's MX converter (torchao MX linear, recipe "
                       "mxfp8) to config.model_converters as your torchtitan version spells it"))
    base, note = _base(plan)
    if note:
        out.append(Gap(f"model {plan.model.name}", note))
    return out


def render(plan: Plan, applied: list[Gap]) -> str:
    lay, pol, schedule = nearest_plan(plan, applied)
    base, _ = _base(plan)
    if lay.dp_mode == "fsdp":  # FSDP2 over its shard group (with CP inside it, as torchtitan's mesh puts it)
        dp_shard = max(1, lay.dp_flavour.shard_group(lay) // (lay.cp * lay.ulysses))
    else:
        dp_shard = lay.dp if lay.zero >= 2 else 1
    dp_rep = lay.dp // dp_shard
    sets = [
        ("parallelism.data_parallel_replicate_degree", dp_rep),
        ("parallelism.data_parallel_shard_degree", dp_shard),
        ("parallelism.tensor_parallel_degree", lay.tp),
        ("parallelism.enable_sequence_parallel", bool(lay.sp and lay.tp > 1)),
        ("parallelism.context_parallel_degree", lay.cp),
        ("parallelism.pipeline_parallel_degree", lay.pp),
    ]
    if plan.model.moe:
        sets.append(("parallelism.expert_parallel_degree", lay.ep))
    if lay.flavour.async_collectives:  # async TP (`memo_sim.tp.async_tp`): torchtitan runs it compiled only
        sets.append(("parallelism.enable_async_tensor_parallel", True))
    if lay.zero == 2 or (lay.dp_mode == "fsdp" and not lay.reshard_after_forward):
        sets.append(("parallelism.fsdp_reshard_after_forward", "never"))
    if lay.pp > 1:
        sets += [("parallelism.pipeline_parallel_schedule", SCHEDULES[schedule]),
                 ("parallelism.num_pp_microbatches", plan.micro_batches),
                 *([] if lay.uneven else
                   [("parallelism.pipeline_parallel_layers_per_stage", plan.model.layers // (lay.pp * lay.vpp))])]
    sets += [("training.max_context_length", plan.seq_tokens),
             ("training.num_tokens_per_microbatch_per_dp_rank", plan.micro_batch * plan.seq_tokens),
             ("training.num_tokens_per_train_step", plan.batch * lay.dp * plan.seq_tokens)]
    body = [f"    config.{k} = {v!r}" for k, v in sets]
    ac = _AC.get(pol.name)
    body.append("    config.activation_checkpoint = " + (f"{ac}.Config()" if ac else "None"))
    if lay.kernel_fusion == "compiled" or lay.flavour.async_collectives:  # each block compiled, as priced (async TP needs it)
        body.append("    config.compile.enable = True")
    fp8 = nearest_model(plan, applied).gemm_format == "fp8-tensorwise" and base in FLAVOURS
    if fp8:  # torchao's Float8Linear, tensorwise scaling (the converter's default recipe), as the model's converter
        body.append(f"    config.model_spec = model_registry({FLAVOURS[base]!r}, converters=[Float8LinearConverter.Config("
                    f"model_compile_enabled={lay.kernel_fusion == 'compiled'})])")
    return "\n".join([
        *(["from torchtitan.components.quantization import Float8LinearConverter"] if fp8 else []),
        *([f"from torchtitan.distributed.activation_checkpoint import {ac}"] if ac else []),
        f"from torchtitan.models.{_module(plan)}.config_registry import {base}",
        *(["from torchtitan.models.llama3 import model_registry"] if fp8 else []),
        "from torchtitan.trainer import Trainer",
        "",
        "",
        f"def {FUNCTION}() -> Trainer.Config:",
        f'    """memo\'s plan: {plan.model.name}, {plan.seq_tokens} tokens x {plan.batch} '
        f'sequence{"s" if plan.batch != 1 else ""} per replica, '
        f'{plan.layout.label()}, {plan.policy.label()}."""',
        f"    config = {base}()",
        *body,
        "    return config",
        "",
    ])


def export(plan: Plan, price: bool = True, instead: dict | None = None) -> Export:
    g = gaps(plan)
    ex = Export("torchtitan", SOURCE, {}, g, "")
    ex.instead = instead
    ex.nearest = price_nearest(plan, g, FRAMEWORK) if price else None
    launch = ("PYTHONPATH=$PWD:$PYTHONPATH " + torchrun_line(plan, "-m torchtitan.train")
              + f" --module memo_torchtitan --config {FUNCTION}")
    ex.files[FILE] = "\n".join([ex.comment_block(), "#", f"# Run from a torchtitan checkout: {launch}", "",
                                render(plan, g)])
    ex.launch = launch
    return ex
