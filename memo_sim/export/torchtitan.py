"""torchtitan: a Python configuration module (torchtitan's ``--module`` / ``--config``) that
derives the plan's run from the nearest shipped model configuration.

torchtitan describes a run by a function returning ``Trainer.Config`` (its command line is
frozen; ``torchtitan/config/README.md`` at `SOURCE`). The exported function starts from a
shipped configuration (``torchtitan.models.llama3.config_registry.llama3_8b`` / ``_70b`` /
``_405b``: the Llama-3.1 shapes; a Qwen3 MoE (softmax top-k router, no shared expert, QK norms, no latent
attention) from ``torchtitan.models.qwen3``'s, its flavour where the shapes are one's; other models start from the one
nearest in size and say so) and
sets ``config.parallelism.*`` (``ParallelismConfig``), ``config.training.*`` (``TrainingConfig``)
and ``config.activation_checkpoint`` (``FullAC.Config()``, ``SelectiveAC.Config()`` for per-op selective
checkpointing, or ``None``), and ``config.compile`` (``CompileConfig``) as priced: the model's blocks compiled
(``enable`` with ``"model"`` in ``components``) for a plan whose blocks are compiled (``Layout.kernel_fusion``),
for async TP and for torchao's quantised formats, else not (`_compile_lines`). torchtitan expresses TP
with SP (async TP: ``CompileConfig.enable_async_tensor_parallel``), CP, PP with ``1F1B`` / ``Interleaved1F1B`` (the
split as three numbers, or each model part's modules where those cannot say it: `module_fqns`), DP by
replication (ZeRO 0) or FSDP2 sharding (``data_parallel_shard_degree``: ZeRO 3, memo's ``fsdp`` flavour; a ZeRO 1
or 2 plan is written and priced as FSDP2 with ``fsdp_reshard_after_forward = "never"``, `_fsdp_gap`) and full or
per-op selective activation checkpointing.

What else the written configuration sets so that torchtitan at `SOURCE` starts it as priced: each layer's
``attention.rope.max_context_length`` where the shipped flavour's rotary table is shorter than the plan's
sequence (`ROPE_MAX`: ``Decoder.Config.update_from_config`` refuses a longer ``training.max_context_length``);
``training.disable_cuda_graphs`` (memo prices eager launches, and torchtitan refuses CUDA graphs beside pipeline
parallelism and the all-to-all EP dispatcher); the converters of the plan's quantised GEMM format (`CONVERTERS`) on
the GEMMs memo prices in it only (MXFP8's and NVFP4's include-list `MXFP8_FQNS`: not the output head, not the
routers; Float8 rowwise with ``filter_fqns=['lm_head']``, as llama3_405b's), or of the nearest format torchtitan
offers where it lacks the plan's (`memo_sim.export.base.target_gemm_format`: Float8 rowwise for a Megatron
fp8-tensorwise plan); and ``config.model_spec`` anew where the shipped
configuration's model is not the one priced (llama3_405b's Float8 converter under a bf16 plan, gpt_oss's varlen
attention under CP).
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.export.base import alloc_env, alloc_gap, ep_overlap_gap
from memo_sim.export.base import (Export, Gap, PlanChange, balance_gap, gemm_format_gap, metp_gap, mtp_gap,
                                  rank_order_gap, nearest_batch, nearest_model, nearest_plan, not_modelled_gap,
                                  optimizer_offload_gap,
                                  policy_gaps,
                                  uneven_stages_gap, price_nearest, rotary_gaps, target_gemm_format, torchrun_line,
                                  ulysses_gap)
from memo_sim.plan.schema import Plan

FRAMEWORK = "torchtitan"  # its version in memo_sim/frameworks/data (the plans exported instead)
SOURCE = "pytorch/torchtitan@b5bcd76c (2026-08-21)"
# the allocator's variable as torchtitan's own launch script sets it (run_train.sh: PYTORCH_ALLOC_CONF=
# "expandable_segments:True" before torchrun, checked at pytorch/torchtitan 0168bd51; the torch it runs on reads it
# first, `memo_sim.export.base.CUDA_ALLOC_ENV`): the run line below bypasses that script, so it sets the variable
ALLOC_ENV = "PYTORCH_ALLOC_CONF"
FILE = "memo_torchtitan.py"
FUNCTION = "memo_plan"
BASES = {"llama-3.1-8b": "llama3_8b", "llama-3.1-70b": "llama3_70b", "llama-3.1-405b": "llama3_405b"}
# the model_registry (module, flavour) of each shipped configuration (torchtitan/models/<module>/__init__.py at SOURCE):
# where the exported function sets config.model_spec with the plan's GEMM format's converters
REGISTRY = {"llama3_8b": ("llama3", "8B"), "llama3_70b": ("llama3", "70B"), "llama3_405b": ("llama3", "405B"),
            "qwen3_30b_a3b": ("qwen3", "30B-A3B"), "deepseek_v3_671b": ("deepseek_v3", "671B"),
            "deepseek_v3_16b": ("deepseek_v3", "16B"),
            "gpt_oss_20b": ("gpt_oss", "20b"), "gpt_oss_120b": ("gpt_oss", "120b"), "qwen3_14b": ("qwen3", "14B"),
            "qwen3_32b": ("qwen3", "32B"), "qwen3_0_6b": ("qwen3", "0.6B"), "qwen3_1_7b": ("qwen3", "1.7B")}
# the other shipped configurations (torchtitan/models/<module>/config_registry.py at SOURCE): (module, function, the
# model_registry flavour the function's model_spec is set to where the model has no function of its own: Qwen3-8B,
# whose flavour "8B" ships without a pretraining configuration, from qwen3_14b's) -- the MoE ones and Qwen3's.
# DeepSeek-V2-Lite is deepseek_v3_16b (config_registry.py line 141: flavour "16B", deepseek_v3/__init__.py lines
# 389-436: 27 layers of dim 2048, 16 heads, q_lora_rank 0, kv_lora_rank 512, 64 experts top-6 of 1408 with 2 shared,
# one dense layer of 10944, vocab 102400, a softmax router without route_norm or scaling); a review found it started
# from deepseek_v3_671b
SHIPPED = {"deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", None),
           "deepseek-v2-lite": ("deepseek_v3", "deepseek_v3_16b", None),
           "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", None),
           "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b", None), "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", None),
           "qwen3-14b": ("qwen3", "qwen3_14b", None),
           "qwen3-32b": ("qwen3", "qwen3_32b", None), "qwen3-8b": ("qwen3", "qwen3_14b", "8B"),
           # the small dense Qwen3 flavours (`QWEN3_DENSE`): 0.6B and 1.7B with configurations of their own
           # (qwen3/config_registry.py at SOURCE, qwen3_0_6b line 186, qwen3_1_7b line 216), 4B without one (started
           # from qwen3_1_7b, the nearest in size, its model_spec set to the flavour, as Qwen3-8B's from qwen3_14b)
           "qwen3-0.6b": ("qwen3", "qwen3_0_6b", None), "qwen3-1.7b": ("qwen3", "qwen3_1_7b", None),
           "qwen3-4b": ("qwen3", "qwen3_1_7b", "4B")}
HF_ASSETS = {"8B": "./assets/hf/Qwen3-8B", "235B-A22B": "./assets/hf/Qwen3-235B-A22B",
             "4B": "./assets/hf/Qwen3-4B"}  # as torchtitan's qwen3 configurations name their hf_assets_path
# torchtitan's small dense Qwen3 flavours (torchtitan/models/qwen3/__init__.py at SOURCE: _0_6b line 253, _1_7b line
# 291, _4b line 329; qwen3_configs line 598), which memo has no preset of: Qwen3-8B's model (`PRESETS`: SwiGLU,
# RMSNorms of eps 1e-6, QK norms, head_dim 128, rotary base 1e6, no biases) with these shapes and tied embeddings
# (enable_weight_tying=True), matched by shape in `_preset` (a Qwen3-0.6B config.json was refused as "not a
# torchtitan model": a review)
_QWEN3_DENSE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied_embeddings")
QWEN3_DENSE = {"qwen3-0.6b": (28, 1024, 16, 8, 3072, 151936, True),
               "qwen3-1.7b": (28, 2048, 16, 8, 6144, 151936, True),
               "qwen3-4b": (36, 2560, 32, 8, 9728, 151936, True)}
# torchtitan's Qwen3 MoE flavours (torchtitan/models/qwen3/__init__.py at SOURCE: _30b_a3b and _235b_a22b pass
# n_layers, dim, n_heads, n_kv_heads, head_dim, moe_hidden_dim, num_experts and top_k to _build_qwen3_moe_layers and
# vocab_size to Qwen3Model.Config; every layer a GQA attention with an RMSNorm over each query and key head, a
# make_router_config of score_func "softmax" and route_norm, no shared experts, no biases, untied embeddings), as
# memo's fields (_QWEN3_MOE_FIELDS); 235B-A22B is a model_registry flavour without a configuration of its own (the
# export starts from qwen3_30b_a3b and sets model_spec, as for Qwen3-8B)
_QWEN3_MOE_FIELDS = ("layers", "hidden", "heads", "n_kv_heads", "qk_head_dim", "value_head_dim", "expert_width",
                     "experts", "top_k", "vocab")
QWEN3_MOE = {"30B-A3B": (48, 2048, 32, 4, 128, 128, 768, 128, 8, 151936),
             "235B-A22B": (94, 4096, 64, 4, 128, 128, 1536, 128, 8, 151936)}
# each flavour's rotary base (CosSinRoPE.Config theta: 235B-A22B's 5e6 is not Qwen/Qwen3-235B-A22B config.json's
# rope_theta 1e6, which the export sets) and the norms' epsilon (_EPS, every RMSNorm of torchtitan's Qwen3)
QWEN3_MOE_THETA = {"30B-A3B": 1000000.0, "235B-A22B": 5000000.0}
QWEN3_EPS = 1e-6
QWEN3_MOE_BASE = "qwen3_30b_a3b"  # the one Qwen3 MoE pretraining configuration (config_registry.py at SOURCE)
# the rotary table each flavour is built with (RoPE.Config.max_context_length at SOURCE: llama3/__init__.py _8b, _70b,
# _405b 131072; qwen3/__init__.py _8b, _14b, _32b, _30b_a3b, _235b_a22b 40960; deepseek_v3/__init__.py _671b and
# _16b 4096 * 4; gpt_oss/__init__.py _20b, _120b 131072). Decoder.Config.update_from_config (models/common/decoder.py)
# raises
# "Training sequence length ... exceeds attention RoPE maximum supported sequence length" where
# training.max_context_length is longer than the first attention layer's, then sets every layer's to it: the export
# sets each layer's attention.rope.max_context_length to the plan's sequence where it is longer (the table's length
# only, not its frequencies: models/common/rope.py _precompute_cache)
ROPE_MAX = {**{("llama3", f): 131072 for f in ("8B", "70B", "405B")},
            **{("qwen3", f): 40960 for f in ("0.6B", "1.7B", "4B", "8B", "14B", "32B", "30B-A3B", "235B-A22B")},
            ("deepseek_v3", "671B"): 16384, ("deepseek_v3", "16B"): 16384,
            **{("gpt_oss", f): 131072 for f in ("20b", "120b")}}
# the compile settings (enable, components, enable_async_tensor_parallel) of the shipped configurations that are not
# CompileConfig()'s (False, ["model", "loss"], False): config_registry.py at SOURCE
SHIPPED_COMPILE = {"llama3_405b": (True, ("model", "loss"), True), "deepseek_v3_671b": (True, ("loss",), False),
                   "deepseek_v3_16b": (True, ("loss",), False)}
# the shipped configurations whose model_spec carries converters (llama3_405b: Float8LinearConverter, rowwise, lm_head
# filtered): a plan priced in bf16 sets model_spec without them
SHIPPED_CONVERTERS = ("llama3_405b",)
# the TransformerBlock.Config fields (models/common/decoder.py) and the MoE.Config field (models/common/moe.py) whose
# Linear.Configs memo prices in the plan's GEMM format (`memo_sim.cost.gemm_format`: the layer GEMMs): the MXFP8
# linear converter's include-list (mx.py: substring match on the FQN; empty converts every Linear.Config), so that the
# output head (lm_head) and the routers (moe.router.gate), priced in the model dtype, stay so
MXFP8_FQNS = ("attention", "feed_forward")
MXFP8_MOE_FQNS = ("shared_experts",)
# the grouped experts' per-expert token padding (MXFP8GroupedExpertsConverter.Config.pad_multiple, default 32): mx.py
# at SOURCE says the CuTeDSL quantization kernel on sm_100 needs multiples of 128, and torchtitan's own MXFP8 MoE
# configuration (deepseek_v3_debugmodel_mxfp8) sets 128; MXFP8 runs on SM100 and later only
MXFP8_PAD = 128
# each quantised GEMM format torchtitan runs: (the torchtitan/components/quantization module, its linear converters,
# the converters it adds for a MoE's grouped experts, its name in the export's words)
CONVERTERS = {"mxfp8": ("mx", ("MXFP8LinearConverter",), ("MXFP8GroupedExpertsConverter",), "MXFP8"),
              "fp8-rowwise": ("float8", ("Float8LinearConverter",), ("Float8GroupedExpertsConverter",),
                              "Float8 rowwise"),
              # nvfp4.py at SOURCE: NVFP4LinearConverter (line 268) swaps dense Linear.Configs only; it has no
              # grouped-experts converter, so a MoE's routed experts stay bf16 (`_nvfp4_moe_gap`)
              "nvfp4": ("nvfp4", ("NVFP4LinearConverter",), (), "NVFP4")}
# why an optimizer-offload plan is written with the optimizer on the GPU: torchtitan's one host offload,
# training.enable_cpu_offload (torchtitan/config/configs.py:70 at SOURCE), is FSDP2's CPUOffloadPolicy
# (torchtitan/distributed/fsdp.py:232): the parameters and gradients on the host too, each unit's parameters copied to
# the GPU for its all-gather, another mechanism than memo's optimizer offload (the framework data's not_modelled)
_OFFLOAD_WHY = ("torchtitan's training.enable_cpu_offload is FSDP2's CPU offload of the parameters, gradients and "
                "optimizer step together, each unit's parameters copied back for its all-gather: not the same "
                "mechanism as memo's optimizer offload, which keeps the parameters and gradients on the GPU")
SCHEDULES = {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
_RUNS = {"store_all": "config.activation_checkpoint = None", "full_recompute": "config.activation_checkpoint = "
         "FullAC.Config()", "op_sac": "config.activation_checkpoint = SelectiveAC.Config()"}
# the activation-checkpointing class each policy runs with (None: no checkpointing)
_AC = {"full_recompute": "FullAC", "op_sac": "SelectiveAC"}


# what a model is, beside its shapes: its name and notes, and how it is trained (dtype, recipe, GEMM format)
_NOT_SHAPE = ("name", "not_modelled", "dtype", "precision", "gemm_format", "fp8_saved_inputs", "fp8_sp_gathers",
             "fp8_weights_per_use", "fp8_weights_saved", "fp8_transposes", "fp8_attention_copy", "fp8_abs_saved",
             "qk_norm_kept", "offload_copies_per_group")


def _preset(model) -> str:
    """The preset a model is, by name or else by shape (a Hugging Face config.json of DeepSeek-V3 under its own
    file name is DeepSeek-V3); its own name where it is none of torchtitan's."""
    from memo_sim.model.config import PRESETS  # noqa: PLC0415

    presets = {name: PRESETS[name] for name in (*BASES, *SHIPPED) if name in PRESETS}
    presets.update({name: replace(PRESETS["qwen3-8b"], **dict(zip(_QWEN3_DENSE_FIELDS, fields)))
                    for name, fields in QWEN3_DENSE.items()})
    if model.name in presets and model.name not in QWEN3_DENSE:
        return model.name
    shape = {f: getattr(model, f) for f in model.__dataclass_fields__ if f not in _NOT_SHAPE}
    for name, p in presets.items():
        if shape == {f: getattr(p, f) for f in p.__dataclass_fields__ if f not in _NOT_SHAPE}:
            return name
    return model.name


def _qwen3_moe(m) -> bool:
    """A MoE of Qwen3-MoE's kind (a ``qwen3_moe`` config.json): a softmax top-k router, no shared expert, QK norms,
    no latent attention. torchtitan's Qwen3 MoE is its nearest model (DeepSeek-V3's latent attention, sigmoid
    grouped router and shared expert are not)."""
    return m.moe and m.router == "softmax" and not m.shared_experts and not m.mla and not m.q_lora_rank and m.qk_norm


def _qwen3_moe_misfits(m) -> list[str]:
    """What a Qwen3-MoE-like model has beside its shapes that torchtitan's Qwen3 MoE layers take no argument for
    (``_build_qwen3_moe_layers`` at `SOURCE`: every layer a MoE of SwiGLU experts, RMSNorms, no biases, no sinks or
    windows, an ungrouped router of scale 1)."""
    out = [f"{m.dense_layers} dense-FFN layers ({m.dense_where})"] if m.dense_layers else []
    out += [f"linear biases ({m.bias})"] if m.bias != "none" else []
    out += ["expert and router biases"] if m.moe_bias else []
    out += ["attention sinks"] if m.attention_sinks else []
    out += [f"sliding-window attention ({m.sliding_window} tokens)"] if m.sliding_window or m.sliding_layers else []
    out += [f"chunked attention ({m.attention_chunk} tokens)"] if m.chunked_layers else []
    out += [f"{m.norm} norms"] if m.norm != "rmsnorm" else []
    out += [f"{m.ffn_type} experts"] if m.ffn_type != "swiglu" else []
    out += [f"grouped routing ({m.router_groups} groups)"] if m.router_groups else []
    out += [f"routing weights scaled by {m.router_scaling:g}"] if m.router_scaling != 1.0 else []
    return out


def _qwen3_moe_flavour(m) -> str | None:
    """The Qwen3 MoE flavour of torchtitan whose model is the plan's (its shapes, untied embeddings, nothing
    `_qwen3_moe_misfits` names; the rotary base is set on it where it differs), else None."""
    if not _qwen3_moe(m) or m.tied_embeddings or _qwen3_moe_misfits(m):
        return None
    shape = tuple(getattr(m, f) for f in _QWEN3_MOE_FIELDS)
    return next((f for f, s in QWEN3_MOE.items() if s == shape), None)


def _qwen3_theta(plan: Plan) -> float | None:
    """The plan's rotary base where it is not its Qwen3 MoE flavour's (Qwen3-235B-A22B's 1e6 against the flavour's
    5e6): the exported function sets it on each layer's ``attention.rope.theta``; else None."""
    name = _preset(plan.model)
    flavour = (SHIPPED[name][2] or REGISTRY[SHIPPED[name][1]][1]) if name in SHIPPED else _qwen3_moe_flavour(
        plan.model)
    theta = plan.model.rope_theta
    return theta if flavour in QWEN3_MOE_THETA and theta and theta != QWEN3_MOE_THETA[flavour] else None


def _module(plan: Plan) -> str:
    """The torchtitan model package whose config_registry the exported function imports from."""
    if _preset(plan.model) not in SHIPPED and _qwen3_moe(plan.model):
        return "qwen3"
    return SHIPPED.get(_preset(plan.model), ("deepseek_v3" if plan.model.moe else "llama3",))[0]


def _flavour(plan: Plan) -> str | None:
    """The model_registry flavour the exported function sets config.model_spec to (a shipped model without a
    configuration of its own: Qwen3-8B, Qwen3-235B-A22B), else None (the configuration's own model)."""
    name = _preset(plan.model)
    if name in SHIPPED or name in BASES:
        return SHIPPED.get(name, (None, None, None))[2]
    flavour = _qwen3_moe_flavour(plan.model)
    return flavour if flavour != REGISTRY[QWEN3_MOE_BASE][1] else None


def _qwen3_moe_args(m) -> str:
    """The plan's model as torchtitan's Qwen3 MoE arguments (torchtitan/models/qwen3/__init__.py at `SOURCE`)."""
    theta = f"; its rope a CosSinRoPE.Config of theta={m.rope_theta!r}" if m.rope_theta else ""
    return (f"_build_qwen3_moe_layers(n_layers={m.layers}, dim={m.hidden}, n_heads={m.heads}, "
            f"n_kv_heads={m.n_kv_heads}, head_dim={m.qk_head_dim}, moe_hidden_dim={m.expert_width}, "
            f"num_experts={m.experts}, top_k={m.top_k}{theta}) as the layers of Qwen3Model.Config(dim={m.hidden}, "
            f"vocab_size={m.vocab}" + (", enable_weight_tying=True" if m.tied_embeddings else "") + ")"
            # the configuration's loss is of its own model's vocabulary (ChunkedLossWrapper.Config.loss_fn, a
            # CrossEntropyLoss.Config of global_vocab_size: torchtitan/components/loss.py at SOURCE)
            + (f", and config.loss.loss_fn.global_vocab_size = {m.vocab} ({QWEN3_MOE_BASE}'s is "
               f"{QWEN3_MOE['30B-A3B'][-1]})" if m.vocab != QWEN3_MOE["30B-A3B"][-1] else ""))


def _base(plan: Plan) -> tuple[str, str | None]:
    """The shipped configuration to start from, and a note when its model is not the plan's."""
    name = _preset(plan.model)
    if name in BASES:
        return BASES[name], None
    if name in SHIPPED:
        return SHIPPED[name][1], None
    if _qwen3_moe_flavour(plan.model):  # a Qwen3 MoE flavour under another name (a config.json of its own)
        return QWEN3_MOE_BASE, None
    if _qwen3_moe(plan.model):  # torchtitan's Qwen3 MoE, of other shapes
        misfits = _qwen3_moe_misfits(plan.model)
        return QWEN3_MOE_BASE, (f"{plan.model.name} is not a torchtitan model: the run starts from {QWEN3_MOE_BASE} "
                                f"(torchtitan's Qwen3 MoE: set config.model_spec to a Qwen3 MoE of the plan's shapes, "
                                f"{_qwen3_moe_args(plan.model)}"
                                + (f"; torchtitan's Qwen3 MoE layers take no argument for its {', '.join(misfits)}"
                                   if misfits else "") + ")")
    if plan.model.moe:  # the nearest shipped MoE configuration
        return "deepseek_v3_671b", (f"{plan.model.name} is not a torchtitan model: the run starts from "
                                    f"deepseek_v3_671b (set config.model_spec to a MoE of the plan's shapes)")
    p = plan.model.params()
    name = "llama3_8b" if p < 30e9 else ("llama3_70b" if p < 200e9 else "llama3_405b")
    return name, (f"{plan.model.name} is not a torchtitan model: the run starts from {name}'s model "
                  f"(set config.model_spec to a model of the plan's shapes to train this one)")


def _titan_counts(n_layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """Layers per virtual stage as torchtitan's ``_generate_llm_fqn_per_model_part`` at `SOURCE` splits
    them (torchtitan/distributed/pipeline_parallel.py): ``n_layers + first_less + last_less`` effective
    layers spread evenly (the first stages one more where they do not divide), the first stage's share
    less ``first_less`` (the embedding's weight), the last stage's less ``last_less`` (the norm and head)."""
    eff = n_layers + first_less + last_less
    each, extra = divmod(eff, stages)
    out, left = [], n_layers
    for i in range(stages):
        want = each + (1 if i < extra else 0) - (first_less if i == 0 else 0) - (last_less if i == stages - 1 else 0)
        take = max(0, min(want, left))
        out.append(take)
        left -= take
    return out


def pipeline_split(plan: Plan) -> tuple[int, int, int] | None:
    """(``pipeline_parallel_layers_per_stage``, ``..._first_stage_less_layers``, ``..._last_stage_less_layers``)
    that make torchtitan split the plan's layers into its pp x vpp model chunks exactly as the plan does
    (chunk c of rank s is virtual stage c x pp + s in both), or None where torchtitan's three numbers
    cannot: its stages are equal but the first and the last, which may hold fewer. torchtitan counts
    ``ceil((layers + first_less + last_less) / layers_per_stage)`` virtual stages; with its defaults of one
    layer less at each end and layers / stages per stage it asks for one stage more than an even plan has."""
    lay, n = plan.layout, plan.model.layers
    counts = [len(r) for r in lay.virtual_stage_ranges(n)]
    k = len(counts)
    m = max(counts[1:-1]) if k > 2 else max(counts)
    first_less, last_less = m - counts[0], m - counts[-1]
    if m < 1 or first_less < 0 or last_less < 0 or -(-(n + first_less + last_less) // m) != k:
        return None
    return (m, first_less, last_less) if _titan_counts(n, k, first_less, last_less) == counts else None


def module_fqns(plan: Plan) -> list[list[str]] | None:
    """The plan's model chunks as ``ParallelismConfig.module_fqns_per_model_part`` (torchtitan/config/configs.py:187
    at `SOURCE`), virtual stages in order: the module names of torchtitan's ``Decoder`` (models/common/decoder.py:248-
    255, the base of its Llama 3, Qwen3, DeepSeek-V3 and GPT-OSS models: ``tok_embeddings``, ``layers.<i>`` of a
    ModuleDict keyed by the layer's index, ``norm``, ``lm_head``), the embedding on the first chunk and the norm and
    head on the last, as ``_generate_llm_fqn_per_model_part`` (distributed/pipeline_parallel.py:357) names them.
    pipeline_llm takes the list as given (pipeline_parallel.py:88), each rank building the chunks of its virtual
    stages (``_pipeline_module_split``), so every split is expressed, the uneven ones `pipeline_split`'s three
    numbers cannot say (a review: those were a gap); None where a chunk would hold no module."""
    parts = [[f"layers.{i}" for i in r] for r in plan.layout.virtual_stage_ranges(plan.model.layers)]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts if all(parts) else None


def _dispatcher_gap(plan: Plan) -> list[Gap]:
    """A MoE token dispatcher torchtitan's data does not run (its experts' dispatchers: all-to-all): every torchtitan
    MoE at `SOURCE` dispatches by all-to-all over the EP ranks (models/common/token_dispatcher.py:228
    AllToAllTokenDispatcher; DeepEP and HybridEP backends memo's torchtitan data does not offer), so the nearest plan
    is priced with it, as `memo_sim.export.deepspeed` does for DeepSpeed-MoE (a review: an allgather plan was kept and
    not listed)."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    lay, experts = plan.layout, get_framework(FRAMEWORK).experts
    if not plan.model.moe or experts is None or lay.moe_dispatcher in experts.dispatchers:
        return []
    return [Gap(f"the {lay.moe_dispatcher} token dispatcher", "torchtitan's all-to-all (AllToAllTokenDispatcher, "
                "torchtitan/models/common/token_dispatcher.py)", PlanChange(layout={"moe_dispatcher": "alltoall"}))]


def _microbatch_gap(plan: Plan, earlier: list[Gap]) -> list[Gap]:
    """PyTorch's Schedule1F1B raises where the micro-batches are fewer than the stages (`Framework.schedule_why_not`;
    a review: a plan of 2 micro-batches over 4 stages was written as expressed): the nearest runs as many micro-batches
    as stages, the batch raised to them. The schedule and batch the ``earlier`` gaps leave (a review: an SPPO plan,
    written as 1F1B, kept its one micro-batch over 4 stages, which Schedule1F1B refuses)."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    lay, _, schedule = nearest_plan(plan, earlier)
    m = nearest_batch(plan, earlier) // plan.micro_batch
    why = get_framework(FRAMEWORK).schedule_why_not(schedule, lay.pp, m)
    if not why:
        return []
    batch = lay.pp * plan.micro_batch
    return [Gap(f"1F1B with {m} micro-batch{'es' if m != 1 else ''} over {lay.pp} pipeline stages",
                f"{lay.pp} micro-batches of {plan.micro_batch}, the replica's batch raised to {batch} sequences "
                f"({why})",
                PlanChange(batch=batch))]


def gaps(plan: Plan) -> list[Gap]:
    out = ulysses_gap(plan) + metp_gap(plan) + _fsdp_gap(plan)
    borrow = _ep_borrow_gap(plan)
    out += (borrow or _cp_shard_gap(plan)) + balance_gap(plan, FRAMEWORK) + rank_order_gap(plan, FRAMEWORK)
    out += policy_gaps(plan, _RUNS, notes={"memo": "torchtitan offloads no activations",
                                           "full_offload": "torchtitan offloads no activations"})
    out += _format_gaps(plan) + optimizer_offload_gap(plan, "torchtitan", _OFFLOAD_WHY) + not_modelled_gap(plan)
    out += mtp_gap(plan, "torchtitan", "memo's torchtitan data and export do not offer it: torchtitan's DeepSeek-V3 "
                                       "MTP, model_registry num_mtp_layers, runs without PP and CP only")
    if plan.layout.pp > 1 and pipeline_split(plan) is None and module_fqns(plan) is None:
        out += uneven_stages_gap(plan, "torchtitan (module_fqns_per_model_part)")
    out += _dispatcher_gap(plan) + ep_overlap_gap(plan, FRAMEWORK)
    out += _microbatch_gap(plan, out) + alloc_gap(plan)
    if plan.layout.etp > 1:
        out.append(Gap(f"expert tensor parallelism over {plan.layout.etp} ranks", "experts whole on each EP rank "
                       "(torchtitan at this version has no expert tensor parallelism)", PlanChange(layout={"etp": 1})))
    fmt = target_gemm_format(plan, FRAMEWORK)
    if _writes_quantised(plan, plan.model) and plan.layout.kernel_fusion != "compiled":
        out.append(Gap(f"{CONVERTERS[fmt][3]} GEMMs in blocks priced uncompiled (memo's hand-fused kernels, "
                       "kernel_fusion fused)",
                       "the blocks compiled (config.compile.enable with 'model' in config.compile.components, the "
                       "converters' model_compile_enabled=True): torchtitan runs torchao's dynamic quantisation at "
                       "speed compiled only (torchtitan/components/quantization/mx.py warns 'torch.compile enablement "
                       "is required for highest performance'; llama3_405b's Float8 sets model_compile_enabled from "
                       "its compile settings); compiled blocks fuse more than the hand-fused kernels priced, so the "
                       "run should be no slower than priced"))
    elif plan.layout.flavour.async_collectives and plan.layout.kernel_fusion != "compiled":
        out.append(Gap("async TP in blocks priced uncompiled (memo's hand-fused kernels, kernel_fusion fused)",
                       "the blocks compiled (config.compile.enable with 'model' in config.compile.components): "
                       "torchtitan runs async TP as Inductor's micro-pipeline pass, so only in compiled blocks "
                       "(torchtitan/config/configs.py CompileConfig.enable_async_tensor_parallel, which its "
                       "__post_init__ accepts with compile.enable and 'model' in compile.components only); compiled "
                       "blocks fuse more than the hand-fused kernels priced, so the run should be no slower than "
                       "priced"))
    out += _nvfp4_moe_gap(plan)
    if _module(plan) == "qwen3" and plan.model.moe:
        out += _qwen3_moe_gaps(plan.model)
    out += _aux_loss_gaps(plan.model)
    m = plan.model
    if m.chunked_layers:  # no Llama 4 in torchtitan at SOURCE
        out.append(Gap(f"chunked attention ({m.attention_chunk}-token chunks on {m.chunked_layers} of {m.layers} "
                       f"layers)", "full causal attention on every layer (torchtitan at this version ships no model "
                       "with chunked attention)"))
    out += rotary_gaps(m, "none of the models memo writes for torchtitan takes it", learned=True)
    base, note = _base(plan)
    if note and m.rope_scaling and not (_module(plan) == "qwen3" and m.moe):  # a stand-in's rotary embedding
        out.append(Gap(f"rotary scaling ({m.rope_scaling})", f"{base}'s own rotary embedding: set the model's "
                                                             f"scaling by hand"))
    if note:
        out.append(Gap(f"model {m.name}", note))
    return out


def _ep_borrow_gap(plan: Plan) -> list[Gap]:
    """Expert parallelism beside replicated data parallelism (ZeRO 0) where TP x CP is too few ranks for it: torchtitan
    at `SOURCE` borrows the EP ranks from data_parallel_shard_degree x context_parallel_degree x tensor_parallel_degree
    (torchtitan/distributed/parallel_dims.py ParallelDims._validate raises "expert_parallel_degree (N) must divide
    dp_shard * cp * tp"), and ZeRO 0 is written with data_parallel_shard_degree 1 (ZeRO 1 and 2 are FSDP2 already).
    The nearest: FSDP2 over the whole data group kept gathered after the forward (memo's fsdp flavour, which also
    runs beside pipeline stages, as torchtitan's does), written as `_fsdp_gap`'s is."""
    lay = plan.layout
    if not (plan.model.moe and lay.ep > 1 and lay.zero == 0 and (lay.tp * lay.cp * lay.ulysses) % lay.ep):
        return []
    return [Gap(f"expert parallelism over {lay.ep} ranks beside replicated data parallelism (ZeRO 0, TP x CP "
                f"{lay.tp * lay.cp * lay.ulysses} ranks)",
                'FSDP2 over the data group, fsdp_reshard_after_forward = "never" (weights kept gathered from the '
                "forward to the backward): torchtitan's EP borrows its ranks from data_parallel_shard_degree x "
                "context_parallel_degree x tensor_parallel_degree (torchtitan/distributed/parallel_dims.py)",
                PlanChange(layout={"zero": 3, "dp_mode": "fsdp", "reshard_after_forward": False}))]


def _fsdp_gap(plan: Plan) -> list[Gap]:
    """ZeRO 1 or 2, which torchtitan does not offer (memo's torchtitan data: ZeRO 0 or 3, as FSDP2): written as FSDP2
    over the data group with fsdp_reshard_after_forward = "never", so the nearest plan is that one, ZeRO 3 in the
    fsdp flavour with the weights kept gathered from the forward to the backward (also beside pipeline stages, where
    torchtitan's apply_fsdp reshards nothing either). It was priced as ZeRO 2, which torchtitan's data refuses, and
    beside stages as a layout memo refuses (a review)."""
    lay = plan.layout
    if lay.zero not in (1, 2):
        return []
    sharded = "optimizer states" + (" and gradients" if lay.zero == 2 else "")
    whole = "weights" + (" and gradients" if lay.zero == 1 else "")
    return [Gap(f"ZeRO stage {lay.zero} ({sharded} sharded, {whole} whole)",
                'FSDP2 over the data group with fsdp_reshard_after_forward = "never" (ZeRO 3: weights, gradients and '
                "optimizer states sharded, each layer's weights kept gathered from its forward to its backward)",
                PlanChange(layout={"zero": 3, "dp_mode": "fsdp", "fsdp_shard": 0, "reshard_after_forward": False}))]


def fsdp_runs(lay) -> dict:
    """How torchtitan runs a ZeRO-3 layout of the ``zero`` flavour (DeepSpeed's, Megatron-FSDP's), which the export
    writes as data_parallel_shard_degree over the data group without fsdp_reshard_after_forward: FSDP2 (memo's fsdp
    flavour), resharding after the forward on one stage, not beside pipeline stages (torchtitan's ``"default"``
    policy); {} for any other layout."""
    if lay.zero != 3 or lay.dp_mode == "fsdp":
        return {}
    return {"dp_mode": "fsdp", "fsdp_shard": 0, "reshard_after_forward": lay.pp == 1}


def _cp_shard_gap(plan: Plan) -> list[Gap]:
    """Weights replicated over the context-parallel ranks (ZeRO 0): torchtitan's FSDP shards over
    data_parallel_shard_degree x context_parallel_degree whatever the first is (its dp_shard_cp mesh: written with
    data_parallel_shard_degree 1, FSDP2 still shards over the CP ranks, memo's torchtitan data refusing the replicated
    layout so); the nearest: FSDP over the CP ranks, replicated over the plan's DP (HSDP where dp > 1)."""
    lay = plan.layout
    if lay.cp * lay.ulysses == 1 or lay.zero != 0:
        return []
    shard = lay.cp * lay.ulysses  # Ulysses is written as CP (`ulysses_gap`)
    return [Gap(f"weights, gradients and optimizer states replicated over the {shard} context-parallel ranks (ZeRO 0)",
                "FSDP2 over them (torchtitan shards over data_parallel_shard_degree x context_parallel_degree, its "
                "dp_shard_cp mesh: torchtitan/distributed/parallel_dims.py)"
                + (f", replicated over data_parallel_replicate_degree {lay.dp}" if lay.dp > 1 else ""),
                PlanChange(layout={"zero": 3, "dp_mode": "fsdp", "fsdp_shard": shard if lay.dp > 1 else 0}))]


def _format_gaps(plan: Plan) -> list[Gap]:
    """The plan's GEMM format as written: torchtitan's nearest where it lacks the plan's (`gemm_format_gap`); and a
    quantised format (the plan's or that nearest one) on a model that is not a shipped one runs in bf16 in what is
    written, priced so (this gap alone then: the first gap's format is the one priced, `nearest_model`)."""
    fmt = target_gemm_format(plan, FRAMEWORK)
    if fmt not in CONVERTERS or _base(plan)[1] is None:
        return gemm_format_gap(plan, FRAMEWORK)
    model = replace(plan.model, gemm_format=fmt)
    return [Gap(f"{plan.model.gemm_format} GEMMs", f"bf16 GEMMs ({fmt} not written: pass "
                + " and ".join(_converter_configs(model))
                + f" (torchtitan/components/quantization/{CONVERTERS[fmt][0]}.py) in the converters of the "
                  "model's model_registry for config.model_spec)", PlanChange(gemm_format="bf16"))]


def writes_gemm_format(plan: Plan) -> bool:
    """Whether the export writes the GEMM format torchtitan runs the plan in (`target_gemm_format`): the model dtype,
    or a quantised format's converters on a model torchtitan ships (a stand-in's GEMMs are written in bf16:
    `memo_sim.export.export_plan` then searches torchtitan's best plan without the format)."""
    return target_gemm_format(plan, FRAMEWORK) not in CONVERTERS or _base(plan)[1] is None


def _writes_quantised(plan: Plan, model) -> bool:
    """Whether the exported configuration sets torchtitan's converters of a quantised GEMM format (`CONVERTERS`):
    ``model`` (the plan's model as written) in one and the model one torchtitan ships (a stand-in's GEMMs are bf16,
    a gap says so)."""
    return model.gemm_format in CONVERTERS and _base(plan)[1] is None


def _nvfp4_moe_gap(plan: Plan) -> list[Gap]:
    """A MoE's routed experts under NVFP4: torchtitan's NVFP4LinearConverter converts dense ``Linear.Config`` nodes
    only (nvfp4.py at SOURCE, ``convert`` traverses ``Linear.Config``, lines 300-316) and ships no grouped-experts
    converter, so the grouped experts' GEMMs run in bf16 where memo prices them in NVFP4."""
    if not (_writes_quantised(plan, plan.model) and plan.model.gemm_format == "nvfp4" and plan.model.moe):
        return []
    return [Gap("the routed experts' grouped GEMMs in NVFP4", "the routed experts' grouped GEMMs in bf16 (torchtitan "
                "at this version has NVFP4LinearConverter for dense Linears only, no NVFP4 grouped-experts "
                "converter: torchtitan/components/quantization/nvfp4.py); the run is slower than priced")]


def _mxfp8_fqns(model) -> list[str]:
    """The MXFP8 linear converter's include-list for ``model`` (`MXFP8_FQNS`; a MoE's shared experts too, where it
    has them: GPT-OSS has none)."""
    return list(MXFP8_FQNS + (MXFP8_MOE_FQNS if model.moe and model.shared_experts else ()))


def _converter_configs(model) -> list[str]:
    """The converters' Configs of ``model``'s GEMM format, each with its blocks compiled: MXFP8 on the GEMMs memo
    prices in it (not the head, not the routers: `MXFP8_FQNS`); NVFP4 on the same include-list
    (nvfp4.py at SOURCE, NVFP4LinearConverter.Config.fqns, lines 271-279: substring match, empty converts every Linear,
    the head too; its only other field, model_compile_enabled, from QuantizationConverter.Config); Float8's rowwise
    recipe (its default) on every Linear but the output head and the routers' gates, as llama3_405b's and
    deepseek_v3_671b_float8's configurations filter them, with a MoE's grouped experts through
    Float8GroupedExpertsConverter."""
    if model.gemm_format == "mxfp8":
        return ([f"MXFP8LinearConverter.Config(fqns={_mxfp8_fqns(model)!r}, model_compile_enabled=True)"]
                + ([f"MXFP8GroupedExpertsConverter.Config(model_compile_enabled=True, pad_multiple={MXFP8_PAD})"]
                   if model.moe else []))
    if model.gemm_format == "nvfp4":
        return [f"NVFP4LinearConverter.Config(fqns={_mxfp8_fqns(model)!r}, model_compile_enabled=True)"]
    skip = ["lm_head", "router.gate"] if model.moe else ["lm_head"]
    return ([f"Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns={skip!r}, model_compile_enabled=True)"]
            + (["Float8GroupedExpertsConverter.Config(model_compile_enabled=True)"] if model.moe else []))


def _compile_lines(base: str, compiled: bool, async_tp: bool) -> list[str]:
    """The ``config.compile`` lines that make the shipped configuration ``base`` compile the model's blocks
    (``compiled``: enable and "model" in components; at `SOURCE` torchtitan/models/llama3/parallelize.py compiles each
    TransformerBlock where ``compile.enable and "model" in compile.components``) or not, and run async TP or not
    (``CompileConfig.enable_async_tensor_parallel``, torchtitan/config/configs.py; not a ParallelismConfig field)."""
    enable, components, shipped_async = SHIPPED_COMPILE.get(base, (False, ("model", "loss"), False))
    out = []
    if compiled:
        out.append("    config.compile.enable = True")
        if "model" not in components:  # deepseek_v3_671b compiles its loss only
            out.append(f"    config.compile.components = {['model', *components]!r}")
    elif enable and "model" in components:  # the shipped one compiles the blocks memo priced uncompiled
        out.append(f"    config.compile.components = {[c for c in components if c != 'model']!r}")
    if async_tp or shipped_async:
        out.append(f"    config.compile.enable_async_tensor_parallel = {async_tp}")
    return out


def _qwen3_moe_gaps(m) -> list[Gap]:
    """What a model exported as torchtitan's Qwen3 MoE trains otherwise (torchtitan at `SOURCE`): every RMSNorm's
    epsilon is torchtitan/models/qwen3/__init__.py's _EPS, its rotary embedding is unscaled (CosSinRoPE.Config,
    scaling "none"), its router renormalises the top-k weights (_build_qwen3_moe_layers' route_norm=True); its
    router's auxiliary loss, which no torchtitan MoE has, is `_aux_loss_gaps`'s."""
    out = []
    if not m.weights_normalised:  # a qwen3_moe config.json's norm_topk_prob false (transformers' default)
        out.append(Gap(f"the router's top-{m.top_k} weights as the softmax over all the experts gives them, not "
                       "renormalised (norm_topk_prob false)", "renormalised to sum to 1 (torchtitan's Qwen3 MoE builds "
                       "its router with route_norm=True)"))
    if m.norm_eps and m.norm_eps != QWEN3_EPS:
        out.append(Gap(f"norm epsilon {m.norm_eps:g}", f"{QWEN3_EPS:g} (torchtitan's Qwen3 sets every RMSNorm's "
                                                        "epsilon to its module's _EPS)"))
    if m.rope_scaling:
        out.append(Gap(f"rotary scaling ({m.rope_scaling})", "none (torchtitan's Qwen3 builds CosSinRoPE.Config "
                                                             "without scaling)"))
    return out


def _aux_loss_gaps(m) -> list[Gap]:
    """A router's auxiliary load-balancing loss, which no torchtitan MoE has at `SOURCE`: every model's MoE is
    torchtitan/models/common/moe.py, balanced by a per-expert routing bias (MoE.Config.load_balance_coeff 1e-3,
    updated before each optimizer step). Only Qwen3's was named until a review exported GPT-OSS and DeepSeek-V3."""
    if not (m.moe and m.aux_loss_coef):
        return []
    return [Gap(f"the router's auxiliary load-balancing loss (coefficient {m.aux_loss_coef:g}"
                + (", per sequence" if m.seq_aux else "") + ")",
                "torchtitan's auxiliary-loss-free balancing (a routing bias per expert, updated before each "
                "optimizer step: MoE.Config.load_balance_coeff 1e-3; torchtitan's MoE has no auxiliary loss)")]


def _shapes(m) -> str:
    """The plan's model shapes, as a user sets them on torchtitan's model arguments."""
    moe = (f", {m.experts} routed experts of width {m.expert_width} top-{m.top_k}"
           + (f", shared width {m.shared_width}" if m.shared_width else "")) if m.moe else ""
    return (f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.n_kv_heads} K/V), FFN {m.ffn}{moe}, "
            f"vocabulary {m.vocab}")


def _value(v) -> str:
    """A setting's value as Python source: its repr, a list of lists (`module_fqns`) one inner list a line."""
    if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
        return "[\n" + "".join(f"        {x!r},\n" for x in v) + "    ]"
    return repr(v)


def render(plan: Plan, applied: list[Gap]) -> str:
    lay, pol, schedule = nearest_plan(plan, applied)
    # the replica's sequences priced (`nearest_batch`: `_microbatch_gap` raises them to a micro-batch per stage; a
    # review found the file writing the plan's 2 micro-batches beside a nearest plan priced with 4)
    batch = nearest_batch(plan, applied)
    base, other_model = _base(plan)
    if lay.dp_mode == "fsdp":  # FSDP2 over its shard group (with CP inside it, as torchtitan's mesh puts it)
        dp_shard = max(1, lay.dp_flavour.shard_group(lay) // (lay.cp * lay.ulysses))
    else:  # ZeRO 3 of the zero flavour (FSDP2 over the data group: `fsdp_runs`) or replicas
        dp_shard = lay.dp if lay.zero == 3 else 1
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
    if lay.dp_mode == "fsdp" and not lay.reshard_after_forward:  # ZeRO 1 and 2 too (`_fsdp_gap`)
        sets.append(("parallelism.fsdp_reshard_after_forward", "never"))
    if lay.pp > 1:
        sets += [("parallelism.pipeline_parallel_schedule", SCHEDULES[schedule]),
                 ("parallelism.num_pp_microbatches", batch // plan.micro_batch)]
        split, fqns = pipeline_split(plan), module_fqns(plan)
        if split is not None:
            sets += [("parallelism.pipeline_parallel_layers_per_stage", split[0]),
                     ("parallelism.pipeline_parallel_first_stage_less_layers", split[1]),
                     ("parallelism.pipeline_parallel_last_stage_less_layers", split[2])]
        elif fqns is not None:  # each model part's modules (else the gap above says so)
            sets.append(("parallelism.module_fqns_per_model_part", fqns))
    sets += [("training.max_context_length", plan.seq_tokens),
             ("training.num_tokens_per_microbatch_per_dp_rank", plan.micro_batch * plan.seq_tokens),
             ("training.num_tokens_per_train_step", batch * lay.dp * plan.seq_tokens),
             # eager launches, as priced; CUDA graphs are on by default at SOURCE and the trainer refuses them beside
             # pipeline parallelism and the all-to-all EP dispatcher (torchtitan/trainer.py _validate_cuda_graphs)
             ("training.disable_cuda_graphs", True)]
    if plan.model.moe and lay.balance.kind == "forced":  # round-robin routing: configs.py DebugConfig at SOURCE
        sets.append(("debug.moe_force_load_balance", True))
    body = [f"    config.{k} = {_value(v)}" for k, v in sets]
    if other_model:  # the shipped configuration trains another model: stop, rather than train that one unnoticed
        shapes = (f"a Qwen3 MoE of the plan's shapes: {_qwen3_moe_args(plan.model)}" if _module(plan) == "qwen3"
                  else f"a model of the plan's shapes ({_shapes(plan.model)})")
        why = (f"memo: {plan.model.name} is not a torchtitan model and this config starts from {base}: set "
               f"config.model_spec to {shapes}, then delete this line")
        body.insert(0, f"    raise NotImplementedError({why!r})")
    ac = _AC.get(pol.name)
    body.append("    config.activation_checkpoint = " + (f"{ac}.Config()" if ac else "None"))
    written = nearest_model(plan, applied)
    quantised = _writes_quantised(plan, written)
    # each block compiled: as priced (kernel_fusion), for async TP (Inductor's pass) and for torchao's quantised
    # formats (see `gaps`)
    body += _compile_lines(base, lay.kernel_fusion == "compiled" or lay.flavour.async_collectives or quantised,
                           lay.flavour.async_collectives)
    module, flavour = REGISTRY[base][0], _flavour(plan) or REGISTRY[base][1]
    args = [repr(flavour)]
    if module == "gpt_oss" and lay.cp > 1:  # its model_registry's default varlen attention refuses CP (decoder.py)
        args.append("attn_backend='flex'")
    convs = []
    if quantised:  # torchao's converters of the plan's GEMM format, the blocks compiled
        fmt = CONVERTERS[written.gemm_format]
        convs = [fmt[0], fmt[1] + (fmt[2] if written.moe else ())]
        args.append("converters=[" + ", ".join(_converter_configs(written)) + "]")
    # model_spec anew: a quantised format, another flavour (Qwen3-8B, -235B-A22B), flex attention, or the shipped
    # Float8 dropped
    registry = len(args) > 1 or _flavour(plan) is not None or base in SHIPPED_CONVERTERS
    if registry:
        body.append(f"    config.model_spec = model_registry({', '.join(args)})")
    theta = _qwen3_theta(plan)
    longer = plan.seq_tokens if plan.seq_tokens > ROPE_MAX.get((module, flavour), plan.seq_tokens) else None
    if theta or longer:  # on the flavour's model (each layer's attention holds its own RoPE config)
        body.append("    for layer in config.model_spec.model.layers:")
        body += [f"        layer.attention.rope.theta = {theta!r}"] if theta else []
        body += [f"        layer.attention.rope.max_context_length = {longer!r}"] if longer else []
    if _flavour(plan):  # its own tokenizer and weights' folder, as the shipped configurations name theirs
        body.append(f"    config.hf_assets_path = {HF_ASSETS[_flavour(plan)]!r}")
    return "\n".join([
        *([f"from torchtitan.components.quantization.{convs[0]} import {', '.join(convs[1])}"] if convs else []),
        *([f"from torchtitan.distributed.activation_checkpoint import {ac}"] if ac else []),
        f"from torchtitan.models.{_module(plan)}.config_registry import {base}",
        *([f"from torchtitan.models.{module} import model_registry"] if registry else []),
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
    ex.nearest = price_nearest(plan, g, FRAMEWORK, own=fsdp_runs(nearest_plan(plan, g)[0])) if price else None
    launch = (alloc_env(nearest_plan(plan, g)[0], ALLOC_ENV) + "PYTHONPATH=$PWD:$PYTHONPATH "
              + torchrun_line(plan, "-m torchtitan.train")
              + f" --module memo_torchtitan --config {FUNCTION}")
    ex.files[FILE] = "\n".join([ex.comment_block(), "#", f"# Run from a torchtitan checkout: {launch}", "",
                                render(plan, g)])
    ex.launch = launch
    return ex
